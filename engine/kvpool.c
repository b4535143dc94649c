/* engine/kvpool.c — block accounting of a rank's KV pools: free
 * queues (FIFO) per paged segment, one slot allocator shared by the fixed
 * segments, per paged block its holders (reservations sharing it, and the
 * prefix cache's hold), counters. */
#include "kvpool.h"

#include <assert.h>
#include <stdlib.h>

#include "log.h"

typedef struct {
    uint64_t nblocks;             /* blocks in the pool (fixed: the slots) */
    uint64_t block_bytes;
    uint64_t nfree;               /* paged: entries of free[] in use */
    uint64_t free_head;           /* paged: index of the oldest free block */
    uint64_t *free;               /* paged: ring of free block ids, oldest first */
    uint32_t *refs;               /* [nblocks] paged: reservations holding it + its cache
                                     hold; 0: free */
    uint64_t *owner;              /* [nblocks] paged: the reservation that took it from
                                     the free queue (0 once only the cache holds it) */
    uint8_t *held;                /* [nblocks] paged: the prefix cache holds it */
} td_kvpool_seg_t;

struct td_kvpool_s {
    const td_layout_t *layout;
    uint8_t **bases;              /* [nsegs] the memory, or NULL */
    td_kvpool_seg_t *segs;        /* [layout->nsegs] */
    uint32_t nfixed;              /* fixed segments */
    uint32_t slots;
    uint32_t slots_used;
    uint32_t nslot_free;
    uint32_t slot_free_head;      /* index of the oldest free slot */
    uint32_t *slot_free;          /* ring of free slots, oldest first */
    const td_kvpool_res_t **slot_state; /* [slots] holder or NULL */
    uint64_t kv_tokens;
    uint64_t tokens_used;
    uint64_t blocks_total;
    uint64_t blocks_used;
    uint64_t blocks_held;         /* paged blocks the cache holds */
};

static void
kvpool_assert_totals(const td_kvpool_t *kp)
{
    uint64_t free_blocks = (uint64_t)kp->nslot_free * kp->nfixed;
    for (uint32_t s = 0; s < kp->layout->nsegs; s++)
        free_blocks += kp->segs[s].nfree;
    assert(kp->blocks_used + free_blocks == kp->blocks_total);
    assert(kp->slots_used + kp->nslot_free == kp->slots);
    (void)free_blocks;
}

td_status_t
td_kvpool_create(const td_layout_t *layout, uint64_t kv_tokens, uint32_t slots,
                 td_kvpool_t **out)
{
    if (kv_tokens == 0 || slots == 0)
        return TD_ERR_INVALID;
    td_kvpool_t *kp = calloc(1, sizeof(*kp));
    if (kp == NULL)
        return TD_ERR_NOMEM;
    kp->layout = layout;
    kp->slots = slots;
    kp->kv_tokens = kv_tokens;
    kp->segs = calloc(layout->nsegs, sizeof(*kp->segs));
    kp->slot_free = calloc(slots, sizeof(*kp->slot_free));
    kp->slot_state = calloc(slots, sizeof(*kp->slot_state));
    if (kp->segs == NULL || kp->slot_free == NULL || kp->slot_state == NULL)
        goto err_free;
    for (uint32_t i = 0; i < slots; i++)
        kp->slot_free[i] = i;   /* slot 0 first */
    kp->nslot_free = slots;
    for (uint32_t s = 0; s < layout->nsegs; s++) {
        const td_layout_seg_t *seg = &layout->segs[s];
        td_kvpool_seg_t *ps = &kp->segs[s];
        if (seg->kind == TD_LAYOUT_FIXED) {
            kp->nfixed++;
            ps->nblocks = slots;
            ps->block_bytes = td_layout_seg_bytes(seg, 0);
            kp->blocks_total += slots;
            continue;
        }
        ps->nblocks = td_layout_blocks(layout, seg, kv_tokens);
        if (ps->nblocks == 0)
            ps->nblocks = 1;
        ps->block_bytes = (uint64_t)layout->block_entries * seg->entry_bytes;
        ps->free = calloc(ps->nblocks, sizeof(*ps->free));
        ps->refs = calloc(ps->nblocks, sizeof(*ps->refs));
        ps->owner = calloc(ps->nblocks, sizeof(*ps->owner));
        ps->held = calloc(ps->nblocks, sizeof(*ps->held));
        if (ps->free == NULL || ps->refs == NULL || ps->owner == NULL || ps->held == NULL)
            goto err_free;
        for (uint64_t b = 0; b < ps->nblocks; b++)
            ps->free[b] = b;   /* block 0 first */
        ps->nfree = ps->nblocks;
        kp->blocks_total += ps->nblocks;
    }
    kvpool_assert_totals(kp);
    *out = kp;
    return TD_OK;

err_free:
    td_kvpool_destroy(kp);
    return TD_ERR_NOMEM;
}

