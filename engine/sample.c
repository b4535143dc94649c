/* engine/sample.c — the one sampler: logit_bias, the min_tokens mask and the
 * penalties over the row's history, one linear pass for greedy rows and the
 * checks, min-p, top-k by selection, top-p and the draw over a prefix sorted
 * only as far as it is read, log-probabilities in double, stop tokens and
 * the finish rule. */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rng.h"

/* The first prefix the draw sorts; each further one is twice the last. */
#define SAMPLE_FIRST_CHUNK 64
/* Independent running maxima of the greedy pass. */
#define SAMPLE_LANES 16

/* ---- The order ------------------------------------------------------------------ */

/* Does (la, a) come before (lb, b): larger logit first, then lower id. */
static int
sample_before(float la, int32_t a, float lb, int32_t b)
{
    return la > lb || (la == lb && a < b);
}

/* A candidate of the draw: its logit, token id and index in the distribution. */
typedef struct {
    float logit;
    int32_t id;
    uint32_t idx;
} sample_cand_t;

static int
sample_cand_cmp(const void *pa, const void *pb)
{
    const sample_cand_t *a = pa, *b = pb;

    if (sample_before(a->logit, a->id, b->logit, b->id))
        return -1;
    return sample_before(b->logit, b->id, a->logit, a->id) ? 1 : 0;
}

static int
sample_cand_before(const sample_cand_t *a, const sample_cand_t *b)
{
    return sample_before(a->logit, a->id, b->logit, b->id);
}

static void
sample_cand_swap(sample_cand_t *a, sample_cand_t *b)
{
    sample_cand_t t = *a;
    *a = *b;
    *b = t;
}

/* Put the k (0 < k < n) first of a[0..n) in order into a[0..k), in no
 * particular order: quickselect with a median-of-three pivot, expected O(n);
 * a range that keeps resisting is sorted instead (O(n log n) at worst). The
 * order is total (ids are distinct), so no two candidates are equal. */
static void
sample_select(sample_cand_t *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    unsigned depth = 0, limit = 8;

    for (size_t m = n; m > 1; m >>= 1)
        limit += 2;
    while (hi - lo > 1 && k > lo && k < hi) {
        size_t mid = lo + (hi - lo) / 2, last = hi - 1, p = lo;

        if (++depth > limit) {
            qsort(a + lo, hi - lo, sizeof(*a), sample_cand_cmp);
            return;
        }
        /* median of a[lo], a[mid], a[last] into a[last] as the pivot */
        if (sample_cand_before(&a[mid], &a[lo]))
            sample_cand_swap(&a[mid], &a[lo]);
        if (sample_cand_before(&a[last], &a[lo]))
            sample_cand_swap(&a[last], &a[lo]);
        if (sample_cand_before(&a[mid], &a[last]))
            sample_cand_swap(&a[mid], &a[last]);
        for (size_t i = lo; i < last; i++)
            if (sample_cand_before(&a[i], &a[last]))
                sample_cand_swap(&a[i], &a[p++]);
        sample_cand_swap(&a[p], &a[last]);
        /* a[lo..p) before the pivot, a[p] the pivot, a[p + 1..hi) after it */
        if (k <= p)
            hi = p;
        else
            lo = p + 1;
    }
}

/* A range of candidates sorted lazily from the front: c[0..sorted) are the
 * first `sorted` in order, in order; the rest come in chunks on demand. */
typedef struct {
    sample_cand_t *c;
    size_t n;
    size_t sorted;
    size_t chunk;
} sample_lazy_t;

/* Sort far enough that c[i] is the i-th in order; 0 when i >= n. */
static int
sample_lazy_at(sample_lazy_t *z, size_t i)
{
    while (i >= z->sorted) {
        size_t rest = z->n - z->sorted;

        if (rest == 0)
            return 0;
        if (z->chunk >= rest) {
            qsort(z->c + z->sorted, rest, sizeof(*z->c), sample_cand_cmp);
            z->sorted = z->n;
        } else {
            sample_select(z->c + z->sorted, rest, z->chunk);
            qsort(z->c + z->sorted, z->chunk, sizeof(*z->c), sample_cand_cmp);
            z->sorted += z->chunk;
            z->chunk *= 2;
        }
    }
    return 1;
}

/* ---- A distribution with the request's logit_bias ------------------------------- */

