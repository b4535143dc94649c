/* kernels/numfmt/numfmt.c — scalar conversions between f32 and the number
 * formats of the DeepSeek-V4.1 checkpoint and cache, bit-exact with torch's
 * casts. Bit manipulation only: nothing depends on the FPU rounding mode. */
#include "numfmt.h"

#include <math.h>
#include <pthread.h>

static inline uint32_t
f2u(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float
u2f(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

/* m >> shift rounded to nearest, ties to even; shift >= 1. */
static inline uint32_t
rne_shift(uint32_t m, unsigned shift)
{
    uint32_t q, rem, half;

    if (shift >= 32)
        return 0;   /* m < 2^31 here, so below half of one unit */
    q = m >> shift;
    rem = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

/* The magnitude a (f32 bits, finite, below the format's overflow) rounded to
 * nearest even on the grid of a binary float with `mbits` mantissa bits and
 * exponent bias `bias`, as that format's code: exponent field << mbits |
 * mantissa. Below the smallest normal (2^(1 - bias)) the grid is the
 * subnormal one, 2^(1 - bias - mbits); f32 subnormals are far below it. */
static inline uint32_t
round_to_grid(uint32_t a, unsigned mbits, unsigned bias)
{
    const uint32_t min_normal = (128u - bias) << 23;   /* 2^(1 - bias) as f32 bits */
    const unsigned drop = 23 - mbits;

    if (a < min_normal) {
        if (a < 0x00800000u)
            return 0;
        /* value / grid = (m | 2^23) * 2^(E - 127 - 23 - (1 - bias - mbits)) */
        return rne_shift((a & 0x7fffff) | 0x800000u, drop + (min_normal >> 23) - (a >> 23));
    }
    /* rebias the exponent, then drop the low bits with a carry into it */
    a += ((bias - 127u) << 23) + (1u << (drop - 1)) - 1 + ((a >> drop) & 1);
    return a >> drop;
}

/* ---- 16-bit floats ---------------------------------------------------------- */

uint16_t
td_numfmt_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);

    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float
td_numfmt_f16_to_f32(uint16_t v)
{
    uint32_t sign = (uint32_t)(v & 0x8000) << 16;
    uint32_t e = (v >> 10) & 0x1f, m = v & 0x3ff;

    if (e == 0x1f)
        return u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float x = (float)m * 0x1p-24f;   /* exact */
        return sign ? -x : x;
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t
td_numfmt_f32_to_f16(float f)
{
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;

    if (a > 0x7f800000u)
        return sign | 0x7e00;
    if (a >= 0x477ff000u)          /* >= 65520: rounds to inf */
        return sign | 0x7c00;
    return sign | (uint16_t)round_to_grid(a, 10, 15);
}

/* ---- fp8 -------------------------------------------------------------------- */

float
td_numfmt_e4m3_to_f32(uint8_t v)
{
    uint32_t e = (v >> 3) & 0xf, m = v & 7;
    float x;

    if (e == 0xf && m == 7)
        return u2f(((uint32_t)(v & 0x80) << 24) | 0x7fc00000u);
    if (e == 0)
        x = (float)m * 0x1p-9f;
    else
        x = u2f(((e + 120) << 23) | (m << 20));
    return (v & 0x80) ? -x : x;
}

uint8_t
td_numfmt_f32_to_e4m3(float f)
{
    uint32_t u = f2u(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;

    if (a >= 0x43f00000u)                    /* 480 (past the tie at 464), inf, NaN */
        return sign | 0x7f;
    return sign | (uint8_t)round_to_grid(a, 3, 7);
}

float
td_numfmt_e5m2_to_f32(uint8_t v)
{
    return td_numfmt_f16_to_f32((uint16_t)((uint16_t)v << 8));
}

uint8_t
td_numfmt_f32_to_e5m2(float f)
{
    uint32_t u = f2u(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;

    if (a >= (143u << 23))                   /* 65536, inf, NaN */
        return sign | (a > 0x7f800000u ? 0x7f : 0x7c);
    return sign | (uint8_t)round_to_grid(a, 2, 15);
}

/* ---- ue8m0 ------------------------------------------------------------------ */

float
td_numfmt_e8m0_to_f32(uint8_t v)
{
    if (v == 0xff)
        return u2f(0x7fc00000u);
    if (v == 0)
        return u2f(0x00400000u);             /* 2^-127 */
    return u2f((uint32_t)v << 23);
}

uint8_t
td_numfmt_f32_to_e8m0(float f)
{
    uint32_t u = f2u(f);
    uint32_t e = (u >> 23) & 0xff;

    if (e == 0xff)
        return 0xff;
    if ((u & 0x400000u) && ((u & 0x3fffffu) || e > 0))
        e++;
    return (uint8_t)e;
}

int
td_numfmt_pow2_ceil_exp(float t)
{
    uint32_t u = f2u(t);

    return (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffff) != 0);
}

uint8_t
td_numfmt_e8m0_ceil(float t)
{
    int k;

    if (!(t >= 0x1p-126f))
        return 1;                            /* 2^-126: the floor (and NaN) */
    if (isinf(t))
        return 0xfe;
    k = td_numfmt_pow2_ceil_exp(t) + 127;
    return k > 0xfe ? 0xfe : (uint8_t)k;
}

/* ---- fp4 -------------------------------------------------------------------- */

static const float e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float
td_numfmt_e2m1_to_f32(uint8_t code)
{
    return e2m1_values[code & 0xf];
}

uint8_t
td_numfmt_f32_to_e2m1(float f)
{
    float a = fabsf(f);
    uint8_t code = 0;

    /* thresholds between codes; ties go to the even code */
    code += a > 0.25f;
    code += a >= 0.75f;
    code += a > 1.25f;
    code += a >= 1.75f;
    code += a > 2.5f;
    code += a >= 3.5f;
    code += a > 5.0f;
    return (uint8_t)(code | (signbit(f) ? 8 : 0));
}

/* ---- groups ------------------------------------------------------------------ */

#define FP8_MAX 448.0f
#define FP4_MAX 6.0f

/* td_numfmt_e4m3_to_f32 of every code: the dequantizers multiply by these. */
static float group_e4m3[256];
static pthread_once_t group_once = PTHREAD_ONCE_INIT;

static void
group_init(void)
{
    for (int c = 0; c < 256; c++)
        group_e4m3[c] = td_numfmt_e4m3_to_f32((uint8_t)c);
}

/* max |x| of a group; NaN if any value is NaN. */
static float
group_amax(const float *x, size_t b)
{
    float amax = 0.0f;

    for (size_t i = 0; i < b; i++) {
        float a = fabsf(x[i]);
        if (a > amax || isnan(a))
            amax = a;
    }
    return amax;
}

static inline float
clamp(float q, float lim)
{
    return q < -lim ? -lim : q > lim ? lim : q;
}

void
td_numfmt_quant_fp8(const float *x, size_t n, size_t group, uint8_t *codes, uint8_t *scales)
{
    const float inv_max = (float)(1.0 / 448.0);

    for (size_t blk = 0; blk < n / group; blk++) {
        const float *xb = x + blk * group;
        float amax = group_amax(xb, group);
        if (amax < 1e-4f)
            amax = 1e-4f;
        int k = td_numfmt_pow2_ceil_exp(amax * inv_max);
        scales[blk] = (uint8_t)(k + 127);
        for (size_t i = 0; i < group; i++)
            codes[blk * group + i] = td_numfmt_f32_to_e4m3(clamp(ldexpf(xb[i], -k), FP8_MAX));
    }
}

void
td_numfmt_dequant_fp8(const uint8_t *codes, const uint8_t *scales, size_t n, size_t group,
                      float *y)
{
    pthread_once(&group_once, group_init);
    for (size_t blk = 0; blk < n / group; blk++) {
        int k = (int)scales[blk] - 127;
        if (k < -126 || k > 127) {            /* 2^k not a normal float: ldexpf rounds once */
            for (size_t i = 0; i < group; i++)
                y[blk * group + i] = ldexpf(group_e4m3[codes[blk * group + i]], k);
            continue;
        }
        float p = td_numfmt_e8m0_to_f32(scales[blk]);
        for (size_t i = 0; i < group; i++)
            y[blk * group + i] = group_e4m3[codes[blk * group + i]] * p;
    }
}

void
td_numfmt_quant_fp4(const float *x, size_t n, size_t group, int e4m3_scales, uint8_t *packed,
                    uint8_t *scales)
{
    const float inv_max = (float)(1.0 / 6.0);

    for (size_t blk = 0; blk < n / group; blk++) {
        const float *xb = x + blk * group;
        float amax = group_amax(xb, group), scale;
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
        uint8_t *pb = packed + blk * group / 2;
        for (size_t i = 0; i < group; i += 2) {
            uint8_t lo = td_numfmt_f32_to_e2m1(clamp(xb[i] / scale, FP4_MAX));
            uint8_t hi = td_numfmt_f32_to_e2m1(clamp(xb[i + 1] / scale, FP4_MAX));
            pb[i / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void
td_numfmt_dequant_fp4(const uint8_t *packed, const uint8_t *scales, size_t n, size_t group,
                      int e4m3_scales, float *y)
{
    pthread_once(&group_once, group_init);
    for (size_t blk = 0; blk < n / group; blk++) {
        float scale = e4m3_scales ? group_e4m3[scales[blk]]
                                  : ldexpf(1.0f, (int)scales[blk] - 127);
        const uint8_t *pb = packed + blk * group / 2;
        for (size_t i = 0; i < group; i += 2) {
            y[blk * group + i] = e2m1_values[pb[i / 2] & 0xF] * scale;
            y[blk * group + i + 1] = e2m1_values[pb[i / 2] >> 4] * scale;
        }
    }
}
