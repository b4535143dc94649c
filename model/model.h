/* model/model.h — a loaded DeepSeek-V4.1 text backbone (f32 weights, rope
 * tables, engram hash state; model.c) and its forward pass over per-request
 * caches, views of the callers' KV memory (forward.c): prefill chunks,
 * batched decode, a hook after each layer. docs/forward.md. */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "comm.h"
#include "placement.h"
#include "sample.h"
#include "kernels.h"
#include "modelcfg.h"
#include "status.h"
#include "tokenizer.h"

/* One backbone layer's weights: the linears as prepared matrices
 * (td_kernels_mat_t, owned by the model, NULL where the layer has none),
 * everything else as pointers into the model's f32 arena (NULL where the
 * layer has no such tensor). H = hidden_size, hc = hc_mult, E =
 * n_routed_experts, I = moe_intermediate_size. */
typedef struct {
    /* attention */
    const float *attn_norm;     /* [H] */
    td_kernels_mat_t *wq_a;     /* [q_lora_rank, H] */
    const float *q_norm;        /* [q_lora_rank] */
    td_kernels_mat_t *wq_b;     /* [heads * head_dim, q_lora_rank] */
    td_kernels_mat_t *wkv;      /* [head_dim, H] */
    const float *kv_norm;       /* [head_dim] */
    td_kernels_mat_t *wo_a;     /* o_groups x [o_lora_rank, heads * head_dim / o_groups] */
    td_kernels_mat_t *wo_b;     /* [H, o_groups * o_lora_rank] */
    const float *attn_sink;     /* [heads] */
    /* compressor (kv sources) */
    td_kernels_mat_t *cmp_wkv;  /* [head_dim, H] */
    td_kernels_mat_t *cmp_wgate;/* [head_dim, H], ratio > 1 only */
    const float *cmp_norm;      /* [head_dim] */
    /* indexer (index sources) */
    td_kernels_mat_t *idx_wq_b; /* [index_n_heads * index_head_dim, q_lora_rank] */
    td_kernels_mat_t *idx_wproj;/* [index_n_heads, H] */
    td_kernels_mat_t *idx_wk;   /* [index_head_dim, head_dim], index source that is a kv source */
    const float *idx_k_norm;    /* [index_head_dim] */
    /* MoE */
    const float *ffn_norm;      /* [H] */
    td_kernels_mat_t *gate;     /* [E, H] */
    const float *gate_bias;     /* [E] */
    td_kernels_mat_t **w1, **w3;/* [E] -> [I, H]; NULL for experts another rank holds */
    td_kernels_mat_t **w2;      /* [E] -> [H, I]; likewise */
    td_kernels_mat_t *sw1, *sw3;/* [I, H] the shared expert */
    td_kernels_mat_t *sw2;      /* [H, I] */
    /* engram (engram layers) */
    td_kernels_wsrc_t eg_table; /* [eg_rows, engram_head_dim] as stored (fp8 rows, bf16) or f32 */
    uint64_t eg_rows;
    td_kernels_mat_t *eg_wkv;   /* [H * (hc + 1), (max_ngram - 1) * engram_n_heads * engram_head_dim] */
    float *eg_qk;               /* [hc, H] q_weight * k_weight (computed at load) */
    /* hyper-connections */
    td_kernels_mat_t *hc_attn_fn;   /* [(2 + hc) * hc, hc * H] */
    const float *hc_attn_base;  /* [(2 + hc) * hc] */
    const float *hc_attn_scale; /* [3] */
    td_kernels_mat_t *hc_ffn_fn;
    const float *hc_ffn_base, *hc_ffn_scale;
} td_model_layer_t;

