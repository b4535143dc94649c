/* tests/model/test_weight_schema.c — model/weights: which tensors exist for which
 * layers (reference module tree, release shapes from docs/weights.md) and each
 * problem class a bind reports (missing, shape, dtype, unexpected, summary). */
#include "check.h"
#include "log.h"
#include "modelcfg.h"
#include "safetensors.h"
#include "weights.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/test_weight_schema.XXXXXX";

/* The tiny schedule: window layer 0; ratio-2 group 1..3 (source 1, reindex 3);
 * ratio-1 group 4..7 (source 4, candidate; reindex 6); engram on 2 and 5. */
#define TINY_TEXT                                                                        \
    "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 8,"                \
    "\"num_attention_heads\": 4, \"head_dim\": 64, \"q_lora_rank\": 32,"                 \
    "\"qk_rope_head_dim\": 16, \"sliding_window\": 8,"                                   \
    "\"compress_ratios\": [0, 2, 2, 2, 1, 1, 1, 1], \"kv_source_layer_ids\": [1, 4],"    \
    "\"index_source_layer_ids\": [1, 3, 4, 6], \"candidate_source_layer_id\": 4,"        \
    "\"index_n_heads\": 2, \"index_head_dim\": 32, \"index_topk\": 4, \"o_groups\": 2,"  \
    "\"o_lora_rank\": 32, \"moe_intermediate_size\": 32, \"n_routed_experts\": 4,"       \
    "\"num_experts_per_tok\": 2, \"engram_layer_ids\": [2, 5], \"engram_vocab_size\": 61," \
    "\"engram_num_embeddings\": [272, 348], \"engram_max_ngram_size\": 3,"               \
    "\"engram_n_heads\": 2, \"engram_head_dim\": 32, \"engram_pad_id\": 2,"              \
    "\"num_nextn_predict_layers\": 0"

static const char tiny_cfg[] = "{\"model_type\": \"deepseek_v41\", \"text_config\": {" TINY_TEXT "}}";
static const char tiny_fp8_cfg[] =
    "{\"model_type\": \"deepseek_v41\", \"text_config\": {" TINY_TEXT "},"
    " \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [32, 32],"
    " \"scale_fmt\": \"ue8m0\", \"expert_dtype\": \"fp8\"}}";
static const char tiny_fp4_cfg[] =
    "{\"model_type\": \"deepseek_v41\", \"text_config\": {" TINY_TEXT "},"
    " \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [32, 32],"
    " \"scale_fmt\": \"ue8m0\", \"expert_dtype\": \"fp4\"}}";

static td_modelcfg_t *
cfg_of(const char *json)
{
    td_modelcfg_t *cfg = NULL;
    char err[512] = "";

    if (td_modelcfg_parse(json, strlen(json), &cfg, err, sizeof(err)) != TD_OK) {
        fprintf(stderr, "config: %s\n", err);
        td_check_failures++;
    }
    return cfg;
}

static td_weights_schema_t *
schema_of(const char *json, td_modelcfg_t **cfgp)
{
    td_modelcfg_t *cfg = cfg_of(json);
    td_weights_schema_t *s = NULL;

    if (cfg != NULL)
        CHECK_STATUS(td_weights_schema_create(cfg, &s), TD_OK);
    if (cfgp != NULL)
        *cfgp = cfg;
    else
        td_modelcfg_destroy(cfg);
    return s;
}

static bool
has(const td_weights_schema_t *s, const char *name)
{
    return td_weights_schema_find(s, name) != NULL;
}

/* ---- Which tensors exist ---------------------------------------------------------- */

