/* tests/unit/test_sample.c — engine/sample's one sampler against a sort-based
 * reference of its documented rule (every candidate sorted, then top-k, the
 * weights, top-p and the draw) on random rows: dense and sparse, continuous
 * and tied logits, -inf holes, logit_bias; greedy and tie rules by hand;
 * logit_bias forcing and banning; log-probabilities after the bias; the
 * row's own steps (min_tokens mask, repetition / presence / frequency
 * penalties over a token history, min-p) against the reference with those
 * written out from token lists; min-p over 20 000 draws; the refusals (NaN,
 * +inf, nothing finite, bad bias, bad penalties, a penalty without a
 * history). */
#include "check.h"
#include "logcap.h"
#include "log.h"
#include "rng.h"
#include "sample.h"
#include "status.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- The reference: the rule of sample.h written out with a full sort ------------ */

typedef struct {
    float l;
    int32_t id;
    uint32_t idx;
} ref_ent_t;

static int
ref_cmp(const void *pa, const void *pb)
{
    const ref_ent_t *a = pa, *b = pb;

    if (a->l != b->l)
        return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static float
ref_bias(const td_sample_params_t *sp, int32_t id)
{
    for (uint32_t b = 0; b < sp->nbias; b++)
        if (sp->bias[b].id == id)
            return sp->bias[b].bias;
    return 0.0f;
}

/* The token, or -1 when no logit is finite. */
static int32_t
ref_sample(const td_sample_dist_t *lg, const td_sample_params_t *sp, uint64_t pos)
{
    ref_ent_t *e = malloc((lg->n + 1) * sizeof(*e)), *s = malloc((lg->n + 1) * sizeof(*s));
    unsigned char *kept = calloc(lg->n + 1, 1);
    size_t n = 0, k, keep;
    double Z = 0, S, u, acc = 0, m;
    int32_t tok = -1;

    for (uint32_t i = 0; i < lg->n; i++) {
        int32_t id = lg->ids ? lg->ids[i] : (int32_t)i;
        float l = lg->logits[i] + ref_bias(sp, id);
        if (l != -INFINITY)
            e[n++] = (ref_ent_t){ l, id, i };
    }
    if (n == 0)
        goto out;
    memcpy(s, e, n * sizeof(*e));
    qsort(s, n, sizeof(*s), ref_cmp);
    if (sp->temperature == 0 || sp->top_k == 1) {
        tok = s[0].id;
        goto out;
    }
    m = s[0].l;
    k = sp->top_k != 0 && sp->top_k < n ? sp->top_k : n;
    for (size_t i = 0; i < k; i++)
        kept[s[i].idx] = 1;
    for (size_t i = 0; i < n; i++)   /* index order */
        if (kept[e[i].idx])
            Z += exp(((double)e[i].l - m) / sp->temperature);
    keep = k;
    S = Z;
    if (sp->top_p < 1) {
        for (size_t i = 0; i < k; i++) {
            acc += exp(((double)s[i].l - m) / sp->temperature) / Z;
            if (acc >= sp->top_p) {
                keep = i + 1;
                break;
            }
        }
        S = 0;
        for (size_t i = 0; i < keep; i++)
            S += exp(((double)s[i].l - m) / sp->temperature);
    }
    u = td_sample_draw(sp->seed, pos) * S;
    acc = 0;
    tok = s[keep - 1].id;
    for (size_t i = 0; i < keep; i++) {
        acc += exp(((double)s[i].l - m) / sp->temperature);
        if (u < acc) {
            tok = s[i].id;
            break;
        }
    }
out:
    free(e);
    free(s);
    free(kept);
    return tok;
}

/* ---- Rows ---------------------------------------------------------------------- */

typedef enum {
    ROW_CONTINUOUS,   /* uniform in [-8, 8) */
    ROW_TIED,         /* five levels: ties everywhere */
    ROW_HOLES,        /* continuous with -inf in about a third */
    ROW_PEAKED,       /* a narrow body and a few high tokens */
} row_kind_t;

static uint64_t rng_state = 12345;

static double
rnd(void)
{
    rng_state = td_rng_mix64(rng_state + TD_RNG_GAMMA);
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

static void
make_row(float *row, size_t n, row_kind_t kind)
{
    for (size_t i = 0; i < n; i++) {
        double x = rnd();
        switch (kind) {
        case ROW_CONTINUOUS: row[i] = (float)(x * 16 - 8); break;
        case ROW_TIED:       row[i] = (float)((int)(x * 5) - 2); break;
        case ROW_HOLES:      row[i] = rnd() < 0.33 ? -INFINITY : (float)(x * 16 - 8); break;
        case ROW_PEAKED:     row[i] = (float)(x * 2) + (rnd() < 0.01 ? 9.0f : 0.0f); break;
        }
    }
    if (kind == ROW_HOLES)
        row[n / 2] = 0.5f;   /* one finite at least */
}

/* ---- The sampler against the reference ------------------------------------------- */

static void
test_reference(void)
{
    static const size_t sizes[] = { 1, 2, 3, 8, 65, 300, 2049 };
    static const double temps[] = { 0.25, 1.0, 3.0 };
    static const double top_ps[] = { 1.0, 0.9, 0.3, 1e-9 };
    unsigned checked = 0, drawn_not_first = 0;

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *row = malloc(n * sizeof(float));
        int32_t *ids = malloc(n * sizeof(int32_t));
        const uint32_t ks[] = { 0, 1, 2, 5, 64, 65, (uint32_t)n - 1, (uint32_t)n + 7 };

        for (size_t i = 0; i < n; i++)   /* sparse ids: distinct, not in index order */
            ids[i] = (int32_t)(((i * 7919u) % n) * 3 + 5);
        for (int kind = ROW_CONTINUOUS; kind <= ROW_PEAKED; kind++) {
            for (int sparse = 0; sparse < 2; sparse++) {
                td_sample_dist_t lg = { (uint32_t)n, sparse ? ids : NULL, row };
                make_row(row, n, (row_kind_t)kind);
                td_sample_params_t g0 = td_sample_params_greedy();
                int32_t first = ref_sample(&lg, &g0, 0);
                for (int biased = 0; biased < 3; biased++) {
                    td_sample_params_t sp = td_sample_params_greedy();
                    td_sample_bias_t b[4];
                    size_t nb = 0;
                    if (biased == 1) {   /* small shifts on a few ids */
                        for (size_t j = 0; j < 4 && j < n; j++) {
                            size_t at = n >= 4 ? j * n / 4 : j;
                            b[nb++] = (td_sample_bias_t){ lg.ids ? ids[at] : (int32_t)at,
                                                          (float)(rnd() * 6 - 3) };
                        }
                    } else if (biased == 2) {   /* one id lifted far */
                        b[nb++] = (td_sample_bias_t){ lg.ids ? ids[n - 1] : (int32_t)n - 1,
                                                      7.5f };
                    }
                    CHECK_STATUS(td_sample_bias_set(&sp, b, nb, NULL, 0), TD_OK);
                    for (size_t ti = 0; ti < 4; ti++) {
                        for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
                            for (size_t pi = 0; pi < 4; pi++) {
                                sp.temperature = ti == 3 ? 0 : temps[ti];
                                sp.top_k = ks[ki];
                                sp.top_p = top_ps[pi];
                                for (uint64_t pos = 0; pos < 3; pos++) {
                                    int32_t got = -2, want;
                                    sp.seed = pos * 977 + ki;
                                    want = ref_sample(&lg, &sp, pos);
                                    CHECK_STATUS(td_sample_dist(&lg, &sp, pos, &got), TD_OK);
                                    if (got != want) {
                                        fprintf(stderr, "n %zu kind %d sparse %d bias %d T %g "
                                                "k %u p %g pos %llu: %d, reference %d\n", n,
                                                kind, sparse, biased, sp.temperature, sp.top_k,
                                                sp.top_p, (unsigned long long)pos, got, want);
                                        td_check_failures++;
                                    }
                                    checked++;
                                    drawn_not_first += got != first;
                                }
                            }
                        }
                    }
                }
            }
        }
        free(row);
        free(ids);
    }
    /* the draws were not all the argmax (a sampler that always took it fails above
     * too, but only where the reference draws something else: this says it does) */
    CHECK(drawn_not_first > checked / 4);
    fprintf(stderr, "test_sample: %u draws equal the sort-based reference (%u not the "
                    "unbiased argmax)\n", checked, drawn_not_first);
}