/* The engram hash state of the reference's DeepseekV41NgramHashState. */
typedef struct {
    uint32_t *token_map;        /* [map_size] token id -> compressed class */
    uint32_t map_size;          /* the tokenizer's vocabulary */
    int64_t pad_class;          /* token_map[engram_pad_id] */
    int64_t *mult;              /* [layers, max_ngram] odd hash multipliers */
    uint64_t *primes;           /* [layers, (max_ngram - 1) * heads] bucket sizes */
    uint64_t *offsets;          /* [layers, (max_ngram - 1) * heads] bucket starts */
} td_model_engram_t;

/* A loaded model. Owns everything it points to; immutable after load, so
 * several threads may run forward passes on it at once (each on its own
 * caches). */
typedef struct {
    td_modelcfg_t *cfg;
    const td_kernels_ops_t *ops;
    td_tokenizer_t *tok;        /* NULL when the directory has no tokenizer.json */
    const td_cache_plan_t *plan;/* the per-request cache layout (owned) */

    td_kernels_wsrc_t embed;    /* [vocab_size, H] as stored (bf16) or f32 */
    const float *norm;          /* [H] */
    td_kernels_mat_t *head;     /* [vocab_size, H] (made from embed when tied) */
    td_model_layer_t *layers;   /* [num_hidden_layers] */

    /* rope: inverse frequencies of qk_rope_head_dim / 2 pairs and the cos/sin
     * factor (YaRN's attention factor), for window-only layers (main) and
     * layers with a compressed branch (compress) */
    float *inv_freq_main, *inv_freq_compress;
    float rope_scale_main, rope_scale_compress;

    td_model_engram_t engram;   /* zero when the config has no engram layers */

    float *arena;               /* every f32 weight but the linears' */
    size_t arena_floats;
    td_kernels_mat_t **mats;    /* [nmats] every prepared linear (owned) */
    size_t nmats;
    size_t mat_bytes;           /* their bytes */
    void **blobs;               /* [nblobs] the tables kept as stored (embed, engram; owned) */
    size_t nblobs;
    size_t table_bytes;         /* their bytes */

    unsigned char *expert_held; /* [E] 1 where the routed expert's weights are loaded */
    uint32_t experts_held;      /* how many (E unless loaded for one rank of a DEP group) */
    size_t expert_bytes;        /* the loaded routed experts' prepared linears, bytes */
} td_model_t;

/* Load dir (config.json, model.safetensors[.index.json], tokenizer.json):
 * the config must pass td_modelcfg_check, the checkpoint td_weights_bind;
 * the linears are prepared by the ops' mat_create_fmt in the checkpoint's
 * format (bf16, fp8 or fp4 codes with their scales; others dequantized and
 * prepared by mat_create), every other tensor dequantized into f32. The
 * tokenizer is required when the config has engram layers (its compressed
 * token map must have engram_compressed_vocab_size classes, as the reference
 * requires). Errors are logged with the object they concern. */
td_status_t td_model_load(const char *dir, td_model_t **out);
void td_model_destroy(td_model_t *m);

/* How to load: for one rank of a DEP group, only the routed experts the
 * placement gives that rank are read (the others' w1/w2/w3 stay NULL and
 * their bytes of the checkpoint are never touched); everything else — the
 * attention, the router, the shared expert, the embedding and the head — is
 * loaded whole on every rank. */
typedef struct {
    const td_placement_t *placement;   /* NULL: every expert */
    uint32_t rank;                     /* < td_placement_ranks(placement) */
} td_model_opts_t;

/* td_model_load with opts (NULL: the same as td_model_load). A placement
 * whose expert count is not the config's n_routed_experts, or a rank outside
 * it: TD_ERR_INVALID, logged. */
td_status_t td_model_load_opts(const char *dir, const td_model_opts_t *opts, td_model_t **out);

/* The reference's compute_hash_multipliers for one engram layer: numpy's
 * default_rng(10007 * layer_id).integers(0, bound, max_ngram) with bound =
 * max(1, (INT64_MAX // vocab) // 2), each value v as 2v + 1 (PCG64 seeded
 * through SeedSequence, Lemire's bounded integers, as numpy 2 draws them).
 * out: [max_ngram]. */
