/* prefilld/prank.c — one prefill rank (prefilld/prank.h): decode peers, the
 * task state machine, the rank's KV pool, the round-robin chunk scheduler
 * that hands one chunk at a time to the rank's compute thread, the KV push
 * per (chunk, layer) from the pool as soon as a layer is computed, and
 * exactly one terminal notification per task. */
#include "prank.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include "clock.h"
#include "fsm.h"
#include "jobq.h"
#include "kvmap.h"
#include "kvpool.h"
#include "log.h"
#include "wcons.h"
#include "wire.h"
#include "chainhash.h"

#ifndef TAILQ_FOREACH_SAFE   /* glibc's sys/queue.h lacks it */
#define TAILQ_FOREACH_SAFE(var, head, field, tvar)                       \
    for ((var) = TAILQ_FIRST(head); (var) && ((tvar) = TAILQ_NEXT(var, field), 1); \
         (var) = (tvar))
#endif

/* ---- Types ------------------------------------------------------------------ */

/* A task's life: QUEUED (waiting for a run slot and its KV blocks) -> RUNNING
 * (chunks, round robin) -> FLUSHING (engine part over; waiting for its data
 * transfers) ->
 * PUSHING (terminal notification posted) -> DONE / FAILED / CANCELED.
 * QUEUED -> FLUSHING when canceled or refused before it ran; FLUSHING -> an
 * end state directly when no terminal notification can be sent. */
typedef enum {
    TASK_QUEUED = 0,
    TASK_RUNNING,
    TASK_FLUSHING,
    TASK_PUSHING,
    TASK_DONE,
    TASK_FAILED,
    TASK_CANCELED,
    TASK_NSTATES
} task_state_t;

static const char *const task_state_names[TASK_NSTATES] = {
    "queued", "running", "flushing", "pushing", "done", "failed", "canceled",
};

#define T(s) TD_FSM_BIT(TASK_##s)
static const uint32_t task_allowed[TASK_NSTATES] = {
    [TASK_QUEUED] = T(RUNNING) | T(FLUSHING),
    [TASK_RUNNING] = T(FLUSHING),
    [TASK_FLUSHING] = T(PUSHING) | T(FAILED) | T(CANCELED),
    [TASK_PUSHING] = T(DONE) | T(FAILED) | T(CANCELED),
};
#undef T

static const td_fsm_t task_fsm = {
    .what = "prefill task",
    .names = task_state_names,
    .allowed = task_allowed,
    .nstates = TASK_NSTATES,
};

/* A decode rank's Fence (docs/decoded.md, "Fencing"): Fenced goes out
 * once none of its transfers can land any more. */
typedef struct prank_fence {
    TAILQ_ENTRY(prank_fence) link;
    char dnode[65];
    uint32_t drank;
    uint64_t dinc;
    uint64_t *ids;               /* [nids] */
    size_t nids;
} prank_fence_t;

/* A decode rank we may push to, as the router described it. */
typedef struct prank_peer {
    TAILQ_ENTRY(prank_peer) link;
    char *node;
    uint32_t rank;
    uint64_t incarnation;
    void *addr;
    size_t addr_len;
    ProtobufCBinaryData *pools;  /* [npools] exported pools (copies) */
    size_t npools;
    td_xfer_peer_t *xp;          /* NULL after a failure, until the next use */
    uint64_t gen;                /* bumped each time xp is (re)created */
} prank_peer_t;

typedef struct task {
    TAILQ_ENTRY(task) all;
    TAILQ_ENTRY(task) run;       /* in rk->runq while QUEUED or RUNNING */
    td_prank_t *rk;
    void *router;                /* NULL once that router is gone */
    uint64_t req_id;
    uint64_t xfer_id;
    td_xfer_token_t token;       /* the decode rank's for this transfer (KvDest) */
    task_state_t state;
    int32_t *tokens;             /* [ntokens] the prompt */
    uint64_t ntokens;
    uint64_t pos;                /* tokens prefilled */
    uint32_t chunks;
    td_sample_params_t sampling;
    Tandem__Constraint cons_in;  /* the Sampling's constraint (spec owned), kind 0: none */
    td_wcons_t *cons;            /* compiled with req, on the compute thread */
    char cons_why[200];          /* why it was refused ("": it was not) */
    td_engine_req_t *req;        /* while RUNNING (created by its first chunk) */
    td_kvpool_res_t *res;        /* its KV in the rank's pool, from RUNNING to the end */
    td_kvmap_t *map;
    prank_peer_t *peer;          /* NULL: no decode rank to notify */
    uint64_t peer_gen;           /* endpoint generation the data went through; 0 = none yet */
    uint32_t inflight;           /* data transfers posted, not yet done */
    td_status_t status;          /* first failure, or TD_OK */
    int canceled;
    int32_t first_token;
    td_sample_pick_t first_pick; /* first_token with its log-probabilities */
    uint32_t nchoices;           /* Sampling.n: the request's choices (1 .. 64) */
    td_sample_pick_t *more_picks;/* [nchoices - 1]: choices 1.. first tokens (seed + i) */
    char reason[TD_KVMAP_REASON_MAX];
    /* The chunk on the compute thread (rk->computing == this task): its
     * size and end, and what it returned. stop asks it to end at the next
     * layer boundary (a cancel, or a failure found on the loop). */
    uint64_t chunk_n;
    int chunk_last;
    td_status_t chunk_st;
    uint64_t chunk_t0;           /* ns: the chunk was handed to the compute thread */
    atomic_int stop;
    struct prank_layer_msg *held, **held_tail; /* cfg.hold_layers: this chunk's layers */
    /* The prefix cache (rk->pc): the prompt's chain of block hashes, its
     * cached prefix (from the start to the end: its pool blocks stay
     * pinned), what the hit's job gave, and the fixed state kept at
     * snap_end, the last block end of the prompt (docs/kvcache.md). */
    uint64_t *hashes;            /* [ntokens / G] */
    td_pcache_hit_t *hit;
    int hit_pending;             /* its job (load, restore, replay) has not run */
    uint64_t hit_pos;            /* tokens the job made valid (compute thread) */
    uint64_t cached;             /* prompt tokens the cache gave */
    uint64_t replayed;           /* tokens replayed to rebuild the fixed state */
    uint64_t snap_end;           /* 0: no snapshot kept */
    uint8_t *snap;
} task_t;


/* One layer of a chunk, computed: what the compute thread tells the loop. */
typedef struct prank_layer_msg {
    struct prank_layer_msg *next;  /* held until the chunk ends (cfg.hold_layers) */
    task_t *t;
    uint32_t layer;
    uint64_t t_done;             /* ns: the layer's compute ended */
    size_t npieces;
    td_engine_piece_t pieces[];
} prank_layer_msg_t;

struct td_prank_s {
    struct event_base *base;
    td_xfer_t *x;
    td_engine_t *e;
    td_prank_config_t cfg;
    td_prank_io_t io;
    TAILQ_HEAD(, task) tasks;
    TAILQ_HEAD(, task) runq;
    TAILQ_HEAD(, prank_peer) peers;
    td_jobq_t *jq;               /* the compute thread */
    task_t *computing;           /* the task whose chunk is on it, or NULL */
    td_kvpool_t *kp;             /* the rank's KV: blocks and slots */
    td_xfer_pool_t **pools;      /* [nsegs] their memory, registered with UCX */
    FILE *trace;                 /* cfg.trace_path, or NULL */
    uint32_t running;            /* tasks in RUNNING */
    int stopping, draining, closing;
    td_prank_stats_t stats;
    Tandem__Load last_load;
    TAILQ_HEAD(, prank_fence) fences;   /* Fences waiting for their transfers to end */
    struct event *fence_ev;      /* looks again while any waits */
    td_pcache_t *pc;             /* the prefix cache, or NULL */
    struct event *cache_ev;      /* its events to the routers, every 50 ms */
    uint64_t cache_seq;
    Tandem__CacheStats cache_stats; /* what the last Load carried */
};

static void task_try_terminal(task_t *t);
static void prank_schedule(td_prank_t *rk);
static void prank_cache_work(td_prank_t *rk);


/* ---- Task state --------------------------------------------------------------- */

/* The one door of every task state change (base/fsm.h: logged; an illegal
 * transition aborts). Callers test the state before acting on a message, so
 * nothing a peer sends reaches here unchecked. */
static void
task_set_state(task_t *t, task_state_t to)
{
    td_fsm_step(&task_fsm, t->req_id, t->state, to, NULL);
    if (t->state == TASK_RUNNING)
        t->rk->running--;
    if (to == TASK_RUNNING)
        t->rk->running++;
    t->state = to;
}

