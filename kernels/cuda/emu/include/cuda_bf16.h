/* kernels/cuda/emu/include/cuda_bf16.h — __nv_bfloat16 and its conversions
 * for the SIMT emulation, with CUDA's rounding (to nearest even, NaN to
 * 0x7FFF). C++ only. */
#ifndef TD_SIMT_CUDA_BF16_H
#define TD_SIMT_CUDA_BF16_H

#include "cuda_fp16.h"

namespace td_simt {

inline uint16_t
f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

inline float
bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

}  // namespace td_simt

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(td_simt::f32_to_bf16(f)) {}
    operator float() const { return td_simt::bf16_to_f32(__x); }
};

struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline __nv_bfloat16
__float2bfloat16(float f)
{
    return __nv_bfloat16(f);
}
inline __nv_bfloat16
__float2bfloat16_rn(float f)
{
    return __nv_bfloat16(f);
}
inline float
__bfloat162float(__nv_bfloat16 b)
{
    return td_simt::bf16_to_f32(b.__x);
}
inline unsigned short
__bfloat16_as_ushort(__nv_bfloat16 b)
{
    return b.__x;
}
inline __nv_bfloat16
__ushort_as_bfloat16(unsigned short u)
{
    __nv_bfloat16 b;
    b.__x = u;
    return b;
}
/* .x = a, .y = b (x in the low half of the 32-bit word). */
inline __nv_bfloat162
__floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162{ __nv_bfloat16(a), __nv_bfloat16(b) };
}
inline __nv_bfloat162
__float22bfloat162_rn(float2 v)
{
    return __floats2bfloat162_rn(v.x, v.y);
}
inline float2
__bfloat1622float2(__nv_bfloat162 v)
{
    return make_float2(__bfloat162float(v.x), __bfloat162float(v.y));
}
inline float
__low2float(__nv_bfloat162 v)
{
    return __bfloat162float(v.x);
}
inline float
__high2float(__nv_bfloat162 v)
{
    return __bfloat162float(v.y);
}

#endif
