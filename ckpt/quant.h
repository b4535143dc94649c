/* ckpt/quant.h — the quantized tensors of the DeepSeek-V4.1 checkpoint:
 * dequantization of block-scaled weights into f32, and the quantizers that
 * write each release layout. The scalar conversions (bf16, f16, fp8
 * e4m3/e5m2, ue8m0, fp4 e2m1) are kernels/numfmt's td_numfmt_*. Formats and
 * the reference quantizers they follow: docs/weights.md.
 * Every function that fails logs why once, at error level, naming the
 * tensors, and returns the status. */
#ifndef TD_QUANT_H
#define TD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"
#include "status.h"

/* ---- tensors --------------------------------------------------------------- */

/* Elementwise value of a tensor as f32: float types decoded, integers and BOOL
 * converted (I64/U64 beyond 2^24 round), F4 as its e2m1 codes (no scale).
 * out holds td_st_numel(t) floats. */
td_status_t td_quant_to_f32(const td_st_tensor_t *t, float *out);

/* Dequantize weight w with its block scale into out (td_st_numel(w) floats,
 * logical elements for packed fp4). The layout follows the dtypes and shapes:
 *   - scale NULL: td_quant_to_f32(w).
 *   - w F8_E4M3/F8_E5M2 [R, C], scale [SR, SC] (F8_E8M0/U8 ue8m0 codes, or
 *     F32/BF16/F16 factors): out = value * scale of its block. With
 *     block_rows/block_cols > 0 the scale must be [ceil(R/br), ceil(C/bc)];
 *     with 0, 0 the blocks are R/SR x C/SC and must divide exactly (this also
 *     covers per-row groups: the engram table [rows, 256] with [rows, 8]).
 *   - w I8/U8 [R, K/2] (packed fp4, low nibble first) or F4 [R, K], scale
 *     [R, K/g]: out = e2m1 value * scale of its group of g along K.
 * A mismatch fails with TD_ERR_INVALID and a message naming both tensors. */
td_status_t td_quant_dequant(const td_st_tensor_t *w, const td_st_tensor_t *scale,
                             int block_rows, int block_cols, float *out);

/* Number of floats td_quant_dequant(w, scale, ...) writes: td_st_numel(w),
 * doubled for I8/U8 packed fp4 with a scale. */
int64_t td_quant_dequant_count(const td_st_tensor_t *w, const td_st_tensor_t *scale);

/* Convert n f32 values into storage of dtype dt (F32, F16, BF16, F8_E4M3,
 * F8_E5M2, E8M0); out holds n * element size bytes, little-endian. */
td_status_t td_quant_from_f32(const float *x, size_t n, td_dtype_t dt, void *out);

/* ---- quantizers (the release layouts) --------------------------------------
 * All inputs are row-major f32 [rows, cols]; NaN or inf input is rejected. */

/* fp8 e4m3 with one ue8m0 scale per block_rows x block_cols block (V4.1: 32x32,
 * V4: 128x128; edge blocks may be partial). q: [rows, cols] e4m3 codes;
 * scale: [ceil(rows/br), ceil(cols/bc)] ue8m0 codes. A zero block gets scale 1. */
td_status_t td_quant_fp8_block(const float *x, int64_t rows, int64_t cols,
                               int block_rows, int block_cols, uint8_t *q,
                               uint8_t *scale);

/* fp4 e2m1 experts: packed [rows, cols/2] (element 2k in the low nibble),
 * scale [rows, cols/32] ue8m0. cols must be a multiple of 32. */
td_status_t td_quant_fp4_group(const float *x, int64_t rows, int64_t cols,
                               uint8_t *packed, uint8_t *scale);

/* fp8 e4m3 rows with one ue8m0 scale per `group` channels of each row (the
 * engram tables: group 32). q: [rows, cols]; scale: [rows, cols/group]. */
td_status_t td_quant_fp8_rows(const float *x, int64_t rows, int64_t cols, int group,
                              uint8_t *q, uint8_t *scale);

#endif
