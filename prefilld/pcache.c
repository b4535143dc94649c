/* prefilld/pcache.c — a prefill rank's prefix cache (pcache.h): nodes of G
 * tokens in a hash table by chain hash (base/hmap.h) and an LRU list (most recent last),
 * each holding its paged blocks in the rank's pool; eviction demotes a node
 * to the host tier; every new node is also written back to the SSD tier;
 * the routing table's news as added / removed hash lists. */
#include "pcache.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "chainhash.h"
#include "hmap.h"
#include "kvmem.h"
#include "kvtier.h"
#include "log.h"

typedef struct pc_node {
    TAILQ_ENTRY(pc_node) lru;        /* most recently used last */
    uint64_t hash, parent, end;
    int32_t *tokens;                 /* [G] */
    uint64_t *blocks;                /* [nblk]: per paged segment its k_s block ids, layout
                                        order */
    uint8_t *snap;                   /* the fixed state at end, or NULL */
    uint32_t pins;                   /* hits holding it, and its write-back */
    bool wb;                         /* queued or taken for its write-back: the compute
                                        thread reads it, so its snap stays as it is */
} pc_node_t;

typedef struct {
    uint64_t *v;
    size_t n, cap;
} pc_list_t;

typedef struct {
    pc_node_t **v;
    size_t n, cap;
} pc_vec_t;

struct td_pcache {
    td_pcache_config_t cfg;
    const td_layout_t *l;
    td_kvpool_t *kp;
    uint32_t G;
    uint64_t *k;                     /* [nsegs] pool blocks per cache block (0: fixed) */
    uint64_t nblk;                   /* sum of k */
    uint32_t seg0;                   /* the segment of every node's blocks[0] */
    uint64_t payload_bytes;          /* a record's paged bytes */
    uint64_t snap_bytes;             /* the fixed segments' bytes */
    td_hmap_t *nodes;                /* hash -> pc_node_t *; room for max_blocks */
    uint64_t nnodes;
    TAILQ_HEAD(, pc_node) lru;
    td_kvtier_t *tier;               /* NULL: no host or SSD tier */
    int ssd;                         /* the tier has an SSD directory (read-ahead) */
    pc_list_t added, removed;
    pc_list_t out_added, out_removed;
    int cleared;
    /* counters */
    uint64_t lookup_tokens, hit_tokens[3], computed, replayed;
    /* bulk work for the compute thread (td_pcache_work_*): new nodes to
     * write back to SSD (pinned), evicted ones to demote to the host tier
     * (out of the table, their blocks still held); the batch a job took */
    pc_vec_t wb, dem, job_wb, job_dem;
    bool working;                    /* a batch is out */
    uint64_t *dem_blocks;            /* [nsegs] pool blocks the demotions queued will free */
};

/* ---- Small helpers ---------------------------------------------------------------- */

