/* common/jobq.h — compute threads fed from a loop thread: work handed from
 * the loop to one thread of its own (a rank's compute thread) or to a small
 * pool of them (routerd's text threads) through a queue and a condition
 * variable, and what comes back handed to the loop again (a queue and an
 * eventfd, signalled only when the queue goes from empty to non-empty: style
 * rule 8). The loop thread never computes; the compute threads never touch
 * the loop's state (sockets, UCX, timers).
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
/* The same with nthreads (>= 1) compute threads taking jobs from one queue,
 * named `name` followed by their index. With more than one thread jobs run
 * side by side and their done functions come back in the order they end;
 * a caller that needs an order keeps one job at a time per thing it orders.
 * on_start runs first on each thread. */
td_status_t td_jobq_create_pool(struct event_base *base, const char *name, unsigned nthreads,
                                td_jobq_run_fn on_start, void *start_arg, td_jobq_t **out);
/* Stop the threads after the jobs they are running (jobs not started are
 * dropped, their done functions not called), join them, deliver what came
 * back (the running jobs' messages and done), free everything. Loop thread. */
void td_jobq_destroy(td_jobq_t *q);

/* Queue run(arg) for the compute thread; done(arg) then runs on the loop
 * thread (done may be NULL). With one thread jobs run one at a time, in
 * order; a pool starts them in order. Loop thread. TD_ERR_NOMEM when the job
 * cannot be queued (logged). */
td_status_t td_jobq_post(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg);
/* The same for a job that may run long (a 1 MiB prompt to tokenize): in a
 * pool, long jobs run on at most nthreads - 1 threads at once, so that the
 * other jobs always find a thread; jobs still start in the order they were
 * posted, except that a short job passes long ones that must wait. In a
 * one-thread queue it is td_jobq_post. */
td_status_t td_jobq_post_long(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done,
                              void *arg);

/* From the compute thread, inside a job: have fn(arg) run on the loop thread
 * soon (before the job's done). TD_ERR_NOMEM when it cannot be queued
 * (logged; fn will not run). */
td_status_t td_jobq_tell(td_jobq_t *q, td_jobq_done_fn fn, void *arg);

/* Jobs queued or running (loop thread). */
size_t td_jobq_pending(const td_jobq_t *q);

#endif
