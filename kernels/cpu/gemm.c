/* kernels/cpu/gemm.c — the linears: weights prepared once (td_kernels_mat_t:
 * in their stored format — fp8 or fp4 codes with ue8m0 scales, bf16, f32 —
 * columns in 16-wide k-major panels) and y = x . w^T summed in one order per
 * output element fixed by the weights' shape alone, so no row count, tile,
 * thread count, code path or storage format changes a bit. Codes are
 * dequantized inside the kernels, sixteen columns at a time, into registers:
 * never into a copy of the matrix. */
#include "cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "numfmt.h"

/* ---- the order ------------------------------------------------------------------
 * It is the order of the OpenBLAS 0.3.21 sgemm calls (on 32 rows, AVX-512
 * kernels) the linears were computed with before, so results are those of
 * that code bit for bit (docs/forward.md). For weights [n, k]:
 *
 * "lanes" when k >= 32, n <= 37 and 32 n k <= 1e6: sixteen sums, sum l
 *   taking fma(x[i], w[i], s) for i = l, l + 16, ... from s = +0; then
 *   q_b = (s_4b + s_4b+1) + (s_4b+2 + s_4b+3), y = (q_0 + q_1) + (q_2 + q_3).
 *   The weights stay rows [n, k].
 * "blocks" otherwise: k in blocks (320 while 640 or more remain, then the
 *   rest, halved and rounded up to 16 when above 320); each block one fma
 *   chain a from +0 in order of i; y = a + y over the blocks from y = +0.
 *   The weights are panels [n / 16][k][16] (columns past n zero).
 *
 * Both code paths (portable scalar, AVX-512) compute exactly this. */

#define GEMM_Q 320
#define GEMM_PANEL 16

/* How a matrix's values are stored. fp8 and fp4 keep the checkpoint's codes
 * (panels only) with one ue8m0 scale per column and 32 values of k. */
enum { GEMM_F32, GEMM_BF16, GEMM_FP8, GEMM_FP4, GEMM_NFMT };

struct td_kernels_mat {
    size_t groups, n, k;
    int fmt;                /* GEMM_* */
    int lanes;              /* the lanes order: rows [n, k]; else panels */
    size_t panels;          /* per group: ceil(n / 16) */
    size_t group_elems;     /* stored values per group */
    size_t k32;             /* fp8, fp4: ceil(k / 32) scales per column */
    void *data;             /* [groups][...] f32, bf16, e4m3 codes or packed e2m1 */
    uint8_t *scales;        /* fp8, fp4: [groups][panels][k32][16] ue8m0; else NULL */
    size_t bytes;
};

static int
gemm_is_lanes(size_t n, size_t k)
{
    return k >= 32 && n <= 37 && 32.0 * (double)n * (double)k <= 1e6;
}

/* The length of the block that starts with `left` values of k to go. */
static size_t
gemm_block(size_t left)
{
    if (left >= 2 * GEMM_Q)
        return GEMM_Q;
    if (left > GEMM_Q)
        return (left / 2 + 15) / 16 * 16;
    return left;
}

/* ---- preparing weights ------------------------------------------------------------ */

/* A matrix of groups x [n, k] in format fmt with its arrays, unfilled
 * (zero): panels, or rows where the shape takes the lanes order. */
static td_status_t
gemm_mat_alloc(int fmt, size_t groups, size_t n, size_t k, td_kernels_mat_t **out)
{
    static const size_t esz2[GEMM_NFMT] = { 8, 4, 2, 1 };   /* twice the bytes a value */
    if (groups == 0 || n == 0 || k == 0 || n > SIZE_MAX / k / groups / 8)
        return td_kernels_fail(TD_ERR_INVALID, "mat_create: %zu groups of %zu x %zu",
                               groups, n, k);
    td_kernels_mat_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return td_kernels_fail(TD_ERR_NOMEM, "mat_create: %zu x %zu", n, k);
    m->groups = groups;
    m->n = n;
    m->k = k;
    m->fmt = fmt;
    m->lanes = fmt <= GEMM_BF16 && gemm_is_lanes(n, k);
    m->panels = (n + GEMM_PANEL - 1) / GEMM_PANEL;
    m->group_elems = m->lanes ? n * k : m->panels * GEMM_PANEL * k;
    m->k32 = (k + 31) / 32;
    size_t data = (groups * m->group_elems * esz2[fmt] / 2 + 63) / 64 * 64;
    size_t scales = fmt >= GEMM_FP8 ? groups * m->panels * m->k32 * GEMM_PANEL : 0;
    m->bytes = data + (scales + 63) / 64 * 64;
    m->data = aligned_alloc(64, m->bytes);
    if (m->data == NULL) {
        size_t bytes = m->bytes;
        free(m);
        return td_kernels_fail(TD_ERR_NOMEM, "mat_create: %zu bytes", bytes);
    }
    memset(m->data, 0, m->bytes);
    m->scales = scales ? (uint8_t *)m->data + data : NULL;
    *out = m;
    return TD_OK;
}

