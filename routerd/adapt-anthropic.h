/* routerd/adapt-anthropic.c's interface: a body of POST /v1/messages (or
 * /v1/messages/count_tokens) parsed into the one request model (ireq.h). */
#ifndef TD_ROUTERD_ADAPT_ANTHROPIC_H
#define TD_ROUTERD_ADAPT_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include "ireq.h"
#include "openai.h"
#include "status.h"

/* Parse and validate a Messages request. The conversation is converted as
 * deepseek-recipe converts it (system and content blocks, thinking,
 * tool_use / tool_result, tools, tool_choice, stop_sequences) into a chat
 * body that the V4.1 encoder reads: (*out)->body. count: the
 * count_tokens shape (no max_tokens, no sampling). Statuses as
 * td_adapt_openai_parse's; e is written in the model's terms and sent in
 * Anthropic's format by the caller. Nothing logs. */
td_status_t td_adapt_anthropic_parse(const td_ireq_cfg_t *cfg, bool count, const char *body,
                                     size_t len, td_ireq_t **out, td_openai_err_t *e);

#endif
