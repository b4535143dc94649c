/* model/modelcfg.c — one field table drives type checks, defaults and to_json;
 * the derivations and validations follow DeepseekV41TextConfig.__post_init__
 * and validate_rope in order, so a config fails here when it fails there. */
#include "modelcfg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define MODELCFG_MAX_FILE (16u << 20)   /* a config.json larger than this is refused */
#define MODELCFG_MAX_DIM  INT32_MAX     /* td_modelcfg_check's bound on every size */
#define MODELCFG_MAX_LAYERS 65536       /* num_hidden_layers, num_nextn_predict_layers: the
                                           per-layer schedules are built in memory */

/* ---- Messages --------------------------------------------------------------
 * parse, check and require put why they refuse a config in the caller's err
 * buffer and log nothing: the caller knows where the config came from and
 * logs it once (td_modelcfg_load does, with the file's path). */

typedef struct {
    char *err;
    size_t errlen;
    const char *prefix;   /* "text_config." for a composite config, else "" */
} cfg_ctx_t;

__attribute__((format(printf, 2, 3)))
static td_status_t
cfg_fail(cfg_ctx_t *cx, const char *fmt, ...)
{
    va_list ap;

    if (cx->err != NULL && cx->errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(cx->err, cx->errlen, fmt, ap);
        va_end(ap);
    }
    return TD_ERR_INVALID;
}

/* Short text of a JSON value for messages: compact JSON, cut at 80 bytes. */
static const char *
cfg_show(const json_t *v, char *buf, size_t len)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);

    if (s == NULL) {
        snprintf(buf, len, "(unprintable)");
        return buf;
    }
    if (strlen(s) > 80)
        snprintf(buf, len, "%.77s...", s);
    else
        snprintf(buf, len, "%s", s);
    free(s);
    return buf;
}

/* What a JSON value is, in the words of a Python type. */
static const char *
cfg_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "a list";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a float";
    case JSON_TRUE:
    case JSON_FALSE:   return "a bool";
    case JSON_NULL:    return "null";
    }
    return "a value";
}

/* "[2, 8, 14]" into buf (cut when long). */
static const char *
cfg_show_list(const td_modelcfg_list_t *l, char *buf, size_t len)
{
    size_t n = 0;

    n += (size_t)snprintf(buf, len, "[");
    for (uint32_t i = 0; i < l->n && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", l->v[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

/* ---- The field table -------------------------------------------------------- */

typedef enum {
    F_INT,      /* int */
    F_OPTINT,   /* int | None */
    F_NUM,      /* float | int */
    F_FLOAT,    /* float */
    F_BOOL,     /* bool */
    F_STR,      /* str */
    F_LIST,     /* list[int] | None (resolved to a list) */
    F_STRLIST,  /* list[str] | None (layer_types: checked, then derived) */
    F_DICT,     /* dict | None */
    F_EOS,      /* int | list[int] | None */
} cfg_ftype_t;

typedef struct {
    const char *name;
    cfg_ftype_t type;
    size_t off;          /* SIZE_MAX: checked only (layer_types) */
    int64_t di;          /* default: F_INT, F_BOOL, F_EOS (int), F_OPTINT (set when dset) */
    double dd;           /* default: F_FLOAT, F_NUM */
    const char *ds;      /* default: F_STR */
    bool dset;           /* F_OPTINT / F_EOS: the default is not null; F_NUM: integer */
} cfg_field_t;

#define OFF(f) offsetof(td_modelcfg_t, f)
#define FI(n, d)      { #n, F_INT, OFF(n), (d), 0, NULL, false }
#define FO(n)         { #n, F_OPTINT, OFF(n), 0, 0, NULL, false }
#define FN(n, d)      { #n, F_NUM, OFF(n), 0, (d), NULL, false }
#define FF(n, d)      { #n, F_FLOAT, OFF(n), 0, (d), NULL, false }
#define FB(n, d)      { #n, F_BOOL, OFF(n), (d), 0, NULL, false }
#define FS(n, d)      { #n, F_STR, OFF(n), 0, 0, (d), false }
#define FL(n)         { #n, F_LIST, OFF(n), 0, 0, NULL, false }
#define FD(n)         { #n, F_DICT, OFF(n), 0, 0, NULL, false }

/* DeepseekV41TextConfig's fields in declaration order (type errors are reported
 * in this order, as the dataclass assigns them). */
static const cfg_field_t cfg_fields[] = {
    FI(vocab_size, 129280),
    FI(hidden_size, 5120),
    FI(num_hidden_layers, 40),
    FI(num_attention_heads, 64),
    FI(num_key_value_heads, 1),
    FI(head_dim, 512),
    FI(q_lora_rank, 1280),
    FI(qk_rope_head_dim, 64),
    FN(rope_theta, 10000.0),
    FN(compress_rope_theta, 160000.0),
    FD(rope_parameters),
    FD(rope_scaling),
    FI(max_position_embeddings, 1048576),
    FB(attention_bias, false),
    FF(attention_dropout, 0.0),
    FI(sliding_window, 128),
    FL(compress_ratios),
    FL(kv_source_layer_ids),
    FL(index_source_layer_ids),
    FO(candidate_source_layer_id),
    FI(candidate_topk_blocks, 2048),
    FI(candidate_block_size, 8),
    FI(index_n_heads, 32),
    FI(index_head_dim, 128),
    FI(index_topk, 512),
    FI(o_groups, 8),
    FI(o_lora_rank, 1024),
    FI(moe_intermediate_size, 2304),
    FI(n_routed_experts, 384),
    FI(n_shared_experts, 1),
    FI(num_experts_per_tok, 6),
    FS(scoring_func, "sqrtsoftplus"),
    FF(gate_temp, 1.0),
    FB(norm_topk_prob, true),
    FF(routed_scaling_factor, 1.5),
    FS(topk_method, "noaux_tc"),
    FF(swiglu_limit, 10.0),
    FI(hc_mult, 4),
    FI(hc_sinkhorn_iters, 20),
    FF(hc_eps, 1.0e-6),
    FL(engram_layer_ids),
    FI(engram_vocab_size, 16000000),
    FL(engram_num_embeddings),
    FI(engram_max_ngram_size, 4),
    FI(engram_n_heads, 8),
    FI(engram_head_dim, 256),
    FI(engram_pad_id, 2),
    FI(engram_compressed_vocab_size, 99092),
    FI(num_nextn_predict_layers, 3),
    FI(dspark_block_size, 5),
    FI(dspark_noise_token_id, 128799),
    FL(dspark_target_layer_ids),
    FI(dspark_markov_rank, 256),
    FI(dspark_n_routed_experts, 128),
    FI(dspark_num_experts_per_tok, 3),
    FS(hidden_act, "silu"),
    FF(initializer_range, 0.02),
    FF(rms_norm_eps, 1.0e-20),
    FB(use_cache, true),
    FB(tie_word_embeddings, false),
    FO(pad_token_id),
    FO(bos_token_id),
    { "eos_token_id", F_EOS, OFF(eos_token_id), 1, 0, NULL, true },
    FB(output_router_logits, false),
    FF(router_aux_loss_coef, 0.001),
    FF(router_jitter_noise, 0.0),
    { "layer_types", F_STRLIST, SIZE_MAX, 0, 0, NULL, false },
};

#define CFG_NFIELDS (sizeof(cfg_fields) / sizeof(cfg_fields[0]))

/* Other names transformers accepts for a field (attribute_map). */
static const struct {
    const char *alias;
    const char *field;
} cfg_aliases[] = {
    { "num_local_experts", "n_routed_experts" },
    { "intermediate_size", "moe_intermediate_size" },
};

/* Keys every transformers config may carry; read and ignored, never "unknown". */
static const char *const cfg_base_keys[] = {
    "model_type", "architectures", "transformers_version", "torch_dtype", "dtype",
    "_name_or_path", "name_or_path", "auto_map", "output_hidden_states",
    "output_attentions", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder",
    "id2label", "label2id", "problem_type", "num_labels", "tokenizer_class",
    "quantization_config", "partial_rotary_factor", "_commit_hash",
    "attn_implementation", "experts_implementation", NULL,
};

/* DeepseekV41VisionConfig's fields: only type-checked (images are unsupported). */
static const struct {
    const char *name;
    cfg_ftype_t type;
} cfg_vision_fields[] = {
    { "hidden_size", F_INT },       { "intermediate_size", F_INT },
    { "num_hidden_layers", F_INT }, { "num_attention_heads", F_INT },
    { "patch_size", F_INT },        { "downsample_ratio", F_INT },
    { "rope_theta", F_NUM },        { "max_image_tokens", F_INT },
    { "min_pixels", F_INT },        { "max_wh_ratio", F_OPTINT },
};

/* The released schedule, used when compress_ratios / sources are not given. */
static const int64_t cfg_default_ratios[40] = {
    0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};
static const int64_t cfg_default_kv[] = { 2, 8, 14, 20 };
static const int64_t cfg_default_index[] = { 2, 8, 14, 20, 24, 28, 32, 36 };

/* ---- Lists ------------------------------------------------------------------ */

static td_status_t
list_set(td_modelcfg_list_t *l, const int64_t *v, uint32_t n)
{
    int64_t *p = malloc((n ? n : 1) * sizeof(*p));

    if (p == NULL)
        return TD_ERR_NOMEM;
    if (n)
        memcpy(p, v, n * sizeof(*p));
    free(l->v);
    l->v = p;
    l->n = n;
    return TD_OK;
}

static bool
list_has(const td_modelcfg_list_t *l, int64_t x)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->v[i] == x)
            return true;
    return false;
}

