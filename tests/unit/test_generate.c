/* tests/unit/test_generate.c — engine/sample on hand-made logits (greedy, ties,
 * temperature, top-k, top-p boundaries, seeded draws, their distribution,
 * logprobs, stop and finish rules) and generation on tiny checkpoints: a batch
 * of 8 decoded together equals each alone bit for bit, a cache written out as
 * bytes continues bit for bit in other blocks of a second load of the model,
 * the deepseek-v41 engine in its caller's KV memory (pieces final right after
 * their layer, adopt of a copy in other blocks, decode into the same blocks, a
 * cancel within a layer), and a request holds no heap that grows with its
 * context. Every cache lives in KV memory whose blocks are scattered. */
#include "cache.h"
#include "check.h"
#include "comm.h"
#include "logcap.h"
#include "testkv.h"
#include "engine.h"
#include "kvmem.h"
#include "log.h"
#include "model.h"
#include "modelcfg.h"
#include "registry.h"
#include "rng.h"
#include "sample.h"
#include "status.h"
#include "testutil.h"
#include "v41engine.h"
#include "v41id.h"

#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------- */


#define CHECK_LOGGED(what)                                                           \
    do {                                                                             \
        if (strstr(td_logcap.last, (what)) == NULL) {                                      \
            fprintf(stderr, "%s:%d: logged \"%s\", want it to say \"%s\"\n", __FILE__,   \
                    __LINE__, td_logcap.last, (what));                                     \
            td_check_failures++;                                                     \
        }                                                                            \
        td_logcap_reset();                                                           \
    } while (0)

static td_sample_params_t
sampling(double temperature, double top_p, uint32_t top_k, uint64_t seed)
{
    td_sample_params_t sp = td_sample_params_greedy();
    sp.temperature = temperature;
    sp.top_p = top_p;
    sp.top_k = top_k;
    sp.seed = seed;
    return sp;
}

static int32_t
pick(const float *lg, size_t n, const td_sample_params_t *sp, uint64_t pos)
{
    td_sample_pick_t pk;
    td_status_t st = td_sample_pick(lg, n, sp, pos, 0, &pk);
    if (st != TD_OK) {
        fprintf(stderr, "td_sample_pick: %s\n", td_status_str(st));
        td_check_failures++;
        return -1;
    }
    return pk.token;
}

/* The sampler's rule written out independently: order by logit (desc, then
 * id), keep top_k, weights exp((l - l_max) / T), keep the shortest prefix
 * whose share reaches top_p, normalize. p[id] for every id. */
static void
expected_dist(const float *lg, size_t n, const td_sample_params_t *sp, double *p)
{
    size_t order[64], keep;
    double w[64], sum = 0, acc = 0;

    for (size_t i = 0; i < n; i++) {
        size_t at = i;
        while (at > 0 && (lg[order[at - 1]] < lg[i]))
            at--;
        memmove(&order[at + 1], &order[at], (i - at) * sizeof(order[0]));
        order[at] = i;
    }
    keep = sp->top_k != 0 && sp->top_k < n ? sp->top_k : n;
    for (size_t i = 0; i < keep; i++) {
        w[i] = exp(((double)lg[order[i]] - lg[order[0]]) / sp->temperature);
        sum += w[i];
    }
    for (size_t i = 0; i < keep; i++) {
        acc += w[i] / sum;
        if (acc >= sp->top_p) {
            keep = i + 1;
            break;
        }
    }
    sum = 0;
    for (size_t i = 0; i < keep; i++)
        sum += w[i];
    for (size_t i = 0; i < n; i++)
        p[i] = 0;
    for (size_t i = 0; i < keep; i++)
        p[order[i]] = w[i] / sum;
}

/* Pearson's statistic of counts against p over n bins (N draws); a count in a
 * bin of probability 0 makes it infinite. *df: bins with p > 0, minus 1. */
static double
chi_square(const unsigned *counts, const double *p, size_t n, unsigned N, unsigned *df)
{
    double x = 0;
    unsigned bins = 0;

    for (size_t i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (counts[i] != 0)
                return INFINITY;
            continue;
        }
        double e = p[i] * N;
        x += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    *df = bins > 0 ? bins - 1 : 0;
    return x;
}

/* The acceptance bound: df + 6 sqrt(2 df), about the 0.9999 quantile for the
 * degrees of freedom used here (7: 29.4 vs 29.9). The draws are a fixed
 * function of (seed, position), so the test is deterministic. */
static double
chi_bound(unsigned df)
{
    return df + 6.0 * sqrt(2.0 * df);
}

/* ---- sampling rules -------------------------------------------------------------- */

static void
test_greedy(void)
{
    const float lg[6] = { 0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f };
    td_sample_params_t t0 = sampling(0, 1, 0, 1), k1 = sampling(5.0, 1, 1, 1);

    CHECK_EQ_INT(td_sample_argmax(lg, 6), 1);      /* tie between 1 and 3: lowest id */
    for (uint64_t s = 0; s < 50; s++) {
        t0.seed = k1.seed = s;
        CHECK_EQ_INT(pick(lg, 6, &t0, s * 7), 1);   /* temperature 0: no draw at all */
        CHECK_EQ_INT(pick(lg, 6, &k1, s * 7), 1);   /* top_k 1 at any temperature */
    }
    /* -inf logits are never chosen; a single finite one always is */
    const float masked[4] = { -INFINITY, -INFINITY, -3.0f, -INFINITY };
    td_sample_params_t hot = sampling(2.0, 1, 0, 9);
    for (uint64_t p = 0; p < 50; p++)
        CHECK_EQ_INT(pick(masked, 4, &hot, p), 2);
    CHECK_EQ_INT(pick(masked, 4, &t0, 0), 2);
}