/* A row of the released vocabulary: greedy is the argmax, draws equal the
 * reference, and the rows of td_sample_rows equal one call each. */
static void
test_vocab(void)
{
    enum { V = 129280, R = 3 };
    float *rows = malloc((size_t)R * V * sizeof(float));
    td_sample_params_t g = td_sample_params_greedy(), hot = g, nuc = g;
    const td_sample_params_t *sps[R] = { &g, &hot, &nuc };
    uint64_t pos[R] = { 5, 6, 7 };
    int32_t tok[R];

    hot.temperature = 1.0;
    hot.seed = 3;
    nuc.temperature = 0.7;
    nuc.top_p = 0.9;
    nuc.top_k = 40;
    nuc.seed = 4;
    for (int r = 0; r < R; r++)
        make_row(rows + (size_t)r * V, V, r == 0 ? ROW_TIED : ROW_PEAKED);
    CHECK_STATUS(td_sample_rows(rows, R, V, sps, pos, tok), TD_OK);
    CHECK_EQ_INT(tok[0], td_sample_argmax(rows, V));
    for (int r = 0; r < R; r++) {
        td_sample_dist_t lg = { V, NULL, rows + (size_t)r * V };
        CHECK_EQ_INT(tok[r], ref_sample(&lg, sps[r], pos[r]));
    }
    free(rows);
}

