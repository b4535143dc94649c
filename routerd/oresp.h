/* routerd/oresp.h — OpenAI's Responses API's side of routerd without I/O:
 * the response object and its stream of events (response.created,
 * .in_progress, .output_item.added / .done, .content_part.added / .done,
 * .output_text.delta / .done, .reasoning_text.delta / .done,
 * .function_call_arguments.delta / .done, .completed / .incomplete), each
 * with its sequence_number, in the reference's order and shapes
 * (deepseek-recipe's ResponsesChunkGenerator). The request body is parsed by
 * adapt-responses.h. */
#ifndef TD_ORESP_H
#define TD_ORESP_H

#include <jansson.h>

#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "chat_reply.h"
#include "openai.h"
#include "status.h"

/* One response being written (streamed or not). Ownership: it owns output
 * and the open item's buffers; echo is borrowed. */
typedef struct {
    const char *id;
    int64_t created;
    const json_t *echo;     /* the settings the request asked for (adapt-responses.h) */
    bool store;             /* reported as stored */
    uint64_t seq;           /* the next event's sequence_number */
    int open;               /* the open item's kind (a td_chat_reply_delta_kind_t), -1: none */
    json_t *item;           /* the open item */
    td_buf_t text;          /* the open item's text or arguments so far */
    json_t *output;         /* the items so far (done ones as they are done) */
    uint32_t nreasoning;    /* output tokens counted as reasoning (usage) */
} td_oresp_t;

/* TD_ERR_NOMEM. */
td_status_t td_oresp_init(td_oresp_t *r, const char *id, int64_t created, const json_t *echo,
                          bool store);
void td_oresp_fini(td_oresp_t *r);

/* response.created and response.in_progress. */
td_status_t td_oresp_start(td_oresp_t *r, td_buf_t *out);
/* The events of one delta of the V4.1 reader (an item opened, the one
 * before done, as needed). */
td_status_t td_oresp_delta(td_oresp_t *r, const td_chat_reply_delta_t *d, td_buf_t *out);

typedef struct {
    uint32_t input_tokens, cached_tokens, output_tokens, reasoning_tokens;
} td_oresp_usage_t;

/* The open item done (incomplete when finish is LENGTH), then
 * response.completed or response.incomplete. *resp (when not NULL): the
 * final response object (a new reference). */
td_status_t td_oresp_end(td_oresp_t *r, td_openai_finish_t finish, const td_oresp_usage_t *u,
                         int64_t completed, td_buf_t *out, json_t **resp);

/* The whole reply's deltas at once (a non-streaming answer): reasoning,
 * content, then each call, as the reader would have sent them. */
td_status_t td_oresp_reply(td_oresp_t *r, const td_chat_reply_t *reply, td_buf_t *out);

/* An error in the middle of a stream: `event: error` with OpenAI's fields. */
td_status_t td_oresp_stream_error(const td_openai_err_t *e, uint64_t seq, td_buf_t *out);

#endif