static uint64_t
pc_gcd(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

uint32_t
td_pcache_block_tokens(const td_layout_t *l)
{
    uint64_t g = 1;

    for (uint32_t s = 0; s < l->nsegs; s++) {
        uint64_t span;

        if (l->segs[s].kind != TD_LAYOUT_PAGED)
            continue;
        span = (uint64_t)l->segs[s].ratio * l->block_entries;
        g = g / pc_gcd(g, span) * span;
        if (g > UINT32_MAX / 2)
            return 0;
    }
    return (uint32_t)g;
}

uint32_t
td_pcache_block(const td_pcache_t *c)
{
    return c->G;
}

static void
pc_list_push(pc_list_t *l, uint64_t v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        uint64_t *nv = realloc(l->v, cap * sizeof(*nv));

        if (nv == NULL)
            return;   /* a lost event: the router's view is a hint, refreshed at flush */
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static bool
pc_vec_push(pc_vec_t *v, pc_node_t *nd)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        pc_node_t **nv = realloc(v->v, cap * sizeof(*nv));

        if (nv == NULL)
            return false;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = nd;
    return true;
}

static pc_node_t *
pc_find(td_pcache_t *c, uint64_t hash)
{
    uint64_t v = td_hmap_get(c->nodes, hash);

    return v != TD_HMAP_NONE ? (pc_node_t *)(uintptr_t)v : NULL;
}

static int
pc_tier_has(td_pcache_t *c, uint64_t hash)
{
    return c->tier != NULL && td_kvtier_has(c->tier, hash) != 0;
}

/* A node nobody uses: no hit pins it and no reservation shares its blocks
 * (the cache's hold is their only reference). */
static int
pc_node_idle(const td_pcache_t *c, const pc_node_t *nd)
{
    /* every block of a node has the same holders: its first says it */
    return nd->pins == 0 && (c->nblk == 0 || td_kvpool_block_refs(c->kp, c->seg0,
                                                                  nd->blocks[0]) == 1);
}

/* The node's paged bytes, gathered in record order into buf. */
static void
pc_gather(const td_pcache_t *c, const pc_node_t *nd, uint8_t *buf)
{
    uint64_t i = 0;

    for (uint32_t s = 0; s < c->l->nsegs; s++)
        for (uint64_t j = 0; j < c->k[s]; j++, i++) {
            uint64_t bb = td_kvpool_seg_block_bytes(c->kp, s);

            memcpy(buf, td_kvpool_block_mem(c->kp, s, nd->blocks[i]), bb);
            buf += bb;
        }
}

static void
pc_record(const td_pcache_t *c, const pc_node_t *nd, const uint8_t *payload, td_kvrec_t *r)
{
    *r = (td_kvrec_t){
        .hash = nd->hash,
        .parent = nd->parent,
        .end = nd->end,
        .block_tokens = c->G,
        .tokens = nd->tokens,
        .payload = payload,
        .payload_bytes = c->payload_bytes,
        .snapshot = nd->snap,
        .snapshot_bytes = nd->snap != NULL ? c->snap_bytes : 0,
    };
}

/* A node out of the table: its pool blocks go back, and the router hears
 * it is gone unless a tier has it; then it is freed. */
static void
pc_node_free(td_pcache_t *c, pc_node_t *nd)
{
    uint64_t i = 0;

    for (uint32_t s = 0; s < c->l->nsegs; s++)
        for (uint64_t j = 0; j < c->k[s]; j++, i++)
            td_kvpool_unhold(c->kp, s, nd->blocks[i]);
    if (!pc_tier_has(c, nd->hash))
        pc_list_push(&c->removed, nd->hash);
    free(nd->snap);
    free(nd->tokens);
    free(nd->blocks);
    free(nd);
}

/* Drop a node from the pool tier; demote: its record goes to the host tier
 * first, copied on the compute thread (td_pcache_work_run): its blocks stay
 * held until then. */
static void
pc_node_drop(td_pcache_t *c, pc_node_t *nd, int demote)
{
    assert(pc_find(c, nd->hash) == nd && nd->pins == 0);
    td_hmap_del(c->nodes, nd->hash);
    TAILQ_REMOVE(&c->lru, nd, lru);
    c->nnodes--;
    if (demote && c->tier != NULL && pc_vec_push(&c->dem, nd)) {
        for (uint32_t s = 0; s < c->l->nsegs; s++)
            c->dem_blocks[s] += c->k[s];
        return;   /* it is going to a tier: nothing for the router yet */
    }
    pc_node_free(c, nd);
}

/* Evict the least recently used idle node; 0 when none is idle. */
static int
pc_evict_one(td_pcache_t *c)
{
    pc_node_t *nd;

    TAILQ_FOREACH(nd, &c->lru, lru)
        if (pc_node_idle(c, nd)) {
            pc_node_drop(c, nd, 1);
            return 1;
        }
    return 0;
}

/* ---- Creation --------------------------------------------------------------------- */

td_status_t
td_pcache_create(const td_pcache_config_t *cfg, const td_layout_t *l, td_kvpool_t *kp,
                 td_pcache_t **out)
{
    td_pcache_t *c;
    uint32_t min = td_pcache_block_tokens(l);
    td_status_t st = TD_ERR_NOMEM;

    if (cfg->block_tokens == 0 || min == 0 || cfg->block_tokens % min != 0 ||
        cfg->max_blocks == 0) {
        td_error("prefill rank %u: prefix cache: a block of %u tokens does not hold whole kv "
                 "blocks of every segment: use a multiple of %u (--cache-block-tokens)",
                 cfg->rank_id, cfg->block_tokens, min);
        return TD_ERR_INVALID;
    }
    if ((c = calloc(1, sizeof(*c))) == NULL)
        goto err;
    c->cfg = *cfg;
    c->cfg.ssd_dir = NULL;
    c->l = l;
    c->kp = kp;
    c->G = cfg->block_tokens;
    TAILQ_INIT(&c->lru);
    c->cleared = 1;
    if ((c->k = calloc(l->nsegs, sizeof(*c->k))) == NULL)
        goto err_free;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];

        if (seg->kind == TD_LAYOUT_FIXED)
            continue;
        c->k[s] = c->G / ((uint64_t)seg->ratio * l->block_entries);
        if (c->nblk == 0)
            c->seg0 = s;
        c->nblk += c->k[s];
        c->payload_bytes += c->k[s] * td_kvpool_seg_block_bytes(kp, s);
    }
    c->snap_bytes = td_kvmem_state_bytes(l, 0);
    /* nodes never outnumber max_blocks: the table never grows */
    if (td_hmap_create(cfg->max_blocks, &c->nodes) != TD_OK ||
        (c->dem_blocks = calloc(l->nsegs, sizeof(*c->dem_blocks))) == NULL)
        goto err_free;
    if (cfg->host_bytes > 0 || (cfg->ssd_dir != NULL && cfg->ssd_dir[0] != '\0')) {
        td_kvtier_config_t tc = {
            .host_budget = cfg->host_bytes,
            .ssd_dir = cfg->ssd_dir,
            .ssd_budget = cfg->ssd_bytes,
            .layout_hash = l->hash,
            .seed = cfg->seed,
        };

        st = td_kvtier_create(&tc, &c->tier);   /* logs */
        if (st != TD_OK)
            goto err_free;
        c->ssd = cfg->ssd_dir != NULL && cfg->ssd_dir[0] != '\0';
    }
    td_info("prefill rank %u: prefix cache: blocks of %u tokens (%.1f KiB of kv, snapshot "
            "%.1f KiB), %" PRIu64 " in the pool, replay bound %" PRIu64 " tokens; host tier %s, "
            "ssd tier %s", cfg->rank_id, c->G, c->payload_bytes / 1024.0, c->snap_bytes / 1024.0,
            cfg->max_blocks, cfg->replay_bound, cfg->host_bytes ? "on" : "off",
            c->tier != NULL && cfg->ssd_dir != NULL && cfg->ssd_dir[0] ? cfg->ssd_dir : "off");
    *out = c;
    return TD_OK;

