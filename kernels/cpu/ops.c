/* kernels/cpu/ops.c — the cpu compute ops of the forward pass: linears through
 * gemm.c, everything else as plain loops in f32 following the
 * reference's order of operations; td_kernels_cpu_ops() is the table. */
#include "cpu_ops.h"
#include "numfmt.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- argument checks ------------------------------------------------------ */

#define NEED(op, cond)                                                          \
    do {                                                                        \
        if (!(cond))                                                            \
            return td_kernels_fail(TD_ERR_INVALID, "%s: %s", op, #cond);        \
    } while (0)

static float
sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* ---- linears ----------------------------------------------------------------
 * Through prepared weights (gemm.c), whose summation order is fixed by the
 * weights' shape: a row's output depends on that row and the weights alone,
 * which makes batched decode equal to each request alone and chunked
 * prefill equal to one shot, bit for bit. */

static td_status_t
cpu_linear_groups(const float *x, const float *w, float *y, size_t m, size_t g, size_t n,
                  size_t k, int acc)
{
    td_kernels_mat_t *mat;
    float *t = NULL;
    td_status_t st = td_kernels_cpu_mat_create(w, g, n, k, &mat);
    if (st != TD_OK)
        return st;
    if (acc && (t = malloc(m * g * n * sizeof(float))) == NULL) {
        td_kernels_cpu_mat_destroy(mat);
        return td_kernels_fail(TD_ERR_NOMEM, "linear: %zu x %zu", m, n);
    }
    st = td_kernels_cpu_linear_mat(x, mat, acc ? t : y, m);
    for (size_t i = 0; acc && st == TD_OK && i < m * g * n; i++)
        y[i] += t[i];
    free(t);
    td_kernels_cpu_mat_destroy(mat);
    return st;
}

static td_status_t
cpu_linear(const float *x, const float *w, float *y, size_t m, size_t n, size_t k, int acc)
{
    NEED("linear", x != NULL && w != NULL && y != NULL);
    NEED("linear", m > 0 && n > 0 && k > 0);
    return cpu_linear_groups(x, w, y, m, 1, n, k, acc);
}

static td_status_t
cpu_linear_grouped(const float *x, const float *w, float *y, size_t m, size_t g,
                   size_t n, size_t k)
{
    NEED("linear_grouped", x != NULL && w != NULL && y != NULL);
    NEED("linear_grouped", m > 0 && g > 0 && n > 0 && k > 0);
    return cpu_linear_groups(x, w, y, m, g, n, k, 0);
}

/* ---- shared helpers ------------------------------------------------------------- */

/* Run fn over rows [0, n) in chunks on the pool: about four chunks a
 * thread, none under ~16 K units of work (row_cost units a row). Each row is
 * computed as in a plain loop, so the split changes no result. */
typedef void (*ops_rows_fn)(void *arg, size_t r0, size_t r1);

typedef struct {
    ops_rows_fn fn;
    void *arg;
    size_t n, per;
} ops_rows_t;

static void
ops_rows_task(void *arg, size_t t)
{
    const ops_rows_t *j = arg;
    size_t r0 = t * j->per, r1 = r0 + j->per < j->n ? r0 + j->per : j->n;
    j->fn(j->arg, r0, r1);
}

static void
ops_rows(size_t n, size_t row_cost, ops_rows_fn fn, void *arg)
{
    size_t threads = td_kernels_cpu_threads();
    size_t per = (n + 4 * threads - 1) / (4 * threads);
    size_t least = (16384 + row_cost) / (row_cost + 1);
    if (per < least)
        per = least;
    if (per >= n) {
        fn(arg, 0, n);
        return;
    }
    ops_rows_t j = { fn, arg, n, per };
    td_kernels_cpu_parallel((n + per - 1) / per, ops_rows_task, &j);
}

/* A per-thread scratch of at least n floats (grown, never shrunk, freed when
 * the thread exits); NULL when it cannot grow. */
typedef struct {
    float *buf;
    size_t have;
} ops_scratch_t;

static pthread_key_t ops_scratch_key;
static pthread_once_t ops_scratch_once = PTHREAD_ONCE_INIT;
static int ops_scratch_ok;

static void
ops_scratch_free(void *p)
{
    ops_scratch_t *s = p;
    free(s->buf);
    free(s);
}

static void
ops_scratch_init(void)
{
    ops_scratch_ok = pthread_key_create(&ops_scratch_key, ops_scratch_free) == 0;
}

static float *
ops_scratch(size_t n)
{
    pthread_once(&ops_scratch_once, ops_scratch_init);
    if (!ops_scratch_ok)
        return NULL;
    ops_scratch_t *s = pthread_getspecific(ops_scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL)
            return NULL;
        if (pthread_setspecific(ops_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->have) {
        float *p = realloc(s->buf, n * sizeof(float));
        if (p == NULL)
            return NULL;
        s->buf = p;
        s->have = n;
    }
    return s->buf;
}

/* a . b with eight running sums s[i % 8] += a[i] * b[i] (a product, then a
 * sum: no fused multiply-add) and ((s0 + s4) + (s1 + s5)) + ((s2 + s6) +
 * (s3 + s7)): the same value wherever the vectors come from, so attention
 * and indexer scores do not depend on how many keys or queries share a call.
 * The AVX version keeps the eight sums in one register: the same bits. */
static float
dotf_scalar(const float *a, const float *b, size_t n)
{
    float s[8] = { 0 };
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            s[j] += a[i + j] * b[i + j];
    for (; i < n; i++)
        s[i % 8] += a[i] * b[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx"))) static float
dotf_avx(const float *a, const float *b, size_t n)
{
    __m256 s = _mm256_setzero_ps();
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    if (i < n) {
        float t[8];
        _mm256_storeu_ps(t, s);
        for (; i < n; i++)
            t[i % 8] += a[i] * b[i];
        s = _mm256_loadu_ps(t);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 u = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));                     /* (s0+s4)+(s1+s5) */
    __m128 v = _mm_add_ss(_mm_shuffle_ps(h, h, 2), _mm_shuffle_ps(h, h, 3)); /* (s2+s6)+(s3+s7) */
    return _mm_cvtss_f32(_mm_add_ss(u, v));
}

/* out[4 g + c] = dotf(a + g * d, b + c * d, d) for g, c < 4: four queries
 * against four keys, sixteen independent sums (each in dotf's order). */
__attribute__((target("avx"))) static void
dotf4x4_avx(const float *a, const float *b, size_t d, float *out)
{
    __m256 s[16];
    for (int q = 0; q < 16; q++)
        s[q] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 kv[4];
        for (int c = 0; c < 4; c++)
            kv[c] = _mm256_loadu_ps(b + c * d + i);
        for (int g = 0; g < 4; g++) {
            __m256 av = _mm256_loadu_ps(a + g * d + i);
            for (int c = 0; c < 4; c++)
                s[4 * g + c] = _mm256_add_ps(s[4 * g + c], _mm256_mul_ps(av, kv[c]));
        }
    }
    for (int q = 0; q < 16; q++) {
        if (i < d) {
            float t[8];
            _mm256_storeu_ps(t, s[q]);
            for (size_t e = i; e < d; e++)
                t[e % 8] += a[(q / 4) * d + e] * b[(q % 4) * d + e];
            s[q] = _mm256_loadu_ps(t);
        }
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s[q]), _mm256_extractf128_ps(s[q], 1));
        __m128 u = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        __m128 v = _mm_add_ss(_mm_shuffle_ps(h, h, 2), _mm_shuffle_ps(h, h, 3));
        out[q] = _mm_cvtss_f32(_mm_add_ss(u, v));
    }
}

