/* tests/unit/test_ranks.c — net/ranks.c: every rank ready on its own thread
 * and loop, a failing init stops and joins the others, stops from the main
 * thread reach only ranks still in their loop, destroy joins every thread. */
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "ranks.h"

#define NRANKS 4

typedef struct {
    int32_t fail_rank;           /* this rank's init fails (-1: none) */
    int32_t self_exit_rank;      /* this rank leaves its loop on its own (-1: none) */
    pthread_t main_th;
    pthread_t th[NRANKS];        /* the thread init ran on */
    struct event_base *base[NRANKS];
    struct event *ev[NRANKS];    /* a rank-owned event, freed by fini */
    int stops[NRANKS];
    td_ranks_stop_t how[NRANKS];
    int stop_on_own_thread[NRANKS];
    int fini_on_own_thread[NRANKS];
    _Atomic int inits;
    _Atomic int finis;
} fx_t;

static void
sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, ms % 1000 * 1000000 };
    nanosleep(&ts, NULL);
}

static void
fx_on_self_exit(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopexit(arg, NULL);
}

static td_status_t
fx_init(void *arg, uint32_t id, struct event_base *base)
{
    fx_t *f = arg;
    f->th[id] = pthread_self();
    f->base[id] = base;
    atomic_fetch_add(&f->inits, 1);
    if ((int32_t)id == f->fail_rank) {
        sleep_ms(20);            /* the others are in their loops by now */
        return TD_ERR_BUSY;
    }
    /* Keeps the loop busy (an empty loop would return at once), or ends it. */
    struct timeval tv = { (int32_t)id == f->self_exit_rank ? 0 : 60, 0 };
    f->ev[id] = evtimer_new(base, fx_on_self_exit, base);
    if (f->ev[id] == NULL || evtimer_add(f->ev[id], &tv) != 0)
        return TD_ERR_NOMEM;
    return TD_OK;
}

static void
fx_stop(void *arg, uint32_t id, td_ranks_stop_t how)
{
    fx_t *f = arg;
    f->stops[id]++;
    f->how[id] = how;
    f->stop_on_own_thread[id] = pthread_equal(pthread_self(), f->th[id]);
    event_base_loopexit(f->base[id], NULL);
}

static void
fx_fini(void *arg, uint32_t id)
{
    fx_t *f = arg;
    f->fini_on_own_thread[id] = pthread_equal(pthread_self(), f->th[id]);
    event_free(f->ev[id]);
    f->ev[id] = NULL;
    sleep_ms(10);                /* a destroy that did not join would see finis < n */
    atomic_fetch_add(&f->finis, 1);
}

static void
fx_init_fixture(fx_t *f, int32_t fail_rank, int32_t self_exit_rank)
{
    memset(f, 0, sizeof(*f));
    f->fail_rank = fail_rank;
    f->self_exit_rank = self_exit_rank;
    f->main_th = pthread_self();
}

static td_status_t
fx_create(struct event_base *main_base, fx_t *f, td_ranks_t **rs)
{
    td_ranks_handlers_t h = { fx_init, fx_stop, fx_fini, f };
    return td_ranks_create(main_base, "test rank", NRANKS, &h, rs);
}

typedef struct {
    struct event_base *base;
    int fired;
} watchdog_t;

static void
on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    watchdog_t *w = arg;
    w->fired = 1;
    event_base_loopexit(w->base, NULL);
}

/* Dispatch the main loop until the ranks make it exit; 1 if they did in time. */
static int
run_main_until_ranks_exit(struct event_base *main_base)
{
    watchdog_t w = { main_base, 0 };
    struct event *wd = evtimer_new(main_base, on_watchdog, &w);
    struct timeval tv = { 5, 0 };
    CHECK(wd != NULL && evtimer_add(wd, &tv) == 0);
    event_base_dispatch(main_base);
    if (wd)
        event_free(wd);
    return !w.fired;
}

