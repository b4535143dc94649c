/* routerd/adapt-anthropic.c — the Messages API's adapter: its fields read
 * into the one request model (ireq.h), its conversation (system, content
 * blocks, thinking, tool_use / tool_result, tools, tool_choice) converted
 * into the chat body the V4.1 encoder reads, as deepseek-recipe's
 * MessagesRequest converts it (tests/chat/api_recipe_test.py checks the
 * prompts are equal). cache_control is accepted anywhere and needs nothing:
 * the prefix cache reuses a prompt's prefix by itself. */
#include "adapt-anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

#define INVALID_REQUEST "invalid_request_error"

/* The conversion of one request. */
typedef struct {
    td_ireq_parse_t *p;
    json_t *msgs;          /* the chat messages made */
    json_t *prev_ids;      /* the tool_use ids of the assistant message before (or NULL) */
} conv_t;

/* 400 at param; fmt's first %s is param, its second arg. */
static td_status_t __attribute__((format(printf, 3, 0)))
invalid(td_ireq_parse_t *p, const char *param, const char *fmt, const char *arg)
{
    char msg[sizeof p->e->message];

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(msg, sizeof msg, fmt, param, arg);
#pragma GCC diagnostic pop
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value", "%s", msg);
    return TD_ERR_INVALID;
}

static td_status_t
nomem(td_ireq_parse_t *p, json_t *j)
{
    json_decref(j);
    return td_ireq_nomem(p);
}

/* A string block's type, or a refusal at param. */
static td_status_t
block_type(td_ireq_parse_t *p, const char *param, const json_t *b, const char **type)
{
    td_ireq_param_t pp;
    const json_t *t = json_object_get(b, "type");

    if (!json_is_object(b))
        return td_ireq_bad_type(p, param, "an object", b);
    td_ireq_param_fmt(pp, "%s.type", param);
    if (t == NULL)
        return td_ireq_missing(p, pp);
    if (!json_is_string(t))
        return td_ireq_bad_type(p, pp, "a string", t);
    *type = json_string_value(t);
    return TD_OK;
}

/* A text block's text appended to b (joined by "\n\n", as the reference's). */
static td_status_t
text_add(td_ireq_parse_t *p, const char *param, const json_t *blk, td_buf_t *b)
{
    td_ireq_param_t pp;
    const json_t *t = json_object_get(blk, "text");

    td_ireq_param_fmt(pp, "%s.text", param);
    if (t == NULL)
        return td_ireq_missing(p, pp);
    if (!json_is_string(t))
        return td_ireq_bad_type(p, pp, "a string", t);
    if (b->len > 0)
        td_buf_append(b, "\n\n", 2);
    td_buf_append(b, json_string_value(t), json_string_length(t));
    return td_buf_status(b) == TD_OK ? TD_OK : td_ireq_nomem(p);
}

/* Text given as a string or an array of text blocks, as one string. */
static td_status_t
text_of(td_ireq_parse_t *p, const char *param, const json_t *v, json_t **out)
{
    td_buf_t b = {0};
    td_ireq_param_t pp;
    td_status_t rc = TD_OK;

    if (json_is_string(v)) {
        *out = json_string(json_string_value(v));
        return *out ? TD_OK : td_ireq_nomem(p);
    }
    if (!json_is_array(v))
        return td_ireq_bad_type(p, param, "a string or an array of text blocks", v);
    for (size_t i = 0; rc == TD_OK && i < json_array_size(v); i++) {
        const char *type;
        td_ireq_param_fmt(pp, "%s.%zu", param, i);
        rc = block_type(p, pp, json_array_get(v, i), &type);
        if (rc == TD_OK && strcmp(type, "text") != 0)
            rc = invalid(p, pp, "%s: only text blocks are supported here, not '%s'.", type);
        if (rc == TD_OK)
            rc = text_add(p, pp, json_array_get(v, i), &b);
    }
    if (rc == TD_OK && (*out = json_stringn(b.data ? b.data : "", b.len)) == NULL)
        rc = td_ireq_nomem(p);
    td_buf_free(&b);
    return rc;
}

static td_status_t
push(conv_t *c, json_t *m)
{
    if (m == NULL || json_array_append_new(c->msgs, m) != 0)
        return td_ireq_nomem(c->p);
    return TD_OK;
}

/* ===================================================================== */
/* User and assistant turns                                               */
/* ===================================================================== */

/* A tool_result block: a tool message answering a tool_use of the message
 * before. */
