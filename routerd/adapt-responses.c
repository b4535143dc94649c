/* routerd/adapt-responses.c — the Responses API's adapter: its fields read
 * into the one request model (ireq.h), its input items (messages, reasoning,
 * function calls and their outputs) and instructions converted into the chat
 * body the V4.1 encoder reads, as deepseek-recipe's ResponsesRequest converts
 * them (tests/chat/api_recipe_test.py checks the prompts are equal); the
 * settings its response objects report kept for the writer (oresp.c). */
#include "adapt-responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

#define INVALID_REQUEST "invalid_request_error"

/* The conversion of one request's input. */
typedef struct {
    td_ireq_parse_t *p;
    json_t *msgs;           /* the chat messages made (the store's conversation) */
    json_t *calls;          /* every call_id so far */
    json_t *open;           /* the assistant message items add to, or NULL */
} rconv_t;

static td_status_t
bad_value(td_ireq_parse_t *p, const char *param, const char *what, const char *v)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                      "Invalid value for '%s': %s%s%s.", param, what, v ? ": " : "", v ? v : "");
    return TD_ERR_INVALID;
}

static td_status_t
push(rconv_t *c, json_t *m)
{
    if (m == NULL || json_array_append_new(c->msgs, m) != 0)
        return td_ireq_nomem(c->p);
    c->open = strcmp(json_string_value(json_object_get(m, "role")), "assistant") == 0 ? m : NULL;
    return TD_OK;
}

/* A string field of an item at param (required). */
static td_status_t
item_string(td_ireq_parse_t *p, const char *param, const json_t *item, const char *key,
            const json_t **out)
{
    td_ireq_param_t pp;
    const json_t *v = json_object_get(item, key);

    td_ireq_param_fmt(pp, "%s.%s", param, key);
    if (v == NULL || json_is_null(v))
        return td_ireq_missing(p, pp);
    if (!json_is_string(v))
        return td_ireq_bad_type(p, pp, "a string", v);
    *out = v;
    return TD_OK;
}

/* Content: a string or parts of text (input_text, output_text, text),
 * joined by a blank line as the reference joins them. */
static td_status_t
content_text(td_ireq_parse_t *p, const char *param, const json_t *v, td_buf_t *b)
{
    td_ireq_param_t pp;

    if (json_is_string(v)) {
        td_buf_append(b, json_string_value(v), json_string_length(v));
        return td_buf_status(b) == TD_OK ? TD_OK : td_ireq_nomem(p);
    }
    if (!json_is_array(v))
        return td_ireq_bad_type(p, param, "a string or an array of content parts", v);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *part = json_array_get(v, i), *t;
        const char *type;
        td_ireq_param_fmt(pp, "%s[%zu]", param, i);
        if (!json_is_object(part))
            return td_ireq_bad_type(p, pp, "an object", part);
        type = json_string_value(json_object_get(part, "type"));
        if (type == NULL) {
            td_ireq_param_fmt(pp, "%s[%zu].type", param, i);
            return td_ireq_missing(p, pp);
        }
        if (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0 &&
            strcmp(type, "text") != 0) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, pp, "unsupported_value",
                              "Unsupported value for '%s': content parts of type '%s' are not "
                              "supported by this server; the model reads text ('input_text', "
                              "'output_text').", pp, type);
            return TD_ERR_UNSUPPORTED;
        }
        td_ireq_param_fmt(pp, "%s[%zu]", param, i);
        if (item_string(p, pp, part, "text", &t) != TD_OK)
            return TD_ERR_INVALID;
        if (b->len > 0)
            td_buf_append(b, "\n\n", 2);
        td_buf_append(b, json_string_value(t), json_string_length(t));
    }
    return td_buf_status(b) == TD_OK ? TD_OK : td_ireq_nomem(p);
}

/* ===================================================================== */
/* Input items                                                            */
/* ===================================================================== */

/* The open assistant message, made when there is none (or it cannot take
 * what comes: fresh says it must have no content and no calls yet). */
static json_t *
assistant(rconv_t *c, bool fresh)
{
    if (c->open != NULL && !(fresh && (json_string_length(json_object_get(c->open, "content")) ||
                                       json_object_get(c->open, "tool_calls"))))
        return c->open;
    if (push(c, json_pack("{s:s, s:s}", "role", "assistant", "content", "")) != TD_OK)
        return NULL;
    return c->open;
}

