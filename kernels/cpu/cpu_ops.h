/* kernels/cpu/cpu_ops.h — the cpu compute ops shared between the files of
 * kernels/cpu (dense ops in ops.c, quantizers in fquant.c, top-k in topk.c);
 * the table itself is td_kernels_cpu_ops() in ops.c. */
#ifndef TD_KERNELS_CPU_OPS_H
#define TD_KERNELS_CPU_OPS_H

#include "kernels.h"

td_status_t td_kernels_cpu_quant_fp8(const float *x, size_t n, size_t d, size_t b,
                                     uint8_t *codes, uint8_t *scales);
td_status_t td_kernels_cpu_dequant_fp8(const uint8_t *codes, const uint8_t *scales,
                                       size_t n, size_t d, size_t b, float *y);
td_status_t td_kernels_cpu_quant_fp4(const float *x, size_t n, size_t d, size_t b,
                                     int e4m3_scales, uint8_t *packed, uint8_t *scales);
td_status_t td_kernels_cpu_dequant_fp4(const uint8_t *packed, const uint8_t *scales,
                                       size_t n, size_t d, size_t b, int e4m3_scales,
                                       float *y);
td_status_t td_kernels_cpu_topk(const float *x, size_t n, size_t m, size_t k,
                                int64_t *idx);

#endif