/* ---- Rules by hand --------------------------------------------------------------- */

static int32_t
dist1(uint32_t n, const int32_t *ids, const float *l, const td_sample_params_t *sp,
      uint64_t pos)
{
    td_sample_dist_t lg = { n, ids, l };
    int32_t t = -1;

    CHECK_STATUS(td_sample_dist(&lg, sp, pos, &t), TD_OK);
    return t;
}

static void
test_ties_and_bias(void)
{
    static const struct {
        const char *what;
        uint32_t n;
        int32_t ids[6];     /* all 0: dense */
        float l[6];
        double temperature;
        uint32_t top_k;
        uint32_t nbias;
        td_sample_bias_t bias[2];
        int32_t want[3];    /* what each of 3 positions may give: -1 = anything else */
    } cases[] = {
        { "greedy tie: lowest id", 4, { 0 }, { 2, 5, 5, 1 }, 0, 0, 0, { { 0 } }, { 1, 1, 1 } },
        { "sparse greedy tie: lowest id, not first index", 3, { 9, 4, 7 }, { 5, 5, 1 }, 0, 0, 0,
          { { 0 } }, { 4, 4, 4 } },
        { "top_k 1 at any temperature", 4, { 0 }, { 2, 5, 5, 1 }, 9, 1, 0, { { 0 } },
          { 1, 1, 1 } },
        { "bias +100 forces a token", 4, { 0 }, { 3, 1, 2, 0 }, 1, 0, 1, { { 3, 100 } },
          { 3, 3, 3 } },
        { "bias +100 wins greedy", 4, { 0 }, { 3, 1, 2, 0 }, 0, 0, 1, { { 2, 100 } },
          { 2, 2, 2 } },
        { "bias -100 bans the top token", 3, { 0 }, { 20, 0, 0 }, 0, 0, 1, { { 0, -100 } },
          { 1, 1, 1 } },
        { "bias lifts a sparse candidate", 3, { 9, 4, 7 }, { 5, 2, 1 }, 0, 0, 1, { { 7, 10 } },
          { 7, 7, 7 } },
        { "bias on an id that is no candidate changes nothing", 3, { 9, 4, 7 }, { 5, 2, 1 }, 0,
          0, 2, { { 5, 100 }, { 8, 100 } }, { 9, 9, 9 } },
        { "-inf is never drawn", 4, { 0 }, { -INFINITY, -INFINITY, -3, -INFINITY }, 5, 0, 0,
          { { 0 } }, { 2, 2, 2 } },
        { "bias does not revive -inf", 3, { 0 }, { -INFINITY, 0, -INFINITY }, 1, 0, 1,
          { { 0, 100 } }, { 1, 1, 1 } },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        td_sample_params_t sp = td_sample_params_greedy();
        const int32_t *ids = cases[c].ids[0] || cases[c].ids[1] ? cases[c].ids : NULL;

        sp.temperature = cases[c].temperature;
        sp.top_k = cases[c].top_k;
        CHECK_STATUS(td_sample_bias_set(&sp, cases[c].bias, cases[c].nbias, NULL, 0), TD_OK);
        for (uint64_t p = 0; p < 3; p++) {
            sp.seed = p * 31 + 1;
            int32_t t = dist1(cases[c].n, ids, cases[c].l, &sp, p);
            if (t != cases[c].want[p]) {
                fprintf(stderr, "%s: position %llu: %d, want %d\n", cases[c].what,
                        (unsigned long long)p, t, cases[c].want[p]);
                td_check_failures++;
            }
        }
    }

    /* a tie on the top_k boundary keeps the lower ids: [5, 3, 3, 3], k 2 */
    const float kt[4] = { 5, 3, 3, 3 };
    td_sample_params_t sp = td_sample_params_greedy();
    unsigned seen[4] = { 0 };
    sp.temperature = 100;
    sp.top_k = 2;
    for (uint64_t p = 0; p < 400; p++)
        seen[dist1(4, NULL, kt, &sp, p) & 3]++;
    CHECK(seen[0] > 100 && seen[1] > 100 && seen[2] == 0 && seen[3] == 0);

    /* bias -100 against a lead of 10 at temperature 1: the banned id is never drawn */
    const float lead[2] = { 10, 0 };
    td_sample_bias_t ban = { 0, -100 };
    unsigned banned = 0;
    sp = td_sample_params_greedy();
    sp.temperature = 1;
    CHECK_STATUS(td_sample_bias_set(&sp, &ban, 1, NULL, 0), TD_OK);
    for (uint64_t p = 0; p < 2000; p++)
        banned += dist1(2, NULL, lead, &sp, p) == 0;
    CHECK_EQ_INT(banned, 0);
}

