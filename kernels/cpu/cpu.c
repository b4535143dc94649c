/* kernels/cpu/cpu.c — the reference backend: every op in plain C on host
 * memory, synchronous; the CUDA backend is checked byte for byte against it. */
#include "kernels.h"

#include <string.h>

/* Move the span between the blocks and buf: one memcpy per block touched,
 * since a span's entries are contiguous inside each block. */
static void
cpu_kv_copy(const td_kernels_pool_t *pool, const uint32_t *table,
            const td_kernels_span_t *span, unsigned char *buf, int pack)
{
    uint64_t epb = span->entries_per_block, eb = span->entry_bytes;
    uint64_t end = span->first + span->count;

    for (uint64_t j = span->first / epb; j * epb < end; j++) {
        uint64_t lo = j * epb > span->first ? j * epb : span->first;
        uint64_t hi = (j + 1) * epb < end ? (j + 1) * epb : end;
        unsigned char *blk = (unsigned char *)pool->base +
                             (size_t)table[j] * pool->block_bytes +
                             span->offset + (size_t)(lo - j * epb) * eb;
        unsigned char *b = buf + (size_t)(lo - span->first) * eb;
        size_t len = (size_t)(hi - lo) * eb;

        if (pack)
            memcpy(b, blk, len);
        else
            memcpy(blk, b, len);
    }
}

static td_status_t
cpu_kv_pack(const td_kernels_pool_t *pool, const uint32_t *table, size_t ntable,
            const td_kernels_span_t *span, void *buf, void *stream)
{
    (void)stream;
    td_status_t st = td_kernels_kv_check("kv_pack", pool, table, ntable, span, buf);
    if (st == TD_OK && span->count)
        cpu_kv_copy(pool, table, span, buf, 1);
    return st;
}

static td_status_t
cpu_kv_unpack(const td_kernels_pool_t *pool, const uint32_t *table, size_t ntable,
              const td_kernels_span_t *span, const void *buf, void *stream)
{
    (void)stream;
    td_status_t st = td_kernels_kv_check("kv_unpack", pool, table, ntable, span, buf);
    if (st == TD_OK && span->count)
        cpu_kv_copy(pool, table, span, (unsigned char *)(uintptr_t)buf, 0);
    return st;
}

static td_status_t
cpu_sync(void *stream)
{
    (void)stream;
    return TD_OK;
}

static const td_kernels_t td_kernels_cpu_table = {
    .name = "cpu",
    .kv_pack = cpu_kv_pack,
    .kv_unpack = cpu_kv_unpack,
    .sync = cpu_sync,
};

const td_kernels_t *
td_kernels_cpu(void)
{
    return &td_kernels_cpu_table;
}
