/* ckpt/quant.c — scalar conversions between f32 and the checkpoint's number
 * formats (bit-exact with torch's casts), block-scaled dequantization and the
 * release-layout quantizers. Bit manipulation only: no dependence on the FPU
 * rounding mode beyond IEEE multiply and divide by powers of two. */
#include "quant.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static _Thread_local char q_err[512];

const char *
td_quant_last_error(void)
{
    return q_err;
}

__attribute__((format(printf, 2, 3)))
static td_status_t
q_fail(td_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(q_err, sizeof(q_err), fmt, ap);
    va_end(ap);
    td_error("%s", q_err);
    return st;
}

static inline uint32_t
f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float
u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
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

/* ==================================================================== */
/* scalars                                                               */
/* ==================================================================== */

float
td_quant_bf16_to_f32(uint16_t v)
{
    return u2f((uint32_t)v << 16);
}

uint16_t
td_quant_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);

    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float
td_quant_f16_to_f32(uint16_t v)
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
td_quant_f32_to_f16(float f)
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

float
td_quant_e4m3_to_f32(uint8_t v)
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
td_quant_f32_to_e4m3(float f)
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
        else
            r = (uint8_t)rne_shift((a & 0x7fffff) | 0x800000u, 14u - ((a >> 23) - 127u + 0u));
    } else {
        uint32_t odd = (a >> 20) & 1;
        a += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + odd;
        r = (uint8_t)(a >> 20);
    }
    return r | sign;
}

float
td_quant_e5m2_to_f32(uint8_t v)
{
    return td_quant_f16_to_f32((uint16_t)((uint16_t)v << 8));
}

uint8_t
td_quant_f32_to_e5m2(float f)
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
        else
            r = (uint8_t)rne_shift((a & 0x7fffff) | 0x800000u, 7u - ((a >> 23) - 127u));
    } else {
        uint32_t odd = (a >> 21) & 1;
        a += ((uint32_t)(15 - 127) << 23) + 0xfffffu + odd;
        r = (uint8_t)(a >> 21);
    }
    return r | sign;
}

float
td_quant_e8m0_to_f32(uint8_t v)
{
    if (v == 0xff)
        return u2f(0x7fc00000u);
    if (v == 0)
        return u2f(0x00400000u);             /* 2^-127 */
    return u2f((uint32_t)v << 23);
}

uint8_t
td_quant_f32_to_e8m0(float f)
{
    uint32_t u = f2u(f);
    uint32_t e = (u >> 23) & 0xff;

    if (e == 0xff)
        return 0xff;
    if ((u & 0x400000u) && ((u & 0x3fffffu) || e > 0))
        e++;
    return (uint8_t)e;
}

uint8_t
td_quant_e8m0_ceil(float t)
{
    uint32_t u = f2u(t) & 0x7fffffffu;
    uint32_t e;

    if (!(t >= 0x1p-126f))
        return 1;                            /* 2^-126: the floor (and NaN) */
    if (u >= 0x7f800000u)
        return 0xfe;
    e = (u >> 23) + ((u & 0x7fffff) != 0);
    return e > 0xfe ? 0xfe : (uint8_t)e;
}

static const float e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float
td_quant_e2m1_to_f32(uint8_t code)
{
    return e2m1_values[code & 0xf];
}

uint8_t
td_quant_f32_to_e2m1(float f)
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

/* ==================================================================== */
/* tensors                                                               */
/* ==================================================================== */

static inline uint16_t
rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t
rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t
rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32);
}

static int
q_is_f8(td_dtype_t dt)
{
    return dt == TD_DT_F8_E4M3 || dt == TD_DT_F8_E5M2;
}

/* 256-entry table for a one-byte float type. */
static void
q_table8(td_dtype_t dt, float *tab)
{
    for (int i = 0; i < 256; i++) {
        switch (dt) {
        case TD_DT_F8_E4M3: tab[i] = td_quant_e4m3_to_f32((uint8_t)i); break;
        case TD_DT_F8_E5M2: tab[i] = td_quant_e5m2_to_f32((uint8_t)i); break;
        case TD_DT_E8M0:    tab[i] = td_quant_e8m0_to_f32((uint8_t)i); break;
        case TD_DT_I8:      tab[i] = (float)(int8_t)(uint8_t)i; break;
        case TD_DT_BOOL:    tab[i] = i != 0; break;
        default:            tab[i] = (float)i; break;
        }
    }
}