static td_status_t
tool_result(conv_t *c, const char *param, const json_t *blk)
{
    td_ireq_param_t pp;
    const json_t *id = json_object_get(blk, "tool_use_id");
    const json_t *content = json_object_get(blk, "content");
    json_t *text = NULL;
    td_status_t rc;
    bool found = false;

    td_ireq_param_fmt(pp, "%s.tool_use_id", param);
    if (id == NULL)
        return td_ireq_missing(c->p, pp);
    if (!json_is_string(id))
        return td_ireq_bad_type(c->p, pp, "a string", id);
    for (size_t i = 0; i < json_array_size(c->prev_ids); i++)
        found |= json_equal(json_array_get(c->prev_ids, i), id);
    if (!found)
        return invalid(c->p, pp, "%s: no tool_use block with id '%s' in the previous "
                       "message; each tool_result block must answer a tool_use block of the "
                       "assistant message before it.", json_string_value(id));
    td_ireq_param_fmt(pp, "%s.content", param);
    if (content == NULL || json_is_null(content))
        text = json_string("");
    else if ((rc = text_of(c->p, pp, content, &text)) != TD_OK)
        return rc;
    return push(c, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id,
                             "content", text));
}

/* A user turn: its tool results (tool messages), then its text. */
static td_status_t
user_turn(conv_t *c, const char *param, const json_t *content)
{
    td_ireq_param_t pp;
    td_buf_t b = {0};
    td_status_t rc = TD_OK;

    for (size_t i = 0; rc == TD_OK && i < json_array_size(content); i++) {
        const json_t *blk = json_array_get(content, i);
        const char *type;
        td_ireq_param_fmt(pp, "%s.%zu", param, i);
        if ((rc = block_type(c->p, pp, blk, &type)) != TD_OK)
            break;
        if (strcmp(type, "text") == 0)
            rc = text_add(c->p, pp, blk, &b);
        else if (strcmp(type, "tool_result") == 0)
            rc = tool_result(c, pp, blk);
        else if (strcmp(type, "image") == 0 || strcmp(type, "document") == 0)
            rc = invalid(c->p, pp, "%s: content blocks of type '%s' are not supported by this "
                         "server (the model reads text only).", type);
        else
            rc = invalid(c->p, pp, "%s: a user message cannot hold a content block of type "
                         "'%s'; the types are 'text', 'image', 'document' and 'tool_result'.",
                         type);
    }
    if (rc == TD_OK && b.len > 0)
        rc = push(c, json_pack("{s:s, s:s%}", "role", "user", "content", b.data, b.len));
    td_buf_free(&b);
    return rc;
}

/* A tool_use block as a chat tool call; its id kept for the next turn. */
static td_status_t
tool_use(conv_t *c, const char *param, const json_t *blk, json_t *calls)
{
    td_ireq_param_t pp;
    const char *keys[] = { "id", "name" };
    const json_t *input = json_object_get(blk, "input");
    char *args;

    for (size_t k = 0; k < 2; k++) {
        const json_t *v = json_object_get(blk, keys[k]);
        td_ireq_param_fmt(pp, "%s.%s", param, keys[k]);
        if (v == NULL)
            return td_ireq_missing(c->p, pp);
        if (!json_is_string(v))
            return td_ireq_bad_type(c->p, pp, "a string", v);
    }
    td_ireq_param_fmt(pp, "%s.input", param);
    if (input == NULL)
        return td_ireq_missing(c->p, pp);
    if (!json_is_object(input))
        return td_ireq_bad_type(c->p, pp, "an object", input);
    if ((args = json_dumps(input, JSON_COMPACT)) == NULL)
        return td_ireq_nomem(c->p);
    if (json_array_append(c->prev_ids, json_object_get(blk, "id")) != 0 ||
        json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id",
                                               json_object_get(blk, "id"), "type", "function",
                                               "function", "name", json_object_get(blk, "name"),
                                               "arguments", args)) != 0) {
        free(args);
        return td_ireq_nomem(c->p);
    }
    free(args);
    return TD_OK;
}

/* An assistant turn: thinking as reasoning_content, text, tool_use as tool
 * calls. */
