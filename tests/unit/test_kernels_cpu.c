/* tests/unit/test_kernels_cpu.c — the CPU backend's KV pack/unpack against a
 * byte-by-byte reference: block sizes 1 B .. 1 MiB, random block tables,
 * partial blocks, strided spans, and rejected arguments that write nothing. */
#include "check.h"
#include "kernels.h"
#include "logcap.h"
#include "rng.h"
#include "status.h"

#include <stdint.h>
#include <stdlib.h>

static td_rng_t rng = { .state = TD_RNG_GAMMA };

static void
fill(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)td_rng_next(&rng);
}

/* ntable distinct random ids out of nblocks (a shuffled prefix). */
static uint32_t *
random_table(uint32_t nblocks, size_t ntable)
{
    uint32_t *ids = malloc(nblocks * sizeof(*ids));
    for (uint32_t i = 0; i < nblocks; i++)
        ids[i] = i;
    for (uint32_t i = 0; i < nblocks && i < ntable; i++) {
        uint32_t k = i + (uint32_t)(td_rng_next(&rng) % (nblocks - i));
        uint32_t t = ids[i];
        ids[i] = ids[k];
        ids[k] = t;
    }
    return ids;
}

/* The reference: where byte i of the contiguous buffer lives in the pool. */
static size_t
ref_addr(const td_kernels_pool_t *pool, const uint32_t *table,
         const td_kernels_span_t *s, size_t i)
{
    uint64_t e = s->first + i / s->entry_bytes;
    return (size_t)table[e / s->entries_per_block] * pool->block_bytes + s->offset +
           (size_t)(e % s->entries_per_block) * s->entry_bytes + i % s->entry_bytes;
}

typedef struct {
    const char *name;
    size_t block_bytes;
    uint32_t nblocks;
    td_kernels_span_t span;   /* entries_per_block 0: plain, count = bytes */
} kv_case_t;

/* Pack from a random pool, unpack a random buffer into another pool, and
 * round-trip; compare every byte with the reference, both ways. */
static void
check_case(const kv_case_t *c)
{
    const td_kernels_t *k = td_kernels_cpu();
    td_kernels_span_t s = c->span.entries_per_block
                              ? c->span
                              : td_kernels_span_bytes(c->block_bytes, c->span.count);
    size_t total = c->block_bytes * c->nblocks;
    size_t len = (size_t)s.count * s.entry_bytes;
    size_t ntable = s.count ? (size_t)((s.first + s.count - 1) / s.entries_per_block + 1) : 0;
    unsigned char *base = malloc(total), *copy = malloc(total);
    unsigned char *buf = malloc(len + 1), *back = malloc(len + 1);
    uint32_t *table = random_table(c->nblocks, ntable);
    td_kernels_pool_t pool = { base, c->nblocks, c->block_bytes };
    size_t bad = 0;

    fill(base, total);
    memcpy(copy, base, total);
    fill(buf, len + 1);
    unsigned char guard = buf[len];
    CHECK_STATUS(k->kv_pack(&pool, table, ntable, &s, buf, NULL), TD_OK);
    for (size_t i = 0; i < len; i++)
        bad += buf[i] != base[ref_addr(&pool, table, &s, i)];
    CHECK(buf[len] == guard);
    CHECK(memcmp(base, copy, total) == 0);

    fill(buf, len);
    CHECK_STATUS(k->kv_unpack(&pool, table, ntable, &s, buf, NULL), TD_OK);
    for (size_t i = 0; i < len; i++) {
        size_t a = ref_addr(&pool, table, &s, i);
        bad += base[a] != buf[i];
        copy[a] = buf[i];  /* copy becomes the expected pool */
    }
    CHECK(memcmp(base, copy, total) == 0);  /* nothing outside the span moved */

    CHECK_STATUS(k->kv_pack(&pool, table, ntable, &s, back, NULL), TD_OK);
    CHECK(memcmp(back, buf, len) == 0);

    if (bad)
        fprintf(stderr, "case %s: %zu bytes differ from the reference\n", c->name, bad);
    CHECK_EQ_INT(bad, 0);
    free(table);
    free(back);
    free(buf);
    free(copy);
    free(base);
}

