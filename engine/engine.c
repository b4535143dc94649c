/* engine/engine.c — the engine-independent half of engine.h: argument and
 * state checks around the ops, and sampling a request's next token (through
 * engine/sample.h, the one sampler). */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"

/* ---- Engines ---------------------------------------------------------------- */

void
td_engine_destroy(td_engine_t *e)
{
    if (e != NULL)
        e->ops->destroy(e);
}

int
td_engine_is_group(const td_engine_t *e)
{
    return e->ops->pass_empty != NULL;
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
td_engine_req_create(td_engine_t *e, const td_sample_params_t *sp, const td_layout_kv_t *kv,
                     td_engine_req_t **out)
{
    td_engine_req_t *req;
    td_sample_params_t chk = *sp;
    char why[128];
    td_status_t st;
    uint64_t cap;

    /* stop ids are only compared with tokens: a negative one never matches */
    for (uint32_t i = 0; i < chk.nstop && i < TD_SAMPLE_MAX_STOP; i++)
        chk.stop[i] = 0;
    if (td_sample_check(&chk, why, sizeof(why)) != TD_OK) {
        td_error("engine %s: sampling: %s", e->name, why);
        return TD_ERR_INVALID;
    }
    if (sp->nbias > 0 && (uint32_t)sp->bias[sp->nbias - 1].id >= e->vocab) {
        td_error("engine %s: sampling: logit_bias names token %d, outside the vocabulary of "
                 "%u", e->name, sp->bias[sp->nbias - 1].id, e->vocab);
        return TD_ERR_INVALID;
    }
    if (e->ops->req_create == NULL) {
        td_error("engine %s: identity only (nothing loaded to run it): it runs no requests",
                 e->name);
        return TD_ERR_UNSUPPORTED;
    }
    if (kv == NULL || kv->layout != e->layout) {
        td_error("engine %s: a request needs KV memory laid out by the engine's layout",
                 e->name);
        return TD_ERR_INVALID;
    }
    cap = td_layout_kv_capacity(kv);
    st = e->ops->req_create(e, kv, &req);
    if (st != TD_OK)
        return st;
    req->hist = (td_sample_hist_t){ 0 };
    if (td_sample_params_penalized(sp) && td_sample_hist_init(&req->hist, e->vocab) != TD_OK) {
        td_error("engine %s: out of memory for a request's token history", e->name);
        e->ops->req_destroy(req);
        return TD_ERR_NOMEM;
    }
    req->engine = e;
    req->sampling = *sp;
    req->kv = *kv;
    req->capacity = cap < e->max_context ? cap : e->max_context;
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
    if (req == NULL)
        return;
    td_sample_hist_free(&req->hist);
    req->engine->ops->req_destroy(req);
}

/* Note tokens the request took (its history, when it keeps one); they are
 * inside the vocabulary (checked before). A history that cannot grow fails
 * the request: its penalties would be wrong. */
static td_status_t
engine_hist_add(td_engine_req_t *req, const int32_t *tokens, size_t n, bool output)
{
    td_status_t st;

    if (req->hist.count == NULL)
        return TD_OK;
    st = td_sample_hist_add(&req->hist, tokens, n, output);
    if (st != TD_OK) {
        td_error("engine %s: a request's token history: %s", req->engine->name,
                 td_status_str(st));
        if (req->failed == TD_OK)
            req->failed = st;
    }
    return st;
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
    if (n > req->capacity - req->ntokens) {
        td_error("engine %s: %llu + %zu tokens exceed the %s of %llu", e->name,
                 (unsigned long long)req->ntokens, n,
                 req->capacity < e->max_context ? "request's KV memory" : "context",
                 (unsigned long long)req->capacity);
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

/* After the op that took prompt tokens[0..n): a failure sticks to the
 * request (the first one wins); on success every token so far is prompt. */
static td_status_t
engine_prompt_done(td_engine_req_t *req, td_status_t st, const int32_t *tokens, size_t n)
{
    if (st != TD_OK) {
        if (req->failed == TD_OK)
            req->failed = st;
        return st;
    }
    req->prompt = req->ntokens;
    return engine_hist_add(req, tokens, n, false);
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
    return engine_prompt_done(req, req->engine->ops->prefill(req, tokens, n, last, fn, arg),
                              tokens, n);
}

td_status_t
td_engine_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n)
{
    td_status_t st;

    if (req->ntokens != 0) {
        td_error("engine %s: adopt into a request that has tokens", req->engine->name);
        return TD_ERR_STATE;
    }
    st = engine_check_append(req, tokens, n);
    if (st != TD_OK)
        return st;
    return engine_prompt_done(req, req->engine->ops->adopt(req, tokens, n), tokens, n);
}

/* ---- Bounded replay ------------------------------------------------------------ */

uint64_t
td_engine_replay_bound(const td_engine_t *e)
{
    return e->ops->replay_bound != NULL ? e->ops->replay_bound(e) : 0;
}

static td_status_t
engine_no_replay(const td_engine_req_t *req, const char *what)
{
    td_error("engine %s: cannot %s (no bounded replay)", req->engine->name, what);
    return TD_ERR_UNSUPPORTED;
}

td_status_t
td_engine_seek(td_engine_req_t *req, const int32_t *tokens, uint64_t pos)
{
    td_status_t st;

    if (req->engine->ops->seek == NULL)
        return engine_no_replay(req, "seek");
    if (req->ntokens != 0) {
        td_error("engine %s: seek in a request that has tokens", req->engine->name);
        return TD_ERR_STATE;
    }
    st = engine_check_append(req, tokens, (size_t)pos);
    if (st != TD_OK)
        return st;
    return engine_prompt_done(req, req->engine->ops->seek(req, tokens, pos), tokens,
                              (size_t)pos);
}

td_status_t
td_engine_replay(td_engine_req_t *req, const int32_t *tokens, size_t n, uint64_t frozen)
{
    td_status_t st;

    if (req->engine->ops->replay == NULL)
        return engine_no_replay(req, "replay");
    if (n == 0) {
        td_error("engine %s: replay needs tokens", req->engine->name);
        return TD_ERR_INVALID;
    }
    if (req->ntokens != req->prompt) {
        td_error("engine %s: replay after decode", req->engine->name);
        return TD_ERR_STATE;
    }
    if (frozen < req->ntokens || n > frozen - req->ntokens) {
        td_error("engine %s: replay of %zu tokens at %llu crosses the frozen prefix of %llu",
                 req->engine->name, n, (unsigned long long)req->ntokens,
                 (unsigned long long)frozen);
        return TD_ERR_RANGE;
    }
    st = engine_check_append(req, tokens, n);
    if (st != TD_OK)
        return st;
    return engine_prompt_done(req, req->engine->ops->replay(req, tokens, n, frozen), tokens,
                              n);
}

td_status_t
td_engine_logits(td_engine_req_t *req, td_sample_dist_t *out)
{
    if (req->failed != TD_OK || req->ntokens == 0) {
        td_error("engine %s: no distribution for a request that is %s", req->engine->name,
                 req->failed != TD_OK ? "failed" : "empty");
        return TD_ERR_STATE;
    }
    return req->engine->ops->logits(req, out);
}

/* The token at the request's end under sp (its own sampling, or the same
 * with another seed), with the request's history. */
static td_status_t
engine_pick(td_engine_req_t *req, const td_sample_params_t *sp, td_sample_pick_t *pick,
            td_sample_finish_t *finish)
{
    td_sample_dist_t lg;
    td_sample_pick_t pk;
    td_sample_row_t row;
    uint64_t generated;
    td_status_t st;

    st = td_engine_logits(req, &lg);
    if (st != TD_OK)
        return st;
    generated = req->ntokens - req->prompt;
    row = (td_sample_row_t){ sp, req->hist.count ? &req->hist : NULL, req->ntokens, generated,
                             NULL };
    if (req->cons != NULL) {
        st = TD_OK;
        row.allow = req->cons->mask(req->cons->ctx, &st);
        if (st != TD_OK) {
            td_error("engine %s: the request's constraint has no mask: %s", req->engine->name,
                     td_status_str(st));
            return st;
        }
    }
    st = td_sample_row_pick(&lg, &row, -1, &pk);   /* logs why */
    if (st != TD_OK)
        return st;
    *finish = td_sample_finish(sp, pk.token, generated + 1, req->ntokens + 1, req->capacity);
    *pick = pk;
    return TD_OK;
}

td_status_t
td_engine_sample_pick(td_engine_req_t *req, td_sample_pick_t *pick, td_sample_finish_t *finish)
{
    return engine_pick(req, &req->sampling, pick, finish);
}

td_status_t
td_engine_sample_pick_seed(td_engine_req_t *req, uint64_t seed, td_sample_pick_t *pick,
                           td_sample_finish_t *finish)
{
    td_sample_params_t sp = req->sampling;

    sp.seed = seed;
    return engine_pick(req, &sp, pick, finish);
}

td_status_t
td_engine_sample(td_engine_req_t *req, int32_t *token, td_sample_finish_t *finish)
{
    td_sample_pick_t pk;
    td_status_t st = td_engine_sample_pick(req, &pk, finish);

    if (st == TD_OK)
        *token = pk.token;
    return st;
}

td_status_t
td_engine_take(td_engine_req_t *req, int32_t token, td_sample_finish_t *finish)
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
                               req->ntokens + 1, req->capacity);
    return TD_OK;
}

/* The constraint takes the token the sequence took. */
static td_status_t
engine_cons_take(td_engine_req_t *req, int32_t token)
{
    td_status_t st = req->cons->take(req->cons->ctx, token);

    if (st != TD_OK)
        td_error("engine %s: the request's constraint refuses token %d: %s", req->engine->name,
                 token, td_status_str(st));
    return st;
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
        st = engine_check_append(req, &rows[i].token, 1);   /* logged there */
        if (st != TD_OK)
            return st;
    }
    st = e->ops->decode(e, rows, n, fn, arg);
    if (st != TD_OK) {
        for (size_t i = 0; i < n; i++)
            if (rows[i].req->failed == TD_OK)
                rows[i].req->failed = st;
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        st = engine_hist_add(rows[i].req, &rows[i].token, 1, true);
        if (st == TD_OK && rows[i].req->cons != NULL)
            st = engine_cons_take(rows[i].req, rows[i].token);
        if (st == TD_OK)
            st = td_engine_sample_pick(rows[i].req, &rows[i].pick, &rows[i].finish);
        if (st != TD_OK)
            return st;
        rows[i].next = rows[i].pick.token;
    }
    return TD_OK;
}