static void
prank_publish_load(td_prank_t *rk)
{
    if (rk->closing)
        return;
    Tandem__Load l;
    td_prank_load(rk, &l);
    if (l.queued == rk->last_load.queued && l.queued_tokens == rk->last_load.queued_tokens &&
        l.running == rk->last_load.running && l.draining == rk->last_load.draining)
        return;
    rk->last_load = l;
    if (rk->io.load)
        rk->io.load(&l, rk->io.arg);
}

/* Record the first failure (later ones are consequences). */
static void __attribute__((format(printf, 3, 4)))
task_fail(task_t *t, td_status_t st, const char *fmt, ...)
{
    if (t->status != TD_OK || t->canceled)
        return;
    t->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->reason, sizeof(t->reason), fmt, ap);
    va_end(ap);
}

/* The engine part is over (finished, failed or canceled): wait for the data
 * transfers, then the terminal notification. Never while its chunk is on the
 * compute thread. */
static void
task_finish_engine(task_t *t)
{
    td_prank_t *rk = t->rk;
    if (t->state != TASK_QUEUED && t->state != TASK_RUNNING)
        return;
    TAILQ_REMOVE(&rk->runq, t, run);
    if (t->req) {
        td_engine_req_destroy(t->req);
        t->req = NULL;
    }
    td_wcons_destroy(t->cons);
    t->cons = NULL;
    task_set_state(t, TASK_FLUSHING);
    task_try_terminal(t);
}

/* A failure or cancel arrived from outside the engine call: a task between
 * chunks stops now; the one on the compute thread stops at its next layer
 * boundary, and its chunk's end finishes it. */
static void
task_stop(task_t *t)
{
    if (t->rk->computing == t)
        atomic_store(&t->stop, 1);
    else
        task_finish_engine(t);
}

static void
task_cancel(task_t *t, const char *why)
{
    if (t->state > TASK_RUNNING || t->status != TD_OK || t->canceled)
        return;
    t->canceled = 1;
    snprintf(t->reason, sizeof(t->reason), "%s", why);
    task_stop(t);
}

static void
prank_check_idle(td_prank_t *rk)
{
    if (!rk->stopping || rk->closing || !TAILQ_EMPTY(&rk->tasks))
        return;
    td_info("prefill rank %u: every task ended", rk->cfg.rank_id);
    if (rk->io.idle)
        rk->io.idle(rk->io.arg);
}

static void
task_free(task_t *t)
{
    if (t->req)
        td_engine_req_destroy(t->req);
    td_wcons_destroy(t->cons);
    free(t->cons_in.spec);
    if (t->hit)
        td_pcache_hit_free(t->rk->pc, t->hit);
    if (t->res)
        td_kvpool_release(t->rk->kp, t->res);
    free(t->hashes);
    free(t->snap);
    free(t->more_picks);
    td_kvmap_destroy(t->map);
    free(t->tokens);
    free(t);
}

/* PrefillDone to the router; a failure to send is logged here. */
static void
prank_send_done(td_prank_t *rk, void *router, uint64_t req_id, td_status_t st,
                const char *reason, int32_t first_token, uint64_t cached, uint64_t computed)
{
    Tandem__PrefillDone msg = TANDEM__PREFILL_DONE__INIT;
    msg.req_id = req_id;
    msg.status = st;
    msg.reason = (char *)reason;
    msg.first_token = first_token;
    msg.cached_tokens = cached;
    msg.computed_tokens = computed;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE;
    env.prefill_done = &msg;
    td_status_t sst = rk->io.send ? rk->io.send(router, &env, rk->io.arg) : TD_OK;
    if (sst != TD_OK)
        td_warn("prefill rank %u: req %016" PRIx64 ": prefill done not sent: %s",
                rk->cfg.rank_id, req_id, td_status_str(sst));
}

/* The terminal notification ended (or none could be sent): report, free. */
static void
task_end(task_t *t)
{
    td_prank_t *rk = t->rk;
    task_state_t end = t->status != TD_OK ? TASK_FAILED
                       : t->canceled      ? TASK_CANCELED
                                          : TASK_DONE;
    task_set_state(t, end);
    td_status_t st = end == TASK_CANCELED ? TD_ERR_CANCELED : t->status;
    uint64_t computed = t->ntokens - t->cached + t->replayed;
    if (end == TASK_DONE) {
        rk->stats.done++;
        if (rk->pc != NULL)
            td_pcache_count(rk->pc, t->ntokens, t->hit, computed, t->replayed);
        td_info("prefill rank %u: req %016" PRIx64 ": done, %" PRIu64 " tokens in %u chunks "
                "(%" PRIu64 " cached, %" PRIu64 " replayed), first token %d", rk->cfg.rank_id,
                t->req_id, t->ntokens, t->chunks, t->cached, t->replayed, (int)t->first_token);
    } else {
        if (end == TASK_FAILED)
            rk->stats.failed++;
        else
            rk->stats.canceled++;
        td_warn("prefill rank %u: req %016" PRIx64 ": %s (%s)", rk->cfg.rank_id, t->req_id,
                td_fsm_name(&task_fsm, end), t->reason);
    }
    if (t->router && !rk->closing)
        prank_send_done(rk, t->router, t->req_id, st, end == TASK_DONE ? "" : t->reason,
                        end == TASK_DONE ? t->first_token : 0, t->cached,
                        end == TASK_DONE ? computed : 0);
    TAILQ_REMOVE(&rk->tasks, t, all);
    task_free(t);   /* its blocks return: no transfer reads them any more */
    rk->stats.live--;
    prank_schedule(rk);
    prank_publish_load(rk);
    prank_check_idle(rk);
}

/* ---- Decode peers -------------------------------------------------------------- */

static prank_peer_t *
prank_peer_find(td_prank_t *rk, const char *node, uint32_t rank)
{
    prank_peer_t *p;
    TAILQ_FOREACH(p, &rk->peers, link)
        if (p->rank == rank && strcmp(p->node, node) == 0)
            return p;
    return NULL;
}

/* (Re)create the endpoint from the stored address and pools. */
static td_status_t
prank_peer_connect(td_prank_t *rk, prank_peer_t *p)
{
    td_xfer_peer_t *xp;
    td_status_t st = td_xfer_peer_create(rk->x, p->addr, p->addr_len, p->incarnation, &xp);
    if (st != TD_OK)
        return st;
    for (size_t i = 0; i < p->npools; i++) {
        st = td_xfer_peer_import_pool(xp, p->pools[i].data, p->pools[i].len);
        if (st != TD_OK) {
            td_xfer_peer_destroy(xp);
            return st;
        }
    }
    p->xp = xp;
    p->gen++;
    return TD_OK;
}

static void
prank_peer_free(prank_peer_t *p)
{
    for (size_t i = 0; i < p->npools; i++)
        free(p->pools[i].data);
    free(p->pools);
    free(p->addr);
    free(p->node);
    free(p);
}

/* Forget a peer: close its endpoint (its transfers fail) and fail the tasks
 * that target it; they end without a terminal notification. */
static void
prank_peer_remove(td_prank_t *rk, prank_peer_t *p, const char *why)
{
    td_info("prefill rank %u: decode rank %s/%u incarnation %016" PRIx64 ": %s",
            rk->cfg.rank_id, p->node, p->rank, p->incarnation, why);
    TAILQ_REMOVE(&rk->peers, p, link);
    task_t *t, *tn;
    TAILQ_FOREACH_SAFE(t, &rk->tasks, all, tn) {
        if (t->peer != p)
            continue;
        t->peer = NULL;
        task_fail(t, TD_ERR_PEER, "decode rank %s/%u: %s", p->node, p->rank, why);
        task_stop(t);
    }
    if (p->xp)
        td_xfer_peer_destroy(p->xp);
    prank_peer_free(p);
}

static td_status_t
prank_peer_add(td_prank_t *rk, const Tandem__DecodePeer *msg)
{
    prank_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        goto err_nomem;
    p->rank = msg->rank_id;
    p->incarnation = msg->incarnation;
    p->node = strdup(msg->node_id ? msg->node_id : "");
    p->addr_len = msg->xfer_address.len;
    p->addr = malloc(p->addr_len ? p->addr_len : 1);
    p->pools = calloc(msg->n_pools ? msg->n_pools : 1, sizeof(*p->pools));
    if (!p->node || !p->addr || !p->pools)
        goto err_free;
    memcpy(p->addr, msg->xfer_address.data, p->addr_len);
    for (; p->npools < msg->n_pools; p->npools++) {
        ProtobufCBinaryData *d = &p->pools[p->npools];
        d->len = msg->pools[p->npools].len;
        if (!(d->data = malloc(d->len ? d->len : 1)))
            goto err_free;
        memcpy(d->data, msg->pools[p->npools].data, d->len);
    }
    td_status_t st = prank_peer_connect(rk, p);
    if (st != TD_OK) {
        td_warn("prefill rank %u: decode rank %s/%u: cannot connect: %s", rk->cfg.rank_id,
                p->node, p->rank, td_status_str(st));
        prank_peer_free(p);
        return st;
    }
    TAILQ_INSERT_TAIL(&rk->peers, p, link);
    td_info("prefill rank %u: decode rank %s/%u incarnation %016" PRIx64 ": %zu pools",
            rk->cfg.rank_id, p->node, p->rank, p->incarnation, p->npools);
    return TD_OK;

err_free:
    prank_peer_free(p);
err_nomem:
    td_error("prefill rank %u: decode rank %s/%u: out of memory", rk->cfg.rank_id,
             msg->node_id ? msg->node_id : "", msg->rank_id);
    return TD_ERR_NOMEM;
}

