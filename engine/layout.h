/* engine/layout.h — a model's KV layout: the segments a request's KV state is
 * made of (paged: grow with the sequence, stored in blocks of equal entries;
 * fixed: one per-request ring), their sizes, and a stable 64-bit hash of it all
 * that peers compare at Hello. Transport and pools know only this. */
#ifndef TD_LAYOUT_H
#define TD_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

typedef enum {
    TD_LAYOUT_PAGED = 1,  /* one entry per `ratio` tokens, stored in blocks */
    TD_LAYOUT_FIXED = 2,  /* a ring of `entries` slots, one slot per token */
} td_layout_kind_t;

/* What an entry holds; descriptive (part of the hash), never interpreted here. */
typedef enum {
    TD_LAYOUT_U8   = 1,  /* opaque packed bytes (quantised values + scales) */
    TD_LAYOUT_BF16 = 2,
    TD_LAYOUT_FP32 = 3,
    TD_LAYOUT_I32  = 4,
    TD_LAYOUT_I64  = 5,
} td_layout_dtype_t;

#define TD_LAYOUT_NAME_MAX 24

/* One segment. A paged segment of ratio r holds floor(n / r) entries after n
 * tokens: entry e covers tokens [e*r, e*r + r) and is complete once token
 * e*r + r - 1 is. A fixed segment is a ring: slot s holds the entry of the
 * latest token t < n with t % entries == s (zero bytes while there is none). */
typedef struct {
    char name[TD_LAYOUT_NAME_MAX]; /* "L2.kv", "L2.index", "L2.partial", "L0.window", "engram" */
    td_layout_kind_t kind;
    td_layout_dtype_t dtype;
    uint32_t layer;        /* the layer after which the segment is complete */
    uint32_t ratio;        /* paged: tokens per entry (>= 1); fixed: 1 */
    uint32_t entries;      /* fixed: ring slots; paged: 0 (unbounded) */
    uint32_t entry_bytes;  /* > 0 */
} td_layout_seg_t;

/* The V4.1-shaped layout, every size configurable. Daemons embed it in their
 * config struct and declare it with TD_LAYOUT_CONFIG_OPTS. Owns kv_sources. */
typedef struct {
    uint64_t layers;              /* transformer layers */
    char *kv_sources;             /* "layer:ratio,...": the KV-source layers */
    uint64_t kv_entry_bytes;      /* compressed KV entry of a source layer */
    uint64_t index_entry_bytes;   /* indexer key entry of a source layer */
    uint64_t window;              /* sliding-window ring slots per layer */
    uint64_t window_entry_bytes;  /* bytes per window slot */
    uint64_t partial_entry_bytes; /* compressor partial-group slot (ratio > 1) */
    uint64_t engram_tokens;       /* engram look-back tokens */
    uint64_t engram_entry_bytes;  /* bytes per look-back token */
    uint64_t counter_bytes;       /* position counters of a request */
    uint64_t block_entries;       /* entries per block of every paged segment */
} td_layout_config_t;

/* Option-table fragment for a td_layout_config_t member `m` of struct `st`;
 * prefix every name with "kv-". Defaults: DeepSeek-V4.1-Flash's shape. */
#define TD_LAYOUT_CONFIG_OPTS(st, m)                                              \
    TD_CONFIG_OPT_UINT64("kv-layers", st, m.layers, "40", 1, 4096,               \
                         "transformer layers of the kv layout"),                \
    TD_CONFIG_OPT_STRING("kv-sources", st, m.kv_sources, "2:2,8:2,14:2,20:1",    \
                         "kv-source layers as layer:ratio (tokens per entry) pairs"), \
    TD_CONFIG_OPT_SIZE("kv-entry-bytes", st, m.kv_entry_bytes, "288", 1, 1 << 20, \
                       "compressed kv bytes per entry of a source layer"),      \
    TD_CONFIG_OPT_SIZE("kv-index-entry-bytes", st, m.index_entry_bytes, "68", 1, 1 << 20, \
                       "indexer key bytes per entry of a source layer"),        \
    TD_CONFIG_OPT_UINT64("kv-window", st, m.window, "127", 1, 1 << 20,           \
                         "sliding-window ring slots per layer"),                \
    TD_CONFIG_OPT_SIZE("kv-window-entry-bytes", st, m.window_entry_bytes, "512", 1, 1 << 20, \
                       "bytes per sliding-window slot"),                        \
    TD_CONFIG_OPT_SIZE("kv-partial-entry-bytes", st, m.partial_entry_bytes, "4096", 1, 1 << 20, \
                       "bytes per slot of a compressor partial-group buffer"),  \
    TD_CONFIG_OPT_UINT64("kv-engram-tokens", st, m.engram_tokens, "3", 0, 1024,  \
                         "engram look-back tokens kept per request"),          \
    TD_CONFIG_OPT_SIZE("kv-engram-entry-bytes", st, m.engram_entry_bytes, "4", 1, 1 << 20, \
                       "bytes per engram look-back token"),                     \
    TD_CONFIG_OPT_SIZE("kv-counter-bytes", st, m.counter_bytes, "8", 0, 1 << 20, \
                       "bytes of a request's position counters"),               \
    TD_CONFIG_OPT_UINT64("kv-block-entries", st, m.block_entries, "64", 1, 1 << 20, \
                         "entries per block of every paged segment")

