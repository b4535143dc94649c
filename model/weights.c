/* model/weights.c — the weight schema of a config (the reference's module tree
 * under the release's tensor names, docs/weights.md) and its binding to an
 * opened safetensors checkpoint, reporting every problem before giving up. */
#include "weights.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "log.h"

/* ---- Building the schema ----------------------------------------------------- */

/* What a tensor is, before the config's quantization picks its format. */
typedef enum {
    KIND_FLOAT,     /* always float */
    KIND_F32,       /* always F32 */
    KIND_LINEAR,    /* fp8 block when quantized */
    KIND_EXPERT,    /* fp8 block or fp4 group when quantized */
    KIND_TABLE,     /* engram table: fp8 rows when quantized */
} wt_kind_t;

typedef struct {
    const td_modelcfg_t *cfg;
    td_weights_schema_t *s;
    size_t cap;
    td_status_t st;               /* first failure while adding */
} wt_builder_t;

static int64_t
ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

__attribute__((format(printf, 6, 7)))
static td_weights_entry_t *
wt_add(wt_builder_t *b, wt_kind_t kind, int ndim, const int64_t *shape, const char *dims,
       const char *fmt, ...)
{
    const td_modelcfg_t *cfg = b->cfg;
    td_weights_schema_t *s = b->s;
    td_weights_entry_t *e;
    va_list ap;
    int len;

    if (b->st != TD_OK)
        return NULL;
    if (s->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 1024;
        td_weights_entry_t *p = realloc(s->entries, cap * sizeof(*p));
        if (p == NULL) {
            b->st = TD_ERR_NOMEM;
            return NULL;
        }
        s->entries = p;
        b->cap = cap;
    }
    e = &s->entries[s->n];
    memset(e, 0, sizeof(*e));
    va_start(ap, fmt);
    len = vsnprintf(e->name, sizeof(e->name), fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof(e->name)) {
        b->st = TD_ERR_INTERNAL;
        return NULL;
    }
    e->ndim = ndim;
    e->shape[0] = shape[0];
    e->shape[1] = ndim > 1 ? shape[1] : 0;
    e->dims = dims;
    e->layer = -1;
    e->expert = -1;

    switch (kind) {
    case KIND_FLOAT:
        e->format = TD_WEIGHTS_FLOAT;
        break;
    case KIND_F32:
        e->format = TD_WEIGHTS_F32;
        break;
    case KIND_LINEAR:
    case KIND_EXPERT:
        if (!cfg->quantized) {
            e->format = TD_WEIGHTS_FLOAT;
        } else if (kind == KIND_EXPERT && cfg->quant_experts_fp4) {
            e->format = TD_WEIGHTS_FP4_GROUP;
            e->scale_shape[0] = shape[0];
            e->scale_shape[1] = shape[1] / 32;
        } else {
            e->format = TD_WEIGHTS_FP8_BLOCK;
            e->scale_shape[0] = ceil_div(shape[0], cfg->quant_block_rows);
            e->scale_shape[1] = ceil_div(shape[1], cfg->quant_block_cols);
        }
        break;
    case KIND_TABLE:
        if (cfg->quantized) {
            e->format = TD_WEIGHTS_FP8_ROWS;
            e->scale_shape[0] = shape[0];
            e->scale_shape[1] = shape[1] / 32;
        } else {
            e->format = TD_WEIGHTS_FLOAT;
        }
        break;
    }
    if (e->format != TD_WEIGHTS_FLOAT && e->format != TD_WEIGHTS_F32) {
        /* "<x>.weight" -> "<x>.scale" */
        size_t n = strlen(e->name);
        if (n < 7 || strcmp(e->name + n - 7, ".weight") != 0) {
            b->st = TD_ERR_INTERNAL;
            return NULL;
        }
        snprintf(e->scale_name, sizeof(e->scale_name), "%.*s.scale", (int)(n - 7), e->name);
    }
    s->n++;
    return e;
}

