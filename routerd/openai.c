/* routerd/openai.c — OpenAI-compatible request parsing and validation (jansson
 * into td_openai_req_t) and the JSON of responses, chunks, models and errors. */
#include "openai.h"
#include "sse.h"
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define INVALID_REQUEST "invalid_request_error"
#define SERVER_ERROR    "server_error"

/* ===================================================================== */
/* Errors                                                                 */
/* ===================================================================== */

/* Cut a message truncated by vsnprintf back to a whole UTF-8 character. */
static void
utf8_trim_tail(char *s)
{
    size_t len = strlen(s), i = len, cont = 0;
    while (i > 0 && cont < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) {
        i--;
        cont++;
    }
    if (i == 0 || (unsigned char)s[i - 1] < 0x80)
        return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (cont + 1 < need)
        s[i - 1] = '\0';
}

/* Length of the well-formed UTF-8 character at s (RFC 3629: no overlong
 * forms, surrogates or code points above U+10FFFF, as jansson requires), or 0. */
static size_t
utf8_char_len(const unsigned char *s)
{
    unsigned char c = s[0];
    size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
             : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;

    for (size_t i = 1; i < n; i++) {
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF))
            return 0;
    }
    return n;
}

/* Replace each byte that is not part of a well-formed UTF-8 character by
 * '?': text quoted from a request (jansson's parse errors quote the bytes
 * where parsing stopped, possibly half a character) must not make the error
 * unrepresentable as JSON. */
static void
utf8_scrub(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p;) {
        size_t n = utf8_char_len(p);
        if (n == 0) {
            *p++ = '?';
        } else {
            p += n;
        }
    }
}

void
td_openai_err_set(td_openai_err_t *e, int http, const char *type, const char *param,
                  const char *code, const char *fmt, ...)
{
    e->http = http;
    e->type = type;
    e->code = code;
    e->retry_after = 0;
    if (snprintf(e->param, sizeof e->param, "%s", param ? param : "") >= (int)sizeof e->param)
        utf8_trim_tail(e->param);
    utf8_scrub(e->param);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->message)
        utf8_trim_tail(e->message);
    utf8_scrub(e->message);
}

void
td_openai_err_auth(td_openai_err_t *e, bool key_given)
{
    if (key_given)
        td_openai_err_set(e, 401, INVALID_REQUEST, NULL, "invalid_api_key",
                          "Incorrect API key provided.");
    else
        td_openai_err_set(e, 401, INVALID_REQUEST, NULL, NULL,
                          "You didn't provide an API key. You need to provide your API key "
                          "in an Authorization header using Bearer auth (i.e. "
                          "Authorization: Bearer YOUR_KEY).");
}

void
td_openai_err_no_route(td_openai_err_t *e, const char *method, const char *path)
{
    td_openai_err_set(e, 404, INVALID_REQUEST, NULL, NULL, "Invalid URL (%s %s)", method, path);
}

void
td_openai_err_too_big(td_openai_err_t *e, size_t len, size_t limit)
{
    if (len)
        td_openai_err_set(e, 413, INVALID_REQUEST, NULL, "request_too_large",
                          "Request body too large: %zu bytes, the limit is %zu bytes.", len,
                          limit);
    else
        td_openai_err_set(e, 413, INVALID_REQUEST, NULL, "request_too_large",
                          "Request body too large: the limit is %zu bytes.", limit);
}

void
td_openai_err_overloaded(td_openai_err_t *e, unsigned retry_after)
{
    td_openai_err_set(e, 503, SERVER_ERROR, NULL, NULL,
                      "The server is overloaded (no decode capacity); retry after %u s.",
                      retry_after);
    e->retry_after = retry_after;
}

void
td_openai_err_internal(td_openai_err_t *e, const char *what)
{
    td_openai_err_set(e, 500, SERVER_ERROR, NULL, NULL,
                      "The server had an error while processing your request: %s.", what);
}

static json_t *
err_obj(const td_openai_err_t *e)
{
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type",
                     e->type, "param", e->param[0] ? e->param : NULL, "code", e->code);
}

/* Append j as compact JSON (as an SSE event when sse) and drop the reference. */
static td_status_t
json_emit(json_t *j, bool sse, td_buf_t *out)
{
    if (j == NULL)
        return TD_ERR_INVALID;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s == NULL)
        return TD_ERR_NOMEM;
    td_status_t rc = sse ? td_sse_event(out, s, strlen(s)) : td_buf_append(out, s, strlen(s));
    free(s);
    return rc;
}

td_status_t
td_openai_err_json(const td_openai_err_t *e, td_buf_t *out)
{
    return json_emit(err_obj(e), false, out);
}

/* ===================================================================== */
/* Field checks: each fills p->e and returns a failure status, or TD_OK   */
/* ===================================================================== */

typedef struct {
    const td_openai_cfg_t *cfg;
    td_openai_req_t *req;
    td_openai_err_t *e;
    bool has_model, has_body;            /* model; messages or prompt */
    bool has_stream_options;
    int64_t max_tokens, max_completion;  /* 0: not given */
} parse_t;

/* A parameter path such as "messages[2].content[0].text" (cut to fit). */
typedef char td_openai_param_t[sizeof(((td_openai_err_t *)0)->param)];

static void param_fmt(td_openai_param_t pp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
param_fmt(td_openai_param_t pp, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pp, sizeof(td_openai_param_t), fmt, ap);
    va_end(ap);
}

static const char *
json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    case JSON_NULL:    return "null";
    }
    return "an unknown type";
}

static td_status_t
bad_type(parse_t *p, const char *param, const char *expected, const json_t *v)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_type",
                      "Invalid type for '%s': expected %s, but got %s instead.", param,
                      expected, json_type_name(v));
    return TD_ERR_INVALID;
}

static td_status_t
missing(parse_t *p, const char *param)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "missing_required_parameter",
                      "Missing required parameter: '%s'.", param);
    return TD_ERR_INVALID;
}

static td_status_t
unsupported(parse_t *p, const char *param, const char *why)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "unsupported_value",
                      "Unsupported value for '%s': %s", param, why);
    return TD_ERR_UNSUPPORTED;
}

