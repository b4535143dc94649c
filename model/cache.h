/* model/cache.h — a DeepSeek-V4.1 request's state between forward calls as
 * the KV segments of engine/layout.h, in one pointer-free block of bytes that
 * can be copied out and loaded in another process. */
#ifndef TD_CACHE_H
#define TD_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cacheplan.h"
#include "status.h"

/* The header at byte 0 of a cache block (little-endian host layout). */
typedef struct {
    char magic[8];          /* "TDV41KV\0" */
    uint32_t version;       /* 1 */
    uint32_t nsegs;
    uint64_t layout_hash;   /* td_layout_hash of the plan's layout */
    uint64_t capacity;      /* tokens the block has room for */
    uint64_t size;          /* bytes of the whole block */
    uint64_t reserved[3];
} td_cache_header_t;

/* A request's cache: bytes[0 .. size) is the whole state. Segment s starts at
 * seg_off[s] (64-byte aligned, in layout order after the header): a fixed
 * segment holds its slots, a paged one capacity / ratio entries. */
typedef struct {
    const td_cache_plan_t *plan;
    uint64_t capacity;
    uint64_t *seg_off;      /* [nsegs] */
    unsigned char *bytes;   /* [size], owned */
    size_t size;
} td_cache_t;

/* An empty cache with room for capacity tokens (>= 1). */
td_status_t td_cache_create(const td_cache_plan_t *p, uint64_t capacity, td_cache_t **out);
void td_cache_destroy(td_cache_t *c);

/* Back to empty (every byte of the segments zero). */
void td_cache_reset(td_cache_t *c);

/* Tokens seen (the counters segment). */
uint64_t td_cache_tokens(const td_cache_t *c);
void td_cache_set_tokens(td_cache_t *c, uint64_t n);

/* Start of segment s's data. */
unsigned char *td_cache_seg(const td_cache_t *c, uint32_t s);

/* A cache from bytes written by another process (c->bytes, c->size): the
 * header must name this plan's layout (magic, version, segment count, layout
 * hash), its capacity and size must agree, and its token count fit; anything
 * else is TD_ERR_INVALID (or TD_ERR_MISMATCH for another layout) with a
 * message naming the field. The bytes are copied. */
td_status_t td_cache_load(const td_cache_plan_t *p, const void *bytes, size_t len,
                          td_cache_t **out);

#endif
