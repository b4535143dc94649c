/* engine/kvpool.h — block accounting of one rank's KV pools (a decode rank's
 * and a prefill rank's alike): per paged segment of the layout a pool of
 * blocks, per fixed segment one slot per request row; all-or-nothing
 * reservations for a request's whole life (decode: prompt + max_tokens;
 * prefill: the prompt), the block states and the counters Load reports.
 * Once given its memory (td_kvpool_set_memory; the rank registers it with
 * UCX), each reservation carries the view of its blocks and slots that the
 * engine computes in (td_layout_kv_t): the pool is the cache.
 * Ownership: the pool borrows the layout and the memory (they must outlive
 * it) and owns its reservations; a reservation is freed by
 * td_kvpool_release. */
#ifndef TD_KVPOOL_H
#define TD_KVPOOL_H

#include <stdint.h>

#include "layout.h"
#include "status.h"

typedef struct td_kvpool_s td_kvpool_t;

/* Blocks of one request. Fixed segments hold one block: the request's slot. */
typedef struct {
    uint64_t owner;      /* request id, for the logs and the block states */
    uint64_t ntokens;    /* tokens reserved for (decode: prompt + max_tokens) */
    uint32_t slot;       /* the row in every fixed segment's pool */
    uint32_t nsegs;
    uint64_t *nblocks;   /* [nsegs] blocks per segment (fixed: 1) */
    uint64_t **blocks;   /* [nsegs][nblocks[seg]] block ids (fixed: {slot}) */
    /* Where they are (the pool has memory): paged segment s's blocks and
     * fixed segment s's slot, in the pool's memory; nblocks is 0 for fixed
     * segments here. Zero when the pool has no memory. */
    td_layout_kv_t kv;
} td_kvpool_res_t;

typedef struct {
    uint64_t blocks_total;   /* all pools: paged blocks + fixed slots × fixed segments */
    uint64_t blocks_used;
    uint64_t blocks_free;
    uint64_t tokens_total;   /* capacity in tokens (the configured kv tokens) */
    uint64_t tokens_used;    /* tokens reserved by live reservations */
    uint64_t tokens_free;    /* the longest request (prompt + max_tokens) that fits now */
    uint32_t slots_total;
    uint32_t slots_used;
    uint64_t blocks_held;    /* paged blocks the prefix cache holds (td_kvpool_hold) */
} td_kvpool_counts_t;

/* Size the pools: every paged segment gets the blocks kv_tokens tokens need,
 * every fixed segment `slots` slots. TD_ERR_INVALID (not logged: the caller
 * does) for zero sizes. */
td_status_t td_kvpool_create(const td_layout_t *layout, uint64_t kv_tokens, uint32_t slots,
                             td_kvpool_t **out);
/* Every reservation must have been released (asserted). */
void td_kvpool_destroy(td_kvpool_t *kp);

/* Give the pool its memory: segment s's block (or slot) b lies at
 * bases[s] + b × td_kvpool_seg_block_bytes(kp, s). Set before the first
 * reservation; reservations made after it carry their view (res->kv). */
void td_kvpool_set_memory(td_kvpool_t *kp, uint8_t *const *bases);

/* Geometry of segment seg's pool: blocks and bytes per block. */
uint64_t td_kvpool_seg_nblocks(const td_kvpool_t *kp, uint32_t seg);
uint64_t td_kvpool_seg_block_bytes(const td_kvpool_t *kp, uint32_t seg);

/* Reserve every block a request of ntokens tokens can need, or nothing:
 * TD_ERR_BUSY when a segment lacks blocks or no slot is free (the reason,
 * not logged, in *why: a static string). */
td_status_t td_kvpool_reserve(td_kvpool_t *kp, uint64_t owner, uint64_t ntokens,
                              td_kvpool_res_t **out, const char **why);
/* td_kvpool_reserve whose first blocks are shared: for each paged segment
 * s, its first nprefix[s] blocks are prefix[s][0..nprefix[s]) (blocks in use:
 * a prefix cache's, td_kvpool_hold), which the reservation references
 * instead of taking free ones; the rest come from the free queue. nprefix
 * NULL: none (td_kvpool_reserve). Shared blocks must be read only to
 * everyone: the caller writes only past them. */
td_status_t td_kvpool_reserve_prefix(td_kvpool_t *kp, uint64_t owner, uint64_t ntokens,
                                     const uint64_t *nprefix, const uint64_t *const *prefix,
                                     td_kvpool_res_t **out, const char **why);
/* Drop the reservation's references: a block goes back to the free queue
 * when nothing else (another reservation, the cache) holds it. */
void td_kvpool_release(td_kvpool_t *kp, td_kvpool_res_t *res);

/* The prefix cache's hold on paged block `block` of segment seg, which a
 * reservation holds now: the block stays in use after that reservation is
 * released, until td_kvpool_unhold. At most one hold per block (asserted). */
void td_kvpool_hold(td_kvpool_t *kp, uint32_t seg, uint64_t block);
void td_kvpool_unhold(td_kvpool_t *kp, uint32_t seg, uint64_t block);
/* References on a paged block: reservations sharing it plus 1 when held. */
uint32_t td_kvpool_block_refs(const td_kvpool_t *kp, uint32_t seg, uint64_t block);
/* Free blocks of a paged segment (a fixed one: free slots). */
uint64_t td_kvpool_seg_free(const td_kvpool_t *kp, uint32_t seg);
/* Where a block lies (NULL before td_kvpool_set_memory). */
uint8_t *td_kvpool_block_mem(const td_kvpool_t *kp, uint32_t seg, uint64_t block);

void td_kvpool_counts(const td_kvpool_t *kp, td_kvpool_counts_t *out);
/* The owner of a block (0 when free or held by the cache alone), for tests
 * and the admin view: a paged block's is the reservation that took it from
 * the free queue. */
uint64_t td_kvpool_block_owner(const td_kvpool_t *kp, uint32_t seg, uint64_t block);
/* Walk every block state and check them against the counters: TD_OK or
 * TD_ERR_INTERNAL (logged). */
td_status_t td_kvpool_check(const td_kvpool_t *kp);

#endif
