/* tests/unit/test_sample.c — engine/sample's one sampler against a sort-based
 * reference of its documented rule (every candidate sorted, then top-k, the
 * weights, top-p and the draw) on random rows: dense and sparse, continuous
 * and tied logits, -inf holes, logit_bias; greedy and tie rules by hand;
 * logit_bias forcing and banning; log-probabilities after the bias; the
 * refusals (NaN, +inf, nothing finite, bad bias). */
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
}

int
main(void)
{
    td_logcap_start();
    test_reference();
    test_vocab();
    test_ties_and_bias();
    test_logprobs();
    test_refusals();
    return td_check_exit("test_sample");
}
