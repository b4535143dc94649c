/* routerd/route-metrics.c — GET /metrics: the router's counters and
 * histograms, plus per-rank gauges (KV blocks and tokens used/free, queue
 * depth, running, in flight, a DEP group's rank's rows per expert), a
 * prefill rank's prefix cache (its figures and this router's placements on
 * it), requests in flight by state and the admission queue's length and
 * oldest wait. */
#include "router.h"
#include "route.h"

#include <stddef.h>
#include <string.h>

/* A label value with '"' and '\' escaped (node ids are printable ASCII). */
static void
label_escape(char *dst, size_t len, const char *src)
{
    size_t j = 0;

    for (; *src && j + 2 < len; src++) {
        if (*src == '"' || *src == '\\')
            dst[j++] = '\\';
        dst[j++] = *src;
    }
    dst[j] = '\0';
}

static td_status_t
rank_gauges(td_router_t *r, td_buf_t *out)
{
    static const struct { const char *name, *help; } g[] = {
        { "tandem_router_rank_kv_blocks",
          "kv blocks of a decode rank (used, free; quarantined: of the used, waiting for a "
          "fence)" },
        { "tandem_router_rank_kv_tokens",
          "kv capacity of a decode rank in tokens (used, free; quarantined: of the used)" },
        { "tandem_router_rank_queue_depth", "requests waiting at a rank (queued, queued_tokens)" },
        { "tandem_router_rank_running", "requests running at a rank" },
        { "tandem_router_rank_inflight", "this router's requests bound to a rank" },
        { "tandem_router_rank_up", "1 when the rank takes requests, else 0" },
        { "tandem_router_rank_kept_states",
          "a decode rank's kept states for next turns (states, their tokens)" },
        { "tandem_router_rank_expert_tokens",
          "a dep group's rank: rows each routed expert ran there, all layers, since it started" },
    };
    td_status_t st = TD_OK;

    bool dep = false;   /* a DEP group's rank among them: its expert rows */
    for (const td_rrank_t *rk = r->cluster.ranks; rk; rk = rk->next)
        dep = dep || rk->n_expert_tokens > 0;
    for (size_t i = 0; st == TD_OK && i < sizeof g / sizeof g[0]; i++) {
        if (i == 7 && !dep)
            break;
        st = td_metrics_header(out, g[i].name, "gauge", g[i].help);
        for (const td_rrank_t *rk = r->cluster.ranks; st == TD_OK && rk; rk = rk->next) {
            char node[2 * TD_HELLO_NODE_ID_MAX + 1], lbl[256];
            const Tandem__Load *l = &rk->load;
            bool dec = rk->role == TANDEM__ROLE__ROLE_DECODE;
            label_escape(node, sizeof node, rk->node->name);
            snprintf(lbl, sizeof lbl, "node=\"%s\",rank=\"%u\",role=\"%s\"", node, rk->rank_id,
                     td_hello_role_str(rk->role));
            switch (i) {
            case 0:
            case 1:
                if (dec)
                    st = td_buf_printf(out, "%s{%s,kind=\"used\"} %llu\n%s{%s,kind=\"free\"} %llu\n"
                                       "%s{%s,kind=\"quarantined\"} %llu\n", g[i].name, lbl,
                                       (unsigned long long)(i ? l->kv_tokens_used : l->kv_blocks_used),
                                       g[i].name, lbl,
                                       (unsigned long long)(i ? l->kv_tokens_free : l->kv_blocks_free),
                                       g[i].name, lbl,
                                       (unsigned long long)(i ? l->kv_tokens_quarantined
                                                              : l->kv_blocks_quarantined));
                break;
            case 2:
                st = td_buf_printf(out, "%s{%s,kind=\"queued\"} %u\n%s{%s,kind=\"queued_tokens\"} %llu\n",
                                   g[i].name, lbl, l->queued, g[i].name, lbl,
                                   (unsigned long long)l->queued_tokens);
                break;
            case 3:
                st = td_buf_printf(out, "%s{%s} %u\n", g[i].name, lbl, l->running);
                break;
            case 4:
                st = td_buf_printf(out, "%s{%s} %u\n", g[i].name, lbl, rk->inflight);
                break;
            case 5:
                st = td_buf_printf(out, "%s{%s} %d\n", g[i].name, lbl,
                                   td_rrank_state(rk) == TD_RRANK_UP);
                break;
            case 6:
                if (dec)
                    st = td_buf_printf(out, "%s{%s,kind=\"states\"} %u\n%s{%s,kind=\"tokens\"} %llu\n",
                                       g[i].name, lbl, l->kept, g[i].name, lbl,
                                       (unsigned long long)l->kept_tokens);
                break;
            default:
                for (size_t x = 0; st == TD_OK && x < rk->n_expert_tokens; x++)
                    st = td_buf_printf(out, "%s{%s,expert=\"%zu\"} %llu\n", g[i].name, lbl, x,
                                       (unsigned long long)rk->expert_tokens[x]);
                break;
            }
        }
    }
    return st;
}

