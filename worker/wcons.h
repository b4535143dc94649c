/* worker/wcons.h — a request's constraint on a worker (structured output):
 * the wire's Constraint compiled against the model's tokenizer (grammars
 * cached by content within a byte bound, shared by the ranks of the
 * process) into the engine's constraint hook (engine.h td_engine_cons_t):
 * the mask of the allowed tokens at each sampling, the tokens taken. The
 * reasoning before start_after's token is free. Compiling runs where the
 * caller runs it: the ranks call create on their compute threads. */
#ifndef TD_WCONS_H
#define TD_WCONS_H

#include <stddef.h>

#include "engine.h"
#include "status.h"
#include "tandem.pb-c.h"

/* The process's vocabulary for constraints: the tokenizer.json of model_dir
 * (NULL, "" or a directory without one: constraints are refused) and the
 * model's end-of-sequence ids. Once, before any rank runs. Logged. */
td_status_t td_wcons_setup(const char *model_dir, const int32_t *eos, size_t neos);
void td_wcons_teardown(void);

/* One request's constraint. */
typedef struct td_wcons td_wcons_t;

/* in (NULL or kind 0: *out NULL, TD_OK) compiled, or found compiled: a
 * refusal (unsupported, invalid, too big, over the budget, no tokenizer)
 * is TD_ERR_INVALID / TD_ERR_UNSUPPORTED with why for the router. */
td_status_t td_wcons_create(const Tandem__Constraint *in, td_wcons_t **out, char *why,
                            size_t whylen);
void td_wcons_destroy(td_wcons_t *c);
/* The engine's hook over c (valid while c lives). */
const td_engine_cons_t *td_wcons_hook(td_wcons_t *c);

#endif