static td_status_t
assistant_turn(conv_t *c, const char *param, const json_t *content)
{
    td_ireq_param_t pp;
    td_buf_t text = {0}, think = {0};
    json_t *calls = json_array();
    json_t *m = NULL;
    td_status_t rc = calls ? TD_OK : td_ireq_nomem(c->p);

    for (size_t i = 0; rc == TD_OK && i < json_array_size(content); i++) {
        const json_t *blk = json_array_get(content, i);
        const char *type;
        td_ireq_param_fmt(pp, "%s.%zu", param, i);
        if ((rc = block_type(c->p, pp, blk, &type)) != TD_OK)
            break;
        if (strcmp(type, "text") == 0) {
            rc = text_add(c->p, pp, blk, &text);
        } else if (strcmp(type, "thinking") == 0) {
            const json_t *t = json_object_get(blk, "thinking");
            td_ireq_param_fmt(pp, "%s.%zu.thinking", param, i);
            if (!json_is_string(t))
                rc = t ? td_ireq_bad_type(c->p, pp, "a string", t) : td_ireq_missing(c->p, pp);
            else
                td_buf_append(&think, json_string_value(t), json_string_length(t));
        } else if (strcmp(type, "redacted_thinking") != 0) {
            rc = strcmp(type, "tool_use") == 0
                     ? tool_use(c, pp, blk, calls)
                     : invalid(c->p, pp, "%s: an assistant message cannot hold a content block "
                               "of type '%s'; the types are 'text', 'thinking', "
                               "'redacted_thinking' and 'tool_use'.", type);
        }
    }
    if (rc == TD_OK) {
        m = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                      text.data ? text.data : "", text.len);
        if (m && think.len > 0)
            json_object_set_new(m, "reasoning_content", json_stringn(think.data, think.len));
        if (m && json_array_size(calls) > 0)
            json_object_set(m, "tool_calls", calls);
        rc = push(c, m);
    }
    json_decref(calls);
    td_buf_free(&text);
    td_buf_free(&think);
    return rc;
}

static td_status_t
convert_message(conv_t *c, size_t i, const json_t *m)
{
    td_ireq_param_t pp;
    const json_t *role, *content;
    json_t *blocks;
    td_status_t rc;
    bool user;

    td_ireq_param_fmt(pp, "messages.%zu", i);
    if (!json_is_object(m))
        return td_ireq_bad_type(c->p, pp, "an object", m);
    role = json_object_get(m, "role");
    content = json_object_get(m, "content");
    td_ireq_param_fmt(pp, "messages.%zu.role", i);
    if (role == NULL)
        return td_ireq_missing(c->p, pp);
    user = json_is_string(role) && strcmp(json_string_value(role), "user") == 0;
    if (!user && !(json_is_string(role) && strcmp(json_string_value(role), "assistant") == 0))
        return invalid(c->p, pp, "%s: the role must be 'user' or 'assistant'%s.",
                       json_is_string(role) ? " (a system prompt goes in 'system')" : "");
    td_ireq_param_fmt(pp, "messages.%zu.content", i);
    if (content == NULL)
        return td_ireq_missing(c->p, pp);
    if (json_is_string(content))
        blocks = json_pack("[{s:s, s:O}]", "type", "text", "text", content);
    else if (json_is_array(content))
        blocks = json_incref((json_t *)content);
    else
        return td_ireq_bad_type(c->p, pp, "a string or an array of content blocks", content);
    if (blocks == NULL)
        return td_ireq_nomem(c->p);
    if (user) {
        rc = user_turn(c, pp, blocks);
        json_array_clear(c->prev_ids);
    } else {
        json_array_clear(c->prev_ids);
        rc = assistant_turn(c, pp, blocks);
    }
    json_decref(blocks);
    return rc;
}

/* ===================================================================== */
/* Tools, thinking                                                        */
/* ===================================================================== */

/* tools: custom tools ({name, description, input_schema}) as chat
 * functions; server tools (web search and the like) are refused. */