static bool
list_eq(const td_modelcfg_list_t *l, const int64_t *v, uint32_t n)
{
    return l->n == n && (n == 0 || memcmp(l->v, v, n * sizeof(*v)) == 0);
}

/* ---- Type checks ------------------------------------------------------------ */

static bool
is_num(const json_t *v)
{
    return json_is_integer(v) || json_is_real(v);
}

static double
num_value(const json_t *v)
{
    if (json_is_boolean(v))
        return json_is_true(v) ? 1.0 : 0.0;
    return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

/* A number to Python arithmetic (bool is an int there). */
static bool
is_pynum(const json_t *v)
{
    return is_num(v) || json_is_boolean(v);
}

/* Check v against type t for field `name`, as the reference's strict
 * dataclass does; a failure names the field and shows the value. */
static td_status_t
cfg_check_type(cfg_ctx_t *cx, const char *prefix, const char *name, cfg_ftype_t t, const json_t *v)
{
    char show[128];
    const char *want = NULL;

    switch (t) {
    case F_INT:    if (!json_is_integer(v)) want = "an integer"; break;
    case F_OPTINT: if (!json_is_integer(v) && !json_is_null(v)) want = "an integer or null"; break;
    case F_NUM:    if (!is_num(v)) want = "a number"; break;
    case F_FLOAT:  if (!json_is_real(v)) want = "a float"; break;
    case F_BOOL:   if (!json_is_boolean(v)) want = "a bool"; break;
    case F_STR:    if (!json_is_string(v)) want = "a string"; break;
    case F_DICT:   if (!json_is_object(v) && !json_is_null(v)) want = "an object or null"; break;
    case F_LIST:
    case F_STRLIST:
    case F_EOS:
        if (json_is_null(v) || (t == F_EOS && json_is_integer(v)))
            break;
        if (!json_is_array(v)) {
            want = t == F_EOS ? "an integer, a list of integers or null"
                 : t == F_LIST ? "a list of integers or null" : "a list of strings or null";
            break;
        }
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *e = json_array_get(v, i);
            if (t == F_STRLIST ? !json_is_string(e) : !json_is_integer(e))
                return cfg_fail(cx, "%s%s[%zu]: expected %s, got %s (%s)", prefix, name, i,
                                t == F_STRLIST ? "a string" : "an integer", cfg_kind(e),
                                cfg_show(e, show, sizeof(show)));
        }
        break;
    }
    if (want != NULL)
        return cfg_fail(cx, "%s%s: expected %s, got %s (%s)", prefix, name, want, cfg_kind(v),
                        cfg_show(v, show, sizeof(show)));
    return TD_OK;
}

static td_status_t
cfg_read_list(const json_t *v, td_modelcfg_list_t *l)
{
    size_t n = json_array_size(v);
    int64_t *tmp;
    td_status_t st;

    if (n > UINT32_MAX)
        return TD_ERR_TOO_BIG;
    tmp = malloc((n ? n : 1) * sizeof(*tmp));
    if (tmp == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        tmp[i] = json_integer_value(json_array_get(v, i));
    st = list_set(l, tmp, (uint32_t)n);
    free(tmp);
    return st;
}

/* Store a checked value (or the default when v is NULL) into its field. */
static td_status_t
cfg_store(td_modelcfg_t *cfg, const cfg_field_t *f, const json_t *v, bool *given)
{
    void *p = (char *)cfg + f->off;

    *given = v != NULL && !json_is_null(v);
    switch (f->type) {
    case F_INT:
        *(int64_t *)p = v ? json_integer_value(v) : f->di;
        return TD_OK;
    case F_OPTINT: {
        td_modelcfg_optint_t *o = p;
        o->set = *given;
        o->v = *given ? json_integer_value(v) : 0;
        return TD_OK;
    }
    case F_NUM: {
        td_modelcfg_num_t *x = p;
        x->is_int = v != NULL && json_is_integer(v);
        x->i = x->is_int ? json_integer_value(v) : 0;
        x->v = v ? num_value(v) : f->dd;
        return TD_OK;
    }
    case F_FLOAT:
        *(double *)p = v ? json_real_value(v) : f->dd;
        return TD_OK;
    case F_BOOL:
        *(bool *)p = v ? json_is_true(v) : f->di != 0;
        return TD_OK;
    case F_STR: {
        char *s = strdup(v ? json_string_value(v) : f->ds);
        if (s == NULL)
            return TD_ERR_NOMEM;
        free(*(char **)p);
        *(char **)p = s;
        return TD_OK;
    }
    case F_LIST:
        if (!*given)
            return list_set(p, NULL, 0);
        return cfg_read_list(v, p);
    case F_DICT: {
        json_t **j = p;
        json_decref(*j);
        *j = *given ? json_deep_copy(v) : NULL;
        return (*given && *j == NULL) ? TD_ERR_NOMEM : TD_OK;
    }
    case F_EOS:
        if (v == NULL) {
            cfg->eos_kind = TD_MODELCFG_EOS_INT;
            return list_set(p, &f->di, 1);
        }
        if (json_is_null(v)) {
            cfg->eos_kind = TD_MODELCFG_EOS_NONE;
            return list_set(p, NULL, 0);
        }
        if (json_is_integer(v)) {
            int64_t x = json_integer_value(v);
            cfg->eos_kind = TD_MODELCFG_EOS_INT;
            return list_set(p, &x, 1);
        }
        cfg->eos_kind = TD_MODELCFG_EOS_LIST;
        return cfg_read_list(v, p);
    case F_STRLIST:
        return TD_OK;
    }
    return TD_ERR_INTERNAL;
}

static const cfg_field_t *
cfg_field_find(const char *name)
{
    for (size_t i = 0; i < CFG_NFIELDS; i++)
        if (strcmp(cfg_fields[i].name, name) == 0)
            return &cfg_fields[i];
    return NULL;
}

static bool
cfg_is_base_key(const char *key)
{
    for (size_t i = 0; cfg_base_keys[i] != NULL; i++)
        if (strcmp(cfg_base_keys[i], key) == 0)
            return true;
    return false;
}

/* ---- Rope --------------------------------------------------------------------- */

/* The resolved rope_theta (or compress_rope_theta) as a JSON number. */
static json_t *
num_json(const td_modelcfg_num_t *x)
{
    return x->is_int ? json_integer(x->i) : json_real(x->v);
}

static bool
rope_type_is(const json_t *d, const char *type)
{
    const json_t *t = json_object_get(d, "rope_type");
    return json_is_string(t) && strcmp(json_string_value(t), type) == 0;
}

static td_status_t
json_setdefault(json_t *d, const char *key, json_t *v /* stolen */)
{
    if (v == NULL)
        return TD_ERR_NOMEM;
    if (json_object_get(d, key) != NULL) {
        json_decref(v);
        return TD_OK;
    }
    return json_object_set_new(d, key, v) == 0 ? TD_OK : TD_ERR_NOMEM;
}

/* PreTrainedConfig's standardization of a nested rope_parameters (keys "main"
 * and/or "compress"): each present sub-dict gets rope_type (from "type", else
 * "default"), rope_theta (the config's rope_theta), partial_rotary_factor
 * (when given at the top level) and, for llama3/yarn/longrope,
 * original_max_position_embeddings. */
static td_status_t
rope_standardize(cfg_ctx_t *cx, td_modelcfg_t *cfg, const json_t *partial)
{
    static const char *const labels[] = { "main", "compress" };
    json_t *rp = cfg->rope_parameters;
    char show[128];
    td_status_t st;

    if (rp == NULL)
        return TD_OK;
    for (int k = 0; k < 2; k++) {
        json_t *d = json_object_get(rp, labels[k]);
        if (d == NULL || json_is_null(d))
            continue;
        if (!json_is_object(d))
            return cfg_fail(cx, "%srope_parameters.%s: expected an object, got %s (%s)", cx->prefix,
                            labels[k], cfg_kind(d), cfg_show(d, show, sizeof(show)));
        if (json_object_get(d, "rope_type") == NULL) {
            json_t *t = json_object_get(d, "type");
            st = json_setdefault(d, "rope_type", t ? json_deep_copy(t) : json_string("default"));
            if (st != TD_OK)
                return st;
        }
        if ((st = json_setdefault(d, "rope_theta", num_json(&cfg->rope_theta))) != TD_OK)
            return st;
        if (partial != NULL &&
            (st = json_setdefault(d, "partial_rotary_factor", json_deep_copy(partial))) != TD_OK)
            return st;
        if (rope_type_is(d, "llama3") || rope_type_is(d, "yarn") || rope_type_is(d, "longrope")) {
            st = json_setdefault(d, "original_max_position_embeddings",
                                 json_integer(cfg->max_position_embeddings));
            if (st != TD_OK)
                return st;
        }
    }
    return TD_OK;
}

/* DeepseekV41TextConfig: keep a nested {main, compress} as given, else derive
 * both from rope_theta / compress_rope_theta and the YaRN keys of rope_scaling
 * (yarn only on the compressed branch, attention_factor 1.0). */
static td_status_t
rope_resolve(cfg_ctx_t *cx, td_modelcfg_t *cfg)
{
    json_t *rp = cfg->rope_parameters, *main = NULL, *comp = NULL, *out;
    const char *key;
    json_t *val;
    double partial;

    if (rp != NULL && json_is_object(json_object_get(rp, "main")) &&
        json_is_object(json_object_get(rp, "compress"))) {
        out = json_pack("{sOsO}", "main", json_object_get(rp, "main"), "compress",
                        json_object_get(rp, "compress"));
        if (out == NULL)
            return TD_ERR_NOMEM;
        json_decref(rp);
        cfg->rope_parameters = out;
        return TD_OK;
    }
    if (cfg->head_dim == 0)
        return cfg_fail(cx, "%shead_dim: 0: the rotary fraction qk_rope_head_dim / head_dim "
                        "divides by zero", cx->prefix);
    partial = (double)cfg->qk_rope_head_dim / (double)cfg->head_dim;
    main = json_pack("{sssosf}", "rope_type", "default", "rope_theta", num_json(&cfg->rope_theta),
                     "partial_rotary_factor", partial);
    comp = json_object();
    if (main == NULL || comp == NULL)
        goto err_nomem;
    if (cfg->rope_scaling != NULL) {
        json_object_foreach(cfg->rope_scaling, key, val) {
            if (strcmp(key, "main") == 0 || strcmp(key, "compress") == 0)
                continue;
            if (json_object_set_new(comp, key, json_deep_copy(val)) != 0)
                goto err_nomem;
        }
    }
    if (json_object_set_new(comp, "rope_theta", num_json(&cfg->compress_rope_theta)) != 0 ||
        json_object_set_new(comp, "partial_rotary_factor", json_real(partial)) != 0 ||
        json_setdefault(comp, "rope_type", json_string("default")) != TD_OK)
        goto err_nomem;
    if (rope_type_is(comp, "yarn") && json_setdefault(comp, "attention_factor", json_real(1.0)) != TD_OK)
        goto err_nomem;
    out = json_pack("{soso}", "main", main, "compress", comp);
    if (out == NULL)
        return TD_ERR_NOMEM;
    json_decref(cfg->rope_parameters);
    cfg->rope_parameters = out;
    return TD_OK;

err_nomem:
    json_decref(main);
    json_decref(comp);
    return TD_ERR_NOMEM;
}

/* The keys each rope type requires (transformers' _validate_<type>_rope_parameters). */
static const struct {
    const char *type;
    const char *required[6];
} rope_required[] = {
    { "default", { NULL } },
    { "axial", { NULL } },
    { "linear", { "factor", NULL } },
    { "dynamic", { "factor", NULL } },
    { "yarn", { "factor", "original_max_position_embeddings", NULL } },
    { "longrope", { "short_factor", "long_factor", "original_max_position_embeddings", NULL } },
    { "llama3", { "factor", "original_max_position_embeddings", "low_freq_factor",
                  "high_freq_factor", "rope_theta", NULL } },
    { "proportional", { "rope_theta", NULL } },
};

/* Python truthiness of a JSON value (for `beta_fast or 32`). */
static bool
json_truthy(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL:    return false;
    case JSON_FALSE:   return false;
    case JSON_TRUE:    return true;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL:    return json_real_value(v) != 0.0;
    case JSON_STRING:  return json_string_length(v) != 0;
    case JSON_ARRAY:   return json_array_size(v) != 0;
    case JSON_OBJECT:  return json_object_size(v) != 0;
    }
    return false;
}