/* Where value (c, i) of group g is stored: an element index (f32, bf16,
 * fp8: a byte; fp4: a nibble, the low one for even i). */
static inline size_t
gemm_at(const td_kernels_mat_t *w, size_t g, size_t c, size_t i)
{
    if (w->fmt == GEMM_FP4)
        return 2 * (g * w->group_elems / 2 +
                    ((c / GEMM_PANEL) * (w->k / 2) + i / 2) * GEMM_PANEL + c % GEMM_PANEL) +
               i % 2;
    return g * w->group_elems +
           (w->lanes ? c * w->k + i
                     : ((c / GEMM_PANEL) * w->k + i) * GEMM_PANEL + c % GEMM_PANEL);
}

/* The scale byte of (c, i) in group g (fp8, fp4). */
static inline uint8_t *
gemm_scale_at(const td_kernels_mat_t *w, size_t g, size_t c, size_t i)
{
    return w->scales + ((g * w->panels + c / GEMM_PANEL) * w->k32 + i / 32) * GEMM_PANEL +
           c % GEMM_PANEL;
}

td_status_t
td_kernels_cpu_mat_create(const float *w, size_t groups, size_t n, size_t k,
                          td_kernels_mat_t **out)
{
    if (w == NULL || out == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "mat_create: NULL argument");
    int bf16 = 1;
    for (size_t i = 0; groups * n * k < SIZE_MAX / 8 && i < groups * n * k && bf16; i++) {
        uint32_t u;
        memcpy(&u, &w[i], sizeof(u));
        bf16 = (u & 0xFFFF) == 0;
    }
    td_kernels_mat_t *m;
    td_status_t st = gemm_mat_alloc(bf16 ? GEMM_BF16 : GEMM_F32, groups, n, k, &m);
    if (st != TD_OK)
        return st;
    for (size_t g = 0; g < groups; g++)
        for (size_t c = 0; c < n; c++)
            for (size_t i = 0; i < k; i++) {
                float v = w[(g * n + c) * k + i];
                size_t at = gemm_at(m, g, c, i);
                if (bf16) {
                    uint32_t u;
                    memcpy(&u, &v, sizeof(u));
                    ((uint16_t *)m->data)[at] = (uint16_t)(u >> 16);
                } else {
                    ((float *)m->data)[at] = v;
                }
            }
    *out = m;
    return TD_OK;
}

/* ---- weights in their stored formats ---------------------------------------------- */

/* Whether src can be kept as it is: bf16 always; fp8 and fp4 where the
 * shape takes the panels (the lanes order's small matrices are widened)
 * when every scale is in [1, 134] (the kernels' power-of-two arithmetic is
 * exact there: fp8 takes 2^120 * 2^(s - 127) as one f32) and no e4m3 code
 * is NaN; the rest is widened by the caller. */
static int
gemm_keeps(const td_kernels_wsrc_t *src, size_t groups, size_t n, size_t k)
{
    size_t N = groups * n;
    if (src->fmt == TD_KERNELS_W_BF16)
        return 1;
    if (gemm_is_lanes(n, k))
        return 0;
    size_t ns = src->fmt == TD_KERNELS_W_FP8_BLOCK
                    ? ((N + src->block_rows - 1) / src->block_rows) * ((k + 31) / 32 * 32 / src->block_cols)
                    : N * (k / 32);
    for (size_t i = 0; i < ns; i++)
        if (src->scales[i] < 1 || src->scales[i] > 134)
            return 0;
    if (src->fmt == TD_KERNELS_W_FP8_BLOCK) {
        const uint8_t *q = src->data;
        for (size_t i = 0; i < N * k; i++)
            if ((q[i] & 0x7F) == 0x7F)
                return 0;
    }
    return 1;
}

/* Value (r, i) of src [N, k] as f32: the checkpoint reader's arithmetic
 * (one product of the code's value and the scale). */
static float
gemm_src_value(const td_kernels_wsrc_t *src, size_t k, size_t r, size_t i)
{
    const uint8_t *q = src->data;
    switch (src->fmt) {
    case TD_KERNELS_W_BF16: {
        uint16_t h;
        memcpy(&h, q + 2 * (r * k + i), sizeof(h));
        return td_numfmt_bf16_to_f32(h);
    }
    case TD_KERNELS_W_FP8_BLOCK: {
        size_t sc = (k + src->block_cols - 1) / src->block_cols;
        uint8_t s = src->scales[(r / src->block_rows) * sc + i / src->block_cols];
        return td_numfmt_e4m3_to_f32(q[r * k + i]) * td_numfmt_e8m0_to_f32(s);
    }
    case TD_KERNELS_W_FP4_K32: {
        size_t e = r * k + i;
        uint8_t code = (uint8_t)(q[e / 2] >> (4 * (e & 1)));
        return td_numfmt_e2m1_to_f32(code & 0xF) *
               td_numfmt_e8m0_to_f32(src->scales[r * (k / 32) + i / 32]);
    }
    case TD_KERNELS_W_F32:
    case TD_KERNELS_W_FP8_ROWS:
        break;   /* tables: gemm_src_bad rejects them */
    }
    return 0.0f;
}

