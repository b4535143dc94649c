/* kernels/cuda/emu/include/td_simt_device.h — the device side of CUDA C++ for
 * the SIMT emulation (kernels/cuda/emu/simt.cc runs it): the qualifiers, the
 * thread and block indices of the running fiber, __syncthreads, the warp
 * collectives (shuffles, votes, reductions, __syncwarp), atomics, the math
 * intrinsics, shared memory as tracked pointers (td_simt::sptr, declared
 * with kernels/cuda/simt.h's TD_SHARED), and launches. Every rule a GPU
 * would only break silently (a thread outside a collective's mask, a
 * misaligned vector access, a shared access out of bounds or racing another
 * thread's) is reported with the kernel, block and thread. C++17. */
#ifndef TD_SIMT_DEVICE_H
#define TD_SIMT_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
/* Shared memory is declared with TD_SHARED / TD_SHARED_DYN (kernels/cuda/simt.h);
 * a plain __shared__ would be one variable per fiber here, so it does not compile. */
#define __shared__ td_simt_declare_shared_memory_with_TD_SHARED
#define __constant__ td_simt_no_constant_memory_in_the_emulation

static constexpr int warpSize = 32;

namespace td_simt {

/* ---- the running thread ---------------------------------------------------- */

struct thread_s;
struct block_s;

/* Set by the block scheduler before it resumes a fiber. */
struct tls_s {
    const uint3 *tid;
    uint3 bid;
    dim3 bdim, gdim;
    thread_s *self;
    block_s *blk;
};
extern thread_local tls_s tls;

/* Report a kernel bug, naming the kernel, block and thread: logged (one
 * error line), counted, and the launch then fails (cudaErrorLaunchFailure
 * from the call that waits for it). */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void syncthreads(const char *file, int line);

/* A warp collective: every lane of mask calls it with its own arg; when the
 * last one arrives, fn(args, mask) computes every lane's result (args[l] is
 * lane l's arg) and the lanes go on. Lanes that reach different collectives,
 * masks that disagree, and lanes that never arrive are reported. */
typedef void (*coll_fn)(void *const args[32], unsigned mask);
void collective(coll_fn fn, const char *what, unsigned mask, void *arg, const char *file,
                int line);
/* The lanes of the calling thread's warp that have not exited. */
unsigned active_lanes();

}  // namespace td_simt

#define threadIdx (*::td_simt::tls.tid)
#define blockIdx (static_cast<const uint3 &>(::td_simt::tls.bid))
#define blockDim (static_cast<const dim3 &>(::td_simt::tls.bdim))
#define gridDim (static_cast<const dim3 &>(::td_simt::tls.gdim))
#define __syncthreads() ::td_simt::syncthreads(__FILE__, __LINE__)

/* ---- warp collectives ----------------------------------------------------- */

