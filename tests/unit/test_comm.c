/* tests/unit/test_comm.c — comm/cpu.c, the communicator's rank threads: every
 * collective for groups of 1, 2, 3, 4 and 8 ranks (reduce-scatter bit for bit
 * a sum in rank order, all-to-all byte for byte), 1000 back-to-back mixed
 * collectives at uneven speeds, and the failures: a missing rank (deadline),
 * an abort, a receive buffer too small, sizes that differ. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "comm.h"
#include "rng.h"
#include "testutil.h"

/* ---- Rank threads --------------------------------------------------------------------- */

typedef struct run_s run_t;

/* One rank thread's view: its communicator and its failed checks (the
 * checks of check.h are not for threads; main adds these up). */
typedef struct {
    run_t *run;
    uint32_t rank;
    td_comm_t *c;
    int fails;
    td_status_t st;          /* the failure cases: what the collective returned */
} rank_t;

typedef void (*rank_fn)(rank_t *r);

struct run_s {
    uint32_t size;
    const char *what;
    rank_fn fn;
    atomic_uint counter;     /* the barrier case */
    atomic_int aborted;      /* the abort case: the abort has happened */
    _Atomic uint64_t abort_ms;   /*   when (td_testutil_now_ms) */
    uint64_t start_ms;       /* when the threads were started */
    rank_t ranks[8];
};

#define RCHECK(r, cond)                                                                  \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: %s, %u ranks, rank %u: check failed: %s\n", __FILE__, \
                    __LINE__, (r)->run->what, (r)->run->size, (r)->rank, #cond);         \
            (r)->fails++;                                                                \
        }                                                                                \
    } while (0)

