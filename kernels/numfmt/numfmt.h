/* kernels/numfmt/numfmt.h — the one codec of the tree's number formats: f32 to
 * and from bf16, f16, fp8 e4m3fn and e5m2, ue8m0 (bare power-of-two scales)
 * and fp4 e2m1, with torch's rounding. The checkpoint reader (ckpt/) and the
 * cpu kernels' cache quantizers (kernels/cpu/fquant.c) both use it; the
 * formats and the reference quantizers they follow: docs/weights.md. */
#ifndef TD_NUMFMT_H
#define TD_NUMFMT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Decoders are exact. Encoders round to nearest, ties to even, like torch's
 * `.to(dtype)`: bf16 NaN -> 0x7FC0; f16 overflow -> inf, NaN -> sign|0x7E00;
 * e4m3fn never saturates (> 464, inf, NaN -> 0x7F|sign); e5m2 >= 61440 -> inf;
 * e8m0 drops the sign and rounds the exponent up at mantissa >= 0.5. */

/* bf16 is the top half of an f32. */
static inline float
td_numfmt_bf16_to_f32(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t td_numfmt_f32_to_bf16(float f);
float td_numfmt_f16_to_f32(uint16_t v);
uint16_t td_numfmt_f32_to_f16(float f);
float td_numfmt_e4m3_to_f32(uint8_t v);        /* 0x7F, 0xFF -> NaN */
uint8_t td_numfmt_f32_to_e4m3(float f);
float td_numfmt_e5m2_to_f32(uint8_t v);
uint8_t td_numfmt_f32_to_e5m2(float f);
float td_numfmt_e8m0_to_f32(uint8_t v);        /* 2^(v-127); 0xFF -> NaN */
uint8_t td_numfmt_f32_to_e8m0(float f);
float td_numfmt_e2m1_to_f32(uint8_t code);     /* low 4 bits; bit 3 = sign */
/* Nearest e2m1 code, ties to the even code, |f| > 6 -> +-6, sign from the
 * sign bit (so -0 -> 8); NaN -> 0 with its sign. */
uint8_t td_numfmt_f32_to_e2m1(float f);

/* ---- power-of-two scales ---------------------------------------------------
 * The block scale of every V4.1 layout is s = 2^ceil(log2 t), taken from the
 * bits of t (the reference's _pow2_ceil_scale, DeepSeek's fast_round_scale). */

/* ceil(log2 t) for a positive normal t: its exponent field - 127, plus one
 * when any mantissa bit is set. The formula as it stands for any bits
 * (sign ignored): a subnormal t gives -126 (or -127 for zero), inf 128,
 * NaN 129. */
int td_numfmt_pow2_ceil_exp(float t);

/* The ue8m0 code of 2^ceil(log2 t) for finite t >= 2^-126; smaller t and NaN
 * count as 2^-126 (code 1), 2^128 and above as 0xFE. */
uint8_t td_numfmt_e8m0_ceil(float t);

/* ---- groups ------------------------------------------------------------------
 * n values quantized in consecutive groups of `group` (n a multiple of group,
 * group even for fp4), one scale per group, as the V4.1 reference's
 * _fake_quant_fp8_block and _fake_quant_fp4_block do (docs/weights.md): the
 * KV cache of the forward pass, the engram tables and the fp4 experts of a
 * checkpoint. A NaN in a group makes its amax NaN (scale code 0x00 for ue8m0,
 * NaN codes for the group); the checkpoint quantizers refuse such input. */

/* fp8 e4m3 codes [n] and ue8m0 scales [n / group]: amax floored at 1e-4,
 * s = 2^ceil(log2(amax / 448)), code = e4m3(clamp(x / s, -448, 448)). */
void td_numfmt_quant_fp8(const float *x, size_t n, size_t group, uint8_t *codes,
                         uint8_t *scales);
/* y = e4m3(code) * 2^(scale - 127), exact. */
void td_numfmt_dequant_fp8(const uint8_t *codes, const uint8_t *scales, size_t n,
                           size_t group, float *y);

/* fp4 e2m1 codes packed two a byte [n / 2] (element 2k in the low nibble) and
 * scales [n / group]: ue8m0 s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)), or
 * with e4m3_scales the e4m3 code of max(amax, 6 * 2^-9) / 6 (s its value);
 * code = e2m1(clamp(x / s, -6, 6)). */
void td_numfmt_quant_fp4(const float *x, size_t n, size_t group, int e4m3_scales,
                         uint8_t *packed, uint8_t *scales);
/* y = e2m1(code) * s. */
void td_numfmt_dequant_fp4(const uint8_t *packed, const uint8_t *scales, size_t n,
                           size_t group, int e4m3_scales, float *y);

#endif
