/* bench/sample.c — the sampler's cost per row of a decode step on the released
 * vocabulary: the qsort path the daemons used before (kept here, only here,
 * as the reference) against engine/sample.c's td_sample_dist, side by side
 * in alternating rounds, medians per row and their ratio; the tokens of both
 * are compared on every row. */
#include "sample.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "log.h"
#include "rng.h"

/* ---- The old path: every logit sorted, for every row, greedy included ---------- */

typedef struct {
    int32_t id;
    float logit;
    double p;
} old_ent_t;

static int
old_ent_cmp(const void *a, const void *b)
{
    const old_ent_t *x = a, *y = b;

    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* td_sample_dist as it was (engine/sample.c before the O(n) sampler). */
static td_status_t
old_sample_dist(const td_sample_dist_t *lg, const td_sample_params_t *sp, uint64_t position,
                int32_t *token)
{
    old_ent_t *c;
    size_t n = lg->n, keep;
    double sum = 0, u, acc = 0;
    int32_t tok;

    if (n == 0 || !(sp->temperature >= 0) || !(sp->top_p > 0 && sp->top_p <= 1))
        return TD_ERR_INVALID;
    c = malloc(n * sizeof(*c));
    if (c == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        c[i].id = lg->ids ? lg->ids[i] : (int32_t)i;
        c[i].logit = lg->logits[i];
    }
    qsort(c, n, sizeof(*c), old_ent_cmp);
    if (sp->temperature == 0 || sp->top_k == 1) {
        tok = c[0].id;
        goto out;
    }
    keep = sp->top_k != 0 && sp->top_k < n ? sp->top_k : n;
    for (size_t i = 0; i < keep; i++) {
        c[i].p = exp(((double)c[i].logit - c[0].logit) / sp->temperature);
        sum += c[i].p;
    }
    for (size_t i = 0; i < keep; i++) {
        acc += c[i].p / sum;
        if (acc >= sp->top_p) {
            keep = i + 1;
            break;
        }
    }
    sum = 0;
    for (size_t i = 0; i < keep; i++)
        sum += c[i].p;
    u = td_sample_draw(sp->seed, position) * sum;
    tok = c[keep - 1].id;
    acc = 0;
    for (size_t i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) {
            tok = c[i].id;
            break;
        }
    }
out:
    free(c);
    *token = tok;
    return TD_OK;
}

/* ---- Rows ---------------------------------------------------------------------- */

/* Logits shaped like a language model's: a broad normal body (sum of four
 * uniforms, sd ~2.3) with a few dozen tokens lifted above it, different per row. */
static void
bench_row(float *row, size_t vocab, uint64_t r)
{
    uint64_t s = td_rng_mix64(r + 1);

    for (size_t i = 0; i < vocab; i++) {
        double x = 0;
        for (int k = 0; k < 4; k++) {
            s = td_rng_mix64(s + TD_RNG_GAMMA);
            x += (double)(s >> 11) * 0x1.0p-53;
        }
        row[i] = (float)((x - 2.0) * 4.0);
    }
    for (int k = 0; k < 40; k++) {
        s = td_rng_mix64(s + TD_RNG_GAMMA);
        row[s % vocab] += (float)(8.0 + (double)(k % 10));
    }
}

static int
bench_dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double
bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), bench_dcmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One mode (its parameters), old and new in alternating rounds: medians in
 * µs per row, and how many rows chose the same token. */
