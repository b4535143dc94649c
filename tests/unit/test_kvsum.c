/* tests/unit/test_kvsum.c — the KV checksum (engine/kvsum.c): td_kvsum_of over
 * block tables scattered in shuffled order equals the definition computed on
 * contiguous bytes and a pinned value; the piece-by-piece sum equals it for
 * any chunking and cut of the pieces, fixed segments replaced per chunk;
 * what it covers (a flipped byte inside changes it, bytes past the prompt's
 * entries do not); refusals. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "check.h"
#include "kvsum.h"
#include "layout.h"
#include "rng.h"

#define BLOCK_ENTRIES 4
#define POOL_BLOCKS   64
#define MAX_TOKENS    200

/* Two KV-source segments of ratios 1 and 2, a ring, a counter. */
static td_layout_t *
small_layout(void)
{
    td_layout_seg_t segs[5];
    td_layout_t *l = NULL;
    td_layout_seg_set(&segs[0], "L0.kv", TD_LAYOUT_PAGED, TD_LAYOUT_U8, 0, 1, 0, 24);
    td_layout_seg_set(&segs[1], "L0.window", TD_LAYOUT_FIXED, TD_LAYOUT_BF16, 0, 1, 5, 16);
    td_layout_seg_set(&segs[2], "L1.kv", TD_LAYOUT_PAGED, TD_LAYOUT_U8, 1, 2, 0, 12);
    td_layout_seg_set(&segs[3], "L1.index", TD_LAYOUT_PAGED, TD_LAYOUT_U8, 1, 2, 0, 7);
    td_layout_seg_set(&segs[4], "counters", TD_LAYOUT_FIXED, TD_LAYOUT_I64, 1, 1, 1, 8);
    CHECK_STATUS(td_layout_create_from(2, BLOCK_ENTRIES, segs, 5, &l), TD_OK);
    return l;
}

/* A request's KV in pools: every segment's blocks taken from its own pool
 * in shuffled order (as a decode rank's free list hands them out after
 * churn), the view over them, and the same bytes contiguous per segment. */
typedef struct {
    const td_layout_t *l;
    uint8_t *pool[8];           /* [nsegs] POOL_BLOCKS blocks (fixed: slots) */
    uint64_t nblocks[8];
    uint8_t *blockp[8][POOL_BLOCKS];
    uint8_t *const *segb[8];
    uint8_t *fixed[8];
    uint8_t *flat[8];           /* [nsegs] the segment's bytes, contiguous */
    td_layout_kv_t kv;
} kv_t;

static size_t
block_bytes(const td_layout_t *l, uint32_t s)
{
    const td_layout_seg_t *seg = &l->segs[s];
    return (seg->kind == TD_LAYOUT_FIXED ? seg->entries : l->block_entries) *
           (size_t)seg->entry_bytes;
}

static void
kv_create(kv_t *k, const td_layout_t *l, uint64_t ntokens, uint64_t seed)
{
    td_rng_t rng = td_rng_seed(seed);
    memset(k, 0, sizeof(*k));
    k->l = l;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        size_t bb = block_bytes(l, s);
        k->pool[s] = malloc(POOL_BLOCKS * bb);
        for (size_t i = 0; i < POOL_BLOCKS * bb; i++)   /* stale bytes everywhere */
            k->pool[s][i] = (uint8_t)td_rng_next(&rng);
        uint64_t order[POOL_BLOCKS];
        for (uint64_t b = 0; b < POOL_BLOCKS; b++)
            order[b] = b;
        for (uint64_t b = POOL_BLOCKS - 1; b > 0; b--) {
            uint64_t j = td_rng_next(&rng) % (b + 1), t = order[b];
            order[b] = order[j];
            order[j] = t;
        }
        if (seg->kind == TD_LAYOUT_FIXED) {
            k->fixed[s] = k->pool[s] + order[0] * bb;
            k->flat[s] = malloc(bb);
            continue;
        }
        k->nblocks[s] = td_layout_blocks(l, seg, ntokens);
        for (uint64_t b = 0; b < k->nblocks[s]; b++)
            k->blockp[s][b] = k->pool[s] + order[b] * bb;
        k->segb[s] = k->blockp[s];
        k->flat[s] = malloc(td_layout_seg_bytes(seg, ntokens) + 1);
    }
    k->kv = (td_layout_kv_t){ l, k->nblocks, k->segb, k->fixed };
    /* the request's bytes, written entry by entry through the view */
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        uint64_t n = td_layout_entries(seg, ntokens);
        for (uint64_t e = 0; e < n; e++) {
            uint8_t *p = td_layout_kv_entry(&k->kv, s, e);
            for (uint32_t i = 0; i < seg->entry_bytes; i++)
                p[i] = k->flat[s][e * seg->entry_bytes + i] = (uint8_t)td_rng_next(&rng);
        }
    }
}