/* Log-probabilities come from the logits after the bias; a sparse
 * distribution lists its candidates only. */
static void
test_logprobs(void)
{
    const float lg[6] = { 1.5f, 0.7f, 0.0f, -0.4f, 2.0f, -1.2f };
    float biased[6];
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_bias_t b[2] = { { 5, 4.0f }, { 0, -1.5f } };
    td_sample_dist_t d = { 6, NULL, lg };
    td_sample_pick_t pk, want;

    memcpy(biased, lg, sizeof(lg));
    biased[5] += 4.0f;
    biased[0] += -1.5f;
    CHECK_STATUS(td_sample_bias_set(&sp, b, 2, NULL, 0), TD_OK);
    CHECK(sp.bias[0].id == 0 && sp.bias[1].id == 5);   /* sorted */
    sp.logprobs = true;
    sp.top_logprobs = 3;
    CHECK_STATUS(td_sample_dist_pick(&d, &sp, 0, -1, &pk), TD_OK);
    CHECK_EQ_INT(pk.token, 5);
    CHECK_STATUS(td_sample_logprobs(biased, 6, 5, 3, &want), TD_OK);
    CHECK(pk.logprob == want.logprob && pk.ntop == 3);
    for (int i = 0; i < 3; i++)
        CHECK(pk.top[i].id == want.top[i].id && pk.top[i].logprob == want.top[i].logprob);
    /* logprobs off: the token alone */
    sp.logprobs = false;
    CHECK_STATUS(td_sample_dist_pick(&d, &sp, 0, -1, &pk), TD_OK);
    CHECK(pk.token == 5 && pk.ntop == 0);
    /* an explicit count wins over the request's */
    CHECK_STATUS(td_sample_dist_pick(&d, &sp, 0, 6, &pk), TD_OK);
    CHECK_EQ_INT(pk.ntop, 6);

    /* sparse: the candidates, by logit then id; asked for more than there are */
    const int32_t ids[3] = { 40, 7, 19 };
    const float sl[3] = { 1.0f, 1.0f, 3.0f };
    td_sample_dist_t s = { 3, ids, sl };
    double lse = log(exp(1.0) + exp(1.0) + exp(3.0));
    sp = td_sample_params_greedy();
    sp.logprobs = true;
    sp.top_logprobs = 5;
    CHECK_STATUS(td_sample_dist_pick(&s, &sp, 0, -1, &pk), TD_OK);
    CHECK(pk.token == 19 && pk.ntop == 3);
    CHECK(pk.top[0].id == 19 && pk.top[1].id == 7 && pk.top[2].id == 40);
    CHECK(fabs(pk.logprob - (3.0 - lse)) < 1e-12);
    CHECK(fabs(pk.top[2].logprob - (1.0 - lse)) < 1e-12);
}


/* ---- A row's own steps: mask, penalties, min-p -------------------------------------- */

/* A history as plain token lists, written out independently of sample.c. */
typedef struct {
    const int32_t *prompt, *out;
    size_t nprompt, nout;
} ref_hist_t;

static int
ref_in(const int32_t *t, size_t n, int32_t id)
{
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += t[i] == id;
    return c;
}

/* The row's logit of id (bias, mask, penalties as sample.h states them). */
static float
ref_row_logit(const td_sample_params_t *sp, const ref_hist_t *h, uint64_t generated,
              int32_t id, float l)
{
    int c = ref_in(h->out, h->nout, id);

    l += ref_bias(sp, id);
    if (generated < sp->min_tokens)
        for (uint32_t i = 0; i < sp->nstop; i++)
            if (sp->stop[i] == id)
                return -INFINITY;
    if (sp->repetition_penalty != 0 && sp->repetition_penalty != 1 &&
        (c > 0 || ref_in(h->prompt, h->nprompt, id) > 0)) {
        float r = (float)sp->repetition_penalty;
        l = l > 0 ? l / r : l * r;
    }
    if (c > 0)
        l -= (float)(sp->frequency_penalty * c + sp->presence_penalty);
    return l;
}

/* The reference for a row: the row's logits, then ref_sample's rule with
 * min-p (weight >= min_p) among the top_k. */
