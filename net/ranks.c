/* net/ranks.c — rank threads with one event loop each: a start-up handshake
 * under a mutex + condition variable, a cross-thread stop through event_active
 * on each rank's loop, and an event on the main loop when every rank has left. */
#include "ranks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "loopstat.h"

/* One rank thread; base and stop_ev belong to it, the rest is under rs->lock. */
typedef struct {
    td_ranks_t *rs;
    uint32_t id;
    pthread_t th;
    struct event_base *base;
    struct event *stop_ev;       /* activated by td_ranks_stop */
    _Atomic int how;             /* td_ranks_stop_t; the last asked */
    td_status_t init_st;         /* under rs->lock */
    bool init_done;              /* under rs->lock */
    bool alive;                  /* under rs->lock: its loop may take stop_ev */
    td_loopstat_t loop;          /* its loop's passes (td_ranks_loopstat) */
} td_ranks_rank_t;

struct td_ranks {
    char name[32];
    td_ranks_handlers_t h;
    struct event_base *main_base;
    struct event *exit_ev;       /* on main_base: a rank thread has left its loop */
    _Atomic uint32_t exited;
    uint32_t n;                  /* threads started */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    td_ranks_rank_t rank[];
};

/* ---- Rank thread ---------------------------------------------------------------- */

/* The calling rank thread's loop statistics (td_ranks_current_loopstat). */
static _Thread_local td_loopstat_t *ranks_self_loop;

static void
td_ranks_on_stop(evutil_socket_t fd, short what, void *arg)
{
    td_ranks_rank_t *r = arg;
    r->rs->h.stop(r->rs->h.arg, r->id, (td_ranks_stop_t)atomic_load(&r->how));
}

static void
td_ranks_loop_free(td_ranks_rank_t *r)
{
    if (r->stop_ev)
        event_free(r->stop_ev);
    r->stop_ev = NULL;
    if (r->base)
        event_base_free(r->base);
    r->base = NULL;
}

static td_status_t
td_ranks_rank_setup(td_ranks_rank_t *r)
{
    td_ranks_t *rs = r->rs;
    if (!(r->base = event_base_new()) ||
        !(r->stop_ev = event_new(r->base, -1, 0, td_ranks_on_stop, r))) {
        td_error("%s %u: cannot start: %s", rs->name, r->id, td_status_str(TD_ERR_NOMEM));
        td_ranks_loop_free(r);
        return TD_ERR_NOMEM;
    }
    td_status_t st = rs->h.init(rs->h.arg, r->id, r->base);
    if (st != TD_OK)
        td_ranks_loop_free(r);
    return st;
}

static void *
td_ranks_rank_main(void *arg)
{
    td_ranks_rank_t *r = arg;
    td_ranks_t *rs = r->rs;
    td_status_t st;

    ranks_self_loop = &r->loop;
    st = td_ranks_rank_setup(r);
    pthread_mutex_lock(&rs->lock);
    r->init_st = st;
    r->init_done = true;
    r->alive = st == TD_OK;
    pthread_cond_broadcast(&rs->cond);
    pthread_mutex_unlock(&rs->lock);
    if (st == TD_OK) {
        td_loopstat_dispatch(r->base, &r->loop);
        pthread_mutex_lock(&rs->lock);
        r->alive = false;
        pthread_mutex_unlock(&rs->lock);
        rs->h.fini(rs->h.arg, r->id);
        td_ranks_loop_free(r);
    }
    atomic_fetch_add(&rs->exited, 1);
    event_active(rs->exit_ev, 0, 0);
    return NULL;
}

/* ---- Main thread ---------------------------------------------------------------- */

static void
td_ranks_on_exit(evutil_socket_t fd, short what, void *arg)
{
    td_ranks_t *rs = arg;
    if (atomic_load(&rs->exited) == rs->n)
        event_base_loopexit(rs->main_base, NULL);
}

td_loopstat_t *
td_ranks_current_loopstat(void)
{
    return ranks_self_loop;
}

void
td_ranks_stop(td_ranks_t *rs, td_ranks_stop_t how)
{
    for (uint32_t i = 0; i < rs->n; i++) {
        td_ranks_rank_t *r = &rs->rank[i];
        atomic_store(&r->how, (int)how);
        pthread_mutex_lock(&rs->lock);
        if (r->alive)
            event_active(r->stop_ev, 0, 0);
        pthread_mutex_unlock(&rs->lock);
    }
}

void
td_ranks_destroy(td_ranks_t *rs)
{
    if (rs == NULL)
        return;
    td_ranks_stop(rs, TD_RANKS_STOP_NOW);
    for (uint32_t i = 0; i < rs->n; i++)
        pthread_join(rs->rank[i].th, NULL);
    event_free(rs->exit_ev);
    pthread_cond_destroy(&rs->cond);
    pthread_mutex_destroy(&rs->lock);
    free(rs);
}

td_status_t
td_ranks_create(struct event_base *main_base, const char *name, uint32_t n,
                const td_ranks_handlers_t *h, td_ranks_t **out)
{
    td_ranks_t *rs = calloc(1, sizeof(*rs) + (size_t)n * sizeof(rs->rank[0]));
    if (rs == NULL || !(rs->exit_ev = event_new(main_base, -1, 0, td_ranks_on_exit, rs))) {
        td_error("%s threads: out of memory", name);
        free(rs);
        return TD_ERR_NOMEM;
    }
    snprintf(rs->name, sizeof(rs->name), "%s", name);
    rs->h = *h;
    rs->main_base = main_base;
    pthread_mutex_init(&rs->lock, NULL);
    pthread_cond_init(&rs->cond, NULL);
    td_status_t st = TD_OK;
    for (uint32_t i = 0; i < n; i++) {
        td_ranks_rank_t *r = &rs->rank[i];
        r->rs = rs;
        r->id = i;
        if (pthread_create(&r->th, NULL, td_ranks_rank_main, r) != 0) {
            td_error("%s %u: cannot create its thread", rs->name, i);
            st = TD_ERR_IO;
            break;
        }
        rs->n = i + 1;
    }
    pthread_mutex_lock(&rs->lock);
    for (uint32_t i = 0; i < rs->n; i++) {
        while (!rs->rank[i].init_done)
            pthread_cond_wait(&rs->cond, &rs->lock);
        if (rs->rank[i].init_st != TD_OK)
            st = rs->rank[i].init_st;
    }
    pthread_mutex_unlock(&rs->lock);
    if (st != TD_OK) {
        td_ranks_destroy(rs);
        return st;
    }
    *out = rs;
    return TD_OK;
}
