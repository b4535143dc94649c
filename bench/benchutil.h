/* bench/benchutil.h — what xferbench and memcpybench share: size parsing,
 * the keyed byte pattern every block is filled with and checked against,
 * a monotonic clock, and medians. Header-only (static inline functions). */
#ifndef TD_BENCHUTIL_H
#define TD_BENCHUTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* "4096", "4K", "4KiB", "64k", "1M", "1GiB" -> bytes (K/M/G are powers of
 * two). Returns 0 and sets *out, or -1 on a malformed or zero value. */
static inline int bench_parse_size(const char *s, uint64_t *out)
{
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1ull << 10},
        {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1ull << 20},
        {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1ull << 30},
    };
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || s[0] == '-' || v == 0)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            if (v > UINT64_MAX / units[i].mult)
                return -1;
            *out = v * units[i].mult;
            return 0;
        }
    }
    return -1;
}

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: the word at index i of block `block` under key `key`. */
static inline uint64_t bench_pattern_word(uint64_t key, uint64_t block, uint64_t i)
{
    uint64_t z = key ^ (block * 0x9e3779b97f4a7c15ull) ^ (i * 0xd1b54a32d192ed03ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
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
