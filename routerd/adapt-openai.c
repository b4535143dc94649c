/* routerd/adapt-openai.c — the Chat Completions and Completions adapters:
 * the fields only these protocols have (messages, prompt, tools, the shapes
 * of logprobs, echo, suffix, the accepted-and-unused ones) parsed into the
 * one request model (ireq.h), whose shared table reads everything else. */
#include "adapt-openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

#define INVALID_REQUEST "invalid_request_error"

/* ===================================================================== */
/* Messages                                                               */
/* ===================================================================== */

/* content given as an array of parts: only text parts, joined with "\n". */
static td_status_t
parse_content_parts(td_ireq_parse_t *p, const char *param, const json_t *parts, char **out)
{
    td_ireq_param_t pp;
    td_buf_t text = {0};
    td_status_t rc = TD_OK;
    if (json_array_size(parts) == 0)
        return td_ireq_empty_array(p, param);
    for (size_t j = 0; j < json_array_size(parts); j++) {
        const json_t *part = json_array_get(parts, j);
        td_ireq_param_fmt(pp, "%s[%zu]", param, j);
        if (!json_is_object(part)) {
            rc = td_ireq_bad_type(p, pp, "an object", part);
            goto err_free_text;
        }
        const json_t *type = json_object_get(part, "type");
        const json_t *t = json_object_get(part, "text");
        td_ireq_param_fmt(pp, "%s[%zu].type", param, j);
        if (type == NULL) {
            rc = td_ireq_missing(p, pp);
            goto err_free_text;
        }
        if (!json_is_string(type)) {
            rc = td_ireq_bad_type(p, pp, "a string", type);
            goto err_free_text;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, pp, "unsupported_value",
                              "Unsupported value for '%s': content parts of type '%s' are not "
                              "supported by this server; only 'text' is.", pp,
                              json_string_value(type));
            rc = TD_ERR_UNSUPPORTED;
            goto err_free_text;
        }
        td_ireq_param_fmt(pp, "%s[%zu].text", param, j);
        if (t == NULL) {
            rc = td_ireq_missing(p, pp);
            goto err_free_text;
        }
        if (!json_is_string(t)) {
            rc = td_ireq_bad_type(p, pp, "a string", t);
            goto err_free_text;
        }
        if ((j > 0 && td_buf_append(&text, "\n", 1) != TD_OK) ||
            td_buf_append(&text, json_string_value(t), json_string_length(t)) != TD_OK) {
            rc = td_ireq_nomem(p);
            goto err_free_text;
        }
    }
    if ((*out = td_buf_take(&text, NULL)) == NULL)
        return td_ireq_nomem(p);
    return TD_OK;

err_free_text:
    td_buf_free(&text);
    return rc;
}

static td_status_t
parse_role(td_ireq_parse_t *p, const char *param, const json_t *v, td_openai_role_t *out)
{
    if (v == NULL)
        return td_ireq_missing(p, param);
    if (!json_is_string(v))
        return td_ireq_bad_type(p, param, "a string", v);
    for (int r = TD_OPENAI_ROLE_SYSTEM; r <= TD_OPENAI_ROLE_DEVELOPER; r++)
        if (strcmp(json_string_value(v), td_openai_role_str((td_openai_role_t)r)) == 0) {
            *out = (td_openai_role_t)r;
            return TD_OK;
        }
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                      "Invalid value: '%s'. Supported values are: 'system', 'assistant', "
                      "'user', 'tool', and 'developer'.", json_string_value(v));
    return TD_ERR_INVALID;
}

/* One element of messages; unknown keys of a message are ignored. */
static td_status_t
parse_message(td_ireq_parse_t *p, size_t i, const json_t *m, td_ireq_msg_t *msg)
{
    td_ireq_param_t pp;
    td_status_t rc;
    td_ireq_param_fmt(pp, "messages[%zu]", i);
    if (!json_is_object(m))
        return td_ireq_bad_type(p, pp, "an object", m);
    td_ireq_param_fmt(pp, "messages[%zu].role", i);
    if ((rc = parse_role(p, pp, json_object_get(m, "role"), &msg->role)) != TD_OK)
        return rc;

    const json_t *name = json_object_get(m, "name");
    td_ireq_param_fmt(pp, "messages[%zu].name", i);
    if (name && !json_is_null(name) && (rc = td_ireq_get_string(p, pp, name, &msg->name)) != TD_OK)
        return rc;

    const json_t *calls = json_object_get(m, "tool_calls");
    if (msg->role == TD_OPENAI_ROLE_ASSISTANT && calls && !json_is_null(calls)) {
        td_ireq_param_fmt(pp, "messages[%zu].tool_calls", i);
        if (!json_is_array(calls))
            return td_ireq_bad_type(p, pp, "an array", calls);
        if ((rc = td_ireq_get_raw(p, calls, &msg->tool_calls)) != TD_OK)
            return rc;
    }

    if (msg->role == TD_OPENAI_ROLE_TOOL) {
        const json_t *id = json_object_get(m, "tool_call_id");
        td_ireq_param_fmt(pp, "messages[%zu].tool_call_id", i);
        if (id == NULL || json_is_null(id))
            return td_ireq_missing(p, pp);
        if ((rc = td_ireq_get_string(p, pp, id, &msg->tool_call_id)) != TD_OK)
            return rc;
    }

    const json_t *content = json_object_get(m, "content");
    td_ireq_param_fmt(pp, "messages[%zu].content", i);
    if (content == NULL || json_is_null(content)) {
        if (msg->tool_calls == NULL)
            return td_ireq_missing(p, pp);
        if ((msg->content = strdup("")) == NULL)
            return td_ireq_nomem(p);
        return TD_OK;
    }
    if (json_is_array(content))
        return parse_content_parts(p, pp, content, &msg->content);
    if (!json_is_string(content))
        return td_ireq_bad_type(p, pp, "a string or an array of content parts", content);
    return td_ireq_get_string(p, pp, content, &msg->content);
}


