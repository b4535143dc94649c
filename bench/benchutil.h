/* bench/benchutil.h — what xferbench and memcpybench share: the flags that
 * make them measure alike, the keyed byte pattern every block is filled with
 * and checked against, and medians. Header-only (static inline functions).
 * Numbers on the command lines are read by td_config_parse_size/uint
 * (base/config.h); the clock is td_clock_s (base/clock.h). */
#ifndef TD_BENCHUTIL_H
#define TD_BENCHUTIL_H

#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "rng.h"

/* The shared flags, for a getopt_long table: --size, --ws and --total are
 * byte sizes (64K, 1M, 1GiB, ...), --rounds a count. */
#define BENCH_SHARED_OPTIONS                    \
    {"size", required_argument, NULL, 's'},     \
    {"ws", required_argument, NULL, 'S'},       \
    {"total", required_argument, NULL, 'B'},    \
    {"rounds", required_argument, NULL, 'r'}

/* Sizes up to 1 TiB. */
#define BENCH_SIZE_MAX (1ull << 40)

/* getopt's option c with value arg, if it is one of BENCH_SHARED_OPTIONS,
 * into the field it sets (block size, working set, bytes per round, timed
 * rounds; all at least 1). TD_ERR_NOT_FOUND for any other c; a bad value
 * gives its status and err ("size: invalid value ..."). */
static inline td_status_t bench_shared_option(int c, const char *arg, uint64_t *size,
                                              uint64_t *ws_bytes, uint64_t *total,
                                              uint32_t *rounds, char *err, size_t errlen)
{
    uint64_t v = 0;
    td_status_t st;

    switch (c) {
    case 's': return td_config_parse_size("size", arg, 1, BENCH_SIZE_MAX, size, err, errlen);
    case 'S': return td_config_parse_size("ws", arg, 1, BENCH_SIZE_MAX, ws_bytes, err, errlen);
    case 'B': return td_config_parse_size("total", arg, 1, BENCH_SIZE_MAX, total, err, errlen);
    case 'r':
        st = td_config_parse_uint("rounds", arg, 1, UINT32_MAX, &v, err, errlen);
        if (st == TD_OK)
            *rounds = (uint32_t)v;
        return st;
    default:
        return TD_ERR_NOT_FOUND;
    }
}

/* The word at index i of block `block` under key `key`: td_rng_mix64. */
static inline uint64_t bench_pattern_word(uint64_t key, uint64_t block, uint64_t i)
{
    return td_rng_mix64(key ^ (block * TD_RNG_GAMMA) ^ (i * 0xd1b54a32d192ed03ull));
}

/* Fill len bytes with block `block`'s pattern. */
static inline void bench_pattern_fill(void *buf, size_t len, uint64_t key, uint64_t block)
{
    unsigned char *p = buf;
    size_t nwords = len / 8;
    for (size_t i = 0; i < nwords; i++) {
        uint64_t w = bench_pattern_word(key, block, i);
        memcpy(p + i * 8, &w, 8);
    }
    if (len % 8) {
        uint64_t w = bench_pattern_word(key, block, nwords);
        memcpy(p + nwords * 8, &w, len % 8);
    }
}

/* Offset of the first byte that differs from the pattern, or -1 if none. */
static inline int64_t bench_pattern_check(const void *buf, size_t len, uint64_t key, uint64_t block)
{
    const unsigned char *p = buf;
    size_t nwords = (len + 7) / 8;
    for (size_t i = 0; i < nwords; i++) {
        uint64_t w = bench_pattern_word(key, block, i);
        size_t n = (i * 8 + 8 <= len) ? 8 : len - i * 8;
        if (memcmp(p + i * 8, &w, n) != 0) {
            for (size_t j = 0; j < n; j++)
                if (p[i * 8 + j] != ((const unsigned char *)&w)[j])
                    return (int64_t)(i * 8 + j);
        }
    }
    return -1;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts them in place). */
static inline double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), bench_cmp_double);
    return (n % 2) ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

#endif