/* The prefix cache of each prefill rank (docs/kvrouting.md): what its
 * last Load said (ranks that sent CacheStats), and this router's placements
 * on every prefill rank. kind 0: the rank's, with a tier or kind label per
 * value; 1: the router's. */
static td_status_t
cache_metrics(td_router_t *r, td_buf_t *out)
{
#define CS(f) offsetof(Tandem__CacheStats, f)
#define CC(f) offsetof(td_rrank_cache_counters_t, f)
    static const struct {
        const char *name, *type, *help, *label;
        int kind;
        size_t n, off[3];
        const char *val[3];
    } m[] = {
        { "tandem_router_rank_cache_bytes", "gauge",
          "bytes a prefill rank's prefix cache holds per tier", "tier", 0, 3,
          { CS(pool_bytes), CS(host_bytes), CS(ssd_bytes) }, { "pool", "host", "ssd" } },
        { "tandem_router_rank_cache_budget_bytes", "gauge",
          "a prefill rank's prefix cache budget per tier", "tier", 0, 2,
          { CS(host_budget), CS(ssd_budget) }, { "host", "ssd" } },
        { "tandem_router_rank_cache_pool_blocks", "gauge",
          "cache blocks a prefill rank holds in its kv pool", NULL, 0, 1, { CS(pool_blocks) }, { NULL } },
        { "tandem_router_rank_cache_lookup_tokens_total", "counter",
          "prompt tokens a prefill rank looked up in its prefix cache", NULL, 0, 1,
          { CS(lookup_tokens) }, { NULL } },
        { "tandem_router_rank_cache_hit_tokens_total", "counter",
          "prompt tokens a prefill rank found in its prefix cache, per tier", "tier", 0, 3,
          { CS(hit_pool_tokens), CS(hit_host_tokens), CS(hit_ssd_tokens) },
          { "pool", "host", "ssd" } },
        { "tandem_router_rank_cache_computed_tokens_total", "counter",
          "tokens a prefill rank computed (replay included)", NULL, 0, 1,
          { CS(computed_tokens) }, { NULL } },
        { "tandem_router_rank_cache_replay_tokens_total", "counter",
          "tokens a prefill rank replayed to rebuild cached state", NULL, 0, 1,
          { CS(replay_tokens) }, { NULL } },
        { "tandem_router_rank_cache_in_use_blocks", "gauge",
          "a prefill rank's cache blocks in use by requests in flight (0 when idle): pinned "
          "by hits, shared by reservations, and the pool blocks reserved besides", "what", 0, 3,
          { CS(pinned_blocks), CS(shared_blocks), CS(reserved_blocks) },
          { "pinned", "shared", "reserved" } },
        { "tandem_router_rank_cache_prefetch_blocks_total", "counter",
          "SSD blocks a prefill rank read ahead of their requests' turn, and of those the ones "
          "dropped unused", "what", 0, 2, { CS(prefetch_blocks), CS(prefetch_unused_blocks) },
          { "read", "unused" } },
        { "tandem_router_rank_prefill_placed_total", "counter",
          "prefills this router sent a prefill rank", NULL, 1, 1, { CC(placed) }, { NULL } },
        { "tandem_router_rank_prefill_prompt_tokens_total", "counter",
          "prompt tokens of the prefills this router sent a prefill rank", NULL, 1, 1,
          { CC(prompt_tokens) }, { NULL } },
        { "tandem_router_rank_cache_predicted_tokens_total", "counter",
          "prompt tokens this router expected cached at a prefill rank when it chose it",
          NULL, 1, 1, { CC(predicted_cached) }, { NULL } },
        { "tandem_router_rank_cache_reported_tokens_total", "counter",
          "prompt tokens a prefill rank said it served from its cache (prefill done)", NULL, 1,
          1, { CC(reported_cached) }, { NULL } },
        { "tandem_router_rank_placed_by_cache_total", "counter",
          "prefills placed on a rank the load-only rule would not have chosen", NULL, 1, 1,
          { CC(by_cache) }, { NULL } },
    };
#undef CS
#undef CC
    td_status_t st = TD_OK;
    bool any_stats = false, any_prefill = false;

    for (const td_rrank_t *rk = r->cluster.ranks; rk; rk = rk->next) {
        any_stats = any_stats || rk->has_cache_stats;
        any_prefill = any_prefill || rk->role == TANDEM__ROLE__ROLE_PREFILL;
    }
    for (size_t i = 0; st == TD_OK && i < sizeof m / sizeof m[0]; i++) {
        if (m[i].kind == 0 ? !any_stats : !any_prefill)
            continue;
        st = td_metrics_header(out, m[i].name, m[i].type, m[i].help);
        for (const td_rrank_t *rk = r->cluster.ranks; st == TD_OK && rk; rk = rk->next) {
            const char *base = m[i].kind == 0 ? (const char *)&rk->cache_stats
                                              : (const char *)&rk->cache_ctr;
            char node[2 * TD_HELLO_NODE_ID_MAX + 1], lbl[256];
            if (rk->role != TANDEM__ROLE__ROLE_PREFILL || (m[i].kind == 0 && !rk->has_cache_stats))
                continue;
            label_escape(node, sizeof node, rk->node->name);
            snprintf(lbl, sizeof lbl, "node=\"%s\",rank=\"%u\",role=\"prefill\"", node,
                     rk->rank_id);
            for (size_t v = 0; st == TD_OK && v < m[i].n; v++) {
                uint64_t x;
                memcpy(&x, base + m[i].off[v], sizeof x);
                if (m[i].label)
                    st = td_buf_printf(out, "%s{%s,%s=\"%s\"} %llu\n", m[i].name, lbl,
                                       m[i].label, m[i].val[v], (unsigned long long)x);
                else
                    st = td_buf_printf(out, "%s{%s} %llu\n", m[i].name, lbl,
                                       (unsigned long long)x);
            }
        }
    }
    return st;
}