static void
kv_destroy(kv_t *k)
{
    for (uint32_t s = 0; s < k->l->nsegs; s++) {
        free(k->pool[s]);
        free(k->flat[s]);
    }
}

/* The definition, on contiguous bytes: XXH3 per segment, then XXH3 over
 * the digests as little-endian u64. */
static uint64_t
reference_sum(const kv_t *k, uint64_t ntokens)
{
    uint8_t le[8 * 8];
    for (uint32_t s = 0; s < k->l->nsegs; s++) {
        uint64_t d = XXH3_64bits(k->flat[s], td_layout_seg_bytes(&k->l->segs[s], ntokens));
        for (int i = 0; i < 8; i++)
            le[8 * s + i] = (uint8_t)(d >> (8 * i));
    }
    return XXH3_64bits(le, 8 * (size_t)k->l->nsegs);
}

/* ---- Over memory ---------------------------------------------------------------- */

static void
test_of(void)
{
    td_layout_t *l = small_layout();
    static const uint64_t lens[] = { 0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 63, 64, 65, 200 };
    for (size_t i = 0; l && i < sizeof(lens) / sizeof(lens[0]); i++) {
        kv_t k;
        uint64_t got = 0, again = 0;
        kv_create(&k, l, lens[i], 100 + i);
        CHECK_STATUS(td_kvsum_of(&k.kv, lens[i], &got), TD_OK);
        CHECK(got == reference_sum(&k, lens[i]));
        CHECK_STATUS(td_kvsum_of(&k.kv, lens[i], &again), TD_OK);
        CHECK(again == got);
        kv_destroy(&k);
    }
    td_layout_destroy(l);
}

/* The definition pinned: both daemons of a cluster must agree, across
 * builds. Bytes (31 * s + 7 * i + 1) mod 256 for the i-th byte of segment s. */
static void
test_pinned(void)
{
    td_layout_t *l = small_layout();
    if (l == NULL)
        return;
    kv_t k;
    kv_create(&k, l, 13, 1);
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        uint64_t n = td_layout_entries(seg, 13);
        for (uint64_t e = 0; e < n; e++)
            for (uint32_t b = 0; b < seg->entry_bytes; b++)
                td_layout_kv_entry(&k.kv, s, e)[b] = k.flat[s][e * seg->entry_bytes + b] =
                    (uint8_t)(31 * s + 7 * (e * seg->entry_bytes + b) + 1);
    }
    uint64_t got = 0;
    CHECK_STATUS(td_kvsum_of(&k.kv, 13, &got), TD_OK);
    if (got != 0xfd7508a9bea27368ull)
        fprintf(stderr, "pinned sum: got %016llx\n", (unsigned long long)got);
    CHECK(got == 0xfd7508a9bea27368ull);
    CHECK(got == reference_sum(&k, 13));
    kv_destroy(&k);
    td_layout_destroy(l);
}

/* What it covers: a flipped byte of any entry of the prompt changes the
 * sum; bytes after the last entry (in its block, or in blocks past the
 * prompt's) do not count. */
