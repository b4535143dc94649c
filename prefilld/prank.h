/* prefilld/prank.h — one prefill rank: its decode peers, its task queue, its
 * KV pool (the engine computes each task's KV in the pool's blocks, and the
 * puts read it from there), the chunk scheduler that hands one chunk at a time
 * to the rank's compute thread, the KV push per (chunk, layer) as soon as the
 * layer is computed, and the terminal notification of every task.
 * Everything but the engine runs on the loop thread of `base`, which never
 * computes; the router connections are opaque handles (`router`) owned by the
 * caller, who reports their end with td_prank_on_router_down. Ownership: the
 * rank owns its tasks, its decode peers (td_xfer_peer_t), its pool and its
 * compute thread; it borrows base, xfer and engine, which must outlive it. */
#ifndef TD_PRANK_H
#define TD_PRANK_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "jobq.h"
#include "pcache.h"
#include "status.h"
#include "tandem.pb-c.h"
#include "xfer.h"

struct event_base;

typedef struct td_prank_s td_prank_t;

typedef struct {
    uint32_t rank_id;
    uint64_t chunk_tokens;       /* prefill chunk size (>= 1) */
    uint64_t max_queued_tokens;  /* prompt tokens not yet prefilled, all tasks; 0 = no cap */
    uint32_t max_running;        /* tasks prefilled round-robin at once (>= 1) */
    uint32_t deadline_ms;        /* per transfer (>= 1: the decode ranks' grace period
                                    relies on it) */
    uint64_t kv_tokens;          /* the KV pool: prompt tokens of the running tasks (>= 1) */
    const char *trace_path;      /* append per-layer timings to PATH.<rank>; NULL: none */
    int prefault;                /* fault the pool in at create (td_xfer_pool_prefault) */
    int hold_layers;             /* put a chunk's layers only when the whole chunk is
                                    computed (no layer-wise streaming: for comparison) */
    /* Run first on the compute thread (binding it to its own compute pool);
     * NULL: nothing. */
    void (*compute_start)(void *arg);
    void *compute_arg;
    /* A DEP group's rank (--dep): the compute thread steps with the group's
     * (net/jobq.h; copied); NULL: it runs its jobs alone. */
    const td_jobq_step_t *step;
    /* The prefix cache (pcache.h; cache.max_blocks 0: none). The pool grows
     * by max_blocks × block_tokens tokens for it; rank_id, seed and
     * replay_bound are filled by the rank. */
    td_pcache_config_t cache;
} td_prank_config_t;

typedef struct {
    /* Send one message (PrefillDone) to a router: the handle a Prefill came
     * with. A failure is the rank's to log. */
    td_status_t (*send)(void *router, const Tandem__Envelope *env, void *arg);
    /* The load changed (queued, queued_tokens, running, draining). */
    void (*load)(const Tandem__Load *load, void *arg);
    /* After td_prank_stop: the last task has ended (called from the loop). */
    void (*idle)(void *arg);
    void *arg;
    /* One message (CacheEvent) to every router that is up; NULL: none. */
    void (*broadcast)(const Tandem__Envelope *env, void *arg);
} td_prank_io_t;

/* Counters for tests and logs; all since create. */
typedef struct {
    uint64_t tasks;           /* Prefill messages taken */
    uint64_t done;            /* ended DONE */
    uint64_t failed;          /* ended FAILED */
    uint64_t canceled;        /* ended CANCELED */
    uint64_t chunks;          /* engine chunks run */
    uint64_t xfers;           /* data transfers posted */
    uint64_t notes;           /* terminal notifications posted */
    uint32_t live;            /* tasks not yet ended */
} td_prank_stats_t;

/* TD_ERR_INVALID for a zero chunk size, run limit, deadline or pool; the
 * pool and the compute thread log their own failures, the caller names the
 * rank that did not start. */
td_status_t td_prank_create(struct event_base *base, td_xfer_t *xfer, td_engine_t *engine,
                            const td_prank_config_t *cfg, const td_prank_io_t *io,
                            td_prank_t **out);
/* Ends every task without messages (their transfers are canceled and drained
 * first, so no block they read is freed under UCX) and closes the peers. */
void td_prank_destroy(td_prank_t *rk);

/* What this rank adds to its Register: its transfer deadline, its cache
 * block size. */
void td_prank_register_fill(const td_prank_t *rk, Tandem__Register *reg);

/* One message from a router: Prefill, Cancel, DecodePeer, Drain (others are
 * ignored). Copied as needed. A Prefill for a request this rank already holds
 * for that router is answered PrefillDone{invalid} and changes nothing. */
void td_prank_on_message(td_prank_t *rk, void *router, const Tandem__Envelope *env);
/* A router took this rank's registration: it gets the prefix cache's whole
 * content (CacheEvent, cleared). */
void td_prank_on_router_up(td_prank_t *rk, void *router);
/* The router's connection ended: its tasks are canceled (each still ends with
 * its terminal notification to the decode rank) and never reported to it. */
void td_prank_on_router_down(td_prank_t *rk, void *router);

/* Stop taking work (new Prefill: failed at once, with the terminal note);
 * the tasks in hand go on, and io.idle runs once none is left ... */
void td_prank_stop(td_prank_t *rk);
/* ... or, at the drain deadline, every task left is canceled (each still
 * ends with its terminal note) and io.idle follows once they have ended. */
void td_prank_abort(td_prank_t *rk);

void td_prank_load(const td_prank_t *rk, Tandem__Load *out);
void td_prank_stats(const td_prank_t *rk, td_prank_stats_t *out);

#endif
