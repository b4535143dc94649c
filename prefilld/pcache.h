/* prefilld/pcache.h — the prefix cache of one prefill rank (docs/kvcache.md):
 * cache blocks of G prompt tokens keyed by their chain hash
 * (kvcache/chainhash.h), whose paged KV lives in the rank's own pool blocks
 * (shared by reference with the requests that reuse them), each optionally
 * with a snapshot of the fixed state (window rings, partial groups, engram
 * look-back, counters) at its end; below the pool, the host-memory and SSD
 * tiers (kvcache/kvtier.h). A hit gives a request the paged KV of its
 * cached prefix; the rank rebuilds the fixed state from the nearest
 * snapshot or by bounded replay (td_engine_replay_bound).
 * Threads: everything runs on the rank's loop thread except
 * td_pcache_load, which the compute thread calls for a hit's tier blocks,
 * and td_pcache_work_run: the bulk copies (write-back of new blocks to the
 * SSD tier, demotion of evicted ones to the host tier) that the loop only
 * queues (no loop callback copies a prompt's KV).
 * Ownership: the cache borrows the pool and the layout (they outlive it),
 * holds its blocks in the pool (td_kvpool_hold) and owns its nodes,
 * snapshots and tiers. */
#ifndef TD_PCACHE_H
#define TD_PCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"
#include "layout.h"
#include "status.h"
#include "tandem.pb-c.h"

typedef struct td_pcache td_pcache_t;

typedef struct {
    uint32_t rank_id;          /* for the logs */
    uint32_t block_tokens;     /* G: a multiple of every paged segment's ratio × block
                                  entries (td_pcache_block_tokens) */
    uint64_t max_blocks;       /* cache blocks kept in the pool (>= 1) */
    uint64_t seed;             /* td_chain_seed of the model and layout */
    uint64_t replay_bound;     /* td_engine_replay_bound; 0: no replay (snapshots only) */
    uint64_t host_bytes;       /* host-memory tier budget; 0: none */
    const char *ssd_dir;       /* SSD tier directory (this rank's own); NULL or "": none */
    uint64_t ssd_bytes;        /* SSD tier budget */
    int snapshots;             /* keep a fixed-state snapshot at each prompt's last block end */
} td_pcache_config_t;

/* The smallest block the layout allows: the least common multiple of every
 * paged segment's ratio × block entries (tokens). */
uint32_t td_pcache_block_tokens(const td_layout_t *l);

/* TD_ERR_INVALID (logged) for a block size the layout cannot share whole
 * blocks at; the SSD tier's directory is scanned (its blocks announced by
 * the first td_pcache_events). */
td_status_t td_pcache_create(const td_pcache_config_t *cfg, const td_layout_t *l,
                             td_kvpool_t *kp, td_pcache_t **out);
/* Every hit must have been freed; the pool keeps no hold after. */
void td_pcache_destroy(td_pcache_t *c);

/* Where a hit's blocks come from. */
typedef enum {
    TD_PCACHE_POOL = 0,
    TD_PCACHE_HOST = 1,
    TD_PCACHE_SSD = 2,
} td_pcache_tier_t;

/* A prompt's cached prefix: its first nblocks cache blocks, the first npool
 * of them in the pool (shared: prefix/nprefix go to
 * td_kvpool_reserve_prefix), the rest to be read from the tiers into the
 * request's own blocks (td_pcache_load). Owned by the cache; freed with
 * td_pcache_hit_free. */
typedef struct {
    uint64_t nblocks;
    uint64_t npool;
    uint64_t *nprefix;         /* [nsegs] shared pool blocks per segment (0: fixed) */
    uint64_t **prefix;         /* [nsegs][nprefix[s]] */
    /* filled by td_pcache_load (compute thread) */
    uint64_t loaded;           /* blocks valid in the request's memory: npool + those read */
    uint64_t snap_end;         /* tokens: the state restored from a snapshot (0: none) */
    uint64_t hit_tokens[3];    /* per td_pcache_tier_t */
    void *priv;
} td_pcache_hit_t;

/* The cached prefix of tokens[0..n): at most (n - 1) / G blocks, so that at
 * least one token is left to compute. hashes: the prompt's chain
 * (td_chain_hashes, at least (n - 1) / G of them). NULL *out: a miss. The
 * hit's pool blocks are pinned (never evicted) until td_pcache_hit_free. */