static td_status_t
nomem(parse_t *p)
{
    td_openai_err_internal(p->e, "out of memory");
    return TD_ERR_NOMEM;
}

static td_status_t
get_int(parse_t *p, const char *param, const json_t *v, int64_t min, int64_t max,
        int64_t *out)
{
    if (!json_is_integer(v))
        return bad_type(p, param, "an integer", v);
    int64_t x = json_integer_value(v);
    if (x < min || x > max) {
        bool below = x < min;
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param,
                          below ? "integer_below_min_value" : "integer_above_max_value",
                          "Invalid '%s': integer %s value. Expected a value %s %lld, but got "
                          "%lld instead.", param, below ? "below minimum" : "above maximum",
                          below ? ">=" : "<=", (long long)(below ? min : max), (long long)x);
        return TD_ERR_INVALID;
    }
    *out = x;
    return TD_OK;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static td_status_t
get_number(parse_t *p, const char *param, const json_t *v, double lo, bool lo_open, double hi,
           double *out)
{
    if (!json_is_number(v))
        return bad_type(p, param, "a number", v);
    double x = json_number_value(v);
    bool below = lo_open ? !(x > lo) : !(x >= lo);
    if (below || !(x <= hi)) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param,
                          below ? "decimal_below_min_value" : "decimal_above_max_value",
                          "Invalid '%s': decimal %s value. Expected a value %s %g, but got %g "
                          "instead.", param, below ? "below minimum" : "above maximum",
                          below ? (lo_open ? ">" : ">=") : "<=", below ? lo : hi, x);
        return TD_ERR_INVALID;
    }
    *out = x;
    return TD_OK;
}

static td_status_t
get_bool(parse_t *p, const char *param, const json_t *v, bool *out)
{
    if (!json_is_boolean(v))
        return bad_type(p, param, "a boolean", v);
    *out = json_is_true(v);
    return TD_OK;
}

static td_status_t
get_string(parse_t *p, const char *param, const json_t *v, char **out)
{
    if (!json_is_string(v))
        return bad_type(p, param, "a string", v);
    if ((*out = strdup(json_string_value(v))) == NULL)
        return nomem(p);
    return TD_OK;
}

/* The raw JSON of v, kept for a later stage (the chat encoder). */
static td_status_t
get_raw(parse_t *p, const json_t *v, char **out)
{
    if ((*out = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)) == NULL)
        return nomem(p);
    return TD_OK;
}

static td_status_t
empty_array(parse_t *p, const char *param)
{
    td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "empty_array",
                      "Invalid '%s': empty array. Expected an array with minimum length 1, "
                      "but got an empty array instead.", param);
    return TD_ERR_INVALID;
}

/* ===================================================================== */
/* Messages                                                               */
/* ===================================================================== */

static const char *const role_names[] = {
    [TD_OPENAI_ROLE_SYSTEM] = "system",       [TD_OPENAI_ROLE_USER] = "user",
    [TD_OPENAI_ROLE_ASSISTANT] = "assistant", [TD_OPENAI_ROLE_TOOL] = "tool",
    [TD_OPENAI_ROLE_DEVELOPER] = "developer",
};

const char *
td_openai_role_str(td_openai_role_t role)
{
    return (unsigned)role < sizeof role_names / sizeof role_names[0] ? role_names[role] : "?";
}