static void
test_schema_tiny(void)
{
    td_weights_schema_t *s = schema_of(tiny_cfg, NULL);
    const td_weights_entry_t *e;
    char name[96];

    if (s == NULL)
        return;
    CHECK(has(s, "embed.weight") && has(s, "norm.weight") && has(s, "head.weight"));
    for (int i = 0; i < 8; i++) {
        bool kv = i == 1 || i == 4, ix = i == 1 || i == 3 || i == 4 || i == 6;
        bool engram = i == 2 || i == 5;
        static const char *const every[] = {
            "attn_norm.weight", "ffn_norm.weight", "attn.wq_a.weight", "attn.q_norm.weight",
            "attn.wq_b.weight", "attn.wkv.weight", "attn.kv_norm.weight", "attn.wo_a.weight",
            "attn.wo_b.weight", "attn.attn_sink", "ffn.gate.weight", "ffn.gate.bias",
            "ffn.gate.bias_vl", "ffn.experts.3.w2.weight", "ffn.shared_experts.w1.weight",
            "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base",
            "hc_ffn_scale",
        };
        for (size_t k = 0; k < sizeof(every) / sizeof(every[0]); k++) {
            snprintf(name, sizeof(name), "layers.%d.%s", i, every[k]);
            CHECK(has(s, name));
        }
        /* compressor only on kv sources, its gate only at ratio > 1 */
        snprintf(name, sizeof(name), "layers.%d.attn.compressor.wkv.weight", i);
        CHECK_EQ_INT(has(s, name), kv);
        snprintf(name, sizeof(name), "layers.%d.attn.compressor.norm.weight", i);
        CHECK_EQ_INT(has(s, name), kv);
        snprintf(name, sizeof(name), "layers.%d.attn.compressor.wgate.weight", i);
        CHECK_EQ_INT(has(s, name), i == 1);
        /* indexer on index sources; its keys (wk, k_norm) only when also a kv source */
        snprintf(name, sizeof(name), "layers.%d.attn.indexer.wq_b.weight", i);
        CHECK_EQ_INT(has(s, name), ix);
        snprintf(name, sizeof(name), "layers.%d.attn.indexer.weights_proj.weight", i);
        CHECK_EQ_INT(has(s, name), ix);
        snprintf(name, sizeof(name), "layers.%d.attn.indexer.wk.weight", i);
        CHECK_EQ_INT(has(s, name), ix && kv);
        snprintf(name, sizeof(name), "layers.%d.attn.indexer.k_norm.weight", i);
        CHECK_EQ_INT(has(s, name), ix && kv);
        /* engram: table + its scale, projection, q/k weights */
        snprintf(name, sizeof(name), "layers.%d.engram.embed.weight", i);
        CHECK_EQ_INT(has(s, name), engram);
        snprintf(name, sizeof(name), "layers.%d.engram.embed.scale", i);
        CHECK_EQ_INT(has(s, name), engram);
        snprintf(name, sizeof(name), "layers.%d.engram.wkv.weight", i);
        CHECK_EQ_INT(has(s, name), engram);
        snprintf(name, sizeof(name), "layers.%d.engram.q_weight", i);
        CHECK_EQ_INT(has(s, name), engram);
        snprintf(name, sizeof(name), "layers.%d.ffn.experts.4.w1.weight", i);
        CHECK(!has(s, name));   /* 4 experts: 0..3 */
    }
    CHECK(!has(s, "layers.8.attn_norm.weight"));

    e = td_weights_schema_find(s, "layers.3.attn.wq_b.weight");
    CHECK(e != NULL && e->shape[0] == 256 && e->shape[1] == 32 && e->layer == 3 &&
          e->format == TD_WEIGHTS_FLOAT && e->scale_name[0] == '\0');
    e = td_weights_schema_find(s, "layers.2.hc_attn_fn");
    CHECK(e != NULL && e->shape[0] == 24 && e->shape[1] == 256 && e->format == TD_WEIGHTS_F32);
    e = td_weights_schema_find(s, "layers.1.attn.wo_a.weight");
    CHECK(e != NULL && e->shape[0] == 64 && e->shape[1] == 128);
    e = td_weights_schema_find(s, "layers.5.engram.embed.weight");
    CHECK(e != NULL && e->shape[0] == 348 && e->shape[1] == 32);
    e = td_weights_schema_find(s, "layers.5.engram.embed.scale");
    CHECK(e != NULL && e->shape[0] == 348 && e->shape[1] == 1);
    e = td_weights_schema_find(s, "layers.5.engram.wkv.weight");
    CHECK(e != NULL && e->shape[0] == 320 && e->shape[1] == 128);
    e = td_weights_schema_find(s, "layers.6.ffn.experts.2.w1.weight");
    CHECK(e != NULL && e->expert == 2 && e->layer == 6);
    td_weights_schema_destroy(s);

    /* tied embeddings: no head */
    s = schema_of("{\"tie_word_embeddings\": true, " TINY_TEXT "}", NULL);
    if (s != NULL) {
        CHECK(!has(s, "head.weight"));
        td_weights_schema_destroy(s);
    }
}

