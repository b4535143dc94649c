/* prefilld/kvmap.h — where a request's KV goes: a checked copy of the KvDest
 * the router sent (one destination per layout segment), and the mapping of
 * one (chunk, layer) batch of engine pieces onto transfer descriptors that
 * read the entries where the engine wrote them, in the rank's pool (no
 * staging copy: a block entry run is contiguous on both sides), and the
 * running checksum of every byte put (engine/kvsum.h) for the terminal KvNote.
 * Ownership: a td_kvmap_t owns its block lists and its checksum state; a
 * td_kvmap_batch_t is one
 * allocation (descriptors) freed with td_kvmap_batch_free; the pool memory
 * it points at must stay unchanged until the transfer is done. */
#ifndef TD_KVMAP_H
#define TD_KVMAP_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "kvsum.h"
#include "status.h"
#include "tandem.pb-c.h"
#include "xfer.h"

#define TD_KVMAP_REASON_MAX 256

/* One segment's destination: the pool and its blocks (fixed: one slot). */
typedef struct {
    uint32_t pool_id;
    uint64_t nblocks;
    uint64_t *blocks;     /* [nblocks] block ids in the decode rank's pool */
} td_kvmap_seg_t;

typedef struct {
    const td_layout_t *layout;   /* borrowed from the engine */
    td_kvmap_seg_t *segs;        /* [layout->nsegs], indexed by segment */
    uint64_t ntokens;            /* the prompt */
    td_kvsum_t *sum;             /* every piece put, in the order computed */
} td_kvmap_t;

/* Check dest against the layout for a prompt of ntokens: every segment named
 * exactly once, paged segments with enough blocks for the prompt, fixed
 * segments with exactly one slot. TD_ERR_INVALID with a readable reason
 * (not logged: the caller owns the request and logs once). */
td_status_t td_kvmap_create(const td_layout_t *layout, const Tandem__KvDest *dest,
                            uint64_t ntokens, td_kvmap_t **out, char *reason, size_t reason_len);
void td_kvmap_destroy(td_kvmap_t *m);

/* Descriptors for one td_xfer_post. */
typedef struct {
    size_t ndescs;
    td_xfer_desc_t *descs;   /* [ndescs], src in the request's KV memory */
    uint64_t bytes;          /* bytes they carry */
    void *user;              /* free for the caller (the task it belongs to) */
} td_kvmap_batch_t;

/* Map pieces onto the destination: paged entry e of a piece, read from
 * td_layout_kv_entry(kv, seg, e), goes to block blocks[e / block_entries] at
 * offset (e % block_entries) × entry_bytes, a piece spanning blocks becomes
 * one descriptor per block; a fixed segment goes whole to its slot at
 * offset 0. Every destination is range-checked against the KvDest, every
 * source against kv (TD_ERR_RANGE with a reason, nothing allocated). */
td_status_t td_kvmap_batch_create(td_kvmap_t *m, const td_layout_kv_t *kv,
                                  const td_engine_piece_t *pieces, size_t npieces,
                                  td_kvmap_batch_t **out, char *reason, size_t reason_len);
void td_kvmap_batch_free(td_kvmap_batch_t *b);

/* Add the bytes of pieces, read from kv, to the map's checksum: the compute
 * thread does it as each layer is done (the bytes are final then), before the
 * loop puts them. Pieces out of order make td_kvmap_sum fail, not this call.
 * One thread at a time: nothing else reads the sum until the prompt is done. */
void td_kvmap_sum_add(td_kvmap_t *m, const td_layout_kv_t *kv, const td_engine_piece_t *pieces,
                      size_t npieces);

/* The checksum of every byte summed so far (td_kvmap_sum_add), for the
 * terminal KvNote once the prompt's KV has all been summed (engine/kvsum.h:
 * td_kvsum_final over the prompt's tokens). TD_ERR_RANGE with a reason when
 * the pieces are not exactly the prompt's KV in order (a bug in the engine or
 * the caller). */
td_status_t td_kvmap_sum(const td_kvmap_t *m, uint64_t *out, char *reason, size_t reason_len);

#endif
