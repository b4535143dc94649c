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

#include "fwspace.h"
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
    /* The top-k block bias as lists: row i's bias is 0 at the entries
     * tk[i, 0 .. ntk[i]) (each chosen with a score above -inf) and -inf
     * elsewhere of its bias_t entries. */
    int32_t *tk;              /* [n, index_topk] */
    uint32_t *ntk;            /* [n] */
    size_t bias_t;
    int has_bias;
    /* The candidate mask of the two-level top-k as lists: row i keeps the
     * entries of the blocks cb[i, 0 .. ncb[i]) of cand_t entries. */
    int32_t *cb;              /* [n, candidate_topk_blocks] */
    uint32_t *ncb;            /* [n] */
    size_t cand_t;
    int has_cand;
} fw_shared_t;

/* One forward call. */
typedef struct {
    const td_model_t *m;
    td_forward_dep_t *dep;    /* NULL: no DEP group */
    fw_moe_ws_t *ws;          /* the MoE workspace */
    size_t tall;              /* rows of every rank of the DEP group (N without one) */
    const td_modelcfg_t *c;
    const td_cache_plan_t *plan;
    const td_kernels_ops_t *k;
    td_forward_seq_t *seqs;
    size_t nseq;
    size_t N;                 /* rows */
    size_t *row0;             /* [nseq] first row of each request */
    uint64_t *p0;             /* [nseq] the request's position before this call */
    int64_t *pos;             /* [N] absolute positions */
    fw_shared_t *sh;          /* [nseq] */
    td_status_t *seq_st;      /* [nseq] each request's attention status */
    td_fwspace_t *sspace;     /* [nslots] scratch of the attention, compressor and indexer */
    atomic_uchar *busy;       /* [nslots] 1 while a request's attention holds the slot */
    size_t nslots;            /* requests attending at once: min(nseq, the pool's threads) */
    int64_t *ids;             /* [N] the tokens, for the embedding */
    size_t H, hc, hd, nh, rd;
    uint64_t shape_T;         /* seqs NULL (td_forward_workspace_bytes): every request's tokens */

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

/* bytes from request scratch sp; NULL (logged) when the workspace's bound
 * (fw_seq_scratch) was wrong: a bug, never input. */
static void *
fw_take(const fw_t *f, td_fwspace_t *sp, size_t bytes)
{
    void *p = td_fwspace_take(sp, bytes);
    if (p == NULL)
        td_error("forward: a request's scratch of %zu bytes is too small (%zu rows)", sp->cap,
                 f->N);
    return p;
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
fw_fake_quant(const fw_t *f, td_fwspace_t *sp, td_cache_fmt_t fmt, uint32_t dim, float *x,
              size_t n)
{
    if (fmt == TD_CACHE_F32)
        return TD_OK;
    size_t mark = sp->used;
    unsigned char *tmp = fw_take(f, sp, td_cache_fmt_bytes(fmt, dim));
    if (tmp == NULL)
        return TD_ERR_INTERNAL;
    td_status_t st = TD_OK;
    for (size_t i = 0; i < n && st == TD_OK; i++) {
        st = fw_store_one(f, fmt, dim, x + i * dim, tmp);
        if (st == TD_OK)
            st = fw_load_one(f, fmt, dim, tmp, x + i * dim);
    }
    sp->used = mark;
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
    FW_CHECK(f->k->embed_fmt(&L->eg_table, L->eg_rows, ed, f->hid, N * cols, f->emb));
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
fw_compress(fw_t *f, uint32_t l, size_t s, td_fwspace_t *sp)
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
    size_t mark = sp->used;

    if (r == 1) {
        G = n;
        lat = fw_take(f, sp, G * hd * sizeof(float));
        gpos = fw_take(f, sp, G * sizeof(int64_t));
        if (lat == NULL || gpos == NULL) {
            st = TD_ERR_INTERNAL;
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
        kvb = fw_take(f, sp, tot * hd * sizeof(float));
        gb = fw_take(f, sp, tot * hd * sizeof(float));
        lat = fw_take(f, sp, (G ? G : 1) * hd * sizeof(float));
        gpos = fw_take(f, sp, (G ? G : 1) * sizeof(int64_t));
        if (kvb == NULL || gb == NULL || lat == NULL || gpos == NULL) {
            st = TD_ERR_INTERNAL;
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
            tmp = fw_take(f, sp, ng * (idh > hd ? idh : hd) * sizeof(float));
            if (tmp == NULL) {
                st = TD_ERR_INTERNAL;
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
    sp->used = mark;
    return st;
}

/* select_candidate_blocks of the reference for one query row: sc [t] (-inf
 * where unreachable), clen = visible entries; the kept blocks into cb (their
 * count returned in *ncb). */
static td_status_t
fw_candidates(const fw_t *f, const float *sc, size_t t, uint64_t clen, int32_t *cb,
              uint32_t *ncb, float *bscore, int64_t *bidx)
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
    *ncb = 0;
    if (kb == 0)
        return TD_OK;
    FW_CHECK(f->k->topk(bscore, 1, nb, kb, bidx));
    for (size_t j = 0; j < kb; j++)
        if (bscore[bidx[j]] > -INFINITY)
            cb[(*ncb)++] = (int32_t)bidx[j];
    return TD_OK;
}

/* Query rows of the indexer scored at a time (bounds its scores: rows x
 * entries). Each score depends on its query and key alone. */
#define FW_INDEX_ROWS 32

/* Scores of the rows [i0, i0 + nr) of request s against its t indexer keys
 * into sc [nr, t], tile by tile of keys; entries a row cannot see yet are
 * -inf. */
static td_status_t
fw_index_scores(fw_t *f, size_t s, size_t ratio, size_t i0, size_t nr, size_t t,
                const float *qi, const float *w, float *keys, float *ksc, float *sc)
{
    const td_modelcfg_t *c = f->c;
    const fw_shared_t *sh = &f->sh[s];
    size_t ih = (size_t)c->index_n_heads, idh = (size_t)c->index_head_dim;
    size_t kt = t < FW_KEY_TILE ? t : FW_KEY_TILE;
    uint64_t p0 = f->p0[s];

    for (size_t j0 = 0; j0 < t; j0 += kt) {
        size_t nk = t - j0 < kt ? t - j0 : kt;
        for (size_t j = 0; j < nk; j++)
            FW_CHECK(fw_load_one(f, f->m->plan->index_fmt, (uint32_t)idh,
                                 td_cache_entry(f->seqs[s].cache, (uint32_t)sh->index_seg, j0 + j),
                                 keys + j * idh));
        FW_CHECK(f->k->index_scores(qi + i0 * ih * idh, keys, w + i0 * ih, nr, ih, nk, idh,
                                    (float)(1.0 / sqrt((double)idh)), nr > 1 ? ksc : sc + j0));
        for (size_t i = 0; nr > 1 && i < nr; i++)
            memcpy(sc + i * t + j0, ksc + i * nk, nk * sizeof(float));
    }
    for (size_t i = 0; i < nr; i++) {        /* visible once the query passed the group */
        uint64_t clen = (p0 + i0 + i + 1) / ratio;
        for (size_t j = (size_t)(clen < t ? clen : t); j < t; j++)
            sc[i * t + j] = -INFINITY;
    }
    return TD_OK;
}

/* The index source layer l for request s: score the queries against the
 * group's indexer keys and publish the top-k block bias (and, at the
 * candidate source, the candidate blocks). */
static td_status_t
fw_index(fw_t *f, uint32_t l, size_t s, td_fwspace_t *sp)
{
    const td_modelcfg_t *c = f->c;
    const td_modelcfg_layer_t *cl = &c->layers[l];
    const td_model_layer_t *L = &f->m->layers[l];
    const td_cache_plan_t *plan = f->m->plan;
    fw_shared_t *sh = &f->sh[s];
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
    size_t qr = n < FW_INDEX_ROWS ? n : FW_INDEX_ROWS;
    size_t bs = (size_t)c->candidate_block_size;

    size_t mark = sp->used;
    qi = fw_take(f, sp, n * ih * idh * sizeof(float));
    w = fw_take(f, sp, n * ih * sizeof(float));
    sc = fw_take(f, sp, qr * t * sizeof(float));
    keys = fw_take(f, sp, kt * idh * sizeof(float));
    ksc = qr > 1 ? fw_take(f, sp, qr * kt * sizeof(float)) : NULL;
    size_t topk = (size_t)c->index_topk < t ? (size_t)c->index_topk : t;
    idx = fw_take(f, sp, (topk ? topk : 1) * qr * sizeof(int64_t));
    bscore = fw_take(f, sp, t * sizeof(float));
    bidx = fw_take(f, sp, t * sizeof(int64_t));
    unsigned char *blk = fw_take(f, sp, (t + bs - 1) / bs);
    if (qi == NULL || w == NULL || sc == NULL || idx == NULL || bscore == NULL ||
        bidx == NULL || keys == NULL || (qr > 1 && ksc == NULL) || blk == NULL) {
        st = TD_ERR_INTERNAL;
        goto out;
    }

    FW_TRY(f->k->linear_mat(f->qr + r0 * ql, L->idx_wq_b, qi, n));
    FW_TRY(f->k->rope(qi, n, ih, idh, f->rd, f->pos + r0, f->m->inv_freq_compress,
                      f->m->rope_scale_compress, 0));
    st = fw_fake_quant(f, sp, plan->index_fmt, (uint32_t)idh, qi, n * ih);
    if (st != TD_OK)
        goto out;
    FW_TRY(f->k->linear_mat(f->x + r0 * f->H, L->idx_wproj, w, n));
    const float heads_scaling = (float)(1.0 / sqrt((double)ih));
    for (size_t i = 0; i < n * ih; i++)
        w[i] *= heads_scaling;
    if (cl->uses_candidates && !cl->candidate_source && sh->has_cand && sh->cand_t != t) {
        td_error("forward: layer %u scores %zu compressed entries against a candidate "
                 "mask of %zu (the reference cannot broadcast them)", l, t, sh->cand_t);
        st = TD_ERR_UNSUPPORTED;
        goto out;
    }
    /* rows tile by tile: scores, candidates, top-k, each row on its own */
    for (size_t i0 = 0; i0 < n; i0 += qr) {
        size_t nr = n - i0 < qr ? n - i0 : qr;
        FW_TRY(fw_index_scores(f, s, r, i0, nr, t, qi, w, keys, ksc, sc));
        for (size_t i = 0; i < nr; i++) {
            size_t row = i0 + i;
            float *sr = sc + i * t;
            if (cl->candidate_source) {
                FW_TRY(fw_candidates(f, sr, t, (p0 + row + 1) / r,
                                     sh->cb + row * (size_t)c->candidate_topk_blocks,
                                     &sh->ncb[row], bscore, bidx));
            } else if (cl->uses_candidates && sh->has_cand) {
                memset(blk, 0, (t + bs - 1) / bs);
                for (uint32_t k = 0; k < sh->ncb[row]; k++)
                    blk[sh->cb[row * (size_t)c->candidate_topk_blocks + k]] = 1;
                for (size_t j = 0; j < t; j++)
                    if (!blk[j / bs])
                        sr[j] = -INFINITY;
            }
        }
        for (size_t i = 0; i < nr; i++)
            sh->ntk[i0 + i] = 0;
        if (topk > 0) {
            FW_TRY(f->k->topk(sc, nr, t, topk, idx));
            for (size_t i = 0; i < nr; i++)
                for (size_t j = 0; j < topk; j++) {
                    int64_t e = idx[i * topk + j];
                    if (sc[i * t + (size_t)e] > -INFINITY)
                        sh->tk[(i0 + i) * (size_t)c->index_topk + sh->ntk[i0 + i]++] = (int32_t)e;
                }
        }
    }
    if (cl->candidate_source) {
        sh->cand_t = t;
        sh->has_cand = 1;
    }
    sh->bias_t = t;
    sh->has_bias = 1;

out:
    sp->used = mark;
    return st;
}

/* ---- attention ---------------------------------------------------------------------- */

/* Attention of request s at layer l over its window (ring + this chunk) and
 * the group's compressed KV; writes f->ao rows, then updates the ring. */
static td_status_t
fw_attend(fw_t *f, uint32_t l, size_t s, td_fwspace_t *sp)
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
    size_t mark = sp->used;

    win = fw_take(f, sp, (nprev + n) * hd * sizeof(float));
    if (win == NULL) {
        st = TD_ERR_INTERNAL;
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
    int bias = 0;
    if (cl->ratio > 0) {
        if (cl->kv_source) {
            st = fw_compress(f, l, s, sp);
            if (st != TD_OK)
                goto out;
        }
        if (cl->index_source) {
            st = fw_index(f, l, s, sp);
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
                bias = 1;
            }
        }
    }

    /* Of the compressed entries, a tile reads those some row of it may weigh
     * (in a row's top-k list), in order, straight from the cache: the kernel
     * skips masked keys, so leaving them out changes no bit. */
    size_t tile = n < FW_TILE ? n : FW_TILE, K = (size_t)f->c->index_topk;
    size_t most = bias ? (tc < tile * K ? tc : tile * K) : 0;
    keys = fw_take(f, sp, (tile + wm + most) * hd * sizeof(float));
    mask = fw_take(f, sp, tile * (tile + wm + most) * sizeof(float));
    sel = fw_take(f, sp, (most ? most : 1) * sizeof(*sel));
    uint32_t *at = fw_take(f, sp, (tc ? tc : 1) * sizeof(uint32_t));
    unsigned char *want = fw_take(f, sp, tc ? tc : 1);
    if (keys == NULL || mask == NULL || sel == NULL || at == NULL || want == NULL) {
        st = TD_ERR_INTERNAL;
        goto out;
    }
    memset(want, 0, tc ? tc : 1);
    const float softmax_scale = (float)(1.0 / sqrt((double)hd));
    for (size_t a = 0; a < n; a += tile) {
        size_t bq = a + tile < n ? a + tile : n, nt = bq - a;
        uint64_t lo = p0 + a >= wm ? p0 + a - wm : 0;  /* first window position needed */
        uint64_t hi = p0 + bq;                          /* one past the last */
        size_t tw = (size_t)(hi - lo), ns = 0, tk;
        memcpy(keys, win + (lo - kbase) * hd, tw * hd * sizeof(float));
        for (size_t i = 0; bias && i < nt; i++)
            for (uint32_t c = 0; c < sh->ntk[a + i]; c++)
                want[sh->tk[(a + i) * K + c]] = 1;
        for (size_t j = 0; bias && j < tc; j++)
            if (want[j]) {
                want[j] = 0;
                at[j] = (uint32_t)ns;
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
                mr[tw + k] = -INFINITY;
            for (uint32_t c = 0; bias && c < sh->ntk[a + i]; c++)
                mr[tw + at[sh->tk[(a + i) * K + c]]] = 0.0f;
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
    sp->used = mark;
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
    fw_t *f = j->f;
    size_t slot = 0;
    /* a free scratch: at most as many tasks run at once as there are slots */
    for (;; slot = (slot + 1) % f->nslots) {
        atomic_uchar *b = &f->busy[slot];
        unsigned char was = 0;
        if (atomic_compare_exchange_strong_explicit(b, &was, 1, memory_order_acquire,
                                                    memory_order_relaxed))
            break;
    }
    f->seq_st[s] = fw_attend(f, j->l, s, &f->sspace[slot]);
    atomic_store_explicit(&f->busy[slot], 0, memory_order_release);
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

/* Carve the MoE buffers for a pass of N rows in a group whose ranks have
 * tall rows in all (tall = N without a group), size ranks, held experts
 * here, from sp (on a counting space: measure them). */
static void
fw_moe_carve(fw_moe_ws_t *w, td_fwspace_t *sp, const td_modelcfg_t *c, size_t N, size_t tall,
             size_t size, size_t held)
{
    size_t E = (size_t)c->n_routed_experts, K = (size_t)c->num_experts_per_tok;
    size_t H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    size_t kh = K < held ? K : held, kd = K < size ? K : size;
    size_t R = tall, S = size > 1 ? tall * kh : N * K, RN = R > N ? R : N;

    w->sc = td_fwspace_take(sp, N * E * sizeof(float));
    w->route_ws = td_fwspace_take(sp, td_kernels_route_ws_bytes(N, E, K));
    w->sexp = td_fwspace_take(sp, N * K * sizeof(int32_t));
    w->swt = td_fwspace_take(sp, N * K * sizeof(float));
    w->xe = td_fwspace_take(sp, R * H * sizeof(float));
    w->ye = td_fwspace_take(sp, RN * H * sizeof(float));
    w->ge = td_fwspace_take(sp, RN * I * sizeof(float));
    w->ue = td_fwspace_take(sp, RN * I * sizeof(float));
    w->we = td_fwspace_take(sp, R * sizeof(float));
    w->bucket = td_fwspace_take(sp, (2 * E + 1) * sizeof(size_t));
    w->order = td_fwspace_take(sp, S * sizeof(size_t));
    w->scap = S;
    if (size <= 1)
        return;
    /* a record: a count, (expert, weight) per slot, the hidden vector; a
     * token sends at most one to each rank */
    w->send = td_fwspace_take(sp, N * (kd * (4 + 4 * H) + 8 * K));
    w->recv_cap = tall * (4 + 8 * kh + 4 * H);
    w->recv = td_fwspace_take(sp, w->recv_cap);
    w->ax = td_fwspace_take(sp, S * sizeof(*w->ax));
    w->aw = td_fwspace_take(sp, S * sizeof(float));
    w->ae = td_fwspace_take(sp, S * sizeof(int32_t));
    w->out = td_fwspace_take(sp, S * H * sizeof(float));
    w->back = td_fwspace_take(sp, N * K * H * sizeof(float));
    w->slot = td_fwspace_take(sp, N * K * sizeof(size_t));
    w->dest = td_fwspace_take(sp, N * K * sizeof(uint32_t));
}

/* Size w's block for the pass (grown, never shrunk) and carve it; its bytes
 * in *bytes. */
static td_status_t
fw_moe_ws_reserve(fw_moe_ws_t *w, const td_modelcfg_t *c, size_t N, size_t tall, size_t size,
                  size_t held, size_t *bytes)
{
    fw_moe_ws_t count = { 0 };
    fw_moe_carve(&count, &count.space, c, N, tall, size, held);
    td_status_t st = td_fwspace_reserve(&w->space, count.space.used, "the experts' workspace");
    if (st != TD_OK)
        return st;
    fw_moe_carve(w, &w->space, c, N, tall, size, held);
    *bytes = count.space.used;
    return TD_OK;
}

/* The router for the pass's rows (one op): ws->sexp / ws->swt get each
 * token's experts in ascending id with their weights (the order of the sum). */
static td_status_t
fw_route(fw_t *f, const td_model_layer_t *L)
{
    const td_modelcfg_t *c = f->c;
    fw_moe_ws_t *w = f->ws;
    size_t N = f->N, E = (size_t)c->n_routed_experts, K = (size_t)c->num_experts_per_tok;

    /* scores from the unbiased logits, selection with the bias */
    FW_CHECK(f->k->linear_mat(f->x, L->gate, w->sc, N));
    FW_CHECK(f->k->route(w->sc, L->gate_bias, N, E, K,
                         strcmp(c->scoring_func, "sigmoid") == 0 ? TD_KERNELS_SCORE_SIGMOID
                                                                 : TD_KERNELS_SCORE_SQRTSOFTPLUS,
                         (float)c->gate_temp, c->norm_topk_prob,
                         (float)c->routed_scaling_factor, w->route_ws, w->sexp, w->swt));
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

td_status_t
td_forward_check(const td_model_t *m, const td_forward_dep_t *dep, const td_forward_seq_t *seqs,
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

/* ---- the workspace ----------------------------------------------------------------------
 * A pass takes every buffer from one block (td_fwspace_t) sized before it by
 * the same carving run on a counting space: the pass-wide buffers (rows
 * N), and per request its top-k bias and candidate mask ([n, T], T its
 * tokens after the pass) and a scratch that fw_attend, fw_compress,
 * fw_index and fw_fake_quant take from and give back (fw_seq_scratch
 * bounds it). td_forward_workspace_bytes gives tools/memplan the figure. */

/* The largest take sequence of one request's scratch for n rows and T
 * tokens after the pass: the window, then the largest of the compressor
 * (any ratio of the config), the indexer and the attention tiles. */
static size_t
fw_seq_scratch(const td_modelcfg_t *c, const td_cache_plan_t *plan, size_t n, uint64_t T)
{
    size_t hd = (size_t)c->head_dim, wm = plan->window_slots, idh = (size_t)c->index_head_dim;
    size_t ih = (size_t)c->index_n_heads, t = (size_t)T, kt = t < FW_KEY_TILE ? t : FW_KEY_TILE;
    size_t topk = (size_t)c->index_topk < t ? (size_t)c->index_topk : t;
    size_t tile = n < FW_TILE ? n : FW_TILE, most = 0, big = idh > hd ? idh : hd;
    td_fwspace_t sp;

    for (int64_t l = 0; l < c->num_hidden_layers; l++) {   /* the compressor */
        size_t r = (size_t)c->layers[l].ratio, tot = r > 1 ? r - 1 + n : n;
        size_t G = r > 1 ? tot / r : n;
        sp = (td_fwspace_t){ 0 };
        if (r == 0)
            continue;
        if (r > 1) {
            td_fwspace_take(&sp, tot * hd * sizeof(float));
            td_fwspace_take(&sp, tot * hd * sizeof(float));
        }
        td_fwspace_take(&sp, (G ? G : 1) * hd * sizeof(float));
        td_fwspace_take(&sp, (G ? G : 1) * sizeof(int64_t));
        td_fwspace_take(&sp, (G ? G : 1) * big * sizeof(float));
        most = sp.used > most ? sp.used : most;
    }
    size_t qr = n < FW_INDEX_ROWS ? n : FW_INDEX_ROWS, bs = (size_t)c->candidate_block_size;
    sp = (td_fwspace_t){ 0 };   /* the indexer */
    td_fwspace_take(&sp, n * ih * idh * sizeof(float));
    td_fwspace_take(&sp, n * ih * sizeof(float));
    td_fwspace_take(&sp, qr * t * sizeof(float));
    td_fwspace_take(&sp, kt * idh * sizeof(float));
    if (qr > 1)
        td_fwspace_take(&sp, qr * kt * sizeof(float));
    td_fwspace_take(&sp, (topk ? topk : 1) * qr * sizeof(int64_t));
    td_fwspace_take(&sp, t * sizeof(float));
    td_fwspace_take(&sp, t * sizeof(int64_t));
    td_fwspace_take(&sp, bs ? (t + bs - 1) / bs : t);
    td_fwspace_take(&sp, td_cache_fmt_bytes(plan->index_fmt, (uint32_t)idh));
    most = sp.used > most ? sp.used : most;
    /* the attention tiles: window, the selected compressed entries */
    size_t K = (size_t)c->index_topk, sel = t < tile * K ? t : tile * K;
    sp = (td_fwspace_t){ 0 };
    td_fwspace_take(&sp, (tile + wm + sel) * hd * sizeof(float));
    td_fwspace_take(&sp, tile * (tile + wm + sel) * sizeof(float));
    td_fwspace_take(&sp, (sel ? sel : 1) * sizeof(size_t));
    td_fwspace_take(&sp, (t ? t : 1) * sizeof(uint32_t));
    td_fwspace_take(&sp, t ? t : 1);
    most = sp.used > most ? sp.used : most;
    sp = (td_fwspace_t){ 0 };   /* the window, held across the rest */
    td_fwspace_take(&sp, (wm + n) * hd * sizeof(float));
    return sp.used + most;
}

/* Request s's rows and its tokens after the pass: from f->seqs, or the
 * uniform shape of td_forward_workspace_bytes (f->seqs NULL). */
static void
fw_seq_shape(const fw_t *f, size_t s, size_t *n, uint64_t *T)
{
    if (f->seqs != NULL) {
        *n = f->seqs[s].n;
        *T = td_cache_tokens(f->seqs[s].cache) + *n;
    } else {
        *n = f->N / f->nseq;
        *T = f->shape_T;
    }
}

/* Zeroed bytes from the pass's space (NULL while counting). */
static void *
fw_take0(td_fwspace_t *sp, size_t bytes)
{
    void *p = td_fwspace_take(sp, bytes);
    if (p != NULL)
        memset(p, 0, bytes);
    return p;
}

/* Carve the pass's buffers from sp (on a counting space: measure them). */
static void
fw_carve(fw_t *f, td_fwspace_t *sp)
{
    const td_modelcfg_t *c = f->c;
    size_t N = f->N, H = f->H, hc = f->hc, hd = f->hd, nh = f->nh, ns = f->nseq;
    size_t nm = (2 + hc) * hc;
    float **rows[] = { &f->S, &f->R, &f->flat };

    f->row0 = fw_take0(sp, ns * sizeof(*f->row0));
    f->p0 = fw_take0(sp, ns * sizeof(*f->p0));
    f->pos = fw_take0(sp, N * sizeof(*f->pos));
    f->ids = fw_take0(sp, N * sizeof(*f->ids));
    f->sh = fw_take0(sp, ns * sizeof(*f->sh));
    f->seq_st = fw_take0(sp, ns * sizeof(*f->seq_st));
    for (size_t i = 0; i < 3; i++)
        *rows[i] = fw_take0(sp, N * hc * H * sizeof(float));
    f->mixes = fw_take0(sp, N * nm * sizeof(float));
    f->pre_in = fw_take0(sp, N * hc * sizeof(float));
    f->a_pre = fw_take0(sp, N * hc * sizeof(float));
    f->a_post = fw_take0(sp, N * hc * sizeof(float));
    f->a_comb = fw_take0(sp, N * hc * hc * sizeof(float));
    f->f_pre = fw_take0(sp, N * hc * sizeof(float));
    f->f_post = fw_take0(sp, N * hc * sizeof(float));
    f->f_comb = fw_take0(sp, N * hc * hc * sizeof(float));
    f->x = fw_take0(sp, N * H * sizeof(float));
    f->y = fw_take0(sp, N * H * sizeof(float));
    f->qr = fw_take0(sp, N * (size_t)c->q_lora_rank * sizeof(float));
    f->q = fw_take0(sp, N * nh * hd * sizeof(float));
    f->ao = fw_take0(sp, N * nh * hd * sizeof(float));
    f->kv = fw_take0(sp, N * hd * sizeof(float));
    f->ckv = fw_take0(sp, N * hd * sizeof(float));
    f->cg = fw_take0(sp, N * hd * sizeof(float));
    f->kv_codes = fw_take0(sp, N * hd);
    f->kv_scales = fw_take0(sp, N * (hd / TD_CACHE_FP8_BLOCK + 1));
    f->oa = fw_take0(sp, N * (size_t)(c->o_groups * c->o_lora_rank) * sizeof(float));
    if (c->engram_layer_ids.n > 0) {
        size_t nb = (size_t)c->engram_max_ngram_size;
        size_t cols = (nb - 1) * (size_t)c->engram_n_heads;
        f->back = fw_take0(sp, N * nb * sizeof(*f->back));
        f->hid = fw_take0(sp, N * cols * sizeof(*f->hid));
        f->emb = fw_take0(sp, N * cols * (size_t)c->engram_head_dim * sizeof(float));
        f->kvx = fw_take0(sp, N * H * (hc + 1) * sizeof(float));
        f->ekey = fw_take0(sp, N * hc * H * sizeof(float));
        f->eval = fw_take0(sp, N * H * sizeof(float));
    }
    size_t scratch = 0;
    for (size_t s = 0; s < ns; s++) {
        size_t n;
        uint64_t T;
        fw_seq_shape(f, s, &n, &T);
        int32_t *tk = td_fwspace_take(sp, n * (size_t)c->index_topk * sizeof(int32_t));
        uint32_t *ntk = td_fwspace_take(sp, n * sizeof(uint32_t));
        int32_t *cb = td_fwspace_take(sp, n * (size_t)c->candidate_topk_blocks * sizeof(int32_t));
        uint32_t *ncb = td_fwspace_take(sp, n * sizeof(uint32_t));
        size_t need = fw_seq_scratch(c, f->plan, n, T);
        scratch = need > scratch ? need : scratch;
        if (f->sh != NULL) {
            f->sh[s].tk = tk;
            f->sh[s].ntk = ntk;
            f->sh[s].cb = cb;
            f->sh[s].ncb = ncb;
        }
    }
    f->nslots = ns < td_kernels_cpu_threads() ? ns : td_kernels_cpu_threads();
    f->sspace = fw_take0(sp, f->nslots * sizeof(*f->sspace));
    f->busy = fw_take0(sp, f->nslots * sizeof(*f->busy));
    for (size_t i = 0; i < f->nslots; i++) {
        unsigned char *base = td_fwspace_take(sp, scratch);
        if (f->sspace != NULL)
            f->sspace[i] = (td_fwspace_t){ base, base != NULL ? scratch : 0, 0 };
    }
}

/* The pass's rows, positions and tokens once carved. */
static void
fw_place(fw_t *f)
{
    size_t at = 0;
    for (size_t s = 0; s < f->nseq; s++) {
        f->row0[s] = at;
        f->p0[s] = td_cache_tokens(f->seqs[s].cache);
        for (size_t i = 0; i < f->seqs[s].n; i++) {
            f->pos[at + i] = (int64_t)(f->p0[s] + i);
            f->ids[at + i] = f->seqs[s].tokens[i];
        }
        at += f->seqs[s].n;
    }
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

/* The embedding into every stream; the first site collapses stream 0. */
static td_status_t
fw_embed(fw_t *f)
{
    FW_CHECK(f->k->embed_fmt(&f->m->embed, (size_t)f->c->vocab_size, f->H, f->ids, f->N, f->x));
    for (size_t r = 0; r < f->N; r++) {
        for (size_t j = 0; j < f->hc; j++)
            memcpy(f->S + (r * f->hc + j) * f->H, f->x + r * f->H, f->H * sizeof(float));
        f->pre_in[r * f->hc] = 1.0f;
    }
    return TD_OK;
}

/* Every layer, the hook after each, then the logits. */
static td_status_t
fw_layers(fw_t *f, td_forward_layer_fn fn, void *arg)
{
    td_status_t st = TD_OK;

    if (f->m->plan->engram >= 0)
        st = fw_engram_back(f);
    if (st == TD_OK)
        st = fw_embed(f);
    for (uint32_t l = 0, nl = (uint32_t)f->c->num_hidden_layers; l < nl && st == TD_OK; l++) {
        st = fw_layer(f, l);
        if (st != TD_OK)
            break;
        if (l + 1 == nl)
            fw_finish_caches(f);   /* the last layer's segments: look-back, counters */
        if (fn != NULL) {
            td_forward_done_t done = { l, f->seqs, f->nseq, f->p0 };
            st = fn(&done, arg);
        }
    }
    return st == TD_OK ? fw_logits(f) : st;
}

/* The sizes and fields a pass of f's shape starts from. */
static void
fw_init(fw_t *f, const td_modelcfg_t *c, const td_cache_plan_t *plan)
{
    f->c = c;
    f->plan = plan;
    f->H = (size_t)c->hidden_size;
    f->hc = (size_t)c->hc_mult;
    f->hd = (size_t)c->head_dim;
    f->nh = (size_t)c->num_attention_heads;
    f->rd = (size_t)c->qk_rope_head_dim;
}

/* Processes' largest pass workspace so far (td_forward_workspace_peak). */
static _Atomic size_t fw_peak;

static void
fw_note(size_t bytes)
{
    size_t old = atomic_load_explicit(&fw_peak, memory_order_relaxed);
    while (bytes > old &&
           !atomic_compare_exchange_weak_explicit(&fw_peak, &old, bytes, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

size_t
td_forward_workspace_peak(void)
{
    return atomic_load_explicit(&fw_peak, memory_order_relaxed);
}

size_t
td_forward_workspace_bytes(const td_modelcfg_t *c, const td_cache_plan_t *plan, size_t nseq,
                           size_t n, uint64_t tokens)
{
    fw_t f;
    fw_moe_ws_t moe = { 0 };
    td_fwspace_t count = { 0 };

    if (nseq * n > TD_FORWARD_PASS_ROWS) {   /* td_forward's passes */
        if (n >= TD_FORWARD_PASS_ROWS) {
            nseq = 1;
            n = TD_FORWARD_PASS_ROWS;
        } else {
            nseq = TD_FORWARD_PASS_ROWS / n;
        }
    }
    memset(&f, 0, sizeof(f));
    fw_init(&f, c, plan);
    f.nseq = nseq;
    f.N = nseq * n;
    f.shape_T = tokens;
    fw_carve(&f, &count);
    fw_moe_carve(&moe, &moe.space, c, f.N, f.N, 1, (size_t)c->n_routed_experts);
    return count.used + moe.space.used;
}

/* One pass: td_forward (dep NULL) or one rank's td_forward_dep (nseqs may
 * then be 0: the rank only serves its experts at each MoE layer). */
td_status_t
td_forward_pass(const td_model_t *m, td_forward_dep_t *dep, td_forward_seq_t *seqs,
                size_t nseqs, td_forward_layer_fn fn, void *arg)
{
    fw_t f;
    fw_moe_ws_t own;
    td_fwspace_t space = { 0 }, count = { 0 };
    td_status_t st;
    size_t moe_bytes = 0;
    bool counted = false;

    memset(&f, 0, sizeof(f));
    memset(&own, 0, sizeof(own));
    st = nseqs > 0 || dep == NULL ? td_forward_check(m, dep, seqs, nseqs) : TD_OK;
    if (st != TD_OK)
        return st;
    fw_init(&f, m->cfg, m->plan);
    f.m = m;
    f.dep = dep;
    f.ws = dep != NULL ? &dep->ws : &own;
    f.k = m->ops;
    f.seqs = seqs;
    f.nseq = nseqs;
    for (size_t s = 0; s < nseqs; s++)
        f.N += seqs[s].n;
    st = fw_dep_begin(&f);
    if (st == TD_OK)
        st = fw_moe_ws_reserve(f.ws, f.c, f.N, f.tall, dep != NULL ? dep->size : 1,
                               dep != NULL ? dep->held : (size_t)m->cfg->n_routed_experts,
                               &moe_bytes);
    if (st != TD_OK)
        goto out;
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
    fw_carve(&f, &count);
    st = td_fwspace_reserve(&space, count.used, "the pass's buffers");
    if (st != TD_OK)
        goto out;
    fw_note(count.used + moe_bytes);
    fw_carve(&f, &space);
    fw_place(&f);
    st = fw_layers(&f, fn, arg);

out:
    /* After its rows are in the per-expert counters: a reader that sees the
     * count of passes (acquire) sees every row of those passes, and the last
     * pass's rows are always followed by a change of the count. */
    if (counted)
        atomic_fetch_add_explicit(&dep->passes, 1, memory_order_release);
    td_fwspace_release(&space);
    td_fwspace_release(&own.space);
    return st;
}

/* ---- DEPn: one rank's counters ------------------------------------------------------ */

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

