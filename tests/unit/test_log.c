/* tests/unit/test_log.c — the log's rate limits: the first line of a burst
 * passes, then one per interval, and the next line written counts the ones
 * held back; lines below the level are not counted; threads share a limit. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "log.h"

#define MS 1000000ull

/* A limit of 100 ms fed at the given times (ms): whether each passes and,
 * when it does, how many it reports held back. */
static void
test_limit_table(void)
{
    static const struct {
        uint64_t at_ms;
        bool pass;
        uint64_t suppressed;
    } steps[] = {
        { 1000, true, 0 },    /* the first line of a burst */
        { 1000, false, 0 },
        { 1050, false, 0 },
        { 1099, false, 0 },
        { 1100, true, 3 },    /* the interval is over: it says 3 were held back */
        { 1150, false, 0 },
        { 1500, true, 1 },
        { 9000, true, 0 },    /* a quiet while: nothing held back */
        { 9000, false, 0 },
        { 9000, false, 0 },
        { 9100, true, 2 },
    };
    td_log_limit_t l = {0};

    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        uint64_t n = 12345;
        bool pass = td_log_limit_pass_at(&l, 100, steps[i].at_ms * MS, &n);
        if (pass != steps[i].pass)
            fprintf(stderr, "step %zu at %llu ms\n", i, (unsigned long long)steps[i].at_ms);
        CHECK(pass == steps[i].pass);
        if (pass)
            CHECK_EQ_INT(n, steps[i].suppressed);
        else
            CHECK_EQ_INT(n, 12345);   /* left alone */
    }
}

/* A burst of 3 at one line per 100 ms: three at once, then the steady
 * rate; a quiet while refills it. */
static void
test_burst_table(void)
{
    static const struct {
        uint64_t at_ms;
        bool pass;
    } steps[] = {
        { 1000, true }, { 1000, true }, { 1000, true },   /* the burst */
        { 1000, false }, { 1050, false },
        { 1100, true },    /* the fourth is due at 1100 + 200 (steady) - 200 (slack) */
        { 1101, false }, { 1200, true }, { 1250, false }, { 1300, true },
        { 5000, true }, { 5000, true }, { 5000, true }, { 5000, false },
    };
    td_log_limit_t l = {0};

    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        uint64_t n;
        bool pass = td_log_limit_pass_burst_at(&l, 100, 3, steps[i].at_ms * MS, &n);
        if (pass != steps[i].pass)
            fprintf(stderr, "burst step %zu at %llu ms\n", i,
                    (unsigned long long)steps[i].at_ms);
        CHECK(pass == steps[i].pass);
    }
}

static char captured[8][256];
static int ncaptured;

static void
sink(td_log_level_t level, const char *line, void *arg)
{
    (void)level;
    (void)arg;
    if (ncaptured < 8)
        snprintf(captured[ncaptured], sizeof captured[0], "%s", line);
    ncaptured++;
}

/* td_log_every: one limit per call site; the suffix names the count. */
static void
test_every_macro(void)
{
    td_log_limit_t shared = {0};

    td_log_set_level(TD_LOG_INFO);
    td_log_set_sink(sink, NULL);
    for (int i = 0; i < 5; i++)
        td_log_every(TD_LOG_WARN, 3600 * 1000, "peer %d: bad frame", i);
    for (int i = 0; i < 5; i++)   /* another call site: its own limit */
        td_log_every(TD_LOG_WARN, 3600 * 1000, "listener: refused %d", i);
    /* debug lines under an info threshold: not written, not counted */
    for (int i = 0; i < 5; i++)
        td_log_limited(&shared, TD_LOG_DEBUG, 0, "debug %d", i);
    CHECK_EQ_INT(atomic_load(&shared.suppressed), 0);
    CHECK_EQ_INT(atomic_load(&shared.next_ns), 0);
    /* an interval of 0 writes every line */
    for (int i = 0; i < 2; i++)
        td_log_limited(&shared, TD_LOG_INFO, 0, "info %d", i);
    td_log_set_sink(NULL, NULL);

    CHECK_EQ_INT(ncaptured, 4);
    CHECK_STR(captured[0], "peer 0: bad frame");
    CHECK_STR(captured[1], "listener: refused 0");
    CHECK_STR(captured[2], "info 0");
    CHECK_STR(captured[3], "info 1");

    /* the count of held-back lines rides on the next line written */
    td_log_limit_t l = {0};
    uint64_t n;
    CHECK(td_log_limit_pass_at(&l, 10, 5 * MS, &n));
    for (int i = 0; i < 41; i++)
        CHECK(!td_log_limit_pass_at(&l, 10, 6 * MS, &n));
    CHECK(td_log_limit_pass_at(&l, 10, 20 * MS, &n));
    ncaptured = 0;
    td_log_set_sink(sink, NULL);
    td_log_write_limited(TD_LOG_WARN, n, "http :%d: accept failed", 8000);
    td_log_write_limited(TD_LOG_WARN, 0, "no count");
    td_log_set_sink(NULL, NULL);
    CHECK_STR(captured[0], "http :8000: accept failed (41 more suppressed)");
    CHECK_STR(captured[1], "no count");
}

/* Threads hammering one limit with a long interval: exactly one line passes
 * and every other call is counted. */
#define NTHREADS 4
#define NCALLS 20000

static td_log_limit_t hammered;
static _Atomic int passed;

static void *
hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < NCALLS; i++) {
        uint64_t n;
        if (td_log_limit_pass_at(&hammered, 3600 * 1000, 1000 * MS, &n))
            atomic_fetch_add(&passed, 1);
    }
    return NULL;
}

static void
test_threads(void)
{
    pthread_t th[NTHREADS];

    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, hammer, NULL) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(atomic_load(&passed), 1);
    CHECK_EQ_INT(atomic_load(&hammered.suppressed), NTHREADS * NCALLS - 1);
}

int
main(void)
{
    test_limit_table();
    test_burst_table();
    test_every_macro();
    test_threads();
    return td_check_exit("test_log");
}
