/* common/log.h — leveled logging to stderr (or a sink set by tests).
 * The macros test the level before evaluating their arguments. Messages are
 * lower-case and name their object: "decode rank %u: admit rejected: %s". */
#ifndef TD_LOG_H
#define TD_LOG_H

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

#endif