static td_status_t
field_model(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    p->has_model = true;
    return td_ireq_get_string(p, key, v, &p->req->model);
}

static td_status_t
field_messages(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    td_ireq_t *r = p->req;
    if (!json_is_array(v))
        return td_ireq_bad_type(p, key, "an array", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return td_ireq_empty_array(p, key);
    if ((r->msgs = calloc(n, sizeof *r->msgs)) == NULL)
        return td_ireq_nomem(p);
    for (r->nmsgs = 0; r->nmsgs < n; r->nmsgs++) {
        td_status_t rc = parse_message(p, r->nmsgs, json_array_get(v, r->nmsgs),
                                       &r->msgs[r->nmsgs]);
        if (rc != TD_OK) {
            r->nmsgs++; /* the failed message may own strings: destroy frees them */
            return rc;
        }
    }
    p->has_body = true;
    return TD_OK;
}

/* A token-id prompt at param (prompt, or prompt[0] of an array of arrays):
 * every id an integer in [0, vocab) (vocab 0: below 2^31), kept as given. */
static td_status_t
get_token_ids(td_ireq_parse_t *p, const char *param, const json_t *v)
{
    size_t n = json_array_size(v);
    int32_t *ids;

    if (n == 0)
        return td_ireq_empty_array(p, param);
    if ((ids = malloc(n * sizeof *ids)) == NULL)
        return td_ireq_nomem(p);
    for (size_t i = 0; i < n; i++) {
        td_ireq_param_t pp;
        td_status_t rc;

        td_ireq_param_fmt(pp, "%s[%zu]", param, i);
        if ((rc = td_ireq_get_token(p, pp, json_array_get(v, i), &ids[i])) != TD_OK) {
            free(ids);
            return rc;
        }
    }
    p->req->prompt_ids = ids;
    p->req->nprompt_ids = n;
    p->has_body = true;
    return TD_OK;
}

/* A string, an array of one string, an array of token ids, or an array of
 * one array of token ids; more than one prompt (a batch) is refused. */
static td_status_t
field_prompt(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return td_ireq_empty_array(p, key);
        const json_t *first = json_array_get(v, 0);
        if (json_is_integer(first))
            return get_token_ids(p, key, v);
        if (json_array_size(v) > 1)
            return td_ireq_unsupported(p, key, "batched prompts (more than one prompt in an array) "
                                       "are not supported by this server; send one prompt "
                                       "per request.");
        if (json_is_array(first))
            return get_token_ids(p, "prompt[0]", first);
        if (!json_is_string(first))
            return td_ireq_bad_type(p, "prompt[0]", "a string or an array of token ids", first);
        v = first;
    } else if (!json_is_string(v)) {
        return td_ireq_bad_type(p, key, "a string, an array of one string or an array of token ids",
                        v);
    }
    p->has_body = true;
    return td_ireq_get_string(p, key, v, &p->req->prompt);
}


static td_status_t
field_tools(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_array(v))
        return td_ireq_bad_type(p, key, "an array", v);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_object(json_array_get(v, i))) {
            td_ireq_param_t pp;
            td_ireq_param_fmt(pp, "tools[%zu]", i);
            return td_ireq_bad_type(p, pp, "an object", json_array_get(v, i));
        }
    return td_ireq_get_raw(p, v, &p->req->tools);
}

static td_status_t
field_tool_choice(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_string(v) && !json_is_object(v))
        return td_ireq_bad_type(p, key, "a string or an object", v);
    return td_ireq_get_raw(p, v, &p->req->tool_choice);
}


