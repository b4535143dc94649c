/* model/v41engine.h — the "deepseek-v41" engine's kind: the DeepSeek-V4.1
 * model on the CPU backend behind engine.h (identity from v41id.h, create
 * loads the weights). */
#ifndef TD_V41ENGINE_H
#define TD_V41ENGINE_H

#include "registry.h"

extern const td_engine_kind_t td_v41_kind;

#endif
