/* decoded/drank.h — one decode rank: its UCX worker and KV pools (the
 * engine's cache: requests decode in the blocks the prefill wrote into),
 * admission, the request state machines, adoption on KV arrival, the
 * continuous batch stepped on the rank's compute thread, and the messages to
 * the routers. It does not know how routers are reached: td_drank_io_t sends
 * to an opaque router handle (decoded/main.c wires it to the worker's links,
 * worker/worker.h; tests to a fake). Ownership: the rank owns its pools, its
 * requests and its compute thread; it borrows the UCX worker (td_xfer_t: its
 * note handler is the rank's while the rank lives), the engine (shared by
 * every rank) and the event_base, which must outlive it. Everything but the
 * engine's work runs on the loop thread of `base`, which never computes. */
#ifndef TD_DRANK_H
#define TD_DRANK_H

#include <stdint.h>

#include "engine.h"
#include "jobq.h"
#include "kvpool.h"
#include "status.h"
#include "tandem.pb-c.h"
#include "xfer.h"

struct event_base;

typedef struct td_drank_s td_drank_t;

/* The grace period, in transfer deadlines D (the larger of --xfer-deadline-ms
 * and the prefill rank's): blocks a prefill rank may still write into are
 * freed at most this many D after the request ended without P's terminal
 * note — two (P gets the Cancel within one D of us; its last transfer ends
 * within one more) and one for the prefill chunk in progress
 * (grace_margin_ms replaces that one when set). The code and decoded's
 * --help both take the number from here (TD_DRANK_GRACE_DEADLINES_STR). */
#define TD_DRANK_GRACE_DEADLINES 3
#define TD_DRANK_STR_(x) #x
#define TD_DRANK_STR(x) TD_DRANK_STR_(x)
#define TD_DRANK_GRACE_DEADLINES_STR TD_DRANK_STR(TD_DRANK_GRACE_DEADLINES)
/* The default cap on a router's prefill deadline (decoded's
 * prefill-deadline-max). */
#define TD_DRANK_PREFILL_DEADLINE_MAX_MS 60000u

typedef struct {
    /* Send one message to a router (the handle passed to td_drank_on_message). */
    td_status_t (*send)(void *router, const Tandem__Envelope *env, void *arg);
    /* The load changed (called on every change; the callee coalesces). */
    void (*load)(const Tandem__Load *load, void *arg);
    void *arg;
    /* After td_drank_stop: no request is live any more (called once, from
     * the loop; NULL: nobody to tell). */
    void (*idle)(void *arg);
    /* One message to every router that is up (a Fence: whichever knows the
     * prefill rank forwards it); NULL: send to none. */
    void (*broadcast)(const Tandem__Envelope *env, void *arg);
} td_drank_io_t;

typedef struct {
    const char *node_id;          /* copied */
    uint32_t rank_id;
    uint64_t kv_tokens;           /* KV capacity in tokens */
    uint32_t max_batch;           /* batch rows = fixed slots */
    uint32_t xfer_deadline_ms;    /* the prefill's transfer deadline, at least (Admit may
                                     name a longer one: the larger counts) */
    uint32_t prefill_deadline_max_ms;   /* the longest prefill deadline an Admit may name
                                     (prefill_deadline_ms): longer ones are clamped to
                                     it; 0: TD_DRANK_PREFILL_DEADLINE_MAX_MS */
    uint32_t grace_margin_ms;     /* replaces the last of the grace period's deadlines
                                     (the prefill chunk in progress when the Cancel
                                     came); 0: one deadline */
    uint32_t step_gap_us;         /* pause between decode steps; 0 = none */
    uint32_t quarantine_slots;    /* fixed slots for requests whose blocks wait for a fence
                                     (docs/decoded.md, "Fencing"), besides the batch rows */
    uint64_t quarantine_max_tokens;   /* KV tokens quarantined requests may hold; past it
                                     admission waits (0: kv_tokens / 4) */
    uint32_t fence_retry_ms;      /* a Fence is sent again this often (0: 1000) */
    uint32_t pause_slots;         /* fixed slots for requests paused for slow clients,
                                     besides the batch rows */
    uint64_t pause_max_bytes;     /* their KV bytes at most; past it the oldest paused
                                     one ends (0: a quarter of the pools) */
    uint32_t retain;              /* finished requests whose state the rank keeps for a
                                     next turn (docs/kvcache.md, "Multi-turn"): extra
                                     fixed slots; their blocks yield to admissions; 0: none */
    const char *trace_path;       /* append adoption timings to PATH.<rank>; NULL: none */
    int prefault;                 /* fault the pools in at create (td_xfer_pool_prefault) */
    /* Run first on the compute thread (binding it to its own compute pool);
     * NULL: nothing. */
    void (*compute_start)(void *arg);
    void *compute_arg;
    /* A DEP group's rank (--dep): the compute thread steps with the group's
     * (net/jobq.h; copied); NULL: it runs its jobs alone. */
    const td_jobq_step_t *step;
} td_drank_config_t;

