/* model/forward.c — the DeepSeek-V4.1 forward pass as transformers'
 * DeepseekV41ForCausalLM runs it with a cache (mHC streams, engram, window +
 * CSA2 attention, MoE), every op through the model's td_kernels_ops_t; the
 * caches are views of the callers' KV memory (paged entries through block
 * tables), a hook is told after each layer, and the requests of a pass
 * attend side by side on the cpu ops' threads. */
#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Query rows per attention tile (bounds the key/mask buffers of long chunks). */
#define FW_TILE 128
/* Indexer keys dequantized at a time while scoring (bounds that scratch:
 * the keys stay in the cache, quantized, and are read tile by tile). */
#define FW_KEY_TILE 256

/* The reference's per-forward `shared` dict, one per request. */
typedef struct {
    int32_t comp_seg;         /* the cache segment of the compressed KV the group reads */
    size_t ncomp;             /* its entries [0, ncomp) (read in place, as needed) */
    int has_comp;
    int32_t index_seg;        /* the cache segment of the indexer keys the group scores */
    size_t nidx;              /* its entries [0, nidx) */
    int has_index_k;
    float *bias;              /* [n, bias_t] top-k block bias (0 / -inf) */
    size_t bias_t;
    int has_bias;
    unsigned char *cand;      /* [n, cand_t] candidate mask of the two-level top-k */
    size_t cand_t;
    int has_cand;
} fw_shared_t;

typedef struct fw_moe_ws fw_moe_ws_t;

/* One forward call. */
typedef struct {
    const td_model_t *m;
    td_forward_dep_t *dep;    /* NULL: no DEP group */
    fw_moe_ws_t *ws;          /* the MoE workspace */
    size_t tall;              /* rows of every rank of the DEP group (N without one) */
    const td_modelcfg_t *c;
    const td_kernels_ops_t *k;
    td_forward_seq_t *seqs;
    size_t nseq;
    size_t N;                 /* rows */
    size_t *row0;             /* [nseq] first row of each request */
    uint64_t *p0;             /* [nseq] the request's position before this call */
    int64_t *pos;             /* [N] absolute positions */
    fw_shared_t *sh;          /* [nseq] */
    td_status_t *seq_st;      /* [nseq] each request's attention status */
    size_t H, hc, hd, nh, rd;

    float *S, *R;             /* [N, hc, H] streams, residual */
    float *flat, *mixes;      /* [N, hc * H], [N, (2 + hc) * hc] */
    float *pre_in, *a_pre, *a_post, *a_comb, *f_pre, *f_post, *f_comb;
    float *x, *y;             /* [N, H] */
    /* attention */
    float *qr, *q, *kv, *ao, *oa, *ckv, *cg;
    uint8_t *kv_codes, *kv_scales;
    /* engram */
    int64_t *back;            /* [N, max_ngram] compressed ids looked back (pad when blocked) */
    int64_t *hid;             /* [N, cols] */
    float *emb, *kvx, *ekey, *eval;
} fw_t;

/* ---- helpers ------------------------------------------------------------------- */

/* A kernel op that fails has logged why (td_kernels_fail): pass the status up. */
#define FW_CHECK(expr)                                                         \
    do {                                                                       \
        td_status_t st_ = (expr);                                              \
        if (st_ != TD_OK)                                                      \
            return st_;                                                        \
    } while (0)

/* The same inside functions that unwind with goto out (st declared there). */
#define FW_TRY(expr)                                                           \
    do {                                                                       \
        st = (expr);                                                           \
        if (st != TD_OK)                                                       \
            goto out;                                                          \
    } while (0)

/* An allocation of the pass failed: logged here, once, with the step. */
static td_status_t
fw_nomem(const fw_t *f, const char *step)
{
    td_error("forward: %s: out of memory (%zu rows)", step, f->N);
    return TD_ERR_NOMEM;
}

