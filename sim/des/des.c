/* sim/des/des.c — the cluster model (des.h): an event heap on virtual
 * time; prefill groups whose ranks each prefill their queue chunk by chunk
 * and keep an LRU prefix cache they announce to the router; decode domains
 * whose ranks admit by KV blocks and batch rows, send the prefill's first
 * token when they adopt the KV (between steps), and step together; and the
 * router's part done by routerd's own code (rsched, rcache, rqueue). */
#include "des.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "chainhash.h"
#include "hmap.h"
#include "log.h"
#include "rcache.h"
#include "rng.h"
#include "rqueue.h"
#include "rrank.h"
#include "rsched.h"

/* ======================================================================= */
/* The built-in cost                                                        */
/* ======================================================================= */

static double
linear_prefill(void *arg, uint64_t n, uint64_t before, uint32_t ranks)
{
    const td_des_linear_t *l = arg;

    (void)ranks;
    return l->prefill_fixed_s + l->prefill_token_s * (double)n +
           l->prefill_attn_s * (double)n * ((double)before + (double)n / 2);
}

static double
linear_decode(void *arg, uint32_t rows, uint64_t sum_ctx, uint32_t ranks)
{
    const td_des_linear_t *l = arg;

    (void)ranks;
    return l->decode_fixed_s + l->decode_row_s * rows + l->decode_ctx_s * (double)sum_ctx;
}

static double
linear_xfer(void *arg, uint64_t n)
{
    const td_des_linear_t *l = arg;

    return l->xfer_fixed_s + l->xfer_token_s * (double)n;
}

td_des_cost_t
td_des_linear_cost(td_des_linear_t *l)
{
    return (td_des_cost_t){ linear_prefill, linear_decode, linear_xfer, l };
}

void
td_des_config_defaults(td_des_config_t *cfg)
{
    *cfg = (td_des_config_t){
        .prefill_groups = 6, .group_gpus = 4, .decode_gpus = 72, .decode_domain = 8,
        .chunk_tokens = 512, .prefill_max_running = 8, .cache_block_tokens = 512, .cache_blocks = 16384,
        .cache_weight = 1.0, .kv_tokens = 1u << 20, .kv_block_tokens = 64, .max_batch = 64,
        .max_context = 131072, .max_queued = 1u << 20, .trace_block_tokens = 512,
    };
}

const char *
td_des_outcome_str(td_des_outcome_t o)
{
    static const char *const names[] = { "pending", "done", "too_long", "refused" };

    return (unsigned)o <= TD_DES_REFUSED ? names[o] : "?";
}

/* ======================================================================= */
/* Types                                                                    */
/* ======================================================================= */

#define NONE UINT32_MAX

/* A rank's prefix cache: an LRU of chain hashes (what prefilld's pcache
 * keys its blocks by), capacity in blocks. A hash table (base/hmap.h) of
 * node indices; list most recently used last. */
typedef struct {
    uint64_t h;
    uint32_t prev, next;        /* LRU */
} lru_node_t;

typedef struct {
    lru_node_t *nodes;
    uint32_t nnodes, capnodes;
    td_hmap_t *map;             /* hash -> node index, room for capnodes; NULL until
                                   the first node */
    uint32_t head, tail;        /* least / most recently used */
    uint64_t max;
    uint64_t *added, *removed;  /* the last insert's announcement */
    size_t nadded, nremoved, capann;
    uint64_t seq;               /* announcements made */
} lru_t;

/* The model's state of one request (same index as its td_des_req_t). */
typedef struct {
    td_rqueue_entry_t qe;
    td_rcache_prompt_t prompt;  /* until admitted */
    int32_t *tokens;            /* [input] until admitted */
    uint64_t *h;                /* [nh] chain hashes of its cache blocks */
    size_t nh;
    uint64_t tried[TD_RSCHED_MAX_TRIED];
    size_t ntried;
    uint32_t attempts, bounced;
    uint32_t prev, next;        /* in a prefill run queue or (next) a ready list */
    bool started;               /* its prefill task is running (the cache looked up) */
    uint64_t done;              /* prompt tokens in the KV (cached or computed) */
    uint32_t produced;          /* output tokens so far */
} rs_t;

/* A rank's prefill work as prefilld schedules it: one run queue of tasks,
 * queued (not started) and running, in order; up to max_running run. */
typedef struct {
    uint32_t head, tail;        /* the run queue (rs_t.prev / next) */
    uint32_t queued;            /* tasks not started */
    uint32_t running;           /* started, not done (in the queue or cur) */
    uint32_t cur;               /* the running step's task (NONE: none) */
    uint32_t chunk;             /* its chunk's tokens */
    uint64_t queued_tokens;     /* prompt tokens not yet prefilled (nor cached), all tasks */
    lru_t lru;
} pwork_t;

typedef struct {
    td_rrank_t rr;              /* the router's view */
    Tandem__Register reg;
    char domain[32];
    uint32_t group;
    pwork_t w;
} prank_t;

typedef struct {
    uint32_t first, n;          /* its ranks */
    bool stepping;
} pgroup_t;

typedef struct {
    td_rrank_t rr;
    Tandem__Register reg;
    char domain[32];
    uint32_t dom;
    uint64_t blocks_total, blocks_free;
    uint32_t rows;              /* admitted, not ended: each holds a batch row */
    uint32_t *run;              /* [max_batch] in the batch */
    uint32_t nrun;
    uint64_t sum_ctx;           /* of the batch */
    uint32_t ready_head, ready_tail;   /* KV here, joins at the next step */
    pwork_t w;                  /* colocated: its prefill work */
} drank_t;

typedef struct {
    uint32_t first, n;
    bool stepping;
} ddomain_t;

typedef enum { EV_ARRIVAL, EV_PREFILL_STEP, EV_XFER_DONE, EV_DECODE_STEP } ev_kind_t;

