/* comm/comm.c — the backend-independent half of the communicator: the
 * broken state (after a failure every call returns it, logged once), the
 * count of collectives, and the call into the backend's table. */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "log.h"

void
td_comm_init(td_comm_t *c, const td_comm_ops_t *ops, uint32_t rank, uint32_t size,
             const td_comm_opts_t *opts)
{
    c->ops = ops;
    c->rank = rank;
    c->size = size;
    c->deadline_ms = opts && opts->deadline_ms ? opts->deadline_ms : TD_COMM_DEADLINE_MS;
    snprintf(c->name, sizeof c->name, "%s", opts && opts->name ? opts->name : "comm");
    atomic_store(&c->broken, TD_OK);
    memset(&c->stats, 0, sizeof c->stats);
}

uint32_t
td_comm_rank(const td_comm_t *c)
{
    return c->rank;
}

uint32_t
td_comm_size(const td_comm_t *c)
{
    return c->size;
}

const char *
td_comm_backend(const td_comm_t *c)
{
    return c->ops->name;
}

td_status_t
td_comm_status(const td_comm_t *c)
{
    return (td_status_t)atomic_load(&((td_comm_t *)c)->broken);
}

/* Run one collective: refused on a broken communicator; a failure breaks it
 * (logged once, here). */
static td_status_t
comm_done(td_comm_t *c, const char *what, td_status_t st)
{
    int ok = TD_OK;

    c->stats.collectives++;
    if (st != TD_OK && atomic_compare_exchange_strong(&c->broken, &ok, st))
        td_warn("%s rank %u/%u: %s failed: %s; the communicator is broken", c->name, c->rank,
                c->size, what, td_status_str(st));
    return st;
}

td_status_t
td_comm_barrier(td_comm_t *c)
{
    td_status_t st = td_comm_status(c);

    if (st != TD_OK)
        return st;
    return comm_done(c, "barrier", c->ops->barrier(c));
}

td_status_t
td_comm_allgather(td_comm_t *c, const void *send, size_t bytes, void *recv)
{
    td_status_t st = td_comm_status(c);

    if (st != TD_OK)
        return st;
    return comm_done(c, "all-gather", c->ops->allgather(c, send, bytes, recv));
}

td_status_t
td_comm_reduce_scatter_f32(td_comm_t *c, const float *send, size_t count, float *recv)
{
    td_status_t st = td_comm_status(c);

    if (st != TD_OK)
        return st;
    return comm_done(c, "reduce-scatter", c->ops->reduce_scatter_f32(c, send, count, recv));
}

td_status_t
td_comm_alltoallv(td_comm_t *c, const void *send, const size_t *send_bytes, void *recv,
                  size_t recv_cap, size_t *recv_bytes)
{
    td_status_t st = td_comm_status(c);

    if (st != TD_OK)
        return st;
    return comm_done(c, "all-to-all",
                     c->ops->alltoallv(c, send, send_bytes, recv, recv_cap, recv_bytes));
}

void
td_comm_abort(td_comm_t *c, td_status_t st)
{
    int ok = TD_OK;

    if (st == TD_OK)
        st = TD_ERR_CANCELED;
    if (atomic_compare_exchange_strong(&c->broken, &ok, st) && c->ops->abort)
        c->ops->abort(c, st);
}

void
td_comm_stats(const td_comm_t *c, td_comm_stats_t *out)
{
    *out = c->stats;
}

void
td_comm_destroy(td_comm_t *c)
{
    if (c != NULL)
        c->ops->destroy(c);
}