static void *
fw_calloc(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* Store one vector of dim values as an entry in format fmt. */
static td_status_t
fw_store_one(const fw_t *f, td_cache_fmt_t fmt, uint32_t dim, const float *v, unsigned char *e)
{
    switch (fmt) {
    case TD_CACHE_FP8:
        FW_CHECK(f->k->quant_fp8(v, 1, dim, TD_CACHE_FP8_BLOCK, e, e + dim));
        break;
    case TD_CACHE_FP4_E4M3:
        FW_CHECK(f->k->quant_fp4(v, 1, dim, TD_CACHE_KV_FP4_BLOCK, 1, e, e + dim / 2));
        break;
    case TD_CACHE_FP4_UE8M0:
        FW_CHECK(f->k->quant_fp4(v, 1, dim, TD_CACHE_INDEX_FP4_BLOCK, 0, e, e + dim / 2));
        break;
    case TD_CACHE_F32:
        memcpy(e, v, (size_t)dim * sizeof(float));
        break;
    }
    return TD_OK;
}

/* Load one entry of format fmt into dim f32 values. */
static td_status_t
fw_load_one(const fw_t *f, td_cache_fmt_t fmt, uint32_t dim, const unsigned char *e, float *v)
{
    switch (fmt) {
    case TD_CACHE_FP8:
        FW_CHECK(f->k->dequant_fp8(e, e + dim, 1, dim, TD_CACHE_FP8_BLOCK, v));
        break;
    case TD_CACHE_FP4_E4M3:
        FW_CHECK(f->k->dequant_fp4(e, e + dim / 2, 1, dim, TD_CACHE_KV_FP4_BLOCK, 1, v));
        break;
    case TD_CACHE_FP4_UE8M0:
        FW_CHECK(f->k->dequant_fp4(e, e + dim / 2, 1, dim, TD_CACHE_INDEX_FP4_BLOCK, 0, v));
        break;
    case TD_CACHE_F32:
        memcpy(v, e, (size_t)dim * sizeof(float));
        break;
    }
    return TD_OK;
}

/* Store n vectors [n, dim] as entries e0 .. e0 + n - 1 of paged segment seg
 * (through the block table: consecutive entries may lie in other blocks). */
static td_status_t
fw_store_seg(const fw_t *f, td_cache_fmt_t fmt, uint32_t dim, const float *x, size_t n,
             const td_cache_t *c, int32_t seg, uint64_t e0)
{
    for (size_t i = 0; i < n; i++)
        FW_CHECK(fw_store_one(f, fmt, dim, x + i * dim, td_cache_entry(c, (uint32_t)seg, e0 + i)));
    return TD_OK;
}

/* The reference's fake quantizers, in place (quantize, then dequantize). */
static td_status_t
fw_fake_quant(const fw_t *f, td_cache_fmt_t fmt, uint32_t dim, float *x, size_t n)
{
    if (fmt == TD_CACHE_F32)
        return TD_OK;
    unsigned char *tmp = malloc(td_cache_fmt_bytes(fmt, dim));
    if (tmp == NULL)
        return fw_nomem(f, "fake quantization");
    td_status_t st = TD_OK;
    for (size_t i = 0; i < n && st == TD_OK; i++) {
        st = fw_store_one(f, fmt, dim, x + i * dim, tmp);
        if (st == TD_OK)
            st = fw_load_one(f, fmt, dim, tmp, x + i * dim);
    }
    free(tmp);
    return st;
}

static const float *
fw_inv_freq(const fw_t *f, uint32_t l, float *scale)
{
    if (f->c->layers[l].ratio > 0) {
        *scale = f->m->rope_scale_compress;
        return f->m->inv_freq_compress;
    }
    *scale = f->m->rope_scale_main;
    return f->m->inv_freq_main;
}

/* ---- engram ---------------------------------------------------------------------- */

/* back[r, s]: the compressed id of the token s places before row r, or the
 * pad class where the look-back reaches before position 0. */
static td_status_t
fw_engram_back(fw_t *f)
{
    const td_model_engram_t *g = &f->m->engram;
    size_t nb = (size_t)f->c->engram_max_ngram_size, slots = f->m->plan->engram_slots;

    for (size_t s = 0; s < f->nseq; s++) {
        const td_forward_seq_t *q = &f->seqs[s];
        const unsigned char *ring = td_cache_fixed(q->cache, (uint32_t)f->m->plan->engram);
        uint64_t p0 = f->p0[s];
        for (size_t i = 0; i < q->n; i++) {
            uint64_t p = p0 + i;
            for (size_t sh = 0; sh < nb; sh++) {
                int64_t cls = g->pad_class;
                if (p >= sh) {
                    uint64_t src = p - sh;
                    int32_t t32;
                    if (src >= p0)
                        t32 = q->tokens[src - p0];
                    else   /* the slot may sit anywhere: no alignment assumed */
                        memcpy(&t32, ring + src % slots * sizeof(int32_t), sizeof(t32));
                    int64_t tok = t32;
                    if (tok < 0 || (uint64_t)tok >= g->map_size) {
                        td_error("forward: cache holds token id %lld at position %llu, "
                                 "outside the tokenizer's %u ids", (long long)tok,
                                 (unsigned long long)src, g->map_size);
                        return TD_ERR_INVALID;
                    }
                    cls = g->token_map[tok];
                }
                f->back[(f->row0[s] + i) * nb + sh] = cls;
            }
        }
    }
    return TD_OK;
}

static td_status_t
fw_engram(fw_t *f, uint32_t l)
{
    const td_modelcfg_t *c = f->c;
    const td_model_layer_t *L = &f->m->layers[l];
    const td_model_engram_t *g = &f->m->engram;
    size_t k = (size_t)c->layers[l].engram, nb = (size_t)c->engram_max_ngram_size;
    size_t heads = (size_t)c->engram_n_heads, cols = (nb - 1) * heads;
    size_t ed = (size_t)c->engram_head_dim, H = f->H, hc = f->hc, N = f->N;
    const int64_t *mult = g->mult + k * nb;
    const uint64_t *primes = g->primes + k * cols, *offs = g->offsets + k * cols;

    for (size_t r = 0; r < N; r++) {
        const int64_t *t = f->back + r * nb;
        /* ids < vocab and multipliers < INT64_MAX / vocab: no product overflows */
        uint64_t rolling = (uint64_t)t[0] * (uint64_t)mult[0];
        for (size_t i = 1; i < nb; i++) {
            rolling ^= (uint64_t)t[i] * (uint64_t)mult[i];
            for (size_t h = 0; h < heads; h++) {
                size_t col = (i - 1) * heads + h;
                f->hid[r * cols + col] = (int64_t)(rolling % primes[col] + offs[col]);
            }
        }
    }
    FW_CHECK(f->k->embed(L->eg_table, L->eg_rows, ed, f->hid, N * cols, f->emb));
    FW_CHECK(f->k->linear_mat(f->emb, L->eg_wkv, f->kvx, N));
    for (size_t r = 0; r < N; r++) {
        memcpy(f->ekey + r * hc * H, f->kvx + r * H * (hc + 1), hc * H * sizeof(float));
        memcpy(f->eval + r * H, f->kvx + r * H * (hc + 1) + hc * H, H * sizeof(float));
    }
    FW_CHECK(f->k->engram_mix(f->S, f->ekey, f->eval, L->eg_qk, N, hc, H,
                              (float)c->rms_norm_eps));
    return TD_OK;
}

/* ---- compressor and indexer (CSA2) -------------------------------------------------- */

/* The kv source layer l for request s: pool the groups that complete in this
 * call, publish their indexer keys and compressed KV into the cache (but for
 * the frozen ones, which the cache holds already), and hand the group the
 * running compressed KV, which every layer reads from the cache. */
static td_status_t
fw_compress(fw_t *f, uint32_t l, size_t s)
{
    const td_modelcfg_layer_t *cl = &f->c->layers[l];
    const td_model_layer_t *L = &f->m->layers[l];
    const td_cache_plan_t *plan = f->m->plan;
    const td_cache_layer_t *sg = &plan->layers[l];
    td_cache_t *cache = f->seqs[s].cache;
    fw_shared_t *sh = &f->sh[s];
    size_t n = f->seqs[s].n, r0 = f->row0[s], hd = f->hd, r = (size_t)cl->ratio;
    uint64_t p0 = f->p0[s], e0 = p0 / r;
    uint64_t ef = f->seqs[s].frozen / r;   /* entries below ef are frozen */
    size_t G, g0, b = 0;
    float *lat = NULL, *kvb = NULL, *gb = NULL, *tmp = NULL;
    int64_t *gpos = NULL;
    td_status_t st = TD_OK;
    const float eps = (float)f->c->rms_norm_eps;

    if (r == 1) {
        G = n;
        lat = malloc(G * hd * sizeof(float));
        gpos = malloc(G * sizeof(int64_t));
        if (lat == NULL || gpos == NULL) {
            st = fw_nomem(f, "compressor");
            goto out;
        }
        g0 = ef > e0 ? (size_t)(ef - e0 < G ? ef - e0 : G) : 0;
        memcpy(lat + g0 * hd, f->ckv + (r0 + g0) * hd, (G - g0) * hd * sizeof(float));
        for (size_t i = 0; i < G; i++)
            gpos[i] = (int64_t)(p0 + i);
    } else {
        unsigned char *part = td_cache_fixed(cache, (uint32_t)sg->partial);
        size_t tot;
        b = (size_t)(p0 % r);
        tot = b + n;
        G = tot / r;
        kvb = malloc(tot * hd * sizeof(float));
        gb = malloc(tot * hd * sizeof(float));
        lat = malloc((G ? G : 1) * hd * sizeof(float));
        gpos = malloc((G ? G : 1) * sizeof(int64_t));
        if (kvb == NULL || gb == NULL || lat == NULL || gpos == NULL) {
            st = fw_nomem(f, "compressor");
            goto out;
        }
        for (size_t j = 0; j < b; j++) {     /* slots 0 .. b-1 hold the open group */
            memcpy(kvb + j * hd, part + j * 2 * hd * sizeof(float), hd * sizeof(float));
            memcpy(gb + j * hd, part + (j * 2 + 1) * hd * sizeof(float), hd * sizeof(float));
        }
        memcpy(kvb + b * hd, f->ckv + r0 * hd, n * hd * sizeof(float));
        memcpy(gb + b * hd, f->cg + r0 * hd, n * hd * sizeof(float));
        g0 = ef > e0 ? (size_t)(ef - e0 < G ? ef - e0 : G) : 0;
        if (G > g0)
            FW_TRY(f->k->gate_pool(kvb + g0 * r * hd, gb + g0 * r * hd, G - g0, r, hd,
                                   lat + g0 * hd));
        /* a ring of r slots: token t in slot t % r (buffer row j is token
         * e0 * r + j), so the open group's tokens sit in slots 0, 1, ... */
        for (size_t j = tot > r ? tot - r : 0; j < tot; j++) {
            memcpy(part + (j % r) * 2 * hd * sizeof(float), kvb + j * hd, hd * sizeof(float));
            memcpy(part + ((j % r) * 2 + 1) * hd * sizeof(float), gb + j * hd,
                   hd * sizeof(float));
        }
        for (size_t g = 0; g < G; g++)
            gpos[g] = (int64_t)((e0 + g) * r);
    }

    if (G > g0) {   /* the groups [g0, G) (every op is row by row: the same bits) */
        size_t ng = G - g0;
        float *lg = lat + g0 * hd;
        const int64_t *pg = gpos + g0;
        FW_TRY(f->k->rmsnorm(lg, L->cmp_norm, eps, ng, hd, lg));
        if (cl->owns_index_k) {
            size_t idh = (size_t)f->c->index_head_dim;
            tmp = malloc(ng * (idh > hd ? idh : hd) * sizeof(float));
            if (tmp == NULL) {
                st = fw_nomem(f, "compressor");
                goto out;
            }
            FW_TRY(f->k->linear_mat(lg, L->idx_wk, tmp, ng));
            FW_TRY(f->k->rmsnorm(tmp, L->idx_k_norm, eps, ng, idh, tmp));
            FW_TRY(f->k->rope(tmp, ng, 1, idh, f->rd, pg, f->m->inv_freq_compress,
                              f->m->rope_scale_compress, 0));
            st = fw_store_seg(f, plan->index_fmt, (uint32_t)idh, tmp, ng, cache, sg->index,
                              e0 + g0);
            if (st != TD_OK)
                goto out;
        }
        FW_TRY(f->k->rope(lg, ng, 1, hd, f->rd, pg, f->m->inv_freq_compress,
                          f->m->rope_scale_compress, 0));
        st = fw_store_seg(f, plan->kv_fmt, (uint32_t)hd, lg, ng, cache, sg->kv, e0 + g0);
        if (st != TD_OK)
            goto out;
    }
    /* the running compressed cache of the group (none before its first group),
     * read from the cache by the layers that attend to it */
    sh->ncomp = (size_t)((p0 + n) / r);
    sh->has_comp = sh->ncomp > 0;
    sh->comp_seg = sg->kv;
    st = TD_OK;

out:
    free(lat);
    free(kvb);
    free(gb);
    free(tmp);
    free(gpos);
    return st;
}

/* select_candidate_blocks of the reference for one query row: sc [t] (-inf
 * where unreachable), clen = visible entries; keep [t]. */
static td_status_t
fw_candidates(const fw_t *f, const float *sc, size_t t, uint64_t clen, unsigned char *keep,
              float *bscore, int64_t *bidx)
{
    size_t bs = (size_t)f->c->candidate_block_size, nb = (t + bs - 1) / bs;
    size_t kb = (size_t)f->c->candidate_topk_blocks < nb ? (size_t)f->c->candidate_topk_blocks : nb;

    for (size_t j = 0; j < nb; j++) {
        float mx = -INFINITY;
        for (size_t i = j * bs; i < (j + 1) * bs && i < t; i++)
            if (sc[i] > mx || isnan(sc[i]))
                mx = sc[i];
        bscore[j] = mx;
    }
    if (clen > 0)   /* (clen - 1) // bs; clen 0 gives block -1: none pinned */
        bscore[(clen - 1) / bs] = INFINITY;
    memset(keep, 0, t);
    if (kb == 0)
        return TD_OK;
    FW_CHECK(f->k->topk(bscore, 1, nb, kb, bidx));
    for (size_t j = 0; j < kb; j++)
        if (bscore[bidx[j]] > -INFINITY)
            for (size_t i = (size_t)bidx[j] * bs; i < ((size_t)bidx[j] + 1) * bs && i < t; i++)
                keep[i] = 1;
    return TD_OK;
}

/* The index source layer l for request s: score the queries against the
 * group's indexer keys and publish the top-k block bias (and, at the
 * candidate source, the candidate blocks). */
static td_status_t
fw_index(fw_t *f, uint32_t l, size_t s)
{
    const td_modelcfg_t *c = f->c;
    const td_modelcfg_layer_t *cl = &c->layers[l];
    const td_model_layer_t *L = &f->m->layers[l];
    const td_cache_plan_t *plan = f->m->plan;
    fw_shared_t *sh = &f->sh[s];
    td_cache_t *cache = f->seqs[s].cache;
    size_t n = f->seqs[s].n, r0 = f->row0[s], r = (size_t)cl->ratio;
    size_t ih = (size_t)c->index_n_heads, idh = (size_t)c->index_head_dim;
    size_t ql = (size_t)c->q_lora_rank;
    uint64_t p0 = f->p0[s];
    float *qi = NULL, *w = NULL, *sc = NULL, *bscore = NULL, *keys = NULL, *ksc = NULL;
    int64_t *idx = NULL, *bidx = NULL;
    td_status_t st = TD_OK;

    if (cl->owns_index_k) {
        sh->nidx = (size_t)((p0 + n) / r);
        sh->has_index_k = sh->nidx > 0;
        sh->index_seg = plan->layers[l].index;
    }
    if (!sh->has_index_k || sh->nidx == 0)
        return TD_OK;
    size_t t = sh->nidx, kt = t < FW_KEY_TILE ? t : FW_KEY_TILE;

    qi = malloc(n * ih * idh * sizeof(float));
    w = malloc(n * ih * sizeof(float));
    sc = malloc(n * t * sizeof(float));
    keys = malloc(kt * idh * sizeof(float));
    ksc = n > 1 ? malloc(n * kt * sizeof(float)) : NULL;
    size_t topk = (size_t)c->index_topk < t ? (size_t)c->index_topk : t;
    idx = malloc((topk ? topk : 1) * n * sizeof(int64_t));
    bscore = malloc(t * sizeof(float));
    bidx = malloc(t * sizeof(int64_t));
    float *nb_bias = realloc(sh->bias, n * t * sizeof(float));
    if (nb_bias != NULL)
        sh->bias = nb_bias;
    if (qi == NULL || w == NULL || sc == NULL || idx == NULL || bscore == NULL ||
        bidx == NULL || nb_bias == NULL || keys == NULL || (n > 1 && ksc == NULL)) {
        st = fw_nomem(f, "indexer");
        goto out;
    }

    FW_TRY(f->k->linear_mat(f->qr + r0 * ql, L->idx_wq_b, qi, n));
    FW_TRY(f->k->rope(qi, n, ih, idh, f->rd, f->pos + r0, f->m->inv_freq_compress,
                      f->m->rope_scale_compress, 0));
    st = fw_fake_quant(f, plan->index_fmt, (uint32_t)idh, qi, n * ih);
    if (st != TD_OK)
        goto out;
    FW_TRY(f->k->linear_mat(f->x + r0 * f->H, L->idx_wproj, w, n));
    const float heads_scaling = (float)(1.0 / sqrt((double)ih));
    for (size_t i = 0; i < n * ih; i++)
        w[i] *= heads_scaling;
    /* scores tile by tile of keys (each score depends on its key alone) */
    for (size_t j0 = 0; j0 < t; j0 += kt) {
        size_t nk = t - j0 < kt ? t - j0 : kt;
        for (size_t j = 0; j < nk; j++) {
            st = fw_load_one(f, plan->index_fmt, (uint32_t)idh,
                             td_cache_entry(cache, (uint32_t)sh->index_seg, j0 + j),
                             keys + j * idh);
            if (st != TD_OK)
                goto out;
        }
        FW_TRY(f->k->index_scores(qi, keys, w, n, ih, nk, idh,
                                  (float)(1.0 / sqrt((double)idh)), n > 1 ? ksc : sc + j0));
        for (size_t i = 0; n > 1 && i < n; i++)
            memcpy(sc + i * t + j0, ksc + i * nk, nk * sizeof(float));
    }
    for (size_t i = 0; i < n; i++) {        /* visible once the query passed the group */
        uint64_t clen = (p0 + i + 1) / r;
        for (size_t j = (size_t)(clen < t ? clen : t); j < t; j++)
            sc[i * t + j] = -INFINITY;
    }
    if (cl->candidate_source) {
        unsigned char *cand = realloc(sh->cand, n * t);
        if (cand == NULL) {
            st = fw_nomem(f, "indexer");
            goto out;
        }
        sh->cand = cand;
        for (size_t i = 0; i < n; i++) {
            st = fw_candidates(f, sc + i * t, t, (p0 + i + 1) / r, cand + i * t, bscore, bidx);
            if (st != TD_OK)
                goto out;
        }
        sh->cand_t = t;
        sh->has_cand = 1;
    } else if (cl->uses_candidates && sh->has_cand) {
        if (sh->cand_t != t) {
            td_error("forward: layer %u scores %zu compressed entries against a candidate "
                     "mask of %zu (the reference cannot broadcast them)", l, t, sh->cand_t);
            st = TD_ERR_UNSUPPORTED;
            goto out;
        }
        for (size_t i = 0; i < n * t; i++)
            if (!sh->cand[i])
                sc[i] = -INFINITY;
    }
    for (size_t i = 0; i < n * t; i++)
        sh->bias[i] = -INFINITY;
    if (topk > 0) {
        FW_TRY(f->k->topk(sc, n, t, topk, idx));
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < topk; j++) {
                int64_t e = idx[i * topk + j];
                if (sc[i * t + (size_t)e] > -INFINITY)
                    sh->bias[i * t + (size_t)e] = 0.0f;
            }
    }
    sh->bias_t = t;
    sh->has_bias = 1;

out:
    free(qi);
    free(w);
    free(sc);
    free(idx);
    free(bscore);
    free(bidx);
    free(keys);
    free(ksc);
    return st;
}

