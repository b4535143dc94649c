/* model/v41id.c — the identity of the "deepseek-v41" engine from config.json
 * and the cache plan (with the end-of-sequence ids from the checkpoint's
 * generation and tokenizer configs), and the identity-only engine routerd
 * builds from it. */
#include "v41id.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "log.h"
#include "rng.h"

typedef struct {
    td_engine_t base;
    td_modelcfg_t *cfg;        /* owned */
    td_cache_plan_t *plan;     /* owned */
    char kind[160];
} v41id_t;

/* FNV-1a over config.json: the same model directory gives the same
 * fingerprint in every daemon. */
static td_status_t
v41id_config_hash(const char *dir, uint64_t *out)
{
    char path[4096];
    FILE *f;
    uint64_t h = 0xcbf29ce484222325ull;
    int c;

    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path)) {
        td_error("engine deepseek-v41: model directory path too long");
        return TD_ERR_INVALID;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        td_error("engine deepseek-v41: %s: cannot open", path);
        return TD_ERR_IO;
    }
    while ((c = getc(f)) != EOF)
        h = (h ^ (uint64_t)(unsigned char)c) * 0x100000001b3ull;
    fclose(f);
    *out = h;
    return TD_OK;
}

td_status_t
td_v41_model_dir(const td_engine_config_t *cfg, const char **dir)
{
    if (cfg->model == NULL || cfg->model[0] == '\0') {
        td_error("engine deepseek-v41: no model directory (set model = DIR)");
        return TD_ERR_INVALID;
    }
    *dir = cfg->model;
    return TD_OK;
}

/* ---- End of sequence ----------------------------------------------------------- */

/* dir/name parsed, or NULL when there is no such file (*st TD_OK) or it is
 * not JSON (*st TD_ERR_INVALID, logged). */
static json_t *
v41id_json(const char *dir, const char *name, td_status_t *st)
{
    char path[4096];
    json_error_t jerr;
    json_t *j;
    FILE *f;

    *st = TD_OK;
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path)) {
        td_error("engine deepseek-v41: model directory path too long");
        *st = TD_ERR_INVALID;
        return NULL;
    }
    f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    j = json_loadf(f, 0, &jerr);
    fclose(f);
    if (j == NULL) {
        td_error("engine deepseek-v41: %s: line %d: %s", path, jerr.line, jerr.text);
        *st = TD_ERR_INVALID;
    }
    return j;
}

/* Add id (from `what`) to ids[*n] unless it is there. */
static td_status_t
v41id_eos_add(int64_t id, int64_t vocab, const char *what, int32_t *ids, uint32_t *n)
{
    if (id < 0 || id >= vocab) {
        td_error("model: %s eos_token_id %lld is outside the vocabulary (%lld ids)", what,
                 (long long)id, (long long)vocab);
        return TD_ERR_INVALID;
    }
    for (uint32_t i = 0; i < *n; i++)
        if (ids[i] == id)
            return TD_OK;
    if (*n >= TD_SAMPLE_MAX_STOP) {
        td_error("model: %s eos_token_id: more than %d stop tokens", what, TD_SAMPLE_MAX_STOP);
        return TD_ERR_RANGE;
    }
    ids[(*n)++] = (int32_t)id;
    return TD_OK;
}

/* generation_config.json's eos_token_id (int or list); *found when it names one. */
static td_status_t
v41id_eos_generation(const char *dir, int64_t vocab, int32_t *ids, uint32_t *n, int *found)
{
    td_status_t st;
    json_t *root = v41id_json(dir, "generation_config.json", &st), *v;

    *found = 0;
    if (root == NULL)
        return st;
    v = json_object_get(root, "eos_token_id");
    if (json_is_integer(v)) {
        *found = 1;
        st = v41id_eos_add(json_integer_value(v), vocab, "generation_config.json", ids, n);
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        size_t i;
        json_t *x;
        *found = 1;
        json_array_foreach(v, i, x) {
            if (!json_is_integer(x)) {
                td_error("model: generation_config.json: eos_token_id[%zu] is not an integer",
                         i);
                st = TD_ERR_INVALID;
                break;
            }
            st = v41id_eos_add(json_integer_value(x), vocab, "generation_config.json", ids, n);
            if (st != TD_OK)
                break;
        }
    } else if (v != NULL && !json_is_null(v) && !json_is_array(v)) {
        td_error("model: generation_config.json: eos_token_id is neither an integer nor a list");
        st = TD_ERR_INVALID;
    }
    json_decref(root);
    return st;
}

/* tokenizer_config.json's eos_token (a string or {"content": ...}) as an id
 * of tokenizer.json (an added token, else the model's vocabulary). */