err_free:
    td_pcache_destroy(c);
err:
    if (st == TD_ERR_NOMEM)
        td_error("prefill rank %u: prefix cache: out of memory", cfg->rank_id);
    return st;
}

void
td_pcache_destroy(td_pcache_t *c)
{
    pc_node_t *nd;

    if (c == NULL)
        return;
    /* the compute thread is gone: queued work is dropped */
    for (size_t i = 0; i < c->wb.n; i++)
        c->wb.v[i]->pins--;
    for (size_t i = 0; i < c->job_wb.n; i++)
        c->job_wb.v[i]->pins--;
    for (size_t i = 0; i < c->dem.n; i++)
        pc_node_free(c, c->dem.v[i]);
    for (size_t i = 0; i < c->job_dem.n; i++)
        pc_node_free(c, c->job_dem.v[i]);
    while ((nd = TAILQ_FIRST(&c->lru)) != NULL) {
        assert(nd->pins == 0);
        pc_node_drop(c, nd, 0);
    }
    td_kvtier_destroy(c->tier);
    free(c->wb.v);
    free(c->dem.v);
    free(c->job_wb.v);
    free(c->job_dem.v);
    free(c->dem_blocks);
    free(c->added.v);
    free(c->removed.v);
    free(c->out_added.v);
    free(c->out_removed.v);
    td_hmap_destroy(c->nodes);
    free(c->k);
    free(c);
}

/* ---- Lookup ----------------------------------------------------------------------- */

