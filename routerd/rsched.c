/* routerd/rsched.c — choosing ranks for a request: a decode rank with free KV
 * and a free batch row and the least load, a prefill rank with the fewest
 * queued tokens; draining, joining and dead ranks are skipped. Load is the
 * rank's latest Load plus what this router sent it since (pend_*), so a burst
 * does not pile onto one rank; when no rank has room, whether one ever could
 * decides between waiting and refusing. */
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

const char *
td_rsched_fit_str(td_rsched_fit_t f)
{
    static const char *const names[] = { "fits", "busy", "too long", "no rank" };

    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

/* Whether rk could ever hold need tokens: its context and its whole KV
 * (0: not told). */
static bool
could_hold(const td_rrank_t *rk, uint64_t need)
{
    return need <= rk->reg->max_context &&
           (rk->reg->kv_tokens_total == 0 || need <= rk->reg->kv_tokens_total);
}

uint64_t
td_rsched_longest(const td_rrank_t *ranks)
{
    uint64_t most = 0;

    for (const td_rrank_t *rk = ranks; rk; rk = rk->next) {
        if (!takes_requests(rk, TANDEM__ROLE__ROLE_DECODE))
            continue;
        uint64_t n = rk->reg->max_context;
        if (rk->reg->kv_tokens_total && rk->reg->kv_tokens_total < n)
            n = rk->reg->kv_tokens_total;
        if (n > most)
            most = n;
    }
    return most;
}

td_rsched_fit_t
td_rsched_pick_decode(td_rrank_t *ranks, uint64_t need, const uint64_t *tried, size_t ntried,
                      td_rrank_t **out)
{
    td_rrank_t *best = NULL;
    uint64_t best_load = 0, best_free = 0;
    bool up = false, holds = false, untried = false;

    for (td_rrank_t *rk = ranks; rk; rk = rk->next) {
        if (!takes_requests(rk, TANDEM__ROLE__ROLE_DECODE))
            continue;
        up = true;
        if (!could_hold(rk, need))
            continue;
        holds = true;
        if (was_tried(rk, tried, ntried))
            continue;
        untried = true;
        uint64_t free_tok = rk->load.kv_tokens_free > rk->pend_tokens
                            ? rk->load.kv_tokens_free - rk->pend_tokens : 0;
        /* every admitted request holds a batch row until it ends */
        uint64_t load = (uint64_t)rk->load.running + rk->load.queued + rk->pend_reqs;
        if (rk->refused || free_tok < need || load >= rk->reg->max_batch)
            continue;
        if (!best || load < best_load || (load == best_load && free_tok > best_free)) {
            best = rk;
            best_load = load;
            best_free = free_tok;
        }
    }
    if (best) {
        *out = best;
        return TD_RSCHED_FITS;
    }
    if (!up)
        return TD_RSCHED_NONE;
    if (!holds)
        return TD_RSCHED_TOO_LONG;
    return untried ? TD_RSCHED_BUSY : TD_RSCHED_NONE;
}
