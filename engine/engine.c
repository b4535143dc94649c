/* engine/engine.c — the engine-independent half of engine.h: creation by
 * name, argument and state checks around the ops, the generic sampler and
 * the cost-model clock. */
#include "engine.h"
#include "sample.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

/* ---- Configuration and creation ------------------------------------------- */

typedef struct {
    td_engine_config_t e;
} engine_wrap_t;

static const td_config_opt_t engine_opts[] = {
    TD_ENGINE_CONFIG_OPTS(engine_wrap_t, e),
    TD_CONFIG_OPT_END
};

td_status_t
td_engine_config_defaults(td_engine_config_t *cfg)
{
    engine_wrap_t w;
    char err[TD_CONFIG_ERRLEN];
    td_status_t st = td_config_defaults(engine_opts, &w, err, sizeof(err));

    if (st != TD_OK) {
        td_error("engine: config defaults: %s", err);
        return st;
    }
    *cfg = w.e;
    return TD_OK;
}

void
td_engine_config_free(td_engine_config_t *cfg)
{
    engine_wrap_t w = { *cfg };

    td_config_free(engine_opts, &w);
    *cfg = w.e;
}

static td_status_t
engine_create(const td_engine_config_t *cfg, int run, td_engine_t **out)
{
    const char *name = cfg->engine ? cfg->engine : "";
    td_engine_t *e;
    td_status_t st;
    char desc[256];

    if (strcmp(name, TD_SYNTH_NAME) == 0) {
        st = td_synth_create(&cfg->synth, &e);
    } else if (strcmp(name, TD_V41_NAME) == 0) {
        st = td_v41_create(cfg, run, &e);
    } else {
        td_error("engine \"%s\": unknown (known: synthetic, deepseek-v41)", name);
        return TD_ERR_NOT_FOUND;
    }
    if (st != TD_OK)
        return st;
    td_engine_describe(e, desc, sizeof(desc));
    td_info("engine %s: %s, layout hash %016llx, fingerprint %016llx", e->name, desc,
            (unsigned long long)e->layout->hash, (unsigned long long)e->fingerprint);
    *out = e;
    return TD_OK;
}

td_status_t
td_engine_create(const td_engine_config_t *cfg, td_engine_t **out)
{
    return engine_create(cfg, 1, out);
}

td_status_t
td_engine_create_identity(const td_engine_config_t *cfg, td_engine_t **out)
{
    return engine_create(cfg, 0, out);
}

void
td_engine_destroy(td_engine_t *e)
{
    if (e != NULL)
        e->ops->destroy(e);
}

size_t
td_engine_describe(const td_engine_t *e, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s, %u layers, %.1f B/token paged + %.1f KiB fixed per "
                     "request, vocab %u", e->kind, e->layout->layers,
                     td_layout_paged_bytes_per_token(e->layout),
                     td_layout_fixed_bytes(e->layout) / 1024.0, e->vocab);

    return n < 0 ? 0 : (size_t)n;
}

/* ---- Requests ---------------------------------------------------------------- */

td_status_t
td_engine_req_create(td_engine_t *e, const td_engine_sampling_t *sp, td_engine_req_t **out)
{
    td_engine_req_t *req;
    td_status_t st;

    if (sp->nstop > TD_ENGINE_MAX_STOP || !(sp->temperature >= 0) ||
        !(sp->top_p > 0 && sp->top_p <= 1)) {
        td_error("engine %s: sampling: temperature %g, top_p %g, %u stop tokens: want "
                 "temperature >= 0, 0 < top_p <= 1, at most %d stop tokens", e->name,
                 sp->temperature, sp->top_p, sp->nstop, TD_ENGINE_MAX_STOP);
        return TD_ERR_INVALID;
    }
    st = e->ops->req_create(e, &req);
    if (st != TD_OK)
        return st;
    req->engine = e;
    req->sampling = *sp;
    req->ntokens = 0;
    req->prompt = 0;
    req->failed = TD_OK;
    req->user = NULL;
    *out = req;
    return TD_OK;
}

void
td_engine_req_destroy(td_engine_req_t *req)
{
    if (req != NULL)
        req->engine->ops->req_destroy(req);
}

/* Tokens that may be appended to req: usable, in the vocabulary, in context. */
static td_status_t
engine_check_append(const td_engine_req_t *req, const int32_t *tokens, size_t n)
{
    const td_engine_t *e = req->engine;

    if (req->failed != TD_OK) {
        td_error("engine %s: request failed earlier (%s)", e->name, td_status_str(req->failed));
        return TD_ERR_STATE;
    }
    if (n > e->max_context - req->ntokens) {
        td_error("engine %s: %llu + %zu tokens exceed the context of %llu", e->name,
                 (unsigned long long)req->ntokens, n, (unsigned long long)e->max_context);
        return TD_ERR_RANGE;
    }
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= e->vocab) {
            td_error("engine %s: token %zu is %d, outside the vocabulary of %u", e->name, i,
                     tokens[i], e->vocab);
            return TD_ERR_INVALID;
        }
    }
    return TD_OK;
}

/* After the op that took a prompt: a failure sticks to the request (the first
 * one wins); on success every token so far is prompt. */
static td_status_t
engine_prompt_done(td_engine_req_t *req, td_status_t st)
{
    if (st != TD_OK) {
        if (req->failed == TD_OK)
            req->failed = st;
        return st;
    }
    req->prompt = req->ntokens;
    return TD_OK;
}

