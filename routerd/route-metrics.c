/* routerd/route-metrics.c — GET /metrics: the router's counters and
 * histograms, plus per-rank gauges (KV blocks and tokens used/free, queue
 * depth, running, in flight, a DEP group's rank's rows per expert), requests in flight by state and the admission
 * queue's length and oldest wait. */
#include "router.h"
#include "route.h"

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
        { "tandem_router_rank_kv_blocks", "kv blocks of a decode rank (used, free)" },
        { "tandem_router_rank_kv_tokens", "kv capacity of a decode rank in tokens (used, free)" },
        { "tandem_router_rank_queue_depth", "requests waiting at a rank (queued, queued_tokens)" },
        { "tandem_router_rank_running", "requests running at a rank" },
        { "tandem_router_rank_inflight", "this router's requests bound to a rank" },
        { "tandem_router_rank_up", "1 when the rank takes requests, else 0" },
        { "tandem_router_rank_expert_tokens",
          "a dep group's rank: rows each routed expert ran there, all layers, since it started" },
    };
    td_status_t st = TD_OK;

    bool dep = false;   /* a DEP group's rank among them: its expert rows */
    for (const td_rrank_t *rk = r->cluster.ranks; rk; rk = rk->next)
        dep = dep || rk->n_expert_tokens > 0;
    for (size_t i = 0; st == TD_OK && i < sizeof g / sizeof g[0]; i++) {
        if (i == 6 && !dep)
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
                    st = td_buf_printf(out, "%s{%s,kind=\"used\"} %llu\n%s{%s,kind=\"free\"} %llu\n",
                                       g[i].name, lbl,
                                       (unsigned long long)(i ? l->kv_tokens_used : l->kv_blocks_used),
                                       g[i].name, lbl,
                                       (unsigned long long)(i ? l->kv_tokens_free : l->kv_blocks_free));
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
        st = td_metrics_header(&out, "tandem_router_requests_in_flight", "gauge",
                               "this router's requests in flight by state (its queue)");
    td_rreq_count_states(r->reqs, states);
    for (int s = TD_RREQ_NEW; st == TD_OK && s < TD_RREQ_DONE; s++)
        st = td_buf_printf(&out, "tandem_router_requests_in_flight{state=\"%s\"} %llu\n",
                           td_rreq_state_str((td_rreq_state_t)s),
                           (unsigned long long)states[s]);
    if (st == TD_OK)
        st = queue_gauges(r, &out);
    if (st == TD_OK) {
        td_http_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8", out.data, out.len);
    } else {
        td_openai_err_t e;
        td_openai_err_internal(&e, "could not render the metrics");
        td_http_reply_err(req, &e);
    }
    td_buf_free(&out);
}
