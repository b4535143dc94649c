/* tools/des.c — des: the cluster model (des.h) over a request
 * trace (Mooncake's JSON lines: timestamp, input_length, output_length,
 * hash_ids), replayed at its timestamps or as Poisson arrivals; prints TTFT,
 * TPOT, SLO attainment and throughput, as text or JSON (docs/scale.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "clock.h"
#include "config.h"
#include "des.h"
#include "gpucost.h"
#include "log.h"

/* The JSON output's version: bumped when a key changes meaning or goes. */
#define DES_JSON_VERSION 1

typedef struct {
    char *trace;
    uint64_t requests;
    uint64_t repeat;
    double rate_scale;
    double poisson;
    uint64_t seed;
    uint64_t prefill_groups, group_gpus, decode_gpus, decode_domain;
    bool colocated;
    uint64_t chunk_tokens, max_running, cache_block_tokens, cache_blocks;
    double cache_weight;
    uint64_t kv_tokens, kv_block_tokens, max_batch, max_context, max_queued;
    uint64_t trace_block_tokens;
    double ttft_slo, tpot_slo;
    bool pick_full;
    bool json;
    char *per_request;
    char *gpu_profile, *gpu_model;   /* the GPU cost model (sim/gpucost.h), or "" */
    uint64_t gpu_prefill_ranks, gpu_decode_ranks;   /* its group sizes (0: the model's) */
    td_des_linear_t lin;
} des_cfg_t;

