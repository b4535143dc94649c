/* base/clock.c — the monotonic clock and the absolute-deadline sleep. */
#include "clock.h"

#include <errno.h>
#include <time.h>

uint64_t
td_clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double
td_clock_s(void)
{
    return (double)td_clock_ns() / 1e9;
}

void
td_clock_wait(uint64_t *deadline_ns, double us)
{
    struct timespec ts;

    if (us <= 0)
        return;
    *deadline_ns += (uint64_t)(us * 1000.0 + 0.5);
    ts.tv_sec = (time_t)(*deadline_ns / 1000000000ull);
    ts.tv_nsec = (long)(*deadline_ns % 1000000000ull);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

void
td_clock_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

void
td_clock_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ns)
{
    uint64_t at = td_clock_ns() + ns;
    struct timespec ts = { (time_t)(at / 1000000000ull), (long)(at % 1000000000ull) };

    pthread_cond_timedwait(cv, mu, &ts);
}