/* Element i of a tensor as f32 (not for F4). */
static float
q_elem(const td_st_tensor_t *t, const float *tab8, int64_t i)
{
    const uint8_t *p = t->data;

    switch (t->dtype) {
    case TD_DT_F32:  return u2f(rd32(p + 4 * i));
    case TD_DT_BF16: return td_quant_bf16_to_f32(rd16(p + 2 * i));
    case TD_DT_F16:  return td_quant_f16_to_f32(rd16(p + 2 * i));
    case TD_DT_F64: {
        uint64_t u = rd64(p + 8 * i);
        double d;
        memcpy(&d, &u, 8);
        return (float)d;
    }
    case TD_DT_I16:  return (float)(int16_t)rd16(p + 2 * i);
    case TD_DT_U16:  return (float)rd16(p + 2 * i);
    case TD_DT_I32:  return (float)(int32_t)rd32(p + 4 * i);
    case TD_DT_U32:  return (float)rd32(p + 4 * i);
    case TD_DT_I64:  return (float)(int64_t)rd64(p + 8 * i);
    case TD_DT_U64:  return (float)rd64(p + 8 * i);
    default:         return tab8[p[i]];
    }
}

td_status_t
td_quant_to_f32(const td_st_tensor_t *t, float *out)
{
    int64_t n = td_st_numel(t);
    float tab[256];

    q_err[0] = '\0';
    if ((unsigned)t->dtype >= TD_DT_COUNT)
        return q_fail(TD_ERR_INVALID, "tensor '%s': unknown dtype", t->name);
    if (t->dtype == TD_DT_F4) {
        const uint8_t *p = t->data;
        for (int64_t i = 0; i < n; i++)
            out[i] = e2m1_values[(p[i / 2] >> (4 * (i & 1))) & 0xf];
        return TD_OK;
    }
    q_table8(t->dtype, tab);
    for (int64_t i = 0; i < n; i++)
        out[i] = q_elem(t, tab, i);
    return TD_OK;
}