static td_status_t
convert_tools(td_ireq_parse_t *p, const json_t *tools, json_t *chat)
{
    td_ireq_param_t pp;
    json_t *out = json_array();

    if (out == NULL)
        return td_ireq_nomem(p);
    json_object_set_new(chat, "tools", out);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name");
        const json_t *desc = json_object_get(t, "description");
        const json_t *schema = json_object_get(t, "input_schema");
        td_ireq_param_fmt(pp, "tools.%zu", i);
        if (!json_is_object(t))
            return td_ireq_bad_type(p, pp, "an object", t);
        if (type && !json_is_null(type) &&
            !(json_is_string(type) && strcmp(json_string_value(type), "custom") == 0))
            return invalid(p, pp, "%s: tools of type '%s' (server tools such as web search, "
                           "code execution, bash or a text editor) are not supported by this "
                           "server; only custom tools (name, description, input_schema) are.",
                           json_is_string(type) ? json_string_value(type) : "?");
        td_ireq_param_fmt(pp, "tools.%zu.name", i);
        if (!json_is_string(name))
            return name ? td_ireq_bad_type(p, pp, "a string", name) : td_ireq_missing(p, pp);
        td_ireq_param_fmt(pp, "tools.%zu.input_schema", i);
        if (!json_is_object(schema))
            return schema ? td_ireq_bad_type(p, pp, "an object", schema) : td_ireq_missing(p, pp);
        td_ireq_param_fmt(pp, "tools.%zu.description", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return td_ireq_bad_type(p, pp, "a string", desc);
        json_t *fn = json_pack("{s:O}", "name", name);
        if (fn && json_is_string(desc))
            json_object_set(fn, "description", (json_t *)desc);
        if (fn)
            json_object_set(fn, "parameters", (json_t *)schema);
        if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function",
                                                 fn)) != 0)
            return td_ireq_nomem(p);
    }
    return TD_OK;
}

/* tool_choice: auto, any (as auto), tool (one named), none. */
static td_status_t
convert_tool_choice(td_ireq_parse_t *p, const json_t *tc, json_t *chat)
{
    const char *type;
    json_t *v;
    td_status_t rc = block_type(p, "tool_choice", tc, &type);

    const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");

    if (rc != TD_OK)
        return rc;
    if (dp != NULL && !json_is_null(dp) && !json_is_boolean(dp))
        return td_ireq_bad_type(p, "tool_choice.disable_parallel_tool_use", "a boolean", dp);
    if (strcmp(type, "auto") == 0 || strcmp(type, "none") == 0 || strcmp(type, "any") == 0) {
        /* any: as the reference converts it, the model is offered the tools
         * and chooses (the V4.1 format has no "some tool" prefix) */
        v = json_string(strcmp(type, "none") == 0 ? "none" : "auto");
    } else if (strcmp(type, "tool") == 0) {
        const json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name))
            return name ? td_ireq_bad_type(p, "tool_choice.name", "a string", name)
                        : td_ireq_missing(p, "tool_choice.name");
        v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        return invalid(p, "tool_choice.type", "%s: '%s' is not one of 'auto', 'any', 'tool' "
                       "and 'none'.", type);
    }
    if (v == NULL)
        return td_ireq_nomem(p);
    json_object_set_new(chat, "tool_choice", v);
    return TD_OK;
}

/* thinking: enabled (with budget_tokens, a cap on the reasoning), adaptive
 * (enabled) or disabled; absent: the server's default. */
static td_status_t
convert_thinking(td_ireq_parse_t *p, const json_t *th, json_t *chat)
{
    const char *type;
    td_status_t rc = block_type(p, "thinking", th, &type);
    const json_t *budget = json_object_get(th, "budget_tokens");
    int64_t b = 0;

    if (rc != TD_OK)
        return rc;
    if (strcmp(type, "enabled") != 0 && strcmp(type, "disabled") != 0 &&
        strcmp(type, "adaptive") != 0)
        return invalid(p, "thinking.type", "%s: '%s' is not one of 'enabled', 'disabled' and "
                       "'adaptive'.", type);
    if (strcmp(type, "enabled") == 0) {
        if (budget == NULL)
            return td_ireq_missing(p, "thinking.budget_tokens");
        if ((rc = td_ireq_get_int(p, "thinking.budget_tokens", budget, 1, UINT32_MAX, &b)) != TD_OK)
            return rc;
        p->req->reasoning.budget = (uint32_t)b;
    }
    json_object_set_new(chat, "thinking", json_pack("{s:s}", "type",
                                                    strcmp(type, "disabled") == 0 ? "disabled"
                                                                                  : "enabled"));
    return TD_OK;
}

/* output_config.format (json_schema): the request model's constraint, the
 * fields response_format sets, enforced by the grammar engine (checked in
 * td_ireq_finish). Any key but effort and format: 400. */
static td_status_t
field_output_config(td_ireq_parse_t *p, const char *key, const json_t *oc)
{
    const json_t *f = json_object_get(oc, "format"), *v;
    const char *k;

    if (!json_is_object(oc))
        return td_ireq_bad_type(p, key, "an object", oc);
    json_object_foreach((json_t *)oc, k, v)
        if (strcmp(k, "effort") != 0 && strcmp(k, "format") != 0)
            return invalid(p, "output_config", "%s: '%s' is not supported by this server; it "
                           "takes 'effort' and 'format'.", k);
    if (f == NULL || json_is_null(f))
        return TD_OK;
    if (!json_is_object(f) || !json_is_string(json_object_get(f, "type")) ||
        strcmp(json_string_value(json_object_get(f, "type")), "json_schema") != 0)
        return invalid(p, "output_config.format", "%s: only {\"type\": \"json_schema\", "
                       "\"schema\": ...} is a format%s.", "");
    return td_ireq_constraint_set(p, "output_config.format", TD_IREQ_CONSTRAINT_JSON_SCHEMA, f);
}