/* The checks of mat_create_fmt's arguments; NULL when they hold, else why. */
static const char *
gemm_src_bad(const td_kernels_wsrc_t *src, size_t groups, size_t n, size_t k)
{
    if (src == NULL || src->data == NULL)
        return "NULL argument";
    if (src->fmt != TD_KERNELS_W_BF16 && src->fmt != TD_KERNELS_W_FP8_BLOCK &&
        src->fmt != TD_KERNELS_W_FP4_K32)
        return "unknown format";
    if (src->fmt != TD_KERNELS_W_BF16 && src->scales == NULL)
        return "no scales";
    if (src->fmt == TD_KERNELS_W_FP8_BLOCK &&
        (src->block_rows == 0 || src->block_cols == 0 || src->block_cols % 32 != 0))
        return "fp8 blocks must be r x 32c";
    if (src->fmt == TD_KERNELS_W_FP4_K32 && k % 32 != 0)
        return "fp4 needs k a multiple of 32";
    if (groups == 0 || n == 0 || k == 0 || n > SIZE_MAX / k / groups / 8)
        return "bad shape";
    return NULL;
}

/* Fill m (fp8 or fp4) from src: codes into panels, scales per column. */
static void
gemm_fill_codes(td_kernels_mat_t *m, const td_kernels_wsrc_t *src)
{
    const uint8_t *q = src->data;
    uint8_t *d = m->data;
    size_t k = m->k, sc = src->fmt == TD_KERNELS_W_FP8_BLOCK
                              ? (k + src->block_cols - 1) / src->block_cols : k / 32;
    for (size_t g = 0; g < m->groups; g++)
        for (size_t c = 0; c < m->n; c++) {
            size_t r = g * m->n + c;
            for (size_t i = 0; i < k; i++) {
                size_t at = gemm_at(m, g, c, i);
                if (m->fmt == GEMM_FP8) {
                    d[at] = q[r * k + i];
                } else {
                    size_t e = r * k + i;
                    uint8_t code = (uint8_t)((q[e / 2] >> (4 * (e & 1))) & 0xF);
                    d[at / 2] |= (uint8_t)(code << (4 * (at & 1)));
                }
            }
            for (size_t i = 0; i < k; i += 32)
                *gemm_scale_at(m, g, c, i) =
                    m->fmt == GEMM_FP8
                        ? src->scales[(r / src->block_rows) * sc + i / src->block_cols]
                        : src->scales[r * sc + i / 32];
        }
}

td_status_t
td_kernels_cpu_mat_create_fmt(const td_kernels_wsrc_t *src, size_t groups, size_t n,
                              size_t k, td_kernels_mat_t **out)
{
    const char *bad = gemm_src_bad(src, groups, n, k);
    if (bad != NULL || out == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "mat_create_fmt: %s", bad ? bad : "NULL out");
    td_kernels_mat_t *m;
    td_status_t st;
    if (!gemm_keeps(src, groups, n, k)) {
        /* widened: exactly the values the checkpoint reader gives */
        float *w = malloc(groups * n * k * sizeof(float));
        if (w == NULL)
            return td_kernels_fail(TD_ERR_NOMEM, "mat_create_fmt: %zu x %zu", groups * n, k);
        for (size_t r = 0; r < groups * n; r++)
            for (size_t i = 0; i < k; i++)
                w[r * k + i] = gemm_src_value(src, k, r, i);
        st = td_kernels_cpu_mat_create(w, groups, n, k, out);
        free(w);
        return st;
    }
    static const int fmts[] = { [TD_KERNELS_W_BF16] = GEMM_BF16,
                                [TD_KERNELS_W_FP8_BLOCK] = GEMM_FP8,
                                [TD_KERNELS_W_FP4_K32] = GEMM_FP4 };
    st = gemm_mat_alloc(fmts[src->fmt], groups, n, k, &m);
    if (st != TD_OK)
        return st;
    if (m->fmt == GEMM_BF16) {
        const uint8_t *q = src->data;
        for (size_t g = 0; g < groups; g++)
            for (size_t c = 0; c < n; c++)
                for (size_t i = 0; i < k; i++)
                    memcpy((uint16_t *)m->data + gemm_at(m, g, c, i),
                           q + 2 * ((g * n + c) * k + i), sizeof(uint16_t));
    } else {
        gemm_fill_codes(m, src);
    }
    *out = m;
    return TD_OK;
}

void
td_kernels_cpu_mat_destroy(td_kernels_mat_t *m)
{
    if (m == NULL)
        return;
    free(m->data);
    free(m);
}

