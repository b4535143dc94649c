/* engine/registry.h — engines by name. Every engine exports a kind: its name,
 * a line of help, the options it reads, how to build its identity and how to
 * build it to run. A program hands the table of kinds it carries to
 * td_engine_create, so one that needs identities only (routerd) links no
 * model. The configuration any engine may be given is one struct and one
 * option list (TD_ENGINE_CONFIG_OPTS), shared by every daemon's table. */
#ifndef TD_REGISTRY_H
#define TD_REGISTRY_H

#include "config.h"
#include "engine.h"
#include "status.h"
#include "synthetic.h"

/* Everything any engine may be configured with. */
typedef struct {
    char *engine;              /* a kind's name: "synthetic", "deepseek-v41" */
    char *model;               /* model directory (engines that load a model) */
    td_synth_config_t synth;
} td_engine_config_t;

#define TD_ENGINE_CONFIG_OPTS(st, m)                                               \
    TD_CONFIG_OPT_STRING("engine", st, m.engine, "synthetic",                      \
                         "engine: synthetic (keyed-hash stand-in) or deepseek-v41"), \
    TD_CONFIG_OPT_STRING("model", st, m.model, "",                                 \
                         "model directory (config.json, safetensors) of a real engine"), \
    TD_SYNTH_CONFIG_OPTS(st, m.synth)

/* A rank of a DEP group: its communicator (td_comm_size ranks, this one
 * td_comm_rank) and the placement of the experts. */
struct td_comm_s;
typedef struct {
    struct td_comm_s *comm;    /* borrowed */
    const char *placement;     /* a placement file (model/placement.h); NULL or "":
                                  contiguous ranges */
} td_engine_group_t;

/* One engine. identity builds what a router needs (name, kind, layout,
 * vocabulary, context, fingerprint) without what running needs; requests on
 * it are TD_ERR_UNSUPPORTED. create builds it to run; NULL where the program
 * carries the identity only. Both log their own failures. */
typedef struct {
    const char *name;          /* "synthetic" */
    const char *help;          /* what it is, one line */
    const char *options;       /* the options it reads: "synth-*", "model" */
    td_status_t (*identity)(const td_engine_config_t *cfg, td_engine_t **out);
    td_status_t (*create)(const td_engine_config_t *cfg, td_engine_t **out);
    /* One rank of a DEP group (NULL: the engine has no experts to share):
     * loads only the experts the placement gives the communicator's rank;
     * its prefill and decode calls are that rank's passes (engine.h,
     * pass_empty). Borrows group->comm, which must outlive it. */
    td_status_t (*create_group)(const td_engine_config_t *cfg, const td_engine_group_t *group,
                                td_engine_t **out);
} td_engine_kind_t;

/* The synthetic engine's kind (its identity is the engine itself). */
extern const td_engine_kind_t td_synth_kind;

/* Defaults / free for a td_engine_config_t outside a daemon's table. */
td_status_t td_engine_config_defaults(td_engine_config_t *cfg);
void td_engine_config_free(td_engine_config_t *cfg);

/* The kind called name in a NULL-terminated table; NULL when absent. */
const td_engine_kind_t *td_engine_kind_find(const td_engine_kind_t *const *kinds,
                                            const char *name);

/* Create the engine cfg->engine names from kinds, and log what it created.
 * A name not in the table: TD_ERR_NOT_FOUND, with the names it has. A kind
 * without create: TD_ERR_UNSUPPORTED. */
td_status_t td_engine_create(const td_engine_kind_t *const *kinds, const td_engine_config_t *cfg,
                             td_engine_t **out);
/* One rank of a DEP group of the engine cfg->engine names (see
 * td_engine_kind_t.create_group). A kind without it: TD_ERR_UNSUPPORTED,
 * logged. */
td_status_t td_engine_create_group(const td_engine_kind_t *const *kinds,
                                   const td_engine_config_t *cfg,
                                   const td_engine_group_t *group, td_engine_t **out);
/* The same engine's identity only (see td_engine_kind_t). */
td_status_t td_engine_create_identity(const td_engine_kind_t *const *kinds,
                                      const td_engine_config_t *cfg, td_engine_t **out);

#endif