namespace td_simt {

template <class T>
struct shfl_type : std::integral_constant<bool, std::is_arithmetic<T>::value &&
                                                    sizeof(T) <= 8 && sizeof(T) >= 4> {};

struct shfl_arg {
    uint64_t v, out;
    unsigned b, c;     /* PTX shfl.sync's b (lane or offset) and c (clamp, segment mask) */
};

enum { SHFL_UP, SHFL_DOWN, SHFL_BFLY, SHFL_IDX };

template <int MODE>
void shfl_fn(void *const args[32], unsigned mask);
extern template void shfl_fn<SHFL_UP>(void *const *, unsigned);
extern template void shfl_fn<SHFL_DOWN>(void *const *, unsigned);
extern template void shfl_fn<SHFL_BFLY>(void *const *, unsigned);
extern template void shfl_fn<SHFL_IDX>(void *const *, unsigned);

template <int MODE, class T>
inline T
shfl(unsigned mask, T var, unsigned b, int width, const char *what, const char *file,
     int line)
{
    static_assert(shfl_type<T>::value, "shuffles take 32- and 64-bit integers and floats");
    shfl_arg a{};
    memcpy(&a.v, &var, sizeof(T));
    a.b = b & 31;
    unsigned seg = (32u - (unsigned)width) & 31;
    a.c = (seg << 8) | (MODE == SHFL_UP ? 0u : 31u);
    collective(shfl_fn<MODE>, what, mask, &a, file, line);
    T r;
    memcpy(&r, &a.out, sizeof(T));
    return r;
}

struct vote_arg {
    int pred;
    unsigned out;
};
void ballot_fn(void *const args[32], unsigned mask);
void syncwarp_fn(void *const args[32], unsigned mask);

struct reduce_arg {
    uint32_t v, out;
};
enum { RED_ADD, RED_MIN, RED_MAX, RED_UMIN, RED_UMAX, RED_AND, RED_OR, RED_XOR };
template <int OP>
void reduce_fn(void *const args[32], unsigned mask);
extern template void reduce_fn<RED_ADD>(void *const *, unsigned);
extern template void reduce_fn<RED_MIN>(void *const *, unsigned);
extern template void reduce_fn<RED_MAX>(void *const *, unsigned);
extern template void reduce_fn<RED_UMIN>(void *const *, unsigned);
extern template void reduce_fn<RED_UMAX>(void *const *, unsigned);
extern template void reduce_fn<RED_AND>(void *const *, unsigned);
extern template void reduce_fn<RED_OR>(void *const *, unsigned);
extern template void reduce_fn<RED_XOR>(void *const *, unsigned);

template <int OP>
inline uint32_t
reduce(unsigned mask, uint32_t v, const char *what, const char *file, int line)
{
    reduce_arg a{ v, 0 };
    collective(reduce_fn<OP>, what, mask, &a, file, line);
    return a.out;
}

}  // namespace td_simt

template <class T>
inline T
__shfl_sync(unsigned mask, T var, int src, int width = warpSize,
            const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return td_simt::shfl<td_simt::SHFL_IDX>(mask, var, (unsigned)src, width, "__shfl_sync",
                                            file, line);
}
template <class T>
inline T
__shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
               const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return td_simt::shfl<td_simt::SHFL_UP>(mask, var, delta, width, "__shfl_up_sync", file,
                                           line);
}
template <class T>
inline T
__shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return td_simt::shfl<td_simt::SHFL_DOWN>(mask, var, delta, width, "__shfl_down_sync",
                                             file, line);
}
template <class T>
inline T
__shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return td_simt::shfl<td_simt::SHFL_BFLY>(mask, var, (unsigned)lane_mask, width,
                                             "__shfl_xor_sync", file, line);
}

inline unsigned
__ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
              int line = __builtin_LINE())
{
    td_simt::vote_arg a{ pred, 0 };
    td_simt::collective(td_simt::ballot_fn, "__ballot_sync", mask, &a, file, line);
    return a.out;
}
inline int
__all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
           int line = __builtin_LINE())
{
    td_simt::vote_arg a{ pred, 0 };
    td_simt::collective(td_simt::ballot_fn, "__all_sync", mask, &a, file, line);
    return (a.out & mask) == mask;
}
inline int
__any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
           int line = __builtin_LINE())
{
    td_simt::vote_arg a{ pred, 0 };
    td_simt::collective(td_simt::ballot_fn, "__any_sync", mask, &a, file, line);
    return (a.out & mask) != 0;
}
inline void
__syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
           int line = __builtin_LINE())
{
    td_simt::collective(td_simt::syncwarp_fn, "__syncwarp", mask, nullptr, file, line);
}
inline unsigned
__activemask()
{
    return td_simt::active_lanes();
}