size_t
td_kernels_cpu_mat_bytes(const td_kernels_mat_t *m)
{
    return m ? m->bytes : 0;
}

/* ---- one call ------------------------------------------------------------------- */

typedef struct {
    const td_kernels_mat_t *w;
    const float *x;         /* [m, groups, k] */
    float *y;               /* [m, groups, n] */
    size_t m;
    size_t mc, cc;          /* rows, columns (whole panels) per task */
    size_t nrt, nct;        /* tasks along rows, along columns (per group) */
} gemm_job_t;

/* Value (c, i) of group g as f32. */
static inline float
gemm_w(const td_kernels_mat_t *w, size_t g, size_t c, size_t i)
{
    size_t at = gemm_at(w, g, c, i);
    switch (w->fmt) {
    case GEMM_BF16:
        return td_numfmt_bf16_to_f32(((const uint16_t *)w->data)[at]);
    case GEMM_FP8:
        return td_numfmt_e4m3_to_f32(((const uint8_t *)w->data)[at]) *
               td_numfmt_e8m0_to_f32(*gemm_scale_at(w, g, c, i));
    case GEMM_FP4:
        return td_numfmt_e2m1_to_f32((uint8_t)(((const uint8_t *)w->data)[at / 2] >> (4 * (at & 1))) & 0xF) *
               td_numfmt_e8m0_to_f32(*gemm_scale_at(w, g, c, i));
    }
    return ((const float *)w->data)[at];
}

/* ---- portable ------------------------------------------------------------------ */

static void
gemm_portable(const gemm_job_t *j, size_t g, size_t r0, size_t r1, size_t c0, size_t c1)
{
    const td_kernels_mat_t *w = j->w;
    size_t k = w->k, ldx = w->groups * k, ldy = w->groups * w->n;

    for (size_t r = r0; r < r1; r++)
        for (size_t c = c0; c < c1; c++) {
            const float *x = j->x + r * ldx + g * k;
            float y = 0.0f;
            if (w->lanes) {
                float s[16] = { 0 };
                for (size_t i = 0; i < k; i++)
                    s[i % 16] = fmaf(x[i], gemm_w(w, g, c, i), s[i % 16]);
                float q[4];
                for (size_t b = 0; b < 4; b++)
                    q[b] = (s[4 * b] + s[4 * b + 1]) + (s[4 * b + 2] + s[4 * b + 3]);
                y = (q[0] + q[1]) + (q[2] + q[3]);
            } else {
                for (size_t i0 = 0, kb; i0 < k; i0 += kb) {
                    kb = gemm_block(k - i0);
                    float a = 0.0f;
                    for (size_t i = i0; i < i0 + kb; i++)
                        a = fmaf(x[i], gemm_w(w, g, c, i), a);
                    y = a + y;
                }
            }
            j->y[r * ldy + g * w->n + c] = y;
        }
}

/* ---- AVX-512 ---------------------------------------------------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#define GEMM_AVX512 1
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

#define GEMM_INLINE static inline __attribute__((always_inline))

GEMM_INLINE __m512
gemm_ld_f32(const float *p)
{
    return _mm512_loadu_ps(p);
}

GEMM_INLINE __m512
gemm_ld_bf16(const uint16_t *p)
{
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

GEMM_INLINE __mmask16
gemm_mask(size_t left)
{
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

GEMM_INLINE __m512
gemm_ldm_f32(const float *p, __mmask16 mk)
{
    return _mm512_maskz_loadu_ps(mk, p);
}

GEMM_INLINE __m512
gemm_ldm_bf16(const uint16_t *p, __mmask16 mk)
{
    __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The lanes order's final sum of one vector of sixteen sums. */
GEMM_INLINE float
gemm_sum_pairs(__m512 v)
{
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));   /* (l, l^1) */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));   /* + (l^2, l^3) */
    __m128 q0 = _mm512_castps512_ps128(v), q1 = _mm512_extractf32x4_ps(v, 1);
    __m128 q2 = _mm512_extractf32x4_ps(v, 2), q3 = _mm512_extractf32x4_ps(v, 3);
    return _mm_cvtss_f32(_mm_add_ss(_mm_add_ss(q0, q1), _mm_add_ss(q2, q3)));
}

/* -- lanes: k in the vector; MR rows x NR columns -- */