typedef struct {
    uint64_t *hashes;          /* [nblocks] */
    const int32_t *tokens;     /* the prompt (the task's; outlives the hit) */
    pc_node_t **nodes;         /* [npool] pinned */
    uint8_t *snap;             /* a record's snapshot read by td_pcache_load */
} pc_hit_t;

td_status_t
td_pcache_lookup(td_pcache_t *c, const int32_t *tokens, uint64_t n, const uint64_t *hashes,
                 td_pcache_hit_t **out)
{
    uint64_t max = n > 0 ? (n - 1) / c->G : 0, nb = 0, np = 0;
    td_pcache_hit_t *h;
    pc_hit_t *p;
    size_t ids = 0;
    uint8_t *mem;

    *out = NULL;
    /* the pool's run, then the tiers' */
    while (nb < max) {
        pc_node_t *nd = pc_find(c, hashes[nb]);

        if (nd == NULL || memcmp(nd->tokens, tokens + nb * c->G, c->G * sizeof(int32_t)) != 0)
            break;
        nb++;
    }
    np = nb;
    while (nb < max && pc_tier_has(c, hashes[nb]))
        nb++;
    if (nb == 0)
        return TD_OK;
    for (uint32_t s = 0; s < c->l->nsegs; s++)
        ids += c->k[s] * np;
    mem = calloc(1, sizeof(*h) + sizeof(*p) + c->l->nsegs * (sizeof(uint64_t) + sizeof(uint64_t *)) +
                        ids * sizeof(uint64_t) + nb * sizeof(uint64_t) + np * sizeof(pc_node_t *));
    if (mem == NULL) {
        td_warn("prefill rank %u: prefix cache: lookup: out of memory (a miss)", c->cfg.rank_id);
        return TD_OK;
    }
    h = (td_pcache_hit_t *)mem;
    p = (pc_hit_t *)(h + 1);
    h->priv = p;
    h->nblocks = nb;
    h->npool = np;
    h->nprefix = (uint64_t *)(p + 1);
    h->prefix = (uint64_t **)(h->nprefix + c->l->nsegs);
    uint64_t *idp = (uint64_t *)(h->prefix + c->l->nsegs);
    for (uint32_t s = 0; s < c->l->nsegs; s++) {
        h->nprefix[s] = c->k[s] * np;
        h->prefix[s] = idp;
        idp += h->nprefix[s];
    }
    p->hashes = idp;
    memcpy(p->hashes, hashes, nb * sizeof(uint64_t));
    p->nodes = (pc_node_t **)(p->hashes + nb);
    p->tokens = tokens;
    /* touch from the deepest up, so that a prefix's first blocks are the
     * most recently used and leave last */
    for (uint64_t i = np; i-- > 0;) {
        pc_node_t *nd = pc_find(c, hashes[i]);
        uint64_t off = 0;

        p->nodes[i] = nd;
        nd->pins++;
        TAILQ_REMOVE(&c->lru, nd, lru);
        TAILQ_INSERT_TAIL(&c->lru, nd, lru);
        for (uint32_t s = 0; s < c->l->nsegs; s++) {
            for (uint64_t j = 0; j < c->k[s]; j++)
                h->prefix[s][i * c->k[s] + j] = nd->blocks[off + j];
            off += c->k[s];
        }
    }
    *out = h;
    return TD_OK;
}

void
td_pcache_hit_free(td_pcache_t *c, td_pcache_hit_t *hit)
{
    pc_hit_t *p;

    if (hit == NULL)
        return;
    p = hit->priv;
    for (uint64_t i = 0; i < hit->npool; i++) {
        assert(p->nodes[i]->pins > 0);
        p->nodes[i]->pins--;
    }
    free(p->snap);
    free(hit);
}

int
td_pcache_make_room(td_pcache_t *c, const uint64_t *need)
{
    for (;;) {
        int now = 1, soon = 1;

        for (uint32_t s = 0; s < c->l->nsegs; s++) {
            uint64_t f = td_kvpool_seg_free(c->kp, s);
            if (c->l->segs[s].kind != TD_LAYOUT_PAGED)
                continue;
            now &= f >= need[s];
            soon &= f + c->dem_blocks[s] >= need[s];
        }
        if (soon)   /* enough, now or once the queued demotions are done */
            return now;
        if (!pc_evict_one(c))
            return 0;
    }
}