td_status_t td_model_hash_multipliers(uint64_t layer_id, uint32_t max_ngram,
                                      uint64_t vocab, int64_t *out);

/* ---- the forward pass (model/forward.c) ------------------------------------ */

/* One request's part of a forward call: n tokens appended at the cache's
 * position. logits: NULL (none), or [n, vocab_size] with all_logits, else
 * [1, vocab_size] (the last position). frozen: the paged entries (compressed
 * KV, indexer keys) whose tokens all lie below it are the cache's as they
 * are (a cached prefix, read-only): the pass neither computes nor writes
 * them and reads them from the cache like every entry (0: none). */
typedef struct {
    td_cache_t *cache;
    const int32_t *tokens;      /* [n] */
    size_t n;                   /* >= 1 */
    float *logits;
    int all_logits;
    uint64_t frozen;
} td_forward_seq_t;

/* What one layer of a pass finished, for every sequence s: the layer's
 * paged entries the pass completed, [floor(p0[s] / ratio),
 * floor((p0[s] + seqs[s].n) / ratio)), are final in the cache, and its fixed
 * segments (window ring, partial group; after the last layer also the engram
 * look-back and the counters) hold the state after the pass's tokens. */
typedef struct {
    uint32_t layer;
    const td_forward_seq_t *seqs;
    size_t nseqs;
    const uint64_t *p0;         /* [nseqs] each cache's tokens before the pass */
} td_forward_done_t;

/* Called after each layer, on the pass's thread, before the next layer
 * starts. A non-OK return stops the pass at that layer boundary and is
 * returned (the caches are then unusable: reset them); it is how a caller
 * cancels a pass within one layer. */
typedef td_status_t (*td_forward_layer_fn)(const td_forward_done_t *done, void *arg);

/* Run the tokens of every sequence through the backbone in one pass (rows of
 * all sequences share the linears; attention, compressor and indexer run per
 * request). Each cache must belong to m's plan, appear once (two views of one
 * memory count as one), and have room for n more tokens (TD_ERR_RANGE
 * otherwise, nothing changed); a token id outside the vocabulary is
 * TD_ERR_RANGE. fn (may be NULL) is told after each layer. On any error the
 * caches are left unchanged only for argument errors; a failure inside the
 * pass (allocation, a stop from fn) leaves them unusable (reset them). */
td_status_t td_forward(const td_model_t *m, td_forward_seq_t *seqs, size_t nseqs,
                       td_forward_layer_fn fn, void *arg);

/* The workspace bytes a pass takes (model/fwspace.c, docs/forward.md): for
 * nseq requests of n rows each with `tokens` tokens in its cache after the
 * pass, split as td_forward splits calls of more than 256 rows. Every buffer
 * of a pass comes from one block of this size (the pass allocates nothing
 * else); tools/memplan's workspace figure is this function. */
size_t td_forward_workspace_bytes(const td_modelcfg_t *c, const td_cache_plan_t *plan,
                                  size_t nseq, size_t n, uint64_t tokens);
/* The largest workspace a pass of this process has taken so far, bytes. */
size_t td_forward_workspace_peak(void);

/* Prefill a chunk of one request (any n >= 1, continuing from its cache). */
td_status_t td_forward_prefill(const td_model_t *m, td_cache_t *c, const int32_t *tokens,
                               size_t n, int all_logits, float *logits);

/* One decode step of n requests (each at its own position): token[i] is
 * appended to caches[i]; logits [n, vocab_size]. */
td_status_t td_forward_decode(const td_model_t *m, td_cache_t *const *caches,
                              const int32_t *tokens, size_t n, float *logits);

