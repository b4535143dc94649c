/* kernels/cpu/fquant.c — the cache quantizers on the cpu: the ops' argument
 * checks around kernels/numfmt's group quantizers, bit-exact with the
 * reference's _fake_quant_fp8_block (e4m3, ue8m0 scales) and
 * _fake_quant_fp4_block (e2m1, ue8m0 or e4m3 scales), and their inverses. */
#include "cpu_ops.h"

#include "numfmt.h"

static td_status_t
check_blocks(const char *op, const void *in, const void *out1, const void *out2,
             size_t n, size_t d, size_t b, int even)
{
    if (in == NULL || out1 == NULL || out2 == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "%s: NULL argument", op);
    if (n == 0 || d == 0 || b == 0 || d % b != 0 || (even && b % 2 != 0))
        return td_kernels_fail(TD_ERR_INVALID, "%s: %zu rows of %zu in blocks of %zu",
                               op, n, d, b);
    return TD_OK;
}

td_status_t
td_kernels_cpu_quant_fp8(const float *x, size_t n, size_t d, size_t b,
                         uint8_t *codes, uint8_t *scales)
{
    td_status_t st = check_blocks("quant_fp8", x, codes, scales, n, d, b, 0);
    if (st == TD_OK)
        td_numfmt_quant_fp8(x, n * d, b, codes, scales);
    return st;
}

td_status_t
td_kernels_cpu_dequant_fp8(const uint8_t *codes, const uint8_t *scales, size_t n,
                           size_t d, size_t b, float *y)
{
    td_status_t st = check_blocks("dequant_fp8", codes, scales, y, n, d, b, 0);
    if (st == TD_OK)
        td_numfmt_dequant_fp8(codes, scales, n * d, b, y);
    return st;
}

td_status_t
td_kernels_cpu_quant_fp4(const float *x, size_t n, size_t d, size_t b, int e4m3_scales,
                         uint8_t *packed, uint8_t *scales)
{
    td_status_t st = check_blocks("quant_fp4", x, packed, scales, n, d, b, 1);
    if (st == TD_OK)
        td_numfmt_quant_fp4(x, n * d, b, e4m3_scales, packed, scales);
    return st;
}

td_status_t
td_kernels_cpu_dequant_fp4(const uint8_t *packed, const uint8_t *scales, size_t n,
                           size_t d, size_t b, int e4m3_scales, float *y)
{
    td_status_t st = check_blocks("dequant_fp4", packed, scales, y, n, d, b, 1);
    if (st == TD_OK)
        td_numfmt_dequant_fp4(packed, scales, n * d, b, e4m3_scales, y);
    return st;
}