/* Backpressure now: answer bytes buffered, the caps, streams paused. */
static td_status_t
flow_gauges(td_router_t *r, td_buf_t *out)
{
    const struct { const char *name, *help; unsigned long long v; } g[] = {
        { "tandem_router_response_buffered_bytes",
          "answer bytes buffered for clients (not yet taken by the kernel)",
          (unsigned long long)r->out_budget.used },
        { "tandem_router_response_buffer_max_bytes", "response-buffer-max: their budget",
          (unsigned long long)r->out_budget.max },
        { "tandem_router_stream_buffer_max_bytes",
          "stream-buffer-max: one stream's buffered bytes before its decode row pauses",
          (unsigned long long)r->cfg->stream_buffer_max },
        { "tandem_router_streams_paused", "streams whose decode row is paused now",
          (unsigned long long)r->metrics.paused_now },
    };
    td_status_t st = TD_OK;

    for (size_t i = 0; st == TD_OK && i < sizeof g / sizeof g[0]; i++) {
        st = td_metrics_header(out, g[i].name, "gauge", g[i].help);
        if (st == TD_OK)
            st = td_buf_printf(out, "%s %llu\n", g[i].name, g[i].v);
    }
    return st;
}

/* One loop's passes as a histogram in seconds, with labels (or none). */
static td_status_t
loop_hist(td_buf_t *out, const char *name, const char *lbl, const td_loopstat_t *ls)
{
    uint64_t cum = 0;
    td_status_t st = TD_OK;
    const char *sep = lbl[0] ? "," : "";

    for (size_t b = 0; st == TD_OK && b <= TD_LOOPSTAT_NBUCKETS; b++) {
        char le[32];
        cum += ls->counts[b];
        if (b < TD_LOOPSTAT_NBUCKETS)
            snprintf(le, sizeof le, "%g", (double)td_loopstat_bounds_us[b] / 1e6);
        else
            snprintf(le, sizeof le, "+Inf");
        st = td_buf_printf(out, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, lbl, sep, le,
                           (unsigned long long)cum);
    }
    if (st == TD_OK)
        st = td_buf_printf(out, "%s_sum%s%s%s %.6f\n%s_count%s%s%s %llu\n", name,
                           lbl[0] ? "{" : "", lbl, lbl[0] ? "}" : "", (double)ls->sum_us / 1e6,
                           name, lbl[0] ? "{" : "", lbl, lbl[0] ? "}" : "",
                           (unsigned long long)cum);
    return st;
}