#define RCHECK_STATUS(r, expr, want)                                                     \
    do {                                                                                 \
        td_status_t got_ = (expr);                                                       \
        if (got_ != (want)) {                                                            \
            fprintf(stderr, "%s:%d: %s, %u ranks, rank %u: %s: got %s, want %s\n",       \
                    __FILE__, __LINE__, (r)->run->what, (r)->run->size, (r)->rank,       \
                    #expr, td_status_str(got_), td_status_str(want));                    \
            (r)->fails++;                                                                \
        }                                                                                \
    } while (0)

static void *
rank_main(void *arg)
{
    rank_t *r = arg;

    r->run->fn(r);
    /* destroyed at once: a rank that leaves must not fail the others'
     * collectives that it took part in */
    td_comm_destroy(r->c);
    r->c = NULL;
    return NULL;
}

/* Run fn on size rank threads of a fresh group; the ranks' results stay in
 * run->ranks. */
static void
run_ranks(run_t *run, uint32_t size, uint64_t deadline_ms, const char *what, rank_fn fn)
{
    td_comm_opts_t opts = { .deadline_ms = deadline_ms, .name = what };
    td_comm_group_t *g = NULL;
    pthread_t th[8];

    memset(run, 0, sizeof *run);
    run->size = size;
    run->what = what;
    run->fn = fn;
    CHECK_STATUS(td_comm_group_create(size, &opts, &g), TD_OK);
    if (g == NULL)
        return;
    for (uint32_t i = 0; i < size; i++) {
        run->ranks[i].run = run;
        run->ranks[i].rank = i;
        CHECK_STATUS(td_comm_cpu_create(g, i, &run->ranks[i].c), TD_OK);
    }
    run->start_ms = td_testutil_now_ms();
    for (uint32_t i = 0; i < size; i++)
        CHECK(pthread_create(&th[i], NULL, rank_main, &run->ranks[i]) == 0);
    for (uint32_t i = 0; i < size; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(run->ranks[i].fails, 0);
    }
    td_comm_group_destroy(g);
}

/* A little jitter: now and then this rank is late. */
static void
jitter(uint32_t rank, uint64_t it)
{
    uint64_t h = td_rng_mix64(it * 131 + rank);

    if (h % 8 == 0)
        usleep((useconds_t)(h >> 8) % 300);
    else if (h % 8 == 1)
        sched_yield();
}

/* ---- What the ranks send ------------------------------------------------------------- */

static uint8_t
byte_of(uint64_t seed, uint32_t from, uint32_t to, size_t i)
{
    return (uint8_t)td_rng_mix64(seed ^ ((uint64_t)from << 48) ^ ((uint64_t)to << 32) ^ i);
}

/* Values where the order of a sum matters: 1e8 and 1 mixed with both signs
 * (1e8 + 1 == 1e8 in float). */
static float
float_of(uint64_t seed, uint32_t from, size_t i)
{
    uint64_t h = td_rng_mix64(seed ^ ((uint64_t)from << 40) ^ i);
    static const float vals[] = { 1e8f, -1e8f, 1.0f, 3.0f, -1.0f, 0.1f, 7e7f, 2.5e-3f };

    return vals[h % 8] * (1.0f + (float)((h >> 8) % 1000) * 1e-4f);
}

/* all-to-all: bytes from rank s to rank d, zero about one time in three. */
static size_t
a2a_count(uint64_t seed, uint32_t s, uint32_t d, size_t max)
{
    uint64_t h = td_rng_mix64(seed * 7919 + s * 131 + d);

    return h % 3 == 0 ? 0 : (size_t)(h >> 8) % (max + 1);
}

/* ---- The collectives, checked ---------------------------------------------------------- */

static void
do_allgather(rank_t *r, uint64_t seed, size_t bytes, int in_place, uint8_t *send,
             uint8_t *recv)
{
    uint32_t n = r->run->size;
    const uint8_t *src = in_place ? recv + (size_t)r->rank * bytes : send;

    for (size_t i = 0; i < bytes; i++)
        ((uint8_t *)src)[i] = byte_of(seed, r->rank, 0, i);
    RCHECK_STATUS(r, td_comm_allgather(r->c, src, bytes, recv), TD_OK);
    for (uint32_t s = 0; s < n; s++) {
        size_t bad = 0;

        for (size_t i = 0; i < bytes; i++)
            bad += recv[(size_t)s * bytes + i] != byte_of(seed, s, 0, i);
        RCHECK(r, bad == 0);
    }
}

static void
do_reduce_scatter(rank_t *r, uint64_t seed, size_t count, int in_place, float *send,
                  float *recv)
{
    uint32_t n = r->run->size;
    float *out = in_place ? send + (size_t)r->rank * count : recv;
    size_t bad = 0;

    for (size_t i = 0; i < n * count; i++)
        send[i] = float_of(seed, r->rank, i);
    RCHECK_STATUS(r, td_comm_reduce_scatter_f32(r->c, send, count, out), TD_OK);
    for (size_t i = 0; i < count; i++) {
        size_t at = (size_t)r->rank * count + i;
        float want = float_of(seed, 0, at);

        for (uint32_t s = 1; s < n; s++)
            want += float_of(seed, s, at);
        bad += memcmp(&want, &out[i], sizeof want) != 0;
    }
    RCHECK(r, bad == 0);
}

/* Send a2a_count(seed, rank, d) bytes to each rank d, from recv room of cap
 * (at least what arrives); check each segment and that nothing past them
 * was written. */
static void
do_alltoallv(rank_t *r, uint64_t seed, size_t max, uint8_t *send, uint8_t *recv, size_t cap)
{
    uint32_t n = r->run->size;
    size_t send_bytes[8] = { 0 }, recv_bytes[8], off = 0, total = 0, bad = 0;

    for (uint32_t d = 0; d < n; d++) {
        send_bytes[d] = a2a_count(seed, r->rank, d, max);
        for (size_t i = 0; i < send_bytes[d]; i++)
            send[off + i] = byte_of(seed, r->rank, d, i);
        off += send_bytes[d];
    }
    memset(recv, 0xee, cap);
    RCHECK_STATUS(r, td_comm_alltoallv(r->c, send, send_bytes, recv, cap, recv_bytes), TD_OK);
    for (uint32_t s = 0; s < n; s++) {
        RCHECK(r, recv_bytes[s] == a2a_count(seed, s, r->rank, max));
        for (size_t i = 0; i < recv_bytes[s] && total + i < cap; i++)
            bad += recv[total + i] != byte_of(seed, s, r->rank, i);
        total += recv_bytes[s];
    }
    for (size_t i = total; i < cap; i++)
        bad += recv[i] != 0xee;
    RCHECK(r, bad == 0);
}

/* ---- The cases: every rank succeeds ------------------------------------------------------ */

static void
rank_barrier(rank_t *r)
{
    uint32_t n = r->run->size;

    for (unsigned it = 0; it < 50; it++) {
        atomic_fetch_add(&r->run->counter, 1);
        jitter(r->rank, it);
        RCHECK_STATUS(r, td_comm_barrier(r->c), TD_OK);
        RCHECK(r, atomic_load(&r->run->counter) == n * (it + 1));
        RCHECK_STATUS(r, td_comm_barrier(r->c), TD_OK);
    }
}

static void
rank_allgather(rank_t *r)
{
    static const size_t sizes[] = { 0, 1, 7, 4096, 100000 };
    uint32_t n = r->run->size;
    uint8_t *send = malloc(100000), *recv = malloc(100000 * (size_t)n);
    td_comm_stats_t before, after;
    uint64_t want = 0;

    td_comm_stats(r->c, &before);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        do_allgather(r, k, sizes[k], 0, send, recv);
        do_allgather(r, k + 100, sizes[k], 1, send, recv);
        want += 2 * sizes[k] * (n - 1);
    }
    td_comm_stats(r->c, &after);
    RCHECK(r, after.bytes_sent - before.bytes_sent == want);
    RCHECK(r, after.bytes_recv - before.bytes_recv == want);
    RCHECK(r, after.collectives - before.collectives == 10);
    free(send);
    free(recv);
}