/* ---- attention ---------------------------------------------------------------------- */

/* Attention of request s at layer l over its window (ring + this chunk) and
 * the group's compressed KV; writes f->ao rows, then updates the ring. */
static td_status_t
fw_attend(fw_t *f, uint32_t l, size_t s)
{
    const td_modelcfg_layer_t *cl = &f->c->layers[l];
    const td_cache_plan_t *plan = f->m->plan;
    const td_cache_layer_t *sg = &plan->layers[l];
    td_cache_t *cache = f->seqs[s].cache;
    fw_shared_t *sh = &f->sh[s];
    size_t n = f->seqs[s].n, r0 = f->row0[s], hd = f->hd, nh = f->nh;
    size_t wm = plan->window_slots;
    uint64_t p0 = f->p0[s];
    size_t nprev = (size_t)(p0 < wm ? p0 : wm);
    uint64_t kbase = p0 - nprev;              /* position of window key 0 */
    size_t web = td_cache_fmt_bytes(plan->window_fmt, (uint32_t)hd);
    unsigned char *ring = td_cache_fixed(cache, (uint32_t)sg->window);
    float *win = NULL, *keys = NULL, *mask = NULL;
    size_t *sel = NULL;
    td_status_t st = TD_OK;

    win = malloc((nprev + n) * hd * sizeof(float));
    if (win == NULL) {
        st = fw_nomem(f, "attention");
        goto out;
    }
    for (size_t j = 0; j < nprev; j++) {
        st = fw_load_one(f, plan->window_fmt, (uint32_t)hd, ring + ((kbase + j) % wm) * web,
                         win + j * hd);
        if (st != TD_OK)
            goto out;
    }
    memcpy(win + nprev * hd, f->kv + r0 * hd, n * hd * sizeof(float));

    size_t tc = 0;
    const float *bias = NULL;
    if (cl->ratio > 0) {
        if (cl->kv_source) {
            st = fw_compress(f, l, s);
            if (st != TD_OK)
                goto out;
        }
        if (cl->index_source) {
            st = fw_index(f, l, s);
            if (st != TD_OK)
                goto out;
        }
        if (sh->has_comp && sh->ncomp > 0) {
            tc = sh->ncomp;
            if (sh->has_bias) {
                if (sh->bias_t != tc) {
                    td_error("forward: layer %u attends %zu compressed entries with a top-k "
                             "bias of %zu (the reference cannot concatenate them)", l, tc,
                             sh->bias_t);
                    st = TD_ERR_UNSUPPORTED;
                    goto out;
                }
                bias = sh->bias;
            }
        }
    }

    /* Of the compressed entries, a tile reads those some row of it may weigh
     * (its top-k bias is not -inf), in order, straight from the cache: the
     * kernel skips masked keys, so leaving them out changes no bit. */
    size_t tile = n < FW_TILE ? n : FW_TILE;
    keys = malloc((tile + wm + tc) * hd * sizeof(float));
    mask = malloc(tile * (tile + wm + tc) * sizeof(float));
    sel = malloc((tc ? tc : 1) * sizeof(*sel));
    if (keys == NULL || mask == NULL || sel == NULL) {
        st = fw_nomem(f, "attention");
        goto out;
    }
    const float softmax_scale = (float)(1.0 / sqrt((double)hd));
    for (size_t a = 0; a < n; a += tile) {
        size_t bq = a + tile < n ? a + tile : n, nt = bq - a;
        uint64_t lo = p0 + a >= wm ? p0 + a - wm : 0;  /* first window position needed */
        uint64_t hi = p0 + bq;                          /* one past the last */
        size_t tw = (size_t)(hi - lo), ns = 0, tk;
        memcpy(keys, win + (lo - kbase) * hd, tw * hd * sizeof(float));
        for (size_t j = 0; bias != NULL && j < tc; j++) {
            size_t i = 0;
            while (i < nt && bias[(a + i) * tc + j] == -INFINITY)
                i++;
            if (i < nt)
                sel[ns++] = j;
        }
        for (size_t k = 0; k < ns; k++) {
            st = fw_load_one(f, f->m->plan->kv_fmt, (uint32_t)hd,
                             td_cache_entry(cache, (uint32_t)sh->comp_seg, sel[k]),
                             keys + (tw + k) * hd);
            if (st != TD_OK)
                goto out;
        }
        tk = tw + ns;
        for (size_t i = 0; i < nt; i++) {
            uint64_t p = p0 + a + i;
            float *mr = mask + i * tk;
            for (size_t j = 0; j < tw; j++) {
                uint64_t kp = lo + j;
                mr[j] = kp <= p && kp + wm >= p ? 0.0f : -INFINITY;
            }
            for (size_t k = 0; k < ns; k++)
                mr[tw + k] = bias[(a + i) * tc + sel[k]];
        }
        FW_TRY(f->k->attention(f->q + (r0 + a) * nh * hd, keys, mask,
                               f->m->layers[l].attn_sink, softmax_scale, nt, nh, tk, hd,
                               f->ao + (r0 + a) * nh * hd));
    }

    /* the ring keeps the last sliding_window - 1 positions */
    for (size_t i = n > wm ? n - wm : 0; i < n; i++) {
        unsigned char *e = ring + ((p0 + i) % wm) * web;
        if (plan->window_fmt == TD_CACHE_FP8) {
            memcpy(e, f->kv_codes + (r0 + i) * hd, hd);
            memcpy(e + hd, f->kv_scales + (r0 + i) * (hd / TD_CACHE_FP8_BLOCK),
                   hd / TD_CACHE_FP8_BLOCK);
        } else {
            memcpy(e, f->kv + (r0 + i) * hd, hd * sizeof(float));
        }
    }
    st = TD_OK;

out:
    free(win);
    free(keys);
    free(mask);
    free(sel);
    return st;
}

