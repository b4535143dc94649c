/* net/ranks.h — N rank threads, each with its own event loop: start them,
 * wait until every one is ready (or one failed), stop them from the main
 * thread, join them. The daemons' rank threads (prefilld, decoded) run on it. */
#ifndef TD_RANKS_H
#define TD_RANKS_H

#include <stdint.h>

#include <event2/event.h>

#include "loopstat.h"
#include "status.h"

/* How the main thread asks a rank to stop; the rank's stop handler decides
 * what each means (finish the work first, or leave the loop now). */
typedef enum {
    TD_RANKS_STOP_DRAIN = 1,   /* end the work in hand, then leave the loop */
    TD_RANKS_STOP_NOW   = 2,   /* leave the loop now */
} td_ranks_stop_t;

/* Called on rank `id`'s own thread. init builds what the rank owns on its
 * loop `base` and cleans up after itself when it fails (the failure is logged
 * there); stop runs on the rank's loop when the main thread asked it to stop
 * and must end the loop (event_base_loopexit) sooner or later; fini runs after
 * the loop ended, only for a rank whose init succeeded. arg is the caller's. */
typedef struct {
    td_status_t (*init)(void *arg, uint32_t id, struct event_base *base);
    void (*stop)(void *arg, uint32_t id, td_ranks_stop_t how);
    void (*fini)(void *arg, uint32_t id);
    void *arg;
} td_ranks_handlers_t;

/* Owns the threads, each rank's event_base (created before init, freed after
 * fini) and an event on main_base; the caller owns main_base (created after
 * evthread_use_pthreads()) and whatever init builds. */
typedef struct td_ranks td_ranks_t;

/* Start n rank threads (named "<name> <id>" in logs, e.g. "decode rank 3") and
 * wait until each is ready or failed. When every rank has left its loop,
 * main_base's loop exits. On failure the started ranks are stopped
 * (TD_RANKS_STOP_NOW) and joined and the last failure is returned. */
td_status_t td_ranks_create(struct event_base *main_base, const char *name, uint32_t n,
                            const td_ranks_handlers_t *h, td_ranks_t **out);

/* On a rank thread (its init included): its loop's statistics (the
 * passes' durations, net/loopstat.h), read on that thread; NULL on any
 * other thread. */
td_loopstat_t *td_ranks_current_loopstat(void);

/* Ask every rank still in its loop to stop; safe from any non-rank thread. */
void td_ranks_stop(td_ranks_t *rs, td_ranks_stop_t how);

/* Stop (TD_RANKS_STOP_NOW) and join every rank, then free; NULL is a no-op. */
void td_ranks_destroy(td_ranks_t *rs);

#endif
