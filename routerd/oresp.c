/* routerd/oresp.c — the Responses API's response object and stream events
 * (see oresp.h); tests/chat/api_recipe_test.py compares them with the
 * reference's generator. */
#include "oresp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"

td_status_t
td_oresp_init(td_oresp_t *r, const char *id, int64_t created, const json_t *echo, bool store)
{
    memset(r, 0, sizeof *r);
    r->id = id;
    r->created = created;
    r->echo = echo;
    r->store = store;
    r->open = -1;
    r->output = json_array();
    return r->output ? TD_OK : TD_ERR_NOMEM;
}

void
td_oresp_fini(td_oresp_t *r)
{
    json_decref(r->output);
    json_decref(r->item);
    td_buf_free(&r->text);
    r->output = r->item = NULL;
}

/* Append the event j (its type is its name) with the next sequence number. */
static td_status_t
emit(td_oresp_t *r, json_t *j, td_buf_t *out)
{
    char *s;
    td_status_t rc;

    if (j == NULL || json_object_set_new(j, "sequence_number",
                                         json_integer((json_int_t)r->seq++)) != 0) {
        json_decref(j);
        return TD_ERR_NOMEM;
    }
    s = json_dumps(j, JSON_COMPACT);
    if (s == NULL) {
        json_decref(j);
        return TD_ERR_NOMEM;
    }
    rc = td_sse_named(out, json_string_value(json_object_get(j, "type")), s, strlen(s));
    json_decref(j);
    free(s);
    return rc;
}

/* The response object now. */
static json_t *
response(td_oresp_t *r, const char *status, json_t *usage, int64_t completed,
         json_t *incomplete)
{
    json_t *o = json_deep_copy(r->echo);
    json_t *now = json_pack("{s:s, s:s, s:I, s:s, s:O, s:o, s:b, s:o?, s:o?}", "id", r->id,
                            "object", "response", "created_at", (json_int_t)r->created,
                            "status", status, "output", r->output, "completed_at",
                            completed ? json_integer(completed) : json_null(), "store",
                            r->store, "usage", usage, "incomplete_details", incomplete);

    if (o == NULL || now == NULL || json_object_update(o, now) != 0) {
        json_decref(o);
        o = NULL;
    }
    json_decref(now);
    return o;
}

td_status_t
td_oresp_start(td_oresp_t *r, td_buf_t *out)
{
    td_status_t rc = emit(r, json_pack("{s:s, s:o}", "type", "response.created", "response",
                                       response(r, "in_progress", NULL, 0, NULL)), out);
    if (rc == TD_OK)
        rc = emit(r, json_pack("{s:s, s:o}", "type", "response.in_progress", "response",
                               response(r, "in_progress", NULL, 0, NULL)), out);
    return rc;
}

/* ===================================================================== */
/* Items                                                                  */
/* ===================================================================== */

static const char *
item_id(const td_oresp_t *r)
{
    return json_string_value(json_object_get(r->item, "id"));
}

static json_t *
part(const td_oresp_t *r, const char *text, size_t len)
{
    if (r->open == TD_CHAT_REPLY_DELTA_REASONING)
        return json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", text, len);
    return json_pack("{s:s, s:[], s:[], s:s%}", "type", "output_text", "annotations", "logprobs",
                     "text", text, len);
}

/* Open an item for delta d at output index n. */
static td_status_t
item_open(td_oresp_t *r, const td_chat_reply_delta_t *d, td_buf_t *out)
{
    size_t n = json_array_size(r->output);
    char id[160];
    td_status_t rc;

    r->open = (int)d->kind;
    td_buf_reset(&r->text);
    if (d->kind == TD_CHAT_REPLY_DELTA_REASONING) {
        char enc[96];
        snprintf(id, sizeof id, "rs_%s_%zu", r->id, n);
        snprintf(enc, sizeof enc, "%s-%zu", r->id, n);
        r->item = json_pack("{s:s, s:s, s:s, s:[], s:[], s:s}", "type", "reasoning", "id", id,
                            "status", "in_progress", "content", "summary", "encrypted_content",
                            enc);
    } else if (d->kind == TD_CHAT_REPLY_DELTA_CONTENT) {
        snprintf(id, sizeof id, "msg_%s_%zu", r->id, n);
        r->item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:[]}", "type", "message", "id", id,
                            "status", "in_progress", "role", "assistant", "phase",
                            "final_answer", "content");
    } else {
        snprintf(id, sizeof id, "fc_%s_%zu", r->id, n);
        r->item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id,
                            "status", "in_progress", "call_id", d->id, "name", d->name,
                            "arguments", "");
    }
    rc = emit(r, json_pack("{s:s, s:O, s:i}", "type", "response.output_item.added", "item",
                           r->item, "output_index", (json_int_t)n), out);
    if (rc == TD_OK && d->kind != TD_CHAT_REPLY_DELTA_TOOL_CALL)
        rc = emit(r, json_pack("{s:s, s:i, s:s, s:i, s:o}", "type", "response.content_part.added",
                               "content_index", 0, "item_id", item_id(r), "output_index",
                               (json_int_t)n, "part", part(r, "", 0)), out);
    return rc;
}