/* content given as an array of parts: only text parts, joined with "\n". */
static td_status_t
parse_content_parts(parse_t *p, const char *param, const json_t *parts, char **out)
{
    td_openai_param_t pp;
    td_buf_t text = {0};
    td_status_t rc = TD_OK;
    if (json_array_size(parts) == 0)
        return empty_array(p, param);
    for (size_t j = 0; j < json_array_size(parts); j++) {
        const json_t *part = json_array_get(parts, j);
        param_fmt(pp, "%s[%zu]", param, j);
        if (!json_is_object(part)) {
            rc = bad_type(p, pp, "an object", part);
            goto err_free_text;
        }
        const json_t *type = json_object_get(part, "type");
        const json_t *t = json_object_get(part, "text");
        param_fmt(pp, "%s[%zu].type", param, j);
        if (type == NULL) {
            rc = missing(p, pp);
            goto err_free_text;
        }
        if (!json_is_string(type)) {
            rc = bad_type(p, pp, "a string", type);
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
        param_fmt(pp, "%s[%zu].text", param, j);
        if (t == NULL) {
            rc = missing(p, pp);
            goto err_free_text;
        }
        if (!json_is_string(t)) {
            rc = bad_type(p, pp, "a string", t);
            goto err_free_text;
        }
        if ((j > 0 && td_buf_append(&text, "\n", 1) != TD_OK) ||
            td_buf_append(&text, json_string_value(t), json_string_length(t)) != TD_OK) {
            rc = nomem(p);
            goto err_free_text;
        }
    }
    if ((*out = td_buf_take(&text, NULL)) == NULL)
        return nomem(p);
    return TD_OK;

err_free_text:
    td_buf_free(&text);
    return rc;
}

static td_status_t
parse_role(parse_t *p, const char *param, const json_t *v, td_openai_role_t *out)
{
    if (v == NULL)
        return missing(p, param);
    if (!json_is_string(v))
        return bad_type(p, param, "a string", v);
    for (size_t r = 0; r < sizeof role_names / sizeof role_names[0]; r++)
        if (strcmp(json_string_value(v), role_names[r]) == 0) {
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
parse_message(parse_t *p, size_t i, const json_t *m, td_openai_msg_t *msg)
{
    td_openai_param_t pp;
    td_status_t rc;
    param_fmt(pp, "messages[%zu]", i);
    if (!json_is_object(m))
        return bad_type(p, pp, "an object", m);
    param_fmt(pp, "messages[%zu].role", i);
    if ((rc = parse_role(p, pp, json_object_get(m, "role"), &msg->role)) != TD_OK)
        return rc;

    const json_t *name = json_object_get(m, "name");
    param_fmt(pp, "messages[%zu].name", i);
    if (name && !json_is_null(name) && (rc = get_string(p, pp, name, &msg->name)) != TD_OK)
        return rc;

    const json_t *calls = json_object_get(m, "tool_calls");
    if (msg->role == TD_OPENAI_ROLE_ASSISTANT && calls && !json_is_null(calls)) {
        param_fmt(pp, "messages[%zu].tool_calls", i);
        if (!json_is_array(calls))
            return bad_type(p, pp, "an array", calls);
        if ((rc = get_raw(p, calls, &msg->tool_calls)) != TD_OK)
            return rc;
    }

    if (msg->role == TD_OPENAI_ROLE_TOOL) {
        const json_t *id = json_object_get(m, "tool_call_id");
        param_fmt(pp, "messages[%zu].tool_call_id", i);
        if (id == NULL || json_is_null(id))
            return missing(p, pp);
        if ((rc = get_string(p, pp, id, &msg->tool_call_id)) != TD_OK)
            return rc;
    }

    const json_t *content = json_object_get(m, "content");
    param_fmt(pp, "messages[%zu].content", i);
    if (content == NULL || json_is_null(content)) {
        if (msg->tool_calls == NULL)
            return missing(p, pp);
        if ((msg->content = strdup("")) == NULL)
            return nomem(p);
        return TD_OK;
    }
    if (json_is_array(content))
        return parse_content_parts(p, pp, content, &msg->content);
    if (!json_is_string(content))
        return bad_type(p, pp, "a string or an array of content parts", content);
    return get_string(p, pp, content, &msg->content);
}

/* ===================================================================== */
/* Top-level fields: one table entry each                                 */
/* ===================================================================== */

typedef td_status_t (*field_fn)(parse_t *p, const char *key, const json_t *v);

static td_status_t
field_model(parse_t *p, const char *key, const json_t *v)
{
    p->has_model = true;
    return get_string(p, key, v, &p->req->model);
}

static td_status_t
field_messages(parse_t *p, const char *key, const json_t *v)
{
    td_openai_req_t *r = p->req;
    if (!json_is_array(v))
        return bad_type(p, key, "an array", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return empty_array(p, key);
    if ((r->msgs = calloc(n, sizeof *r->msgs)) == NULL)
        return nomem(p);
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
get_token_ids(parse_t *p, const char *param, const json_t *v)
{
    size_t n = json_array_size(v);
    uint64_t limit = p->cfg->vocab ? p->cfg->vocab : (uint64_t)INT32_MAX + 1;
    int32_t *ids;

    if (n == 0)
        return empty_array(p, param);
    if ((ids = malloc(n * sizeof *ids)) == NULL)
        return nomem(p);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        td_openai_param_t pp;
        param_fmt(pp, "%s[%zu]", param, i);
        if (!json_is_integer(x)) {
            free(ids);
            return bad_type(p, pp, "an integer (a token id)", x);
        }
        json_int_t id = json_integer_value(x);
        if (id < 0 || (uint64_t)id >= limit) {
            free(ids);
            if (p->cfg->vocab)
                td_openai_err_set(p->e, 400, INVALID_REQUEST, pp, "invalid_value",
                                  "Invalid '%s': token id %lld is outside the vocabulary of "
                                  "this model (ids 0 to %u).", pp, (long long)id,
                                  p->cfg->vocab - 1);
            else
                td_openai_err_set(p->e, 400, INVALID_REQUEST, pp, "invalid_value",
                                  "Invalid '%s': token id %lld is not a token id (0 to %d).",
                                  pp, (long long)id, INT32_MAX);
            return TD_ERR_INVALID;
        }
        ids[i] = (int32_t)id;
    }
    p->req->prompt_ids = ids;
    p->req->nprompt_ids = n;
    p->has_body = true;
    return TD_OK;
}

/* A string, an array of one string, an array of token ids, or an array of
 * one array of token ids; more than one prompt (a batch) is refused. */
static td_status_t
field_prompt(parse_t *p, const char *key, const json_t *v)
{
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return empty_array(p, key);
        const json_t *first = json_array_get(v, 0);
        if (json_is_integer(first))
            return get_token_ids(p, key, v);
        if (json_array_size(v) > 1)
            return unsupported(p, key, "batched prompts (more than one prompt in an array) "
                                       "are not supported by this server; send one prompt "
                                       "per request.");
        if (json_is_array(first))
            return get_token_ids(p, "prompt[0]", first);
        if (!json_is_string(first))
            return bad_type(p, "prompt[0]", "a string or an array of token ids", first);
        v = first;
    } else if (!json_is_string(v)) {
        return bad_type(p, key, "a string, an array of one string or an array of token ids",
                        v);
    }
    p->has_body = true;
    return get_string(p, key, v, &p->req->prompt);
}

static td_status_t
field_stream(parse_t *p, const char *key, const json_t *v)
{
    return get_bool(p, key, v, &p->req->stream);
}

static td_status_t
field_stream_options(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_object(v))
        return bad_type(p, key, "an object", v);
    p->has_stream_options = true;
    const json_t *u = json_object_get(v, "include_usage");
    if (u == NULL || json_is_null(u))
        return TD_OK;
    return get_bool(p, "stream_options.include_usage", u, &p->req->include_usage);
}

static td_status_t
field_max_tokens(parse_t *p, const char *key, const json_t *v)
{
    int64_t *dst = strcmp(key, "max_tokens") == 0 ? &p->max_tokens : &p->max_completion;
    return get_int(p, key, v, 1, p->cfg->max_tokens_limit, dst);
}

static td_status_t
field_temperature(parse_t *p, const char *key, const json_t *v)
{
    return get_number(p, key, v, 0, false, 2, &p->req->temperature);
}

static td_status_t
field_top_p(parse_t *p, const char *key, const json_t *v)
{
    return get_number(p, key, v, 0, true, 1, &p->req->top_p);
}

static td_status_t
field_penalty(parse_t *p, const char *key, const json_t *v)
{
    double *dst = strcmp(key, "presence_penalty") == 0 ? &p->req->presence_penalty
                                                       : &p->req->frequency_penalty;
    return get_number(p, key, v, -2, false, 2, dst);
}

static td_status_t
field_seed(parse_t *p, const char *key, const json_t *v)
{
    td_status_t rc = get_int(p, key, v, INT64_MIN, INT64_MAX, &p->req->seed);
    p->req->has_seed = rc == TD_OK;
    return rc;
}

/* An extension (vLLM has one too, ordered the other way): the admission
 * queue serves higher values first. */
static td_status_t
field_priority(parse_t *p, const char *key, const json_t *v)
{
    int64_t prio = 0;
    td_status_t rc = get_int(p, key, v, INT32_MIN, INT32_MAX, &prio);

    p->req->priority = (int32_t)prio;
    return rc;
}

static td_status_t
add_stop(parse_t *p, const char *param, const json_t *s)
{
    td_openai_req_t *r = p->req;
    if (!json_is_string(s))
        return bad_type(p, param, "a string", s);
    size_t cap = p->cfg->max_stop_bytes ? p->cfg->max_stop_bytes : TD_OPENAI_STOP_BYTES;
    if (json_string_length(s) == 0) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "invalid_value",
                          "Invalid '%s': stop sequences must not be empty.", param);
        return TD_ERR_INVALID;
    }
    if (json_string_length(s) > cap) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, param, "string_above_max_length",
                          "Invalid '%s': a stop sequence of %zu bytes; this server takes at "
                          "most %zu bytes per stop sequence (max-stop-bytes).", param,
                          json_string_length(s), cap);
        return TD_ERR_INVALID;
    }
    return get_string(p, param, s, &r->stop[r->nstop++]);
}

