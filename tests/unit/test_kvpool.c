/* tests/unit/test_kvpool.c — KV block accounting (engine/kvpool.c): pool
 * geometry from the layout, all-or-nothing reservations, block states,
 * counters, the used + free == total invariant under random churn, FIFO
 * reuse of freed blocks, the view of a reservation's blocks in the pool's
 * memory, and blocks shared by reference (a prefix cache's hold, prefix
 * reservations). */
#include "kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"

/* Block = 4 entries. seg 0: paged ratio 1, 8 B; seg 1: paged ratio 2, 4 B;
 * seg 2: fixed ring of 3 slots × 16 B. */
static td_layout_t *
small_layout(void)
{
    td_layout_seg_t segs[3] = {
        { .name = "L0.kv", .kind = TD_LAYOUT_PAGED, .dtype = TD_LAYOUT_U8, .layer = 0,
          .ratio = 1, .entries = 0, .entry_bytes = 8 },
        { .name = "L0.index", .kind = TD_LAYOUT_PAGED, .dtype = TD_LAYOUT_U8, .layer = 0,
          .ratio = 2, .entries = 0, .entry_bytes = 4 },
        { .name = "L0.window", .kind = TD_LAYOUT_FIXED, .dtype = TD_LAYOUT_U8, .layer = 0,
          .ratio = 1, .entries = 3, .entry_bytes = 16 },
    };
    td_layout_t *l = NULL;
    CHECK_STATUS(td_layout_create_from(1, 4, segs, 3, &l), TD_OK);
    return l;
}

static void
test_geometry(const td_layout_t *l)
{
    td_kvpool_t *kp = NULL;
    CHECK_STATUS(td_kvpool_create(l, 0, 2, &kp), TD_ERR_INVALID);
    CHECK_STATUS(td_kvpool_create(l, 64, 0, &kp), TD_ERR_INVALID);
    CHECK_STATUS(td_kvpool_create(l, 64, 2, &kp), TD_OK);
    if (kp == NULL)
        return;
    CHECK_EQ_INT(td_kvpool_seg_nblocks(kp, 0), 16);      /* 64 entries / 4 */
    CHECK_EQ_INT(td_kvpool_seg_nblocks(kp, 1), 8);       /* 32 entries / 4 */
    CHECK_EQ_INT(td_kvpool_seg_nblocks(kp, 2), 2);       /* the slots */
    CHECK_EQ_INT(td_kvpool_seg_block_bytes(kp, 0), 32);
    CHECK_EQ_INT(td_kvpool_seg_block_bytes(kp, 1), 16);
    CHECK_EQ_INT(td_kvpool_seg_block_bytes(kp, 2), 48);
    td_kvpool_counts_t c;
    td_kvpool_counts(kp, &c);
    CHECK_EQ_INT(c.blocks_total, 26);
    CHECK_EQ_INT(c.blocks_used, 0);
    CHECK_EQ_INT(c.blocks_free, 26);
    CHECK_EQ_INT(c.tokens_total, 64);
    CHECK_EQ_INT(c.tokens_free, 64);
    CHECK_EQ_INT(c.slots_total, 2);
    td_kvpool_destroy(kp);
}

