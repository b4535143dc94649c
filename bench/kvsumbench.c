/* bench/kvsumbench.c — what the KV checksum (engine/kvsum.h) costs: one
 * request's KV in the released V4.1 layout (the defaults of the --kv-*
 * options) for N prompt tokens, its blocks scattered in a pool, summed the
 * way a decode rank does (td_kvsum_of over the blocks) and the way a prefill
 * rank does (td_kvsum_update per piece, chunk by chunk and layer by layer),
 * next to a memcpy of the same bytes. Prints milliseconds and GB/s (1e9). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "clock.h"
#include "config.h"
#include "kvsum.h"
#include "layout.h"
#include "rng.h"

typedef struct {
    uint64_t tokens;
    uint64_t chunk;
    uint32_t rounds;
    int cold;
} kvsumbench_opts_t;

static void
kvsumbench_usage(FILE *f)
{
    fprintf(f,
        "usage: kvsumbench [options]\n"
        "The KV checksum of one request in the released V4.1 layout.\n"
        "  --tokens N   prompt tokens (default 4096)\n"
        "  --chunk N    prefill chunk for the piece-by-piece sum (default 512)\n"
        "  --rounds N   timed rounds; the median is printed (default 9)\n"
        "  --cold       evict the caches (touch 256 MiB) before every timed pass\n"
        "Output: kvsumbench what=W bytes=B ms=M gbps=G, what = of (decode rank,\n"
        "over the blocks), stream (prefill rank, per piece), memcpy (the bytes once).\n");
}

/* The request: per paged segment its blocks in shuffled pool order, per
 * fixed segment a slot; the same bytes flat per segment (the sender's). */
typedef struct {
    const td_layout_t *l;
    uint64_t *nblocks;
    uint8_t ***blocks;
    uint8_t **fixed;
    uint8_t **flat;
    uint8_t *pool;
    td_layout_kv_t kv;
    uint64_t bytes;
} kvsumbench_kv_t;

static int
kvsumbench_kv_create(kvsumbench_kv_t *k, const td_layout_t *l, uint64_t n)
{
    uint32_t ns = l->nsegs;
    uint64_t pool_bytes = 0, at = 0;
    td_rng_t rng = td_rng_seed(42);

    memset(k, 0, sizeof(*k));
    k->l = l;
    k->nblocks = calloc(ns, sizeof(*k->nblocks));
    k->blocks = calloc(ns, sizeof(*k->blocks));
    k->fixed = calloc(ns, sizeof(*k->fixed));
    k->flat = calloc(ns, sizeof(*k->flat));
    if (!k->nblocks || !k->blocks || !k->fixed || !k->flat)
        return -1;
    for (uint32_t s = 0; s < ns; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        pool_bytes += seg->kind == TD_LAYOUT_FIXED
                          ? (uint64_t)seg->entries * seg->entry_bytes
                          : 2 * td_layout_blocks(l, seg, n) * l->block_entries * seg->entry_bytes;
    }
    k->pool = malloc(pool_bytes);
    if (k->pool == NULL)
        return -1;
    for (uint64_t i = 0; i < pool_bytes; i += 8) {
        uint64_t v = td_rng_next(&rng);
        memcpy(k->pool + i, &v, pool_bytes - i < 8 ? pool_bytes - i : 8);
    }
    for (uint32_t s = 0; s < ns; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        uint64_t sb = td_layout_seg_bytes(seg, n);
        k->bytes += sb;
        if (seg->kind == TD_LAYOUT_FIXED) {
            k->fixed[s] = k->pool + at;
            at += sb;
            k->flat[s] = malloc(sb);
            if (k->flat[s] == NULL)
                return -1;
            memcpy(k->flat[s], k->fixed[s], sb);
            continue;
        }
        /* twice the blocks in the pool region, the request's taken shuffled */
        uint64_t nb = td_layout_blocks(l, seg, n), bb = l->block_entries * seg->entry_bytes;
        uint64_t *order = malloc(2 * nb * sizeof(*order) + 1);
        k->blocks[s] = calloc(nb ? nb : 1, sizeof(**k->blocks));
        k->flat[s] = malloc(sb + 1);
        if (order == NULL || k->blocks[s] == NULL || k->flat[s] == NULL)
            return -1;
        for (uint64_t b = 0; b < 2 * nb; b++)
            order[b] = b;
        for (uint64_t b = 2 * nb; b-- > 1;) {
            uint64_t j = td_rng_next(&rng) % (b + 1), t = order[b];
            order[b] = order[j];
            order[j] = t;
        }
        for (uint64_t b = 0; b < nb; b++)
            k->blocks[s][b] = k->pool + at + order[b] * bb;
        free(order);
        at += 2 * nb * bb;
        k->nblocks[s] = nb;
        uint64_t entries = td_layout_entries(seg, n);
        for (uint64_t e = 0; e < entries; e++)
            memcpy(k->flat[s] + e * seg->entry_bytes,
                   k->blocks[s][e / l->block_entries] +
                       e % l->block_entries * seg->entry_bytes,
                   seg->entry_bytes);
    }
    k->kv = (td_layout_kv_t){ l, k->nblocks, (uint8_t *const *const *)k->blocks,
                              (uint8_t *const *)k->fixed };
    return 0;
}

