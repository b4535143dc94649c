/* routerd/rsched.c — choosing ranks for a request: a decode rank with free KV
 * and the least load, a prefill rank with the fewest queued tokens; draining,
 * joining and dead ranks are skipped. Load is the rank's latest Load plus what
 * this router sent it since (pend_*), so a burst does not pile onto one rank. */
#include "rsched.h"

static bool
takes_requests(const td_rrank_t *rk, Tandem__Role role)
{
    return rk->role == role && td_rrank_state(rk) == TD_RRANK_UP;
}

td_rrank_t *
td_rsched_pick_prefill(td_rrank_t *ranks)
{
    td_rrank_t *best = NULL;
    uint64_t best_q = 0;

    for (td_rrank_t *rk = ranks; rk; rk = rk->next) {
        if (!takes_requests(rk, TANDEM__ROLE__ROLE_PREFILL))
            continue;
        uint64_t q = rk->load.queued_tokens + rk->pend_tokens;
        if (!best || q < best_q || (q == best_q && rk->inflight < best->inflight)) {
            best = rk;
            best_q = q;
        }
    }
    return best;
}

static bool
was_tried(const td_rrank_t *rk, const uint64_t *tried, size_t ntried)
{
    for (size_t i = 0; i < ntried; i++)
        if (tried[i] == rk->incarnation)
            return true;
    return false;
}

td_rrank_t *
td_rsched_pick_decode(td_rrank_t *ranks, uint64_t need, const uint64_t *tried, size_t ntried,
                     bool *too_long)
{
    td_rrank_t *best = NULL;
    uint64_t best_load = 0, best_free = 0;
    bool any = false;

    for (td_rrank_t *rk = ranks; rk; rk = rk->next) {
        if (!takes_requests(rk, TANDEM__ROLE__ROLE_DECODE))
            continue;
        any = true;
        if (need > rk->reg->max_context || was_tried(rk, tried, ntried))
            continue;
        uint64_t free_tok = rk->load.kv_tokens_free > rk->pend_tokens
                            ? rk->load.kv_tokens_free - rk->pend_tokens : 0;
        uint64_t load = (uint64_t)rk->load.running + rk->load.queued + rk->pend_reqs;
        if (free_tok < need)
            continue;
        if (!best || load < best_load || (load == best_load && free_tok > best_free)) {
            best = rk;
            best_load = load;
            best_free = free_tok;
        }
    }
    if (!best) {
        bool fits = false;
        for (td_rrank_t *rk = ranks; rk; rk = rk->next)
            if (takes_requests(rk, TANDEM__ROLE__ROLE_DECODE) && need <= rk->reg->max_context)
                fits = true;
        *too_long = any && !fits;
    }
    return best;
}
