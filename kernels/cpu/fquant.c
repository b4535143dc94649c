/* kernels/cpu/fquant.c — the cache quantizers on the cpu, bit-exact with the
 * reference's _fake_quant_fp8_block (e4m3, ue8m0 scales) and
 * _fake_quant_fp4_block (e2m1, ue8m0 or e4m3 scales), and their inverses. */
#include "cpu_ops.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#define FP8_MAX 448.0f
#define FP4_MAX 6.0f

/* The e2m1 values by code (bit 3 = sign). */
static const float fp4_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* 2^ceil(log2 t) as its exponent k, from the bits of a positive normal f32
 * (exponent field - 127, plus one when any mantissa bit is set): the
 * reference's _pow2_ceil_scale. */
static int
pow2_ceil_exp(float t)
{
    uint32_t bits;

    memcpy(&bits, &t, sizeof(bits));
    return (int)((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0);
}

/* e4m3fn code of v, round to nearest even like torch's .to(float8_e4m3fn);
 * |v| > 464 (rounds past 448), inf and NaN give NaN (0x7F | sign). */
static uint8_t
e4m3_encode(float v)
{
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);

    if (!(a <= 464.0f))
        return sign | 0x7F;
    if (a < 0.015625f)                         /* below 2^-6: subnormal step 2^-9 */
        return sign | (uint8_t)rintf(a * 512.0f);   /* 8 is the smallest normal */
    int e;
    (void)frexpf(a, &e);                        /* a in [2^(e-1), 2^e) */
    int q = (int)rintf(ldexpf(a, 4 - e));       /* 8 .. 16 */
    if (q == 16) {
        q = 8;
        e++;
    }
    if (e - 1 > 8)
        return sign | 0x7F;
    return sign | (uint8_t)(((e - 1 + 7) << 3) | (q - 8));
}

static float
e4m3_decode(uint8_t c)
{
    int e = (c >> 3) & 0xF, m = c & 7;
    float v;

    if (e == 0xF && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), e - 10);
    return (c & 0x80) ? -v : v;
}

/* e4m3_decode of every code, and 2^k as a float: the dequantizers multiply
 * by these (x * 2^k is exact, as ldexpf, for the normal range of 2^k). */
static float fq_e4m3[256];
static pthread_once_t fq_once = PTHREAD_ONCE_INIT;

static void
fq_init(void)
{
    for (int c = 0; c < 256; c++)
        fq_e4m3[c] = e4m3_decode((uint8_t)c);
}

/* ldexpf(v, k): a product with 2^k where 2^k is a normal float. */
static inline float
fq_ldexp(float v, int k)
{
    if (k < -126 || k > 127)
        return ldexpf(v, k);
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float p;
    memcpy(&p, &bits, sizeof(p));
    return v * p;
}

/* e2m1 code of a value already clamped to [-6, 6]: ties at 0.25, 1.25, 2.5
 * and 5 go down (to the even code), at 0.75, 1.75 and 3.5 up. */
static uint8_t
e2m1_encode(float q)
{
    static const float up[7] = { 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f };
    float a = fabsf(q);
    uint8_t code = 0;

    for (int i = 0; i < 7; i++) {
        int tie_up = i & 1;
        if (tie_up ? a >= up[i] : a > up[i])
            code++;
    }
    return code | (signbit(q) ? 8 : 0);
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
        int k = pow2_ceil_exp(amax * inv_max);
        scales[blk] = (uint8_t)(k + 127);
        for (size_t i = 0; i < b; i++) {
            float q = ldexpf(xb[i], -k);
            q = q < -FP8_MAX ? -FP8_MAX : q > FP8_MAX ? FP8_MAX : q;
            codes[blk * b + i] = e4m3_encode(q);
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
        float p = fq_ldexp(1.0f, k);
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
            uint8_t c = e4m3_encode((amax < lo ? lo : amax) / FP4_MAX);
            scales[blk] = c;
            scale = e4m3_decode(c);
        } else {
            const float lo = 6.0f * 0x1p-126f;
            int k = pow2_ceil_exp((amax < lo ? lo : amax) * inv_max);
            scales[blk] = (uint8_t)(k + 127);
            scale = ldexpf(1.0f, k);
        }
        uint8_t *pb = packed + blk * b / 2;
        for (size_t i = 0; i < b; i += 2) {
            float q0 = xb[i] / scale, q1 = xb[i + 1] / scale;
            q0 = q0 < -FP4_MAX ? -FP4_MAX : q0 > FP4_MAX ? FP4_MAX : q0;
            q1 = q1 < -FP4_MAX ? -FP4_MAX : q1 > FP4_MAX ? FP4_MAX : q1;
            pb[i / 2] = (uint8_t)(e2m1_encode(q0) | (e2m1_encode(q1) << 4));
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
            y[blk * b + i] = fp4_values[pb[i / 2] & 0xF] * scale;
            y[blk * b + i + 1] = fp4_values[pb[i / 2] >> 4] * scale;
        }
    }
    return TD_OK;
}