static void
test_top_k_top_p(void)
{
    /* top_k at a tie on its boundary: [5, 3, 3, 3] with k 2 keeps ids 0 and 1 */
    const float kt[4] = { 5.0f, 3.0f, 3.0f, 3.0f };
    td_sample_params_t sp = sampling(100.0, 1, 2, 3);
    unsigned seen[4] = { 0 };
    for (uint64_t p = 0; p < 400; p++)
        seen[pick(kt, 4, &sp, p) & 3]++;
    CHECK(seen[0] > 100 && seen[1] > 100 && seen[2] == 0 && seen[3] == 0);

    /* top_p on exact boundaries: four equal logits have shares 1/4 each, the
     * running sums 0.25, 0.5, 0.75, 1 are exact, and ">= top_p" decides */
    const float flat[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
    static const struct {
        double top_p;
        unsigned kept;   /* ids 0 .. kept-1 (ties ordered by id) */
    } cases[] = {
        { 0.25, 1 }, { 0.2500001, 2 }, { 0.5, 2 }, { 0.5000001, 3 }, { 0.75, 3 }, { 0.76, 4 },
        { 1.0, 4 }, { 1e-9, 1 },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        unsigned cnt[4] = { 0 };
        sp = sampling(1.0, cases[c].top_p, 0, 77);
        for (uint64_t p = 0; p < 800; p++)
            cnt[pick(flat, 4, &sp, p) & 3]++;
        for (unsigned i = 0; i < 4; i++) {
            int want = i < cases[c].kept;
            if ((cnt[i] > 0) != want || (want && cnt[i] < 800 / cases[c].kept / 2)) {
                fprintf(stderr, "top_p %.9g: id %u drawn %u times of 800 (want %s)\n",
                        cases[c].top_p, i, cnt[i], want ? "about 1/kept" : "never");
                td_check_failures++;
            }
        }
    }
}

static void
test_seed(void)
{
    const float lg[8] = { 1.5f, 0.7f, 0.0f, -0.4f, -1.2f, 0.3f, 2.0f, -2.5f };
    td_sample_params_t a = sampling(1.0, 1, 0, 1234), b = a;
    int32_t ra[64], rb[64];
    int differ = 0;

    b.seed = 1235;
    for (uint64_t p = 0; p < 64; p++) {
        ra[p] = pick(lg, 8, &a, p);
        rb[p] = pick(lg, 8, &b, p);
        differ += ra[p] != rb[p];
        CHECK_EQ_INT(pick(lg, 8, &a, p), ra[p]);   /* the same (seed, position) again */
    }
    CHECK(differ > 8);                              /* another seed, other draws */

    /* the model samples as the synthetic engine does: td_sample_dist
     * with the same (seed, position) */
    td_sample_params_t e = sampling(0.9, 0.95, 6, 0);
    td_sample_dist_t dense = { 8, NULL, lg };
    for (uint64_t s = 0; s < 40; s++)
        for (uint64_t p = 0; p < 40; p += 3) {
            int32_t want = -1;
            e.seed = s * 0x10001;
            CHECK_STATUS(td_sample_dist(&dense, &e, p, &want), TD_OK);
            CHECK_EQ_INT(pick(lg, 8, &e, p), want);
        }

    /* the same with a vocabulary of 1000 full of ties, for top_k below and
     * above the preselection's threshold (vocab / 2) */
    static float wide[1000];
    static const uint32_t ks[] = { 0, 2, 3, 5, 17, 100, 499, 500, 501, 999, 1000, 5000 };
    for (int i = 0; i < 1000; i++)
        wide[i] = (float)((i * 7919) % 23) * 0.25f;
    td_sample_dist_t wl = { 1000, NULL, wide };
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++)
        for (uint64_t p = 0; p < 30; p++) {
            td_sample_params_t w = sampling(3.0, p % 3 ? 0.9 : 1.0, ks[ki], p * 31);
            int32_t want = -1;
            CHECK_STATUS(td_sample_dist(&wl, &w, p, &want), TD_OK);
            CHECK_EQ_INT(pick(wide, 1000, &w, p), want);
        }

    /* the draw does not depend on the batch: rows of td_sample_rows, in any
     * order and with other rows around, give what each gives alone */
    float rows[3][8];
    td_sample_params_t c = sampling(0.7, 0.9, 5, 99);
    const td_sample_params_t *sps[3] = { &c, &a, &b };
    for (uint64_t p = 0; p < 32; p++) {
        uint64_t pos[3] = { p, p + 100, 3 * p };
        int32_t tok[3];
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < 8; i++)
                rows[r][i] = lg[(i + r) % 8];
        CHECK_STATUS(td_sample_rows(&rows[0][0], 3, 8, sps, pos, tok), TD_OK);
        for (int r = 0; r < 3; r++)
            CHECK_EQ_INT(tok[r], pick(rows[r], 8, sps[r], pos[r]));
    }
}

/* Draws over many seeds (one position) and many positions (one seed) follow
 * the rule's distribution; the same draws are far from a sampler that gets
 * the temperature or the cut wrong. */
static void
test_distribution(void)
{
    enum { N = 20000 };
    const float lg[8] = { 1.5f, 0.7f, 0.0f, -0.4f, -1.2f, 0.3f, 2.0f, -2.5f };
    static const struct {
        double temperature, top_p;
        uint32_t top_k;
        double wrong_t;         /* a broken sampler's temperature */
        uint32_t wrong_k;       /* ... or its missing top_k */
    } cases[] = {
        { 0.8, 1.0, 0, 1.0, 0 },
        { 1.0, 1.0, 0, 1.2, 0 },
        { 1.3, 1.0, 4, 1.3, 0 },
        { 1.0, 0.8, 0, 1.0, 0 },      /* wrong: top_p ignored (checked below) */
        { 2.0, 0.9, 6, 2.0, 7 },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int over_seeds = 0; over_seeds < 2; over_seeds++) {
            td_sample_params_t sp = sampling(cases[c].temperature, cases[c].top_p,
                                               cases[c].top_k, 2024);
            unsigned counts[8] = { 0 }, df, wdf;
            double p[8], q[8];

            for (unsigned i = 0; i < N; i++) {
                uint64_t pos = 41;
                if (over_seeds)
                    sp.seed = i;
                else
                    pos = i;
                int32_t t = pick(lg, 8, &sp, pos);
                if (t >= 0 && t < 8)
                    counts[t]++;
            }
            expected_dist(lg, 8, &sp, p);
            double x = chi_square(counts, p, 8, N, &df);
            if (!(x <= chi_bound(df))) {
                fprintf(stderr, "distribution case %zu (%s): chi-square %.2f > %.2f (df %u)\n",
                        c, over_seeds ? "over seeds" : "over positions", x, chi_bound(df), df);
                td_check_failures++;
            }
            /* power: the draws reject the broken variant */
            td_sample_params_t wrong = sp;
            wrong.temperature = cases[c].wrong_t;
            wrong.top_k = cases[c].wrong_k;
            if (cases[c].top_p < 1 && cases[c].wrong_t == cases[c].temperature &&
                cases[c].wrong_k == cases[c].top_k)
                wrong.top_p = 1.0;
            expected_dist(lg, 8, &wrong, q);
            double wx = chi_square(counts, q, 8, N, &wdf);
            if (!(wx > chi_bound(wdf))) {
                fprintf(stderr, "distribution case %zu: a broken sampler is not rejected "
                                "(chi-square %.2f <= %.2f)\n", c, wx, chi_bound(wdf));
                td_check_failures++;
            }
            if (c == 0 && over_seeds)
                fprintf(stderr, "test_generate: chi-square %.2f (df %u, bound %.1f); a "
                                "sampler at temperature %.1f scores %.0f\n", x, df,
                        chi_bound(df), wrong.temperature, wx);
        }
    }
}

