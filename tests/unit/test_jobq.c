/* tests/unit/test_jobq.c — net/jobq: jobs run on the compute thread in
 * order, one at a time, while the loop stays free; messages a job tells come
 * back on the loop before its done; destroy delivers what came back. A pool:
 * jobs run side by side on its threads, long jobs leave a thread to the
 * others, destroy drops what has not started. */
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

/* ---- A pool of threads ---------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, peak;      /* pool jobs running now, most at once */
    int release;            /* gate: blocked jobs may end */
    int ran[8];             /* job i ran */
    char names[8][16];      /* the thread job i ran on */
    int done[8];
    int ndone, want_done;
    pthread_t loop_thread;
    struct event_base *base;
} pool_t;

typedef struct {
    pool_t *p;
    int i;
    int gate;               /* wait for p->release (at most 5 s) */
    int wait_peak;          /* wait until this many jobs run at once (at most 5 s) */
} pjob_t;

static void
pool_run(void *arg)
{
    pjob_t *j = arg;
    pool_t *p = j->p;
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_getname_np(pthread_self(), p->names[j->i], sizeof p->names[j->i]);
    pthread_mutex_lock(&p->mu);
    p->ran[j->i] = !pthread_equal(pthread_self(), p->loop_thread);
    if (++p->running > p->peak)
        p->peak = p->running;
    pthread_cond_broadcast(&p->cv);
    while ((j->gate && !p->release) || (j->wait_peak && p->peak < j->wait_peak))
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) != 0)
            break;
    p->running--;
    pthread_mutex_unlock(&p->mu);
}

static void
pool_done(void *arg)
{
    pjob_t *j = arg;

    CHECK(pthread_equal(pthread_self(), j->p->loop_thread));
    j->p->done[j->i] = 1;
    if (++j->p->ndone == j->p->want_done)
        event_base_loopbreak(j->p->base);
}

static void
pool_release(pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->release = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Run the loop until want_done jobs are done (at most 10 s). */
static void
pool_wait(pool_t *p, int want_done)
{
    struct timeval tv = { 10, 0 };

    p->want_done = want_done;
    if (p->ndone < want_done) {
        event_base_loopexit(p->base, &tv);
        event_base_dispatch(p->base);
    }
    CHECK_EQ_INT(p->ndone, want_done);
}

/* Opens the gate a while later, once td_jobq_destroy has told the threads to
 * stop (it does that before it waits for them). */
static void *
pool_release_later(void *arg)
{
    usleep(300000);
    pool_release(arg);
    return NULL;
}

static void
test_pool(void)
{
    pool_t p;
    td_jobq_t *q;

    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    p.loop_thread = pthread_self();
    p.base = event_base_new();
    CHECK_STATUS(td_jobq_create_pool(p.base, "tpool", 0, NULL, NULL, &q), TD_ERR_INVALID);

    /* three threads: three jobs run at once, each on a named thread */
    CHECK_STATUS(td_jobq_create_pool(p.base, "tpool", 3, NULL, NULL, &q), TD_OK);
    pjob_t side[3] = { { &p, 0, 0, 3 }, { &p, 1, 0, 3 }, { &p, 2, 0, 3 } };
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(td_jobq_post(q, pool_run, pool_done, &side[i]), TD_OK);
    pool_wait(&p, 3);
    CHECK_EQ_INT(p.peak, 3);
    for (int i = 0; i < 3; i++) {
        CHECK(p.ran[i]);
        CHECK(strncmp(p.names[i], "tpool", 5) == 0 && p.names[i][5] >= '0' &&
              p.names[i][5] <= '2');
    }
    td_jobq_destroy(q);

    /* two threads: the second long job waits while a short one posted after
     * it runs on the thread left free */
    memset(p.ran, 0, sizeof p.ran);
    memset(p.done, 0, sizeof p.done);
    p.ndone = 0;
    p.peak = 0;
    CHECK_STATUS(td_jobq_create_pool(p.base, "tpool", 2, NULL, NULL, &q), TD_OK);
    pjob_t lj[2] = { { &p, 0, 1, 0 }, { &p, 1, 1, 0 } }, sj = { &p, 2, 0, 0 };
    CHECK_STATUS(td_jobq_post_long(q, pool_run, pool_done, &lj[0]), TD_OK);
    CHECK_STATUS(td_jobq_post_long(q, pool_run, pool_done, &lj[1]), TD_OK);
    CHECK_STATUS(td_jobq_post(q, pool_run, pool_done, &sj), TD_OK);
    pool_wait(&p, 1);
    CHECK(p.done[2]);                 /* the short one, while the long ones are held */
    CHECK(p.ran[0] && !p.ran[1]);     /* one long job at a time on two threads */
    CHECK_EQ_INT(td_jobq_pending(q), 2);
    pool_release(&p);
    pool_wait(&p, 3);
    CHECK(p.ran[1]);
    CHECK_EQ_INT(td_jobq_pending(q), 0);

    /* destroy: a running job's done is delivered, one not started is dropped */
    p.release = 0;
    p.ndone = 0;
    memset(p.done, 0, sizeof p.done);
    pjob_t held[4] = { { &p, 3, 1, 0 }, { &p, 4, 1, 0 }, { &p, 5, 1, 0 }, { &p, 6, 1, 0 } };
    CHECK_STATUS(td_jobq_post_long(q, pool_run, pool_done, &held[0]), TD_OK);
    CHECK_STATUS(td_jobq_post(q, pool_run, pool_done, &held[1]), TD_OK);
    CHECK_STATUS(td_jobq_post(q, pool_run, pool_done, &held[2]), TD_OK);
    pthread_mutex_lock(&p.mu);
    while (p.running < 2)
        pthread_cond_wait(&p.cv, &p.mu);
    pthread_mutex_unlock(&p.mu);
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, pool_release_later, &p) == 0);
    td_jobq_destroy(q);
    pthread_join(releaser, NULL);
    CHECK(p.done[3] && p.done[4] && !p.done[5]);
    CHECK(!p.ran[5]);

    event_base_free(p.base);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
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
    /* before the posts: the compute thread may start the 200 ms job at once */
    uint64_t t0 = td_clock_ns();
    for (int i = 0; i < 4; i++)
        CHECK_STATUS(td_jobq_post(c.q, run, done, &jobs[i]), TD_OK);
    CHECK_EQ_INT(td_jobq_pending(c.q), 4);

    int ticks = 0;
    struct event *t = event_new(c.base, -1, EV_PERSIST, tick, &ticks);
    struct timeval tv = { 0, 10000 };
    event_add(t, &tv);
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

    test_pool();
    return td_check_exit("test_jobq");
}