typedef struct {
    double t;
    uint64_t seq;
    ev_kind_t kind;
    uint32_t arg;
} ev_t;

struct td_des_s {
    td_des_config_t cfg;
    ev_t *heap;
    size_t nheap, capheap;
    uint64_t seq, nevents;
    double now;
    uint64_t chain_seed;
    td_rrank_node_t node;       /* every rank's node (never drained) */
    td_rrank_t *plist;          /* the router's table of prefill ranks (the decode
                                   ranks': a list per domain, pick_decode) */
    prank_t *pr;
    uint32_t npr;
    pgroup_t *pg;
    uint32_t npg;
    drank_t *dr;
    uint32_t ndr;
    ddomain_t *dd;
    uint32_t ndd;
    struct event_base *base;    /* the queue's; never dispatched */
    td_rqueue_t *queue;
    bool pass_due;              /* capacity may have freed: a queue pass after this event */
    td_des_req_t *reqs;
    rs_t *rs;
    size_t nreq, next_arrival;
    bool ran;
};

/* ======================================================================= */
/* The event heap                                                           */
/* ======================================================================= */

static bool
ev_before(const ev_t *a, const ev_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static td_status_t
ev_push(td_des_t *d, double t, ev_kind_t kind, uint32_t arg)
{
    if (d->nheap == d->capheap) {
        size_t cap = d->capheap ? d->capheap * 2 : 256;
        ev_t *h = realloc(d->heap, cap * sizeof *h);
        if (!h)
            return TD_ERR_NOMEM;
        d->heap = h;
        d->capheap = cap;
    }
    ev_t e = { t, d->seq++, kind, arg };
    size_t i = d->nheap++;
    while (i > 0 && ev_before(&e, &d->heap[(i - 1) / 2])) {
        d->heap[i] = d->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    d->heap[i] = e;
    return TD_OK;
}

static ev_t
ev_pop(td_des_t *d)
{
    ev_t top = d->heap[0], last = d->heap[--d->nheap];
    size_t i = 0, n = d->nheap;

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ev_before(&d->heap[c + 1], &d->heap[c]))
            c++;
        if (!ev_before(&d->heap[c], &last))
            break;
        d->heap[i] = d->heap[c];
        i = c;
    }
    if (n > 0)
        d->heap[i] = last;
    return top;
}

/* ======================================================================= */
/* The prefix cache (LRU of chain hashes)                                   */
/* ======================================================================= */

static void
lru_init(lru_t *c, uint64_t max)
{
    memset(c, 0, sizeof *c);
    c->head = c->tail = NONE;
    c->max = max;
}

static void
lru_fini(lru_t *c)
{
    free(c->nodes);
    td_hmap_destroy(c->map);
    free(c->added);
    free(c->removed);
    memset(c, 0, sizeof *c);
}

static uint32_t
lru_find(const lru_t *c, uint64_t h)
{
    uint64_t v = c->map != NULL ? td_hmap_get(c->map, h) : TD_HMAP_NONE;

    return v != TD_HMAP_NONE ? (uint32_t)v : NONE;
}

static void
lru_unlink(lru_t *c, uint32_t i)
{
    lru_node_t *nd = &c->nodes[i];

    if (nd->prev != NONE)
        c->nodes[nd->prev].next = nd->next;
    else
        c->head = nd->next;
    if (nd->next != NONE)
        c->nodes[nd->next].prev = nd->prev;
    else
        c->tail = nd->prev;
}

static void
lru_append(lru_t *c, uint32_t i)
{
    c->nodes[i].prev = c->tail;
    c->nodes[i].next = NONE;
    if (c->tail != NONE)
        c->nodes[c->tail].next = i;
    else
        c->head = i;
    c->tail = i;
}

static void
lru_touch(lru_t *c, uint32_t i)
{
    if (c->tail != i) {
        lru_unlink(c, i);
        lru_append(c, i);
    }
}

static td_status_t
lru_grow(lru_t *c)
{
    uint32_t cap = c->capnodes ? c->capnodes * 2 : 1024;
    lru_node_t *nodes = realloc(c->nodes, (size_t)cap * sizeof *nodes);

    if (!nodes)
        return TD_ERR_NOMEM;
    c->nodes = nodes;
    if ((c->map == NULL && td_hmap_create(cap, &c->map) != TD_OK) ||
        td_hmap_reserve(c->map, cap) != TD_OK)
        return TD_ERR_NOMEM;
    c->capnodes = cap;
    return TD_OK;
}

/* Room for one more hash in both announcement arrays. */
static td_status_t
ann_room(lru_t *c)
{
    size_t need = c->nadded > c->nremoved ? c->nadded : c->nremoved;

    if (need < c->capann)
        return TD_OK;
    size_t cap = c->capann ? c->capann * 2 : 64;
    uint64_t *a = realloc(c->added, cap * sizeof *a);
    if (!a)
        return TD_ERR_NOMEM;
    c->added = a;
    uint64_t *r = realloc(c->removed, cap * sizeof *r);
    if (!r)
        return TD_ERR_NOMEM;
    c->removed = r;
    c->capann = cap;
    return TD_OK;
}

/* The longest prefix of h[0..n) held, touched as used (a hit's blocks). */
static size_t
lru_prefix(lru_t *c, const uint64_t *h, size_t n)
{
    size_t k = 0;
    uint32_t i;

    while (k < n && (i = lru_find(c, h[k])) != NONE) {
        lru_touch(c, i);
        k++;
    }
    return k;
}

/* Keep h[0..n) (a prompt's whole blocks, in order) as most recently used,
 * evicting the least recently used beyond max; c->added / c->removed say
 * what changed. */