#define GEMM_LANES_TILE(WT, SUF, MR, NR)                                              \
    static void gemm_lanes_##SUF##_##MR##x##NR(const gemm_job_t *j, size_t g,          \
                                               size_t r, size_t c)                     \
    {                                                                                 \
        const td_kernels_mat_t *w = j->w;                                             \
        const size_t k = w->k, ldx = w->groups * k, ldy = w->groups * w->n;           \
        const float *x = j->x + r * ldx + g * k;                                      \
        const WT *wp = (const WT *)w->data + gemm_at(w, g, c, 0);                     \
        __m512 s[MR][NR];                                                             \
        _Pragma("GCC unroll 8") for (int a = 0; a < MR; a++)                          \
            _Pragma("GCC unroll 8") for (int b = 0; b < NR; b++)                      \
                s[a][b] = _mm512_setzero_ps();                                        \
        for (size_t i = 0; i < k; i += 16) {                                          \
            __mmask16 mk = gemm_mask(k - i);                                          \
            __m512 xv[MR];                                                            \
            _Pragma("GCC unroll 8") for (int a = 0; a < MR; a++)                      \
                xv[a] = _mm512_maskz_loadu_ps(mk, x + a * ldx + i);                   \
            _Pragma("GCC unroll 8") for (int b = 0; b < NR; b++) {                    \
                __m512 wv = gemm_ldm_##SUF(wp + b * k + i, mk);                       \
                _Pragma("GCC unroll 8") for (int a = 0; a < MR; a++)                  \
                    s[a][b] = _mm512_fmadd_ps(xv[a], wv, s[a][b]);                    \
            }                                                                         \
        }                                                                             \
        _Pragma("GCC unroll 8") for (int a = 0; a < MR; a++)                          \
            _Pragma("GCC unroll 8") for (int b = 0; b < NR; b++)                      \
                j->y[(r + a) * ldy + g * w->n + c + b] = gemm_sum_pairs(s[a][b]);     \
    }

#define GEMM_LANES_TILES(WT, SUF)                                                     \
    GEMM_LANES_TILE(WT, SUF, 4, 4)                                                    \
    GEMM_LANES_TILE(WT, SUF, 1, 4)                                                    \
    GEMM_LANES_TILE(WT, SUF, 4, 1)                                                    \
    GEMM_LANES_TILE(WT, SUF, 1, 1)

GEMM_LANES_TILES(float, f32)
GEMM_LANES_TILES(uint16_t, bf16)

#define GEMM_LANES_CALL(MR, NR, ...)                                                  \
    (j->w->fmt == GEMM_BF16 ? gemm_lanes_bf16_##MR##x##NR(__VA_ARGS__)                           \
                : gemm_lanes_f32_##MR##x##NR(__VA_ARGS__))

static void
gemm_lanes(const gemm_job_t *j, size_t g, size_t r0, size_t r1, size_t c0, size_t c1)
{
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        size_t c = c0;
        for (; c + 4 <= c1; c += 4)
            GEMM_LANES_CALL(4, 4, j, g, r, c);
        for (; c < c1; c++)
            GEMM_LANES_CALL(4, 1, j, g, r, c);
    }
    for (; r < r1; r++) {
        size_t c = c0;
        for (; c + 4 <= c1; c += 4)
            GEMM_LANES_CALL(1, 4, j, g, r, c);
        for (; c < c1; c++)
            GEMM_LANES_CALL(1, 1, j, g, r, c);
    }
}

/* -- blocks: columns in the vector (a panel), MR rows x CT panels -- */

/* The end of a panel tile: y = a + y (y = a + 0 for the first block). */
#define GEMM_PANEL_STORE(MR, CT)                                                      \
        _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++) {                        \
            size_t c = (p + t) * GEMM_PANEL;                                          \
            __mmask16 mk = gemm_mask(w->n - c);                                       \
            _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) {                   \
                float *yp = j->y + (r + m) * ldy + g * w->n + c;                      \
                __m512 old = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, yp); \
                _mm512_mask_storeu_ps(yp, mk, _mm512_add_ps(a[m][t], old));           \
            }                                                                         \
        }

/* Over k in [i0, i0 + kb) for rows r .. r + MR - 1 and the CT panels from
 * panel p; first: the first block (y = a + 0). */
#define GEMM_PANEL_TILE(WT, SUF, MR, CT)                                              \
    static void gemm_panel_##SUF##_##MR##x##CT(const gemm_job_t *j, size_t g,          \
                                               size_t r, size_t p, size_t i0,          \
                                               size_t kb, int first, const void *wb,   \
                                               size_t wk)                              \
    {                                                                                 \
        const td_kernels_mat_t *w = j->w;                                             \
        const size_t k = w->k, ldx = w->groups * k, ldy = w->groups * w->n;           \
        const float *x = j->x + r * ldx + g * k;                                      \
        const WT *wp = (const WT *)wb;                                                \
        __m512 a[MR][CT];                                                             \
        _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++)                         \
            _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                      \
                a[m][t] = _mm512_setzero_ps();                                        \
        for (size_t i = i0; i < i0 + kb; i++) {                                       \
            __m512 wv[CT];                                                            \
            _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                      \
                wv[t] = gemm_ld_##SUF(wp + (t * wk + i - i0) * GEMM_PANEL);           \
            _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) {                   \
                __m512 xb = _mm512_set1_ps(x[m * ldx + i]);                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                  \
                    a[m][t] = _mm512_fmadd_ps(xb, wv[t], a[m][t]);                    \
            }                                                                         \
        }                                                                             \
        GEMM_PANEL_STORE(MR, CT)                                                      \
    }