static void
prank_decode_peer(td_prank_t *rk, const Tandem__DecodePeer *msg)
{
    const char *node = msg->node_id ? msg->node_id : "";
    prank_peer_t *p = prank_peer_find(rk, node, msg->rank_id);
    if (msg->gone) {
        if (p && p->incarnation == msg->incarnation)
            prank_peer_remove(rk, p, "gone");
        return;
    }
    if (p && p->incarnation == msg->incarnation)
        return;   /* the same news from another router */
    if (p)
        prank_peer_remove(rk, p, "replaced by a new incarnation");
    if (!rk->closing)
        (void)prank_peer_add(rk, msg);
}

static void
prank_on_peer_fail(td_xfer_t *x, td_xfer_peer_t *xp, td_status_t status, void *arg)
{
    td_prank_t *rk = arg;
    prank_peer_t *p;
    TAILQ_FOREACH(p, &rk->peers, link) {
        if (p->xp != xp)
            continue;
        td_warn("prefill rank %u: decode rank %s/%u: endpoint failed: %s; reconnecting on "
                "next use", rk->cfg.rank_id, p->node, p->rank, td_status_str(status));
        td_xfer_peer_destroy(xp);
        p->xp = NULL;
        return;
    }
}

/* The endpoint a task's transfers go through. All of a task's transfers use
 * one endpoint generation: after that endpoint failed, its writes may still
 * land (docs/xfer.md), so no notification goes out on a new one. */
static td_status_t
task_endpoint(task_t *t, td_xfer_peer_t **out)
{
    prank_peer_t *p = t->peer;
    if (!p) {
        task_fail(t, TD_ERR_PEER, "no decode rank to push to");
        return TD_ERR_PEER;
    }
    if (t->peer_gen && (!p->xp || p->gen != t->peer_gen)) {
        task_fail(t, TD_ERR_PEER, "decode rank %s/%u: endpoint failed", p->node, p->rank);
        return TD_ERR_PEER;
    }
    if (!p->xp) {
        td_status_t st = prank_peer_connect(t->rk, p);
        if (st != TD_OK) {
            task_fail(t, st, "decode rank %s/%u: cannot reconnect: %s", p->node, p->rank,
                      td_status_str(st));
            return st;
        }
    }
    t->peer_gen = p->gen;
    *out = p->xp;
    return TD_OK;
}

/* ---- Transfers ------------------------------------------------------------------ */

static void
task_on_data_done(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg)
{
    td_kvmap_batch_t *b = arg;
    task_t *t = b->user;
    td_kvmap_batch_free(b);
    t->inflight--;
    if (status != TD_OK) {
        task_fail(t, status, "decode rank %s/%u: transfer failed: %s",
                  t->peer ? t->peer->node : "?", t->peer ? t->peer->rank : 0,
                  td_status_str(status));
        if (t->state <= TASK_RUNNING) {
            /* task_stop either leaves the task running (inside its engine
             * call) or ends the engine part and tries the terminal note
             * itself, which may end and free the task: t is not used again */
            task_stop(t);
            return;
        }
    }
    task_try_terminal(t);
}

static void
task_on_note_done(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg)
{
    task_t *t = arg;
    if (status != TD_OK)
        task_fail(t, status, "terminal notification failed: %s", td_status_str(status));
    task_end(t);
}

/* The checksum of the KV the task put (docs/xfer.md, "KV checksum"). A
 * sum that cannot be given fails the task, whose note then says why. */
static uint64_t
task_kv_sum(task_t *t)
{
    char why[TD_KVMAP_REASON_MAX];
    uint64_t sum = 0;
    td_status_t st = td_kvmap_sum(t->map, &sum, why, sizeof(why));
    if (st != TD_OK)
        task_fail(t, st, "kv checksum: %s", why);
    return sum;
}

/* Post the terminal KvNote, with the first tokens of the other choices of
 * a successful task (n > 1) and their log-probabilities when asked. A note
 * past the transfer's payload bound is refused by td_xfer_post
 * (TD_ERR_TOO_BIG; routerd keeps n and top_logprobs within it). */
static td_status_t
task_note_post(task_t *t, td_xfer_peer_t *xp, Tandem__KvNote *note)
{
    uint32_t more = t->status == TD_OK && !t->canceled && t->nchoices > 1 ? t->nchoices - 1 : 0;
    int32_t *toks = more ? calloc(more, sizeof(*toks)) : NULL;
    td_wire_logprob_t *lps = more && t->sampling.logprobs ? calloc(more, sizeof(*lps)) : NULL;
    Tandem__TokenLogprob **plps = lps ? calloc(more, sizeof(*plps)) : NULL;
    uint8_t *buf = NULL;
    td_status_t st = TD_ERR_NOMEM;

    if (more && (toks == NULL || (t->sampling.logprobs && (lps == NULL || plps == NULL))))
        goto out;
    for (uint32_t i = 0; i < more; i++) {
        toks[i] = t->more_picks[i].token;
        if (lps == NULL)
            continue;
        td_wire_logprob_pack(&t->more_picks[i], &lps[i]);
        plps[i] = &lps[i].msg;
    }
    note->n_more_first_tokens = more;
    note->more_first_tokens = toks;
    note->n_more_first_logprobs = lps ? more : 0;
    note->more_first_logprobs = plps;
    size_t len = tandem__kv_note__get_packed_size(note);
    if ((buf = malloc(len ? len : 1)) == NULL)
        goto out;
    len = tandem__kv_note__pack(note, buf);
    st = td_xfer_post(xp, t->xfer_id, &t->token, NULL, 0, buf, len, t->rk->cfg.deadline_ms,
                      task_on_note_done, t);
out:
    free(buf);
    free(plps);
    free(lps);
    free(toks);
    return st;
}

/* Once the engine part is over and every data transfer has ended, post the
 * terminal notification: a transfer with no pieces whose payload is the
 * KvNote. Its flush follows the earlier transfers' completion, so the decode
 * rank sees it after all of the request's data. */
static void
task_try_terminal(task_t *t)
{
    td_prank_t *rk = t->rk;
    if (t->state != TASK_FLUSHING || t->inflight > 0 || rk->closing)
        return;
    td_xfer_peer_t *xp;
    if (task_endpoint(t, &xp) != TD_OK) {
        task_end(t);   /* nobody to notify: the decode rank goes by its endpoint's failure */
        return;
    }
    uint64_t kv_sum = t->status == TD_OK && !t->canceled ? task_kv_sum(t) : 0;
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    note.req_id = t->req_id;
    if (t->status != TD_OK) {
        note.reason = t->reason;
    } else if (t->canceled) {
        note.canceled = 1;
        note.reason = t->reason;
    } else {
        note.first_token = t->first_token;
        note.kv_sum = kv_sum;
    }
    td_wire_logprob_t lp;
    if (t->status == TD_OK && !t->canceled && t->sampling.logprobs) {
        td_wire_logprob_pack(&t->first_pick, &lp);
        note.first_logprob = &lp.msg;
    }
    td_status_t st = task_note_post(t, xp, &note);
    if (st != TD_OK) {
        task_fail(t, st, "terminal notification refused: %s", td_status_str(st));
        task_end(t);
        return;
    }
    rk->stats.notes++;
    task_set_state(t, TASK_PUSHING);
}


/* A trace line (cfg.trace_path): what the layer-overlap benchmark reads. */
static void __attribute__((format(printf, 2, 3)))
prank_trace(td_prank_t *rk, const char *fmt, ...)
{
    va_list ap;

    if (rk->trace == NULL)
        return;
    va_start(ap, fmt);
    vfprintf(rk->trace, fmt, ap);
    va_end(ap);
    fputc('\n', rk->trace);
}

/* Loop thread: a layer of the chunk on the compute thread is done; its
 * finished entries are in the task's blocks: put them to the decode rank
 * now, while the next layer computes (or, with cfg.hold_layers, when the
 * chunk ends). */
