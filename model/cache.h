/* model/cache.h — a DeepSeek-V4.1 request's state between forward calls: a
 * view of KV memory its caller owns (engine/layout.h's td_layout_kv_t, laid
 * out by the cache plan): the paged segments (compressed KV, indexer keys)
 * entry by entry through their block tables, the fixed ones (window rings,
 * partial groups, engram look-back, counters) in their slots. */
#ifndef TD_CACHE_H
#define TD_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cacheplan.h"
#include "status.h"

/* A request's cache. Owns nothing: the memory and the view's arrays belong
 * to the caller (a rank's pools, td_kvmem_t) and outlive the cache, which
 * may be copied (two copies are one cache). */
typedef struct {
    const td_cache_plan_t *plan;
    td_layout_kv_t kv;          /* the view, copied */
    uint64_t capacity;          /* tokens it holds: td_layout_kv_capacity(&kv) */
} td_cache_t;

/* A cache over kv, which must be laid out by p's layout (TD_ERR_INVALID
 * otherwise, logged). Its state is what the memory holds: td_cache_reset
 * makes it empty. */
td_status_t td_cache_init(td_cache_t *c, const td_cache_plan_t *p, const td_layout_kv_t *kv);

/* Back to empty: every fixed segment zero (paged entries are written before
 * they are read again). */
void td_cache_reset(td_cache_t *c);

/* The empty state placed at position pos of tokens[0..pos) (a bounded
 * replay's start): every fixed segment zero but the engram look-back, which
 * holds the last of those tokens as td_cache_check wants them, and the
 * counters, pos. Paged entries are not touched. */
void td_cache_seek(td_cache_t *c, const int32_t *tokens, uint64_t pos);

/* Tokens seen (the counters segment). */
uint64_t td_cache_tokens(const td_cache_t *c);
void td_cache_set_tokens(td_cache_t *c, uint64_t n);

/* The slot of fixed segment s. */
static inline unsigned char *
td_cache_fixed(const td_cache_t *c, uint32_t s)
{
    return c->kv.fixed[s];
}

/* Entry e of paged segment s (below capacity / ratio). */
static inline unsigned char *
td_cache_entry(const td_cache_t *c, uint32_t s, uint64_t e)
{
    return td_layout_kv_entry(&c->kv, s, e);
}

/* Check a state written elsewhere (a prefill rank, a copy) before it is
 * used as the state after tokens[0..n): the counters say n tokens within the
 * capacity, and the engram look-back holds the last of those tokens (zero in
 * slots no token reached). tokens NULL: the counters only. TD_ERR_MISMATCH,
 * logged with what differs. */
td_status_t td_cache_check(const td_cache_t *c, const int32_t *tokens, uint64_t n);

#endif
