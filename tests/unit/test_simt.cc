/* tests/unit/test_simt.cc — the SIMT emulation's primitives, each against what
 * CUDA documents for it, computed here on the host: thread and block
 * indices, __syncthreads with static and dynamic shared memory, warp
 * shuffles (every mode and width), votes, reductions, atomics on global
 * and shared memory, vector loads, the bf16/f16/fp8 conversions (against
 * td_numfmt), mma.sync for bf16 and e4m3 (fragments loaded here from the
 * PTX ISA's layout tables), and the runtime: deferred stream work, events
 * across streams, graphs recorded and replayed, launch and copy errors. */
#include "check.h"
#include "mma.h"
#include "simt.h"
#include "simt_emu.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "numfmt.h"
#include "rng.h"
}

#define CUDA_CHECK(call) CHECK_EQ_INT((call), cudaSuccess)

template <class T>
static T *
dev_alloc(size_t n)
{
    T *p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
    return p;
}

template <class T>
static std::vector<T>
to_host(const T *d, size_t n)
{
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* ---- indices -------------------------------------------------------------------- */

__global__ void
k_indices(unsigned *out)
{
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned *o = out + 8 * (b * blockDim.x * blockDim.y * blockDim.z + t);
    unsigned v[8] = { threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x,
                      blockIdx.y,  blockIdx.z,  blockDim.x * blockDim.y * blockDim.z,
                      gridDim.x * gridDim.y * gridDim.z };
    for (int i = 0; i < 8; i++)
        o[i] = v[i];
}

static void
test_indices(void)
{
    dim3 g(3, 2, 2), b(5, 4, 2);
    unsigned nb = 12, nt = 40;
    unsigned *d = dev_alloc<unsigned>(8 * nb * nt);
    CUDA_CHECK(TD_LAUNCH(k_indices, g, b, 0, nullptr, d));
    std::vector<unsigned> h = to_host(d, 8 * nb * nt);
    int bad = 0;
    for (unsigned bz = 0; bz < 2; bz++)
        for (unsigned by = 0; by < 2; by++)
            for (unsigned bx = 0; bx < 3; bx++)
                for (unsigned tz = 0; tz < 2; tz++)
                    for (unsigned ty = 0; ty < 4; ty++)
                        for (unsigned tx = 0; tx < 5; tx++) {
                            unsigned bl = bx + 3 * (by + 2 * bz), t = tx + 5 * (ty + 4 * tz);
                            const unsigned *o = &h[8 * (bl * nt + t)];
                            unsigned want[8] = { tx, ty, tz, bx, by, bz, nt, nb };
                            bad += memcmp(o, want, sizeof(want)) != 0;
                        }
    CHECK_EQ_INT(bad, 0);
    CUDA_CHECK(cudaFree(d));
}

/* ---- barriers and shared memory ----------------------------------------------------- */

/* Reverse each block's values through static shared memory, and sum them by
 * a tree in shared memory; dynamic shared memory doubles the reversed value. */
__global__ void
k_shared(const int *in, int *rev, int *sum, int *twice)
{
    TD_SHARED(int, s, 256);
    TD_SHARED_DYN(int, dyn);
    unsigned t = threadIdx.x, n = blockDim.x;
    const int *x = in + blockIdx.x * n;
    s[t] = x[t];
    dyn[t] = 2 * x[t];
    __syncthreads();
    rev[blockIdx.x * n + t] = s[n - 1 - t];
    twice[blockIdx.x * n + t] = dyn[n - 1 - t];
    __syncthreads();
    for (unsigned h = n / 2; h > 0; h /= 2) {
        if (t < h)
            s[t] += s[t + h];
        __syncthreads();
    }
    if (t == 0)
        sum[blockIdx.x] = s[0];
}

static void
test_shared(void)
{
    const unsigned nb = 5, n = 128;
    std::vector<int> h(nb * n);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (int)(i * 7 % 101) - 50;
    int *in = dev_alloc<int>(nb * n), *rev = dev_alloc<int>(nb * n);
    int *sum = dev_alloc<int>(nb), *twice = dev_alloc<int>(nb * n);
    CUDA_CHECK(cudaMemcpy(in, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(TD_LAUNCH(k_shared, nb, n, n * sizeof(int), nullptr, in, rev, sum, twice));
    std::vector<int> r = to_host(rev, nb * n), s = to_host(sum, nb), w = to_host(twice, nb * n);
    int bad = 0;
    for (unsigned b = 0; b < nb; b++) {
        int want = 0;
        for (unsigned t = 0; t < n; t++) {
            want += h[b * n + t];
            bad += r[b * n + t] != h[b * n + n - 1 - t];
            bad += w[b * n + t] != 2 * h[b * n + n - 1 - t];
        }
        bad += s[b] != want;
    }
    CHECK_EQ_INT(bad, 0);
    for (int *p : { in, rev, sum, twice })
        CUDA_CHECK(cudaFree(p));
}

/* Dynamic shared memory above 48 KiB needs the kernel's opt-in. */
__global__ void
k_big_dyn(int *out)
{
    TD_SHARED_DYN(int, big);
    big[threadIdx.x * 512 + 511] = (int)threadIdx.x;   /* the last word of 64 KiB at thread 31 */
    __syncthreads();
    out[threadIdx.x] = big[(31 - threadIdx.x) * 512 + 511];
}

static void
test_dynamic_optin(void)
{
    int *out = dev_alloc<int>(32);
    size_t bytes = 64 * 1024;
    td_simt_capture([](const char *, void *) {}, nullptr);
    CHECK_EQ_INT(TD_LAUNCH(k_big_dyn, 1, 32, bytes, nullptr, out), cudaErrorInvalidValue);
    td_simt_capture(nullptr, nullptr);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CUDA_CHECK(cudaFuncSetAttribute(k_big_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)bytes));
    CUDA_CHECK(TD_LAUNCH(k_big_dyn, 1, 32, bytes, nullptr, out));
    std::vector<int> h = to_host(out, 32);
    for (int i = 0; i < 32; i++)
        CHECK_EQ_INT(h[i], 31 - i);
    CUDA_CHECK(cudaFree(out));
}

/* ---- warp collectives ---------------------------------------------------------------- */

enum { M_IDX, M_UP, M_DOWN, M_XOR };

template <class T>
__global__ void
k_shfl(T *out, int mode, int arg, int width)
{
    unsigned lane = threadIdx.x % 32;
    T v = (T)(lane * 3 + 1 + 64 * (threadIdx.x / 32));
    T r;
    switch (mode) {
    case M_IDX:  r = __shfl_sync(0xffffffffu, v, arg, width); break;
    case M_UP:   r = __shfl_up_sync(0xffffffffu, v, (unsigned)arg, width); break;
    case M_DOWN: r = __shfl_down_sync(0xffffffffu, v, (unsigned)arg, width); break;
    default:     r = __shfl_xor_sync(0xffffffffu, v, arg, width); break;
    }
    out[threadIdx.x] = r;
}

/* The source lane of each shuffle as the CUDA Programming Guide states it:
 * within groups of `width` lanes; up/down keep their own value past the
 * group's edge; xor may read earlier groups, not later ones. */
static unsigned
shfl_src(int mode, unsigned lane, int arg, unsigned width)
{
    unsigned base = lane / width * width, in = lane % width;
    switch (mode) {
    case M_IDX:  return base + (unsigned)arg % width;
    case M_UP:   return in >= (unsigned)arg ? lane - (unsigned)arg : lane;
    case M_DOWN: return in + (unsigned)arg < width ? lane + (unsigned)arg : lane;
    default: {
        unsigned j = lane ^ (unsigned)arg;
        return j >= base + width ? lane : j;
    }
    }
}

template <class T>
static void
test_shfl_type(void)
{
    T *d = dev_alloc<T>(64);
    int bad = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int width : { 32, 16, 8, 4, 2 })
            for (int arg : { 0, 1, 3, 5, 13, 31, 37 }) {
                if (mode != M_IDX && arg >= 32)   /* offsets are 0 .. 31 */
                    continue;
                CUDA_CHECK(TD_LAUNCH(k_shfl<T>, 1, 64, 0, nullptr, d, mode, arg, width));
                std::vector<T> h = to_host(d, 64);
                for (unsigned t = 0; t < 64; t++) {
                    unsigned src = shfl_src(mode, t % 32, arg, (unsigned)width);
                    T want = (T)(src * 3 + 1 + 64 * (t / 32));
                    if (h[t] != want && bad++ < 5)
                        fprintf(stderr, "shfl mode %d width %d arg %d lane %u: got %g, want %g\n",
                                mode, width, arg, t, (double)h[t], (double)want);
                }
            }
    CHECK_EQ_INT(bad, 0);
    CUDA_CHECK(cudaFree(d));
}

/* Votes and reductions over the whole warp and over its lower half alone. */
__global__ void
k_votes(unsigned *out)
{
    unsigned lane = threadIdx.x;
    int pred = lane % 3 == 0;
    unsigned *o = out + 12 * lane;
    o[0] = __ballot_sync(0xffffffffu, pred);
    o[1] = (unsigned)__all_sync(0xffffffffu, lane < 32);
    o[2] = (unsigned)__any_sync(0xffffffffu, lane == 17);
    o[3] = (unsigned)__all_sync(0xffffffffu, pred);
    o[4] = __reduce_add_sync(0xffffffffu, lane + 1);
    o[5] = (unsigned)__reduce_min_sync(0xffffffffu, (int)lane - 7);
    o[6] = __reduce_max_sync(0xffffffffu, lane * 5 % 32);
    o[7] = __reduce_and_sync(0xffffffffu, lane | 0x100u);
    o[8] = __reduce_or_sync(0xffffffffu, 1u << (lane % 8));
    o[9] = __reduce_xor_sync(0xffffffffu, lane);
    if (lane < 16) {
        o[10] = __ballot_sync(0x0000ffffu, lane % 2);
        o[11] = __reduce_add_sync(0x0000ffffu, 1u);
    } else {
        o[10] = __ballot_sync(0xffff0000u, lane % 2);
        o[11] = __reduce_add_sync(0xffff0000u, 2u);
    }
    __syncwarp();
}

static void
test_votes(void)
{
    unsigned *d = dev_alloc<unsigned>(12 * 32);
    CUDA_CHECK(TD_LAUNCH(k_votes, 1, 32, 0, nullptr, d));
    std::vector<unsigned> h = to_host(d, 12 * 32);
    unsigned ballot = 0, x = 0;
    for (unsigned l = 0; l < 32; l++) {
        ballot |= (l % 3 == 0) << l;
        x ^= l;
    }
    int bad = 0;
    for (unsigned l = 0; l < 32; l++) {
        const unsigned *o = &h[12 * l];
        unsigned want[12] = { ballot, 1, 1, 0, 528, (unsigned)-7, 31, 0x100u, 0xffu, x,
                              (l < 16 ? 0x0000aaaau : 0xaaaa0000u), l < 16 ? 16u : 32u };
        bad += memcmp(o, want, sizeof(want)) != 0;
    }
    CHECK_EQ_INT(bad, 0);
    CUDA_CHECK(cudaFree(d));
}

/* ---- atomics and vector loads ---------------------------------------------------------- */

__global__ void
k_atomics(int *count, float *fsum, unsigned *maxv, int *cas, unsigned *hist)
{
    TD_SHARED(unsigned, sh, 8);
    unsigned t = threadIdx.x, g = blockIdx.x * blockDim.x + t;
    if (t < 8)
        sh[t] = 0;
    __syncthreads();
    atomicAdd(&sh[g % 8], 1u);
    atomicAdd(count, 1);
    atomicAdd(fsum, 0.5f);
    atomicMax(maxv, g * 7 % 1000);
    int old = *cas, seen;
    while ((seen = atomicCAS(cas, old, old + 2)) != old)
        old = seen;
    __syncthreads();
    if (t < 8)
        atomicAdd(&hist[t], (unsigned)sh[t]);
}

static void
test_atomics(void)
{
    const unsigned nb = 6, n = 96;
    int *count = dev_alloc<int>(1), *cas = dev_alloc<int>(1);
    float *fsum = dev_alloc<float>(1);
    unsigned *maxv = dev_alloc<unsigned>(1), *hist = dev_alloc<unsigned>(8);
    CUDA_CHECK(TD_LAUNCH(k_atomics, nb, n, 0, nullptr, count, fsum, maxv, cas, hist));
    unsigned want_max = 0;
    for (unsigned g = 0; g < nb * n; g++)
        want_max = g * 7 % 1000 > want_max ? g * 7 % 1000 : want_max;
    CHECK_EQ_INT(to_host(count, 1)[0], nb * n);
    CHECK(to_host(fsum, 1)[0] == 0.5f * nb * n);
    CHECK_EQ_INT(to_host(maxv, 1)[0], want_max);
    CHECK_EQ_INT(to_host(cas, 1)[0], 2 * nb * n);
    std::vector<unsigned> h = to_host(hist, 8);
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(h[i], nb * n / 8);
    for (void *p : { (void *)count, (void *)cas, (void *)fsum, (void *)maxv, (void *)hist })
        CUDA_CHECK(cudaFree(p));
}

__global__ void
k_vec(const float *in, float *out)
{
    TD_SHARED(float, s, 128);
    unsigned t = threadIdx.x;
    float4 v = td_ld<float4>(in + 4 * t);
    td_st<float4>(s + 4 * t, v);
    __syncthreads();
    float4 w = td_ld<float4>(s + 4 * (31 - t));
    uint2 u = td_ld<uint2>(td_sptr_cast<unsigned>(s) + 2 * t);
    td_st<float4>(out + 4 * t, w);
    td_st<uint2>(reinterpret_cast<unsigned *>(out) + 128 + 2 * t, u);
}

static void
test_vector(void)
{
    std::vector<float> h(128);
    for (int i = 0; i < 128; i++)
        h[i] = (float)i * 0.25f;
    float *in = dev_alloc<float>(128), *out = dev_alloc<float>(192);
    CUDA_CHECK(cudaMemcpy(in, h.data(), 512, cudaMemcpyHostToDevice));
    CUDA_CHECK(TD_LAUNCH(k_vec, 1, 32, 0, nullptr, in, out));
    std::vector<float> o = to_host(out, 192);
    int bad = 0;
    for (int t = 0; t < 32; t++)
        for (int j = 0; j < 4; j++)
            bad += o[4 * t + j] != h[4 * (31 - t) + j];
    for (int i = 0; i < 64; i++)
        bad += o[128 + i] != h[i];
    CHECK_EQ_INT(bad, 0);
    CUDA_CHECK(cudaFree(in));
    CUDA_CHECK(cudaFree(out));
}

/* ---- conversions ------------------------------------------------------------------------ */

static float
bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Every conversion against td_numfmt (torch's rounding) on random and edge
 * values; NaNs excepted, where CUDA and torch pick other NaN codes. */
static void
test_conversions(void)
{
    td_rng_t r = td_rng_seed(7);
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)td_rng_next(&r);
        if (i % 4 == 1)   /* the fp8 range, where rounding and saturation matter */
            u = (u & 0x807fffffu) | ((uint32_t)(110 + td_rng_next(&r) % 40) << 23);
        float f = bits_f32(u);
        if (isnan(f))
            continue;
        bad += __bfloat16_as_ushort(__float2bfloat16(f)) != td_numfmt_f32_to_bf16(f);
        bad += __half_as_ushort(__float2half(f)) != td_numfmt_f32_to_f16(f);
        uint8_t e4 = __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E4M3);
        uint8_t e5 = __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E5M2);
        bad += (e4 & 0x7f) == 0x7f ? (td_numfmt_f32_to_e4m3(f) & 0x7f) != 0x7f
                                   : e4 != td_numfmt_f32_to_e4m3(f);
        bad += e5 != td_numfmt_f32_to_e5m2(f);
        uint8_t sat = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
        float want = fabsf(f) > 448.0f ? copysignf(448.0f, f) : f;
        if (fabsf(f) < 464.0f)
            bad += sat != td_numfmt_f32_to_e4m3(want);
        else
            bad += sat != (uint8_t)(f < 0 ? 0xfe : 0x7e);
    }
    for (int c = 0; c < 256; c++) {
        float a = __half2float(__half(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E4M3)));
        float b = td_numfmt_e4m3_to_f32((uint8_t)c);
        bad += !(a == b || (isnan(a) && isnan(b)));
        a = __half2float(__half(__nv_cvt_fp8_to_halfraw((uint8_t)c, __NV_E5M2)));
        b = td_numfmt_e5m2_to_f32((uint8_t)c);
        bad += !(a == b || (isnan(a) && isnan(b)));
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float a = __half2float(__ushort_as_half((unsigned short)h));
        float b = td_numfmt_f16_to_f32((uint16_t)h);
        bad += !(a == b || (isnan(a) && isnan(b)));
        a = __bfloat162float(__ushort_as_bfloat16((unsigned short)h));
        b = td_numfmt_bf16_to_f32((uint16_t)h);
        bad += !(a == b || (isnan(a) && isnan(b)));
    }
    CHECK_EQ_INT(bad, 0);
}