#define GEMM_PANEL_TILES(WT, SUF)                                                     \
    GEMM_PANEL_TILE(WT, SUF, 12, 2)                                                   \
    GEMM_PANEL_TILE(WT, SUF, 8, 2)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 4, 2)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 2, 2)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 1, 2)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 4, 4)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 2, 4)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 1, 4)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 12, 1)                                                   \
    GEMM_PANEL_TILE(WT, SUF, 8, 1)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 4, 1)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 2, 1)                                                    \
    GEMM_PANEL_TILE(WT, SUF, 1, 1)

GEMM_PANEL_TILES(float, f32)
GEMM_PANEL_TILES(uint16_t, bf16)

/* -- blocks over codes: sixteen columns' values made in registers ------------------
 * fp8: the code's bits moved into an f32's (e4m3's exponent and mantissa
 * sit 20 bits up, the sign 24) are its value times 2^-120, exact (subnormal
 * codes become f32 subnormals); one product with 2^(s - 7) gives the
 * correctly rounded value * 2^(s - 127), the checkpoint reader's product.
 * fp4: the code picks its value from a sixteen-entry table; one product
 * with 2^(s - 127). Scales are per column and 32 values of k. */

GEMM_INLINE __m512
gemm_fp8_scale(const uint8_t *sp)
{
    __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sp));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(s, _mm512_set1_epi32(120)), 23));
}

GEMM_INLINE __m512
gemm_fp8_vals(const uint8_t *q, __m512 s)
{
    /* sign-extended, 20 bits up: the sign fills bits 31..27, the code's
     * exponent and mantissa land in bits 26..20; keep bit 31 and 26..20 */
    __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
    __m512i b = _mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32((int)0x87F00000u));
    return _mm512_mul_ps(_mm512_castsi512_ps(b), s);
}

GEMM_INLINE __m512
gemm_fp4_scale(const uint8_t *sp)
{
    __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sp));
    return _mm512_castsi512_ps(_mm512_slli_epi32(s, 23));
}

#define GEMM_Q_STEPS_fp8(MR, CT)                                                      \
        for (; i < e; i++) {                                                          \
            __m512 wv[CT];                                                            \
            _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                      \
                wv[t] = gemm_fp8_vals(wp[t] + i * GEMM_PANEL, sv[t]);                 \
            _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) {                   \
                __m512 xb = _mm512_set1_ps(x[m * ldx + i]);                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                  \
                    a[m][t] = _mm512_fmadd_ps(xb, wv[t], a[m][t]);                    \
            }                                                                         \
        }

#define GEMM_Q_STEPS_fp4(MR, CT)                                                      \
        for (; i < e; i += 2) {                                                       \
            __m512 lo[CT], hi[CT];                                                    \
            _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++) {                    \
                __m512i v = _mm512_cvtepu8_epi32(                                     \
                    _mm_loadu_si128((const __m128i *)(wp[t] + i / 2 * GEMM_PANEL)));  \
                lo[t] = _mm512_mul_ps(_mm512_permutexvar_ps(v, tab), sv[t]);          \
                hi[t] = _mm512_mul_ps(                                                \
                    _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab), sv[t]);      \
            }                                                                         \
            _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++) {                   \
                __m512 xb = _mm512_set1_ps(x[m * ldx + i]);                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                  \
                    a[m][t] = _mm512_fmadd_ps(xb, lo[t], a[m][t]);                    \
                xb = _mm512_set1_ps(x[m * ldx + i + 1]);                              \
                _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                  \
                    a[m][t] = _mm512_fmadd_ps(xb, hi[t], a[m][t]);                    \
            }                                                                         \
        }

#define GEMM_PANEL_Q_TILE(SUF, MR, CT)                                                \
    static void gemm_panel_##SUF##_##MR##x##CT(const gemm_job_t *j, size_t g,          \
                                               size_t r, size_t p, size_t i0,          \
                                               size_t kb, int first, const void *wb,   \
                                               size_t wk)                              \
    {                                                                                 \
        (void)wb;                                                                     \
        (void)wk;                                                                     \
        const td_kernels_mat_t *w = j->w;                                             \
        const size_t k = w->k, ldx = w->groups * k, ldy = w->groups * w->n;           \
        const float *x = j->x + r * ldx + g * k;                                      \
        const __m512 tab = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f,    \
                                          6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f,     \
                                          -3.0f, -4.0f, -6.0f);                        \
        const uint8_t *wp[CT];                                                        \
        __m512 a[MR][CT];                                                             \
        (void)tab;                                                                    \
        _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                          \
            wp[t] = (const uint8_t *)w->data +                                        \
                    gemm_at(w, g, (p + t) * GEMM_PANEL, 0) / (w->fmt == GEMM_FP4 ? 2 : 1); \
        _Pragma("GCC unroll 16") for (int m = 0; m < MR; m++)                         \
            _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                      \
                a[m][t] = _mm512_setzero_ps();                                        \
        for (size_t i = i0; i < i0 + kb;) {                                           \
            size_t e = (i / 32 + 1) * 32 < i0 + kb ? (i / 32 + 1) * 32 : i0 + kb;     \
            __m512 sv[CT];                                                            \
            _Pragma("GCC unroll 8") for (int t = 0; t < CT; t++)                      \
                sv[t] = gemm_##SUF##_scale(gemm_scale_at(w, g, (p + t) * GEMM_PANEL, i)); \
            GEMM_Q_STEPS_##SUF(MR, CT)                                                \
        }                                                                             \
        GEMM_PANEL_STORE(MR, CT)                                                      \
    }

