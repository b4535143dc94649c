/* engine/sample.c — choosing next tokens: the generic sampler over a
 * distribution, a linear argmax for greedy rows of logits, log-probabilities
 * in double, stop tokens and the finish rule. */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rng.h"

int32_t
td_sample_argmax(const float *logits, size_t n)
{
    size_t best = 0;

    if (n == 0 || n > INT32_MAX)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (isnan(logits[i]))
            return -1;
        if (logits[i] > logits[best])
            best = i;
    }
    return (int32_t)best;
}

td_status_t
td_sample_logsumexp(const float *logits, size_t n, double *lse)
{
    float mx = -INFINITY;
    double sum = 0;

    if (n == 0)
        return TD_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return TD_ERR_INVALID;
        if (logits[i] > mx)
            mx = logits[i];
    }
    if (mx == -INFINITY)
        return TD_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        sum += exp((double)logits[i] - (double)mx);
    *lse = (double)mx + log(sum);
    return TD_OK;
}

/* Does (la, a) come before (lb, b): larger logit first, then lower id. */
static int
sample_before(float la, int32_t a, float lb, int32_t b)
{
    return la > lb || (la == lb && a < b);
}

td_status_t
td_sample_logprobs(const float *logits, size_t n, int32_t token, uint32_t ntop,
                   td_sample_pick_t *out)
{
    td_sample_alt_t top[TD_SAMPLE_MAX_TOP];
    double lse;
    size_t k = 0;
    td_status_t st;

    if (token < 0 || (size_t)token >= n || ntop > TD_SAMPLE_MAX_TOP || n > INT32_MAX)
        return TD_ERR_RANGE;
    st = td_sample_logsumexp(logits, n, &lse);
    if (st != TD_OK)
        return st;
    /* insertion into the ntop best so far, in order (logit desc, id asc) */
    for (size_t i = 0; i < n && ntop > 0; i++) {
        float l = logits[i];
        size_t at = k;

        if (k == ntop && !sample_before(l, (int32_t)i, logits[top[k - 1].id], top[k - 1].id))
            continue;
        while (at > 0 && sample_before(l, (int32_t)i, logits[top[at - 1].id], top[at - 1].id))
            at--;
        if (k < ntop)
            k++;
        memmove(&top[at + 1], &top[at], (k - 1 - at) * sizeof(top[0]));
        top[at].id = (int32_t)i;
    }
    for (size_t j = 0; j < k; j++)
        top[j].logprob = (double)logits[top[j].id] - lse;
    out->token = token;
    out->logprob = (double)logits[token] - lse;
    out->ntop = (uint32_t)k;
    memcpy(out->top, top, k * sizeof(top[0]));
    return TD_OK;
}

/* ---- Choosing ------------------------------------------------------------------- */

/* A candidate of the top-k preselection. */
typedef struct {
    float logit;
    int32_t id;
} sample_cand_t;

/* Is a worse than b in the sampler's order (logit desc, then id asc)? */
static int
sample_worse(const sample_cand_t *a, const sample_cand_t *b)
{
    return sample_before(b->logit, b->id, a->logit, a->id);
}