/* ---- tensor cores -------------------------------------------------------------------- */

/* A [16, K] row-major codes, Bt [8, K] (B by columns), C [16, 8] -> D [16, 8],
 * each lane's fragments gathered as the PTX ISA tables lay them out. */
template <bool FP8>
__global__ void
k_mma(const uint8_t *A, const uint8_t *Bt, const float *C, float *D)
{
    const unsigned K = FP8 ? 32 : 16, es = FP8 ? 1 : 2;   /* element bytes */
    unsigned lane = threadIdx.x, g = lane / 4, t = lane % 4;
    uint32_t a[4], b[2];
    float c[4], d[4];
    for (unsigned r = 0; r < 4; r++) {
        unsigned row = g + 8 * (r % 2);
        unsigned col = FP8 ? 4 * t + 16 * (r / 2) : 2 * t + 8 * (r / 2);
        memcpy(&a[r], A + (row * K + col) * es, 4);
    }
    for (unsigned r = 0; r < 2; r++) {
        unsigned k = FP8 ? 4 * t + 16 * r : 2 * t + 8 * r;
        memcpy(&b[r], Bt + (g * K + k) * es, 4);
    }
    for (unsigned i = 0; i < 4; i++)
        c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    if (FP8)
        td_mma_m16n8k32_e4m3(d, a, b, c);
    else
        td_mma_m16n8k16_bf16(d, a, b, c);
    for (unsigned i = 0; i < 4; i++)
        D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

template <bool FP8>
static void
test_mma_shape(void)
{
    const unsigned K = FP8 ? 32 : 16, es = FP8 ? 1 : 2;
    td_rng_t r = td_rng_seed(FP8 ? 3 : 4);
    std::vector<uint8_t> A(16 * K * es), Bt(8 * K * es);
    std::vector<float> Af(16 * K), Bf(8 * K), C(128);
    for (unsigned i = 0; i < 16 * K + 8 * K; i++) {
        float v = (float)((int)(td_rng_next(&r) % 41) - 20) / 8.0f;
        uint8_t *dst = i < 16 * K ? &A[i * es] : &Bt[(i - 16 * K) * es];
        float *vf = i < 16 * K ? &Af[i] : &Bf[i - 16 * K];
        if (FP8) {
            *dst = td_numfmt_f32_to_e4m3(v);
            *vf = td_numfmt_e4m3_to_f32(*dst);
        } else {
            uint16_t h = td_numfmt_f32_to_bf16(v);
            memcpy(dst, &h, 2);
            *vf = td_numfmt_bf16_to_f32(h);
        }
    }
    for (unsigned i = 0; i < 128; i++)
        C[i] = (float)i - 64.0f;
    uint8_t *dA = dev_alloc<uint8_t>(A.size()), *dB = dev_alloc<uint8_t>(Bt.size());
    float *dC = dev_alloc<float>(128), *dD = dev_alloc<float>(128);
    CUDA_CHECK(cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dB, Bt.data(), Bt.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dC, C.data(), 512, cudaMemcpyHostToDevice));
    CUDA_CHECK(TD_LAUNCH(k_mma<FP8>, 1, 32, 0, nullptr, dA, dB, dC, dD));
    std::vector<float> D = to_host(dD, 128);
    int bad = 0;
    for (unsigned m = 0; m < 16; m++)
        for (unsigned n = 0; n < 8; n++) {
            double want = C[m * 8 + n];
            for (unsigned k = 0; k < K; k++)
                want += (double)Af[m * K + k] * Bf[n * K + k];
            bad += fabs(D[m * 8 + n] - want) > 1e-4 * (1 + fabs(want));
        }
    CHECK_EQ_INT(bad, 0);
    for (void *p : { (void *)dA, (void *)dB, (void *)dC, (void *)dD })
        CUDA_CHECK(cudaFree(p));
}