#define C des_cfg_t
static const td_config_opt_t des_opts[] = {
    TD_CONFIG_OPT_STRING("trace", C, trace, "", "the trace (JSON lines), required"),
    TD_CONFIG_OPT_UINT64("requests", C, requests, "0", 0, 0,
                         "the first N requests of the trace (0: all)"),
    TD_CONFIG_OPT_UINT64("repeat", C, repeat, "1", 1, 1000,
                         "the requests K times, each copy's hash ids its own (new "
                         "conversations) and after the one before"),
    TD_CONFIG_OPT_UINT64("trace-block-tokens", C, trace_block_tokens, "512", 1, 1u << 20,
                         "tokens per hash id of the trace"),
    TD_CONFIG_OPT_DOUBLE("rate-scale", C, rate_scale, "1", 1e-6, 1e6,
                         "replay: arrivals at the trace's timestamps divided by this"),
    TD_CONFIG_OPT_DOUBLE("poisson", C, poisson, "0", 0, 1e9,
                         "Poisson arrivals at this rate (requests/s) instead of the "
                         "timestamps; the requests in trace order (0: replay)"),
    TD_CONFIG_OPT_UINT64("seed", C, seed, "1", 0, 0, "the Poisson arrivals' seed"),
    TD_CONFIG_OPT_UINT64("prefill-groups", C, prefill_groups, "6", 0, 1u << 20,
                         "prefill engines (disaggregated)"),
    TD_CONFIG_OPT_UINT64("group-gpus", C, group_gpus, "4", 1, 1024,
                         "ranks (GPUs) per prefill engine: its DEP size"),
    TD_CONFIG_OPT_UINT64("decode-gpus", C, decode_gpus, "72", 1, 1u << 20, "decode ranks"),
    TD_CONFIG_OPT_UINT64("decode-ranks-per-domain", C, decode_domain, "8", 1, 1024,
                         "decode ranks per DEP domain (they step together)"),
    TD_CONFIG_OPT_BOOL("colocated", C, colocated, "false",
                       "no prefill ranks: the decode ranks prefill too (a chunk with each step)"),
    TD_CONFIG_OPT_UINT64("chunk-tokens", C, chunk_tokens, "512", 1, 1u << 24,
                         "prefill chunk (tokens per rank and step; prefilld's chunk-tokens)"),
    TD_CONFIG_OPT_UINT64("max-running", C, max_running, "8", 1, 4096,
                         "prefill tasks per rank taking chunks round robin (prefilld's "
                         "max-running)"),
    TD_CONFIG_OPT_UINT64("cache-block-tokens", C, cache_block_tokens, "512", 0, 1u << 20,
                         "prefix cache block (0: no prefix cache)"),
    TD_CONFIG_OPT_UINT64("cache-blocks", C, cache_blocks, "16384", 0, 1ull << 32,
                         "prefix cache capacity per rank in blocks (0: none)"),
    TD_CONFIG_OPT_DOUBLE("cache-weight", C, cache_weight, "1.0", 0.0, 1000.0,
                         "routerd's cache-weight: cached tokens against queued ones"),
    TD_CONFIG_OPT_UINT64("kv-tokens", C, kv_tokens, "1048576", 1, 1ull << 40,
                         "decode KV capacity per rank (tokens)"),
    TD_CONFIG_OPT_UINT64("kv-block-tokens", C, kv_block_tokens, "64", 1, 1u << 20,
                         "decode KV block (tokens)"),
    TD_CONFIG_OPT_UINT64("max-batch", C, max_batch, "64", 1, 1u << 20,
                         "decode batch rows per rank"),
    TD_CONFIG_OPT_UINT64("max-context", C, max_context, "131072", 1, 1ull << 40,
                         "longest prompt + output a decode rank takes"),
    TD_CONFIG_OPT_UINT64("max-queued", C, max_queued, "1048576", 0, 1ull << 32,
                         "routerd's max-queued (admission queue bound)"),
    TD_CONFIG_OPT_DOUBLE("ttft-slo", C, ttft_slo, "5", 0, 1e9, "TTFT SLO (s)"),
    TD_CONFIG_OPT_DOUBLE("tpot-slo", C, tpot_slo, "0.1", 0, 1e9, "TPOT SLO (s)"),
    TD_CONFIG_OPT_BOOL("pick-full", C, pick_full, "false",
                       "the decode pick in one call over the whole table (the same choice; "
                       "slow with many DEP domains)"),
    TD_CONFIG_OPT_BOOL("json", C, json, "false", "print the result as JSON"),
    TD_CONFIG_OPT_STRING("per-request", C, per_request, "",
                         "write one JSON line per request to this file"),
    TD_CONFIG_OPT_STRING("gpu-profile", C, gpu_profile, "",
                         "the GPU cost model's profile (deploy/profiles/*.json; with "
                         "gpu-model: the cost instead of the linear one below)"),
    TD_CONFIG_OPT_STRING("gpu-model", C, gpu_model, "",
                         "the model config.json the GPU cost model reads "
                         "(deploy/models/deepseek-v41-flash.json)"),
    TD_CONFIG_OPT_UINT64("gpu-prefill-ranks", C, gpu_prefill_ranks, "0", 0, 1u << 20,
                         "the GPU cost model charges a prefill rank as a GPU of a group of "
                         "this size (0: group-gpus; the processes' synth-gpu-ranks)"),
    TD_CONFIG_OPT_UINT64("gpu-decode-ranks", C, gpu_decode_ranks, "0", 0, 1u << 20,
                         "... and a decode rank as a GPU of a domain of this size "
                         "(0: decode-ranks-per-domain)"),
    TD_CONFIG_OPT_DOUBLE("prefill-fixed-s", C, lin.prefill_fixed_s, "0.005", 0, 1e6,
                         "linear cost: seconds per prefill chunk"),
    TD_CONFIG_OPT_DOUBLE("prefill-token-s", C, lin.prefill_token_s, "5e-5", 0, 1e6,
                         "linear cost: seconds per prompt token"),
    TD_CONFIG_OPT_DOUBLE("prefill-attn-s", C, lin.prefill_attn_s, "1e-9", 0, 1e6,
                         "linear cost: seconds per prompt token and token before it"),
    TD_CONFIG_OPT_DOUBLE("decode-fixed-s", C, lin.decode_fixed_s, "0.025", 0, 1e6,
                         "linear cost: seconds per decode step"),
    TD_CONFIG_OPT_DOUBLE("decode-row-s", C, lin.decode_row_s, "1.5e-4", 0, 1e6,
                         "linear cost: seconds per batch row"),
    TD_CONFIG_OPT_DOUBLE("decode-ctx-s", C, lin.decode_ctx_s, "3e-9", 0, 1e6,
                         "linear cost: seconds per context token of the batch"),
    TD_CONFIG_OPT_DOUBLE("xfer-fixed-s", C, lin.xfer_fixed_s, "0.001", 0, 1e6,
                         "linear cost: seconds per KV transfer"),
    TD_CONFIG_OPT_DOUBLE("xfer-token-s", C, lin.xfer_token_s, "3e-6", 0, 1e6,
                         "linear cost: seconds per prompt token's KV moved"),
    TD_CONFIG_OPT_END
};
#undef C