static td_status_t
field_stop(parse_t *p, const char *key, const json_t *v)
{
    if (json_is_string(v))
        return add_stop(p, key, v);
    if (!json_is_array(v))
        return bad_type(p, key, "a string or an array of strings", v);
    size_t n = json_array_size(v);
    if (n > TD_OPENAI_MAX_STOP) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "array_above_max_length",
                          "Invalid '%s': array too long. Expected an array with maximum "
                          "length %d, but got an array with length %zu instead.", key,
                          TD_OPENAI_MAX_STOP, n);
        return TD_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        td_openai_param_t pp;
        param_fmt(pp, "stop[%zu]", i);
        td_status_t rc = add_stop(p, pp, json_array_get(v, i));
        if (rc != TD_OK)
            return rc;
    }
    return TD_OK;
}

static td_status_t
field_n(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_integer(v))
        return bad_type(p, key, "an integer", v);
    if (json_integer_value(v) != 1)
        return unsupported(p, key, "only n = 1 is supported by this server (one choice per "
                                   "request); send separate requests instead.");
    return TD_OK;
}

static td_status_t
field_best_of(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_integer(v))
        return bad_type(p, key, "an integer", v);
    if (json_integer_value(v) != 1)
        return unsupported(p, key, "best_of is not supported by this server (only 1).");
    return TD_OK;
}

static td_status_t
field_tools(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_array(v))
        return bad_type(p, key, "an array", v);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_is_object(json_array_get(v, i))) {
            td_openai_param_t pp;
            param_fmt(pp, "tools[%zu]", i);
            return bad_type(p, pp, "an object", json_array_get(v, i));
        }
    return get_raw(p, v, &p->req->tools);
}

static td_status_t
field_tool_choice(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_string(v) && !json_is_object(v))
        return bad_type(p, key, "a string or an object", v);
    return get_raw(p, v, &p->req->tool_choice);
}

/* Fields whose only accepted value is "off": echo, suffix, response_format.
 * Anything that would change the output in a way this server cannot honour
 * is refused, never silently dropped. */

/* chat: a boolean; completions: the number of alternatives, 0..5. */
static td_status_t
field_logprobs(parse_t *p, const char *key, const json_t *v)
{
    int64_t n;
    td_status_t rc;

    if (p->req->kind == TD_OPENAI_CHAT)
        return get_bool(p, key, v, &p->req->logprobs);
    rc = get_int(p, key, v, 0, TD_OPENAI_MAX_COMPLETION_LOGPROBS, &n);
    if (rc == TD_OK) {
        p->req->logprobs = true;
        p->req->top_logprobs = (uint32_t)n;
    }
    return rc;
}

/* chat: 0..20, with logprobs true (checked in parse_finish). */
static td_status_t
field_top_logprobs(parse_t *p, const char *key, const json_t *v)
{
    int64_t n;
    td_status_t rc = get_int(p, key, v, 0, TD_OPENAI_MAX_TOP_LOGPROBS, &n);

    if (rc == TD_OK)
        p->req->top_logprobs = (uint32_t)n;
    return rc;
}

static td_status_t
field_echo(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_boolean(v))
        return bad_type(p, key, "a boolean", v);
    if (json_is_false(v))
        return TD_OK;
    return unsupported(p, key, "echo is not supported by this server.");
}

static td_status_t
field_suffix(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_string(v))
        return bad_type(p, key, "a string", v);
    if (json_string_length(v) == 0)
        return TD_OK;
    return unsupported(p, key, "suffix (insertion) is not supported by this server.");
}

/* {"<token id>": bias in [-100, 100], ...}: ids in the vocabulary, at most
 * TD_OPENAI_MAX_BIAS of them. */
static td_status_t
field_logit_bias(parse_t *p, const char *key, const json_t *v)
{
    td_openai_req_t *r = p->req;
    const char *k;
    const json_t *b;
    size_t n;

    if (!json_is_object(v))
        return bad_type(p, key, "an object", v);
    n = json_object_size(v);
    if (n == 0)
        return TD_OK;
    if (n > TD_OPENAI_MAX_BIAS) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                          "Invalid '%s': %zu tokens, this server takes at most %d.", key, n,
                          TD_OPENAI_MAX_BIAS);
        return TD_ERR_INVALID;
    }
    if ((r->logit_bias = calloc(n, sizeof(*r->logit_bias))) == NULL)
        return nomem(p);
    json_object_foreach((json_t *)v, k, b) {
        td_openai_param_t pp;
        char *end = NULL;
        long long id;
        double x;

        param_fmt(pp, "%s.%s", key, k);
        errno = 0;
        id = k[0] >= '0' && k[0] <= '9' ? strtoll(k, &end, 10) : -1;
        if (id < 0 || end == NULL || *end != '\0' || errno != 0 || id > INT32_MAX) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                              "Invalid key in '%s': '%s' is not a token id.", key, k);
            return TD_ERR_INVALID;
        }
        if (p->cfg->vocab != 0 && (uint64_t)id >= p->cfg->vocab) {
            td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                              "Invalid '%s': token id %lld is outside the vocabulary of this "
                              "model (%u tokens).", key, id, p->cfg->vocab);
            return TD_ERR_INVALID;
        }
        td_status_t rc = get_number(p, pp, b, -100, false, 100, &x);
        if (rc != TD_OK)
            return rc;
        for (size_t i = 0; i < r->nbias; i++)
            if (r->logit_bias[i].token == id) {   /* "7" and "07" */
                td_openai_err_set(p->e, 400, INVALID_REQUEST, key, "invalid_value",
                                  "Invalid '%s': token id %lld is given twice.", key, id);
                return TD_ERR_INVALID;
            }
        r->logit_bias[r->nbias++] = (td_openai_bias_t){ (int32_t)id, (float)x };
    }
    return TD_OK;
}