/* Loop threads (net/loopstat.h): routerd's own, and every rank's from its
 * Load: how long each pass of callbacks took (thread CPU time); the
 * longest too. A loop thread never computes: the tail says whether one
 * did. */
static td_status_t
loop_metrics(td_router_t *r, td_buf_t *out)
{
    td_status_t st = td_metrics_header(out, "tandem_router_loop_pass_seconds", "histogram",
                                       "routerd's event loop: each pass's callbacks, thread "
                                       "cpu time");
    if (st == TD_OK)
        st = loop_hist(out, "tandem_router_loop_pass_seconds", "", &r->loop);
    if (st == TD_OK)
        st = td_metrics_header(out, "tandem_router_rank_loop_pass_seconds", "histogram",
                               "a worker rank's event loop: each pass's callbacks, thread cpu "
                               "time (from its Load)");
    for (const td_rrank_t *rk = r->cluster.ranks; st == TD_OK && rk; rk = rk->next) {
        char node[2 * TD_HELLO_NODE_ID_MAX + 1], lbl[256];
        if (rk->loop.n == 0)
            continue;
        label_escape(node, sizeof node, rk->node->name);
        snprintf(lbl, sizeof lbl, "node=\"%s\",rank=\"%u\",role=\"%s\"", node, rk->rank_id,
                 td_hello_role_str(rk->role));
        st = loop_hist(out, "tandem_router_rank_loop_pass_seconds", lbl, &rk->loop);
    }
    if (st == TD_OK)
        st = td_metrics_header(out, "tandem_router_rank_loop_pass_max_seconds", "gauge",
                               "a worker rank's longest loop pass since it started");
    for (const td_rrank_t *rk = r->cluster.ranks; st == TD_OK && rk; rk = rk->next) {
        char node[2 * TD_HELLO_NODE_ID_MAX + 1];
        if (rk->loop.n == 0)
            continue;
        label_escape(node, sizeof node, rk->node->name);
        st = td_buf_printf(out, "tandem_router_rank_loop_pass_max_seconds{node=\"%s\",rank="
                           "\"%u\",role=\"%s\"} %.6f\n", node, rk->rank_id,
                           td_hello_role_str(rk->role), (double)rk->loop.max_us / 1e6);
    }
    return st;
}