/* output_config.effort as the V4.1 format's reasoning effort. */
static td_status_t
convert_output_config(td_ireq_parse_t *p, const json_t *oc, json_t *chat)
{
    const json_t *effort = json_object_get(oc, "effort");

    if (effort == NULL || json_is_null(effort))
        return TD_OK;
    if (!json_is_string(effort))
        return td_ireq_bad_type(p, "output_config.effort", "a string", effort);
    json_object_set(chat, "reasoning_effort", (json_t *)effort);
    return TD_OK;
}

/* ===================================================================== */
/* The request                                                            */
/* ===================================================================== */

/* The conversation as a chat body: system, messages, tools, tool_choice,
 * thinking, effort and stop strings (the V4.1 reader stops at them). count:
 * count_tokens's shape (no max_tokens to hold the thinking budget). */
static td_status_t
convert(td_ireq_parse_t *p, const json_t *body, bool count, json_t *chat)
{
    conv_t c = { .p = p, .msgs = json_array(), .prev_ids = json_array() };
    const json_t *v, *msgs = json_object_get(body, "messages");
    json_t *sys;
    td_status_t rc = TD_OK;

    if (c.msgs == NULL || c.prev_ids == NULL) {
        json_decref(c.prev_ids);
        return nomem(p, c.msgs);
    }
    json_object_set_new(chat, "messages", c.msgs);
    if ((v = json_object_get(body, "system")) != NULL && !json_is_null(v)) {
        if ((rc = text_of(p, "system", v, &sys)) == TD_OK)
            rc = push(&c, json_pack("{s:s, s:o}", "role", "system", "content", sys));
    }
    for (size_t i = 0; rc == TD_OK && i < json_array_size(msgs); i++)
        rc = convert_message(&c, i, json_array_get(msgs, i));
    json_decref(c.prev_ids);
    if (rc == TD_OK && (v = json_object_get(body, "tools")) && json_array_size(v) > 0)
        rc = convert_tools(p, v, chat);
    if (rc == TD_OK && (v = json_object_get(body, "tool_choice")) && !json_is_null(v))
        rc = convert_tool_choice(p, v, chat);
    if (rc == TD_OK && (v = json_object_get(body, "thinking")) && !json_is_null(v))
        rc = convert_thinking(p, v, chat);
    if (rc == TD_OK && (v = json_object_get(body, "output_config")) && !json_is_null(v))
        rc = convert_output_config(p, v, chat);
    /* output_config.format is the constraint only: the reference's prompt does
     * not tell the model the schema (Responses' text.format does) */
    if (rc == TD_OK && p->cfg->no_default_thinking && json_object_get(chat, "thinking") == NULL &&
        json_object_get(chat, "reasoning_effort") == NULL)
        json_object_set_new(chat, "thinking", json_pack("{s:s}", "type", "disabled"));
    if (rc == TD_OK && (v = json_object_get(body, "stop_sequences")) && json_array_size(v) > 0)
        json_object_set(chat, "stop", (json_t *)v);
    if (rc == TD_OK && !count && p->req->reasoning.budget > 0 &&
        p->req->reasoning.budget >= p->req->sampling.max_tokens)
        rc = invalid(p, "thinking.budget_tokens", "%s: must be less than max_tokens%s.", "");
    return rc;
}

/* Fields whose shape the conversion checks, or that are only type-checked. */
static td_status_t
field_later(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    static const struct { const char *name; json_type type; const char *what; } types[] = {
        { "messages", JSON_ARRAY, "an array" },
        { "tools", JSON_ARRAY, "an array" },
        { "metadata", JSON_OBJECT, "an object" },
        { "service_tier", JSON_STRING, "a string" },
        { "cache_control", JSON_OBJECT, "an object" },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].name, key) == 0) {
            if (json_typeof(v) != types[i].type)
                return td_ireq_bad_type(p, key, types[i].what, v);
            if (strcmp(key, "messages") == 0) {
                if (json_array_size(v) == 0)
                    return td_ireq_empty_array(p, key);
                p->has_body = true;
            }
            return TD_OK;
        }
    return TD_OK;   /* system, tool_choice, thinking, output_config: convert() */
}

