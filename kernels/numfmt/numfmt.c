/* kernels/numfmt/numfmt.c — scalar conversions between f32 and the number
 * formats of the DeepSeek-V4.1 checkpoint and cache, bit-exact with torch's
 * casts. Bit manipulation only: nothing depends on the FPU rounding mode. */
#include "numfmt.h"

#include <math.h>

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
    int e;
    uint32_t m;

    if (a > 0x7f800000u)
        return sign | 0x7e00;
    if (a >= 0x477ff000u)          /* >= 65520: rounds to inf */
        return sign | 0x7c00;
    e = (int)(a >> 23) - 127;
    m = a & 0x7fffff;
    if (e >= -14) {
        /* normal: drop 13 mantissa bits; a carry walks into the exponent */
        uint32_t h = ((uint32_t)(e + 15) << 10) | (m >> 13);
        uint32_t rem = m & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
            h++;
        return sign | (uint16_t)h;
    }
    if (a < 0x00800000u)           /* f32 subnormal: far below 2^-25 */
        return sign;
    /* f16 subnormal: value / 2^-24 = (m | 2^23) * 2^(e + 1) */
    return sign | (uint16_t)rne_shift(m | 0x800000u, (unsigned)(-e - 1));
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
    uint8_t r;

    if (a >= 0x43f00000u) {                  /* 480, inf, NaN */
        r = 0x7f;
    } else if (a < (121u << 23)) {           /* below 2^-6: subnormal grid 2^-9 */
        if (a < 0x00800000u)
            r = 0;
        else   /* value / 2^-9 = (m | 2^23) * 2^(E - 141), E the exponent field */
            r = (uint8_t)rne_shift((a & 0x7fffff) | 0x800000u, 141u - (a >> 23));
    } else {
        uint32_t odd = (a >> 20) & 1;
        a += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + odd;
        r = (uint8_t)(a >> 20);
    }
    return r | sign;
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
    uint8_t r;

    if (a >= (143u << 23)) {                 /* 65536, inf, NaN */
        r = a > 0x7f800000u ? 0x7f : 0x7c;
    } else if (a < (113u << 23)) {           /* below 2^-14: subnormal grid 2^-16 */
        if (a < 0x00800000u)
            r = 0;
        else   /* value / 2^-16 = (m | 2^23) * 2^(E - 134) */
            r = (uint8_t)rne_shift((a & 0x7fffff) | 0x800000u, 134u - (a >> 23));
    } else {
        uint32_t odd = (a >> 21) & 1;
        a += ((uint32_t)(15 - 127) << 23) + 0xfffffu + odd;
        r = (uint8_t)(a >> 21);
    }
    return r | sign;
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