#define GEMM_PANEL_Q_TILES(SUF)                                                       \
    GEMM_PANEL_Q_TILE(SUF, 12, 2)                                                     \
    GEMM_PANEL_Q_TILE(SUF, 8, 2)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 4, 2)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 2, 2)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 1, 2)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 4, 4)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 2, 4)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 1, 4)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 12, 1)                                                     \
    GEMM_PANEL_Q_TILE(SUF, 8, 1)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 4, 1)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 2, 1)                                                      \
    GEMM_PANEL_Q_TILE(SUF, 1, 1)

GEMM_PANEL_Q_TILES(fp8)
GEMM_PANEL_Q_TILES(fp4)

/* wb, wk (f32, bf16): the weights of panel p at k = i0, panel p + t's at
 * wb + t * wk * 16 values; fp8, fp4 find theirs in the matrix. */
typedef void (*gemm_panel_fn)(const gemm_job_t *j, size_t g, size_t r, size_t p, size_t i0,
                              size_t kb, int first, const void *wb, size_t wk);

#define GEMM_PANEL_ROW(SUF, CT)                                                       \
    { gemm_panel_##SUF##_1x##CT, gemm_panel_##SUF##_2x##CT, gemm_panel_##SUF##_4x##CT,   \
      gemm_panel_##SUF##_8x##CT, gemm_panel_##SUF##_12x##CT }

#define GEMM_PANEL_FMT(SUF)                                                           \
    { GEMM_PANEL_ROW(SUF, 1), GEMM_PANEL_ROW(SUF, 2),                                 \
      { gemm_panel_##SUF##_1x4, gemm_panel_##SUF##_2x4, gemm_panel_##SUF##_4x4, NULL, NULL } }

/* [format][panels 1, 2, 4][rows 1, 2, 4, 8, 12]; 4 panels only with up to 4 rows */
static const size_t gemm_tile_rows[5] = { 1, 2, 4, 8, 12 };
static const gemm_panel_fn gemm_panel_fns[GEMM_NFMT][3][5] = {
    [GEMM_F32] = GEMM_PANEL_FMT(f32),
    [GEMM_BF16] = GEMM_PANEL_FMT(bf16),
    [GEMM_FP8] = GEMM_PANEL_FMT(fp8),
    [GEMM_FP4] = GEMM_PANEL_FMT(fp4),
};

/* Quantized panels [p, p + np) over k in [i0, i0 + kb) into tile [np][kb][16]
 * as f32: each value the one the kernels make in registers. */
static void
gemm_q_tile(const td_kernels_mat_t *w, size_t g, size_t p, size_t np, size_t i0, size_t kb,
            float *tile)
{
    const __m512 tab = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f,
                                      -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    for (size_t t = 0; t < np; t++) {
        size_t c = (p + t) * GEMM_PANEL;
        const uint8_t *wp = (const uint8_t *)w->data + gemm_at(w, g, c, 0) / (w->fmt == GEMM_FP4 ? 2 : 1);
        float *o = tile + t * kb * GEMM_PANEL;
        for (size_t i = i0; i < i0 + kb;) {
            size_t e = (i / 32 + 1) * 32 < i0 + kb ? (i / 32 + 1) * 32 : i0 + kb;
            const uint8_t *sp = gemm_scale_at(w, g, c, i);
            if (w->fmt == GEMM_FP8) {
                __m512 sv = gemm_fp8_scale(sp);
                for (; i < e; i++)
                    _mm512_storeu_ps(o + (i - i0) * GEMM_PANEL,
                                     gemm_fp8_vals(wp + i * GEMM_PANEL, sv));
            } else {
                __m512 sv = gemm_fp4_scale(sp);
                for (; i < e; i += 2) {
                    __m512i v = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i *)(wp + i / 2 * GEMM_PANEL)));
                    _mm512_storeu_ps(o + (i - i0) * GEMM_PANEL,
                                     _mm512_mul_ps(_mm512_permutexvar_ps(v, tab), sv));
                    _mm512_storeu_ps(o + (i + 1 - i0) * GEMM_PANEL,
                                     _mm512_mul_ps(_mm512_permutexvar_ps(
                                                       _mm512_srli_epi32(v, 4), tab), sv));
                }
            }
        }
    }
}

