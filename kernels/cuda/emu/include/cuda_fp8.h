/* kernels/cuda/emu/include/cuda_fp8.h — the fp8 (e4m3, e5m2) conversions of
 * CUDA's cuda_fp8.h for the SIMT emulation: round to nearest even; without
 * saturation e4m3 overflows to NaN and e5m2 to infinity, with __NV_SATFINITE
 * both clamp to their largest finite value; NaN stays NaN. C++ only. */
#ifndef TD_SIMT_CUDA_FP8_H
#define TD_SIMT_CUDA_FP8_H

#include "cuda_bf16.h"
#include "cuda_fp16.h"

#include <math.h>

typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short __nv_fp8x2_storage_t;
typedef unsigned int __nv_fp8x4_storage_t;

typedef enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE } __nv_saturation_t;
typedef enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 } __nv_fp8_interpretation_t;

namespace td_simt {

/* Round x >= 0 to an integer, ties to even (x exact in a double). */
inline uint32_t
round_even(double x)
{
    double fl = floor(x), rem = x - fl;
    uint32_t q = (uint32_t)fl;
    return rem > 0.5 || (rem == 0.5 && (q & 1)) ? q + 1 : q;
}

/* The fp8 code of f. A code read as an integer is (exponent << mbits) |
 * mantissa, so a subnormal's code is its value in units of the smallest
 * subnormal, and rounding up into the next binade carries into the exponent. */
inline __nv_fp8_storage_t
f32_to_fp8(float f, __nv_saturation_t sat, __nv_fp8_interpretation_t in)
{
    const int mbits = in == __NV_E4M3 ? 3 : 2, bias = in == __NV_E4M3 ? 7 : 15;
    const uint32_t maxc = in == __NV_E4M3 ? 0x7e : 0x7b;   /* 448, 57344 */
    const uint32_t over = in == __NV_E4M3 ? 0x7f : 0x7c;   /* NaN, infinity */
    uint32_t u = f32_bits(f), a = u & 0x7fffffffu, code;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7f);
    double v = (double)bits_f32(a);
    if (a == 0x7f800000u) {
        code = maxc + 1;
    } else if (v < ldexp(1.0, 1 - bias)) {                 /* subnormal */
        code = round_even(ldexp(v, bias - 1 + mbits));
    } else {
        int e2;
        frexp(v, &e2);                                     /* v in [2^(e2-1), 2^e2) */
        int exp = e2 - 1;
        uint32_t q = round_even(ldexp(v, mbits - exp));    /* 2^mbits .. 2^(mbits+1) */
        code = ((uint32_t)(exp + bias - 1) << mbits) + q;
    }
    if (code > maxc)
        code = sat == __NV_SATFINITE ? maxc : over;
    return (uint8_t)(sign | code);
}

inline float
fp8_to_f32(__nv_fp8_storage_t c, __nv_fp8_interpretation_t in)
{
    const int mbits = in == __NV_E4M3 ? 3 : 2, bias = in == __NV_E4M3 ? 7 : 15;
    int sign = c & 0x80, e = (c & 0x7f) >> mbits, m = c & ((1 << mbits) - 1);
    float v;
    if (in == __NV_E4M3 && (c & 0x7f) == 0x7f)
        v = bits_f32(0x7fc00000u);
    else if (in == __NV_E5M2 && e == 0x1f)
        v = m ? bits_f32(0x7fc00000u) : bits_f32(0x7f800000u);
    else if (e == 0)
        v = ldexpf((float)m, 1 - bias - mbits);
    else
        v = ldexpf((float)((1 << mbits) | m), e - bias - mbits);
    return sign ? -v : v;
}

}  // namespace td_simt

inline __nv_fp8_storage_t
__nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t in)
{
    return td_simt::f32_to_fp8(x, sat, in);
}
/* .x in the low byte. */
inline __nv_fp8x2_storage_t
__nv_cvt_float2_to_fp8x2(float2 x, __nv_saturation_t sat, __nv_fp8_interpretation_t in)
{
    return (__nv_fp8x2_storage_t)(td_simt::f32_to_fp8(x.x, sat, in) |
                                  (td_simt::f32_to_fp8(x.y, sat, in) << 8));
}
/* Exact: every e4m3 and e5m2 value is a binary16 value. */
inline __half_raw
__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t in)
{
    return __half_raw{ td_simt::f32_to_f16(td_simt::fp8_to_f32(x, in)) };
}
inline __half2_raw
__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t x, __nv_fp8_interpretation_t in)
{
    return __half2_raw{ td_simt::f32_to_f16(td_simt::fp8_to_f32((uint8_t)x, in)),
                        td_simt::f32_to_f16(td_simt::fp8_to_f32((uint8_t)(x >> 8), in)) };
}

struct __nv_fp8_e4m3 {
    __nv_fp8_storage_t __x;
    __nv_fp8_e4m3() = default;
    explicit __nv_fp8_e4m3(float f) : __x(td_simt::f32_to_fp8(f, __NV_SATFINITE, __NV_E4M3)) {}
    explicit operator float() const { return td_simt::fp8_to_f32(__x, __NV_E4M3); }
};

struct __nv_fp8_e5m2 {
    __nv_fp8_storage_t __x;
    __nv_fp8_e5m2() = default;
    explicit __nv_fp8_e5m2(float f) : __x(td_simt::f32_to_fp8(f, __NV_SATFINITE, __NV_E5M2)) {}
    explicit operator float() const { return td_simt::fp8_to_f32(__x, __NV_E5M2); }
};

#endif