static td_status_t
field_response_format(parse_t *p, const char *key, const json_t *v)
{
    if (!json_is_object(v))
        return bad_type(p, key, "an object", v);
    const json_t *t = json_object_get(v, "type");
    if (t == NULL)
        return missing(p, "response_format.type");
    if (!json_is_string(t))
        return bad_type(p, "response_format.type", "a string", t);
    if (strcmp(json_string_value(t), "text") == 0)
        return TD_OK;
    return unsupported(p, "response_format.type",
                       "only 'text' is supported by this server (no JSON mode).");
}

/* Type-checked only here: user, metadata, store, service_tier and
 * parallel_tool_calls are accepted for compatibility and not used; thinking
 * and reasoning_effort are read by the V4.1 chat encoding (text/chat.c:
 * values checked there) and have no effect on the byte-level stand-in. */
static td_status_t
field_ignored(parse_t *p, const char *key, const json_t *v)
{
    static const struct { const char *name; json_type type; const char *what; } types[] = {
        { "user", JSON_STRING, "a string" },
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
            return ok ? TD_OK : bad_type(p, key, types[i].what, v);
        }
    return TD_ERR_INTERNAL;
}

#define CHAT (1u << TD_OPENAI_CHAT)
#define COMP (1u << TD_OPENAI_COMPLETION)

typedef struct {
    const char *name;
    unsigned kinds;   /* CHAT, COMP or both */
    field_fn fn;
    bool required;    /* null counts as missing; for the others null is the default */
} td_openai_field_t;

static const td_openai_field_t fields[] = {
    { "model",                 CHAT | COMP, field_model, true },
    { "messages",              CHAT,        field_messages, true },
    { "prompt",                COMP,        field_prompt, true },
    { "stream",                CHAT | COMP, field_stream, false },
    { "stream_options",        CHAT | COMP, field_stream_options, false },
    { "max_tokens",            CHAT | COMP, field_max_tokens, false },
    { "max_completion_tokens", CHAT,        field_max_tokens, false },
    { "temperature",           CHAT | COMP, field_temperature, false },
    { "top_p",                 CHAT | COMP, field_top_p, false },
    { "seed",                  CHAT | COMP, field_seed, false },
    { "priority",              CHAT | COMP, field_priority, false },
    { "stop",                  CHAT | COMP, field_stop, false },
    { "n",                     CHAT | COMP, field_n, false },
    { "presence_penalty",      CHAT | COMP, field_penalty, false },
    { "frequency_penalty",     CHAT | COMP, field_penalty, false },
    { "tools",                 CHAT,        field_tools, false },
    { "tool_choice",           CHAT,        field_tool_choice, false },
    { "logprobs",              CHAT | COMP, field_logprobs, false },
    { "top_logprobs",          CHAT,        field_top_logprobs, false },
    { "logit_bias",            CHAT | COMP, field_logit_bias, false },
    { "response_format",       CHAT,        field_response_format, false },
    { "echo",                  COMP,        field_echo, false },
    { "suffix",                COMP,        field_suffix, false },
    { "best_of",               COMP,        field_best_of, false },
    { "user",                  CHAT | COMP, field_ignored, false },
    { "metadata",              CHAT,        field_ignored, false },
    { "store",                 CHAT,        field_ignored, false },
    { "service_tier",          CHAT,        field_ignored, false },
    { "parallel_tool_calls",   CHAT,        field_ignored, false },
    { "thinking",              CHAT,        field_ignored, false },
    { "reasoning_effort",      CHAT,        field_ignored, false },
};

static const td_openai_field_t *
field_find(td_openai_kind_t kind, const char *name)
{
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if ((fields[i].kinds & (1u << kind)) && strcmp(fields[i].name, name) == 0)
            return &fields[i];
    return NULL;
}

/* ===================================================================== */
/* Parsing                                                                */
/* ===================================================================== */

/* Checks that involve more than one field, after every field was read. */
static td_status_t
parse_finish(parse_t *p)
{
    td_openai_req_t *r = p->req;
    if (!p->has_model)
        return missing(p, "model");
    if (!p->has_body)
        return missing(p, r->kind == TD_OPENAI_CHAT ? "messages" : "prompt");
    if (p->has_stream_options && !r->stream) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "stream_options", "invalid_value",
                          "The 'stream_options' parameter is only allowed when 'stream' is "
                          "enabled.");
        return TD_ERR_INVALID;
    }
    if (r->kind == TD_OPENAI_CHAT && r->top_logprobs > 0 && !r->logprobs) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "top_logprobs", "invalid_value",
                          "Invalid 'top_logprobs': it needs 'logprobs' set to true.");
        return TD_ERR_INVALID;
    }
    if (p->max_tokens && p->max_completion && p->max_tokens != p->max_completion) {
        td_openai_err_set(p->e, 400, INVALID_REQUEST, "max_tokens", "invalid_value",
                          "'max_tokens' (%lld) and 'max_completion_tokens' (%lld) disagree; "
                          "send one of them.", (long long)p->max_tokens,
                          (long long)p->max_completion);
        return TD_ERR_INVALID;
    }
    r->max_tokens = p->max_completion ? (uint32_t)p->max_completion
                  : p->max_tokens     ? (uint32_t)p->max_tokens
                                      : p->cfg->max_tokens_default;
    if (r->max_tokens > p->cfg->max_tokens_limit)
        r->max_tokens = p->cfg->max_tokens_limit;
    for (const char *const *m = p->cfg->models; m && *m; m++)
        if (strcmp(*m, r->model) == 0)
            return TD_OK;
    td_openai_err_set(p->e, 404, INVALID_REQUEST, NULL, "model_not_found",
                      "The model `%s` does not exist or you do not have access to it.",
                      r->model);
    return TD_ERR_NOT_FOUND;
}