static void
test_logprobs(void)
{
    const float lg[10] = { 1.5f, 0.7f, 0.0f, -0.4f, -1.2f, 0.7f, 2.0f, -2.5f, 9.0f, -30.0f };
    td_sample_pick_t pk, all;
    double lse, sum = 0, naive = 0;

    CHECK_STATUS(td_sample_logsumexp(lg, 10, &lse), TD_OK);
    for (int i = 0; i < 10; i++)
        naive += exp((double)lg[i]);
    CHECK(fabs(lse - log(naive)) < 1e-13);

    /* every id (ntop = vocab): ordered, sum of probabilities 1, = logit - lse */
    CHECK_STATUS(td_sample_logprobs(lg, 10, 3, 10, &all), TD_OK);
    CHECK_EQ_INT(all.ntop, 10);
    CHECK_EQ_INT(all.token, 3);
    CHECK(all.logprob == (double)lg[3] - lse);
    for (uint32_t i = 0; i < all.ntop; i++) {
        sum += exp(all.top[i].logprob);
        CHECK(all.top[i].logprob == (double)lg[all.top[i].id] - lse);
        if (i > 0)
            CHECK(all.top[i].logprob <= all.top[i - 1].logprob);
        CHECK(all.top[i].logprob <= 0);
    }
    CHECK(fabs(sum - 1.0) < 1e-12);
    CHECK_EQ_INT(all.top[0].id, 8);
    CHECK_EQ_INT(all.top[1].id, 6);
    CHECK(all.top[3].id == 1 && all.top[4].id == 5);   /* equal logits: lower id first */

    /* the chosen token's logprob is the model's, whatever the sampling: the
     * same at temperature 0, 0.3 and 3, with top_k and top_p cuts */
    td_sample_params_t sps[3] = { sampling(0, 1, 0, 0), sampling(0.3, 0.5, 2, 1),
                                    sampling(3.0, 0.9, 0, 2) };
    for (int s = 0; s < 3; s++)
        for (uint64_t p = 0; p < 20; p++) {
            CHECK_STATUS(td_sample_pick(lg, 10, &sps[s], p, 3, &pk), TD_OK);
            CHECK(pk.logprob == (double)lg[pk.token] - lse);
            CHECK_EQ_INT(pk.ntop, 3);
            CHECK(pk.top[0].id == 8 && pk.top[1].id == 6 && pk.top[2].id == 0);
            CHECK_EQ_INT(pk.token, pick(lg, 10, &sps[s], p));
        }

    /* shifting every logit changes nothing (to rounding); large logits stay finite */
    float big[10];
    for (int i = 0; i < 10; i++)
        big[i] = lg[i] + 1e4f;
    CHECK_STATUS(td_sample_logprobs(big, 10, 8, 2, &pk), TD_OK);
    CHECK(isfinite(pk.logprob) && fabs(pk.logprob - all.top[0].logprob) < 1e-3);

    /* a 129,280-id row: still normalized in double */
    size_t V = 129280;
    float *row = malloc(V * sizeof(float));
    for (size_t i = 0; i < V; i++)
        row[i] = (float)sin((double)i * 0.37) * 4.0f;
    CHECK_STATUS(td_sample_logsumexp(row, V, &lse), TD_OK);
    sum = 0;
    for (size_t i = 0; i < V; i++)
        sum += exp((double)row[i] - lse);
    CHECK(fabs(sum - 1.0) < 1e-12);
    free(row);

    /* -inf: probability 0, listed last */
    const float masked[3] = { -INFINITY, 0.0f, -INFINITY };
    CHECK_STATUS(td_sample_logprobs(masked, 3, 0, 3, &pk), TD_OK);
    CHECK(pk.logprob == -INFINITY && pk.top[0].id == 1 && pk.top[0].logprob == 0.0);
    CHECK(pk.top[1].id == 0 && pk.top[2].id == 2);

    /* refusals */
    const float nan_row[2] = { 0.0f, NAN }, inf_row[2] = { 0.0f, INFINITY };
    const float none[2] = { -INFINITY, -INFINITY };
    td_sample_params_t g = sampling(0, 1, 0, 0);
    CHECK_STATUS(td_sample_logprobs(lg, 10, 10, 0, &pk), TD_ERR_RANGE);
    CHECK_STATUS(td_sample_logprobs(lg, 10, -1, 0, &pk), TD_ERR_RANGE);
    CHECK_STATUS(td_sample_logprobs(lg, 10, 0, TD_SAMPLE_MAX_TOP + 1, &pk), TD_ERR_RANGE);
    CHECK_STATUS(td_sample_logprobs(nan_row, 2, 0, 0, &pk), TD_ERR_INVALID);
    CHECK_STATUS(td_sample_logprobs(inf_row, 2, 0, 0, &pk), TD_ERR_INVALID);
    CHECK_STATUS(td_sample_logsumexp(none, 2, &lse), TD_ERR_INVALID);
    CHECK_STATUS(td_sample_logsumexp(lg, 0, &lse), TD_ERR_INVALID);
    CHECK_STATUS(td_sample_pick(nan_row, 2, &g, 0, 0, &pk), TD_ERR_INVALID);
    CHECK_LOGGED("NaN or +inf");
    CHECK_STATUS(td_sample_pick(inf_row, 2, &g, 0, 0, &pk), TD_ERR_INVALID);
    CHECK_LOGGED("NaN or +inf");
    CHECK_STATUS(td_sample_pick(none, 2, &g, 0, 0, &pk), TD_ERR_INVALID);
    CHECK_LOGGED("none finite");
    CHECK_STATUS(td_sample_pick(lg, 10, &g, 0, TD_SAMPLE_MAX_TOP + 1, &pk), TD_ERR_RANGE);
    CHECK_LOGGED("21 alternatives");
}

static void
test_stop_finish(void)
{
    td_sample_params_t sp = sampling(1.0, 1.0, 0, 0);
    char why[96];

    /* parameter checks */
    CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_OK);
    sp.temperature = -0.1;
    CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
    CHECK(strstr(why, "temperature") != NULL);
    sp.temperature = INFINITY;
    CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
    sp.temperature = NAN;
    CHECK_STATUS(td_sample_check(&sp, NULL, 0), TD_ERR_INVALID);
    sp.temperature = 1.0;
    static const double bad_p[] = { 0.0, -0.5, 1.0000001, NAN };
    for (size_t i = 0; i < 4; i++) {
        sp.top_p = bad_p[i];
        CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
        CHECK(strstr(why, "top_p") != NULL);
    }
    sp.top_p = 1.0;
    sp.nstop = 1;
    sp.stop[0] = -4;
    CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
    sp.nstop = TD_SAMPLE_MAX_STOP + 1;
    CHECK_STATUS(td_sample_check(&sp, why, sizeof(why)), TD_ERR_INVALID);
    const float lg[3] = { 0, 1, 2 };
    CHECK_STATUS(td_sample_pick(lg, 3, &sp, 0, 0, &(td_sample_pick_t){ 0 }), TD_ERR_INVALID);
    CHECK_LOGGED("too many stop tokens");

    /* finish: stop ids first, then max_tokens, then the context */
    sp = sampling(1.0, 1.0, 0, 0);
    sp.nstop = 2;
    sp.stop[0] = 7;
    sp.stop[1] = 9;
    sp.max_tokens = 4;
    CHECK_EQ_INT(td_sample_finish(&sp, 9, 1, 10, 100), TD_SAMPLE_FINISH_STOP);
    CHECK_EQ_INT(td_sample_finish(&sp, 7, 4, 100, 100), TD_SAMPLE_FINISH_STOP);
    CHECK_EQ_INT(td_sample_finish(&sp, 8, 3, 10, 100), TD_SAMPLE_FINISH_NONE);
    CHECK_EQ_INT(td_sample_finish(&sp, 8, 4, 10, 100), TD_SAMPLE_FINISH_LENGTH);
    CHECK_EQ_INT(td_sample_finish(&sp, 8, 2, 100, 100), TD_SAMPLE_FINISH_LENGTH);
    CHECK_EQ_INT(td_sample_finish(&sp, 8, 2, 99, 100), TD_SAMPLE_FINISH_NONE);
    sp.max_tokens = 0;   /* no limit but the context; context 0: none at all */
    CHECK_EQ_INT(td_sample_finish(&sp, 8, 1000000, 5000, 0), TD_SAMPLE_FINISH_NONE);

    /* end-of-sequence ids from config.json */
    static const struct {
        const char *json;
        td_status_t st;
        unsigned n;
        int32_t ids[2];
    } cfgs[] = {
        { "{\"vocab_size\": 1000, \"eos_token_id\": 1}", TD_OK, 1, { 1 } },
        { "{\"vocab_size\": 1000, \"eos_token_id\": [5, 7]}", TD_OK, 2, { 5, 7 } },
        { "{\"vocab_size\": 1000, \"eos_token_id\": [7, 7]}", TD_OK, 1, { 7 } },
        { "{\"vocab_size\": 1000, \"eos_token_id\": 1000}", TD_ERR_INVALID, 0, { 0 } },
        { "{\"vocab_size\": 1000, \"eos_token_id\": [3, -1]}", TD_ERR_INVALID, 0, { 0 } },
        { "{\"vocab_size\": 1000, \"eos_token_id\": null}", TD_ERR_NOT_FOUND, 0, { 0 } },
    };
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        td_modelcfg_t *cfg = NULL;
        char err[256];
        CHECK_STATUS(td_modelcfg_parse(cfgs[i].json, strlen(cfgs[i].json), &cfg, err,
                                       sizeof(err)), TD_OK);
        if (cfg == NULL) {
            fprintf(stderr, "%s: %s\n", cfgs[i].json, err);
            continue;
        }
        sp = sampling(0, 1, 0, 0);
        sp.nstop = 1;
        sp.stop[0] = 7;   /* one the caller set; EOS ids are added, not repeated */
        CHECK_STATUS(td_model_stop_eos(cfg, NULL, &sp), cfgs[i].st);
        if (cfgs[i].st == TD_ERR_INVALID)
            CHECK_LOGGED("outside the vocabulary");
        if (cfgs[i].st == TD_ERR_NOT_FOUND)
            CHECK_LOGGED("no end-of-sequence token");
        if (cfgs[i].st == TD_OK) {
            unsigned want = 1 + cfgs[i].n - (cfgs[i].ids[cfgs[i].n - 1] == 7);
            CHECK_EQ_INT(sp.nstop, want);
            for (unsigned k = 0; k < cfgs[i].n; k++) {
                int found = 0;
                for (unsigned j = 0; j < sp.nstop; j++)
                    found |= sp.stop[j] == cfgs[i].ids[k];
                CHECK(found);
            }
        } else {
            CHECK_EQ_INT(sp.nstop, 1);   /* unchanged */
        }
        td_modelcfg_destroy(cfg);
    }
    /* too many: the caller's 16 plus one more */
    td_modelcfg_t *cfg = NULL;
    const char *one = "{\"vocab_size\": 1000, \"eos_token_id\": 999}";
    CHECK_STATUS(td_modelcfg_parse(one, strlen(one), &cfg, NULL, 0), TD_OK);
    if (cfg != NULL) {
        sp.nstop = TD_SAMPLE_MAX_STOP;
        for (int i = 0; i < TD_SAMPLE_MAX_STOP; i++)
            sp.stop[i] = i;
        CHECK_STATUS(td_model_stop_eos(cfg, NULL, &sp), TD_ERR_RANGE);
        CHECK_LOGGED("more than 16 stop tokens");
        CHECK_EQ_INT(sp.nstop, TD_SAMPLE_MAX_STOP);
        td_modelcfg_destroy(cfg);
    }
}