static td_status_t
lru_insert(lru_t *c, const uint64_t *h, size_t n)
{
    td_status_t st;

    c->nadded = c->nremoved = 0;
    if (c->max == 0)
        return TD_OK;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = lru_find(c, h[k]);
        if (i != NONE) {
            lru_touch(c, i);
            continue;
        }
        if ((st = ann_room(c)) != TD_OK)
            return st;
        if (c->nnodes >= c->max) {
            /* full: the least recently used goes (never one of this prompt's
             * earlier blocks: they were just touched) */
            i = c->head;
            lru_unlink(c, i);
            td_hmap_del(c->map, c->nodes[i].h);
            c->removed[c->nremoved++] = c->nodes[i].h;
        } else {
            if (c->nnodes == c->capnodes && (st = lru_grow(c)) != TD_OK)
                return st;
            i = c->nnodes++;
        }
        c->nodes[i].h = h[k];
        (void)td_hmap_put(c->map, h[k], i);   /* room for capnodes: no allocation */
        lru_append(c, i);
        c->added[c->nadded++] = h[k];
    }
    return TD_OK;
}

/* ======================================================================= */
/* Ranks as the router sees them (what cluster.c does on Register, Load     */
/* and CacheEvent)                                                          */
/* ======================================================================= */

static void
rank_register(td_des_t *d, td_rrank_t *rr, Tandem__Register *reg, Tandem__Role role,
              uint32_t id, const char *domain, uint32_t dep_rank, uint32_t dep_size)
{
    const td_des_config_t *c = &d->cfg;

    *reg = (Tandem__Register)TANDEM__REGISTER__INIT;
    reg->max_context = c->max_context;
    if (role == TANDEM__ROLE__ROLE_DECODE) {
        reg->kv_tokens_total = c->kv_tokens / c->kv_block_tokens * c->kv_block_tokens;
        reg->max_batch = c->max_batch;
    } else {
        reg->cache_block_tokens = c->cache_blocks > 0 ? c->cache_block_tokens : 0;
    }
    if (dep_size > 1) {
        reg->dep_domain = (char *)domain;
        reg->dep_rank = dep_rank;
        reg->dep_size = dep_size;
    }
    memset(rr, 0, sizeof *rr);
    rr->node = &d->node;
    /* connected: the state reads only whether there is a connection, and
     * the model sends nothing through it */
    rr->conn = (td_ctl_conn_t *)(void *)&d->node;
    rr->rank_id = id;
    rr->role = role;
    rr->incarnation = ((uint64_t)role << 32) | id;
    rr->reg = reg;
    rr->load.kv_tokens_free = reg->kv_tokens_total;
    td_rcache_init(&rr->cache, TD_RCACHE_MAX_DEFAULT);
}

/* A Load arrives: the rank's latest state, and what the router sent since
 * is in it (td_rrank_load, as cluster.c's on_load takes one). */
static void
rank_load(td_rrank_t *rr, const Tandem__Load *ld)
{
    td_rrank_load(rr, ld);
}

static void
prank_publish(prank_t *p)
{
    Tandem__Load ld = TANDEM__LOAD__INIT;

    ld.running = p->w.running;
    ld.queued = p->w.queued;
    ld.queued_tokens = p->w.queued_tokens;
    rank_load(&p->rr, &ld);
}

static void
drank_publish(td_des_t *d, drank_t *r)
{
    Tandem__Load ld = TANDEM__LOAD__INIT;
    uint64_t bt = d->cfg.kv_block_tokens;

    ld.kv_blocks_free = r->blocks_free;
    ld.kv_blocks_used = r->blocks_total - r->blocks_free;
    ld.kv_tokens_free = r->blocks_free * bt;
    ld.kv_tokens_used = ld.kv_blocks_used * bt;
    ld.running = r->nrun;
    ld.queued = r->rows - r->nrun;
    ld.queued_tokens = r->w.queued_tokens;
    rank_load(&r->rr, &ld);
}

/* The rank's cache changed: its CacheEvent, applied in order. */
static void
cache_announce(td_rrank_t *rr, lru_t *c)
{
    const char *why = "";
    td_status_t st;

    if (c->nadded == 0 && c->nremoved == 0)
        return;
    td_rcache_event_t ev = { .seq = ++c->seq, .added = c->added, .nadded = c->nadded,
                             .removed = c->removed, .nremoved = c->nremoved };
    st = td_rcache_apply(&rr->cache, &ev, &why);
    if (st != TD_OK && st != TD_ERR_TOO_BIG)
        td_warn("model: prefill rank %u: cache event %llu: %s %s", rr->rank_id,
                (unsigned long long)ev.seq, td_status_str(st), why);
}

/* ======================================================================= */
/* Prefill work (a prefill rank's, or a colocated decode rank's)            */
/* ======================================================================= */

static void
pwork_init(pwork_t *w)
{
    w->head = w->tail = w->cur = NONE;
}

static void
runq_append(td_des_t *d, pwork_t *w, uint32_t q)
{
    d->rs[q].next = NONE;
    d->rs[q].prev = w->tail;
    if (w->tail != NONE)
        d->rs[w->tail].next = q;
    else
        w->head = q;
    w->tail = q;
}

static void
runq_unlink(td_des_t *d, pwork_t *w, uint32_t q)
{
    rs_t *s = &d->rs[q];

    if (s->prev != NONE)
        d->rs[s->prev].next = s->next;
    else
        w->head = s->next;
    if (s->next != NONE)
        d->rs[s->next].prev = s->prev;
    else
        w->tail = s->prev;
}

/* A Prefill arrives: a task at the back of the run queue. */
static void
pwork_push(td_des_t *d, pwork_t *w, uint32_t q)
{
    runq_append(d, w, q);
    w->queued++;
    w->queued_tokens += d->reqs[q].input;
}

