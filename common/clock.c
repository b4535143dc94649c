/* common/clock.c — the monotonic clock and the absolute-deadline sleep. */
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
