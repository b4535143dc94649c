/* kvcache/kvlock.c — the tier's mutexes, with the lock order of
 * kvtier_int.h checked on every lock, trylock, unlock and wait where NDEBUG
 * is not defined (debug and sanitizer builds): each thread keeps the levels
 * it holds, and taking a lock while one of its level or above is held aborts
 * with both named. Release builds only lock. */
#include "kvtier_int.h"

#include <stdio.h>
#include <stdlib.h>

#include "clock.h"

#ifndef NDEBUG
static _Thread_local unsigned kvlock_held;   /* bit L: a lock of level L is held */

static void
kvlock_fail(const kvlock_t *l, const char *what)
{
    fprintf(stderr, "kvtier: lock order: %s %s (level %u) with levels 0x%x held\n", what,
            l->name, l->level, kvlock_held);
    abort();
}

static void
kvlock_taking(const kvlock_t *l)
{
    if ((kvlock_held >> l->level) != 0)
        kvlock_fail(l, "taking");
}

static void
kvlock_holds(const kvlock_t *l)
{
    if ((kvlock_held & (1u << l->level)) == 0)
        kvlock_fail(l, "not holding");
}

static void kvlock_took(const kvlock_t *l) { kvlock_held |= 1u << l->level; }
static void kvlock_gave(const kvlock_t *l) { kvlock_held &= ~(1u << l->level); }
#else
static void kvlock_taking(const kvlock_t *l) { (void)l; }
static void kvlock_holds(const kvlock_t *l) { (void)l; }
static void kvlock_took(const kvlock_t *l) { (void)l; }
static void kvlock_gave(const kvlock_t *l) { (void)l; }
#endif

void
kvlock_init(kvlock_t *l, unsigned level, const char *name)
{
    pthread_mutex_init(&l->m, NULL);
    l->level = level;
    l->name = name;
}

void
kvlock_destroy(kvlock_t *l)
{
    pthread_mutex_destroy(&l->m);
}

void
kvlock_lock(kvlock_t *l)
{
    kvlock_taking(l);
    pthread_mutex_lock(&l->m);
    kvlock_took(l);
}

bool
kvlock_trylock(kvlock_t *l)
{
    kvlock_taking(l);
    if (pthread_mutex_trylock(&l->m) != 0)
        return false;
    kvlock_took(l);
    return true;
}

void
kvlock_unlock(kvlock_t *l)
{
    kvlock_holds(l);
    kvlock_gave(l);
    pthread_mutex_unlock(&l->m);
}

void
kvlock_wait(pthread_cond_t *cv, kvlock_t *l)
{
    kvlock_holds(l);
    pthread_cond_wait(cv, &l->m);
}

void
kvlock_wait_ns(pthread_cond_t *cv, kvlock_t *l, uint64_t ns)
{
    kvlock_holds(l);
    td_clock_cond_wait(cv, &l->m, ns);
}