typedef struct {
    uint32_t n;
    const int32_t *ids;     /* NULL: dense */
    const float *logits;    /* the distribution's, or `own` */
    float *own;             /* the biased copy (freed by sample_view_free), or NULL */
} sample_view_t;

static int32_t
sample_view_id(const sample_view_t *v, uint32_t i)
{
    return v->ids ? v->ids[i] : (int32_t)i;
}

static const td_sample_bias_t *
sample_bias_find(const td_sample_params_t *sp, int32_t id)
{
    size_t lo = 0, hi = sp->nbias;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sp->bias[mid].id == id)
            return &sp->bias[mid];
        if (sp->bias[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Is id one of sp's stop ids? */
static bool
sample_is_stop(const td_sample_params_t *sp, int32_t id)
{
    for (uint32_t i = 0; i < sp->nstop && i < TD_SAMPLE_MAX_STOP; i++)
        if (sp->stop[i] == id)
            return true;
    return false;
}

bool
td_sample_params_penalized(const td_sample_params_t *sp)
{
    return (sp->repetition_penalty != 1.0 && sp->repetition_penalty != 0) ||
           sp->presence_penalty != 0 || sp->frequency_penalty != 0;
}

/* The penalties of sp on one logit of token id (l finite or -inf). */
static float
sample_penalize(const td_sample_params_t *sp, const td_sample_hist_t *h, int32_t id, float l)
{
    uint32_t c;

    if (id < 0 || (uint32_t)id >= h->vocab)
        return l;
    c = h->count[id];
    if (sp->repetition_penalty != 0 &&
        (c > 0 || (h->in_prompt[(uint32_t)id >> 3] >> (id & 7) & 1))) {
        float r = (float)sp->repetition_penalty;
        l = l > 0 ? l / r : l * r;
    }
    if (c > 0)
        l -= (float)(sp->frequency_penalty * (double)c + sp->presence_penalty);
    return l;
}

/* The min_tokens mask and the penalties on the biased copy v->own. */
static void
sample_view_row(sample_view_t *v, const td_sample_row_t *row, bool mask, bool pen)
{
    const td_sample_params_t *sp = row->sp;
    const td_sample_hist_t *h = row->hist;

    if (v->ids == NULL) {
        for (uint32_t i = 0; mask && i < sp->nstop; i++)
            if (sp->stop[i] >= 0 && (uint32_t)sp->stop[i] < v->n)
                v->own[sp->stop[i]] = -INFINITY;
        for (uint32_t k = 0; pen && k < h->nseen; k++) {
            int32_t id = h->seen[k];
            if ((uint32_t)id < v->n)
                v->own[id] = sample_penalize(sp, h, id, v->own[id]);
        }
        return;
    }
    for (uint32_t i = 0; i < v->n; i++) {
        if (mask && sample_is_stop(sp, v->ids[i]))
            v->own[i] = -INFINITY;
        else if (pen)
            v->own[i] = sample_penalize(sp, h, v->ids[i], v->own[i]);
    }
}

/* A constraint's mask on v->own: the tokens it leaves out at -inf. */
static void
sample_view_allow(sample_view_t *v, const uint64_t *allow)
{
    for (uint32_t i = 0; i < v->n; i++) {
        uint32_t id = v->ids == NULL ? i : (uint32_t)v->ids[i];
        if (!(allow[id >> 6] >> (id & 63) & 1))
            v->own[i] = -INFINITY;
    }
}

/* v = lg as the row samples it: sp's logit_bias added, then the min_tokens
 * mask, the penalties and the constraint's mask (a copy only when one of
 * them applies). */
static td_status_t
sample_view_init(sample_view_t *v, const td_sample_dist_t *lg, const td_sample_row_t *row,
                 char *why, size_t whylen)
{
    const td_sample_params_t *sp = row->sp;
    bool mask = row->generated < sp->min_tokens && sp->nstop > 0;
    bool pen = td_sample_params_penalized(sp);

    *v = (sample_view_t){ lg->n, lg->ids, lg->logits, NULL };
    if (sp->nbias == 0 && !mask && !pen && row->allow == NULL)
        return TD_OK;
    if (pen && row->hist == NULL) {
        snprintf(why, whylen, "penalties without the row's token history");
        return TD_ERR_INVALID;
    }
    if (sp->nbias > 0 && lg->ids == NULL && sp->bias[sp->nbias - 1].id >= 0 &&
        (uint32_t)sp->bias[sp->nbias - 1].id >= lg->n) {
        snprintf(why, whylen, "logit_bias names token %d, outside the %u logits",
                 sp->bias[sp->nbias - 1].id, lg->n);
        return TD_ERR_INVALID;
    }
    v->own = malloc((lg->n ? lg->n : 1) * sizeof(float));
    if (v->own == NULL) {
        snprintf(why, whylen, "out of memory for %u biased logits", lg->n);
        return TD_ERR_NOMEM;
    }
    memcpy(v->own, lg->logits, lg->n * sizeof(float));
    if (lg->ids == NULL) {
        for (uint32_t b = 0; b < sp->nbias; b++)
            v->own[sp->bias[b].id] += sp->bias[b].bias;
    } else {
        for (uint32_t i = 0; sp->nbias > 0 && i < lg->n; i++) {
            const td_sample_bias_t *b = sample_bias_find(sp, lg->ids[i]);
            if (b != NULL)
                v->own[i] += b->bias;
        }
    }
    sample_view_row(v, row, mask, pen);
    if (row->allow != NULL)
        sample_view_allow(v, row->allow);
    v->logits = v->own;
    return TD_OK;
}

static void
sample_view_free(sample_view_t *v)
{
    free(v->own);
    v->own = NULL;
}

/* One pass: the index of the first candidate in order, and whether the
 * logits are usable (no NaN, no +inf, one finite at least). */
static int
sample_view_scan(const sample_view_t *v, uint32_t *best_out)
{
    const float *l = v->logits;
    uint32_t best = 0;
    float bl = -INFINITY;

    if (v->ids == NULL) {
        /* ids ascend with the index: the largest value, then the first index
         * holding it. The maximum runs in SAMPLE_LANES independent lanes (no
         * branch on the data, so it pipelines), the search stops there. */
        float m[SAMPLE_LANES];
        int bad = 0;
        uint32_t i = 0;

        for (int k = 0; k < SAMPLE_LANES; k++)
            m[k] = -INFINITY;
        for (; i + SAMPLE_LANES <= v->n; i += SAMPLE_LANES)
            for (int k = 0; k < SAMPLE_LANES; k++) {
                float x = l[i + k];
                bad |= !(x < INFINITY);   /* NaN or +inf */
                m[k] = x > m[k] ? x : m[k];
            }
        for (; i < v->n; i++) {
            bad |= !(l[i] < INFINITY);
            bl = l[i] > bl ? l[i] : bl;
        }
        for (int k = 0; k < SAMPLE_LANES; k++)
            bl = m[k] > bl ? m[k] : bl;
        if (bad || bl == -INFINITY)
            return 0;
        while (l[best] != bl)
            best++;
    } else {
        for (uint32_t i = 0; i < v->n; i++) {
            float x = l[i];
            if (!(x < INFINITY))
                return 0;
            if (x != -INFINITY && sample_before(x, v->ids[i], bl, v->ids[best]))
                best = i, bl = x;
        }
    }
    if (bl == -INFINITY)
        return 0;
    *best_out = best;
    return 1;
}

/* ---- The draw ------------------------------------------------------------------- */

static double
sample_weight(const sample_cand_t *c, float mx, double temperature)
{
    return exp(((double)c->logit - mx) / temperature);
}

/* The sampled token of a usable view whose largest logit is mx (see
 * td_sample_dist for the rule). */
static td_status_t
sample_draw(const sample_view_t *v, const td_sample_params_t *sp, float mx, uint64_t position,
            int32_t *token)
{
    sample_cand_t *c;
    sample_lazy_t z;
    size_t k = 0, keep;
    double Z = 0, S, u, acc;
    int32_t tok = -1;

    c = malloc((v->n ? v->n : 1) * sizeof(*c));
    if (c == NULL)
        return TD_ERR_NOMEM;
    /* the finite candidates, in the distribution's index order; with min_p,
     * those whose weight is at least min_p (the top one's is 1) */
    for (uint32_t i = 0; i < v->n; i++) {
        if (v->logits[i] == -INFINITY)
            continue;
        c[k] = (sample_cand_t){ v->logits[i], sample_view_id(v, i), i };
        if (sp->min_p > 0 && sample_weight(&c[k], mx, sp->temperature) < sp->min_p)
            continue;
        k++;
    }
    if (sp->top_k != 0 && sp->top_k < k) {
        /* keep the first top_k in order, still in index order */
        sample_cand_t *sel = malloc(k * sizeof(*sel)), thr;
        size_t kept = 0;

        if (sel == NULL) {
            free(c);
            return TD_ERR_NOMEM;
        }
        memcpy(sel, c, k * sizeof(*sel));
        sample_select(sel, k, sp->top_k);
        thr = sel[0];   /* the last in order of the kept ones */
        for (size_t i = 1; i < sp->top_k; i++)
            if (sample_cand_before(&thr, &sel[i]))
                thr = sel[i];
        free(sel);
        for (size_t i = 0; i < k; i++)
            if (!sample_cand_before(&thr, &c[i]))
                c[kept++] = c[i];
        k = kept;
    }
    for (size_t i = 0; i < k; i++)
        Z += sample_weight(&c[i], mx, sp->temperature);

    z = (sample_lazy_t){ c, k, 0, SAMPLE_FIRST_CHUNK };
    keep = k;
    S = Z;
    if (sp->top_p < 1) {
        /* the shortest prefix whose share reaches top_p */
        acc = 0;
        for (size_t i = 0; sample_lazy_at(&z, i); i++) {
            acc += sample_weight(&c[i], mx, sp->temperature) / Z;
            if (acc >= sp->top_p) {
                keep = i + 1;
                break;
            }
        }
        S = 0;
        for (size_t i = 0; i < keep; i++)   /* sorted that far already */
            S += sample_weight(&c[i], mx, sp->temperature);
    }
    u = td_sample_draw(sp->seed, position) * S;
    acc = 0;
    for (size_t i = 0; i < keep && sample_lazy_at(&z, i); i++) {
        acc += sample_weight(&c[i], mx, sp->temperature);
        if (u < acc) {
            tok = c[i].id;
            break;
        }
    }
    if (tok < 0) {   /* rounding left u at the end: the last kept one */
        (void)sample_lazy_at(&z, keep - 1);
        tok = c[keep - 1].id;
    }
    free(c);
    *token = tok;
    return TD_OK;
}

/* ---- Log-probabilities ------------------------------------------------------------ */

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

/* out for token (a candidate of v) with the ntop most likely candidates. */
static td_status_t
sample_view_logprobs(const sample_view_t *v, int32_t token, uint32_t ntop,
                     td_sample_pick_t *out)
{
    uint32_t top[TD_SAMPLE_MAX_TOP];   /* candidate indices, in order */
    const float *l = v->logits;
    double lse, lt = -INFINITY;
    size_t k = 0;
    td_status_t st = td_sample_logsumexp(l, v->n, &lse);

    if (st != TD_OK)
        return st;
    /* insertion into the ntop best so far, in order (logit desc, id asc) */
    for (uint32_t i = 0; i < v->n; i++) {
        int32_t id = sample_view_id(v, i);
        size_t at = k;

        if (id == token)
            lt = (double)l[i] - lse;
        if (ntop == 0 || (k == ntop && !sample_before(l[i], id, l[top[k - 1]],
                                                      sample_view_id(v, top[k - 1]))))
            continue;
        while (at > 0 && sample_before(l[i], id, l[top[at - 1]], sample_view_id(v, top[at - 1])))
            at--;
        if (k < ntop)
            k++;
        memmove(&top[at + 1], &top[at], (k - 1 - at) * sizeof(top[0]));
        top[at] = i;
    }
    out->token = token;
    out->logprob = lt;
    out->ntop = (uint32_t)k;
    for (size_t j = 0; j < k; j++)
        out->top[j] = (td_sample_alt_t){ sample_view_id(v, top[j]), (double)l[top[j]] - lse };
    return TD_OK;
}

td_status_t
td_sample_logprobs(const float *logits, size_t n, int32_t token, uint32_t ntop,
                   td_sample_pick_t *out)
{
    sample_view_t v = { (uint32_t)n, NULL, logits, NULL };

    if (token < 0 || (size_t)token >= n || ntop > TD_SAMPLE_MAX_TOP || n > INT32_MAX)
        return TD_ERR_RANGE;
    return sample_view_logprobs(&v, token, ntop, out);
}

/* ---- Choosing ------------------------------------------------------------------- */

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

static td_status_t sample_check(const td_sample_params_t *sp, int stop_sign, char *err,
                                size_t errlen);

/* The sampler (td_sample_row_pick); `what` names the row in the one log
 * line of a refusal. ntop -1: as sp asks; -2: no log-probabilities. */
static td_status_t
sample_run(const td_sample_dist_t *lg, const td_sample_row_t *row, int ntop, const char *what,
           td_sample_pick_t *out)
{
    const td_sample_params_t *sp = row->sp;
    uint64_t position = row->position;
    sample_view_t v;
    uint32_t best;
    char why[128];
    int32_t tok;
    td_status_t st = sample_check(sp, 0, why, sizeof(why));

    if (st != TD_OK) {
        td_error("sample: %s: %s", what, why);
        return st;
    }
    if (ntop == -1)
        ntop = sp->logprobs ? (int)sp->top_logprobs : -2;
    if (ntop > TD_SAMPLE_MAX_TOP) {
        td_error("sample: %d alternatives asked, at most %d", ntop, TD_SAMPLE_MAX_TOP);
        return TD_ERR_RANGE;
    }
    if (lg->n == 0 || lg->n > INT32_MAX) {
        td_error("sample: %s: a distribution of %u candidates", what, lg->n);
        return TD_ERR_INVALID;
    }
    st = sample_view_init(&v, lg, row, why, sizeof(why));
    if (st != TD_OK) {
        td_error("sample: %s: %s", what, why);
        return st;
    }
    if (!sample_view_scan(&v, &best)) {
        td_error("sample: %s: %u logits, with a NaN or +inf among them or none finite", what,
                 lg->n);
        sample_view_free(&v);
        return TD_ERR_INVALID;
    }
    tok = sample_view_id(&v, best);
    if (!(sp->temperature == 0 || sp->top_k == 1)) {
        st = sample_draw(&v, sp, v.logits[best], position, &tok);
        if (st != TD_OK) {
            td_error("sample: %s: temperature %g, top_p %g, top_k %u: %s", what,
                     sp->temperature, sp->top_p, sp->top_k, td_status_str(st));
            sample_view_free(&v);
            return st;
        }
    }
    if (ntop >= 0) {
        st = sample_view_logprobs(&v, tok, (uint32_t)ntop, out);   /* the view is usable */
    } else {
        out->token = tok;
        out->logprob = 0;
        out->ntop = 0;
    }
    sample_view_free(&v);
    return st;
}

td_status_t
td_sample_row_pick(const td_sample_dist_t *lg, const td_sample_row_t *row, int ntop,
                   td_sample_pick_t *out)
{
    return sample_run(lg, row, ntop, "distribution", out);
}

/* A row with no history and nothing generated: min_tokens would mask every
 * step of it, so a row that needs either is refused rather than sampled
 * without. */
static td_status_t
sample_plain_row(const td_sample_params_t *sp, uint64_t position, td_sample_row_t *row)
{
    if (sp->min_tokens > 0) {
        td_error("sample: min_tokens %u without the row's count of generated tokens",
                 sp->min_tokens);
        return TD_ERR_INVALID;
    }
    *row = (td_sample_row_t){ sp, NULL, position, 0, NULL };
    return TD_OK;
}

td_status_t
td_sample_dist_pick(const td_sample_dist_t *lg, const td_sample_params_t *sp,
                    uint64_t position, int ntop, td_sample_pick_t *out)
{
    td_sample_row_t row;
    td_status_t st = sample_plain_row(sp, position, &row);

    return st == TD_OK ? sample_run(lg, &row, ntop, "distribution", out) : st;
}

td_status_t
td_sample_dist(const td_sample_dist_t *lg, const td_sample_params_t *sp, uint64_t position,
               int32_t *token)
{
    td_sample_pick_t pk;
    td_status_t st = td_sample_dist_pick(lg, sp, position, -2, &pk);

    if (st == TD_OK)
        *token = pk.token;
    return st;
}

td_status_t
td_sample_rows(const float *logits, size_t rows, size_t vocab,
               const td_sample_params_t *const *sp, const uint64_t *positions, int32_t *tokens)
{
    for (size_t r = 0; r < rows; r++) {
        td_sample_dist_t lg = { (uint32_t)vocab, NULL, logits + r * vocab };
        td_sample_pick_t pk;
        td_sample_row_t row;
        char what[32];
        td_status_t st = sample_plain_row(sp[r], positions[r], &row);

        snprintf(what, sizeof(what), "row %zu", r);
        if (vocab > INT32_MAX)
            lg.n = 0;   /* refused below */
        if (st == TD_OK)
            st = sample_run(&lg, &row, -2, what, &pk);
        if (st != TD_OK)
            return st;
        tokens[r] = pk.token;
    }
    return TD_OK;
}

td_status_t
td_sample_rows_pick(const float *logits, size_t rows, size_t vocab, const td_sample_row_t *row,
                    td_sample_pick_t *out)
{
    for (size_t r = 0; r < rows; r++) {
        td_sample_dist_t lg = { vocab > INT32_MAX ? 0 : (uint32_t)vocab, NULL,
                                logits + r * vocab };
        char what[32];
        td_status_t st;

        snprintf(what, sizeof(what), "row %zu", r);
        st = sample_run(&lg, &row[r], -1, what, &out[r]);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

td_status_t
td_sample_pick(const float *logits, size_t n, const td_sample_params_t *sp, uint64_t position,
               uint32_t ntop, td_sample_pick_t *out)
{
    td_sample_dist_t lg = { n > INT32_MAX ? 0 : (uint32_t)n, NULL, logits };
    td_sample_row_t row;
    td_status_t st;

    if (ntop > TD_SAMPLE_MAX_TOP) {
        td_error("sample: %u alternatives asked, at most %d", ntop, TD_SAMPLE_MAX_TOP);
        return TD_ERR_RANGE;
    }
    st = sample_plain_row(sp, position, &row);
    return st == TD_OK ? sample_run(&lg, &row, (int)ntop, "row 0", out) : st;
}

/* ---- The token history ------------------------------------------------------------ */

td_status_t
td_sample_hist_init(td_sample_hist_t *h, uint32_t vocab)
{
    *h = (td_sample_hist_t){ .vocab = vocab };
    h->in_prompt = calloc((size_t)vocab / 8 + 1, 1);
    h->count = calloc(vocab ? vocab : 1, sizeof(*h->count));
    if (h->in_prompt == NULL || h->count == NULL) {
        td_sample_hist_free(h);
        return TD_ERR_NOMEM;
    }
    return TD_OK;
}

void
td_sample_hist_free(td_sample_hist_t *h)
{
    free(h->in_prompt);
    free(h->count);
    free(h->seen);
    *h = (td_sample_hist_t){ 0 };
}

td_status_t
td_sample_hist_add(td_sample_hist_t *h, const int32_t *tokens, size_t n, bool output)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t id = (uint32_t)tokens[i];
        bool first;

        if (tokens[i] < 0 || id >= h->vocab)
            return TD_ERR_RANGE;
        first = h->count[id] == 0 && !(h->in_prompt[id >> 3] >> (id & 7) & 1);
        if (first && h->nseen == h->cap) {
            uint32_t cap = h->cap ? 2 * h->cap : 64;
            int32_t *seen = realloc(h->seen, cap * sizeof(*seen));
            if (seen == NULL)
                return TD_ERR_NOMEM;
            h->seen = seen;
            h->cap = cap;
        }
        if (first)
            h->seen[h->nseen++] = (int32_t)id;
        if (output)
            h->count[id]++;
        else
            h->in_prompt[id >> 3] |= (uint8_t)(1u << (id & 7));
    }
    return TD_OK;
}

/* ---- Parameters and stopping ---------------------------------------------------- */

/* td_sample_check; stop_sign: negative stop ids are refused too (the
 * sampler itself only compares them, so it lets them be). */
static td_status_t
sample_check(const td_sample_params_t *sp, int stop_sign, char *err, size_t errlen)
{
    const char *what = NULL;
    char buf[96];

    if (!(sp->temperature >= 0) || isinf(sp->temperature))
        what = "temperature must be finite and >= 0";
    else if (!(sp->top_p > 0 && sp->top_p <= 1))
        what = "top_p must be in (0, 1]";
    else if (!(sp->min_p >= 0 && sp->min_p <= 1))
        what = "min_p must be in [0, 1]";
    else if (!(sp->repetition_penalty >= 0 && sp->repetition_penalty <= TD_SAMPLE_REPETITION_MAX))
        what = "repetition_penalty must be in (0, 2] (0: off)";
    else if (!(fabs(sp->presence_penalty) <= TD_SAMPLE_PENALTY_LIMIT))
        what = "presence_penalty must be in [-2, 2]";
    else if (!(fabs(sp->frequency_penalty) <= TD_SAMPLE_PENALTY_LIMIT))
        what = "frequency_penalty must be in [-2, 2]";
    else if (sp->nstop > TD_SAMPLE_MAX_STOP)
        what = "too many stop tokens";
    else if (sp->nbias > TD_SAMPLE_MAX_BIAS)
        what = "too many logit_bias entries";
    else if (sp->top_logprobs > TD_SAMPLE_MAX_TOP)
        what = "top_logprobs above 20";
    for (uint32_t i = 0; what == NULL && stop_sign && i < sp->nstop; i++)
        if (sp->stop[i] < 0) {
            snprintf(buf, sizeof(buf), "stop token %u is negative (%d)", i, sp->stop[i]);
            what = buf;
        }
    for (uint32_t i = 0; what == NULL && i < sp->nbias; i++) {
        const td_sample_bias_t *b = &sp->bias[i];
        if (b->id < 0 || (i > 0 && b->id <= sp->bias[i - 1].id)) {
            snprintf(buf, sizeof(buf), "logit_bias ids must be >= 0, ascending, each once "
                     "(entry %u: %d)", i, b->id);
            what = buf;
        } else if (!(fabs((double)b->bias) <= TD_SAMPLE_BIAS_LIMIT)) {
            snprintf(buf, sizeof(buf), "logit_bias of token %d is %g, outside [-100, 100]",
                     b->id, (double)b->bias);
            what = buf;
        }
    }
    if (what == NULL)
        return TD_OK;
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", what);
    return TD_ERR_INVALID;
}

td_status_t
td_sample_check(const td_sample_params_t *sp, char *err, size_t errlen)
{
    return sample_check(sp, 1, err, errlen);
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

static int
sample_bias_cmp(const void *pa, const void *pb)
{
    const td_sample_bias_t *a = pa, *b = pb;

    return (a->id > b->id) - (a->id < b->id);
}

td_status_t
td_sample_bias_set(td_sample_params_t *sp, const td_sample_bias_t *bias, size_t n, char *err,
                   size_t errlen)
{
    td_sample_bias_t sorted[TD_SAMPLE_MAX_BIAS];
    char buf[96];
    const char *what = NULL;

    if (n > TD_SAMPLE_MAX_BIAS) {
        snprintf(buf, sizeof(buf), "%zu logit_bias entries, at most %d", n,
                 TD_SAMPLE_MAX_BIAS);
        what = buf;
    } else {
        memcpy(sorted, bias, n * sizeof(*bias));
        qsort(sorted, n, sizeof(*sorted), sample_bias_cmp);
        for (size_t i = 0; what == NULL && i < n; i++) {
            if (sorted[i].id < 0) {
                snprintf(buf, sizeof(buf), "logit_bias token %d is negative", sorted[i].id);
                what = buf;
            } else if (i > 0 && sorted[i].id == sorted[i - 1].id) {
                snprintf(buf, sizeof(buf), "logit_bias names token %d twice", sorted[i].id);
                what = buf;
            } else if (!(fabs((double)sorted[i].bias) <= TD_SAMPLE_BIAS_LIMIT)) {
                snprintf(buf, sizeof(buf), "logit_bias of token %d is %g, outside [-100, 100]",
                         sorted[i].id, (double)sorted[i].bias);
                what = buf;
            }
        }
    }
    if (what != NULL) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "%s", what);
        return TD_ERR_INVALID;
    }
    memcpy(sp->bias, sorted, n * sizeof(*sorted));
    sp->nbias = (uint32_t)n;
    return TD_OK;
}

td_sample_finish_t
td_sample_finish(const td_sample_params_t *sp, int32_t token, uint64_t generated,
                 uint64_t seq_len, uint64_t context)
{
    if (generated > sp->min_tokens && sample_is_stop(sp, token))
        return TD_SAMPLE_FINISH_STOP;
    if ((sp->max_tokens != 0 && generated >= sp->max_tokens) ||
        (context != 0 && seq_len >= context))
        return TD_SAMPLE_FINISH_LENGTH;
    return TD_SAMPLE_FINISH_NONE;
}

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
