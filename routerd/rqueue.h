/* routerd/rqueue.h — the admission queue: requests that found no decode rank
 * with room wait here, highest priority first and in arrival order within a
 * priority, each until its deadline. The queue orders, bounds, times out and
 * measures its entries; placing them is its owner's (rreq.c), which it calls
 * through the handlers it was given: a pass when capacity may have freed
 * (coalesced: one per loop iteration however often it was kicked), and each
 * entry whose deadline passed.
 * Ownership: the entries are embedded in their owners' objects; the queue
 * holds them while queued and frees nothing of theirs. td_rqueue_entry_fini
 * frees an entry's timer. */
#ifndef TD_ROUTERD_RQUEUE_H
#define TD_ROUTERD_RQUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "status.h"

struct event;
struct event_base;

typedef struct td_rqueue_s td_rqueue_t;

/* One request that may wait (td_rqueue_entry_init). */
typedef struct td_rqueue_entry_s {
    struct td_rqueue_entry_s *prev, *next;  /* in the queue, head first */
    td_rqueue_t *q;             /* the queue while queued, else NULL */
    int32_t priority;           /* higher first (the request's "priority") */
    uint64_t seq;               /* arrival order at the router, kept across stays */
    uint64_t t_first_ns;        /* when it first had to wait (0: never); the deadline
                                   counts from here; the owner may reset it to 0 */
    uint64_t t_enter_ns;        /* when this stay began */
    struct event *timer;        /* the deadline (created on the first push) */
} td_rqueue_entry_t;

typedef struct {
    /* Capacity may have freed: place entries from the head (td_rqueue_head)
     * until one has to go on waiting. */
    void (*on_pass)(td_rqueue_t *q, void *arg);
    /* e waited past its deadline and has left the queue (a pass follows when
     * it was the head): answer it. */
    void (*on_expired)(td_rqueue_entry_t *e, void *arg);
    void *arg;
} td_rqueue_handlers_t;

typedef struct {
    struct event_base *base;
    size_t max_queued;          /* new entries beyond this are refused (0: no queue) */
    uint64_t timeout_ms;        /* the longest wait, from t_first_ns (>= 1) */
    td_metrics_hist_t *wait;    /* each stay's wait is observed here, or NULL */
} td_rqueue_config_t;

/* A snapshot for /metrics and the admin status. */
typedef struct {
    size_t len;
    size_t max_queued;
    uint64_t timeout_ms;
    uint64_t oldest_ns;         /* the longest current wait (0: empty) */
} td_rqueue_stats_t;

/* TD_ERR_NOMEM (not logged: the caller says what it was for). */
td_status_t td_rqueue_create(const td_rqueue_config_t *cfg, const td_rqueue_handlers_t *h,
                             td_rqueue_t **out);
/* Entries still queued are unlinked, not answered. */
void td_rqueue_destroy(td_rqueue_t *q);

/* e (zeroed) as a request that arrived now, with its priority. */
void td_rqueue_entry_init(td_rqueue_t *q, td_rqueue_entry_t *e, int32_t priority);
/* Its owner is done with e: out of the queue (a pass follows when it was
 * the head), its timer freed. */
void td_rqueue_entry_fini(td_rqueue_entry_t *e);

/* Queue e (not queued) in its place: TD_ERR_BUSY when the queue holds
 * max_queued entries and bounded is set (a request coming back after it was
 * admitted once passes bounded = false: it keeps its turn); TD_ERR_TIMEOUT
 * when e's deadline has passed already; TD_ERR_NOMEM (logged). Nothing is
 * logged for a refusal: the owner answers it. */
td_status_t td_rqueue_push(td_rqueue_t *q, td_rqueue_entry_t *e, bool bounded);
/* Take e out of the queue to place it (its wait is observed); nothing when
 * not queued. */
void td_rqueue_remove(td_rqueue_entry_t *e);

/* The first entry to place, or NULL when empty. */
td_rqueue_entry_t *td_rqueue_head(const td_rqueue_t *q);
/* Whether a queued entry goes before e (not queued): one of a higher
 * priority, or of the same priority that arrived earlier. */
bool td_rqueue_ahead(const td_rqueue_t *q, const td_rqueue_entry_t *e);
/* Ask for a pass on the next loop iteration (nothing when empty). */
void td_rqueue_kick(td_rqueue_t *q);

void td_rqueue_stats(const td_rqueue_t *q, td_rqueue_stats_t *out);

#endif