/* Bad arguments: the expected status, and neither buffer nor pool written.
 * Pools and buffers near the top of the address space are fake addresses:
 * the check rejects them before any byte moves (an overflowing overlap test
 * would let them through to the copy, which crashes). */
static void
check_rejects(void)
{
    const td_kernels_t *k = td_kernels_cpu();
    enum { BB = 64, NB = 8 };
    static unsigned char base[BB * NB], copy[BB * NB];
    unsigned char buf[4 * BB], bufcopy[4 * BB];
    td_kernels_pool_t pool = { base, NB, BB };
    td_kernels_span_t plain = td_kernels_span_bytes(BB, 3 * BB + 5);
    size_t plain_len = 3 * BB + 5;
    uint32_t good[4] = { 5, 1, 7, 2 };
    uint32_t low[4] = { 3, 1, 0, 2 };            /* for pools of 4 blocks */
    uint32_t last_bad[4] = { 5, 1, 7, NB };      /* bad id in the last block used */
    uint32_t first_bad[4] = { UINT32_MAX, 1, 7, 2 };
    /* pools of 4 blocks around buf = base: right after it, on its last byte */
    td_kernels_pool_t after = { base + plain_len, 4, BB };
    td_kernels_pool_t on_last = { base + plain_len - 1, 4, BB };
    /* fake pools: ending at the top of the address space, BB below it, past it */
    uintptr_t top = UINTPTR_MAX - NB * BB + 1, below = top - BB;
    td_kernels_pool_t at_top = { (void *)top, NB, BB };
    td_kernels_pool_t below_top = { (void *)below, NB, BB };
    td_kernels_pool_t wrapping = { (void *)(UINTPTR_MAX - BB + 1), NB, BB };
    struct {
        const char *name;
        const td_kernels_pool_t *pool;
        const uint32_t *table;
        size_t ntable;
        td_kernels_span_t span;
        void *buf;
        td_status_t want;
        const char *msg;  /* expected in the one error line logged */
    } cases[] = {
        { "last id out of range", &pool, last_bad, 4, plain, buf, TD_ERR_RANGE, "table[3] = 8 >= nblocks 8" },
        { "first id out of range", &pool, first_bad, 4, plain, buf, TD_ERR_RANGE, "table[0]" },
        { "table too short", &pool, good, 3, plain, buf, TD_ERR_RANGE, "span needs 4" },
        { "zero entry bytes", &pool, good, 4, { 0, 4, 0, 0, 4 }, buf, TD_ERR_INVALID, "entry_bytes 0" },
        { "zero entries per block", &pool, good, 4, { 4, 0, 0, 0, 4 }, buf, TD_ERR_INVALID, "entries_per_block 0" },
        { "span wider than block", &pool, good, 4, { 8, 8, 1, 0, 4 }, buf, TD_ERR_INVALID, "exceeds block_bytes" },
        { "offset past block", &pool, good, 4, { 1, 1, BB + 1, 0, 4 }, buf, TD_ERR_INVALID, "exceeds block_bytes" },
        { "entry count overflows", &pool, good, 4, { 2, 32, 0, UINT64_MAX - 2, 4 }, buf, TD_ERR_RANGE, "overflows" },
        { "null buffer", &pool, good, 4, plain, NULL, TD_ERR_INVALID, "NULL" },
        { "null table", &pool, NULL, 4, plain, buf, TD_ERR_INVALID, "NULL" },
        { "buffer inside pool", &pool, good, 4, td_kernels_span_bytes(BB, 8), base + 3 * BB, TD_ERR_INVALID, "overlaps" },
        { "buffer's last byte on the pool's first", &on_last, low, 4, plain, base, TD_ERR_INVALID, "overlaps" },
        { "pool ending at the top, buffer inside", &at_top, good, 4, plain, (void *)(top + BB), TD_ERR_INVALID, "overlaps" },
        { "buffer ending at the top, pool below", &below_top, good, 4, plain,
          (void *)(UINTPTR_MAX - plain_len + 1), TD_ERR_INVALID, "overlaps" },
        { "buffer past the top", &pool, good, 4, plain, (void *)(UINTPTR_MAX - 10), TD_ERR_INVALID, "buffer wraps" },
        { "pool past the top", &wrapping, good, 4, plain, buf, TD_ERR_INVALID, "pool wraps" },
        { "buffer right before the pool", &after, low, 4, plain, base, TD_OK, NULL },
        { "empty span", &pool, NULL, 0, td_kernels_span_bytes(BB, 0), NULL, TD_OK, NULL },
        { "ids past the span unchecked", &pool, last_bad, 4, td_kernels_span_bytes(BB, 3 * BB), buf, TD_OK, NULL },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int pack = 0; pack < 2; pack++) {
            fill(base, sizeof(base));
            memcpy(copy, base, sizeof(base));
            fill(buf, sizeof(buf));
            memcpy(bufcopy, buf, sizeof(buf));
            td_logcap_start();
            td_status_t st = pack ? k->kv_pack(cases[i].pool, cases[i].table, cases[i].ntable,
                                               &cases[i].span, cases[i].buf, NULL)
                                  : k->kv_unpack(cases[i].pool, cases[i].table, cases[i].ntable,
                                                 &cases[i].span, cases[i].buf, NULL);
            td_logcap_stop();
            if (st != cases[i].want)
                fprintf(stderr, "reject case %s (%s): %s\n", cases[i].name,
                        pack ? "pack" : "unpack", td_logcap.last);
            CHECK_STATUS(st, cases[i].want);
            CHECK_EQ_INT(td_logcap.errors, cases[i].want == TD_OK ? 0 : 1);
            if (cases[i].want == TD_OK)
                continue;
            CHECK(strstr(td_logcap.last, pack ? "kv_pack: " : "kv_unpack: ") != NULL);
            CHECK(strstr(td_logcap.last, cases[i].msg) != NULL);
            CHECK(memcmp(base, copy, sizeof(base)) == 0);
            CHECK(memcmp(buf, bufcopy, sizeof(buf)) == 0);
        }
    }
}