td_status_t
td_openai_req_parse(const td_openai_cfg_t *cfg, td_openai_kind_t kind, const char *body,
                    size_t len, td_openai_req_t **out, td_openai_err_t *e)
{
    td_status_t rc;
    if (len > cfg->max_body) {
        td_openai_err_too_big(e, len, cfg->max_body);
        return TD_ERR_TOO_BIG;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
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
                          json_type_name(root));
        rc = TD_ERR_INVALID;
        goto out_decref;
    }
    td_openai_req_t *req = calloc(1, sizeof *req);
    if (req == NULL) {
        td_openai_err_internal(e, "out of memory");
        rc = TD_ERR_NOMEM;
        goto out_decref;
    }
    req->kind = kind;
    req->temperature = 1;
    req->top_p = 1;
    parse_t p = { .cfg = cfg, .req = req, .e = e };

    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        const td_openai_field_t *f = field_find(kind, key);
        if (f == NULL) {
            td_openai_err_set(e, 400, INVALID_REQUEST, NULL, NULL,
                              "Unrecognized request argument supplied: %s", key);
            rc = TD_ERR_INVALID;
            goto err_destroy_req;
        }
        if (json_is_null(v) && !f->required)
            continue; /* null: the default, as OpenAI treats it */
        rc = json_is_null(v) ? missing(&p, key) : f->fn(&p, key, v);
        if (rc != TD_OK)
            goto err_destroy_req;
    }
    if ((rc = parse_finish(&p)) != TD_OK)
        goto err_destroy_req;
    req->body = root;   /* the reference moves to req */
    *out = req;
    return TD_OK;

err_destroy_req:
    td_openai_req_destroy(req);
out_decref:
    json_decref(root);
    return rc;
}

void
td_openai_req_destroy(td_openai_req_t *req)
{
    if (req == NULL)
        return;
    for (size_t i = 0; i < req->nmsgs; i++) {
        free(req->msgs[i].content);
        free(req->msgs[i].name);
        free(req->msgs[i].tool_call_id);
        free(req->msgs[i].tool_calls);
    }
    free(req->msgs);
    for (size_t i = 0; i < req->nstop; i++)
        free(req->stop[i]);
    free(req->logit_bias);
    free(req->model);
    free(req->prompt);
    free(req->prompt_ids);
    free(req->tools);
    free(req->tool_choice);
    json_decref(req->body);
    free(req);
}

/* ===================================================================== */
/* Log-probabilities                                                      */
/* ===================================================================== */

struct td_openai_logprobs {
    td_openai_kind_t kind;
    json_t *content;            /* chat: entries not sent yet */
    json_t *tokens, *token_logprobs, *top_logprobs, *text_offset;   /* completions: same */
    size_t n;                   /* entries not sent yet */
    uint64_t offset;            /* completions: characters of every token so far */
};

/* Fresh (empty) pending lists. */
static td_status_t
logprobs_reset(td_openai_logprobs_t *l)
{
    l->n = 0;
    if (l->kind == TD_OPENAI_CHAT) {
        l->content = json_array();
        return l->content ? TD_OK : TD_ERR_NOMEM;
    }
    l->tokens = json_array();
    l->token_logprobs = json_array();
    l->top_logprobs = json_array();
    l->text_offset = json_array();
    return l->tokens && l->token_logprobs && l->top_logprobs && l->text_offset ? TD_OK
                                                                                : TD_ERR_NOMEM;
}

static void
logprobs_drop(td_openai_logprobs_t *l)
{
    json_decref(l->content);
    json_decref(l->tokens);
    json_decref(l->token_logprobs);
    json_decref(l->top_logprobs);
    json_decref(l->text_offset);
    l->content = l->tokens = l->token_logprobs = l->top_logprobs = l->text_offset = NULL;
}

td_status_t
td_openai_logprobs_create(td_openai_kind_t kind, td_openai_logprobs_t **out)
{
    td_openai_logprobs_t *l = calloc(1, sizeof(*l));

    if (l == NULL)
        return TD_ERR_NOMEM;
    l->kind = kind;
    if (logprobs_reset(l) != TD_OK) {
        td_openai_logprobs_destroy(l);
        return TD_ERR_NOMEM;
    }
    *out = l;
    return TD_OK;
}

void
td_openai_logprobs_destroy(td_openai_logprobs_t *l)
{
    if (l == NULL)
        return;
    logprobs_drop(l);
    free(l);
}

/* A token's spelling as JSON text: valid UTF-8 kept, the rest U+FFFD. */
static json_t *
lp_text(const td_openai_token_lp_t *t, size_t *chars)
{
    td_detok_t st = {0};
    size_t cap = TD_DETOK_OUT_MAX(t->len) + 3, n;
    char small[512], *buf = cap <= sizeof(small) ? small : malloc(cap);
    json_t *j;

    if (buf == NULL)
        return NULL;
    n = td_detok_bytes(&st, t->text, t->len, buf);
    n += td_detok_flush(&st, buf + n);
    j = json_stringn(buf, n);
    *chars = 0;
    for (size_t i = 0; i < n; i++)
        *chars += ((unsigned char)buf[i] & 0xC0) != 0x80;
    if (buf != small)
        free(buf);
    return j;
}