static void
task_post_layer(prank_layer_msg_t *m)
{
    task_t *t = m->t;
    td_prank_t *rk = t->rk;
    uint64_t t_post = td_clock_ns();
    td_kvmap_batch_t *b;
    td_xfer_peer_t *xp;
    char why[TD_KVMAP_REASON_MAX];
    td_status_t st;

    if (rk->closing || t->status != TD_OK || t->canceled || m->npieces == 0)
        goto out;
    st = task_endpoint(t, &xp);
    if (st != TD_OK)
        goto err_stop;
    st = td_kvmap_batch_create(t->map, &t->res->kv, m->pieces, m->npieces, &b, why,
                               sizeof(why));
    if (st != TD_OK) {
        task_fail(t, st, "layer %u: %s", m->layer, why);
        goto err_stop;
    }
    b->user = t;
    st = td_xfer_post(xp, t->xfer_id, &t->token, b->descs, b->ndescs, NULL, 0,
                      rk->cfg.deadline_ms, task_on_data_done, b);
    if (st != TD_OK) {
        td_kvmap_batch_free(b);
        task_fail(t, st, "layer %u: transfer refused: %s", m->layer, td_status_str(st));
        goto err_stop;
    }
    t->inflight++;
    rk->stats.xfers++;
    prank_trace(rk, "layer req=%016" PRIx64 " chunk=%u layer=%u computed=%" PRIu64
                " posted=%" PRIu64 " bytes=%" PRIu64, t->req_id, t->chunks, m->layer, m->t_done,
                t_post, b->bytes);   /* chunk: 0-based, the chunk on the compute thread */
    goto out;
err_stop:
    task_stop(t);   /* the chunk on the compute thread stops at its next layer */
out:
    free(m);
}

static void
task_on_layer_done(void *arg)
{
    prank_layer_msg_t *m = arg;
    task_t *t = m->t;

    if (!t->rk->cfg.hold_layers || t->rk->closing) {
        task_post_layer(m);
        return;
    }
    if (t->held == NULL)
        t->held_tail = &t->held;
    m->next = NULL;
    *t->held_tail = m;
    t->held_tail = &m->next;
}

/* Compute thread: the engine's per-(chunk, layer) callback, the cancellation
 * point. The loop learns of the layer's pieces at once. */
static td_status_t
task_on_layer(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *pieces,
              size_t npieces, void *arg)
{
    task_t *t = arg;
    prank_layer_msg_t *m;

    (void)req;
    if (atomic_load(&t->stop))
        return TD_ERR_CANCELED;
    if (npieces == 0)
        return TD_OK;
    td_kvmap_sum_add(t->map, &t->res->kv, pieces, npieces);   /* here, off the loop */
    m = malloc(sizeof(*m) + npieces * sizeof(*pieces));
    if (m == NULL)
        return TD_ERR_NOMEM;
    m->t = t;
    m->layer = layer;
    m->t_done = td_clock_ns();
    m->npieces = npieces;
    memcpy(m->pieces, pieces, npieces * sizeof(*pieces));
    if (td_jobq_tell(t->rk->jq, task_on_layer_done, m) != TD_OK) {
        free(m);
        return TD_ERR_NOMEM;
    }
    return TD_OK;
}

/* ---- Scheduler -------------------------------------------------------------------- */

/* Compute thread: the task's engine request, with its constraint compiled
 * (or found compiled) and hooked in; a refused constraint leaves why in
 * t->cons_why. */
static td_status_t
task_req_create(task_t *t)
{
    td_status_t st = td_engine_req_create(t->rk->e, &t->sampling, &t->res->kv, &t->req);

    if (st == TD_OK && t->cons_in.kind != 0 && t->cons == NULL)
        st = td_wcons_create(&t->cons_in, &t->cons, t->cons_why, sizeof(t->cons_why));
    if (st == TD_OK && t->cons != NULL)
        t->req->cons = td_wcons_hook(t->cons);
    return st;
}

/* Compute thread: one chunk of the task (the first creates its engine
 * request over its blocks; the last samples the first token). */
static void
task_chunk_run(void *arg)
{
    task_t *t = arg;
    td_prank_t *rk = t->rk;
    td_status_t st = TD_OK;

    if (t->req == NULL)
        st = task_req_create(t);
    int snap = t->snap_end != 0 && t->pos + t->chunk_n == t->snap_end && t->snap == NULL;
    if (st == TD_OK)
        st = td_engine_prefill(t->req, t->tokens + t->pos, t->chunk_n,
                               t->chunk_last ? TD_ENGINE_CHUNK_LAST
                               : snap        ? TD_ENGINE_CHUNK_KEEP
                                             : TD_ENGINE_CHUNK_MORE,
                               task_on_layer, t);
    if (st == TD_OK && snap)
        t->snap = td_pcache_snapshot(rk->pc, &t->res->kv);   /* the state at a block end */
    if (st == TD_OK && t->chunk_last) {
        td_sample_finish_t fin;
        st = td_engine_sample_pick(t->req, &t->first_pick, &fin);
        t->first_token = t->first_pick.token;
        /* the other choices draw from the same distribution, seeds S + i */
        for (uint32_t i = 1; st == TD_OK && i < t->nchoices; i++)
            st = td_engine_sample_pick_seed(t->req, t->sampling.seed + i, &t->more_picks[i - 1],
                                            &fin);
    }
    t->chunk_st = st;
}

/* Loop thread: a job of the task came back with st. A cancel or a failure
 * on the loop stopped it, or the engine (what) failed: the engine part
 * ends and 1 is returned; else the task goes to the back of the run queue
 * (its turn is over) and 0. */
static int
task_job_ended(task_t *t, td_status_t st, const char *what)
{
    td_prank_t *rk = t->rk;

    if (st != TD_OK || t->canceled || t->status != TD_OK) {
        if (st != TD_OK && !(st == TD_ERR_CANCELED && atomic_load(&t->stop)))
            task_fail(t, st, "%s: %s", what, td_status_str(st));
        task_finish_engine(t);
        return 1;
    }
    TAILQ_REMOVE(&rk->runq, t, run);
    TAILQ_INSERT_TAIL(&rk->runq, t, run);
    return 0;
}

/* ---- The prefix cache's bulk work (compute thread) ----------------------------- */

static void
prank_cache_work_run(void *arg)
{
    td_pcache_work_run(((td_prank_t *)arg)->pc);
}

static void
prank_cache_work_done(void *arg)
{
    td_prank_t *rk = arg;

    td_pcache_work_done(rk->pc);
    if (rk->closing)
        return;
    prank_cache_work(rk);   /* what was queued meanwhile */
    prank_schedule(rk);     /* demoted blocks are free: a task may start */
}

/* The cache's write-backs and demotions, queued by its loop-thread calls,
 * go to the compute thread (a pass of the loop never copies a prompt's KV). */
static void
prank_cache_work(td_prank_t *rk)
{
    if (rk->closing || !td_pcache_work_take(rk->pc))
        return;
    if (td_jobq_post(rk->jq, prank_cache_work_run, prank_cache_work_done, rk) != TD_OK) {
        td_pcache_work_run(rk->pc);   /* out of memory for a job: here, as before */
        td_pcache_work_done(rk->pc);
    }
}

/* Loop thread: the chunk came back. */
static void
task_chunk_done(void *arg)
{
    task_t *t = arg;
    td_prank_t *rk = t->rk;
    td_status_t st = t->chunk_st;

    rk->computing = NULL;
    while (t->held != NULL) {   /* cfg.hold_layers: the chunk's layers go now */
        prank_layer_msg_t *m = t->held;
        t->held = m->next;
        task_post_layer(m);
    }
    if (rk->closing)
        return;
    prank_trace(rk, "chunk req=%016" PRIx64 " chunk=%u tokens=%" PRIu64 " start=%" PRIu64
                " end=%" PRIu64 " status=%d", t->req_id, t->chunks, t->chunk_n, t->chunk_t0,
                td_clock_ns(), (int)st);   /* td_status_t: 0 ok, -12 canceled */
    rk->stats.chunks++;
    t->chunks++;
    if (!task_job_ended(t, st, t->cons_why[0] ? t->cons_why : "engine prefill")) {
        t->pos += t->chunk_n;
        if (t->chunk_last) {
            if (rk->pc != NULL) {   /* its whole blocks are final now: the cache takes them */
                td_pcache_insert(rk->pc, t->tokens, t->ntokens, t->hashes, t->res, t->snap,
                                 t->snap_end);
                t->snap = NULL;
                prank_cache_work(rk);
            }
            task_finish_engine(t);
        }
    }
    prank_schedule(rk);
    prank_publish_load(rk);
}

