/* routerd/route-admin-status.c — GET /admin/status: every node with its
 * ranks (role, state, incarnation, load, KV used/free, in flight, a DEP
 * group's rank's group, passes and rows per expert, a prefill rank's prefix
 * cache), and the admission queue (length, bounds, waits). */
#include "router.h"
#include "route.h"

#include <inttypes.h>
#include <jansson.h>

/* A DEP group's rank: its group ({domain, size, rank}; null from a worker
 * that did not say), the passes it made and its rows per expert (null for a
 * dead rank, as its load). */
static json_t *
dep_json(const td_rrank_t *rk, bool dead)
{
    uint32_t size = td_rrank_dep_size(rk);
    json_t *e = dead ? NULL : json_array();

    for (size_t i = 0; e && i < rk->n_expert_tokens; i++)
        json_array_append_new(e, json_integer((json_int_t)rk->expert_tokens[i]));
    return json_pack("{s:o, s:o, s:o, s:o, s:o}",
                     "domain", size ? json_string(rk->reg->dep_domain) : json_null(),
                     "size", size ? json_integer(size) : json_null(),
                     "rank", size ? json_integer(rk->reg->dep_rank) : json_null(),
                     "passes", dead ? json_null() : json_integer((json_int_t)rk->load.dep_passes),
                     "expert_tokens", e ? e : json_null());
}

/* A prefill rank's prefix cache (docs/kvrouting.md), or null without one:
 * its block size, the blocks this router tracks, its last Load's figures
 * ("stats", null until one came or once it is dead) and this router's
 * placements on it. */
static json_t *
cache_json(const td_rrank_t *rk, bool dead)
{
    const Tandem__CacheStats *s = &rk->cache_stats;
    const td_rrank_cache_counters_t *k = &rk->cache_ctr;
    json_t *stats = NULL;

    if (td_rrank_cache_block(rk) == 0)
        return json_null();
    if (!dead && rk->has_cache_stats)
        stats = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
                          " s:I, s:I, s:I, s:I}",
                          "pool_blocks", (json_int_t)s->pool_blocks,
                          "pool_bytes", (json_int_t)s->pool_bytes,
                          "host_bytes", (json_int_t)s->host_bytes,
                          "host_budget", (json_int_t)s->host_budget,
                          "ssd_bytes", (json_int_t)s->ssd_bytes,
                          "ssd_budget", (json_int_t)s->ssd_budget,
                          "lookup_tokens", (json_int_t)s->lookup_tokens,
                          "hit_pool_tokens", (json_int_t)s->hit_pool_tokens,
                          "hit_host_tokens", (json_int_t)s->hit_host_tokens,
                          "hit_ssd_tokens", (json_int_t)s->hit_ssd_tokens,
                          "computed_tokens", (json_int_t)s->computed_tokens,
                          "replay_tokens", (json_int_t)s->replay_tokens,
                          "pinned_blocks", (json_int_t)s->pinned_blocks,
                          "shared_blocks", (json_int_t)s->shared_blocks,
                          "reserved_blocks", (json_int_t)s->reserved_blocks,
                          "prefetch_blocks", (json_int_t)s->prefetch_blocks,
                          "prefetch_unused_blocks", (json_int_t)s->prefetch_unused_blocks);
    return json_pack("{s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:I}",
                     "block_tokens", (json_int_t)td_rrank_cache_block(rk),
                     "blocks_tracked", (json_int_t)rk->cache.n,
                     "stats", stats ? stats : json_null(),
                     "placed", (json_int_t)k->placed,
                     "prompt_tokens", (json_int_t)k->prompt_tokens,
                     "predicted_cached_tokens", (json_int_t)k->predicted_cached,
                     "reported_cached_tokens", (json_int_t)k->reported_cached,
                     "placed_by_cache", (json_int_t)k->by_cache);
}

