/* kernels/cuda/ops.h — the compute kernels' launchers, one op per .cu file:
 * device pointers and shapes in, the op enqueued on a stream, a td_status_t
 * out (NULL pointers and empty or inconsistent shapes: TD_ERR_INVALID, the
 * reason logged once; a launch error: td_kernels_cuda_status). Thin on
 * purpose: the op interface wraps them. Tensors are row-major, shapes in
 * brackets. Each op has two instantiations (docs/kernels.md, "Precisions"):
 *   f32   f32 operands, f32 accumulation, CUDA cores: the correctness mode;
 *   fast  bf16 or fp8 operands, tensor cores: the serving mode. */
#ifndef TD_KERNELS_CUDA_OPS_H
#define TD_KERNELS_CUDA_OPS_H

#include "kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace td_cuda {

enum class prec { f32, fast };

/* y [n, d] (f32) = rows ids [n] of table [rows, d]; T float (f32) or
 * __nv_bfloat16 (the checkpoint's table: fast). The ids are device memory,
 * never read on the host: an id outside [0, rows) makes its row of y NaN
 * and counts in *bad (device memory; NULL: not counted). embed.cu */
template <class T>
td_status_t embed(const T *table, size_t rows, size_t d, const int64_t *ids, size_t n,
                  float *y, unsigned *bad, cudaStream_t s);

/* y [n, d] = x [n, d] * rsqrt(mean(x^2) + eps) (* w [d] unless NULL), as the
 * cpu op; TO float (f32; y may be x) or __nv_bfloat16 (fast: the tensor-core
 * GEMMs' input). rmsnorm.cu */
template <class TO>
td_status_t rmsnorm(const float *x, const float *w, float eps, size_t n, size_t d, TO *y,
                    cudaStream_t s);

/* Interleaved-pair RoPE in place on the last rd channels of every head, as
 * the cpu op: x [n, h, d] of T (float: f32; __nv_bfloat16: fast), pos [n],
 * inv_freq [rd / 2] (YaRN's blend of frequencies is in this table, its
 * attention factor in scale: model/model.c). rd even, rd <= d. rope.cu */
template <class T>
td_status_t rope(T *x, size_t n, size_t h, size_t d, size_t rd, const int64_t *pos,
                 const float *inv_freq, float scale, int inverse, cudaStream_t s);

/* y [m, n] (f32) = x [m, k] (f32) . w [n, k]^T, a bias-free linear over
 * bf16 weights. f32: on CUDA cores; fast: x rounded to bf16, mma.sync
 * m16n8k16 with f32 accumulation. gemm.cu */
template <prec P>
td_status_t linear_bf16(const float *x, const __nv_bfloat16 *w, float *y, size_t m, size_t n,
                        size_t k, cudaStream_t s);

/* The same over V4.1's fp8 weights: w [n, k] e4m3 codes with one ue8m0 scale
 * per 32 x 32 block, scales [ceil(n / 32), ceil(k / 32)] (edge blocks
 * partial). f32: weights dequantized exactly, CUDA cores; fast: x
 * quantized to e4m3 per row and 32 columns (ue8m0 scale as
 * td_numfmt_quant_fp8), mma.sync m16n8k32, each 32-column step scaled by
 * both scales into the f32 sum. gemm.cu */
template <prec P>
td_status_t linear_fp8(const float *x, const uint8_t *w, const uint8_t *scales, float *y,
                       size_t m, size_t n, size_t k, cudaStream_t s);

}  // namespace td_cuda

#endif