/* prefilld's task_try_start: with a run slot free the task starts, its
 * cache looked up: the longest cached chain prefix, at most (n - 1) / G
 * blocks so that a token is left to compute (pcache.h). */
static bool
pwork_try_start(td_des_t *d, pwork_t *w, uint32_t q)
{
    td_des_req_t *r = &d->reqs[q];
    rs_t *s = &d->rs[q];

    if (s->started)
        return true;
    if (w->running >= d->cfg.prefill_max_running)
        return false;
    uint32_t g = d->cfg.cache_block_tokens;
    size_t most = g ? (r->input - 1) / g : 0;
    size_t k = lru_prefix(&w->lru, s->h, s->nh < most ? s->nh : most);
    s->started = true;
    s->done = (uint64_t)k * g;
    r->cached_tokens = s->done;
    r->t_prefill_start = d->now;
    w->queued_tokens -= s->done;
    w->queued--;
    w->running++;
    return true;
}

/* The next chunk, as prefilld's prank_schedule hands them to the compute
 * thread: the first task in the run queue whose work left fits in one chunk
 * and that runs or can start, else the first that runs or can start; after
 * its chunk a task goes to the back. Returns the step's seconds (0: no
 * work). */
static double
pwork_chunk(td_des_t *d, pwork_t *w, uint32_t ranks)
{
    uint32_t q;

    w->cur = NONE;
    w->chunk = 0;
    for (q = w->head; q != NONE; q = d->rs[q].next)
        if (d->reqs[q].input - d->rs[q].done <= d->cfg.chunk_tokens &&
            pwork_try_start(d, w, q))
            break;
    if (q == NONE)
        for (q = w->head; q != NONE; q = d->rs[q].next)
            if (pwork_try_start(d, w, q))
                break;
    if (q == NONE)
        return 0;
    runq_unlink(d, w, q);
    uint64_t left = d->reqs[q].input - d->rs[q].done;
    w->cur = q;
    w->chunk = (uint32_t)(left < d->cfg.chunk_tokens ? left : d->cfg.chunk_tokens);
    return d->cfg.cost.prefill_s(d->cfg.cost.arg, w->chunk, d->rs[q].done, ranks);
}

/* The step's chunk is done: the request when its prompt is (its blocks
 * cached and announced), else NONE (the task to the back of the run queue). */
static uint32_t
pwork_chunk_done(td_des_t *d, pwork_t *w, td_rrank_t *rr)
{
    uint32_t q = w->cur;
    rs_t *s;

    if (q == NONE)
        return NONE;
    s = &d->rs[q];
    s->done += w->chunk;
    w->queued_tokens -= w->chunk;
    w->chunk = 0;
    w->cur = NONE;
    if (s->done < d->reqs[q].input) {
        runq_append(d, w, q);
        return NONE;
    }
    w->running--;
    d->reqs[q].t_prefill_end = d->now;
    if (lru_insert(&w->lru, s->h, s->nh) == TD_OK) {
        if (rr->role == TANDEM__ROLE__ROLE_PREFILL)
            cache_announce(rr, &w->lru);
    } else {
        td_warn("model: rank %u: out of memory for its prefix cache", rr->rank_id);
    }
    return q;
}

/* ======================================================================= */
/* Steps: a prefill group's, a decode domain's                              */
/* ======================================================================= */

static td_status_t
pgroup_step(td_des_t *d, uint32_t g)
{
    pgroup_t *pg = &d->pg[g];
    double dt = 0;
    bool any = false;

    for (uint32_t i = pg->first; i < pg->first + pg->n; i++) {
        prank_t *p = &d->pr[i];
        double t = pwork_chunk(d, &p->w, pg->n);
        if (p->w.chunk > 0) {
            any = true;
            dt = t > dt ? t : dt;
        }
        prank_publish(p);
    }
    pg->stepping = any;
    return any ? ev_push(d, d->now + dt, EV_PREFILL_STEP, g) : TD_OK;
}

static td_status_t
on_prefill_step(td_des_t *d, uint32_t g)
{
    pgroup_t *pg = &d->pg[g];
    td_status_t st;

    for (uint32_t i = pg->first; i < pg->first + pg->n; i++) {
        prank_t *p = &d->pr[i];
        uint32_t q = pwork_chunk_done(d, &p->w, &p->rr);
        if (q != NONE &&
            (st = ev_push(d, d->now + d->cfg.cost.kv_xfer_s(d->cfg.cost.arg, d->reqs[q].input),
                          EV_XFER_DONE, q)) != TD_OK)
            return st;
    }
    return pgroup_step(d, g);
}

static void
ready_push(td_des_t *d, drank_t *r, uint32_t q)
{
    d->rs[q].next = NONE;
    if (r->ready_tail != NONE)
        d->rs[r->ready_tail].next = q;
    else
        r->ready_head = q;
    r->ready_tail = q;
}

static uint64_t
req_blocks(const td_des_t *d, const td_des_req_t *r)
{
    uint64_t bt = d->cfg.kv_block_tokens;

    return ((uint64_t)r->input + r->output + bt - 1) / bt;
}

/* The model is done with request q: what it kept for it is freed. */
static void
req_release(td_des_t *d, uint32_t q)
{
    rs_t *s = &d->rs[q];

    td_rqueue_entry_fini(&s->qe);
    td_rcache_prompt_fini(&s->prompt);
    free(s->tokens);
    s->tokens = NULL;
    free(s->h);
    s->h = NULL;
}

/* q's last token is out: its blocks and row go back (a queue pass follows). */
static void
req_finish(td_des_t *d, drank_t *r, uint32_t q)
{
    td_des_req_t *rq = &d->reqs[q];

    rq->t_last = d->now;
    rq->outcome = TD_DES_DONE;
    r->blocks_free += req_blocks(d, rq);
    r->rows--;
    r->rr.inflight--;
    req_release(d, q);
    d->pass_due = true;
}