/* Compute thread: the task's cached prefix. Its tier blocks are read into
 * the task's own blocks, its KV goes to the decode rank like a computed
 * layer's, and its fixed state comes back from a snapshot or by replaying
 * at most the engine's bound before the prefix end (docs/kvcache.md). */
static void
task_hit_run(void *arg)
{
    task_t *t = arg;
    td_prank_t *rk = t->rk;
    const td_layout_t *l = rk->e->layout;
    uint64_t p, from, bound = td_engine_replay_bound(rk->e);
    td_engine_piece_t *pieces = NULL;
    td_status_t st;

    t->hit_pos = 0;
    st = task_req_create(t);
    if (st != TD_OK)
        goto out;
    td_pcache_load(rk->pc, t->hit, t->tokens, &t->res->kv);
    p = t->hit->loaded * td_pcache_block(rk->pc);
    if (p == 0)
        goto out;   /* nothing could be read: a cold prefill */
    /* the prefix's paged entries, layer by layer, as if just computed */
    if ((pieces = calloc(l->nsegs, sizeof(*pieces))) == NULL) {
        st = TD_ERR_NOMEM;
        goto out;
    }
    for (uint32_t L = 0, s = 0; L < l->layers && st == TD_OK; L++) {
        size_t n = 0;

        for (; s < l->nsegs && l->segs[s].layer == L; s++)
            if (l->segs[s].kind == TD_LAYOUT_PAGED && td_layout_entries(&l->segs[s], p) > 0)
                pieces[n++] = (td_engine_piece_t){ s, 0, td_layout_entries(&l->segs[s], p) };
        st = task_on_layer(t->req, L, pieces, n, t);
    }
    if (st != TD_OK)
        goto out;
    if (t->hit->snap_end > 0) {
        from = t->hit->snap_end;
        st = td_engine_adopt(t->req, t->tokens, from);
    } else {
        from = p > bound ? p - bound : 0;
        st = td_engine_seek(t->req, t->tokens, from);
    }
    if (st == TD_OK && p > from)
        st = td_engine_replay(t->req, t->tokens + from, p - from, p);
    if (st != TD_OK)
        goto out;
    t->replayed = p - from;
    t->cached = p;
    t->hit_pos = p;
    if (t->snap_end == p && t->snap == NULL)
        t->snap = td_pcache_snapshot(rk->pc, &t->res->kv);
out:
    free(pieces);
    t->chunk_st = st;
}

/* Loop thread: the hit's job came back; the chunks go on from its end. */
static void
task_hit_done(void *arg)
{
    task_t *t = arg;
    td_prank_t *rk = t->rk;
    td_status_t st = t->chunk_st;

    rk->computing = NULL;
    if (rk->closing)
        return;
    t->hit_pending = 0;
    prank_trace(rk, "hit req=%016" PRIx64 " cached=%" PRIu64 " replayed=%" PRIu64
                " start=%" PRIu64 " end=%" PRIu64 " status=%d", t->req_id, t->cached, t->replayed,
                t->chunk_t0, td_clock_ns(), (int)st);
    if (!task_job_ended(t, st, t->cons_why[0] ? t->cons_why : "prefix cache hit"))
        t->pos = t->hit_pos;
    prank_schedule(rk);
    prank_publish_load(rk);
}

/* With the prefix cache: the prompt's cached prefix shares its pool blocks
 * (the rest are the task's own), and cached blocks nobody uses make room
 * when the pool is short. */
static td_status_t
task_reserve_cached(task_t *t)
{
    td_prank_t *rk = t->rk;
    const td_layout_t *l = rk->e->layout;
    const uint64_t *np = NULL, *const *pp = NULL;
    const char *why = NULL;
    td_status_t st;
    uint64_t *need;

    if (t->hit == NULL)
        (void)td_pcache_lookup(rk->pc, t->tokens, t->ntokens, t->hashes, &t->hit);
    if (t->hit != NULL) {
        np = t->hit->nprefix;
        pp = (const uint64_t *const *)t->hit->prefix;
    }
    st = td_kvpool_reserve_prefix(rk->kp, t->req_id, t->ntokens, np, pp, &t->res, &why);
    if (st != TD_ERR_BUSY || (need = calloc(l->nsegs, sizeof(*need))) == NULL)
        return st;
    for (uint32_t s = 0; s < l->nsegs; s++)
        if (l->segs[s].kind == TD_LAYOUT_PAGED)
            need[s] = td_layout_blocks(l, &l->segs[s], t->ntokens) - (np != NULL ? np[s] : 0);
    if (td_pcache_make_room(rk->pc, need))
        st = td_kvpool_reserve_prefix(rk->kp, t->req_id, t->ntokens, np, pp, &t->res, &why);
    prank_cache_work(rk);   /* demotions it queued: their blocks come after them */
    free(need);
    return st;
}

/* A queued task may start once a run slot and its blocks are free. */
static int
task_try_start(task_t *t)
{
    td_prank_t *rk = t->rk;
    const char *why = NULL;
    td_status_t st;

    if (rk->running >= rk->cfg.max_running)
        return 0;
    st = rk->pc != NULL ? task_reserve_cached(t)
                        : td_kvpool_reserve(rk->kp, t->req_id, t->ntokens, &t->res, &why);
    if (st != TD_OK) {
        if (t->hit != NULL) {   /* looked up again when it can start: the cache moves */
            td_pcache_hit_free(rk->pc, t->hit);
            t->hit = NULL;
        }
        return 0;   /* busy: it waits for a task to end and free blocks */
    }
    t->hit_pending = t->hit != NULL;
    task_set_state(t, TASK_RUNNING);
    return 1;
}

/* Work left to a task, in tokens: its prompt past what is prefilled, less
 * what its cache hit (not loaded yet) is about to give. */
static uint64_t
task_left(const task_t *t)
{
    uint64_t left = t->ntokens - t->pos;

    if (t->hit_pending && t->hit != NULL) {
        uint64_t hit = t->hit->nblocks * td_pcache_block(t->rk->pc);
        left = hit < left ? left - hit : 0;
    }
    return left;
}

/* Hand the next chunk to the compute thread, if it is free: the first task
 * in the run queue whose work left fits in one chunk (a short prompt, or a
 * cache hit's suffix: it is done at once instead of waiting a turn behind
 * every long prompt), else the first that is running, or queued and able to
 * start. Finished chunks go to the back, so running tasks take turns chunk
 * by chunk; a long prompt waits only while short ones keep coming. */
static void
prank_schedule(td_prank_t *rk)
{
    task_t *t;

    if (rk->computing != NULL || rk->closing)
        return;
    TAILQ_FOREACH(t, &rk->runq, run)
        if (task_left(t) <= rk->cfg.chunk_tokens &&
            (t->state == TASK_RUNNING || task_try_start(t)))
            break;
    if (t == NULL)
        TAILQ_FOREACH(t, &rk->runq, run)
            if (t->state == TASK_RUNNING || task_try_start(t))
                break;
    if (t == NULL)
        return;
    if (t->hit_pending) {   /* its cached prefix first: one job, at most one pass */
        t->chunk_t0 = td_clock_ns();
        if (td_jobq_post_pass(rk->jq, task_hit_run, task_hit_done, t) != TD_OK) {
            task_fail(t, TD_ERR_NOMEM, "cannot hand the cache hit to the compute thread");
            task_finish_engine(t);
            return;
        }
        rk->computing = t;
        return;
    }
    t->chunk_n = t->ntokens - t->pos < rk->cfg.chunk_tokens ? t->ntokens - t->pos
                                                             : rk->cfg.chunk_tokens;
    if (t->snap_end > t->pos && t->snap_end < t->pos + t->chunk_n)
        t->chunk_n = t->snap_end - t->pos;   /* a chunk ends where the snapshot is taken */
    t->chunk_last = t->pos + t->chunk_n == t->ntokens;
    t->chunk_t0 = td_clock_ns();
    if (td_jobq_post_pass(rk->jq, task_chunk_run, task_chunk_done, t) != TD_OK) {
        task_fail(t, TD_ERR_NOMEM, "cannot hand the chunk to the compute thread");
        task_finish_engine(t);
        return;
    }
    rk->computing = t;
}

/* ---- Messages --------------------------------------------------------------------- */

static task_t *
prank_task_find(td_prank_t *rk, void *router, uint64_t req_id)
{
    task_t *t;
    TAILQ_FOREACH(t, &rk->tasks, all)
        if (t->router == router && t->req_id == req_id)
            return t;
    return NULL;
}

static uint64_t
prank_queued_tokens(const td_prank_t *rk)
{
    uint64_t n = 0;
    const task_t *t;
    TAILQ_FOREACH(t, &rk->runq, run)
        n += t->ntokens - t->pos;
    return n;
}