static void
kvsumbench_kv_destroy(kvsumbench_kv_t *k)
{
    for (uint32_t s = 0; k->l && s < k->l->nsegs; s++) {
        if (k->blocks)
            free(k->blocks[s]);
        if (k->flat)
            free(k->flat[s]);
    }
    free(k->nblocks);
    free(k->blocks);
    free(k->fixed);
    free(k->flat);
    free(k->pool);
}

/* The prefill rank's way: per chunk, per layer, each segment's new entries
 * (fixed segments whole, on the last chunk). */
static td_status_t
kvsumbench_stream(const kvsumbench_kv_t *k, uint64_t n, uint64_t chunk, uint64_t *out)
{
    const td_layout_t *l = k->l;
    td_kvsum_t *s;
    char why[160];
    td_status_t st = td_kvsum_create(l, &s);

    if (st != TD_OK)
        return st;
    for (uint64_t n0 = 0; n0 < n; n0 += chunk) {
        uint64_t n1 = n0 + chunk < n ? n0 + chunk : n;
        for (uint32_t i = 0; i < l->nsegs; i++) {
            const td_layout_seg_t *seg = &l->segs[i];
            if (seg->kind == TD_LAYOUT_FIXED) {
                if (n1 == n)
                    (void)td_kvsum_update(s, i, 0, seg->entries, k->flat[i]);
                continue;
            }
            uint64_t e0 = td_layout_entries(seg, n0), e1 = td_layout_entries(seg, n1);
            if (e1 > e0)
                (void)td_kvsum_update(s, i, e0, e1 - e0, k->flat[i] + e0 * seg->entry_bytes);
        }
    }
    st = td_kvsum_final(s, n, out, why, sizeof(why));
    if (st != TD_OK)
        fprintf(stderr, "kvsumbench: %s\n", why);
    td_kvsum_destroy(s);
    return st;
}

static uint8_t *kvsumbench_evict_buf;

static void
kvsumbench_evict(void)
{
    size_t n = 256u << 20;
    if (kvsumbench_evict_buf == NULL && (kvsumbench_evict_buf = malloc(n)) == NULL)
        return;
    for (size_t i = 0; i < n; i += 64)
        kvsumbench_evict_buf[i]++;
}