/* A message item: user, system and developer as chat messages; an
 * assistant message's text goes to the open assistant message. */
static td_status_t
item_message(rconv_t *c, const char *param, const json_t *item)
{
    td_ireq_param_t pp;
    const json_t *role;
    td_buf_t b = {0};
    td_status_t rc;
    const char *r;

    if ((rc = item_string(c->p, param, item, "role", &role)) != TD_OK)
        return rc;
    r = json_string_value(role);
    td_ireq_param_fmt(pp, "%s.role", param);
    if (strcmp(r, "user") != 0 && strcmp(r, "system") != 0 && strcmp(r, "developer") != 0 &&
        strcmp(r, "assistant") != 0)
        return bad_value(c->p, pp, "the role must be 'user', 'assistant', 'system' or "
                         "'developer', not", r);
    td_ireq_param_fmt(pp, "%s.content", param);
    if (json_object_get(item, "content") == NULL)
        return td_ireq_missing(c->p, pp);
    if ((rc = content_text(c->p, pp, json_object_get(item, "content"), &b)) != TD_OK) {
        td_buf_free(&b);
        return rc;
    }
    if (strcmp(r, "assistant") == 0) {
        json_t *a = assistant(c, true);
        rc = a ? TD_OK : td_ireq_nomem(c->p);
        if (a)
            json_object_set_new(a, "content", json_stringn(b.data ? b.data : "", b.len));
    } else {
        rc = push(c, json_pack("{s:s, s:s%}", "role", r, "content", b.data ? b.data : "", b.len));
    }
    td_buf_free(&b);
    return rc;
}

/* A reasoning item: its reasoning_text content is the next assistant
 * message's reasoning (a summary alone is not the reasoning: dropped, as the
 * reference drops it). */
static td_status_t
item_reasoning(rconv_t *c, const char *param, const json_t *item)
{
    const json_t *content = json_object_get(item, "content");
    td_ireq_param_t pp;
    td_buf_t b = {0};
    json_t *a;

    for (size_t i = 0; i < json_array_size(content); i++) {
        const json_t *t = json_object_get(json_array_get(content, i), "text");
        td_ireq_param_fmt(pp, "%s.content[%zu].text", param, i);
        if (!json_is_string(t)) {
            td_buf_free(&b);
            return td_ireq_bad_type(c->p, pp, "a string", t);
        }
        td_buf_append(&b, json_string_value(t), json_string_length(t));
    }
    if ((a = assistant(c, true)) == NULL || td_buf_status(&b) != TD_OK) {
        td_buf_free(&b);
        return td_ireq_nomem(c->p);
    }
    json_object_set_new(a, "reasoning_content", json_stringn(b.data ? b.data : "", b.len));
    td_buf_free(&b);
    return TD_OK;
}

/* A function_call item: a tool call of the open assistant message. */
static td_status_t
item_call(rconv_t *c, const char *param, const json_t *item)
{
    const json_t *id, *name, *args;
    json_t *a, *calls;
    td_status_t rc;

    if ((rc = item_string(c->p, param, item, "call_id", &id)) != TD_OK ||
        (rc = item_string(c->p, param, item, "name", &name)) != TD_OK ||
        (rc = item_string(c->p, param, item, "arguments", &args)) != TD_OK)
        return rc;
    if ((a = assistant(c, false)) == NULL)
        return td_ireq_nomem(c->p);
    if ((calls = json_object_get(a, "tool_calls")) == NULL) {
        calls = json_array();
        json_object_set_new(a, "tool_calls", calls);
    }
    if (json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type",
                                               "function", "function", "name", name,
                                               "arguments", args)) != 0 ||
        json_array_append(c->calls, (json_t *)id) != 0)
        return td_ireq_nomem(c->p);
    return TD_OK;
}

/* A function_call_output item: a tool message answering an earlier call. */
static td_status_t
item_output(rconv_t *c, const char *param, const json_t *item)
{
    td_ireq_param_t pp;
    const json_t *id, *out = json_object_get(item, "output");
    td_buf_t b = {0};
    bool found = false;
    td_status_t rc;

    if ((rc = item_string(c->p, param, item, "call_id", &id)) != TD_OK)
        return rc;
    for (size_t i = 0; i < json_array_size(c->calls); i++)
        found |= json_equal(json_array_get(c->calls, i), id);
    td_ireq_param_fmt(pp, "%s.call_id", param);
    if (!found)
        return bad_value(c->p, pp, "no function_call item with this call_id comes before this "
                         "function_call_output", json_string_value(id));
    td_ireq_param_fmt(pp, "%s.output", param);
    if (out == NULL)
        return td_ireq_missing(c->p, pp);
    if ((rc = content_text(c->p, pp, out, &b)) == TD_OK)
        rc = push(c, json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", id,
                               "content", b.data ? b.data : "", b.len));
    td_buf_free(&b);
    return rc;
}

