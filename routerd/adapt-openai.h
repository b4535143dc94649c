/* routerd/adapt-openai.c's interface: a body of POST /v1/chat/completions or
 * /v1/completions parsed into the one request model (ireq.h). */
#ifndef TD_ROUTERD_ADAPT_OPENAI_H
#define TD_ROUTERD_ADAPT_OPENAI_H

#include <stddef.h>

#include "ireq.h"
#include "openai.h"
#include "status.h"

/* Parse and validate a request body of kind. On success *out is set (free
 * it with td_ireq_destroy). On failure e is filled and the status says
 * which: TD_ERR_TOO_BIG (413), TD_ERR_INVALID (400), TD_ERR_UNSUPPORTED (400,
 * a feature this server does not have), TD_ERR_NOT_FOUND (404, unknown model),
 * TD_ERR_NOMEM (500). Unknown top-level fields are rejected as OpenAI does
 * ("Unrecognized request argument supplied: x"; a vLLM extension this
 * server does not take is named so). Nothing logs. */
td_status_t td_adapt_openai_parse(const td_ireq_cfg_t *cfg, td_openai_kind_t kind,
                                  const char *body, size_t len, td_ireq_t **out,
                                  td_openai_err_t *e);

#endif