/* A dead rank's load and KV are null: its last figures no longer hold. */
static json_t *
rank_json(const td_rrank_t *rk)
{
    const Tandem__Load *l = &rk->load;
    td_rrank_state_t st = td_rrank_state(rk);
    json_t *load = NULL, *kv = NULL, *dep = NULL;
    char inc[17];

    if (st != TD_RRANK_DEAD) {
        load = json_pack("{s:I, s:I, s:I, s:I, s:I}", "running", (json_int_t)l->running,
                         "queued", (json_int_t)l->queued,
                         "queued_tokens", (json_int_t)l->queued_tokens,
                         "paused", (json_int_t)l->paused,
                         "paused_kv_bytes", (json_int_t)l->kv_bytes_paused);
        kv = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "blocks_used",
                       (json_int_t)l->kv_blocks_used, "blocks_free", (json_int_t)l->kv_blocks_free,
                       "tokens_used", (json_int_t)l->kv_tokens_used,
                       "tokens_free", (json_int_t)l->kv_tokens_free,
                       "kept", (json_int_t)l->kept, "kept_tokens", (json_int_t)l->kept_tokens,
                       "quarantined", (json_int_t)l->quarantined,
                       "blocks_quarantined", (json_int_t)l->kv_blocks_quarantined,
                       "tokens_quarantined", (json_int_t)l->kv_tokens_quarantined);
    }
    if (td_rrank_dep_size(rk) > 0 || l->dep_passes > 0 || rk->n_expert_tokens > 0)
        dep = dep_json(rk, st == TD_RRANK_DEAD);   /* a DEP group's rank */
    snprintf(inc, sizeof inc, "%016" PRIx64, rk->incarnation);
    json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:o, s:o}",
                          "rank", (json_int_t)rk->rank_id, "role", td_hello_role_str(rk->role),
                          "state", td_rrank_state_str(st),
                          "incarnation", inc, "engine", rk->reg ? rk->reg->engine_name : "",
                          "max_context", (json_int_t)(rk->reg ? rk->reg->max_context : 0),
                          "max_batch", (json_int_t)(rk->reg ? rk->reg->max_batch : 0),
                          "inflight", (json_int_t)rk->inflight,
                          "load", load ? load : json_null(), "kv", kv ? kv : json_null());
    if (dep != NULL && o != NULL)
        (void)json_object_set_new(o, "dep", dep);   /* only a DEP group's rank has it */
    else if (dep != NULL)
        json_decref(dep);
    if (o != NULL && rk->role == TANDEM__ROLE__ROLE_PREFILL)
        (void)json_object_set_new(o, "cache", cache_json(rk, st == TD_RRANK_DEAD));
    return o;
}

/* The admission queue: waiting now, its bounds, the longest wait now and
 * the mean wait of every stay so far. */
static json_t *
queue_json(td_router_t *r)
{
    const td_metrics_hist_t *w = &r->metrics.queue_wait;
    td_rqueue_stats_t q;

    td_rreq_queue_stats(r->reqs, &q);
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "length", (json_int_t)q.len,
                     "max", (json_int_t)q.max_queued, "timeout_ms", (json_int_t)q.timeout_ms,
                     "oldest_ms", (json_int_t)(q.oldest_ns / 1000000u),
                     "waited", (json_int_t)w->n,
                     "mean_wait_ms", (json_int_t)(w->n ? w->sum * 1000 / (double)w->n : 0));
}

void
td_route_admin_status(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    json_t *nodes = json_array();
    uint64_t states[TD_RREQ_NSTATES], inflight = 0;

    for (const td_rrank_node_t *n = r->cluster.nodes; nodes && n; n = n->next) {
        json_t *ranks = json_array();
        for (const td_rrank_t *rk = r->cluster.ranks; ranks && rk; rk = rk->next)
            if (rk->node == n)
                json_array_append_new(ranks, rank_json(rk));
        json_array_append_new(nodes, json_pack("{s:s, s:b, s:b, s:o}", "node", n->name,
                                               "draining", n->draining, "removing", n->removing,
                                               "ranks", ranks ? ranks : json_null()));
    }
    td_rreq_count_states(r->reqs, states);
    for (int s = 0; s < TD_RREQ_DONE; s++)
        inflight += states[s];
    td_http_reply_json(req, 200, json_pack("{s:s, s:s, s:s, s:I, s:o, s:o}", "router_id",
                                           r->router_id, "model", r->model,
                                           "engine", r->engine_kind,
                                           "requests_in_flight", (json_int_t)inflight,
                                           "queue", queue_json(r),
                                           "nodes", nodes ? nodes : json_null()));
}
