/* model/v41engine.c — the "deepseek-v41" engine: the CPU DeepSeek-V4.1 model
 * (model.h, forward.c) behind engine.h. A request's cache is a view of the
 * KV memory its caller gave (the engine's layout is the cache plan's), so
 * prefill writes every entry where it will be sent from, a layer's pieces
 * are named right after that layer runs, adopt takes received memory as it
 * is, decode appends into the same blocks and a bounded replay rebuilds
 * the fixed state over a cached prefix's blocks. docs/engine.md.
 * As one rank of a DEP group (create_group) it holds only its experts and
 * every call is that rank's td_forward_dep pass (docs/dep.md). */
#include "engine.h"
#include "model.h"
#include "v41engine.h"
#include "v41id.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "modelcfg.h"
#include "placement.h"

typedef struct {
    td_engine_t base;
    td_model_t *m;             /* owned */
    uint32_t *layer_first;     /* [layers + 1]: segments of layer L are
                                  [layer_first[L], layer_first[L + 1]) */
    uint32_t layer_most;       /* the most segments of one layer */
    uint64_t replay_bound;     /* docs/kvcache.md, "Replay bound" */
    td_placement_t *placement; /* a DEP group's rank: the group's placement (owned) */
    td_forward_dep_t *dep;     /*   and this rank's side of it (owned); NULL: no group */
    char kind[160];
} v41_t;

/* A request: its cache (a view of base.kv, the caller's memory) and the
 * distribution at its end. Nothing else per request. */
typedef struct {
    td_engine_req_t base;
    td_cache_t cache;
    float *logits;             /* [vocab] the distribution at the end */
    int have_logits;           /* 0 after adopt until the first decode step */
} v41_req_t;

static const td_engine_ops_t v41_ops;

/* ---- Creation ------------------------------------------------------------------- */

static void
v41_destroy(td_engine_t *e)
{
    v41_t *v = (v41_t *)e;

    td_forward_dep_destroy(v->dep);
    td_model_destroy(v->m);
    td_placement_destroy(v->placement);
    free(v->layer_first);
    free(v);
}

static const td_engine_ops_t v41_group_ops;

/* The replay bound of a plan (docs/kvcache.md, "Replay bound"): with w
 * window slots, the fixed state of layer l (its w window keys, its r
 * partial-group slots) is computed from layer l - 1's output, which is exact
 * only l windows after the replay's start; so B = max over the layers of
 * l * w + max(w, r_l) (r_l = 0 for a layer without a partial group). */
static uint64_t
v41_bound(const td_cache_plan_t *p)
{
    uint64_t w = p->window_slots, b = 0;

    for (uint32_t l = 0; l < p->nlayers; l++) {
        uint64_t r = 0, need;

        if (p->layers[l].partial >= 0)
            r = p->layout->segs[p->layers[l].partial].entries;
        need = (uint64_t)l * w + (r > w ? r : w);
        if (need > b)
            b = need;
    }
    return b;
}

/* The engine around a loaded model (owned from here on, also on failure);
 * with group, one rank of a DEP group (placement owned from here on too). */
static td_status_t
v41_wrap(const char *dir, td_model_t *m, td_placement_t *placement, td_comm_t *comm,
         td_engine_t **out)
{
    v41_t *v = calloc(1, sizeof(*v));
    td_status_t st;

    if (v == NULL) {
        td_error("engine deepseek-v41: out of memory");
        td_model_destroy(m);
        td_placement_destroy(placement);
        return TD_ERR_NOMEM;
    }
    v->m = m;
    v->placement = placement;
    if (placement != NULL) {
        st = td_forward_dep_create(m, comm, placement, &v->dep);   /* logs */
        if (st != TD_OK) {
            v41_destroy(&v->base);
            return st;
        }
    }
    st = td_v41_identify(dir, m->cfg, m->plan, &v->base, v->kind, sizeof(v->kind));
    if (st != TD_OK) {
        v41_destroy(&v->base);
        return st;
    }
    v->layer_first = calloc(v->base.layout->layers + 1, sizeof(*v->layer_first));
    if (v->layer_first == NULL) {
        td_error("engine deepseek-v41: out of memory");
        v41_destroy(&v->base);
        return TD_ERR_NOMEM;
    }
    for (uint32_t L = 0, i = 0; L <= v->base.layout->layers; L++) {
        const td_layout_t *l = v->base.layout;

        v->layer_first[L] = i;
        while (i < l->nsegs && l->segs[i].layer == L)
            i++;
        if (L > 0 && v->layer_first[L] - v->layer_first[L - 1] > v->layer_most)
            v->layer_most = v->layer_first[L] - v->layer_first[L - 1];
    }
    v->replay_bound = v41_bound(m->plan);
    v->base.ops = v->dep != NULL ? &v41_group_ops : &v41_ops;
    if (v->dep != NULL) {
        size_t k = strlen(v->kind);
        snprintf(v->kind + k, sizeof(v->kind) - k, ", dep rank %u of %u (%u experts)",
                 td_comm_rank(comm), td_comm_size(comm), m->experts_held);
    }
    *out = &v->base;
    return TD_OK;
}