static void
rank_reduce_scatter(rank_t *r)
{
    static const size_t counts[] = { 1, 5, 1000, 3000 };
    uint32_t n = r->run->size;
    float *send = malloc(3000 * sizeof(float) * n), *recv = malloc(3000 * sizeof(float));

    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        do_reduce_scatter(r, k, counts[k], 0, send, recv);
        do_reduce_scatter(r, k + 100, counts[k], 1, send, recv);
    }
    /* the values do make the order matter: summed from the last rank
     * down, some element of 3000 comes out different */
    if (n >= 3 && r->rank == 0) {
        size_t differ = 0;

        for (size_t i = 0; i < 3000; i++) {
            float fwd = float_of(7, 0, i), back = float_of(7, n - 1, i);

            for (uint32_t s = 1; s < n; s++)
                fwd += float_of(7, s, i);
            for (uint32_t s = n - 1; s-- > 0;)
                back += float_of(7, s, i);
            differ += memcmp(&fwd, &back, sizeof fwd) != 0;
        }
        RCHECK(r, differ > 0);
    }
    free(send);
    free(recv);
}

static void
rank_alltoallv(rank_t *r)
{
    static const size_t maxes[] = { 0, 1, 100, 70000 };
    uint32_t n = r->run->size;
    size_t cap = 70000 * (size_t)n + 64;
    uint8_t *send = malloc(70000 * (size_t)n), *recv = malloc(cap);
    td_comm_stats_t before, after;
    uint64_t sent = 0, got = 0;

    td_comm_stats(r->c, &before);
    for (size_t k = 0; k < sizeof maxes / sizeof maxes[0]; k++) {
        for (uint64_t seed = 0; seed < 5; seed++) {
            size_t exact = 0;

            for (uint32_t s = 0; s < n; s++)
                exact += a2a_count(seed * 10 + k, s, r->rank, maxes[k]);
            /* room for exactly what arrives, then more */
            do_alltoallv(r, seed * 10 + k, maxes[k], send, recv, seed % 2 ? exact : cap);
            for (uint32_t d = 0; d < n; d++) {
                if (d == r->rank)
                    continue;
                sent += a2a_count(seed * 10 + k, r->rank, d, maxes[k]);
                got += a2a_count(seed * 10 + k, d, r->rank, maxes[k]);
            }
        }
    }
    td_comm_stats(r->c, &after);
    RCHECK(r, after.bytes_sent - before.bytes_sent == sent);
    RCHECK(r, after.bytes_recv - before.bytes_recv == got);
    free(send);
    free(recv);
}

