/* tests/unit/test_kvmem.c — engine/kvmem: a request's KV memory for a layout
 * and a token count (capacity, blocks and slots that do not overlap, a
 * shuffled order that really scatters them), a request's state packed,
 * unpacked and copied between views of different orders, and the guards
 * that catch a write past a block. */
#include "check.h"
#include "kvmem.h"
#include "layout.h"
#include "logcap.h"
#include "rng.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Ratios 1, 2 and 3, blocks of 4 entries, rings of several sizes. */
static td_layout_t *
small_layout(void)
{
    td_layout_config_t cfg;
    td_layout_t *l = NULL;

    CHECK_STATUS(td_layout_config_defaults(&cfg), TD_OK);
    free(cfg.kv_sources);
    cfg.kv_sources = strdup("1:2,3:1,4:3");
    cfg.layers = 6;
    cfg.kv_entry_bytes = 37;
    cfg.index_entry_bytes = 12;
    cfg.window = 5;
    cfg.window_entry_bytes = 20;
    cfg.partial_entry_bytes = 9;
    cfg.block_entries = 4;
    CHECK_STATUS(td_layout_create(&cfg, &l), TD_OK);
    td_layout_config_free(&cfg);
    return l;
}

/* Every byte of the state after n tokens set from a keyed stream. */
static void
fill_state(const td_layout_kv_t *kv, uint64_t n, uint64_t key)
{
    const td_layout_t *l = kv->layout;

    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];
        uint64_t count = td_layout_entries(sg, n);

        for (uint64_t e = 0; e < count; e++) {
            unsigned char *p = td_layout_kv_entry(kv, s, e);

            for (uint32_t b = 0; b < sg->entry_bytes; b++)
                p[b] = (unsigned char)td_rng_mix64(key + ((uint64_t)s << 40) + (e << 12) + b);
        }
    }
}

/* The blocks and slots of a view, as [start, end) pairs: none overlaps. */
static int
no_overlap(const td_layout_kv_t *kv)
{
    const td_layout_t *l = kv->layout;
    size_t n = 0, cap = 0;
    unsigned char **lo = NULL, **hi = NULL;
    int ok = 1;

    for (uint32_t s = 0; s < l->nsegs; s++)
        cap += l->segs[s].kind == TD_LAYOUT_PAGED ? kv->nblocks[s] : 1;
    lo = calloc(cap + 1, sizeof(*lo));
    hi = calloc(cap + 1, sizeof(*hi));
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];

        if (sg->kind == TD_LAYOUT_FIXED) {
            lo[n] = kv->fixed[s];
            hi[n++] = kv->fixed[s] + (size_t)sg->entries * sg->entry_bytes;
            continue;
        }
        for (uint64_t b = 0; b < kv->nblocks[s]; b++) {
            lo[n] = kv->blocks[s][b];
            hi[n++] = kv->blocks[s][b] + (size_t)l->block_entries * sg->entry_bytes;
        }
    }
    for (size_t i = 0; i < n && ok; i++)
        for (size_t j = 0; j < i; j++)
            if (lo[i] < hi[j] && lo[j] < hi[i])
                ok = 0;
    free(lo);
    free(hi);
    return ok;
}

/* Somewhere a segment's block b + 1 lies before its block b, or another
 * segment's block lies between them. */
static int
scattered(const td_layout_kv_t *kv)
{
    const td_layout_t *l = kv->layout;
    int back = 0;

    for (uint32_t s = 0; s < l->nsegs; s++)
        for (uint64_t b = 1; l->segs[s].kind == TD_LAYOUT_PAGED && b < kv->nblocks[s]; b++)
            back += kv->blocks[s][b] < kv->blocks[s][b - 1];
    return back > 0;
}