/* validate_rope: each of main / compress gets rope_type written back and the
 * keys its type requires; yarn also compares its betas and divides
 * max_position_embeddings by original_max_position_embeddings. */
static td_status_t
rope_validate(cfg_ctx_t *cx, td_modelcfg_t *cfg)
{
    static const char *const labels[] = { "main", "compress" };
    char show[128];

    for (int k = 0; k < 2; k++) {
        json_t *d = json_object_get(cfg->rope_parameters, labels[k]);
        json_t *type;

        if (!json_is_object(d))
            continue;
        type = json_object_get(d, "rope_type");
        if (type == NULL)
            type = json_object_get(d, "type");
        type = type ? json_deep_copy(type) : json_string("default");
        if (type == NULL || json_object_set_new(d, "rope_type", type) != 0)
            return TD_ERR_NOMEM;
        if (!json_is_string(type))
            continue;   /* no validator for such a type */
        for (size_t t = 0; t < sizeof(rope_required) / sizeof(rope_required[0]); t++) {
            if (strcmp(rope_required[t].type, json_string_value(type)) != 0)
                continue;
            for (int r = 0; rope_required[t].required[r] != NULL; r++)
                if (json_object_get(d, rope_required[t].required[r]) == NULL)
                    return cfg_fail(cx, "%srope_parameters.%s: rope_type '%s' needs the key '%s'",
                                    cx->prefix, labels[k], json_string_value(type),
                                    rope_required[t].required[r]);
        }
        if (strcmp(json_string_value(type), "yarn") == 0) {
            const json_t *bf = json_object_get(d, "beta_fast"), *bs = json_object_get(d, "beta_slow");
            const json_t *om = json_object_get(d, "original_max_position_embeddings");
            if ((bf && json_truthy(bf) && !is_pynum(bf)) || (bs && json_truthy(bs) && !is_pynum(bs)))
                return cfg_fail(cx, "%srope_parameters.%s: beta_fast and beta_slow must be numbers, "
                                "got %s", cx->prefix, labels[k],
                                cfg_show(bf && json_truthy(bf) && !is_pynum(bf) ? bf : bs, show,
                                         sizeof(show)));
            if (!is_pynum(om) || num_value(om) == 0.0)
                return cfg_fail(cx, "%srope_parameters.%s: original_max_position_embeddings must "
                                "be a non-zero number, got %s", cx->prefix, labels[k],
                                cfg_show(om, show, sizeof(show)));
        }
    }
    return TD_OK;
}

/* Read one resolved rope dict into the struct the forward pass uses. */
static td_status_t
rope_read(const json_t *d, td_modelcfg_rope_t *r)
{
    const json_t *t = json_object_get(d, "rope_type");
    const struct {
        const char *key;
        bool *has;
        double *v;
    } nums[] = {
        { "rope_theta", &r->has_theta, &r->theta },
        { "partial_rotary_factor", &r->has_partial, &r->partial_rotary_factor },
        { "factor", &r->has_factor, &r->factor },
        { "original_max_position_embeddings", &r->has_original_max, &r->original_max_position_embeddings },
        { "beta_fast", &r->has_beta_fast, &r->beta_fast },
        { "beta_slow", &r->has_beta_slow, &r->beta_slow },
        { "attention_factor", &r->has_attention_factor, &r->attention_factor },
        { "mscale", &r->has_mscale, &r->mscale },
        { "mscale_all_dim", &r->has_mscale_all_dim, &r->mscale_all_dim },
    };

    free(r->rope_type);
    memset(r, 0, sizeof(*r));
    r->rope_type = strdup(json_is_string(t) ? json_string_value(t) : "(not a string)");
    if (r->rope_type == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        const json_t *v = json_object_get(d, nums[i].key);
        if (v != NULL && is_num(v)) {
            *nums[i].has = true;
            *nums[i].v = num_value(v);
        }
    }
    return TD_OK;
}

/* ---- __post_init__ ---------------------------------------------------------- */

typedef struct {
    bool compress_ratios, kv, index, dspark, candidate, engram_ids, engram_num;
} cfg_given_t;

/* compress_ratios: the released schedule, or it scaled to n layers, unless
 * given; n to n + nn entries, padded to n + nn with zeros (draft layers are
 * window-only). */
