/* common/jobq.c — the compute thread of jobq.h: a FIFO of jobs guarded by a
 * mutex and a condition variable towards the thread, a FIFO of messages
 * guarded by the same mutex and an eventfd towards the loop. */
#include "jobq.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "log.h"

typedef struct jobq_item {
    struct jobq_item *next;
    td_jobq_run_fn run;       /* jobs only */
    td_jobq_done_fn fn;       /* done (jobs) or the message's function */
    void *arg;
    int is_done;              /* a job's completion: the pending count drops */
} jobq_item_t;

typedef struct {
    jobq_item_t *head, *tail;
} jobq_list_t;

struct td_jobq_s {
    char name[16];
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    jobq_list_t jobs;          /* to the compute thread */
    jobq_list_t back;          /* to the loop */
    int stop;
    int efd;
    struct event *ev;
    size_t pending;            /* loop thread's count: posted, done not yet run */
    td_jobq_run_fn on_start;
    void *start_arg;
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

/* Hand an item back to the loop; the eventfd is written only when the list
 * was empty (the loop drains it whole). Called with mu held. */
static void
jobq_send_back_locked(td_jobq_t *q, jobq_item_t *it)
{
    int was_empty = q->back.head == NULL;
    uint64_t one = 1;

    jobq_push(&q->back, it);
    if (was_empty && write(q->efd, &one, sizeof(one)) != sizeof(one))
        td_error("jobq %s: eventfd write failed: %s", q->name, strerror(errno));
}

static void *
jobq_main(void *p)
{
    td_jobq_t *q = p;

    if (q->on_start != NULL)
        q->on_start(q->start_arg);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        jobq_item_t *it;

        while (!q->stop && q->jobs.head == NULL)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop)
            break;
        it = jobq_pop(&q->jobs);
        pthread_mutex_unlock(&q->mu);
        it->run(it->arg);
        pthread_mutex_lock(&q->mu);
        it->is_done = 1;
        jobq_send_back_locked(q, it);
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
    pthread_mutex_lock(&q->mu);
    if (read(fd, &v, sizeof(v)) != sizeof(v) && errno != EAGAIN)
        td_error("jobq %s: eventfd read failed: %s", q->name, strerror(errno));
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

td_status_t
td_jobq_create(struct event_base *base, const char *name, td_jobq_run_fn on_start,
               void *start_arg, td_jobq_t **out)
{
    td_jobq_t *q = calloc(1, sizeof(*q));
    int rc;

    if (q == NULL) {
        td_error("jobq %s: out of memory", name);
        return TD_ERR_NOMEM;
    }
    snprintf(q->name, sizeof(q->name), "%s", name);
    q->on_start = on_start;
    q->start_arg = start_arg;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) {
        td_error("jobq %s: eventfd: %s", name, strerror(errno));
        goto err_free;
    }
    q->ev = event_new(base, q->efd, EV_READ | EV_PERSIST, jobq_on_back, q);
    if (q->ev == NULL || event_add(q->ev, NULL) != 0) {
        td_error("jobq %s: cannot add its event to the loop", name);
        goto err_close;
    }
    rc = pthread_create(&q->thread, NULL, jobq_main, q);
    if (rc != 0) {
        td_error("jobq %s: cannot start its thread: %s", name, strerror(rc));
        goto err_event;
    }
    q->started = 1;
    pthread_setname_np(q->thread, q->name);
    *out = q;
    return TD_OK;

err_event:
    if (q->ev != NULL)
        event_free(q->ev);
err_close:
    close(q->efd);
err_free:
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
    return TD_ERR_IO;
}

void
td_jobq_destroy(td_jobq_t *q)
{
    if (q == NULL)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (q->started)
        pthread_join(q->thread, NULL);
    jobq_free_list(&q->jobs);
    /* What came back is still delivered, so its owners free what they gave. */
    jobq_on_back(q->efd, EV_READ, q);
    event_free(q->ev);
    close(q->efd);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

td_status_t
td_jobq_post(td_jobq_t *q, td_jobq_run_fn run, td_jobq_done_fn done, void *arg)
{
    jobq_item_t *it = calloc(1, sizeof(*it));

    if (it == NULL) {
        td_error("jobq %s: out of memory for a job", q->name);
        return TD_ERR_NOMEM;
    }
    it->run = run;
    it->fn = done;
    it->arg = arg;
    q->pending++;
    pthread_mutex_lock(&q->mu);
    jobq_push(&q->jobs, it);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return TD_OK;
}

td_status_t
td_jobq_tell(td_jobq_t *q, td_jobq_done_fn fn, void *arg)
{
    jobq_item_t *it = calloc(1, sizeof(*it));

    if (it == NULL) {
        td_error("jobq %s: out of memory for a message", q->name);
        return TD_ERR_NOMEM;
    }
    it->fn = fn;
    it->arg = arg;
    pthread_mutex_lock(&q->mu);
    jobq_send_back_locked(q, it);
    pthread_mutex_unlock(&q->mu);
    return TD_OK;
}

size_t
td_jobq_pending(const td_jobq_t *q)
{
    return q->pending;
}