/* The prefill's first token is out now (the prefill rank sampled it; a
 * decode rank sends it once it adopted the KV): true when it was the last. */
static bool
req_first_token(td_des_t *d, drank_t *r, uint32_t q)
{
    if (d->rs[q].produced > 0)
        return false;
    d->rs[q].produced = 1;
    d->reqs[q].t_first = d->now;
    if (d->reqs[q].output > 1)
        return false;
    req_finish(d, r, q);
    return true;
}

static td_status_t
ddomain_step(td_des_t *d, uint32_t k)
{
    ddomain_t *dd = &d->dd[k];
    double dt = 0;
    bool any = false;

    for (uint32_t i = dd->first; i < dd->first + dd->n; i++) {
        drank_t *r = &d->dr[i];
        double t = 0;
        /* the KV arrived: adopted on the compute thread between steps, the
         * prefill's first token sent then, the row in the batch from here */
        while (r->ready_head != NONE) {
            uint32_t q = r->ready_head;
            r->ready_head = d->rs[q].next;
            if (req_first_token(d, r, q))
                continue;
            r->run[r->nrun++] = q;
            r->sum_ctx += d->reqs[q].input + d->rs[q].produced;
        }
        r->ready_tail = NONE;
        if (r->nrun > 0)
            t += d->cfg.cost.decode_step_s(d->cfg.cost.arg, r->nrun, r->sum_ctx, dd->n);
        if (d->cfg.colocated)
            t += pwork_chunk(d, &r->w, dd->n);   /* prefill first: one chunk with the rows */
        if (r->nrun > 0 || r->w.chunk > 0) {
            any = true;
            dt = t > dt ? t : dt;
        }
        drank_publish(d, r);
    }
    dd->stepping = any;
    return any ? ev_push(d, d->now + dt, EV_DECODE_STEP, k) : TD_OK;
}

static td_status_t
on_decode_step(td_des_t *d, uint32_t k)
{
    ddomain_t *dd = &d->dd[k];

    for (uint32_t i = dd->first; i < dd->first + dd->n; i++) {
        drank_t *r = &d->dr[i];
        for (uint32_t j = 0; j < r->nrun; j++) {
            uint32_t q = r->run[j];
            td_des_req_t *rq = &d->reqs[q];
            rs_t *s = &d->rs[q];
            s->produced++;
            r->sum_ctx++;
            if (s->produced < rq->output)
                continue;
            r->sum_ctx -= rq->input + s->produced;
            req_finish(d, r, q);
            r->run[j--] = r->run[--r->nrun];
        }
        if (d->cfg.colocated) {
            uint32_t q = pwork_chunk_done(d, &r->w, &r->rr);
            if (q != NONE && !req_first_token(d, r, q))
                ready_push(d, r, q);
        }
        drank_publish(d, r);
    }
    return ddomain_step(d, k);
}

static td_status_t
on_xfer_done(td_des_t *d, uint32_t q)
{
    td_des_req_t *r = &d->reqs[q];
    drank_t *dr = &d->dr[r->decode_rank];

    d->pr[r->prefill_rank].rr.inflight--;   /* PrefillDone */
    ready_push(d, dr, q);
    return d->dd[dr->dom].stepping ? TD_OK : ddomain_step(d, dr->dom);
}

/* ======================================================================= */
/* The router: routerd's admission (rreq.c admit_try) over its rank table   */
/* ======================================================================= */

/* td_rsched_pick_decode over the decode ranks. The table is kept as one
 * list per domain (the domains in table order: domain k's last rank links
 * to nothing); pick_full links them into one table for the call. Otherwise
 * each domain is asked on its own (rsched's pick looks at every rank of the
 * table for each rank of a domain: O(ranks^2)) and the domains' offers
 * compete by rsched's rule (the least loaded, then the most free KV, then
 * the first in the table), which gives the same rank. */
static td_rsched_fit_t
pick_decode(td_des_t *d, uint64_t need, const uint64_t *tried, size_t ntried,
            td_rrank_t **out)
{
    td_rsched_fit_t best_fit = TD_RSCHED_NONE, fit;
    td_rrank_t *best = NULL, *rk;
    uint64_t best_free = 0, best_load = 0;

    if (d->cfg.pick_full) {
        for (uint32_t k = 0; k + 1 < d->ndd; k++)
            d->dr[d->dd[k].first + d->dd[k].n - 1].rr.next = &d->dr[d->dd[k + 1].first].rr;
        fit = td_rsched_pick_decode(&d->dr[0].rr, need, tried, ntried, out);
        for (uint32_t k = 0; k + 1 < d->ndd; k++)
            d->dr[d->dd[k].first + d->dd[k].n - 1].rr.next = NULL;
        return fit;
    }
    for (uint32_t k = 0; k < d->ndd; k++) {
        fit = td_rsched_pick_decode(&d->dr[d->dd[k].first].rr, need, tried, ntried, &rk);
        if (fit != TD_RSCHED_FITS) {
            /* the whole table's answer when none fits: busy if a domain could
             * hold it later, too long when every one says so */
            if (best_fit != TD_RSCHED_FITS &&
                (fit == TD_RSCHED_BUSY || (fit == TD_RSCHED_TOO_LONG && best_fit == TD_RSCHED_NONE)))
                best_fit = fit;
            continue;
        }
        td_rrank_room_t room = td_rrank_room(rk);   /* as rsched.c reckons it */
        if (!best || room.rows < best_load ||
            (room.rows == best_load && room.free_tok > best_free)) {
            best = rk;
            best_free = room.free_tok;
            best_load = room.rows;
        }
        best_fit = TD_RSCHED_FITS;
    }
    if (best)
        *out = best;
    return best_fit;
}

