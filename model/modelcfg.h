/* model/modelcfg.h — a DeepSeek-V4.1 config.json (composite or flat) resolved
 * as transformers' DeepseekV41TextConfig resolves it (defaults, derived
 * schedules, the same errors), plus what Tandem needs before running it. */
#ifndef TD_MODELCFG_H
#define TD_MODELCFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct json_t;

/* An integer list (config.json `list[int]`). */
typedef struct {
    int64_t *v;   /* [n], owned */
    uint32_t n;
} td_modelcfg_list_t;

/* A `float | int` field: JSON integers stay integers (to_json writes them back). */
typedef struct {
    double v;     /* the value, also when is_int */
    int64_t i;    /* exact value when is_int */
    bool is_int;
} td_modelcfg_num_t;

/* An `int | None` field. */
typedef struct {
    int64_t v;
    bool set;     /* false: null */
} td_modelcfg_optint_t;

/* `eos_token_id`: int, list[int] or null. */
typedef enum {
    TD_MODELCFG_EOS_NONE = 0,
    TD_MODELCFG_EOS_INT  = 1,
    TD_MODELCFG_EOS_LIST = 2,
} td_modelcfg_eos_kind_t;

/* One resolved rope entry (rope_parameters.main / .compress), read for the
 * forward pass; the full dict, unknown keys included, stays in the JSON. A
 * value that is absent or not a number leaves its `has_` flag false. */
typedef struct {
    char *rope_type;              /* "default", "yarn", ... (owned) */
    bool has_theta;
    double theta;
    bool has_partial;
    double partial_rotary_factor; /* rotated fraction of head_dim */
    bool has_factor;
    double factor;
    bool has_original_max;
    double original_max_position_embeddings;
    bool has_beta_fast, has_beta_slow, has_attention_factor;
    double beta_fast, beta_slow, attention_factor;
    bool has_mscale, has_mscale_all_dim;
    double mscale, mscale_all_dim;
} td_modelcfg_rope_t;

/* Per backbone layer, derived from the schedules. */
typedef struct {
    int64_t ratio;            /* compress_ratios[i]: 0 window only, 1, or r > 1 */
    bool kv_source;           /* owns a compressor (and its group's caches) */
    bool index_source;        /* runs the indexer */
    bool owns_index_k;        /* index source that is also a kv source: wk, k_norm */
    bool candidate_source;    /* publishes the candidate-block mask */
    bool uses_candidates;     /* index source after the candidate source */
    int32_t group;            /* the kv source whose compressed cache it reads
                                 (the latest at or before it), -1 when ratio 0 */
    int32_t engram;           /* index into engram_layer_ids, -1 if none */
} td_modelcfg_layer_t;

/* Fields named and typed as in DeepseekV41TextConfig; values after resolution.
 * Owns every pointer; free with td_modelcfg_destroy. */
typedef struct {
    /* attention / rope */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim;
    int64_t q_lora_rank;
    int64_t qk_rope_head_dim;
    td_modelcfg_num_t rope_theta;
    td_modelcfg_num_t compress_rope_theta;
    struct json_t *rope_parameters;   /* {"main": {...}, "compress": {...}} */
    struct json_t *rope_scaling;      /* as given, NULL for null */
    int64_t max_position_embeddings;
    bool attention_bias;
    double attention_dropout;

    /* sliding window + compressed sparse attention */
    int64_t sliding_window;
    td_modelcfg_list_t compress_ratios;        /* [num_hidden_layers + num_nextn_predict_layers] */
    td_modelcfg_list_t kv_source_layer_ids;
    td_modelcfg_list_t index_source_layer_ids;
    int64_t candidate_source_layer_id;         /* < 0: no two-level top-k */
    int64_t candidate_topk_blocks;
    int64_t candidate_block_size;
    int64_t index_n_heads;
    int64_t index_head_dim;
    int64_t index_topk;

    /* grouped low-rank output projection */
    int64_t o_groups;
    int64_t o_lora_rank;

    /* MoE */
    int64_t moe_intermediate_size;
    int64_t n_routed_experts;
    int64_t n_shared_experts;
    int64_t num_experts_per_tok;
    char *scoring_func;
    double gate_temp;
    bool norm_topk_prob;
    double routed_scaling_factor;
    char *topk_method;
    double swiglu_limit;

    /* hyper-connections */
    int64_t hc_mult;
    int64_t hc_sinkhorn_iters;
    double hc_eps;

    /* engram */
    td_modelcfg_list_t engram_layer_ids;
    int64_t engram_vocab_size;
    td_modelcfg_list_t engram_num_embeddings;  /* [engram_layer_ids.n] */
    int64_t engram_max_ngram_size;
    int64_t engram_n_heads;
    int64_t engram_head_dim;
    int64_t engram_pad_id;
    int64_t engram_compressed_vocab_size;

    /* DSpark draft layers */
    int64_t num_nextn_predict_layers;
    int64_t dspark_block_size;
    int64_t dspark_noise_token_id;
    td_modelcfg_list_t dspark_target_layer_ids;
    int64_t dspark_markov_rank;
    int64_t dspark_n_routed_experts;
    int64_t dspark_num_experts_per_tok;

    /* misc */
    char *hidden_act;
    double initializer_range;
    double rms_norm_eps;
    bool use_cache;
    bool tie_word_embeddings;
    td_modelcfg_optint_t pad_token_id;
    td_modelcfg_optint_t bos_token_id;
    td_modelcfg_eos_kind_t eos_kind;
    td_modelcfg_list_t eos_token_id;           /* [1] for EOS_INT */

    /* training / loss (read, unused) */
    bool output_router_logits;
    double router_aux_loss_coef;
    double router_jitter_noise;

    /* derived */
    td_modelcfg_layer_t *layers;               /* [num_hidden_layers] */
    td_modelcfg_rope_t rope_main;              /* window-only layers */
    td_modelcfg_rope_t rope_compress;          /* layers with a compressed branch */

    /* the composite wrapper (config.json with text_config) */
    bool composite;
    bool has_vision;                           /* vision_config present: images unsupported */
    int64_t image_token_id;

    /* quantization_config (top level), read as transformers'
     * FineGrainedFP8Config reads it; docs/weights.md has the layouts */
    bool quantized;                            /* present: quant_method "fp8" */
    int64_t quant_block_rows;                  /* weight_block_size, default [128, 128] */
    int64_t quant_block_cols;
    bool quant_scale_ue8m0;                    /* scale_fmt "ue8m0" (else "float") */
    bool quant_experts_fp4;                    /* expert_dtype "fp4" (else "fp8") */
} td_modelcfg_t;

