/* kernels/cuda/rope.cu — RoPE on interleaved pairs, in place: one CTA per
 * token computes cos and sin of its rd / 2 angles once (dynamic shared
 * memory), then turns every head's pairs, as the cpu op does. YaRN is in
 * the frequency table and the scale (ops.h). */
#include "backend.h"
#include "device.h"
#include "ops.h"

namespace td_cuda {

static constexpr unsigned ROPE_THREADS = 128;

template <class T>
__global__ static void __launch_bounds__(ROPE_THREADS)
rope_kernel(T *__restrict__ x, size_t h, size_t d, size_t rd, const int64_t *__restrict__ pos,
            const float *__restrict__ inv_freq, float scale, int inverse)
{
    TD_SHARED_DYN(float, cs);   /* [rd / 2] cos * scale, then [rd / 2] +-sin * scale */
    size_t half = rd / 2;
    float p = (float)pos[blockIdx.x];

    for (size_t i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, c;
        sincosf(inv_freq[i] * p, &sn, &c);
        cs[i] = c * scale;
        cs[half + i] = (inverse ? -sn : sn) * scale;
    }
    __syncthreads();
    T *xr = x + blockIdx.x * h * d + (d - rd);
    for (size_t q = threadIdx.x; q < h * half; q += blockDim.x) {
        size_t j = q / half, i = q % half;
        T *v = xr + j * d + 2 * i;
        float e = td_to_f32(v[0]), o = td_to_f32(v[1]);
        float c = cs[i], sn = cs[half + i];
        v[0] = td_from_f32<T>(e * c - o * sn);
        v[1] = td_from_f32<T>(e * sn + o * c);
    }
}

template <class T>
td_status_t
rope(T *x, size_t n, size_t h, size_t d, size_t rd, const int64_t *pos, const float *inv_freq,
     float scale, int inverse, cudaStream_t s)
{
    if (x == nullptr || pos == nullptr || inv_freq == nullptr || n == 0 || h == 0 ||
        rd == 0 || rd % 2 != 0 || rd > d)
        return td_kernels_fail(TD_ERR_INVALID, "cuda rope: NULL pointer or bad shape "
                               "(n %zu, h %zu, d %zu, rd %zu)", n, h, d, rd);
    if (n > 0x7fffffffu || rd > 4096)
        return td_kernels_fail(TD_ERR_INVALID, "cuda rope: %zu tokens, rd %zu", n, rd);
    size_t pairs = h * (rd / 2);
    unsigned threads = pairs >= ROPE_THREADS ? ROPE_THREADS : (unsigned)((pairs + 31) / 32 * 32);
    return td_kernels_cuda_status(TD_LAUNCH(rope_kernel<T>, (unsigned)n, threads,
                                                            rd * sizeof(float), s, x, h, d, rd,
                                                            pos, inv_freq, scale, inverse),
                                  "rope");
}

template td_status_t rope<float>(float *, size_t, size_t, size_t, size_t, const int64_t *,
                                 const float *, float, int, cudaStream_t);
template td_status_t rope<__nv_bfloat16>(__nv_bfloat16 *, size_t, size_t, size_t, size_t,
                                         const int64_t *, const float *, float, int,
                                         cudaStream_t);

}  // namespace td_cuda
