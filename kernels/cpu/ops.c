/* kernels/cpu/ops.c — the cpu compute ops of the forward pass: linears through
 * OpenBLAS sgemm, everything else as plain loops in f32 following the
 * reference's order of operations; td_kernels_cpu_ops() is the table. */
#include "cpu_ops.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- argument checks ------------------------------------------------------ */

#define NEED(op, cond)                                                          \
    do {                                                                        \
        if (!(cond))                                                            \
            return td_kernels_fail(TD_ERR_INVALID, "%s: %s", op, #cond);        \
    } while (0)

/* Dimensions handed to BLAS must fit its int. */
static int
blas_dims(size_t a, size_t b, size_t c)
{
    return a <= INT_MAX && b <= INT_MAX && c <= INT_MAX;
}

static float
sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* ---- linears ----------------------------------------------------------------
 * OpenBLAS picks its kernels by matrix size (small-matrix kernels, edge
 * tiles), so one row's result would depend on how many rows share the call.
 * Every sgemm here therefore runs on exactly LINEAR_ROWS rows (the last block
 * zero-padded): a row's output then depends on that row and the weights
 * alone, which makes batched decode equal to each request alone and chunked
 * prefill equal to one shot, bit for bit. */

#define LINEAR_ROWS 32

/* y[r, :] (row stride ldy) = x[r, :] (row stride ldx) . w^T for m rows. */
static td_status_t
linear_rows(const float *x, size_t ldx, const float *w, float *y, size_t ldy, size_t m,
            size_t n, size_t k)
{
    float *px = NULL, *py = NULL;

    for (size_t r = 0; r < m; r += LINEAR_ROWS) {
        size_t rows = m - r < LINEAR_ROWS ? m - r : LINEAR_ROWS;
        if (rows == LINEAR_ROWS) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, LINEAR_ROWS, (int)n, (int)k,
                        1.0f, x + r * ldx, (int)ldx, w, (int)k, 0.0f, y + r * ldy, (int)ldy);
            continue;
        }
        px = calloc(LINEAR_ROWS * k, sizeof(float));
        py = malloc(LINEAR_ROWS * n * sizeof(float));
        if (px == NULL || py == NULL) {
            free(px);
            free(py);
            return td_kernels_fail(TD_ERR_NOMEM, "linear: %zu x %zu block", n, k);
        }
        for (size_t i = 0; i < rows; i++)
            memcpy(px + i * k, x + (r + i) * ldx, k * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, LINEAR_ROWS, (int)n, (int)k, 1.0f,
                    px, (int)k, w, (int)k, 0.0f, py, (int)n);
        for (size_t i = 0; i < rows; i++)
            memcpy(y + (r + i) * ldy, py + i * n, n * sizeof(float));
        free(px);
        free(py);
    }
    return TD_OK;
}

static td_status_t
cpu_linear(const float *x, const float *w, float *y, size_t m, size_t n, size_t k, int acc)
{
    NEED("linear", x != NULL && w != NULL && y != NULL);
    NEED("linear", m > 0 && n > 0 && k > 0 && blas_dims(m, n, k));
    if (!acc)
        return linear_rows(x, k, w, y, n, m, n, k);
    float *t = malloc(m * n * sizeof(float));
    if (t == NULL)
        return td_kernels_fail(TD_ERR_NOMEM, "linear: %zu x %zu", m, n);
    td_status_t st = linear_rows(x, k, w, t, n, m, n, k);
    for (size_t i = 0; st == TD_OK && i < m * n; i++)
        y[i] += t[i];
    free(t);
    return st;
}