/* The GPU cost model (sim/gpucost.h) through des's cost interface; the
 * group sizes it charges for, when they differ from the ones that step
 * together (independent ranks each charged as a GPU of a group, as the
 * synthetic engine's synth-gpu-ranks does). */
typedef struct {
    td_gpucost_t *c;
    uint32_t prefill_ranks, decode_ranks;   /* 0: the model's own */
} gpu_cost_t;

static double
gpu_prefill_s(void *arg, uint64_t n, uint64_t before, uint32_t ranks)
{
    const gpu_cost_t *g = arg;
    return td_gpucost_prefill_s(g->c, n, before, g->prefill_ranks ? g->prefill_ranks : ranks);
}

static double
gpu_decode_step_s(void *arg, uint32_t rows, uint64_t ctx, uint32_t ranks)
{
    const gpu_cost_t *g = arg;
    return td_gpucost_decode_step_s(g->c, rows, ctx, g->decode_ranks ? g->decode_ranks : ranks);
}

static double
gpu_kv_xfer_s(void *arg, uint64_t n)
{
    return td_gpucost_kv_xfer_s(((const gpu_cost_t *)arg)->c, n);
}

/* ======================================================================= */
/* The trace                                                                */
/* ======================================================================= */

typedef struct {
    td_des_req_t *reqs;
    size_t n, cap;
    double *ts;                 /* [n] the trace's timestamps, s */
    uint64_t *ids;              /* every request's block ids, one after another */
    size_t nids, capids;
} trace_t;

static void
trace_free(trace_t *t)
{
    free(t->reqs);
    free(t->ts);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

static int
trace_grow(trace_t *t, size_t nids)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        td_des_req_t *r = realloc(t->reqs, cap * sizeof *r);
        double *ts = r ? realloc(t->ts, cap * sizeof *ts) : NULL;
        if (r)
            t->reqs = r;
        if (!ts)
            return -1;
        t->ts = ts;
        t->cap = cap;
    }
    while (t->nids + nids > t->capids) {
        size_t cap = t->capids ? t->capids * 2 : 65536;
        uint64_t *p = realloc(t->ids, cap * sizeof *p);
        if (!p)
            return -1;
        t->ids = p;
        t->capids = cap;
    }
    return 0;
}

/* Read up to max requests (0: all), their block ids as offsets into t->ids
 * until trace_finish; a line that is not a request is an
 * error naming it. */
static td_status_t
trace_read(const char *path, size_t max, trace_t *t)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t len = 0, lineno = 0;
    td_status_t st = TD_OK;

    if (!f) {
        td_error("trace %s: cannot open", path);
        return TD_ERR_NOT_FOUND;
    }
    while ((max == 0 || t->n < max) && getline(&line, &len, f) > 0) {
        json_error_t jerr;
        json_t *o, *ids;
        json_int_t ts, in, outl;

        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue;
        o = json_loads(line, 0, &jerr);
        if (!o || json_unpack(o, "{s:I, s:I, s:I, s:o}", "timestamp", &ts, "input_length", &in,
                              "output_length", &outl, "hash_ids", &ids) != 0 ||
            !json_is_array(ids) || in < 1 || outl < 0 || ts < 0 ||
            json_array_size(ids) > (size_t)UINT32_MAX) {
            td_error("trace %s:%zu: not a request (timestamp, input_length, output_length, "
                     "hash_ids)", path, lineno);
            json_decref(o);
            st = TD_ERR_INVALID;
            break;
        }
        size_t nb = json_array_size(ids);
        if (trace_grow(t, nb) != 0) {
            json_decref(o);
            st = TD_ERR_NOMEM;
            td_error("trace %s: out of memory at line %zu", path, lineno);
            break;
        }
        for (size_t i = 0; i < nb; i++)
            t->ids[t->nids + i] = (uint64_t)json_integer_value(json_array_get(ids, i));
        t->reqs[t->n] = (td_des_req_t){
            .input = (uint32_t)in, .output = outl > 0 ? (uint32_t)outl : 1,
            .nblocks = (uint32_t)nb, .block_ids = (const uint64_t *)(uintptr_t)t->nids,
        };
        t->ts[t->n] = (double)ts / 1000.0;
        t->nids += nb;
        t->n++;
        json_decref(o);
    }
    free(line);
    fclose(f);
    return st;   /* block ids as offsets into ids (it moves while it grows): trace_finish */
}