void
td_kvpool_destroy(td_kvpool_t *kp)
{
    if (kp == NULL)
        return;
    assert(kp->blocks_used == 0);
    if (kp->segs != NULL) {
        for (uint32_t s = 0; s < kp->layout->nsegs; s++) {
            free(kp->segs[s].free);
            free(kp->segs[s].refs);
            free(kp->segs[s].owner);
            free(kp->segs[s].held);
        }
    }
    free(kp->segs);
    free(kp->bases);
    free(kp->slot_free);
    free(kp->slot_state);
    free(kp);
}

void
td_kvpool_set_memory(td_kvpool_t *kp, uint8_t *const *bases)
{
    uint8_t **b = calloc(kp->layout->nsegs, sizeof(*b));

    if (b == NULL)   /* only a view is lost: reservations then carry none */
        return;
    for (uint32_t s = 0; s < kp->layout->nsegs; s++)
        b[s] = bases[s];
    free(kp->bases);
    kp->bases = b;
}

uint64_t
td_kvpool_seg_nblocks(const td_kvpool_t *kp, uint32_t seg)
{
    assert(seg < kp->layout->nsegs);
    return kp->segs[seg].nblocks;
}

uint64_t
td_kvpool_seg_block_bytes(const td_kvpool_t *kp, uint32_t seg)
{
    assert(seg < kp->layout->nsegs);
    return kp->segs[seg].block_bytes;
}

/* Fill res->kv in the memory after res's ids (mem, sized by the caller). */
static void
kvpool_view(const td_kvpool_t *kp, td_kvpool_res_t *res, uint8_t *mem)
{
    const td_layout_t *l = kp->layout;
    uint64_t *nb = (uint64_t *)mem;
    uint8_t ***tables = (uint8_t ***)(nb + l->nsegs);
    uint8_t **fixed = (uint8_t **)(tables + l->nsegs);
    uint8_t **ptrs = fixed + l->nsegs;

    for (uint32_t s = 0; s < l->nsegs; s++) {
        uint64_t bb = kp->segs[s].block_bytes;

        if (l->segs[s].kind == TD_LAYOUT_FIXED) {
            nb[s] = 0;
            tables[s] = NULL;
            fixed[s] = kp->bases[s] + (uint64_t)res->slot * bb;
            continue;
        }
        nb[s] = res->nblocks[s];
        tables[s] = ptrs;
        fixed[s] = NULL;
        for (uint64_t i = 0; i < res->nblocks[s]; i++)
            *ptrs++ = kp->bases[s] + res->blocks[s][i] * bb;
    }
    res->kv.layout = l;
    res->kv.nblocks = nb;
    res->kv.blocks = (uint8_t *const *const *)tables;
    res->kv.fixed = fixed;
}

/* Take one reference on paged block b of segment s (from the free queue
 * when it has none). */
static void
kvpool_ref(td_kvpool_t *kp, uint32_t s, uint64_t b, uint64_t owner)
{
    td_kvpool_seg_t *ps = &kp->segs[s];

    if (ps->refs[b]++ == 0) {
        ps->owner[b] = owner;
        kp->blocks_used++;
    }
}

/* Drop one reference on paged block b of segment s; the last returns it to
 * the free queue. */
static void
kvpool_unref(td_kvpool_t *kp, uint32_t s, uint64_t b)
{
    td_kvpool_seg_t *ps = &kp->segs[s];

    assert(b < ps->nblocks && ps->refs[b] > 0);
    if (--ps->refs[b] > 0)
        return;
    ps->owner[b] = 0;
    ps->free[(ps->free_head + ps->nfree++) % ps->nblocks] = b;
    kp->blocks_used--;
}

td_status_t
td_kvpool_reserve(td_kvpool_t *kp, uint64_t owner, uint64_t ntokens, td_kvpool_res_t **out,
                  const char **why)
{
    return td_kvpool_reserve_prefix(kp, owner, ntokens, NULL, NULL, out, why);
}

