/* base/progress.h — how far a long start-up step has come (loading a
 * checkpoint of hundreds of GB): one line when it begins, one every few
 * seconds while it runs, one when it ends, each logged at info and handed to
 * the handler the program set (a daemon passes it to systemd as STATUS=,
 * tools/generate prints it). The handler and the interval are process-wide,
 * like the log's level: set them before the step, on the thread that runs
 * it; a td_progress_t is used by one thread. */
#ifndef TD_PROGRESS_H
#define TD_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

#define TD_PROGRESS_EVERY_MS 5000   /* default interval; $TD_PROGRESS_MS overrides */

typedef enum {
    TD_PROGRESS_BEGIN,   /* "model /m: loading: 0 of 1532 tensors, 0 B of 160.2 GiB (0%)" */
    TD_PROGRESS_STEP,    /* "... 120 of 1532 tensors, 12.3 GiB of 160.2 GiB (7%), 35 s" */
    TD_PROGRESS_END,     /* "model /m: loaded 1532 tensors, 160.2 GiB in 412.3 s" (or failed) */
} td_progress_phase_t;

/* line: what is done of what, one line, valid during the call. */
typedef void (*td_progress_fn)(td_progress_phase_t phase, const char *line, void *arg);

/* NULL: lines are only logged. */
void td_progress_set_handler(td_progress_fn fn, void *arg);
/* Milliseconds between STEP lines (0: every step); before the first call
 * $TD_PROGRESS_MS if set, else TD_PROGRESS_EVERY_MS. */
void td_progress_set_interval_ms(uint64_t ms);

/* One step's progress: `what` ("model /m"), the items it counts
 * ("tensors"), their number and bytes. Filled by td_progress_begin. */
typedef struct {
    char what[256];
    const char *unit;
    uint64_t items, bytes;          /* totals */
    uint64_t items_done, bytes_done;
    uint64_t t0_ns, next_ns;
    bool stepped;                   /* a STEP line was reported */
} td_progress_t;

void td_progress_begin(td_progress_t *p, const char *what, const char *unit, uint64_t items,
                       uint64_t bytes);
/* So much is done; a STEP line when the interval has passed since the last
 * line. */
void td_progress_step(td_progress_t *p, uint64_t items_done, uint64_t bytes_done);
/* st != TD_OK: "model /m: loading failed after 120 of 1532 tensors (...)". */
void td_progress_end(td_progress_t *p, td_status_t st);

#endif
