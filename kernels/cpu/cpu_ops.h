/* kernels/cpu/cpu_ops.h — the cpu compute ops shared between the files of
 * kernels/cpu (dense ops in ops.c, quantizers in fquant.c, top-k in topk.c,
 * the linears in gemm.c, worker threads in pool.c, instruction sets in
 * isa.c); the table itself is td_kernels_cpu_ops() in ops.c. */
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
/* The linears' weights and the linear over them (gemm.c): the ops
 * mat_create, mat_destroy, mat_bytes and linear_mat of td_kernels_ops_t. */
td_status_t td_kernels_cpu_mat_create(const float *w, size_t groups, size_t n, size_t k,
                                      td_kernels_mat_t **out);
td_status_t td_kernels_cpu_mat_create_fmt(const td_kernels_wsrc_t *src, size_t groups,
                                          size_t n, size_t k, td_kernels_mat_t **out);
void td_kernels_cpu_mat_destroy(td_kernels_mat_t *w);
size_t td_kernels_cpu_mat_bytes(const td_kernels_mat_t *w);
td_status_t td_kernels_cpu_linear_mat(const float *x, const td_kernels_mat_t *w, float *y,
                                      size_t m);

/* The vector instructions the ops may use (isa.c): AVX (8-wide f32, the
 * element-wise loops and dot products) and AVX-512 with FMA (the linears). */
#define TD_KERNELS_CPU_AVX 1u
#define TD_KERNELS_CPU_AVX512 2u
unsigned td_kernels_cpu_isa(void);

td_status_t td_kernels_cpu_topk(const float *x, size_t n, size_t m, size_t k,
                                int64_t *idx);

#endif