static td_status_t
v41_create(const td_engine_config_t *cfg, td_engine_t **out)
{
    const char *dir;
    td_model_t *m = NULL;
    td_status_t st = td_v41_model_dir(cfg, &dir);

    /* The model, then the engine around it. */
    if (st == TD_OK)
        st = td_model_load(dir, &m);
    if (st != TD_OK)
        return st;
    return v41_wrap(dir, m, NULL, NULL, out);
}

/* One rank of a DEP group: the placement (the expert count from the config
 * alone), the rank's experts only, its side of the group. */
static td_status_t
v41_create_group(const td_engine_config_t *cfg, const td_engine_group_t *g, td_engine_t **out)
{
    const char *dir;
    td_modelcfg_t *mc = NULL;
    td_placement_t *p = NULL;
    td_model_t *m = NULL;
    uint32_t size = td_comm_size(g->comm), rank = td_comm_rank(g->comm), E;
    td_status_t st = td_v41_model_dir(cfg, &dir);

    if (st == TD_OK)
        st = td_modelcfg_load(dir, &mc);   /* logs why */
    if (st != TD_OK)
        return st;
    E = (uint32_t)mc->n_routed_experts;
    td_modelcfg_destroy(mc);
    st = g->placement != NULL && g->placement[0] != '\0'
             ? td_placement_load(g->placement, E, size, &p)   /* logs the reason */
             : td_placement_create_ranges(E, size, &p);
    if (st != TD_OK)
        return st;
    st = td_model_load_opts(dir, &(td_model_opts_t){ p, rank }, &m);
    if (st != TD_OK) {
        td_placement_destroy(p);
        return st;
    }
    return v41_wrap(dir, m, p, g->comm, out);
}

/* ---- Requests ------------------------------------------------------------------- */

static td_status_t
v41_req_create(td_engine_t *e, const td_layout_kv_t *kv, td_engine_req_t **out)
{
    v41_t *v = (v41_t *)e;
    v41_req_t *r = calloc(1, sizeof(*r));
    td_status_t st;

    if (r == NULL || (r->logits = malloc((size_t)e->vocab * sizeof(float))) == NULL) {
        td_error("engine deepseek-v41: a request: out of memory");
        st = TD_ERR_NOMEM;
        goto err_free_req;
    }
    st = td_cache_init(&r->cache, v->m->plan, kv);   /* logs its failures */
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

    free(r->logits);
    free(r);
}

/* Tell fn what layer L finished for r, whose sequence grew from n0 to n
 * tokens: the paged entries completed, [entries(n0), entries(n)), and, with
 * fixed, every fixed segment of the layer whole. pieces: room for a layer's
 * segments. With no pieces fn is called only when `always`. */
static td_status_t
v41_emit_layer(const v41_t *v, v41_req_t *r, uint32_t L, uint64_t n0, uint64_t n, int fixed,
               int always, td_engine_piece_t *pieces, td_engine_layer_fn fn, void *arg)
{
    const td_layout_t *l = v->base.layout;
    size_t np = 0;

    for (uint32_t s = v->layer_first[L]; s < v->layer_first[L + 1]; s++) {
        const td_layout_seg_t *sg = &l->segs[s];

        if (sg->kind == TD_LAYOUT_PAGED) {
            uint64_t first = td_layout_entries(sg, n0), end = td_layout_entries(sg, n);

            if (end > first)
                pieces[np++] = (td_engine_piece_t){ s, first, end - first };
        } else if (fixed) {
            pieces[np++] = (td_engine_piece_t){ s, 0, sg->entries };
        }
    }
    if (np == 0 && !always)
        return TD_OK;
    return fn(&r->base, L, pieces, np, arg);
}

/* The forward pass's layer hook: each request of the pass is told what the
 * layer finished (docs/engine.md). */
typedef struct {
    const v41_t *v;
    v41_req_t *const *reqs;    /* [nseqs], in the pass's order */
    int fixed;                 /* the prompt's last chunk: fixed segments too */
    int always;                /* prefill: every layer is a callback */
    td_engine_piece_t *pieces; /* [layer_most] */
    td_engine_layer_fn fn;
    void *arg;
    td_status_t stopped;       /* a DEP group's rank: what fn stopped the pass with */
} v41_hook_t;