static td_status_t
convert_item(rconv_t *c, size_t i, const json_t *item)
{
    td_ireq_param_t pp;
    const json_t *t = json_object_get(item, "type");
    const char *type = json_string_value(t);

    td_ireq_param_fmt(pp, "input[%zu]", i);
    if (!json_is_object(item))
        return td_ireq_bad_type(c->p, pp, "an object", item);
    if (t != NULL && type == NULL) {
        td_ireq_param_fmt(pp, "input[%zu].type", i);
        return td_ireq_bad_type(c->p, pp, "a string", t);
    }
    if (type == NULL || strcmp(type, "message") == 0)
        return item_message(c, pp, item);
    if (strcmp(type, "reasoning") == 0)
        return item_reasoning(c, pp, item);
    if (strcmp(type, "function_call") == 0)
        return item_call(c, pp, item);
    if (strcmp(type, "function_call_output") == 0)
        return item_output(c, pp, item);
    td_ireq_param_fmt(pp, "input[%zu].type", i);
    td_openai_err_set(c->p->e, 400, INVALID_REQUEST, pp, "unsupported_value",
                      "Unsupported value for '%s': input items of type '%s' are not supported "
                      "by this server; it takes 'message', 'reasoning', 'function_call' and "
                      "'function_call_output'.", pp, type);
    return TD_ERR_UNSUPPORTED;
}

/* ===================================================================== */
/* Tools, reasoning, text                                                 */
/* ===================================================================== */

/* Function tools ({type: function, name, description, parameters, strict})
 * as chat functions; other tool types (web search, file search, ...) are
 * refused. The echo gets each with strict (null when not given). */
static td_status_t
convert_tools(td_ireq_parse_t *p, const json_t *tools, json_t *chat, json_t *echo)
{
    td_ireq_param_t pp;
    json_t *out = json_array(), *shown = json_array();

    json_object_set_new(chat, "tools", out);
    json_object_set_new(echo, "tools", shown);
    if (out == NULL || shown == NULL)
        return td_ireq_nomem(p);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *name;
        const char *type = json_string_value(json_object_get(t, "type"));
        td_ireq_param_fmt(pp, "tools[%zu]", i);
        if (!json_is_object(t))
            return td_ireq_bad_type(p, pp, "an object", t);
        td_ireq_param_fmt(pp, "tools[%zu].type", i);
        if (type == NULL || strcmp(type, "function") != 0) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, pp, "unsupported_value",
                              "Unsupported value for '%s': tools of type '%s' (hosted tools "
                              "such as web search or file search) are not supported by this "
                              "server; only 'function' tools are.", pp, type ? type : "?");
            return TD_ERR_UNSUPPORTED;
        }
        td_ireq_param_fmt(pp, "tools[%zu]", i);
        if (item_string(p, pp, t, "name", &name) != TD_OK)
            return TD_ERR_INVALID;
        json_t *fn = json_pack("{s:O}", "name", name);
        const char *keys[] = { "description", "parameters", "strict" };
        for (size_t k = 0; fn && k < 3; k++)
            if (json_object_get(t, keys[k]) && !json_is_null(json_object_get(t, keys[k])))
                json_object_set(fn, keys[k], json_object_get(t, keys[k]));
        json_t *e = json_deep_copy(t);
        if (e && json_object_get(e, "strict") == NULL)
            json_object_set_new(e, "strict", json_null());
        if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function",
                                                 fn)) != 0 ||
            json_array_append_new(shown, e) != 0)
            return td_ireq_nomem(p);
    }
    return TD_OK;
}

