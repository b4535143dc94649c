/* tests/unit/test_simt_fiber.c — the SIMT emulation's fibers
 * (kernels/cuda/emu/fiber.c), built twice: with the hand-written x86-64
 * switch and with ucontext (-DTD_SIMT_UCONTEXT, the other machines' path).
 * Fibers interleave in the order they are switched to, keep their own
 * floating-point rounding mode, can be prepared again after they end, and
 * use their stacks deeply; the cost of a switch is printed (not checked). */
#include "check.h"
#include "clock.h"
#include "fiber.h"

#include <fenv.h>
#include <stdio.h>
#include <string.h>

enum { NFIB = 3, ROUNDS = 4 };

static td_simt_fiber_t host, fib[NFIB];
static int trace[NFIB * ROUNDS + 8], ntrace;
static int mode_ok = 1;

static void
run(void *arg)
{
    long id = (long)arg;
    int want = id == 1 ? FE_UPWARD : FE_TONEAREST;
    if (id == 1)
        fesetround(FE_UPWARD);
    for (int i = 0; i < ROUNDS; i++) {
        trace[ntrace++] = (int)id * 10 + i;
        mode_ok &= fegetround() == want;
        td_simt_fiber_switch(&fib[id], &host);
    }
    td_simt_fiber_exit(&fib[id], &host);
}

/* About 48 KiB of frames: a fiber's stack is usable to its depth. */
static int
deep(int n, volatile char *prev)
{
    volatile char buf[1024];
    memset((char *)buf, n, sizeof(buf));
    if (n == 0)
        return buf[0] + (prev != NULL);
    return deep(n - 1, buf) + buf[1023] - n;
}

static int deep_result = -1;

static void
run_deep(void *arg)
{
    (void)arg;
    deep_result = deep(48, NULL);
    td_simt_fiber_exit(&fib[0], &host);
}

static long switches;

static void
run_pingpong(void *arg)
{
    (void)arg;
    for (;;) {
        switches++;
        td_simt_fiber_switch(&fib[0], &host);
    }
}

int
main(void)
{
    for (long i = 0; i < NFIB; i++) {
        CHECK(td_simt_fiber_alloc(&fib[i], 128 * 1024) == 0);
        td_simt_fiber_prepare(&fib[i], &host, run, (void *)i);
    }
    for (int r = 0; r <= ROUNDS; r++)
        for (int i = 0; i < NFIB; i++)
            td_simt_fiber_switch(&host, &fib[i]);
    CHECK_EQ_INT(ntrace, NFIB * ROUNDS);
    for (int k = 0; k < ntrace; k++)
        CHECK_EQ_INT(trace[k], k % NFIB * 10 + k / NFIB);
    CHECK(mode_ok);
    CHECK(fegetround() == FE_TONEAREST);

    ntrace = 0;   /* an ended fiber starts over */
    td_simt_fiber_prepare(&fib[2], &host, run, (void *)2L);
    td_simt_fiber_switch(&host, &fib[2]);
    CHECK_EQ_INT(ntrace, 1);
    CHECK_EQ_INT(trace[0], 20);

    td_simt_fiber_prepare(&fib[0], &host, run_deep, NULL);
    td_simt_fiber_switch(&host, &fib[0]);
    CHECK_EQ_INT(deep_result, 1);

    td_simt_fiber_prepare(&fib[0], &host, run_pingpong, NULL);
    const long n = 200000;
    uint64_t t0 = td_clock_ns();
    for (long i = 0; i < n; i++)
        td_simt_fiber_switch(&host, &fib[0]);
    uint64_t t1 = td_clock_ns();
    CHECK_EQ_INT(switches, n);
    printf("%s: %.1f ns per switch (%ld round trips)\n",
#ifdef TD_SIMT_UCONTEXT
           "ucontext",
#else
           "x86-64 switch",
#endif
           (double)(t1 - t0) / (2.0 * n), n);
    for (int i = 0; i < NFIB; i++)
        td_simt_fiber_free(&fib[i]);
    return td_check_exit("test_simt_fiber");
}
