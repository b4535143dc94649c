/* kernels/cuda/simt.h — what every kernel source of kernels/cuda includes:
 * the conventions that let one source compile twice, by nvcc for the GPU
 * and by the host C++ compiler against the SIMT emulation (emu/), and mean
 * the same in both (docs/kernels.md, "Writing a kernel for both builds"):
 *
 *   TD_SHARED(T, name, n)   a static shared array of n T, one per block,
 *                           aligned to 16 bytes (vector loads);
 *   TD_SHARED_DYN(T, name)  the launch's dynamic shared memory as T
 *                           (one per kernel; carve it with td_sptr_cast);
 *   td_sptr<T>              a pointer into shared memory (a parameter of a
 *                           device function that takes one);
 *   td_ld<V>(p), td_st<V>(p, v)   a vector load or store (float4, uint4,
 *                           uint2, ...) from global or shared memory, which
 *                           must be aligned to sizeof(V);
 *   TD_LAUNCH(kernel, grid, block, smem, stream, args...)   a launch: the
 *                           launch's error (cudaGetLastError). The kernel is
 *                           passed as a function (GCC 12 would not
 *                           instantiate a kernel template that is only a
 *                           template argument) and named by the macro.
 *
 * Under the emulation a shared element read or written through td_sptr is
 * checked (bounds, alignment, races between barriers); never keep one in an
 * `auto` (that is a reference to the element, not its value). */
#ifndef TD_KERNELS_CUDA_SIMT_H
#define TD_KERNELS_CUDA_SIMT_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <utility>

#ifdef TD_SIMT_EMU

#define TD_SHARED(T, name, n)                                                            \
    static const ::td_simt::shared_decl name##_decl_(#name, sizeof(T) * (size_t)(n),     \
                                                     alignof(T) > 16 ? alignof(T) : 16); \
    const ::td_simt::sptr<T> name = ::td_simt::static_shared<T>(name##_decl_)
#define TD_SHARED_DYN(T, name) const ::td_simt::sptr<T> name(::td_simt::dynamic_buf(#name), 0)

template <class T>
using td_sptr = ::td_simt::sptr<T>;

template <class U, class T>
inline td_sptr<U>
td_sptr_cast(td_sptr<T> p)
{
    return ::td_simt::sptr_cast<U>(p);
}

template <class V, class T>
inline V
td_ld(const T *p)
{
    ::td_simt::check_aligned(p, sizeof(V), "vector load");
    V v;
    memcpy((void *)&v, (const void *)p, sizeof(V));
    return v;
}

template <class V, class T>
inline void
td_st(T *p, const V &v)
{
    ::td_simt::check_aligned(p, sizeof(V), "vector store");
    memcpy((void *)p, (const void *)&v, sizeof(V));
}

template <class V, class T>
inline V
td_ld(td_sptr<T> p)
{
    return *td_sptr_cast<V>(p);
}

template <class V, class T>
inline void
td_st(td_sptr<T> p, const V &v)
{
    *td_sptr_cast<V>(p) = v;
}

#else

#define TD_SHARED(T, name, n) __shared__ __align__(16) T name[n]
#define TD_SHARED_DYN(T, name)                                 \
    extern __shared__ __align__(16) unsigned char td_dyn_smem_[]; \
    T *const name = reinterpret_cast<T *>(td_dyn_smem_)

template <class T>
using td_sptr = T *;

template <class U, class T>
__device__ __forceinline__ U *
td_sptr_cast(T *p)
{
    return reinterpret_cast<U *>(p);
}

template <class V, class T>
__device__ __forceinline__ V
td_ld(const T *p)
{
    return *reinterpret_cast<const V *>(p);
}

template <class V, class T>
__device__ __forceinline__ void
td_st(T *p, const V &v)
{
    *reinterpret_cast<V *>(p) = v;
}

#endif

/* Launch kernel k on stream s; the launch's error. Through TD_LAUNCH, which
 * names the kernel for the emulation's reports. */
template <class... P, class... A>
inline cudaError_t
td_launch_kernel(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                 cudaStream_t s, A &&...a)
{
#ifdef TD_SIMT_EMU
    return ::td_simt::launch(name, k, grid, block, smem, s, std::forward<A>(a)...);
#else
    (void)name;
    k<<<grid, block, smem, s>>>(std::forward<A>(a)...);
    return cudaGetLastError();
#endif
}

#define TD_LAUNCH(kernel, grid, block, smem, stream, ...) \
    td_launch_kernel(#kernel, kernel, grid, block, smem, stream, __VA_ARGS__)

#endif
