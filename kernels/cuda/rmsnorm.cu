/* kernels/cuda/rmsnorm.cu — RMSNorm: one CTA per row sums the squares (per
 * thread, then a warp butterfly, then the warps' sums in order), and every
 * thread scales its elements as the cpu op does, y = w * (x * rs), writing
 * f32 or bf16. */
#include "backend.h"
#include "device.h"
#include "ops.h"

namespace td_cuda {

static constexpr unsigned NORM_THREADS = 256;

/* x and y may be the same rows: each element is read, then written, by one thread. */
template <class TO>
__global__ static void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *x, const float *__restrict__ w, float eps, size_t d, TO *y)
{
    TD_SHARED(float, part, NORM_THREADS / 32);
    const float *xr = x + blockIdx.x * d;
    TO *yr = y + blockIdx.x * d;
    unsigned nw = blockDim.x / 32;

    float ss = 0.0f;
    for (size_t i = threadIdx.x; i < d; i += blockDim.x)
        ss = fmaf(xr[i], xr[i], ss);
    ss = td_warp_sum(ss);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (unsigned j = 0; j < nw; j++)
        tot += part[j];
    float rs = 1.0f / sqrtf(tot / (float)d + eps);
    for (size_t i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i] * rs;
        yr[i] = td_from_f32<TO>(w != nullptr ? w[i] * v : v);
    }
}

template <class TO>
td_status_t
rmsnorm(const float *x, const float *w, float eps, size_t n, size_t d, TO *y, cudaStream_t s)
{
    if (x == nullptr || y == nullptr || n == 0 || d == 0)
        return td_kernels_fail(TD_ERR_INVALID, "cuda rmsnorm: NULL pointer or empty shape");
    if (n > 0x7fffffffu)
        return td_kernels_fail(TD_ERR_INVALID, "cuda rmsnorm: %zu rows in one call", n);
    unsigned threads = d >= NORM_THREADS ? NORM_THREADS : (unsigned)((d + 31) / 32 * 32);
    return td_kernels_cuda_status(TD_LAUNCH(rmsnorm_kernel<TO>, (unsigned)n, threads, 0, s, x,
                                                                w, eps, d, y),
                                  "rmsnorm");
}

template td_status_t rmsnorm<float>(const float *, const float *, float, size_t, size_t,
                                    float *, cudaStream_t);
template td_status_t rmsnorm<__nv_bfloat16>(const float *, const float *, float, size_t,
                                            size_t, __nv_bfloat16 *, cudaStream_t);

}  // namespace td_cuda