static td_status_t
cfg_resolve_ratios(cfg_ctx_t *cx, td_modelcfg_t *cfg, const cfg_given_t *g)
{
    const int64_t n = cfg->num_hidden_layers, nn = cfg->num_nextn_predict_layers;
    td_modelcfg_list_t *r = &cfg->compress_ratios;
    td_status_t st;
    int64_t *tmp;

    if (!g->compress_ratios) {
        if (n == 40) {
            st = list_set(r, cfg_default_ratios, 40);
        } else {
            /* window-only layers, a ratio-2 "encoder", a ratio-1 "decoder" */
            int64_t slide = n < 2 ? n : 2, enc = (n - slide + 1) / 2;
            tmp = calloc((size_t)n + 1, sizeof(*tmp));
            if (tmp == NULL)
                return TD_ERR_NOMEM;
            for (int64_t i = 0; i < n; i++)
                tmp[i] = i < slide ? 0 : i < slide + enc ? 2 : 1;
            st = list_set(r, tmp, (uint32_t)n);
            free(tmp);
        }
        if (st != TD_OK)
            return st;
    }
    if ((int64_t)r->n < n)
        return cfg_fail(cx, "%scompress_ratios: %u entries, needs at least num_hidden_layers (%" PRId64
                        ")", cx->prefix, r->n, n);
    if ((int64_t)r->n > n + nn)
        return cfg_fail(cx, "%scompress_ratios: %u entries, but num_hidden_layers + "
                        "num_nextn_predict_layers = %" PRId64, cx->prefix, r->n, n + nn);
    tmp = calloc((size_t)(n + nn) + 1, sizeof(*tmp));
    if (tmp == NULL)
        return TD_ERR_NOMEM;
    memcpy(tmp, r->v, r->n * sizeof(*tmp));
    st = list_set(r, tmp, (uint32_t)(n + nn));
    free(tmp);
    return st;
}

/* The defaults of the layer lists not given, from the ratio schedule: kv
 * sources (each layer that starts a run of one compressed ratio), index
 * sources (the kv sources) and the DSpark targets (the last three layers that
 * are no kv source). */
static td_status_t
cfg_resolve_sources(td_modelcfg_t *cfg, const cfg_given_t *g)
{
    const int64_t n = cfg->num_hidden_layers;
    td_modelcfg_list_t *r = &cfg->compress_ratios, *kv = &cfg->kv_source_layer_ids;
    td_modelcfg_list_t *ix = &cfg->index_source_layer_ids;
    td_status_t st;
    uint32_t m;

    if (!g->kv) {
        if (n <= 40 && memcmp(r->v, cfg_default_ratios, (size_t)n * sizeof(int64_t)) == 0) {
            st = list_set(kv, cfg_default_kv, 4);
        } else {
            int64_t *tmp = malloc(((size_t)n + 1) * sizeof(*tmp));
            if (tmp == NULL)
                return TD_ERR_NOMEM;
            m = 0;
            for (int64_t i = 0; i < n; i++)
                if (r->v[i] > 0 && (i == 0 || r->v[i - 1] != r->v[i]))
                    tmp[m++] = i;
            st = list_set(kv, tmp, m);
            free(tmp);
        }
        if (st != TD_OK)
            return st;
    }
    if (!g->index) {
        st = list_eq(kv, cfg_default_kv, 4) ? list_set(ix, cfg_default_index, 8)
                                            : list_set(ix, kv->v, kv->n);
        if (st != TD_OK)
            return st;
    }
    if (!g->dspark) {
        int64_t last[3];
        m = 0;
        for (int64_t i = n - 1; i >= 0 && m < 3; i--)
            if (!list_has(kv, i))
                last[m++] = i;
        int64_t asc[3];
        for (uint32_t i = 0; i < m; i++)
            asc[i] = last[m - 1 - i];
        if ((st = list_set(&cfg->dspark_target_layer_ids, asc, m)) != TD_OK)
            return st;
    }
    return TD_OK;
}

/* The kv and index sources are backbone layers with a compressed branch, each
 * index source has a kv source at or before it, the candidate source (by
 * default the last kv source) is an index source, and every compressed layer
 * has a kv source at or before it. */
static td_status_t
cfg_check_sources(cfg_ctx_t *cx, td_modelcfg_t *cfg, const cfg_given_t *g)
{
    const int64_t n = cfg->num_hidden_layers;
    const td_modelcfg_list_t *r = &cfg->compress_ratios, *kv = &cfg->kv_source_layer_ids;
    const td_modelcfg_list_t *ix = &cfg->index_source_layer_ids;
    char a[512];

    for (uint32_t i = 0; i < kv->n; i++)
        if (kv->v[i] < 0 || kv->v[i] >= n)
            return cfg_fail(cx, "%skv_source_layer_ids: %s: %" PRId64 " is out of range [0, %" PRId64
                            ")", cx->prefix, cfg_show_list(kv, a, sizeof(a)), kv->v[i], n);
    for (uint32_t i = 0; i < kv->n; i++)
        if (r->v[kv->v[i]] == 0)
            return cfg_fail(cx, "%skv_source_layer_ids: %s: layer %" PRId64 " has compress_ratios[%"
                            PRId64 "] = 0; a kv source needs a compressed branch", cx->prefix,
                            cfg_show_list(kv, a, sizeof(a)), kv->v[i], kv->v[i]);
    /* Python indexing: a negative id counts from the end */
    for (uint32_t i = 0; i < ix->n; i++) {
        int64_t id = ix->v[i], at = id < 0 ? id + n : id;
        if (at < 0 || at >= n)
            return cfg_fail(cx, "%sindex_source_layer_ids: %s: %" PRId64 " is out of range [0, %"
                            PRId64 ")", cx->prefix, cfg_show_list(ix, a, sizeof(a)), id, n);
        if (r->v[at] == 0)
            return cfg_fail(cx, "%sindex_source_layer_ids: %s: layer %" PRId64 " has compress_ratios[%"
                            PRId64 "] = 0; an index source needs a compressed branch", cx->prefix,
                            cfg_show_list(ix, a, sizeof(a)), id, at);
    }
    for (uint32_t i = 0; i < ix->n; i++) {
        bool before = false;
        for (uint32_t j = 0; j < kv->n; j++)
            before |= kv->v[j] < ix->v[i];
        if (!list_has(kv, ix->v[i]) && !before)
            return cfg_fail(cx, "%sindex_source_layer_ids: %s: layer %" PRId64 " has no "
                            "kv_source_layer_ids entry at or before it to publish the indexer keys",
                            cx->prefix, cfg_show_list(ix, a, sizeof(a)), ix->v[i]);
    }
    if (!g->candidate)
        cfg->candidate_source_layer_id = kv->n ? kv->v[kv->n - 1] : -1;
    if (cfg->candidate_source_layer_id >= 0 && !list_has(ix, cfg->candidate_source_layer_id))
        return cfg_fail(cx, "%scandidate_source_layer_id: %" PRId64 " is not in "
                        "index_source_layer_ids %s", cx->prefix, cfg->candidate_source_layer_id,
                        cfg_show_list(ix, a, sizeof(a)));
    for (int64_t i = 0; i < n; i++) {
        bool src = false;
        for (uint32_t j = 0; j < kv->n; j++)
            src |= kv->v[j] <= i;
        if (r->v[i] > 0 && !src)
            return cfg_fail(cx, "%skv_source_layer_ids: %s: layer %" PRId64 " has compress_ratios[%"
                            PRId64 "] = %" PRId64 " but no kv source at or before it", cx->prefix,
                            cfg_show_list(kv, a, sizeof(a)), i, i, r->v[i]);
    }
    return TD_OK;
}

/* engram_num_embeddings: zeros unless given, one per engram layer. */
static td_status_t
cfg_resolve_engram(cfg_ctx_t *cx, td_modelcfg_t *cfg, const cfg_given_t *g)
{
    td_status_t st;

    if (!g->engram_num) {
        int64_t *tmp = calloc((size_t)cfg->engram_layer_ids.n + 1, sizeof(*tmp));
        if (tmp == NULL)
            return TD_ERR_NOMEM;
        st = list_set(&cfg->engram_num_embeddings, tmp, cfg->engram_layer_ids.n);
        free(tmp);
        if (st != TD_OK)
            return st;
    }
    if (cfg->engram_num_embeddings.n != cfg->engram_layer_ids.n)
        return cfg_fail(cx, "%sengram_num_embeddings: %u entries, must match engram_layer_ids "
                        "(%u entries)", cx->prefix, cfg->engram_num_embeddings.n,
                        cfg->engram_layer_ids.n);
    return TD_OK;
}

/* The derived fields and their checks, in __post_init__'s order. */
static td_status_t
cfg_resolve(cfg_ctx_t *cx, td_modelcfg_t *cfg, const cfg_given_t *g)
{
    const int64_t n = cfg->num_hidden_layers, nn = cfg->num_nextn_predict_layers;
    td_status_t st;

    if (n < 0)
        return cfg_fail(cx, "%snum_hidden_layers: %" PRId64 " must not be negative", cx->prefix, n);
    if (n > MODELCFG_MAX_LAYERS || nn > MODELCFG_MAX_LAYERS)
        return cfg_fail(cx, "%snum_hidden_layers + num_nextn_predict_layers: %" PRId64 " + %" PRId64
                        " is too large (at most %d each)", cx->prefix, n, nn,
                        MODELCFG_MAX_LAYERS);
    if ((st = cfg_resolve_ratios(cx, cfg, g)) != TD_OK ||
        (st = cfg_resolve_sources(cfg, g)) != TD_OK ||
        (st = cfg_check_sources(cx, cfg, g)) != TD_OK ||
        (st = cfg_resolve_engram(cx, cfg, g)) != TD_OK ||
        (st = rope_resolve(cx, cfg)) != TD_OK)
        return st;
    return rope_validate(cx, cfg);
}