/* The requests k times over: copy j's block ids shifted past every id of
 * the copies before it, its timestamps after the last one's by the mean
 * gap. Block ids still offsets (trace_read). TD_ERR_NOMEM. */
static td_status_t
trace_repeat(trace_t *t, uint64_t k)
{
    size_t n = t->n, nids = t->nids;
    uint64_t top = 0;
    double gap = n > 1 ? (t->ts[n - 1] - t->ts[0]) / (double)(n - 1) : 1.0;
    double span = t->ts[n - 1] - t->ts[0] + gap;

    for (size_t i = 0; i < nids; i++)
        top = t->ids[i] > top ? t->ids[i] : top;
    for (uint64_t j = 1; j < k; j++) {
        for (size_t i = 0; i < n; i++) {
            if (trace_grow(t, t->reqs[i].nblocks) != 0)
                return TD_ERR_NOMEM;
            size_t off = (uintptr_t)t->reqs[i].block_ids;
            for (uint32_t b = 0; b < t->reqs[i].nblocks; b++)
                t->ids[t->nids + b] = t->ids[off + b] + j * (top + 1);
            t->reqs[t->n] = t->reqs[i];
            t->reqs[t->n].block_ids = (const uint64_t *)(uintptr_t)t->nids;
            t->ts[t->n] = t->ts[i] + (double)j * span;
            t->nids += t->reqs[i].nblocks;
            t->n++;
        }
    }
    return TD_OK;
}

/* The block ids' offsets become pointers (the array no longer moves). */
static void
trace_finish(trace_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        t->reqs[i].block_ids = t->ids + (uintptr_t)t->reqs[i].block_ids;
}

/* Arrival times: the trace's timestamps / scale (from 0), or a Poisson
 * process at rate with seed. */
static void
arrivals_set(trace_t *t, double scale, double rate, uint64_t seed)
{
    if (rate > 0) {
        td_des_poisson(t->reqs, t->n, rate, seed);
        return;
    }
    for (size_t i = 0; i < t->n; i++)
        t->reqs[i].t_arrive = (t->ts[i] - t->ts[0]) / scale;
}

/* ======================================================================= */
/* Output                                                                   */
/* ======================================================================= */

static json_t *
json_summary(const td_des_summary_t *s)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
                     "s:f, s:f}",
                     "requests", (json_int_t)s->n, "done", (json_int_t)s->done,
                     "too_long", (json_int_t)s->too_long, "refused", (json_int_t)s->refused,
                     "slo_met", (json_int_t)s->slo_met, "attainment", s->attainment,
                     "ttft_p50_s", s->ttft_p50, "ttft_p99_s", s->ttft_p99,
                     "ttft_mean_s", s->ttft_mean, "tpot_p50_s", s->tpot_p50,
                     "tpot_p99_s", s->tpot_p99, "tpot_mean_s", s->tpot_mean,
                     "makespan_s", s->makespan_s, "req_per_s", s->req_per_s,
                     "out_tok_per_s", s->out_tok_per_s, "hit_ratio", s->hit_ratio);
}