static void
test_reserve_release(const td_layout_t *l)
{
    td_kvpool_t *kp = NULL;
    CHECK_STATUS(td_kvpool_create(l, 64, 2, &kp), TD_OK);
    if (kp == NULL)
        return;
    const char *why = NULL;
    td_kvpool_res_t *a = NULL, *b = NULL, *c = NULL;
    /* 10 tokens: seg 0 ceil(10/4) = 3 blocks, seg 1 ceil(5/4) = 2, one slot. */
    CHECK_STATUS(td_kvpool_reserve(kp, 7, 10, &a, &why), TD_OK);
    if (a == NULL)
        goto out;
    CHECK_EQ_INT(a->nblocks[0], 3);
    CHECK_EQ_INT(a->nblocks[1], 2);
    CHECK_EQ_INT(a->nblocks[2], 1);
    CHECK_EQ_INT(a->blocks[2][0], a->slot);
    for (uint32_t s = 0; s < 3; s++)
        for (uint64_t i = 0; i < a->nblocks[s]; i++)
            CHECK_EQ_INT(td_kvpool_block_owner(kp, s, a->blocks[s][i]), 7);
    td_kvpool_counts_t cnt;
    td_kvpool_counts(kp, &cnt);
    CHECK_EQ_INT(cnt.blocks_used, 6);
    CHECK_EQ_INT(cnt.blocks_free, 20);
    CHECK_EQ_INT(cnt.tokens_used, 10);
    CHECK_EQ_INT(cnt.tokens_free, 48);     /* seg 1: 6 blocks × 4 entries × 2 tokens */
    CHECK_EQ_INT(cnt.slots_used, 1);
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);

    /* Too many tokens for seg 0: nothing reserved. */
    CHECK_STATUS(td_kvpool_reserve(kp, 8, 50, &b, &why), TD_ERR_BUSY);
    CHECK(b == NULL);
    CHECK(why != NULL && strstr(why, "blocks") != NULL);
    td_kvpool_counts(kp, &cnt);
    CHECK_EQ_INT(cnt.blocks_used, 6);
    CHECK_EQ_INT(cnt.slots_used, 1);

    /* The rest fits exactly; then no slot is left. */
    CHECK_STATUS(td_kvpool_reserve(kp, 8, 48, &b, &why), TD_OK);
    CHECK(b != NULL && b->slot != a->slot);
    td_kvpool_counts(kp, &cnt);
    CHECK_EQ_INT(cnt.tokens_free, 0);
    CHECK_STATUS(td_kvpool_reserve(kp, 9, 1, &c, &why), TD_ERR_BUSY);
    CHECK(why != NULL && strstr(why, "slot") != NULL);

    td_kvpool_release(kp, a);
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);
    if (b != NULL) {
        CHECK_EQ_INT(td_kvpool_block_owner(kp, 2, b->slot), 8);
        td_kvpool_release(kp, b);
    }
    td_kvpool_counts(kp, &cnt);
    CHECK_EQ_INT(cnt.blocks_used, 0);
    CHECK_EQ_INT(cnt.tokens_used, 0);
    CHECK_EQ_INT(cnt.slots_used, 0);
    CHECK_EQ_INT(cnt.tokens_free, 64);
    for (uint64_t i = 0; i < 16; i++)
        CHECK_EQ_INT(td_kvpool_block_owner(kp, 0, i), 0);
out:
    td_kvpool_destroy(kp);
}

/* Random reserve/release; every block owned by exactly its reservation. */
static void
test_churn(const td_layout_t *l)
{
    enum { SLOTS = 8, ROUNDS = 4000 };
    td_kvpool_t *kp = NULL;
    CHECK_STATUS(td_kvpool_create(l, 200, SLOTS, &kp), TD_OK);
    if (kp == NULL)
        return;
    td_kvpool_res_t *live[SLOTS] = { 0 };
    uint64_t blocks = 0, tokens = 0;
    td_rng_t rng = td_rng_seed(42);
    for (int r = 0; r < ROUNDS; r++) {
        int i = (int)(td_rng_next(&rng) % SLOTS);
        if (live[i] != NULL) {
            for (uint32_t s = 0; s < 3; s++)
                for (uint64_t k = 0; k < live[i]->nblocks[s]; k++)
                    CHECK_EQ_INT(td_kvpool_block_owner(kp, s, live[i]->blocks[s][k]),
                                 (uint64_t)i + 100);
            for (uint32_t s = 0; s < 3; s++)
                blocks -= live[i]->nblocks[s];
            tokens -= live[i]->ntokens;
            td_kvpool_release(kp, live[i]);
            live[i] = NULL;
        } else {
            const char *why;
            uint64_t n = 1 + td_rng_next(&rng) % 90;
            if (td_kvpool_reserve(kp, (uint64_t)i + 100, n, &live[i], &why) == TD_OK) {
                for (uint32_t s = 0; s < 3; s++)
                    blocks += live[i]->nblocks[s];
                tokens += n;
            }
        }
        td_kvpool_counts_t c;
        td_kvpool_counts(kp, &c);
        CHECK_EQ_INT(c.blocks_used, blocks);
        CHECK_EQ_INT(c.tokens_used, tokens);
        CHECK_EQ_INT(c.blocks_used + c.blocks_free, c.blocks_total);
        if (r % 97 == 0)
            CHECK_STATUS(td_kvpool_check(kp), TD_OK);
    }
    for (int i = 0; i < SLOTS; i++)
        if (live[i] != NULL)
            td_kvpool_release(kp, live[i]);
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);
    td_kvpool_destroy(kp);
}