/* Per-layer view of the schedules (after validation). */
static td_status_t
cfg_build_layers(td_modelcfg_t *cfg)
{
    const int64_t n = cfg->num_hidden_layers;

    cfg->layers = calloc((size_t)n + 1, sizeof(*cfg->layers));
    if (cfg->layers == NULL)
        return TD_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        td_modelcfg_layer_t *l = &cfg->layers[i];
        l->ratio = cfg->compress_ratios.v[i];
        l->kv_source = list_has(&cfg->kv_source_layer_ids, i);
        l->index_source = list_has(&cfg->index_source_layer_ids, i);
        l->owns_index_k = l->index_source && l->kv_source;
        l->candidate_source = l->index_source && cfg->candidate_source_layer_id == i;
        l->uses_candidates = l->index_source && cfg->candidate_source_layer_id >= 0 &&
                             cfg->candidate_source_layer_id < i;
        l->group = -1;
        if (l->ratio != 0)
            for (uint32_t j = 0; j < cfg->kv_source_layer_ids.n; j++) {
                int64_t s = cfg->kv_source_layer_ids.v[j];
                if (s <= i && s > l->group)
                    l->group = (int32_t)s;
            }
        l->engram = -1;
        for (uint32_t k = 0; k < cfg->engram_layer_ids.n; k++)
            if (cfg->engram_layer_ids.v[k] == i) {
                l->engram = (int32_t)k;
                break;
            }
    }
    return TD_OK;
}

/* ---- Parsing ----------------------------------------------------------------- */

static td_status_t
cfg_check_vision(cfg_ctx_t *cx, const json_t *vision)
{
    td_status_t st;

    for (size_t i = 0; i < sizeof(cfg_vision_fields) / sizeof(cfg_vision_fields[0]); i++) {
        const json_t *v = json_object_get(vision, cfg_vision_fields[i].name);
        if (v != NULL &&
            (st = cfg_check_type(cx, "vision_config.", cfg_vision_fields[i].name,
                                 cfg_vision_fields[i].type, v)) != TD_OK)
            return st;
    }
    return TD_OK;
}

/* List (debug) the keys of obj that are neither fields, aliases nor base keys. */
static void
cfg_log_unknown(const json_t *obj, const char *where, const char *const *extra)
{
    char buf[1024];
    size_t n = 0;
    const char *key;
    json_t *v;

    if (TD_LOG_DEBUG > td_log_threshold)
        return;
    buf[0] = '\0';
    json_object_foreach((json_t *)obj, key, v) {
        bool known = cfg_field_find(key) != NULL || cfg_is_base_key(key);
        for (size_t i = 0; !known && i < sizeof(cfg_aliases) / sizeof(cfg_aliases[0]); i++)
            known = strcmp(cfg_aliases[i].alias, key) == 0;
        for (size_t i = 0; !known && extra != NULL && extra[i] != NULL; i++)
            known = strcmp(extra[i], key) == 0;
        if (!known && n < sizeof(buf))
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s", n ? ", " : "", key);
    }
    if (n > 0)
        td_debug("model config: %s: unknown fields, ignored: %s", where, buf);
}

static td_status_t
cfg_parse_text(cfg_ctx_t *cx, td_modelcfg_t *cfg, const json_t *text)
{
    cfg_given_t g = { 0 };
    const json_t *partial = json_object_get(text, "partial_rotary_factor");
    td_status_t st;

    /* type checks in declaration order, then store */
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const json_t *v = json_object_get(text, cfg_fields[i].name);
        if (v != NULL &&
            (st = cfg_check_type(cx, cx->prefix, cfg_fields[i].name, cfg_fields[i].type, v)) != TD_OK)
            return st;
    }
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const cfg_field_t *f = &cfg_fields[i];
        bool given;
        if (f->off == SIZE_MAX)
            continue;
        if ((st = cfg_store(cfg, f, json_object_get(text, f->name), &given)) != TD_OK)
            return st;
        if (f->off == OFF(compress_ratios)) g.compress_ratios = given;
        if (f->off == OFF(kv_source_layer_ids)) g.kv = given;
        if (f->off == OFF(index_source_layer_ids)) g.index = given;
        if (f->off == OFF(dspark_target_layer_ids)) g.dspark = given;
        if (f->off == OFF(candidate_source_layer_id)) g.candidate = given;
        if (f->off == OFF(engram_layer_ids)) g.engram_ids = given;
        if (f->off == OFF(engram_num_embeddings)) g.engram_num = given;
    }
    /* attribute_map aliases are applied after the fields, so they win */
    for (size_t i = 0; i < sizeof(cfg_aliases) / sizeof(cfg_aliases[0]); i++) {
        const json_t *v = json_object_get(text, cfg_aliases[i].alias);
        const cfg_field_t *f = cfg_field_find(cfg_aliases[i].field);
        bool given;
        if (v == NULL)
            continue;
        if ((st = cfg_check_type(cx, cx->prefix, cfg_aliases[i].alias, f->type, v)) != TD_OK ||
            (st = cfg_store(cfg, f, v, &given)) != TD_OK)
            return st;
    }
    if ((st = rope_standardize(cx, cfg, partial)) != TD_OK)
        return st;
    if ((st = cfg_resolve(cx, cfg, &g)) != TD_OK)
        return st;
    if ((st = cfg_build_layers(cfg)) != TD_OK)
        return st;
    if ((st = rope_read(json_object_get(cfg->rope_parameters, "main"), &cfg->rope_main)) != TD_OK)
        return st;
    return rope_read(json_object_get(cfg->rope_parameters, "compress"), &cfg->rope_compress);
}

/* quantization_config: FineGrainedFP8Config's fields and checks. Another
 * quant_method, static activations or a partial module list cannot be read
 * into the weight schema: TD_ERR_UNSUPPORTED. */
static td_status_t
cfg_parse_quant(cfg_ctx_t *cx, td_modelcfg_t *cfg, const json_t *q)
{
    const json_t *m = json_object_get(q, "quant_method"), *bs = json_object_get(q, "weight_block_size");
    const json_t *sf = json_object_get(q, "scale_fmt"), *ed = json_object_get(q, "expert_dtype");
    const json_t *as = json_object_get(q, "activation_scheme"), *fmt = json_object_get(q, "fmt");
    const json_t *nc = json_object_get(q, "modules_to_not_convert");
    const json_t *mc = json_object_get(q, "modules_to_convert");
    char show[128];

    if (!json_is_object(q))
        return cfg_fail(cx, "quantization_config: expected an object, got %s (%s)", cfg_kind(q),
                        cfg_show(q, show, sizeof(show)));
    if (!json_is_string(m) || strcmp(json_string_value(m), "fp8") != 0) {
        cfg_fail(cx, "quantization_config.quant_method: %s is not supported (fp8 only)",
                 m ? cfg_show(m, show, sizeof(show)) : "(absent)");
        return TD_ERR_UNSUPPORTED;
    }
    cfg->quantized = true;
    cfg->quant_block_rows = cfg->quant_block_cols = 128;
    if (bs != NULL) {
        if (!json_is_array(bs) || json_array_size(bs) != 2 ||
            !json_is_integer(json_array_get(bs, 0)) || !json_is_integer(json_array_get(bs, 1)) ||
            json_integer_value(json_array_get(bs, 0)) <= 0 ||
            json_integer_value(json_array_get(bs, 1)) <= 0 ||
            json_integer_value(json_array_get(bs, 0)) > MODELCFG_MAX_DIM ||
            json_integer_value(json_array_get(bs, 1)) > MODELCFG_MAX_DIM)
            return cfg_fail(cx, "quantization_config.weight_block_size: %s is not two positive "
                            "integers", cfg_show(bs, show, sizeof(show)));
        cfg->quant_block_rows = json_integer_value(json_array_get(bs, 0));
        cfg->quant_block_cols = json_integer_value(json_array_get(bs, 1));
    }
    if (sf != NULL && (!json_is_string(sf) || (strcmp(json_string_value(sf), "float") != 0 &&
                                               strcmp(json_string_value(sf), "ue8m0") != 0)))
        return cfg_fail(cx, "quantization_config.scale_fmt: %s is not \"float\" or \"ue8m0\"",
                        cfg_show(sf, show, sizeof(show)));
    cfg->quant_scale_ue8m0 = sf != NULL && strcmp(json_string_value(sf), "ue8m0") == 0;
    if (ed != NULL && (!json_is_string(ed) || (strcmp(json_string_value(ed), "fp8") != 0 &&
                                               strcmp(json_string_value(ed), "fp4") != 0)))
        return cfg_fail(cx, "quantization_config.expert_dtype: %s is not \"fp8\" or \"fp4\"",
                        cfg_show(ed, show, sizeof(show)));
    cfg->quant_experts_fp4 = ed != NULL && strcmp(json_string_value(ed), "fp4") == 0;
    if (fmt != NULL && (!json_is_string(fmt) || (strcmp(json_string_value(fmt), "e4m3") != 0 &&
                                                 strcmp(json_string_value(fmt), "e5m2") != 0))) {
        cfg_fail(cx, "quantization_config.fmt: %s is not supported (e4m3 or e5m2)",
                 cfg_show(fmt, show, sizeof(show)));
        return TD_ERR_UNSUPPORTED;
    }
    if (as != NULL && (!json_is_string(as) || strcasecmp(json_string_value(as), "dynamic") != 0)) {
        cfg_fail(cx, "quantization_config.activation_scheme: %s is not supported (dynamic only)",
                 cfg_show(as, show, sizeof(show)));
        return TD_ERR_UNSUPPORTED;
    }
    if ((nc != NULL && !json_is_null(nc) && !(json_is_array(nc) && json_array_size(nc) == 0)) ||
        (mc != NULL && !json_is_null(mc) && !(json_is_array(mc) && json_array_size(mc) == 0))) {
        cfg_fail(cx, "quantization_config: modules_to_not_convert / modules_to_convert lists "
                 "are not supported");
        return TD_ERR_UNSUPPORTED;
    }
    return TD_OK;
}

