/* comm/cpu.c — the communicator's CPU backend: the ranks of a group are
 * threads of one process sharing memory. A collective publishes this rank's
 * pointers in its slot, meets the others at a barrier, copies straight out
 * of the other ranks' buffers and meets them at a second barrier, after
 * which no rank reads its buffers any more. */
#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "comm.h"
#include "log.h"

/* A group larger than this is a bug in the caller (a DEP group is a few
 * dozen ranks at most). */
#define CPU_MAX_RANKS 4096u

/* Polls of the barrier's phase before a waiter sleeps on the condition
 * variable: short, since the rank threads often outnumber the cores. */
#define CPU_SPIN 200

/* Floats a reduce-scatter sums at a time (on the stack). */
#define CPU_RS_CHUNK 512

/* ---- The group ------------------------------------------------------------------------ */

/* What a rank publishes for the collective it is in; read by the other
 * ranks between the two barriers of that collective. */
typedef struct {
    alignas(64) uint64_t arrived;   /* phase + 1 of the last barrier this rank reached */
    const void *send;
    size_t bytes;                   /* all-gather: bytes; reduce-scatter: floats */
    const size_t *send_bytes;       /* all-to-all: [size] bytes per destination */
    size_t *offset;                 /* all-to-all: [size] where each segment starts */
} cpu_slot_t;

struct td_comm_group_s {
    uint32_t size;
    uint64_t deadline_ms;
    char name[48];
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* on CLOCK_MONOTONIC */
    uint32_t arrived;               /* ranks at the current barrier (under mu) */
    _Atomic uint64_t phase;         /* barriers completed; changed under mu */
    _Atomic int status;             /* TD_OK, or what the other ranks' collectives return */
    uint64_t broken_phase;          /* the phase in progress when it broke (under mu) */
    uint32_t live;                  /* communicators taken and not destroyed (under mu) */
    bool *taken;                    /* [size]: rank's communicator exists (under mu) */
    cpu_slot_t *slots;              /* [size] */
    size_t *offsets;                /* [size * size]: the slots' offset arrays */
};

typedef struct {
    td_comm_t head;
    td_comm_group_t *g;
    cpu_slot_t *me;
} cpu_comm_t;

td_status_t
td_comm_group_create(uint32_t size, const td_comm_opts_t *opts, td_comm_group_t **out)
{
    td_comm_group_t *g;
    pthread_condattr_t ca;
    td_status_t st = TD_ERR_NOMEM;

    if (size == 0 || size > CPU_MAX_RANKS) {
        td_error("comm: group of %u ranks: must be 1 to %u", size, CPU_MAX_RANKS);
        return TD_ERR_INVALID;
    }
    g = calloc(1, sizeof *g);
    if (g == NULL)
        goto err_log;
    g->size = size;
    g->deadline_ms = opts && opts->deadline_ms ? opts->deadline_ms : TD_COMM_DEADLINE_MS;
    snprintf(g->name, sizeof g->name, "%s", opts && opts->name ? opts->name : "comm");
    g->taken = calloc(size, sizeof *g->taken);
    if (g->taken == NULL)
        goto err_free_group;
    g->slots = aligned_alloc(alignof(cpu_slot_t), size * sizeof *g->slots);
    if (g->slots == NULL)
        goto err_free_taken;
    memset(g->slots, 0, size * sizeof *g->slots);
    g->offsets = calloc((size_t)size * size, sizeof *g->offsets);
    if (g->offsets == NULL)
        goto err_free_slots;
    for (uint32_t r = 0; r < size; r++)
        g->slots[r].offset = g->offsets + (size_t)r * size;
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        goto err_free_offsets;
    if (pthread_condattr_init(&ca) != 0)
        goto err_destroy_mutex;
    if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&g->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        st = TD_ERR_INTERNAL;
        goto err_destroy_mutex;
    }
    pthread_condattr_destroy(&ca);
    atomic_init(&g->phase, 0);
    atomic_init(&g->status, TD_OK);
    *out = g;
    return TD_OK;

err_destroy_mutex:
    pthread_mutex_destroy(&g->mu);
err_free_offsets:
    free(g->offsets);
err_free_slots:
    free(g->slots);
err_free_taken:
    free(g->taken);
err_free_group:
    free(g);
err_log:
    td_error("%s: group of %u ranks: %s", opts && opts->name ? opts->name : "comm", size,
             td_status_str(st));
    return st;
}

void
td_comm_group_destroy(td_comm_group_t *g)
{
    if (g == NULL)
        return;
    if (g->live != 0)
        td_error("%s: group destroyed with %u communicators alive", g->name, g->live);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->offsets);
    free(g->slots);
    free(g->taken);
    free(g);
}

