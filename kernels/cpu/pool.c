/* kernels/cpu/pool.c — the worker threads of the cpu compute ops: pools of
 * threads, each running one parallel loop at a time with its tasks handed
 * out in any order; a thread's loops run on the pool it is bound to (each
 * rank its own), else on the process's default pool. A task writes only its
 * own outputs, so no result depends on the thread count, the pool or which
 * thread ran a task. */
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

typedef struct {
    td_kernels_cpu_pool_t *pool;
    unsigned id;
    unsigned long gen0;           /* gen when it was started */
    pthread_t tid;
} pool_worker_t;

struct td_kernels_cpu_pool {
    pthread_mutex_t run;          /* held by the caller of the running loop */
    pthread_mutex_t sleep;        /* with wake: idle workers */
    pthread_cond_t wake;
    _Atomic unsigned threads;     /* caller included; default pool: 0 until decided */
    unsigned started;             /* workers running (under run) */
    _Atomic unsigned long gen;    /* bumped for each loop, and to stop */
    _Atomic int quit;             /* destroy: workers return */
    int joinable;                 /* a created pool: destroy joins its workers */
    /* the running loop (written under run before gen is bumped) */
    td_kernels_task_fn fn;
    void *arg;
    size_t n;
    unsigned active;              /* workers taking part (ids below it) */
    _Atomic size_t next;          /* next task */
    _Atomic unsigned busy;        /* started workers yet to answer the loop */
    td_kernels_cpu_pool_t *link;  /* every pool of the process (for fork) */
    pool_worker_t workers[POOL_MAX];
};

static td_kernels_cpu_pool_t pool_default_pool = {
    .run = PTHREAD_MUTEX_INITIALIZER,
    .sleep = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
};
static pthread_once_t pool_default_once = PTHREAD_ONCE_INIT;

/* Every pool, for a forked child to reset (the default one included). */
static pthread_mutex_t pool_list_lock = PTHREAD_MUTEX_INITIALIZER;
static td_kernels_cpu_pool_t *pool_list = &pool_default_pool;
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;

static _Thread_local int pool_inside;   /* a worker, or a caller running a loop */
static _Thread_local td_kernels_cpu_pool_t *pool_bound;   /* NULL: the default pool */

static inline void
pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- Workers --------------------------------------------------------------------- */

static void
pool_work(td_kernels_cpu_pool_t *p)
{
    size_t i;
    while ((i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->n)
        p->fn(p->arg, i);
}

static void *
pool_worker(void *arg)
{
    pool_worker_t *w = arg;
    td_kernels_cpu_pool_t *p = w->pool;
    unsigned long seen = w->gen0;   /* the loops before it was started */

    pool_inside = 1;
    pool_bound = p == &pool_default_pool ? NULL : p;   /* its tasks' ops see its size */
    for (;;) {
        uint64_t t0 = td_clock_ns();
        for (unsigned spin = 0; atomic_load_explicit(&p->gen, memory_order_acquire) == seen;
             spin++) {
            pool_pause();
            if ((spin & 63) == 63 && td_clock_ns() - t0 > POOL_SPIN_NS) {
                pthread_mutex_lock(&p->sleep);
                while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen)
                    pthread_cond_wait(&p->wake, &p->sleep);
                pthread_mutex_unlock(&p->sleep);
                break;
            }
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load_explicit(&p->quit, memory_order_acquire))
            return NULL;
        if (w->id < p->active)
            pool_work(p);
        /* every started worker answers every loop, so none can lag behind */
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
    return NULL;
}

/* Start workers up to threads - 1 (under p->run). Fewer if the system
 * refuses: the results are the same. */
static void
pool_start(td_kernels_cpu_pool_t *p, unsigned want)
{
    while (p->started + 1 < want) {
        pool_worker_t *w = &p->workers[p->started];
        pthread_attr_t at;
        int ok = pthread_attr_init(&at) == 0;

        if (ok) {
            w->pool = p;
            w->id = p->started;
            w->gen0 = atomic_load(&p->gen);
            if (!p->joinable)
                pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            ok = pthread_create(&w->tid, &at, pool_worker, w) == 0;
            pthread_attr_destroy(&at);
        }
        if (!ok)
            break;
        p->started++;
    }
}

/* ---- Fork ----------------------------------------------------------------------- */

/* A forked child has none of the workers (and maybe a locked mutex of a
 * loop running at the fork): every pool starts afresh. */
static void
pool_forked(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cfresh = PTHREAD_COND_INITIALIZER;

    pool_list_lock = fresh;
    for (td_kernels_cpu_pool_t *p = pool_list; p != NULL; p = p->link) {
        p->run = fresh;
        p->sleep = fresh;
        p->wake = cfresh;
        p->started = 0;
    }
    pool_inside = 0;
}

static void
pool_fork_init(void)
{
    pthread_atfork(NULL, NULL, pool_forked);
}

/* ---- Pools ------------------------------------------------------------------------ */

static void
pool_default_decide(void)
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
    atomic_compare_exchange_strong(&pool_default_pool.threads, &zero, n);
}