static int32_t
ref_row(const td_sample_dist_t *lg, const td_sample_params_t *sp, const ref_hist_t *h,
        uint64_t generated, uint64_t pos, float *rowl)
{
    td_sample_params_t plain = *sp;
    td_sample_dist_t d = { lg->n, lg->ids, rowl };
    float mx = -INFINITY;

    for (uint32_t i = 0; i < lg->n; i++) {
        int32_t id = lg->ids ? lg->ids[i] : (int32_t)i;
        rowl[i] = ref_row_logit(sp, h, generated, id, lg->logits[i]);
        mx = rowl[i] > mx ? rowl[i] : mx;
    }
    plain.nbias = 0;
    if (sp->min_p > 0 && sp->temperature > 0 && sp->top_k != 1) {
        td_sample_params_t g = plain;   /* min-p cuts the tail the top-k keeps */
        g.min_p = 0;
        for (uint32_t i = 0; i < lg->n; i++)
            if (rowl[i] != -INFINITY && exp(((double)rowl[i] - mx) / sp->temperature) < sp->min_p)
                rowl[i] = -INFINITY;
        return ref_sample(&d, &g, pos);
    }
    return ref_sample(&d, &plain, pos);
}

static void
test_row_reference(void)
{
    static const size_t sizes[] = { 3, 8, 65, 700 };
    unsigned checked = 0, differs = 0;

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        float *row = malloc(n * sizeof(float)), *rowl = malloc(n * sizeof(float));
        int32_t *ids = malloc(n * sizeof(int32_t)), prompt[40], out[40];
        uint32_t vocab = (uint32_t)(3 * n + 8);

        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)(((i * 7919u) % n) * 3 + 5);
        for (int round = 0; round < 60; round++) {
            int sparse = round & 1;
            td_sample_dist_t lg = { (uint32_t)n, sparse ? ids : NULL, row };
            td_sample_params_t sp = td_sample_params_greedy();
            td_sample_hist_t h;
            ref_hist_t rh = { prompt, out, 1 + (size_t)(rnd() * 39), (size_t)(rnd() * 40) };
            uint64_t gen = (uint64_t)(rnd() * 6), pos = 100 + (uint64_t)round;
            td_sample_pick_t pk, plain;
            td_sample_row_t r;
            int32_t want;

            make_row(row, n, (row_kind_t)(round % 4));
            for (size_t i = 0; i < rh.nprompt; i++)   /* ids of the distribution, mostly */
                prompt[i] = sparse ? ids[(size_t)(rnd() * n)] : (int32_t)(rnd() * n);
            for (size_t i = 0; i < rh.nout; i++)
                out[i] = sparse ? ids[(size_t)(rnd() * n)] : (int32_t)(rnd() * n);
            sp.temperature = round % 5 == 0 ? 0 : 0.3 + rnd() * 2;
            sp.top_k = round % 3 == 0 ? 0 : 1 + (uint32_t)(rnd() * n);
            sp.top_p = round % 4 == 0 ? 0.8 : 1;
            sp.min_p = round % 2 == 0 ? rnd() * 0.5 : 0;
            sp.repetition_penalty = round % 3 == 1 ? 0.5 + rnd() * 1.5 : 1;
            sp.presence_penalty = rnd() * 4 - 2;
            sp.frequency_penalty = rnd() * 4 - 2;
            sp.min_tokens = (uint32_t)(rnd() * 6);
            sp.seed = (uint64_t)round * 31;
            sp.logprobs = true;
            sp.top_logprobs = 5;
            for (int k = 0; k < 3; k++)
                (void)td_sample_stop_add(&sp, sparse ? ids[(size_t)(rnd() * n)]
                                                     : (int32_t)(rnd() * n));
            CHECK_STATUS(td_sample_hist_init(&h, vocab), TD_OK);
            CHECK_STATUS(td_sample_hist_add(&h, prompt, rh.nprompt, false), TD_OK);
            CHECK_STATUS(td_sample_hist_add(&h, out, rh.nout, true), TD_OK);
            r = (td_sample_row_t){ &sp, &h, pos, gen, NULL };
            want = ref_row(&lg, &sp, &rh, gen, pos, rowl);
            if (want < 0) {   /* the mask left nothing: refused */
                CHECK_STATUS(td_sample_row_pick(&lg, &r, -1, &pk), TD_ERR_INVALID);
                td_sample_hist_free(&h);
                continue;
            }
            CHECK_STATUS(td_sample_row_pick(&lg, &r, -1, &pk), TD_OK);
            if (pk.token != want) {
                fprintf(stderr, "row n %zu round %d: %d, reference %d\n", n, round, pk.token,
                        want);
                td_check_failures++;
            }
            /* log-probabilities of the row's logits (before min-p: that is a cut) */
            for (uint32_t i = 0; i < n; i++) {
                int32_t id = sparse ? ids[i] : (int32_t)i;
                rowl[i] = ref_row_logit(&sp, &rh, gen, id, row[i]);
            }
            if (!sparse) {
                CHECK_STATUS(td_sample_logprobs(rowl, n, pk.token, 5, &plain), TD_OK);
                CHECK(fabs(plain.logprob - pk.logprob) < 1e-9 && plain.ntop == pk.ntop);
                for (uint32_t k = 0; k < plain.ntop && k < pk.ntop; k++)
                    CHECK(plain.top[k].id == pk.top[k].id &&
                          (plain.top[k].logprob == pk.top[k].logprob ||   /* -inf */
                           fabs(plain.top[k].logprob - pk.top[k].logprob) < 1e-9));
            }
            td_sample_hist_free(&h);
            checked++;
            differs += pk.token != ref_sample(&lg, &(td_sample_params_t){ .temperature =
                                              sp.temperature, .top_p = 1, .seed = sp.seed },
                                              pos);
        }
        free(row);
        free(rowl);
        free(ids);
    }
    /* the row's steps changed the outcome often (a sampler that ignored them
     * would agree with the plain draw) */
    CHECK(differs > checked / 5);
    fprintf(stderr, "test_sample: %u rows equal the reference with mask, penalties and "
                    "min-p (%u differ from the plain draw)\n", checked, differs);
}