static td_status_t
v41_layer_done(const td_forward_done_t *d, void *arg)
{
    v41_hook_t *h = arg;

    if (h->stopped != TD_OK)
        return TD_OK;   /* a group's pass goes on without telling fn any more */
    for (size_t s = 0; s < d->nseqs; s++) {
        td_status_t st = v41_emit_layer(h->v, h->reqs[s], d->layer, d->p0[s],
                                        d->p0[s] + d->seqs[s].n, h->fixed, h->always,
                                        h->pieces, h->fn, h->arg);
        if (st != TD_OK && h->v->dep != NULL) {
            /* The other ranks' tokens need this rank's experts at every
             * layer: a stop from fn (a cancel) cannot end a group's pass,
             * it ends at the pass's end (and the request is unusable). */
            h->stopped = st;
            return TD_OK;
        }
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* One pass: td_forward, or this rank's td_forward_dep (which aborts the
 * group's communicator when it fails). */
static td_status_t
v41_pass(const v41_t *v, td_forward_seq_t *seqs, size_t n, v41_hook_t *hook, int hooked)
{
    td_status_t st = v->dep != NULL
                         ? td_forward_dep(v->dep, seqs, n, hooked ? v41_layer_done : NULL, hook)
                         : td_forward(v->m, seqs, n, hooked ? v41_layer_done : NULL, hook);

    return st == TD_OK ? hook->stopped : st;
}

static td_status_t
v41_prefill(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
            td_engine_layer_fn fn, void *arg)
{
    v41_t *v = (v41_t *)req->engine;
    v41_req_t *r = (v41_req_t *)req;
    td_forward_seq_t seq = { &r->cache, tokens, n, r->logits, 0, 0 };
    /* its rings are in the KV memory after every chunk: KEEP is MORE here */
    v41_hook_t hook = { v, &r, last == TD_ENGINE_CHUNK_LAST, 1, NULL, fn, arg, TD_OK };
    td_status_t st;

    hook.pieces = malloc((v->layer_most ? v->layer_most : 1) * sizeof(*hook.pieces));
    if (hook.pieces == NULL) {
        td_error("engine deepseek-v41: prefill: out of memory");
        return TD_ERR_NOMEM;
    }
    r->have_logits = 0;
    if (req->ntokens == 0)   /* the first chunk: empty rings, zero counters */
        td_cache_reset(&r->cache);
    req->ntokens += n;
    st = v41_pass(v, &seq, 1, &hook, 1);   /* logs its failures */
    if (st == TD_OK)
        r->have_logits = 1;
    free(hook.pieces);
    return st;
}

/* Bounded replay: the empty state at pos (td_cache_seek), then passes that
 * leave the frozen prefix's paged entries as the memory holds them. */
static td_status_t
v41_seek(td_engine_req_t *req, const int32_t *tokens, uint64_t pos)
{
    v41_req_t *r = (v41_req_t *)req;

    td_cache_seek(&r->cache, tokens, pos);
    req->ntokens = pos;
    r->have_logits = 0;
    return TD_OK;
}

static td_status_t
v41_replay(td_engine_req_t *req, const int32_t *tokens, size_t n, uint64_t frozen)
{
    v41_t *v = (v41_t *)req->engine;
    v41_req_t *r = (v41_req_t *)req;
    td_forward_seq_t seq = { &r->cache, tokens, n, NULL, 0, frozen };
    v41_hook_t hook = { v, &r, 0, 0, NULL, NULL, NULL, TD_OK };

    r->have_logits = 0;
    if (req->ntokens == 0)   /* as prefill's first chunk */
        td_cache_reset(&r->cache);
    req->ntokens += n;
    return v41_pass(v, &seq, 1, &hook, 0);   /* logs its failures */
}

static uint64_t
v41_replay_bound(const td_engine_t *e)
{
    return ((const v41_t *)e)->replay_bound;
}

/* The KV memory already holds the state after the prompt (received): it is
 * the cache as it is. What can be checked cheaply is (td_cache_check). */
static td_status_t
v41_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n)
{
    v41_req_t *r = (v41_req_t *)req;
    td_status_t st = td_cache_check(&r->cache, tokens, n);

    if (st != TD_OK) {
        td_error("engine deepseek-v41: adopt: the received kv is not the state after the "
                 "prompt of %zu tokens", n);
        return st;
    }
    req->ntokens = n;
    r->have_logits = 0;
    return TD_OK;
}

static td_status_t
v41_decode(td_engine_t *e, td_engine_row_t *rows, size_t n, td_engine_layer_fn fn, void *arg)
{
    v41_t *v = (v41_t *)e;
    td_forward_seq_t *seqs = calloc(n, sizeof(*seqs));
    v41_req_t **reqs = calloc(n, sizeof(*reqs));
    v41_hook_t hook = { v, NULL, 0, 0, NULL, fn, arg, TD_OK };
    td_status_t st = TD_ERR_NOMEM;

    hook.pieces = malloc((v->layer_most ? v->layer_most : 1) * sizeof(*hook.pieces));
    if (seqs == NULL || reqs == NULL || hook.pieces == NULL) {
        td_error("engine deepseek-v41: decode step of %zu rows: out of memory", n);
        goto cleanup;
    }
    for (size_t i = 0; i < n; i++) {
        v41_req_t *r = (v41_req_t *)rows[i].req;

        reqs[i] = r;
        seqs[i] = (td_forward_seq_t){ &r->cache, &rows[i].token, 1, r->logits, 0, 0 };
        r->have_logits = 0;
        r->base.ntokens++;
    }
    hook.reqs = reqs;
    /* the new entries land in each row's blocks; fn, if given, is told */
    st = v41_pass(v, seqs, n, &hook, fn != NULL);   /* logs */
    if (st != TD_OK)
        goto cleanup;
    for (size_t i = 0; i < n; i++)
        reqs[i]->have_logits = 1;
cleanup:
    free(hook.pieces);
    free(reqs);
    free(seqs);
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

/* ---- A DEP group's rank ----------------------------------------------------------- */

static td_status_t
v41_pass_empty(td_engine_t *e)
{
    v41_t *v = (v41_t *)e;

    return td_forward_dep(v->dep, NULL, 0, NULL, NULL);   /* logs its failures */
}

static uint64_t
v41_passes(const td_engine_t *e)
{
    const v41_t *v = (const v41_t *)e;
    td_forward_dep_stats_t s;

    td_forward_dep_stats(v->dep, &s);
    return s.passes;
}

static uint32_t
v41_expert_tokens(const td_engine_t *e, uint64_t *out, uint32_t cap)
{
    const v41_t *v = (const v41_t *)e;
    uint32_t E = (uint32_t)v->m->cfg->n_routed_experts;
    size_t L = (size_t)v->m->cfg->num_hidden_layers;
    uint64_t *all;

    if (cap == 0)
        return E;   /* the size only */
    if ((all = calloc(L * E, sizeof(*all))) == NULL)
        return 0;
    td_forward_dep_expert_tokens(v->dep, all);
    for (uint32_t x = 0; x < E && x < cap; x++) {
        out[x] = 0;
        for (size_t l = 0; l < L; l++)
            out[x] += all[l * E + x];
    }
    free(all);
    return E;
}

static const td_engine_ops_t v41_ops = {
    .destroy = v41_destroy,
    .req_create = v41_req_create,
    .req_destroy = v41_req_destroy,
    .prefill = v41_prefill,
    .adopt = v41_adopt,
    .decode = v41_decode,
    .logits = v41_logits,
    .seek = v41_seek,
    .replay = v41_replay,
    .replay_bound = v41_replay_bound,
};

static const td_engine_ops_t v41_group_ops = {
    .destroy = v41_destroy,
    .req_create = v41_req_create,
    .req_destroy = v41_req_destroy,
    .prefill = v41_prefill,
    .adopt = v41_adopt,
    .decode = v41_decode,
    .logits = v41_logits,
    .seek = v41_seek,
    .replay = v41_replay,
    .replay_bound = v41_replay_bound,
    .pass_empty = v41_pass_empty,
    .passes = v41_passes,
    .expert_tokens = v41_expert_tokens,
};

const td_engine_kind_t td_v41_kind = {
    .name = TD_V41_NAME,
    .help = TD_V41_HELP,
    .options = TD_V41_OPTIONS,
    .identity = td_v41_identity,
    .create = v41_create,
    .create_group = v41_create_group,
};

td_status_t
td_v41_engine_open(const char *dir, const td_engine_group_t *group, td_engine_t **out)
{
    static const td_engine_kind_t *const kinds[] = { &td_v41_kind, NULL };
    td_engine_config_t cfg;
    td_status_t st = td_engine_config_defaults(&cfg);

    if (st != TD_OK)
        return st;
    free(cfg.engine);
    free(cfg.model);
    cfg.engine = strdup(TD_V41_NAME);
    cfg.model = strdup(dir);
    if (cfg.engine == NULL || cfg.model == NULL) {
        td_error("engine deepseek-v41: out of memory");
        st = TD_ERR_NOMEM;
    } else {
        st = group != NULL ? td_engine_create_group(kinds, &cfg, group, out)
                           : td_engine_create(kinds, &cfg, out);
    }
    td_engine_config_free(&cfg);
    return st;
}