static void
q_shape(char *buf, size_t len, const td_st_tensor_t *t)
{
    size_t off = (size_t)snprintf(buf, len, "[");

    for (int i = 0; i < t->ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%" PRId64, i ? "," : "", t->shape[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
}

/* Scale factor k of a scale tensor; stab is the ue8m0 table for byte scales. */
static inline float
q_scale_at(const td_st_tensor_t *s, const float *stab, int64_t k)
{
    if (s->dtype == TD_DT_E8M0 || s->dtype == TD_DT_U8)
        return stab[((const uint8_t *)s->data)[k]];
    return q_elem(s, stab, k);
}

td_status_t
td_quant_dequant(const td_st_tensor_t *w, const td_st_tensor_t *s, int block_rows,
                 int block_cols, float *out)
{
    char ws[128], ss[128];
    int64_t R, C, SR, SC;
    float tab[256], stab[256];
    const uint8_t *q;

    q_err[0] = '\0';
    if (s == NULL)
        return td_quant_to_f32(w, out);
    q_shape(ws, sizeof(ws), w);
    q_shape(ss, sizeof(ss), s);
    if (s->dtype != TD_DT_E8M0 && s->dtype != TD_DT_U8 && s->dtype != TD_DT_F32 &&
        s->dtype != TD_DT_BF16 && s->dtype != TD_DT_F16)
        return q_fail(TD_ERR_INVALID, "tensor '%s': scale '%s' has dtype %s; a block scale is "
                      "F8_E8M0, U8, F32, BF16 or F16", w->name, s->name, td_dtype_name(s->dtype));
    if (w->ndim != 2 || s->ndim != 2)
        return q_fail(TD_ERR_INVALID, "tensor '%s' %s: block-scaled weights and their scale '%s' "
                      "%s must be 2-D", w->name, ws, s->name, ss);
    if (block_rows < 0 || block_cols < 0)
        return q_fail(TD_ERR_INVALID, "tensor '%s': negative block size", w->name);
    R = w->shape[0];
    C = w->shape[1];
    SR = s->shape[0];
    SC = s->shape[1];
    q = w->data;
    q_table8(TD_DT_E8M0, stab);

    if (q_is_f8(w->dtype)) {
        int64_t br = block_rows, bc = block_cols;

        if (br == 0 && bc == 0) {
            if (SR <= 0 || SC <= 0 || R % SR != 0 || C % SC != 0)
                return q_fail(TD_ERR_INVALID, "tensor '%s': scale '%s' shape %s does not divide "
                              "weight shape %s; give the block size", w->name, s->name, ss, ws);
            br = R / SR;
            bc = C / SC;
        } else if (br == 0 || bc == 0) {
            return q_fail(TD_ERR_INVALID, "tensor '%s': give both block sizes or neither", w->name);
        } else if (SR != (R + br - 1) / br || SC != (C + bc - 1) / bc) {
            return q_fail(TD_ERR_INVALID, "tensor '%s': scale '%s' has shape %s, which does not "
                          "tile weight %s in %" PRId64 "x%" PRId64 " blocks (expected [%" PRId64
                          ",%" PRId64 "])", w->name, s->name, ss, ws, br, bc,
                          (R + br - 1) / br, (C + bc - 1) / bc);
        }
        q_table8(w->dtype, tab);
        for (int64_t i = 0; i < R; i++) {
            const int64_t srow = (i / br) * SC;

            for (int64_t j0 = 0; j0 < C; j0 += bc) {
                const float f = q_scale_at(s, stab, srow + j0 / bc);
                const int64_t j1 = j0 + bc < C ? j0 + bc : C;

                for (int64_t j = j0; j < j1; j++)
                    out[i * C + j] = tab[q[i * C + j]] * f;
            }
        }
        return TD_OK;
    }

    if (w->dtype == TD_DT_I8 || w->dtype == TD_DT_U8 || w->dtype == TD_DT_F4) {
        int64_t K = w->dtype == TD_DT_F4 ? C : 2 * C;
        int64_t g;

        if (SR != R || SC <= 0 || K % SC != 0)
            return q_fail(TD_ERR_INVALID, "tensor '%s': scale '%s' has shape %s; packed fp4 "
                          "weight %s (%" PRId64 " x %" PRId64 " values) needs [%" PRId64
                          ", K/group]", w->name, s->name, ss, ws, R, K, R);
        g = K / SC;
        if ((block_rows != 0 && block_rows != 1) || (block_cols != 0 && block_cols != g))
            return q_fail(TD_ERR_INVALID, "tensor '%s': scale '%s' %s gives groups of 1x%" PRId64
                          ", not %dx%d", w->name, s->name, ss, g, block_rows, block_cols);
        for (int64_t i = 0; i < R; i++) {
            for (int64_t j0 = 0; j0 < K; j0 += g) {
                const float f = q_scale_at(s, stab, i * SC + j0 / g);

                for (int64_t j = j0; j < j0 + g; j++) {
                    const int64_t e = i * K + j;   /* nibbles follow the flat order */
                    uint8_t b = q[e / 2];
                    uint8_t code = (e & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0xf);
                    out[i * K + j] = e2m1_values[code] * f;
                }
            }
        }
        return TD_OK;
    }
    return q_fail(TD_ERR_INVALID, "tensor '%s': dtype %s does not take a block scale ('%s')",
                  w->name, td_dtype_name(w->dtype), s->name);
}

int64_t
td_quant_dequant_count(const td_st_tensor_t *w, const td_st_tensor_t *scale)
{
    int64_t n = td_st_numel(w);

    if (scale != NULL && (w->dtype == TD_DT_I8 || w->dtype == TD_DT_U8))
        return 2 * n;
    return n;
}

td_status_t
td_quant_from_f32(const float *x, size_t n, td_dtype_t dt, void *out)
{
    uint8_t *o = out;

    q_err[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        uint16_t h;

        switch (dt) {
        case TD_DT_F32:
            u = f2u(x[i]);
            for (int k = 0; k < 4; k++)
                o[4 * i + k] = (uint8_t)(u >> (8 * k));
            break;
        case TD_DT_F16:
        case TD_DT_BF16:
            h = dt == TD_DT_F16 ? td_quant_f32_to_f16(x[i]) : td_quant_f32_to_bf16(x[i]);
            o[2 * i] = (uint8_t)h;
            o[2 * i + 1] = (uint8_t)(h >> 8);
            break;
        case TD_DT_F8_E4M3: o[i] = td_quant_f32_to_e4m3(x[i]); break;
        case TD_DT_F8_E5M2: o[i] = td_quant_f32_to_e5m2(x[i]); break;
        case TD_DT_E8M0:    o[i] = td_quant_f32_to_e8m0(x[i]); break;
        default:
            return q_fail(TD_ERR_UNSUPPORTED, "conversion from f32 to %s is not implemented",
                          td_dtype_name(dt));
        }
    }
    return TD_OK;
}

/* ==================================================================== */
/* quantizers                                                            */
/* ==================================================================== */

static td_status_t
q_check_input(const char *what, const float *x, int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0)
        return q_fail(TD_ERR_INVALID, "%s: negative shape [%" PRId64 ",%" PRId64 "]", what,
                      rows, cols);
    for (int64_t i = 0; i < rows * cols; i++) {
        if (!isfinite(x[i]))
            return q_fail(TD_ERR_INVALID, "%s: element %" PRId64 " (row %" PRId64 ", column %"
                          PRId64 ") is not finite", what, i, i / cols, i % cols);
    }
    return TD_OK;
}