/* chat: a boolean; completions: the number of alternatives, 0..5. */
static td_status_t
field_logprobs(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    int64_t n;
    td_status_t rc;

    if (p->req->kind == TD_OPENAI_CHAT)
        return td_ireq_get_bool(p, key, v, &p->req->out.logprobs);
    rc = td_ireq_get_int(p, key, v, 0, TD_OPENAI_MAX_COMPLETION_LOGPROBS, &n);
    if (rc == TD_OK) {
        p->req->out.logprobs = true;
        p->req->out.top_logprobs = (uint32_t)n;
    }
    return rc;
}

/* chat: 0..20, with logprobs true (checked in parse_finish). */
static td_status_t
field_top_logprobs(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    int64_t n;
    td_status_t rc = td_ireq_get_int(p, key, v, 0, TD_OPENAI_MAX_TOP_LOGPROBS, &n);

    if (rc == TD_OK)
        p->req->out.top_logprobs = (uint32_t)n;
    return rc;
}

static td_status_t
field_echo(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_boolean(v))
        return td_ireq_bad_type(p, key, "a boolean", v);
    if (json_is_false(v))
        return TD_OK;
    return td_ireq_unsupported(p, key, "echo is not supported by this server.");
}

static td_status_t
field_suffix(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_string(v))
        return td_ireq_bad_type(p, key, "a string", v);
    if (json_string_length(v) == 0)
        return TD_OK;
    return td_ireq_unsupported(p, key, "suffix (insertion) is not supported by this server.");
}


/* Type-checked only here: metadata, store and service_tier are accepted for
 * compatibility and not used; parallel_tool_calls is read from the body by
 * td_ireq_finish (false: a forced tool choice makes one call); thinking
 * and reasoning_effort are read by the V4.1 chat encoding (text/chat.c:
 * values checked there) and have no effect on the byte-level stand-in. */
static td_status_t
field_ignored(td_ireq_parse_t *p, const char *key, const json_t *v)
{
    static const struct { const char *name; json_type type; const char *what; } types[] = {
        { "service_tier", JSON_STRING, "a string" },
        { "metadata", JSON_OBJECT, "an object" },
        { "store", JSON_TRUE, "a boolean" },
        { "parallel_tool_calls", JSON_TRUE, "a boolean" },
        { "thinking", JSON_OBJECT, "an object" },
        { "reasoning_effort", JSON_STRING, "a string" },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(types[i].name, key) == 0) {
            bool ok = types[i].type == JSON_TRUE ? json_is_boolean(v)
                                                 : json_typeof(v) == types[i].type;
            return ok ? TD_OK : td_ireq_bad_type(p, key, types[i].what, v);
        }
    return TD_ERR_INTERNAL;
}


#define CHAT TD_IREQ_KIND(TD_OPENAI_CHAT)
#define COMP TD_IREQ_KIND(TD_OPENAI_COMPLETION)

/* The fields only these two protocols have; ireq.c's table has the rest. */
static const td_ireq_field_t openai_fields[] = {
    { "model",                 CHAT | COMP, field_model, true },
    { "messages",              CHAT,        field_messages, true },
    { "prompt",                COMP,        field_prompt, true },
    { "tools",                 CHAT,        field_tools, false },
    { "tool_choice",           CHAT,        field_tool_choice, false },
    { "logprobs",              CHAT | COMP, field_logprobs, false },
    { "top_logprobs",          CHAT,        field_top_logprobs, false },
    { "echo",                  COMP,        field_echo, false },
    { "suffix",                COMP,        field_suffix, false },
    { "metadata",              CHAT,        field_ignored, false },
    { "store",                 CHAT,        field_ignored, false },
    { "service_tier",          CHAT,        field_ignored, false },
    { "parallel_tool_calls",   CHAT,        field_ignored, false },
    { "thinking",              CHAT,        field_ignored, false },
    { "reasoning_effort",      CHAT,        field_ignored, false },
    { NULL, 0, NULL, false },
};

td_status_t
td_adapt_openai_parse(const td_ireq_cfg_t *cfg, td_openai_kind_t kind, const char *body,
                      size_t len, td_ireq_t **out, td_openai_err_t *e)
{
    json_error_t jerr;
    json_t *root;
    td_status_t rc;

    if (len > cfg->max_body) {
        td_openai_err_too_big(e, len, cfg->max_body);
        return TD_ERR_TOO_BIG;
    }
    root = json_loadb(body, len, 0, &jerr);
    if (root == NULL) {
        td_openai_err_set(e, 400, INVALID_REQUEST, NULL, NULL,
                          "We could not parse the JSON body of your request: %s (line %d, "
                          "column %d). The API expects a JSON object.", jerr.text,
                          jerr.line, jerr.column);
        return TD_ERR_INVALID;
    }
    if (!json_is_object(root)) {
        td_openai_err_set(e, 400, INVALID_REQUEST, NULL, "invalid_type",
                          "The request body must be a JSON object, but got %s instead.",
                          td_ireq_json_type(root));
        json_decref(root);
        return TD_ERR_INVALID;
    }
    rc = td_ireq_parse_object(cfg, kind, openai_fields, root, out, e);
    json_decref(root);
    return rc;
}