/* tool_choice: "auto", "none", "required", or {type: function, name}. */
static td_status_t
convert_tool_choice(td_ireq_parse_t *p, const json_t *tc, json_t *chat)
{
    const char *type;

    if (json_is_string(tc)) {
        type = json_string_value(tc);
        if (strcmp(type, "auto") != 0 && strcmp(type, "none") != 0 &&
            strcmp(type, "required") != 0)
            return bad_value(p, "tool_choice", "not one of 'auto', 'none' and 'required'", type);
        json_object_set(chat, "tool_choice", (json_t *)tc);
        return TD_OK;
    }
    if (!json_is_object(tc))
        return td_ireq_bad_type(p, "tool_choice", "a string or an object", tc);
    type = json_string_value(json_object_get(tc, "type"));
    if (type == NULL || strcmp(type, "function") != 0)
        return bad_value(p, "tool_choice.type", "this server takes 'function'",
                         type ? type : NULL);
    const json_t *name;
    if (item_string(p, "tool_choice", tc, "name", &name) != TD_OK)
        return TD_ERR_INVALID;
    json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function",
                                                       "function", "name", name));
    return TD_OK;
}

/* reasoning: {effort, summary}: effort is the V4.1 format's reasoning
 * effort ("none" turns thinking off, as the reference's). */
static td_status_t
convert_reasoning(td_ireq_parse_t *p, const json_t *r, json_t *chat, json_t *echo)
{
    const json_t *effort = json_object_get(r, "effort"), *summary = json_object_get(r, "summary");
    const char *key;
    const json_t *v;

    if (!json_is_object(r))
        return td_ireq_bad_type(p, "reasoning", "an object", r);
    json_object_foreach((json_t *)r, key, v)
        if (strcmp(key, "effort") != 0 && strcmp(key, "summary") != 0 &&
            strcmp(key, "generate_summary") != 0)
            return bad_value(p, "reasoning", "this server takes 'effort' and 'summary', not", key);
    if (effort && !json_is_null(effort) && !json_is_string(effort))
        return td_ireq_bad_type(p, "reasoning.effort", "a string", effort);
    if (summary && !json_is_null(summary) && !json_is_string(summary))
        return td_ireq_bad_type(p, "reasoning.summary", "a string", summary);
    if (json_is_string(effort))
        json_object_set(chat, "reasoning_effort", (json_t *)effort);
    json_object_set_new(echo, "reasoning", json_pack("{s:O?, s:O?}", "effort", effort,
                                                     "summary", summary));
    return TD_OK;
}

/* text: {format, verbosity}: format json_object or json_schema is the
 * request model's constraint (structured output), as response_format's. */
static td_status_t
field_text(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    const json_t *f = json_object_get(v, "format"), *t;
    const char *type;

    if (!json_is_object(v))
        return td_ireq_bad_type(p, key, "an object", v);
    if (f == NULL || json_is_null(f))
        return TD_OK;
    if (!json_is_object(f))
        return td_ireq_bad_type(p, "text.format", "an object", f);
    if ((t = json_object_get(f, "type")) == NULL)
        return td_ireq_missing(p, "text.format.type");
    type = json_string_value(t);
    if (type != NULL && strcmp(type, "text") == 0)
        return TD_OK;
    if (type != NULL && strcmp(type, "json_object") == 0)
        return td_ireq_constraint_set(p, "text.format", TD_IREQ_CONSTRAINT_JSON_OBJECT, NULL);
    if (type == NULL || strcmp(type, "json_schema") != 0)
        return bad_value(p, "text.format.type", "supported values are 'text', 'json_object' "
                         "and 'json_schema'", type);
    if (!json_is_object(json_object_get(f, "schema")))
        return json_object_get(f, "schema") ? td_ireq_bad_type(p, "text.format.schema",
                                                              "an object",
                                                              json_object_get(f, "schema"))
                                            : td_ireq_missing(p, "text.format.schema");
    p->req->constraint.strict = json_is_true(json_object_get(f, "strict"));
    return td_ireq_constraint_set(p, "text.format", TD_IREQ_CONSTRAINT_JSON_SCHEMA, f);
}

/* ===================================================================== */
/* The request                                                            */
/* ===================================================================== */

static td_status_t
field_model(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    p->has_model = true;
    return td_ireq_get_string(p, key, v, &p->req->model);
}

static td_status_t
field_input(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_string(v) && !json_is_array(v))
        return td_ireq_bad_type(p, key, "a string or an array of input items", v);
    if (json_is_array(v) && json_array_size(v) == 0)
        return td_ireq_empty_array(p, key);
    p->has_body = true;
    return TD_OK;
}

