/* kernels/cuda/device.h — the device helpers the kernels of kernels/cuda
 * share: warp reductions, and the number formats (bf16 halves of a 32-bit
 * word, fp8 e4m3 codes, ue8m0 scales, the power-of-two block scale of
 * td_numfmt) as the kernels read and write them. */
#ifndef TD_KERNELS_CUDA_DEVICE_H
#define TD_KERNELS_CUDA_DEVICE_H

#include "simt.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* The sum and the maximum over the 32 lanes, in every lane (a butterfly:
 * every lane adds in the same order, so all get the same bits). */
__device__ __forceinline__ float
td_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float
td_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The bf16 in the low and the high half of a word, exactly. */
__device__ __forceinline__ float
td_bf16_lo(uint32_t w)
{
    return __uint_as_float(w << 16);
}

__device__ __forceinline__ float
td_bf16_hi(uint32_t w)
{
    return __uint_as_float(w & 0xffff0000u);
}

/* Two floats rounded to bf16 (nearest even), lo in the low half. */
__device__ __forceinline__ uint32_t
td_bf16_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

__device__ __forceinline__ float
td_to_f32(float v)
{
    return v;
}

__device__ __forceinline__ float
td_to_f32(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T td_from_f32(float v);

template <>
__device__ __forceinline__ float
td_from_f32<float>(float v)
{
    return v;
}

template <>
__device__ __forceinline__ __nv_bfloat16
td_from_f32<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

/* An e4m3 code's value (exact through f16). */
__device__ __forceinline__ float
td_e4m3_to_f32(uint8_t c)
{
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
}

/* Four e4m3 codes of x (x.x in the low byte), rounded to nearest even,
 * clamped to +-448. */
__device__ __forceinline__ uint32_t
td_e4m3_pack4(float4 x)
{
    uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x.x, x.y), __NV_SATFINITE, __NV_E4M3);
    uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x.z, x.w), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

/* 2^(e - 127), the value of a ue8m0 scale (e < 255). */
__device__ __forceinline__ float
td_ue8m0_to_f32(uint8_t e)
{
    return e != 0 ? __uint_as_float((uint32_t)e << 23) : __uint_as_float(0x400000u);
}

/* ceil(log2 t) for a positive normal t, from its bits (td_numfmt_pow2_ceil_exp). */
__device__ __forceinline__ int
td_pow2_ceil_exp(float t)
{
    uint32_t u = __float_as_uint(t);
    return (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0);
}

/* 2^e for -126 <= e <= 127. */
__device__ __forceinline__ float
td_pow2(int e)
{
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

#endif