/* The admission queue now (its waits are the queue_wait histogram). */
static td_status_t
queue_gauges(td_router_t *r, td_buf_t *out)
{
    td_rqueue_stats_t q;
    td_status_t st;

    td_rreq_queue_stats(r->reqs, &q);
    st = td_metrics_header(out, "tandem_router_queue_length", "gauge",
                           "requests waiting in the admission queue for a decode rank with room");
    if (st == TD_OK)
        st = td_buf_printf(out, "tandem_router_queue_length %zu\n", q.len);
    if (st == TD_OK)
        st = td_metrics_header(out, "tandem_router_queue_max", "gauge",
                               "most requests the admission queue holds (max-queued)");
    if (st == TD_OK)
        st = td_buf_printf(out, "tandem_router_queue_max %zu\n", q.max_queued);
    if (st == TD_OK)
        st = td_metrics_header(out, "tandem_router_queue_oldest_seconds", "gauge",
                               "how long the longest-waiting queued request has waited");
    if (st == TD_OK)
        st = td_buf_printf(out, "tandem_router_queue_oldest_seconds %.6f\n",
                           (double)q.oldest_ns / 1e9);
    return st;
}

/* The Responses store as its last trim found it (responses-dir only). */
static td_status_t
store_gauges(td_router_t *r, td_buf_t *out)
{
    td_rstore_stats_t ss;
    td_status_t st = TD_OK;

    if (r->store == NULL)
        return TD_OK;
    td_rstore_stats(r->store, &ss);
    const struct { const char *name, *type, *help; unsigned long long v; } g[] = {
        { "tandem_router_responses_stored_bytes", "gauge",
          "stored responses' bytes after this router's last write", ss.bytes },
        { "tandem_router_responses_stored", "gauge",
          "stored responses after this router's last write", ss.files },
        { "tandem_router_responses_max_bytes", "gauge", "responses-max-bytes: their budget",
          ss.max_bytes },
        { "tandem_router_responses_dropped_total", "counter",
          "stored responses this router dropped, the oldest first (budget or age)", ss.dropped },
    };
    for (size_t i = 0; st == TD_OK && i < sizeof g / sizeof g[0]; i++) {
        st = td_metrics_header(out, g[i].name, g[i].type, g[i].help);
        if (st == TD_OK)
            st = td_buf_printf(out, "%s %llu\n", g[i].name, g[i].v);
    }
    return st;
}

void
td_route_metrics(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    td_buf_t out = {0};
    uint64_t states[TD_RREQ_NSTATES];
    td_status_t st = td_metrics_render(&r->metrics, &out);

    if (st == TD_OK)
        st = rank_gauges(r, &out);
    if (st == TD_OK)
        st = cache_metrics(r, &out);
    if (st == TD_OK)
        st = td_metrics_header(&out, "tandem_router_requests_in_flight", "gauge",
                               "this router's requests in flight by state (its queue)");
    td_rreq_count_states(r->reqs, states);
    for (int s = TD_RREQ_NEW; st == TD_OK && s < TD_RREQ_DONE; s++)
        st = td_buf_printf(&out, "tandem_router_requests_in_flight{state=\"%s\"} %llu\n",
                           td_rreq_state_str((td_rreq_state_t)s),
                           (unsigned long long)states[s]);
    if (st == TD_OK)
        st = queue_gauges(r, &out);
    if (st == TD_OK)
        st = flow_gauges(r, &out);
    if (st == TD_OK)
        st = store_gauges(r, &out);
    if (st == TD_OK)
        st = loop_metrics(r, &out);
    if (st == TD_OK) {
        td_http_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", out.data, out.len);
    } else {
        td_openai_err_t e;
        td_openai_err_internal(&e, "could not render the metrics");
        td_http_reply_err(req, &e);
    }
    td_buf_free(&out);
}