int
main(void)
{
    enum { KiB = 1024, MiB = 1024 * 1024 };
    /* plain spans: { 0, 0, 0, 0, bytes }; strided: { eb, epb, offset, first, count } */
    static const kv_case_t cases[] = {
        { "1 B blocks", 1, 16, { 0, 0, 0, 0, 11 } },
        { "3 B blocks, partial last", 3, 16, { 0, 0, 0, 0, 40 } },
        { "empty", 7, 4, { 0, 0, 0, 0, 0 } },
        { "64 B blocks, whole", 64, 32, { 0, 0, 0, 0, 64 * 10 } },
        { "one partial block", 4 * KiB, 4, { 0, 0, 0, 0, 100 } },
        { "4 KiB blocks, partial last", 4 * KiB, 16, { 0, 0, 0, 0, 5 * 4 * KiB + 17 } },
        { "64 KiB blocks, 1 byte in last", 64 * KiB, 8, { 0, 0, 0, 0, 3 * 64 * KiB + 1 } },
        { "1 MiB blocks, partial last", MiB, 4, { 0, 0, 0, 0, 2 * MiB + 12345 } },
        { "1 MiB blocks, all", MiB, 3, { 0, 0, 0, 0, 3 * MiB } },
        /* a block of [3 layers, 4 entries, 5 B] + 4 B padding; layer 1, entries 6..14 */
        { "strided, layer 1 of 3", 64, 8, { 5, 4, 20, 6, 9 } },
        { "strided, one entry mid-block", 64, 8, { 5, 4, 40, 13, 1 } },
        { "strided, starts on a block edge", 64, 8, { 5, 4, 0, 8, 12 } },
        { "strided, empty", 64, 8, { 5, 4, 0, 3, 0 } },
        /* V4.1-like: 64 entries of 584 B per block, a 1000-token ratio-2 prefix */
        { "strided, v4.1 compressed kv", 64 * 584, 24, { 584, 64, 0, 0, 500 } },
        { "strided, decode append", 64 * 584, 24, { 584, 64, 0, 500, 1 } },
    };

    CHECK_STR(td_kernels_cpu()->name, "cpu");
    CHECK_STATUS(td_kernels_cpu()->sync(NULL), TD_OK);
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            check_case(&cases[i]);
    check_rejects();
    return td_check_exit("test_kernels_cpu");
}