/* The open item done: its text's .done, its part's, then the item's. */
static td_status_t
item_close(td_oresp_t *r, const char *status, const char *phase, td_buf_t *out)
{
    size_t n = json_array_size(r->output);
    const char *t = r->text.data ? r->text.data : "";
    td_status_t rc = TD_OK;

    if (r->open < 0)
        return TD_OK;
    if (r->open == TD_CHAT_REPLY_DELTA_TOOL_CALL) {
        json_object_set_new(r->item, "arguments", json_stringn(t, r->text.len));
        rc = emit(r, json_pack("{s:s, s:s%, s:s, s:i}", "type",
                               "response.function_call_arguments.done", "arguments", t,
                               r->text.len, "item_id", item_id(r), "output_index",
                               (json_int_t)n), out);
    } else {
        bool rs = r->open == TD_CHAT_REPLY_DELTA_REASONING;
        json_t *done = json_pack("{s:s, s:i, s:s, s:i, s:s%}", "type",
                                 rs ? "response.reasoning_text.done"
                                    : "response.output_text.done", "content_index", 0,
                                 "item_id", item_id(r), "output_index", (json_int_t)n, "text",
                                 t, r->text.len);
        if (done && !rs)
            json_object_set_new(done, "logprobs", json_array());
        rc = emit(r, done, out);
        if (rc == TD_OK)
            rc = emit(r, json_pack("{s:s, s:i, s:s, s:i, s:o}", "type",
                                   "response.content_part.done", "content_index", 0, "item_id",
                                   item_id(r), "output_index", (json_int_t)n, "part",
                                   part(r, t, r->text.len)), out);
        json_object_set_new(r->item, "content", json_pack("[o]", part(r, t, r->text.len)));
        if (!rs)
            json_object_set_new(r->item, "phase", json_string(phase));
    }
    json_object_set_new(r->item, "status", json_string(status));
    if (rc == TD_OK)
        rc = emit(r, json_pack("{s:s, s:O, s:i}", "type", "response.output_item.done", "item",
                               r->item, "output_index", (json_int_t)n), out);
    if (json_array_append_new(r->output, r->item) != 0)
        rc = TD_ERR_NOMEM;
    r->item = NULL;
    r->open = -1;
    return rc;
}

td_status_t
td_oresp_delta(td_oresp_t *r, const td_chat_reply_delta_t *d, td_buf_t *out)
{
    size_t n = json_array_size(r->output);
    td_status_t rc = TD_OK;
    const char *type;

    if (d->kind == TD_CHAT_REPLY_DELTA_TOOL_CALL ||
        (d->kind != TD_CHAT_REPLY_DELTA_TOOL_ARGS && r->open != (int)d->kind)) {
        /* a message followed by a call was commentary, not the final answer */
        rc = item_close(r, "completed", d->kind == TD_CHAT_REPLY_DELTA_TOOL_CALL ? "commentary"
                                                                               : "final_answer",
                        out);
        n = json_array_size(r->output);
        if (rc == TD_OK)
            rc = item_open(r, d, out);
        if (rc != TD_OK || d->kind == TD_CHAT_REPLY_DELTA_TOOL_CALL)
            return rc;
    }
    if (r->open < 0)
        return TD_OK;   /* arguments without a call: not made by the reader */
    td_buf_append(&r->text, d->text, d->len);
    if (d->kind == TD_CHAT_REPLY_DELTA_TOOL_ARGS)
        return emit(r, json_pack("{s:s, s:s%, s:s, s:i}", "type",
                                 "response.function_call_arguments.delta", "delta", d->text,
                                 d->len, "item_id", item_id(r), "output_index", (json_int_t)n),
                    out);
    type = d->kind == TD_CHAT_REPLY_DELTA_REASONING ? "response.reasoning_text.delta"
                                                    : "response.output_text.delta";
    json_t *ev = json_pack("{s:s, s:i, s:s%, s:s, s:i}", "type", type, "content_index", 0,
                           "delta", d->text, d->len, "item_id", item_id(r), "output_index",
                           (json_int_t)n);
    if (ev && d->kind == TD_CHAT_REPLY_DELTA_CONTENT)
        json_object_set_new(ev, "logprobs", json_array());
    return emit(r, ev, out);
}