td_status_t
td_modelcfg_parse(const char *text, size_t len, td_modelcfg_t **out, char *err, size_t errlen)
{
    static const char *const composite_keys[] = { "text_config", "vision_config", "image_token_id",
                                                  "tie_word_embeddings", NULL };
    cfg_ctx_t cx = { err, errlen, "" };
    json_error_t jerr;
    json_t *root, *text_obj = NULL, *empty = NULL;
    const json_t *mt, *q;
    td_modelcfg_t *cfg;
    td_status_t st;
    char show[128];

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    root = json_loadb(text, len, 0, &jerr);
    if (root == NULL)
        return cfg_fail(&cx, "not valid JSON: line %d, column %d: %s", jerr.line, jerr.column,
                        jerr.text);
    cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL) {
        json_decref(root);
        return TD_ERR_NOMEM;
    }
    if (!json_is_object(root)) {
        st = cfg_fail(&cx, "expected a JSON object at the top, got %s", cfg_kind(root));
        goto fail;
    }
    mt = json_object_get(root, "model_type");
    if (mt != NULL && (!json_is_string(mt) || (strcmp(json_string_value(mt), "deepseek_v41") != 0 &&
                                               strcmp(json_string_value(mt), "deepseek_v41_text") != 0))) {
        cfg_fail(&cx, "model_type %s is not DeepSeek-V4.1 (deepseek_v41 or deepseek_v41_text)",
                 cfg_show(mt, show, sizeof(show)));
        st = TD_ERR_UNSUPPORTED;
        goto fail;
    }

    cfg->composite = json_object_get(root, "text_config") != NULL;
    cfg->image_token_id = 129264;
    if (cfg->composite) {
        const json_t *tc = json_object_get(root, "text_config");
        const json_t *vc = json_object_get(root, "vision_config");
        const json_t *it = json_object_get(root, "image_token_id");
        const json_t *tw = json_object_get(root, "tie_word_embeddings");
        cx.prefix = "text_config.";
        if ((st = cfg_check_type(&cx, "", "text_config", F_DICT, tc)) != TD_OK ||
            (vc && (st = cfg_check_type(&cx, "", "vision_config", F_DICT, vc)) != TD_OK) ||
            (it && (st = cfg_check_type(&cx, "", "image_token_id", F_INT, it)) != TD_OK) ||
            (tw && (st = cfg_check_type(&cx, "", "tie_word_embeddings", F_BOOL, tw)) != TD_OK))
            goto fail;
        if (it != NULL)
            cfg->image_token_id = json_integer_value(it);
        if (json_is_object(vc)) {
            cfg->has_vision = true;
            if ((st = cfg_check_vision(&cx, vc)) != TD_OK)
                goto fail;
        }
        if (json_is_object(tc)) {
            text_obj = (json_t *)tc;
        } else {
            empty = json_object();
            if (empty == NULL) {
                st = TD_ERR_NOMEM;
                goto fail;
            }
            text_obj = empty;
        }
        cfg_log_unknown(root, "top level", composite_keys);
    } else {
        text_obj = root;
    }
    cfg_log_unknown(text_obj, cfg->composite ? "text_config" : "top level", NULL);

    if ((st = cfg_parse_text(&cx, cfg, text_obj)) != TD_OK)
        goto fail;

    q = json_object_get(root, "quantization_config");
    if (q != NULL && !json_is_null(q) && (st = cfg_parse_quant(&cx, cfg, q)) != TD_OK)
        goto fail;
    json_decref(empty);
    json_decref(root);
    *out = cfg;
    return TD_OK;

fail:
    json_decref(empty);
    json_decref(root);
    td_modelcfg_destroy(cfg);
    return st;
}

void
td_modelcfg_destroy(td_modelcfg_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        const cfg_field_t *f = &cfg_fields[i];
        void *p;
        if (f->off == SIZE_MAX)   /* no field (layer_types): cfg + SIZE_MAX is undefined */
            continue;
        p = (char *)cfg + f->off;
        if (f->type == F_STR)
            free(*(char **)p);
        else if (f->type == F_LIST || f->type == F_EOS)
            free(((td_modelcfg_list_t *)p)->v);
        else if (f->type == F_DICT)
            json_decref(*(json_t **)p);
    }
    free(cfg->rope_main.rope_type);
    free(cfg->rope_compress.rope_type);
    free(cfg->layers);
    free(cfg);
}

/* ---- Loading ----------------------------------------------------------------- */

/* Read a whole file (at most MODELCFG_MAX_FILE bytes). */
static td_status_t
cfg_read_file(const char *path, char **buf, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    char *p;
    size_t got = 0;

    if (fd < 0) {
        td_error("model config %s: %s", path, strerror(errno));
        return td_status_from_errno(errno);
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        td_error("model config %s: not a regular file", path);
        close(fd);
        return TD_ERR_INVALID;
    }
    if ((uint64_t)sb.st_size > MODELCFG_MAX_FILE) {
        td_error("model config %s: %lld bytes, more than the %u allowed", path,
                 (long long)sb.st_size, MODELCFG_MAX_FILE);
        close(fd);
        return TD_ERR_TOO_BIG;
    }
    p = malloc((size_t)sb.st_size + 1);
    if (p == NULL) {
        td_error("model config %s: out of memory for %lld bytes", path, (long long)sb.st_size);
        close(fd);
        return TD_ERR_NOMEM;
    }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, p + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            td_error("model config %s: read: %s", path, r < 0 ? strerror(errno) : "file shrank");
            free(p);
            close(fd);
            return r < 0 ? td_status_from_errno(errno) : TD_ERR_IO;
        }
        got += (size_t)r;
    }
    close(fd);
    *buf = p;
    *len = got;
    return TD_OK;
}

td_status_t
td_modelcfg_load(const char *path, td_modelcfg_t **out)
{
    char file[4096], err[1024];
    struct stat sb;
    char *text = NULL;
    size_t len = 0;
    td_modelcfg_t *cfg;
    td_status_t st;

    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(file, sizeof(file), "%s/config.json", path) >= sizeof(file)) {
            td_error("model config %s: path too long", path);
            return TD_ERR_INVALID;
        }
    } else if ((size_t)snprintf(file, sizeof(file), "%s", path) >= sizeof(file)) {
        td_error("model config %s: path too long", path);
        return TD_ERR_INVALID;
    }
    if ((st = cfg_read_file(file, &text, &len)) != TD_OK)
        return st;
    st = td_modelcfg_parse(text, len, &cfg, err, sizeof(err));
    free(text);
    if (st != TD_OK) {
        td_error("model config %s: %s", file, err[0] ? err : td_status_str(st));
        return st;
    }
    if (cfg->has_vision)
        td_info("model config %s: vision_config present: image inputs are not supported; text only",
                file);
    if (cfg->num_nextn_predict_layers > 0)
        td_info("model config %s: %" PRId64 " DSpark draft layers are present but drafting is not "
                "implemented: the backbone runs without them", file, cfg->num_nextn_predict_layers);
    *out = cfg;
    return TD_OK;
}

/* ---- to_json ----------------------------------------------------------------- */