/* Freed blocks and slots are reused oldest-freed first: a request reserved
 * right after another's release gets none of its blocks while older free
 * ones exist (a late write would otherwise land in exactly the next request). */
static void
test_fifo_reuse(const td_layout_t *l)
{
    td_kvpool_t *kp = NULL;
    CHECK_STATUS(td_kvpool_create(l, 64, 3, &kp), TD_OK);
    if (kp == NULL)
        return;
    const char *why;
    td_kvpool_res_t *a = NULL, *b = NULL, *c = NULL;
    CHECK_STATUS(td_kvpool_reserve(kp, 1, 16, &a, &why), TD_OK);
    CHECK_STATUS(td_kvpool_reserve(kp, 2, 16, &b, &why), TD_OK);
    if (a == NULL || b == NULL)
        goto out;
    uint64_t a_blocks[2][8], a_n[2], a_slot = a->slot;
    for (uint32_t s = 0; s < 2; s++) {
        a_n[s] = a->nblocks[s];
        CHECK(a_n[s] <= 8);
        memcpy(a_blocks[s], a->blocks[s], a_n[s] * sizeof(uint64_t));
    }
    td_kvpool_release(kp, a);
    CHECK_STATUS(td_kvpool_reserve(kp, 3, 16, &c, &why), TD_OK);
    if (c == NULL)
        goto out;
    CHECK(c->slot != a_slot);
    for (uint32_t s = 0; s < 2; s++)
        for (uint64_t i = 0; i < c->nblocks[s]; i++)
            for (uint64_t k = 0; k < a_n[s]; k++)
                CHECK(c->blocks[s][i] != a_blocks[s][k]);
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);
out:
    if (b != NULL)
        td_kvpool_release(kp, b);
    if (c != NULL)
        td_kvpool_release(kp, c);
    td_kvpool_destroy(kp);
}

/* The V4.1 default layout: 8 paged segments (ratios 2, 2, 2, 1). */
static void
test_default_layout(void)
{
    td_layout_config_t cfg;
    td_layout_t *l = NULL;
    td_kvpool_t *kp = NULL;
    CHECK_STATUS(td_layout_config_defaults(&cfg), TD_OK);
    CHECK_STATUS(td_layout_create(&cfg, &l), TD_OK);
    if (l == NULL)
        goto out_cfg;
    CHECK_STATUS(td_kvpool_create(l, 4096, 4, &kp), TD_OK);
    if (kp == NULL)
        goto out_layout;
    const td_layout_seg_t *kv20 = td_layout_find(l, "L20.kv");
    const td_layout_seg_t *kv2 = td_layout_find(l, "L2.kv");
    CHECK(kv20 != NULL && kv2 != NULL);
    if (kv20 != NULL && kv2 != NULL) {
        CHECK_EQ_INT(td_kvpool_seg_nblocks(kp, (uint32_t)(kv20 - l->segs)), 64);
        CHECK_EQ_INT(td_kvpool_seg_nblocks(kp, (uint32_t)(kv2 - l->segs)), 32);
        CHECK_EQ_INT(td_kvpool_seg_block_bytes(kp, (uint32_t)(kv2 - l->segs)), 64 * 288);
    }
    const char *why;
    td_kvpool_res_t *res = NULL;
    CHECK_STATUS(td_kvpool_reserve(kp, 1, 4096, &res, &why), TD_OK);
    td_kvpool_counts_t c;
    td_kvpool_counts(kp, &c);
    CHECK_EQ_INT(c.tokens_free, 0);
    if (res != NULL)
        td_kvpool_release(kp, res);
    td_kvpool_counts(kp, &c);
    CHECK_EQ_INT(c.blocks_used, 0);
    CHECK_EQ_INT(c.tokens_free, 4096);
    td_kvpool_destroy(kp);
out_layout:
    td_layout_destroy(l);
out_cfg:
    td_layout_config_free(&cfg);
}

