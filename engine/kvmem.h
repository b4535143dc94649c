/* engine/kvmem.h — KV memory for programs that own it themselves (tools,
 * tests, benchmarks): the blocks and slots of one request for a layout and a
 * token count, in one arena, with the td_layout_kv_t view of them; and moving
 * a request's state between two such views as a transfer would. A daemon's
 * pools hand out the same view with their accounting. */
#ifndef TD_KVMEM_H
#define TD_KVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "status.h"

/* One request's KV memory. Owns the arena and the view's arrays; kv points
 * into them and is valid until td_kvmem_destroy. */
typedef struct {
    td_layout_kv_t kv;       /* the view to hand to td_engine_req_create / a cache */
    uint64_t tokens;         /* asked for (td_layout_kv_capacity(&kv) >= tokens) */
    size_t bytes;            /* the arena: blocks, slots, their guards */
    unsigned char *arena;    /* [bytes], 64-byte aligned */
    uint64_t *nblocks;       /* [nsegs] */
    unsigned char ***blocks; /* [nsegs] -> [nblocks[s]] (NULL for fixed) */
    unsigned char **fixed;   /* [nsegs] (NULL for paged) */
    unsigned char **ends;    /* [npieces] the end of each block or slot: a guard follows */
    unsigned char **nexts;   /* [npieces] where the guard after it ends */
    size_t npieces;
} td_kvmem_t;

/* Memory for `tokens` tokens of layout l (>= 1): every paged segment
 * td_layout_blocks(l, seg, tokens) blocks of block_entries entries, every
 * fixed segment its slot, all zero, each followed by a guard of at least 64
 * bytes (under AddressSanitizer also poisoned). seed 0: blocks and slots in
 * layout order; otherwise every block and slot of every segment at a place
 * shuffled by the seed (block b + 1 of a segment may lie before block b and
 * among other segments' blocks), so that nothing reading the view can depend
 * on the order. Out of memory: TD_ERR_NOMEM, logged. */
td_status_t td_kvmem_create(const td_layout_t *l, uint64_t tokens, uint64_t seed,
                            td_kvmem_t **out);
void td_kvmem_destroy(td_kvmem_t *m);

/* TD_OK when every guard still holds its pattern; TD_ERR_MISMATCH (logged
 * with the segment) when something wrote past a block or slot. */
td_status_t td_kvmem_check(const td_kvmem_t *m);

/* A request's state after n tokens in a fixed order: for every segment in
 * layout order its paged entries [0, td_layout_entries(seg, n)) or its fixed
 * slots whole. Its size, and copies of it between views of one layout (each
 * holding n tokens): packed into / out of a contiguous buffer (as a file or a
 * transfer carries it), or from one view to another. */
uint64_t td_kvmem_state_bytes(const td_layout_t *l, uint64_t n);
void td_kvmem_pack(const td_layout_kv_t *kv, uint64_t n, void *out);
void td_kvmem_unpack(const td_layout_kv_t *kv, uint64_t n, const void *in);
void td_kvmem_copy(const td_layout_kv_t *dst, const td_layout_kv_t *src, uint64_t n);

#endif
