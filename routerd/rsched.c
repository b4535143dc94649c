/* routerd/rsched.c — choosing ranks for a request: a decode rank with free KV
 * and a free batch row and the least load (within a DEP domain, the most free
 * KV), a prefill rank with the least prefill work left (queued tokens plus
 * the prompt's uncached tokens, docs/kvrouting.md); draining, joining and
 * dead ranks are skipped. Load is the rank's latest Load plus what this
 * router sent it since (pend_*) less what the rank let go of since (a
 * decode rank's releases, td_rrank_room), so a burst does not pile onto one
 * rank and a release is room at once; when
 * no rank has room, whether one ever could decides between waiting and
 * refusing. */
#include "rsched.h"

static bool
takes_requests(const td_rrank_t *rk, Tandem__Role role)
{
    return rk->role == role && td_rrank_state(rk) == TD_RRANK_UP;
}

/* The prefix of prompt rk's cache holds, in tokens (whole blocks). */
static uint64_t
cached_prefix(const td_rrank_t *rk, td_rcache_prompt_t *prompt)
{
    uint32_t g = td_rrank_cache_block(rk);
    const uint64_t *h;
    size_t n;

    if (g == 0 || rk->cache.n == 0)
        return 0;
    h = td_rcache_prompt_hashes(prompt, g, &n);
    return (uint64_t)td_rcache_prefix(&rk->cache, h, n) * g;
}

/* Whether a (cost ca, inflight) goes before the best so far (cost cb). */
static bool
prefill_better(const td_rrank_t *a, double ca, const td_rrank_t *b, double cb)
{
    return !b || ca < cb || (ca == cb && a->inflight < b->inflight);
}

td_rsched_prefill_t
td_rsched_pick_prefill(td_rrank_t *ranks, td_rcache_prompt_t *prompt, double weight)
{
    td_rsched_prefill_t out = { NULL, 0, false };
    td_rrank_t *by_load = NULL;
    double best_cost = 0, load_cost = 0;
    double ntok = prompt ? (double)prompt->ntokens : 0;

    for (td_rrank_t *rk = ranks; rk; rk = rk->next) {
        if (!takes_requests(rk, TANDEM__ROLE__ROLE_PREFILL))
            continue;
        double q = (double)(rk->load.queued_tokens + rk->pend_tokens);
        uint64_t cached = prompt && weight > 0 ? cached_prefix(rk, prompt) : 0;
        double cost = q + ntok - weight * (double)cached;
        if (prefill_better(rk, q, by_load, load_cost)) {
            by_load = rk;
            load_cost = q;
        }
        if (prefill_better(rk, cost, out.rank, best_cost)) {
            out.rank = rk;
            out.cached_tokens = cached;
            best_cost = cost;
        }
    }
    out.by_cache = out.rank != by_load;
    return out;
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

/* Whether an up decode rank that could hold need tokens and was not tried
 * has room for them now: free KV, a free row, no refusal since its Load. */
static bool
decode_fits(const td_rrank_t *rk, uint64_t need, td_rrank_room_t room)
{
    return !rk->refused && room.free_tok >= need && room.rows < rk->reg->max_batch;
}

/* Whether rk, with room for need tokens, is the one its DEP domain offers:
 * the ranks of a domain step together whatever their rows, so within one the
 * rank with the most free KV (then the fewest rows, then the first in the
 * table) takes the request. */
static bool
domain_offers(td_rrank_t *ranks, const td_rrank_t *rk, td_rrank_room_t room, uint64_t need,
              const uint64_t *tried, size_t ntried)
{
    bool before = true;   /* o comes before rk in the table */

    for (const td_rrank_t *o = ranks; o; o = o->next) {
        if (o == rk) {
            before = false;
            continue;
        }
        if (!td_rrank_same_dep(o, rk) || !takes_requests(o, TANDEM__ROLE__ROLE_DECODE) ||
            !could_hold(o, need) || was_tried(o, tried, ntried))
            continue;
        td_rrank_room_t r = td_rrank_room(o);
        if (!decode_fits(o, need, r))
            continue;
        if (r.free_tok > room.free_tok ||
            (r.free_tok == room.free_tok && (r.rows < room.rows ||
                                             (r.rows == room.rows && before))))
            return false;
    }
    return true;
}

td_rsched_fit_t
td_rsched_pick_decode(td_rrank_t *ranks, uint64_t need, const uint64_t *tried, size_t ntried,
                      td_rrank_t **out)
{
    td_rrank_t *best = NULL;
    td_rrank_room_t best_room = { 0, 0 };
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
        td_rrank_room_t room = td_rrank_room(rk);
        if (!decode_fits(rk, need, room))
            continue;
        if (td_rrank_dep_size(rk) > 0 && !domain_offers(ranks, rk, room, need, tried, ntried))
            continue;
        /* the least loaded, then the most free KV; a domain competes with
         * the rank it offers */
        if (!best || room.rows < best_room.rows ||
            (room.rows == best_room.rows && room.free_tok > best_room.free_tok)) {
            best = rk;
            best_room = room;
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