/* With memory, a reservation carries the view of its blocks and slot: entry
 * e of a paged segment lies in its (scattered) block, the capacity matches the
 * tokens reserved, and the views of two reservations never overlap. */
static void
test_view(const td_layout_t *l)
{
    td_kvpool_t *kp = NULL;
    uint8_t *mem[3];
    const char *why;
    td_kvpool_res_t *a = NULL, *b = NULL, *c = NULL;

    CHECK_STATUS(td_kvpool_create(l, 64, 3, &kp), TD_OK);
    if (kp == NULL)
        return;
    for (uint32_t s = 0; s < 3; s++)
        mem[s] = calloc(td_kvpool_seg_nblocks(kp, s), td_kvpool_seg_block_bytes(kp, s));
    td_kvpool_set_memory(kp, mem);
    CHECK_STATUS(td_kvpool_reserve(kp, 1, 6, &a, &why), TD_OK);   /* blocks 0-1 of seg 0 */
    CHECK_STATUS(td_kvpool_reserve(kp, 2, 9, &b, &why), TD_OK);
    td_kvpool_release(kp, a);   /* freed blocks go to the back: c gets scattered ones */
    CHECK_STATUS(td_kvpool_reserve(kp, 3, 20, &c, &why), TD_OK);
    if (b == NULL || c == NULL)
        goto out;
    CHECK(c->kv.layout == l);
    /* seg 0 (ratio 1): 5 blocks hold 20 tokens; seg 1 (ratio 2): 3 blocks, 25 */
    CHECK_EQ_INT(td_layout_kv_capacity(&c->kv), 20);
    for (uint32_t s = 0; s < 3; s++) {
        uint64_t bb = td_kvpool_seg_block_bytes(kp, s);
        if (l->segs[s].kind == TD_LAYOUT_FIXED) {
            CHECK(c->kv.fixed[s] == mem[s] + c->slot * bb);
            CHECK(c->kv.nblocks[s] == 0);
            continue;
        }
        CHECK_EQ_INT(c->kv.nblocks[s], c->nblocks[s]);
        for (uint64_t e = 0; e < c->nblocks[s] * 4; e++) {
            uint8_t *p = td_layout_kv_entry(&c->kv, s, e);
            CHECK(p == mem[s] + c->blocks[s][e / 4] * bb + (e % 4) * l->segs[s].entry_bytes);
            /* no entry of c is in b's blocks */
            for (uint64_t k = 0; k < b->nblocks[s]; k++)
                CHECK(!(p >= mem[s] + b->blocks[s][k] * bb && p < mem[s] + (b->blocks[s][k] + 1) * bb));
        }
    }
    td_kvpool_release(kp, b);
    td_kvpool_release(kp, c);
out:
    td_kvpool_destroy(kp);
    for (uint32_t s = 0; s < 3; s++)
        free(mem[s]);
}

/* A prefix cache's blocks: held past their reservation, shared by later
 * reservations, free only when the last holder lets go. */
