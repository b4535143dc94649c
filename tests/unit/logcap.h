/* tests/unit/logcap.h — what the code under test logs, for tests that check a
 * failure's message: modules log an error once where they decide it (and keep
 * no last-error string), so a test reads the line from a log sink. */
#ifndef TD_LOGCAP_H
#define TD_LOGCAP_H

#include <stdio.h>
#include <string.h>

#include "log.h"

typedef struct {
    char last[1024];   /* the last error or warning line ("" when none) */
    int errors;        /* error lines since td_logcap_start / td_logcap_reset */
} td_logcap_t;

static td_logcap_t td_logcap;

static void
td_logcap_sink(td_log_level_t level, const char *line, void *arg)
{
    (void)arg;
    if (level > TD_LOG_WARN)
        return;
    snprintf(td_logcap.last, sizeof(td_logcap.last), "%s", line);
    td_logcap.errors += level == TD_LOG_ERROR;
}

/* Forget what was captured. */
static inline void
td_logcap_reset(void)
{
    td_logcap.last[0] = '\0';
    td_logcap.errors = 0;
}

/* Send the log to the capture (single-threaded tests: td_log_set_sink). */
static inline void
td_logcap_start(void)
{
    td_logcap_reset();
    td_log_set_sink(td_logcap_sink, NULL);
}

/* Back to stderr. */
static inline void
td_logcap_stop(void)
{
    td_log_set_sink(NULL, NULL);
}

#endif