typedef struct {
    fw_t *f;
    uint32_t l;
} fw_attend_job_t;

static void
fw_attend_task(void *arg, size_t s)
{
    fw_attend_job_t *j = arg;
    j->f->seq_st[s] = fw_attend(j->f, j->l, s);
}

static td_status_t
fw_attention(fw_t *f, uint32_t l)
{
    const td_modelcfg_t *c = f->c;
    const td_model_layer_t *L = &f->m->layers[l];
    size_t N = f->N, hd = f->hd, nh = f->nh, ql = (size_t)c->q_lora_rank;
    const float eps = (float)c->rms_norm_eps;
    float rs;
    const float *inv = fw_inv_freq(f, l, &rs);

    FW_CHECK(f->k->linear_mat(f->x, L->wq_a, f->qr, N));
    FW_CHECK(f->k->rmsnorm(f->qr, L->q_norm, eps, N, ql, f->qr));
    FW_CHECK(f->k->linear_mat(f->qr, L->wq_b, f->q, N));
    FW_CHECK(f->k->rope(f->q, N, nh, hd, f->rd, f->pos, inv, rs, 0));
    FW_CHECK(f->k->linear_mat(f->x, L->wkv, f->kv, N));
    FW_CHECK(f->k->rmsnorm(f->kv, L->kv_norm, eps, N, hd, f->kv));
    FW_CHECK(f->k->rope(f->kv, N, 1, hd, f->rd, f->pos, inv, rs, 0));
    if (f->m->plan->window_fmt == TD_CACHE_FP8) {
        FW_CHECK(f->k->quant_fp8(f->kv, N, hd, TD_CACHE_FP8_BLOCK, f->kv_codes, f->kv_scales));
        FW_CHECK(f->k->dequant_fp8(f->kv_codes, f->kv_scales, N, hd, TD_CACHE_FP8_BLOCK, f->kv));
    }
    if (c->layers[l].kv_source) {
        FW_CHECK(f->k->linear_mat(f->x, L->cmp_wkv, f->ckv, N));
        if (c->layers[l].ratio > 1)
            FW_CHECK(f->k->linear_mat(f->x, L->cmp_wgate, f->cg, N));
    }
    /* the requests side by side: each touches only its rows, cache and shared state */
    fw_attend_job_t job = { f, l };
    td_kernels_cpu_parallel(f->nseq, fw_attend_task, &job);
    for (size_t s = 0; s < f->nseq; s++)
        if (f->seq_st[s] != TD_OK)
            return f->seq_st[s];
    FW_CHECK(f->k->rope(f->ao, N, nh, hd, f->rd, f->pos, inv, rs, 1));
    FW_CHECK(f->k->linear_mat(f->ao, L->wo_a, f->oa, N));
    FW_CHECK(f->k->linear_mat(f->oa, L->wo_b, f->y, N));
    return TD_OK;
}

/* ---- MoE --------------------------------------------------------------------------------
 * Four steps. The router (scores, bias, top-k, weights) runs on the token's
 * rank. Dispatch sends each token's hidden vector once to every rank that
 * holds one of its experts (td_placement_route picks the replica), with
 * those experts and their weights. Each rank runs the experts it holds on
 * what it received, grouped by expert. Combine sends every expert's output
 * row back to the token's rank, which sums them in ascending expert id into
 * a zeroed row and then adds the shared expert: the order of the one-rank
 * pass. A row's expert output depends on that row and the expert's weights
 * alone (linear_mat sums in an order fixed by the weights' shape, swiglu is
 * per element), so it is the same bits on whatever rank and in whatever
 * batch it runs, and DEPn gives the one-rank pass's bits. Without a DEP
 * group (or with a group of one) there is nothing to send: the experts run
 * on the pass's rows and add straight into y. */

/* A workspace buffer, grown on demand, never shrunk. */
typedef struct {
    void *p;
    size_t bytes;
} fw_buf_t;

static void *
fw_buf(fw_buf_t *b, size_t bytes)
{
    if (b->p == NULL || bytes > b->bytes) {
        free(b->p);
        b->p = malloc(bytes ? bytes : 1);
        b->bytes = b->p != NULL ? bytes : 0;
    }
    return b->p;
}

enum {
    FW_MB_SC, FW_MB_BIASED, FW_MB_WTS, FW_MB_IDX, FW_MB_SEXP, FW_MB_SWT, FW_MB_XE, FW_MB_YE,
    FW_MB_GE, FW_MB_UE, FW_MB_WE, FW_MB_BUCKET, FW_MB_ORDER, FW_MB_SEND, FW_MB_RECV, FW_MB_AX,
    FW_MB_AW, FW_MB_AE, FW_MB_OUT, FW_MB_BACK, FW_MB_SLOT, FW_MB_DEST, FW_MB_N
};

/* The MoE workspace of a pass: one forward's (td_forward), or kept by a DEP
 * context from pass to pass. N = the pass's rows, R = rows one expert may
 * get, S = expert slots run here. */
struct fw_moe_ws {
    fw_buf_t buf[FW_MB_N];
    float *sc, *biased, *wts;   /* [N, E], [N, E], [N, K] router */
    int64_t *idx;               /* [N, K] */
    int32_t *sexp;              /* [N, K] each token's experts, ascending */
    float *swt;                 /* [N, K] their weights */
    float *xe, *ye, *ge, *ue;   /* [R, H], [R, H], [R, I], [R, I] one expert's rows */
    float *we;                  /* [R] their weights */
    size_t *bucket;             /* [2 E + 1] slots per expert: starts, then cursors */
    size_t *order;              /* [S] slots grouped by expert */
    /* DEP */
    unsigned char *send, *recv; /* dispatch records out, in */
    size_t recv_cap;
    const float **ax;           /* [S] each received slot's hidden vector (in recv) */
    float *aw;                  /* [S] its weight */
    int32_t *ae;                /* [S] its expert */
    size_t scap;                /* S's bound */
    float *out;                 /* [S, H] expert outputs, in arrival order */
    float *back;                /* [N * K, H] outputs back at the token's rank */
    size_t *slot;               /* [N, K] each token's slot's row in back */
    uint32_t *dest;             /* [N, K] each slot's rank */
};

static void
fw_moe_ws_free(fw_moe_ws_t *w)
{
    for (size_t i = 0; i < FW_MB_N; i++)
        free(w->buf[i].p);
    memset(w, 0, sizeof(*w));
}

/* Size the workspace for a pass of N rows in a group whose ranks have tall
 * rows in all (tall = N without a group), size ranks, held experts here. */
static int
fw_moe_ws_reserve(fw_moe_ws_t *w, const td_modelcfg_t *c, size_t N, size_t tall, size_t size,
                  size_t held)
{
    size_t E = (size_t)c->n_routed_experts, K = (size_t)c->num_experts_per_tok;
    size_t H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    size_t kh = K < held ? K : held, kd = K < size ? K : size;
    size_t R = tall, S = size > 1 ? tall * kh : N * K;
    fw_buf_t *b = w->buf;

    w->sc = fw_buf(&b[FW_MB_SC], N * E * sizeof(float));
    w->biased = fw_buf(&b[FW_MB_BIASED], N * E * sizeof(float));
    w->wts = fw_buf(&b[FW_MB_WTS], N * K * sizeof(float));
    w->idx = fw_buf(&b[FW_MB_IDX], N * K * sizeof(int64_t));
    w->sexp = fw_buf(&b[FW_MB_SEXP], N * K * sizeof(int32_t));
    w->swt = fw_buf(&b[FW_MB_SWT], N * K * sizeof(float));
    w->xe = fw_buf(&b[FW_MB_XE], R * H * sizeof(float));
    w->ye = fw_buf(&b[FW_MB_YE], (R > N ? R : N) * H * sizeof(float));
    w->ge = fw_buf(&b[FW_MB_GE], (R > N ? R : N) * I * sizeof(float));
    w->ue = fw_buf(&b[FW_MB_UE], (R > N ? R : N) * I * sizeof(float));
    w->we = fw_buf(&b[FW_MB_WE], R * sizeof(float));
    w->bucket = fw_buf(&b[FW_MB_BUCKET], (2 * E + 1) * sizeof(size_t));
    w->order = fw_buf(&b[FW_MB_ORDER], S * sizeof(size_t));
    w->scap = S;
    if (w->sc == NULL || w->biased == NULL || w->wts == NULL || w->idx == NULL ||
        w->sexp == NULL || w->swt == NULL || w->xe == NULL || w->ye == NULL || w->ge == NULL ||
        w->ue == NULL || w->we == NULL || w->bucket == NULL || w->order == NULL)
        return -1;
    if (size <= 1)
        return 0;
    /* a record: a count, (expert, weight) per slot, the hidden vector; a
     * token sends at most one to each rank */
    w->send = fw_buf(&b[FW_MB_SEND], N * (kd * (4 + 4 * H) + 8 * K));
    w->recv_cap = tall * (4 + 8 * kh + 4 * H);
    w->recv = fw_buf(&b[FW_MB_RECV], w->recv_cap);
    w->ax = fw_buf(&b[FW_MB_AX], S * sizeof(*w->ax));
    w->aw = fw_buf(&b[FW_MB_AW], S * sizeof(float));
    w->ae = fw_buf(&b[FW_MB_AE], S * sizeof(int32_t));
    w->out = fw_buf(&b[FW_MB_OUT], S * H * sizeof(float));
    w->back = fw_buf(&b[FW_MB_BACK], N * K * H * sizeof(float));
    w->slot = fw_buf(&b[FW_MB_SLOT], N * K * sizeof(size_t));
    w->dest = fw_buf(&b[FW_MB_DEST], N * K * sizeof(uint32_t));
    if (w->send == NULL || w->recv == NULL || w->ax == NULL || w->aw == NULL ||
        w->ae == NULL || w->out == NULL || w->back == NULL || w->slot == NULL ||
        w->dest == NULL)
        return -1;
    return 0;
}