/* Break the group (under mu): every rank's collectives return status from
 * now on, those waiting wake. The first break wins. */
static void
group_break_locked(td_comm_group_t *g, td_status_t status)
{
    int ok = TD_OK;

    if (atomic_load(&g->status) != TD_OK)
        return;
    g->broken_phase = atomic_load_explicit(&g->phase, memory_order_relaxed);
    atomic_compare_exchange_strong(&g->status, &ok, status);
    pthread_cond_broadcast(&g->cv);
}

static void
group_break(td_comm_group_t *g, td_status_t status)
{
    pthread_mutex_lock(&g->mu);
    group_break_locked(g, status);
    pthread_mutex_unlock(&g->mu);
}

/* ---- The barrier ---------------------------------------------------------------------- */

typedef enum {
    WAIT_BOUNDED,   /* ends at the deadline or when the group breaks */
    WAIT_DRAIN,     /* ends only when every rank is there */
} cpu_wait_t;

/* The ranks that have not reached the barrier of phase (under mu), as
 * "3, 5" in buf. */
static void
group_missing_locked(const td_comm_group_t *g, uint64_t phase, char *buf, size_t len)
{
    size_t n = 0;

    buf[0] = '\0';
    for (uint32_t r = 0; r < g->size && n < len; r++)
        if (g->slots[r].arrived != phase + 1)
            n += (size_t)snprintf(buf + n, len - n, "%s%u", n ? ", " : "", r);
}