static json_t *
list_json(const td_modelcfg_list_t *l)
{
    json_t *a = json_array();

    for (uint32_t i = 0; a != NULL && i < l->n; i++)
        if (json_array_append_new(a, json_integer(l->v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *
field_json(const td_modelcfg_t *cfg, const cfg_field_t *f)
{
    const void *p = f->off == SIZE_MAX ? NULL : (const char *)cfg + f->off;

    if (f->off == SIZE_MAX) {   /* layer_types */
        json_t *a = json_array();
        for (int64_t i = 0; a != NULL && i < cfg->num_hidden_layers; i++)
            if (json_array_append_new(a, json_string(cfg->layers[i].kv_source
                                                         ? "shared_compressed_attention"
                                                         : "sliding_attention")) != 0) {
                json_decref(a);
                return NULL;
            }
        return a;
    }
    switch (f->type) {
    case F_INT:    return json_integer(*(const int64_t *)p);
    case F_OPTINT: {
        const td_modelcfg_optint_t *o = p;
        /* candidate_source_layer_id is always resolved to a number */
        if (f->off == OFF(candidate_source_layer_id))
            return json_integer(cfg->candidate_source_layer_id);
        return o->set ? json_integer(o->v) : json_null();
    }
    case F_NUM:    return num_json(p);
    case F_FLOAT:  return json_real(*(const double *)p);
    case F_BOOL:   return json_boolean(*(const bool *)p);
    case F_STR:    return json_string(*(char *const *)p);
    case F_LIST:   return list_json(p);
    case F_DICT: {
        json_t *const *j = p;
        return *j ? json_deep_copy(*j) : json_null();
    }
    case F_EOS:
        if (cfg->eos_kind == TD_MODELCFG_EOS_NONE)
            return json_null();
        if (cfg->eos_kind == TD_MODELCFG_EOS_INT)
            return json_integer(cfg->eos_token_id.v[0]);
        return list_json(p);
    case F_STRLIST:
        return NULL;
    }
    return NULL;
}

char *
td_modelcfg_to_json(const td_modelcfg_t *cfg)
{
    json_t *o = json_object();
    char *s = NULL;

    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < CFG_NFIELDS; i++) {
        json_t *v = field_json(cfg, &cfg_fields[i]);
        if (v == NULL || json_object_set_new(o, cfg_fields[i].name, v) != 0)
            goto out;
    }
    if (json_object_set_new(o, "model_type", json_string("deepseek_v41_text")) != 0)
        goto out;
    s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
out:
    json_decref(o);
    return s;
}

/* ---- What Tandem runs ---------------------------------------------------------- */

__attribute__((format(printf, 4, 5)))
static td_status_t
check_fail(td_status_t st, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* Deterministic Miller-Rabin for 64-bit n. */
static uint64_t
mulmod(uint64_t a, uint64_t b, uint64_t m)
{
    return (uint64_t)((unsigned __int128)a * b % m);
}

static uint64_t
powmod(uint64_t a, uint64_t e, uint64_t m)
{
    uint64_t r = 1;

    a %= m;
    while (e) {
        if (e & 1)
            r = mulmod(r, a, m);
        a = mulmod(a, a, m);
        e >>= 1;
    }
    return r;
}

static bool
is_prime(uint64_t n)
{
    static const uint64_t bases[] = { 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37 };
    uint64_t d = n - 1;
    int s = 0;

    if (n < 2)
        return false;
    for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
        if (n == bases[i])
            return true;
        if (n % bases[i] == 0)
            return false;
    }
    while ((d & 1) == 0) {
        d >>= 1;
        s++;
    }
    for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
        uint64_t x = powmod(bases[i], d, n);
        if (x == 1 || x == n - 1)
            continue;
        int r = 1;
        for (; r < s; r++) {
            x = mulmod(x, x, n);
            if (x == n - 1)
                break;
        }
        if (r == s)
            return false;
    }
    return true;
}

td_status_t
td_modelcfg_engram_primes(const td_modelcfg_t *cfg, uint32_t k, uint64_t *primes, uint64_t *total)
{
    uint64_t per, skip, p, sum = 0;

    if (k >= cfg->engram_layer_ids.n || cfg->engram_max_ngram_size < 2 ||
        cfg->engram_n_heads < 1 || cfg->engram_vocab_size < 1 ||
        cfg->engram_vocab_size > (INT64_C(1) << 56) ||
        (cfg->engram_max_ngram_size - 1) * cfg->engram_n_heads > MODELCFG_MAX_DIM)
        return TD_ERR_INVALID;
    /* Every (layer, n-gram size, head) takes the next unused prime at or above
     * engram_vocab_size, so layer k's buckets are primes k*per .. k*per+per-1
     * of that sequence. */
    per = (uint64_t)(cfg->engram_max_ngram_size - 1) * (uint64_t)cfg->engram_n_heads;
    skip = (uint64_t)k * per;
    p = (uint64_t)cfg->engram_vocab_size - 1;
    for (uint64_t i = 0; i < skip + per; i++) {
        do
            p++;
        while (!is_prime(p));
        if (i >= skip) {
            if (primes != NULL)
                primes[i - skip] = p;
            sum += p;
        }
    }
    if (total != NULL)
        *total = sum;
    return TD_OK;
}

/* The candidate source's two-level top-k leaves a mask with one entry per
 * indexer key it scores; a later index source applies it to its own scores.
 * Both score the keys of the latest layer at or before them that owns them
 * (owns_index_k), (prompt + generated) / ratio of them, so when those two
 * layers' ratios differ the widths differ for all but the shortest
 * sequences: the reference cannot broadcast the mask, and forward.c refuses
 * it at the first pass that has both. The same ratio in another group is
 * applied as the reference applies it. */
static td_status_t
check_candidate_groups(const td_modelcfg_t *cfg, const char *pfx, char *err, size_t errlen)
{
    int64_t keys = -1, cand = -1, cand_keys = -1;

    for (int64_t i = 0; i < cfg->num_hidden_layers; i++) {
        const td_modelcfg_layer_t *l = &cfg->layers[i];

        if (l->owns_index_k)
            keys = i;
        if (!l->index_source || keys < 0)
            continue;   /* no keys scored yet: no scores, no mask */
        if (l->candidate_source) {
            cand = i;
            cand_keys = keys;
        } else if (l->uses_candidates && cand_keys >= 0 &&
                   cfg->layers[keys].ratio != cfg->layers[cand_keys].ratio) {
            return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%scandidate_source_layer_id: "
                              "layer %" PRId64 "'s candidate mask covers the indexer keys of "
                              "layer %" PRId64 " (compress_ratios %" PRId64 "), but index "
                              "source layer %" PRId64 " scores those of layer %" PRId64
                              " (compress_ratios %" PRId64 "): the mask and the scores differ in "
                              "width, which the reference cannot broadcast", pfx, cand,
                              cand_keys, cfg->layers[cand_keys].ratio, i, keys,
                              cfg->layers[keys].ratio);
        }
    }
    return TD_OK;
}

/* Every size is 1 .. MODELCFG_MAX_DIM, and the sizes fit one another. */
static td_status_t
check_sizes(const td_modelcfg_t *cfg, const char *pfx, char *err, size_t errlen)
{
    const struct {
        const char *name;
        int64_t v;
    } dims[] = {
        { "vocab_size", cfg->vocab_size },
        { "hidden_size", cfg->hidden_size },
        { "num_hidden_layers", cfg->num_hidden_layers },
        { "num_attention_heads", cfg->num_attention_heads },
        { "head_dim", cfg->head_dim },
        { "q_lora_rank", cfg->q_lora_rank },
        { "qk_rope_head_dim", cfg->qk_rope_head_dim },
        { "max_position_embeddings", cfg->max_position_embeddings },
        { "sliding_window", cfg->sliding_window },
        { "candidate_topk_blocks", cfg->candidate_topk_blocks },
        { "candidate_block_size", cfg->candidate_block_size },
        { "index_n_heads", cfg->index_n_heads },
        { "index_head_dim", cfg->index_head_dim },
        { "index_topk", cfg->index_topk },
        { "o_groups", cfg->o_groups },
        { "o_lora_rank", cfg->o_lora_rank },
        { "moe_intermediate_size", cfg->moe_intermediate_size },
        { "n_routed_experts", cfg->n_routed_experts },
        { "num_experts_per_tok", cfg->num_experts_per_tok },
        { "hc_mult", cfg->hc_mult },
        { "hc_sinkhorn_iters", cfg->hc_sinkhorn_iters },
    };

    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v < 1 || dims[i].v > MODELCFG_MAX_DIM)
            return check_fail(TD_ERR_INVALID, err, errlen, "%s%s: %" PRId64 " is not a size "
                              "(1 .. %d)", pfx, dims[i].name, dims[i].v, MODELCFG_MAX_DIM);
    if (cfg->qk_rope_head_dim % 2 != 0 || cfg->qk_rope_head_dim > cfg->head_dim)
        return check_fail(TD_ERR_INVALID, err, errlen, "%sqk_rope_head_dim: %" PRId64 " must be "
                          "even and at most head_dim (%" PRId64 ")", pfx, cfg->qk_rope_head_dim,
                          cfg->head_dim);
    if ((cfg->num_attention_heads * cfg->head_dim) % cfg->o_groups != 0)
        return check_fail(TD_ERR_INVALID, err, errlen, "%so_groups: %" PRId64 " does not divide "
                          "num_attention_heads * head_dim (%" PRId64 ")", pfx, cfg->o_groups,
                          cfg->num_attention_heads * cfg->head_dim);
    if (cfg->num_experts_per_tok > cfg->n_routed_experts)
        return check_fail(TD_ERR_INVALID, err, errlen, "%snum_experts_per_tok: %" PRId64 " is more "
                          "than n_routed_experts (%" PRId64 ")", pfx, cfg->num_experts_per_tok,
                          cfg->n_routed_experts);
    return TD_OK;
}

