/* kernels/cpu/kernels.c — what every backend shares: the one way a kernel
 * reports a failure, and the host-side argument checks of the KV ops. */
#include "kernels.h"

#include <stdarg.h>
#include <stdio.h>

#include "log.h"

td_status_t
td_kernels_fail(td_status_t st, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    td_error("kernels: %s", msg);
    return st;
}

/* Whether [a, a + len) runs past the top of the address space (a range
 * ending exactly at the top does not). */
static int
kv_wraps(uintptr_t a, size_t len)
{
    return len != 0 && len - 1 > UINTPTR_MAX - a;
}

/* Whether [a, a + alen) and [b, b + blen) share a byte; neither wraps. Only
 * differences of addresses are formed, so ranges at the top of the address
 * space compare correctly. */
static int
kv_overlaps(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
{
    if (alen == 0 || blen == 0)
        return 0;
    return a <= b ? b - a < alen : a - b < blen;
}

td_status_t
td_kernels_kv_check(const char *op, const td_kernels_pool_t *pool,
                    const uint32_t *table, size_t ntable,
                    const td_kernels_span_t *span, const void *buf)
{
    if (pool == NULL || span == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "%s: no pool or span", op);

    size_t eb = span->entry_bytes, epb = span->entries_per_block;
    if (eb == 0 || epb == 0)
        return td_kernels_fail(TD_ERR_INVALID, "%s: span has entry_bytes %zu, "
                               "entries_per_block %zu", op, eb, epb);
    if (epb > SIZE_MAX / eb || span->offset > pool->block_bytes ||
        epb * eb > pool->block_bytes - span->offset)
        return td_kernels_fail(TD_ERR_INVALID, "%s: span of %zu entries x %zu "
                               "bytes at offset %zu exceeds block_bytes %zu",
                               op, epb, eb, span->offset, pool->block_bytes);
    if (span->count == 0)
        return TD_OK;

    if (pool->base == NULL || table == NULL || buf == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "%s: NULL pool base, table or "
                               "buffer", op);
    if (pool->nblocks != 0 && pool->block_bytes > SIZE_MAX / pool->nblocks)
        return td_kernels_fail(TD_ERR_INVALID, "%s: pool of %u x %zu bytes "
                               "overflows", op, pool->nblocks, pool->block_bytes);
    if (span->count > SIZE_MAX / eb || span->first > UINT64_MAX - span->count)
        return td_kernels_fail(TD_ERR_RANGE, "%s: span of %llu entries from "
                               "%llu overflows", op,
                               (unsigned long long)span->count,
                               (unsigned long long)span->first);

    uint64_t jfirst = span->first / epb;
    uint64_t jlast = (span->first + span->count - 1) / epb;
    if (jlast >= ntable)
        return td_kernels_fail(TD_ERR_RANGE, "%s: block table has %zu ids, "
                               "span needs %llu", op, ntable,
                               (unsigned long long)jlast + 1);

    uintptr_t b0 = (uintptr_t)buf, p0 = (uintptr_t)pool->base;
    size_t blen = (size_t)span->count * eb;
    size_t plen = (size_t)pool->nblocks * pool->block_bytes;
    if (kv_wraps(b0, blen) || kv_wraps(p0, plen))
        return td_kernels_fail(TD_ERR_INVALID, "%s: %s wraps the address space",
                               op, kv_wraps(b0, blen) ? "buffer" : "pool");
    if (kv_overlaps(b0, blen, p0, plen))
        return td_kernels_fail(TD_ERR_INVALID, "%s: buffer overlaps the pool", op);

    for (uint64_t j = jfirst; j <= jlast; j++)
        if (table[j] >= pool->nblocks)
            return td_kernels_fail(TD_ERR_RANGE, "%s: table[%llu] = %u >= "
                                   "nblocks %u", op, (unsigned long long)j,
                                   table[j], pool->nblocks);
    return TD_OK;
}
