/* base/clock.h — the monotonic clock every timer, deadline and benchmark
 * reads, an absolute-deadline sleep (oversleep does not add up), and timed
 * waits on condition variables on that clock. */
#ifndef TD_CLOCK_H
#define TD_CLOCK_H

#include <pthread.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t td_clock_ns(void);

/* CLOCK_MONOTONIC in seconds. */
double td_clock_s(void);

/* Sleep until *deadline_ns (CLOCK_MONOTONIC, absolute) after adding us to it;
 * us <= 0 returns at once. */
void td_clock_wait(uint64_t *deadline_ns, double us);

/* pthread_cond_init on CLOCK_MONOTONIC: the clock td_clock_cond_wait reads. */
void td_clock_cond_init(pthread_cond_t *cv);

/* Waits on cv (made by td_clock_cond_init; mu held) until signalled or ns
 * have passed. */
void td_clock_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ns);

#endif
