/* tests/unit/testutil.h — small helpers the C tests share (next to check.h):
 * monotonic clocks, and whole-buffer socket I/O that gives up after 10 s. */
#ifndef TD_TESTUTIL_H
#define TD_TESTUTIL_H

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t
td_testutil_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static inline uint64_t
td_testutil_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
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

#endif