/* The shared table's parser of a field of this meaning. */
static td_status_t
field_shared(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    const char *name = strcmp(key, "max_output_tokens") == 0 ? "max_completion_tokens" : key;
    const td_ireq_field_t *f = td_ireq_field_find(TD_OPENAI_CHAT, name);

    return f ? f->fn(p, key, v) : TD_ERR_INTERNAL;
}

/* include: only reasoning.encrypted_content, which every reasoning item
 * has (its id; the reasoning is its content). */
static bool
include_ok(const json_t *v)
{
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_string(json_array_get(v, i)) ||
            strcmp(json_string_value(json_array_get(v, i)), "reasoning.encrypted_content") != 0)
            return false;
    return true;
}

/* Checked here, applied by the conversion or reported in the echo. */
static td_status_t
field_typed(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    static const struct { const char *name; json_type type; const char *what; } types[] = {
        { "instructions", JSON_STRING, "a string" },
        { "tools", JSON_ARRAY, "an array" },
        { "metadata", JSON_OBJECT, "an object" },
        { "store", JSON_TRUE, "a boolean" },
        { "previous_response_id", JSON_STRING, "a string" },
        { "parallel_tool_calls", JSON_TRUE, "a boolean" },
        { "prompt_cache_key", JSON_STRING, "a string" },
        { "safety_identifier", JSON_STRING, "a string" },
        { "service_tier", JSON_STRING, "a string" },
        { "truncation", JSON_STRING, "a string" },
        { "background", JSON_TRUE, "a boolean" },
        { "top_logprobs", JSON_INTEGER, "an integer" },
        { "include", JSON_ARRAY, "an array" },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].name, key) == 0) {
            bool ok = types[i].type == JSON_TRUE ? json_is_boolean(v)
                                                 : json_typeof(v) == types[i].type;
            if (!ok)
                return td_ireq_bad_type(p, key, types[i].what, v);
        }
    if (strcmp(key, "instructions") == 0)
        p->has_body = true;   /* input is optional beside instructions */
    if ((strcmp(key, "background") == 0 && json_is_true(v)) ||
        (strcmp(key, "truncation") == 0 && strcmp(json_string_value(v), "disabled") != 0) ||
        (strcmp(key, "top_logprobs") == 0 && json_integer_value(v) != 0) ||
        (strcmp(key, "include") == 0 && !include_ok(v))) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "unsupported_value",
                          "Unsupported value for '%s': %s", key,
                          key[0] == 'b' ? "background responses are not supported by this "
                                          "server; send the request without it."
                        : key[0] == 't' && key[1] == 'r'
                            ? "this server takes 'disabled' only (a prompt over the context "
                              "is refused, never cut)."
                        : key[0] == 't' ? "log-probabilities are not supported on "
                                          "/v1/responses by this server."
                                        : "this server includes only "
                                          "'reasoning.encrypted_content' (always there).");
        return TD_ERR_UNSUPPORTED;
    }
    return TD_OK;
}

#define RESP TD_IREQ_KIND(TD_OPENAI_RESPONSES)

static const td_ireq_field_t responses_fields[] = {
    { "model",                RESP, field_model, true },
    { "input",                RESP, field_input, false },
    { "instructions",         RESP, field_typed, false },
    { "tools",                RESP, field_typed, false },
    { "tool_choice",          RESP, field_typed, false },
    { "reasoning",            RESP, field_typed, false },
    { "text",                 RESP, field_text, false },
    { "max_output_tokens",    RESP, field_shared, false },
    { "temperature",          RESP, field_shared, false },
    { "top_p",                RESP, field_shared, false },
    { "stream",               RESP, field_shared, false },
    { "user",                 RESP, field_shared, false },
    { "metadata",             RESP, field_typed, false },
    { "store",                RESP, field_typed, false },
    { "previous_response_id", RESP, field_typed, false },
    { "parallel_tool_calls",  RESP, field_typed, false },
    { "prompt_cache_key",     RESP, field_typed, false },
    { "safety_identifier",    RESP, field_typed, false },
    { "service_tier",         RESP, field_typed, false },
    { "truncation",           RESP, field_typed, false },
    { "background",           RESP, field_typed, false },
    { "top_logprobs",         RESP, field_typed, false },
    { "include",              RESP, field_typed, false },
    { NULL, 0, NULL, false },
};