td_status_t
td_kvpool_reserve_prefix(td_kvpool_t *kp, uint64_t owner, uint64_t ntokens,
                         const uint64_t *nprefix, const uint64_t *const *prefix,
                         td_kvpool_res_t **out, const char **why)
{
    const td_layout_t *l = kp->layout;
    uint64_t need_total = 0;
    if (kp->nslot_free == 0) {
        *why = "no free batch slot";
        return TD_ERR_BUSY;
    }
    for (uint32_t s = 0; s < l->nsegs; s++) {
        if (l->segs[s].kind != TD_LAYOUT_PAGED)
            continue;
        uint64_t need = td_layout_blocks(l, &l->segs[s], ntokens);
        uint64_t shared = nprefix != NULL ? nprefix[s] : 0;
        assert(shared <= need);
        for (uint64_t i = 0; i < shared; i++)
            assert(prefix[s][i] < kp->segs[s].nblocks && kp->segs[s].refs[prefix[s][i]] > 0);
        if (need - shared > kp->segs[s].nfree) {
            *why = "not enough free kv blocks";
            return TD_ERR_BUSY;
        }
        need_total += need;
    }
    /* One allocation: the header, nblocks[], blocks[] and every id array;
     * with memory also the view: its nblocks[], its block tables' heads,
     * every block pointer and the slot pointers. */
    size_t size = sizeof(td_kvpool_res_t) + l->nsegs * (sizeof(uint64_t) + sizeof(uint64_t *)) +
                  (need_total + kp->nfixed) * sizeof(uint64_t);
    if (kp->bases != NULL)
        size += l->nsegs * (sizeof(uint64_t) + sizeof(uint8_t **) + sizeof(uint8_t *)) +
                need_total * sizeof(uint8_t *);
    td_kvpool_res_t *res = calloc(1, size);
    if (res == NULL) {
        *why = "out of memory";
        return TD_ERR_NOMEM;
    }
    res->owner = owner;
    res->ntokens = ntokens;
    res->nsegs = l->nsegs;
    res->nblocks = (uint64_t *)(res + 1);
    res->blocks = (uint64_t **)(res->nblocks + l->nsegs);
    uint64_t *ids = (uint64_t *)(res->blocks + l->nsegs);

    res->slot = kp->slot_free[kp->slot_free_head];
    kp->slot_free_head = (kp->slot_free_head + 1) % kp->slots;
    kp->nslot_free--;
    assert(kp->slot_state[res->slot] == NULL);
    kp->slot_state[res->slot] = res;
    kp->slots_used++;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        td_kvpool_seg_t *ps = &kp->segs[s];
        uint64_t shared = nprefix != NULL && l->segs[s].kind == TD_LAYOUT_PAGED ? nprefix[s] : 0;
        res->blocks[s] = ids;
        if (l->segs[s].kind == TD_LAYOUT_FIXED) {
            res->nblocks[s] = 1;
            ids[0] = res->slot;
            ids++;
            continue;
        }
        res->nblocks[s] = td_layout_blocks(l, &l->segs[s], ntokens);
        for (uint64_t i = 0; i < res->nblocks[s]; i++) {
            uint64_t b;
            if (i < shared) {
                b = prefix[s][i];
            } else {
                b = ps->free[ps->free_head];
                ps->free_head = (ps->free_head + 1) % ps->nblocks;
                ps->nfree--;
                assert(ps->refs[b] == 0);
            }
            kvpool_ref(kp, s, b, owner);
            ids[i] = b;
        }
        ids += res->nblocks[s];
    }
    if (kp->bases != NULL)
        kvpool_view(kp, res, (uint8_t *)ids);
    kp->blocks_used += kp->nfixed;
    kp->tokens_used += ntokens;
    kvpool_assert_totals(kp);
    *out = res;
    return TD_OK;
}

void
td_kvpool_release(td_kvpool_t *kp, td_kvpool_res_t *res)
{
    const td_layout_t *l = kp->layout;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        if (l->segs[s].kind == TD_LAYOUT_FIXED)
            continue;
        for (uint64_t i = 0; i < res->nblocks[s]; i++)
            kvpool_unref(kp, s, res->blocks[s][i]);
    }
    assert(kp->slot_state[res->slot] == res);
    kp->slot_state[res->slot] = NULL;
    kp->slot_free[(kp->slot_free_head + kp->nslot_free++) % kp->slots] = res->slot;
    kp->slots_used--;
    assert(kp->blocks_used >= kp->nfixed && kp->tokens_used >= res->ntokens);
    kp->blocks_used -= kp->nfixed;
    kp->tokens_used -= res->ntokens;
    kvpool_assert_totals(kp);
    free(res);
}

void
td_kvpool_hold(td_kvpool_t *kp, uint32_t seg, uint64_t block)
{
    td_kvpool_seg_t *ps = &kp->segs[seg];

    assert(kp->layout->segs[seg].kind == TD_LAYOUT_PAGED && block < ps->nblocks);
    assert(ps->refs[block] > 0 && !ps->held[block]);
    ps->held[block] = 1;
    ps->refs[block]++;
    kp->blocks_held++;
}

