/* tests/unit/test_jobq_step.c — net/jobq's stepped compute threads (a DEP
 * group's ranks, docs/dep.md "In the daemons") over the CPU communicator: a
 * "pass" here is an all-gather of each rank's pass count, so any rank making
 * one pass more or less than another breaks the group or mismatches.
 * Uneven work (ranks without jobs join with empty passes), a pass job that
 * makes no pass, jobs that are not passes, an idle group that does not spin,
 * ranks leaving at different times, a rank aborting (the others are told,
 * nothing hangs). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "check.h"
#include "clock.h"
#include "comm.h"
#include "jobq.h"

#define NR 3

typedef struct rank_s rank_t;

typedef struct {
    td_comm_group_t *g;
    rank_t *ranks[NR];
    pthread_barrier_t bar;
    int scenario;
} group_t;

struct rank_s {
    group_t *grp;
    uint32_t id;
    td_comm_t *comm;
    td_jobq_t *q;
    struct event_base *base;
    _Atomic uint64_t passes;
    atomic_int mismatch;       /* a pass saw another rank at another count */
    atomic_int broken;         /* the queue said the group broke */
    td_status_t broken_st;
    int posted, done;
    int skip_pass;             /* the next pass job makes no pass */
    uint64_t t_done_ns;
};

/* One pass: every rank gives its count of passes; they must agree. */
static td_status_t
pass(rank_t *r)
{
    uint64_t mine = atomic_load(&r->passes), all[NR];
    td_status_t st = td_comm_allgather(r->comm, &mine, sizeof(mine), all);

    atomic_fetch_add(&r->passes, 1);
    if (st != TD_OK)
        return st;
    for (int i = 0; i < NR; i++)
        if (all[i] != mine)
            atomic_store(&r->mismatch, 1);
    return TD_OK;
}

static td_status_t
agree(void *arg, int work, int leaving, td_jobq_agreed_t *out)
{
    rank_t *r = arg;
    uint32_t mine = (work ? 1u : 0u) | (leaving ? 2u : 0u), w[NR];
    td_status_t st = td_comm_allgather(r->comm, &mine, sizeof(mine), w);

    if (st != TD_OK)
        return st;
    *out = (td_jobq_agreed_t){ .ranks = NR };
    for (int i = 0; i < NR; i++) {
        out->work += w[i] & 1u;
        out->leaving += (w[i] >> 1) & 1u;
    }
    return TD_OK;
}

static void
pass_empty(void *arg)
{
    (void)pass(arg);
}

static uint64_t
passes(void *arg)
{
    return atomic_load(&((rank_t *)arg)->passes);
}

static void
broken(void *arg, td_status_t st)
{
    rank_t *r = arg;
    r->broken_st = st;
    atomic_store(&r->broken, 1);
}

static void
job_pass(void *arg)
{
    rank_t *r = arg;
    if (r->skip_pass) {   /* failed before its pass */
        r->skip_pass = 0;
        return;
    }
    (void)pass(r);
}

static void
job_plain(void *arg)
{
    (void)arg;
}

static void
job_done(void *arg)
{
    rank_t *r = arg;
    if (++r->done == r->posted) {
        r->t_done_ns = td_clock_ns();
        event_base_loopbreak(r->base);
    }
}

static void
run_loop(rank_t *r)
{
    struct timeval tv = { 10, 0 };   /* a hang fails the test, it does not block it */
    if (r->done < r->posted)
        event_base_loopexit(r->base, &tv);
    if (r->done < r->posted)
        event_base_dispatch(r->base);
}

