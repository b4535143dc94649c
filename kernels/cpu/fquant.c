/* kernels/cpu/fquant.c — the cache quantizers on the cpu, bit-exact with the
 * reference's _fake_quant_fp8_block (e4m3, ue8m0 scales) and
 * _fake_quant_fp4_block (e2m1, ue8m0 or e4m3 scales), and their inverses; the
 * codes are those of kernels/numfmt. */
#include "cpu_ops.h"

#include <math.h>
#include <pthread.h>

#include "numfmt.h"

#define FP8_MAX 448.0f
#define FP4_MAX 6.0f

/* td_numfmt_e4m3_to_f32 of every code: the dequantizers multiply by these. */
static float fq_e4m3[256];
static pthread_once_t fq_once = PTHREAD_ONCE_INIT;

static void
fq_init(void)
{
    for (int c = 0; c < 256; c++)
        fq_e4m3[c] = td_numfmt_e4m3_to_f32((uint8_t)c);
}

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

static float
block_amax(const float *x, size_t b)
{
    float amax = 0.0f;

    for (size_t i = 0; i < b; i++) {
        float a = fabsf(x[i]);
        if (a > amax || isnan(a))
            amax = a;
    }
    return amax;
}

td_status_t
td_kernels_cpu_quant_fp8(const float *x, size_t n, size_t d, size_t b,
                         uint8_t *codes, uint8_t *scales)
{
    td_status_t st = check_blocks("quant_fp8", x, codes, scales, n, d, b, 0);
    if (st != TD_OK)
        return st;
    const float inv_max = (float)(1.0 / 448.0);
    for (size_t blk = 0; blk < n * (d / b); blk++) {
        const float *xb = x + blk * b;
        float amax = block_amax(xb, b);
        if (amax < 1e-4f)
            amax = 1e-4f;
        int k = td_numfmt_pow2_ceil_exp(amax * inv_max);
        scales[blk] = (uint8_t)(k + 127);
        for (size_t i = 0; i < b; i++) {
            float q = ldexpf(xb[i], -k);
            q = q < -FP8_MAX ? -FP8_MAX : q > FP8_MAX ? FP8_MAX : q;
            codes[blk * b + i] = td_numfmt_f32_to_e4m3(q);
        }
    }
    return TD_OK;
}

td_status_t
td_kernels_cpu_dequant_fp8(const uint8_t *codes, const uint8_t *scales, size_t n,
                           size_t d, size_t b, float *y)
{
    td_status_t st = check_blocks("dequant_fp8", codes, scales, y, n, d, b, 0);
    if (st != TD_OK)
        return st;
    pthread_once(&fq_once, fq_init);
    for (size_t blk = 0; blk < n * (d / b); blk++) {
        int k = (int)scales[blk] - 127;
        if (k < -126 || k > 127) {
            for (size_t i = 0; i < b; i++)
                y[blk * b + i] = ldexpf(fq_e4m3[codes[blk * b + i]], k);
            continue;
        }
        float p = td_numfmt_e8m0_to_f32(scales[blk]);   /* 2^k, a normal float */
        for (size_t i = 0; i < b; i++)
            y[blk * b + i] = fq_e4m3[codes[blk * b + i]] * p;
    }
    return TD_OK;
}

td_status_t
td_kernels_cpu_quant_fp4(const float *x, size_t n, size_t d, size_t b, int e4m3_scales,
                         uint8_t *packed, uint8_t *scales)
{
    td_status_t st = check_blocks("quant_fp4", x, packed, scales, n, d, b, 1);
    if (st != TD_OK)
        return st;
    const float inv_max = (float)(1.0 / 6.0);
    for (size_t blk = 0; blk < n * (d / b); blk++) {
        const float *xb = x + blk * b;
        float amax = block_amax(xb, b), scale;
        if (e4m3_scales) {
            const float lo = 6.0f * 0x1p-9f;
            uint8_t c = td_numfmt_f32_to_e4m3((amax < lo ? lo : amax) / FP4_MAX);
            scales[blk] = c;
            scale = td_numfmt_e4m3_to_f32(c);
        } else {
            const float lo = 6.0f * 0x1p-126f;
            int k = td_numfmt_pow2_ceil_exp((amax < lo ? lo : amax) * inv_max);
            scales[blk] = (uint8_t)(k + 127);
            scale = ldexpf(1.0f, k);
        }
        uint8_t *pb = packed + blk * b / 2;
        for (size_t i = 0; i < b; i += 2) {
            float q0 = xb[i] / scale, q1 = xb[i + 1] / scale;
            q0 = q0 < -FP4_MAX ? -FP4_MAX : q0 > FP4_MAX ? FP4_MAX : q0;
            q1 = q1 < -FP4_MAX ? -FP4_MAX : q1 > FP4_MAX ? FP4_MAX : q1;
            pb[i / 2] = (uint8_t)(td_numfmt_f32_to_e2m1(q0) |
                                 (td_numfmt_f32_to_e2m1(q1) << 4));
        }
    }
    return TD_OK;
}

td_status_t
td_kernels_cpu_dequant_fp4(const uint8_t *packed, const uint8_t *scales, size_t n,
                           size_t d, size_t b, int e4m3_scales, float *y)
{
    td_status_t st = check_blocks("dequant_fp4", packed, scales, y, n, d, b, 1);
    if (st != TD_OK)
        return st;
    pthread_once(&fq_once, fq_init);
    for (size_t blk = 0; blk < n * (d / b); blk++) {
        float scale = e4m3_scales ? fq_e4m3[scales[blk]]
                                  : ldexpf(1.0f, (int)scales[blk] - 127);
        const uint8_t *pb = packed + blk * b / 2;
        for (size_t i = 0; i < b; i += 2) {
            y[blk * b + i] = td_numfmt_e2m1_to_f32(pb[i / 2] & 0xF) * scale;
            y[blk * b + i + 1] = td_numfmt_e2m1_to_f32(pb[i / 2] >> 4) * scale;
        }
    }
    return TD_OK;
}
