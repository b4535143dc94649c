/* kernels/cuda/emu/include/cuda_fp16.h — __half and its conversions for the
 * SIMT emulation, with CUDA's rounding (to nearest even, subnormals kept,
 * overflow to infinity, NaN to 0x7FFF). C++ only. These conversions (here and
 * in cuda_bf16.h, cuda_fp8.h) are written apart from td_numfmt on purpose:
 * they follow CUDA's NaN codes and saturation modes, not torch's, and
 * test_simt checks the two against each other. */
#ifndef TD_SIMT_CUDA_FP16_H
#define TD_SIMT_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime_api.h"

namespace td_simt {

inline uint32_t
f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

inline float
bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* f32 -> IEEE binary16, round to nearest even. */
inline uint16_t
f32_to_f16(float f)
{
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7fff;                        /* NaN */
    if (a >= 0x477ff000u)                     /* >= 65520: rounds past the largest */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                    /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u)                  /* below half the smallest subnormal */
            return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;             /* value = m 2^(e-150) = q 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);  /* round the 13 dropped bits */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

inline float
f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0x1f)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;  /* m * 2^-24 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace td_simt

struct __half_raw {
    unsigned short x;
};
struct __half2_raw {
    unsigned short x, y;
};

struct __half {
    unsigned short __x;
    __half() = default;
    __half(const __half_raw &r) : __x(r.x) {}
    __half(float f) : __x(td_simt::f32_to_f16(f)) {}
    operator float() const { return td_simt::f16_to_f32(__x); }
    operator __half_raw() const { return __half_raw{ __x }; }
};

struct __half2 {
    __half x, y;
};

inline __half
__float2half(float f)
{
    return __half(f);
}
inline __half
__float2half_rn(float f)
{
    return __half(f);
}
inline float
__half2float(__half h)
{
    return td_simt::f16_to_f32(h.__x);
}
inline unsigned short
__half_as_ushort(__half h)
{
    return h.__x;
}
inline __half
__ushort_as_half(unsigned short u)
{
    return __half(__half_raw{ u });
}

#endif