static void
req_fail(td_des_t *d, uint32_t q, td_des_outcome_t o)
{
    d->reqs[q].outcome = o;
    req_release(d, q);
}

/* The decode rank's side of Admit: every block of prompt + output and a
 * batch row, or NO_CAPACITY. */
static bool
decode_admit(td_des_t *d, drank_t *r, uint32_t q)
{
    uint64_t nb = req_blocks(d, &d->reqs[q]);

    if (r->blocks_free < nb || r->rows >= d->cfg.max_batch)
        return false;
    r->blocks_free -= nb;
    r->rows++;
    drank_publish(d, r);
    return true;
}

/* Choose the ranks of q and send it on, or queue it, or end it: routerd's
 * admit_try. Returns whether q waits. */
static td_status_t
admit_try(td_des_t *d, uint32_t q, bool *waits)
{
    td_des_req_t *r = &d->reqs[q];
    rs_t *s = &d->rs[q];
    uint64_t need = (uint64_t)r->input + r->output;
    td_status_t st;

    *waits = false;
    for (;;) {
        td_rsched_prefill_t pick = { NULL, 0, false };
        td_rrank_t *dk = NULL;
        td_rsched_fit_t fit;

        if (s->ntried >= TD_RSCHED_MAX_TRIED) {
            req_fail(d, q, TD_DES_REFUSED);
            return TD_OK;
        }
        if (!d->cfg.colocated)
            pick = td_rsched_pick_prefill(d->plist, &s->prompt, d->cfg.cache_weight);
        fit = pick.rank || d->cfg.colocated
              ? pick_decode(d, need, s->tried, s->ntried, &dk)
              : TD_RSCHED_NONE;
        /* a request not in the queue goes behind the ones waiting before it */
        if (fit == TD_RSCHED_FITS && !s->qe.q && td_rqueue_ahead(d->queue, &s->qe))
            fit = TD_RSCHED_BUSY;
        if (fit == TD_RSCHED_BUSY) {
            if (s->qe.q) {
                *waits = true;
                return TD_OK;
            }
            st = td_rqueue_push(d->queue, &s->qe, s->attempts == 0);
            if (st == TD_ERR_NOMEM)
                return st;
            if (st != TD_OK)
                req_fail(d, q, TD_DES_REFUSED);
            *waits = st == TD_OK;
            return TD_OK;
        }
        if (fit != TD_RSCHED_FITS) {
            req_fail(d, q, fit == TD_RSCHED_TOO_LONG ? TD_DES_TOO_LONG : TD_DES_REFUSED);
            return TD_OK;
        }
        td_rqueue_remove(&s->qe);
        s->attempts++;
        r->pred_cached = pick.cached_tokens;
        r->by_cache = pick.by_cache;
        /* Admit to the decode rank */
        drank_t *dr = (drank_t *)(void *)dk;
        td_rrank_admit_sent(dk, need);
        td_rrank_admit_answered(dk, need);   /* at once: no time on the wire */
        if (!decode_admit(d, dr, q)) {
            td_rrank_admit_freed(dk, need);
            dk->refused = true;   /* AdmitReject NO_CAPACITY: not chosen until its next Load */
            s->bounced++;
            continue;
        }
        dk->inflight++;
        r->decode_rank = (uint32_t)(dr - d->dr);
        r->t_admit = d->now;
        /* the prompt's tokens and hashes were the router's; the rank keeps its hashes */
        td_rcache_prompt_fini(&s->prompt);
        free(s->tokens);
        s->tokens = NULL;
        if (d->cfg.colocated) {
            r->prefill_rank = r->decode_rank;
            pwork_push(d, &dr->w, q);
            if (!d->dd[dr->dom].stepping)
                return ddomain_step(d, dr->dom);
            return TD_OK;
        }
        /* AdmitOk: Prefill to the prefill rank */
        prank_t *p = (prank_t *)(void *)pick.rank;
        pick.rank->inflight++;
        pick.rank->pend_tokens += r->input - r->pred_cached;
        pick.rank->pend_reqs++;
        pick.rank->cache_ctr.placed++;
        pick.rank->cache_ctr.prompt_tokens += r->input;
        pick.rank->cache_ctr.predicted_cached += r->pred_cached;
        pick.rank->cache_ctr.by_cache += r->by_cache;
        r->prefill_rank = (uint32_t)(p - d->pr);
        pwork_push(d, &p->w, q);
        prank_publish(p);
        if (!d->pg[p->group].stepping)
            return pgroup_step(d, p->group);
        return TD_OK;
    }
}

/* Capacity may have freed: place from the head until one waits
 * (rreq.c queue_pass). */
static td_status_t
queue_pass(td_des_t *d)
{
    td_rqueue_entry_t *qe;
    bool waits = false;
    td_status_t st;

    while (!waits && (qe = td_rqueue_head(d->queue)) != NULL)
        if ((st = admit_try(d, (uint32_t)((rs_t *)(void *)qe - d->rs), &waits)) != TD_OK)
            return st;
    return TD_OK;
}

/* A request arrives: its prompt as token ids (block id b: trace_block_tokens
 * tokens of value b, so equal leading ids give equal chain hashes), its
 * cache blocks' hashes once, and the router tries to place it. */