static inline float
clampf(float v, float lim)
{
    return v > lim ? lim : (v < -lim ? -lim : v);
}

td_status_t
td_quant_fp8_block(const float *x, int64_t rows, int64_t cols, int block_rows,
                   int block_cols, uint8_t *q, uint8_t *scale)
{
    int64_t sr, sc;
    td_status_t rc;

    q_err[0] = '\0';
    if (block_rows <= 0 || block_cols <= 0)
        return q_fail(TD_ERR_INVALID, "fp8 block quantizer: block %dx%d must be positive",
                      block_rows, block_cols);
    rc = q_check_input("fp8 block quantizer", x, rows, cols);
    if (rc != TD_OK)
        return rc;
    sr = (rows + block_rows - 1) / block_rows;
    sc = (cols + block_cols - 1) / block_cols;
    for (int64_t bi = 0; bi < sr; bi++) {
        int64_t r0 = bi * block_rows, r1 = r0 + block_rows < rows ? r0 + block_rows : rows;

        for (int64_t bj = 0; bj < sc; bj++) {
            int64_t c0 = bj * block_cols, c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
            float amax = 0.0f, s;
            uint8_t code;

            for (int64_t i = r0; i < r1; i++)
                for (int64_t j = c0; j < c1; j++)
                    amax = fmaxf(amax, fabsf(x[i * cols + j]));
            code = amax == 0.0f ? 127 : td_quant_e8m0_ceil(amax * (1.0f / 448.0f));
            s = td_quant_e8m0_to_f32(code);
            scale[bi * sc + bj] = code;
            for (int64_t i = r0; i < r1; i++)
                for (int64_t j = c0; j < c1; j++)
                    q[i * cols + j] = td_quant_f32_to_e4m3(clampf(x[i * cols + j] / s, 448.0f));
        }
    }
    return TD_OK;
}

/* The ue8m0 scale of one group of n values: 2^ceil(log2(max(amax, floor) /
 * vmax)), the power of two that brings the group within +-vmax. Its code is
 * returned, its value in *s. */
static uint8_t
q_group_scale(const float *v, int64_t n, float floor, float vmax, float *s)
{
    float amax = 0.0f;

    for (int64_t j = 0; j < n; j++)
        amax = fmaxf(amax, fabsf(v[j]));
    amax = fmaxf(amax, floor);
    uint8_t code = td_quant_e8m0_ceil(amax * (1.0f / vmax));
    *s = td_quant_e8m0_to_f32(code);
    return code;
}

td_status_t
td_quant_fp4_group(const float *x, int64_t rows, int64_t cols, uint8_t *packed, uint8_t *scale)
{
    const int64_t g = 32;
    td_status_t rc;

    q_err[0] = '\0';
    if (cols % g != 0)
        return q_fail(TD_ERR_INVALID, "fp4 quantizer: %" PRId64 " columns is not a multiple of %"
                      PRId64, cols, g);
    rc = q_check_input("fp4 quantizer", x, rows, cols);
    if (rc != TD_OK)
        return rc;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j0 = 0; j0 < cols; j0 += g) {
            const float *v = x + i * cols + j0;
            float s;

            scale[i * (cols / g) + j0 / g] = q_group_scale(v, g, 6.0f * 0x1p-126f, 6.0f, &s);
            for (int64_t j = 0; j < g; j += 2) {
                uint8_t lo = td_quant_f32_to_e2m1(clampf(v[j] / s, 6.0f));
                uint8_t hi = td_quant_f32_to_e2m1(clampf(v[j + 1] / s, 6.0f));
                packed[(i * cols + j0 + j) / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
    return TD_OK;
}

td_status_t
td_quant_fp8_rows(const float *x, int64_t rows, int64_t cols, int group, uint8_t *q,
                  uint8_t *scale)
{
    td_status_t rc;

    q_err[0] = '\0';
    if (group <= 0 || cols % group != 0)
        return q_fail(TD_ERR_INVALID, "fp8 row quantizer: %" PRId64 " columns is not a multiple "
                      "of the group %d", cols, group);
    rc = q_check_input("fp8 row quantizer", x, rows, cols);
    if (rc != TD_OK)
        return rc;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j0 = 0; j0 < cols; j0 += group) {
            const float *v = x + i * cols + j0;
            float s;

            scale[i * (cols / group) + j0 / group] = q_group_scale(v, group, 1e-4f, 448.0f, &s);
            for (int64_t j = 0; j < group; j++)
                q[i * cols + j0 + j] = td_quant_f32_to_e4m3(clampf(v[j] / s, 448.0f));
        }
    }
    return TD_OK;
}
