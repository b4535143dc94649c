/* tests/unit/test_status.c — status names and errno conversion; log levels and sink. */
#include "check.h"
#include "log.h"
#include "status.h"

#include <errno.h>

static char last_line[256];
static int lines;

static void
sink(td_log_level_t level, const char *line, void *arg)
{
    (void)level; (void)arg;
    snprintf(last_line, sizeof(last_line), "%s", line);
    lines++;
}

static int evaluated;
static int
side_effect(void)
{
    return ++evaluated;
}

int
main(void)
{
    static const struct { td_status_t st; const char *name; } names[] = {
        { TD_OK, "ok" }, { TD_ERR_TIMEOUT, "timeout" },
        { TD_ERR_STALE, "stale incarnation" }, { TD_ERR_TOO_BIG, "too big" },
        { (td_status_t)-999, "unknown status" },
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        CHECK_STR(td_status_str(names[i].st), names[i].name);

    static const struct { int err; td_status_t st; } errs[] = {
        { 0, TD_OK }, { ENOMEM, TD_ERR_NOMEM }, { ETIMEDOUT, TD_ERR_TIMEOUT },
        { ECONNRESET, TD_ERR_CLOSED }, { EBADF, TD_ERR_IO },
    };
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
        CHECK_EQ_INT(td_status_from_errno(errs[i].err), errs[i].st);

    td_log_level_t lvl;
    CHECK_STATUS(td_log_level_parse("DEBUG", &lvl), TD_OK);
    CHECK_EQ_INT(lvl, TD_LOG_DEBUG);
    CHECK_STATUS(td_log_level_parse("loud", &lvl), TD_ERR_INVALID);

    td_log_set_sink(sink, NULL);
    td_log_set_level(TD_LOG_WARN);
    td_info("hidden %d", side_effect());
    CHECK_EQ_INT(evaluated, 0); /* arguments are not evaluated below the level */
    CHECK_EQ_INT(lines, 0);
    td_warn("decode rank %u: admit rejected: %s", 3u, "no free blocks");
    CHECK_EQ_INT(lines, 1);
    CHECK_STR(last_line, "decode rank 3: admit rejected: no free blocks");
    td_log_set_sink(NULL, NULL);
    return td_check_exit("test_status");
}