static void
test_kvmem(void)
{
    td_layout_t *l = small_layout();
    td_kvmem_t *a = NULL, *b = NULL, *c = NULL;
    enum { N = 101 };
    uint64_t bytes;
    unsigned char *packed = NULL, *packed2 = NULL;

    if (l == NULL)
        return;
    CHECK_STATUS(td_kvmem_create(l, N, 0, &a), TD_OK);
    CHECK_STATUS(td_kvmem_create(l, N, 7, &b), TD_OK);
    CHECK_STATUS(td_kvmem_create(l, N + 30, 8, &c), TD_OK);
    if (a == NULL || b == NULL || c == NULL)
        goto out;
    CHECK(td_layout_kv_capacity(&a->kv) >= N);
    CHECK(td_layout_kv_capacity(&c->kv) >= N + 30);
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];

        if (sg->kind == TD_LAYOUT_PAGED) {
            CHECK_EQ_INT(a->kv.nblocks[s], td_layout_blocks(l, sg, N));
            CHECK(a->kv.fixed[s] == NULL);
        } else {
            CHECK(a->kv.fixed[s] != NULL);
            for (uint32_t i = 0; i < sg->entries * sg->entry_bytes; i++)
                CHECK_EQ_INT(a->kv.fixed[s][i], 0);
        }
    }
    CHECK(no_overlap(&a->kv) && no_overlap(&b->kv) && no_overlap(&c->kv));
    CHECK(!scattered(&a->kv));
    CHECK(scattered(&b->kv) && scattered(&c->kv));

    /* pack = unpack = copy, across orders and capacities */
    bytes = td_kvmem_state_bytes(l, N);
    /* sources 1:2, 3:1, 4:3 of 37 + 12 B: 50, 101 and 33 entries */
    CHECK_EQ_INT(bytes, td_layout_fixed_bytes(l) + 49 * (50 + 101 + 33));
    packed = malloc(bytes);
    packed2 = malloc(bytes);
    fill_state(&a->kv, N, 42);
    td_kvmem_pack(&a->kv, N, packed);
    td_kvmem_unpack(&b->kv, N, packed);
    td_kvmem_copy(&c->kv, &b->kv, N);
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];

        for (uint64_t e = 0; e < td_layout_entries(sg, N); e++) {
            CHECK(memcmp(td_layout_kv_entry(&a->kv, s, e), td_layout_kv_entry(&b->kv, s, e),
                         sg->entry_bytes) == 0);
            CHECK(memcmp(td_layout_kv_entry(&a->kv, s, e), td_layout_kv_entry(&c->kv, s, e),
                         sg->entry_bytes) == 0);
        }
    }
    td_kvmem_pack(&c->kv, N, packed2);
    CHECK(memcmp(packed, packed2, bytes) == 0);
    CHECK_STATUS(td_kvmem_check(a), TD_OK);
    CHECK_STATUS(td_kvmem_check(b), TD_OK);
    CHECK_STATUS(td_kvmem_check(c), TD_OK);
#if !defined(__SANITIZE_ADDRESS__)   /* there the guards are poisoned: the write would stop */
    {
        uint32_t s = 0;
        while (l->segs[s].kind != TD_LAYOUT_PAGED)
            s++;
        unsigned char *end = b->kv.blocks[s][0] + (size_t)l->block_entries * l->segs[s].entry_bytes;

        end[5] ^= 1;
        td_logcap_start();
        CHECK_STATUS(td_kvmem_check(b), TD_ERR_MISMATCH);
        td_logcap_stop();
        CHECK(strstr(td_logcap.last, "5 bytes after it") != NULL);
        end[5] ^= 1;
        CHECK_STATUS(td_kvmem_check(b), TD_OK);
    }
#endif
out:
    free(packed);
    free(packed2);
    td_kvmem_destroy(a);
    td_kvmem_destroy(b);
    td_kvmem_destroy(c);
    td_layout_destroy(l);
}

int
main(void)
{
    test_kvmem();
    return td_check_exit("test_kvmem");
}