#define TD_SIMT_REDUCE(name, OPU, OPI)                                                   \
    inline unsigned name(unsigned mask, unsigned v, const char *file = __builtin_FILE(), \
                         int line = __builtin_LINE())                                    \
    {                                                                                    \
        return td_simt::reduce<td_simt::OPU>(mask, v, #name, file, line);               \
    }                                                                                    \
    inline int name(unsigned mask, int v, const char *file = __builtin_FILE(),           \
                    int line = __builtin_LINE())                                         \
    {                                                                                    \
        return (int)td_simt::reduce<td_simt::OPI>(mask, (uint32_t)v, #name, file, line); \
    }
TD_SIMT_REDUCE(__reduce_add_sync, RED_ADD, RED_ADD)
TD_SIMT_REDUCE(__reduce_min_sync, RED_UMIN, RED_MIN)
TD_SIMT_REDUCE(__reduce_max_sync, RED_UMAX, RED_MAX)
#undef TD_SIMT_REDUCE
inline unsigned
__reduce_and_sync(unsigned mask, unsigned v, const char *file = __builtin_FILE(),
                  int line = __builtin_LINE())
{
    return td_simt::reduce<td_simt::RED_AND>(mask, v, "__reduce_and_sync", file, line);
}
inline unsigned
__reduce_or_sync(unsigned mask, unsigned v, const char *file = __builtin_FILE(),
                 int line = __builtin_LINE())
{
    return td_simt::reduce<td_simt::RED_OR>(mask, v, "__reduce_or_sync", file, line);
}
inline unsigned
__reduce_xor_sync(unsigned mask, unsigned v, const char *file = __builtin_FILE(),
                  int line = __builtin_LINE())
{
    return td_simt::reduce<td_simt::RED_XOR>(mask, v, "__reduce_xor_sync", file, line);
}

/* ---- shared memory ----------------------------------------------------------
 * Every shared buffer (one per TD_SHARED declaration, one for the dynamic
 * part) is its own heap allocation per block, filled with 0xff bytes (a
 * NaN in every float, -1 in every integer) since shared memory starts
 * undefined. Each access through an sptr is checked: in bounds, aligned to
 * its type, and not racing another thread's access to the same bytes
 * since the last barrier (docs/kernels.md, "Bug catchers"). */

namespace td_simt {

struct shared_buf {
    unsigned char *base;
    size_t bytes;
    const char *name;
    void *shadow;          /* the race checker's state per byte (simt.cc) */
};

enum { ACC_READ, ACC_WRITE, ACC_ATOMIC };
/* Check an access of len bytes at off; false: do not make it (reported). */
bool shared_access(shared_buf *b, size_t off, size_t len, size_t align, int kind);

/* One TD_SHARED declaration: the same buffer for every thread of a block. */
struct shared_decl {
    const char *name;
    size_t bytes, align;
    unsigned id;
    shared_decl(const char *n, size_t b, size_t a);
    shared_buf *buf() const;
};
/* The launch's dynamic shared memory (bytes given at launch). */
shared_buf *dynamic_buf(const char *name);

template <class T>
struct sptr;

template <class T>
struct sref {
    using V = typename std::remove_const<T>::type;
    shared_buf *b;
    size_t off;

    operator V() const
    {
        V v{};
        if (shared_access(b, off, sizeof(V), alignof(V), ACC_READ))
            memcpy((void *)&v, b->base + off, sizeof(V));
        return v;
    }
    const sref &operator=(const V &v) const
    {
        static_assert(!std::is_const<T>::value, "a write through a pointer to const");
        if (shared_access(b, off, sizeof(V), alignof(V), ACC_WRITE))
            memcpy(b->base + off, (const void *)&v, sizeof(V));
        return *this;
    }
    const sref &operator=(const sref &o) const { return *this = (V)o; }
    sref(shared_buf *bb, size_t o) : b(bb), off(o) {}
    sref(const sref &) = default;
    template <class U> const sref &operator+=(const U &v) const { return *this = (V)((V)*this + v); }
    template <class U> const sref &operator-=(const U &v) const { return *this = (V)((V)*this - v); }
    template <class U> const sref &operator*=(const U &v) const { return *this = (V)((V)*this * v); }
    template <class U> const sref &operator/=(const U &v) const { return *this = (V)((V)*this / v); }
    template <class U> const sref &operator|=(const U &v) const { return *this = (V)((V)*this | v); }
    template <class U> const sref &operator&=(const U &v) const { return *this = (V)((V)*this & v); }
    template <class U> const sref &operator^=(const U &v) const { return *this = (V)((V)*this ^ v); }
    sptr<T> operator&() const { return sptr<T>(b, off); }
};

template <class T>
struct sptr {
    shared_buf *b;
    size_t off;    /* bytes from the buffer's start (may lie outside: checked on access) */

    sptr() : b(nullptr), off(0) {}
    sptr(shared_buf *bb, size_t o) : b(bb), off(o) {}
    template <class U, class = typename std::enable_if<std::is_convertible<U *, T *>::value>::type>
    sptr(const sptr<U> &o) : b(o.b), off(o.off) {}

    sref<T> operator*() const { return sref<T>(b, off); }
    sref<T> operator[](ptrdiff_t i) const { return sref<T>(b, off + (size_t)i * sizeof(T)); }
    sptr operator+(ptrdiff_t i) const { return sptr(b, off + (size_t)i * sizeof(T)); }
    sptr operator-(ptrdiff_t i) const { return sptr(b, off - (size_t)i * sizeof(T)); }
    ptrdiff_t operator-(const sptr &o) const { return ((ptrdiff_t)off - (ptrdiff_t)o.off) / (ptrdiff_t)sizeof(T); }
    sptr &operator+=(ptrdiff_t i) { off += (size_t)i * sizeof(T); return *this; }
    sptr &operator-=(ptrdiff_t i) { off -= (size_t)i * sizeof(T); return *this; }
    sptr &operator++() { off += sizeof(T); return *this; }
    bool operator==(const sptr &o) const { return b == o.b && off == o.off; }
    bool operator!=(const sptr &o) const { return !(*this == o); }
    bool operator<(const sptr &o) const { return off < o.off; }
};

template <class U, class T>
inline sptr<U>
sptr_cast(const sptr<T> &p)
{
    return sptr<U>(p.b, p.off);
}

template <class T>
inline sptr<T>
static_shared(const shared_decl &d)
{
    return sptr<T>(d.buf(), 0);
}

/* ---- vector access to global memory, checked for alignment ---------------- */

void check_aligned(const void *p, size_t align, const char *what);

}  // namespace td_simt

/* ---- atomics -----------------------------------------------------------------
 * On global memory (blocks run on several host threads) with the
 * compiler's atomics; on shared memory through an sptr (bounds-checked; not
 * part of the race check, atomics do not race each other). */

namespace td_simt {

template <class T, class F>
inline T
atomic_update(T *p, F f)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4 and 8 bytes");
    using U = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
    U *q = reinterpret_cast<U *>(p);
    U old = __atomic_load_n(q, __ATOMIC_RELAXED), nu;
    T o, n;
    do {
        memcpy(&o, &old, sizeof(T));
        n = f(o);
        memcpy(&nu, &n, sizeof(T));
    } while (!__atomic_compare_exchange_n(q, &old, nu, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return o;
}

template <class T, class F>
inline T
atomic_shared(const sptr<T> &p, F f)
{
    if (!shared_access(p.b, p.off, sizeof(T), sizeof(T), ACC_ATOMIC))
        return T{};
    return atomic_update(reinterpret_cast<T *>(p.b->base + p.off), f);
}

}  // namespace td_simt

#define TD_SIMT_ATOMIC(name, T, expr)                                                  \
    inline T name(T *p, T v) { return td_simt::atomic_update(p, [v](T o) { return (T)(expr); }); } \
    inline T name(const td_simt::sptr<T> &p, T v)                                       \
    {                                                                                   \
        return td_simt::atomic_shared(p, [v](T o) { return (T)(expr); });               \
    }
TD_SIMT_ATOMIC(atomicAdd, int, o + v)
TD_SIMT_ATOMIC(atomicAdd, unsigned, o + v)
TD_SIMT_ATOMIC(atomicAdd, unsigned long long, o + v)
TD_SIMT_ATOMIC(atomicAdd, float, o + v)
TD_SIMT_ATOMIC(atomicAdd, double, o + v)
TD_SIMT_ATOMIC(atomicSub, int, o - v)
TD_SIMT_ATOMIC(atomicSub, unsigned, o - v)
TD_SIMT_ATOMIC(atomicExch, int, v)
TD_SIMT_ATOMIC(atomicExch, unsigned, v)
TD_SIMT_ATOMIC(atomicExch, unsigned long long, v)
TD_SIMT_ATOMIC(atomicExch, float, v)
TD_SIMT_ATOMIC(atomicMax, int, o > v ? o : v)
TD_SIMT_ATOMIC(atomicMax, unsigned, o > v ? o : v)
TD_SIMT_ATOMIC(atomicMax, long long, o > v ? o : v)
TD_SIMT_ATOMIC(atomicMax, unsigned long long, o > v ? o : v)
TD_SIMT_ATOMIC(atomicMin, int, o < v ? o : v)
TD_SIMT_ATOMIC(atomicMin, unsigned, o < v ? o : v)
TD_SIMT_ATOMIC(atomicMin, long long, o < v ? o : v)
TD_SIMT_ATOMIC(atomicMin, unsigned long long, o < v ? o : v)
TD_SIMT_ATOMIC(atomicAnd, int, o & v)
TD_SIMT_ATOMIC(atomicAnd, unsigned, o & v)
TD_SIMT_ATOMIC(atomicOr, int, o | v)
TD_SIMT_ATOMIC(atomicOr, unsigned, o | v)
TD_SIMT_ATOMIC(atomicXor, int, o ^ v)
TD_SIMT_ATOMIC(atomicXor, unsigned, o ^ v)
#undef TD_SIMT_ATOMIC

#define TD_SIMT_CAS(T)                                                                  \
    inline T atomicCAS(T *p, T cmp, T v)                                                \
    {                                                                                   \
        return td_simt::atomic_update(p, [cmp, v](T o) { return o == cmp ? v : o; });   \
    }                                                                                   \
    inline T atomicCAS(const td_simt::sptr<T> &p, T cmp, T v)                           \
    {                                                                                   \
        return td_simt::atomic_shared(p, [cmp, v](T o) { return o == cmp ? v : o; });   \
    }
TD_SIMT_CAS(int)
TD_SIMT_CAS(unsigned)
TD_SIMT_CAS(unsigned long long)
#undef TD_SIMT_CAS

inline void
__threadfence()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline void
__threadfence_block()
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* ---- math and bit intrinsics ------------------------------------------------ */

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __clzll(unsigned long long x) { return x ? __builtin_clzll(x) : 64; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline int __ffsll(unsigned long long x) { return __builtin_ffsll((long long)x); }
inline unsigned __brev(unsigned x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

template <class T>
inline T
__ldg(const T *p)
{
    return *p;
}

/* ---- tensor cores ------------------------------------------------------------------
 * mma.sync on one warp, the host versions (mma.cc) of the instructions that
 * kernels/cuda/mma.h wraps: every lane passes its fragments as the PTX ISA
 * lays them out, the last lane to arrive computes D = A B + C for all. */

namespace td_simt {
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                       const char *file, int line);
void mma_m16n8k32_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                       const char *file, int line);
}  // namespace td_simt

/* ---- launches ------------------------------------------------------------------ */

namespace td_simt {

/* One kernel launch as the runtime keeps it: the kernel's name and address,
 * its shape, and its arguments copied at launch (a tuple behind invoke). */
struct launch_desc {
    const char *name;
    const void *func;
    dim3 grid, block;
    size_t smem;
    void (*invoke)(const void *args);
    std::shared_ptr<const void> args;
};
/* Check the shape and enqueue on stream (runtime.cc); the launch's error. */
cudaError_t enqueue_launch(launch_desc &&d, cudaStream_t stream);

/* Launch kernel k (named name in reports): its arguments converted to its
 * parameters' types and copied now, as a GPU launch copies them. */
template <class... P, class... A>
inline cudaError_t
launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
       cudaStream_t stream, A &&...a)
{
    static_assert(sizeof...(P) == sizeof...(A), "a launch passes every parameter of its kernel");
    using tup = std::tuple<typename std::decay<P>::type...>;
    struct packed {
        void (*k)(P...);
        tup args;
    };
    launch_desc d;
    d.name = name;
    d.func = reinterpret_cast<const void *>(k);
    d.grid = grid;
    d.block = block;
    d.smem = smem;
    d.invoke = [](const void *p) {
        const packed *q = static_cast<const packed *>(p);
        std::apply(q->k, q->args);
    };
    d.args = std::make_shared<const packed>(packed{ k, tup(std::forward<A>(a)...) });
    return enqueue_launch(std::move(d), stream);
}

}  // namespace td_simt

#endif