/* ---- end-of-sequence ids from a checkpoint directory ------------------------------------ */

static void
write_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (text == NULL) {
        unlink(path);
        return;
    }
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

/* td_v41_eos_ids: generation_config.json first, then config.json, then
 * tokenizer_config.json's eos_token through tokenizer.json, as transformers'
 * generate resolves them. */
static void
test_eos_ids(void)
{
    static const char *tokenizer =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<bos>\"}, "
        "{\"id\": 13, \"content\": \"<eos>\"}], "
        "\"model\": {\"vocab\": {\"a\": 1, \"</s>\": 9}}}";
    static const struct {
        const char *what;
        const char *generation;   /* generation_config.json, or NULL: none */
        const char *config;       /* config.json */
        const char *tok_config;   /* tokenizer_config.json, or NULL: none */
        td_status_t st;
        unsigned n;
        int32_t ids[3];
    } cases[] = {
        { "generation_config's list wins", "{\"eos_token_id\": [5, 6, 5]}",
          "{\"vocab_size\": 100, \"eos_token_id\": 1}", "{\"eos_token\": \"<eos>\"}",
          TD_OK, 2, { 5, 6 } },
        { "generation_config's int", "{\"eos_token_id\": 7}",
          "{\"vocab_size\": 100, \"eos_token_id\": 1}", NULL, TD_OK, 1, { 7 } },
        { "generation_config without one: config.json's", "{\"do_sample\": true}",
          "{\"vocab_size\": 100, \"eos_token_id\": [1, 2]}", NULL, TD_OK, 2, { 1, 2 } },
        { "null everywhere but the tokenizer config (added token)",
          "{\"eos_token_id\": null}", "{\"vocab_size\": 100, \"eos_token_id\": null}",
          "{\"eos_token\": {\"content\": \"<eos>\", \"special\": true}}", TD_OK, 1,
          { 13 } },
        { "the tokenizer config's token from the vocabulary", NULL,
          "{\"vocab_size\": 100, \"eos_token_id\": null}",
          "{\"eos_token\": \"</s>\"}", TD_OK, 1, { 9 } },
        { "nothing names one", NULL, "{\"vocab_size\": 100, \"eos_token_id\": null}",
          "{\"bos_token\": \"<bos>\"}", TD_ERR_NOT_FOUND, 0, { 0 } },
        { "generation_config's id outside the vocabulary", "{\"eos_token_id\": [3, 100]}",
          "{\"vocab_size\": 100}", NULL, TD_ERR_INVALID, 0, { 0 } },
        { "generation_config that is not JSON", "{eos", "{\"vocab_size\": 100}", NULL,
          TD_ERR_INVALID, 0, { 0 } },
        { "generation_config's eos a string", "{\"eos_token_id\": \"2\"}",
          "{\"vocab_size\": 100}", NULL, TD_ERR_INVALID, 0, { 0 } },
    };
    char dir[] = "/tmp/test_generate_eos.XXXXXX";

    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        td_check_failures++;
        return;
    }
    write_file(dir, "tokenizer.json", tokenizer);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        td_modelcfg_t *cfg = NULL;
        int32_t ids[TD_SAMPLE_MAX_STOP] = { 0 };
        uint32_t n = 0;

        write_file(dir, "generation_config.json", cases[c].generation);
        write_file(dir, "tokenizer_config.json", cases[c].tok_config);
        CHECK_STATUS(td_modelcfg_parse(cases[c].config, strlen(cases[c].config), &cfg, NULL, 0),
                     TD_OK);
        if (cfg == NULL)
            continue;
        td_status_t st = td_v41_eos_ids(dir, cfg, ids, &n);
        if (st != cases[c].st || (st == TD_OK && (n != cases[c].n ||
                                                  memcmp(ids, cases[c].ids, n * 4) != 0))) {
            fprintf(stderr, "%s: %s, %u ids (%d %d), want %s, %u ids (%d %d)\n",
                    cases[c].what, td_status_str(st), n, ids[0], ids[1],
                    td_status_str(cases[c].st), cases[c].n, cases[c].ids[0], cases[c].ids[1]);
            td_check_failures++;
        }
        td_modelcfg_destroy(cfg);
    }
    const char *names[] = { "generation_config.json", "tokenizer_config.json", "tokenizer.json" };
    for (size_t i = 0; i < 3; i++)
        write_file(dir, names[i], NULL);
    rmdir(dir);
}

/* ---- tiny checkpoints ---------------------------------------------------------------- */

static char tmpdir[] = "/tmp/test_generate.XXXXXX";
static char tool[PATH_MAX + 32];

/* mk-tiny-model: $TD_MK_TINY_MODEL, else <build>/tools/mk-tiny-model. */
static int
find_tool(void)
{
    return td_testutil_build_tool("TD_MK_TINY_MODEL", "mk-tiny-model", tool, sizeof(tool));
}

static td_rng_t rng = { .state = TD_RNG_GAMMA };

/* Every cache of this test at other shuffled places (tests/unit/testkv.h). */
static uint64_t kv_seed = 100;

static td_kvmem_t *
kv_cache(const td_model_t *m, uint64_t cap, td_cache_t *c)
{
    return td_testkv_cache(m, cap, &kv_seed, c);
}

/* Report the first differing logit of two rows. */
static int
rows_equal(const char *what, int step, int req, const float *a, const float *b, size_t V)
{
    if (memcmp(a, b, V * sizeof(float)) == 0)
        return 1;
    for (size_t i = 0; i < V; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            fprintf(stderr, "%s: step %d, request %d: logit %zu is %.9g, alone %.9g\n", what,
                    step, req, i, a[i], b[i]);
            break;
        }
    td_check_failures++;
    return 0;
}

/* Eight requests with different prompts and lengths, decoded together with
 * td_forward_decode, give bit for bit the logits each gives alone: all eight
 * for 8 steps, then subsets in other orders (a request's row moves). */