static void
test_all_ready(struct event_base *main_base)
{
    fx_t f;
    fx_init_fixture(&f, -1, -1);
    td_ranks_t *rs = NULL;
    CHECK_STATUS(fx_create(main_base, &f, &rs), TD_OK);
    CHECK(rs != NULL);
    CHECK_EQ_INT(atomic_load(&f.inits), NRANKS);   /* all ready when create returns */
    CHECK_EQ_INT(atomic_load(&f.finis), 0);
    for (int i = 0; i < NRANKS; i++) {
        CHECK(f.base[i] != NULL);
        CHECK(!pthread_equal(f.th[i], f.main_th));
        for (int j = 0; j < i; j++) {
            CHECK(f.base[i] != f.base[j]);
            CHECK(!pthread_equal(f.th[i], f.th[j]));
        }
    }
    td_ranks_stop(rs, TD_RANKS_STOP_DRAIN);
    CHECK(run_main_until_ranks_exit(main_base));
    td_ranks_destroy(rs);
    CHECK_EQ_INT(atomic_load(&f.finis), NRANKS);
    for (int i = 0; i < NRANKS; i++) {
        CHECK_EQ_INT(f.stops[i], 1);               /* destroy's stop finds no live loop */
        CHECK_EQ_INT(f.how[i], TD_RANKS_STOP_DRAIN);
        CHECK(f.stop_on_own_thread[i]);
        CHECK(f.fini_on_own_thread[i]);
    }
}

static void
test_init_fails(struct event_base *main_base)
{
    fx_t f;
    fx_init_fixture(&f, 2, -1);
    td_ranks_t *rs = (td_ranks_t *)&f;             /* must stay untouched */
    CHECK_STATUS(fx_create(main_base, &f, &rs), TD_ERR_BUSY);
    CHECK(rs == (td_ranks_t *)&f);
    CHECK_EQ_INT(atomic_load(&f.inits), NRANKS);
    CHECK_EQ_INT(atomic_load(&f.finis), NRANKS - 1);   /* the others stopped and joined */
    for (int i = 0; i < NRANKS; i++) {
        CHECK_EQ_INT(f.stops[i], (i == 2 ? 0 : 1));
        if (i != 2) {
            CHECK_EQ_INT(f.how[i], TD_RANKS_STOP_NOW);
            CHECK(f.fini_on_own_thread[i]);
        }
    }
    CHECK(f.fini_on_own_thread[2] == 0);
}

static void
test_destroy_joins(struct event_base *main_base)
{
    fx_t f;
    fx_init_fixture(&f, -1, -1);
    td_ranks_t *rs = NULL;
    CHECK_STATUS(fx_create(main_base, &f, &rs), TD_OK);
    td_ranks_destroy(rs);
    CHECK_EQ_INT(atomic_load(&f.finis), NRANKS);
    for (int i = 0; i < NRANKS; i++) {
        CHECK_EQ_INT(f.stops[i], 1);
        CHECK_EQ_INT(f.how[i], TD_RANKS_STOP_NOW);
        CHECK(f.ev[i] == NULL);
    }
    td_ranks_destroy(NULL);
}

static void
test_self_exit_not_stopped(struct event_base *main_base)
{
    fx_t f;
    fx_init_fixture(&f, -1, 1);
    td_ranks_t *rs = NULL;
    CHECK_STATUS(fx_create(main_base, &f, &rs), TD_OK);
    while (atomic_load(&f.finis) < 1)            /* rank 1 leaves on its own */
        sleep_ms(1);
    td_ranks_stop(rs, TD_RANKS_STOP_DRAIN);
    CHECK(run_main_until_ranks_exit(main_base));
    td_ranks_destroy(rs);
    CHECK_EQ_INT(atomic_load(&f.finis), NRANKS);
    for (int i = 0; i < NRANKS; i++)
        CHECK_EQ_INT(f.stops[i], (i == 1 ? 0 : 1));
}

int
main(void)
{
    evthread_use_pthreads();
    struct event_base *main_base = event_base_new();
    CHECK(main_base != NULL);
    if (main_base == NULL)
        return td_check_exit("test_ranks");
    test_all_ready(main_base);
    test_init_fails(main_base);
    test_destroy_joins(main_base);
    test_self_exit_not_stopped(main_base);
    event_base_free(main_base);
    libevent_global_shutdown();
    return td_check_exit("test_ranks");
}
