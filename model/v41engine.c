/* model/v41engine.c — the "deepseek-v41" engine: the CPU DeepSeek-V4.1 model
 * (model.h, forward.c) behind engine.h, one td_cache_t per request whose
 * segments are the engine's layout, so prefill pieces and adopted KV are
 * plain copies of cache bytes. docs/engine.md. */
#include "engine.h"
#include "model.h"
#include "v41engine.h"
#include "v41id.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef struct {
    td_engine_t base;
    td_model_t *m;             /* owned */
    char kind[160];
} v41_t;

typedef struct {
    td_engine_req_t base;
    td_cache_t *cache;         /* owned, capacity = max_context */
    float *logits;             /* [vocab] the distribution at the end */
    int have_logits;           /* 0 after adopt until the first decode step */
} v41_req_t;

static const td_engine_ops_t v41_ops;

/* ---- Creation ------------------------------------------------------------------- */

static void
v41_destroy(td_engine_t *e)
{
    v41_t *v = (v41_t *)e;

    td_model_destroy(v->m);
    free(v);
}

static td_status_t
v41_create(const td_engine_config_t *cfg, td_engine_t **out)
{
    const char *dir;
    td_model_t *m = NULL;
    v41_t *v = NULL;
    td_status_t st = td_v41_model_dir(cfg, &dir);

    /* The model, then the engine around it. */
    if (st == TD_OK)
        st = td_model_load(dir, &m);
    if (st == TD_OK && (v = calloc(1, sizeof(*v))) == NULL) {
        td_error("engine deepseek-v41: out of memory");
        st = TD_ERR_NOMEM;
    }
    if (st != TD_OK) {
        td_model_destroy(m);
        return st;
    }
    v->m = m;
    st = td_v41_identify(dir, m->cfg, m->plan, &v->base, v->kind, sizeof(v->kind));
    if (st != TD_OK) {
        v41_destroy(&v->base);
        return st;
    }
    v->base.ops = &v41_ops;
    *out = &v->base;
    return TD_OK;
}

/* ---- Requests ------------------------------------------------------------------- */

static td_status_t
v41_req_create(td_engine_t *e, td_engine_req_t **out)
{
    v41_t *v = (v41_t *)e;
    v41_req_t *r = calloc(1, sizeof(*r));
    td_status_t st;

    if (r == NULL || (r->logits = malloc((size_t)e->vocab * sizeof(float))) == NULL) {
        td_error("engine deepseek-v41: a request: out of memory");
        st = TD_ERR_NOMEM;
        goto err_free_req;
    }
    st = td_cache_create(v->m->plan, e->max_context, &r->cache);   /* logs its failures */
    if (st != TD_OK)
        goto err_free_logits;
    *out = &r->base;
    return TD_OK;
err_free_logits:
    free(r->logits);
err_free_req:
    free(r);
    return st;
}

static void
v41_req_destroy(td_engine_req_t *req)
{
    v41_req_t *r = (v41_req_t *)req;

    td_cache_destroy(r->cache);
    free(r->logits);
    free(r);
}

/* Hand layer L's output to fn: the paged entries completed by tokens
 * [n0, n) and, with_fixed, every fixed segment of the layer, straight from
 * the cache. pieces: room for every segment. */
static td_status_t
v41_emit_layer(v41_req_t *r, uint32_t L, uint64_t n0, int with_fixed, td_engine_piece_t *pieces,
               td_engine_layer_fn fn, void *arg, int always)
{
    const td_layout_t *l = r->base.engine->layout;
    uint64_t n = r->base.ntokens;
    size_t np = 0;

    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];
        const unsigned char *base = td_cache_seg(r->cache, s);

        if (sg->layer != L)
            continue;
        if (sg->kind == TD_LAYOUT_PAGED) {
            uint64_t first = td_layout_entries(sg, n0), end = td_layout_entries(sg, n);

            if (end > first)
                pieces[np++] = (td_engine_piece_t){ s, first, end - first,
                                                    base + first * sg->entry_bytes };
        } else if (with_fixed) {
            pieces[np++] = (td_engine_piece_t){ s, 0, sg->entries, base };
        }
    }
    if (np == 0 && !always)
        return TD_OK;
    return fn(&r->base, L, pieces, np, arg);
}

static td_status_t
v41_prefill(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
            td_engine_layer_fn fn, void *arg)
{
    v41_t *v = (v41_t *)req->engine;
    v41_req_t *r = (v41_req_t *)req;
    const td_layout_t *l = req->engine->layout;
    uint64_t n0 = req->ntokens;
    td_engine_piece_t *pieces;
    td_status_t st;

    pieces = malloc(l->nsegs * sizeof(*pieces));
    if (pieces == NULL) {
        td_error("engine deepseek-v41: prefill: out of memory");
        return TD_ERR_NOMEM;
    }
    r->have_logits = 0;
    st = td_forward_prefill(v->m, r->cache, tokens, n, 0, r->logits);   /* logs its failures */
    if (st != TD_OK)
        goto cleanup;
    req->ntokens += n;
    r->have_logits = 1;
    for (uint32_t L = 0; L < l->layers; L++) {
        st = v41_emit_layer(r, L, n0, last, pieces, fn, arg, 1);
        if (st != TD_OK)
            goto cleanup;
    }
cleanup:
    free(pieces);
    return st;
}