static int
bench_mode(const char *name, const float *rows, size_t nrows, size_t vocab,
           const td_sample_params_t *sp, unsigned rounds)
{
    double *t_old = calloc(rounds, sizeof(double)), *t_new = calloc(rounds, sizeof(double));
    int32_t *tok_old = calloc(nrows, sizeof(int32_t)), *tok_new = calloc(nrows, sizeof(int32_t));
    size_t same = 0;
    int rc = 1;

    if (!t_old || !t_new || !tok_old || !tok_new) {
        fprintf(stderr, "sample: out of memory\n");
        goto out;
    }
    for (unsigned k = 0; k <= rounds; k++) {   /* round 0 warms up, untimed */
        for (int which = 0; which < 2; which++) {
            int old = (k + (unsigned)which) % 2 == 0;   /* alternate who goes first */
            double t0 = td_clock_s();
            for (size_t r = 0; r < nrows; r++) {
                td_sample_dist_t lg = { (uint32_t)vocab, NULL, rows + r * vocab };
                td_status_t st = old ? old_sample_dist(&lg, sp, 1000 + r, &tok_old[r])
                                     : td_sample_dist(&lg, sp, 1000 + r, &tok_new[r]);
                if (st != TD_OK) {
                    fprintf(stderr, "sample: %s: %s\n", old ? "old" : "new", td_status_str(st));
                    goto out;
                }
            }
            double us = (td_clock_s() - t0) * 1e6 / (double)nrows;
            if (k > 0)
                (old ? t_old : t_new)[k - 1] = us;
        }
    }
    for (size_t r = 0; r < nrows; r++)
        same += tok_old[r] == tok_new[r];
    double mo = bench_median(t_old, rounds), mn = bench_median(t_new, rounds);
    printf("%-28s qsort (old) %10.1f us/row   new %8.1f us/row   old/new %7.1fx   "
           "same token %zu/%zu\n", name, mo, mn, mo / mn, same, nrows);
    rc = 0;
out:
    free(t_old);
    free(t_new);
    free(tok_old);
    free(tok_new);
    return rc;
}

static void
bench_usage(FILE *f)
{
    fprintf(f,
            "usage: sample [--vocab V] [--rows R] [--rounds N]\n"
            "  The sampling cost per row of a decode step: R rows (default 32) of V\n"
            "  logits (default 129280, the released vocabulary), each sampled by the old\n"
            "  qsort path and by td_sample_dist, in N alternating timed rounds (default\n"
            "  9) after one untimed; medians in us per row, their ratio, and how many\n"
            "  rows chose the same token. Modes: greedy (what a decode step of greedy\n"
            "  requests pays), then for information temperature 1 with top_p 1, top_p\n"
            "  0.9 and top_k 50.\n");
}

int
main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "vocab", required_argument, NULL, 'v' },
        { "rows", required_argument, NULL, 'r' },
        { "rounds", required_argument, NULL, 'n' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    uint64_t vocab = 129280, nrows = 32, rounds = 9;
    char err[160];
    int c, rc = 0;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        td_status_t st = TD_OK;
        switch (c) {
        case 'v': st = td_config_parse_uint("vocab", optarg, 2, 1u << 24, &vocab, err, sizeof(err)); break;
        case 'r': st = td_config_parse_uint("rows", optarg, 1, 4096, &nrows, err, sizeof(err)); break;
        case 'n': st = td_config_parse_uint("rounds", optarg, 1, 1000, &rounds, err, sizeof(err)); break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (st != TD_OK) {
            fprintf(stderr, "sample: %s\n", err);
            return 2;
        }
    }
    float *rows = malloc(nrows * vocab * sizeof(float));
    if (rows == NULL) {
        fprintf(stderr, "sample: out of memory for %llu rows\n", (unsigned long long)nrows);
        return 1;
    }
    for (size_t r = 0; r < nrows; r++)
        bench_row(rows + r * vocab, vocab, r);
    printf("sample: vocab %llu, %llu rows, %llu rounds (+1 untimed), medians per row\n",
           (unsigned long long)vocab, (unsigned long long)nrows, (unsigned long long)rounds);

    td_sample_params_t sp = td_sample_params_greedy();
    rc |= bench_mode("greedy", rows, nrows, vocab, &sp, (unsigned)rounds);
    sp.temperature = 1.0;
    sp.seed = 7;
    rc |= bench_mode("temperature 1", rows, nrows, vocab, &sp, (unsigned)rounds);
    sp.top_p = 0.9;
    rc |= bench_mode("temperature 1, top_p 0.9", rows, nrows, vocab, &sp, (unsigned)rounds);
    sp.top_p = 1.0;
    sp.top_k = 50;
    rc |= bench_mode("temperature 1, top_k 50", rows, nrows, vocab, &sp, (unsigned)rounds);
    free(rows);
    return rc;
}