static void
deadline_timespec(uint64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

/* Wait until every rank of the group has reached this barrier: a
 * generation barrier (the phase counts completed barriers; the last rank to
 * arrive starts the next phase), so consecutive barriers cannot mix; *passed
 * is the phase of this barrier.
 * WAIT_BOUNDED gives up at deadline_ns (CLOCK_MONOTONIC), breaking the
 * group with TD_ERR_TIMEOUT, and when the group is broken; WAIT_DRAIN, the
 * second barrier of a collective, waits for every rank whatever happens:
 * the ranks past the first barrier only copy memory, and one leaving early
 * would let its caller free a buffer another rank still reads. */
static td_status_t
group_wait(td_comm_group_t *g, cpu_comm_t *cc, uint64_t deadline_ns, cpu_wait_t how,
           uint64_t *passed)
{
    uint64_t phase;
    td_status_t st = TD_OK;
    struct timespec until;

    pthread_mutex_lock(&g->mu);
    if (how == WAIT_BOUNDED && (st = atomic_load(&g->status)) != TD_OK) {
        pthread_mutex_unlock(&g->mu);
        return st;
    }
    phase = atomic_load_explicit(&g->phase, memory_order_relaxed);
    *passed = phase;
    cc->me->arrived = phase + 1;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        atomic_store_explicit(&g->phase, phase + 1, memory_order_release);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return TD_OK;
    }
    pthread_mutex_unlock(&g->mu);

    for (int i = 0; i < CPU_SPIN; i++) {
        if (atomic_load_explicit(&g->phase, memory_order_acquire) != phase)
            return TD_OK;
        if (how == WAIT_BOUNDED && atomic_load_explicit(&g->status, memory_order_relaxed) != TD_OK)
            break;
    }

    deadline_timespec(deadline_ns, &until);
    pthread_mutex_lock(&g->mu);
    while (atomic_load_explicit(&g->phase, memory_order_relaxed) == phase) {
        int rc;

        if (how == WAIT_DRAIN) {
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        if ((st = atomic_load(&g->status)) != TD_OK)
            break;
        rc = pthread_cond_timedwait(&g->cv, &g->mu, &until);
        if (rc == ETIMEDOUT && atomic_load_explicit(&g->phase, memory_order_relaxed) == phase &&
            atomic_load(&g->status) == TD_OK) {
            char missing[128];

            group_missing_locked(g, phase, missing, sizeof missing);
            td_warn("%s rank %u/%u: no collective from rank(s) %s within %llu ms; "
                    "the group is broken", g->name, cc->head.rank, g->size, missing,
                    (unsigned long long)cc->head.deadline_ms);
            group_break_locked(g, TD_ERR_TIMEOUT);
            st = TD_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* The end of every collective that passed its first barrier: wait until no
 * rank reads this one's buffers, then report what this rank found (local),
 * or that the group broke before every rank was done. A rank that fails
 * breaks the group before it reaches the second barrier, so every rank sees
 * the failure in this same collective; a break after it (a rank that
 * finished and left) is for the next one. */
static td_status_t
cpu_finish(cpu_comm_t *cc, td_status_t local)
{
    td_comm_group_t *g = cc->g;
    td_status_t st = TD_OK;
    uint64_t drain;

    if (local != TD_OK)
        group_break(g, TD_ERR_PEER);
    (void)group_wait(g, cc, 0, WAIT_DRAIN, &drain);
    if (local != TD_OK)
        return local;
    if (atomic_load(&g->status) == TD_OK)
        return TD_OK;
    pthread_mutex_lock(&g->mu);
    if (g->broken_phase <= drain)
        st = atomic_load(&g->status);
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* now + the deadline, in CLOCK_MONOTONIC ns (a deadline too far to count
 * is never). */
static uint64_t
cpu_deadline(const cpu_comm_t *cc)
{
    uint64_t now = td_clock_ns();

    if (cc->head.deadline_ms > (UINT64_MAX - now) / 1000000u)
        return UINT64_MAX;
    return now + cc->head.deadline_ms * 1000000u;
}

/* ---- The collectives ------------------------------------------------------------------ */

/* A collective where every rank gives the same size: publish send (n units)
 * and wait for every rank; one that gave another n fails the collective for
 * the whole group (TD_ERR_MISMATCH). */
static td_status_t
cpu_publish_equal(cpu_comm_t *cc, const void *send, size_t n, const char *what,
                  const char *unit)
{
    td_comm_group_t *g = cc->g;
    uint64_t phase;
    td_status_t st;

    cc->me->send = send;
    cc->me->bytes = n;
    st = group_wait(g, cc, cpu_deadline(cc), WAIT_BOUNDED, &phase);
    if (st != TD_OK)
        return st;
    for (uint32_t r = 0; r < g->size; r++) {
        if (g->slots[r].bytes != n) {
            td_error("%s rank %u/%u: %s of %zu %s, rank %u gave %zu", g->name, cc->head.rank,
                     cc->head.size, what, n, unit, r, g->slots[r].bytes);
            return cpu_finish(cc, TD_ERR_MISMATCH);
        }
    }
    return TD_OK;
}

/* Its end: bytes_each went to, and came from, each other rank. */
static td_status_t
cpu_finish_equal(cpu_comm_t *cc, size_t bytes_each)
{
    td_status_t st = cpu_finish(cc, TD_OK);

    if (st == TD_OK) {
        cc->head.stats.bytes_sent += (uint64_t)bytes_each * (cc->g->size - 1);
        cc->head.stats.bytes_recv += (uint64_t)bytes_each * (cc->g->size - 1);
    }
    return st;
}

static td_status_t
cpu_barrier(td_comm_t *c)
{
    cpu_comm_t *cc = (cpu_comm_t *)c;
    uint64_t phase;

    return group_wait(cc->g, cc, cpu_deadline(cc), WAIT_BOUNDED, &phase);
}

static td_status_t
cpu_allgather(td_comm_t *c, const void *send, size_t bytes, void *recv)
{
    cpu_comm_t *cc = (cpu_comm_t *)c;
    td_comm_group_t *g = cc->g;
    td_status_t st = cpu_publish_equal(cc, send, bytes, "all-gather", "bytes");

    if (st != TD_OK)
        return st;
    for (uint32_t r = 0; r < g->size; r++) {
        unsigned char *to = (unsigned char *)recv + (size_t)r * bytes;

        if (r != c->rank)
            memcpy(to, g->slots[r].send, bytes);
        else if (to != send)
            memmove(to, send, bytes);
    }
    return cpu_finish_equal(cc, bytes);
}

/* recv[i] = rank 0's + rank 1's + ... segment `rank`, summed in that order,
 * a chunk at a time so recv may be this rank's own segment of send. */
static void
cpu_sum_segments(const td_comm_group_t *g, uint32_t rank, size_t count, float *recv)
{
    float acc[CPU_RS_CHUNK];

    for (size_t base = 0; base < count; base += CPU_RS_CHUNK) {
        size_t n = count - base < CPU_RS_CHUNK ? count - base : CPU_RS_CHUNK;
        const float *s0 = (const float *)g->slots[0].send + (size_t)rank * count + base;

        memcpy(acc, s0, n * sizeof(float));
        for (uint32_t r = 1; r < g->size; r++) {
            const float *sr = (const float *)g->slots[r].send + (size_t)rank * count + base;

            for (size_t i = 0; i < n; i++)
                acc[i] += sr[i];
        }
        memcpy(recv + base, acc, n * sizeof(float));
    }
}

static td_status_t
cpu_reduce_scatter_f32(td_comm_t *c, const float *send, size_t count, float *recv)
{
    cpu_comm_t *cc = (cpu_comm_t *)c;
    td_status_t st = cpu_publish_equal(cc, send, count, "reduce-scatter", "floats");

    if (st != TD_OK)
        return st;
    cpu_sum_segments(cc->g, c->rank, count, recv);
    return cpu_finish_equal(cc, count * sizeof(float));
}

static td_status_t
cpu_alltoallv(td_comm_t *c, const void *send, const size_t *send_bytes, void *recv,
              size_t recv_cap, size_t *recv_bytes)
{
    cpu_comm_t *cc = (cpu_comm_t *)c;
    td_comm_group_t *g = cc->g;
    size_t off = 0, total = 0;
    uint64_t sent = 0, phase;
    td_status_t st;

    for (uint32_t d = 0; d < g->size; d++) {
        cc->me->offset[d] = off;
        off += send_bytes[d];
        if (d != c->rank)
            sent += send_bytes[d];
    }
    cc->me->send = send;
    cc->me->send_bytes = send_bytes;
    st = group_wait(g, cc, cpu_deadline(cc), WAIT_BOUNDED, &phase);
    if (st != TD_OK)
        return st;
    for (uint32_t s = 0; s < g->size; s++) {
        size_t n = g->slots[s].send_bytes[c->rank];

        if (n > recv_cap - total) {
            td_error("%s rank %u/%u: all-to-all: more than the %zu bytes of room arrive",
                     g->name, c->rank, c->size, recv_cap);
            return cpu_finish(cc, TD_ERR_TOO_BIG);
        }
        total += n;
    }
    total = 0;
    for (uint32_t s = 0; s < g->size; s++) {
        const cpu_slot_t *from = &g->slots[s];
        size_t n = from->send_bytes[c->rank];

        if (n != 0)
            memcpy((unsigned char *)recv + total,
                   (const unsigned char *)from->send + from->offset[c->rank], n);
        recv_bytes[s] = n;
        total += n;
    }
    st = cpu_finish(cc, TD_OK);
    if (st == TD_OK) {
        c->stats.bytes_sent += sent;
        c->stats.bytes_recv += total - recv_bytes[c->rank];
    }
    return st;
}

static void
cpu_abort(td_comm_t *c, td_status_t st)
{
    cpu_comm_t *cc = (cpu_comm_t *)c;

    td_warn("%s rank %u/%u: aborted (%s); the group is broken", cc->g->name, c->rank, c->size,
            td_status_str(st));
    group_break(cc->g, TD_ERR_PEER);
}

/* A rank whose communicator is destroyed is gone: the group breaks (the
 * others' later collectives return TD_ERR_PEER). */
static void
cpu_destroy(td_comm_t *c)
{
    cpu_comm_t *cc = (cpu_comm_t *)c;
    td_comm_group_t *g = cc->g;

    pthread_mutex_lock(&g->mu);
    group_break_locked(g, TD_ERR_PEER);
    g->taken[c->rank] = false;
    g->live--;
    pthread_mutex_unlock(&g->mu);
    free(cc);
}

static const td_comm_ops_t cpu_ops = {
    .name = "cpu",
    .barrier = cpu_barrier,
    .allgather = cpu_allgather,
    .reduce_scatter_f32 = cpu_reduce_scatter_f32,
    .alltoallv = cpu_alltoallv,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
};

td_status_t
td_comm_cpu_create(td_comm_group_t *g, uint32_t rank, td_comm_t **out)
{
    cpu_comm_t *cc;
    td_comm_opts_t opts = { .deadline_ms = g->deadline_ms, .name = g->name };

    if (rank >= g->size) {
        td_error("%s: rank %u of a group of %u", g->name, rank, g->size);
        return TD_ERR_INVALID;
    }
    cc = calloc(1, sizeof *cc);
    if (cc == NULL) {
        td_error("%s rank %u/%u: %s", g->name, rank, g->size, td_status_str(TD_ERR_NOMEM));
        return TD_ERR_NOMEM;
    }
    pthread_mutex_lock(&g->mu);
    if (g->taken[rank]) {
        pthread_mutex_unlock(&g->mu);
        td_error("%s rank %u/%u: communicator already taken", g->name, rank, g->size);
        free(cc);
        return TD_ERR_STATE;
    }
    g->taken[rank] = true;
    g->live++;
    pthread_mutex_unlock(&g->mu);
    td_comm_init(&cc->head, &cpu_ops, rank, g->size, &opts);
    cc->g = g;
    cc->me = &g->slots[rank];
    *out = &cc->head;
    return TD_OK;
}