#define SHAPE1(a) ((const int64_t[2]){ (a), 0 })
#define SHAPE2(a, b) ((const int64_t[2]){ (a), (b) })

/* The attention block of layer i: projections, norms, sink, and the
 * compressor and indexer where the layer is their source. */
static void
wt_add_attn(wt_builder_t *b, int64_t i)
{
    const td_modelcfg_t *c = b->cfg;
    const td_modelcfg_layer_t *l = &c->layers[i];
    const int64_t H = c->hidden_size;
    const int64_t qh = c->num_attention_heads * c->head_dim;
    const int64_t ihd = c->index_n_heads * c->index_head_dim;

    wt_add(b, KIND_FLOAT, 1, SHAPE1(H), "hidden_size", "layers.%" PRId64 ".attn_norm.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(c->q_lora_rank, H), "q_lora_rank, hidden_size",
           "layers.%" PRId64 ".attn.wq_a.weight", i);
    wt_add(b, KIND_FLOAT, 1, SHAPE1(c->q_lora_rank), "q_lora_rank",
           "layers.%" PRId64 ".attn.q_norm.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(qh, c->q_lora_rank), "num_attention_heads*head_dim, q_lora_rank",
           "layers.%" PRId64 ".attn.wq_b.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(c->head_dim, H), "head_dim, hidden_size",
           "layers.%" PRId64 ".attn.wkv.weight", i);
    wt_add(b, KIND_FLOAT, 1, SHAPE1(c->head_dim), "head_dim",
           "layers.%" PRId64 ".attn.kv_norm.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(c->o_groups * c->o_lora_rank, qh / c->o_groups),
           "o_groups*o_lora_rank, num_attention_heads*head_dim/o_groups",
           "layers.%" PRId64 ".attn.wo_a.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(H, c->o_groups * c->o_lora_rank),
           "hidden_size, o_groups*o_lora_rank", "layers.%" PRId64 ".attn.wo_b.weight", i);
    wt_add(b, KIND_F32, 1, SHAPE1(c->num_attention_heads), "num_attention_heads",
           "layers.%" PRId64 ".attn.attn_sink", i);
    if (l->kv_source) {
        wt_add(b, KIND_FLOAT, 2, SHAPE2(c->head_dim, H), "head_dim, hidden_size",
               "layers.%" PRId64 ".attn.compressor.wkv.weight", i);
        if (l->ratio > 1)
            wt_add(b, KIND_FLOAT, 2, SHAPE2(c->head_dim, H), "head_dim, hidden_size",
                   "layers.%" PRId64 ".attn.compressor.wgate.weight", i);
        wt_add(b, KIND_FLOAT, 1, SHAPE1(c->head_dim), "head_dim",
               "layers.%" PRId64 ".attn.compressor.norm.weight", i);
    }
    if (l->index_source) {
        wt_add(b, KIND_LINEAR, 2, SHAPE2(ihd, c->q_lora_rank),
               "index_n_heads*index_head_dim, q_lora_rank",
               "layers.%" PRId64 ".attn.indexer.wq_b.weight", i);
        wt_add(b, KIND_FLOAT, 2, SHAPE2(c->index_n_heads, H), "index_n_heads, hidden_size",
               "layers.%" PRId64 ".attn.indexer.weights_proj.weight", i);
        if (l->owns_index_k) {
            wt_add(b, KIND_FLOAT, 2, SHAPE2(c->index_head_dim, c->head_dim),
                   "index_head_dim, head_dim", "layers.%" PRId64 ".attn.indexer.wk.weight", i);
            wt_add(b, KIND_FLOAT, 1, SHAPE1(c->index_head_dim), "index_head_dim",
                   "layers.%" PRId64 ".attn.indexer.k_norm.weight", i);
        }
    }
}

