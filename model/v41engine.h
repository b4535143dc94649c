/* model/v41engine.h — the "deepseek-v41" engine's kind: the DeepSeek-V4.1
 * model on the CPU backend behind engine.h (identity from v41id.h, create
 * loads the weights). */
#ifndef TD_V41ENGINE_H
#define TD_V41ENGINE_H

#include "registry.h"

extern const td_engine_kind_t td_v41_kind;

/* The engine over the checkpoint in dir with every other option at its
 * default (tools and tests): td_engine_create of this kind, or with group
 * (not NULL) td_engine_create_group, one rank of that DEP group. Logged. */
td_status_t td_v41_engine_open(const char *dir, const td_engine_group_t *group,
                               td_engine_t **out);

#endif