static td_status_t
on_arrival(td_des_t *d, uint32_t q)
{
    td_des_req_t *r = &d->reqs[q];
    rs_t *s = &d->rs[q];
    uint32_t tb = d->cfg.trace_block_tokens, g = d->cfg.cache_block_tokens;
    bool waits;

    s->tokens = malloc((size_t)r->input * sizeof *s->tokens);
    if (!s->tokens)
        return TD_ERR_NOMEM;
    for (uint32_t i = 0; i < r->input; i++) {
        uint32_t b = i / tb;
        s->tokens[i] = (int32_t)((b < r->nblocks ? r->block_ids[b] : UINT32_MAX) & 0x7fffffff);
    }
    td_rcache_prompt_init(&s->prompt, d->chain_seed, s->tokens, r->input);
    if (g > 0 && d->cfg.cache_blocks > 0) {
        size_t n;
        const uint64_t *h = td_rcache_prompt_hashes(&s->prompt, g, &n);
        if (n > 0) {
            s->h = malloc(n * sizeof *s->h);
            if (!s->h)
                return TD_ERR_NOMEM;
            memcpy(s->h, h, n * sizeof *h);
            s->nh = n;
        }
    }
    td_rqueue_entry_init(d->queue, &s->qe, 0);
    if (d->cfg.max_context && r->input + (uint64_t)r->output > d->cfg.max_context) {
        req_fail(d, q, TD_DES_TOO_LONG);
        return TD_OK;
    }
    return admit_try(d, q, &waits);
}

/* ======================================================================= */
/* The model's life                                                          */
/* ======================================================================= */

td_status_t
td_des_create(const td_des_config_t *cfg, td_des_t **out)
{
    const td_des_config_t *c = cfg;
    td_des_t *d;

    if (c->decode_gpus == 0 || c->decode_domain == 0 || c->kv_block_tokens == 0 ||
        c->chunk_tokens == 0 || c->prefill_max_running == 0 || c->max_batch == 0 || c->trace_block_tokens == 0 ||
        c->kv_tokens < c->kv_block_tokens || !c->cost.prefill_s || !c->cost.decode_step_s ||
        !c->cost.kv_xfer_s || (!c->colocated && (c->prefill_groups == 0 || c->group_gpus == 0))) {
        td_error("model: a configuration without ranks, blocks, rows or a cost model");
        return TD_ERR_INVALID;
    }
    d = calloc(1, sizeof *d);
    if (!d)
        return TD_ERR_NOMEM;
    d->cfg = *cfg;
    d->chain_seed = td_chain_seed("tandem-des", 0);
    snprintf(d->node.name, sizeof d->node.name, "model");
    d->npr = c->colocated ? 0 : c->prefill_groups * c->group_gpus;
    d->npg = c->colocated ? 0 : c->prefill_groups;
    d->ndr = c->decode_gpus;
    d->ndd = (c->decode_gpus + c->decode_domain - 1) / c->decode_domain;
    d->pr = calloc(d->npr ? d->npr : 1, sizeof *d->pr);
    d->pg = calloc(d->npg ? d->npg : 1, sizeof *d->pg);
    d->dr = calloc(d->ndr, sizeof *d->dr);
    d->dd = calloc(d->ndd, sizeof *d->dd);
    d->base = event_base_new();
    if (!d->pr || !d->pg || !d->dr || !d->dd || !d->base)
        goto err_nomem;
    td_rrank_t **tail = &d->plist;
    for (uint32_t i = 0; i < d->npr; i++) {
        prank_t *p = &d->pr[i];
        p->group = i / c->group_gpus;
        snprintf(p->domain, sizeof p->domain, "prefill%u", p->group);
        rank_register(d, &p->rr, &p->reg, TANDEM__ROLE__ROLE_PREFILL, i, p->domain,
                      i % c->group_gpus, c->group_gpus);
        pwork_init(&p->w);
        lru_init(&p->w.lru, c->cache_block_tokens ? c->cache_blocks : 0);
        *tail = &p->rr;
        tail = &p->rr.next;
    }
    for (uint32_t g = 0; g < d->npg; g++)
        d->pg[g] = (pgroup_t){ g * c->group_gpus, c->group_gpus, false };
    for (uint32_t i = 0; i < d->ndr; i++) {
        drank_t *r = &d->dr[i];
        uint32_t k = i / c->decode_domain, dn = c->decode_domain;
        if ((k + 1) * dn > c->decode_gpus)
            dn = c->decode_gpus - k * dn;
        r->dom = k;
        snprintf(r->domain, sizeof r->domain, "decode%u", k);
        rank_register(d, &r->rr, &r->reg, TANDEM__ROLE__ROLE_DECODE, i, r->domain,
                      i % c->decode_domain, dn);
        r->blocks_total = r->blocks_free = c->kv_tokens / c->kv_block_tokens;
        r->run = malloc(c->max_batch * sizeof *r->run);
        if (!r->run)
            goto err_nomem;
        r->ready_head = r->ready_tail = NONE;
        pwork_init(&r->w);
        lru_init(&r->w.lru, c->colocated && c->cache_block_tokens ? c->cache_blocks : 0);
        drank_publish(d, r);
        if (i % c->decode_domain > 0)
            d->dr[i - 1].rr.next = &r->rr;   /* a list per domain (pick_decode) */
        if (i % c->decode_domain == 0)
            d->dd[k] = (ddomain_t){ i, dn, false };
    }
    /* routerd's queue, its deadline beyond any run (the model's time is not
     * the clock the queue's timers read) */
    td_rqueue_config_t qc = { .base = d->base, .max_queued = c->max_queued,
                              .timeout_ms = 1000000000ull };
    td_rqueue_handlers_t qh = { .on_pass = NULL, .on_expired = NULL, .arg = d };
    if (td_rqueue_create(&qc, &qh, &d->queue) != TD_OK)
        goto err_nomem;
    *out = d;
    return TD_OK;

err_nomem:
    td_error("model: out of memory for %u prefill and %u decode ranks", d->npr, d->ndr);
    td_des_destroy(d);
    return TD_ERR_NOMEM;
}