/* The MoE block of layer i: norm, router, routed and shared experts. */
static void
wt_add_ffn(wt_builder_t *b, int64_t i)
{
    const td_modelcfg_t *c = b->cfg;
    const int64_t H = c->hidden_size;

    wt_add(b, KIND_FLOAT, 1, SHAPE1(H), "hidden_size", "layers.%" PRId64 ".ffn_norm.weight", i);
    wt_add(b, KIND_FLOAT, 2, SHAPE2(c->n_routed_experts, H), "n_routed_experts, hidden_size",
           "layers.%" PRId64 ".ffn.gate.weight", i);
    wt_add(b, KIND_F32, 1, SHAPE1(c->n_routed_experts), "n_routed_experts",
           "layers.%" PRId64 ".ffn.gate.bias", i);
    wt_add(b, KIND_F32, 1, SHAPE1(c->n_routed_experts), "n_routed_experts",
           "layers.%" PRId64 ".ffn.gate.bias_vl", i);
    for (int64_t e = 0; e < c->n_routed_experts; e++) {
        const size_t at = b->s->n;
        wt_add(b, KIND_EXPERT, 2, SHAPE2(c->moe_intermediate_size, H),
               "moe_intermediate_size, hidden_size",
               "layers.%" PRId64 ".ffn.experts.%" PRId64 ".w1.weight", i, e);
        wt_add(b, KIND_EXPERT, 2, SHAPE2(H, c->moe_intermediate_size),
               "hidden_size, moe_intermediate_size",
               "layers.%" PRId64 ".ffn.experts.%" PRId64 ".w2.weight", i, e);
        wt_add(b, KIND_EXPERT, 2, SHAPE2(c->moe_intermediate_size, H),
               "moe_intermediate_size, hidden_size",
               "layers.%" PRId64 ".ffn.experts.%" PRId64 ".w3.weight", i, e);
        for (size_t k = at; k < b->s->n; k++)
            b->s->entries[k].expert = (int32_t)e;
    }
    wt_add(b, KIND_LINEAR, 2, SHAPE2(c->moe_intermediate_size, H), "moe_intermediate_size, hidden_size",
           "layers.%" PRId64 ".ffn.shared_experts.w1.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(H, c->moe_intermediate_size), "hidden_size, moe_intermediate_size",
           "layers.%" PRId64 ".ffn.shared_experts.w2.weight", i);
    wt_add(b, KIND_LINEAR, 2, SHAPE2(c->moe_intermediate_size, H), "moe_intermediate_size, hidden_size",
           "layers.%" PRId64 ".ffn.shared_experts.w3.weight", i);
}

/* Layer i's engram (where it has one) and its two hyper-connection mixes. */
static void
wt_add_engram_hc(wt_builder_t *b, int64_t i)
{
    const td_modelcfg_t *c = b->cfg;
    const td_modelcfg_layer_t *l = &c->layers[i];
    const int64_t H = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;

    if (l->engram >= 0) {
        const int64_t rows = c->engram_num_embeddings.v[l->engram], ed = c->engram_head_dim;
        const int64_t cols = (c->engram_max_ngram_size - 1) * c->engram_n_heads * ed;
        wt_add(b, KIND_TABLE, 2, SHAPE2(rows, ed), "engram_num_embeddings[k], engram_head_dim",
               "layers.%" PRId64 ".engram.embed.weight", i);
        if (!c->quantized)
            wt_add(b, KIND_FLOAT, 2, SHAPE2(rows, ed / 32),
                   "engram_num_embeddings[k], engram_head_dim/32",
                   "layers.%" PRId64 ".engram.embed.scale", i);
        wt_add(b, KIND_LINEAR, 2, SHAPE2(H * (hc + 1), cols),
               "hidden_size*(hc_mult+1), (engram_max_ngram_size-1)*engram_n_heads*engram_head_dim",
               "layers.%" PRId64 ".engram.wkv.weight", i);
        wt_add(b, KIND_FLOAT, 2, SHAPE2(hc, H), "hc_mult, hidden_size",
               "layers.%" PRId64 ".engram.q_weight", i);
        wt_add(b, KIND_FLOAT, 2, SHAPE2(hc, H), "hc_mult, hidden_size",
               "layers.%" PRId64 ".engram.k_weight", i);
    }

    wt_add(b, KIND_F32, 2, SHAPE2(mix, hc * H), "(2+hc_mult)*hc_mult, hc_mult*hidden_size",
           "layers.%" PRId64 ".hc_attn_fn", i);
    wt_add(b, KIND_F32, 1, SHAPE1(mix), "(2+hc_mult)*hc_mult", "layers.%" PRId64 ".hc_attn_base", i);
    wt_add(b, KIND_F32, 1, SHAPE1(3), "3", "layers.%" PRId64 ".hc_attn_scale", i);
    wt_add(b, KIND_F32, 2, SHAPE2(mix, hc * H), "(2+hc_mult)*hc_mult, hc_mult*hidden_size",
           "layers.%" PRId64 ".hc_ffn_fn", i);
    wt_add(b, KIND_F32, 1, SHAPE1(mix), "(2+hc_mult)*hc_mult", "layers.%" PRId64 ".hc_ffn_base", i);
    wt_add(b, KIND_F32, 1, SHAPE1(3), "3", "layers.%" PRId64 ".hc_ffn_scale", i);
}