/* ---- the runtime ----------------------------------------------------------------------- */

__global__ void
k_add(int *x, int n, int v)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (unsigned)n)
        x[i] += v;
}

__global__ void
k_copy_twice(const int *in, int *out, int n)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (unsigned)n)
        out[i] = 2 * in[i];
}

/* Work waits for the host to wait: the host reads device memory before a
 * sync and sees nothing done (what a GPU would allow too), then all of it. */
static void
test_deferred(void)
{
    const int n = 100;
    int *x = dev_alloc<int>(n);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    CUDA_CHECK(TD_LAUNCH(k_add, 2, 64, 0, s, x, n, 5));
    CHECK_EQ_INT(x[7], 0);
    CHECK_EQ_INT(cudaStreamQuery(s), cudaErrorNotReady);
    CHECK_EQ_INT(cudaStreamQuery(s), cudaSuccess);
    CHECK_EQ_INT(x[7], 5);
    CUDA_CHECK(TD_LAUNCH(k_add, 2, 64, 0, s, x, n, 1));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CHECK_EQ_INT(x[99], 6);
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(x));
}

/* An event orders a second stream after the first. */
static void
test_events(void)
{
    const int n = 64;
    int *x = dev_alloc<int>(n), *y = dev_alloc<int>(n);
    cudaStream_t s1, s2;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, s1));
    CUDA_CHECK(TD_LAUNCH(k_add, 1, 64, 0, s1, x, n, 3));
    CUDA_CHECK(cudaEventRecord(e1, s1));
    CUDA_CHECK(cudaStreamWaitEvent(s2, e1, 0));
    CUDA_CHECK(TD_LAUNCH(k_copy_twice, 1, 64, 0, s2, x, y, n));
    CUDA_CHECK(cudaStreamSynchronize(s2));
    CHECK_EQ_INT(y[10], 6);
    float ms = -1.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(ms >= 0.0f);
    for (cudaEvent_t e : { e0, e1 })
        CUDA_CHECK(cudaEventDestroy(e));
    for (cudaStream_t s : { s1, s2 })
        CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
}

