/* model/cache.c — the per-request cache of the DeepSeek-V4.1 forward pass as
 * a view of the caller's KV memory laid out by the cache plan (cacheplan.c):
 * reset, placing an empty state at a position (replay), the token counter,
 * and checking a state written elsewhere. */
#include "cache.h"

#include <string.h>

#include "log.h"

td_status_t
td_cache_init(td_cache_t *c, const td_cache_plan_t *p, const td_layout_kv_t *kv)
{
    if (kv == NULL || kv->layout != p->layout) {
        td_error("kv cache: the memory is not laid out by this model's cache plan");
        return TD_ERR_INVALID;
    }
    c->plan = p;
    c->kv = *kv;
    c->capacity = td_layout_kv_capacity(kv);
    return TD_OK;
}

void
td_cache_reset(td_cache_t *c)
{
    const td_layout_t *l = c->plan->layout;

    for (uint32_t s = 0; s < l->nsegs; s++)
        if (l->segs[s].kind == TD_LAYOUT_FIXED)
            memset(td_cache_fixed(c, s), 0, td_layout_seg_bytes(&l->segs[s], 0));
}

void
td_cache_seek(td_cache_t *c, const int32_t *tokens, uint64_t pos)
{
    const td_cache_plan_t *p = c->plan;

    td_cache_reset(c);
    if (p->engram >= 0) {
        unsigned char *ring = td_cache_fixed(c, (uint32_t)p->engram);

        /* slot s holds the latest token t < pos with t % slots == s */
        for (uint64_t t = pos > p->engram_slots ? pos - p->engram_slots : 0; t < pos; t++)
            memcpy(ring + t % p->engram_slots * sizeof(int32_t), &tokens[t], sizeof(int32_t));
    }
    td_cache_set_tokens(c, pos);
}

uint64_t
td_cache_tokens(const td_cache_t *c)
{
    uint64_t n;

    memcpy(&n, td_cache_fixed(c, (uint32_t)c->plan->counters), sizeof(n));
    return n;
}

void
td_cache_set_tokens(td_cache_t *c, uint64_t n)
{
    memcpy(td_cache_fixed(c, (uint32_t)c->plan->counters), &n, sizeof(n));
}

td_status_t
td_cache_check(const td_cache_t *c, const int32_t *tokens, uint64_t n)
{
    const td_cache_plan_t *p = c->plan;
    uint64_t have = td_cache_tokens(c);

    if (have != n || n > c->capacity) {
        td_error("kv cache: the state counts %llu tokens, expected %llu (capacity %llu)",
                 (unsigned long long)have, (unsigned long long)n,
                 (unsigned long long)c->capacity);
        return TD_ERR_MISMATCH;
    }
    if (tokens == NULL || p->engram < 0)
        return TD_OK;
    for (uint64_t slot = 0; slot < p->engram_slots; slot++) {
        int32_t got, want = 0;

        /* slot s holds the latest token t < n with t % slots == s */
        if (slot < n)
            want = tokens[slot + (n - 1 - slot) / p->engram_slots * p->engram_slots];
        memcpy(&got, td_cache_fixed(c, (uint32_t)p->engram) + slot * sizeof(int32_t),
               sizeof(got));
        if (got != want) {
            td_error("kv cache: engram look-back slot %llu holds token %d, the prompt's is %d",
                     (unsigned long long)slot, got, want);
            return TD_ERR_MISMATCH;
        }
    }
    return TD_OK;
}