/* What the response objects report of the request (OpenAI's fields; the
 * writer adds id, status, output, usage and the times). */
static json_t *
echo_new(const td_ireq_t *r, const json_t *body)
{
    const json_t *v;
    json_t *e = json_pack("{s:b, s:n, s:n, s:f, s:n, s:O?, s:O?, s:n, s:s, s:n, s:b, s:f, "
                          "s:O?, s:O?, s:n, s:{s:n, s:n}, s:O?, s:s, s:f, s:{s:{s:s}, s:n}, "
                          "s:s, s:[], s:i, s:f, s:s, s:O?, s:o}",
                          "background", 0, "content_filters", "error", "frequency_penalty", 0.0,
                          "incomplete_details", "instructions",
                          json_object_get(body, "instructions"), "max_output_tokens",
                          json_object_get(body, "max_output_tokens"), "max_tool_calls",
                          "model", r->model, "moderation", "parallel_tool_calls",
                          !json_is_false(json_object_get(body, "parallel_tool_calls")),
                          "presence_penalty", 0.0, "previous_response_id",
                          json_object_get(body, "previous_response_id"), "prompt_cache_key",
                          json_object_get(body, "prompt_cache_key"), "prompt_cache_retention",
                          "reasoning", "effort", "summary", "safety_identifier",
                          json_object_get(body, "safety_identifier"), "service_tier",
                          "default", "temperature", r->sampling.temperature, "text", "format",
                          "type", "text", "verbosity", "tool_choice", "auto", "tools",
                          "top_logprobs", 0, "top_p", r->sampling.top_p, "truncation",
                          "disabled", "user", json_object_get(body, "user"), "metadata",
                          json_object());

    if (e == NULL)
        return NULL;
    if ((v = json_object_get(body, "metadata")) && json_is_object(v))
        json_object_set(e, "metadata", (json_t *)v);
    if ((v = json_object_get(body, "tool_choice")) && !json_is_null(v))
        json_object_set(e, "tool_choice", (json_t *)v);
    if ((v = json_object_get(body, "text")) && json_is_object(v)) {
        json_t *t = json_deep_copy(v);
        if (t && json_object_get(t, "format") == NULL)
            json_object_set_new(t, "format", json_pack("{s:s}", "type", "text"));
        if (t && json_object_get(t, "verbosity") == NULL)
            json_object_set_new(t, "verbosity", json_null());
        json_object_set_new(e, "text", t);
    }
    return e;
}

/* Whether some message of the conversation says "json" (any case). */
static bool
mentions_json(const json_t *msgs)
{
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const char *t = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
        if (t != NULL && strcasestr(t, "json") != NULL)
            return true;
    }
    return false;
}

/* text.format as the chat body's response_format, which the V4.1 encoder
 * tells the model as the reference does (the constraint, set by field_text,
 * enforces it); json_object needs the word json in the conversation, as
 * OpenAI's rule and the reference's. */
static td_status_t
convert_format(td_ireq_parse_t *p, const json_t *f, json_t *chat)
{
    const char *type = json_string_value(json_object_get(f, "type"));
    json_t *rf;

    if (type == NULL || strcmp(type, "text") == 0)
        return TD_OK;
    if (strcmp(type, "json_object") == 0) {
        if (!mentions_json(json_object_get(chat, "messages"))) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, "input", "invalid_value",
                              "Response input messages must contain the word 'json' in some "
                              "form to use 'text.format' of type 'json_object'.");
            return TD_ERR_INVALID;
        }
        rf = json_pack("{s:s}", "type", "json_object");
    } else {
        rf = json_pack("{s:s, s:{s:O, s:O?, s:b}}", "type", "json_schema", "json_schema",
                       "schema", json_object_get(f, "schema"), "name",
                       json_object_get(f, "name"), "strict",
                       json_is_true(json_object_get(f, "strict")));
    }
    if (rf == NULL || json_object_set_new(chat, "response_format", rf) != 0)
        return td_ireq_nomem(p);
    return TD_OK;
}

/* The conversation: instructions, the previous response's conversation,
 * then the input; tools, tool_choice, reasoning into chat and echo. */