td_status_t
td_engine_prefill(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
                  td_engine_layer_fn fn, void *arg)
{
    td_status_t st;

    if (n == 0 || fn == NULL) {
        td_error("engine %s: prefill needs tokens and a layer callback", req->engine->name);
        return TD_ERR_INVALID;
    }
    if (req->ntokens != req->prompt) {
        td_error("engine %s: prefill after decode", req->engine->name);
        return TD_ERR_STATE;
    }
    st = engine_check_append(req, tokens, n);
    if (st != TD_OK)
        return st;
    return engine_prompt_done(req, req->engine->ops->prefill(req, tokens, n, last, fn, arg));
}

td_status_t
td_engine_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n, const void *const *fixed)
{
    return td_engine_adopt_kv(req, tokens, n, fixed, NULL);
}

td_status_t
td_engine_adopt_kv(td_engine_req_t *req, const int32_t *tokens, size_t n,
                   const void *const *fixed, const void *const *const *paged)
{
    td_status_t st;

    if (req->ntokens != 0) {
        td_error("engine %s: adopt into a request that has tokens", req->engine->name);
        return TD_ERR_STATE;
    }
    st = engine_check_append(req, tokens, n);
    if (st != TD_OK)
        return st;
    return engine_prompt_done(req, req->engine->ops->adopt(req, tokens, n, fixed, paged));
}

td_status_t
td_engine_logits(td_engine_req_t *req, td_engine_logits_t *out)
{
    if (req->failed != TD_OK || req->ntokens == 0) {
        td_error("engine %s: no distribution for a request that is %s", req->engine->name,
                 req->failed != TD_OK ? "failed" : "empty");
        return TD_ERR_STATE;
    }
    return req->engine->ops->logits(req, out);
}

td_status_t
td_engine_sample(td_engine_req_t *req, int32_t *token, td_engine_finish_t *finish)
{
    const td_engine_sampling_t *sp = &req->sampling;
    td_engine_logits_t lg;
    uint64_t generated;
    int32_t tok;
    td_status_t st;

    st = td_engine_logits(req, &lg);
    if (st != TD_OK)
        return st;
    st = td_engine_sample_logits(&lg, sp, req->ntokens, &tok);
    if (st != TD_OK)
        return st;
    generated = req->ntokens - req->prompt + 1;
    *finish = td_sample_finish(sp, tok, generated, req->ntokens + 1, req->engine->max_context);
    *token = tok;
    return TD_OK;
}

td_status_t
td_engine_take(td_engine_req_t *req, int32_t token, td_engine_finish_t *finish)
{
    const td_engine_t *e = req->engine;

    if (req->failed != TD_OK || req->ntokens == 0) {
        td_error("engine %s: cannot take a token for a request that is %s", e->name,
                 req->failed != TD_OK ? "failed" : "empty");
        return TD_ERR_STATE;
    }
    if (token < 0 || (uint32_t)token >= e->vocab) {
        td_error("engine %s: token %d is outside the vocabulary of %u", e->name, token,
                 e->vocab);
        return TD_ERR_INVALID;
    }
    *finish = td_sample_finish(&req->sampling, token, req->ntokens - req->prompt + 1,
                               req->ntokens + 1, e->max_context);
    return TD_OK;
}

td_status_t
td_engine_decode_step(td_engine_t *e, td_engine_row_t *rows, size_t n, td_engine_layer_fn fn,
                      void *arg)
{
    td_status_t st;

    for (size_t i = 0; i < n; i++) {
        td_engine_req_t *req = rows[i].req;

        if (req == NULL || req->engine != e || req->ntokens == 0) {
            td_error("engine %s: decode row %zu: no request of this engine with a prompt",
                     e->name, i);
            return TD_ERR_INVALID;
        }
        st = engine_check_append(req, &rows[i].token, 1);
        if (st != TD_OK) {
            td_debug("engine %s: decode step refused at row %zu", e->name, i);
            return st;
        }
    }
    st = e->ops->decode(e, rows, n, fn, arg);
    if (st != TD_OK) {
        for (size_t i = 0; i < n; i++)
            if (rows[i].req->failed == TD_OK)
                rows[i].req->failed = st;
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        st = td_engine_sample(rows[i].req, &rows[i].next, &rows[i].finish);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* ---- Sampling ------------------------------------------------------------------- */

td_engine_sampling_t
td_engine_sampling_greedy(void)
{
    td_engine_sampling_t sp = { .temperature = 0, .top_p = 1 };

    return sp;
}

const char *
td_engine_finish_str(td_engine_finish_t f)
{
    switch (f) {
    case TD_ENGINE_FINISH_NONE:   return "none";
    case TD_ENGINE_FINISH_STOP:   return "stop";
    case TD_ENGINE_FINISH_LENGTH: return "length";
    }
    return "?";
}

double
td_engine_draw(uint64_t seed, uint64_t position)
{
    uint64_t z = td_engine_mix64(seed ^ td_engine_mix64(position + TD_ENGINE_GAMMA));

    return (double)(z >> 11) * 0x1.0p-53;
}

typedef struct {
    int32_t id;
    float logit;
    double p;
} engine_cand_t;

static int
engine_cand_cmp(const void *a, const void *b)
{
    const engine_cand_t *x = a, *y = b;

    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

td_status_t
td_engine_sample_logits(const td_engine_logits_t *lg, const td_engine_sampling_t *sp,
                        uint64_t position, int32_t *token)
{
    engine_cand_t *c;
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
    qsort(c, n, sizeof(*c), engine_cand_cmp);
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
    u = td_engine_draw(sp->seed, position) * sum;
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

/* ---- Cost-model clock ---------------------------------------------------------- */

uint64_t
td_engine_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void
td_engine_wait(uint64_t *deadline_ns, double us)
{
    struct timespec ts;

    if (us <= 0)
        return;
    *deadline_ns += (uint64_t)(us * 1000.0 + 0.5);
    ts.tv_sec = (time_t)(*deadline_ns / 1000000000ull);
    ts.tv_nsec = (long)(*deadline_ns % 1000000000ull);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}
