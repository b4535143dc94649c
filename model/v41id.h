/* model/v41id.h — the identity of the "deepseek-v41" engine: its name, kind,
 * layout, vocabulary, context and fingerprint from a model directory's
 * config.json and cache plan, without loading a weight. routerd carries
 * td_v41_identity_kind; the worker daemons carry td_v41_kind
 * (model/v41engine.c), which also runs the model. */
#ifndef TD_V41ID_H
#define TD_V41ID_H

#include <stddef.h>

#include "cacheplan.h"
#include "engine.h"
#include "modelcfg.h"
#include "registry.h"
#include "status.h"

#define TD_V41_NAME "deepseek-v41"
#define TD_V41_HELP "DeepSeek-V4.1 on the CPU backend"
#define TD_V41_OPTIONS "model"

/* A request's cache is sized for this many tokens at most (and the model's
 * max_position_embeddings). */
#define TD_V41_MAX_CONTEXT 65536u

/* The model directory of an engine config (cfg->model); none set:
 * TD_ERR_INVALID, logged. */
td_status_t td_v41_model_dir(const td_engine_config_t *cfg, const char **dir);

/* The model's end-of-sequence ids, as transformers' generate resolves them:
 * dir's generation_config.json eos_token_id (an int or a list) when it names
 * one, else config.json's (cfg), else tokenizer_config.json's eos_token found
 * in tokenizer.json (dir NULL: config.json's only). Each once, inside the
 * vocabulary, at most TD_SAMPLE_MAX_STOP: ids[0..*n). TD_ERR_NOT_FOUND when
 * nothing names one (not logged); TD_ERR_INVALID for an id outside the
 * vocabulary or a file that is not JSON, TD_ERR_RANGE for too many (logged). */
td_status_t td_v41_eos_ids(const char *dir, const td_modelcfg_t *cfg, int32_t *ids,
                           uint32_t *n);

/* Set e's name, kind (written into kind[kindlen]), layout (plan's), vocab,
 * max_context, fingerprint (config.json's bytes and the layout hash) and
 * end-of-sequence ids (td_v41_eos_ids; none is a warning) for the model in
 * dir with config cfg. */
td_status_t td_v41_identify(const char *dir, const td_modelcfg_t *cfg,
                            const td_cache_plan_t *plan, td_engine_t *e, char *kind,
                            size_t kindlen);

/* The identity-only engine of cfg->model (config.json and cache plan). */
td_status_t td_v41_identity(const td_engine_config_t *cfg, td_engine_t **out);

/* The kind with identity and no create. */
extern const td_engine_kind_t td_v41_identity_kind;

#endif