/* The released shapes as docs/weights.md lists them from the release headers. */
static void
test_schema_flash(void)
{
    static const char flash[] =
        "{\"model_type\": \"deepseek_v41\", \"text_config\": {"
        "\"compress_ratios\": [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,"
        " 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],"
        "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 16, \"beta_fast\": 32,"
        " \"beta_slow\": 1, \"original_max_position_embeddings\": 65536},"
        "\"engram_layer_ids\": [1, 14], \"engram_num_embeddings\": [384006168, 384016682]},"
        "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [32, 32],"
        " \"scale_fmt\": \"ue8m0\", \"expert_dtype\": \"fp4\"}}";
    td_weights_schema_t *s = schema_of(flash, NULL);
    const td_weights_entry_t *e;

    if (s == NULL)
        return;
    e = td_weights_schema_find(s, "layers.14.engram.embed.weight");
    CHECK(e != NULL && e->shape[0] == 384016682 && e->shape[1] == 256 &&
          e->format == TD_WEIGHTS_FP8_ROWS && e->scale_shape[1] == 8);
    CHECK_STR(e ? e->scale_name : NULL, "layers.14.engram.embed.scale");
    e = td_weights_schema_find(s, "layers.1.engram.wkv.weight");
    CHECK(e != NULL && e->shape[0] == 25600 && e->shape[1] == 6144 &&
          e->format == TD_WEIGHTS_FP8_BLOCK && e->scale_shape[0] == 800 && e->scale_shape[1] == 192);
    e = td_weights_schema_find(s, "layers.7.ffn.experts.383.w2.weight");
    CHECK(e != NULL && e->shape[0] == 5120 && e->shape[1] == 2304 &&
          e->format == TD_WEIGHTS_FP4_GROUP && e->scale_shape[1] == 72);
    CHECK_STR(e ? e->scale_name : NULL, "layers.7.ffn.experts.383.w2.scale");
    e = td_weights_schema_find(s, "layers.7.ffn.shared_experts.w2.weight");
    CHECK(e != NULL && e->format == TD_WEIGHTS_FP8_BLOCK);
    e = td_weights_schema_find(s, "layers.20.attn.indexer.wk.weight");
    CHECK(e != NULL && e->shape[0] == 128 && e->shape[1] == 512 && e->format == TD_WEIGHTS_FLOAT);
    e = td_weights_schema_find(s, "layers.24.attn.indexer.wq_b.weight");
    CHECK(e != NULL && e->shape[0] == 4096 && e->shape[1] == 1280 && e->format == TD_WEIGHTS_FP8_BLOCK);
    CHECK(!has(s, "layers.24.attn.indexer.wk.weight"));
    CHECK(!has(s, "layers.20.attn.compressor.wgate.weight"));
    CHECK(has(s, "layers.14.attn.compressor.wgate.weight"));
    CHECK(!has(s, "layers.15.attn.compressor.wkv.weight"));
    e = td_weights_schema_find(s, "layers.0.attn.wo_a.weight");
    CHECK(e != NULL && e->shape[0] == 8192 && e->shape[1] == 4096);
    e = td_weights_schema_find(s, "layers.0.hc_ffn_fn");
    CHECK(e != NULL && e->shape[0] == 24 && e->shape[1] == 20480 && e->format == TD_WEIGHTS_F32);
    e = td_weights_schema_find(s, "embed.weight");
    CHECK(e != NULL && e->shape[0] == 129280 && e->shape[1] == 5120 && e->layer == -1);
    CHECK(!has(s, "layers.40.attn_norm.weight"));   /* the draft layers are not in the backbone */
    td_weights_schema_destroy(s);
}

/* ---- Writing test checkpoints ------------------------------------------------------ */

