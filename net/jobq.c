/* net/jobq.c — the compute threads of jobq.h: FIFOs of jobs (short and
 * long ones) guarded by a mutex and a condition variable towards the threads,
 * a FIFO of messages guarded by the same mutex and an eventfd towards the
 * loop. */
#include "jobq.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"

#define JOBQ_MAX_THREADS 256

typedef struct jobq_item {
    struct jobq_item *next;
    td_jobq_run_fn run;       /* jobs only */
    td_jobq_done_fn fn;       /* done (jobs) or the message's function */
    void *arg;
    uint64_t seq;             /* jobs: the order they were posted in */
    int is_long;              /* jobs: posted with td_jobq_post_long */
    int is_done;              /* a job's completion: the pending count drops */
    int is_pass;              /* jobs: posted with td_jobq_post_pass */
} jobq_item_t;

typedef struct {
    jobq_item_t *head, *tail;
} jobq_list_t;

struct td_jobq_s {
    char name[16];
    pthread_t *threads;        /* [nthreads] */
    unsigned nthreads;
    unsigned started;          /* threads running */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    jobq_list_t jobs;          /* to the compute threads: short jobs */
    jobq_list_t long_jobs;     /*   and long ones */
    unsigned long_running;     /* long jobs running now */
    unsigned long_max;         /* at most this many at once */
    uint64_t seq;              /* of the next job posted */
    unsigned idle;             /* threads waiting on cv for a job */
    jobq_list_t back;          /* to the loop */
    int stop;
    int efd;
    struct event *ev;
    size_t pending;            /* loop thread's count: posted, done not yet run */
    td_jobq_run_fn on_start;
    void *start_arg;
    int stepped;               /* a DEP group's compute thread: step below */
    td_jobq_step_t step;
    _Atomic uint64_t steps, steps_empty;
};

static void
jobq_push(jobq_list_t *l, jobq_item_t *it)
{
    it->next = NULL;
    if (l->tail != NULL)
        l->tail->next = it;
    else
        l->head = it;
    l->tail = it;
}

static jobq_item_t *
jobq_pop(jobq_list_t *l)
{
    jobq_item_t *it = l->head;

    if (it != NULL) {
        l->head = it->next;
        if (l->head == NULL)
            l->tail = NULL;
    }
    return it;
}

static void jobq_on_back(evutil_socket_t fd, short what, void *arg);

static void
jobq_free_list(jobq_list_t *l)
{
    jobq_item_t *it;

    while ((it = jobq_pop(l)) != NULL)
        free(it);
}

/* Wake the loop: its eventfd. */
static void
jobq_wake_loop(td_jobq_t *q)
{
    uint64_t one = 1;

    if (write(q->efd, &one, sizeof(one)) != sizeof(one))
        td_error("jobq %s: eventfd write failed: %s", q->name, strerror(errno));
}

/* Queue an item back to the loop; whether the loop must be woken (the list
 * was empty: the loop drains it whole). Called with mu held; the caller
 * wakes the loop after unlocking, so that the loop, woken, does not wait
 * for mu. */
static int
jobq_queue_back_locked(td_jobq_t *q, jobq_item_t *it)
{
    int was_empty = q->back.head == NULL;

    jobq_push(&q->back, it);
    return was_empty;
}

/* Hand an item back to the loop, waking it under mu (the stepped thread,
 * which keeps mu across its passes). */
static void
jobq_send_back_locked(td_jobq_t *q, jobq_item_t *it)
{
    if (jobq_queue_back_locked(q, it))
        jobq_wake_loop(q);
}

/* Wait on cv for a job or a stop (mu held), counted in idle so that a post
 * signals only when a thread waits. */
static void
jobq_wait_locked(td_jobq_t *q)
{
    q->idle++;
    pthread_cond_wait(&q->cv, &q->mu);
    q->idle--;
}

/* The next job a thread may start, taken off its list, or NULL: the one
 * posted first, unless it is long and long jobs are at their limit. Called
 * with mu held. */
static jobq_item_t *
jobq_take_locked(td_jobq_t *q)
{
    jobq_item_t *s = q->jobs.head, *l = q->long_jobs.head;

    if (l != NULL && q->long_running >= q->long_max)
        l = NULL;
    if (l != NULL && (s == NULL || l->seq < s->seq)) {
        q->long_running++;
        return jobq_pop(&q->long_jobs);
    }
    return s != NULL ? jobq_pop(&q->jobs) : NULL;
}