static json_t *
json_config(const des_cfg_t *c, double offered)
{
    uint64_t pg = c->colocated ? 0 : c->prefill_groups * c->group_gpus;

    return json_pack("{s:s, s:f, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:I, s:I, s:f, "
                     "s:I, s:I, s:I, s:I, s:f, s:f, s:f}",
                     "arrivals", c->poisson > 0 ? "poisson" : "replay",
                     "rate", c->poisson > 0 ? c->poisson : c->rate_scale,
                     "cost", c->gpu_profile[0] ? "gpu" : "linear",
                     "prefill_groups", (json_int_t)(c->colocated ? 0 : c->prefill_groups),
                     "group_gpus", (json_int_t)c->group_gpus,
                     "prefill_gpus", (json_int_t)pg,
                     "decode_gpus", (json_int_t)c->decode_gpus,
                     "decode_ranks_per_domain", (json_int_t)c->decode_domain,
                     "gpus", (json_int_t)(pg + c->decode_gpus),
                     "colocated", c->colocated,
                     "chunk_tokens", (json_int_t)c->chunk_tokens,
                     "max_running", (json_int_t)c->max_running,
                     "cache_block_tokens", (json_int_t)c->cache_block_tokens,
                     "cache_blocks", (json_int_t)c->cache_blocks,
                     "cache_weight", c->cache_weight,
                     "kv_tokens", (json_int_t)c->kv_tokens,
                     "max_batch", (json_int_t)c->max_batch,
                     "seed", (json_int_t)c->seed, "repeat", (json_int_t)c->repeat,
                     "ttft_slo_s", c->ttft_slo, "tpot_slo_s", c->tpot_slo,
                     "offered_req_per_s", offered);
}