/* ---- Load (compute thread) ---------------------------------------------------------- */

/* Block i's paged bytes from buf into the request's blocks. */
static void
pc_scatter(const td_pcache_t *c, const td_layout_kv_t *kv, uint64_t i, const uint8_t *buf)
{
    for (uint32_t s = 0; s < c->l->nsegs; s++)
        for (uint64_t j = 0; j < c->k[s]; j++) {
            uint64_t bb = (uint64_t)c->l->block_entries * c->l->segs[s].entry_bytes;

            memcpy(kv->blocks[s][i * c->k[s] + j], buf, bb);
            buf += bb;
        }
}

void
td_pcache_prefetch(td_pcache_t *c, uint64_t n, const uint64_t *hashes)
{
    uint64_t max = n > 0 ? (n - 1) / c->G : 0, nb = 0, first;

    if (c->tier == NULL || !c->ssd)
        return;   /* nothing to read ahead */
    while (nb < max && pc_find(c, hashes[nb]) != NULL)
        nb++;
    first = nb;
    while (nb < max && pc_tier_has(c, hashes[nb]))
        nb++;
    if (nb > first)   /* no SSD tier, or a full queue: read when loaded, as without */
        (void)td_kvtier_prefetch(c->tier, hashes + first, nb - first);
}

/* Blocks read from the tiers per get_many. */
#define PC_READ_BATCH 16

void
td_pcache_load(td_pcache_t *c, td_pcache_hit_t *hit, const int32_t *tokens,
               const td_layout_kv_t *kv)
{
    pc_hit_t *p = hit->priv;
    const uint8_t *best = NULL;
    uint64_t best_end = 0, rec = c->payload_bytes + c->snap_bytes;
    uint8_t *bufs = NULL;

    hit->loaded = hit->npool;
    hit->hit_tokens[TD_PCACHE_POOL] = hit->npool * c->G;
    for (uint64_t i = 0; i < hit->npool; i++)   /* nodes are pinned: their snapshots stay */
        if (p->nodes[i]->snap != NULL) {
            best = p->nodes[i]->snap;
            best_end = p->nodes[i]->end;
        }
    if (hit->nblocks > hit->npool && c->tier != NULL)
        bufs = malloc(PC_READ_BATCH * rec);
    for (uint64_t i = hit->npool; i < hit->nblocks && bufs != NULL;) {
        td_kvtier_out_t outs[PC_READ_BATCH];
        size_t k = hit->nblocks - i < PC_READ_BATCH ? hit->nblocks - i : PC_READ_BATCH, got = 0;

        for (size_t j = 0; j < k; j++)
            outs[j] = (td_kvtier_out_t){
                .payload = bufs + j * rec,
                .payload_cap = c->payload_bytes,
                .snapshot = c->snap_bytes ? bufs + j * rec + c->payload_bytes : NULL,
                .snapshot_cap = c->snap_bytes,
            };
        /* a miss or a bad file (logged by the tier) ends the hit there */
        (void)td_kvtier_get_many(c->tier, p->hashes + i, k, tokens + i * c->G, c->G, outs, &got);
        for (size_t j = 0; j < got; j++, i++) {
            const td_kvtier_out_t *o = &outs[j];

            if (o->payload_bytes != c->payload_bytes ||
                (o->snapshot_bytes != 0 && o->snapshot_bytes != c->snap_bytes)) {
                got = 0;   /* another geometry: not ours to use */
                break;
            }
            pc_scatter(c, kv, i, o->payload);
            hit->hit_tokens[o->tier == TD_KVTIER_SSD ? TD_PCACHE_SSD : TD_PCACHE_HOST] += c->G;
            hit->loaded = i + 1;
            if (o->snapshot_bytes != 0 &&
                (p->snap != NULL || (p->snap = malloc(c->snap_bytes)) != NULL)) {
                memcpy(p->snap, o->snapshot, c->snap_bytes);
                best = p->snap;
                best_end = (i + 1) * c->G;
            }
        }
        if (got < k)
            break;
    }
    free(bufs);
    /* the snapshot pays when it leaves less to replay than the bound */
    uint64_t p_end = hit->loaded * c->G;
    uint64_t replay_from = c->cfg.replay_bound > 0 && p_end > c->cfg.replay_bound
                               ? p_end - c->cfg.replay_bound
                               : 0;
    hit->snap_end = 0;
    if (best != NULL && best_end <= p_end && best_end > replay_from) {
        td_kvmem_unpack(kv, 0, best);   /* the fixed segments alone */
        hit->snap_end = best_end;
    }
}

