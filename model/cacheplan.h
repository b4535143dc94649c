/* model/cacheplan.h — the KV layout of a DeepSeek-V4.1 config as the
 * segments of engine/layout.h: per layer the paged compressed KV and indexer
 * keys, the fixed partial groups and window ring, then the engram look-back
 * and the counters; each segment's storage format. Immutable once made. */
#ifndef TD_CACHEPLAN_H
#define TD_CACHEPLAN_H

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

#endif