static td_status_t
v41id_eos_tokenizer(const char *dir, int64_t vocab, int32_t *ids, uint32_t *n, int *found)
{
    td_status_t st;
    json_t *tc = v41id_json(dir, "tokenizer_config.json", &st), *tj = NULL, *v;
    const char *name = NULL;

    *found = 0;
    if (tc == NULL)
        return st;
    v = json_object_get(tc, "eos_token");
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (json_is_string(v))
        name = json_string_value(v);
    if (name == NULL)
        goto out;
    tj = v41id_json(dir, "tokenizer.json", &st);
    if (tj == NULL) {
        if (st == TD_OK)
            td_warn("model: tokenizer_config.json names eos_token \"%s\" and there is no "
                    "tokenizer.json to find its id in", name);
        goto out;
    }
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, t) {
        json_t *c = json_object_get(t, "content"), *id = json_object_get(t, "id");
        if (json_is_string(c) && json_is_integer(id) && strcmp(json_string_value(c), name) == 0) {
            *found = 1;
            st = v41id_eos_add(json_integer_value(id), vocab, "tokenizer_config.json", ids, n);
            goto out;
        }
    }
    v = json_object_get(json_object_get(json_object_get(tj, "model"), "vocab"), name);
    if (json_is_integer(v)) {
        *found = 1;
        st = v41id_eos_add(json_integer_value(v), vocab, "tokenizer_config.json", ids, n);
    } else {
        td_warn("model: tokenizer_config.json's eos_token \"%s\" is not in tokenizer.json",
                name);
    }
out:
    json_decref(tj);
    json_decref(tc);
    return st;
}

td_status_t
td_v41_eos_ids(const char *dir, const td_modelcfg_t *cfg, int32_t *ids, uint32_t *nids)
{
    int32_t got[TD_SAMPLE_MAX_STOP];
    uint32_t n = 0;
    int found = 0;
    td_status_t st = TD_OK;

    if (dir != NULL)
        st = v41id_eos_generation(dir, cfg->vocab_size, got, &n, &found);
    if (st == TD_OK && !found && cfg->eos_kind != TD_MODELCFG_EOS_NONE &&
        cfg->eos_token_id.n > 0) {
        found = 1;
        for (uint32_t i = 0; st == TD_OK && i < cfg->eos_token_id.n; i++)
            st = v41id_eos_add(cfg->eos_token_id.v[i], cfg->vocab_size, "config", got, &n);
    }
    if (st == TD_OK && !found && dir != NULL)
        st = v41id_eos_tokenizer(dir, cfg->vocab_size, got, &n, &found);
    if (st != TD_OK)
        return st;
    if (!found)
        return TD_ERR_NOT_FOUND;
    memcpy(ids, got, n * sizeof(got[0]));
    *nids = n;
    return TD_OK;
}

/* ---- Identity ------------------------------------------------------------------ */

td_status_t
td_v41_identify(const char *dir, const td_modelcfg_t *cfg, const td_cache_plan_t *plan,
                td_engine_t *e, char *kind, size_t kindlen)
{
    uint64_t h;
    td_status_t st = v41id_config_hash(dir, &h);

    if (st != TD_OK)
        return st;
    e->name = TD_V41_NAME;
    snprintf(kind, kindlen, "DeepSeek-V4.1 on the CPU (%s)", dir);
    e->kind = kind;
    e->layout = plan->layout;
    e->vocab = (uint32_t)cfg->vocab_size;
    e->max_context = (uint64_t)cfg->max_position_embeddings < TD_V41_MAX_CONTEXT
                         ? (uint64_t)cfg->max_position_embeddings
                         : TD_V41_MAX_CONTEXT;
    e->fingerprint = td_rng_mix64(h ^ td_rng_mix64(e->layout->hash));
    e->nstop = 0;
    st = td_v41_eos_ids(dir, cfg, e->stop, &e->nstop);
    if (st == TD_ERR_NOT_FOUND) {
        td_warn("engine deepseek-v41: %s names no end-of-sequence token (generation_config.json, "
                "config.json, tokenizer_config.json): replies end at max_tokens", dir);
        st = TD_OK;
    }
    return st;
}

static void
v41id_destroy(td_engine_t *e)
{
    v41id_t *v = (v41id_t *)e;

    td_cache_plan_destroy(v->plan);
    td_modelcfg_destroy(v->cfg);
    free(v);
}

/* Identity only: no request op (td_engine_req_create refuses). */
static const td_engine_ops_t v41id_ops = {
    .destroy = v41id_destroy,
};

td_status_t
td_v41_identity(const td_engine_config_t *cfg, td_engine_t **out)
{
    const char *dir;
    v41id_t *v;
    td_status_t st = td_v41_model_dir(cfg, &dir);

    if (st != TD_OK)
        return st;
    v = calloc(1, sizeof(*v));
    if (v == NULL) {
        td_error("engine deepseek-v41: out of memory");
        return TD_ERR_NOMEM;
    }
    v->base.ops = &v41id_ops;
    st = td_modelcfg_load(dir, &v->cfg);
    if (st == TD_OK)
        st = td_cache_plan_create(v->cfg, &v->plan);
    if (st == TD_OK)
        st = td_v41_identify(dir, v->cfg, v->plan, &v->base, v->kind, sizeof(v->kind));
    if (st != TD_OK) {
        v41id_destroy(&v->base);
        return st;
    }
    *out = &v->base;
    return TD_OK;
}

const td_engine_kind_t td_v41_identity_kind = {
    .name = TD_V41_NAME,
    .help = TD_V41_HELP,
    .options = TD_V41_OPTIONS,
    .identity = td_v41_identity,
    .create = NULL,
};
