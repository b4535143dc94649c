/* tests/unit/testutil.h — small helpers the C tests share (next to check.h):
 * the clock in us and ms, whole-buffer socket I/O that gives up after 10 s,
 * finding a tool of the build the test belongs to, and making a checkpoint
 * with it. */
#ifndef TD_TESTUTIL_H
#define TD_TESTUTIL_H

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"

/* base/clock.h's monotonic clock in microseconds and milliseconds. */
static inline uint64_t
td_testutil_now_us(void)
{
    return td_clock_ns() / 1000;
}

static inline uint64_t
td_testutil_now_ms(void)
{
    return td_clock_ns() / 1000000;
}

/* Write (writing != 0) or read all len bytes of buf on fd; -1 on error, EOF or
 * 10 s without progress. */
static inline int
td_testutil_io_full(int fd, void *buf, size_t len, int writing)
{
    uint8_t *p = buf;
    while (len) {
        struct pollfd pfd = { .fd = fd, .events = writing ? POLLOUT : POLLIN };
        if (poll(&pfd, 1, 10000) != 1)
            return -1;
        ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The path of a built tool in out (len bytes): $env when set, else
 * <build>/tools/<name>, the test being <build>/tests/<folder>/<test>.
 * 1 when it is there and executable. */
static inline int
td_testutil_build_tool(const char *env, const char *name, char *out, size_t len)
{
    const char *given = getenv(env);
    char exe[PATH_MAX];
    ssize_t n;

    if (given != NULL && *given != '\0') {
        snprintf(out, len, "%s", given);
        return access(out, X_OK) == 0;
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return 0;
    exe[n] = '\0';
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(exe, '/');
        if (slash == NULL)
            return 0;
        *slash = '\0';
    }
    snprintf(out, len, "%s/tools/%s", exe, name);
    return access(out, X_OK) == 0;
}

/* Write a checkpoint with the mk-tiny-model tool (found by
 * td_testutil_build_tool) and its args into root/name; dir (len bytes) gets
 * its path. 0, or -1 with the command printed and counted as a failure. */
static inline int
td_testutil_mk_model(const char *tool, const char *root, const char *name, const char *args,
                     char *dir, size_t len)
{
    char cmd[3 * PATH_MAX + 200];

    snprintf(dir, len, "%s/%s", root, name);
    snprintf(cmd, sizeof(cmd), "'%s' %s '%s' >/dev/null", tool, args, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        td_check_failures++;
        return -1;
    }
    return 0;
}

#endif