static td_status_t
cpu_linear_grouped(const float *x, const float *w, float *y, size_t m, size_t g,
                   size_t n, size_t k)
{
    NEED("linear_grouped", x != NULL && w != NULL && y != NULL);
    NEED("linear_grouped", m > 0 && g > 0 && n > 0 && k > 0);
    NEED("linear_grouped", blas_dims(m, n, g * k) && g * n <= INT_MAX);
    for (size_t j = 0; j < g; j++) {
        td_status_t st = linear_rows(x + j * k, g * k, w + j * n * k, y + j * n, g * n, m, n, k);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* a . b with eight running sums in a fixed order: the same value wherever
 * the vectors come from (attention and indexer scores do not depend on how
 * many keys or queries share the call). */
static float
dotf(const float *a, const float *b, size_t n)
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

/* ---- norms and rotations ------------------------------------------------------- */

static td_status_t
cpu_rmsnorm(const float *x, const float *w, float eps, size_t n, size_t d, float *y)
{
    NEED("rmsnorm", x != NULL && y != NULL && n > 0 && d > 0);
    for (size_t r = 0; r < n; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double ss = 0.0;
        for (size_t i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        float rs = 1.0f / sqrtf((float)(ss / (double)d) + eps);
        for (size_t i = 0; i < d; i++)
            yr[i] = w ? w[i] * (xr[i] * rs) : xr[i] * rs;
    }
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

/* ---- attention ------------------------------------------------------------------- */

static td_status_t
cpu_attention(const float *q, const float *kv, const float *mask, const float *sink,
              float scale, size_t n, size_t h, size_t t, size_t d, float *out)
{
    NEED("attention", q != NULL && kv != NULL && sink != NULL && out != NULL);
    NEED("attention", n > 0 && h > 0 && t > 0 && d > 0);
    float *s = malloc(t * sizeof(float));
    if (s == NULL)
        return td_kernels_fail(TD_ERR_NOMEM, "attention: %zu scores", t);
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < h; j++) {
            const float *qr = q + (r * h + j) * d;
            float *o = out + (r * h + j) * d, mx = sink[j], sum = 0.0f;
            for (size_t c = 0; c < t; c++) {
                float m = mask ? mask[r * t + c] : 0.0f;
                s[c] = m == -INFINITY ? -INFINITY : dotf(qr, kv + c * d, d) * scale + m;
                if (s[c] > mx)
                    mx = s[c];
            }
            for (size_t c = 0; c < t; c++) {
                s[c] = expf(s[c] - mx);
                sum += s[c];
            }
            sum += expf(sink[j] - mx);
            memset(o, 0, d * sizeof(float));
            for (size_t c = 0; c < t; c++) {
                float p = s[c] / sum;
                if (p == 0.0f)
                    continue;
                const float *v = kv + c * d;
                for (size_t i = 0; i < d; i++)
                    o[i] += p * v[i];
            }
        }
    free(s);
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

static td_status_t
cpu_hc_collapse(const float *s, const float *pre, size_t n, size_t hc, size_t d, float *out)
{
    NEED("hc_collapse", s != NULL && pre != NULL && out != NULL && n > 0 && hc > 0 && d > 0);
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (size_t j = 0; j < hc; j++)
                acc += pre[r * hc + j] * s[(r * hc + j) * d + i];
            out[r * d + i] = acc;
        }
    return TD_OK;
}

static td_status_t
cpu_hc_expand(const float *x, const float *res, const float *post, const float *comb,
              size_t n, size_t hc, size_t d, float *out)
{
    NEED("hc_expand", x != NULL && res != NULL && post != NULL && comb != NULL);
    NEED("hc_expand", out != NULL && out != res && n > 0 && hc > 0 && d > 0);
    for (size_t r = 0; r < n; r++)
        for (size_t k = 0; k < hc; k++) {
            float pk = post[r * hc + k];
            for (size_t i = 0; i < d; i++) {
                float acc = 0.0f;
                for (size_t j = 0; j < hc; j++)
                    acc += comb[(r * hc + j) * hc + k] * res[(r * hc + j) * d + i];
                out[(r * hc + k) * d + i] = pk * x[r * d + i] + acc;
            }
        }
    return TD_OK;
}

/* ---- engram, compressor, indexer ------------------------------------------------------ */

static td_status_t
cpu_engram_mix(float *s, const float *key, const float *value, const float *qk, size_t n,
               size_t hc, size_t d, float eps)
{
    NEED("engram_mix", s != NULL && key != NULL && value != NULL && qk != NULL);
    NEED("engram_mix", n > 0 && hc > 0 && d > 0);
    const float inv_sqrt_d = (float)(1.0 / sqrt((double)d));
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < hc; j++) {
            float *h = s + (r * hc + j) * d;
            const float *kk = key + (r * hc + j) * d, *w = qk + j * d;
            double hh = 0.0, kk2 = 0.0, dot = 0.0;
            for (size_t i = 0; i < d; i++) {
                hh += (double)h[i] * h[i];
                kk2 += (double)kk[i] * kk[i];
                dot += (double)(h[i] * w[i] * kk[i]);
            }
            float rstd = (1.0f / sqrtf((float)(hh / (double)d) + eps)) *
                         (1.0f / sqrtf((float)(kk2 / (double)d) + eps));
            float dt = (float)dot * rstd * inv_sqrt_d;
            float a = fabsf(dt) < 1e-6f ? 1e-6f : fabsf(dt);
            float gate = sigmoidf(copysignf(sqrtf(a), dt));
            for (size_t i = 0; i < d; i++)
                h[i] = h[i] + gate * value[r * d + i];
        }
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

static td_status_t
cpu_index_scores(const float *q, const float *k, const float *w, size_t n, size_t h,
                 size_t t, size_t d, float scale, float *out)
{
    NEED("index_scores", q != NULL && k != NULL && w != NULL && out != NULL);
    NEED("index_scores", n > 0 && h > 0 && t > 0 && d > 0);
    for (size_t r = 0; r < n; r++)
        for (size_t c = 0; c < t; c++) {
            float acc = 0.0f;
            for (size_t j = 0; j < h; j++) {
                float v = dotf(q + (r * h + j) * d, k + c * d, d);
                acc += (v > 0.0f ? v : 0.0f) * scale * w[r * h + j];
            }
            out[r * t + c] = acc;
        }
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
    .linear = cpu_linear,
    .linear_grouped = cpu_linear_grouped,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .quant_fp8 = td_kernels_cpu_quant_fp8,
    .dequant_fp8 = td_kernels_cpu_dequant_fp8,
    .quant_fp4 = td_kernels_cpu_quant_fp4,
    .dequant_fp4 = td_kernels_cpu_dequant_fp4,
    .swiglu = cpu_swiglu,
    .score = cpu_score,
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
