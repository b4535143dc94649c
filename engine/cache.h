/* engine/cache.h — a DeepSeek-V4.1 request's state between forward calls as
 * the KV segments of engine/layout.h, in one pointer-free block of bytes that
 * can be copied out and loaded in another process. */
#ifndef TD_CACHE_H
#define TD_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "modelcfg.h"
#include "status.h"

/* How a segment stores a vector of `dim` values (the reference's QAT
 * formats; a value round-trips to exactly what the reference's fake
 * quantizer gives). */
typedef enum {
    TD_CACHE_F32 = 0,        /* dim f32 (also when dim does not divide the block) */
    TD_CACHE_FP8 = 1,        /* dim e4m3 codes, then dim/32 ue8m0 scales */
    TD_CACHE_FP4_E4M3 = 2,   /* dim/2 packed e2m1 bytes, then dim/16 e4m3 scales */
    TD_CACHE_FP4_UE8M0 = 3,  /* dim/2 packed e2m1 bytes, then dim/32 ue8m0 scales */
} td_cache_fmt_t;

/* Block sizes of the formats. */
#define TD_CACHE_FP8_BLOCK 32
#define TD_CACHE_KV_FP4_BLOCK 16
#define TD_CACHE_INDEX_FP4_BLOCK 32

/* Segments of one layer (indices into the layout, -1 when absent). */
typedef struct {
    int32_t kv;        /* paged, 1 entry per `ratio` tokens: compressed KV [head_dim] */
    int32_t index;     /* paged, same ratio: indexer keys [index_head_dim] */
    int32_t partial;   /* fixed, `ratio` slots: f32 kv [head_dim] then gate [head_dim] */
    int32_t window;    /* fixed, sliding_window - 1 slots: window KV [head_dim] */
} td_cache_layer_t;

/* The cache layout of a config; immutable, shared by every request. */
typedef struct {
    td_layout_t *layout;           /* owned */
    td_cache_layer_t *layers;      /* [layers] */
    uint32_t nlayers;
    int32_t engram;                /* fixed, max_ngram - 1 slots of i32 token ids; -1 none */
    int32_t counters;              /* fixed, 1 slot: u64 tokens seen */
    uint32_t head_dim, index_head_dim;
    uint32_t window_slots;         /* sliding_window - 1 */
    uint32_t engram_slots;         /* max_ngram - 1 (0 without engram layers) */
    td_cache_fmt_t window_fmt;     /* FP8 when head_dim % 32 == 0 */
    td_cache_fmt_t kv_fmt;         /* FP4_E4M3 when head_dim % 16 == 0 */
    td_cache_fmt_t index_fmt;      /* FP4_UE8M0 when index_head_dim % 32 == 0 */
} td_cache_plan_t;

/* Build the plan of cfg (td_modelcfg_check must accept it). Segments, in
 * layout order: per layer "L<i>.kv", "L<i>.index" (index source owning its
 * keys), "L<i>.partial" (ratio > 1) for KV sources, "L<i>.window" for
 * every layer; then "engram" and "counters". TD_ERR_UNSUPPORTED for a
 * sliding_window below 2. */
td_status_t td_cache_plan_create(const td_modelcfg_t *cfg, td_cache_plan_t **out);
void td_cache_plan_destroy(td_cache_plan_t *p);

/* Bytes of one entry of a format. */
size_t td_cache_fmt_bytes(td_cache_fmt_t f, uint32_t dim);

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
