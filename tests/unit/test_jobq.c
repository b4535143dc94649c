/* tests/unit/test_jobq.c — common/jobq: jobs run on the compute thread in
 * order, one at a time, while the loop stays free; messages a job tells come
 * back on the loop before its done; destroy delivers what came back. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "check.h"
#include "clock.h"
#include "jobq.h"

typedef struct {
    td_jobq_t *q;
    pthread_t loop_thread;
    int order[64];          /* what ran, in order: +i run, 100+i told, 200+i done */
    atomic_int n;
    int on_compute[32];     /* run i was not on the loop thread */
    atomic_int running;     /* jobs running at once */
    atomic_int overlap;     /* a second job ran while one did */
    int started;
    int done;
    struct event_base *base;
} ctx_t;

typedef struct {
    ctx_t *c;
    int i;
    int sleep_ms;
} job_t;

static void
rec(ctx_t *c, int v)
{
    int k = atomic_fetch_add(&c->n, 1);
    if (k < 64)
        c->order[k] = v;
}

static void
told(void *arg)
{
    job_t *j = arg;
    CHECK(pthread_equal(pthread_self(), j->c->loop_thread));
    rec(j->c, 100 + j->i);
}

static void
run(void *arg)
{
    job_t *j = arg;
    if (atomic_fetch_add(&j->c->running, 1) != 0)
        atomic_store(&j->c->overlap, 1);
    j->c->on_compute[j->i] = !pthread_equal(pthread_self(), j->c->loop_thread);
    rec(j->c, j->i);
    if (j->sleep_ms)
        usleep((useconds_t)j->sleep_ms * 1000);
    CHECK_STATUS(td_jobq_tell(j->c->q, told, j), TD_OK);
    atomic_fetch_sub(&j->c->running, 1);
}

static void
done(void *arg)
{
    job_t *j = arg;
    CHECK(pthread_equal(pthread_self(), j->c->loop_thread));
    rec(j->c, 200 + j->i);
    if (++j->c->done == 4)
        event_base_loopbreak(j->c->base);
}

static void
on_start(void *arg)
{
    ((ctx_t *)arg)->started = 1;
}

/* A timer on the loop while a long job runs: the loop is not held up. */
static void
tick(evutil_socket_t fd, short what, void *arg)
{
    int *ticks = arg;
    (*ticks)++;
}

int
main(void)
{
    ctx_t c;
    memset(&c, 0, sizeof(c));
    c.loop_thread = pthread_self();
    c.base = event_base_new();
    CHECK(c.base != NULL);
    CHECK_STATUS(td_jobq_create(c.base, "test-jobq", on_start, &c, &c.q), TD_OK);

    job_t jobs[4] = { { &c, 0, 200 }, { &c, 1, 0 }, { &c, 2, 0 }, { &c, 3, 0 } };
    for (int i = 0; i < 4; i++)
        CHECK_STATUS(td_jobq_post(c.q, run, done, &jobs[i]), TD_OK);
    CHECK_EQ_INT(td_jobq_pending(c.q), 4);

    int ticks = 0;
    struct event *t = event_new(c.base, -1, EV_PERSIST, tick, &ticks);
    struct timeval tv = { 0, 10000 };
    event_add(t, &tv);
    uint64_t t0 = td_clock_ns();
    event_base_dispatch(c.base);
    uint64_t ms = (td_clock_ns() - t0) / 1000000;
    event_free(t);

    CHECK(c.started);
    CHECK_EQ_INT(td_jobq_pending(c.q), 0);
    CHECK(ms >= 200);
    CHECK(ticks >= 5);   /* the 10 ms timer kept firing during the 200 ms job */
    CHECK(!atomic_load(&c.overlap));
    for (int i = 0; i < 4; i++)
        CHECK(c.on_compute[i]);
    /* runs in order; each job's message before its done */
    int pos_run[4], pos_told[4], pos_done[4];
    int n = atomic_load(&c.n);
    CHECK_EQ_INT(n, 12);
    for (int k = 0; k < n && k < 64; k++) {
        int v = c.order[k];
        if (v < 100)
            pos_run[v] = k;
        else if (v < 200)
            pos_told[v - 100] = k;
        else
            pos_done[v - 200] = k;
    }
    for (int i = 0; i < 4; i++) {
        CHECK(pos_told[i] < pos_done[i]);
        if (i > 0)
            CHECK(pos_run[i - 1] < pos_run[i]);
    }

    /* destroy while a job runs: its message and done are still delivered */
    atomic_store(&c.n, 0);
    c.done = 0;
    job_t late = { &c, 5, 100 };
    CHECK_STATUS(td_jobq_post(c.q, run, done, &late), TD_OK);
    usleep(20000);   /* it has started */
    td_jobq_destroy(c.q);
    CHECK_EQ_INT(atomic_load(&c.n), 3);
    event_base_free(c.base);
    return td_check_exit("test_jobq");
}