static int
per_request_write(const char *path, const td_des_req_t *r, size_t n)
{
    FILE *f = fopen(path, "w");

    if (!f) {
        td_error("per-request file %s: cannot open", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const td_des_req_t *q = &r[i];
        bool done = q->outcome == TD_DES_DONE;
        double tpot = done && q->output > 1 ? (q->t_last - q->t_first) / (q->output - 1) : 0;
        fprintf(f, "{\"by_cache\": %s, \"cached_tokens\": %llu, \"decode_rank\": %u, "
                "\"i\": %zu, \"input\": %u, \"outcome\": \"%s\", \"output\": %u, "
                "\"prefill_rank\": %u, \"t_arrive\": %.6f, \"tpot_s\": %.6f, \"ttft_s\": %.6f}\n",
                q->by_cache ? "true" : "false", (unsigned long long)q->cached_tokens,
                q->decode_rank, i, q->input, td_des_outcome_str(q->outcome), q->output,
                q->prefill_rank, q->t_arrive, tpot, done ? q->t_first - q->t_arrive : 0);
    }
    return fclose(f) == 0 ? 0 : -1;
}

int
main(int argc, char **argv)
{
    des_cfg_t c;
    td_config_action_t action;
    char err[TD_CONFIG_ERRLEN];
    trace_t t = { 0 };
    td_des_config_t dc;
    td_des_t *d = NULL;
    td_gpucost_t *gpu = NULL;
    gpu_cost_t gcost;
    td_des_summary_t sum;
    int rc = 1;

    if (td_config_defaults(des_opts, &c, err, sizeof err) != TD_OK ||
        td_config_parse_args(des_opts, &c, argc, argv, &action, NULL, err,
                             sizeof err) != TD_OK) {
        fprintf(stderr, "des: %s\n", err);
        return 2;
    }
    if (action == TD_CONFIG_HELP) {
        td_config_usage(des_opts, "des", stdout);
        return 0;
    }
    if (action == TD_CONFIG_DUMP) {
        td_config_dump(des_opts, &c, stdout);
        return 0;
    }
    if (c.trace[0] == '\0') {
        fprintf(stderr, "des: --trace FILE is required\n");
        goto out;
    }
    if (trace_read(c.trace, c.requests, &t) != TD_OK)
        goto out;
    if (t.n == 0) {
        td_error("trace %s: no requests", c.trace);
        goto out;
    }
    if (trace_repeat(&t, c.repeat) != TD_OK) {
        td_error("trace %s: out of memory for %llu copies", c.trace, (unsigned long long)c.repeat);
        goto out;
    }
    trace_finish(&t);
    arrivals_set(&t, c.rate_scale, c.poisson, c.seed);

    td_des_config_defaults(&dc);
    dc.prefill_groups = (uint32_t)c.prefill_groups;
    dc.group_gpus = (uint32_t)c.group_gpus;
    dc.decode_gpus = (uint32_t)c.decode_gpus;
    dc.decode_domain = (uint32_t)c.decode_domain;
    dc.colocated = c.colocated;
    dc.chunk_tokens = (uint32_t)c.chunk_tokens;
    dc.prefill_max_running = (uint32_t)c.max_running;
    dc.cache_block_tokens = (uint32_t)c.cache_block_tokens;
    dc.cache_blocks = c.cache_blocks;
    dc.cache_weight = c.cache_weight;
    dc.kv_tokens = c.kv_tokens;
    dc.kv_block_tokens = (uint32_t)c.kv_block_tokens;
    dc.max_batch = (uint32_t)c.max_batch;
    dc.max_context = c.max_context;
    dc.max_queued = (size_t)c.max_queued;
    dc.trace_block_tokens = (uint32_t)c.trace_block_tokens;
    dc.pick_full = c.pick_full;
    dc.cost = td_des_linear_cost(&c.lin);
    if (c.gpu_profile[0] || c.gpu_model[0]) {   /* the GPU cost model instead */
        td_gpucost_config_t gc = { .profile = c.gpu_profile, .model = c.gpu_model };
        if (!c.gpu_profile[0] || !c.gpu_model[0]) {
            fprintf(stderr, "des: --gpu-profile and --gpu-model go together\n");
            goto out;
        }
        if (td_gpucost_create(&gc, &gpu) != TD_OK)   /* logs why */
            goto out;
        gcost = (gpu_cost_t){ gpu, (uint32_t)c.gpu_prefill_ranks, (uint32_t)c.gpu_decode_ranks };
        dc.cost = (td_des_cost_t){ gpu_prefill_s, gpu_decode_step_s, gpu_kv_xfer_s, &gcost };
    }

    double t0 = td_clock_s();
    if (td_des_create(&dc, &d) != TD_OK || td_des_run(d, t.reqs, t.n) != TD_OK)
        goto out;
    double wall = td_clock_s() - t0;
    if (td_des_summarize(t.reqs, t.n, c.ttft_slo, c.tpot_slo, &sum) != TD_OK)
        goto out;
    double span = t.reqs[t.n - 1].t_arrive - t.reqs[0].t_arrive;
    double offered = span > 0 ? (double)(t.n - 1) / span : 0;
    if (c.per_request[0] && per_request_write(c.per_request, t.reqs, t.n) != 0)
        goto out;
    if (c.json) {
        json_t *o = json_pack("{s:i, s:o, s:o, s:{s:I, s:f}}", "version", DES_JSON_VERSION,
                              "config", json_config(&c, offered), "summary",
                              json_summary(&sum), "run", "events",
                              (json_int_t)td_des_events(d), "wall_s", wall);
        if (!o) {
            td_error("des: out of memory for the JSON output");
            goto out;
        }
        json_dumpf(o, stdout, JSON_SORT_KEYS | JSON_INDENT(2) | JSON_REAL_PRECISION(9));
        fputc('\n', stdout);
        json_decref(o);
    } else {
        printf("requests %zu (offered %.3f/s): done %zu, too long %zu, refused %zu\n", sum.n,
               offered, sum.done, sum.too_long, sum.refused);
        printf("ttft  p50 %.3f s  p99 %.3f s  mean %.3f s\n", sum.ttft_p50, sum.ttft_p99,
               sum.ttft_mean);
        printf("tpot  p50 %.4f s  p99 %.4f s  mean %.4f s\n", sum.tpot_p50, sum.tpot_p99,
               sum.tpot_mean);
        printf("slo (ttft <= %g s, tpot <= %g s): %zu met, attainment %.4f\n", c.ttft_slo,
               c.tpot_slo, sum.slo_met, sum.attainment);
        printf("throughput %.3f req/s, %.1f output tok/s over %.1f s; prefix hit ratio %.4f\n",
               sum.req_per_s, sum.out_tok_per_s, sum.makespan_s, sum.hit_ratio);
        printf("model: %llu events in %.3f s\n", (unsigned long long)td_des_events(d), wall);
    }
    rc = 0;
out:
    td_des_destroy(d);
    td_gpucost_destroy(gpu);
    trace_free(&t);
    td_config_free(des_opts, &c);
    return rc;
}
