/* bench/memcpybench.c — the same-host copy limit xferbench is compared with:
 * one thread memcpy()s a working set of distinct source blocks to distinct
 * destination blocks inside one process and prints GB/s (1 GB = 1e9 bytes). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "benchutil.h"
#include "clock.h"

typedef struct {
    uint64_t size;      /* block size = bytes per memcpy */
    uint64_t ws_bytes;  /* working set per side */
    uint64_t total;     /* bytes per timed round */
    uint32_t rounds;
} memcpybench_opts_t;

static void memcpybench_usage(FILE *f)
{
    fprintf(f,
        "usage: memcpybench [options]\n"
        "One thread copies WS bytes of distinct source blocks into WS bytes of\n"
        "distinct destination blocks (both touched before timing), block by block,\n"
        "and prints GB/s, where 1 GB = 1e9 bytes.\n"
        "  --size SIZE     block size (default 64K; K/M/G = 2^10/2^20/2^30)\n"
        "  --ws BYTES      working set per side (default 1G)\n"
        "  --total BYTES   bytes per timed round (default WS)\n"
        "  --rounds N      timed rounds (default 5)\n"
        "Output: one line per round\n"
        "  memcpybench round=R size=B bytes=N seconds=S gbps=G\n"
        "then a summary with the median.\n");
}

static int memcpybench_opts_parse(int argc, char **argv, memcpybench_opts_t *o)
{
    static const struct option longopts[] = {
        BENCH_SHARED_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (memcpybench_opts_t){.size = 64 << 10, .ws_bytes = 1ull << 30, .rounds = 5};
    char err[TD_CONFIG_ERRLEN];
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'h') {
            memcpybench_usage(stdout);
            exit(0);
        }
        td_status_t st = bench_shared_option(c, optarg, &o->size, &o->ws_bytes, &o->total,
                                             &o->rounds, err, sizeof(err));
        if (st == TD_ERR_NOT_FOUND)
            goto usage;
        if (st != TD_OK) {
            fprintf(stderr, "memcpybench: --%s\n", err);
            goto usage;
        }
    }
    if (optind != argc)
        goto usage;
    if (o->ws_bytes < o->size) {
        fprintf(stderr, "memcpybench: --ws must hold at least one block\n");
        goto usage;
    }
    if (o->total == 0)
        o->total = o->ws_bytes - o->ws_bytes % o->size;
    return 0;
usage:
    memcpybench_usage(stderr);
    return -1;
}

/* Anonymous private pages, like the heap of a process (no huge pages asked). */
static char *memcpybench_map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("memcpybench: mmap");
        return NULL;
    }
    return p;
}

int main(int argc, char **argv)
{
    memcpybench_opts_t o;
    if (memcpybench_opts_parse(argc, argv, &o))
        return 2;
    uint64_t nblocks = o.ws_bytes / o.size;
    size_t len = nblocks * o.size;
    uint64_t copies = o.total / o.size ? o.total / o.size : 1;
    uint64_t bytes = copies * o.size;
    uint64_t key = (uint64_t)(td_clock_s() * 1e9);
    int rc = 1;

    char *src = memcpybench_map(len);
    char *dst = memcpybench_map(len);
    double *gbps = calloc(o.rounds, sizeof(*gbps));
    if (!src || !dst || !gbps)
        goto out;
    /* Touch both sides before timing: the source with the pattern, the
     * destination with poison, so that no page fault is measured. */
    for (uint64_t b = 0; b < nblocks; b++)
        bench_pattern_fill(src + b * o.size, o.size, key, b);
    memset(dst, 0xa5, len);
    printf("# memcpybench: one thread, %" PRIu64 "-byte blocks, working set %zu bytes per side,"
           " %" PRIu64 " bytes per round\n", o.size, len, bytes);

    for (uint32_t r = 0; r < o.rounds; r++) {
        double t0 = td_clock_s();
        for (uint64_t k = 0; k < copies; k++) {
            uint64_t off = (k % nblocks) * o.size;
            memcpy(dst + off, src + off, o.size);
        }
        double secs = td_clock_s() - t0;
        gbps[r] = (double)bytes / secs / 1e9;
        printf("memcpybench round=%u size=%" PRIu64 " bytes=%" PRIu64 " seconds=%.6f gbps=%.3f\n",
               r + 1, o.size, bytes, secs, gbps[r]);
        fflush(stdout);
    }
    /* Check the copy (also keeps the compiler from dropping it). */
    uint64_t written = copies < nblocks ? copies : nblocks;
    for (uint64_t b = 0; b < written; b++) {
        int64_t off = bench_pattern_check(dst + b * o.size, o.size, key, b);
        if (off >= 0) {
            fprintf(stderr, "memcpybench: block %" PRIu64 " differs at byte %" PRId64 "\n", b, off);
            goto out;
        }
    }
    printf("# memcpybench: median %.3f GB/s over %u rounds; GB = 1e9 bytes; every byte verified\n",
           bench_median(gbps, o.rounds), o.rounds);
    rc = 0;
out:
    free(gbps);
    if (dst)
        munmap(dst, len);
    if (src)
        munmap(src, len);
    return rc;
}
