/* engine/synthetic/synthetic.c — the synthetic engine: rolling keyed prefix hashes give
 * its next tokens and every KV byte (spec in docs/engine.md); a cost model
 * sets its speed. It is not a model and says so wherever it shows. */
#include "synthetic.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "gpucost.h"
#include "log.h"
#include "rng.h"

#define SYNTH_TAG_PREFIX 0x7464707265666978ull  /* "tdprefix" */
#define SYNTH_SEG_MUL    0xd1b54a32d192ed03ull

typedef struct {
    td_engine_t base;
    td_layout_t *layout;
    uint64_t key;
    double prefill_us, step_us, row_us;
    td_gpucost_t *cost;        /* owned; NULL: the flat costs above */
    uint32_t cost_ranks;
    double dilation;
    uint32_t *layer_first;     /* [layers + 1]: segments of layer L are
                                  [layer_first[L], layer_first[L + 1]) */
} synth_t;

typedef struct {
    td_engine_req_t base;
    uint64_t *ph;              /* [cap + 1]: ph[i] = hash of tokens [0, i) */
    uint64_t cap;
    td_engine_piece_t *pieces; /* [nsegs] */
    int32_t cand_ids[TD_SYNTH_CANDIDATES];
    float cand_logits[TD_SYNTH_CANDIDATES];
} synth_req_t;

static const td_engine_ops_t synth_ops;

/* ---- The hashes (docs/engine.md, "Synthetic engine") ------------------------ */

static uint64_t
synth_prefix_init(uint64_t key)
{
    return td_rng_mix64(key ^ SYNTH_TAG_PREFIX);
}

static uint64_t
synth_prefix_next(uint64_t p, int32_t token)
{
    return td_rng_mix64(p ^ td_rng_mix64((uint64_t)(uint32_t)token + TD_RNG_GAMMA));
}

/* Candidate j at the end of a prefix with hash p: the greedy token is j = 0. */
static int32_t
synth_candidate(uint64_t p, uint32_t j, uint32_t vocab)
{
    return (int32_t)(td_rng_mix64(p + (uint64_t)(j + 1) * TD_RNG_GAMMA) % vocab);
}

/* The bytes of one entry whose last token ends the prefix with hash p:
 * splitmix64's stream seeded by p and the segment, little-endian words. */
static void
synth_entry(uint64_t p, uint32_t seg, unsigned char *out, size_t len)
{
    uint64_t s = td_rng_mix64(p + (uint64_t)(seg + 1) * SYNTH_SEG_MUL);

    for (size_t off = 0; off < len; off += 8) {
        uint64_t z;
        size_t k = len - off < 8 ? len - off : 8;

        s += TD_RNG_GAMMA;
        z = td_rng_mix64(s);
        for (size_t b = 0; b < k; b++)
            out[off + b] = (unsigned char)(z >> (8 * b));
    }
}

/* Entries [first, first + count) of segment seg for a sequence of r->base.ntokens
 * tokens (callers checked the range). */
static void
synth_seg_bytes(const synth_t *s, const synth_req_t *r, uint32_t seg, uint64_t first,
                uint64_t count, unsigned char *out)
{
    const td_layout_seg_t *sg = &s->layout->segs[seg];
    uint64_t n = r->base.ntokens;

    for (uint64_t i = 0; i < count; i++) {
        uint64_t e = first + i, t;
        unsigned char *dst = out + i * sg->entry_bytes;

        if (sg->kind == TD_LAYOUT_PAGED) {
            t = e * sg->ratio + sg->ratio - 1;
        } else if (e >= n) {
            memset(dst, 0, sg->entry_bytes);
            continue;
        } else {
            t = e + (n - 1 - e) / sg->entries * sg->entries;
        }
        synth_entry(r->ph[t + 1], seg, dst, sg->entry_bytes);
    }
}

/* ---- Engine ---------------------------------------------------------------------- */

static void
synth_destroy(td_engine_t *e)
{
    synth_t *s = (synth_t *)e;

    td_layout_destroy(s->layout);
    td_gpucost_destroy(s->cost);
    free(s->layer_first);
    free(s);
}

/* µs each layer of a prefill chunk of n tokens after n0 sleeps: the GPU
 * cost model's time spread evenly over the layers, or the flat cost. */
static double
synth_prefill_layer_us(const synth_t *s, uint64_t n, uint64_t n0)
{
    if (s->cost != NULL)
        return td_gpucost_prefill_s(s->cost, n, n0, s->cost_ranks) * s->dilation * 1e6 /
               s->layout->layers;
    return s->prefill_us * (double)n;
}