/* One rank's side of a DEP group (model.h). */
struct td_forward_dep {
    const td_model_t *m;
    td_comm_t *comm;
    const td_placement_t *p;
    uint32_t rank, size, held;
    fw_moe_ws_t ws;
    uint64_t *ntok;             /* [size] each rank's rows this pass */
    size_t *sbytes, *rbytes;    /* [size] dispatch bytes to / from each rank */
    size_t *cbytes, *cback;     /* [size] combine bytes to each rank, expected from each */
    size_t *first;              /* [size + 1] each source's first received slot */
    _Atomic uint64_t *expert_tokens;   /* [layers, E] rows run by this rank's experts */
    _Atomic uint64_t passes, tokens, dispatch_bytes, combine_bytes;
    _Atomic uint64_t dispatch_remote, combine_remote;   /* of those, to other ranks */
};

/* The router for the pass's rows: ws->sexp / ws->swt get each token's
 * experts in ascending id with their weights (the order of the sum). */
static td_status_t
fw_route(fw_t *f, const td_model_layer_t *L)
{
    const td_modelcfg_t *c = f->c;
    fw_moe_ws_t *w = f->ws;
    size_t N = f->N, E = (size_t)c->n_routed_experts, K = (size_t)c->num_experts_per_tok;
    float *sc = w->sc, *biased = w->biased, *wts = w->wts;
    int64_t *idx = w->idx;

    /* scores from the unbiased logits, selection with the bias */
    FW_CHECK(f->k->linear_mat(f->x, L->gate, sc, N));
    FW_CHECK(f->k->score(sc, N, E,
                         strcmp(c->scoring_func, "sigmoid") == 0 ? TD_KERNELS_SCORE_SIGMOID
                                                                 : TD_KERNELS_SCORE_SQRTSOFTPLUS,
                         (float)c->gate_temp));
    for (size_t r = 0; r < N; r++)
        for (size_t e = 0; e < E; e++)
            biased[r * E + e] = sc[r * E + e] + L->gate_bias[e];
    FW_CHECK(f->k->topk(biased, N, E, K, idx));
    for (size_t r = 0; r < N; r++) {
        float sum = 0.0f;
        for (size_t j = 0; j < K; j++) {
            wts[r * K + j] = sc[r * E + (size_t)idx[r * K + j]];
            sum += wts[r * K + j];
        }
        for (size_t j = 0; j < K; j++) {
            if (c->norm_topk_prob && K > 1)
                wts[r * K + j] = wts[r * K + j] / (sum + 1e-20f);
            wts[r * K + j] *= (float)c->routed_scaling_factor;
        }
        /* the token's experts in ascending id (insertion sort of K pairs) */
        int32_t *se = w->sexp + r * K;
        float *sw = w->swt + r * K;
        for (size_t j = 0; j < K; j++) {
            int32_t e = (int32_t)idx[r * K + j];
            float v = wts[r * K + j];
            size_t i = j;
            for (; i > 0 && se[i - 1] > e; i--) {
                se[i] = se[i - 1];
                sw[i] = sw[i - 1];
            }
            se[i] = e;
            sw[i] = v;
        }
    }
    return TD_OK;
}

/* Group n slots by expert (ae[i]: slot i's expert), stably: slots of
 * expert e are order[bucket[e] .. bucket[e + 1]), in slot order. */
static void
fw_group(const int32_t *ae, size_t n, size_t E, size_t *bucket, size_t *order)
{
    size_t *cur = bucket + E + 1;

    memset(bucket, 0, (E + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++)
        bucket[(size_t)ae[i] + 1]++;
    for (size_t e = 0; e < E; e++) {
        bucket[e + 1] += bucket[e];
        cur[e] = bucket[e];
    }
    for (size_t i = 0; i < n; i++)
        order[cur[ae[i]]++] = i;
}

/* Expert e on the n rows gathered in ws->xe with weights ws->we: ws->ye. */
static td_status_t
fw_expert(const fw_t *f, const td_model_layer_t *L, size_t e, size_t n)
{
    fw_moe_ws_t *w = f->ws;
    size_t I = (size_t)f->c->moe_intermediate_size;

    FW_CHECK(f->k->linear_mat(w->xe, L->w1[e], w->ge, n));
    FW_CHECK(f->k->linear_mat(w->xe, L->w3[e], w->ue, n));
    FW_CHECK(f->k->swiglu(w->ge, w->ue, w->we, n, I, (float)f->c->swiglu_limit, w->ge));
    FW_CHECK(f->k->linear_mat(w->ge, L->w2[e], w->ye, n));
    return TD_OK;
}

/* The shared expert on the pass's rows, added to f->y. */
static td_status_t
fw_shared(fw_t *f, const td_model_layer_t *L)
{
    fw_moe_ws_t *w = f->ws;
    size_t N = f->N, I = (size_t)f->c->moe_intermediate_size;

    FW_CHECK(f->k->linear_mat(f->x, L->sw1, w->ge, N));
    FW_CHECK(f->k->linear_mat(f->x, L->sw3, w->ue, N));
    FW_CHECK(f->k->swiglu(w->ge, w->ue, NULL, N, I, (float)f->c->swiglu_limit, w->ge));
    FW_CHECK(f->k->linear_mat(w->ge, L->sw2, w->ye, N));
    FW_CHECK(f->k->add(f->y, w->ye, N * f->H));
    return TD_OK;
}

static void
fw_count(fw_t *f, uint32_t l, size_t e, size_t n)
{
    if (f->dep != NULL)
        atomic_fetch_add_explicit(
            &f->dep->expert_tokens[(size_t)l * (size_t)f->c->n_routed_experts + e], n,
            memory_order_relaxed);
}

/* Every expert on the pass's own rows, added into y in ascending expert id. */
static td_status_t
fw_moe_local(fw_t *f, uint32_t l)
{
    const td_model_layer_t *L = &f->m->layers[l];
    fw_moe_ws_t *w = f->ws;
    size_t N = f->N, H = f->H, E = (size_t)f->c->n_routed_experts;
    size_t K = (size_t)f->c->num_experts_per_tok;

    fw_group(w->sexp, N * K, E, w->bucket, w->order);
    memset(f->y, 0, N * H * sizeof(float));
    for (size_t e = 0; e < E; e++) {
        size_t n = w->bucket[e + 1] - w->bucket[e];
        const size_t *sl = w->order + w->bucket[e];
        if (n == 0)
            continue;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->xe + i * H, f->x + sl[i] / K * H, H * sizeof(float));
            w->we[i] = w->swt[sl[i]];
        }
        FW_CHECK(fw_expert(f, L, e, n));
        for (size_t i = 0; i < n; i++)
            FW_CHECK(f->k->add(f->y + sl[i] / K * H, w->ye + i * H, H));
        fw_count(f, l, e, n);
    }
    return fw_shared(f, L);
}

/* A dispatch record from a peer that breaks the format: its status. */
static td_status_t
fw_bad_record(const fw_t *f, uint32_t l, uint32_t src, const char *why)
{
    td_error("forward: layer %u: rank %u's dispatch to rank %u: %s", l, src, f->dep->rank, why);
    return TD_ERR_PROTO;
}

/* Dispatch: pack the records of this rank's tokens, rank by rank, and
 * exchange them. A record is u32 c, c x (i32 expert, f32 weight) in
 * ascending expert id, then the H floats of the token's hidden vector; a
 * token's records go out in row order. ws->slot says where each slot's
 * output will be in what combine brings back (packed by rank, then in the
 * order sent); dep->cback the bytes expected from each rank. */
static td_status_t
fw_dispatch(fw_t *f)
{
    td_forward_dep_t *d = f->dep;
    fw_moe_ws_t *w = f->ws;
    size_t N = f->N, H = f->H, K = (size_t)f->c->num_experts_per_tok;
    unsigned char *p = w->send;
    size_t slots = 0, total = 0;

    for (size_t r = 0; r < N; r++)
        for (size_t j = 0; j < K; j++)
            w->dest[r * K + j] = td_placement_route(d->p, (uint32_t)w->sexp[r * K + j], d->rank,
                                                    r);
    for (uint32_t to = 0; to < d->size; to++) {
        unsigned char *start = p;
        size_t first = slots;
        for (size_t r = 0; r < N; r++) {
            uint32_t c = 0;
            for (size_t j = 0; j < K; j++)
                c += w->dest[r * K + j] == to;
            if (c == 0)
                continue;
            memcpy(p, &c, 4);
            p += 4;
            for (size_t j = 0; j < K; j++) {
                if (w->dest[r * K + j] != to)
                    continue;
                memcpy(p, &w->sexp[r * K + j], 4);
                memcpy(p + 4, &w->swt[r * K + j], 4);
                p += 8;
                w->slot[r * K + j] = slots++;
            }
            memcpy(p, f->x + r * H, H * sizeof(float));
            p += H * sizeof(float);
        }
        d->sbytes[to] = (size_t)(p - start);
        d->cback[to] = (slots - first) * H * sizeof(float);
        total += d->sbytes[to];
    }
    atomic_fetch_add_explicit(&d->dispatch_bytes, total, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->dispatch_remote, total - d->sbytes[d->rank],
                              memory_order_relaxed);
    return td_comm_alltoallv(d->comm, w->send, d->sbytes, w->recv, w->recv_cap, d->rbytes);
}