void
td_kvpool_unhold(td_kvpool_t *kp, uint32_t seg, uint64_t block)
{
    td_kvpool_seg_t *ps = &kp->segs[seg];

    assert(kp->layout->segs[seg].kind == TD_LAYOUT_PAGED && block < ps->nblocks);
    assert(ps->held[block]);
    ps->held[block] = 0;
    kp->blocks_held--;
    kvpool_unref(kp, seg, block);
}

uint32_t
td_kvpool_block_refs(const td_kvpool_t *kp, uint32_t seg, uint64_t block)
{
    assert(kp->layout->segs[seg].kind == TD_LAYOUT_PAGED && block < kp->segs[seg].nblocks);
    return kp->segs[seg].refs[block];
}

uint64_t
td_kvpool_seg_free(const td_kvpool_t *kp, uint32_t seg)
{
    assert(seg < kp->layout->nsegs);
    return kp->layout->segs[seg].kind == TD_LAYOUT_PAGED ? kp->segs[seg].nfree
                                                         : kp->nslot_free;
}

uint8_t *
td_kvpool_block_mem(const td_kvpool_t *kp, uint32_t seg, uint64_t block)
{
    assert(seg < kp->layout->nsegs && block < kp->segs[seg].nblocks);
    return kp->bases != NULL ? kp->bases[seg] + block * kp->segs[seg].block_bytes : NULL;
}

void
td_kvpool_counts(const td_kvpool_t *kp, td_kvpool_counts_t *out)
{
    const td_layout_t *l = kp->layout;
    uint64_t fits = kp->nslot_free ? kp->kv_tokens : 0;
    for (uint32_t s = 0; s < l->nsegs && fits; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        if (seg->kind != TD_LAYOUT_PAGED)
            continue;
        uint64_t t = kp->segs[s].nfree * l->block_entries * seg->ratio;
        if (t < fits)
            fits = t;
    }
    *out = (td_kvpool_counts_t){
        .blocks_total = kp->blocks_total,
        .blocks_used = kp->blocks_used,
        .blocks_free = kp->blocks_total - kp->blocks_used,
        .tokens_total = kp->kv_tokens,
        .tokens_used = kp->tokens_used,
        .tokens_free = fits,
        .slots_total = kp->slots,
        .slots_used = kp->slots_used,
        .blocks_held = kp->blocks_held,
    };
}

uint64_t
td_kvpool_block_owner(const td_kvpool_t *kp, uint32_t seg, uint64_t block)
{
    const td_kvpool_res_t *res;
    assert(seg < kp->layout->nsegs && block < kp->segs[seg].nblocks);
    if (kp->layout->segs[seg].kind != TD_LAYOUT_FIXED)
        return kp->segs[seg].owner[block];
    res = kp->slot_state[block];
    return res ? res->owner : 0;
}

td_status_t
td_kvpool_check(const td_kvpool_t *kp)
{
    uint64_t used = 0, held = 0;
    uint32_t slots = 0;
    for (uint32_t i = 0; i < kp->slots; i++)
        slots += kp->slot_state[i] != NULL;
    used += (uint64_t)slots * kp->nfixed;
    for (uint32_t s = 0; s < kp->layout->nsegs; s++) {
        const td_kvpool_seg_t *ps = &kp->segs[s];
        if (kp->layout->segs[s].kind == TD_LAYOUT_FIXED)
            continue;
        uint64_t seg_used = 0, seg_held = 0;
        for (uint64_t b = 0; b < ps->nblocks; b++) {
            seg_used += ps->refs[b] != 0;
            seg_held += ps->held[b];
            if (ps->held[b] && ps->refs[b] == 0) {
                td_error("kv pool: segment %u block %llu: held by the cache with no reference",
                         s, (unsigned long long)b);
                return TD_ERR_INTERNAL;
            }
        }
        held += seg_held;
        if (seg_used + ps->nfree != ps->nblocks) {
            td_error("kv pool: segment %u: %llu blocks reserved + %llu free != %llu", s,
                     (unsigned long long)seg_used, (unsigned long long)ps->nfree,
                     (unsigned long long)ps->nblocks);
            return TD_ERR_INTERNAL;
        }
        used += seg_used;
    }
    if (held != kp->blocks_held) {
        td_error("kv pool: %llu blocks held by the cache, counter %llu",
                 (unsigned long long)held, (unsigned long long)kp->blocks_held);
        return TD_ERR_INTERNAL;
    }
    if (used != kp->blocks_used || slots != kp->slots_used) {
        td_error("kv pool: block states say %llu used (%u slots), counters %llu (%u slots)",
                 (unsigned long long)used, slots, (unsigned long long)kp->blocks_used,
                 kp->slots_used);
        return TD_ERR_INTERNAL;
    }
    return TD_OK;
}