/* out[c] = dotf(a, b + c * ldb, n) for c < 4: four independent sums at once
 * (each in dotf's order). */
__attribute__((target("avx"))) static void
dotf4_avx(const float *a, const float *b, size_t ldb, size_t n, float *out)
{
    __m256 s[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                    _mm256_setzero_ps() };
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 av = _mm256_loadu_ps(a + i);
        for (int c = 0; c < 4; c++)
            s[c] = _mm256_add_ps(s[c], _mm256_mul_ps(av, _mm256_loadu_ps(b + c * ldb + i)));
    }
    for (int c = 0; c < 4; c++) {
        if (i < n) {
            float t[8];
            _mm256_storeu_ps(t, s[c]);
            for (size_t q = i; q < n; q++)
                t[q % 8] += a[q] * b[c * ldb + q];
            s[c] = _mm256_loadu_ps(t);
        }
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s[c]), _mm256_extractf128_ps(s[c], 1));
        __m128 u = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        __m128 v = _mm_add_ss(_mm_shuffle_ps(h, h, 2), _mm_shuffle_ps(h, h, 3));
        out[c] = _mm_cvtss_f32(_mm_add_ss(u, v));
    }
}

#endif

static int
ops_have_avx(void)
{
    return (td_kernels_cpu_isa() & TD_KERNELS_CPU_AVX) != 0;
}

static float
dotf(const float *a, const float *b, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (ops_have_avx())
        return dotf_avx(a, b, n);
#endif
    return dotf_scalar(a, b, n);
}

