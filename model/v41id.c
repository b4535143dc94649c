/* model/v41id.c — the identity of the "deepseek-v41" engine from config.json
 * and the cache plan, and the identity-only engine routerd builds from it. */
#include "v41id.h"

#include <stdio.h>
#include <stdlib.h>

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
    return TD_OK;
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