static json_t *
lp_bytes(const td_openai_token_lp_t *t)
{
    json_t *a = json_array();

    for (size_t i = 0; a != NULL && i < t->len; i++)
        if (json_array_append_new(a, json_integer((unsigned char)t->text[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

/* -inf as OpenAI shows it. */
static json_t *
lp_value(double x)
{
    return json_real(isfinite(x) ? x : -9999.0);
}

/* chat: {"token","logprob","bytes"} (and "top_logprobs" when top != NULL). */
static json_t *
lp_chat_entry(const td_openai_token_lp_t *t, const td_openai_token_lp_t *top, size_t ntop,
              bool with_top)
{
    size_t chars;
    json_t *e = json_object(), *alts = with_top ? json_array() : NULL;
    int bad = e == NULL || (with_top && alts == NULL);

    bad |= json_object_set_new(e, "token", lp_text(t, &chars));
    bad |= json_object_set_new(e, "logprob", lp_value(t->logprob));
    bad |= json_object_set_new(e, "bytes", lp_bytes(t));
    for (size_t i = 0; !bad && i < ntop; i++)
        bad |= json_array_append_new(alts, lp_chat_entry(&top[i], NULL, 0, false));
    if (with_top)
        bad |= json_object_set_new(e, "top_logprobs", alts);
    if (bad) {
        json_decref(e);
        return NULL;
    }
    return e;
}

td_status_t
td_openai_logprobs_add(td_openai_logprobs_t *l, const td_openai_token_lp_t *tok,
                       const td_openai_token_lp_t *top, size_t ntop)
{
    int bad = 0;

    if (l->kind == TD_OPENAI_CHAT) {
        bad = json_array_append_new(l->content, lp_chat_entry(tok, top, ntop, true));
    } else {
        size_t chars, c2;
        json_t *alts = json_object();
        bad |= alts == NULL;
        for (size_t i = 0; !bad && i < ntop; i++) {
            json_t *k = lp_text(&top[i], &c2);
            bad |= k == NULL;
            if (!bad && json_object_get(alts, json_string_value(k)) == NULL)   /* first wins */
                bad |= json_object_set_new(alts, json_string_value(k), lp_value(top[i].logprob));
            json_decref(k);
        }
        bad |= json_array_append_new(l->tokens, lp_text(tok, &chars));
        bad |= json_array_append_new(l->token_logprobs, lp_value(tok->logprob));
        bad |= json_array_append_new(l->top_logprobs, alts);
        bad |= json_array_append_new(l->text_offset, json_integer((json_int_t)l->offset));
        if (!bad)
            l->offset += chars;
    }
    if (bad)
        return TD_ERR_NOMEM;
    l->n++;
    return TD_OK;
}

/* The "logprobs" value of the next choice: the entries not sent yet (then
 * forgotten), or null (none, or the request asked for none). */
static json_t *
logprobs_take(td_openai_logprobs_t *l)
{
    json_t *j;

    if (l == NULL || l->n == 0)
        return json_null();
    if (l->kind == TD_OPENAI_CHAT)
        j = json_pack("{s:O, s:n}", "content", l->content, "refusal");
    else
        j = json_pack("{s:O, s:O, s:O, s:O}", "tokens", l->tokens, "token_logprobs",
                      l->token_logprobs, "top_logprobs", l->top_logprobs, "text_offset",
                      l->text_offset);
    if (j == NULL)
        return NULL;
    logprobs_drop(l);
    if (logprobs_reset(l) != TD_OK) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* ===================================================================== */
/* Responses and streams                                                  */
/* ===================================================================== */

td_status_t
td_openai_id_new(td_openai_kind_t kind, char buf[TD_OPENAI_ID_LEN])
{
    unsigned char rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return TD_ERR_IO;
    int n = snprintf(buf, TD_OPENAI_ID_LEN, "%s-",
                     kind == TD_OPENAI_CHAT ? "chatcmpl" : "cmpl");
    for (size_t i = 0; i < sizeof rnd; i++)
        n += snprintf(buf + n, TD_OPENAI_ID_LEN - (size_t)n, "%02x", rnd[i]);
    return TD_OK;
}

static const char *
finish_str(td_openai_finish_t f)
{
    switch (f) {
    case TD_OPENAI_FINISH_STOP:   return "stop";
    case TD_OPENAI_FINISH_LENGTH: return "length";
    case TD_OPENAI_FINISH_TOOL_CALLS: return "tool_calls";
    case TD_OPENAI_FINISH_NONE:   break;
    }
    return NULL;
}

static json_t *
usage_obj(const td_openai_usage_t *u)
{
    json_t *o = json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                          "completion_tokens", (json_int_t)u->completion_tokens, "total_tokens",
                          (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens);

    if (o && u->cached_tokens > 0)   /* served from a prefix cache (docs/kvrouting.md) */
        (void)json_object_set_new(o, "prompt_tokens_details",
                                  json_pack("{s:I}", "cached_tokens",
                                            (json_int_t)u->cached_tokens));
    return o;
}

/* The fields every response object starts with. */
static json_t *
base_obj(const td_openai_meta_t *m, bool chunk)
{
    const char *object = m->kind == TD_OPENAI_COMPLETION ? "text_completion"
                       : chunk                           ? "chat.completion.chunk"
                                                         : "chat.completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:s?}", "id", m->id, "object", object, "created",
                     (json_int_t)m->created, "model", m->model, "system_fingerprint",
                     m->fingerprint);
}

/* The single choice of a response or chunk. text NULL: no content (a chat
 * chunk without delta.content; "" for completions). with_role: chat delta.role.
 * Its logprobs: what lp has not sent yet (lp NULL: null). */
static json_t *
choice_obj(td_openai_kind_t kind, bool chunk, bool with_role, const char *text, size_t len,
           td_openai_finish_t finish, td_openai_logprobs_t *lp)
{
    json_t *c = json_pack("{s:i, s:o?, s:s?}", "index", 0, "logprobs", logprobs_take(lp),
                          "finish_reason", finish_str(finish));
    if (c == NULL)
        return NULL;
    json_t *t = text ? json_stringn(text, len) : kind == TD_OPENAI_COMPLETION ? json_string("")
                                                                             : NULL;
    int bad = text != NULL && t == NULL;
    if (kind == TD_OPENAI_COMPLETION) {
        bad |= json_object_set_new(c, "text", t);
    } else {
        json_t *msg = json_object();
        bad |= msg == NULL;
        if (with_role || !chunk)
            bad |= json_object_set_new(msg, "role", json_string("assistant"));
        if (t)
            bad |= json_object_set_new(msg, "content", t);
        else if (!chunk)
            bad |= json_object_set_new(msg, "content", json_string(""));
        bad |= json_object_set_new(c, chunk ? "delta" : "message", msg);
    }
    if (bad) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* A response object: base + choices (choice, or [] when NULL) + usage
 * (omitted when usage_mode is 0, null when 1, the object when 2). */
static json_t *
response_obj(const td_openai_meta_t *m, bool chunk, json_t *choice, int usage_mode,
             const td_openai_usage_t *u)
{
    json_t *o = base_obj(m, chunk);
    json_t *choices = json_array();
    int bad = o == NULL || choices == NULL;
    if (choice)
        bad |= json_array_append_new(choices, choice);
    bad |= json_object_set_new(o, "choices", choices);
    if (usage_mode == 1)
        bad |= json_object_set_new(o, "usage", json_null());
    else if (usage_mode == 2)
        bad |= json_object_set_new(o, "usage", usage_obj(u));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

td_status_t
td_openai_response_json(const td_openai_meta_t *m, const char *text, size_t len,
                        td_openai_finish_t finish, const td_openai_usage_t *usage,
                        td_buf_t *out)
{
    json_t *c = choice_obj(m->kind, false, true, text, len, finish, m->logprobs);
    if (c == NULL)
        return TD_ERR_INVALID;
    return json_emit(response_obj(m, false, c, 2, usage), false, out);
}

td_status_t
td_openai_stream_text(td_openai_stream_t *s, const char *text, size_t len, td_buf_t *out)
{
    bool with_role = s->meta.kind == TD_OPENAI_CHAT && !s->role_sent;
    json_t *c = choice_obj(s->meta.kind, true, with_role, text ? text : "", len,
                           TD_OPENAI_FINISH_NONE, s->meta.logprobs);
    if (c == NULL)
        return TD_ERR_INVALID;
    td_status_t rc = json_emit(response_obj(&s->meta, true, c, s->include_usage, NULL), true,
                               out);
    if (rc == TD_OK && with_role)
        s->role_sent = true;
    return rc;
}

/* A choice around a delta (chunk) or message object, which it takes over;
 * its logprobs as choice_obj's. */
static json_t *
choice_with(json_t *obj, bool chunk, td_openai_finish_t finish, td_openai_logprobs_t *lp)
{
    json_t *c = json_pack("{s:i, s:o?, s:s?}", "index", 0, "logprobs", logprobs_take(lp),
                          "finish_reason", finish_str(finish));
    if (c == NULL || obj == NULL || json_object_set_new(c, chunk ? "delta" : "message", obj)) {
        json_decref(c);
        return NULL;
    }
    return c;
}

td_status_t
td_openai_stream_delta(td_openai_stream_t *s, json_t *delta, td_buf_t *out)
{
    bool with_role = !s->role_sent;
    if (delta && with_role && json_object_set_new(delta, "role", json_string("assistant"))) {
        json_decref(delta);
        return TD_ERR_NOMEM;
    }
    json_t *c = choice_with(delta, true, TD_OPENAI_FINISH_NONE, s->meta.logprobs);
    if (c == NULL)
        return TD_ERR_NOMEM;
    td_status_t rc = json_emit(response_obj(&s->meta, true, c, s->include_usage, NULL), true,
                               out);
    if (rc == TD_OK)
        s->role_sent = true;
    return rc;
}

td_status_t
td_openai_response_message_json(const td_openai_meta_t *m, json_t *message,
                                td_openai_finish_t finish, const td_openai_usage_t *usage,
                                td_buf_t *out)
{
    json_t *c = choice_with(message, false, finish, m->logprobs);
    if (c == NULL)
        return TD_ERR_NOMEM;
    return json_emit(response_obj(m, false, c, 2, usage), false, out);
}

td_status_t
td_openai_stream_finish(td_openai_stream_t *s, td_openai_finish_t finish,
                        const td_openai_usage_t *usage, td_buf_t *out)
{
    size_t start = out->len;
    bool with_role = s->meta.kind == TD_OPENAI_CHAT && !s->role_sent;
    td_status_t rc;
    if (s->include_usage && usage == NULL)
        return TD_ERR_INVALID;
    json_t *c = choice_obj(s->meta.kind, true, with_role, NULL, 0, finish, s->meta.logprobs);
    if (c == NULL)
        return TD_ERR_NOMEM;
    if ((rc = json_emit(response_obj(&s->meta, true, c, s->include_usage, NULL), true, out)) !=
        TD_OK)
        goto err_truncate;
    if (s->include_usage &&
        (rc = json_emit(response_obj(&s->meta, true, NULL, 2, usage), true, out)) != TD_OK)
        goto err_truncate;
    if ((rc = td_sse_done(out)) != TD_OK)
        goto err_truncate;
    s->role_sent = true;
    return TD_OK;

err_truncate:
    td_buf_truncate(out, start);
    return rc;
}

td_status_t
td_openai_stream_error(const td_openai_err_t *e, td_buf_t *out)
{
    size_t start = out->len;
    td_status_t rc = json_emit(err_obj(e), true, out);
    if (rc == TD_OK && (rc = td_sse_done(out)) != TD_OK)
        td_buf_truncate(out, start);
    return rc;
}

/* ===================================================================== */
/* Models                                                                 */
/* ===================================================================== */

td_status_t
td_openai_models_json(const td_openai_model_t *models, size_t n, td_buf_t *out)
{
    json_t *data = json_array();
    json_t *list = json_pack("{s:s, s:o}", "object", "list", "data", data);
    if (list == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const td_openai_model_t *m = &models[i];
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s?, s:s?}", "id", m->id, "object",
                              "model", "created", (json_int_t)m->created, "owned_by",
                              "tandem", "engine", m->engine, "tokenizer", m->tokenizer);
        if (o == NULL || json_array_append_new(data, o) != 0) {
            json_decref(list);
            return TD_ERR_NOMEM;
        }
    }
    return json_emit(list, false, out);
}