static td_status_t
field_model(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    p->has_model = true;
    return td_ireq_get_string(p, key, v, &p->req->model);
}

/* The shared table's parser of a field of the same name and meaning. */
static td_status_t
field_shared(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    const char *name = strcmp(key, "stop_sequences") == 0 ? "stop" : key;
    const td_ireq_field_t *f = td_ireq_field_find(TD_OPENAI_CHAT, name);

    if (strcmp(key, "temperature") == 0 && json_is_number(v) &&
        (json_number_value(v) < 0 || json_number_value(v) > 1))
        return invalid(p, key, "%s: must be between 0 and 1%s.", "");
    if (strcmp(key, "top_k") == 0 && json_is_integer(v) && json_integer_value(v) < 0)
        return invalid(p, key, "%s: must be at least 0%s.", "");
    if (strcmp(key, "stop_sequences") == 0 && !json_is_array(v))
        return td_ireq_bad_type(p, key, "an array of strings", v);
    return f ? f->fn(p, name, v) : TD_ERR_INTERNAL;
}

/* count_tokens takes the conversation only (its own bit). */
#define MSG TD_IREQ_KIND(TD_OPENAI_MESSAGES)
#define CNT TD_IREQ_KIND(TD_OPENAI_COMPLETION)   /* unused kind: the count shape */

static const td_ireq_field_t messages_fields[] = {
    { "model",          MSG | CNT, field_model, true },
    { "messages",       MSG | CNT, field_later, true },
    { "system",         MSG | CNT, field_later, false },
    { "tools",          MSG | CNT, field_later, false },
    { "tool_choice",    MSG | CNT, field_later, false },
    { "thinking",       MSG | CNT, field_later, false },
    { "output_config",  MSG | CNT, field_output_config, false },
    { "cache_control",  MSG | CNT, field_later, false },
    { "max_tokens",     MSG,       field_shared, true },
    { "stream",         MSG,       field_shared, false },
    { "temperature",    MSG,       field_shared, false },
    { "top_p",          MSG,       field_shared, false },
    { "top_k",          MSG,       field_shared, false },
    { "stop_sequences", MSG,       field_shared, false },
    { "metadata",       MSG,       field_later, false },
    { "service_tier",   MSG,       field_later, false },
    { NULL, 0, NULL, false },
};

td_status_t
td_adapt_anthropic_parse(const td_ireq_cfg_t *cfg, bool count, const char *body, size_t len,
                         td_ireq_t **out, td_openai_err_t *e)
{
    td_ireq_parse_t p = { .cfg = cfg, .e = e };
    json_error_t jerr;
    json_t *root, *chat;
    td_ireq_t *req = NULL;
    td_status_t rc;

    if (len > cfg->max_body) {
        td_openai_err_too_big(e, len, cfg->max_body);
        return TD_ERR_TOO_BIG;
    }
    if ((root = json_loadb(body, len, 0, &jerr)) == NULL || !json_is_object(root)) {
        td_openai_err_set(e, 400, INVALID_REQUEST, NULL, NULL,
                          root ? "The request body must be a JSON object." :
                          "The request body is not valid JSON: %s (line %d, column %d).",
                          jerr.text, jerr.line, jerr.column);
        json_decref(root);
        return TD_ERR_INVALID;
    }
    if (!count && json_object_get(root, "max_tokens") == NULL) {
        td_openai_err_set(e, 400, INVALID_REQUEST, "max_tokens", "missing_required_parameter",
                          "max_tokens: Field required");
        json_decref(root);
        return TD_ERR_INVALID;
    }
    rc = td_ireq_parse_object(cfg, count ? TD_OPENAI_COMPLETION : TD_OPENAI_MESSAGES,
                              messages_fields, root, &req, e);
    if (rc == TD_OK) {
        req->kind = TD_OPENAI_MESSAGES;
        p.req = req;
        chat = json_object();
        rc = chat ? convert(&p, root, count, chat) : td_ireq_nomem(&p);
        if (rc == TD_OK)
            rc = td_ireq_set_msgs(&p, json_object_get(chat, "messages"));
        json_decref(req->body);
        req->body = chat;
    }
    json_decref(root);
    if (rc != TD_OK) {
        td_ireq_destroy(req);
        return rc;
    }
    *out = req;
    return TD_OK;
}