static void *
jobq_main(void *p)
{
    td_jobq_t *q = p;

    if (q->on_start != NULL)
        q->on_start(q->start_arg);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        jobq_item_t *it = NULL;

        while (!q->stop && (it = jobq_take_locked(q)) == NULL)
            jobq_wait_locked(q);
        if (q->stop)
            break;
        pthread_mutex_unlock(&q->mu);
        it->run(it->arg);
        pthread_mutex_lock(&q->mu);
        if (it->is_long && q->long_running-- == q->long_max)
            pthread_cond_broadcast(&q->cv);   /* a long job waiting may start now */
        it->is_done = 1;
        if (jobq_queue_back_locked(q, it)) {
            pthread_mutex_unlock(&q->mu);
            jobq_wake_loop(q);
            pthread_mutex_lock(&q->mu);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* The compute thread hands a finished job back. Called with mu held. */
static void
jobq_finish_locked(td_jobq_t *q, jobq_item_t *it)
{
    it->is_done = 1;
    jobq_send_back_locked(q, it);
}

/* A DEP group's compute thread (jobq.h, td_jobq_step_t). */
static void *
jobq_main_stepped(void *p)
{
    td_jobq_t *q = p;
    const td_jobq_step_t *sp = &q->step;
    int broken = 0;

    if (q->on_start != NULL)
        q->on_start(q->start_arg);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        jobq_item_t *it = q->stop ? NULL : jobq_take_locked(q);
        int leaving = q->stop;
        td_jobq_agreed_t ag = { 0, 0, 0 };
        td_status_t st;

        if (it != NULL && (!it->is_pass || broken)) {
            /* not a pass, or a broken group: no agreement (a pass fails at once) */
            pthread_mutex_unlock(&q->mu);
            it->run(it->arg);
            pthread_mutex_lock(&q->mu);
            jobq_finish_locked(q, it);
            continue;
        }
        if (broken) {
            if (q->stop)
                break;
            jobq_wait_locked(q);
            continue;
        }
        pthread_mutex_unlock(&q->mu);
        st = sp->agree(sp->arg, it != NULL, leaving, &ag);
        if (st != TD_OK) {
            broken = 1;
            if (sp->broken != NULL)
                sp->broken(sp->arg, st);
        } else {
            atomic_fetch_add_explicit(&q->steps, 1, memory_order_relaxed);
        }
        if (it != NULL) {
            uint64_t before = sp->passes(sp->arg);

            it->run(it->arg);
            if (!broken && sp->passes(sp->arg) == before) {
                /* it failed before its pass: the others are in theirs */
                atomic_fetch_add_explicit(&q->steps_empty, 1, memory_order_relaxed);
                sp->pass_empty(sp->arg);
            }
        } else if (!broken && ag.work > 0) {
            atomic_fetch_add_explicit(&q->steps_empty, 1, memory_order_relaxed);
            sp->pass_empty(sp->arg);
        }
        pthread_mutex_lock(&q->mu);
        if (it != NULL)
            jobq_finish_locked(q, it);
        if (broken)
            continue;
        if (leaving && ag.leaving == ag.ranks)
            break;   /* every rank leaves: nobody steps any more */
        if (it == NULL && ag.work == 0 && (q->stop || q->jobs.head == NULL)) {
            /* an idle group: no spinning */
            q->idle++;
            td_clock_cond_wait(&q->cv, &q->mu, (uint64_t)sp->idle_ms * 1000000ull);
            q->idle--;
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* The loop side: run every message and completion that came back. */
static void
jobq_on_back(evutil_socket_t fd, short what, void *arg)
{
    td_jobq_t *q = arg;
    jobq_list_t l;
    jobq_item_t *it;
    uint64_t v;

    (void)what;
    /* read before taking the list: an item queued after it wakes us again */
    if (read(fd, &v, sizeof(v)) != sizeof(v) && errno != EAGAIN)
        td_error("jobq %s: eventfd read failed: %s", q->name, strerror(errno));
    pthread_mutex_lock(&q->mu);
    l = q->back;
    q->back.head = q->back.tail = NULL;
    pthread_mutex_unlock(&q->mu);
    while ((it = jobq_pop(&l)) != NULL) {
        if (it->is_done)
            q->pending--;
        if (it->fn != NULL)
            it->fn(it->arg);
        free(it);
    }
}

/* Stop and join the threads that were started. */
static void
jobq_stop_threads(td_jobq_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (unsigned i = 0; i < q->started; i++)
        pthread_join(q->threads[i], NULL);
    q->started = 0;
}

static td_status_t
jobq_create(struct event_base *base, const char *name, unsigned nthreads,
            td_jobq_run_fn on_start, void *start_arg, const td_jobq_step_t *step,
            td_jobq_t **out)
{
    td_jobq_t *q;
    int rc;

    if (nthreads < 1 || nthreads > JOBQ_MAX_THREADS) {
        td_error("jobq %s: %u threads (1 to %u)", name, nthreads, JOBQ_MAX_THREADS);
        return TD_ERR_INVALID;
    }
    q = calloc(1, sizeof(*q));
    if (q == NULL || (q->threads = calloc(nthreads, sizeof(*q->threads))) == NULL) {
        free(q);
        td_error("jobq %s: out of memory", name);
        return TD_ERR_NOMEM;
    }
    snprintf(q->name, sizeof(q->name), "%s", name);
    q->nthreads = nthreads;
    q->long_max = nthreads > 1 ? nthreads - 1 : 1;
    q->on_start = on_start;
    q->start_arg = start_arg;
    if (step != NULL) {
        q->stepped = 1;
        q->step = *step;
        if (q->step.idle_ms < 1)
            q->step.idle_ms = 1;
    }
    atomic_init(&q->steps, 0);
    atomic_init(&q->steps_empty, 0);
    pthread_mutex_init(&q->mu, NULL);
    td_clock_cond_init(&q->cv);
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        td_error("jobq %s: eventfd: %s", name, strerror(errno));
        goto err_free;
    }
    q->ev = event_new(base, q->efd, EV_READ | EV_PERSIST, jobq_on_back, q);
    if (q->ev == NULL || event_add(q->ev, NULL) != 0) {
        td_error("jobq %s: cannot add its event to the loop", name);
        goto err_event;
    }
    for (unsigned i = 0; i < nthreads; i++) {
        char tname[16];

        rc = pthread_create(&q->threads[i], NULL, q->stepped ? jobq_main_stepped : jobq_main,
                            q);
        if (rc != 0) {
            td_error("jobq %s: cannot start thread %u: %s", name, i, strerror(rc));
            goto err_threads;
        }
        q->started++;
        if (nthreads == 1)
            snprintf(tname, sizeof(tname), "%s", q->name);
        else
            snprintf(tname, sizeof(tname), "%.*s%u", i < 10 ? 14 : i < 100 ? 13 : 12,
                     q->name, i);
        pthread_setname_np(q->threads[i], tname);
    }
    *out = q;
    return TD_OK;

err_threads:
    jobq_stop_threads(q);
err_event:
    if (q->ev != NULL)
        event_free(q->ev);
    close(q->efd);
err_free:
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->threads);
    free(q);
    return TD_ERR_IO;
}

td_status_t
td_jobq_create_pool(struct event_base *base, const char *name, unsigned nthreads,
                    td_jobq_run_fn on_start, void *start_arg, td_jobq_t **out)
{
    return jobq_create(base, name, nthreads, on_start, start_arg, NULL, out);
}

td_status_t
td_jobq_create(struct event_base *base, const char *name, td_jobq_run_fn on_start,
               void *start_arg, td_jobq_t **out)
{
    return jobq_create(base, name, 1, on_start, start_arg, NULL, out);
}

td_status_t
td_jobq_create_stepped(struct event_base *base, const char *name, td_jobq_run_fn on_start,
                       void *start_arg, const td_jobq_step_t *step, td_jobq_t **out)
{
    return jobq_create(base, name, 1, on_start, start_arg, step, out);
}

void
td_jobq_destroy(td_jobq_t *q)
{
    if (q == NULL)
        return;
    jobq_stop_threads(q);
    jobq_free_list(&q->jobs);
    jobq_free_list(&q->long_jobs);
    /* What came back is still delivered, so its owners free what they gave. */
    jobq_on_back(q->efd, EV_READ, q);
    event_free(q->ev);
    close(q->efd);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->threads);
    free(q);
}

static td_status_t
jobq_post(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg, int is_long,
          int is_pass)
{
    jobq_item_t *it = calloc(1, sizeof(*it));
    int wake;

    if (it == NULL) {
        td_error("jobq %s: out of memory for a job", q->name);
        return TD_ERR_NOMEM;
    }
    it->run = run;
    it->fn = done;
    it->arg = arg;
    it->is_long = is_long && q->nthreads > 1;
    it->is_pass = is_pass;
    q->pending++;
    pthread_mutex_lock(&q->mu);
    it->seq = q->seq++;
    jobq_push(it->is_long ? &q->long_jobs : &q->jobs, it);
    wake = q->idle > 0;
    pthread_mutex_unlock(&q->mu);
    if (wake)   /* after unlocking: the thread woken takes mu at once */
        pthread_cond_signal(&q->cv);
    return TD_OK;
}

td_status_t
td_jobq_post(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg)
{
    return jobq_post(q, run, done, arg, 0, 0);
}

td_status_t
td_jobq_post_pass(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg)
{
    return jobq_post(q, run, done, arg, 0, 1);
}

void
td_jobq_step_counts(const td_jobq_t *q, uint64_t *steps, uint64_t *empty)
{
    *steps = atomic_load_explicit(&q->steps, memory_order_relaxed);
    *empty = atomic_load_explicit(&q->steps_empty, memory_order_relaxed);
}

td_status_t
td_jobq_post_long(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg)
{
    return jobq_post(q, run, done, arg, 1, 0);
}

td_status_t
td_jobq_tell(td_jobq_t *q, td_jobq_done_fn fn, void *arg)
{
    jobq_item_t *it = calloc(1, sizeof(*it));
    int wake;

    if (it == NULL) {
        td_error("jobq %s: out of memory for a message", q->name);
        return TD_ERR_NOMEM;
    }
    it->fn = fn;
    it->arg = arg;
    pthread_mutex_lock(&q->mu);
    wake = jobq_queue_back_locked(q, it);
    pthread_mutex_unlock(&q->mu);
    if (wake)
        jobq_wake_loop(q);
    return TD_OK;
}

size_t
td_jobq_pending(const td_jobq_t *q)
{
    return q->pending;
}
