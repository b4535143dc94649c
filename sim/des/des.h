/* sim/des/des.h — a discrete-event model of a Tandem cluster (prefill
 * groups, decode domains, routerd) in virtual time, built on routerd's own
 * scheduling code: the rank table (rrank.h), the picks (rsched.h), the
 * announced prefix caches (rcache.h) and the admission queue (rqueue.h).
 * What is modelled rather than the project's code (step times, the prefill
 * ranks' prefix cache, decode admission by blocks and rows) is in
 * docs/scale.md.
 * Ownership: the caller owns the requests (td_des_req_t) and the cost
 * model's argument; td_des_t owns its ranks, its queue and the per-request
 * state it keeps while running. */
#ifndef TD_DES_H
#define TD_DES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* ======================================================================= */
/* The cost model                                                           */
/* ======================================================================= */

/* Seconds of one step of work on a rank of a group of `ranks` ranks that
 * step together (a prefill group's DEP size, a decode domain's size; 1 for a
 * rank alone). The counts are the rank's own; the group's step lasts as long
 * as its slowest rank's.
 *   prefill_s:     ntokens_new prompt tokens computed after ncontext_before
 *                  tokens already in the KV (cached or earlier chunks);
 *   decode_step_s: one decode step of batch_rows rows whose contexts sum to
 *                  sum_context tokens (each row makes one token);
 *   kv_xfer_s:     moving the KV of ntokens prompt tokens from a prefill rank
 *                  to a decode rank, after the prefill's last chunk. */
typedef struct {
    double (*prefill_s)(void *arg, uint64_t ntokens_new, uint64_t ncontext_before,
                        uint32_t ranks);
    double (*decode_step_s)(void *arg, uint32_t batch_rows, uint64_t sum_context,
                            uint32_t ranks);
    double (*kv_xfer_s)(void *arg, uint64_t ntokens);
    void *arg;
} td_des_cost_t;

/* The built-in cost: linear, ranks ignored (des takes its constants as
 * options, docs/scale.md).
 *   prefill = fixed + token * new + attn * new * (before + new / 2)
 *   decode  = fixed + row * rows + ctx * sum_context
 *   xfer    = fixed + token * ntokens */
typedef struct {
    double prefill_fixed_s, prefill_token_s, prefill_attn_s;
    double decode_fixed_s, decode_row_s, decode_ctx_s;
    double xfer_fixed_s, xfer_token_s;
} td_des_linear_t;

/* The interface over l (borrowed: it must outlive the model). */
td_des_cost_t td_des_linear_cost(td_des_linear_t *l);

/* ======================================================================= */
/* The cluster and the requests                                             */
/* ======================================================================= */

typedef struct {
    uint32_t prefill_groups;        /* prefill engines (disaggregated) */
    uint32_t group_gpus;            /* ranks per prefill group (its DEP size) */
    uint32_t decode_gpus;           /* decode ranks in all */
    uint32_t decode_domain;         /* ranks per decode DEP domain (1: none) */
    bool colocated;                 /* no prefill ranks: the decode ranks prefill too */
    uint32_t chunk_tokens;          /* prefill chunk, tokens */
    uint32_t prefill_max_running;   /* prefill tasks taking chunks round robin, per rank */
    uint32_t cache_block_tokens;    /* prefix cache block G (0: no prefix cache) */
    uint64_t cache_blocks;          /* prefix cache capacity per rank, blocks */
    double cache_weight;            /* routerd's --cache-weight */
    uint64_t kv_tokens;             /* decode KV per rank, tokens */
    uint32_t kv_block_tokens;       /* decode KV block, tokens */
    uint32_t max_batch;             /* decode rows per rank */
    uint64_t max_context;           /* registered max context (prompt + output) */
    size_t max_queued;              /* routerd's --max-queued */
    uint32_t trace_block_tokens;    /* tokens per request block id (the trace's 512) */
    bool pick_full;                 /* the decode pick over the whole table in one call
                                       (the same choice, O(ranks^2) with domains) */
    td_des_cost_t cost;
} td_des_config_t;

/* Defaults (docs/scale.md); cost: none (set it). */
void td_des_config_defaults(td_des_config_t *cfg);

typedef enum {
    TD_DES_PENDING = 0,     /* not run (yet) */
    TD_DES_DONE,
    TD_DES_TOO_LONG,        /* no rank could ever hold it (routerd's 400) */
    TD_DES_REFUSED,         /* queue full or no rank (routerd's 503) */
} td_des_outcome_t;

const char *td_des_outcome_str(td_des_outcome_t o);

/* One request: inputs set by the caller, results by td_des_run. */
typedef struct {
    double t_arrive;            /* s, non-decreasing over the array */
    uint32_t input;             /* prompt tokens (>= 1) */
    uint32_t output;            /* output tokens (>= 1) */
    uint32_t nblocks;           /* block ids: ceil(input / trace_block_tokens) */
    const uint64_t *block_ids;  /* [nblocks] equal ids = equal blocks (borrowed) */
    /* results */
    td_des_outcome_t outcome;
    double t_admit;             /* decode rank and prefill rank chosen */
    double t_prefill_start;     /* its first chunk began */
    double t_prefill_end;       /* its last chunk ended */
    double t_first;             /* first output token */
    double t_last;              /* last output token */
    uint64_t cached_tokens;     /* served from the prefix cache */
    uint64_t pred_cached;       /* the router expected cached (its pick) */
    bool by_cache;              /* the cache changed the router's choice */
    uint32_t prefill_rank;      /* index among the prefill ranks (colocated: decode) */
    uint32_t decode_rank;
} td_des_req_t;

typedef struct td_des_s td_des_t;

/* TD_ERR_INVALID for a configuration that cannot run (logged). */
td_status_t td_des_create(const td_des_config_t *cfg, td_des_t **out);
void td_des_destroy(td_des_t *d);

/* Run reqs[0..n) to the end (a model runs once). */
td_status_t td_des_run(td_des_t *d, td_des_req_t *reqs, size_t n);

/* Poisson arrivals at rate (requests/s) from seed: reqs[0] at 0, then
 * exponential gaps; the same seed gives the same times. */
void td_des_poisson(td_des_req_t *reqs, size_t n, double rate, uint64_t seed);

/* Events handled by the run. */
uint64_t td_des_events(const td_des_t *d);

/* ======================================================================= */
/* Results                                                                  */
/* ======================================================================= */

typedef struct {
    size_t n, done, too_long, refused;
    size_t slo_met;             /* done, TTFT <= ttft_slo and TPOT <= tpot_slo */
    double attainment;          /* slo_met / n */
    double ttft_p50, ttft_p99, ttft_mean;      /* s, over the done */
    double tpot_p50, tpot_p99, tpot_mean;      /* s, over the done with output > 1 */
    double makespan_s;          /* first arrival to last token */
    double req_per_s;           /* done / makespan */
    double out_tok_per_s;       /* output tokens of the done / makespan */
    double hit_ratio;           /* cached / prompt tokens of the done */
} td_des_summary_t;

/* TTFT = t_first - t_arrive; TPOT = (t_last - t_first) / (output - 1), 0 for
 * one token. TD_ERR_NOMEM. */
td_status_t td_des_summarize(const td_des_req_t *reqs, size_t n, double ttft_slo,
                             double tpot_slo, td_des_summary_t *out);

#endif