static void
test_batch_invariance(const char *name, const char *args)
{
    enum { R = 8, MAXP = 48 };
    static const size_t lens[R] = { 1, 2, 7, 8, 9, 16, 29, 44 };
    /* the rows of each step, in batch order */
    static const int sched[][R + 1] = {
        { 8, 0, 1, 2, 3, 4, 5, 6, 7 }, { 8, 0, 1, 2, 3, 4, 5, 6, 7 },
        { 8, 0, 1, 2, 3, 4, 5, 6, 7 }, { 8, 0, 1, 2, 3, 4, 5, 6, 7 },
        { 8, 7, 6, 5, 4, 3, 2, 1, 0 }, { 8, 3, 0, 7, 1, 6, 2, 5, 4 },
        { 8, 0, 1, 2, 3, 4, 5, 6, 7 }, { 8, 0, 1, 2, 3, 4, 5, 6, 7 },
        { 5, 6, 1, 4, 0, 3 },          { 5, 6, 1, 4, 0, 3 },
        { 3, 7, 2, 5 },                { 1, 2 },
        { 8, 5, 4, 3, 2, 1, 0, 7, 6 }, { 8, 0, 1, 2, 3, 4, 5, 6, 7 },
    };
    const int nsteps = (int)(sizeof(sched) / sizeof(sched[0]));
    char dir[PATH_MAX + 64];
    td_model_t *m = NULL;
    td_cache_t batch[R], alone[R];
    td_kvmem_t *mb[R] = { 0 }, *ma[R] = { 0 };
    float *lb = NULL, *la = NULL;
    int32_t prompt[R][MAXP], next[R];
    int same = 1;

    if (td_testutil_mk_model(tool, tmpdir, name, args, dir, sizeof(dir)) != 0)
        return;
    CHECK_STATUS(td_model_load(dir, &m), TD_OK);
    if (m == NULL)
        return;
    size_t V = (size_t)m->cfg->vocab_size;
    lb = malloc(R * V * sizeof(float));
    la = malloc(V * sizeof(float));
    for (int r = 0; r < R; r++) {
        for (size_t i = 0; i < lens[r]; i++)
            prompt[r][i] = (int32_t)(td_rng_next(&rng) % (uint64_t)V);
        mb[r] = kv_cache(m, 128, &batch[r]);
        ma[r] = kv_cache(m, 128, &alone[r]);
        if (mb[r] == NULL || ma[r] == NULL)
            goto out;
        /* the batch's copies prefill in chunks of 5, the lone ones in one call */
        for (size_t at = 0; at < lens[r]; at += 5) {
            size_t n = lens[r] - at < 5 ? lens[r] - at : 5;
            CHECK_STATUS(td_forward_prefill(m, &batch[r], prompt[r] + at, n, 0, lb), TD_OK);
        }
        CHECK_STATUS(td_forward_prefill(m, &alone[r], prompt[r], lens[r], 0, la), TD_OK);
        same &= rows_equal(name, -1, r, lb, la, V);
        next[r] = td_sample_argmax(la, V);
    }
    for (int s = 0; s < nsteps; s++) {
        int n = sched[s][0];
        td_cache_t *caches[R];
        int32_t toks[R];
        for (int i = 0; i < n; i++) {
            caches[i] = &batch[sched[s][1 + i]];
            toks[i] = next[sched[s][1 + i]];
        }
        CHECK_STATUS(td_forward_decode(m, caches, toks, (size_t)n, lb), TD_OK);
        for (int i = 0; i < n; i++) {
            int r = sched[s][1 + i];
            td_cache_t *one[1] = { &alone[r] };
            CHECK_STATUS(td_forward_decode(m, one, &next[r], 1, la), TD_OK);
            same &= rows_equal(name, s, r, lb + (size_t)i * V, la, V);
            next[r] = td_sample_argmax(la, V);   /* greedy continuation */
        }
    }
    for (int r = 0; r < R; r++)
        CHECK_EQ_INT(td_cache_tokens(&batch[r]), td_cache_tokens(&alone[r]));
    fprintf(stderr, "test_generate: %s: batch of %d over %d steps: %s\n", name, R, nsteps,
            same ? "bitwise equal" : "DIFFERENT");
out:
    for (int r = 0; r < R; r++) {
        td_testkv_done(mb[r]);
        td_testkv_done(ma[r]);
    }
    free(lb);
    free(la);
    td_model_destroy(m);
}

/* A cache written out as bytes after prefill and a few steps (its state in
 * td_kvmem_pack's order, as a transfer carries it), read back into memory
 * whose blocks lie in another order under a second, fresh load of the same
 * checkpoint (the first one gone, as in another process), continues with
 * bit-identical logits. */
static void
test_cache_handoff(const char *name, const char *args)
{
    enum { P = 37, WARM = 5, K = 12 };
    char dir[PATH_MAX + 64], path[PATH_MAX + 96];
    td_model_t *a = NULL, *b = NULL;
    td_cache_t c, cb, *pc = &c, *pcb = &cb;
    td_kvmem_t *mem = NULL, *memb = NULL;
    float *la = NULL, *ref = NULL;
    int32_t seq[P + WARM], toks[K + 1], tok;
    unsigned char *bytes = NULL;
    size_t size = 0, want = 0;
    int same = 1;

    if (td_testutil_mk_model(tool, tmpdir, name, args, dir, sizeof(dir)) != 0)
        return;
    snprintf(path, sizeof(path), "%s/%s.cache", tmpdir, name);
    CHECK_STATUS(td_model_load(dir, &a), TD_OK);
    if (a == NULL)
        return;
    size_t V = (size_t)a->cfg->vocab_size;
    la = malloc(V * sizeof(float));
    ref = malloc((size_t)K * V * sizeof(float));
    for (int i = 0; i < P; i++)
        seq[i] = (int32_t)(td_rng_next(&rng) % (uint64_t)V);
    mem = kv_cache(a, 96, &c);
    if (mem == NULL)
        goto out;
    CHECK_STATUS(td_forward_prefill(a, &c, seq, P, 0, la), TD_OK);
    tok = td_sample_argmax(la, V);
    for (int s = 0; s < WARM; s++) {
        seq[P + s] = tok;
        CHECK_STATUS(td_forward_decode(a, &pc, &tok, 1, la), TD_OK);
        tok = td_sample_argmax(la, V);
    }
    /* out to a file */
    want = (size_t)td_kvmem_state_bytes(a->plan->layout, P + WARM);
    bytes = malloc(want);
    td_kvmem_pack(&mem->kv, P + WARM, bytes);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL && fwrite(bytes, 1, want, f) == want);
    if (f != NULL)
        CHECK(fclose(f) == 0);
    free(bytes);
    bytes = NULL;
    /* the original goes on */
    for (int s = 0; s < K; s++) {
        toks[s] = tok;
        CHECK_STATUS(td_forward_decode(a, &pc, &tok, 1, ref + (size_t)s * V), TD_OK);
        tok = td_sample_argmax(ref + (size_t)s * V, V);
    }
    td_testkv_done(mem);
    mem = NULL;
    td_model_destroy(a);
    a = NULL;

    /* a fresh instance reads the bytes into other blocks */
    CHECK_STATUS(td_model_load(dir, &b), TD_OK);
    f = fopen(path, "rb");
    if (b == NULL || f == NULL) {
        td_check_failures++;
        if (f != NULL)
            fclose(f);
        goto out;
    }
    fseek(f, 0, SEEK_END);
    size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    CHECK_EQ_INT(size, want);
    bytes = malloc(size);
    CHECK(fread(bytes, 1, size, f) == size);
    fclose(f);
    memb = kv_cache(b, 96, &cb);
    if (memb == NULL || size != want)
        goto out;
    td_kvmem_unpack(&memb->kv, P + WARM, bytes);
    CHECK_EQ_INT(td_cache_tokens(&cb), P + WARM);
    CHECK_STATUS(td_cache_check(&cb, seq, P + WARM), TD_OK);
    for (int s = 0; s < K; s++) {
        CHECK_STATUS(td_forward_decode(b, &pcb, &toks[s], 1, la), TD_OK);
        same &= rows_equal(name, s, 0, la, ref + (size_t)s * V, V);
        if (s + 1 < K)
            CHECK_EQ_INT(td_sample_argmax(la, V), toks[s + 1]);
    }
    /* the state is now P + WARM + K tokens: taken as the one of P + WARM, refused */
    CHECK_STATUS(td_cache_check(&cb, NULL, P + WARM), TD_ERR_MISMATCH);
    fprintf(stderr, "test_generate: %s: state of %zu bytes handed to other blocks of a fresh "
            "load, %d steps: %s\n", name, size, K, same ? "bitwise equal" : "DIFFERENT");