/* ---- expert parallelism: DEPn (model/forward.c, docs/dep.md) ------------------------------
 * A DEP group of n ranks: attention and the dense layers data-parallel (a
 * request lives on one rank, with its KV), the routed experts
 * expert-parallel (each rank holds those the placement gives it: load its
 * model with td_model_load_opts). At each MoE layer every token's hidden
 * vector goes to the ranks holding its top-k experts and their outputs come
 * back (td_comm_alltoallv, twice); the token's rank sums them in the order
 * of the one-rank pass, so every rank's logits are td_forward's bit for bit.
 * Every rank of the group runs each step's pass together (SPMD): the same
 * number of td_forward_dep calls, a rank with no requests in a step passing
 * nseqs = 0. */

/* One rank's side of a group: its communicator, the group's placement, the
 * MoE workspace kept from pass to pass (grown to the largest pass, never
 * shrunk) and the counters. Owns the workspace and counters only: m, comm
 * and p must outlive it. One thread at a time runs its passes; the counters
 * may be read from any thread. */
typedef struct td_forward_dep td_forward_dep_t;

/* p must span td_comm_size(comm) ranks and m's n_routed_experts, and m
 * must hold every expert p gives td_comm_rank(comm): TD_ERR_INVALID,
 * logged, otherwise. */
td_status_t td_forward_dep_create(const td_model_t *m, td_comm_t *comm, const td_placement_t *p,
                                  td_forward_dep_t **out);
void td_forward_dep_destroy(td_forward_dep_t *d);

/* td_forward on this rank (the same arguments and results), or with
 * nseqs = 0 (seqs may be NULL) this rank's part of a step it has no
 * requests in: its experts serve the other ranks' tokens at every MoE
 * layer. A pass begins with an all-gather of each rank's rows, which bounds
 * the workspace. In a group of one nothing is sent: the pass is
 * td_forward's. On any failure — this rank's (an argument, memory, a stop
 * from fn) or the group's (a peer gone, a deadline: the communicator's
 * status) — the communicator is aborted, so every rank's pass fails rather
 * than waits; the group must then be made anew (comm.h). */
td_status_t td_forward_dep(td_forward_dep_t *d, td_forward_seq_t *seqs, size_t nseqs,
                           td_forward_layer_fn fn, void *arg);

/* What a rank's passes moved: the bytes it put in all-to-all segments (its
 * own segment included; td_comm_stats counts only what crossed to other
 * ranks), for /metrics and bench/dep. */
typedef struct {
    uint64_t passes;            /* td_forward_dep calls that began */
    uint64_t tokens;            /* rows of this rank's requests, over all passes */
    uint64_t dispatch_bytes;    /* records: count, (expert, weight) pairs, hidden vector */
    uint64_t combine_bytes;     /* expert output rows sent back */
    uint64_t dispatch_remote;   /* of dispatch_bytes, those to other ranks */
    uint64_t combine_remote;    /* of combine_bytes, those to other ranks */
} td_forward_dep_stats_t;
void td_forward_dep_stats(const td_forward_dep_t *d, td_forward_dep_stats_t *out);

/* The rows each expert of this rank ran, per layer, over all passes: out
 * [num_hidden_layers, n_routed_experts] (0 for experts it does not hold). */
void td_forward_dep_expert_tokens(const td_forward_dep_t *d, uint64_t *out);

/* Add the end-of-sequence ids of a config alone to sp's stop tokens (those
 * already there are not repeated): config.json's eos_token_id (an int or a
 * list), or, when it is null, the tokenizer's "<｜end▁of▁sentence｜>" (tok may
 * be NULL). A checkpoint's directory says more (generation_config.json,
 * tokenizer_config.json): td_v41_eos_ids, which the engines and
 * tools/generate use. An id
 * outside [0, vocab_size): TD_ERR_INVALID; more stops than
 * TD_SAMPLE_MAX_STOP: TD_ERR_RANGE; neither source names one:
 * TD_ERR_NOT_FOUND (a warning: the caller may go on without). Logged; sp
 * unchanged on error. */
td_status_t td_model_stop_eos(const td_modelcfg_t *cfg, const td_tokenizer_t *tok,
                              td_sample_params_t *sp);

#endif