/* Every tensor of layer i, each tagged with the layer. */
static void
wt_add_layer(wt_builder_t *b, int64_t i)
{
    const size_t first = b->s->n;

    wt_add_attn(b, i);
    wt_add_ffn(b, i);
    wt_add_engram_hc(b, i);
    if (b->st == TD_OK)
        for (size_t k = first; k < b->s->n; k++)
            b->s->entries[k].layer = (int32_t)i;
}

static int
wt_cmp_index(const void *a, const void *b, void *arg)
{
    const td_weights_entry_t *e = arg;
    return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

td_status_t
td_weights_schema_create(const td_modelcfg_t *cfg, td_weights_schema_t **out)
{
    char err[512];
    wt_builder_t b = { 0 };
    td_weights_schema_t *s;
    td_status_t st;

    if ((st = td_modelcfg_check(cfg, err, sizeof(err))) != TD_OK) {
        td_error("weight schema: %s", err);
        return st;
    }
    if (cfg->quantized && cfg->quant_experts_fp4 &&
        (cfg->hidden_size % 32 != 0 || cfg->moe_intermediate_size % 32 != 0)) {
        td_error("weight schema: fp4 experts need hidden_size (%" PRId64 ") and "
                 "moe_intermediate_size (%" PRId64 ") multiples of 32", cfg->hidden_size,
                 cfg->moe_intermediate_size);
        return TD_ERR_INVALID;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        td_error("weight schema: out of memory");
        return TD_ERR_NOMEM;
    }
    s->block_rows = cfg->quantized ? cfg->quant_block_rows : 0;
    s->block_cols = cfg->quantized ? cfg->quant_block_cols : 0;
    b.cfg = cfg;
    b.s = s;

    wt_add(&b, KIND_FLOAT, 2, SHAPE2(cfg->vocab_size, cfg->hidden_size), "vocab_size, hidden_size",
           "embed.weight");
    for (int64_t i = 0; i < cfg->num_hidden_layers; i++)
        wt_add_layer(&b, i);
    wt_add(&b, KIND_FLOAT, 1, SHAPE1(cfg->hidden_size), "hidden_size", "norm.weight");
    if (!cfg->tie_word_embeddings)
        wt_add(&b, KIND_FLOAT, 2, SHAPE2(cfg->vocab_size, cfg->hidden_size),
               "vocab_size, hidden_size", "head.weight");
    if (b.st != TD_OK) {
        td_error("weight schema: %s", td_status_str(b.st));
        td_weights_schema_destroy(s);
        return b.st;
    }
    s->by_name = malloc((s->n ? s->n : 1) * sizeof(*s->by_name));
    if (s->by_name == NULL) {
        td_error("weight schema: out of memory");
        td_weights_schema_destroy(s);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < s->n; i++)
        s->by_name[i] = i;
    qsort_r(s->by_name, s->n, sizeof(*s->by_name), wt_cmp_index, s->entries);
    *out = s;
    return TD_OK;
}

void
td_weights_schema_destroy(td_weights_schema_t *s)
{
    if (s == NULL)
        return;
    free(s->entries);
    free(s->by_name);
    free(s);
}

static ssize_t
wt_find_index(const td_weights_schema_t *s, const char *name)
{
    size_t lo = 0, hi = s->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->entries[s->by_name[mid]].name, name);
        if (c == 0)
            return (ssize_t)s->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

const td_weights_entry_t *
td_weights_schema_find(const td_weights_schema_t *s, const char *name)
{
    ssize_t i = wt_find_index(s, name);
    return i < 0 ? NULL : &s->entries[i];
}

bool
td_weights_ignored(const char *name)
{
    return strncmp(name, "mtp.", 4) == 0 || strstr(name, ".mtp.") != NULL ||
           strncmp(name, "vision.", 7) == 0 || strncmp(name, "aligner.", 8) == 0 ||
           strcmp(name, "image_start") == 0 || strcmp(name, "image_end") == 0 ||
           strcmp(name, "image_newline") == 0;
}

const char *
td_weights_format_str(td_weights_format_t f)
{
    switch (f) {
    case TD_WEIGHTS_FLOAT:     return "float";
    case TD_WEIGHTS_F32:       return "f32";
    case TD_WEIGHTS_FP8_BLOCK: return "fp8 block";
    case TD_WEIGHTS_FP4_GROUP: return "fp4 group";
    case TD_WEIGHTS_FP8_ROWS:  return "fp8 rows";
    }
    return "?";
}

/* ---- Binding -------------------------------------------------------------------- */

/* Without a report function, problems are logged: the first WT_LOG_MAX of
 * them one by one, then only the summary (a config that does not match its
 * checkpoint can make every tensor wrong). */
#define WT_LOG_MAX 20

typedef struct {
    td_weights_report_fn fn;
    void *arg;
    size_t count[TD_WEIGHTS_SUMMARY];
    size_t logged;
} wt_report_t;

__attribute__((format(printf, 3, 4)))
static void
wt_report(wt_report_t *r, td_weights_problem_t kind, const char *fmt, ...)
{
    char line[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (kind < TD_WEIGHTS_SUMMARY)
        r->count[kind]++;
    if (r->fn != NULL)
        r->fn(r->arg, kind, line);
    else if (kind == TD_WEIGHTS_SUMMARY || r->logged < WT_LOG_MAX)
        td_error("%s", line);
    else if (r->logged == WT_LOG_MAX)
        td_error("weights: more problems follow; only the summary is shown");
    if (kind < TD_WEIGHTS_SUMMARY)
        r->logged++;
}

static const char *
shape_str(const td_st_tensor_t *t, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

static const char *
want_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    if (ndim == 1)
        snprintf(buf, len, "[%" PRId64 "]", shape[0]);
    else
        snprintf(buf, len, "[%" PRId64 ", %" PRId64 "]", shape[0], shape[1]);
    return buf;
}

static bool
shape_is(const td_st_tensor_t *t, int ndim, int64_t d0, int64_t d1)
{
    return t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
}

static bool
dt_float(td_dtype_t dt)
{
    return dt == TD_DT_F32 || dt == TD_DT_BF16 || dt == TD_DT_F16;
}

static bool
dt_scale(td_dtype_t dt)
{
    return dt == TD_DT_E8M0 || dt == TD_DT_U8 || dt_float(dt);
}

static bool
dt_fp8(td_dtype_t dt)
{
    return dt == TD_DT_F8_E4M3 || dt == TD_DT_F8_E5M2;
}

/* The weight of e: dtype first (the expected shape depends on it), then shape. */
static bool
wt_check_weight(wt_report_t *r, const td_weights_entry_t *e, const td_st_tensor_t *t)
{
    char got[96], want[96];
    int64_t d1 = e->shape[1];
    const char *note = "";

    switch (e->format) {
    case TD_WEIGHTS_FLOAT:
        if (!dt_float(t->dtype)) {
            wt_report(r, TD_WEIGHTS_DTYPE, "tensor '%s': dtype %s, expected F32, BF16 or F16%s",
                      e->name, td_dtype_name(t->dtype),
                      dt_fp8(t->dtype) || t->dtype == TD_DT_I8 || t->dtype == TD_DT_F4
                          ? " (quantized, but the config has no quantization_config for it)" : "");
            return false;
        }
        break;
    case TD_WEIGHTS_F32:
        if (t->dtype != TD_DT_F32) {
            wt_report(r, TD_WEIGHTS_DTYPE, "tensor '%s': dtype %s, expected F32 (kept in fp32)",
                      e->name, td_dtype_name(t->dtype));
            return false;
        }
        break;
    case TD_WEIGHTS_FP8_BLOCK:
    case TD_WEIGHTS_FP8_ROWS:
        if (!dt_fp8(t->dtype)) {
            wt_report(r, TD_WEIGHTS_DTYPE, "tensor '%s': dtype %s, expected F8_E4M3 (%s, "
                      "quantization_config quant_method fp8)", e->name, td_dtype_name(t->dtype),
                      td_weights_format_str(e->format));
            return false;
        }
        break;
    case TD_WEIGHTS_FP4_GROUP:
        if (t->dtype == TD_DT_I8 || t->dtype == TD_DT_U8) {
            d1 = e->shape[1] / 2;
            note = ", packed two fp4 codes a byte";
        } else if (t->dtype != TD_DT_F4) {
            wt_report(r, TD_WEIGHTS_DTYPE, "tensor '%s': dtype %s, expected I8 or F4 (packed fp4 "
                      "experts, quantization_config expert_dtype fp4)", e->name,
                      td_dtype_name(t->dtype));
            return false;
        }
        break;
    }
    if (!shape_is(t, e->ndim, e->shape[0], d1)) {
        int64_t want_shape[2] = { e->shape[0], d1 };
        wt_report(r, TD_WEIGHTS_SHAPE, "tensor '%s': shape %s, expected %s (%s%s)", e->name,
                  shape_str(t, got, sizeof(got)), want_str(e->ndim, want_shape, want, sizeof(want)),
                  e->dims, note);
        return false;
    }
    return true;
}

static bool
wt_check_scale(wt_report_t *r, const td_weights_schema_t *s, const td_weights_entry_t *e,
               const td_st_tensor_t *t)
{
    char got[96], want[96], what[96];

    if (e->format == TD_WEIGHTS_FP8_BLOCK)
        snprintf(what, sizeof(what), "blocks of %" PRId64 "x%" PRId64, s->block_rows, s->block_cols);
    else
        snprintf(what, sizeof(what), "one per 32 along a row");
    if (!dt_scale(t->dtype)) {
        wt_report(r, TD_WEIGHTS_DTYPE, "tensor '%s': dtype %s, expected F8_E8M0, U8, F32, BF16 or "
                  "F16 (scale of '%s')", e->scale_name, td_dtype_name(t->dtype), e->name);
        return false;
    }
    if (!shape_is(t, 2, e->scale_shape[0], e->scale_shape[1])) {
        wt_report(r, TD_WEIGHTS_SHAPE, "tensor '%s': shape %s, expected %s (scale of '%s', %s)",
                  e->scale_name, shape_str(t, got, sizeof(got)),
                  want_str(2, e->scale_shape, want, sizeof(want)), e->name, what);
        return false;
    }
    return true;
}

/* Names the schema expects, sorted, for the unexpected-tensor pass. */
static int
wt_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

td_status_t
td_weights_bind(const td_weights_schema_t *s, const td_st_t *st, td_weights_report_fn report,
                void *arg, td_weights_t **out)
{
    wt_report_t r = { report, arg, { 0 }, 0 };
    const char **names = NULL;
    size_t nnames = 0, ntensors = td_st_count(st), problems;
    td_weights_t *w;
    td_status_t ret = TD_ERR_NOMEM;
    char want[96];

    w = calloc(1, sizeof(*w));
    if (w == NULL || (w->t = calloc(s->n ? s->n : 1, sizeof(*w->t))) == NULL ||
        (names = malloc((2 * s->n + 1) * sizeof(*names))) == NULL) {
        td_error("weights: binding %zu tensors: out of memory", s->n);
        goto err;
    }
    w->n = s->n;
    w->schema = s;

    for (size_t i = 0; i < s->n; i++) {
        const td_weights_entry_t *e = &s->entries[i];
        const td_st_tensor_t *t = td_st_find(st, e->name), *sc = NULL;
        bool quant = e->scale_name[0] != '\0';

        names[nnames++] = e->name;
        if (quant)
            names[nnames++] = e->scale_name;
        w->t[i].entry = e;
        if (t == NULL) {
            wt_report(&r, TD_WEIGHTS_MISSING, "tensor '%s': missing (%s %s, %s)", e->name,
                      want_str(e->ndim, e->shape, want, sizeof(want)), e->dims,
                      td_weights_format_str(e->format));
        } else if (wt_check_weight(&r, e, t)) {
            w->t[i].w = t;
            w->bytes += t->nbytes;
        }
        if (!quant)
            continue;
        sc = td_st_find(st, e->scale_name);
        if (sc == NULL) {
            wt_report(&r, TD_WEIGHTS_MISSING, "tensor '%s': missing (scale of '%s', %s)",
                      e->scale_name, e->name, want_str(2, e->scale_shape, want, sizeof(want)));
        } else if (wt_check_scale(&r, s, e, sc)) {
            w->t[i].scale = sc;
            w->bytes += sc->nbytes;
        }
    }

    qsort(names, nnames, sizeof(*names), wt_cmp_str);
    for (size_t i = 0; i < ntensors; i++) {
        const td_st_tensor_t *t = td_st_at(st, i);
        if (bsearch(&t->name, names, nnames, sizeof(*names), wt_cmp_str) != NULL)
            continue;
        if (td_weights_ignored(t->name)) {
            w->ignored++;
            continue;
        }
        wt_report(&r, TD_WEIGHTS_UNEXPECTED, "tensor '%s': unexpected (%s %s in %s; not part of "
                  "this config's text backbone)", t->name, td_dtype_name(t->dtype),
                  shape_str(t, want, sizeof(want)), t->file ? t->file : "the checkpoint");
    }

    problems = r.count[TD_WEIGHTS_MISSING] + r.count[TD_WEIGHTS_SHAPE] +
               r.count[TD_WEIGHTS_DTYPE] + r.count[TD_WEIGHTS_UNEXPECTED];
    if (problems > 0) {
        wt_report(&r, TD_WEIGHTS_SUMMARY, "weights: %zu problem%s in %zu tensors: %zu missing, "
                  "%zu wrong shape, %zu wrong dtype, %zu unexpected; %zu ignored", problems,
                  problems == 1 ? "" : "s", ntensors, r.count[TD_WEIGHTS_MISSING],
                  r.count[TD_WEIGHTS_SHAPE], r.count[TD_WEIGHTS_DTYPE],
                  r.count[TD_WEIGHTS_UNEXPECTED], w->ignored);
        ret = TD_ERR_INVALID;
        goto err;
    }
    free(names);
    td_debug("weights: %zu schema tensors bound (%" PRIu64 " bytes), %zu ignored", s->n, w->bytes,
             w->ignored);
    *out = w;
    return TD_OK;

err:
    free(names);
    td_weights_destroy(w);
    return ret;
}

void
td_weights_destroy(td_weights_t *w)
{
    if (w == NULL)
        return;
    free(w->t);
    free(w);
}

const td_weights_bound_t *
td_weights_get(const td_weights_t *w, const char *name)
{
    ssize_t i = wt_find_index(w->schema, name);
    return i < 0 ? NULL : &w->t[i];
}
