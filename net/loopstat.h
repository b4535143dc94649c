/* net/loopstat.h — how long a loop thread's callbacks run: a histogram of
 * the thread CPU time each pass of the event loop took (the callbacks of
 * the events that became ready together), kept by the loop that runs them
 * (td_loopstat_dispatch in place of event_base_dispatch). A loop thread must
 * never compute (style rule 16); this is how that is checked from outside:
 * routerd's /metrics shows its own loop's and every rank's (Load). */
#ifndef TD_LOOPSTAT_H
#define TD_LOOPSTAT_H

#include <stddef.h>
#include <stdint.h>

struct event_base;

#define TD_LOOPSTAT_NBUCKETS 12

/* Upper bounds of the buckets, in microseconds (the last bucket, +Inf,
 * follows them). */
extern const uint64_t td_loopstat_bounds_us[TD_LOOPSTAT_NBUCKETS];

/* Written by its loop thread only; another thread reads a copy it made
 * (td_loopstat_copy) or accepts torn reads of single counters. */
typedef struct {
    uint64_t counts[TD_LOOPSTAT_NBUCKETS + 1];   /* passes per bucket, last: +Inf */
    uint64_t n;
    uint64_t sum_us;
    uint64_t max_us;                              /* the longest pass */
} td_loopstat_t;

/* One pass that took us microseconds. */
void td_loopstat_observe(td_loopstat_t *st, uint64_t us);

/* event_base_dispatch, each pass observed in st: the thread CPU time from
 * the moment the pass's events are ready (the wait for them costs none)
 * until their callbacks have run. Returns as event_base_dispatch does. */
int td_loopstat_dispatch(struct event_base *base, td_loopstat_t *st);

#endif