static void
test_coverage(void)
{
    td_layout_t *l = small_layout();
    if (l == NULL)
        return;
    const uint64_t n = 37;
    kv_t k;
    kv_create(&k, l, n, 7);
    uint64_t base = 0, got = 0;
    CHECK_STATUS(td_kvsum_of(&k.kv, n, &base), TD_OK);
    td_rng_t rng = td_rng_seed(99);
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        uint64_t entries = td_layout_entries(seg, n);
        for (int trial = 0; trial < 20; trial++) {
            uint64_t e = td_rng_next(&rng) % entries;
            uint32_t b = (uint32_t)(td_rng_next(&rng) % seg->entry_bytes);
            uint8_t *p = td_layout_kv_entry(&k.kv, s, e) + b;
            uint8_t bit = (uint8_t)(1u << (td_rng_next(&rng) % 8));
            *p ^= bit;
            CHECK_STATUS(td_kvsum_of(&k.kv, n, &got), TD_OK);
            CHECK(got != base);
            *p ^= bit;
        }
        if (seg->kind != TD_LAYOUT_PAGED)
            continue;
        /* past the prompt's entries, inside the last block */
        if (entries % BLOCK_ENTRIES != 0) {
            td_layout_kv_entry(&k.kv, s, entries)[0] ^= 1;
            CHECK_STATUS(td_kvsum_of(&k.kv, n, &got), TD_OK);
            CHECK(got == base);
        }
    }
    /* swapping two blocks of a segment is a change too */
    uint8_t *const *b = k.kv.blocks[0];
    uint8_t *swapped[POOL_BLOCKS];
    memcpy(swapped, b, k.nblocks[0] * sizeof(*swapped));
    swapped[0] = b[1];
    swapped[1] = b[0];
    k.segb[0] = swapped;
    CHECK_STATUS(td_kvsum_of(&k.kv, n, &got), TD_OK);
    CHECK(got != base);
    k.segb[0] = b;
    /* too few blocks for the prompt */
    k.nblocks[2]--;
    CHECK_STATUS(td_kvsum_of(&k.kv, n, &got), TD_ERR_RANGE);
    k.nblocks[2]++;
    /* the fixed slot is whole whatever the prompt */
    CHECK_STATUS(td_kvsum_of(&k.kv, n, &got), TD_OK);
    CHECK(got == base);
    kv_destroy(&k);
    td_layout_destroy(l);
}

/* ---- Piece by piece --------------------------------------------------------------- */

/* As a prefill rank produces them: the prompt in chunks of random size; per
 * chunk, layer by layer, the paged entries the chunk completed (cut at
 * random into several pieces), and on every chunk each fixed segment whole
 * (earlier chunks with other bytes: only the last one counts, as in the
 * decode rank's slot). */
static uint64_t
stream_sum(const kv_t *k, uint64_t n, uint64_t seed, td_status_t *st)
{
    const td_layout_t *l = k->l;
    td_rng_t rng = td_rng_seed(seed);
    td_kvsum_t *s = NULL;
    uint64_t out = 0;
    char why[160];
    uint8_t junk[256];
    *st = td_kvsum_create(l, &s);
    if (*st != TD_OK)
        return 0;
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)td_rng_next(&rng);
    for (uint64_t n0 = 0; n0 < n;) {
        uint64_t n1 = n0 + 1 + td_rng_next(&rng) % 23;
        if (n1 > n)
            n1 = n;
        for (uint32_t layer = 0; layer < l->layers; layer++) {
            for (uint32_t si = 0; si < l->nsegs; si++) {
                const td_layout_seg_t *seg = &l->segs[si];
                if (seg->layer != layer)
                    continue;
                if (seg->kind == TD_LAYOUT_FIXED) {
                    const void *bytes = n1 == n ? (const void *)k->flat[si] : junk;
                    CHECK_STATUS(td_kvsum_update(s, si, 0, seg->entries, bytes), TD_OK);
                    continue;
                }
                uint64_t e = td_layout_entries(seg, n0), end = td_layout_entries(seg, n1);
                while (e < end) {
                    uint64_t c = 1 + td_rng_next(&rng) % (end - e);
                    CHECK_STATUS(td_kvsum_update(s, si, e, c,
                                                 k->flat[si] + e * seg->entry_bytes), TD_OK);
                    e += c;
                }
            }
        }
        n0 = n1;
    }
    *st = td_kvsum_final(s, n, &out, why, sizeof(why));
    if (*st != TD_OK)
        fprintf(stderr, "stream_sum: %s\n", why);
    td_kvsum_destroy(s);
    return out;
}