td_status_t
td_oresp_end(td_oresp_t *r, td_openai_finish_t finish, const td_oresp_usage_t *u,
             int64_t completed, td_buf_t *out, json_t **resp)
{
    bool len = finish == TD_OPENAI_FINISH_LENGTH;
    td_status_t rc = item_close(r, len ? "incomplete" : "completed", "final_answer", out);
    json_t *usage = json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens",
                              (json_int_t)u->input_tokens, "input_tokens_details",
                              "cached_tokens", (json_int_t)u->cached_tokens, "output_tokens",
                              (json_int_t)u->output_tokens, "output_tokens_details",
                              "reasoning_tokens", (json_int_t)u->reasoning_tokens,
                              "total_tokens",
                              (json_int_t)(u->input_tokens + u->output_tokens));
    json_t *o = response(r, len ? "incomplete" : "completed", usage, completed,
                         len ? json_pack("{s:s}", "reason", "max_output_tokens") : NULL);

    if (rc == TD_OK && o == NULL)
        rc = TD_ERR_NOMEM;
    if (rc == TD_OK)
        rc = emit(r, json_pack("{s:s, s:O}", "type", len ? "response.incomplete"
                                                         : "response.completed", "response", o),
                  out);
    if (rc == TD_OK && resp != NULL)
        *resp = json_incref(o);
    json_decref(o);
    return rc;
}

td_status_t
td_oresp_reply(td_oresp_t *r, const td_chat_reply_t *reply, td_buf_t *out)
{
    td_chat_reply_delta_t d = { .kind = TD_CHAT_REPLY_DELTA_REASONING };
    td_status_t rc = TD_OK;

    if (reply->reasoning_len > 0) {
        d.text = reply->reasoning;
        d.len = reply->reasoning_len;
        rc = td_oresp_delta(r, &d, out);
    }
    if (rc == TD_OK && reply->content_len > 0) {
        d = (td_chat_reply_delta_t){ .kind = TD_CHAT_REPLY_DELTA_CONTENT,
                                     .text = reply->content, .len = reply->content_len };
        rc = td_oresp_delta(r, &d, out);
    }
    for (size_t i = 0; rc == TD_OK && i < reply->ncalls; i++) {
        const td_chat_reply_call_t *c = &reply->calls[i];
        d = (td_chat_reply_delta_t){ .kind = TD_CHAT_REPLY_DELTA_TOOL_CALL, .index = (uint32_t)i,
                                     .id = c->id, .name = c->name };
        rc = td_oresp_delta(r, &d, out);
        d = (td_chat_reply_delta_t){ .kind = TD_CHAT_REPLY_DELTA_TOOL_ARGS, .index = (uint32_t)i,
                                     .text = c->arguments, .len = c->arguments_len };
        if (rc == TD_OK && c->arguments_len > 0)
            rc = td_oresp_delta(r, &d, out);
    }
    return rc;
}

td_status_t
td_oresp_stream_error(const td_openai_err_t *e, uint64_t seq, td_buf_t *out)
{
    json_t *j = json_pack("{s:s, s:s?, s:s, s:s?, s:I}", "type", "error", "code", e->code,
                          "message", e->message, "param", e->param[0] ? e->param : NULL,
                          "sequence_number", (json_int_t)seq);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    td_status_t rc = s ? td_sse_named(out, "error", s, strlen(s)) : TD_ERR_NOMEM;

    json_decref(j);
    free(s);
    return rc;
}
