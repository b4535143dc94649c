/* net/jobq.h — compute threads fed from a loop thread: work handed from
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
#include <stdint.h>

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
/* ---- A DEP group's compute thread ------------------------------------------------
 * The ranks of a DEP group step together (docs/dep.md, "In the daemons"):
 * every forward pass is a collective, so each rank's compute thread makes
 * the same number of passes. A stepped queue (one thread) runs each job
 * posted with td_jobq_post_pass as one step of the group: first `agree`
 * (every rank says whether it has a pass to run, and whether it is leaving),
 * then the job, which makes at most one pass (when it made none — it failed
 * before its pass — the queue makes an empty one in its place). A rank with
 * no such job joins every step another rank has work in with an empty pass;
 * when no rank has work the thread waits for a job up to idle_ms and agrees
 * again. Other jobs (td_jobq_post) run between steps, with no agreement.
 * Destroying the queue makes the rank leave: it takes no more jobs and keeps
 * joining the others' steps until every rank is leaving. After a failed
 * agreement (the group is broken) jobs run without agreeing (their passes
 * fail at once) and `broken` is called once. */
typedef struct {
    uint32_t ranks;       /* in the group */
    uint32_t work;        /* ranks with a pass to run in this step */
    uint32_t leaving;     /* ranks leaving */
} td_jobq_agreed_t;

typedef struct {
    /* Compute thread: this rank's part of the step's agreement. */
    td_status_t (*agree)(void *arg, int work, int leaving, td_jobq_agreed_t *out);
    /* Compute thread: this rank's empty pass (failures are the group's:
     * the next agreement fails). */
    void (*pass_empty)(void *arg);
    /* Any thread: passes begun so far. */
    uint64_t (*passes)(void *arg);
    /* Compute thread, once: the group broke (st: why). NULL: nothing. */
    void (*broken)(void *arg, td_status_t st);
    void *arg;
    uint32_t idle_ms;     /* an idle group agrees again after this long (>= 1) */
} td_jobq_step_t;

/* td_jobq_create with a stepped compute thread (step copied). */
td_status_t td_jobq_create_stepped(struct event_base *base, const char *name,
                                   td_jobq_run_fn on_start, void *start_arg,
                                   const td_jobq_step_t *step, td_jobq_t **out);
/* A job that makes one forward pass: one step of the group in a stepped
 * queue; td_jobq_post in any other. */
td_status_t td_jobq_post_pass(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done,
                              void *arg);
/* Steps the queue has agreed on, and of them those it joined with an empty
 * pass (any thread; 0 for a queue that is not stepped). */
void td_jobq_step_counts(const td_jobq_t *q, uint64_t *steps, uint64_t *empty);

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
