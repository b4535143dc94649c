/* routerd/rqueue.c — the admission queue: a list kept in placing order
 * (priority, then arrival), a deadline timer per entry, and one deferred
 * event that runs the owner's pass however many times capacity news came in
 * during one loop iteration. */
#include "rqueue.h"

#include <stdlib.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"

struct td_rqueue_s {
    td_rqueue_config_t cfg;
    td_rqueue_handlers_t h;
    td_rqueue_entry_t *head, *tail;
    size_t len;
    uint64_t seq;                   /* arrivals so far */
    struct event *pass;             /* made active by td_rqueue_kick */
};

/* a is placed before b: a higher priority, or the same and an earlier arrival. */
static bool
goes_before(const td_rqueue_entry_t *a, const td_rqueue_entry_t *b)
{
    return a->priority > b->priority || (a->priority == b->priority && a->seq < b->seq);
}

static void
unlink_entry(td_rqueue_t *q, td_rqueue_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        q->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        q->tail = e->prev;
    e->prev = e->next = NULL;
    e->q = NULL;
    q->len--;
}

/* e leaves for good (expired, or its owner is done with it): when it was
 * the head, the one behind may be placeable now. */
static void
remove_and_kick(td_rqueue_entry_t *e)
{
    td_rqueue_t *q = e->q;
    bool was_head = q && q->head == e;

    td_rqueue_remove(e);
    if (was_head)
        td_rqueue_kick(q);
}

static void
on_deadline(evutil_socket_t fd, short what, void *arg)
{
    td_rqueue_entry_t *e = arg;
    td_rqueue_t *q = e->q;

    if (!q)
        return;
    remove_and_kick(e);
    q->h.on_expired(e, q->h.arg);
}

static void
on_pass(evutil_socket_t fd, short what, void *arg)
{
    td_rqueue_t *q = arg;

    if (q->head)
        q->h.on_pass(q, q->h.arg);
}

void
td_rqueue_entry_init(td_rqueue_t *q, td_rqueue_entry_t *e, int32_t priority)
{
    e->priority = priority;
    e->seq = ++q->seq;
}

void
td_rqueue_entry_fini(td_rqueue_entry_t *e)
{
    remove_and_kick(e);
    if (e->timer)
        event_free(e->timer);
    e->timer = NULL;
}

td_status_t
td_rqueue_push(td_rqueue_t *q, td_rqueue_entry_t *e, bool bounded)
{
    uint64_t now = td_clock_ns(), deadline;
    td_rqueue_entry_t *p;
    struct timeval tv;

    if (bounded && q->len >= q->cfg.max_queued)
        return TD_ERR_BUSY;
    if (e->t_first_ns == 0)
        e->t_first_ns = now;
    deadline = e->t_first_ns + q->cfg.timeout_ms * 1000000u;
    if (now >= deadline)
        return TD_ERR_TIMEOUT;
    if (!e->timer) {
        e->timer = evtimer_new(q->cfg.base, on_deadline, e);
        if (!e->timer) {
            td_error("admission queue: out of memory for a deadline timer");
            return TD_ERR_NOMEM;
        }
    }
    tv.tv_sec = (time_t)((deadline - now) / 1000000000u);
    tv.tv_usec = (suseconds_t)((deadline - now) % 1000000000u / 1000u);
    evtimer_add(e->timer, &tv);
    /* from the tail: in the common case (one priority, a newcomer) no step */
    for (p = q->tail; p && goes_before(e, p); p = p->prev)
        ;
    e->prev = p;
    e->next = p ? p->next : q->head;
    if (e->next)
        e->next->prev = e;
    else
        q->tail = e;
    if (p)
        p->next = e;
    else
        q->head = e;
    e->q = q;
    e->t_enter_ns = now;
    q->len++;
    return TD_OK;
}

void
td_rqueue_remove(td_rqueue_entry_t *e)
{
    td_rqueue_t *q = e->q;

    if (!q)
        return;
    evtimer_del(e->timer);
    unlink_entry(q, e);
    if (q->cfg.wait)
        td_metrics_observe_wait(q->cfg.wait, (double)(td_clock_ns() - e->t_enter_ns) / 1e9);
}

td_rqueue_entry_t *
td_rqueue_head(const td_rqueue_t *q)
{
    return q->head;
}

bool
td_rqueue_ahead(const td_rqueue_t *q, const td_rqueue_entry_t *e)
{
    return q->head && goes_before(q->head, e);
}

void
td_rqueue_kick(td_rqueue_t *q)
{
    if (q->head)
        event_active(q->pass, EV_TIMEOUT, 1);   /* once, however often kicked */
}

void
td_rqueue_stats(const td_rqueue_t *q, td_rqueue_stats_t *out)
{
    uint64_t now = td_clock_ns(), first = now;

    for (const td_rqueue_entry_t *e = q->head; e; e = e->next)
        if (e->t_first_ns < first)
            first = e->t_first_ns;
    *out = (td_rqueue_stats_t){ .len = q->len, .max_queued = q->cfg.max_queued,
                                .timeout_ms = q->cfg.timeout_ms, .oldest_ns = now - first };
}

td_status_t
td_rqueue_create(const td_rqueue_config_t *cfg, const td_rqueue_handlers_t *h,
                 td_rqueue_t **out)
{
    td_rqueue_t *q = calloc(1, sizeof *q);

    if (!q)
        goto err_nomem;
    q->cfg = *cfg;
    q->h = *h;
    q->pass = event_new(cfg->base, -1, 0, on_pass, q);
    if (!q->pass)
        goto err_free_queue;
    *out = q;
    return TD_OK;

err_free_queue:
    free(q);
err_nomem:
    return TD_ERR_NOMEM;
}

void
td_rqueue_destroy(td_rqueue_t *q)
{
    if (!q)
        return;
    while (q->head) {
        evtimer_del(q->head->timer);
        unlink_entry(q, q->head);
    }
    event_free(q->pass);
    free(q);
}
