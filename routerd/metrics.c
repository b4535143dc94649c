/* routerd/metrics.c — counters and latency histograms, rendered in the
 * Prometheus text exposition format (version 0.0.4). */
#include "metrics.h"

static const char *const outcome_names[TD_OUTCOME_N] = {
    "done", "failed", "canceled", "rejected",
};

static const char *const errreason_names[TD_ERRREASON_N] = {
    "bad_request", "unauthorized", "not_found", "too_large", "no_capacity", "queue_full",
    "queue_timeout", "too_long",
    "rank_lost", "prefill_failed", "decode_failed", "timeout", "shutdown", "internal",
    "slow_reader",
};

/* Upper bounds in seconds: 100 us .. 10 s, roughly x2 (the router's own share
 * of TTFT is in the first buckets). */
static const double buckets[TD_METRICS_NBUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
};

/* Waits in the admission queue: 1 ms .. 5 min (the queue timeout's range). */
static const double wait_buckets[TD_METRICS_NBUCKETS] = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1, 2.5, 5, 10, 30, 60, 120, 300,
};

const char *
td_metrics_outcome_str(td_outcome_t o)
{
    return (unsigned)o < TD_OUTCOME_N ? outcome_names[o] : "?";
}

const char *
td_metrics_errreason_str(td_errreason_t r)
{
    return (unsigned)r < TD_ERRREASON_N ? errreason_names[r] : "?";
}

static void
hist_observe(td_metrics_hist_t *h, const double *le, double seconds)
{
    size_t i = 0;

    while (i < TD_METRICS_NBUCKETS && seconds > le[i])
        i++;
    h->counts[i]++;
    h->n++;
    h->sum += seconds;
}

void
td_metrics_observe(td_metrics_hist_t *h, double seconds)
{
    hist_observe(h, buckets, seconds);
}

void
td_metrics_observe_wait(td_metrics_hist_t *h, double seconds)
{
    hist_observe(h, wait_buckets, seconds);
}

td_status_t
td_metrics_header(td_buf_t *out, const char *name, const char *type, const char *help)
{
    return td_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static td_status_t
hist_render(td_buf_t *out, const char *name, const char *help, const td_metrics_hist_t *h,
            const double *le)
{
    td_status_t st = td_metrics_header(out, name, "histogram", help);
    uint64_t cum = 0;

    for (size_t i = 0; st == TD_OK && i < TD_METRICS_NBUCKETS; i++) {
        cum += h->counts[i];
        st = td_buf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, le[i],
                           (unsigned long long)cum);
    }
    if (st == TD_OK)
        st = td_buf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n",
                           name, (unsigned long long)h->n, name, h->sum, name,
                           (unsigned long long)h->n);
    return st;
}

td_status_t
td_metrics_render(const td_metrics_t *m, td_buf_t *out)
{
    td_status_t st = td_metrics_header(out, "tandem_router_requests_total", "counter",
                                       "requests by outcome");

    for (int o = 0; st == TD_OK && o < TD_OUTCOME_N; o++)
        st = td_buf_printf(out, "tandem_router_requests_total{outcome=\"%s\"} %llu\n",
                           outcome_names[o], (unsigned long long)m->requests[o]);
    if (st == TD_OK)
        st = td_metrics_header(out, "tandem_router_errors_total", "counter",
                               "error responses and error events by reason");
    for (int r = 0; st == TD_OK && r < TD_ERRREASON_N; r++)
        st = td_buf_printf(out, "tandem_router_errors_total{reason=\"%s\"} %llu\n",
                           errreason_names[r], (unsigned long long)m->errors[r]);
    if (st == TD_OK)
        st = hist_render(out, "tandem_router_ttft_seconds",
                         "time from request received to first token sent", &m->ttft, buckets);
    if (st == TD_OK)
        st = hist_render(out, "tandem_router_inter_token_seconds",
                         "time between token messages of one request", &m->itl, buckets);
    if (st == TD_OK)
        st = hist_render(out, "tandem_router_queue_wait_seconds",
                         "time requests spent in the admission queue, per stay", &m->queue_wait,
                         wait_buckets);
    const struct { const char *name, *help; uint64_t v; } counters[] = {
        { "tandem_router_kv_bytes_moved_total",
          "kv bytes of finished prefills pushed to decode ranks (from the kv layout)",
          m->kv_bytes_moved },
        { "tandem_router_prompt_tokens_total", "prompt tokens of admitted requests",
          m->prompt_tokens },
        { "tandem_router_completion_tokens_total", "tokens streamed to clients",
          m->completion_tokens },
        { "tandem_router_retries_total", "re-admissions after a reject or a lost rank",
          m->retries },
        { "tandem_router_kept_states_total",
          "finished requests whose state a decode rank kept for a next turn", m->kept_noted },
        { "tandem_router_continue_total",
          "requests sent to the decode rank keeping the state they continue", m->continue_sent },
        { "tandem_router_continue_refused_total",
          "of those, refused by the decode rank (state gone or no room) and admitted anew",
          m->continue_refused },
        { "tandem_router_continue_kept_tokens_total",
          "prompt tokens those requests took from kept states", m->continue_kept_tokens },
        { "tandem_router_continue_prefill_tokens_total",
          "prompt tokens their decode ranks prefilled", m->continue_suffix_tokens },
        { "tandem_router_streams_paused_total",
          "times a stream's decode row was paused: its client read slower than it was "
          "generated (stream-buffer-max, response-buffer-max)", m->streams_paused },
        { "tandem_router_streams_resumed_total", "of those, resumed once the client read",
          m->streams_resumed },
        { "tandem_router_slow_readers_timeout_total",
          "streams canceled: paused longer than slow-reader-timeout", m->slow_timeout },
        { "tandem_router_slow_readers_evicted_total",
          "streams canceled: the oldest paused when a decode rank's paused budget was full",
          m->slow_evicted },
    };
    for (size_t i = 0; st == TD_OK && i < sizeof counters / sizeof counters[0]; i++) {
        st = td_metrics_header(out, counters[i].name, "counter", counters[i].help);
        if (st == TD_OK)
            st = td_buf_printf(out, "%s %llu\n", counters[i].name,
                               (unsigned long long)counters[i].v);
    }
    return st;
}