/* The block the forward pass implements: one shared expert, silu, the
 * routers it has, and a ratio schedule it can lay out. */
static td_status_t
check_block(const td_modelcfg_t *cfg, const char *pfx, char *err, size_t errlen)
{
    if (cfg->n_shared_experts != 1)
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%sn_shared_experts: %" PRId64 ": the "
                          "V4.1 block has exactly one shared expert", pfx, cfg->n_shared_experts);
    if (strcmp(cfg->hidden_act, "silu") != 0)
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%shidden_act: \"%s\" is not supported "
                          "(silu only)", pfx, cfg->hidden_act);
    if (strcmp(cfg->scoring_func, "sqrtsoftplus") != 0 && strcmp(cfg->scoring_func, "softmax") != 0 &&
        strcmp(cfg->scoring_func, "sigmoid") != 0)
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%sscoring_func: \"%s\" is not supported "
                          "(sqrtsoftplus, softmax or sigmoid)", pfx, cfg->scoring_func);
    if (strcmp(cfg->topk_method, "noaux_tc") != 0)
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%stopk_method: \"%s\" is not supported "
                          "(noaux_tc only)", pfx, cfg->topk_method);
    for (int64_t i = 0; i < cfg->num_hidden_layers; i++)
        if (cfg->compress_ratios.v[i] < 0 || cfg->compress_ratios.v[i] > MODELCFG_MAX_DIM)
            return check_fail(TD_ERR_INVALID, err, errlen, "%scompress_ratios[%" PRId64 "]: %" PRId64
                              " is not a ratio (0, 1 or more)", pfx, i, cfg->compress_ratios.v[i]);
    return check_candidate_groups(cfg, pfx, err, errlen);
}

/* rope: the forward pass implements default on both branches and yarn on the
 * compressed one, rotating qk_rope_head_dim channels. */
static td_status_t
check_rope(const td_modelcfg_t *cfg, const char *pfx, char *err, size_t errlen)
{
    const td_modelcfg_rope_t *rm = &cfg->rope_main, *rc = &cfg->rope_compress;

    if (strcmp(rm->rope_type, "default") != 0)
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%srope_parameters.main.rope_type: \"%s\" "
                          "is not supported (default only)", pfx, rm->rope_type);
    if (strcmp(rc->rope_type, "default") != 0 && strcmp(rc->rope_type, "yarn") != 0)
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%srope_parameters.compress.rope_type: "
                          "\"%s\" is not supported (default or yarn)", pfx, rc->rope_type);
    for (int k = 0; k < 2; k++) {
        const td_modelcfg_rope_t *r = k ? rc : rm;
        const char *label = k ? "compress" : "main";
        double partial = r->has_partial ? r->partial_rotary_factor : 1.0;
        if (!r->has_theta || !(r->theta > 0))
            return check_fail(TD_ERR_INVALID, err, errlen, "%srope_parameters.%s.rope_theta: "
                              "missing or not a positive number", pfx, label);
        if ((int64_t)((double)cfg->head_dim * partial) != cfg->qk_rope_head_dim)
            return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "%srope_parameters.%s."
                              "partial_rotary_factor: %g rotates %" PRId64 " channels, not "
                              "qk_rope_head_dim (%" PRId64 ")", pfx, label, partial,
                              (int64_t)((double)cfg->head_dim * partial), cfg->qk_rope_head_dim);
    }
    if (strcmp(rc->rope_type, "yarn") == 0 &&
        (!rc->has_factor || !(rc->factor > 0) || !rc->has_original_max || !(rc->original_max_position_embeddings > 0)))
        return check_fail(TD_ERR_INVALID, err, errlen, "%srope_parameters.compress: yarn needs "
                          "positive factor and original_max_position_embeddings", pfx);
    return TD_OK;
}

/* engram: sizes in range, distinct backbone layers, and each layer's table
 * holds its hash buckets. */
static td_status_t
check_engram(const td_modelcfg_t *cfg, const char *pfx, char *err, size_t errlen)
{
    if (cfg->engram_layer_ids.n == 0)
        return TD_OK;
    if (cfg->engram_max_ngram_size < 2 || cfg->engram_max_ngram_size > 64)
        return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_max_ngram_size: %" PRId64
                          " is not in 2 .. 64", pfx, cfg->engram_max_ngram_size);
    if (cfg->engram_n_heads < 1 || cfg->engram_n_heads > 4096)
        return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_n_heads: %" PRId64
                          " is not in 1 .. 4096", pfx, cfg->engram_n_heads);
    if (cfg->engram_head_dim < 32 || cfg->engram_head_dim % 32 != 0 ||
        cfg->engram_head_dim > MODELCFG_MAX_DIM)
        return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_head_dim: %" PRId64 " must be "
                          "a positive multiple of 32 (one scale per 32 channels)", pfx,
                          cfg->engram_head_dim);
    if (cfg->engram_vocab_size < 1 || cfg->engram_vocab_size > (INT64_C(1) << 56))
        return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_vocab_size: %" PRId64
                          " is not in 1 .. 2^56", pfx, cfg->engram_vocab_size);
    if (cfg->engram_compressed_vocab_size < 1)
        return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_compressed_vocab_size: %" PRId64
                          " is not positive", pfx, cfg->engram_compressed_vocab_size);
    if (cfg->engram_pad_id < 0 || cfg->engram_pad_id >= cfg->vocab_size)
        return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_pad_id: %" PRId64 " is not a "
                          "token id (vocab_size %" PRId64 ")", pfx, cfg->engram_pad_id,
                          cfg->vocab_size);
    for (uint32_t k = 0; k < cfg->engram_layer_ids.n; k++) {
        int64_t id = cfg->engram_layer_ids.v[k];
        uint64_t rows;
        if (id < 0 || id >= cfg->num_hidden_layers)
            return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_layer_ids[%u]: %" PRId64
                              " is not a backbone layer (0 .. %" PRId64 ")", pfx, k, id,
                              cfg->num_hidden_layers - 1);
        for (uint32_t j = 0; j < k; j++)
            if (cfg->engram_layer_ids.v[j] == id)
                return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_layer_ids: layer %"
                                  PRId64 " is listed twice", pfx, id);
        if (td_modelcfg_engram_primes(cfg, k, NULL, &rows) != TD_OK)
            return check_fail(TD_ERR_INVALID, err, errlen, "%sengram: no bucket layout", pfx);
        if (cfg->engram_num_embeddings.v[k] < 0 ||
            (uint64_t)cfg->engram_num_embeddings.v[k] < rows)
            return check_fail(TD_ERR_INVALID, err, errlen, "%sengram_num_embeddings[%u]: %"
                              PRId64 " rows, but layer %" PRId64 "'s hash buckets need %"
                              PRIu64, pfx, k, cfg->engram_num_embeddings.v[k], id, rows);
    }
    return TD_OK;
}

td_status_t
td_modelcfg_check(const td_modelcfg_t *cfg, char *err, size_t errlen)
{
    const char *pfx = cfg->composite ? "text_config." : "";
    td_status_t st;

    if ((st = check_sizes(cfg, pfx, err, errlen)) != TD_OK ||
        (st = check_block(cfg, pfx, err, errlen)) != TD_OK ||
        (st = check_rope(cfg, pfx, err, errlen)) != TD_OK)
        return st;
    return check_engram(cfg, pfx, err, errlen);
}

td_status_t
td_modelcfg_require(const td_modelcfg_t *cfg, td_modelcfg_feature_t feature, char *err,
                    size_t errlen)
{
    switch (feature) {
    case TD_MODELCFG_FEATURE_IMAGES:
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "image inputs are not supported; text "
                          "only%s", cfg->has_vision ? " (the model's vision tower is not loaded)"
                                                    : " (the model has no vision_config)");
    case TD_MODELCFG_FEATURE_DRAFTING:
        if (cfg->num_nextn_predict_layers <= 0)
            return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "drafting: the model has no DSpark "
                              "draft layers (num_nextn_predict_layers = %" PRId64 ")",
                              cfg->num_nextn_predict_layers);
        return check_fail(TD_ERR_UNSUPPORTED, err, errlen, "drafting: DSpark drafting is not "
                          "implemented; the %" PRId64 " draft layers are present but the backbone "
                          "runs without them", cfg->num_nextn_predict_layers);
    }
    return check_fail(TD_ERR_INVALID, err, errlen, "unknown feature %d", (int)feature);
}