/* Read what dispatch brought: every slot's hidden vector, weight and
 * expert (ws->ax, aw, ae), by source rank then in the order sent; checks
 * every record (bytes from a peer). *nslots: the slots. */
static td_status_t
fw_receive(fw_t *f, uint32_t l, size_t *nslots)
{
    td_forward_dep_t *d = f->dep;
    fw_moe_ws_t *w = f->ws;
    size_t H = f->H, K = (size_t)f->c->num_experts_per_tok;
    size_t E = (size_t)f->c->n_routed_experts, S = 0;
    const unsigned char *q = w->recv;

    for (uint32_t src = 0; src < d->size; src++) {
        const unsigned char *end = q + d->rbytes[src];
        d->first[src] = S;
        while (q < end) {
            uint32_t c;
            if ((size_t)(end - q) < 4)
                return fw_bad_record(f, l, src, "a truncated record");
            memcpy(&c, q, 4);
            if (c == 0 || c > K || (size_t)(end - q) < 4 + 8 * (size_t)c + 4 * H)
                return fw_bad_record(f, l, src, "a record of a bad expert count or size");
            if (S + c > w->scap)
                return fw_bad_record(f, l, src, "more expert slots than its tokens can have");
            const float *x = (const float *)(const void *)(q + 4 + 8 * (size_t)c);
            for (uint32_t j = 0; j < c; j++) {
                int32_t e;
                memcpy(&e, q + 4 + 8 * (size_t)j, 4);
                memcpy(&w->aw[S], q + 8 + 8 * (size_t)j, 4);
                if (e < 0 || (size_t)e >= E || !f->m->expert_held[e] ||
                    !td_placement_holds(d->p, d->rank, (uint32_t)e) ||
                    (j > 0 && e <= w->ae[S - 1]))
                    return fw_bad_record(f, l, src, "an expert this rank does not hold, or "
                                         "experts out of order");
                w->ae[S] = e;
                w->ax[S] = x;
                S++;
            }
            q += 4 + 8 * (size_t)c + 4 * H;
        }
    }
    d->first[d->size] = S;
    *nslots = S;
    return TD_OK;
}

/* The four steps on one rank of a DEP group (f->N may be 0). */
static td_status_t
fw_moe_dep(fw_t *f, uint32_t l)
{
    const td_model_layer_t *L = &f->m->layers[l];
    td_forward_dep_t *d = f->dep;
    fw_moe_ws_t *w = f->ws;
    size_t N = f->N, H = f->H, E = (size_t)f->c->n_routed_experts;
    size_t K = (size_t)f->c->num_experts_per_tok, S = 0, total = 0;
    td_status_t st;

    if (N > 0)
        FW_CHECK(fw_route(f, L));
    st = fw_dispatch(f);
    if (st != TD_OK)
        return st;   /* the communicator logged why */
    FW_CHECK(fw_receive(f, l, &S));

    /* the experts this rank holds, on what came, grouped by expert */
    fw_group(w->ae, S, E, w->bucket, w->order);
    for (size_t e = 0; e < E; e++) {
        size_t n = w->bucket[e + 1] - w->bucket[e];
        const size_t *sl = w->order + w->bucket[e];
        if (n == 0)
            continue;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->xe + i * H, w->ax[sl[i]], H * sizeof(float));
            w->we[i] = w->aw[sl[i]];
        }
        FW_CHECK(fw_expert(f, L, e, n));
        for (size_t i = 0; i < n; i++)
            memcpy(w->out + sl[i] * H, w->ye + i * H, H * sizeof(float));
        fw_count(f, l, e, n);
    }

    /* combine: each source's outputs back, in the order it sent them */
    for (uint32_t src = 0; src < d->size; src++) {
        d->cbytes[src] = (d->first[src + 1] - d->first[src]) * H * sizeof(float);
        total += d->cbytes[src];
    }
    atomic_fetch_add_explicit(&d->combine_bytes, total, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->combine_remote, total - d->cbytes[d->rank],
                              memory_order_relaxed);
    st = td_comm_alltoallv(d->comm, w->out, d->cbytes, w->back, N * K * H * sizeof(float),
                           d->rbytes);
    if (st != TD_OK)
        return st;
    for (uint32_t r = 0; r < d->size; r++)
        if (d->rbytes[r] != d->cback[r]) {
            td_error("forward: layer %u: rank %u sent %zu bytes of expert outputs back to rank "
                     "%u, %zu expected", l, r, d->rbytes[r], d->rank, d->cback[r]);
            return TD_ERR_PROTO;
        }
    if (N == 0)
        return TD_OK;
    memset(f->y, 0, N * H * sizeof(float));
    for (size_t r = 0; r < N; r++)
        for (size_t j = 0; j < K; j++)   /* ascending expert id: the one-rank order */
            FW_CHECK(f->k->add(f->y + r * H, w->back + w->slot[r * K + j] * H, H));
    return fw_shared(f, L);
}

static td_status_t
fw_moe(fw_t *f, uint32_t l)
{
    if (f->dep != NULL && f->dep->size > 1)
        return fw_moe_dep(f, l);
    if (f->N == 0)
        return TD_OK;
    FW_CHECK(fw_route(f, &f->m->layers[l]));
    return fw_moe_local(f, l);
}

/* ---- the layer and the model ----------------------------------------------------------- */

/* The streams become the residual R; S takes the site's output. */
static void
fw_swap_streams(fw_t *f)
{
    float *t = f->S;
    f->S = f->R;
    f->R = t;
}

/* (pre, post, comb) of one hc site from the streams (in f->R). */
static td_status_t
fw_hc_mixes(fw_t *f, const td_kernels_mat_t *fn, const float *scale, const float *base,
            float *pre, float *post, float *comb)
{
    size_t N = f->N, hc = f->hc, H = f->H;

    FW_CHECK(f->k->rmsnorm(f->R, NULL, (float)f->c->rms_norm_eps, N, hc * H, f->flat));
    FW_CHECK(f->k->linear_mat(f->flat, fn, f->mixes, N));
    FW_CHECK(f->k->hc_mixes(f->mixes, scale, base, N, hc, (int)f->c->hc_sinkhorn_iters,
                            (float)f->c->hc_eps, pre, post, comb));
    return TD_OK;
}

static td_status_t
fw_layer(fw_t *f, uint32_t l)
{
    const td_model_layer_t *L = &f->m->layers[l];
    size_t N = f->N, hc = f->hc, H = f->H;
    const float eps = (float)f->c->rms_norm_eps;
    td_status_t st;

    if (f->c->layers[l].engram >= 0) {
        st = fw_engram(f, l);
        if (st != TD_OK)
            return st;
    }
    fw_swap_streams(f);   /* R: the residual (the streams so far); S: the site's output */
    st = fw_hc_mixes(f, L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, f->a_pre, f->a_post,
                     f->a_comb);
    if (st != TD_OK)
        return st;
    FW_CHECK(f->k->hc_collapse(f->R, f->pre_in, N, hc, H, f->x));
    FW_CHECK(f->k->rmsnorm(f->x, L->attn_norm, eps, N, H, f->x));
    st = fw_attention(f, l);
    if (st != TD_OK)
        return st;
    FW_CHECK(f->k->hc_expand(f->y, f->R, f->a_post, f->a_comb, N, hc, H, f->S));

    fw_swap_streams(f);
    st = fw_hc_mixes(f, L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base, f->f_pre, f->f_post,
                     f->f_comb);
    if (st != TD_OK)
        return st;
    FW_CHECK(f->k->hc_collapse(f->R, f->a_pre, N, hc, H, f->x));
    FW_CHECK(f->k->rmsnorm(f->x, L->ffn_norm, eps, N, H, f->x));
    st = fw_moe(f, l);
    if (st != TD_OK)
        return st;
    FW_CHECK(f->k->hc_expand(f->y, f->R, f->f_post, f->f_comb, N, hc, H, f->S));
    memcpy(f->pre_in, f->f_pre, N * hc * sizeof(float));
    return TD_OK;
}

