/* routerd/anthropic.c — Anthropic's Messages API as JSON: errors, the
 * message object, stream events, the model list (see anthropic.h). The
 * shapes and the order of events are deepseek-recipe's Messages generator's
 * (tests/chat/api_recipe_test.py compares them). */
#include "anthropic.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sse.h"

/* ===================================================================== */
/* Errors                                                                 */
/* ===================================================================== */

int
td_anthropic_err_http(const td_openai_err_t *e)
{
    return e->http == 503 ? 529 : e->http;
}

static const char *
err_type(int http)
{
    switch (http) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    case 504: return "timeout_error";
    default: return http >= 500 ? "api_error" : "invalid_request_error";
    }
}

static json_t *
err_obj(const td_openai_err_t *e)
{
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", err_type(e->http),
                     "message", e->message);
}

/* Append j as compact JSON (as a named SSE event when name) and drop it. */
static td_status_t
emit(json_t *j, const char *name, td_buf_t *out)
{
    char *s;
    td_status_t rc;

    if (j == NULL)
        return TD_ERR_NOMEM;
    s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s == NULL)
        return TD_ERR_NOMEM;
    rc = name ? td_sse_named(out, name, s, strlen(s)) : td_buf_append(out, s, strlen(s));
    free(s);
    return rc;
}

td_status_t
td_anthropic_err_json(const td_openai_err_t *e, td_buf_t *out)
{
    return emit(err_obj(e), NULL, out);
}

td_status_t
td_anthropic_stream_error(const td_openai_err_t *e, td_buf_t *out)
{
    return emit(err_obj(e), "error", out);
}

/* ===================================================================== */
/* The message                                                            */
/* ===================================================================== */

static const char *
stop_reason(const td_anthropic_stop_t *s)
{
    switch (s->finish) {
    case TD_OPENAI_FINISH_LENGTH: return "max_tokens";
    case TD_OPENAI_FINISH_TOOL_CALLS: return "tool_use";
    case TD_OPENAI_FINISH_STOP: return s->by_stop_string ? "stop_sequence" : "end_turn";
    case TD_OPENAI_FINISH_NONE: break;
    }
    return NULL;
}

static json_t *
usage_obj(const td_anthropic_usage_t *u)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:s}", "input_tokens", (json_int_t)u->input_tokens,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens",
                     (json_int_t)u->cache_read_input_tokens, "output_tokens",
                     (json_int_t)u->output_tokens, "service_tier", "standard");
}

/* A tool call's input: its arguments as an object ({} when the model wrote
 * no object). */
static json_t *
call_input(const td_chat_reply_call_t *c)
{
    json_t *in = json_loadb(c->arguments, c->arguments_len, JSON_DECODE_ANY, NULL);

    if (json_is_object(in))
        return in;
    json_decref(in);
    return json_object();
}

static td_status_t
content_add(json_t *content, const char *id, const td_chat_reply_t *r)
{
    int bad = 0;

    if (r->reasoning != NULL && r->reasoning_len > 0)
        bad |= json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking",
                                                        "thinking", r->reasoning,
                                                        r->reasoning_len, "signature", id));
    if (r->content_len > 0)
        bad |= json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
                                                        r->content, r->content_len));
    for (size_t i = 0; i < r->ncalls; i++)
        bad |= json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type",
                                                        "tool_use", "id", r->calls[i].id,
                                                        "name", r->calls[i].name, "input",
                                                        call_input(&r->calls[i])));
    return bad ? TD_ERR_NOMEM : TD_OK;
}

td_status_t
td_anthropic_message_json(const char *id, const char *model, const td_chat_reply_t *r,
                          const td_anthropic_stop_t *stop, const td_anthropic_usage_t *u,
                          td_buf_t *out)
{
    json_t *content = json_array();
    json_t *m;

    if (content == NULL || content_add(content, id, r) != TD_OK) {
        json_decref(content);
        return TD_ERR_NOMEM;
    }
    m = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:s?, s:o}", "id", id, "type", "message",
                  "role", "assistant", "model", model, "content", content, "stop_reason",
                  stop_reason(stop), "stop_sequence", stop->by_stop_string ? stop->stop : NULL,
                  "usage", usage_obj(u));
    return emit(m, NULL, out);
}

/* ===================================================================== */
/* The stream                                                             */
/* ===================================================================== */

td_status_t
td_anthropic_stream_start(td_anthropic_stream_t *s, const td_anthropic_usage_t *u, td_buf_t *out)
{
    s->block = -1;
    s->open = -1;
    s->pinged = false;
    return emit(json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}", "type",
                          "message_start", "message", "id", s->id, "type", "message", "role",
                          "assistant", "model", s->model, "content", "stop_reason",
                          "stop_sequence", "usage", usage_obj(u)),
                "message_start", out);
}