uint8_t *
td_pcache_snapshot(const td_pcache_t *c, const td_layout_kv_t *kv)
{
    uint8_t *snap = malloc(c->snap_bytes ? c->snap_bytes : 1);

    if (snap != NULL)
        td_kvmem_pack(kv, 0, snap);   /* the fixed segments alone, in layout order */
    return snap;
}

void
td_pcache_resync(td_pcache_t *c)
{
    c->cleared = 1;
}

/* ---- Insert ----------------------------------------------------------------------- */

void
td_pcache_insert(td_pcache_t *c, const int32_t *tokens, uint64_t n, const uint64_t *hashes,
                 const td_kvpool_res_t *res, uint8_t *snap, uint64_t snap_end)
{
    uint64_t nb = n / c->G;

    for (uint64_t i = 0; i < nb; i++) {
        pc_node_t *nd = pc_find(c, hashes[i]);
        uint64_t off = 0;

        if (nd != NULL) {
            if (memcmp(nd->tokens, tokens + i * c->G, c->G * sizeof(int32_t)) != 0)
                break;   /* a chain hash collision: keep the one there */
            if (snap != NULL && snap_end == nd->end && nd->snap == NULL && !nd->wb) {
                nd->snap = snap;
                snap = NULL;
            }
            continue;
        }
        if (c->nnodes >= c->cfg.max_blocks && !pc_evict_one(c))
            break;   /* every cached block is in use */
        nd = calloc(1, sizeof(*nd));
        if (nd != NULL) {
            nd->tokens = malloc(c->G * sizeof(int32_t));
            nd->blocks = malloc((c->nblk ? c->nblk : 1) * sizeof(uint64_t));
        }
        if (nd == NULL || nd->tokens == NULL || nd->blocks == NULL) {
            if (nd != NULL) {
                free(nd->tokens);
                free(nd->blocks);
                free(nd);
            }
            td_warn("prefill rank %u: prefix cache: out of memory: block not cached",
                    c->cfg.rank_id);
            break;
        }
        nd->hash = hashes[i];
        nd->parent = i > 0 ? hashes[i - 1] : c->cfg.seed;
        nd->end = (i + 1) * c->G;
        memcpy(nd->tokens, tokens + i * c->G, c->G * sizeof(int32_t));
        for (uint32_t s = 0; s < c->l->nsegs; s++) {
            for (uint64_t j = 0; j < c->k[s]; j++) {
                nd->blocks[off + j] = res->blocks[s][i * c->k[s] + j];
                td_kvpool_hold(c->kp, s, nd->blocks[off + j]);
            }
            off += c->k[s];
        }
        if (snap != NULL && snap_end == nd->end) {
            nd->snap = snap;
            snap = NULL;
        }
        (void)td_hmap_put(c->nodes, nd->hash, (uintptr_t)nd);   /* room made at create */
        TAILQ_INSERT_TAIL(&c->lru, nd, lru);
        c->nnodes++;
        if (!pc_tier_has(c, nd->hash)) {
            pc_list_push(&c->added, nd->hash);
            /* written back to SSD (it survives a restart) by the compute
             * thread: pinned till then */
            if (c->ssd && pc_vec_push(&c->wb, nd)) {
                nd->pins++;
                nd->wb = true;
            }
        }
    }
    free(snap);
}

/* ---- Bulk work (compute thread) --------------------------------------------------- */

/* Records of a batch's nodes written per put (one SSD file each at most). */
#define PC_WORK_BATCH 64u