/* A graph records a stream's work with its arguments as they were, and
 * replays it; waiting on a stream under capture invalidates the capture. */
static void
test_graphs(void)
{
    const int n = 50;
    int *x = dev_alloc<int>(n), *y = dev_alloc<int>(n);
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int v = 4;
    CUDA_CHECK(TD_LAUNCH(k_add, 1, 64, 0, s, x, n, v));
    v = 100;
    CUDA_CHECK(TD_LAUNCH(k_copy_twice, 1, 64, 0, s, x, y, n));
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CHECK_EQ_INT(x[0], 0);
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++)
        CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CHECK_EQ_INT(x[49], 12);
    CHECK_EQ_INT(y[0], 24);
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaGraphDestroy(g));

    td_simt_capture([](const char *, void *) {}, nullptr);
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus cs;
    CUDA_CHECK(cudaStreamIsCapturing(s, &cs));
    CHECK_EQ_INT(cs, cudaStreamCaptureStatusInvalidated);
    CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    td_simt_capture(nullptr, nullptr);
    (void)cudaGetLastError();
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
}

/* A launch too large for a block and a copy into host memory that claims to
 * go to the device are refused, and the error is the last one once. */
static void
test_refusals(void)
{
    int *x = dev_alloc<int>(4), host[4] = { 0 };
    td_simt_capture([](const char *, void *) {}, nullptr);
    CHECK_EQ_INT(TD_LAUNCH(k_add, 1, 2000, 0, nullptr, x, 4, 1), cudaErrorInvalidConfiguration);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidConfiguration);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpy(host, x, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaMemcpy(x, host, 32, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaFree(host), cudaErrorInvalidValue);
    td_simt_capture(nullptr, nullptr);
    (void)cudaGetLastError();
    CUDA_CHECK(cudaFree(x));
}

int
main(void)
{
    unsigned long before = td_simt_reports();
    test_indices();
    test_shared();
    test_dynamic_optin();
    test_shfl_type<int>();
    test_shfl_type<float>();
    test_shfl_type<double>();
    test_shfl_type<unsigned long long>();
    test_votes();
    test_atomics();
    test_vector();
    test_conversions();
    test_mma_shape<false>();
    test_mma_shape<true>();
    test_deferred();
    test_events();
    test_graphs();
    test_refusals();
    CHECK_EQ_INT(td_simt_reports() - before, 0);   /* correct kernels report nothing */
    return td_check_exit("test_simt");
}