static void
sample_sift_down(sample_cand_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        if (l < n && sample_worse(&h[l], &h[w]))
            w = l;
        if (l + 1 < n && sample_worse(&h[l + 1], &h[w]))
            w = l + 1;
        if (w == i)
            return;
        sample_cand_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* td_sample_dist over the row, with top_k < vocab: the engine sorts
 * every candidate and keeps the first top_k, so handing it exactly those k
 * (a heap of the best k, O(vocab log k)) draws the same token, without
 * sorting the whole vocabulary. */
static td_status_t
sample_draw(const float *row, size_t vocab, const td_sample_params_t *s, uint64_t position,
            int32_t *token)
{
    size_t k = s->top_k;
    td_sample_dist_t lg = { (uint32_t)vocab, NULL, row };

    if (k == 0 || k >= vocab / 2)
        return td_sample_dist(&lg, s, position, token);

    sample_cand_t *h = malloc(k * sizeof(*h));
    int32_t *ids = malloc(k * sizeof(*ids));
    float *lgs = malloc(k * sizeof(*lgs));
    td_status_t st = TD_ERR_NOMEM;

    if (h == NULL || ids == NULL || lgs == NULL)
        goto cleanup;
    for (size_t i = 0; i < k; i++)
        h[i] = (sample_cand_t){ row[i], (int32_t)i };
    for (size_t i = k / 2; i-- > 0;)
        sample_sift_down(h, k, i);
    for (size_t i = k; i < vocab; i++) {
        sample_cand_t c = { row[i], (int32_t)i };
        if (sample_worse(&h[0], &c)) {
            h[0] = c;
            sample_sift_down(h, k, 0);
        }
    }
    for (size_t i = 0; i < k; i++) {
        ids[i] = h[i].id;
        lgs[i] = h[i].logit;
    }
    lg = (td_sample_dist_t){ (uint32_t)k, ids, lgs };
    st = td_sample_dist(&lg, s, position, token);
cleanup:
    free(h);
    free(ids);
    free(lgs);
    return st;
}

/* The token of one row (see td_sample_rows); row r only names it in logs. */
static td_status_t
sample_choose(const float *row, size_t vocab, const td_sample_params_t *s, uint64_t position,
              size_t r, int32_t *token)
{
    int32_t t = td_sample_argmax(row, vocab);
    char why[96];
    td_status_t st = td_sample_check(s, why, sizeof(why));

    if (st != TD_OK) {
        td_error("sample: row %zu: %s", r, why);
        return st;
    }
    if (t < 0 || row[t] == INFINITY || row[t] == -INFINITY) {
        td_error("sample: row %zu: %zu logits, with a NaN or +inf among them or none finite", r,
                 vocab);
        return TD_ERR_INVALID;
    }
    if (!(s->temperature == 0 || s->top_k == 1)) {
        st = sample_draw(row, vocab, s, position, &t);
        if (st != TD_OK) {
            td_error("sample: row %zu: temperature %g, top_p %g, top_k %u: %s", r,
                     s->temperature, s->top_p, s->top_k, td_status_str(st));
            return st;
        }
    }
    *token = t;
    return TD_OK;
}

td_status_t
td_sample_rows(const float *logits, size_t rows, size_t vocab,
               const td_sample_params_t *const *sp, const uint64_t *positions, int32_t *tokens)
{
    for (size_t r = 0; r < rows; r++) {
        td_status_t st = sample_choose(logits + r * vocab, vocab, sp[r], positions[r], r,
                                       &tokens[r]);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

td_status_t
td_sample_pick(const float *logits, size_t n, const td_sample_params_t *sp, uint64_t position,
               uint32_t ntop, td_sample_pick_t *out)
{
    int32_t t;
    td_status_t st;

    if (ntop > TD_SAMPLE_MAX_TOP) {
        td_error("sample: %u alternatives asked, at most %d", ntop, TD_SAMPLE_MAX_TOP);
        return TD_ERR_RANGE;
    }
    st = sample_choose(logits, n, sp, position, 0, &t);
    if (st != TD_OK)
        return st;
    return td_sample_logprobs(logits, n, t, ntop, out);
}

/* ---- Stopping ------------------------------------------------------------------ */

td_status_t
td_sample_check(const td_sample_params_t *sp, char *err, size_t errlen)
{
    const char *what = NULL;
    char buf[96];

    if (!(sp->temperature >= 0) || isinf(sp->temperature))
        what = "temperature must be finite and >= 0";
    else if (!(sp->top_p > 0 && sp->top_p <= 1))
        what = "top_p must be in (0, 1]";
    else if (sp->nstop > TD_SAMPLE_MAX_STOP)
        what = "too many stop tokens";
    for (uint32_t i = 0; what == NULL && i < sp->nstop; i++)
        if (sp->stop[i] < 0) {
            snprintf(buf, sizeof(buf), "stop token %u is negative (%d)", i, sp->stop[i]);
            what = buf;
        }
    if (what == NULL)
        return TD_OK;
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", what);
    return TD_ERR_INVALID;
}

td_status_t
td_sample_stop_add(td_sample_params_t *sp, int32_t id)
{
    for (uint32_t i = 0; i < sp->nstop; i++)
        if (sp->stop[i] == id)
            return TD_OK;
    if (sp->nstop >= TD_SAMPLE_MAX_STOP)
        return TD_ERR_RANGE;
    sp->stop[sp->nstop++] = id;
    return TD_OK;
}

td_sample_finish_t
td_sample_finish(const td_sample_params_t *sp, int32_t token, uint64_t generated,
                 uint64_t seq_len, uint64_t context)
{
    for (uint32_t i = 0; i < sp->nstop && i < TD_SAMPLE_MAX_STOP; i++)
        if (sp->stop[i] == token)
            return TD_SAMPLE_FINISH_STOP;
    if ((sp->max_tokens != 0 && generated >= sp->max_tokens) ||
        (context != 0 && seq_len >= context))
        return TD_SAMPLE_FINISH_LENGTH;
    return TD_SAMPLE_FINISH_NONE;
}

/* ---- The generic sampler ----------------------------------------------------------- */

td_sample_params_t
td_sample_params_greedy(void)
{
    td_sample_params_t sp = { .temperature = 0, .top_p = 1 };

    return sp;
}

const char *
td_sample_finish_str(td_sample_finish_t f)
{
    switch (f) {
    case TD_SAMPLE_FINISH_NONE:   return "none";
    case TD_SAMPLE_FINISH_STOP:   return "stop";
    case TD_SAMPLE_FINISH_LENGTH: return "length";
    }
    return "?";
}

double
td_sample_draw(uint64_t seed, uint64_t position)
{
    uint64_t z = td_rng_mix64(seed ^ td_rng_mix64(position + TD_RNG_GAMMA));

    return (double)(z >> 11) * 0x1.0p-53;
}

typedef struct {
    int32_t id;
    float logit;
    double p;
} sample_ent_t;

static int
sample_ent_cmp(const void *a, const void *b)
{
    const sample_ent_t *x = a, *y = b;

    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

td_status_t
td_sample_dist(const td_sample_dist_t *lg, const td_sample_params_t *sp,
                        uint64_t position, int32_t *token)
{
    sample_ent_t *c;
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
    qsort(c, n, sizeof(*c), sample_ent_cmp);
    if (sp->temperature == 0 || sp->top_k == 1) {
        tok = c[0].id;
        goto out;
    }
    keep = sp->top_k != 0 && sp->top_k < n ? sp->top_k : n;
    for (size_t i = 0; i < keep; i++) {
        c[i].p = exp(((double)c[i].logit - c[0].logit) / sp->temperature);
        sum += c[i].p;
    }
    /* top_p: the smallest prefix whose mass reaches top_p (at least one). */
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