typedef struct {
    const char *drop;         /* leave this tensor out */
    const char *reshape;      /* write this tensor with shape[0] = 64 */
    const char *retype;       /* write this (float) tensor as retype_dt */
    td_dtype_t retype_dt;
    const char *const *extra; /* more tensors (F32 [2]) */
    bool as_f4;               /* fp4 experts as F4 [R, K] instead of I8 [R, K/2] */
    bool quantize_float;      /* write FLOAT linears as fp8 + scale (config says float) */
} ckpt_opts_t;

static size_t
nbytes_of(td_dtype_t dt, const int64_t *shape, int ndim)
{
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    return dt == TD_DT_F4 ? n / 2 : n * (td_dtype_bits(dt) / 8);
}

static void
add_zero(td_st_writer_t *w, const char *name, td_dtype_t dt, int ndim, const int64_t *shape)
{
    size_t n = nbytes_of(dt, shape, ndim);
    void *buf = calloc(1, n ? n : 1);
    CHECK(buf != NULL);
    CHECK_STATUS(td_st_writer_add(w, name, dt, ndim, shape, buf, n), TD_OK);
    free(buf);
}

static const char *
write_ckpt(const td_weights_schema_t *s, const char *file, const ckpt_opts_t *o)
{
    static char path[512];
    td_st_writer_t *w = NULL;

    snprintf(path, sizeof(path), "%s/%s", tmpdir, file);
    CHECK_STATUS(td_st_writer_create(path, &w), TD_OK);
    if (w == NULL)
        return path;
    for (size_t i = 0; i < s->n; i++) {
        const td_weights_entry_t *e = &s->entries[i];
        int64_t shape[2] = { e->shape[0], e->shape[1] };
        td_dtype_t dt;

        if (o->drop && strcmp(o->drop, e->name) == 0)
            continue;
        if (o->reshape && strcmp(o->reshape, e->name) == 0)
            shape[0] = 64;
        switch (e->format) {
        case TD_WEIGHTS_FLOAT:
            dt = TD_DT_BF16;
            if (o->quantize_float && e->ndim == 2 && strstr(e->name, "norm") == NULL &&
                strstr(e->name, "engram.embed") == NULL) {
                add_zero(w, e->name, TD_DT_F8_E4M3, 2, shape);
                char sc[96];
                snprintf(sc, sizeof(sc), "%.*s.scale", (int)(strlen(e->name) - 7), e->name);
                add_zero(w, sc, TD_DT_E8M0, 2, (const int64_t[2]){ 1, 1 });
                continue;
            }
            break;
        case TD_WEIGHTS_F32:
            dt = TD_DT_F32;
            break;
        case TD_WEIGHTS_FP4_GROUP:
            dt = o->as_f4 ? TD_DT_F4 : TD_DT_I8;
            if (!o->as_f4)
                shape[1] /= 2;
            break;
        default:
            dt = TD_DT_F8_E4M3;
            break;
        }
        if (o->retype && strcmp(o->retype, e->name) == 0)
            dt = o->retype_dt;
        add_zero(w, e->name, dt, e->ndim, shape);
        if (e->scale_name[0] != '\0') {
            int64_t ss[2] = { e->scale_shape[0], e->scale_shape[1] };
            if (o->drop && strcmp(o->drop, e->scale_name) == 0)
                continue;
            if (o->reshape && strcmp(o->reshape, e->scale_name) == 0)
                ss[0] = 64;
            dt = o->retype && strcmp(o->retype, e->scale_name) == 0 ? o->retype_dt : TD_DT_E8M0;
            add_zero(w, e->scale_name, dt, 2, ss);
        }
    }
    for (size_t i = 0; o->extra && o->extra[i]; i++)
        add_zero(w, o->extra[i], TD_DT_F32, 1, (const int64_t[1]){ 2 });
    CHECK_STATUS(td_st_writer_finish(w, NULL), TD_OK);
    return path;
}

/* ---- Binding ------------------------------------------------------------------------ */

typedef struct {
    int count[TD_WEIGHTS_SUMMARY + 1];
    char lines[1024][256];
    int n;
} reports_t;