/* out[c] = dotf(a, b + c * ldb, n) for c < nb. */
static void
dotf_many(const float *a, const float *b, size_t ldb, size_t n, size_t nb, float *out)
{
    size_t c = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (ops_have_avx())
        for (; c + 4 <= nb; c += 4)
            dotf4_avx(a, b + c * ldb, ldb, n, out + c);
#endif
    for (; c < nb; c++)
        out[c] = dotf(a, b + c * ldb, n);
}

/* Element-wise loops, each element computed as the plain loop does (a
 * product, then a sum), 8 at a time where AVX is there. o may be x. */
#if defined(__x86_64__) && defined(__GNUC__)
/* o[i] = o[i] + a * x[i] */
__attribute__((target("avx"))) static void
axpy_avx(float *o, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i),
                                              _mm256_mul_ps(av, _mm256_loadu_ps(x + i))));
    for (; i < n; i++)
        o[i] = o[i] + a * x[i];
}

/* o[i] = w[i] * (x[i] * a), or x[i] * a without w */
__attribute__((target("avx"))) static void
scale_avx(float *o, const float *w, const float *x, float a, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), av);
        _mm256_storeu_ps(o + i, w ? _mm256_mul_ps(_mm256_loadu_ps(w + i), v) : v);
    }
    for (; i < n; i++)
        o[i] = w ? w[i] * (x[i] * a) : x[i] * a;
}

/* x[i] = x[i] / a */
__attribute__((target("avx"))) static void
divide_avx(float *x, size_t n, float a)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), av));
    for (; i < n; i++)
        x[i] = x[i] / a;
}
#endif

static void
divide(float *x, size_t n, float a)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (ops_have_avx()) {
        divide_avx(x, n, a);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / a;
}

