/* kernels/cuda/embed.cu — the embedding gather: one CTA per token copies its
 * table row into y as f32, 16 bytes at a time when the row allows it. The
 * ids stay on the device; an id out of range poisons its row with NaN and
 * is counted (ops.h). */
#include "backend.h"
#include "device.h"
#include "ops.h"

namespace td_cuda {

static constexpr unsigned EMB_THREADS = 128;

/* out [d] = src [d] as f32: float4 copies when d % 4 == 0 and both rows are
 * 16-byte aligned (vec), else one float at a time. */
__device__ static void
embed_row(const float *src, float *out, size_t d, bool vec)
{
    if (vec) {
        for (size_t i = threadIdx.x; i < d / 4; i += blockDim.x)
            td_st<float4>(out + 4 * i, td_ld<float4>(src + 4 * i));
        return;
    }
    for (size_t i = threadIdx.x; i < d; i += blockDim.x)
        out[i] = src[i];
}

/* bf16 rows: eight values (one uint4) at a time when d % 8 == 0 and aligned. */
__device__ static void
embed_row(const __nv_bfloat16 *src, float *out, size_t d, bool vec)
{
    if (vec) {
        for (size_t i = threadIdx.x; i < d / 8; i += blockDim.x) {
            uint4 w = td_ld<uint4>(src + 8 * i);
            td_st<float4>(out + 8 * i, make_float4(td_bf16_lo(w.x), td_bf16_hi(w.x),
                                                   td_bf16_lo(w.y), td_bf16_hi(w.y)));
            td_st<float4>(out + 8 * i + 4, make_float4(td_bf16_lo(w.z), td_bf16_hi(w.z),
                                                       td_bf16_lo(w.w), td_bf16_hi(w.w)));
        }
        return;
    }
    for (size_t i = threadIdx.x; i < d; i += blockDim.x)
        out[i] = __bfloat162float(src[i]);
}

template <class T>
__global__ static void __launch_bounds__(EMB_THREADS)
embed_kernel(const T *__restrict__ table, size_t rows, size_t d,
             const int64_t *__restrict__ ids, float *__restrict__ y, unsigned *bad, bool vec)
{
    size_t r = blockIdx.x;
    int64_t id = ids[r];
    float *out = y + r * d;

    if (id < 0 || (uint64_t)id >= rows) {
        for (size_t i = threadIdx.x; i < d; i += blockDim.x)
            out[i] = __uint_as_float(0x7fc00000u);
        if (threadIdx.x == 0 && bad != nullptr)
            atomicAdd(bad, 1u);
        return;
    }
    embed_row(table + (size_t)id * d, out, d, vec);
}

template <class T>
td_status_t
embed(const T *table, size_t rows, size_t d, const int64_t *ids, size_t n, float *y,
      unsigned *bad, cudaStream_t s)
{
    if (table == nullptr || ids == nullptr || y == nullptr || rows == 0 || d == 0 || n == 0)
        return td_kernels_fail(TD_ERR_INVALID, "cuda embed: NULL pointer or empty shape");
    if (n > 0x7fffffffu)
        return td_kernels_fail(TD_ERR_INVALID, "cuda embed: %zu ids in one call", n);
    const size_t per = 16 / sizeof(T);   /* elements of one 16-byte load */
    bool vec = d % per == 0 && d % 4 == 0 && (uintptr_t)table % 16 == 0 &&
               (uintptr_t)y % 16 == 0;
    size_t work = vec ? d / per : d;   /* loads per row */
    unsigned threads = work >= EMB_THREADS ? EMB_THREADS : (unsigned)((work + 31) / 32 * 32);
    return td_kernels_cuda_status(TD_LAUNCH(embed_kernel<T>, (unsigned)n, threads, 0, s, table,
                                                             rows, d, ids, y, bad, vec),
                                  "embed");
}

template td_status_t embed<float>(const float *, size_t, size_t, const int64_t *, size_t,
                                  float *, unsigned *, cudaStream_t);
template td_status_t embed<__nv_bfloat16>(const __nv_bfloat16 *, size_t, size_t,
                                          const int64_t *, size_t, float *, unsigned *,
                                          cudaStream_t);

}  // namespace td_cuda