static td_status_t
convert(td_ireq_parse_t *p, const json_t *body, const json_t *prev, json_t *chat, json_t *echo,
        json_t *conv)
{
    rconv_t c = { .p = p, .msgs = conv, .calls = json_array() };
    const json_t *v = json_object_get(body, "input");
    json_t *msgs = json_array();
    td_status_t rc = TD_OK;

    if (c.calls == NULL || msgs == NULL) {
        json_decref(msgs);
        json_decref(c.calls);
        return td_ireq_nomem(p);
    }
    for (size_t i = 0; i < json_array_size(prev); i++) {
        const json_t *m = json_array_get(prev, i), *calls = json_object_get(m, "tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++)
            json_array_append(c.calls, json_object_get(json_array_get(calls, k), "id"));
        json_array_append(conv, (json_t *)m);
    }
    if (json_is_string(v))
        rc = push(&c, json_pack("{s:s, s:O}", "role", "user", "content", v));
    for (size_t i = 0; rc == TD_OK && i < json_array_size(v); i++)
        rc = convert_item(&c, i, json_array_get(v, i));
    json_decref(c.calls);
    if (rc == TD_OK && (v = json_object_get(body, "instructions")) && json_is_string(v))
        rc = json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content",
                                                   v)) == 0 ? TD_OK : td_ireq_nomem(p);
    json_array_extend(msgs, conv);
    json_object_set_new(chat, "messages", msgs);
    if (rc == TD_OK && (v = json_object_get(body, "tools")) && json_array_size(v) > 0)
        rc = convert_tools(p, v, chat, echo);
    if (rc == TD_OK && (v = json_object_get(body, "tool_choice")) && !json_is_null(v))
        rc = convert_tool_choice(p, v, chat);
    if (rc == TD_OK && (v = json_object_get(body, "reasoning")) && !json_is_null(v))
        rc = convert_reasoning(p, v, chat, echo);
    if (rc == TD_OK)
        rc = convert_format(p, json_object_get(json_object_get(body, "text"), "format"), chat);
    if (rc == TD_OK && p->cfg->no_default_thinking &&
        json_object_get(chat, "reasoning_effort") == NULL)
        json_object_set_new(chat, "thinking", json_pack("{s:s}", "type", "disabled"));
    if (rc == TD_OK && json_array_size(msgs) == 0)
        rc = td_ireq_missing(p, "input");
    return rc;
}

td_status_t
td_adapt_responses_prev_id(const json_t *body, const char **id, td_openai_err_t *e)
{
    const json_t *v = json_object_get(body, "previous_response_id");

    *id = NULL;
    if (v == NULL || json_is_null(v))
        return TD_OK;
    if (!json_is_string(v)) {
        td_openai_err_set(e, 400, INVALID_REQUEST, "previous_response_id", "invalid_type",
                          "Invalid type for 'previous_response_id': expected a string, but got "
                          "%s instead.", td_ireq_json_type(v));
        return TD_ERR_INVALID;
    }
    *id = json_string_value(v);
    return TD_OK;
}

td_status_t
td_adapt_responses_parse(const td_ireq_cfg_t *cfg, const json_t *body, const json_t *prev,
                         td_ireq_t **out, td_openai_err_t *e)
{
    td_ireq_parse_t p = { .cfg = cfg, .e = e };
    td_ireq_t *req = NULL;
    json_t *chat = NULL, *echo = NULL, *conv = NULL;
    td_status_t rc;

    rc = td_ireq_parse_object(cfg, TD_OPENAI_RESPONSES, responses_fields, (json_t *)body, &req,
                              e);
    if (rc != TD_OK)
        return rc;
    p.req = req;
    chat = json_object();
    conv = json_array();
    echo = echo_new(req, body);
    if (chat == NULL || conv == NULL || echo == NULL)
        rc = td_ireq_nomem(&p);
    if (rc == TD_OK)
        rc = convert(&p, body, prev, chat, echo, conv);
    if (rc == TD_OK)
        rc = td_ireq_set_msgs(&p, json_object_get(chat, "messages"));
    if (rc == TD_OK) {
        json_decref(req->body);
        req->body = chat;
        req->proto = json_pack("{s:o, s:o, s:b}", "echo", echo, "conv", conv, "store",
                               !json_is_false(json_object_get(body, "store")));
        if (req->proto == NULL)
            rc = td_ireq_nomem(&p);
        chat = echo = conv = NULL;
    }
    json_decref(chat);
    json_decref(echo);
    json_decref(conv);
    if (rc != TD_OK) {
        td_ireq_destroy(req);
        return rc;
    }
    *out = req;
    return TD_OK;
}