bool
td_pcache_work_take(td_pcache_t *c)
{
    pc_vec_t t;

    if (c->working || (c->wb.n == 0 && c->dem.n == 0))
        return false;
    t = c->job_wb, c->job_wb = c->wb, c->wb = t;
    t = c->job_dem, c->job_dem = c->dem, c->dem = t;
    c->wb.n = c->dem.n = 0;
    c->working = true;
    return true;
}

/* n nodes' records into the tiers `to` (one put), gathered into buf. */
static void
pc_work_put(td_pcache_t *c, pc_node_t *const *nodes, size_t n, unsigned to, uint8_t *buf,
            td_kvrec_t *recs)
{
    for (size_t i = 0; i < n; i++) {
        pc_gather(c, nodes[i], buf + i * c->payload_bytes);
        pc_record(c, nodes[i], buf + i * c->payload_bytes, &recs[i]);
    }
    (void)td_kvtier_put_many_to(c->tier, recs, n, to);   /* copies; logs */
}

void
td_pcache_work_run(td_pcache_t *c)
{
    uint8_t *buf = malloc(PC_WORK_BATCH * (c->payload_bytes ? c->payload_bytes : 1));
    td_kvrec_t *recs = calloc(PC_WORK_BATCH, sizeof(*recs));

    if (buf == NULL || recs == NULL) {
        td_warn("prefill rank %u: prefix cache: out of memory: %zu blocks not written back, "
                "%zu not demoted", c->cfg.rank_id, c->job_wb.n, c->job_dem.n);
        goto out;
    }
    for (size_t i = 0; i < c->job_wb.n; i += PC_WORK_BATCH)
        pc_work_put(c, c->job_wb.v + i,
                    c->job_wb.n - i < PC_WORK_BATCH ? c->job_wb.n - i : PC_WORK_BATCH,
                    TD_KVTIER_SSD, buf, recs);
    for (size_t i = 0; i < c->job_dem.n; i++) {
        pc_node_t *nd = c->job_dem.v[i];
        /* to the host tier; to SSD again if its file is gone (evicted for
         * budget, or deleted with a bad neighbour while this block was read) */
        unsigned to = TD_KVTIER_HOST | (td_kvtier_has(c->tier, nd->hash) & TD_KVTIER_SSD
                                            ? 0u
                                            : (unsigned)TD_KVTIER_SSD);
        pc_work_put(c, &nd, 1, to, buf, recs);
    }
out:
    free(buf);
    free(recs);
}

void
td_pcache_work_done(td_pcache_t *c)
{
    for (size_t i = 0; i < c->job_wb.n; i++) {
        c->job_wb.v[i]->pins--;
        c->job_wb.v[i]->wb = false;
    }
    for (size_t i = 0; i < c->job_dem.n; i++) {
        for (uint32_t s = 0; s < c->l->nsegs; s++)
            c->dem_blocks[s] -= c->k[s];
        pc_node_free(c, c->job_dem.v[i]);
    }
    c->job_wb.n = c->job_dem.n = 0;
    c->working = false;
}

void
td_pcache_flush(td_pcache_t *c)
{
    pc_node_t *nd, *next;

    for (nd = TAILQ_FIRST(&c->lru); nd != NULL; nd = next) {
        next = TAILQ_NEXT(nd, lru);
        if (pc_node_idle(c, nd))
            pc_node_drop(c, nd, 0);
    }
    if (c->tier != NULL)
        td_kvtier_flush(c->tier);
    c->added.n = c->removed.n = 0;
    c->cleared = 1;   /* the next events carry what is left */
    td_info("prefill rank %u: prefix cache flushed (%" PRIu64 " blocks in use stay)",
            c->cfg.rank_id, c->nnodes);
}

/* ---- Events and counters ----------------------------------------------------------- */

/* Every hash the tiers hold, into l; their pending news is forgotten. */
static void
pc_tier_list(td_pcache_t *c, pc_list_t *l)
{
    size_t n = 0, need = 0;
    uint64_t *v;

    (void)td_kvtier_snapshot(c->tier, NULL, 0, &need);
    v = malloc((need + 64) * sizeof(*v));
    if (v == NULL || td_kvtier_snapshot(c->tier, v, need + 64, &n) != TD_OK)
        n = 0;   /* the routers learn them at the next flush: a hint lost */
    for (size_t i = 0; i < n; i++)
        if (pc_find(c, v[i]) == NULL)
            pc_list_push(l, v[i]);
    free(v);
}

