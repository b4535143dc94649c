/* engine/registry.c — creating an engine by name from a program's table of
 * kinds, the shared engine configuration, and the synthetic engine's kind. */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

/* ---- Configuration ---------------------------------------------------------- */

typedef struct {
    td_engine_config_t e;
} registry_wrap_t;

static const td_config_opt_t registry_opts[] = {
    TD_ENGINE_CONFIG_OPTS(registry_wrap_t, e),
    TD_CONFIG_OPT_END
};

td_status_t
td_engine_config_defaults(td_engine_config_t *cfg)
{
    registry_wrap_t w;
    char err[TD_CONFIG_ERRLEN];
    td_status_t st = td_config_defaults(registry_opts, &w, err, sizeof(err));

    if (st != TD_OK) {
        td_error("engine: config defaults: %s", err);
        return st;
    }
    *cfg = w.e;
    return TD_OK;
}

void
td_engine_config_free(td_engine_config_t *cfg)
{
    registry_wrap_t w = { *cfg };

    td_config_free(registry_opts, &w);
    *cfg = w.e;
}

/* ---- Creation ---------------------------------------------------------------- */

const td_engine_kind_t *
td_engine_kind_find(const td_engine_kind_t *const *kinds, const char *name)
{
    for (size_t i = 0; kinds[i] != NULL; i++)
        if (strcmp(kinds[i]->name, name) == 0)
            return kinds[i];
    return NULL;
}

static td_status_t
registry_create(const td_engine_kind_t *const *kinds, const td_engine_config_t *cfg, int run,
                const td_engine_group_t *group, td_engine_t **out)
{
    const char *name = cfg->engine ? cfg->engine : "";
    const td_engine_kind_t *k = td_engine_kind_find(kinds, name);
    td_engine_t *e;
    td_status_t st;
    char desc[256], known[256];
    size_t off = 0;

    if (k == NULL) {
        known[0] = '\0';
        for (size_t i = 0; kinds[i] != NULL && off < sizeof(known); i++)
            off += (size_t)snprintf(known + off, sizeof(known) - off, "%s%s", i ? ", " : "",
                                    kinds[i]->name);
        td_error("engine \"%s\": unknown (known here: %s)", name, known);
        return TD_ERR_NOT_FOUND;
    }
    if (run && k->create == NULL) {
        td_error("engine %s: this program carries its identity only, it cannot run it", name);
        return TD_ERR_UNSUPPORTED;
    }
    if (group != NULL && k->create_group == NULL) {
        td_error("engine %s: has no experts to share: it cannot run as a rank of a dep group",
                 name);
        return TD_ERR_UNSUPPORTED;
    }
    st = group != NULL ? k->create_group(cfg, group, &e)
         : run         ? k->create(cfg, &e)
                       : k->identity(cfg, &e);
    if (st != TD_OK)
        return st;
    td_engine_describe(e, desc, sizeof(desc));
    td_info("engine %s%s: %s, layout hash %016llx, fingerprint %016llx", e->name,
            group != NULL ? " (a dep group's rank)" : run ? "" : " (identity)", desc,
            (unsigned long long)e->layout->hash, (unsigned long long)e->fingerprint);
    *out = e;
    return TD_OK;
}

td_status_t
td_engine_create(const td_engine_kind_t *const *kinds, const td_engine_config_t *cfg,
                 td_engine_t **out)
{
    return registry_create(kinds, cfg, 1, NULL, out);
}

td_status_t
td_engine_create_identity(const td_engine_kind_t *const *kinds, const td_engine_config_t *cfg,
                          td_engine_t **out)
{
    return registry_create(kinds, cfg, 0, NULL, out);
}

td_status_t
td_engine_create_group(const td_engine_kind_t *const *kinds, const td_engine_config_t *cfg,
                       const td_engine_group_t *group, td_engine_t **out)
{
    return registry_create(kinds, cfg, 1, group, out);
}

/* ---- The synthetic engine's kind ---------------------------------------------- */

static td_status_t
registry_synth_create(const td_engine_config_t *cfg, td_engine_t **out)
{
    return td_synth_create(&cfg->synth, out);
}

const td_engine_kind_t td_synth_kind = {
    .name = TD_SYNTH_NAME,
    .help = TD_SYNTH_KIND,
    .options = "synth-*, time-dilation, kv-*",
    .identity = registry_synth_create,
    .create = registry_synth_create,
};