static void
test_stream(void)
{
    td_layout_t *l = small_layout();
    static const uint64_t lens[] = { 1, 2, 3, 8, 9, 31, 64, 129, 200 };
    for (size_t i = 0; l && i < sizeof(lens) / sizeof(lens[0]); i++) {
        kv_t k;
        uint64_t want = 0;
        kv_create(&k, l, lens[i], 300 + i);
        CHECK_STATUS(td_kvsum_of(&k.kv, lens[i], &want), TD_OK);
        for (uint64_t cut = 0; cut < 6; cut++) {
            td_status_t st;
            uint64_t got = stream_sum(&k, lens[i], 1000 * i + cut, &st);
            CHECK_STATUS(st, TD_OK);
            CHECK(got == want);
        }
        kv_destroy(&k);
    }
    td_layout_destroy(l);
}

/* The released V4.1 layout (defaults): streamed and in scattered blocks agree. */
static void
test_v41_layout(void)
{
    td_layout_config_t cfg;
    td_layout_t *l = NULL;
    CHECK_STATUS(td_layout_config_defaults(&cfg), TD_OK);
    CHECK_STATUS(td_layout_create(&cfg, &l), TD_OK);
    td_layout_config_free(&cfg);
    if (l == NULL)
        return;
    const uint64_t n = 333;
    size_t ns = l->nsegs;
    uint64_t *nblocks = calloc(ns, sizeof(*nblocks));
    uint8_t *const **segb = calloc(ns, sizeof(*segb));
    uint8_t **fixed = calloc(ns, sizeof(*fixed));
    uint8_t ***blocks = calloc(ns, sizeof(*blocks));
    td_kvsum_t *s = NULL;
    td_rng_t rng = td_rng_seed(41);
    CHECK_STATUS(td_kvsum_create(l, &s), TD_OK);
    for (uint32_t i = 0; s && i < ns; i++) {
        const td_layout_seg_t *seg = &l->segs[i];
        size_t bytes = td_layout_seg_bytes(seg, n);
        uint8_t *flat = malloc(bytes ? bytes : 1);
        for (size_t b = 0; b < bytes; b++)
            flat[b] = (uint8_t)td_rng_next(&rng);
        if (seg->kind == TD_LAYOUT_FIXED) {
            fixed[i] = flat;
            CHECK_STATUS(td_kvsum_update(s, i, 0, seg->entries, flat), TD_OK);
            continue;
        }
        /* blocks allocated one by one, in reverse: nothing is contiguous */
        nblocks[i] = td_layout_blocks(l, seg, n);
        blocks[i] = calloc(nblocks[i] ? nblocks[i] : 1, sizeof(**blocks));
        for (uint64_t b = nblocks[i]; b-- > 0;)
            blocks[i][b] = calloc(l->block_entries, seg->entry_bytes);
        segb[i] = blocks[i];
        uint64_t entries = td_layout_entries(seg, n);
        for (uint64_t e = 0; e < entries; e++)
            memcpy(blocks[i][e / l->block_entries] + e % l->block_entries * seg->entry_bytes,
                   flat + e * seg->entry_bytes, seg->entry_bytes);
        CHECK_STATUS(td_kvsum_update(s, i, 0, entries / 2, flat), TD_OK);
        CHECK_STATUS(td_kvsum_update(s, i, entries / 2, entries - entries / 2,
                                     flat + entries / 2 * seg->entry_bytes), TD_OK);
        free(flat);
    }
    td_layout_kv_t kv = { l, nblocks, segb, fixed };
    uint64_t a = 0, b = 1;
    char why[160];
    CHECK_STATUS(td_kvsum_of(&kv, n, &a), TD_OK);
    if (s != NULL)
        CHECK_STATUS(td_kvsum_final(s, n, &b, why, sizeof(why)), TD_OK);
    CHECK(a == b);
    td_kvsum_destroy(s);
    for (uint32_t i = 0; i < ns; i++) {
        for (uint64_t k = 0; blocks[i] && k < nblocks[i]; k++)
            free(blocks[i][k]);
        free(blocks[i]);
        free(fixed[i]);
    }
    free(blocks);
    free(fixed);
    free(segb);
    free(nblocks);
    td_layout_destroy(l);
}