out:
    free(bytes);
    td_testkv_done(memb);
    td_testkv_done(mem);
    td_model_destroy(b);
    td_model_destroy(a);
    free(la);
    free(ref);
}

/* ---- the deepseek-v41 engine in its caller's memory ------------------------------------ */

/* Pack two views' states after n tokens and compare them. */
static int
same_state(const td_layout_kv_t *x, const td_layout_kv_t *y, uint64_t n)
{
    size_t len = (size_t)td_kvmem_state_bytes(x->layout, n);
    unsigned char *a = malloc(len ? len : 1), *b = malloc(len ? len : 1);
    int same;

    td_kvmem_pack(x, n, a);
    td_kvmem_pack(y, n, b);
    same = memcmp(a, b, len) == 0;
    free(a);
    free(b);
    return same;
}

/* What a layer callback is told, checked when it is told: layers in order;
 * each piece's entries already final in the request's KV memory (equal to a
 * reference pass's, when given); entries and fixed segments counted. */
typedef struct {
    const td_cache_t *ref;     /* the reference's state after the same tokens, or NULL */
    int64_t last_layer;
    int calls, fixed_pieces, bad, cancel_layer;
    uint64_t entries;
} told_t;

static td_status_t
told_fn(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *p, size_t np, void *arg)
{
    told_t *t = arg;
    const td_layout_t *l = req->engine->layout;

    t->calls++;
    if ((int64_t)layer < t->last_layer)
        t->bad++;
    t->last_layer = layer;
    for (size_t k = 0; k < np; k++) {
        const td_layout_seg_t *sg = &l->segs[p[k].seg];

        if (sg->layer != layer || p[k].count == 0)
            t->bad++;
        if (sg->kind == TD_LAYOUT_FIXED) {
            t->fixed_pieces++;
            if (p[k].first != 0 || p[k].count != sg->entries)
                t->bad++;
        } else {
            t->entries += p[k].count;
        }
        for (uint64_t e = p[k].first; t->ref != NULL && e < p[k].first + p[k].count; e++)
            if (memcmp(td_layout_kv_entry(&req->kv, p[k].seg, e),
                       td_layout_kv_entry(&t->ref->kv, p[k].seg, e), sg->entry_bytes) != 0)
                t->bad++;
    }
    return (int)layer == t->cancel_layer ? TD_ERR_CANCELED : TD_OK;
}

/* Paged entries every paged segment holds after n tokens, summed; fixed
 * segments counted. */
static uint64_t
paged_entries(const td_layout_t *l, uint64_t n, int *nfixed)
{
    uint64_t e = 0;

    *nfixed = 0;
    for (uint32_t i = 0; i < l->nsegs; i++) {
        if (l->segs[i].kind == TD_LAYOUT_PAGED)
            e += td_layout_entries(&l->segs[i], n);
        else
            (*nfixed)++;
    }
    return e;
}

/* Prefill in chunks through the engine (each layer's pieces checked against
 * a one-shot reference pass as they are told), adopt of a copy of the state
 * in other blocks, both decoded in one batch equal to the reference bit for
 * bit, adopt refusing a state that is not the prompt's, a cancel after a
 * layer. */
static void
test_v41_engine(const char *name, const char *args)
{
    enum { P = 45, CHUNK = 16, K = 6, CAP = P + K + 1 };
    char dir[PATH_MAX + 64];
    td_model_t *m = NULL;
    td_engine_t *e = NULL;
    td_engine_req_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    td_kvmem_t *mref = NULL, *ma = NULL, *mb = NULL, *mc = NULL, *md = NULL;
    td_cache_t ref, *pref = &ref;
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_finish_t fin;
    td_sample_dist_t da, db;
    int32_t prompt[P], first = -1;
    float *lr = NULL;
    told_t t;
    int nfixed, same = 1;

    if (td_testutil_mk_model(tool, tmpdir, name, args, dir, sizeof(dir)) != 0)
        return;
    CHECK_STATUS(td_v41_engine_open(dir, NULL, &e), TD_OK);
    CHECK_STATUS(td_model_load(dir, &m), TD_OK);   /* the reference: another instance */
    if (e == NULL || m == NULL)
        goto out;
    size_t V = (size_t)m->cfg->vocab_size;
    const td_layout_t *l = e->layout;
    CHECK_EQ_INT(l->hash, m->plan->layout->hash);
    lr = malloc(V * sizeof(float));
    for (int i = 0; i < P; i++)
        prompt[i] = (int32_t)(td_rng_next(&rng) % (uint64_t)V);
    mref = kv_cache(m, CAP, &ref);
    if (mref == NULL || lr == NULL)
        goto out;
    CHECK_STATUS(td_forward_prefill(m, &ref, prompt, P, 0, lr), TD_OK);

    /* the prefill side, in chunks */
    CHECK_STATUS(td_kvmem_create(l, CAP, kv_seed++, &ma), TD_OK);
    if (ma == NULL)
        goto out;
    CHECK_STATUS(td_engine_req_create(e, &sp, &ma->kv, &a), TD_OK);
    if (a == NULL)
        goto out;
    t = (told_t){ .ref = &ref, .cancel_layer = -1 };
    for (int at = 0; at < P; at += CHUNK) {
        int n = P - at < CHUNK ? P - at : CHUNK;
        t.last_layer = -1;
        CHECK_STATUS(td_engine_prefill(a, prompt + at, (size_t)n, at + n == P, told_fn, &t),
                     TD_OK);
    }
    CHECK_EQ_INT(t.bad, 0);
    CHECK_EQ_INT(t.calls, (int)l->layers * ((P + CHUNK - 1) / CHUNK));
    CHECK_EQ_INT(t.entries, paged_entries(l, P, &nfixed));
    CHECK_EQ_INT(t.fixed_pieces, nfixed);
    CHECK(same_state(&a->kv, &ref.kv, P));
    CHECK_STATUS(td_engine_sample(a, &first, &fin), TD_OK);
    CHECK_EQ_INT(first, td_sample_argmax(lr, V));
    CHECK_STATUS(td_engine_logits(a, &da), TD_OK);
    CHECK(da.n == V && memcmp(da.logits, lr, V * sizeof(float)) == 0);

    /* the decode side: the state copied into other blocks, adopted as it is */
    CHECK_STATUS(td_kvmem_create(l, CAP, kv_seed++, &mb), TD_OK);
    if (mb == NULL)
        goto out;
    CHECK_STATUS(td_engine_req_create(e, &sp, &mb->kv, &b), TD_OK);
    if (b == NULL)
        goto out;
    td_kvmem_copy(&mb->kv, &ma->kv, P);
    CHECK_STATUS(td_engine_adopt(b, prompt, P), TD_OK);
    CHECK_EQ_INT(b->ntokens, P);
    CHECK_STATUS(td_engine_logits(b, &db), TD_ERR_STATE);
    CHECK_STATUS(td_engine_take(b, first, &fin), TD_OK);

    /* a state that is not the prompt's is refused: another length, another
     * last token (the engram look-back) */
    CHECK_STATUS(td_kvmem_create(l, CAP, kv_seed++, &mc), TD_OK);
    if (mc == NULL)
        goto out;
    CHECK_STATUS(td_engine_req_create(e, &sp, &mc->kv, &c), TD_OK);
    if (c == NULL)
        goto out;
    td_kvmem_copy(&mc->kv, &ma->kv, P);
    CHECK_STATUS(td_engine_adopt(c, prompt, P - 1), TD_ERR_MISMATCH);
    td_engine_req_destroy(c);
    c = NULL;
    if (m->plan->engram >= 0) {
        int32_t other[P];
        memcpy(other, prompt, sizeof(other));
        other[P - 1] = (other[P - 1] + 1) % (int32_t)V;
        CHECK_STATUS(td_engine_req_create(e, &sp, &mc->kv, &c), TD_OK);
        if (c == NULL)
            goto out;
        td_kvmem_copy(&mc->kv, &ma->kv, P);
        CHECK_STATUS(td_engine_adopt(c, other, P), TD_ERR_MISMATCH);
    }

    /* both sides in one batch, equal to the reference bit for bit; the new
     * entries land in each side's own blocks, and fn is told of them */
    td_engine_row_t rows[2] = { { .req = a, .token = first }, { .req = b, .token = first } };
    int32_t tok = first;
    t = (told_t){ .cancel_layer = -1 };
    for (int s = 0; s < K; s++) {
        t.last_layer = -1;
        CHECK_STATUS(td_engine_decode_step(e, rows, 2, told_fn, &t), TD_OK);
        CHECK_STATUS(td_forward_decode(m, &pref, &tok, 1, lr), TD_OK);
        tok = td_sample_argmax(lr, V);
        CHECK_STATUS(td_engine_logits(a, &da), TD_OK);
        CHECK_STATUS(td_engine_logits(b, &db), TD_OK);
        same &= da.n == V && memcmp(da.logits, lr, V * sizeof(float)) == 0;
        same &= db.n == V && memcmp(db.logits, lr, V * sizeof(float)) == 0;
        CHECK_EQ_INT(rows[0].next, tok);
        CHECK_EQ_INT(rows[1].next, tok);
        rows[0].token = rows[0].next;
        rows[1].token = rows[1].next;
    }
    CHECK(same);
    CHECK_EQ_INT(t.bad, 0);
    CHECK_EQ_INT(t.entries, 2 * (paged_entries(l, P + K, &nfixed) - paged_entries(l, P, &nfixed)));
    CHECK_EQ_INT(t.fixed_pieces, 0);
    CHECK(same_state(&ma->kv, &ref.kv, P + K));
    CHECK(same_state(&mb->kv, &ref.kv, P + K));

    /* a callback that cancels stops the prefill after that layer */
    CHECK_STATUS(td_kvmem_create(l, CAP, kv_seed++, &md), TD_OK);
    if (md == NULL)
        goto out;
    CHECK_STATUS(td_engine_req_create(e, &sp, &md->kv, &d), TD_OK);
    if (d == NULL)
        goto out;
    t = (told_t){ .cancel_layer = 1, .last_layer = -1 };
    CHECK_STATUS(td_engine_prefill(d, prompt, P, 1, told_fn, &t), TD_ERR_CANCELED);
    CHECK_EQ_INT(t.calls, 2);
    CHECK_STATUS(td_engine_prefill(d, prompt, 1, 1, told_fn, &t), TD_ERR_STATE);
    fprintf(stderr, "test_generate: %s: engine in shuffled blocks, prefill in chunks of %d, "
            "adopt in other blocks, %d steps in one batch: %s\n", name, CHUNK, K,
            same ? "bitwise equal" : "DIFFERENT");
out:
    td_engine_req_destroy(a);
    td_engine_req_destroy(b);
    td_engine_req_destroy(c);
    td_engine_req_destroy(d);
    td_testkv_done(ma);
    td_testkv_done(mb);
    td_testkv_done(mc);
    td_testkv_done(md);
    td_testkv_done(mref);
    free(lr);
    td_engine_destroy(e);
    td_model_destroy(m);
}

