/* prefilld/main.c — the prefill daemon: its options and its rank (prefilld/
 * prank.h) on the worker daemons' shared main (worker/worker.h): one engine
 * shared by N rank threads, each with its own event loop, UCX worker, router
 * links and task queue; SIGTERM ends every task with its terminal
 * notification before the process exits. docs/prefilld.md. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "chainhash.h"
#include "prank.h"
#include "worker.h"

typedef struct {
    td_worker_opts_t w;
    uint64_t chunk_tokens;
    uint64_t max_queued_tokens;
    uint64_t max_running;
    uint64_t kv_tokens;
    char *trace_file;
    bool layer_streaming;
    uint64_t cache_blocks;
    uint64_t cache_block_tokens;
    uint64_t cache_host_bytes;
    char *cache_dir;
    uint64_t cache_ssd_bytes;
    bool cache_snapshots;
} prefilld_config_t;

static const td_config_opt_t prefilld_opts[] = {
    TD_WORKER_CONFIG_OPTS(prefilld_config_t, w, "rank threads (a prefill group: one per gpu)",
                          "deadline of one kv transfer in ms (decode ranks hold the blocks "
                          "of a request whose prefill failed for twice this)"),
    TD_CONFIG_OPT_UINT64("chunk-tokens", prefilld_config_t, chunk_tokens, "512", 1, 1 << 20,
                         "prompt tokens per prefill chunk"),
    TD_CONFIG_OPT_UINT64("max-queued-tokens", prefilld_config_t, max_queued_tokens, "1048576",
                         0, 0, "prompt tokens not yet prefilled per rank before refusing (0: no cap)"),
    TD_CONFIG_OPT_UINT64("max-running", prefilld_config_t, max_running, "8", 1, 4096,
                         "requests per rank prefilled round-robin, chunk by chunk"),
    TD_CONFIG_OPT_UINT64("kv-tokens", prefilld_config_t, kv_tokens, "131072", 1, 1ull << 32,
                         "kv pool per rank in prompt tokens: the running requests' prompts "
                         "(a longer prompt is refused)"),
    TD_CONFIG_OPT_STRING("trace-file", prefilld_config_t, trace_file, "",
                         "append per-layer compute and put timings to FILE.<rank> (benchmarks)"),
    TD_CONFIG_OPT_BOOL("layer-streaming", prefilld_config_t, layer_streaming, "true",
                       "put each layer's kv as soon as it is computed (false: when the "
                       "whole chunk is, for comparison)"),
    TD_CONFIG_OPT_UINT64("cache-blocks", prefilld_config_t, cache_blocks, "0", 0, 1ull << 24,
                         "prefix cache: cache blocks kept in each rank's kv pool, which grows "
                         "by that many blocks (0: no prefix cache; docs/kvcache.md)"),
    TD_CONFIG_OPT_UINT64("cache-block-tokens", prefilld_config_t, cache_block_tokens, "0", 0,
                         1 << 20, "prefix cache: tokens per cache block, a multiple of the "
                         "smallest the kv layout shares whole (0: that smallest)"),
    TD_CONFIG_OPT_SIZE("cache-host-bytes", prefilld_config_t, cache_host_bytes, "0", 0, 0,
                       "prefix cache: host-memory tier per rank (blocks evicted from the "
                       "pool; 0: none)"),
    TD_CONFIG_OPT_STRING("cache-dir", prefilld_config_t, cache_dir, "",
                         "prefix cache: ssd tier directory (each rank in DIR/rank<N>; it "
                         "survives restarts; \"\": none)"),
    TD_CONFIG_OPT_SIZE("cache-ssd-bytes", prefilld_config_t, cache_ssd_bytes, "1G", 0, 0,
                       "prefix cache: ssd tier budget per rank"),
    TD_CONFIG_OPT_BOOL("cache-snapshots", prefilld_config_t, cache_snapshots, "true",
                       "prefix cache: keep the fixed kv state at each prompt's last block "
                       "end, so that the next turn needs no replay"),
    TD_CONFIG_OPT_END
};

static prefilld_config_t prefilld_cfg;

static td_status_t
prefilld_rank_create(td_worker_rank_t *wr, void **out)
{
    const prefilld_config_t *c = &prefilld_cfg;
    char dir[4096] = "";

    if (c->cache_blocks > 0 && c->cache_dir != NULL && c->cache_dir[0] != '\0') {
        if ((size_t)snprintf(dir, sizeof(dir), "%s/rank%u", c->cache_dir, wr->id) >= sizeof(dir)) {
            td_error("prefilld: --cache-dir %s: path too long", c->cache_dir);
            return TD_ERR_INVALID;
        }
        if (mkdir(c->cache_dir, 0700) != 0 && errno != EEXIST) {   /* the tier makes rankN */
            td_error("prefilld: --cache-dir %s: cannot create it: %s", c->cache_dir,
                     strerror(errno));
            return TD_ERR_IO;
        }
    }
    td_prank_config_t rc = {
        .rank_id = wr->id,
        .chunk_tokens = c->chunk_tokens,
        .max_queued_tokens = c->max_queued_tokens,
        .max_running = (uint32_t)c->max_running,
        .deadline_ms = (uint32_t)c->w.xfer_deadline_ms,
        .kv_tokens = c->kv_tokens,
        .trace_path = c->trace_file,
        .prefault = c->w.prefault_pools,
        .hold_layers = !c->layer_streaming,
        .compute_start = td_worker_rank_compute_start,
        .compute_arg = wr,
        .step = wr->stepping,
        .cache = {
            .block_tokens = (uint32_t)c->cache_block_tokens,
            .max_blocks = c->cache_blocks,
            .seed = td_chain_seed(wr->w->fingerprint, wr->engine->layout->hash),
            .host_bytes = c->cache_host_bytes,
            .ssd_dir = dir,
            .ssd_bytes = c->cache_ssd_bytes,
            .snapshots = c->cache_snapshots,
        },
    };
    td_prank_io_t io = { td_worker_rank_send, td_worker_rank_load, td_worker_rank_idle, wr,
                         td_worker_rank_broadcast };
    return td_prank_create(wr->base, wr->xfer, wr->engine, &rc, &io, (td_prank_t **)out);
}

