/* model/cache.c — the per-request cache of the DeepSeek-V4.1 forward pass:
 * one contiguous block of bytes per request laid out by the cache plan
 * (cacheplan.c), and loading such a block written elsewhere. */
#include "cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define CACHE_MAGIC "TDV41KV"
#define CACHE_VERSION 1u
#define CACHE_ALIGN 64u

/* Offsets of every segment after the header for a capacity; the total size. */
static td_status_t
cache_offsets(const td_cache_plan_t *p, uint64_t capacity, uint64_t *off, size_t *size)
{
    uint64_t at = (sizeof(td_cache_header_t) + CACHE_ALIGN - 1) / CACHE_ALIGN * CACHE_ALIGN;

    for (uint32_t s = 0; s < p->layout->nsegs; s++) {
        const td_layout_seg_t *seg = &p->layout->segs[s];
        uint64_t entries = seg->kind == TD_LAYOUT_PAGED ? capacity / seg->ratio : seg->entries;
        if (entries > UINT64_MAX / 2 / seg->entry_bytes)
            return TD_ERR_RANGE;
        off[s] = at;
        at += (entries * seg->entry_bytes + CACHE_ALIGN - 1) / CACHE_ALIGN * CACHE_ALIGN;
        if (at > SIZE_MAX / 2)
            return TD_ERR_RANGE;
    }
    *size = (size_t)at;
    return TD_OK;
}

static td_status_t
cache_alloc(const td_cache_plan_t *p, uint64_t capacity, td_cache_t **out)
{
    td_cache_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        td_error("kv cache: out of memory");
        return TD_ERR_NOMEM;
    }
    c->plan = p;
    c->capacity = capacity;
    c->seg_off = calloc(p->layout->nsegs, sizeof(*c->seg_off));
    if (c->seg_off == NULL)
        goto err_nomem;
    if (cache_offsets(p, capacity, c->seg_off, &c->size) != TD_OK) {
        td_error("kv cache: capacity %llu tokens does not fit in memory",
                 (unsigned long long)capacity);
        td_cache_destroy(c);
        return TD_ERR_RANGE;
    }
    c->bytes = calloc(1, c->size);
    if (c->bytes == NULL)
        goto err_nomem;
    *out = c;
    return TD_OK;

err_nomem:
    td_error("kv cache: cannot allocate %zu bytes for %llu tokens", c->size,
             (unsigned long long)capacity);
    td_cache_destroy(c);
    return TD_ERR_NOMEM;
}

static void
cache_write_header(td_cache_t *c)
{
    td_cache_header_t h;

    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CACHE_MAGIC, sizeof(CACHE_MAGIC));
    h.version = CACHE_VERSION;
    h.nsegs = c->plan->layout->nsegs;
    h.layout_hash = c->plan->layout->hash;
    h.capacity = c->capacity;
    h.size = c->size;
    memcpy(c->bytes, &h, sizeof(h));
}

td_status_t
td_cache_create(const td_cache_plan_t *p, uint64_t capacity, td_cache_t **out)
{
    td_cache_t *c;

    if (capacity == 0) {
        td_error("kv cache: capacity of 0 tokens");
        return TD_ERR_INVALID;
    }
    td_status_t st = cache_alloc(p, capacity, &c);
    if (st != TD_OK)
        return st;
    cache_write_header(c);
    *out = c;
    return TD_OK;
}

void
td_cache_destroy(td_cache_t *c)
{
    if (c == NULL)
        return;
    free(c->bytes);
    free(c->seg_off);
    free(c);
}

void
td_cache_reset(td_cache_t *c)
{
    memset(c->bytes, 0, c->size);
    cache_write_header(c);
}

unsigned char *
td_cache_seg(const td_cache_t *c, uint32_t s)
{
    return c->bytes + c->seg_off[s];
}

uint64_t
td_cache_tokens(const td_cache_t *c)
{
    uint64_t n;

    memcpy(&n, td_cache_seg(c, (uint32_t)c->plan->counters), sizeof(n));
    return n;
}

void
td_cache_set_tokens(td_cache_t *c, uint64_t n)
{
    memcpy(td_cache_seg(c, (uint32_t)c->plan->counters), &n, sizeof(n));
}

td_status_t
td_cache_load(const td_cache_plan_t *p, const void *bytes, size_t len, td_cache_t **out)
{
    td_cache_header_t h;
    td_cache_t *c;

    if (bytes == NULL || len < sizeof(h)) {
        td_error("kv cache: %zu bytes: shorter than the %zu-byte header", len, sizeof(h));
        return TD_ERR_INVALID;
    }
    memcpy(&h, bytes, sizeof(h));
    if (memcmp(h.magic, CACHE_MAGIC, sizeof(CACHE_MAGIC)) != 0) {
        td_error("kv cache: bad magic (not a DeepSeek-V4.1 cache block)");
        return TD_ERR_INVALID;
    }
    if (h.version != CACHE_VERSION) {
        td_error("kv cache: version %u, expected %u", h.version, CACHE_VERSION);
        return TD_ERR_INVALID;
    }
    if (h.nsegs != p->layout->nsegs || h.layout_hash != p->layout->hash) {
        td_error("kv cache: layout %u segments hash %016llx, this model's is %u segments "
                 "hash %016llx", h.nsegs, (unsigned long long)h.layout_hash,
                 p->layout->nsegs, (unsigned long long)p->layout->hash);
        return TD_ERR_MISMATCH;
    }
    if (h.capacity == 0 || h.capacity > UINT64_MAX / 2) {
        td_error("kv cache: capacity %llu tokens", (unsigned long long)h.capacity);
        return TD_ERR_INVALID;
    }
    td_status_t st = cache_alloc(p, h.capacity, &c);
    if (st != TD_OK)
        return st == TD_ERR_RANGE ? TD_ERR_INVALID : st;
    if (h.size != c->size || len != c->size) {
        td_error("kv cache: header size %llu, block of %zu bytes; capacity %llu needs %zu",
                 (unsigned long long)h.size, len, (unsigned long long)h.capacity, c->size);
        td_cache_destroy(c);
        return TD_ERR_INVALID;
    }
    memcpy(c->bytes, bytes, len);
    if (td_cache_tokens(c) > c->capacity) {
        td_error("kv cache: %llu tokens in a cache of capacity %llu",
                 (unsigned long long)td_cache_tokens(c), (unsigned long long)c->capacity);
        td_cache_destroy(c);
        return TD_ERR_INVALID;
    }
    *out = c;
    return TD_OK;
}