/* Fill cfg with the defaults (allocates kv_sources); release with _free. */
td_status_t td_layout_config_defaults(td_layout_config_t *cfg);
void td_layout_config_free(td_layout_config_t *cfg);

/* An immutable segment list with its hash. Owns its segments. */
typedef struct {
    uint32_t layers;
    uint32_t block_entries;
    uint32_t nsegs;
    td_layout_seg_t *segs;    /* [nsegs], ordered by layer, then kv, index,
                                 partial, window; engram and counters last */
    uint64_t hash;            /* td_layout_hash of the above */
} td_layout_t;

/* Fill *s: every field given (name cut to TD_LAYOUT_NAME_MAX - 1 bytes;
 * entry_bytes below 2^32), nothing else set. */
void td_layout_seg_set(td_layout_seg_t *s, const char *name, td_layout_kind_t kind,
                       td_layout_dtype_t dtype, uint32_t layer, uint32_t ratio, uint32_t entries,
                       uint64_t entry_bytes);

/* Build the V4.1-shaped layout from cfg: per layer, for a KV source of ratio r
 * the paged segments "L<i>.kv" and "L<i>.index" and, when r > 1, a fixed
 * "L<i>.partial" ring of r slots; every layer a fixed "L<i>.window" ring; then
 * fixed "engram" (engram_tokens slots, if any) and "counters" (1 slot, if
 * counter_bytes > 0) on the last layer. A malformed kv_sources or a source
 * outside the layers: TD_ERR_INVALID, logged. */
td_status_t td_layout_create(const td_layout_config_t *cfg, td_layout_t **out);
/* Build a layout from an explicit segment list (copied); checked the same way. */
td_status_t td_layout_create_from(uint32_t layers, uint32_t block_entries,
                                  const td_layout_seg_t *segs, uint32_t nsegs,
                                  td_layout_t **out);
void td_layout_destroy(td_layout_t *l);

/* Entries a segment holds after n tokens (paged: n / ratio; fixed: its slots). */
uint64_t td_layout_entries(const td_layout_seg_t *seg, uint64_t n);
/* Blocks a paged segment needs after n tokens: ceil(entries / block_entries). */
uint64_t td_layout_blocks(const td_layout_t *l, const td_layout_seg_t *seg, uint64_t n);
/* Bytes of a segment after n tokens: entries × entry_bytes. */
uint64_t td_layout_seg_bytes(const td_layout_seg_t *seg, uint64_t n);

/* Paged bytes per token (sum of entry_bytes / ratio) and fixed bytes per
 * request (sum of slots × entry_bytes). */
double td_layout_paged_bytes_per_token(const td_layout_t *l);
uint64_t td_layout_fixed_bytes(const td_layout_t *l);

/* FNV-1a 64 over the canonical encoding (docs/engine.md): "tdkv1", then
 * little-endian u32 layers, block_entries, nsegs, and per segment u8 kind,
 * u8 dtype, u32 layer, ratio, entries, entry_bytes, u8 name length, name. */
uint64_t td_layout_hash(const td_layout_t *l);

/* The segment called name, or NULL. */
const td_layout_seg_t *td_layout_find(const td_layout_t *l, const char *name);

typedef struct {
    const td_layout_t *layout;
    const uint64_t *nblocks;        /* [nsegs]: paged: its blocks; fixed: 0 */
    uint8_t *const *const *blocks;  /* [nsegs] -> [nblocks[s]]: paged; NULL for fixed */
    uint8_t *const *fixed;          /* [nsegs]: fixed: its slot; NULL for paged */
} td_layout_kv_t;
static inline uint8_t *td_layout_kv_entry(const td_layout_kv_t *kv, uint32_t s, uint64_t e)
{ const td_layout_seg_t *seg = &kv->layout->segs[s]; uint64_t be = kv->layout->block_entries;
  if (seg->kind == TD_LAYOUT_FIXED) return kv->fixed[s] + e * seg->entry_bytes;
  return kv->blocks[s][e / be] + (e % be) * seg->entry_bytes; }

#endif