static void *
rank_main(void *arg)
{
    rank_t *r = arg;
    group_t *g = r->grp;
    td_jobq_step_t step = { agree, pass_empty, passes, broken, r, 5 };
    uint64_t steps, empty;

    r->base = event_base_new();
    CHECK_STATUS(td_comm_cpu_create(g->g, r->id, &r->comm), TD_OK);
    CHECK_STATUS(td_jobq_create_stepped(r->base, "step", NULL, NULL, &step, &r->q), TD_OK);
    switch (g->scenario) {
    case 0: {
        /* uneven work: rank 0 five passes, rank 1 two (one of them makes
         * none) and two plain jobs, rank 2 nothing; then an idle spell */
        int n = r->id == 0 ? 5 : r->id == 1 ? 2 : 0;
        if (r->id == 1)
            r->skip_pass = 1;
        for (int i = 0; i < n; i++, r->posted++)
            CHECK_STATUS(td_jobq_post_pass(r->q, job_pass, job_done, r), TD_OK);
        if (r->id == 1)
            for (int i = 0; i < 2; i++, r->posted++)
                CHECK_STATUS(td_jobq_post(r->q, job_plain, job_done, r), TD_OK);
        run_loop(r);
        CHECK_EQ_INT(r->done, r->posted);
        pthread_barrier_wait(&g->bar);
        td_jobq_step_counts(r->q, &steps, &empty);
        uint64_t s0 = steps;
        usleep(200 * 1000);   /* idle: one agreement per idle_ms (5 ms), not a spin */
        td_jobq_step_counts(r->q, &steps, &empty);
        CHECK(steps - s0 <= 200 / 5 + 5);
        CHECK(steps - s0 >= 5);
        pthread_barrier_wait(&g->bar);
        /* rank 0 leaves first; rank 1 still gets its passes (rank 0 joins) */
        if (r->id == 0) {
            td_jobq_destroy(r->q);
            r->q = NULL;
        } else {
            usleep(50 * 1000);
            if (r->id == 1) {
                r->posted = r->done = 0;
                for (int i = 0; i < 3; i++, r->posted++)
                    CHECK_STATUS(td_jobq_post_pass(r->q, job_pass, job_done, r), TD_OK);
                run_loop(r);
                CHECK_EQ_INT(r->done, 3);
            }
        }
        break;
    }
    case 1: {
        /* rank 2 aborts: the others' queues say the group broke; their
         * later pass jobs still run (their passes fail at once) */
        pthread_barrier_wait(&g->bar);
        if (r->id == 2) {
            usleep(30 * 1000);
            td_comm_abort(r->comm, TD_ERR_CANCELED);
        } else {
            uint64_t t0 = td_clock_ns();
            while (!atomic_load(&r->broken) && td_clock_ns() - t0 < 5000000000ull)
                usleep(1000);
            CHECK(atomic_load(&r->broken));
            CHECK_STATUS(r->broken_st, TD_ERR_PEER);
            for (int i = 0; i < 2; i++, r->posted++)
                CHECK_STATUS(td_jobq_post_pass(r->q, job_pass, job_done, r), TD_OK);
            run_loop(r);
            CHECK_EQ_INT(r->done, 2);
            CHECK(td_clock_ns() - t0 < 5000000000ull);
        }
        pthread_barrier_wait(&g->bar);
        break;
    }
    }
    if (r->q != NULL)
        td_jobq_destroy(r->q);   /* leaves with the others (or broken: at once) */
    CHECK(!atomic_load(&r->mismatch));
    td_comm_destroy(r->comm);
    event_base_free(r->base);
    return NULL;
}

static void
run_group(int scenario)
{
    group_t g = { .scenario = scenario };
    rank_t r[NR];
    pthread_t th[NR];
    td_comm_opts_t co = { .deadline_ms = 5000, .name = "test group" };
    uint64_t t0 = td_clock_ns();

    CHECK_STATUS(td_comm_group_create(NR, &co, &g.g), TD_OK);
    pthread_barrier_init(&g.bar, NULL, NR);
    for (uint32_t i = 0; i < NR; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        r[i].grp = &g;
        r[i].id = i;
        g.ranks[i] = &r[i];
        pthread_create(&th[i], NULL, rank_main, &r[i]);
    }
    for (int i = 0; i < NR; i++)
        pthread_join(th[i], NULL);
    if (scenario == 0) {
        /* every rank made the same passes: 5 steps of rank 0's, 2 of rank 1's
         * (one filled in by the queue) at most side by side, 3 more of rank 1's */
        for (int i = 0; i < NR; i++)
            CHECK_EQ_INT(atomic_load(&r[i].passes), atomic_load(&r[0].passes));
        CHECK(atomic_load(&r[0].passes) >= 5 + 3);
        CHECK(atomic_load(&r[0].passes) <= 5 + 2 + 3);
    }
    CHECK(td_clock_ns() - t0 < 8000000000ull);   /* nobody waited for a deadline */
    pthread_barrier_destroy(&g.bar);
    td_comm_group_destroy(g.g);
}

int
main(void)
{
    run_group(0);
    run_group(1);
    return td_check_exit("test_jobq_step");
}