/* The GPU cost model of cfg, when it names a profile. */
static td_status_t
synth_cost_create(const td_synth_config_t *cfg, td_gpucost_t **out)
{
    int has_profile = cfg->gpu_profile != NULL && cfg->gpu_profile[0] != '\0';
    int has_model = cfg->gpu_model != NULL && cfg->gpu_model[0] != '\0';
    td_gpucost_config_t gc = {.profile = cfg->gpu_profile, .model = cfg->gpu_model};

    *out = NULL;
    if (!has_profile && !has_model)
        return TD_OK;
    if (!has_profile || !has_model || !(cfg->time_dilation >= 0)) {
        td_error("engine synthetic: synth-gpu-profile '%s', synth-gpu-model '%s', time-dilation "
                 "%g: the GPU cost model needs both files and a dilation >= 0",
                 has_profile ? cfg->gpu_profile : "", has_model ? cfg->gpu_model : "",
                 cfg->time_dilation);
        return TD_ERR_INVALID;
    }
    return td_gpucost_create(&gc, out);
}

td_status_t
td_synth_create(const td_synth_config_t *cfg, td_engine_t **out)
{
    synth_t *s;
    td_status_t st;

    if (cfg->vocab < 2 || cfg->vocab > (1u << 30) || cfg->max_context == 0 ||
        !(cfg->prefill_us >= 0) || !(cfg->step_us >= 0) || !(cfg->row_us >= 0)) {
        td_error("engine synthetic: vocab %llu, max context %llu, costs %g/%g/%g us: want "
                 "2..2^30 tokens, a positive context, costs >= 0",
                 (unsigned long long)cfg->vocab, (unsigned long long)cfg->max_context,
                 cfg->prefill_us, cfg->step_us, cfg->row_us);
        return TD_ERR_INVALID;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return TD_ERR_NOMEM;
    st = td_layout_create(&cfg->layout, &s->layout);
    if (st != TD_OK)
        goto err_free;
    st = synth_cost_create(cfg, &s->cost);
    if (st != TD_OK)
        goto err_layout;
    s->cost_ranks = (uint32_t)(cfg->gpu_ranks ? cfg->gpu_ranks : 1);
    s->dilation = cfg->time_dilation;
    s->layer_first = calloc(s->layout->layers + 1, sizeof(*s->layer_first));
    if (s->layer_first == NULL) {
        st = TD_ERR_NOMEM;
        goto err_cost;
    }
    for (uint32_t L = 0, i = 0; L <= s->layout->layers; L++) {
        s->layer_first[L] = i;
        while (i < s->layout->nsegs && s->layout->segs[i].layer == L)
            i++;
    }
    s->key = cfg->key;
    s->prefill_us = cfg->prefill_us;
    s->step_us = cfg->step_us;
    s->row_us = cfg->row_us;
    s->base.ops = &synth_ops;
    s->base.name = TD_SYNTH_NAME;
    s->base.kind = TD_SYNTH_KIND;
    s->base.layout = s->layout;
    s->base.vocab = (uint32_t)cfg->vocab;
    s->base.max_context = cfg->max_context;
    s->base.fingerprint = td_rng_mix64(td_rng_mix64(cfg->key ^ 0x73796e7468ull /* "synth" */)
                                          ^ s->layout->hash) ^ cfg->vocab;
    s->base.checks_kv = 1;
    *out = &s->base;
    return TD_OK;

err_cost:
    td_gpucost_destroy(s->cost);
err_layout:
    td_layout_destroy(s->layout);
err_free:
    free(s);
    return st;
}

/* ---- Requests ----------------------------------------------------------------- */

/* Write entries [first, first + count) of segment seg into the request's KV
 * memory, one entry at a time (blocks lie anywhere). */
static void
synth_seg_store(const synth_t *s, const synth_req_t *r, uint32_t seg, uint64_t first,
                uint64_t count)
{
    for (uint64_t i = 0; i < count; i++)
        synth_seg_bytes(s, r, seg, first + i, 1, td_layout_kv_entry(&r->base.kv, seg, first + i));
}

static td_status_t
synth_req_create(td_engine_t *e, const td_layout_kv_t *kv, td_engine_req_t **out)
{
    synth_t *s = (synth_t *)e;
    synth_req_t *r = calloc(1, sizeof(*r));

    if (r == NULL)
        return TD_ERR_NOMEM;
    r->cap = 64;
    r->ph = malloc((r->cap + 1) * sizeof(*r->ph));
    r->pieces = calloc(s->layout->nsegs ? s->layout->nsegs : 1, sizeof(*r->pieces));
    if (r->ph == NULL || r->pieces == NULL) {
        free(r->ph);
        free(r->pieces);
        free(r);
        return TD_ERR_NOMEM;
    }
    r->ph[0] = synth_prefix_init(s->key);
    (void)kv;   /* kept by td_engine_req_create in r->base.kv */
    *out = &r->base;
    return TD_OK;
}

static void
synth_req_destroy(td_engine_req_t *req)
{
    synth_req_t *r = (synth_req_t *)req;

    free(r->ph);
    free(r->pieces);
    free(r);
}

/* Append tokens to the prefix-hash history (the "compute" of every op). */
static td_status_t
synth_append(synth_req_t *r, const int32_t *tokens, size_t n)
{
    uint64_t need = r->base.ntokens + n;

    if (need > r->cap) {
        uint64_t cap = r->cap;
        uint64_t *ph;

        while (cap < need)
            cap *= 2;
        ph = realloc(r->ph, (cap + 1) * sizeof(*ph));
        if (ph == NULL)
            return TD_ERR_NOMEM;
        r->ph = ph;
        r->cap = cap;
    }
    for (size_t i = 0; i < n; i++, r->base.ntokens++)
        r->ph[r->base.ntokens + 1] = synth_prefix_next(r->ph[r->base.ntokens], tokens[i]);
    return TD_OK;
}

/* The pieces layer L owes after the sequence grew from n0 to its current
 * length: paged entries completed since n0, and (with_fixed) every fixed
 * segment whole, written into the KV memory (with_fixed 2: written, not
 * reported). Calls fn (when given) when there are pieces or `always`. */
static td_status_t
synth_emit_layer(synth_t *s, synth_req_t *r, uint32_t L, uint64_t n0, int with_fixed,
                 int always, td_engine_layer_fn fn, void *arg)
{
    uint64_t n = r->base.ntokens;
    size_t np = 0;

    for (uint32_t i = s->layer_first[L]; i < s->layer_first[L + 1]; i++) {
        const td_layout_seg_t *sg = &s->layout->segs[i];
        td_engine_piece_t *p = &r->pieces[np];

        if (sg->kind == TD_LAYOUT_PAGED) {
            p->first = n0 / sg->ratio;
            p->count = n / sg->ratio - p->first;
        } else if (with_fixed) {
            p->first = 0;
            p->count = sg->entries;
        } else {
            continue;
        }
        if (p->count == 0)
            continue;
        p->seg = i;
        synth_seg_store(s, r, i, p->first, p->count);
        if (with_fixed == 2 && sg->kind == TD_LAYOUT_FIXED)
            continue;   /* kept in memory, not reported */
        np++;
    }
    if (fn == NULL || (np == 0 && !always))
        return TD_OK;
    return fn(&r->base, L, r->pieces, np, arg);
}

/* A fresh request's rings are empty. */
static void
synth_reset_fixed(const synth_t *s, td_engine_req_t *req)
{
    for (uint32_t i = 0; i < s->layout->nsegs; i++)
        if (s->layout->segs[i].kind == TD_LAYOUT_FIXED)
            memset(req->kv.fixed[i], 0, td_layout_seg_bytes(&s->layout->segs[i], 0));
}

static td_status_t
synth_prefill(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
              td_engine_layer_fn fn, void *arg)
{
    synth_t *s = (synth_t *)req->engine;
    synth_req_t *r = (synth_req_t *)req;
    uint64_t n0 = req->ntokens, deadline = td_clock_ns();
    double layer_us = synth_prefill_layer_us(s, n, n0);
    td_status_t st;

    if (n0 == 0)   /* a fresh request's rings are empty */
        synth_reset_fixed(s, req);
    st = synth_append(r, tokens, n);
    if (st != TD_OK)
        return st;
    for (uint32_t L = 0; L < s->layout->layers; L++) {
        td_clock_wait(&deadline, layer_us);
        /* fixed segments: stored and reported with the last chunk, stored
         * only with KEEP (2), not touched otherwise (cheaper) */
        st = synth_emit_layer(s, r, L, n0, last, 1, fn, arg);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* ---- Bounded replay -------------------------------------------------------------
 * Every byte is a hash of the prefix up to its token, and the prefix hashes
 * come from the tokens alone: seek computes them (no KV), a replay chunk
 * writes the fixed segments whole, so one replayed token rebuilds the state
 * exactly (the bound is 1). As adopt does, replay checks the frozen paged
 * entries its tokens complete: a cache that hands out wrong bytes is caught. */

static td_status_t
synth_seek(td_engine_req_t *req, const int32_t *tokens, uint64_t pos)
{
    synth_t *s = (synth_t *)req->engine;

    synth_reset_fixed(s, req);
    return synth_append((synth_req_t *)req, tokens, (size_t)pos);
}

/* Entries [first, end) of segment seg (paged, or a fixed one's slots) hold
 * what this engine computes for them at the request's length;
 * TD_ERR_MISMATCH, logged with what: "<what> kv differs: ...". */
static td_status_t
synth_check_entries(const synth_t *s, const synth_req_t *r, uint32_t seg, uint64_t first,
                    uint64_t end, const char *what)
{
    const td_layout_seg_t *sg = &s->layout->segs[seg];
    unsigned char *want = malloc(sg->entry_bytes);

    if (want == NULL)
        return TD_ERR_NOMEM;
    for (uint64_t e = first; e < end; e++) {
        const unsigned char *got = td_layout_kv_entry(&r->base.kv, seg, e);

        synth_seg_bytes(s, r, seg, e, 1, want);
        if (memcmp(want, got, sg->entry_bytes) != 0) {
            uint32_t b = 0;

            while (want[b] == got[b])
                b++;
            td_error("engine synthetic: %s kv differs: segment %s entry %llu byte %u", what,
                     sg->name, (unsigned long long)e, b);
            free(want);
            return TD_ERR_MISMATCH;
        }
    }
    free(want);
    return TD_OK;
}

static td_status_t
synth_replay(td_engine_req_t *req, const int32_t *tokens, size_t n, uint64_t frozen)
{
    synth_t *s = (synth_t *)req->engine;
    synth_req_t *r = (synth_req_t *)req;
    uint64_t n0 = req->ntokens, deadline = td_clock_ns();
    td_status_t st;

    if (n0 == 0)
        synth_reset_fixed(s, req);
    st = synth_append(r, tokens, n);
    if (st != TD_OK)
        return st;
    td_clock_wait(&deadline, s->cost != NULL
                                 ? synth_prefill_layer_us(s, n, n0) * s->layout->layers
                                 : s->prefill_us * (double)n * s->layout->layers);
    for (uint32_t i = 0; i < s->layout->nsegs; i++) {
        const td_layout_seg_t *sg = &s->layout->segs[i];
        uint64_t end = td_layout_entries(sg, req->ntokens), fz = frozen / sg->ratio;

        if (sg->kind == TD_LAYOUT_FIXED) {
            synth_seg_store(s, r, i, 0, sg->entries);
            continue;
        }
        /* the entries this chunk completes: frozen ones are read, the rest
         * (none while ntokens <= frozen) written */
        uint64_t first = td_layout_entries(sg, n0), mid = fz < first ? first : fz < end ? fz : end;
        st = synth_check_entries(s, r, i, first, mid, "replay: the cached prefix's");
        if (st != TD_OK)
            return st;
        synth_seg_store(s, r, i, mid, end - mid);
    }
    return TD_OK;
}

static uint64_t
synth_replay_bound(const td_engine_t *e)
{
    (void)e;
    return 1;
}

/* The received state must be exactly what this engine computes for the
 * prompt: every complete paged entry and every fixed segment. */
static td_status_t
synth_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n)
{
    synth_t *s = (synth_t *)req->engine;
    synth_req_t *r = (synth_req_t *)req;
    td_status_t st = synth_append(r, tokens, n);

    for (uint32_t i = 0; st == TD_OK && i < s->layout->nsegs; i++)
        st = synth_check_entries(s, r, i, 0, td_layout_entries(&s->layout->segs[i], n),
                                 "adopt: received");
    return st;
}

static td_status_t
synth_decode(td_engine_t *e, td_engine_row_t *rows, size_t n, td_engine_layer_fn fn, void *arg)
{
    synth_t *s = (synth_t *)e;
    uint64_t deadline = td_clock_ns(), context = 0;
    td_status_t st;

    for (size_t i = 0; i < n; i++) {
        context += rows[i].req->ntokens;   /* before this step's token */
        st = synth_append((synth_req_t *)rows[i].req, &rows[i].token, 1);
        if (st != TD_OK)
            return st;
    }
    if (s->cost != NULL)
        td_clock_wait(&deadline, td_gpucost_decode_step_s(s->cost, n, context, s->cost_ranks) *
                                     s->dilation * 1e6);
    else
        td_clock_wait(&deadline, s->step_us + s->row_us * (double)n);
    for (uint32_t L = 0; L < s->layout->layers; L++) {
        for (size_t i = 0; i < n; i++) {
            synth_req_t *r = (synth_req_t *)rows[i].req;

            /* the new token's slot of each fixed ring (not emitted) */
            for (uint32_t g = s->layer_first[L]; g < s->layer_first[L + 1]; g++)
                if (s->layout->segs[g].kind == TD_LAYOUT_FIXED)
                    synth_seg_store(s, r, g, (r->base.ntokens - 1) % s->layout->segs[g].entries,
                                    1);
            st = synth_emit_layer(s, r, L, r->base.ntokens - 1, 0, 0, fn, arg);
            if (st != TD_OK)
                return st;
        }
    }
    return TD_OK;
}

static td_status_t
synth_logits(td_engine_req_t *req, td_sample_dist_t *out)
{
    synth_req_t *r = (synth_req_t *)req;
    uint64_t p = r->ph[req->ntokens];
    uint32_t n = 0;

    for (uint32_t j = 0; j < TD_SYNTH_CANDIDATES; j++) {
        int32_t id = synth_candidate(p, j, req->engine->vocab);
        uint32_t k = 0;

        while (k < n && r->cand_ids[k] != id)
            k++;
        if (k < n)
            continue;   /* a repeated candidate keeps its first, higher logit */
        r->cand_ids[n] = id;
        r->cand_logits[n] = -0.5f * (float)j;
        n++;
    }
    out->n = n;
    out->ids = r->cand_ids;
    out->logits = r->cand_logits;
    return TD_OK;
}

/* ---- Verification ------------------------------------------------------------------ */

/* The range must be entries that exist now: complete paged entries, or a
 * fixed segment whole. */
static td_status_t
synth_check_range(td_engine_req_t *req, uint32_t seg, uint64_t first, uint64_t count,
                  synth_t **sout)
{
    synth_t *s = (synth_t *)req->engine;
    const td_layout_seg_t *sg;

    if (req->engine->ops != &synth_ops) {
        td_error("engine %s: not a synthetic engine", req->engine->name);
        return TD_ERR_INVALID;
    }
    if (seg >= s->layout->nsegs) {
        td_error("engine synthetic: segment %u of %u", seg, s->layout->nsegs);
        return TD_ERR_RANGE;
    }
    sg = &s->layout->segs[seg];
    if (sg->kind == TD_LAYOUT_PAGED ? (first > req->ntokens / sg->ratio ||
                                       count > req->ntokens / sg->ratio - first)
                                    : (first != 0 || count != sg->entries)) {
        td_error("engine synthetic: segment %s: entries [%llu, +%llu) do not exist at "
                 "%llu tokens", sg->name, (unsigned long long)first,
                 (unsigned long long)count, (unsigned long long)req->ntokens);
        return TD_ERR_RANGE;
    }
    *sout = s;
    return TD_OK;
}

td_status_t
td_synth_kv_expect(td_engine_req_t *req, uint32_t seg, uint64_t first, uint64_t count, void *buf)
{
    synth_t *s;
    td_status_t st = synth_check_range(req, seg, first, count, &s);

    if (st == TD_OK)
        synth_seg_bytes(s, (synth_req_t *)req, seg, first, count, buf);
    return st;
}

td_status_t
td_synth_kv_verify(td_engine_req_t *req, uint32_t seg, uint64_t first, uint64_t count,
                   const void *data, uint64_t *bad)
{
    synth_t *s;
    const unsigned char *got = data;
    unsigned char *want;
    td_status_t st = synth_check_range(req, seg, first, count, &s);
    uint32_t eb;

    if (st != TD_OK)
        return st;
    eb = s->layout->segs[seg].entry_bytes;
    want = malloc(eb);
    if (want == NULL)
        return TD_ERR_NOMEM;
    for (uint64_t i = 0; i < count; i++) {
        synth_seg_bytes(s, (synth_req_t *)req, seg, first + i, 1, want);
        if (memcmp(want, got + i * eb, eb) != 0) {
            uint32_t b = 0;

            while (want[b] == got[i * eb + b])
                b++;
            *bad = i * eb + b;
            st = TD_ERR_MISMATCH;
            break;
        }
    }
    free(want);
    return st;
}

static const td_engine_ops_t synth_ops = {
    .destroy = synth_destroy,
    .req_create = synth_req_create,
    .req_destroy = synth_req_destroy,
    .prefill = synth_prefill,
    .adopt = synth_adopt,
    .decode = synth_decode,
    .logits = synth_logits,
    .seek = synth_seek,
    .replay = synth_replay,
    .replay_bound = synth_replay_bound,
};