/* Parse config.json text. Resolution, derivations and errors follow the
 * reference config class (docs/model.md); an error names the field and its
 * value. On error: TD_ERR_INVALID (malformed or contradicting) or
 * TD_ERR_UNSUPPORTED (not a DeepSeek-V4.1 config) with the message in err
 * (errlen bytes; err may be NULL), or TD_ERR_NOMEM (err empty). Nothing is
 * logged: the caller, who knows where the text came from, logs the message
 * once. Unknown fields are listed at debug level. *out is set only on
 * success. */
td_status_t td_modelcfg_parse(const char *json, size_t len, td_modelcfg_t **out,
                              char *err, size_t errlen);

/* Read path (a config.json, or a directory holding one), parse it, log what
 * is present but unsupported (images, DSpark drafting) at info level. Every
 * failure is logged here, once, with the path; callers pass the status up. */
td_status_t td_modelcfg_load(const char *path, td_modelcfg_t **out);

void td_modelcfg_destroy(td_modelcfg_t *cfg);

/* The resolved text config as JSON (caller frees with free()): the same keys
 * and values as transformers' DeepseekV41TextConfig.to_dict() for every field
 * above, plus "model_type". NULL on allocation failure. */
char *td_modelcfg_to_json(const td_modelcfg_t *cfg);

/* Whether Tandem's backbone can run this config: positive sizes, shapes that
 * divide, rope types it implements (main: default; compress: default or
 * yarn), silu experts, noaux_tc routing, one shared expert, engram tables at
 * least as large as their prime buckets. TD_ERR_UNSUPPORTED or
 * TD_ERR_INVALID with the reason in err; not logged (the caller logs it). */
td_status_t td_modelcfg_check(const td_modelcfg_t *cfg, char *err, size_t errlen);

/* Optional features a caller may ask for. */
typedef enum {
    TD_MODELCFG_FEATURE_IMAGES = 1,   /* image inputs (vision tower + aligner) */
    TD_MODELCFG_FEATURE_DRAFTING = 2, /* DSpark speculative drafting */
} td_modelcfg_feature_t;

/* TD_OK if the feature can be used with this model, else TD_ERR_UNSUPPORTED
 * with the reason in err, not logged: images are not supported
 * (text only); drafting is not implemented (the backbone runs without the
 * draft layers), or the model has none. */
td_status_t td_modelcfg_require(const td_modelcfg_t *cfg, td_modelcfg_feature_t feature,
                                char *err, size_t errlen);

/* The engram hash bucket sizes of engram layer k (0 <= k < engram_layer_ids.n):
 * (engram_max_ngram_size - 1) * engram_n_heads primes, in n-gram-major order,
 * drawn in order above engram_vocab_size and never reused across heads,
 * n-gram sizes or layers (the reference's EngramLayout). primes has room for
 * that many; *total gets their sum (the rows the layer's table needs). */
td_status_t td_modelcfg_engram_primes(const td_modelcfg_t *cfg, uint32_t k, uint64_t *primes,
                                      uint64_t *total);

#endif