/* From this many rows a task's quantized panels are made into an f32 tile
 * once per block and run by the f32 tiles (the same values, the same
 * order); fewer rows make their values in registers, tile by tile. */
#define GEMM_Q_TILE_ROWS 5

/* Panels [p0, p1) for rows [r0, r1): block by block; per group of panels,
 * the rows in the largest tiles that fit. */
static void
gemm_panels(const gemm_job_t *j, size_t g, size_t r0, size_t r1, size_t p0, size_t p1)
{
    const td_kernels_mat_t *w = j->w;
    const size_t esz = w->fmt == GEMM_F32 ? sizeof(float) : sizeof(uint16_t);
    const int via_tile = w->fmt >= GEMM_FP8 && r1 - r0 >= GEMM_Q_TILE_ROWS;
    float tile[2 * GEMM_Q * GEMM_PANEL] __attribute__((aligned(64)));

    for (size_t i0 = 0, kb; i0 < w->k; i0 += kb) {
        kb = gemm_block(w->k - i0);
        int first = i0 == 0;
        for (size_t p = p0; p < p1;) {
            size_t np = p1 - p;
            /* few rows: 4 panels at a time (4 chains in flight), else 2 */
            int ci = r1 - r0 <= 4 && np >= 4 ? 2 : np >= 2 ? 1 : 0;
            int fmt = w->fmt;
            const void *wb = w->fmt <= GEMM_BF16
                ? (const char *)w->data + (g * w->group_elems + (p * w->k + i0) * GEMM_PANEL) * esz
                : NULL;
            size_t wk = w->k;
            if (via_tile) {
                gemm_q_tile(w, g, p, (size_t)1 << ci, i0, kb, tile);
                fmt = GEMM_F32;
                wb = tile;
                wk = kb;
            }
            size_t r = r0;
            for (int ri = ci == 2 ? 2 : 4; ri >= 0; ri--)
                for (; r + gemm_tile_rows[ri] <= r1; r += gemm_tile_rows[ri])
                    gemm_panel_fns[fmt][ci][ri](j, g, r, p, i0, kb, first, wb, wk);
            p += (size_t)1 << ci;
        }
    }
}

#pragma GCC pop_options

static int
gemm_have_avx512(void)
{
    return (td_kernels_cpu_isa() & TD_KERNELS_CPU_AVX512) != 0;
}
#endif

/* ---- tasks ---------------------------------------------------------------------- */

static void
gemm_task(void *arg, size_t t)
{
    const gemm_job_t *j = arg;
    const td_kernels_mat_t *w = j->w;
    size_t per_group = j->nrt * j->nct;
    size_t g = t / per_group, rt = (t % per_group) / j->nct, ct = t % j->nct;
    size_t r0 = rt * j->mc, r1 = r0 + j->mc < j->m ? r0 + j->mc : j->m;
    size_t c0 = ct * j->cc, c1 = c0 + j->cc < w->n ? c0 + j->cc : w->n;

#ifdef GEMM_AVX512
    if (gemm_have_avx512()) {
        if (w->lanes)
            gemm_lanes(j, g, r0, r1, c0, c1);
        else
            gemm_panels(j, g, r0, r1, c0 / GEMM_PANEL, (c1 + GEMM_PANEL - 1) / GEMM_PANEL);
        return;
    }
#endif
    gemm_portable(j, g, r0, r1, c0, c1);
}

td_status_t
td_kernels_cpu_linear_mat(const float *x, const td_kernels_mat_t *w, float *y, size_t m)
{
    if (x == NULL || w == NULL || y == NULL || m == 0)
        return td_kernels_fail(TD_ERR_INVALID, "linear_mat: NULL argument or no rows");
    gemm_job_t j = { w, x, y, m, 0, 0, 0, 0 };

    /* rows per task: 96 (whole 12-row tiles); columns: whole panels, about
     * 64 K weights a task (at least 4 panels) */
    j.mc = m < 96 ? m : 96;
    size_t cc = (64u << 10) / w->k / GEMM_PANEL * GEMM_PANEL;
    cc = cc < 4 * GEMM_PANEL ? 4 * GEMM_PANEL : cc;
    j.cc = cc < w->n ? cc : w->n;
    j.nrt = (m + j.mc - 1) / j.mc;
    j.nct = (w->n + j.cc - 1) / j.cc;
    size_t tasks = w->groups * j.nrt * j.nct;
    if ((double)m * (double)w->n * (double)w->k * (double)w->groups < 32768.0)
        for (size_t t = 0; t < tasks; t++)
            gemm_task(&j, t);
    else
        td_kernels_cpu_parallel(tasks, gemm_task, &j);
    return TD_OK;
}