/* ---- what a request holds ---------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

/* Heap bytes in use by the process. */
static size_t
heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#endif
}

static td_status_t
count_fn(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *p, size_t np, void *arg)
{
    (void)req;
    (void)layer;
    (void)p;
    *(size_t *)arg += np;
    return TD_OK;
}

/* R requests of `prompt` tokens in memory for cap tokens: prefill in chunks,
 * the first token, 3 decode steps in one batch. Returns the heap they hold
 * then, per request, beyond what was in use before they were created (their
 * KV memory, the caller's, made before). */
static size_t
requests_heap(td_engine_t *e, size_t prompt, size_t cap, size_t *kv_bytes)
{
    enum { R = 4, CHUNK = 256, STEPS = 3 };
    td_kvmem_t *mem[R] = { 0 };
    td_engine_req_t *req[R] = { 0 };
    td_engine_row_t rows[R];
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_finish_t fin;
    int32_t *tok = malloc(prompt * sizeof(*tok));
    size_t h0, h1 = 0, told = 0;

    for (size_t i = 0; i < prompt; i++)
        tok[i] = (int32_t)(td_rng_next(&rng) % e->vocab);
    for (int r = 0; r < R; r++)
        CHECK_STATUS(td_kvmem_create(e->layout, cap, kv_seed++, &mem[r]), TD_OK);
    *kv_bytes = mem[0] != NULL ? mem[0]->bytes : 0;
    h0 = heap_in_use();
    for (int r = 0; r < R && mem[r] != NULL; r++) {
        CHECK_STATUS(td_engine_req_create(e, &sp, &mem[r]->kv, &req[r]), TD_OK);
        if (req[r] == NULL)
            goto out;
        for (size_t at = 0; at < prompt; at += CHUNK) {
            size_t n = prompt - at < CHUNK ? prompt - at : CHUNK;
            CHECK_STATUS(td_engine_prefill(req[r], tok + at, n, at + n == prompt, count_fn,
                                           &told), TD_OK);
        }
        rows[r] = (td_engine_row_t){ .req = req[r] };
        CHECK_STATUS(td_engine_sample(req[r], &rows[r].token, &fin), TD_OK);
    }
    for (int s = 0; s < STEPS; s++) {
        CHECK_STATUS(td_engine_decode_step(e, rows, R, NULL, NULL), TD_OK);
        for (int r = 0; r < R; r++)
            rows[r].token = rows[r].next;
    }
    h1 = heap_in_use();
out:
    for (int r = 0; r < R; r++) {
        td_engine_req_destroy(req[r]);
        td_testkv_done(mem[r]);
    }
    free(tok);
    return h1 > h0 ? (h1 - h0) / R : 0;
}

/* A request holds nothing outside its KV memory but a few KB (its
 * distribution, [vocab] floats, and its state): the same at 40 tokens as at
 * 1 000 (within the heap's rounding, 512 B), while its KV grows 7-fold. One
 * thread, so no worker's scratch grows between the two; a first round of
 * each grows this thread's and whatever is allocated once. */
static void
test_request_memory(const char *name, const char *args)
{
    char dir[PATH_MAX + 64];
    td_engine_t *e = NULL;
    unsigned threads = td_kernels_cpu_threads();
    size_t kv_short = 0, kv_long = 0, h_short, h_long;

    if (td_testutil_mk_model(tool, tmpdir, name, args, dir, sizeof(dir)) != 0)
        return;
    CHECK_STATUS(td_v41_engine_open(dir, NULL, &e), TD_OK);
    if (e == NULL)
        return;
    CHECK_STATUS(td_kernels_cpu_set_threads(1), TD_OK);
    requests_heap(e, 1000, 1024, &kv_long);
    requests_heap(e, 40, 64, &kv_short);
    h_short = requests_heap(e, 40, 64, &kv_short);
    h_long = requests_heap(e, 1000, 1024, &kv_long);
    CHECK_STATUS(td_kernels_cpu_set_threads(threads), TD_OK);
    fprintf(stderr, "test_generate: %s: heap per request: %zu B at 40 tokens, %zu B at 1000 "
            "(vocab %u; KV memory, the caller's: %zu and %zu B)\n", name, h_short, h_long,
            e->vocab, kv_short, kv_long);
    CHECK(h_short > 0 && h_short <= 4096 + e->vocab * sizeof(float));
    CHECK(h_long <= h_short + 512);
    td_engine_destroy(e);
}