static void
axpy(float *o, float a, const float *x, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (ops_have_avx()) {
        axpy_avx(o, a, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        o[i] = o[i] + a * x[i];
}

static void
scale(float *o, const float *w, const float *x, float a, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (ops_have_avx()) {
        scale_avx(o, w, x, a, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        o[i] = w ? w[i] * (x[i] * a) : x[i] * a;
}

static td_status_t
cpu_embed(const float *table, size_t rows, size_t d, const int64_t *ids, size_t n, float *y)
{
    NEED("embed", table != NULL && ids != NULL && y != NULL && d > 0 && n > 0);
    for (size_t r = 0; r < n; r++)
        if (ids[r] < 0 || (uint64_t)ids[r] >= rows)
            return td_kernels_fail(TD_ERR_RANGE, "embed: id %lld of row %zu >= %zu rows",
                                   (long long)ids[r], r, rows);
    for (size_t r = 0; r < n; r++)
        memcpy(y + r * d, table + (size_t)ids[r] * d, d * sizeof(float));
    return TD_OK;
}

static td_status_t
cpu_embed_fmt(const td_kernels_wsrc_t *t, size_t rows, size_t d, const int64_t *ids, size_t n,
              float *y)
{
    NEED("embed_fmt", t != NULL && t->data != NULL && ids != NULL && y != NULL && d > 0 && n > 0);
    NEED("embed_fmt", t->fmt == TD_KERNELS_W_F32 || t->fmt == TD_KERNELS_W_BF16 ||
                          (t->fmt == TD_KERNELS_W_FP8_ROWS && t->scales != NULL && d % 32 == 0));
    for (size_t r = 0; r < n; r++)
        if (ids[r] < 0 || (uint64_t)ids[r] >= rows)
            return td_kernels_fail(TD_ERR_RANGE, "embed_fmt: id %lld of row %zu >= %zu rows",
                                   (long long)ids[r], r, rows);
    for (size_t r = 0; r < n; r++) {
        size_t row = (size_t)ids[r];
        float *o = y + r * d;
        if (t->fmt == TD_KERNELS_W_F32) {
            memcpy(o, (const float *)t->data + row * d, d * sizeof(float));
        } else if (t->fmt == TD_KERNELS_W_BF16) {
            const unsigned char *q = (const unsigned char *)t->data + row * d * 2;
            for (size_t i = 0; i < d; i++) {
                uint16_t h;
                memcpy(&h, q + 2 * i, sizeof(h));
                o[i] = td_numfmt_bf16_to_f32(h);
            }
        } else {
            const uint8_t *q = (const uint8_t *)t->data + row * d;
            const uint8_t *sc = t->scales + row * (d / 32);
            for (size_t i = 0; i < d; i++)
                o[i] = td_numfmt_e4m3_to_f32(q[i]) * td_numfmt_e8m0_to_f32(sc[i / 32]);
        }
    }
    return TD_OK;
}

/* ---- norms and rotations ------------------------------------------------------- */

typedef struct {
    const float *x, *w;
    float eps;
    size_t d;
    float *y;
} rmsnorm_job_t;

/* Four rows at a time: four independent sums, each in the plain order. */
static void
rmsnorm_rows(void *arg, size_t r0, size_t r1)
{
    const rmsnorm_job_t *j = arg;
    size_t d = j->d;
    for (size_t r = r0; r < r1; r += 4) {
        size_t nr = r1 - r < 4 ? r1 - r : 4;
        const float *x0 = j->x + r * d;
        const float *x1 = nr > 1 ? x0 + d : x0, *x2 = nr > 2 ? x0 + 2 * d : x0;
        const float *x3 = nr > 3 ? x0 + 3 * d : x0;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (size_t i = 0; i < d; i++) {
            s0 += (double)x0[i] * x0[i];
            s1 += (double)x1[i] * x1[i];
            s2 += (double)x2[i] * x2[i];
            s3 += (double)x3[i] * x3[i];
        }
        double ss[4] = { s0, s1, s2, s3 };
        for (size_t q = 0; q < nr; q++) {
            float rs = 1.0f / sqrtf((float)(ss[q] / (double)d) + j->eps);
            scale(j->y + (r + q) * d, j->w, j->x + (r + q) * d, rs, d);
        }
    }
}

static td_status_t
cpu_rmsnorm(const float *x, const float *w, float eps, size_t n, size_t d, float *y)
{
    NEED("rmsnorm", x != NULL && y != NULL && n > 0 && d > 0);
    rmsnorm_job_t j = { x, w, eps, d, y };
    ops_rows(n, 2 * d, rmsnorm_rows, &j);
    return TD_OK;
}

static td_status_t
cpu_rope(float *x, size_t n, size_t h, size_t d, size_t rd, const int64_t *pos,
         const float *inv_freq, float scale, int inverse)
{
    NEED("rope", x != NULL && pos != NULL && inv_freq != NULL);
    NEED("rope", n > 0 && h > 0 && rd > 0 && rd % 2 == 0 && rd <= d);
    for (size_t r = 0; r < n; r++) {
        float p = (float)pos[r];
        for (size_t i = 0; i < rd / 2; i++) {
            float a = inv_freq[i] * p;
            float c = cosf(a) * scale, s = sinf(a) * scale;
            if (inverse)
                s = -s;
            for (size_t j = 0; j < h; j++) {
                float *v = x + (r * h + j) * d + (d - rd) + 2 * i;
                float e = v[0], o = v[1];
                v[0] = e * c - o * s;
                v[1] = e * s + o * c;
            }
        }
    }
    return TD_OK;
}

/* o[i] = (((0 + p[0] v[k0][i]) + p[1] v[k1][i]) + ...) over the np listed
 * rows k of v [., d]: each element summed in the listed order (a product,
 * then a sum); with AVX, 64 outputs stay in registers over all rows. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx"))) static size_t
weighted_sum_avx(float *o, const float *p, const size_t *k, size_t np, const float *v,
                 size_t d)
{
    size_t i = 0;
    for (; i + 64 <= d; i += 64) {
        __m256 a[8];
        for (int q = 0; q < 8; q++)
            a[q] = _mm256_setzero_ps();
        for (size_t c = 0; c < np; c++) {
            __m256 pc = _mm256_set1_ps(p[c]);
            const float *vr = v + k[c] * d + i;
            for (int q = 0; q < 8; q++)
                a[q] = _mm256_add_ps(a[q], _mm256_mul_ps(pc, _mm256_loadu_ps(vr + 8 * q)));
        }
        for (int q = 0; q < 8; q++)
            _mm256_storeu_ps(o + i + 8 * q, a[q]);
    }
    return i;
}
#endif

static void
weighted_sum(float *o, const float *p, const size_t *k, size_t np, const float *v, size_t d)
{
    size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (ops_have_avx())
        i = weighted_sum_avx(o, p, k, np, v, d);
#endif
    if (i == d)
        return;
    memset(o + i, 0, (d - i) * sizeof(float));
    for (size_t c = 0; c < np; c++)
        axpy(o + i, p[c], v + k[c] * d + i, d - i);
}

/* ---- attention ------------------------------------------------------------------- */

typedef struct {
    const float *q, *kv, *mask, *sink;
    float scale;
    size_t h, t, d;
    float *out;
    int nomem;
} attention_job_t;

/* (row, head) pairs [p0, p1). A masked key's score is -inf and its weight
 * exactly 0 (expf(-inf) is +0 and adds nothing), so it is skipped. */
/* The scores of queries q [hn, d] (hn <= 4 heads of one row) against the
 * keys u[0 .. nu) of kv: sc[g * t + i] = dotf(q_g, kv[u[i]]); four heads x
 * four consecutive keys share their loads. */
static void
attention_scores(const float *q, size_t hn, const float *kv, const size_t *u, size_t nu,
                 size_t d, size_t t, float *sc)
{
    float blk[16];
    for (size_t i = 0; i < nu;) {
        size_t e = i + 1;   /* a run of consecutive keys */
        while (e < nu && u[e] == u[e - 1] + 1)
            e++;
#if defined(__x86_64__) && defined(__GNUC__)
        if (hn == 4 && ops_have_avx())
            for (; i + 4 <= e; i += 4) {
                dotf4x4_avx(q, kv + u[i] * d, d, blk);
                for (size_t g = 0; g < 4; g++)
                    for (size_t c = 0; c < 4; c++)
                        sc[g * t + i + c] = blk[4 * g + c];
            }
#endif
        if (i < e)   /* what the 4 x 4 blocks left of the run (u[e] may be unset) */
            for (size_t g = 0; g < hn; g++)
                dotf_many(q + g * d, kv + u[i] * d, d, d, e - i, sc + g * t + i);
        i = e;
    }
}

/* (row, head) pairs [p0, p1), up to four heads of a row at a time. A masked
 * key's score is -inf and its weight exactly 0 (expf(-inf) is +0 and adds
 * nothing to the sum), so masked keys are left out. */
static void
attention_pairs(void *arg, size_t p0, size_t p1)
{
    attention_job_t *j = arg;
    size_t t = j->t, d = j->d, row = SIZE_MAX, nu = 0;
    /* sc [4, t] scores then weights, u [t] the row's unmasked keys, w [t] keys with a weight */
    size_t words = sizeof(size_t) / sizeof(float);
    float *sc = ops_scratch(4 * t + 2 * t * words + 2);
    if (sc == NULL) {
        j->nomem = 1;
        return;
    }
    size_t *u = (size_t *)(void *)(sc + 4 * t + ((4 * t) & 1)), *w = u + t;
    for (size_t p = p0; p < p1;) {
        size_t r = p / j->h, hd0 = p % j->h;
        size_t hn = j->h - hd0 < 4 ? j->h - hd0 : 4;
        hn = p1 - p < hn ? p1 - p : hn;
        const float *mr = j->mask ? j->mask + r * t : NULL;
        if (r != row) {   /* a row's heads share its mask */
            row = r;
            nu = 0;
            for (size_t c = 0; c < t; c++)
                if (!(mr && mr[c] == -INFINITY))
                    u[nu++] = c;
        }
        attention_scores(j->q + p * d, hn, j->kv, u, nu, d, t, sc);
        for (size_t g = 0; g < hn; g++) {
            size_t hd = hd0 + g;
            float *s = sc + g * t, *o = j->out + (p + g) * d, mx = j->sink[hd], sum = 0.0f;
            for (size_t i = 0; i < nu; i++) {
                s[i] = s[i] * j->scale + (mr ? mr[u[i]] : 0.0f);
                if (s[i] > mx)
                    mx = s[i];
            }
            for (size_t i = 0; i < nu; i++) {
                s[i] = s[i] == -INFINITY ? 0.0f : expf(s[i] - mx);
                sum += s[i];
            }
            sum += expf(j->sink[hd] - mx);
            divide(s, nu, sum);
            size_t np = 0;   /* the keys with a weight, packed at the front of s / w */
            for (size_t i = 0; i < nu; i++)
                if (s[i] != 0.0f) {
                    s[np] = s[i];
                    w[np++] = u[i];
                }
            weighted_sum(o, s, w, np, j->kv, d);
        }
        p += hn;
    }
}

static td_status_t
cpu_attention(const float *q, const float *kv, const float *mask, const float *sink,
              float scale, size_t n, size_t h, size_t t, size_t d, float *out)
{
    NEED("attention", q != NULL && kv != NULL && sink != NULL && out != NULL);
    NEED("attention", n > 0 && h > 0 && t > 0 && d > 0);
    attention_job_t j = { q, kv, mask, sink, scale, h, t, d, out, 0 };
    ops_rows(n * h, 2 * t * d, attention_pairs, &j);
    if (j.nomem)
        return td_kernels_fail(TD_ERR_NOMEM, "attention: %zu scores", t);
    return TD_OK;
}

/* ---- activations and routing ------------------------------------------------------ */

static td_status_t
cpu_swiglu(const float *g, const float *u, const float *w, size_t n, size_t f,
           float limit, float *out)
{
    NEED("swiglu", g != NULL && u != NULL && out != NULL && n > 0 && f > 0);
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < f; i++) {
            float gv = g[r * f + i], uv = u[r * f + i];
            if (limit > 0.0f) {
                uv = uv < -limit ? -limit : uv > limit ? limit : uv;
                gv = gv > limit ? limit : gv;
            }
            float y = gv / (1.0f + expf(-gv)) * uv;
            out[r * f + i] = w ? w[r] * y : y;
        }
    return TD_OK;
}

static td_status_t
cpu_score(float *x, size_t n, size_t e, td_kernels_score_t fn, float temp)
{
    NEED("score", x != NULL && n > 0 && e > 0);
    NEED("score", fn == TD_KERNELS_SCORE_SQRTSOFTPLUS || fn == TD_KERNELS_SCORE_SIGMOID);
    for (size_t i = 0; i < n * e; i++) {
        float v = x[i] / temp;
        if (fn == TD_KERNELS_SCORE_SIGMOID)
            x[i] = sigmoidf(v);
        else
            x[i] = sqrtf(v > 20.0f ? v : log1pf(expf(v)));
    }
    return TD_OK;
}

static td_status_t
cpu_route(float *logits, const float *bias, size_t n, size_t e, size_t k, td_kernels_score_t fn,
          float temp, int norm, float scale, void *ws, int32_t *experts, float *weights)
{
    NEED("route", logits != NULL && bias != NULL && ws != NULL && experts != NULL &&
                      weights != NULL && n > 0 && k > 0 && k <= e);
    float *biased = ws;
    int64_t *idx = (int64_t *)(void *)((char *)ws + (n * e * sizeof(float) + 7) / 8 * 8);
    td_status_t st = cpu_score(logits, n, e, fn, temp);
    if (st != TD_OK)
        return st;
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < e; j++)
            biased[r * e + j] = logits[r * e + j] + bias[j];
    st = td_kernels_cpu_topk(biased, n, e, k, idx);
    if (st != TD_OK)
        return st;
    for (size_t r = 0; r < n; r++) {
        float *w = weights + r * k, sum = 0.0f;
        int32_t *se = experts + r * k;
        for (size_t j = 0; j < k; j++) {
            w[j] = logits[r * e + (size_t)idx[r * k + j]];
            sum += w[j];
        }
        for (size_t j = 0; j < k; j++) {
            if (norm && k > 1)
                w[j] = w[j] / (sum + 1e-20f);
            w[j] *= scale;
        }
        /* ascending expert id (insertion sort of k pairs) */
        for (size_t j = 0; j < k; j++) {
            int32_t x = (int32_t)idx[r * k + j];
            float v = w[j];
            size_t i = j;
            for (; i > 0 && se[i - 1] > x; i--) {
                se[i] = se[i - 1];
                w[i] = w[i - 1];
            }
            se[i] = x;
            w[i] = v;
        }
    }
    return TD_OK;
}

/* ---- hyper-connections ---------------------------------------------------------------- */

static td_status_t
cpu_hc_mixes(const float *mixes, const float *scale, const float *base, size_t n,
             size_t hc, int iters, float eps, float *pre, float *post, float *comb)
{
    NEED("hc_mixes", mixes != NULL && scale != NULL && base != NULL);
    NEED("hc_mixes", pre != NULL && post != NULL && comb != NULL);
    NEED("hc_mixes", n > 0 && hc > 0 && iters >= 1);
    size_t nm = (2 + hc) * hc;
    for (size_t r = 0; r < n; r++) {
        const float *m = mixes + r * nm;
        float *c = comb + r * hc * hc;
        for (size_t j = 0; j < hc; j++) {
            pre[r * hc + j] = sigmoidf(m[j] * scale[0] + base[j]) + eps;
            post[r * hc + j] = 2.0f * sigmoidf(m[hc + j] * scale[1] + base[hc + j]);
        }
        for (size_t j = 0; j < hc; j++) {
            float *row = c + j * hc, mx = -INFINITY, sum = 0.0f;
            for (size_t k = 0; k < hc; k++) {
                row[k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
                if (row[k] > mx)
                    mx = row[k];
            }
            for (size_t k = 0; k < hc; k++) {
                row[k] = expf(row[k] - mx);
                sum += row[k];
            }
            for (size_t k = 0; k < hc; k++)
                row[k] = row[k] / sum + eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0)   /* rows (after the first, softmax already did them) */
                for (size_t j = 0; j < hc; j++) {
                    float sum = 0.0f;
                    for (size_t k = 0; k < hc; k++)
                        sum += c[j * hc + k];
                    for (size_t k = 0; k < hc; k++)
                        c[j * hc + k] /= sum + eps;
                }
            for (size_t k = 0; k < hc; k++) {
                float sum = 0.0f;
                for (size_t j = 0; j < hc; j++)
                    sum += c[j * hc + k];
                for (size_t j = 0; j < hc; j++)
                    c[j * hc + k] /= sum + eps;
            }
        }
    }
    return TD_OK;
}

typedef struct {
    const float *s, *pre, *x, *res, *post, *comb;
    size_t hc, d;
    float *out;
} hc_job_t;

static void
hc_collapse_rows(void *arg, size_t r0, size_t r1)
{
    const hc_job_t *j = arg;
    size_t hc = j->hc, d = j->d;
    for (size_t r = r0; r < r1; r++) {
        float *o = j->out + r * d;
        for (size_t i = 0; i < d; i++)
            o[i] = 0.0f;
        for (size_t k = 0; k < hc; k++)   /* o[i] = ((0 + p0 s0) + p1 s1) + ... */
            axpy(o, j->pre[r * hc + k], j->s + (r * hc + k) * d, d);
    }
}

static td_status_t
cpu_hc_collapse(const float *s, const float *pre, size_t n, size_t hc, size_t d, float *out)
{
    NEED("hc_collapse", s != NULL && pre != NULL && out != NULL && n > 0 && hc > 0 && d > 0);
    hc_job_t j = { s, pre, NULL, NULL, NULL, NULL, hc, d, out };
    ops_rows(n, 2 * hc * d, hc_collapse_rows, &j);
    return TD_OK;
}

static void
hc_expand_rows(void *arg, size_t r0, size_t r1)
{
    const hc_job_t *j = arg;
    size_t hc = j->hc, d = j->d;
    for (size_t r = r0; r < r1; r++)
        for (size_t k = 0; k < hc; k++) {
            float pk = j->post[r * hc + k];
            float *o = j->out + (r * hc + k) * d;
            const float *xr = j->x + r * d;
            for (size_t i = 0; i < d; i++)   /* o holds acc = ((0 + c0 r0) + c1 r1) + ... */
                o[i] = 0.0f;
            for (size_t m = 0; m < hc; m++)
                axpy(o, j->comb[(r * hc + m) * hc + k], j->res + (r * hc + m) * d, d);
            axpy(o, pk, xr, d);   /* pk * x + acc */
        }
}

static td_status_t
cpu_hc_expand(const float *x, const float *res, const float *post, const float *comb,
              size_t n, size_t hc, size_t d, float *out)
{
    NEED("hc_expand", x != NULL && res != NULL && post != NULL && comb != NULL);
    NEED("hc_expand", out != NULL && out != res && n > 0 && hc > 0 && d > 0);
    hc_job_t j = { NULL, NULL, x, res, post, comb, hc, d, out };
    ops_rows(n, 2 * hc * hc * d, hc_expand_rows, &j);
    return TD_OK;
}

/* ---- engram, compressor, indexer ------------------------------------------------------ */

typedef struct {
    float *s;
    const float *key, *value, *qk;
    size_t hc, d;
    float eps;
} engram_job_t;

static void
engram_rows(void *arg, size_t r0, size_t r1)
{
    const engram_job_t *j = arg;
    size_t hc = j->hc, d = j->d;
    const float inv_sqrt_d = (float)(1.0 / sqrt((double)d));
    for (size_t r = r0; r < r1; r++)
        for (size_t m = 0; m < hc; m++) {
            float *h = j->s + (r * hc + m) * d;
            const float *kk = j->key + (r * hc + m) * d, *w = j->qk + m * d;
            double hh = 0.0, kk2 = 0.0, dot = 0.0;
            for (size_t i = 0; i < d; i++) {
                hh += (double)h[i] * h[i];
                kk2 += (double)kk[i] * kk[i];
                dot += (double)(h[i] * w[i] * kk[i]);
            }
            float rstd = (1.0f / sqrtf((float)(hh / (double)d) + j->eps)) *
                         (1.0f / sqrtf((float)(kk2 / (double)d) + j->eps));
            float dt = (float)dot * rstd * inv_sqrt_d;
            float a = fabsf(dt) < 1e-6f ? 1e-6f : fabsf(dt);
            float gate = sigmoidf(copysignf(sqrtf(a), dt));
            for (size_t i = 0; i < d; i++)
                h[i] = h[i] + gate * j->value[r * d + i];
        }
}

static td_status_t
cpu_engram_mix(float *s, const float *key, const float *value, const float *qk, size_t n,
               size_t hc, size_t d, float eps)
{
    NEED("engram_mix", s != NULL && key != NULL && value != NULL && qk != NULL);
    NEED("engram_mix", n > 0 && hc > 0 && d > 0);
    engram_job_t j = { s, key, value, qk, hc, d, eps };
    ops_rows(n, 6 * hc * d, engram_rows, &j);
    return TD_OK;
}

static td_status_t
cpu_gate_pool(const float *kv, const float *gate, size_t g, size_t r, size_t d, float *out)
{
    NEED("gate_pool", kv != NULL && gate != NULL && out != NULL && g > 0 && r > 0 && d > 0);
    for (size_t k = 0; k < g; k++)
        for (size_t i = 0; i < d; i++) {
            const float *gk = gate + k * r * d + i, *vk = kv + k * r * d + i;
            float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
            for (size_t j = 0; j < r; j++)
                if (gk[j * d] > mx)
                    mx = gk[j * d];
            for (size_t j = 0; j < r; j++)
                sum += expf(gk[j * d] - mx);
            for (size_t j = 0; j < r; j++)
                acc += vk[j * d] * (expf(gk[j * d] - mx) / sum);
            out[k * d + i] = acc;
        }
    return TD_OK;
}

typedef struct {
    const float *q, *k, *w;
    size_t h, t, d;
    float scale;
    float *out;
    int nomem;
} index_job_t;

static void
index_rows(void *arg, size_t r0, size_t r1)
{
    index_job_t *j = arg;
    size_t h = j->h, t = j->t, d = j->d;
    float *v = ops_scratch(h * 16);
    if (v == NULL) {
        j->nomem = 1;
        return;
    }
    for (size_t r = r0; r < r1; r++)
        for (size_t c0 = 0; c0 < t; c0 += 16) {   /* the heads' dots of 16 keys */
            size_t nc = t - c0 < 16 ? t - c0 : 16;
            for (size_t m = 0; m < h; m++)
                dotf_many(j->q + (r * h + m) * d, j->k + c0 * d, d, d, nc, v + m * nc);
            for (size_t c = 0; c < nc; c++) {
                float acc = 0.0f;
                for (size_t m = 0; m < h; m++) {
                    float vm = v[m * nc + c];
                    acc += (vm > 0.0f ? vm : 0.0f) * j->scale * j->w[r * h + m];
                }
                j->out[r * t + c0 + c] = acc;
            }
        }
}

static td_status_t
cpu_index_scores(const float *q, const float *k, const float *w, size_t n, size_t h,
                 size_t t, size_t d, float scale, float *out)
{
    NEED("index_scores", q != NULL && k != NULL && w != NULL && out != NULL);
    NEED("index_scores", n > 0 && h > 0 && t > 0 && d > 0);
    index_job_t j = { q, k, w, h, t, d, scale, out, 0 };
    ops_rows(n, 2 * h * t * d, index_rows, &j);
    if (j.nomem)
        return td_kernels_fail(TD_ERR_NOMEM, "index_scores: %zu heads", h);
    return TD_OK;
}

static td_status_t
cpu_add(float *y, const float *x, size_t n)
{
    NEED("add", y != NULL && x != NULL);
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
    return TD_OK;
}

static const td_kernels_ops_t td_kernels_cpu_ops_table = {
    .name = "cpu",
    .mat_create = td_kernels_cpu_mat_create,
    .mat_create_fmt = td_kernels_cpu_mat_create_fmt,
    .mat_destroy = td_kernels_cpu_mat_destroy,
    .mat_bytes = td_kernels_cpu_mat_bytes,
    .linear_mat = td_kernels_cpu_linear_mat,
    .linear = cpu_linear,
    .linear_grouped = cpu_linear_grouped,
    .embed = cpu_embed,
    .embed_fmt = cpu_embed_fmt,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .quant_fp8 = td_kernels_cpu_quant_fp8,
    .dequant_fp8 = td_kernels_cpu_dequant_fp8,
    .quant_fp4 = td_kernels_cpu_quant_fp4,
    .dequant_fp4 = td_kernels_cpu_dequant_fp4,
    .swiglu = cpu_swiglu,
    .score = cpu_score,
    .route = cpu_route,
    .topk = td_kernels_cpu_topk,
    .hc_mixes = cpu_hc_mixes,
    .hc_collapse = cpu_hc_collapse,
    .hc_expand = cpu_hc_expand,
    .engram_mix = cpu_engram_mix,
    .gate_pool = cpu_gate_pool,
    .index_scores = cpu_index_scores,
    .add = cpu_add,
};

const td_kernels_ops_t *
td_kernels_cpu_ops(void)
{
    return &td_kernels_cpu_ops_table;
}