/* The Prefill's sampling parameters (worker/wire.h, as decoded reads them)
 * and its choices; bad ones fail the task. */
static void
task_sampling(task_t *t, const Tandem__Sampling *s)
{
    char why[160];

    t->nchoices = td_wire_choices(s);
    if (td_wire_sampling(s, t->rk->e, &t->sampling, why, sizeof(why)) != TD_OK) {
        task_fail(t, TD_ERR_INVALID, "sampling: %s", why);
    } else if (t->nchoices > TD_WIRE_MAX_CHOICES) {
        task_fail(t, TD_ERR_INVALID, "sampling: %u choices, at most %d", t->nchoices,
                  TD_WIRE_MAX_CHOICES);
    } else if (t->nchoices > 1 &&
               (t->more_picks = calloc(t->nchoices - 1, sizeof(*t->more_picks))) == NULL) {
        task_fail(t, TD_ERR_NOMEM, "out of memory for %u choices", t->nchoices);
    } else if (s != NULL && s->constraint != NULL && s->constraint->kind != 0) {
        /* compiled with the engine request, on the compute thread */
        t->cons_in = *s->constraint;
        t->cons_in.base = (ProtobufCMessage)PROTOBUF_C_MESSAGE_INIT(&tandem__constraint__descriptor);
        t->cons_in.spec = strdup(s->constraint->spec ? s->constraint->spec : "");
        if (t->cons_in.spec == NULL)
            task_fail(t, TD_ERR_NOMEM, "out of memory for the constraint");
    }
}

/* Why a Prefill cannot run (its task then fails at once, still with the
 * terminal notification when the decode rank is known); TD_OK if it can. */
static td_status_t
task_check(task_t *t, const Tandem__Prefill *msg)
{
    td_prank_t *rk = t->rk;
    char why[TD_KVMAP_REASON_MAX];
    if (rk->stopping) {
        task_fail(t, TD_ERR_CANCELED, "prefill rank %u is stopping", rk->cfg.rank_id);
        return TD_ERR_CANCELED;
    }
    if (t->ntokens == 0) {
        task_fail(t, TD_ERR_INVALID, "empty prompt");
        return TD_ERR_INVALID;
    }
    td_status_t st = td_kvmap_create(rk->e->layout, msg->dest, t->ntokens, &t->map, why,
                                     sizeof(why));
    if (st != TD_OK) {
        task_fail(t, st, "%s", why);
        return st;
    }
    td_kvpool_counts_t c;
    td_kvpool_counts(rk->kp, &c);
    if (t->ntokens > c.tokens_total) {
        task_fail(t, TD_ERR_TOO_BIG, "prompt of %" PRIu64 " tokens exceeds prefill rank %u's "
                  "kv pool (%" PRIu64 " tokens, --kv-tokens)", t->ntokens, rk->cfg.rank_id,
                  c.tokens_total);
        return TD_ERR_TOO_BIG;
    }
    uint64_t queued = prank_queued_tokens(rk) - t->ntokens;   /* t is in the queue */
    if (rk->cfg.max_queued_tokens && queued + t->ntokens > rk->cfg.max_queued_tokens) {
        task_fail(t, TD_ERR_BUSY, "prefill rank %u: queue full (%" PRIu64 " tokens queued)",
                  rk->cfg.rank_id, queued);
        return TD_ERR_BUSY;
    }
    return TD_OK;
}

/* A Prefill that does not fit (its request is already here) is answered
 * with PrefillDone{invalid} and touches nothing: the task already running
 * keeps its state and its decode rank's blocks. No terminal note goes out for
 * it either: its KvDest may be that task's, and a note would end it there. */
static void
prank_prefill(td_prank_t *rk, void *router, const Tandem__Prefill *msg)
{
    if (prank_task_find(rk, router, msg->req_id)) {
        td_log_peer_every(TD_LOG_WARN, "prefill rank %u: req %016" PRIx64 ": prefill refused: "
                     "already here", rk->cfg.rank_id, msg->req_id);
        prank_send_done(rk, router, msg->req_id, TD_ERR_INVALID,
                        "duplicate prefill: the request is already on this rank", 0, 0, 0);
        return;
    }
    task_t *t = calloc(1, sizeof(*t));
    if (t)
        t->tokens = malloc((msg->n_tokens ? msg->n_tokens : 1) * sizeof(int32_t));
    if (!t || !t->tokens) {
        td_log_peer_every(TD_LOG_ERROR, "prefill rank %u: req %016" PRIx64 ": out of memory",
                     rk->cfg.rank_id, msg->req_id);
        free(t);
        return;
    }
    t->rk = rk;
    t->router = router;
    t->req_id = msg->req_id;
    t->state = TASK_QUEUED;
    t->ntokens = msg->n_tokens;
    memcpy(t->tokens, msg->tokens, msg->n_tokens * sizeof(int32_t));
    if (rk->pc != NULL) {   /* its chain of block hashes, once */
        uint32_t G = td_pcache_block(rk->pc);
        size_t nh = (size_t)(t->ntokens / G);

        if ((t->hashes = malloc((nh ? nh : 1) * sizeof(uint64_t))) == NULL) {
            td_log_peer_every(TD_LOG_ERROR, "prefill rank %u: req %016" PRIx64 ": out of "
                         "memory", rk->cfg.rank_id, msg->req_id);
            free(t->tokens);
            free(t);
            return;
        }
        (void)td_chain_hashes(rk->cfg.cache.seed, t->tokens, t->ntokens, G, t->hashes, nh);
        /* the state where the longest hit of this prompt or a longer one
         * ends: the last block end before its last token */
        t->snap_end = rk->cfg.cache.snapshots && t->ntokens > 0 ? (t->ntokens - 1) / G * G : 0;
    }
    task_sampling(t, msg->sampling);
    TAILQ_INSERT_TAIL(&rk->tasks, t, all);
    TAILQ_INSERT_TAIL(&rk->runq, t, run);
    rk->stats.tasks++;
    rk->stats.live++;
    const Tandem__KvDest *d = msg->dest;
    if (d && d->xfer_token.len != TD_XFER_TOKEN_LEN) {
        task_fail(t, TD_ERR_INVALID, "kv dest with a transfer token of %zu bytes (want %u)",
                  d->xfer_token.len, TD_XFER_TOKEN_LEN);
    } else if (d) {
        t->xfer_id = d->xfer_id;
        memcpy(t->token.b, d->xfer_token.data, TD_XFER_TOKEN_LEN);
        t->peer = prank_peer_find(rk, d->node_id ? d->node_id : "", d->rank_id);
        if (t->peer && t->peer->incarnation != d->incarnation) {
            task_fail(t, TD_ERR_STALE, "decode rank %s/%u: incarnation %016" PRIx64
                      " unknown (have %016" PRIx64 ")", t->peer->node, t->peer->rank,
                      d->incarnation, t->peer->incarnation);
            t->peer = NULL;
        } else if (!t->peer) {
            task_fail(t, TD_ERR_NOT_FOUND, "decode rank %s/%u unknown",
                      d->node_id ? d->node_id : "", d->rank_id);
        }
    } else {
        task_fail(t, TD_ERR_INVALID, "prefill without kv dest");
    }
    td_debug("prefill rank %u: req %016" PRIx64 ": %" PRIu64 " tokens queued",
             rk->cfg.rank_id, t->req_id, t->ntokens);
    if (t->status != TD_OK || task_check(t, msg) != TD_OK) {
        task_finish_engine(t);
        return;
    }
    if (rk->pc != NULL)   /* its cached prefix's SSD blocks, read while it waits */
        td_pcache_prefetch(rk->pc, t->ntokens, t->hashes);
    prank_schedule(rk);
    prank_publish_load(rk);
}

static void
prank_cancel(td_prank_t *rk, void *router, const Tandem__Cancel *msg)
{
    task_t *t = prank_task_find(rk, router, msg->req_id);
    if (!t) {
        td_debug("prefill rank %u: cancel of unknown req %016" PRIx64, rk->cfg.rank_id,
                 msg->req_id);
        return;
    }
    task_cancel(t, msg->reason && msg->reason[0] ? msg->reason : "by the router");
    prank_publish_load(rk);
}

void
td_prank_on_router_down(td_prank_t *rk, void *router)
{
    task_t *t, *tn;
    TAILQ_FOREACH_SAFE(t, &rk->tasks, all, tn) {
        if (t->router != router)
            continue;
        t->router = NULL;
        task_cancel(t, "router gone");
    }
    prank_publish_load(rk);
}

static void
prank_drain(td_prank_t *rk, int draining)
{
    if (rk->stopping || rk->draining == draining)
        return;
    rk->draining = draining;
    td_info("prefill rank %u: %s", rk->cfg.rank_id, draining ? "draining" : "drain ended");
    prank_publish_load(rk);
}

