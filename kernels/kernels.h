/* kernels/kernels.h — the op interface: one table of function pointers per
 * backend (cpu, cuda). The engine is written once against td_kernels_t; the
 * only project header kernels include is the leaf common/status.h. */
#ifndef TD_KERNELS_H
#define TD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A view of a paged KV pool (owns nothing): nblocks blocks of block_bytes
 * each, back to back. Host memory for the cpu backend, device-accessible
 * memory (cudaMalloc, or mapped pinned host memory) for cuda. */
typedef struct {
    void    *base;          /* [nblocks, block_bytes] bytes */
    uint32_t nblocks;
    size_t   block_bytes;
} td_kernels_pool_t;

/* Which entries of a paged segment move, and where they sit in a block.
 * Entry e, for first <= e < first + count, lives in block
 * table[e / entries_per_block] at byte
 *     offset + (e % entries_per_block) * entry_bytes
 * and in the contiguous buffer at byte (e - first) * entry_bytes.
 * offset lets several segments share one block (e.g. a block holding
 * [layers, entries_per_block, entry_bytes]); first lets a decode step append
 * in the middle of a block. td_kernels_span_bytes() is the plain case. */
typedef struct {
    size_t   entry_bytes;       /* > 0 */
    size_t   entries_per_block; /* > 0; offset + entries_per_block * entry_bytes <= block_bytes */
    size_t   offset;            /* byte offset of the segment inside every block */
    uint64_t first;             /* first entry moved */
    uint64_t count;             /* entries moved; 0 moves nothing */
} td_kernels_span_t;

/* The plain case: `bytes` bytes filling whole blocks in table order, the last
 * block partly when bytes is not a multiple of block_bytes. */
static inline td_kernels_span_t
td_kernels_span_bytes(size_t block_bytes, uint64_t bytes)
{
    td_kernels_span_t s = { 1, block_bytes, 0, 0, bytes };
    return s;
}

/* One backend. Every op validates its arguments on the host before touching
 * memory: a block id >= pool->nblocks, or a table shorter than the span needs,
 * gives TD_ERR_RANGE and writes nothing; malformed spans, NULL pointers, a
 * buffer overlapping the pool, or a buffer or pool running past the top of
 * the address space give TD_ERR_INVALID. The table is host memory (pageable
 * or pinned), read before the op returns, so the caller may overwrite or free
 * it as soon as the op returns, even while a cuda op is still running; it
 * holds distinct ids (not checked: the pool's accounting guarantees it;
 * duplicates make unpack's result unspecified).
 *
 * stream: NULL for cpu (ignored); for cuda a cudaStream_t, NULL meaning the
 * legacy default stream. cuda ops are asynchronous: TD_OK means enqueued, the
 * pool and buffer must stay alive until sync(stream) returns. A cuda op
 * carries the block ids by value in its kernel launch parameters (one launch
 * per 1000 blocks touched): it allocates nothing, copies nothing ahead of the
 * kernel and never waits for the stream. A launch error after the first of
 * several launches leaves the earlier ones enqueued (the span's content is
 * then unspecified, as after an error from sync). cpu ops are done when they
 * return. On failure td_kernels_error() says why. */
typedef struct td_kernels {
    const char *name;  /* "cpu", "cuda" */

    /* Gather: buf[(e - first) * entry_bytes ...] = entry e of the span.
     * table: [ntable] block ids; buf: [span->count, span->entry_bytes]. */
    td_status_t (*kv_pack)(const td_kernels_pool_t *pool, const uint32_t *table,
                           size_t ntable, const td_kernels_span_t *span,
                           void *buf, void *stream);
    /* Scatter: the inverse of kv_pack; bytes of the blocks outside the span
     * are left as they were. buf: [span->count, span->entry_bytes]. */
    td_status_t (*kv_unpack)(const td_kernels_pool_t *pool, const uint32_t *table,
                             size_t ntable, const td_kernels_span_t *span,
                             const void *buf, void *stream);
    /* Wait until every op enqueued on stream is done. */
    td_status_t (*sync)(void *stream);
} td_kernels_t;

/* The reference backend: plain C, memcpy; always available, never NULL. */
const td_kernels_t *td_kernels_cpu(void);

/* The CUDA backend on the current device. Defined only when kernels/cuda is
 * built (td_kernels_cuda_dep defines TD_HAVE_CUDA). TD_ERR_UNSUPPORTED when
 * there is no usable device or no kernel image for it; *out set on TD_OK. */
td_status_t td_kernels_cuda(const td_kernels_t **out);

/* Why the last failed call on this thread failed, e.g.
 * "kv_pack: table[3] = 17 >= nblocks 16"; "" when none has failed. */
const char *td_kernels_error(void);

/* ---- for backends ---------------------------------------------------- */

/* Record the message td_kernels_error() returns; returns st. */
td_status_t td_kernels_fail(td_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The checks every backend runs first (see td_kernels_t); op names the op
 * in the message. buf is the contiguous buffer (read or written). */
td_status_t td_kernels_kv_check(const char *op, const td_kernels_pool_t *pool,
                                const uint32_t *table, size_t ntable,
                                const td_kernels_span_t *span, const void *buf);

#ifdef __cplusplus
}
#endif

#endif