/* Penalties by hand: a dense row of 4, token 0 in the prompt, token 1
 * generated twice, token 3 once. */
static void
test_penalties(void)
{
    const float l[4] = { 2.0f, 1.0f, -1.0f, -0.5f };
    const int32_t prompt[2] = { 0, 2 }, out[3] = { 1, 1, 3 };
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_dist_t d = { 4, NULL, l };
    td_sample_hist_t h;
    td_sample_pick_t pk, want;
    float pl[4];

    CHECK_STATUS(td_sample_hist_init(&h, 4), TD_OK);
    CHECK_STATUS(td_sample_hist_add(&h, prompt, 2, false), TD_OK);
    CHECK_STATUS(td_sample_hist_add(&h, out, 3, true), TD_OK);
    CHECK_EQ_INT(h.nseen, 4);
    sp.logprobs = true;
    sp.top_logprobs = 4;
    sp.repetition_penalty = 2.0;
    sp.presence_penalty = 0.5;
    sp.frequency_penalty = 0.25;
    /* 2/2 = 1; 1/2 - (0.25*2 + 0.5) = -0.5; -1*2 = -2; -0.5*2 - (0.25 + 0.5) = -1.75 */
    pl[0] = 1.0f, pl[1] = -0.5f, pl[2] = -2.0f, pl[3] = -1.75f;
    CHECK_STATUS(td_sample_row_pick(&d, &(td_sample_row_t){ &sp, &h, 9, 3, NULL }, -1, &pk), TD_OK);
    CHECK_STATUS(td_sample_logprobs(pl, 4, 0, 4, &want), TD_OK);
    CHECK_EQ_INT(pk.token, 0);
    CHECK(pk.logprob == want.logprob);
    for (int k = 0; k < 4; k++)
        CHECK(pk.top[k].id == want.top[k].id && pk.top[k].logprob == want.top[k].logprob);
    /* a penalty without a history is refused, never skipped */
    td_logcap_reset();
    CHECK_STATUS(td_sample_dist_pick(&d, &sp, 9, -1, &pk), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "history") != NULL);
    /* off: nothing changes, no copy needed */
    sp = td_sample_params_greedy();
    sp.repetition_penalty = 1;
    CHECK(!td_sample_params_penalized(&sp));
    CHECK_STATUS(td_sample_row_pick(&d, &(td_sample_row_t){ &sp, NULL, 9, 3, NULL }, -1, &pk), TD_OK);
    CHECK_EQ_INT(pk.token, 0);
    td_sample_hist_free(&h);
}

/* A constraint's allow mask: the tokens it leaves out are -inf after the
 * bias, for the draw and for the reported log-probabilities (dense and
 * sparse distributions alike). */