static void
collect(void *arg, td_weights_problem_t kind, const char *line)
{
    reports_t *r = arg;
    r->count[kind]++;
    if (r->n < 1024)
        snprintf(r->lines[r->n++], sizeof(r->lines[0]), "%s", line);
}

static bool
reported(const reports_t *r, const char *line)
{
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->lines[i], line) == 0)
            return true;
    fprintf(stderr, "not reported: \"%s\"; reports:\n", line);
    for (int i = 0; i < r->n && i < 20; i++)
        fprintf(stderr, "  %s\n", r->lines[i]);
    return false;
}

/* Bind the checkpoint at path; returns the status, reports in r. */
static td_status_t
bind_file(const td_weights_schema_t *s, const char *path, reports_t *r, td_weights_t **out)
{
    td_st_t *st = NULL;
    td_weights_t *w = NULL;
    td_status_t ret;

    memset(r, 0, sizeof(*r));
    CHECK_STATUS(td_st_open(path, &st), TD_OK);
    if (st == NULL)
        return TD_ERR_IO;
    ret = td_weights_bind(s, st, collect, r, &w);
    if (ret == TD_OK && out != NULL) {
        /* keep the checkpoint open for the caller's checks on the binding */
        *out = w;
        CHECK(td_weights_get(w, "layers.3.attn.wq_b.weight") != NULL);
        CHECK(td_weights_get(w, "layers.3.attn.wq_b.weight")->w ==
              td_st_find(st, "layers.3.attn.wq_b.weight"));
        CHECK(td_weights_get(w, "no.such.tensor") == NULL);
        *out = NULL;
    }
    CHECK(ret == TD_OK ? w != NULL : w == NULL);
    td_weights_destroy(w);
    td_st_close(st);
    return ret;
}