static td_status_t
fw_check_args(const td_model_t *m, const td_forward_dep_t *dep, const td_forward_seq_t *seqs,
              size_t nseqs)
{
    const td_modelcfg_t *c = m->cfg;

    if ((dep == NULL || dep->size <= 1) && m->experts_held < (uint32_t)c->n_routed_experts) {
        td_error("forward: the model holds %u of %lld experts (loaded for one rank of a DEP "
                 "group): its passes go through td_forward_dep", m->experts_held,
                 (long long)c->n_routed_experts);
        return TD_ERR_INVALID;
    }
    if (seqs == NULL || nseqs == 0) {
        td_error("forward: no sequences");
        return TD_ERR_INVALID;
    }
    for (size_t s = 0; s < nseqs; s++) {
        const td_forward_seq_t *q = &seqs[s];
        if (q->cache == NULL || q->tokens == NULL || q->n == 0) {
            td_error("forward: sequence %zu: no cache, no tokens or n = 0", s);
            return TD_ERR_INVALID;
        }
        if (q->cache->plan != m->plan) {
            td_error("forward: sequence %zu: the cache belongs to another model", s);
            return TD_ERR_INVALID;
        }
        for (size_t o = 0; o < s; o++)   /* two views of one memory are one cache */
            if (td_cache_fixed(seqs[o].cache, (uint32_t)m->plan->counters) ==
                td_cache_fixed(q->cache, (uint32_t)m->plan->counters)) {
                td_error("forward: sequences %zu and %zu share one cache", o, s);
                return TD_ERR_INVALID;
            }
        uint64_t have = td_cache_tokens(q->cache);
        if (have > q->cache->capacity || q->n > q->cache->capacity - have) {
            td_error("forward: sequence %zu: %zu tokens after %llu exceed the cache's "
                     "capacity of %llu", s, q->n, (unsigned long long)have,
                     (unsigned long long)q->cache->capacity);
            return TD_ERR_RANGE;
        }
        for (size_t i = 0; i < q->n; i++) {
            int32_t t = q->tokens[i];
            if (t < 0 || t >= c->vocab_size ||
                (m->engram.token_map != NULL && (uint32_t)t >= m->engram.map_size)) {
                td_error("forward: sequence %zu: token %zu is id %d, outside the vocabulary "
                         "of %lld", s, i, t, (long long)c->vocab_size);
                return TD_ERR_RANGE;
            }
        }
    }
    return TD_OK;
}

static td_status_t
fw_alloc(fw_t *f)
{
    const td_modelcfg_t *c = f->c;
    size_t N = f->N, H = f->H, hc = f->hc, hd = f->hd, nh = f->nh;
    size_t nm = (2 + hc) * hc;

    f->row0 = fw_calloc(f->nseq, sizeof(*f->row0));
    f->p0 = fw_calloc(f->nseq, sizeof(*f->p0));
    f->pos = fw_calloc(N, sizeof(*f->pos));
    f->sh = fw_calloc(f->nseq, sizeof(*f->sh));
    f->seq_st = fw_calloc(f->nseq, sizeof(*f->seq_st));
    f->S = fw_calloc(N * hc * H, sizeof(float));
    f->R = fw_calloc(N * hc * H, sizeof(float));
    f->flat = fw_calloc(N * hc * H, sizeof(float));
    f->mixes = fw_calloc(N * nm, sizeof(float));
    f->pre_in = fw_calloc(N * hc, sizeof(float));
    f->a_pre = fw_calloc(N * hc, sizeof(float));
    f->a_post = fw_calloc(N * hc, sizeof(float));
    f->a_comb = fw_calloc(N * hc * hc, sizeof(float));
    f->f_pre = fw_calloc(N * hc, sizeof(float));
    f->f_post = fw_calloc(N * hc, sizeof(float));
    f->f_comb = fw_calloc(N * hc * hc, sizeof(float));
    f->x = fw_calloc(N * H, sizeof(float));
    f->y = fw_calloc(N * H, sizeof(float));
    f->qr = fw_calloc(N * (size_t)c->q_lora_rank, sizeof(float));
    f->q = fw_calloc(N * nh * hd, sizeof(float));
    f->ao = fw_calloc(N * nh * hd, sizeof(float));
    f->kv = fw_calloc(N * hd, sizeof(float));
    f->ckv = fw_calloc(N * hd, sizeof(float));
    f->cg = fw_calloc(N * hd, sizeof(float));
    f->kv_codes = fw_calloc(N * hd, 1);
    f->kv_scales = fw_calloc(N * (hd / TD_CACHE_FP8_BLOCK + 1), 1);
    f->oa = fw_calloc(N * (size_t)(c->o_groups * c->o_lora_rank), sizeof(float));
    if (f->row0 == NULL || f->p0 == NULL || f->pos == NULL || f->sh == NULL ||
        f->seq_st == NULL || f->S == NULL ||
        f->R == NULL || f->flat == NULL || f->mixes == NULL || f->pre_in == NULL ||
        f->a_pre == NULL || f->a_post == NULL || f->a_comb == NULL || f->f_pre == NULL ||
        f->f_post == NULL || f->f_comb == NULL || f->x == NULL || f->y == NULL ||
        f->qr == NULL || f->q == NULL || f->ao == NULL || f->kv == NULL || f->ckv == NULL ||
        f->cg == NULL || f->kv_codes == NULL || f->kv_scales == NULL || f->oa == NULL)
        return TD_ERR_NOMEM;
    if (c->engram_layer_ids.n > 0) {
        size_t nb = (size_t)c->engram_max_ngram_size;
        size_t cols = (nb - 1) * (size_t)c->engram_n_heads;
        f->back = fw_calloc(N * nb, sizeof(*f->back));
        f->hid = fw_calloc(N * cols, sizeof(*f->hid));
        f->emb = fw_calloc(N * cols * (size_t)c->engram_head_dim, sizeof(float));
        f->kvx = fw_calloc(N * H * (hc + 1), sizeof(float));
        f->ekey = fw_calloc(N * hc * H, sizeof(float));
        f->eval = fw_calloc(N * H, sizeof(float));
        if (f->back == NULL || f->hid == NULL || f->emb == NULL || f->kvx == NULL ||
            f->ekey == NULL || f->eval == NULL)
            return TD_ERR_NOMEM;
    }
    size_t at = 0;
    for (size_t s = 0; s < f->nseq; s++) {
        f->row0[s] = at;
        f->p0[s] = td_cache_tokens(f->seqs[s].cache);
        for (size_t i = 0; i < f->seqs[s].n; i++)
            f->pos[at + i] = (int64_t)(f->p0[s] + i);
        at += f->seqs[s].n;
    }
    return TD_OK;
}

static void
fw_free(fw_t *f)
{
    if (f->sh != NULL)
        for (size_t s = 0; s < f->nseq; s++) {
            free(f->sh[s].bias);
            free(f->sh[s].cand);
        }
    void *bufs[] = { f->row0, f->p0, f->pos, f->sh, f->seq_st, f->S, f->R, f->flat, f->mixes,
                     f->pre_in, f->a_pre, f->a_post, f->a_comb, f->f_pre, f->f_post,
                     f->f_comb, f->x, f->y, f->qr, f->q, f->ao, f->kv, f->ckv, f->cg,
                     f->kv_codes, f->kv_scales, f->oa, f->back, f->hid, f->emb, f->kvx,
                     f->ekey, f->eval };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
}

/* The final collapse, norm and head for the rows that want logits. */
static td_status_t
fw_logits(fw_t *f)
{
    const td_modelcfg_t *c = f->c;
    size_t H = f->H;

    FW_CHECK(f->k->hc_collapse(f->S, f->pre_in, f->N, f->hc, H, f->x));
    FW_CHECK(f->k->rmsnorm(f->x, f->m->norm, (float)c->rms_norm_eps, f->N, H, f->x));
    for (size_t s = 0; s < f->nseq; s++) {
        const td_forward_seq_t *q = &f->seqs[s];
        if (q->logits == NULL)
            continue;
        size_t first = q->all_logits ? 0 : q->n - 1, rows = q->n - first;
        FW_CHECK(f->k->linear_mat(f->x + (f->row0[s] + first) * H, f->m->head, q->logits,
                                  rows));
    }
    return TD_OK;
}

/* After the last layer: each cache's engram look-back takes the pass's
 * last tokens and its counter the new length (nothing of the pass reads
 * either again: the look-back was read into f->back first). */
static void
fw_finish_caches(fw_t *f)
{
    const td_cache_plan_t *plan = f->m->plan;

    for (size_t s = 0; s < f->nseq; s++) {
        const td_forward_seq_t *q = &f->seqs[s];

        if (plan->engram >= 0) {
            unsigned char *ring = td_cache_fixed(q->cache, (uint32_t)plan->engram);
            size_t slots = plan->engram_slots, n = q->n;
            for (size_t i = n > slots ? n - slots : 0; i < n; i++)
                memcpy(ring + (f->p0[s] + i) % slots * sizeof(int32_t), &q->tokens[i],
                       sizeof(int32_t));
        }
        td_cache_set_tokens(q->cache, f->p0[s] + q->n);
    }
}

/* The rows of every rank of f's DEP group (an all-gather of each one's
 * count): f->tall, the bound of what this rank's experts may get. */
static td_status_t
fw_dep_begin(fw_t *f)
{
    td_forward_dep_t *d = f->dep;
    uint64_t mine = f->N;

    f->tall = f->N;
    if (d == NULL || d->size <= 1)
        return TD_OK;
    td_status_t st = td_comm_allgather(d->comm, &mine, sizeof(mine), d->ntok);
    if (st != TD_OK)
        return st;   /* the communicator logged why */
    f->tall = 0;
    for (uint32_t r = 0; r < d->size; r++) {
        if (d->ntok[r] > (uint64_t)1 << 32) {
            td_error("forward: rank %u of the DEP group announces %llu rows", r,
                     (unsigned long long)d->ntok[r]);
            return TD_ERR_PROTO;
        }
        f->tall += (size_t)d->ntok[r];
    }
    return TD_OK;
}

/* One pass: td_forward (dep NULL) or one rank's td_forward_dep (nseqs may
 * then be 0: the rank only serves its experts at each MoE layer). */