/* The open block ends: a thinking block with its signature first. */
static td_status_t
block_close(td_anthropic_stream_t *s, td_buf_t *out)
{
    td_status_t rc = TD_OK;

    if (s->open < 0)
        return TD_OK;
    if (s->open == TD_CHAT_REPLY_DELTA_REASONING)
        rc = emit(json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                            s->block, "delta", "type", "signature_delta", "signature", s->id),
                  "content_block_delta", out);
    if (rc == TD_OK)
        rc = emit(json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->block),
                  "content_block_stop", out);
    s->open = -1;
    return rc;
}

static td_status_t
block_open(td_anthropic_stream_t *s, const td_chat_reply_delta_t *d, td_buf_t *out)
{
    json_t *b;
    td_status_t rc = block_close(s, out);

    if (rc != TD_OK)
        return rc;
    s->block++;
    s->open = (int)d->kind;
    if (d->kind == TD_CHAT_REPLY_DELTA_REASONING)
        b = json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "");
    else if (d->kind == TD_CHAT_REPLY_DELTA_CONTENT)
        b = json_pack("{s:s, s:s}", "type", "text", "text", "");
    else
        b = json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", d->id, "name", d->name,
                      "input");
    rc = emit(json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", s->block,
                        "content_block", b), "content_block_start", out);
    if (rc == TD_OK && !s->pinged) {
        s->pinged = true;
        rc = emit(json_pack("{s:s}", "type", "ping"), "ping", out);
    }
    return rc;
}

/* In thinking mode the thinking block is the first, even when empty. */
static td_status_t
thinking_first(td_anthropic_stream_t *s, td_buf_t *out)
{
    td_chat_reply_delta_t th = { .kind = TD_CHAT_REPLY_DELTA_REASONING };

    return s->thinking && s->block < 0 ? block_open(s, &th, out) : TD_OK;
}

td_status_t
td_anthropic_stream_delta(td_anthropic_stream_t *s, const td_chat_reply_delta_t *d,
                          td_buf_t *out)
{
    json_t *delta;
    td_status_t rc = thinking_first(s, out);

    if (rc != TD_OK)
        return rc;
    if (d->kind == TD_CHAT_REPLY_DELTA_TOOL_CALL ||
        (d->kind != TD_CHAT_REPLY_DELTA_TOOL_ARGS && s->open != (int)d->kind))
        rc = block_open(s, d, out);
    if (rc != TD_OK || d->kind == TD_CHAT_REPLY_DELTA_TOOL_CALL)
        return rc;
    if (d->kind == TD_CHAT_REPLY_DELTA_REASONING)
        delta = json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", d->text, d->len);
    else if (d->kind == TD_CHAT_REPLY_DELTA_CONTENT)
        delta = json_pack("{s:s, s:s%}", "type", "text_delta", "text", d->text, d->len);
    else
        delta = json_pack("{s:s, s:s%}", "type", "input_json_delta", "partial_json", d->text,
                          d->len);
    return emit(json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", s->block,
                          "delta", delta), "content_block_delta", out);
}

td_status_t
td_anthropic_stream_end(td_anthropic_stream_t *s, const td_anthropic_stop_t *stop,
                        const td_anthropic_usage_t *u, td_buf_t *out)
{
    td_status_t rc = thinking_first(s, out);

    if (rc == TD_OK)
        rc = block_close(s, out);
    if (rc == TD_OK)
        rc = emit(json_pack("{s:s, s:{s:s?, s:s?}, s:o}", "type", "message_delta", "delta",
                            "stop_reason", stop_reason(stop), "stop_sequence",
                            stop->by_stop_string ? stop->stop : NULL, "usage", usage_obj(u)),
                  "message_delta", out);
    if (rc == TD_OK)
        rc = emit(json_pack("{s:s}", "type", "message_stop"), "message_stop", out);
    return rc;
}

/* ===================================================================== */
/* Models                                                                 */
/* ===================================================================== */

td_status_t
td_anthropic_models_json(const td_openai_model_t *models, size_t n, td_buf_t *out)
{
    json_t *data = json_array();
    char when[32];

    if (data == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        time_t t = (time_t)models[i].created;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        if (json_array_append_new(data, json_pack("{s:s, s:s, s:s, s:s}", "type", "model", "id",
                                                  models[i].id, "display_name", models[i].id,
                                                  "created_at", when)) != 0) {
            json_decref(data);
            return TD_ERR_NOMEM;
        }
    }
    return emit(json_pack("{s:o, s:b, s:s?, s:s?}", "data", data, "has_more", 0, "first_id",
                          n ? models[0].id : NULL, "last_id", n ? models[n - 1].id : NULL),
                NULL, out);
}
