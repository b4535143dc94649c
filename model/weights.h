/* model/weights.h — the DeepSeek-V4.1 weight schema (every backbone tensor of
 * a config: release name, shape, float/fp8/fp4 storage) and its binding to an
 * opened checkpoint, reporting every missing, misshapen, mistyped or extra tensor. */
#ifndef TD_WEIGHTS_H
#define TD_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "modelcfg.h"
#include "safetensors.h"
#include "status.h"

#define TD_WEIGHTS_NAME_MAX 80

/* How a tensor is stored (docs/weights.md, "Quantized layouts"). */
typedef enum {
    TD_WEIGHTS_FLOAT = 0,  /* F32, BF16 or F16 (norms, embeddings, router, compressor, ...) */
    TD_WEIGHTS_F32,        /* F32 only: kept in fp32 by the reference (hc_*, attn_sink, gate biases) */
    TD_WEIGHTS_FP8_BLOCK,  /* F8_E4M3 [R, C] + scale [ceil(R/br), ceil(C/bc)] */
    TD_WEIGHTS_FP4_GROUP,  /* I8/U8 [R, C/2] (or F4 [R, C]) + scale [R, C/32] */
    TD_WEIGHTS_FP8_ROWS,   /* F8_E4M3 [R, C] + scale [R, C/32] (engram tables) */
} td_weights_format_t;

/* One tensor of the schema. Shapes are logical (elements, not packed bytes). */
typedef struct {
    char name[TD_WEIGHTS_NAME_MAX];       /* "layers.3.attn.wq_b.weight" */
    char scale_name[TD_WEIGHTS_NAME_MAX]; /* "layers.3.attn.wq_b.scale"; "" for float formats */
    td_weights_format_t format;
    int ndim;                             /* 1 or 2 */
    int64_t shape[2];
    int64_t scale_shape[2];               /* quantized formats */
    const char *dims;                     /* the shape in config terms: "num_attention_heads*head_dim, q_lora_rank" */
    int32_t layer;                        /* backbone layer, -1 for embed / head / norm */
    int32_t expert;                       /* routed expert index, -1 otherwise */
} td_weights_entry_t;

/* The tensors a config's backbone needs, in a fixed order (embed, then layer
 * by layer, then norm and head). Owns its entries. */
typedef struct {
    td_weights_entry_t *entries;          /* [n] */
    size_t n;
    int64_t block_rows, block_cols;       /* fp8 block of the quantized linears */
    size_t *by_name;                      /* [n] entry indices in name order (lookups) */
} td_weights_schema_t;

/* Build the schema of cfg: without a quantization_config every tensor is a
 * float format; with one (quant_method fp8), the linears the release stores in
 * fp8 are FP8_BLOCK (weight_block_size), the routed experts FP8_BLOCK or, for
 * expert_dtype fp4, FP4_GROUP, and the engram tables FP8_ROWS. td_modelcfg_check
 * must accept cfg; fp4 experts need hidden_size and moe_intermediate_size
 * multiples of 32. Errors are logged. */
td_status_t td_weights_schema_create(const td_modelcfg_t *cfg, td_weights_schema_t **out);
void td_weights_schema_destroy(td_weights_schema_t *s);

/* Lookup by name (binary search); NULL if absent. */
const td_weights_entry_t *td_weights_schema_find(const td_weights_schema_t *s, const char *name);

/* Whether a checkpoint tensor that is not in the schema is expected and left
 * alone: DSpark draft layers ("mtp." at the start or after a dot), "vision.",
 * "aligner.", "image_start", "image_end", "image_newline" (the reference's
 * _keys_to_ignore_on_load_unexpected). */
bool td_weights_ignored(const char *name);

/* Problem classes a bind reports. */
typedef enum {
    TD_WEIGHTS_MISSING = 0,   /* a schema tensor (or its scale) is absent */
    TD_WEIGHTS_SHAPE,         /* present with another shape */
    TD_WEIGHTS_DTYPE,         /* present with a dtype its format does not allow */
    TD_WEIGHTS_UNEXPECTED,    /* in the checkpoint, in no schema entry, not ignored */
    TD_WEIGHTS_SUMMARY,       /* the last report of a bind that found problems */
} td_weights_problem_t;

/* Receives one line per problem, e.g.
 * "tensor 'layers.3.attn.wq_b.weight': shape [64, 32], expected [128, 32]
 * (num_attention_heads*head_dim, q_lora_rank)". NULL: lines are logged. */
typedef void (*td_weights_report_fn)(void *arg, td_weights_problem_t kind, const char *line);

/* A schema tensor bound to the checkpoint's tensors (pointers into the
 * td_st_t, valid while it is open). */
typedef struct {
    const td_weights_entry_t *entry;
    const td_st_tensor_t *w;
    const td_st_tensor_t *scale;          /* NULL for float formats */
} td_weights_bound_t;

/* The bindings of every schema entry, in schema order. Owns the array only:
 * the schema and the checkpoint must outlive it. */
typedef struct {
    const td_weights_schema_t *schema;
    td_weights_bound_t *t;                /* [n], t[i] binds schema->entries[i] */
    size_t n;
    size_t ignored;                       /* checkpoint tensors left alone (mtp., vision., ...) */
    uint64_t bytes;                       /* bytes of the bound tensors and scales */
} td_weights_t;

/* Bind every schema entry to the checkpoint. Each problem is reported (all of
 * them, not only the first), then a summary line ("weights: 3 problems in 1234
 * tensors: 1 missing, 1 wrong shape, 0 wrong dtype, 1 unexpected; 40
 * ignored"); the status is then TD_ERR_INVALID and *out is not set. */
td_status_t td_weights_bind(const td_weights_schema_t *s, const td_st_t *st,
                            td_weights_report_fn report, void *arg, td_weights_t **out);
void td_weights_destroy(td_weights_t *w);

/* The binding of a schema name (binary search); NULL if absent. */
const td_weights_bound_t *td_weights_get(const td_weights_t *w, const char *name);

/* "float", "f32", "fp8 block", "fp4 group", "fp8 rows". */
const char *td_weights_format_str(td_weights_format_t f);

#endif
