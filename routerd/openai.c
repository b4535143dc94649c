/* routerd/openai.c — the OpenAI protocols' JSON: errors, log-probabilities,
 * responses and stream chunks (one choice each or several), models. The
 * requests are parsed into the one request model by adapt-openai.c. */
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
/* Roles                                                                  */
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
    static const char *const prefix[] = {
        [TD_OPENAI_CHAT] = "chatcmpl-", [TD_OPENAI_COMPLETION] = "cmpl-",
        [TD_OPENAI_MESSAGES] = "msg_", [TD_OPENAI_RESPONSES] = "resp_",
    };
    int n = snprintf(buf, TD_OPENAI_ID_LEN, "%s", prefix[kind]);
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

/* A choice of a response or chunk, index-th of the request's. text NULL: no
 * content (a chat chunk without delta.content; "" for completions).
 * with_role: chat delta.role. Its logprobs: what lp has not sent yet (lp
 * NULL: null). */
static json_t *
choice_obj(td_openai_kind_t kind, uint32_t index, bool chunk, bool with_role, const char *text,
           size_t len, td_openai_finish_t finish, td_openai_logprobs_t *lp)
{
    json_t *c = json_pack("{s:I, s:o?, s:s?}", "index", (json_int_t)index, "logprobs",
                          logprobs_take(lp), "finish_reason", finish_str(finish));
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

/* A response object: base + choices (n of them, consumed) + usage
 * (omitted when usage_mode is 0, null when 1, the object when 2). */
static json_t *
response_obj(const td_openai_meta_t *m, bool chunk, json_t *const *choice, size_t n,
             int usage_mode, const td_openai_usage_t *u)
{
    json_t *o = base_obj(m, chunk);
    json_t *choices = json_array();
    int bad = o == NULL || choices == NULL;
    for (size_t i = 0; i < n; i++)
        bad |= choice[i] == NULL || json_array_append_new(choices, choice[i]);
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

json_t *
td_openai_choice_text(td_openai_kind_t kind, uint32_t index, const char *text, size_t len,
                      td_openai_finish_t finish, td_openai_logprobs_t *lp)
{
    return choice_obj(kind, index, false, true, text, len, finish, lp);
}

/* A choice around a delta (chunk) or message object, which it takes over;
 * its logprobs as choice_obj's. */
static json_t *
choice_with(uint32_t index, json_t *obj, bool chunk, td_openai_finish_t finish,
            td_openai_logprobs_t *lp)
{
    json_t *c = json_pack("{s:I, s:o?, s:s?}", "index", (json_int_t)index, "logprobs",
                          logprobs_take(lp), "finish_reason", finish_str(finish));
    if (c == NULL || obj == NULL || json_object_set_new(c, chunk ? "delta" : "message", obj)) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *
td_openai_choice_message(uint32_t index, json_t *message, td_openai_finish_t finish,
                         td_openai_logprobs_t *lp)
{
    return choice_with(index, message, false, finish, lp);
}

td_status_t
td_openai_response_json(const td_openai_meta_t *m, json_t *const *choices, size_t n,
                        const td_openai_usage_t *usage, td_buf_t *out)
{
    for (size_t i = 0; i < n; i++)
        if (choices[i] == NULL) {
            for (size_t j = 0; j < n; j++)
                json_decref(choices[j]);
            return TD_ERR_INVALID;
        }
    return json_emit(response_obj(m, false, choices, n, 2, usage), false, out);
}

static bool
role_pending(const td_openai_stream_t *s, uint32_t index)
{
    return s->meta.kind == TD_OPENAI_CHAT && index < 64 && !(s->role_sent >> index & 1);
}

/* One chunk of the stream with choice c (consumed). */
static td_status_t
stream_chunk(td_openai_stream_t *s, uint32_t index, bool with_role, json_t *c, td_buf_t *out)
{
    td_status_t rc;

    if (c == NULL)
        return TD_ERR_NOMEM;
    rc = json_emit(response_obj(&s->meta, true, &c, 1, s->include_usage, NULL), true, out);
    if (rc == TD_OK && with_role)
        s->role_sent |= 1ull << index;
    return rc;
}

td_status_t
td_openai_stream_text(td_openai_stream_t *s, uint32_t index, td_openai_logprobs_t *lp,
                      const char *text, size_t len, td_buf_t *out)
{
    bool with_role = role_pending(s, index);

    return stream_chunk(s, index, with_role,
                        choice_obj(s->meta.kind, index, true, with_role, text ? text : "", len,
                                   TD_OPENAI_FINISH_NONE, lp), out);
}

td_status_t
td_openai_stream_delta(td_openai_stream_t *s, uint32_t index, td_openai_logprobs_t *lp,
                       json_t *delta, td_buf_t *out)
{
    bool with_role = role_pending(s, index);

    if (delta && with_role && json_object_set_new(delta, "role", json_string("assistant"))) {
        json_decref(delta);
        return TD_ERR_NOMEM;
    }
    return stream_chunk(s, index, with_role,
                        choice_with(index, delta, true, TD_OPENAI_FINISH_NONE, lp), out);
}

td_status_t
td_openai_stream_choice_end(td_openai_stream_t *s, uint32_t index, td_openai_logprobs_t *lp,
                            td_openai_finish_t finish, td_buf_t *out)
{
    bool with_role = role_pending(s, index);

    return stream_chunk(s, index, with_role,
                        choice_obj(s->meta.kind, index, true, with_role, NULL, 0, finish, lp),
                        out);
}

td_status_t
td_openai_stream_end(td_openai_stream_t *s, const td_openai_usage_t *usage, td_buf_t *out)
{
    size_t start = out->len;
    td_status_t rc = TD_OK;

    if (s->include_usage && usage == NULL)
        return TD_ERR_INVALID;
    if (s->include_usage)
        rc = json_emit(response_obj(&s->meta, true, NULL, 0, 2, usage), true, out);
    if (rc == TD_OK)
        rc = td_sse_done(out);
    if (rc != TD_OK)
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
