/* sim/gpucost.h — a GPU cost model: how long a prefill chunk, a decode step,
 * the expert all-to-all and a KV transfer take on a GPU, from a model's
 * config.json (DeepSeek-V4.1 or V3) and a GPU profile whose every constant
 * names its source (deploy/profiles/, docs/costmodel.md). Used by the
 * synthetic engine to set its speed and by tools/costmodel. */
#ifndef TD_GPUCOST_H
#define TD_GPUCOST_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct td_gpucost td_gpucost_t;

/* What to build a cost model from. Paths are read at create; the text
 * fields, when set, are used instead of the paths (tests, embedded
 * profiles). Precision overrides are bit widths (16, 8 or 4), 0 = the
 * model's own: dense linears, routed experts, the KV cache (V3 only:
 * V4.1's KV formats are fixed by the model) and the attention math. */
typedef struct {
    const char *profile;        /* a GPU profile (deploy/profiles/h200.json) */
    const char *model;          /* a config.json, or a directory holding one */
    const char *profile_json;   /* the profile's text instead of the file */
    const char *model_json;     /* the config's text instead of the file */
    uint32_t dense_bits, expert_bits, kv_bits, attn_bits;
} td_gpucost_config_t;

/* The terms of one prefill chunk or decode step on one GPU. Compute times
 * are FLOPs over the profile's peak for the term's precision times the
 * compute efficiency; the memory time is the HBM bytes over the HBM
 * bandwidth times its efficiency. total_s = max(compute_s, memory_s) +
 * alltoall_s. */
typedef struct {
    double t_proj;        /* s: attention projections, compressor, indexer projections */
    double t_attn;        /* s: attention over window + top-k (V4.1) or the context (V3) */
    double t_indexer;     /* s: indexer scoring of compressed keys (V4.1) */
    double t_moe;         /* s: routed experts (top-k of this rank's tokens) */
    double t_shared;      /* s: shared experts, router, dense FFN layers (V3) */
    double t_hc;          /* s: hyper-connection mixing (V4.1 mHC) */
    double t_engram;      /* s: engram projections (V4.1) */
    double t_head;        /* s: the output head (rows that need logits) */
    double flops;         /* every term's FLOPs */
    double compute_s;     /* the sum of the compute terms */
    double b_weights;     /* bytes: the weights every pass reads (not experts) */
    double b_experts;     /* bytes: the distinct experts the pass hits on this rank */
    double b_kv;          /* bytes: KV read and written */
    double b_engram;      /* bytes: engram table rows gathered */
    double bytes;         /* all of them */
    double memory_s;      /* bytes over the HBM bandwidth */
    double experts_hit;   /* expected distinct experts per MoE layer on this rank */
    double alltoall_s;    /* dispatch + combine, every MoE layer */
    double total_s;
} td_gpucost_terms_t;

/* What the model and profile amount to. */
typedef struct {
    const char *model_type;       /* "deepseek_v41" or "deepseek_v3" */
    const char *profile_name;     /* the profile's "name" */
    uint32_t layers, moe_layers, experts, topk, hidden;
    double kv_bytes_per_token;    /* paged KV a request holds and transfers per token */
    double kv_fixed_bytes;        /* per request: windows, partial groups, counters */
    double dense_weight_bytes;    /* every weight but the routed experts (every rank holds them) */
    double expert_weight_bytes;   /* all routed experts */
    double flops_per_token;       /* linears only (2 x active parameters), no attention */
    double hbm_bytes;             /* the profile's HBM capacity */
    double nvlink_domain;         /* GPUs in one NVLink domain */
} td_gpucost_info_t;

/* Build a cost model: read and check the profile (every field present, a
 * number in range, with a non-empty "source") and the model config. A
 * missing or bad field is TD_ERR_INVALID, a model type other than
 * deepseek_v41 / deepseek_v3 TD_ERR_UNSUPPORTED, an unreadable file
 * TD_ERR_NOT_FOUND or TD_ERR_IO; each logged once with the file and field.
 * *out is set only on success; the caller destroys it. */
td_status_t td_gpucost_create(const td_gpucost_config_t *cfg, td_gpucost_t **out);
void td_gpucost_destroy(td_gpucost_t *c);

td_status_t td_gpucost_info(const td_gpucost_t *c, td_gpucost_info_t *out);

/* The terms of a prefill chunk of ntokens_new tokens after ncontext_before
 * earlier (cached or prefilled) tokens of the same request, on one GPU of a
 * group of `ranks` (DEP: attention per rank, the experts split across the
 * group, every rank with a chunk of this size). */
td_status_t td_gpucost_prefill_terms(const td_gpucost_t *c, uint64_t ntokens_new,
                                     uint64_t ncontext_before, uint32_t ranks,
                                     td_gpucost_terms_t *out);

/* The terms of one decode step of batch_rows rows holding sum_context_tokens
 * tokens in all (before the step) on one GPU of a domain of ranks_in_domain
 * GPUs, every rank with a batch of this size. */
td_status_t td_gpucost_decode_terms(const td_gpucost_t *c, uint64_t batch_rows,
                                    uint64_t sum_context_tokens, uint32_t ranks_in_domain,
                                    td_gpucost_terms_t *out);

/* Seconds, from the functions above (total_s). Pure: they read c only and
 * cannot fail on a created model; zero tokens or rows take 0 s, ranks 0 is 1. */
double td_gpucost_prefill_s(const td_gpucost_t *c, uint64_t ntokens_new,
                            uint64_t ncontext_before, uint32_t ranks);
double td_gpucost_decode_step_s(const td_gpucost_t *c, uint64_t batch_rows,
                                uint64_t sum_context_tokens, uint32_t ranks_in_domain);
/* The expert all-to-all of `tokens` tokens of one rank in a group of
 * `ranks`: hidden x top-k elements dispatched and combined, every MoE layer,
 * over NVLink inside the profile's NVLink domain and the network beyond it. */
double td_gpucost_alltoall_s(const td_gpucost_t *c, uint64_t tokens, uint32_t ranks);
/* A request's KV after ntokens tokens (paged entries + fixed state) over one
 * GPU's network link. */
double td_gpucost_kv_xfer_s(const td_gpucost_t *c, uint64_t ntokens);

/* Print the model, the profile with every constant's source, to out. */
td_status_t td_gpucost_describe(const td_gpucost_t *c, FILE *out);
/* Print one table of terms (milliseconds, GB, shares) under a title. */
td_status_t td_gpucost_terms_print(const td_gpucost_terms_t *t, const char *title, FILE *out);

#endif