int
main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"tokens", required_argument, NULL, 't'},
        {"chunk", required_argument, NULL, 'c'},
        {"rounds", required_argument, NULL, 'r'},
        {"cold", no_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvsumbench_opts_t o = { .tokens = 4096, .chunk = 512, .rounds = 9 };
    char err[TD_CONFIG_ERRLEN];
    uint64_t v;
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        td_status_t st = TD_OK;
        switch (c) {
        case 't': st = td_config_parse_uint("tokens", optarg, 1, 1 << 24, &o.tokens, err, sizeof(err)); break;
        case 'c': st = td_config_parse_uint("chunk", optarg, 1, 1 << 24, &o.chunk, err, sizeof(err)); break;
        case 'r':
            st = td_config_parse_uint("rounds", optarg, 1, 1001, &v, err, sizeof(err));
            o.rounds = (uint32_t)v;
            break;
        case 'C': o.cold = 1; break;
        case 'h': kvsumbench_usage(stdout); return 0;
        default: kvsumbench_usage(stderr); return 2;
        }
        if (st != TD_OK) {
            fprintf(stderr, "kvsumbench: --%s\n", err);
            return 2;
        }
    }
    td_layout_config_t cfg;
    td_layout_t *l = NULL;
    if (td_layout_config_defaults(&cfg) != TD_OK || td_layout_create(&cfg, &l) != TD_OK)
        return 1;
    td_layout_config_free(&cfg);
    kvsumbench_kv_t k;
    if (kvsumbench_kv_create(&k, l, o.tokens) != 0) {
        fprintf(stderr, "kvsumbench: out of memory\n");
        return 1;
    }
    printf("kvsumbench layout: %u segments, %.1f paged bytes/token, %" PRIu64
           " fixed bytes; %" PRIu64 " tokens: %" PRIu64 " bytes\n", l->nsegs,
           td_layout_paged_bytes_per_token(l), td_layout_fixed_bytes(l), o.tokens, k.bytes);
    double *t[3];
    uint64_t sum_of = 0, sum_stream = 1;
    uint8_t *dst = malloc(k.bytes);
    for (int w = 0; w < 3; w++)
        t[w] = calloc(o.rounds, sizeof(double));
    if (dst == NULL || !t[0] || !t[1] || !t[2])
        return 1;
    for (uint32_t r = 0; r < o.rounds; r++) {
        double t0;
        if (o.cold)
            kvsumbench_evict();
        t0 = td_clock_s();
        if (td_kvsum_of(&k.kv, o.tokens, &sum_of) != TD_OK)
            return 1;
        t[0][r] = td_clock_s() - t0;
        if (o.cold)
            kvsumbench_evict();
        t0 = td_clock_s();
        if (kvsumbench_stream(&k, o.tokens, o.chunk, &sum_stream) != TD_OK)
            return 1;
        t[1][r] = td_clock_s() - t0;
        if (o.cold)
            kvsumbench_evict();
        t0 = td_clock_s();
        uint64_t at = 0;
        for (uint32_t s = 0; s < l->nsegs; s++) {
            uint64_t sb = td_layout_seg_bytes(&l->segs[s], o.tokens);
            memcpy(dst + at, k.flat[s], sb);
            at += sb;
        }
        t[2][r] = td_clock_s() - t0;
    }
    if (sum_of != sum_stream) {
        fprintf(stderr, "kvsumbench: the two sums differ: %016" PRIx64 " %016" PRIx64 "\n",
                sum_of, sum_stream);
        return 1;
    }
    static const char *const what[3] = { "of", "stream", "memcpy" };
    for (int w = 0; w < 3; w++) {
        double m = bench_median(t[w], o.rounds);
        printf("kvsumbench what=%s bytes=%" PRIu64 " ms=%.3f gbps=%.2f%s\n", what[w], k.bytes,
               m * 1e3, (double)k.bytes / m / 1e9, o.cold ? " cold" : "");
        free(t[w]);
    }
    printf("kvsumbench sum=%016" PRIx64 "\n", sum_of);
    free(dst);
    free(kvsumbench_evict_buf);
    kvsumbench_kv_destroy(&k);
    td_layout_destroy(l);
    return 0;
}
