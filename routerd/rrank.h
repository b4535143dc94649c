/* routerd/rrank.h — routerd's view of one worker rank and of its node: what
 * the rank registered, its latest Load, what this router sent it since, how
 * many requests are bound to it; its state, and sending it one message.
 * cluster.c keeps the table of them, rsched.c chooses among them, rreq.c binds
 * requests to them. Ownership: cluster.c allocates and frees both. */
#ifndef TD_ROUTERD_RRANK_H
#define TD_ROUTERD_RRANK_H

#include <stdbool.h>
#include <stdint.h>

#include "ctl.h"
#include "hello.h"
#include "log.h"
#include "loopstat.h"
#include "rcache.h"
#include "status.h"
#include "tandem.pb-c.h"

typedef enum {
    TD_RRANK_UP = 0,     /* connected and registered, takes requests */
    TD_RRANK_JOINING,    /* connected, Register not yet received */
    TD_RRANK_DRAINING,   /* connected; the operator or the rank itself drains it */
    TD_RRANK_DEAD,       /* connection ended; kept for the admin view */
} td_rrank_state_t;

/* A node (one worker process's node id) as the operator sees it. */
typedef struct td_rrank_node_s {
    struct td_rrank_node_s *next;
    char name[TD_HELLO_NODE_ID_MAX + 1];
    bool draining;      /* admin drain */
    bool removing;      /* admin remove: forgotten once nothing is in flight */
} td_rrank_node_t;

/* Since the router started: Prefills this router sent a prefill rank, their
 * prompt tokens, the tokens it expected cached there when it chose the rank,
 * the tokens the rank said it served from its cache (PrefillDone), and the
 * placements where the cache changed the choice (the load-only rule would
 * have chosen another rank). */
typedef struct {
    uint64_t placed;
    uint64_t prompt_tokens;
    uint64_t predicted_cached;
    uint64_t reported_cached;
    uint64_t by_cache;
} td_rrank_cache_counters_t;

typedef struct td_rrank_s {
    struct td_rrank_s *next;
    td_rrank_node_t *node;
    uint32_t rank_id;
    Tandem__Role role;
    uint64_t incarnation;
    td_ctl_conn_t *conn;        /* NULL once the connection ended */
    Tandem__Register *reg;      /* own unpacked copy; NULL until registered */
    Tandem__Load load;          /* latest Load (scalars only) */
    uint64_t *expert_tokens;    /* its expert_tokens (own copy; a DEP group's rank) */
    size_t n_expert_tokens;
    uint64_t pend_tokens;       /* KV tokens / prompt tokens we sent since that Load */
    uint32_t pend_reqs;         /* requests we sent since that Load */
    /* A decode rank's room between its Loads (td_rrank_admit_*): the rows
     * and KV tokens of our requests it let go of since that Load, and the
     * Admits we sent it that it has not answered yet (a Load may not show
     * them: the next Load's pend_* start from these). */
    uint64_t freed_tokens;
    uint32_t freed_reqs;
    uint64_t unans_tokens;
    uint32_t unans_reqs;
    uint32_t inflight;          /* our requests bound to this rank */
    bool refused;               /* answered NO_CAPACITY since that Load: not chosen
                                   again until the next one */
    /* A prefill rank's prefix cache (docs/kvrouting.md): the blocks it
     * announced (empty without a cache: Register's cache_block_tokens 0),
     * its latest Load's CacheStats and this router's placements on it. */
    td_rcache_t cache;
    Tandem__CacheStats cache_stats;   /* scalars; valid when has_cache_stats */
    bool has_cache_stats;
    td_rrank_cache_counters_t cache_ctr;
    td_log_limit_t log;         /* the lines its messages can make the router repeat */
    td_loopstat_t loop;         /* its loop thread's passes, from its latest Load */
} td_rrank_t;

td_rrank_state_t td_rrank_state(const td_rrank_t *rk);
const char *td_rrank_state_str(td_rrank_state_t st);

/* A DEP group's rank: the size of its group (Register's dep_size), 0 for
 * any other rank and before it registered. */
uint32_t td_rrank_dep_size(const td_rrank_t *rk);
/* Whether a and b are ranks of one DEP group (same role and dep_domain). */
bool td_rrank_same_dep(const td_rrank_t *a, const td_rrank_t *b);
/* Whether a Register's DEP fields hold (none, or a domain of 1..64 printable
 * bytes and a rank below the size); why not in why. */
bool td_rrank_dep_valid(const Tandem__Register *reg, const char **why);

/* Queue one message to rk: TD_ERR_CLOSED when its connection has ended, else
 * what td_ctl_conn_send says. A failure is logged here (once); callers only
 * decide what to do about it. */
td_status_t td_rrank_send(td_rrank_t *rk, const Tandem__Envelope *env);

/* A Load from rk: its scalars, cache stats and expert rows become rk's
 * latest state, and what this router sent rk since (pend_*, refused) is in
 * it now. The message's arrays are copied, never kept. */
void td_rrank_load(td_rrank_t *rk, const Tandem__Load *ld);
/* Forget rk's load and what this router sent it (its connection ended, or
 * a new one began). */
void td_rrank_load_clear(td_rrank_t *rk);

/* A decode rank's room as this router reckons it between Loads: its last
 * Load, plus what it let go of since, less what we sent it since. */
typedef struct {
    uint64_t free_tok;          /* KV tokens free */
    uint64_t rows;              /* batch rows in use (running + queued) */
} td_rrank_room_t;

td_rrank_room_t td_rrank_room(const td_rrank_t *rk);

/* An Admit of need tokens (prompt + max_tokens) went to decode rank rk. */
void td_rrank_admit_sent(td_rrank_t *rk, uint64_t need);
/* rk answered it (AdmitOk or AdmitReject), or the request stopped waiting
 * for the answer: the next Load shows it if rk took it. */
void td_rrank_admit_answered(td_rrank_t *rk, uint64_t need);
/* rk let go of a request of ours holding need tokens and a row: Released,
 * a kept state (its blocks yield to admissions), or an AdmitReject. */
void td_rrank_admit_freed(td_rrank_t *rk, uint64_t need);

/* A prefill rank's cache block size in tokens (Register's
 * cache_block_tokens): 0 without a prefix cache or before it registered. */
uint32_t td_rrank_cache_block(const td_rrank_t *rk);

#endif
