/* common/jobq.h — a rank's compute thread: work handed from a loop thread to
 * one thread of its own (a queue and a condition variable), and what comes
 * back handed to the loop again (a queue and an eventfd, signalled only when
 * the queue goes from empty to non-empty: style rule 8). The loop thread never computes; the
 * compute thread never touches the loop's state (sockets, UCX, timers).
 *
 * Ownership: the loop thread creates and destroys the queue; a job's arg is
 * the caller's and must live until its done function ran (or the queue was
 * destroyed: jobs not yet started are then dropped without done, while the
 * messages and the done of the job that was running are still delivered,
 * inside td_jobq_destroy). Messages posted
 * from the compute thread (td_jobq_tell) run on the loop thread in the order
 * they were posted, and before the done function of the job that posted them. */
#ifndef TD_JOBQ_H
#define TD_JOBQ_H

#include <stddef.h>

#include "status.h"

struct event_base;

typedef struct td_jobq_s td_jobq_t;

/* Runs on the compute thread. */
typedef void (*td_jobq_run_fn)(void *arg);
/* Runs on the loop thread. */
typedef void (*td_jobq_done_fn)(void *arg);

/* Start the compute thread (named `name` in logs and /proc, at most 15
 * bytes shown) and hook its results into base. on_start, if given, runs
 * first on the compute thread (binding it to a compute pool, say). Logs its
 * failures. */
td_status_t td_jobq_create(struct event_base *base, const char *name,
                           td_jobq_run_fn on_start, void *start_arg, td_jobq_t **out);
/* Stop the thread after the job it is running (jobs not started are dropped,
 * their done functions not called), join it, deliver what came back (the
 * running job's messages and done), free everything. Loop thread. */
void td_jobq_destroy(td_jobq_t *q);

/* Queue run(arg) for the compute thread; done(arg) then runs on the loop
 * thread (done may be NULL). Jobs run one at a time, in order. Loop thread.
 * TD_ERR_NOMEM when the job cannot be queued (logged). */
td_status_t td_jobq_post(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg);

/* From the compute thread, inside a job: have fn(arg) run on the loop thread
 * soon (before the job's done). TD_ERR_NOMEM when it cannot be queued
 * (logged; fn will not run). */
td_status_t td_jobq_tell(td_jobq_t *q, td_jobq_done_fn fn, void *arg);

/* Jobs queued or running (loop thread). */
size_t td_jobq_pending(const td_jobq_t *q);

#endif