static void
test_allow_mask(void)
{
    const float l[5] = { 2.0f, 0.5f, 1.0f, -1.0f, 0.0f };
    const int32_t ids[5] = { 7, 1, 70, 3, 64 };
    const float kept[2] = { 0.5f, -1.0f };
    const td_sample_bias_t up = { 0, 5.0f };
    td_sample_params_t sp = td_sample_params_greedy();
    uint64_t allow[2] = { (1ull << 1) | (1ull << 3), 0 };   /* tokens 1 and 3 */
    td_sample_dist_t d = { 5, NULL, l };
    td_sample_pick_t pk, want;

    sp.logprobs = true;
    sp.top_logprobs = 3;
    CHECK_STATUS(td_sample_bias_set(&sp, &up, 1, NULL, 0), TD_OK);   /* token 0 biased up */
    CHECK_STATUS(td_sample_row_pick(&d, &(td_sample_row_t){ &sp, NULL, 1, 0, allow }, -1, &pk),
                 TD_OK);
    CHECK_STATUS(td_sample_logprobs(kept, 2, 0, 2, &want), TD_OK);
    CHECK_EQ_INT(pk.token, 1);
    CHECK(pk.logprob == want.logprob);
    CHECK(pk.top[0].id == 1 && pk.top[1].id == 3 && pk.top[1].logprob == want.top[1].logprob);
    /* temperature 1: only allowed tokens are ever drawn */
    sp.temperature = 1.0;
    for (uint64_t pos = 0; pos < 64; pos++) {
        CHECK_STATUS(td_sample_row_pick(&d, &(td_sample_row_t){ &sp, NULL, pos, 0, allow }, -1,
                                        &pk), TD_OK);
        CHECK(pk.token == 1 || pk.token == 3);
    }
    /* sparse: ids 1 and 3 of the candidates */
    td_sample_dist_t ds = { 5, ids, l };
    allow[1] = 1ull << (70 - 64);   /* and 70 */
    sp.temperature = 0;
    CHECK_STATUS(td_sample_row_pick(&ds, &(td_sample_row_t){ &sp, NULL, 1, 0, allow }, -1, &pk),
                 TD_OK);
    CHECK_EQ_INT(pk.token, 70);
}

/* min_tokens: a stop id forced by logit_bias is masked until min_tokens
 * tokens were generated, and finishes nothing before. */
static void
test_min_tokens(void)
{
    const float l[5] = { 0.3f, 0.1f, 0.0f, 0.2f, -0.4f };
    const td_sample_bias_t force = { 4, 100.0f };
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_dist_t d = { 5, NULL, l };
    td_sample_pick_t pk;

    CHECK_STATUS(td_sample_bias_set(&sp, &force, 1, NULL, 0), TD_OK);
    CHECK_STATUS(td_sample_stop_add(&sp, 4), TD_OK);
    sp.min_tokens = 3;
    sp.temperature = 1;
    for (uint64_t g = 0; g < 5; g++) {
        CHECK_STATUS(td_sample_row_pick(&d, &(td_sample_row_t){ &sp, NULL, 10 + g, g, NULL }, -1, &pk),
                     TD_OK);
        CHECK(g < 3 ? pk.token != 4 : pk.token == 4);
    }
    CHECK_EQ_INT(td_sample_finish(&sp, 4, 3, 10, 0), TD_SAMPLE_FINISH_NONE);
    CHECK_EQ_INT(td_sample_finish(&sp, 4, 4, 10, 0), TD_SAMPLE_FINISH_STOP);
    /* no count of generated tokens: refused */
    CHECK_STATUS(td_sample_dist_pick(&d, &sp, 0, -1, &pk), TD_ERR_INVALID);
}

/* min-p: over 20 000 draws of a small vocabulary at temperature 1, no token
 * whose probability is below min_p times the top one's; the others come. */
static void
test_min_p_draws(void)
{
    enum { V = 12 };
    float l[V];
    unsigned seen[V] = { 0 };
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_dist_t d = { V, NULL, l };
    double pmax = 0, p[V], z = 0;

    for (int i = 0; i < V; i++)
        l[i] = (float)(-0.35 * i);
    for (int i = 0; i < V; i++)
        z += exp(l[i]);
    for (int i = 0; i < V; i++)
        pmax = (p[i] = exp(l[i]) / z) > pmax ? p[i] : pmax;
    sp.temperature = 1;
    sp.min_p = 0.2;
    for (uint64_t pos = 0; pos < 20000; pos++) {
        int32_t t = -1;
        sp.seed = pos;
        CHECK_STATUS(td_sample_dist(&d, &sp, pos, &t), TD_OK);
        if (t >= 0 && t < V)
            seen[t]++;
    }
    for (int i = 0; i < V; i++) {
        if (p[i] < sp.min_p * pmax)
            CHECK_EQ_INT(seen[i], 0);
        else
            CHECK(seen[i] > 100);
    }
    /* min_p 0 is off: the tail comes */
    sp.min_p = 0;
    memset(seen, 0, sizeof(seen));
    for (uint64_t pos = 0; pos < 20000; pos++) {
        int32_t t = -1;
        CHECK_STATUS(td_sample_dist(&d, &sp, pos, &t), TD_OK);
        seen[t >= 0 && t < V ? t : 0]++;
    }
    CHECK(seen[V - 1] > 0);
}

/* ---- Refusals ------------------------------------------------------------------- */


