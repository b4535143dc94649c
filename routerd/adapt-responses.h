/* routerd/adapt-responses.c's interface: a body of POST /v1/responses parsed
 * into the one request model (ireq.h). */
#ifndef TD_ROUTERD_ADAPT_RESPONSES_H
#define TD_ROUTERD_ADAPT_RESPONSES_H

#include <jansson.h>

#include "ireq.h"
#include "openai.h"
#include "status.h"

/* Parse and validate a Responses request (body: a JSON object). prev: the
 * conversation of the response named by previous_response_id (a chat
 * messages array, the stored record's), NULL when it names none; the caller
 * looked it up (and refused an unknown id). The conversation (instructions,
 * input items: messages, reasoning, function_call, function_call_output) is
 * converted as deepseek-recipe's ResponsesRequest converts it into the chat
 * body the V4.1 encoder reads ((*out)->body); (*out)->proto holds
 * {"echo": the settings response objects report, "conv": the conversation
 * without the instructions, for the store, "store": bool}. text.format is
 * the request model's constraint. Statuses as td_adapt_openai_parse's; e in
 * OpenAI's format. Nothing logs. */
td_status_t td_adapt_responses_parse(const td_ireq_cfg_t *cfg, const json_t *body,
                                     const json_t *prev, td_ireq_t **out, td_openai_err_t *e);

/* previous_response_id of body: NULL when absent or null; a value that is
 * not a string fills e (TD_ERR_INVALID). */
td_status_t td_adapt_responses_prev_id(const json_t *body, const char **id,
                                       td_openai_err_t *e);

#endif
