/* common/clock.h — the monotonic clock every timer, deadline and benchmark
 * reads, and an absolute-deadline sleep (oversleep does not add up). */
#ifndef TD_CLOCK_H
#define TD_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t td_clock_ns(void);

/* CLOCK_MONOTONIC in seconds. */
double td_clock_s(void);

/* Sleep until *deadline_ns (CLOCK_MONOTONIC, absolute) after adding us to it;
 * us <= 0 returns at once. */
void td_clock_wait(uint64_t *deadline_ns, double us);

#endif