static void
test_shared(const td_layout_t *l)
{
    td_kvpool_t *kp = NULL;
    td_kvpool_res_t *a = NULL, *b = NULL, *c = NULL;
    td_kvpool_counts_t n;
    const char *why = NULL;

    CHECK_STATUS(td_kvpool_create(l, 32, 3, &kp), TD_OK);   /* seg 0: 8 blocks, seg 1: 4 */
    if (kp == NULL)
        return;
    /* a: 16 tokens = 4 + 2 blocks; the cache holds the first 2 + 1 */
    CHECK_STATUS(td_kvpool_reserve(kp, 1, 16, &a, &why), TD_OK);
    td_kvpool_hold(kp, 0, a->blocks[0][0]);
    td_kvpool_hold(kp, 0, a->blocks[0][1]);
    td_kvpool_hold(kp, 1, a->blocks[1][0]);
    CHECK_EQ_INT(td_kvpool_block_refs(kp, 0, a->blocks[0][0]), 2);
    uint64_t h0[2] = { a->blocks[0][0], a->blocks[0][1] }, h1[1] = { a->blocks[1][0] };
    td_kvpool_release(kp, a);
    td_kvpool_counts(kp, &n);
    CHECK_EQ_INT(n.blocks_used, 3);   /* the held ones stay */
    CHECK_EQ_INT(n.blocks_held, 3);
    CHECK_EQ_INT(td_kvpool_block_owner(kp, 0, h0[0]), 1);   /* still the first taker's */
    CHECK_EQ_INT(td_kvpool_seg_free(kp, 0), 6);
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);
    /* b and c share them: 24 tokens = 6 + 3 blocks, 2 + 1 of them shared */
    uint64_t np[3] = { 2, 1, 0 };
    const uint64_t *pp[3] = { h0, h1, NULL };
    CHECK_STATUS(td_kvpool_reserve_prefix(kp, 2, 24, np, pp, &b, &why), TD_OK);
    CHECK_STATUS(td_kvpool_reserve_prefix(kp, 3, 16, np, pp, &c, &why), TD_OK);
    if (b == NULL || c == NULL)
        goto out;
    CHECK_EQ_INT(b->blocks[0][0], h0[0]);
    CHECK_EQ_INT(b->blocks[0][1], h0[1]);
    CHECK_EQ_INT(b->blocks[1][0], h1[0]);
    CHECK(b->blocks[0][2] != h0[0] && b->blocks[0][2] != h0[1]);
    CHECK_EQ_INT(td_kvpool_block_refs(kp, 0, h0[0]), 3);
    CHECK_EQ_INT(td_kvpool_seg_free(kp, 0), 0);   /* 8 - 2 held - 4 b - 2 c */
    /* not enough fresh blocks: nothing taken */
    td_kvpool_res_t *d = NULL;
    CHECK_STATUS(td_kvpool_reserve_prefix(kp, 4, 12, np, pp, &d, &why), TD_ERR_BUSY);
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);
    /* the cache lets go while b and c still read them: they stay */
    td_kvpool_unhold(kp, 0, h0[0]);
    td_kvpool_unhold(kp, 0, h0[1]);
    td_kvpool_unhold(kp, 1, h1[0]);
    CHECK_EQ_INT(td_kvpool_block_refs(kp, 0, h0[0]), 2);
    td_kvpool_release(kp, b);
    CHECK_EQ_INT(td_kvpool_block_refs(kp, 0, h0[0]), 1);
    td_kvpool_release(kp, c);
    td_kvpool_counts(kp, &n);
    CHECK_EQ_INT(n.blocks_used, 0);
    CHECK_EQ_INT(n.blocks_held, 0);
    CHECK_EQ_INT(td_kvpool_seg_free(kp, 0), 8);
    CHECK_EQ_INT(td_kvpool_block_owner(kp, 0, h0[0]), 0);
out:
    CHECK_STATUS(td_kvpool_check(kp), TD_OK);
    td_kvpool_destroy(kp);
}

int
main(void)
{
    td_layout_t *l = small_layout();
    if (l != NULL) {
        test_shared(l);
        test_geometry(l);
        test_reserve_release(l);
        test_churn(l);
        test_fifo_reuse(l);
        test_view(l);
        td_layout_destroy(l);
    }
    test_default_layout();
    return td_check_exit("test_kvpool");
}