static td_status_t
fw_run(const td_model_t *m, td_forward_dep_t *dep, td_forward_seq_t *seqs, size_t nseqs,
       td_forward_layer_fn fn, void *arg)
{
    fw_t f;
    fw_moe_ws_t own;
    td_status_t st;
    bool counted = false;

    memset(&f, 0, sizeof(f));
    memset(&own, 0, sizeof(own));
    st = nseqs > 0 || dep == NULL ? fw_check_args(m, dep, seqs, nseqs) : TD_OK;
    if (st != TD_OK)
        return st;
    f.m = m;
    f.dep = dep;
    f.ws = dep != NULL ? &dep->ws : &own;
    f.c = m->cfg;
    f.k = m->ops;
    f.seqs = seqs;
    f.nseq = nseqs;
    for (size_t s = 0; s < nseqs; s++)
        f.N += seqs[s].n;
    f.H = (size_t)m->cfg->hidden_size;
    f.hc = (size_t)m->cfg->hc_mult;
    f.hd = (size_t)m->cfg->head_dim;
    f.nh = (size_t)m->cfg->num_attention_heads;
    f.rd = (size_t)m->cfg->qk_rope_head_dim;
    st = fw_dep_begin(&f);
    if (st != TD_OK)
        goto out;
    if (fw_moe_ws_reserve(f.ws, f.c, f.N, f.tall, dep != NULL ? dep->size : 1,
                          dep != NULL ? dep->held : (size_t)m->cfg->n_routed_experts) != 0) {
        st = fw_nomem(&f, "the experts' workspace");
        goto out;
    }
    if (dep != NULL) {
        counted = true;   /* the pass is counted at its end, below */
        atomic_fetch_add_explicit(&dep->tokens, f.N, memory_order_relaxed);
    }
    if (f.N == 0) {   /* a rank of a DEP group without rows: its experts only */
        for (uint32_t l = 0, nl = (uint32_t)m->cfg->num_hidden_layers; l < nl && st == TD_OK;
             l++)
            st = fw_moe(&f, l);
        goto out;
    }
    st = fw_alloc(&f);
    if (st != TD_OK) {
        fw_nomem(&f, "the pass's buffers");
        goto out;
    }
    if (m->plan->engram >= 0) {
        st = fw_engram_back(&f);
        if (st != TD_OK)
            goto out;
    }

    /* embedding into every stream; the first site collapses stream 0 */
    for (size_t s = 0, r = 0; s < nseqs; s++)
        for (size_t i = 0; i < seqs[s].n; i++, r++)
            f.pos[r] = (int64_t)(f.p0[s] + i);
    {
        int64_t *ids = malloc(f.N * sizeof(int64_t));
        if (ids == NULL) {
            st = fw_nomem(&f, "embedding");
            goto out;
        }
        for (size_t s = 0, r = 0; s < nseqs; s++)
            for (size_t i = 0; i < seqs[s].n; i++, r++)
                ids[r] = seqs[s].tokens[i];
        st = m->ops->embed(m->embed, (size_t)m->cfg->vocab_size, f.H, ids, f.N, f.x);
        free(ids);
        if (st != TD_OK)
            goto out;   /* the op logged why */
    }
    for (size_t r = 0; r < f.N; r++) {
        for (size_t j = 0; j < f.hc; j++)
            memcpy(f.S + (r * f.hc + j) * f.H, f.x + r * f.H, f.H * sizeof(float));
        f.pre_in[r * f.hc] = 1.0f;
    }

    for (uint32_t l = 0, nl = (uint32_t)m->cfg->num_hidden_layers; l < nl; l++) {
        st = fw_layer(&f, l);
        if (st != TD_OK)
            goto out;
        if (l + 1 == nl)
            fw_finish_caches(&f);   /* the last layer's segments: look-back, counters */
        if (fn != NULL) {
            td_forward_done_t done = { l, seqs, nseqs, f.p0 };
            st = fn(&done, arg);
            if (st != TD_OK)
                goto out;
        }
    }
    st = fw_logits(&f);

out:
    /* After its rows are in the per-expert counters: a reader that sees the
     * count of passes (acquire) sees every row of those passes, and the last
     * pass's rows are always followed by a change of the count. */
    if (counted)
        atomic_fetch_add_explicit(&dep->passes, 1, memory_order_release);
    fw_free(&f);
    fw_moe_ws_free(&own);
    return st;
}

td_status_t
td_forward(const td_model_t *m, td_forward_seq_t *seqs, size_t nseqs, td_forward_layer_fn fn,
           void *arg)
{
    return fw_run(m, NULL, seqs, nseqs, fn, arg);
}

/* ---- DEPn: one rank's context ------------------------------------------------------------ */

td_status_t
td_forward_dep_create(const td_model_t *m, td_comm_t *comm, const td_placement_t *p,
                      td_forward_dep_t **out)
{
    const td_modelcfg_t *c = m->cfg;
    uint32_t E = (uint32_t)c->n_routed_experts, size = td_comm_size(comm);
    uint32_t rank = td_comm_rank(comm);
    size_t nl = (size_t)c->num_hidden_layers;

    if (td_placement_experts(p) != E || td_placement_ranks(p) != size) {
        td_error("forward: a placement of %u experts over %u ranks for a group of %u ranks and "
                 "a model of %u experts", td_placement_experts(p), td_placement_ranks(p), size,
                 E);
        return TD_ERR_INVALID;
    }
    for (uint32_t e = 0; e < E; e++)
        if (td_placement_holds(p, rank, e) && !m->expert_held[e]) {
            td_error("forward: rank %u holds expert %u by the placement, but its model was "
                     "loaded without it", rank, e);
            return TD_ERR_INVALID;
        }
    td_forward_dep_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        goto nomem;
    d->m = m;
    d->comm = comm;
    d->p = p;
    d->rank = rank;
    d->size = size;
    d->held = td_placement_held(p, rank);
    d->ntok = calloc(size, sizeof(*d->ntok));
    d->sbytes = calloc(size, sizeof(size_t));
    d->rbytes = calloc(size, sizeof(size_t));
    d->cbytes = calloc(size, sizeof(size_t));
    d->cback = calloc(size, sizeof(size_t));
    d->first = calloc((size_t)size + 1, sizeof(size_t));
    d->expert_tokens = calloc(nl * E, sizeof(*d->expert_tokens));
    if (d->ntok == NULL || d->sbytes == NULL || d->rbytes == NULL || d->cbytes == NULL ||
        d->cback == NULL || d->first == NULL || d->expert_tokens == NULL) {
        td_forward_dep_destroy(d);
        goto nomem;
    }
    for (size_t i = 0; i < nl * E; i++)
        atomic_init(&d->expert_tokens[i], 0);
    atomic_init(&d->passes, 0);
    atomic_init(&d->tokens, 0);
    atomic_init(&d->dispatch_bytes, 0);
    atomic_init(&d->combine_bytes, 0);
    atomic_init(&d->dispatch_remote, 0);
    atomic_init(&d->combine_remote, 0);
    *out = d;
    return TD_OK;
nomem:
    td_error("forward: rank %u of %u: out of memory for the DEP context", rank, size);
    return TD_ERR_NOMEM;
}

void
td_forward_dep_destroy(td_forward_dep_t *d)
{
    if (d == NULL)
        return;
    fw_moe_ws_free(&d->ws);
    free(d->ntok);
    free(d->sbytes);
    free(d->rbytes);
    free(d->cbytes);
    free(d->cback);
    free(d->first);
    free(d->expert_tokens);
    free(d);
}

td_status_t
td_forward_dep(td_forward_dep_t *d, td_forward_seq_t *seqs, size_t nseqs,
               td_forward_layer_fn fn, void *arg)
{
    td_status_t st = td_comm_status(d->comm);

    if (st != TD_OK) {
        td_error("forward: rank %u of %u: the DEP group's communicator is broken (%s)",
                 d->rank, d->size, td_status_str(st));
        return st;
    }
    st = fw_run(d->m, d, seqs, nseqs, fn, arg);
    if (st != TD_OK && d->size > 1)
        td_comm_abort(d->comm, st);   /* the other ranks stop at their next collective */
    return st;
}

void
td_forward_dep_stats(const td_forward_dep_t *d, td_forward_dep_stats_t *out)
{
    out->passes = atomic_load_explicit(&d->passes, memory_order_acquire);
    out->tokens = atomic_load_explicit(&d->tokens, memory_order_relaxed);
    out->dispatch_bytes = atomic_load_explicit(&d->dispatch_bytes, memory_order_relaxed);
    out->combine_bytes = atomic_load_explicit(&d->combine_bytes, memory_order_relaxed);
    out->dispatch_remote = atomic_load_explicit(&d->dispatch_remote, memory_order_relaxed);
    out->combine_remote = atomic_load_explicit(&d->combine_remote, memory_order_relaxed);
}

void
td_forward_dep_expert_tokens(const td_forward_dep_t *d, uint64_t *out)
{
    size_t n = (size_t)d->m->cfg->num_hidden_layers * (size_t)d->m->cfg->n_routed_experts;

    for (size_t i = 0; i < n; i++)
        out[i] = atomic_load_explicit(&d->expert_tokens[i], memory_order_relaxed);
}

td_status_t
td_forward_prefill(const td_model_t *m, td_cache_t *c, const int32_t *tokens, size_t n,
                   int all_logits, float *logits)
{
    td_forward_seq_t s = { c, tokens, n, logits, all_logits, 0 };
    return td_forward(m, &s, 1, NULL, NULL);
}

td_status_t
td_forward_decode(const td_model_t *m, td_cache_t *const *caches, const int32_t *tokens,
                  size_t n, float *logits)
{
    td_status_t st;

    if (caches == NULL || tokens == NULL || n == 0) {
        td_error("forward: decode of %zu requests without caches or tokens", n);
        return TD_ERR_INVALID;
    }
    td_forward_seq_t *s = calloc(n, sizeof(*s));
    if (s == NULL) {
        td_error("forward: decode of %zu requests: out of memory", n);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        s[i].cache = caches[i];
        s[i].tokens = &tokens[i];
        s[i].n = 1;
        s[i].logits = logits ? logits + i * (size_t)m->cfg->vocab_size : NULL;
        s[i].all_logits = 0;
    }
    st = td_forward(m, s, n, NULL, NULL);
    free(s);
    return st;
}