static void
prefilld_rank_destroy(void *rank)
{
    td_prank_destroy(rank);
}

static void
prefilld_rank_register(void *rank, Tandem__Register *reg)
{
    td_prank_register_fill(rank, reg);
}

static void
prefilld_rank_router_up(void *rank, void *router)
{
    td_prank_on_router_up(rank, router);
}

static void
prefilld_rank_message(void *rank, void *router, const Tandem__Envelope *env)
{
    td_prank_on_message(rank, router, env);
}

static void
prefilld_rank_router_down(void *rank, void *router)
{
    td_prank_on_router_down(rank, router);
}

/* No new Prefill; the tasks in hand finish (the worker's drain deadline). */
static void
prefilld_rank_stop(void *rank)
{
    td_prank_stop(rank);
}

/* The drain deadline: every task left is canceled. */
static void
prefilld_rank_abort(void *rank)
{
    td_prank_abort(rank);
}

/* After the abort: canceled tasks wait for their transfers, which have a
 * deadline. */
static uint64_t
prefilld_stop_ms(const void *cfg)
{
    const prefilld_config_t *c = cfg;
    return 2 * c->w.xfer_deadline_ms + 2000;
}

static const td_worker_spec_t prefilld_spec = {
    .ident = "prefilld",
    .rank_name = "prefill rank",
    .role = TANDEM__ROLE__ROLE_PREFILL,
    .opts = prefilld_opts,
    .cfg = &prefilld_cfg,
    .wcfg = &prefilld_cfg.w,
    .rank_create = prefilld_rank_create,
    .rank_destroy = prefilld_rank_destroy,
    .rank_register = prefilld_rank_register,
    .rank_router_up = prefilld_rank_router_up,
    .rank_message = prefilld_rank_message,
    .rank_router_down = prefilld_rank_router_down,
    .rank_stop = prefilld_rank_stop,
    .rank_abort = prefilld_rank_abort,
    .stop_ms = prefilld_stop_ms,
};

int
main(int argc, char **argv)
{
    return td_worker_main(&prefilld_spec, argc, argv);
}
