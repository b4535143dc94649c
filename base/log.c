/* base/log.c — leveled logging: one write(2) per line so that lines from
 * several threads or processes sharing stderr never interleave; rate limits
 * for lines a peer can make us repeat. */
#include "log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

volatile td_log_level_t td_log_threshold = TD_LOG_INFO;

static const char *log_ident = "tandem";
static td_log_sink_fn log_sink;
static void *log_sink_arg;

static const char *const log_level_names[] = {
    [TD_LOG_ERROR] = "error",
    [TD_LOG_WARN]  = "warn",
    [TD_LOG_INFO]  = "info",
    [TD_LOG_DEBUG] = "debug",
    [TD_LOG_TRACE] = "trace",
};

void
td_log_set_ident(const char *ident)
{
    log_ident = ident ? ident : "tandem";
}

void
td_log_set_level(td_log_level_t level)
{
    td_log_threshold = level;
}

void
td_log_set_sink(td_log_sink_fn fn, void *arg)
{
    log_sink = fn;
    log_sink_arg = arg;
}

const char *
td_log_level_str(td_log_level_t level)
{
    if ((unsigned)level > TD_LOG_TRACE)
        return "?";
    return log_level_names[level];
}

td_status_t
td_log_level_parse(const char *name, td_log_level_t *out)
{
    for (unsigned i = 0; i <= TD_LOG_TRACE; i++) {
        if (strcasecmp(name, log_level_names[i]) == 0) {
            *out = (td_log_level_t)i;
            return TD_OK;
        }
    }
    return TD_ERR_INVALID;
}

/* One line: the prefix (stderr only), the message, and " (N more
 * suppressed)" when a rate limit held lines back. */
static void
log_vwrite(td_log_level_t level, uint64_t suppressed, const char *fmt, va_list ap)
{
    char line[2048];
    size_t n = 0;

    if (log_sink == NULL) {
        struct timeval tv;
        struct tm tm;

        gettimeofday(&tv, NULL);
        gmtime_r(&tv.tv_sec, &tm);
        n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
        n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %s[%d] %s: ",
                              (long)(tv.tv_usec / 1000), log_ident, (int)getpid(),
                              td_log_level_str(level));
    }
    int w = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    if (w < 0)
        return;
    n += (size_t)w;
    if (suppressed > 0 && n < sizeof(line)) {
        w = snprintf(line + n, sizeof(line) - n, " (%" PRIu64 " more suppressed)", suppressed);
        if (w > 0)
            n += (size_t)w;
    }
    if (n >= sizeof(line) - 1)
        n = sizeof(line) - 2; /* truncated: keep room for the newline */

    if (log_sink != NULL) {
        line[n] = '\0';
        log_sink(level, line, log_sink_arg);
        return;
    }
    line[n++] = '\n';
    ssize_t r = write(STDERR_FILENO, line, n);
    (void)r;
}

void
td_log_write(td_log_level_t level, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    log_vwrite(level, 0, fmt, ap);
    va_end(ap);
}

void
td_log_write_limited(td_log_level_t level, uint64_t suppressed, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    log_vwrite(level, suppressed, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Rate limits                                                              */
/* ------------------------------------------------------------------------ */

/* next_ns is the time the next line is due at the steady rate (one per
 * interval); a line passes when it is at most burst - 1 intervals early,
 * and moves it one interval on (from now, when the limit was idle). With a
 * burst of 1: the first line, then one per interval. */
bool
td_log_limit_pass_burst_at(td_log_limit_t *l, uint64_t interval_ms, uint32_t burst,
                           uint64_t now_ns, uint64_t *suppressed)
{
    uint64_t iv = interval_ms * 1000000u;
    uint64_t slack = (burst > 1 ? burst - 1 : 0) * iv;
    uint64_t next = atomic_load_explicit(&l->next_ns, memory_order_relaxed);

    /* of the threads that find room, one wins the exchange */
    if (now_ns + slack < next ||
        !atomic_compare_exchange_strong(&l->next_ns, &next, (next > now_ns ? next : now_ns) + iv)) {
        atomic_fetch_add_explicit(&l->suppressed, 1, memory_order_relaxed);
        return false;
    }
    *suppressed = atomic_exchange(&l->suppressed, 0);
    return true;
}

bool
td_log_limit_pass_at(td_log_limit_t *l, uint64_t interval_ms, uint64_t now_ns,
                     uint64_t *suppressed)
{
    return td_log_limit_pass_burst_at(l, interval_ms, 1, now_ns, suppressed);
}

bool
td_log_limit_pass(td_log_limit_t *l, uint64_t interval_ms, uint64_t *suppressed)
{
    return td_log_limit_pass_at(l, interval_ms, td_clock_ns(), suppressed);
}