void
td_des_destroy(td_des_t *d)
{
    if (!d)
        return;
    if (d->rs)
        for (size_t q = 0; q < d->nreq; q++)
            req_release(d, (uint32_t)q);
    free(d->rs);
    if (d->queue)
        td_rqueue_destroy(d->queue);
    if (d->base)
        event_base_free(d->base);
    for (uint32_t i = 0; d->pr && i < d->npr; i++) {
        td_rcache_fini(&d->pr[i].rr.cache);
        lru_fini(&d->pr[i].w.lru);
    }
    for (uint32_t i = 0; d->dr && i < d->ndr; i++) {
        td_rcache_fini(&d->dr[i].rr.cache);
        lru_fini(&d->dr[i].w.lru);
        free(d->dr[i].run);
    }
    free(d->pr);
    free(d->pg);
    free(d->dr);
    free(d->dd);
    free(d->heap);
    free(d);
}

void
td_des_poisson(td_des_req_t *reqs, size_t n, double rate, uint64_t seed)
{
    double now = 0;
    td_rng_t s = td_rng_seed(seed);

    for (size_t i = 0; i < n; i++) {
        if (i > 0) {
            /* u in (0, 1]: 53 random bits */
            double u = ((double)(td_rng_next(&s) >> 11) + 1.0) / 9007199254740992.0;
            now += -log(u) / rate;
        }
        reqs[i].t_arrive = now;
    }
}

uint64_t
td_des_events(const td_des_t *d)
{
    return d->nevents;
}

td_status_t
td_des_run(td_des_t *d, td_des_req_t *reqs, size_t n)
{
    td_status_t st = TD_OK;

    if (d->ran || n >= NONE) {
        td_error("model: runs once, fewer than %u requests", NONE);
        return TD_ERR_INVALID;
    }
    d->ran = true;
    d->reqs = reqs;
    d->nreq = n;
    d->rs = calloc(n ? n : 1, sizeof *d->rs);
    if (!d->rs)
        return TD_ERR_NOMEM;
    for (size_t q = 0; q < n; q++) {
        reqs[q].outcome = TD_DES_PENDING;
        reqs[q].cached_tokens = reqs[q].pred_cached = 0;
        d->rs[q].next = NONE;
    }
    if (n > 0)
        st = ev_push(d, reqs[0].t_arrive, EV_ARRIVAL, 0);
    while (st == TD_OK && d->nheap > 0) {
        ev_t e = ev_pop(d);
        d->now = e.t;
        d->nevents++;
        switch (e.kind) {
        case EV_ARRIVAL:
            st = on_arrival(d, e.arg);
            if (st == TD_OK && e.arg + 1 < n)
                st = ev_push(d, reqs[e.arg + 1].t_arrive, EV_ARRIVAL, e.arg + 1);
            break;
        case EV_PREFILL_STEP:
            st = on_prefill_step(d, e.arg);
            break;
        case EV_XFER_DONE:
            st = on_xfer_done(d, e.arg);
            break;
        case EV_DECODE_STEP:
            st = on_decode_step(d, e.arg);
            break;
        }
        if (st == TD_OK && d->pass_due) {
            d->pass_due = false;
            st = queue_pass(d);
        }
    }
    if (st != TD_OK)
        td_error("model: run stopped at %.3f s: %s", d->now, td_status_str(st));
    return st;
}

/* ======================================================================= */
/* Results                                                                  */
/* ======================================================================= */

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* The p-quantile of sorted v[0..n) (nearest rank); 0 when empty. */
static double
quantile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)ceil(p * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

td_status_t
td_des_summarize(const td_des_req_t *reqs, size_t n, double ttft_slo, double tpot_slo,
                 td_des_summary_t *out)
{
    td_des_summary_t s = { .n = n };
    double *ttft = malloc((n ? n : 1) * sizeof *ttft), *tpot = malloc((n ? n : 1) * sizeof *tpot);
    size_t ntpot = 0;
    double t0 = n ? reqs[0].t_arrive : 0, t1 = t0, sum_ttft = 0, sum_tpot = 0;
    uint64_t out_tok = 0, prompt = 0, cached = 0;

    if (!ttft || !tpot) {
        free(ttft);
        free(tpot);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const td_des_req_t *r = &reqs[i];
        if (r->outcome == TD_DES_TOO_LONG)
            s.too_long++;
        if (r->outcome == TD_DES_REFUSED)
            s.refused++;
        if (r->outcome != TD_DES_DONE)
            continue;
        double a = r->t_first - r->t_arrive;
        double b = r->output > 1 ? (r->t_last - r->t_first) / (r->output - 1) : 0;
        ttft[s.done++] = a;
        sum_ttft += a;
        if (r->output > 1) {
            tpot[ntpot++] = b;
            sum_tpot += b;
        }
        s.slo_met += a <= ttft_slo && b <= tpot_slo;
        t1 = r->t_last > t1 ? r->t_last : t1;
        out_tok += r->output;
        prompt += r->input;
        cached += r->cached_tokens;
    }
    qsort(ttft, s.done, sizeof *ttft, cmp_double);
    qsort(tpot, ntpot, sizeof *tpot, cmp_double);
    s.attainment = n ? (double)s.slo_met / (double)n : 0;
    s.ttft_p50 = quantile(ttft, s.done, 0.5);
    s.ttft_p99 = quantile(ttft, s.done, 0.99);
    s.ttft_mean = s.done ? sum_ttft / (double)s.done : 0;
    s.tpot_p50 = quantile(tpot, ntpot, 0.5);
    s.tpot_p99 = quantile(tpot, ntpot, 0.99);
    s.tpot_mean = ntpot ? sum_tpot / (double)ntpot : 0;
    s.makespan_s = t1 - t0;
    s.req_per_s = s.makespan_s > 0 ? (double)s.done / s.makespan_s : 0;
    s.out_tok_per_s = s.makespan_s > 0 ? (double)out_tok / s.makespan_s : 0;
    s.hit_ratio = prompt ? (double)cached / (double)prompt : 0;
    free(ttft);
    free(tpot);
    *out = s;
    return TD_OK;
}