/* Updates that do not fit, and sums that are not whole: refused with the
 * segment named; a refusal sticks. */
static void
test_refusals(void)
{
    td_layout_t *l = small_layout();
    if (l == NULL)
        return;
    uint8_t bytes[1024] = { 0 };
    char why[160];
    uint64_t out = 0;
    td_kvsum_t *s;
    typedef struct {
        uint32_t seg;
        uint64_t first, count;
    } upd_t;
    static const struct {
        upd_t bad;
        const char *names;
    } cases[] = {
        { { 0, 1, 2 }, "L0.kv" },        /* a gap at the start */
        { { 1, 0, 4 }, "L0.window" },    /* a fixed segment not whole */
        { { 1, 1, 5 }, "L0.window" },
        { { 2, 0, 0 }, "L1.kv" },        /* nothing */
        { { 9, 0, 1 }, "outside" },      /* no such segment */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CHECK_STATUS(td_kvsum_create(l, &s), TD_OK);
        if (s == NULL)
            continue;
        CHECK_STATUS(td_kvsum_update(s, cases[i].bad.seg, cases[i].bad.first,
                                     cases[i].bad.count, bytes), TD_ERR_RANGE);
        CHECK_STATUS(td_kvsum_update(s, 0, 0, 1, bytes), TD_ERR_RANGE);   /* it sticks */
        CHECK_STATUS(td_kvsum_final(s, 0, &out, why, sizeof(why)), TD_ERR_RANGE);
        CHECK(strstr(why, cases[i].names) != NULL);
        td_kvsum_destroy(s);
    }
    /* in order, then a repeat and a skip */
    CHECK_STATUS(td_kvsum_create(l, &s), TD_OK);
    if (s != NULL) {
        CHECK_STATUS(td_kvsum_update(s, 0, 0, 3, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_update(s, 0, 3, 2, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_update(s, 0, 4, 1, bytes), TD_ERR_RANGE);
        td_kvsum_destroy(s);
    }
    /* whole updates, but not what the prompt needs */
    CHECK_STATUS(td_kvsum_create(l, &s), TD_OK);
    if (s != NULL) {
        CHECK_STATUS(td_kvsum_update(s, 0, 0, 10, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_update(s, 2, 0, 5, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_update(s, 3, 0, 5, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_update(s, 4, 0, 1, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_final(s, 10, &out, why, sizeof(why)), TD_ERR_RANGE);
        CHECK(strstr(why, "L0.window") != NULL && strstr(why, "never") != NULL);
        CHECK_STATUS(td_kvsum_update(s, 1, 0, 5, bytes), TD_OK);
        CHECK_STATUS(td_kvsum_final(s, 10, &out, why, sizeof(why)), TD_OK);
        CHECK_STATUS(td_kvsum_final(s, 11, &out, why, sizeof(why)), TD_ERR_RANGE);
        CHECK(strstr(why, "L0.kv") != NULL);
        CHECK_STATUS(td_kvsum_final(s, 12, &out, why, sizeof(why)), TD_ERR_RANGE);
        td_kvsum_destroy(s);
    }
    td_layout_destroy(l);
}

int
main(void)
{
    test_of();
    test_pinned();
    test_coverage();
    test_stream();
    test_v41_layout();
    test_refusals();
    return td_check_exit("test_kvsum");
}
