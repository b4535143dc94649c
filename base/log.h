/* base/log.h — leveled logging to stderr (or a sink set by tests), and
 * rate limits for lines a peer can make us repeat. The macros test the level
 * before evaluating their arguments. Messages are lower-case and name their
 * object: "decode rank %u: admit rejected: %s". */
#ifndef TD_LOG_H
#define TD_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "clock.h"
#include "status.h"

typedef enum {
    TD_LOG_ERROR = 0,
    TD_LOG_WARN  = 1,
    TD_LOG_INFO  = 2,
    TD_LOG_DEBUG = 3,
    TD_LOG_TRACE = 4,
} td_log_level_t;

/* Current threshold; read by the macros, set with td_log_set_level(). */
extern volatile td_log_level_t td_log_threshold;

/* Called with each formatted line (no trailing newline). */
typedef void (*td_log_sink_fn)(td_log_level_t level, const char *line, void *arg);

/* Name shown on every line (process name); the pointer is kept. */
void td_log_set_ident(const char *ident);
void td_log_set_level(td_log_level_t level);
/* Replace stderr by a sink (NULL restores stderr). Not thread-safe against
 * concurrent logging; set it before starting threads. */
void td_log_set_sink(td_log_sink_fn fn, void *arg);

/* "error", "warn", "info", "debug", "trace" -> level. */
td_status_t td_log_level_parse(const char *name, td_log_level_t *out);
const char *td_log_level_str(td_log_level_t level);

void td_log_write(td_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define td_log(lvl, ...)                                                    \
    do {                                                                    \
        if ((lvl) <= td_log_threshold)                                      \
            td_log_write((lvl), __VA_ARGS__);                               \
    } while (0)

#define td_error(...) td_log(TD_LOG_ERROR, __VA_ARGS__)
#define td_warn(...)  td_log(TD_LOG_WARN, __VA_ARGS__)
#define td_info(...)  td_log(TD_LOG_INFO, __VA_ARGS__)
#define td_debug(...) td_log(TD_LOG_DEBUG, __VA_ARGS__)
#define td_trace(...) td_log(TD_LOG_TRACE, __VA_ARGS__)

/* ---- Rate-limited lines ---------------------------------------------------
 * A line that a client, a peer or an attacker can trigger again and again
 * (accept errors, refused connections, bad requests) goes through a limit:
 * the first is written, then at most one per interval, and the next line
 * written says how many were held back: "... (41 more suppressed)".
 *
 *   td_log_every(TD_LOG_WARN, 10000, "http :%u: refused %s: at the cap", port, addr);
 *
 * gives each call site its own limit (a static). One limit may also serve
 * several call sites or one object (a listener's lines): make it a field and
 * use td_log_limited(&obj->limit, lvl, ms, ...). Thread-safe; lines below the
 * log level are neither written nor counted. */
typedef struct {
    _Atomic uint64_t next_ns;      /* CLOCK_MONOTONIC: no line before this */
    _Atomic uint64_t suppressed;   /* lines held back since the last written */
} td_log_limit_t;                  /* zero-initialised: the first line passes */

/* Whether a line may be written now (at now_ns for ..._at); when it may,
 * *suppressed is the number held back since the last one written. */
bool td_log_limit_pass(td_log_limit_t *l, uint64_t interval_ms, uint64_t *suppressed);
bool td_log_limit_pass_at(td_log_limit_t *l, uint64_t interval_ms, uint64_t now_ns,
                          uint64_t *suppressed);
/* The same with a burst: up to burst lines at once, then one per interval
 * (a line may come burst - 1 intervals before the steady rate would let it). */
bool td_log_limit_pass_burst_at(td_log_limit_t *l, uint64_t interval_ms, uint32_t burst,
                                uint64_t now_ns, uint64_t *suppressed);

/* td_log_write with " (N more suppressed)" appended when suppressed > 0. */
void td_log_write_limited(td_log_level_t level, uint64_t suppressed, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define td_log_limited(lim, lvl, interval_ms, ...)                          \
    do {                                                                    \
        uint64_t td_log_n_;                                                 \
        if ((lvl) <= td_log_threshold &&                                    \
            td_log_limit_pass((lim), (interval_ms), &td_log_n_))            \
            td_log_write_limited((lvl), td_log_n_, __VA_ARGS__);            \
    } while (0)

/* td_log_limited with a burst (td_log_limit_pass_burst_at). */
#define td_log_limited_burst(lim, lvl, interval_ms, burst, ...)             \
    do {                                                                    \
        uint64_t td_log_n_;                                                 \
        if ((lvl) <= td_log_threshold &&                                    \
            td_log_limit_pass_burst_at((lim), (interval_ms), (burst),       \
                                       td_clock_ns(), &td_log_n_))          \
            td_log_write_limited((lvl), td_log_n_, __VA_ARGS__);            \
    } while (0)

/* Lines a peer can make us repeat (a worker's or a router's malformed or
 * untimely messages, connections refused or ended): bursts of
 * TD_LOG_PEER_BURST, then one a second. xfer's notifications, which anyone
 * who reaches a worker can send, get no burst (td_log_limited). */
#define TD_LOG_PEER_MS    1000u
#define TD_LOG_PEER_BURST 10u
#define td_log_peer(lim, lvl, ...) \
    td_log_limited_burst((lim), (lvl), TD_LOG_PEER_MS, TD_LOG_PEER_BURST, __VA_ARGS__)
#define td_log_peer_every(lvl, ...)                                         \
    do {                                                                    \
        static td_log_limit_t td_log_plim_;                                 \
        td_log_peer(&td_log_plim_, (lvl), __VA_ARGS__);                     \
    } while (0)

#define td_log_every(lvl, interval_ms, ...)                                 \
    do {                                                                    \
        static td_log_limit_t td_log_lim_;                                  \
        td_log_limited(&td_log_lim_, (lvl), (interval_ms), __VA_ARGS__);    \
    } while (0)

#endif
