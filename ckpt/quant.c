/* ckpt/quant.c — tensors in the checkpoint's number formats: elementwise
 * conversion to f32, block-scaled dequantization and the release-layout
 * quantizers, over the scalar codec of kernels/numfmt. No dependence on the
 * FPU rounding mode beyond IEEE multiply and divide by powers of two. */
#include "quant.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "numfmt.h"

/* Every failure is logged here, once, where it is decided; callers get the
 * status and log nothing more. */
#define q_fail(st, ...) (td_log_write(TD_LOG_ERROR, __VA_ARGS__), (st))

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
        case TD_DT_F8_E4M3: tab[i] = td_numfmt_e4m3_to_f32((uint8_t)i); break;
        case TD_DT_F8_E5M2: tab[i] = td_numfmt_e5m2_to_f32((uint8_t)i); break;
        case TD_DT_E8M0:    tab[i] = td_numfmt_e8m0_to_f32((uint8_t)i); break;
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
    case TD_DT_F32: {
        uint32_t u = rd32(p + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case TD_DT_BF16: return td_numfmt_bf16_to_f32(rd16(p + 2 * i));
    case TD_DT_F16:  return td_numfmt_f16_to_f32(rd16(p + 2 * i));
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

    if ((unsigned)t->dtype >= TD_DT_COUNT)
        return q_fail(TD_ERR_INVALID, "tensor '%s': unknown dtype", t->name);
    if (t->dtype == TD_DT_F4) {
        const uint8_t *p = t->data;
        for (int64_t i = 0; i < n; i++)
            out[i] = td_numfmt_e2m1_to_f32((uint8_t)(p[i / 2] >> (4 * (i & 1))));
        return TD_OK;
    }
    q_table8(t->dtype, tab);
    for (int64_t i = 0; i < n; i++)
        out[i] = q_elem(t, tab, i);
    return TD_OK;
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

    if (s == NULL)
        return td_quant_to_f32(w, out);
    td_st_shape_str(ws, sizeof(ws), w->ndim, w->shape);
    td_st_shape_str(ss, sizeof(ss), s->ndim, s->shape);
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
                    out[i * K + j] = td_numfmt_e2m1_to_f32(code) * f;
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

    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        uint16_t h;

        switch (dt) {
        case TD_DT_F32:
            memcpy(&u, &x[i], 4);
            for (int k = 0; k < 4; k++)
                o[4 * i + k] = (uint8_t)(u >> (8 * k));
            break;
        case TD_DT_F16:
        case TD_DT_BF16:
            h = dt == TD_DT_F16 ? td_numfmt_f32_to_f16(x[i]) : td_numfmt_f32_to_bf16(x[i]);
            o[2 * i] = (uint8_t)h;
            o[2 * i + 1] = (uint8_t)(h >> 8);
            break;
        case TD_DT_F8_E4M3: o[i] = td_numfmt_f32_to_e4m3(x[i]); break;
        case TD_DT_F8_E5M2: o[i] = td_numfmt_f32_to_e5m2(x[i]); break;
        case TD_DT_E8M0:    o[i] = td_numfmt_f32_to_e8m0(x[i]); break;
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
            code = amax == 0.0f ? 127 : td_numfmt_e8m0_ceil(amax * (1.0f / 448.0f));
            s = td_numfmt_e8m0_to_f32(code);
            scale[bi * sc + bj] = code;
            for (int64_t i = r0; i < r1; i++)
                for (int64_t j = c0; j < c1; j++)
                    q[i * cols + j] = td_numfmt_f32_to_e4m3(clampf(x[i * cols + j] / s, 448.0f));
        }
    }
    return TD_OK;
}

td_status_t
td_quant_fp4_group(const float *x, int64_t rows, int64_t cols, uint8_t *packed, uint8_t *scale)
{
    const int64_t g = 32;
    td_status_t rc;

    if (cols % g != 0)
        return q_fail(TD_ERR_INVALID, "fp4 quantizer: %" PRId64 " columns is not a multiple of %"
                      PRId64, cols, g);
    rc = q_check_input("fp4 quantizer", x, rows, cols);
    if (rc != TD_OK)
        return rc;
    /* rows of whole groups: the groups follow the flat order */
    td_numfmt_quant_fp4(x, (size_t)(rows * cols), (size_t)g, 0, packed, scale);
    return TD_OK;
}

td_status_t
td_quant_fp8_rows(const float *x, int64_t rows, int64_t cols, int group, uint8_t *q,
                  uint8_t *scale)
{
    td_status_t rc;

    if (group <= 0 || cols % group != 0)
        return q_fail(TD_ERR_INVALID, "fp8 row quantizer: %" PRId64 " columns is not a multiple "
                      "of the group %d", cols, group);
    rc = q_check_input("fp8 row quantizer", x, rows, cols);
    if (rc != TD_OK)
        return rc;
    td_numfmt_quant_fp8(x, (size_t)(rows * cols), (size_t)group, q, scale);
    return TD_OK;
}