static void
test_bind_float(void)
{
    td_weights_schema_t *s = schema_of(tiny_cfg, NULL);
    static const char *const ignored[] = { "mtp.0.attn.wq_a.weight", "model.mtp.2.norm.weight",
                                           "vision.blocks.0.w", "aligner.proj.weight",
                                           "image_newline", "image_start", NULL };
    static const char *const bogus[] = { "layers.0.attn.bogus.weight", "lm_head.weight", NULL };
    static reports_t r;
    td_weights_t *w = NULL;
    ckpt_opts_t o;
    char line[512];

    if (s == NULL)
        return;
    /* complete, with the tensors the reference ignores */
    memset(&o, 0, sizeof(o));
    o.extra = ignored;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "ok.safetensors", &o), &r, &w), TD_OK);
    CHECK_EQ_INT(r.n, 0);

    /* missing */
    memset(&o, 0, sizeof(o));
    o.drop = "layers.3.attn.wq_b.weight";
    CHECK_STATUS(bind_file(s, write_ckpt(s, "missing.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_MISSING], 1);
    CHECK(reported(&r, "tensor 'layers.3.attn.wq_b.weight': missing ([256, 32] "
                       "num_attention_heads*head_dim, q_lora_rank, float)"));
    CHECK_EQ_INT(r.count[TD_WEIGHTS_SUMMARY], 1);

    /* wrong shape */
    memset(&o, 0, sizeof(o));
    o.reshape = "layers.3.attn.wq_b.weight";
    CHECK_STATUS(bind_file(s, write_ckpt(s, "shape.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_SHAPE], 1);
    CHECK(reported(&r, "tensor 'layers.3.attn.wq_b.weight': shape [64, 32], expected [256, 32] "
                       "(num_attention_heads*head_dim, q_lora_rank)"));

    /* wrong dtype: a tensor the reference keeps in fp32, and an integer norm */
    memset(&o, 0, sizeof(o));
    o.retype = "layers.0.attn.attn_sink";
    o.retype_dt = TD_DT_BF16;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "dtype.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_DTYPE], 1);
    CHECK(reported(&r, "tensor 'layers.0.attn.attn_sink': dtype BF16, expected F32 (kept in fp32)"));
    o.retype = "norm.weight";
    o.retype_dt = TD_DT_I32;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "dtype2.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'norm.weight': dtype I32, expected F32, BF16 or F16"));

    /* unexpected, next to ignored ones */
    memset(&o, 0, sizeof(o));
    static const char *const mixed[] = { "layers.0.attn.bogus.weight", "mtp.1.x", NULL };
    o.extra = mixed;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "extra.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_UNEXPECTED], 1);
    CHECK(reported(&r, "tensor 'layers.0.attn.bogus.weight': unexpected (F32 [2] in "
                       "extra.safetensors; not part of this config's text backbone)"));

    /* everything at once: each problem reported, then the summary */
    memset(&o, 0, sizeof(o));
    o.drop = "layers.7.ffn.experts.1.w3.weight";
    o.reshape = "layers.4.attn.indexer.wk.weight";
    o.retype = "layers.5.hc_ffn_base";
    o.retype_dt = TD_DT_F16;
    o.extra = bogus;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "all.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_MISSING], 1);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_SHAPE], 1);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_DTYPE], 1);
    CHECK_EQ_INT(r.count[TD_WEIGHTS_UNEXPECTED], 2);
    CHECK(reported(&r, "tensor 'layers.4.attn.indexer.wk.weight': shape [64, 64], expected "
                       "[32, 64] (index_head_dim, head_dim)"));
    snprintf(line, sizeof(line), "weights: 5 problems in %zu tensors: 1 missing, 1 wrong shape, "
             "1 wrong dtype, 2 unexpected; 0 ignored", s->n - 1 + 2);
    CHECK(reported(&r, line));

    /* quantized tensors under a config without quantization_config */
    memset(&o, 0, sizeof(o));
    o.quantize_float = true;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "quantized.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(r.count[TD_WEIGHTS_DTYPE] > 0 && r.count[TD_WEIGHTS_UNEXPECTED] > 0);
    CHECK(reported(&r, "tensor 'embed.weight': dtype F8_E4M3, expected F32, BF16 or F16 "
                       "(quantized, but the config has no quantization_config for it)"));
    CHECK(reported(&r, "tensor 'embed.scale': unexpected (F8_E8M0 [1, 1] in "
                       "quantized.safetensors; not part of this config's text backbone)"));
    td_weights_schema_destroy(s);
}

static void
test_bind_quantized(void)
{
    td_weights_schema_t *s = schema_of(tiny_fp8_cfg, NULL), *s4 = schema_of(tiny_fp4_cfg, NULL);
    const td_weights_entry_t *e;
    static reports_t r;
    td_weights_t *w = NULL;
    ckpt_opts_t o;

    if (s == NULL || s4 == NULL)
        goto out;
    e = td_weights_schema_find(s, "layers.3.attn.wq_b.weight");
    CHECK(e != NULL && e->format == TD_WEIGHTS_FP8_BLOCK && e->scale_shape[0] == 8 &&
          e->scale_shape[1] == 1);
    e = td_weights_schema_find(s, "layers.2.engram.embed.weight");
    CHECK(e != NULL && e->format == TD_WEIGHTS_FP8_ROWS && e->scale_shape[0] == 272);
    CHECK(!has(s, "layers.2.engram.embed.scale"));   /* the scale belongs to the fp8 table */
    e = td_weights_schema_find(s, "layers.0.ffn.experts.0.w2.weight");
    CHECK(e != NULL && e->format == TD_WEIGHTS_FP8_BLOCK);
    e = td_weights_schema_find(s, "layers.0.attn.compressor.wkv.weight");
    CHECK(e == NULL);
    e = td_weights_schema_find(s, "layers.1.attn.compressor.wkv.weight");
    CHECK(e != NULL && e->format == TD_WEIGHTS_FLOAT);   /* stays BF16 in the release */

    memset(&o, 0, sizeof(o));
    CHECK_STATUS(bind_file(s, write_ckpt(s, "q-ok.safetensors", &o), &r, &w), TD_OK);

    /* a scale missing, a scale misshapen, a weight not fp8 */
    memset(&o, 0, sizeof(o));
    o.drop = "layers.3.attn.wq_b.scale";
    CHECK_STATUS(bind_file(s, write_ckpt(s, "q-noscale.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'layers.3.attn.wq_b.scale': missing (scale of "
                       "'layers.3.attn.wq_b.weight', [8, 1])"));
    memset(&o, 0, sizeof(o));
    o.reshape = "layers.3.attn.wq_b.scale";
    CHECK_STATUS(bind_file(s, write_ckpt(s, "q-scale.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'layers.3.attn.wq_b.scale': shape [64, 1], expected [8, 1] "
                       "(scale of 'layers.3.attn.wq_b.weight', blocks of 32x32)"));
    memset(&o, 0, sizeof(o));
    o.retype = "layers.3.attn.wq_b.weight";
    o.retype_dt = TD_DT_BF16;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "q-dtype.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'layers.3.attn.wq_b.weight': dtype BF16, expected F8_E4M3 "
                       "(fp8 block, quantization_config quant_method fp8)"));
    memset(&o, 0, sizeof(o));
    o.retype = "layers.2.engram.embed.scale";
    o.retype_dt = TD_DT_I32;
    CHECK_STATUS(bind_file(s, write_ckpt(s, "q-sdtype.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'layers.2.engram.embed.scale': dtype I32, expected F8_E8M0, U8, "
                       "F32, BF16 or F16 (scale of 'layers.2.engram.embed.weight')"));

    /* fp4 experts: packed I8 [R, K/2] or F4 [R, K] */
    memset(&o, 0, sizeof(o));
    CHECK_STATUS(bind_file(s4, write_ckpt(s4, "q4-ok.safetensors", &o), &r, &w), TD_OK);
    o.as_f4 = true;
    CHECK_STATUS(bind_file(s4, write_ckpt(s4, "q4-f4.safetensors", &o), &r, &w), TD_OK);
    memset(&o, 0, sizeof(o));
    o.reshape = "layers.0.ffn.experts.1.w1.weight";
    CHECK_STATUS(bind_file(s4, write_ckpt(s4, "q4-shape.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'layers.0.ffn.experts.1.w1.weight': shape [64, 32], expected "
                       "[32, 32] (moe_intermediate_size, hidden_size, packed two fp4 codes a byte)"));
    memset(&o, 0, sizeof(o));
    o.retype = "layers.0.ffn.experts.1.w1.weight";
    o.retype_dt = TD_DT_F8_E4M3;
    CHECK_STATUS(bind_file(s4, write_ckpt(s4, "q4-dtype.safetensors", &o), &r, NULL), TD_ERR_INVALID);
    CHECK(reported(&r, "tensor 'layers.0.ffn.experts.1.w1.weight': dtype F8_E4M3, expected I8 or "
                       "F4 (packed fp4 experts, quantization_config expert_dtype fp4)"));
out:
    td_weights_schema_destroy(s);
    td_weights_schema_destroy(s4);
}

static void
test_schema_refusals(void)
{
    td_modelcfg_t *cfg = cfg_of("{\"hidden_size\": 48, \"num_attention_heads\": 4,"
                                " \"quantization_config\": {\"quant_method\": \"fp8\","
                                " \"expert_dtype\": \"fp4\"}}");
    td_weights_schema_t *s = NULL;

    if (cfg != NULL) {
        CHECK_STATUS(td_weights_schema_create(cfg, &s), TD_ERR_INVALID);   /* 48 % 32 */
        CHECK(s == NULL);
        td_modelcfg_destroy(cfg);
    }
    cfg = cfg_of("{\"hidden_act\": \"gelu\"}");
    if (cfg != NULL) {
        CHECK_STATUS(td_weights_schema_create(cfg, &s), TD_ERR_UNSUPPORTED);
        td_modelcfg_destroy(cfg);
    }
    CHECK(td_weights_ignored("mtp.0.x") && td_weights_ignored("model.mtp.0.x") &&
          td_weights_ignored("vision.a") && td_weights_ignored("aligner.b") &&
          td_weights_ignored("image_end") && !td_weights_ignored("layers.0.mtp") &&
          !td_weights_ignored("image_start.weight") && !td_weights_ignored("visionx"));
}

int
main(void)
{
    td_log_set_level(TD_LOG_ERROR);
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_schema_tiny();
    test_schema_flash();
    test_bind_float();
    test_bind_quantized();
    test_schema_refusals();
    {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return td_check_exit("test_weight_schema");
}
