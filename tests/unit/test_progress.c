/* tests/unit/test_progress.c — base/progress.c: the BEGIN, STEP and END
 * lines, logged and handed to the handler, STEPs at most once per interval,
 * a failure's END for the handler only. */
#include "check.h"
#include "log.h"
#include "progress.h"

#include <stdlib.h>
#include <string.h>

#define CAP_MAX 16

typedef struct {
    int n;
    td_progress_phase_t phase[CAP_MAX];
    char line[CAP_MAX][512];
} cap_t;

static cap_t got;     /* handler */
static cap_t logged;  /* info lines of the log */

static void
on_progress(td_progress_phase_t phase, const char *line, void *arg)
{
    cap_t *c = arg;
    if (c->n < CAP_MAX) {
        c->phase[c->n] = phase;
        snprintf(c->line[c->n], sizeof(c->line[0]), "%s", line);
    }
    c->n++;
}

static void
log_sink(td_log_level_t level, const char *line, void *arg)
{
    (void)arg;
    if (level == TD_LOG_INFO)
        on_progress(TD_PROGRESS_STEP, line, &logged);
}

static void
reset(void)
{
    memset(&got, 0, sizeof(got));
    memset(&logged, 0, sizeof(logged));
}

static void
check_line(const cap_t *c, int i, td_progress_phase_t phase, const char *want)
{
    if (i >= c->n || (c == &got && c->phase[i] != phase) || strstr(c->line[i], want) == NULL) {
        fprintf(stderr, "line %d: \"%s\" (phase %d), want \"%s\" (phase %d)\n", i,
                i < c->n ? c->line[i] : "(none)", i < c->n ? (int)c->phase[i] : -1, want,
                (int)phase);
        td_check_failures++;
    }
}

int
main(void)
{
    td_progress_t p;

    td_log_set_sink(log_sink, NULL);
    td_progress_set_handler(on_progress, &got);

    /* interval 0: every step is a line */
    reset();
    td_progress_set_interval_ms(0);
    td_progress_begin(&p, "model /m", "tensors", 3, 3 << 20);
    td_progress_step(&p, 1, 1 << 20);
    td_progress_step(&p, 2, 2 << 20);
    td_progress_end(&p, TD_OK);
    CHECK_EQ_INT(got.n, 4);
    check_line(&got, 0, TD_PROGRESS_BEGIN, "model /m: loading 3 tensors, 3.0 MiB");
    check_line(&got, 1, TD_PROGRESS_STEP, "model /m: loading: 1 of 3 tensors, 1.0 MiB of 3.0 MiB (33%)");
    check_line(&got, 2, TD_PROGRESS_STEP, "model /m: loading: 2 of 3 tensors, 2.0 MiB of 3.0 MiB (66%)");
    check_line(&got, 3, TD_PROGRESS_END, "model /m: loaded 3 tensors, 3.0 MiB in ");
    CHECK_EQ_INT(logged.n, 4);   /* each also logged at info */
    for (int i = 0; i < 4 && i < logged.n; i++)
        CHECK_STR(logged.line[i], got.line[i]);

    /* a long interval: no STEP between BEGIN and END */
    reset();
    td_progress_set_interval_ms(3600 * 1000);
    td_progress_begin(&p, "model /m", "tensors", 1000, 1000);
    for (int i = 1; i < 1000; i++)
        td_progress_step(&p, (uint64_t)i, (uint64_t)i);
    td_progress_end(&p, TD_OK);
    CHECK_EQ_INT(got.n, 2);
    check_line(&got, 0, TD_PROGRESS_BEGIN, "loading 1000 tensors, 1000 B");
    check_line(&got, 1, TD_PROGRESS_END, "loaded 1000 tensors, 1000 B");

    /* a failure: its END goes to the handler (systemd's STATUS=), not to the
     * log, where the failure was logged once already */
    reset();
    td_progress_begin(&p, "model /m", "tensors", 10, 10ull << 30);
    td_progress_step(&p, 4, 4ull << 30);
    td_progress_end(&p, TD_ERR_IO);
    CHECK_EQ_INT(got.n, 2);
    check_line(&got, 0, TD_PROGRESS_BEGIN, "loading 10 tensors, 10.0 GiB");
    check_line(&got, 1, TD_PROGRESS_END, "model /m: loading failed after 4 of 10 tensors");
    CHECK_EQ_INT(logged.n, 1);

    td_progress_set_handler(NULL, NULL);
    td_log_set_sink(NULL, NULL);
    return td_check_exit("test_progress");
}