/* ---- Fences (docs/decoded.md, "Fencing") -------------------------------------- */

#define PRANK_FENCE_POLL_MS 10u

/* Whether nothing of transfer id towards decode incarnation dinc can land
 * any more: no task of it left (a canceled one still sends its terminal
 * note, then ends) and the xfer engine has nothing of it in flight. */
static bool
prank_fence_quiet(td_prank_t *rk, uint64_t dinc, uint64_t id)
{
    task_t *t;

    TAILQ_FOREACH(t, &rk->tasks, all)
        if (t->xfer_id == id && t->peer != NULL && t->peer->incarnation == dinc)
            return false;
    return td_xfer_quiet(rk->x, dinc, id);
}

static void
prank_fence_answer(td_prank_t *rk, const prank_fence_t *f)
{
    Tandem__Fenced ans = TANDEM__FENCED__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    ans.prefill_node = "";   /* the router names the rank from its connection */
    ans.prefill_rank = rk->cfg.rank_id;
    ans.prefill_incarnation = td_xfer_incarnation(rk->x);
    ans.decode_node = (char *)f->dnode;
    ans.decode_rank = f->drank;
    ans.decode_incarnation = f->dinc;
    ans.n_xfer_ids = f->nids;
    ans.xfer_ids = f->ids;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCED;
    env.fenced = &ans;
    td_info("prefill rank %u: %zu transfers to decode rank %s/%u fenced", rk->cfg.rank_id,
            f->nids, f->dnode, f->drank);
    if (rk->io.broadcast != NULL)   /* every router: any of them reaches the decode rank */
        rk->io.broadcast(&env, rk->io.arg);
}

/* Answer the fences whose transfers are all quiet; look again soon while
 * some wait. */
static void
prank_fence_check(td_prank_t *rk)
{
    prank_fence_t *f, *fn;
    struct timeval tv = { 0, PRANK_FENCE_POLL_MS * 1000 };

    TAILQ_FOREACH_SAFE(f, &rk->fences, link, fn) {
        size_t i = 0;
        while (i < f->nids && prank_fence_quiet(rk, f->dinc, f->ids[i]))
            i++;
        if (i < f->nids)
            continue;
        prank_fence_answer(rk, f);
        TAILQ_REMOVE(&rk->fences, f, link);
        free(f->ids);
        free(f);
    }
    if (!TAILQ_EMPTY(&rk->fences) && !rk->closing)
        evtimer_add(rk->fence_ev, &tv);
}

static void
prank_on_fence_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    prank_fence_check(arg);
}

/* A decode rank quarantined these transfers' blocks: stop their tasks (a
 * frozen process resumed, or a late one) and answer once nothing of them
 * can land. A Fence for another incarnation of this rank is not ours. */
static void
prank_fence(td_prank_t *rk, const Tandem__Fence *msg)
{
    prank_fence_t *f;
    task_t *t;

    if (msg->prefill_incarnation != td_xfer_incarnation(rk->x) ||
        msg->prefill_rank != rk->cfg.rank_id) {
        td_log_peer_every(TD_LOG_WARN, "prefill rank %u: fence for prefill %u#%016" PRIx64
                          " ignored: not this rank", rk->cfg.rank_id, msg->prefill_rank,
                          msg->prefill_incarnation);
        return;
    }
    for (size_t i = 0; i < msg->n_xfer_ids; i++)
        TAILQ_FOREACH(t, &rk->tasks, all)
            if (t->xfer_id == msg->xfer_ids[i] && t->peer != NULL &&
                t->peer->incarnation == msg->decode_incarnation)
                task_cancel(t, "fenced by the decode rank");
    f = calloc(1, sizeof(*f));
    if (f != NULL && msg->n_xfer_ids > 0)
        f->ids = malloc(msg->n_xfer_ids * sizeof(*f->ids));
    if (f == NULL || (msg->n_xfer_ids > 0 && f->ids == NULL)) {
        free(f);
        return;   /* the decode rank asks again */
    }
    snprintf(f->dnode, sizeof(f->dnode), "%.64s", msg->decode_node ? msg->decode_node : "");
    f->drank = msg->decode_rank;
    f->dinc = msg->decode_incarnation;
    f->nids = msg->n_xfer_ids;
    if (f->nids > 0)
        memcpy(f->ids, msg->xfer_ids, f->nids * sizeof(*f->ids));
    TAILQ_INSERT_TAIL(&rk->fences, f, link);
    prank_fence_check(rk);
}

void
td_prank_on_message(td_prank_t *rk, void *router, const Tandem__Envelope *env)
{
    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_PREFILL:
        prank_prefill(rk, router, env->prefill);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_CANCEL:
        prank_cancel(rk, router, env->cancel);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER:
        prank_decode_peer(rk, env->decode_peer);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_FENCE:
        prank_fence(rk, env->fence);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_DRAIN:
        prank_drain(rk, env->drain->draining);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_CACHE_FLUSH:
        if (rk->pc == NULL) {
            td_info("prefill rank %u: cache flush asked: this rank has no prefix cache",
                    rk->cfg.rank_id);
            break;
        }
        td_info("prefill rank %u: cache flush asked by the router (%s)", rk->cfg.rank_id,
                env->cache_flush->reason && env->cache_flush->reason[0] ? env->cache_flush->reason
                                                                        : "no reason given");
        td_pcache_flush(rk->pc);
        break;
    default:
        td_debug("prefill rank %u: message %d ignored", rk->cfg.rank_id, (int)env->payload_case);
        break;
    }
}

void
td_prank_stop(td_prank_t *rk)
{
    rk->stopping = 1;
    prank_publish_load(rk);
    prank_check_idle(rk);
}

void
td_prank_abort(td_prank_t *rk)
{
    rk->stopping = 1;
    task_t *t, *tn;
    TAILQ_FOREACH_SAFE(t, &rk->tasks, all, tn)
        task_cancel(t, "prefill rank stopping");
    prank_publish_load(rk);
    prank_check_idle(rk);
}

void
td_prank_load(const td_prank_t *rk, Tandem__Load *out)
{
    tandem__load__init(out);
    const task_t *t;
    TAILQ_FOREACH(t, &rk->runq, run)
        out->queued += t->state == TASK_QUEUED;
    out->queued_tokens = prank_queued_tokens(rk);
    out->running = rk->stats.live - out->queued;
    out->draining = rk->draining || rk->stopping;
    if (rk->pc != NULL)
        out->cache = (Tandem__CacheStats *)&rk->cache_stats;   /* the rank's: it outlives the Load */
}

void
td_prank_stats(const td_prank_t *rk, td_prank_stats_t *out)
{
    *out = rk->stats;
}

void
td_prank_register_fill(const td_prank_t *rk, Tandem__Register *reg)
{
    reg->xfer_deadline_ms = rk->cfg.deadline_ms;
    reg->cache_block_tokens = rk->pc != NULL ? td_pcache_block(rk->pc) : 0;
}

void
td_prank_on_router_up(td_prank_t *rk, void *router)
{
    (void)router;
    if (rk->pc != NULL)
        td_pcache_resync(rk->pc);   /* every router gets the whole list at the next tick */
}

/* Every 50 ms: the cache's news to the routers, and its figures in Load
 * when they moved. */
static void
prank_cache_tick(evutil_socket_t fd, short what, void *arg)
{
    td_prank_t *rk = arg;
    Tandem__CacheStats cs = TANDEM__CACHE_STATS__INIT;
    Tandem__CacheEvent ev = TANDEM__CACHE_EVENT__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    const uint64_t *added, *removed;
    size_t nadded, nremoved;
    int cleared;

    (void)fd;
    (void)what;
    if (rk->closing)
        return;
    td_pcache_events(rk->pc, &cleared, &added, &nadded, &removed, &nremoved);
    if ((cleared || nadded > 0 || nremoved > 0) && rk->io.broadcast != NULL) {
        ev.seq = ++rk->cache_seq;
        ev.cleared = cleared;
        ev.added = (uint64_t *)added;
        ev.n_added = nadded;
        ev.removed = (uint64_t *)removed;
        ev.n_removed = nremoved;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CACHE_EVENT;
        env.cache_event = &ev;
        rk->io.broadcast(&env, rk->io.arg);
    }
    td_pcache_stats(rk->pc, &cs);
    if (memcmp(&cs, &rk->cache_stats, sizeof(cs)) != 0) {
        Tandem__Load l;

        rk->cache_stats = cs;
        td_prank_load(rk, &l);
        if (rk->io.load != NULL)
            rk->io.load(&l, rk->io.arg);
    }
}

/* ---- Lifetime ----------------------------------------------------------------------- */

