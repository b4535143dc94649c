/* decoded/main.c — the decode daemon: its options and its rank (decoded/
 * drank.h) on the worker daemons' shared main (worker/worker.h): one engine
 * shared by M rank threads, each with its own event loop, UCX worker, KV
 * pools and router links; SIGTERM stops taking work, lets the live requests
 * finish up to --drain-timeout, ends what is left with an error and exits.
 * docs/decoded.md. */
#include <inttypes.h>

#include "drank.h"
#include "worker.h"

typedef struct {
    td_worker_opts_t w;
    uint64_t kv_tokens;
    uint64_t max_batch;
    uint64_t retain;
    uint64_t prefill_deadline_max_ms;
    uint64_t quarantine_slots;
    uint64_t quarantine_max_tokens;
    uint64_t pause_slots;
    uint64_t pause_max_bytes;
    char *trace_file;
} decoded_config_t;

static const td_config_opt_t decoded_opts[] = {
    TD_WORKER_CONFIG_OPTS(decoded_config_t, w, "rank threads (one per gpu of the node)",
                          "the prefill ranks' kv transfer deadline in ms; blocks of a request "
                          "whose prefill went silent are freed after "
                          TD_DRANK_GRACE_DEADLINES_STR " times this (the grace period)"),
    TD_CONFIG_OPT_UINT64("kv-tokens", decoded_config_t, kv_tokens, "65536", 1, 1ull << 32,
                         "kv capacity per rank in tokens (sizes every paged pool)"),
    TD_CONFIG_OPT_UINT64("max-batch", decoded_config_t, max_batch, "16", 1, 4096,
                         "requests per rank holding kv at once (batch rows, fixed slots)"),
    TD_CONFIG_OPT_UINT64("retain", decoded_config_t, retain, "0", 0, 4096,
                         "finished requests per rank whose kv the rank keeps for a next turn "
                         "to continue here (routerd's continue-max-suffix; extra fixed slots; "
                         "their blocks yield to new requests); 0: none"),
    TD_CONFIG_OPT_DURATION("prefill-deadline-max", decoded_config_t, prefill_deadline_max_ms,
                           "60s", 1, 3600000,
                           "the longest prefill transfer deadline a router's Admit may name "
                           "(its prefill rank's xfer-deadline-ms); a longer one is clamped to "
                           "this"),
    TD_CONFIG_OPT_UINT64("quarantine-slots", decoded_config_t, quarantine_slots, "4", 0, 4096,
                         "fixed slots per rank for requests whose blocks wait for a fence "
                         "(their prefill rank missed its deadline; docs/decoded.md, "
                         "Fencing), besides the batch rows"),
    TD_CONFIG_OPT_UINT64("quarantine-max", decoded_config_t, quarantine_max_tokens, "0", 0,
                         1ull << 32,
                         "kv tokens per rank that quarantined requests may hold; past it "
                         "admission waits for fences (0: a quarter of kv-tokens)"),
    TD_CONFIG_OPT_UINT64("pause-slots", decoded_config_t, pause_slots, "64", 0, 65536,
                         "fixed slots per rank for requests paused because their clients "
                         "read slowly (they leave the batch, keep their kv), besides the "
                         "batch rows"),
    TD_CONFIG_OPT_SIZE("pause-max", decoded_config_t, pause_max_bytes, "0", 0, 1ull << 44,
                       "kv bytes per rank that paused requests may hold; past it the oldest "
                       "paused request ends (0: a quarter of the pools)"),
    TD_CONFIG_OPT_STRING("trace-file", decoded_config_t, trace_file, "",
                         "append adoption timings to FILE.<rank> (benchmarks)"),
    TD_WORKER_DOMAIN_OPTS(decoded_config_t, w),
    TD_CONFIG_OPT_END
};

static decoded_config_t decoded_cfg;

static td_status_t
decoded_rank_create(td_worker_rank_t *wr, void **out)
{
    const decoded_config_t *c = &decoded_cfg;
    td_drank_config_t rc = {
        .node_id = td_daemon_node_id(wr->w->d),
        .rank_id = wr->id,
        .kv_tokens = c->kv_tokens,
        .max_batch = (uint32_t)c->max_batch,
        .retain = (uint32_t)c->retain,
        .xfer_deadline_ms = (uint32_t)c->w.xfer_deadline_ms,
        .prefill_deadline_max_ms = (uint32_t)c->prefill_deadline_max_ms,
        .quarantine_slots = (uint32_t)c->quarantine_slots,
        .quarantine_max_tokens = c->quarantine_max_tokens,
        .pause_slots = (uint32_t)c->pause_slots,
        .pause_max_bytes = c->pause_max_bytes,
        .trace_path = c->trace_file,
        .prefault = c->w.prefault_pools,
        .compute_start = td_worker_rank_compute_start,
        .compute_arg = wr,
        .step = wr->stepping,
    };
    td_drank_io_t io = { td_worker_rank_send, td_worker_rank_load, wr, td_worker_rank_idle,
                         td_worker_rank_broadcast };
    return td_drank_create(wr->base, wr->xfer, wr->engine, &rc, &io, (td_drank_t **)out);
}

static void
decoded_rank_destroy(void *rank)
{
    td_drank_destroy(rank);
}

static void
decoded_rank_register(void *rank, Tandem__Register *reg)
{
    td_drank_register_fill(rank, reg);
}

/* The routers learn the pools' capacity at once. */
static void
decoded_rank_started(void *rank)
{
    td_drank_load(rank);
}

static void
decoded_rank_message(void *rank, void *router, const Tandem__Envelope *env)
{
    td_drank_on_message(rank, router, env);
}

static void
decoded_rank_router_down(void *rank, void *router)
{
    td_drank_on_router_down(rank, router);
}

/* No new requests; the live ones finish (the worker's drain deadline). */
static void
decoded_rank_stop(void *rank)
{
    td_drank_stop(rank);
}

/* The drain deadline: what is left ends at once (Tokens ERROR). */
static void
decoded_rank_abort(void *rank)
{
    td_drank_abort(rank);
}

/* After the abort nothing is waited for: the last frames' flush only. */
static uint64_t
decoded_stop_ms(const void *cfg)
{
    (void)cfg;
    return 100;
}

static void
decoded_status(const void *cfg, td_buf_t *b)
{
    const decoded_config_t *c = cfg;
    td_buf_printf(b, ", kv-tokens %" PRIu64 ", max-batch %" PRIu64 ", retain %" PRIu64,
                  c->kv_tokens, c->max_batch, c->retain);
}

static const td_worker_spec_t decoded_spec = {
    .ident = "decoded",
    .rank_name = "decode rank",
    .role = TANDEM__ROLE__ROLE_DECODE,
    .opts = decoded_opts,
    .cfg = &decoded_cfg,
    .wcfg = &decoded_cfg.w,
    .rank_create = decoded_rank_create,
    .rank_destroy = decoded_rank_destroy,
    .rank_register = decoded_rank_register,
    .rank_started = decoded_rank_started,
    .rank_message = decoded_rank_message,
    .rank_router_down = decoded_rank_router_down,
    .rank_stop = decoded_rank_stop,
    .rank_abort = decoded_rank_abort,
    .stop_ms = decoded_stop_ms,
    .status = decoded_status,
};

int
main(int argc, char **argv)
{
    return td_worker_main(&decoded_spec, argc, argv);
}