static void
test_refusals(void)
{
    static const float ok[3] = { 0, 1, 2 };
    static const struct {
        const char *what;
        uint32_t n;
        float l[3];
        double temperature;
        const char *logged;
    } rows[] = {
        { "NaN first", 3, { NAN, 1, 2 }, 0, "NaN or +inf" },
        { "NaN in the middle", 3, { 0, NAN, 2 }, 1, "NaN or +inf" },
        { "NaN last, sampled", 3, { 0, 1, NAN }, 1, "NaN or +inf" },
        { "+inf", 3, { 0, INFINITY, 2 }, 0, "NaN or +inf" },
        { "nothing finite", 3, { -INFINITY, -INFINITY, -INFINITY }, 1, "none finite" },
        { "empty", 0, { 0 }, 0, "0 candidates" },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        td_sample_params_t sp = td_sample_params_greedy();
        td_sample_dist_t lg = { rows[i].n, NULL, rows[i].l };
        int32_t t;

        sp.temperature = rows[i].temperature;
        td_logcap_reset();
        CHECK_STATUS(td_sample_dist(&lg, &sp, 0, &t), TD_ERR_INVALID);
        if (strstr(td_logcap.last, rows[i].logged) == NULL) {
            fprintf(stderr, "%s: logged \"%s\", want \"%s\"\n", rows[i].what, td_logcap.last,
                    rows[i].logged);
            td_check_failures++;
        }
    }

    /* parameters */
    td_sample_dist_t lg = { 3, NULL, ok };
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_bias_t b[3] = { { 2, 1 }, { 2, 3 }, { 0, 0 } };
    char why[128];
    int32_t t;

    CHECK_STATUS(td_sample_bias_set(&sp, b, 3, why, sizeof(why)), TD_ERR_INVALID);
    CHECK(strstr(why, "twice") != NULL && sp.nbias == 0);
    b[1] = (td_sample_bias_t){ 1, 100.5f };
    CHECK_STATUS(td_sample_bias_set(&sp, b, 3, why, sizeof(why)), TD_ERR_INVALID);
    CHECK(strstr(why, "outside [-100, 100]") != NULL);
    b[1] = (td_sample_bias_t){ -1, 1 };
    CHECK_STATUS(td_sample_bias_set(&sp, b, 3, why, sizeof(why)), TD_ERR_INVALID);
    b[1] = (td_sample_bias_t){ 1, NAN };
    CHECK_STATUS(td_sample_bias_set(&sp, b, 3, why, sizeof(why)), TD_ERR_INVALID);
    CHECK_STATUS(td_sample_bias_set(&sp, b, TD_SAMPLE_MAX_BIAS + 1, why, sizeof(why)),
                 TD_ERR_INVALID);
    b[1] = (td_sample_bias_t){ 1, -100 };
    CHECK_STATUS(td_sample_bias_set(&sp, b, 3, why, sizeof(why)), TD_OK);
    CHECK(sp.nbias == 3 && sp.bias[0].id == 0 && sp.bias[2].id == 2);

    /* a dense distribution smaller than a bias id; a bias list out of order */
    sp.bias[2].id = 3;
    CHECK_STATUS(td_sample_dist(&lg, &sp, 0, &t), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "outside the 3 logits") != NULL);
    sp.bias[2].id = 1;
    CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
    CHECK_STATUS(td_sample_dist(&lg, &sp, 0, &t), TD_ERR_INVALID);
    sp.nbias = 0;
    sp.top_logprobs = TD_SAMPLE_MAX_TOP + 1;
    CHECK_STATUS(td_sample_dist(&lg, &sp, 0, &t), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "top_logprobs") != NULL);
    sp.top_logprobs = 0;
    sp.top_p = 0;
    CHECK_STATUS(td_sample_dist(&lg, &sp, 0, &t), TD_ERR_INVALID);
    sp.top_p = 1;
    CHECK_STATUS(td_sample_dist(&lg, &sp, 0, &t), TD_OK);
    CHECK_EQ_INT(t, 2);
    static const struct {
        double min_p, rep, pres, freq;
        const char *why;
    } bad[] = {
        { -0.1, 1, 0, 0, "min_p" }, { 1.5, 1, 0, 0, "min_p" }, { 0, -1, 0, 0, "repetition" },
        { 0, 2.5, 0, 0, "repetition" }, { 0, 1, 2.5, 0, "presence" }, { 0, 1, 0, -3, "frequency" },
        { NAN, 1, 0, 0, "min_p" }, { 0, 1, NAN, 0, "presence" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sp = td_sample_params_greedy();
        sp.min_p = bad[i].min_p;
        sp.repetition_penalty = bad[i].rep;
        sp.presence_penalty = bad[i].pres;
        sp.frequency_penalty = bad[i].freq;
        CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
        CHECK(strstr(why, bad[i].why) != NULL);
    }
}

int
main(void)
{
    td_logcap_start();
    test_reference();
    test_vocab();
    test_ties_and_bias();
    test_logprobs();
    test_row_reference();
    test_penalties();
    test_min_tokens();
    test_allow_mask();
    test_min_p_draws();
    test_refusals();
    return td_check_exit("test_sample");
}