/* Load the received KV into the request's cache: fixed segments whole,
 * paged segments entry range [0, entries(n)) block by block; the counters
 * segment must then say n tokens. */
static td_status_t
v41_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n, const void *const *fixed,
          const void *const *const *paged)
{
    v41_req_t *r = (v41_req_t *)req;
    const td_layout_t *l = req->engine->layout;

    (void)tokens;
    if (fixed == NULL || paged == NULL) {
        td_error("engine deepseek-v41: adopt needs the received fixed and paged kv");
        return TD_ERR_INVALID;
    }
    td_cache_reset(r->cache);
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];
        unsigned char *dst = td_cache_seg(r->cache, s);

        if (sg->kind == TD_LAYOUT_FIXED) {
            if (fixed[s] == NULL) {
                td_error("engine deepseek-v41: adopt: fixed segment %s missing", sg->name);
                return TD_ERR_INVALID;
            }
            memcpy(dst, fixed[s], (size_t)sg->entries * sg->entry_bytes);
            continue;
        }
        uint64_t entries = td_layout_entries(sg, n);
        for (uint64_t first = 0, b = 0; first < entries; first += l->block_entries, b++) {
            uint64_t count = entries - first < l->block_entries ? entries - first
                                                                : l->block_entries;
            if (paged[s] == NULL || paged[s][b] == NULL) {
                td_error("engine deepseek-v41: adopt: segment %s block %llu missing", sg->name,
                         (unsigned long long)b);
                return TD_ERR_INVALID;
            }
            memcpy(dst + first * sg->entry_bytes, paged[s][b], count * sg->entry_bytes);
        }
    }
    if (td_cache_tokens(r->cache) != n) {
        td_error("engine deepseek-v41: adopt: received kv counts %llu tokens, prompt has %zu",
                 (unsigned long long)td_cache_tokens(r->cache), n);
        return TD_ERR_MISMATCH;
    }
    req->ntokens = n;
    r->have_logits = 0;
    return TD_OK;
}

static td_status_t
v41_decode(td_engine_t *e, td_engine_row_t *rows, size_t n, td_engine_layer_fn fn, void *arg)
{
    v41_t *v = (v41_t *)e;
    size_t V = e->vocab;
    td_cache_t **caches = calloc(n, sizeof(*caches));
    int32_t *toks = calloc(n, sizeof(*toks));
    float *logits = malloc(n * V * sizeof(float));
    td_engine_piece_t *pieces = malloc(e->layout->nsegs * sizeof(*pieces));
    td_status_t st = TD_ERR_NOMEM;

    if (caches == NULL || toks == NULL || logits == NULL || pieces == NULL) {
        td_error("engine deepseek-v41: decode step of %zu rows: out of memory", n);
        goto cleanup;
    }
    for (size_t i = 0; i < n; i++) {
        v41_req_t *r = (v41_req_t *)rows[i].req;

        caches[i] = r->cache;
        toks[i] = rows[i].token;
        r->have_logits = 0;
    }
    st = td_forward_decode(v->m, caches, toks, n, logits);   /* logs its failures */
    if (st != TD_OK)
        goto cleanup;
    for (size_t i = 0; i < n; i++) {
        v41_req_t *r = (v41_req_t *)rows[i].req;

        memcpy(r->logits, logits + i * V, V * sizeof(float));
        r->have_logits = 1;
        r->base.ntokens++;
    }
    for (uint32_t L = 0; fn != NULL && L < e->layout->layers; L++) {
        for (size_t i = 0; i < n; i++) {
            v41_req_t *r = (v41_req_t *)rows[i].req;

            st = v41_emit_layer(r, L, r->base.ntokens - 1, 0, pieces, fn, arg, 0);
            if (st != TD_OK)
                goto cleanup;
        }
    }
cleanup:
    free(pieces);
    free(logits);
    free(toks);
    free(caches);
    return st;
}

static td_status_t
v41_logits(td_engine_req_t *req, td_sample_dist_t *out)
{
    v41_req_t *r = (v41_req_t *)req;

    if (!r->have_logits) {
        td_debug("engine deepseek-v41: no logits before the first decode step after adopt");
        return TD_ERR_STATE;
    }
    *out = (td_sample_dist_t){ .n = req->engine->vocab, .ids = NULL, .logits = r->logits };
    return TD_OK;
}

static const td_engine_ops_t v41_ops = {
    .destroy = v41_destroy,
    .req_create = v41_req_create,
    .req_destroy = v41_req_destroy,
    .prefill = v41_prefill,
    .adopt = v41_adopt,
    .decode = v41_decode,
    .logits = v41_logits,
};

const td_engine_kind_t td_v41_kind = {
    .name = TD_V41_NAME,
    .help = TD_V41_HELP,
    .options = TD_V41_OPTIONS,
    .identity = td_v41_identity,
    .create = v41_create,
};
