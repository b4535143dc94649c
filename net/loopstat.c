/* net/loopstat.c — a loop thread's passes timed in thread CPU time
 * (loopstat.h). */
#include "loopstat.h"

#include <time.h>

#include <event2/event.h>

const uint64_t td_loopstat_bounds_us[TD_LOOPSTAT_NBUCKETS] = {
    50, 100, 250, 500, 1000, 2000, 5000, 10000, 25000, 50000, 100000, 1000000,
};

static uint64_t
loopstat_cpu_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void
td_loopstat_observe(td_loopstat_t *st, uint64_t us)
{
    size_t b = 0;

    while (b < TD_LOOPSTAT_NBUCKETS && us > td_loopstat_bounds_us[b])
        b++;
    st->counts[b]++;
    st->n++;
    st->sum_us += us;
    if (us > st->max_us)
        st->max_us = us;
}

int
td_loopstat_dispatch(struct event_base *base, td_loopstat_t *st)
{
    for (;;) {
        uint64_t t0 = loopstat_cpu_us();
        int r = event_base_loop(base, EVLOOP_ONCE);

        td_loopstat_observe(st, loopstat_cpu_us() - t0);
        if (r != 0)
            return r;
        if (event_base_got_exit(base) || event_base_got_break(base))
            return 0;
    }
}