/* The compute thread's first act: its own compute pool, if the rank has one. */
static void
prank_compute_start(void *arg)
{
    td_prank_t *rk = arg;

    if (rk->cfg.compute_start != NULL)
        rk->cfg.compute_start(rk->cfg.compute_arg);
}

/* The rank's KV memory: per segment a pool of blocks (fixed: one slot per
 * run slot) registered with UCX, the puts' source; the accounting on top. */
static td_status_t
prank_pools_create(td_prank_t *rk)
{
    const td_layout_t *l = rk->e->layout;
    uint8_t **bases = calloc(l->nsegs, sizeof(*bases));
    td_status_t st = TD_ERR_NOMEM;
    uint64_t bytes = 0, pool_tokens = rk->cfg.kv_tokens;

    if (rk->cfg.cache.max_blocks > 0)   /* room for the cached blocks too */
        pool_tokens += rk->cfg.cache.max_blocks * rk->cfg.cache.block_tokens;
    rk->pools = calloc(l->nsegs, sizeof(*rk->pools));
    if (bases == NULL || rk->pools == NULL)
        goto out;
    st = td_kvpool_create(l, pool_tokens, rk->cfg.max_running, &rk->kp);
    if (st != TD_OK)
        goto out;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        uint64_t bb = td_kvpool_seg_block_bytes(rk->kp, s), nb = td_kvpool_seg_nblocks(rk->kp, s);

        st = td_xfer_pool_create(rk->x, s, TD_XFER_MEM_HOST, NULL, bb, nb, &rk->pools[s]);
        if (st != TD_OK)
            goto out;
        bases[s] = td_xfer_pool_base(rk->pools[s]);
        if (rk->cfg.prefault)
            td_xfer_pool_prefault(rk->pools[s]);
        bytes += bb * nb;
    }
    td_kvpool_set_memory(rk->kp, bases);
    td_info("prefill rank %u: kv pool of %" PRIu64 " tokens (%" PRIu64 " of them for the prefix "
            "cache), %.1f MiB, %u run slots", rk->cfg.rank_id, pool_tokens,
            pool_tokens - rk->cfg.kv_tokens, (double)bytes / (1 << 20), rk->cfg.max_running);
out:
    free(bases);
    return st;
}

td_status_t
td_prank_create(struct event_base *base, td_xfer_t *xfer, td_engine_t *engine,
                const td_prank_config_t *cfg, const td_prank_io_t *io, td_prank_t **out)
{
    char name[16];
    td_status_t st;

    if (cfg->chunk_tokens == 0 || cfg->max_running == 0 || cfg->deadline_ms == 0 ||
        cfg->kv_tokens == 0)
        return TD_ERR_INVALID;
    td_prank_t *rk = calloc(1, sizeof(*rk));
    if (!rk)
        return TD_ERR_NOMEM;
    rk->base = base;
    rk->x = xfer;
    rk->e = engine;
    rk->cfg = *cfg;
    rk->io = *io;
    TAILQ_INIT(&rk->tasks);
    TAILQ_INIT(&rk->runq);
    TAILQ_INIT(&rk->peers);
    TAILQ_INIT(&rk->fences);
    rk->fence_ev = evtimer_new(base, prank_on_fence_timer, rk);
    if (rk->fence_ev == NULL) {
        st = TD_ERR_NOMEM;
        goto err_destroy;
    }
    tandem__load__init(&rk->last_load);
    if (cfg->cache.max_blocks > 0) {
        rk->cfg.cache.rank_id = cfg->rank_id;
        rk->cfg.cache.replay_bound = td_engine_replay_bound(engine);
        if (rk->cfg.cache.block_tokens == 0)
            rk->cfg.cache.block_tokens = td_pcache_block_tokens(engine->layout);
        if (rk->cfg.cache.replay_bound == 0) {
            td_error("prefill rank %u: prefix cache: engine %s cannot replay a prefix "
                     "(--cache-blocks needs one that can)", cfg->rank_id, engine->name);
            st = TD_ERR_UNSUPPORTED;
            goto err_destroy;
        }
    }
    st = prank_pools_create(rk);
    if (st != TD_OK)
        goto err_destroy;
    if (cfg->cache.max_blocks > 0) {
        struct timeval tick = { 0, 50000 };

        st = td_pcache_create(&rk->cfg.cache, engine->layout, rk->kp, &rk->pc);   /* logs */
        rk->cfg.cache.ssd_dir = NULL;   /* the caller's: copied by the tier */
        if (st != TD_OK)
            goto err_destroy;
        tandem__cache_stats__init(&rk->cache_stats);
        rk->cache_ev = event_new(base, -1, EV_PERSIST, prank_cache_tick, rk);
        if (rk->cache_ev == NULL || event_add(rk->cache_ev, &tick) != 0) {
            td_error("prefill rank %u: prefix cache: cannot start its timer", cfg->rank_id);
            st = TD_ERR_NOMEM;
            goto err_destroy;
        }
    }
    if (cfg->trace_path != NULL && cfg->trace_path[0] != '\0') {
        char path[4096];
        snprintf(path, sizeof(path), "%s.%u", cfg->trace_path, cfg->rank_id);
        rk->trace = fopen(path, "a");
        if (rk->trace == NULL) {
            td_error("prefill rank %u: trace file %s: cannot open", cfg->rank_id, path);
            st = TD_ERR_IO;
            goto err_destroy;
        }
        setvbuf(rk->trace, NULL, _IOLBF, 0);
    }
    snprintf(name, sizeof(name), "prefill-c%u", cfg->rank_id);
    st = cfg->step != NULL
             ? td_jobq_create_stepped(base, name, prank_compute_start, rk, cfg->step, &rk->jq)
             : td_jobq_create(base, name, prank_compute_start, rk, &rk->jq);
    if (st != TD_OK)
        goto err_destroy;
    td_xfer_set_peer_fail_handler(xfer, prank_on_peer_fail, rk);
    *out = rk;
    return TD_OK;

err_destroy:
    td_prank_destroy(rk);
    return st;
}

static int
prank_inflight(const td_prank_t *rk)
{
    const task_t *t;
    TAILQ_FOREACH(t, &rk->tasks, all)
        if (t->inflight || t->state == TASK_PUSHING)
            return 1;
    return 0;
}

void
td_prank_destroy(td_prank_t *rk)
{
    if (!rk)
        return;
    rk->closing = 1;
    task_t *t, *tn;
    /* The compute thread first: the chunk it runs stops at its next layer;
     * what it had told the loop is dropped (closing). */
    if (rk->computing != NULL)
        atomic_store(&rk->computing->stop, 1);
    td_jobq_destroy(rk->jq);
    rk->jq = NULL;
    rk->computing = NULL;
    TAILQ_FOREACH(t, &rk->tasks, all)
        t->peer = NULL;
    prank_peer_t *p, *pn;
    TAILQ_FOREACH_SAFE(p, &rk->peers, link, pn) {
        TAILQ_REMOVE(&rk->peers, p, link);
        if (p->xp)
            td_xfer_peer_destroy(p->xp);
        prank_peer_free(p);
    }
    /* Closing the endpoints ends their transfers; their done callbacks free
     * the batches, and the blocks they read must stay until then: wait for
     * them (bounded) before freeing tasks and pools. */
    uint64_t until = td_clock_ns() + 2000000000ull;
    while (prank_inflight(rk) && td_clock_ns() < until) {
        td_xfer_progress(rk->x);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    td_xfer_set_peer_fail_handler(rk->x, NULL, NULL);
    TAILQ_FOREACH_SAFE(t, &rk->tasks, all, tn) {
        if (t->inflight || t->state == TASK_PUSHING)
            td_error("prefill rank %u: req %016" PRIx64 ": transfers still in flight at exit",
                     rk->cfg.rank_id, t->req_id);
        TAILQ_REMOVE(&rk->tasks, t, all);
        task_free(t);
    }
    if (rk->cache_ev != NULL)
        event_free(rk->cache_ev);
    if (rk->fence_ev != NULL)
        event_free(rk->fence_ev);
    while (!TAILQ_EMPTY(&rk->fences)) {
        prank_fence_t *f = TAILQ_FIRST(&rk->fences);
        TAILQ_REMOVE(&rk->fences, f, link);
        free(f->ids);
        free(f);
    }
    td_pcache_destroy(rk->pc);   /* after the tasks: nothing pins a block now */
    if (rk->pools != NULL)
        for (uint32_t s = 0; s < rk->e->layout->nsegs; s++)
            td_xfer_pool_destroy(rk->pools[s]);
    free(rk->pools);
    td_kvpool_destroy(rk->kp);
    if (rk->trace != NULL)
        fclose(rk->trace);
    free(rk);
}