/* The tiers' changes: news for the routers where the pool does not hold the
 * block (then the router knows it already, and keeps it). */
static void
pc_tier_drain(td_pcache_t *c)
{
    uint64_t add[256], rem[256];
    size_t na, nr;
    td_status_t st;

    do {
        st = td_kvtier_drain_events(c->tier, add, 256, &na, rem, 256, &nr);
        for (size_t i = 0; i < na; i++)
            if (pc_find(c, add[i]) == NULL)
                pc_list_push(&c->out_added, add[i]);
        for (size_t i = 0; i < nr; i++)
            if (pc_find(c, rem[i]) == NULL)
                pc_list_push(&c->out_removed, rem[i]);
    } while (st == TD_INPROGRESS);
}

void
td_pcache_events(td_pcache_t *c, int *cleared, const uint64_t **added, size_t *nadded,
                 const uint64_t **removed, size_t *nremoved)
{
    pc_list_t *a = &c->out_added, *r = &c->out_removed;

    a->n = r->n = 0;
    *cleared = c->cleared;
    if (c->cleared) {   /* everything held, from scratch */
        pc_node_t *nd;

        TAILQ_FOREACH(nd, &c->lru, lru)
            pc_list_push(a, nd->hash);
        if (c->tier != NULL)
            pc_tier_list(c, a);
        c->added.n = c->removed.n = 0;
        c->cleared = 0;
    } else {
        for (size_t i = 0; i < c->added.n; i++)
            pc_list_push(a, c->added.v[i]);
        for (size_t i = 0; i < c->removed.n; i++)
            pc_list_push(r, c->removed.v[i]);
        c->added.n = c->removed.n = 0;
        if (c->tier != NULL)
            pc_tier_drain(c);
    }
    *added = a->v;
    *nadded = a->n;
    *removed = r->v;
    *nremoved = r->n;
}

void
td_pcache_stats(const td_pcache_t *c, Tandem__CacheStats *st)
{
    st->pool_blocks = c->nnodes;
    st->pool_bytes = c->nnodes * c->payload_bytes;
    st->lookup_tokens = c->lookup_tokens;
    st->hit_pool_tokens = c->hit_tokens[TD_PCACHE_POOL];
    st->hit_host_tokens = c->hit_tokens[TD_PCACHE_HOST];
    st->hit_ssd_tokens = c->hit_tokens[TD_PCACHE_SSD];
    st->computed_tokens = c->computed;
    st->replay_tokens = c->replayed;
    for (const pc_node_t *nd = TAILQ_FIRST(&c->lru); nd != NULL; nd = TAILQ_NEXT(nd, lru)) {
        st->pinned_blocks += nd->pins > 0;
        st->shared_blocks += !pc_node_idle(c, nd);
    }
    td_kvpool_counts_t kc;   /* blocks in use that the cache does not hold */
    td_kvpool_counts(c->kp, &kc);
    st->reserved_blocks = kc.blocks_used - kc.blocks_held;
    if (c->tier != NULL) {
        td_kvtier_stats_t ts = { 0 };

        td_kvtier_stats(c->tier, &ts);
        st->host_bytes = ts.host_bytes;
        st->host_budget = ts.host_budget;
        st->ssd_bytes = ts.ssd_disk_bytes;
        st->ssd_budget = ts.ssd_budget;
        st->prefetch_blocks = ts.prefetched;
        st->prefetch_unused_blocks = ts.prefetch_unused;
    }
}

void
td_pcache_count(td_pcache_t *c, uint64_t lookup, const td_pcache_hit_t *hit, uint64_t computed,
                uint64_t replayed)
{
    c->lookup_tokens += lookup;
    if (hit != NULL)
        for (int i = 0; i < 3; i++)
            c->hit_tokens[i] += hit->hit_tokens[i];
    c->computed += computed;
    c->replayed += replayed;
}