/* ---- the engine as a DEP group's rank (create_group) -------------------------------- */

enum { GP = 21, GR = 2 };

typedef struct {
    const char *dir;
    td_comm_t *comm;
    int32_t prompt[GP];
    const float *want;         /* [vocab]: the one-rank engine's logits after the prompt */
    td_status_t st_cancel, st_pass;
    int same;
    uint64_t passes;
} grank_t;

static void *
grank_main(void *arg)
{
    grank_t *g = arg;
    td_engine_t *e = NULL;
    td_engine_group_t grp = { g->comm, NULL };
    td_sample_params_t sp = td_sample_params_greedy();

    CHECK_STATUS(td_v41_engine_open(g->dir, &grp, &e), TD_OK);
    if (e == NULL) {
        td_comm_abort(g->comm, TD_ERR_INVALID);
        return NULL;
    }
    CHECK(td_engine_is_group(e));
    if (td_comm_rank(g->comm) == 0) {
        /* a cancel at layer 2 ends the request, not the group's pass */
        td_kvmem_t *mc = NULL, *ma = NULL;
        td_engine_req_t *c = NULL, *a = NULL;
        told_t t = { .cancel_layer = 2, .last_layer = -1 };
        td_sample_dist_t d;

        CHECK_STATUS(td_kvmem_create(e->layout, GP + 1, kv_seed++, &mc), TD_OK);
        CHECK_STATUS(td_kvmem_create(e->layout, GP + 1, kv_seed++, &ma), TD_OK);
        if (mc != NULL && ma != NULL && td_engine_req_create(e, &sp, &mc->kv, &c) == TD_OK &&
            td_engine_req_create(e, &sp, &ma->kv, &a) == TD_OK) {
            g->st_cancel = td_engine_prefill(c, g->prompt, GP, 1, told_fn, &t);
            CHECK_EQ_INT(t.calls, 3);   /* layers 0, 1, 2: told no more after the stop */
            t = (told_t){ .cancel_layer = -1, .last_layer = -1 };
            g->st_pass = td_engine_prefill(a, g->prompt, GP, 1, told_fn, &t);
            g->same = td_engine_logits(a, &d) == TD_OK &&
                      memcmp(d.logits, g->want, d.n * sizeof(float)) == 0;
        }
        td_engine_req_destroy(c);
        td_engine_req_destroy(a);
        td_kvmem_destroy(mc);
        td_kvmem_destroy(ma);
    } else {
        g->st_cancel = e->ops->pass_empty(e);
        g->st_pass = e->ops->pass_empty(e);
        g->same = 1;
    }
    g->passes = e->ops->passes(e);
    uint64_t et[64] = { 0 }, sum = 0;
    uint32_t E = e->ops->expert_tokens(e, et, 64);
    for (uint32_t x = 0; x < E && x < 64; x++)
        sum += et[x];
    CHECK(E > 0 && sum > 0);   /* every rank's experts took some of rank 0's rows */
    td_engine_destroy(e);
    return NULL;
}

/* Two ranks of a group, rank 0 with the requests: a layer callback's stop
 * (a cancel) fails that request only — the group's pass runs to its end and
 * the communicator stays whole — and the next request's logits are the
 * one-rank engine's bit for bit; both ranks made the same passes. The
 * synthetic engine cannot be a group's rank. */
static void
test_v41_group(const char *name, const char *args)
{
    char dir[PATH_MAX + 64];
    td_engine_t *one = NULL;
    td_engine_req_t *r = NULL;
    td_kvmem_t *m = NULL;
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_dist_t d;
    td_comm_group_t *cg = NULL;
    grank_t gr[GR];
    pthread_t th[GR];

    if (td_testutil_mk_model(tool, tmpdir, name, args, dir, sizeof(dir)) != 0)
        return;
    CHECK_STATUS(td_v41_engine_open(dir, NULL, &one), TD_OK);
    if (one == NULL)
        return;
    memset(gr, 0, sizeof(gr));
    for (int i = 0; i < GP; i++)
        gr[0].prompt[i] = (int32_t)(td_rng_next(&rng) % one->vocab);
    CHECK_STATUS(td_kvmem_create(one->layout, GP + 1, kv_seed++, &m), TD_OK);
    CHECK_STATUS(td_engine_req_create(one, &sp, &m->kv, &r), TD_OK);
    told_t t1 = { .cancel_layer = -1, .last_layer = -1 };
    CHECK_STATUS(td_engine_prefill(r, gr[0].prompt, GP, 1, told_fn, &t1), TD_OK);
    if (td_engine_logits(r, &d) != TD_OK) {
        td_check_failures++;
        goto out;
    }
    gr[0].want = d.logits;
    CHECK_STATUS(td_comm_group_create(GR, &(td_comm_opts_t){ 20000, "test group" }, &cg),
                 TD_OK);
    for (int i = 0; i < GR; i++) {
        gr[i].dir = dir;
        CHECK_STATUS(td_comm_cpu_create(cg, (uint32_t)i, &gr[i].comm), TD_OK);
    }
    for (int i = 0; i < GR; i++)
        pthread_create(&th[i], NULL, grank_main, &gr[i]);
    for (int i = 0; i < GR; i++)
        pthread_join(th[i], NULL);
    CHECK_STATUS(gr[0].st_cancel, TD_ERR_CANCELED);
    CHECK_STATUS(gr[1].st_cancel, TD_OK);
    CHECK_STATUS(gr[0].st_pass, TD_OK);
    CHECK_STATUS(gr[1].st_pass, TD_OK);
    CHECK(gr[0].same);
    CHECK_EQ_INT(gr[0].passes, 2);
    CHECK_EQ_INT(gr[1].passes, 2);
    for (int i = 0; i < GR; i++) {
        CHECK_STATUS(td_comm_status(gr[i].comm), TD_OK);
        td_comm_destroy(gr[i].comm);
    }
    td_comm_group_destroy(cg);
out:
    td_engine_req_destroy(r);
    td_kvmem_destroy(m);
    td_engine_destroy(one);

    /* an engine without experts to share */
    static const td_engine_kind_t *const synth[] = { &td_synth_kind, NULL };
    td_engine_config_t cfg;
    td_engine_t *e = NULL;
    CHECK_STATUS(td_engine_config_defaults(&cfg), TD_OK);
    CHECK_STATUS(td_engine_create_group(synth, &cfg, &(td_engine_group_t){ NULL, NULL }, &e),
                 TD_ERR_UNSUPPORTED);
    CHECK(e == NULL);
    td_engine_config_free(&cfg);
}

int
main(void)
{
    td_log_set_level(TD_LOG_WARN);
    td_logcap_start();
    test_greedy();
    test_top_k_top_p();
    test_seed();
    test_distribution();
    test_logprobs();
    test_stop_finish();
    test_eos_ids();

    if (!find_tool()) {
        fprintf(stderr, "test_generate: mk-tiny-model not found (%s); set TD_MK_TINY_MODEL\n",
                tool);
        td_check_failures++;
        return td_check_exit("test_generate");
    }
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_batch_invariance("tiny", "--dtype f32 --init perturbed --seed 11");
    test_batch_invariance("tiny-fp4", "--quant fp8+fp4 --init perturbed --seed 12");
    test_batch_invariance("tiny-noengram", "--preset tiny-noengram --init perturbed --seed 13");
    test_cache_handoff("handoff", "--dtype f32 --init perturbed --seed 14");
    test_cache_handoff("handoff-fp4", "--quant fp8+fp4 --init perturbed --seed 15");
    test_v41_engine("engine", "--dtype f32 --init perturbed --seed 16");
    test_v41_engine("engine-noengram", "--preset tiny-noengram --init perturbed --seed 17");
    test_request_memory("memory", "--init perturbed --seed 18");
    test_v41_group("group", "--dtype f32 --init perturbed --seed 19");

    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_generate: could not remove %s\n", tmpdir);
    return td_check_exit("test_generate");
}
