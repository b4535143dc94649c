/* routerd/anthropic.h — Anthropic's Messages API's side of routerd without
 * I/O: its errors ({"type":"error","error":{"type","message"}}, overload as
 * 529), the message object, its stream events (message_start,
 * content_block_start / _delta / _stop, ping, message_delta, message_stop)
 * and its model list. The request body is parsed by adapt-anthropic.h. */
#ifndef TD_ANTHROPIC_H
#define TD_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "chat_reply.h"
#include "openai.h"
#include "status.h"

/* The one version of the API this server speaks (anthropic-version). */
#define TD_ANTHROPIC_VERSION "2023-06-01"

/* The HTTP status Anthropic answers e with (503 overload: 529). */
int td_anthropic_err_http(const td_openai_err_t *e);
/* e as Anthropic's error body, appended to out. */
td_status_t td_anthropic_err_json(const td_openai_err_t *e, td_buf_t *out);
/* The same as an SSE `event: error` (an error in the middle of a stream). */
td_status_t td_anthropic_stream_error(const td_openai_err_t *e, td_buf_t *out);

/* Why a message ended: end_turn, max_tokens, stop_sequence or tool_use.
 * stop: the stop sequence that matched (NULL: none, or not known). */
typedef struct {
    td_openai_finish_t finish;
    bool by_stop_string;
    const char *stop;
} td_anthropic_stop_t;

typedef struct {
    uint32_t input_tokens;
    uint32_t output_tokens;
    uint32_t cache_read_input_tokens;
} td_anthropic_usage_t;

/* The whole message (a non-streaming answer) of reply r, appended to out;
 * the signature of a thinking block is the message id, as the reference's. */
td_status_t td_anthropic_message_json(const char *id, const char *model,
                                      const td_chat_reply_t *r, const td_anthropic_stop_t *stop,
                                      const td_anthropic_usage_t *u, td_buf_t *out);

/* One streamed message: fill id and model, zero the rest. */
typedef struct {
    const char *id;
    const char *model;
    bool thinking;      /* the reply begins in reasoning: its thinking block comes first,
                           empty or not, as the reference's */
    int block;          /* the open content block's index; -1 before the first */
    int open;           /* its kind: -1 none, else a td_chat_reply_delta_kind_t */
    bool pinged;
} td_anthropic_stream_t;

/* message_start, with the prompt's tokens in its usage. */
td_status_t td_anthropic_stream_start(td_anthropic_stream_t *s, const td_anthropic_usage_t *u,
                                      td_buf_t *out);
/* The events of one delta of the V4.1 reader: a block of its kind is
 * opened (the one before closed) as needed, then its delta. */
td_status_t td_anthropic_stream_delta(td_anthropic_stream_t *s, const td_chat_reply_delta_t *d,
                                      td_buf_t *out);
/* The open block closed, message_delta (stop_reason, usage) and message_stop. */
td_status_t td_anthropic_stream_end(td_anthropic_stream_t *s, const td_anthropic_stop_t *stop,
                                    const td_anthropic_usage_t *u, td_buf_t *out);

/* GET /v1/models in Anthropic's shape: {"data":[{"type":"model","id",
 * "display_name","created_at"}],"has_more":false,"first_id","last_id"}. */
td_status_t td_anthropic_models_json(const td_openai_model_t *models, size_t n, td_buf_t *out);

#endif