static td_kernels_cpu_pool_t *
pool_current(void)
{
    if (pool_bound != NULL)
        return pool_bound;
    pthread_once(&pool_default_once, pool_default_decide);
    return &pool_default_pool;
}

td_status_t
td_kernels_cpu_set_threads(unsigned n)
{
    if (n < 1 || n > POOL_MAX)
        return td_kernels_fail(TD_ERR_RANGE, "threads: %u outside 1 .. %d", n, POOL_MAX);
    pthread_once(&pool_default_once, pool_default_decide);
    atomic_store(&pool_default_pool.threads, n);
    return TD_OK;
}

unsigned
td_kernels_cpu_threads(void)
{
    return atomic_load(&pool_current()->threads);
}

td_status_t
td_kernels_cpu_pool_create(unsigned nthreads, td_kernels_cpu_pool_t **out)
{
    td_kernels_cpu_pool_t *p;

    if (nthreads < 1 || nthreads > POOL_MAX)
        return td_kernels_fail(TD_ERR_RANGE, "pool: %u threads outside 1 .. %d", nthreads,
                               POOL_MAX);
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return td_kernels_fail(TD_ERR_NOMEM, "pool of %u threads: out of memory", nthreads);
    if (pthread_mutex_init(&p->run, NULL) != 0 || pthread_mutex_init(&p->sleep, NULL) != 0 ||
        pthread_cond_init(&p->wake, NULL) != 0) {
        free(p);
        return td_kernels_fail(TD_ERR_NOMEM, "pool of %u threads: no mutex", nthreads);
    }
    atomic_store(&p->threads, nthreads);
    p->joinable = 1;
    pthread_once(&pool_fork_once, pool_fork_init);
    pthread_mutex_lock(&pool_list_lock);
    p->link = pool_list;
    pool_list = p;
    pthread_mutex_unlock(&pool_list_lock);
    *out = p;
    return TD_OK;
}

void
td_kernels_cpu_pool_destroy(td_kernels_cpu_pool_t *p)
{
    if (p == NULL || p == &pool_default_pool)
        return;
    pthread_mutex_lock(&pool_list_lock);
    for (td_kernels_cpu_pool_t **q = &pool_list; *q != NULL; q = &(*q)->link)
        if (*q == p) {
            *q = p->link;
            break;
        }
    pthread_mutex_unlock(&pool_list_lock);
    pthread_mutex_lock(&p->run);   /* no loop is running on it */
    atomic_store_explicit(&p->quit, 1, memory_order_release);
    pthread_mutex_lock(&p->sleep);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->sleep);
    for (unsigned i = 0; i < p->started; i++)
        pthread_join(p->workers[i].tid, NULL);
    pthread_mutex_unlock(&p->run);
    pthread_mutex_destroy(&p->run);
    pthread_mutex_destroy(&p->sleep);
    pthread_cond_destroy(&p->wake);
    if (pool_bound == p)
        pool_bound = NULL;
    free(p);
}

td_kernels_cpu_pool_t *
td_kernels_cpu_pool_bind(td_kernels_cpu_pool_t *p)
{
    td_kernels_cpu_pool_t *was = pool_bound;

    pool_bound = p == &pool_default_pool ? NULL : p;
    return was;
}

unsigned
td_kernels_cpu_pool_threads(const td_kernels_cpu_pool_t *p)
{
    return atomic_load(&p->threads);
}

/* ---- Loops ------------------------------------------------------------------------ */

void
td_kernels_cpu_parallel(size_t n, td_kernels_task_fn fn, void *arg)
{
    td_kernels_cpu_pool_t *p = pool_current();
    unsigned want = atomic_load(&p->threads);

    if (n <= 1 || want <= 1 || pool_inside || pthread_mutex_trylock(&p->run) != 0) {
        for (size_t i = 0; i < n; i++)   /* one task at a time, in this thread */
            fn(arg, i);
        return;
    }
    pthread_once(&pool_fork_once, pool_fork_init);
    pool_start(p, want);
    unsigned active = want - 1 < p->started ? want - 1 : p->started;
    if ((size_t)active > n - 1)
        active = (unsigned)(n - 1);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->active = active;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->started, memory_order_relaxed);
    pthread_mutex_lock(&p->sleep);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->sleep);
    pool_inside = 1;
    pool_work(p);
    pool_inside = 0;
    while (atomic_load_explicit(&p->busy, memory_order_acquire) != 0)
        pool_pause();
    pthread_mutex_unlock(&p->run);
}
