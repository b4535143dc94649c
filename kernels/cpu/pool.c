/* kernels/cpu/pool.c — the worker threads of the cpu compute ops: one
 * parallel loop at a time, its tasks handed out in any order; a task writes
 * only its own outputs, so no result depends on the thread count or on
 * which thread ran a task. */
#include "cpu_ops.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"

#define POOL_MAX 256
/* How long an idle worker spins before it sleeps (a decode step issues a
 * few hundred short loops back to back; a sleeping worker takes tens of
 * microseconds to wake). */
#define POOL_SPIN_NS 200000u

static struct {
    pthread_mutex_t run;          /* held by the caller of the running loop */
    pthread_mutex_t sleep;        /* with wake: idle workers */
    pthread_cond_t wake;
    pthread_once_t once;
    _Atomic unsigned threads;     /* configured, caller included; 0: not decided */
    unsigned started;             /* workers running (under run) */
    _Atomic unsigned long gen;    /* bumped for each loop */
    /* the running loop (written under run before gen is bumped) */
    td_kernels_task_fn fn;
    void *arg;
    size_t n;
    unsigned active;              /* workers taking part (ids below it) */
    _Atomic size_t next;          /* next task */
    _Atomic unsigned busy;        /* started workers yet to answer the loop */
} pool = {
    .run = PTHREAD_MUTEX_INITIALIZER,
    .sleep = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .once = PTHREAD_ONCE_INIT,
};

static unsigned long pool_gen0[POOL_MAX];   /* gen when worker i was started */
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;
static _Thread_local int pool_inside;   /* a worker, or a caller running a loop */

static inline void
pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void
pool_work(void)
{
    size_t i;
    while ((i = atomic_fetch_add_explicit(&pool.next, 1, memory_order_relaxed)) < pool.n)
        pool.fn(pool.arg, i);
}

static void *
pool_worker(void *p)
{
    unsigned id = (unsigned)(uintptr_t)p;
    unsigned long seen = pool_gen0[id];   /* the loops before it was started */

    pool_inside = 1;
    for (;;) {
        uint64_t t0 = td_clock_ns();
        for (unsigned spin = 0; atomic_load_explicit(&pool.gen, memory_order_acquire) == seen;
             spin++) {
            pool_pause();
            if ((spin & 63) == 63 && td_clock_ns() - t0 > POOL_SPIN_NS) {
                pthread_mutex_lock(&pool.sleep);
                while (atomic_load_explicit(&pool.gen, memory_order_acquire) == seen)
                    pthread_cond_wait(&pool.wake, &pool.sleep);
                pthread_mutex_unlock(&pool.sleep);
                break;
            }
        }
        seen = atomic_load_explicit(&pool.gen, memory_order_acquire);
        if (id < pool.active)
            pool_work();
        /* every started worker answers every loop, so none can lag behind */
        atomic_fetch_sub_explicit(&pool.busy, 1, memory_order_release);
    }
    return NULL;
}

static void
pool_default(void)
{
    unsigned n = 0;
    const char *e = getenv("TD_CPU_THREADS");
    if (e != NULL && *e != '\0') {
        char *end;
        unsigned long v = strtoul(e, &end, 10);
        if (*end == '\0' && v >= 1 && v <= POOL_MAX)
            n = (unsigned)v;
    }
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c < 1 ? 1 : c > POOL_MAX ? POOL_MAX : (unsigned)c;
    }
    unsigned zero = 0;
    atomic_compare_exchange_strong(&pool.threads, &zero, n);
}

td_status_t
td_kernels_cpu_set_threads(unsigned n)
{
    if (n < 1 || n > POOL_MAX)
        return td_kernels_fail(TD_ERR_RANGE, "threads: %u outside 1 .. %d", n, POOL_MAX);
    atomic_store(&pool.threads, n);
    return TD_OK;
}

unsigned
td_kernels_cpu_threads(void)
{
    pthread_once(&pool.once, pool_default);
    return atomic_load(&pool.threads);
}

/* A forked child has none of the workers (and maybe a locked mutex of a
 * loop running at the fork): it starts afresh. */
static void
pool_forked(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cfresh = PTHREAD_COND_INITIALIZER;

    pool.run = fresh;
    pool.sleep = fresh;
    pool.wake = cfresh;
    pool.started = 0;
    pool_inside = 0;
}

static void
pool_fork_init(void)
{
    pthread_atfork(NULL, NULL, pool_forked);
}

void
td_kernels_cpu_parallel(size_t n, td_kernels_task_fn fn, void *arg)
{
    unsigned want = td_kernels_cpu_threads();

    if (n <= 1 || want <= 1 || pool_inside || pthread_mutex_trylock(&pool.run) != 0) {
        for (size_t i = 0; i < n; i++)   /* one task at a time, in this thread */
            fn(arg, i);
        return;
    }
    pthread_once(&pool_fork_once, pool_fork_init);
    while (pool.started + 1 < want) {
        pthread_t t;
        pthread_attr_t at;
        int ok = pthread_attr_init(&at) == 0;
        if (ok) {
            pool_gen0[pool.started] = atomic_load(&pool.gen);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            ok = pthread_create(&t, &at, pool_worker, (void *)(uintptr_t)pool.started) == 0;
            pthread_attr_destroy(&at);
        }
        if (!ok)
            break;   /* fewer threads: the results are the same */
        pool.started++;
    }
    unsigned active = want - 1 < pool.started ? want - 1 : pool.started;
    if ((size_t)active > n - 1)
        active = (unsigned)(n - 1);
    pool.fn = fn;
    pool.arg = arg;
    pool.n = n;
    pool.active = active;
    atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.busy, pool.started, memory_order_relaxed);
    pthread_mutex_lock(&pool.sleep);
    atomic_fetch_add_explicit(&pool.gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.sleep);
    pool_inside = 1;
    pool_work();
    pool_inside = 0;
    while (atomic_load_explicit(&pool.busy, memory_order_acquire) != 0)
        pool_pause();
    pthread_mutex_unlock(&pool.run);
}
