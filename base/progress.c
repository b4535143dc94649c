/* base/progress.c — start-up progress lines (progress.h): logged at info,
 * handed to the program's handler, STEP lines at most once per interval. */
#include "progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"

static td_progress_fn progress_fn;
static void *progress_arg;
static uint64_t progress_every_ms;
static bool progress_every_set;

void
td_progress_set_handler(td_progress_fn fn, void *arg)
{
    progress_fn = fn;
    progress_arg = arg;
}

void
td_progress_set_interval_ms(uint64_t ms)
{
    progress_every_ms = ms;
    progress_every_set = true;
}

static uint64_t
progress_every_ns(void)
{
    if (!progress_every_set) {
        const char *env = getenv("TD_PROGRESS_MS");
        char *end;
        unsigned long long v = env && env[0] ? strtoull(env, &end, 10) : 0;
        progress_every_ms = env && env[0] && *end == '\0' ? v : TD_PROGRESS_EVERY_MS;
        progress_every_set = true;
    }
    return progress_every_ms * 1000000u;
}

/* "160.2 GiB", "12.0 KiB", "100 B" */
static void
progress_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
    double v = (double)n;
    int u = -1;

    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    if (u < 0)
        snprintf(buf, len, "%" PRIu64 " B", n);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* A failure is logged where it was decided; its END line goes to the
 * handler only. */
static void
progress_report(td_progress_phase_t phase, const char *line, td_status_t st)
{
    if (st == TD_OK)
        td_info("%s", line);
    if (progress_fn)
        progress_fn(phase, line, progress_arg);
}

void
td_progress_begin(td_progress_t *p, const char *what, const char *unit, uint64_t items,
                  uint64_t bytes)
{
    char line[512], b[32];

    memset(p, 0, sizeof(*p));
    snprintf(p->what, sizeof(p->what), "%s", what);
    p->unit = unit;
    p->items = items;
    p->bytes = bytes;
    p->t0_ns = td_clock_ns();
    p->next_ns = p->t0_ns + progress_every_ns();
    progress_bytes(bytes, b, sizeof(b));
    snprintf(line, sizeof(line), "%s: loading %" PRIu64 " %s, %s", p->what, items, unit, b);
    progress_report(TD_PROGRESS_BEGIN, line, TD_OK);
}

void
td_progress_step(td_progress_t *p, uint64_t items_done, uint64_t bytes_done)
{
    char line[512], done[32], total[32];
    uint64_t now;

    p->items_done = items_done;
    p->bytes_done = bytes_done;
    now = td_clock_ns();
    if (now < p->next_ns)
        return;
    p->next_ns = now + progress_every_ns();
    p->stepped = true;
    progress_bytes(bytes_done, done, sizeof(done));
    progress_bytes(p->bytes, total, sizeof(total));
    snprintf(line, sizeof(line), "%s: loading: %" PRIu64 " of %" PRIu64 " %s, %s of %s (%d%%), "
             "%.0f s", p->what, items_done, p->items, p->unit, done, total,
             p->bytes ? (int)(100.0 * (double)bytes_done / (double)p->bytes) : 100,
             (double)(now - p->t0_ns) / 1e9);
    progress_report(TD_PROGRESS_STEP, line, TD_OK);
}

void
td_progress_end(td_progress_t *p, td_status_t st)
{
    char line[512], b[32];
    double s = (double)(td_clock_ns() - p->t0_ns) / 1e9;

    if (st == TD_OK) {
        progress_bytes(p->bytes, b, sizeof(b));
        snprintf(line, sizeof(line), "%s: loaded %" PRIu64 " %s, %s in %.1f s", p->what,
                 p->items, p->unit, b, s);
    } else {
        snprintf(line, sizeof(line), "%s: loading failed after %" PRIu64 " of %" PRIu64
                 " %s (%.1f s): %s", p->what, p->items_done, p->items, p->unit, s,
                 td_status_str(st));
    }
    progress_report(TD_PROGRESS_END, line, st);
}