/* 1000 collectives back to back, the kind chosen per step, the ranks late at
 * random, the same buffers rewritten as soon as a collective returns: a rank
 * that entered collective n + 1 while another still read collective n's
 * buffers would show up as a wrong byte. */
static void
rank_mixed(rank_t *r)
{
    uint32_t n = r->run->size;
    size_t cap = 600 * (size_t)n;
    uint8_t *send = malloc(cap), *recv = malloc(cap);
    float *fsend = malloc(100 * sizeof(float) * n), *frecv = malloc(100 * sizeof(float));

    for (uint64_t it = 0; it < 1000; it++) {
        jitter(r->rank, it);
        switch (td_rng_mix64(it) % 4) {
        case 0:
            RCHECK_STATUS(r, td_comm_barrier(r->c), TD_OK);
            break;
        case 1:
            do_allgather(r, it, 1 + it % 500, it % 3 == 0, send, recv);
            break;
        case 2:
            do_reduce_scatter(r, it, 1 + it % 100, it % 3 == 0, fsend, frecv);
            break;
        default:
            do_alltoallv(r, it, 600, send, recv, cap);
            break;
        }
        if (r->fails > 10)
            break;
    }
    free(send);
    free(recv);
    free(fsend);
    free(frecv);
}

/* ---- The cases: failures ------------------------------------------------------------------ */

/* The last rank never comes: the others time out, not before the deadline
 * (none can, counted from when the threads started) and within it and some
 * slack of their call (a rank that the scheduler started late finds the
 * group broken at once); then every call returns the broken status, the late
 * rank's too. */
static void
rank_missing(rank_t *r)
{
    uint32_t last = r->run->size - 1;
    uint64_t t0, t1;

    if (r->rank == last) {
        usleep(800 * 1000);   /* past the deadline and the others' checks */
        RCHECK(r, td_comm_barrier(r->c) != TD_OK);
        return;
    }
    t0 = td_testutil_now_ms();
    r->st = r->rank % 2 ? td_comm_barrier(r->c) : td_comm_allgather(r->c, "x", 1, (char[8]){ 0 });
    t1 = td_testutil_now_ms();
    RCHECK_STATUS(r, r->st, TD_ERR_TIMEOUT);
    RCHECK(r, t1 >= r->run->start_ms + 199);
    RCHECK(r, t1 - t0 < 200 + 2000);
    t0 = td_testutil_now_ms();
    RCHECK_STATUS(r, td_comm_barrier(r->c), TD_ERR_TIMEOUT);
    RCHECK_STATUS(r, td_comm_status(r->c), TD_ERR_TIMEOUT);
    RCHECK(r, td_testutil_now_ms() - t0 < 100);
}

/* The last rank aborts while the others wait in a collective (deadline 60 s):
 * they return TD_ERR_PEER at once (within 2 s of the abort on a loaded
 * machine); rank 1 enters only after the abort and gets it too. */
static void
rank_abort(rank_t *r)
{
    uint32_t last = r->run->size - 1;
    uint64_t t1;
    uint8_t buf[64] = { 0 };
    size_t counts[8] = { 0 }, got[8];

    if (r->rank == last) {
        usleep(150 * 1000);
        atomic_store(&r->run->abort_ms, td_testutil_now_ms());
        td_comm_abort(r->c, TD_ERR_CANCELED);
        atomic_store(&r->run->aborted, 1);
        RCHECK_STATUS(r, td_comm_barrier(r->c), TD_ERR_CANCELED);
        RCHECK_STATUS(r, td_comm_status(r->c), TD_ERR_CANCELED);
        return;
    }
    if (r->rank == 1)
        while (!atomic_load(&r->run->aborted))
            usleep(1000);
    r->st = r->rank % 2 ? td_comm_barrier(r->c)
                        : td_comm_alltoallv(r->c, buf, counts, buf + 32, 32, got);
    t1 = td_testutil_now_ms();
    RCHECK_STATUS(r, r->st, TD_ERR_PEER);
    RCHECK(r, atomic_load(&r->run->abort_ms) != 0);
    RCHECK(r, t1 - atomic_load(&r->run->abort_ms) < 2000);
    RCHECK_STATUS(r, td_comm_allgather(r->c, buf, 1, buf + 8), TD_ERR_PEER);
}