typedef struct {
    uint64_t admitted, rejected, finished, canceled, failed, released;
    uint64_t verified_bytes;      /* received KV bytes checked against the engine */
    uint64_t notes_stale;         /* KV notes from another prefill incarnation than the
                                     request's (dropped) */
    uint64_t kv_sum_mismatch;     /* requests failed: received KV checksum differs */
    uint64_t deadlines_clamped;   /* Admits whose prefill deadline was over the cap */
    uint64_t quarantined;         /* requests whose blocks went to quarantine */
    uint64_t fenced;              /*   of them freed on a Fenced (gone: gone_fenced) */
    uint64_t gone_fenced;
    uint64_t fences_sent;         /* Fence messages sent */
    uint32_t quarantined_now;     /* requests in quarantine now */
    uint64_t quarantined_tokens;  /*   the KV tokens they hold, */
    uint64_t quarantined_blocks;  /*   and their paged blocks */
    uint64_t paused, resumed;     /* Pause and resume taken */
    uint64_t pause_evicted;       /* paused requests ended for the paused budget */
    uint32_t paused_now;          /* requests paused now, */
    uint64_t paused_bytes;        /*   their KV bytes */
    uint64_t steps;               /* decode steps run */
    uint64_t kept;                /* finished requests whose state was kept */
    uint64_t kept_dropped;        /*   of them dropped again (room, drain, router gone) */
    uint64_t continued;           /*   of them continued by a next turn */
    uint64_t continue_tokens;     /* suffix tokens those turns prefilled here */
    uint32_t kept_now;            /* kept states held now */
    uint32_t live;                /* requests holding blocks */
    uint32_t running;             /* in the batch */
    uint32_t waiting;             /* admitted, waiting for KV */
} td_drank_stats_t;

/* Register one pool per layout segment on xfer (UCX-allocated memory), size
 * the accounting, take xfer's notes. Failures are returned, not logged (the
 * caller names the rank that did not start; xfer logs its own). */
td_status_t td_drank_create(struct event_base *base, td_xfer_t *xfer, td_engine_t *engine,
                            const td_drank_config_t *cfg, const td_drank_io_t *io,
                            td_drank_t **out);
/* Frees every request (its blocks too, whatever the peers: the pools go
 * away with it, so a late write fails at its sender). */
void td_drank_destroy(td_drank_t *r);

/* What this rank adds to its Register: its UCX address, pools, capacity
 * (pointers into the rank: valid while it lives). */
void td_drank_register_fill(const td_drank_t *r, Tandem__Register *reg);

/* One message from a router (Admit, Cancel, Drain; others are ignored). An
 * Admit with continue_from takes over a kept state (cfg.retain) and
 * prefills the prompt's rest on this rank's compute thread. */
void td_drank_on_message(td_drank_t *r, void *router, const Tandem__Envelope *env);
/* That router is gone: its requests are canceled (no more sends to it). */
void td_drank_on_router_down(td_drank_t *r, void *router);

/* Shutdown: take no more work (Admit: rejected, draining); the live
 * requests go on, and io.idle runs once none is left ... */
void td_drank_stop(td_drank_t *r);
/* ... or, at the drain deadline, they fail (Tokens ERROR "decode rank
 * shutting down"), and io.idle runs. */
void td_drank_abort(td_drank_t *r);

/* Publish the current load through io.load (also when unchanged). */
void td_drank_load(td_drank_t *r);

void td_drank_stats(const td_drank_t *r, td_drank_stats_t *out);
void td_drank_kv_counts(const td_drank_t *r, td_kvpool_counts_t *out);

#endif