td_status_t td_pcache_lookup(td_pcache_t *c, const int32_t *tokens, uint64_t n,
                             const uint64_t *hashes, td_pcache_hit_t **out);
void td_pcache_hit_free(td_pcache_t *c, td_pcache_hit_t *hit);

/* Make room: evict least recently used blocks nobody uses until every
 * paged segment has need[s] free blocks, or will have once the demotions
 * queued (td_pcache_work_*) are done. 1 when it has them now; 0 when not
 * (the caller waits for td_pcache_work_done, or for requests to end). */
int td_pcache_make_room(td_pcache_t *c, const uint64_t *need);

/* Starts reading ahead the SSD blocks that a lookup of this prompt would
 * find after its pool blocks (td_kvtier_prefetch), for td_pcache_load to
 * find read: called when a request arrives, its load comes at its turn.
 * hashes as for td_pcache_lookup. */
void td_pcache_prefetch(td_pcache_t *c, uint64_t n, const uint64_t *hashes);

/* Compute thread: read the hit's tier blocks into the request's own blocks
 * (kv: its reservation's view; block i of the prefix lies at the same
 * positions a prompt of those tokens has), checking each; a block that fails
 * ends the hit there (hit->loaded). Then the snapshot: the latest one at or
 * below the loaded prefix, from a node or a record, is copied into kv's
 * fixed segments when it saves more than replay would (hit->snap_end). */
void td_pcache_load(td_pcache_t *c, td_pcache_hit_t *hit, const int32_t *tokens,
                    const td_layout_kv_t *kv);

/* The request whose KV kv holds (its reservation's view, blocks read only
 * from here) prefilled tokens[0..n) (hashes: its chain, n / G of them): its
 * whole blocks enter the cache (those it shared already are touched); snap
 * (ownership passes; may be NULL) is the fixed state at snap_end, a block
 * end. */
void td_pcache_insert(td_pcache_t *c, const int32_t *tokens, uint64_t n, const uint64_t *hashes,
                      const td_kvpool_res_t *res, uint8_t *snap, uint64_t snap_end);

/* Compute thread: a copy of kv's fixed segments (layout order), for
 * td_pcache_insert; NULL when out of memory. */
uint8_t *td_pcache_snapshot(const td_pcache_t *c, const td_layout_kv_t *kv);

/* The next td_pcache_events carries the whole content (cleared): a router
 * that registered again must learn it. */
void td_pcache_resync(td_pcache_t *c);

/* Empty every tier (blocks in use stay until their requests end). */
void td_pcache_flush(td_pcache_t *c);

/* The routing table's news since the last call: hashes that entered the
 * cache (any tier) and that left it (every tier); *cleared after a flush or
 * at the first call. Arrays owned by the cache, valid until the next call. */
void td_pcache_events(td_pcache_t *c, int *cleared, const uint64_t **added, size_t *nadded,
                      const uint64_t **removed, size_t *nremoved);

/* Fill st (tandem__cache_stats__init'ed by the caller). */
void td_pcache_stats(const td_pcache_t *c, Tandem__CacheStats *st);
/* The counters a finished request adds: tokens looked up, from each tier,
 * computed (replay included) and replayed. */
void td_pcache_count(td_pcache_t *c, uint64_t lookup, const td_pcache_hit_t *hit,
                     uint64_t computed, uint64_t replayed);

uint32_t td_pcache_block(const td_pcache_t *c);

/* ---- Bulk work off the loop thread ------------------------------------------- */
/* Loop thread: take the queued write-backs and demotions as one batch for
 * a job (false: nothing queued, or a batch is out already). */
bool td_pcache_work_take(td_pcache_t *c);
/* Compute thread: the batch's copies into the tiers (its nodes are pinned
 * or already out of the cache, their blocks held: nothing else frees them
 * meanwhile). */
void td_pcache_work_run(td_pcache_t *c);
/* Loop thread: the batch is done: written-back blocks unpinned, demoted
 * ones' pool blocks freed. */
void td_pcache_work_done(td_pcache_t *c);

#endif