/* Rank 1 (rank 0 alone) has too little room: it gets TD_ERR_TOO_BIG, every
 * other rank TD_ERR_PEER in the same collective; all are broken after. */
static void
rank_too_big(rank_t *r)
{
    uint32_t n = r->run->size, victim = n > 1 ? 1 : 0;
    uint8_t send[8 * 16] = { 0 }, recv[8 * 16];
    size_t counts[8], got[8];
    td_status_t want = r->rank == victim ? TD_ERR_TOO_BIG : TD_ERR_PEER;

    for (uint32_t d = 0; d < n; d++)
        counts[d] = 16;
    RCHECK_STATUS(r, td_comm_alltoallv(r->c, send, counts, recv, sizeof recv, got), TD_OK);
    RCHECK_STATUS(r, td_comm_alltoallv(r->c, send, counts, recv,
                                       r->rank == victim ? 16 * n - 1 : sizeof recv, got),
                  want);
    RCHECK_STATUS(r, td_comm_status(r->c), want);
    RCHECK_STATUS(r, td_comm_barrier(r->c), want);
}

/* An all-gather where the last rank gives another size: every rank gets
 * TD_ERR_MISMATCH (nobody reads past a buffer). */
static void
rank_mismatch(rank_t *r)
{
    uint8_t send[16] = { 0 }, recv[16 * 8];
    size_t bytes = r->rank == r->run->size - 1 ? 16 : 8;

    RCHECK_STATUS(r, td_comm_allgather(r->c, send, bytes, recv), TD_ERR_MISMATCH);
    RCHECK_STATUS(r, td_comm_barrier(r->c), TD_ERR_MISMATCH);
}

/* ---- The table ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    rank_fn fn;
    uint64_t deadline_ms;
    uint32_t min_size;       /* the failure cases need someone to fail */
} cases[] = {
    { "barrier", rank_barrier, 0, 1 },
    { "allgather", rank_allgather, 0, 1 },
    { "reduce_scatter", rank_reduce_scatter, 0, 1 },
    { "alltoallv", rank_alltoallv, 0, 1 },
    { "mixed", rank_mixed, 0, 1 },
    { "missing", rank_missing, 200, 2 },
    { "abort", rank_abort, 60000, 2 },
    { "too_big", rank_too_big, 0, 1 },
    { "mismatch", rank_mismatch, 0, 2 },
};

static void
test_create(void)
{
    td_comm_group_t *g = NULL;
    td_comm_t *c = NULL, *c2 = NULL;
    td_comm_stats_t st;

    CHECK_STATUS(td_comm_group_create(0, NULL, &g), TD_ERR_INVALID);
    CHECK_STATUS(td_comm_group_create(2, NULL, &g), TD_OK);
    CHECK_STATUS(td_comm_cpu_create(g, 2, &c), TD_ERR_INVALID);
    CHECK_STATUS(td_comm_cpu_create(g, 1, &c), TD_OK);
    CHECK_STATUS(td_comm_cpu_create(g, 1, &c2), TD_ERR_STATE);
    CHECK(c2 == NULL);
    CHECK_STR(td_comm_backend(c), "cpu");
    CHECK_EQ_INT(td_comm_rank(c), 1);
    CHECK_EQ_INT(td_comm_size(c), 2);
    CHECK_STATUS(td_comm_status(c), TD_OK);
    td_comm_stats(c, &st);
    CHECK_EQ_INT(st.collectives + st.bytes_sent + st.bytes_recv, 0);
    td_comm_destroy(c);
    td_comm_group_destroy(g);
}

int
main(void)
{
    static const uint32_t sizes[] = { 1, 2, 3, 4, 8 };
    static run_t run;

    test_create();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            uint64_t t0 = td_testutil_now_ms();

            if (sizes[i] < cases[k].min_size)
                continue;
            run_ranks(&run, sizes[i], cases[k].deadline_ms, cases[k].name, cases[k].fn);
            fprintf(stderr, "%s, %u ranks: %llu ms\n", cases[k].name, sizes[i],
                    (unsigned long long)(td_testutil_now_ms() - t0));
        }
    }
    return td_check_exit("test_comm");
}
