/* text/chat.c — DeepSeek-V4.1 chat format: OpenAI-style requests checked and
 * rendered into the prompt text (with the byte ranges of its special tokens),
 * and the streaming reader of the model's output (reasoning, content, DSML
 * tool calls). The format itself is described in docs/chat.md. */
#include "chat.h"
#include "tokenizer.h"

#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- Growable byte buffer ---------------------------------------------- */

/* Always NUL-terminated once anything was added; a failed allocation sets
 * oom and later adds do nothing, so callers check once at the end. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} chat_buf_t;

static void
buf_reserve(chat_buf_t *b, size_t extra)
{
    if (b->oom)
        return;
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void
buf_add(chat_buf_t *b, const void *s, size_t n)
{
    buf_reserve(b, n);
    if (b->oom)
        return;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void
buf_adds(chat_buf_t *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

static void
buf_addc(chat_buf_t *b, char c)
{
    buf_add(b, &c, 1);
}

static void buf_addf(chat_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
buf_addf(chat_buf_t *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;

    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->oom = true;   /* only used for short numbers */
        return;
    }
    buf_add(b, tmp, (size_t)n);
}

/* Make sure p is a (possibly empty) NUL-terminated string. */
static void
buf_terminate(chat_buf_t *b)
{
    buf_add(b, "", 0);
}

static void
buf_free(chat_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

static char *
chat_strndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* ---- JSON text ----------------------------------------------------------
 * Two writers: a string escaper (the tool-call arguments the reader builds,
 * and strings inside dumped values), and a dumper of jansson values in the
 * layout the prompt uses for tool schemas and non-string arguments: ", " and
 * ": " separators, non-ASCII kept as is, numbers the way Python prints them. */

static void
json_escape(chat_buf_t *b, const char *s, size_t n)
{
    size_t run = 0;   /* start of the bytes copied unchanged */

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];

        switch (c) {
        case '"':  esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof(u), "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            buf_add(b, s + run, i - run);
            buf_adds(b, esc);
            run = i + 1;
        }
    }
    buf_add(b, s + run, n - run);
}

static void
json_quote(chat_buf_t *b, const char *s, size_t n)
{
    buf_addc(b, '"');
    json_escape(b, s, n);
    buf_addc(b, '"');
}

/* A double as Python's repr() writes it: the shortest digits that read back
 * to the same value; exponent form when the decimal exponent is < -4 or
 * >= 16 ("1e-07", "1e+26"), otherwise fixed with at least one decimal
 * ("100000.0", "0.0001"). JSON has no NaN or infinity. */
static void
py_float(chat_buf_t *b, double x)
{
    char tmp[48];
    int prec;

    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    if (prec > 17)
        snprintf(tmp, sizeof(tmp), "%.16e", x);

    /* tmp: [-]d[.ddd]e(+|-)xx */
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg)
        q++;
    char digits[24];
    size_t nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < sizeof(digits) - 1)
            digits[nd++] = *q;
    int exp10 = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int decpt = exp10 + 1;   /* value = 0.DIGITS x 10^decpt */

    if (neg)
        buf_addc(b, '-');
    if (decpt <= -4 || decpt > 16) {
        buf_addc(b, digits[0]);
        if (nd > 1) {
            buf_addc(b, '.');
            buf_add(b, digits + 1, nd - 1);
        }
        buf_addf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        buf_adds(b, "0.");
        for (int i = 0; i < -decpt; i++)
            buf_addc(b, '0');
        buf_add(b, digits, nd);
    } else if ((size_t)decpt < nd) {
        buf_add(b, digits, (size_t)decpt);
        buf_addc(b, '.');
        buf_add(b, digits + decpt, nd - (size_t)decpt);
    } else {
        buf_add(b, digits, nd);
        for (size_t i = nd; i < (size_t)decpt; i++)
            buf_addc(b, '0');
        buf_adds(b, ".0");
    }
}

static void
py_dump(chat_buf_t *b, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        bool first = true;

        buf_addc(b, '{');
        json_object_foreach((json_t *)v, key, val) {
            if (!first)
                buf_adds(b, ", ");
            first = false;
            json_quote(b, key, strlen(key));
            buf_adds(b, ": ");
            py_dump(b, val);
        }
        buf_addc(b, '}');
        break;
    }
    case JSON_ARRAY:
        buf_addc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                buf_adds(b, ", ");
            py_dump(b, json_array_get(v, i));
        }
        buf_addc(b, ']');
        break;
    case JSON_STRING:
        json_quote(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        buf_addf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        py_float(b, json_real_value(v));
        break;
    case JSON_TRUE:
        buf_adds(b, "true");
        break;
    case JSON_FALSE:
        buf_adds(b, "false");
        break;
    case JSON_NULL:
        buf_adds(b, "null");
        break;
    }
}

/* ---- Refusals ---------------------------------------------------------- */

/* Cut a string cut short by snprintf back to a whole UTF-8 character. */
static void
utf8_trim(char *s)
{
    size_t n = strlen(s);
    size_t i = n;

    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0)
        return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (n - (i - 1) < need)
        s[i - 1] = '\0';
}

static td_status_t chat_refuse(td_chat_err_t *err, td_status_t st, const char *param,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Fill err (may be NULL) and return st. Refusals are the client's doing:
 * they are logged at debug level only. */
static td_status_t
chat_refuse(td_chat_err_t *err, td_status_t st, const char *param, const char *fmt, ...)
{
    td_chat_err_t local;
    td_chat_err_t *e = err ? err : &local;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    utf8_trim(e->message);
    utf8_trim(e->param);
    e->code = st == TD_ERR_UNSUPPORTED ? "unsupported_value" : NULL;
    td_debug("chat: request refused (%s): %s", e->param[0] ? e->param : "-", e->message);
    return st;
}

td_status_t
td_chat_err_json(const td_chat_err_t *e, char **out)
{
    json_t *inner = json_pack("{s:s, s:s, s:o, s:o}", "message", e->message,
                              "type", "invalid_request_error",
                              "param", e->param[0] ? json_string(e->param) : json_null(),
                              "code", e->code ? json_string(e->code) : json_null());
    if (inner == NULL)
        return TD_ERR_NOMEM;
    json_t *root = json_pack("{s:o}", "error", inner);
    if (root == NULL)
        return TD_ERR_NOMEM;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (s == NULL)
        return TD_ERR_NOMEM;
    *out = s;
    return TD_OK;
}

/* ---- Special tokens and fixed prompt text ------------------------------ */

#define TOK_BOS       "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define TOK_EOS       "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define TOK_SYSTEM    "<\xef\xbd\x9cSystem\xef\xbd\x9c>"
#define TOK_USER      "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define TOK_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define TOK_REMINDER  "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define TOK_THINK     "<think>"
#define TOK_UNTHINK   "</think>"
#define TOK_DSML      "\xef\xbd\x9c" "DSML\xef\xbd\x9c"   /* U+FF5C DSML U+FF5C */

static const char *const chat_format_tokens[] = {
    TOK_BOS, TOK_EOS, TOK_SYSTEM, TOK_USER, TOK_ASSISTANT, TOK_REMINDER,
    TOK_THINK, TOK_UNTHINK, TOK_DSML,
};

const char *const *
td_chat_special_tokens(size_t *n)
{
    *n = sizeof chat_format_tokens / sizeof chat_format_tokens[0];
    return chat_format_tokens;
}

/* The spellings that count as special tokens inside the fixed texts below. */
static const char *const chat_template_specials[] = { TOK_DSML, TOK_THINK, TOK_UNTHINK };

#define EFFORT_LINE "Reasoning Effort: %u (range 1-100, the higher the value, the more " \
                    "thorough the reasoning)\n\n"

static const char chat_tools_head[] =
    "\n\n## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke "
    "tools by writing a \"<" TOK_DSML " calls>\" block like the following:\n"
    "\n"
    "<" TOK_DSML " calls>\n"
    "<" TOK_DSML " invoke name=\"$TOOL_NAME\">\n"
    "<" TOK_DSML " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</" TOK_DSML " parameter>\n"
    "...\n"
    "</" TOK_DSML " invoke>\n"
    "<" TOK_DSML " invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" TOK_DSML " invoke>\n"
    "</" TOK_DSML " calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
    "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";

static const char chat_tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
    "invoke tool calls.\n";

/* ---- Requests: checking and the conversation --------------------------- */

typedef enum {
    ROLE_SYSTEM,
    ROLE_USER,
    ROLE_ASSISTANT,
    ROLE_TOOL,
    ROLE_REMINDER,
} chat_role_t;

/* A tool call of an assistant message; the strings are the request's. */
typedef struct {
    const char *id, *name, *args;
    size_t id_len, name_len, args_len;
} chat_call_t;

typedef struct {
    chat_role_t role;
    char *text;                 /* owned: the content, parts joined with "\n\n" */
    size_t len;
    const char *reasoning;      /* assistant: the request's, or NULL */
    size_t reasoning_len;
    chat_call_t *calls;         /* assistant: owned array */
    size_t ncalls;
    bool prefix;                /* assistant: continued, not a finished turn */
    size_t answers;             /* tool: index of the call it answers */
} chat_msg_t;

/* What the renderer needs, checked. Borrows from the request. */
typedef struct {
    chat_msg_t *msgs;
    size_t nmsgs, cap;
    const json_t **tools;       /* the "function" objects shown to the model */
    size_t ntools;
    bool thinking;
    unsigned effort;
    bool in_tool_calls;         /* tool_choice required / named: the prompt opens the block */
    const char **stop;
    size_t nstop;
} chat_conv_t;

static void
conv_free(chat_conv_t *c)
{
    for (size_t i = 0; i < c->nmsgs; i++) {
        free(c->msgs[i].text);
        free(c->msgs[i].calls);
    }
    free(c->msgs);
    free(c->tools);
    free(c->stop);
    memset(c, 0, sizeof(*c));
}

/* A member that is present and not null, else NULL. */
static const json_t *
get_opt(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v == NULL || json_is_null(v) ? NULL : v;
}

static const char *
json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER:
    case JSON_REAL:    return "a number";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    case JSON_NULL:    return "null";
    }
    return "a value";
}

static td_status_t
conv_push(chat_conv_t *c, const chat_msg_t *m)
{
    if (c->nmsgs == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        chat_msg_t *n = realloc(c->msgs, cap * sizeof(*n));
        if (n == NULL)
            return TD_ERR_NOMEM;
        c->msgs = n;
        c->cap = cap;
    }
    c->msgs[c->nmsgs++] = *m;
    return TD_OK;
}

/* Content: a string, or an array of text parts joined with "\n\n". null or
 * absent only where null_ok (*present false then). */
static td_status_t
conv_content(const json_t *msg, size_t mi, bool null_ok, chat_buf_t *out, bool *present,
             td_chat_err_t *err)
{
    const json_t *c = get_opt(msg, "content");
    char param[96];

    snprintf(param, sizeof(param), "messages[%zu].content", mi);
    *present = c != NULL;
    if (c == NULL) {
        if (null_ok)
            return TD_OK;
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': expected a string or an array of content parts, "
                           "got %s.", param, json_is_null(json_object_get(msg, "content"))
                           ? "null" : "nothing");
    }
    if (json_is_string(c)) {
        buf_add(out, json_string_value(c), json_string_length(c));
        buf_terminate(out);
        return TD_OK;
    }
    if (!json_is_array(c))
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': expected a string or an array of content parts, "
                           "got %s.", param, json_type_name(c));
    buf_terminate(out);
    for (size_t j = 0; j < json_array_size(c); j++) {
        const json_t *part = json_array_get(c, j);
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;

        snprintf(param, sizeof(param), "messages[%zu].content[%zu]", mi, j);
        if (!json_is_object(part))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': expected a content part object, got %s.",
                               param, json_type_name(part));
        snprintf(param, sizeof(param), "messages[%zu].content[%zu].type", mi, j);
        if (!json_is_string(type))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': expected a string such as 'text'.", param);
        const char *t = json_string_value(type);
        if (strcmp(t, "image_url") == 0 || strcmp(t, "file") == 0 ||
            strcmp(t, "input_audio") == 0)
            return chat_refuse(err, TD_ERR_UNSUPPORTED, param,
                               "Content parts of type '%s' are not supported: this model "
                               "reads text only.", t);
        if (strcmp(t, "text") != 0)
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid value for '%s': '%s' is not a content part type "
                               "(expected 'text').", param, t);
        const json_t *text = json_object_get(part, "text");
        snprintf(param, sizeof(param), "messages[%zu].content[%zu].text", mi, j);
        if (!json_is_string(text))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': expected a string.", param);
        if (j)
            buf_adds(out, "\n\n");
        buf_add(out, json_string_value(text), json_string_length(text));
    }
    return TD_OK;
}

/* An optional string member; *s NULL when absent or null. */
static td_status_t
conv_opt_string(const json_t *obj, const char *key, const char *param, const char **s,
                size_t *len, td_chat_err_t *err)
{
    const json_t *v = get_opt(obj, key);

    *s = NULL;
    *len = 0;
    if (v == NULL)
        return TD_OK;
    if (!json_is_string(v))
        return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string, got %s.",
                           param, json_type_name(v));
    *s = json_string_value(v);
    *len = json_string_length(v);
    return TD_OK;
}

static td_status_t
conv_tool_calls(const json_t *tc, size_t mi, chat_msg_t *m, td_chat_err_t *err)
{
    char param[96];
    size_t n = json_array_size(tc);

    snprintf(param, sizeof(param), "messages[%zu].tool_calls", mi);
    if (n == 0)
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': empty array. Expected an array with minimum "
                           "length 1, but got an empty array instead.", param);
    m->calls = calloc(n, sizeof(*m->calls));
    if (m->calls == NULL)
        return TD_ERR_NOMEM;
    m->ncalls = n;
    for (size_t k = 0; k < n; k++) {
        const json_t *call = json_array_get(tc, k);
        chat_call_t *cc = &m->calls[k];
        const json_t *v;

        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu]", mi, k);
        if (!json_is_object(call))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an object.",
                               param);
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].id", mi, k);
        v = json_object_get(call, "id");
        if (!json_is_string(v))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string.",
                               param);
        cc->id = json_string_value(v);
        cc->id_len = json_string_length(v);
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].type", mi, k);
        v = json_object_get(call, "type");
        if (!json_is_string(v) || strcmp(json_string_value(v), "function") != 0)
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': expected 'function'.", param);
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function", mi, k);
        const json_t *fn = json_object_get(call, "function");
        if (!json_is_object(fn))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an object.",
                               param);
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function.name", mi, k);
        v = json_object_get(fn, "name");
        if (!json_is_string(v))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string.",
                               param);
        cc->name = json_string_value(v);
        cc->name_len = json_string_length(v);
        snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function.arguments",
                 mi, k);
        v = json_object_get(fn, "arguments");
        if (!json_is_string(v))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': expected a string holding a JSON object.", param);
        cc->args = json_string_value(v);
        cc->args_len = json_string_length(v);
        for (size_t q = 0; q < k; q++)
            if (m->calls[q].id_len == cc->id_len && memcmp(m->calls[q].id, cc->id, cc->id_len) == 0)
                return chat_refuse(err, TD_ERR_INVALID, param,
                                   "Duplicate value for 'tool_call_id' of %s in message[%zu].",
                                   cc->id, mi);
    }
    return TD_OK;
}

/* The tool results that follow an assistant message with tool calls. */
typedef struct {
    bool open;
    size_t assistant;   /* index in conv msgs */
    size_t request_mi;  /* index in the request, for messages */
    size_t first;       /* conv index of the first result */
    bool *answered;
} chat_run_t;

/* End of a run of tool results: every call answered; results in call order. */
static td_status_t
conv_run_close(chat_conv_t *c, chat_run_t *run, td_chat_err_t *err)
{
    if (!run->open)
        return TD_OK;
    run->open = false;
    const chat_msg_t *a = &c->msgs[run->assistant];
    for (size_t k = 0; k < a->ncalls; k++)
        if (!run->answered[k])
            return chat_refuse(err, TD_ERR_INVALID, "messages",
                               "An assistant message with 'tool_calls' must be followed by tool "
                               "messages responding to each 'tool_call_id'. The following "
                               "tool_call_ids did not have response messages: %s "
                               "(messages[%zu]).", a->calls[k].id, run->request_mi);
    for (size_t i = run->first + 1; i < c->nmsgs; i++) {   /* insertion sort by call */
        chat_msg_t t = c->msgs[i];
        size_t j = i;
        while (j > run->first && c->msgs[j - 1].answers > t.answers) {
            c->msgs[j] = c->msgs[j - 1];
            j--;
        }
        c->msgs[j] = t;
    }
    return TD_OK;
}

static td_status_t
conv_messages(chat_conv_t *c, const json_t *msgs, bool had_tools, td_chat_err_t *err)
{
    chat_run_t run = { 0 };
    chat_buf_t text = { 0 };
    bool seen_calls = false;    /* an earlier assistant message called tools */
    td_status_t st = TD_OK;
    size_t n = json_array_size(msgs);
    char param[96];

    for (size_t mi = 0; mi < n; mi++) {
        const json_t *m = json_array_get(msgs, mi);
        chat_msg_t cm = { 0 };
        bool present;

        snprintf(param, sizeof(param), "messages[%zu]", mi);
        if (!json_is_object(m)) {
            st = chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an object.",
                             param);
            goto out;
        }
        const json_t *rv = json_object_get(m, "role");
        snprintf(param, sizeof(param), "messages[%zu].role", mi);
        if (!json_is_string(rv)) {
            st = chat_refuse(err, TD_ERR_INVALID, param,
                             "Invalid '%s': expected one of 'system', 'developer', 'user', "
                             "'assistant', 'tool', 'latest_reminder'.", param);
            goto out;
        }
        const char *role = json_string_value(rv);
        if (strcmp(role, "tool") != 0) {
            st = conv_run_close(c, &run, err);
            if (st != TD_OK)
                goto out;
        }
        text.len = 0;
        if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
            st = conv_content(m, mi, false, &text, &present, err);
            if (st != TD_OK)
                goto out;
            if (text.len == 0)
                continue;   /* an empty system message says nothing */
            cm.role = ROLE_SYSTEM;
        } else if (strcmp(role, "user") == 0) {
            st = conv_content(m, mi, false, &text, &present, err);
            if (st != TD_OK)
                goto out;
            cm.role = ROLE_USER;
        } else if (strcmp(role, "latest_reminder") == 0) {
            const json_t *v = json_object_get(m, "content");
            snprintf(param, sizeof(param), "messages[%zu].content", mi);
            if (!json_is_string(v)) {
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': a latest_reminder message takes a string.",
                                 param);
                goto out;
            }
            buf_add(&text, json_string_value(v), json_string_length(v));
            cm.role = ROLE_REMINDER;
        } else if (strcmp(role, "assistant") == 0) {
            cm.role = ROLE_ASSISTANT;
            st = conv_content(m, mi, true, &text, &present, err);
            if (st != TD_OK)
                goto out;
            snprintf(param, sizeof(param), "messages[%zu].reasoning_content", mi);
            st = conv_opt_string(m, "reasoning_content", param, &cm.reasoning,
                                 &cm.reasoning_len, err);
            if (st != TD_OK)
                goto out;
            const json_t *tc = get_opt(m, "tool_calls");
            snprintf(param, sizeof(param), "messages[%zu].tool_calls", mi);
            if (tc != NULL && !json_is_array(tc)) {
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': expected an array, got %s.", param,
                                 json_type_name(tc));
                goto out;
            }
            if (tc != NULL) {
                st = conv_tool_calls(tc, mi, &cm, err);
                if (st != TD_OK) {
                    free(cm.calls);
                    goto out;
                }
            }
            if (!present && cm.ncalls == 0) {
                snprintf(param, sizeof(param), "messages[%zu]", mi);
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid assistant message '%s': content or tool_calls must "
                                 "be set.", param);
                goto out;
            }
            const json_t *pv = get_opt(m, "prefix");
            snprintf(param, sizeof(param), "messages[%zu].prefix", mi);
            if (pv != NULL && !json_is_boolean(pv)) {
                free(cm.calls);
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': expected a boolean, got %s.", param,
                                 json_type_name(pv));
                goto out;
            }
            cm.prefix = pv != NULL && json_is_true(pv);
            if (cm.prefix && mi + 1 != n) {
                free(cm.calls);
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': only the last message may be an assistant "
                                 "message with prefix set.", param);
                goto out;
            }
            if (cm.prefix && (had_tools || cm.ncalls || seen_calls)) {
                free(cm.calls);
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': a prefix continuation cannot be combined with "
                                 "tools or tool calls.", param);
                goto out;
            }
            seen_calls = seen_calls || cm.ncalls > 0;
        } else if (strcmp(role, "tool") == 0) {
            const json_t *idv = json_object_get(m, "tool_call_id");
            snprintf(param, sizeof(param), "messages[%zu].tool_call_id", mi);
            if (!json_is_string(idv)) {
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': a tool message needs the string id of the "
                                 "call it answers.", param);
                goto out;
            }
            st = conv_content(m, mi, false, &text, &present, err);
            if (st != TD_OK)
                goto out;
            if (!run.open) {
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Messages with role 'tool' must be a response to a preceding "
                                 "message with 'tool_calls' (messages[%zu]).", mi);
                goto out;
            }
            const chat_msg_t *a = &c->msgs[run.assistant];
            size_t k;
            for (k = 0; k < a->ncalls; k++)
                if (a->calls[k].id_len == json_string_length(idv) &&
                    memcmp(a->calls[k].id, json_string_value(idv), a->calls[k].id_len) == 0)
                    break;
            if (k == a->ncalls || run.answered[k]) {
                st = chat_refuse(err, TD_ERR_INVALID, param,
                                 "Invalid '%s': '%s' is not the id of a tool call of the "
                                 "preceding assistant message that awaits a result.", param,
                                 json_string_value(idv));
                goto out;
            }
            run.answered[k] = true;
            cm.role = ROLE_TOOL;
            cm.answers = k;
        } else {
            st = chat_refuse(err, TD_ERR_INVALID, param,
                             "Invalid value for '%s': '%s' is not one of 'system', 'developer', "
                             "'user', 'assistant', 'tool', 'latest_reminder'.", param, role);
            goto out;
        }

        buf_terminate(&text);
        if (text.oom) {
            free(cm.calls);
            st = TD_ERR_NOMEM;
            goto out;
        }
        cm.text = chat_strndup(text.p, text.len);
        cm.len = text.len;
        if (cm.text == NULL || conv_push(c, &cm) != TD_OK) {
            free(cm.text);
            free(cm.calls);
            st = TD_ERR_NOMEM;
            goto out;
        }
        if (cm.role == ROLE_ASSISTANT && cm.ncalls) {
            free(run.answered);
            run.answered = calloc(cm.ncalls, sizeof(bool));
            if (run.answered == NULL) {
                st = TD_ERR_NOMEM;
                goto out;
            }
            run.open = true;
            run.assistant = c->nmsgs - 1;
            run.request_mi = mi;
            run.first = c->nmsgs;
        }
    }
    st = conv_run_close(c, &run, err);
out:
    free(run.answered);
    buf_free(&text);
    return st;
}

static bool
tool_name_ok(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* "tools": function definitions; c->tools gets their "function" objects. */
static td_status_t
conv_tools(chat_conv_t *c, const json_t *tools, td_chat_err_t *err)
{
    char param[96];
    size_t n = json_array_size(tools);

    c->tools = calloc(n ? n : 1, sizeof(*c->tools));
    if (c->tools == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *v;

        snprintf(param, sizeof(param), "tools[%zu]", i);
        if (!json_is_object(t))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an object.",
                               param);
        snprintf(param, sizeof(param), "tools[%zu].type", i);
        v = json_object_get(t, "type");
        if (!json_is_string(v) || strcmp(json_string_value(v), "function") != 0)
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': expected 'function'.", param);
        snprintf(param, sizeof(param), "tools[%zu].function", i);
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an object.",
                               param);
        snprintf(param, sizeof(param), "tools[%zu].function.name", i);
        v = json_object_get(fn, "name");
        if (!json_is_string(v))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string.",
                               param);
        const char *name = json_string_value(v);
        if (strlen(name) != json_string_length(v) || !tool_name_ok(name))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': string does not match pattern. Expected a string "
                               "that matches the pattern '^[a-zA-Z0-9_-]+$'.", param);
        for (size_t k = 0; k < c->ntools; k++)
            if (strcmp(json_string_value(json_object_get(c->tools[k], "name")), name) == 0)
                return chat_refuse(err, TD_ERR_INVALID, param,
                                   "Tool names must be unique: '%s' appears twice.", name);
        snprintf(param, sizeof(param), "tools[%zu].function.description", i);
        v = get_opt(fn, "description");
        if (v != NULL && !json_is_string(v))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string.",
                               param);
        snprintf(param, sizeof(param), "tools[%zu].function.parameters", i);
        v = get_opt(fn, "parameters");
        if (v != NULL) {
            const json_t *type = json_is_object(v) ? json_object_get(v, "type") : NULL;
            if (!json_is_object(v))
                return chat_refuse(err, TD_ERR_INVALID, param,
                                   "Invalid schema for function '%s': expected a JSON Schema "
                                   "object, got %s.", name, json_type_name(v));
            if (!json_is_string(type) || strcmp(json_string_value(type), "object") != 0)
                return chat_refuse(err, TD_ERR_INVALID, param,
                                   "Invalid schema for function '%s': schema must be a JSON "
                                   "Schema of 'type: \"object\"'.", name);
        }
        snprintf(param, sizeof(param), "tools[%zu].function.strict", i);
        v = get_opt(fn, "strict");
        if (v != NULL && !json_is_boolean(v))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a boolean.",
                               param);
        if (v != NULL && json_is_true(v))
            return chat_refuse(err, TD_ERR_UNSUPPORTED, param,
                               "Strict function schemas are not supported (function '%s'); "
                               "send the tool without \"strict\": true.", name);
        c->tools[c->ntools++] = fn;
    }
    return TD_OK;
}

/* "tool_choice": auto (default), none (the tools are not shown), required or
 * a named function (thinking off only: the prompt opens the tool-call block;
 * a named function is the only one shown). Without tools it does nothing. */
static td_status_t
conv_tool_choice(chat_conv_t *c, const json_t *tc, td_chat_err_t *err)
{
    const char *name = NULL;

    if (tc == NULL)
        return TD_OK;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "auto") == 0)
            return TD_OK;
        if (strcmp(s, "none") == 0) {
            c->ntools = 0;
            return TD_OK;
        }
        if (strcmp(s, "required") != 0)
            return chat_refuse(err, TD_ERR_INVALID, "tool_choice",
                               "Invalid value for 'tool_choice': '%s' (expected 'none', 'auto', "
                               "'required' or a function).", s);
    } else if (json_is_object(tc)) {
        const json_t *type = json_object_get(tc, "type");
        const json_t *fn = json_object_get(tc, "function");
        const json_t *nv = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_string(nv))
            return chat_refuse(err, TD_ERR_INVALID, "tool_choice",
                               "Invalid 'tool_choice': expected {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}.");
        name = json_string_value(nv);
    } else {
        return chat_refuse(err, TD_ERR_INVALID, "tool_choice",
                           "Invalid 'tool_choice': expected a string or an object, got %s.",
                           json_type_name(tc));
    }
    if (c->ntools == 0)
        return TD_OK;
    if (c->thinking)
        return chat_refuse(err, TD_ERR_INVALID, "tool_choice",
                           "Thinking mode does not support tool_choice 'required' or a named "
                           "function; send \"thinking\": {\"type\": \"disabled\"} with it.");
    if (name != NULL) {
        size_t k;
        for (k = 0; k < c->ntools; k++)
            if (strcmp(json_string_value(json_object_get(c->tools[k], "name")), name) == 0)
                break;
        if (k == c->ntools)
            return chat_refuse(err, TD_ERR_INVALID, "tool_choice",
                               "Invalid value for 'tool_choice': no function named '%s' was "
                               "specified in the 'tools' parameter.", name);
        c->tools[0] = c->tools[k];
        c->ntools = 1;
    }
    c->in_tool_calls = true;
    return TD_OK;
}

static const char *const chat_effort_names[] = {
    "none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max", NULL
};

/* Thinking and its effort: an explicit "thinking" wins; without it, effort
 * "none" turns thinking off. Effort minimal/low -> 50, ultra/max -> 100,
 * anything else (or none given) -> 75. */
static td_status_t
conv_thinking(chat_conv_t *c, const json_t *req, const td_chat_opts_t *opts,
              td_chat_err_t *err)
{
    int thinking = opts ? opts->thinking : -1;
    const char *effort = opts ? opts->effort : NULL;

    if (thinking < 0 && req != NULL) {
        const json_t *t = get_opt(req, "thinking");
        if (t != NULL) {
            const json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
            const char *s = json_is_string(type) ? json_string_value(type) : "";
            if (strcmp(s, "enabled") == 0 || strcmp(s, "adaptive") == 0)
                thinking = 1;
            else if (strcmp(s, "disabled") == 0)
                thinking = 0;
            else
                return chat_refuse(err, TD_ERR_INVALID, "thinking.type",
                                   "Invalid 'thinking': expected {\"type\": \"enabled\"}, "
                                   "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}.");
        }
    }
    if (effort == NULL && req != NULL) {
        const json_t *e = get_opt(req, "reasoning_effort");
        if (e != NULL && !json_is_string(e))
            return chat_refuse(err, TD_ERR_INVALID, "reasoning_effort",
                               "Invalid 'reasoning_effort': expected a string, got %s.",
                               json_type_name(e));
        effort = e ? json_string_value(e) : NULL;
    }
    if (effort != NULL) {
        size_t k;
        for (k = 0; chat_effort_names[k]; k++)
            if (strcmp(effort, chat_effort_names[k]) == 0)
                break;
        if (chat_effort_names[k] == NULL)
            return chat_refuse(err, TD_ERR_INVALID, "reasoning_effort",
                               "Invalid value for 'reasoning_effort': '%s' (expected none, "
                               "minimal, low, medium, high, xhigh, ultra or max).", effort);
    }
    if (thinking < 0)
        thinking = effort == NULL || strcmp(effort, "none") != 0;
    c->thinking = thinking;
    c->effort = 0;
    if (c->thinking) {
        c->effort = 75;
        if (effort && (strcmp(effort, "minimal") == 0 || strcmp(effort, "low") == 0))
            c->effort = 50;
        if (effort && (strcmp(effort, "ultra") == 0 || strcmp(effort, "max") == 0))
            c->effort = 100;
    }
    return TD_OK;
}

static td_status_t
conv_stop(chat_conv_t *c, const json_t *stop, td_chat_err_t *err)
{
    size_t n;

    if (stop == NULL)
        return TD_OK;
    if (!json_is_string(stop) && !json_is_array(stop))
        return chat_refuse(err, TD_ERR_INVALID, "stop",
                           "Invalid 'stop': expected a string or an array of strings, got %s.",
                           json_type_name(stop));
    n = json_is_string(stop) ? 1 : json_array_size(stop);
    c->stop = calloc(n ? n : 1, sizeof(*c->stop));
    if (c->stop == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
        char param[32];
        snprintf(param, sizeof(param), json_is_string(stop) ? "stop" : "stop[%zu]", i);
        if (!json_is_string(s))
            return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string.",
                               param);
        if (json_string_length(s) == 0 || strlen(json_string_value(s)) != json_string_length(s))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': empty string. Expected a string with minimum "
                               "length 1.", param);
        c->stop[c->nstop++] = json_string_value(s);
    }
    return TD_OK;
}

static td_status_t
conv_build(chat_conv_t *c, const json_t *request, const td_chat_opts_t *opts,
           td_chat_err_t *err)
{
    const json_t *req = json_is_object(request) ? request : NULL;
    const json_t *msgs = req ? json_object_get(req, "messages") : request;
    td_status_t st;

    if (!json_is_object(request) && !json_is_array(request))
        return chat_refuse(err, TD_ERR_INVALID, NULL,
                           "The request must be a JSON object with 'messages' (or an array of "
                           "messages).");
    if (!json_is_array(msgs))
        return chat_refuse(err, TD_ERR_INVALID, "messages",
                           "Invalid 'messages': expected an array of messages%s.",
                           msgs == NULL ? ", got nothing" : "");
    if (json_array_size(msgs) == 0)
        return chat_refuse(err, TD_ERR_INVALID, "messages",
                           "Invalid 'messages': empty array. Expected an array with minimum "
                           "length 1, but got an empty array instead.");
    st = conv_thinking(c, req, opts, err);
    if (st != TD_OK)
        return st;
    if (req != NULL) {
        const json_t *rf = get_opt(req, "response_format");
        if (rf != NULL) {
            const json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
            const char *s = json_is_string(type) ? json_string_value(type) : NULL;
            if (s != NULL && (strcmp(s, "json_object") == 0 || strcmp(s, "json_schema") == 0 ||
                              strcmp(s, "regex") == 0))
                return chat_refuse(err, TD_ERR_UNSUPPORTED, "response_format.type",
                                   "response_format '%s' is not supported (no constrained "
                                   "decoding); use 'text'.", s);
            if (s == NULL || strcmp(s, "text") != 0)
                return chat_refuse(err, TD_ERR_INVALID, "response_format.type",
                                   "Invalid 'response_format': expected {\"type\": \"text\"}.");
        }
        st = conv_stop(c, get_opt(req, "stop"), err);
        if (st != TD_OK)
            return st;
        const json_t *tools = get_opt(req, "tools");
        if (tools != NULL && !json_is_array(tools))
            return chat_refuse(err, TD_ERR_INVALID, "tools",
                               "Invalid 'tools': expected an array, got %s.",
                               json_type_name(tools));
        if (tools != NULL) {
            st = conv_tools(c, tools, err);
            if (st != TD_OK)
                return st;
        }
    }
    bool had_tools = c->ntools > 0;
    st = conv_messages(c, msgs, had_tools, err);
    if (st != TD_OK)
        return st;
    if (req != NULL)
        st = conv_tool_choice(c, get_opt(req, "tool_choice"), err);
    return st;
}

/* ---- Rendering --------------------------------------------------------- */

typedef struct {
    chat_buf_t text;
    td_chat_span_t *spans;
    size_t nspans, cap;
    bool oom;
} chat_out_t;

static void
out_text(chat_out_t *o, const char *s, size_t n)
{
    buf_add(&o->text, s, n);
}

static void
out_texts(chat_out_t *o, const char *s)
{
    buf_adds(&o->text, s);
}

static void
out_special(chat_out_t *o, const char *tok)
{
    size_t start = o->text.len;

    buf_adds(&o->text, tok);
    if (o->nspans == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 32;
        td_chat_span_t *n = realloc(o->spans, cap * sizeof(*n));
        if (n == NULL) {
            o->oom = true;
            return;
        }
        o->spans = n;
        o->cap = cap;
    }
    o->spans[o->nspans++] = (td_chat_span_t){ start, o->text.len };
}

/* Fixed text of the format: the spellings in chat_template_specials inside
 * it are special tokens. Never used for request text. */
static void
out_template(chat_out_t *o, const char *tpl)
{
    while (*tpl) {
        const char *best = NULL, *tok = NULL;
        for (size_t k = 0; k < sizeof(chat_template_specials) / sizeof(*chat_template_specials);
             k++) {
            const char *at = strstr(tpl, chat_template_specials[k]);
            if (at && (best == NULL || at < best)) {
                best = at;
                tok = chat_template_specials[k];
            }
        }
        if (best == NULL) {
            out_texts(o, tpl);
            return;
        }
        out_text(o, tpl, (size_t)(best - tpl));
        out_special(o, tok);
        tpl = best + strlen(tok);
    }
}

/* The first system block: effort line (thinking), the system text, the tools. */
static void
render_system_body(chat_out_t *o, const chat_conv_t *c, const char *text, size_t len)
{
    if (c->thinking) {
        char line[160];
        snprintf(line, sizeof(line), EFFORT_LINE, c->effort);
        out_texts(o, line);
    }
    out_text(o, text, len);
    if (c->ntools == 0)
        return;
    out_template(o, chat_tools_head);
    for (size_t i = 0; i < c->ntools; i++) {
        const json_t *fn = c->tools[i];
        const json_t *name = json_object_get(fn, "name");
        const json_t *desc = get_opt(fn, "description");
        const json_t *params = get_opt(fn, "parameters");

        if (i)
            out_texts(o, "\n");
        out_texts(o, "{\"name\": ");
        json_quote(&o->text, json_string_value(name), json_string_length(name));
        out_texts(o, ", \"description\": ");
        if (desc)
            json_quote(&o->text, json_string_value(desc), json_string_length(desc));
        else
            out_texts(o, "\"\"");
        out_texts(o, ", \"parameters\": ");
        if (params)
            py_dump(&o->text, params);
        else
            out_texts(o, "{}");
        out_texts(o, "}");
    }
    out_template(o, chat_tools_tail);
}

static void
render_param(chat_out_t *o, const char *name, size_t name_len, bool string)
{
    out_template(o, "<" TOK_DSML " parameter name=\"");
    out_text(o, name, name_len);
    out_texts(o, string ? "\" string=\"true\">" : "\" string=\"false\">");
}

/* A call's arguments: a JSON object becomes one parameter per member
 * (strings as they are, other values as JSON); anything else is passed as
 * one string parameter named "arguments". */
static void
render_call(chat_out_t *o, const chat_call_t *call)
{
    json_error_t jerr;
    json_t *args = json_loadb(call->args, call->args_len, JSON_ALLOW_NUL, &jerr);

    out_template(o, "<" TOK_DSML " invoke name=\"");
    out_text(o, call->name, call->name_len);
    out_texts(o, "\">\n");
    if (json_is_object(args)) {
        const char *key;
        json_t *val;
        bool first = true;

        json_object_foreach(args, key, val) {
            if (!first)
                out_texts(o, "\n");
            first = false;
            render_param(o, key, strlen(key), json_is_string(val));
            if (json_is_string(val))
                out_text(o, json_string_value(val), json_string_length(val));
            else
                py_dump(&o->text, val);
            out_template(o, "</" TOK_DSML " parameter>");
        }
    } else {
        render_param(o, "arguments", 9, true);
        out_text(o, call->args, call->args_len);
        out_template(o, "</" TOK_DSML " parameter>");
    }
    json_decref(args);
    out_texts(o, "\n");
    out_template(o, "</" TOK_DSML " invoke>\n");
}

static void
render_assistant(chat_out_t *o, const chat_conv_t *c, const chat_msg_t *m, bool first)
{
    const char *rc = m->reasoning ? m->reasoning : "";
    size_t rc_len = m->reasoning ? m->reasoning_len : 0;

    out_special(o, TOK_ASSISTANT);
    if (!c->thinking) {
        out_special(o, TOK_UNTHINK);
    } else if (m->prefix && !first) {
        /* A continuation: reasoning left open while there is no content yet
         * (not when the conversation starts with it: then it is dropped). */
        out_special(o, TOK_THINK);
        out_text(o, rc, rc_len);
        if (m->len)
            out_special(o, TOK_UNTHINK);
    } else if (c->ntools) {
        /* With tools, every turn keeps its reasoning; otherwise it is dropped. */
        out_special(o, TOK_THINK);
        out_text(o, rc, rc_len);
        out_special(o, TOK_UNTHINK);
    } else {
        out_special(o, TOK_UNTHINK);
    }
    out_text(o, m->text, m->len);
    if (m->ncalls) {
        out_template(o, "\n\n<" TOK_DSML " calls>\n");
        for (size_t k = 0; k < m->ncalls; k++)
            render_call(o, &m->calls[k]);
        out_template(o, "</" TOK_DSML " calls>");
    }
    if (!m->prefix)
        out_special(o, TOK_EOS);
}

static void
render(chat_out_t *o, const chat_conv_t *c)
{
    bool system_extra = c->thinking || c->ntools > 0;
    const chat_msg_t *last = c->nmsgs ? &c->msgs[c->nmsgs - 1] : NULL;
    chat_role_t prev = ROLE_SYSTEM;
    bool have_prev = false;

    out_special(o, TOK_BOS);
    /* Without any message, the effort line alone makes no system block. */
    if (c->nmsgs == 0 ? c->ntools > 0 : system_extra && c->msgs[0].role != ROLE_SYSTEM) {
        out_special(o, TOK_SYSTEM);
        render_system_body(o, c, "", 0);
    }
    for (size_t i = 0; i < c->nmsgs; i++) {
        const chat_msg_t *m = &c->msgs[i];
        bool user_block = have_prev && (prev == ROLE_USER || prev == ROLE_TOOL);

        switch (m->role) {
        case ROLE_SYSTEM:
            out_special(o, TOK_SYSTEM);
            if (i == 0 && system_extra)
                render_system_body(o, c, m->text, m->len);
            else
                out_text(o, m->text, m->len);
            break;
        case ROLE_USER:
        case ROLE_TOOL:
            /* User turns and tool results in a row share one user block. */
            if (user_block)
                out_texts(o, "\n\n");
            else
                out_special(o, TOK_USER);
            if (m->role == ROLE_TOOL)
                out_texts(o, "<tool_result>");
            out_text(o, m->text, m->len);
            if (m->role == ROLE_TOOL)
                out_texts(o, "</tool_result>");
            break;
        case ROLE_REMINDER:
            /* Of several reminders in a row, the first is shown. */
            if (!(have_prev && prev == ROLE_REMINDER)) {
                out_special(o, TOK_REMINDER);
                out_text(o, m->text, m->len);
            }
            break;
        case ROLE_ASSISTANT:
            render_assistant(o, c, m, i == 0);
            break;
        }
        prev = m->role;
        have_prev = true;
    }
    if (!(last && last->role == ROLE_ASSISTANT && last->prefix)) {
        out_special(o, TOK_ASSISTANT);
        out_special(o, c->thinking ? TOK_THINK : TOK_UNTHINK);
        if (c->in_tool_calls)
            out_template(o, "\n\n<" TOK_DSML " calls>\n");
    }
}

void
td_chat_prompt_destroy(td_chat_prompt_t *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->parse.nstop; i++)
        free((char *)p->parse.stop[i]);
    free((void *)p->parse.stop);
    free(p->text);
    free(p->specials);
    free(p);
}

td_status_t
td_chat_encode(const json_t *request, const td_chat_opts_t *opts, td_chat_prompt_t **out,
               td_chat_err_t *err)
{
    chat_conv_t c = { 0 };
    chat_out_t o = { 0 };
    td_chat_prompt_t *p = NULL;
    td_status_t st;

    if (request == NULL)
        return chat_refuse(err, TD_ERR_INVALID, NULL, "The request is empty.");
    st = conv_build(&c, request, opts, err);
    if (st != TD_OK)
        goto cleanup;
    render(&o, &c);
    buf_terminate(&o.text);
    if (o.oom || o.text.oom) {
        st = TD_ERR_NOMEM;
        goto cleanup;
    }

    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        st = TD_ERR_NOMEM;
        goto cleanup;
    }
    p->thinking = c.thinking;
    p->effort = c.effort;
    p->parse.tool_calls = c.ntools > 0;
    p->parse.in_tool_calls = c.in_tool_calls;
    const chat_msg_t *last = c.nmsgs ? &c.msgs[c.nmsgs - 1] : NULL;
    if (!c.thinking)
        p->parse.start = TD_CHAT_START_PLAIN;
    else if (last && last->role == ROLE_ASSISTANT && last->prefix)
        p->parse.start = last->len ? TD_CHAT_START_CONTENT_CONT
                         : last->reasoning_len ? TD_CHAT_START_REASONING_CONT
                         : TD_CHAT_START_REASONING;
    else
        p->parse.start = TD_CHAT_START_REASONING;
    if (c.nstop) {
        char **stop = calloc(c.nstop, sizeof(*stop));
        p->parse.stop = (const char *const *)stop;
        if (stop == NULL) {
            st = TD_ERR_NOMEM;
            goto cleanup;
        }
        for (size_t i = 0; i < c.nstop; i++) {
            stop[i] = strdup(c.stop[i]);
            if (stop[i] == NULL) {
                st = TD_ERR_NOMEM;
                goto cleanup;
            }
            p->parse.nstop = i + 1;
        }
    }
    p->text = o.text.p;
    p->len = o.text.len;
    p->specials = o.spans;
    p->nspecials = o.nspans;
    o.text.p = NULL;
    o.spans = NULL;
    *out = p;
    p = NULL;
    st = TD_OK;
cleanup:
    td_chat_prompt_destroy(p);
    buf_free(&o.text);
    free(o.spans);
    conv_free(&c);
    return st;
}

/* ---- Reading the output: the marker state machine -----------------------
 * The output is read byte by byte. Each stage has a list of patterns
 * (branches), tried in order; bytes that cannot be part of a pattern any more
 * get the stage's own action (content, reasoning, skipped, ...); a pattern
 * that completes has the branch's action and moves to the branch's stage.
 * Bytes that may still become a pattern are held back, so a delta is never
 * taken back. Patterns:
 *   STRING      the string, found anywhere (a KMP automaton);
 *   NL_STRING   the string with the newlines right before it (they are not
 *               content: "text\n\n</think>" gives "text");
 *   LEADING_NL  a newline as the first byte of the stage (leading newlines
 *               are dropped one at a time).
 * When things are released follows the reference reader exactly (it shows in
 * the deltas of each feed): what precedes a completed pattern at once; held
 * bytes at the end of a feed, and only whole feeds' worth of them; a
 * completed pattern's own action at the end of the feed, unless everything
 * after it in that same feed is still a possible pattern (release_held). */

typedef enum { PAT_STRING, PAT_NL_STRING, PAT_LEADING_NL } chat_pat_kind_t;

typedef enum {
    STAGE_CONTENT,      /* flag: at the start (leading newlines dropped) */
    STAGE_REASONING,    /* flag: at the start */
    STAGE_CALLS,        /* inside the tool-call block, between invokes */
    STAGE_TOOL_NAME,    /* after invoke name=" */
    STAGE_ARGS,         /* inside an invoke; flag: no parameter yet */
    STAGE_PARAM_NAME,   /* after parameter name= : the quoted name, up to a space */
    STAGE_PARAM_TYPE,   /* after that space, until string="true|false"> */
    STAGE_PARAM_VALUE,  /* flag: a string value */
    STAGE_FINISHED,     /* after the block, or a stop string: the rest is dropped */
} chat_stage_t;

typedef enum {
    ACT_CONTENT,
    ACT_REASONING,
    ACT_SKIP,
    ACT_STOP,          /* a stop string */
    ACT_CALL_BEGIN,    /* invoke name=" */
    ACT_CALL_NAME,     /* bytes of the name */
    ACT_CALL_NAME_END, /* its closing quote: the call is announced */
    ACT_ARGS_LABEL,    /* JSON punctuation: the label */
    ACT_ARGS_RAW,      /* bytes as they are (quoted parameter names, non-string values) */
    ACT_ARGS_STRING,   /* bytes escaped for a JSON string */
} chat_act_t;

enum {
    PAT_DSML_BEGIN, PAT_DSML_END, PAT_CALLS_END1, PAT_CALLS_END2, PAT_THINK_END,
    PAT_INVOKE, PAT_QUOTE, PAT_PARAM, PAT_SPACE, PAT_TRUE, PAT_FALSE, PAT_NFIXED
};

static const char *const chat_fixed_pats[PAT_NFIXED] = {
    [PAT_DSML_BEGIN] = "<" TOK_DSML,
    [PAT_DSML_END]   = "</" TOK_DSML,
    [PAT_CALLS_END1] = "</" TOK_DSML "tool_calls>",
    [PAT_CALLS_END2] = "</" TOK_DSML " calls>",
    [PAT_THINK_END]  = TOK_UNTHINK,
    [PAT_INVOKE]     = "invoke name=\"",
    [PAT_QUOTE]      = "\"",
    [PAT_PARAM]      = "parameter name=",
    [PAT_SPACE]      = " ",
    [PAT_TRUE]       = "true\">",
    [PAT_FALSE]      = "false\">",
};

typedef struct {
    const char *s;
    size_t n;
    size_t *fail;   /* KMP failure table, n entries */
} chat_pat_t;

typedef struct {
    chat_pat_kind_t kind;
    const chat_pat_t *pat;  /* NULL for PAT_LEADING_NL */
    size_t len;             /* bytes of pat matched */
    size_t nl;              /* NL_STRING: newlines before them */
    bool leading, matched;  /* LEADING_NL */
    chat_stage_t next;
    bool next_flag;
    chat_act_t act;
    const char *label;      /* ACT_ARGS_LABEL */
} chat_branch_t;

struct td_chat_parser {
    td_chat_start_t start;
    bool tool_calls;
    chat_pat_t pats[PAT_NFIXED];
    chat_pat_t *stops;
    size_t nstop;

    chat_stage_t stage;
    bool flag;
    chat_branch_t *br;
    size_t nbr;
    chat_act_t unmatched;
    /* The action of the pattern the last match completed, not yet taken
     * (pending), and the bytes this stage has seen since, not yet acted on. */
    bool pending;
    chat_act_t pend_act;
    const char *pend_label;
    bool pend_within;       /* the whole pattern came in one feed */
    bool pend_checked;      /* a feed has ended since the match */
    bool pend_glued;        /* ... and that feed went on after the pattern */
    chat_buf_t held;
    size_t *frags;          /* held, cut where the feeds that brought it began */
    size_t nfrags, frags_cap;
    bool frag_open;         /* the current feed has a fragment in frags */

    uint8_t utf8[4];        /* an unfinished UTF-8 character from the last feed */
    size_t nutf8;
    bool stopped, finished;
    uint64_t rng;

    /* What the deltas add up to. */
    chat_buf_t content, reasoning, name;
    chat_buf_t *args;       /* per call */
    td_chat_reply_t reply;
    size_t calls_cap;

    /* Deltas of the current feed; their texts live in dtext. */
    td_chat_delta_t *deltas;
    size_t ndeltas, deltas_cap;
    size_t *doff;           /* offset of each delta's text in dtext */
    chat_buf_t dtext;
    bool oom;
};

static td_status_t
pat_init(chat_pat_t *p, const char *s, size_t n)
{
    p->s = s;
    p->n = n;
    p->fail = calloc(n ? n : 1, sizeof(*p->fail));
    if (p->fail == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 1, k = 0; i < n;) {
        if (s[i] == s[k]) {
            p->fail[i++] = ++k;
        } else if (k) {
            k = p->fail[k - 1];
        } else {
            p->fail[i++] = 0;
        }
    }
    return TD_OK;
}

static size_t
pat_next(const chat_pat_t *p, size_t len, char c)
{
    while (len > 0 && (len >= p->n || p->s[len] != c))
        len = p->fail[len - 1];
    if (len < p->n && p->s[len] == c)
        len++;
    return len;
}

/* Feed one byte; true when the pattern is complete. */
static bool
branch_feed(chat_branch_t *b, char c)
{
    switch (b->kind) {
    case PAT_STRING:
        b->len = pat_next(b->pat, b->len, c);
        return b->len == b->pat->n;
    case PAT_NL_STRING:
        if (b->len == 0 && c == '\n') {
            b->nl++;
        } else {
            size_t next = pat_next(b->pat, b->len, c);
            if (next <= b->len)
                b->nl = 0;
            b->len = next;
        }
        return b->len == b->pat->n;
    case PAT_LEADING_NL:
        if (b->leading)
            b->matched = c == '\n';
        b->leading = false;
        return b->matched;
    }
    return false;
}

/* Bytes at the end of what was seen that belong to the (partial) match. */
static size_t
branch_len(const chat_branch_t *b)
{
    switch (b->kind) {
    case PAT_STRING:     return b->len;
    case PAT_NL_STRING:  return b->len + b->nl;
    case PAT_LEADING_NL: return b->matched ? 1 : 0;
    }
    return 0;
}

static void
add_branch(td_chat_parser_t *p, chat_pat_kind_t kind, const chat_pat_t *pat,
           chat_stage_t next, bool next_flag, chat_act_t act, const char *label)
{
    p->br[p->nbr++] = (chat_branch_t){
        .kind = kind, .pat = pat, .leading = true, .next = next, .next_flag = next_flag,
        .act = act, .label = label,
    };
}

/* Enter a stage: its branches, in the order they are tried, and the action
 * of bytes no branch can use. */
static void
stage_enter(td_chat_parser_t *p, chat_stage_t stage, bool flag)
{
    const chat_pat_t *pt = p->pats;

    p->stage = stage;
    p->flag = flag;
    p->nbr = 0;
    switch (stage) {
    case STAGE_CONTENT:
        for (size_t i = 0; i < p->nstop; i++)
            add_branch(p, PAT_STRING, &p->stops[i], STAGE_FINISHED, false, ACT_STOP, NULL);
        if (p->tool_calls)
            add_branch(p, PAT_NL_STRING, &pt[PAT_DSML_BEGIN], STAGE_CALLS, false, ACT_SKIP, NULL);
        if (flag)
            add_branch(p, PAT_LEADING_NL, NULL, STAGE_CONTENT, true, ACT_SKIP, NULL);
        /* A stray end of thinking in the content is dropped. */
        add_branch(p, PAT_STRING, &pt[PAT_THINK_END], STAGE_CONTENT, false, ACT_SKIP, NULL);
        p->unmatched = ACT_CONTENT;
        break;
    case STAGE_REASONING:
        if (p->tool_calls)
            add_branch(p, PAT_NL_STRING, &pt[PAT_DSML_BEGIN], STAGE_CALLS, false, ACT_SKIP, NULL);
        if (flag)
            add_branch(p, PAT_LEADING_NL, NULL, STAGE_REASONING, true, ACT_SKIP, NULL);
        add_branch(p, PAT_NL_STRING, &pt[PAT_THINK_END], STAGE_CONTENT, true, ACT_SKIP, NULL);
        p->unmatched = ACT_REASONING;
        break;
    case STAGE_CALLS:
        add_branch(p, PAT_STRING, &pt[PAT_INVOKE], STAGE_TOOL_NAME, false, ACT_CALL_BEGIN, NULL);
        add_branch(p, PAT_STRING, &pt[PAT_CALLS_END1], STAGE_FINISHED, false, ACT_SKIP, NULL);
        add_branch(p, PAT_STRING, &pt[PAT_CALLS_END2], STAGE_FINISHED, false, ACT_SKIP, NULL);
        p->unmatched = ACT_SKIP;
        break;
    case STAGE_TOOL_NAME:
        add_branch(p, PAT_STRING, &pt[PAT_QUOTE], STAGE_ARGS, true, ACT_CALL_NAME_END, NULL);
        p->unmatched = ACT_CALL_NAME;
        break;
    case STAGE_ARGS:
        add_branch(p, PAT_STRING, &pt[PAT_PARAM], STAGE_PARAM_NAME, false, ACT_ARGS_LABEL,
                   flag ? "{" : ", ");
        add_branch(p, PAT_STRING, &pt[PAT_DSML_END], STAGE_CALLS, false, ACT_ARGS_LABEL,
                   flag ? "{}" : "}");
        p->unmatched = ACT_SKIP;
        break;
    case STAGE_PARAM_NAME:
        /* The name goes out with its quotes, as written, up to the first space. */
        add_branch(p, PAT_STRING, &pt[PAT_SPACE], STAGE_PARAM_TYPE, false, ACT_ARGS_LABEL,
                   ": ");
        p->unmatched = ACT_ARGS_RAW;
        break;
    case STAGE_PARAM_TYPE:
        add_branch(p, PAT_STRING, &pt[PAT_TRUE], STAGE_PARAM_VALUE, true, ACT_ARGS_LABEL, "\"");
        add_branch(p, PAT_STRING, &pt[PAT_FALSE], STAGE_PARAM_VALUE, false, ACT_SKIP, NULL);
        p->unmatched = ACT_SKIP;
        break;
    case STAGE_PARAM_VALUE:
        add_branch(p, PAT_STRING, &pt[PAT_DSML_END], STAGE_ARGS, false,
                   flag ? ACT_ARGS_LABEL : ACT_SKIP, flag ? "\"" : NULL);
        p->unmatched = flag ? ACT_ARGS_STRING : ACT_ARGS_RAW;
        break;
    case STAGE_FINISHED:
        p->unmatched = ACT_SKIP;
        break;
    }
}

/* ---- Deltas and the reply ---------------------------------------------- */

/* The reply has reasoning (possibly empty) when the output begins in it. */
static bool
chat_starts_in_reasoning(td_chat_start_t s)
{
    return s == TD_CHAT_START_REASONING || s == TD_CHAT_START_REASONING_CONT;
}

/* A new delta with an empty text; NULL when out of memory. */
static td_chat_delta_t *
delta_new(td_chat_parser_t *p, td_chat_delta_kind_t kind, uint32_t index)
{
    if (p->ndeltas == p->deltas_cap) {
        size_t cap = p->deltas_cap ? 2 * p->deltas_cap : 16;
        td_chat_delta_t *d = realloc(p->deltas, cap * sizeof(*d));
        if (d == NULL) {
            p->oom = true;
            return NULL;
        }
        p->deltas = d;
        size_t *o = realloc(p->doff, cap * sizeof(*o));
        if (o == NULL) {
            p->oom = true;
            return NULL;
        }
        p->doff = o;
        p->deltas_cap = cap;
    }
    buf_addc(&p->dtext, '\0');
    if (p->dtext.oom) {
        p->oom = true;
        return NULL;
    }
    p->doff[p->ndeltas] = p->dtext.len - 1;
    p->deltas[p->ndeltas] = (td_chat_delta_t){ .kind = kind, .index = index };
    return &p->deltas[p->ndeltas++];
}

/* Text for the deltas; it extends the last delta when that is of the same
 * kind (and the same call). Each delta's text is followed by a NUL in dtext. */
static void
delta_text(td_chat_parser_t *p, td_chat_delta_kind_t kind, uint32_t index, const char *s,
           size_t n, bool escape)
{
    td_chat_delta_t *last = p->ndeltas ? &p->deltas[p->ndeltas - 1] : NULL;

    if (n == 0)
        return;
    if (last == NULL || last->kind != kind ||
        (kind == TD_CHAT_DELTA_TOOL_ARGS && last->index != index)) {
        last = delta_new(p, kind, index);
        if (last == NULL)
            return;
    }
    p->dtext.len--;   /* write over the NUL that ends the last delta */
    size_t before = p->dtext.len;
    if (escape)
        json_escape(&p->dtext, s, n);
    else
        buf_add(&p->dtext, s, n);
    last->len += p->dtext.len - before;
    buf_addc(&p->dtext, '\0');
}

static const char chat_id_alnum[] =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

static uint64_t
rng_next(uint64_t *s)   /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A call's name is complete: the call exists from now on. */
static void
call_open(td_chat_parser_t *p)
{
    td_chat_reply_t *r = &p->reply;

    if (r->ncalls == p->calls_cap) {
        size_t cap = p->calls_cap ? 2 * p->calls_cap : 4;
        td_chat_tool_call_t *c = realloc(r->calls, cap * sizeof(*c));
        chat_buf_t *a = c ? realloc(p->args, cap * sizeof(*a)) : NULL;
        if (c)
            r->calls = c;
        if (a == NULL) {
            p->oom = true;
            return;
        }
        p->args = a;
        p->calls_cap = cap;
    }
    /* With thinking on, a call made before any reasoning is marked "ET_"
     * (empty thinking) in its id, as the reference does. */
    char id[48];
    int n = snprintf(id, sizeof(id), "call_%02zu_%s", r->ncalls,
                     p->start != TD_CHAT_START_PLAIN && p->reasoning.len == 0 ? "ET_" : "");
    for (int i = 0; i < 24 && n < (int)sizeof(id) - 1; i++, n++) {
        uint64_t x = rng_next(&p->rng);
        id[n] = i < 20 ? chat_id_alnum[x % 62] : (char)('0' + x % 10);
    }
    id[n] = '\0';
    buf_terminate(&p->name);
    td_chat_tool_call_t *call = &r->calls[r->ncalls];
    call->id = strdup(id);
    call->name = chat_strndup(p->name.p ? p->name.p : "", p->name.len);
    call->arguments = NULL;
    call->arguments_len = 0;
    memset(&p->args[r->ncalls], 0, sizeof(chat_buf_t));
    if (call->id == NULL || call->name == NULL || p->name.oom) {
        free(call->id);
        free(call->name);
        p->oom = true;
        return;
    }
    r->ncalls++;
    td_chat_delta_t *d = delta_new(p, TD_CHAT_DELTA_TOOL_CALL, (uint32_t)(r->ncalls - 1));
    if (d) {
        d->id = call->id;
        d->name = call->name;
    }
}

static void
call_args(td_chat_parser_t *p, const char *s, size_t n, bool escape)
{
    td_chat_reply_t *r = &p->reply;

    if (r->ncalls == 0 || n == 0)
        return;
    size_t i = r->ncalls - 1;
    if (escape)
        json_escape(&p->args[i], s, n);
    else
        buf_add(&p->args[i], s, n);
    delta_text(p, TD_CHAT_DELTA_TOOL_ARGS, (uint32_t)i, s, n, escape);
}

/* Act on n bytes. */
static void
act(td_chat_parser_t *p, chat_act_t a, const char *s, size_t n, const char *label)
{
    switch (a) {
    case ACT_CONTENT:
        buf_add(&p->content, s, n);
        delta_text(p, TD_CHAT_DELTA_CONTENT, 0, s, n, false);
        break;
    case ACT_REASONING:
        buf_add(&p->reasoning, s, n);
        delta_text(p, TD_CHAT_DELTA_REASONING, 0, s, n, false);
        break;
    case ACT_SKIP:
        break;
    case ACT_STOP:
        p->stopped = true;
        break;
    case ACT_CALL_BEGIN:
        p->name.len = 0;
        break;
    case ACT_CALL_NAME:
        buf_add(&p->name, s, n);
        break;
    case ACT_CALL_NAME_END:
        call_open(p);
        break;
    case ACT_ARGS_LABEL:
        call_args(p, label, strlen(label), false);
        break;
    case ACT_ARGS_RAW:
        call_args(p, s, n, false);
        break;
    case ACT_ARGS_STRING:
        call_args(p, s, n, true);
        break;
    }
}

/* Take the pending pattern action, if any. */
static void
pending_release(td_chat_parser_t *p)
{
    if (p->pending) {
        p->pending = false;
        act(p, p->pend_act, "", 0, p->pend_label);
    }
}

/* Act on the first n held bytes (after the pending pattern action). */
static void
held_release(td_chat_parser_t *p, size_t n)
{
    pending_release(p);
    if (n == 0)
        return;
    act(p, p->unmatched, p->held.p, n, NULL);
    memmove(p->held.p, p->held.p + n, p->held.len - n);
    p->held.len -= n;
    size_t k = 0;
    while (k < p->nfrags && p->frags[k] <= n) {
        n -= p->frags[k];
        k++;
    }
    if (k < p->nfrags)
        p->frags[k] -= n;
    memmove(p->frags, p->frags + k, (p->nfrags - k) * sizeof(*p->frags));
    p->nfrags -= k;
}

/* One byte of (valid UTF-8) output through the state machine. When a pattern
 * completes, what came before it is acted on at once; the pattern's own
 * action is pending until the end of the feed (see release_held). */
static void
feed_byte(td_chat_parser_t *p, char c)
{
    chat_branch_t *hit = NULL;

    buf_addc(&p->held, c);
    if (p->held.oom)
        return;
    if (!p->frag_open || p->nfrags == 0) {
        if (p->nfrags == p->frags_cap) {
            size_t cap = p->frags_cap ? 2 * p->frags_cap : 8;
            size_t *f = realloc(p->frags, cap * sizeof(*f));
            if (f == NULL) {
                p->oom = true;
                return;
            }
            p->frags = f;
            p->frags_cap = cap;
        }
        p->frags[p->nfrags++] = 0;
        p->frag_open = true;
    }
    p->frags[p->nfrags - 1]++;
    for (size_t i = 0; i < p->nbr; i++)
        if (branch_feed(&p->br[i], c)) {
            hit = &p->br[i];
            break;
        }
    if (hit == NULL)
        return;
    chat_branch_t b = *hit;
    size_t m = branch_len(&b);
    if (m > p->held.len)
        m = p->held.len;
    bool within = p->frag_open && p->frags[p->nfrags - 1] >= m;
    held_release(p, p->held.len - m);
    p->held.len = 0;          /* the pattern's bytes: its action stands for them */
    p->nfrags = 0;
    p->frag_open = false;     /* what follows in this feed starts a new fragment */
    p->pending = true;
    p->pend_act = b.act;
    p->pend_label = b.label;
    p->pend_within = within;
    p->pend_checked = false;
    p->pend_glued = false;
    stage_enter(p, b.next, b.next_flag);
}

/* End of a feed. The held bytes that no branch can still use go out, but only
 * in whole fragments (what one feed added since the last match): the
 * reference reader releases no part of a piece that ends inside a possible
 * marker. A pending pattern action waits while everything after it is a
 * possible marker, if the pattern and those bytes came in one feed (the
 * reference's timing, found by comparing piece by piece); otherwise it is
 * taken at the end of the feed. The deltas are the reference's, piece for
 * piece. */
static void
release_held(td_chat_parser_t *p)
{
    size_t m = 0, n = 0;

    for (size_t i = 0; i < p->nbr; i++) {
        size_t l = branch_len(&p->br[i]);
        if (l > m)
            m = l;
    }
    bool all_partial = p->held.len > 0 && m >= p->held.len;
    if (p->pending) {
        if (!p->pend_checked) {
            p->pend_checked = true;
            p->pend_glued = p->pend_within && p->held.len > 0;
        }
        if (!(p->pend_glued && all_partial))
            pending_release(p);
    }
    if (all_partial)
        return;
    size_t limit = p->held.len - m;
    for (size_t k = 0; k < p->nfrags && n + p->frags[k] <= limit; k++)
        n += p->frags[k];
    if (n)
        held_release(p, n);
}

/* Length of a well-formed UTF-8 character at s (n bytes available): > 0 when
 * complete, 0 when s is a valid but unfinished start, -k when the first k
 * bytes are an ill-formed sequence (replaced by one U+FFFD). */
static int
utf8_char(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n)
            return 0;
        uint8_t b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF))
            return -i;
    }
    return need;
}

static void
feed_utf8(td_chat_parser_t *p, const uint8_t *s, size_t n, bool final)
{
    size_t i = 0;

    while (i < n) {
        int k = utf8_char(s + i, n - i);
        if (k == 0 && !final)
            break;
        if (k <= 0) {
            static const char repl[] = "\xef\xbf\xbd";
            for (int j = 0; j < 3; j++)
                feed_byte(p, repl[j]);
            i += k < 0 ? (size_t)-k : n - i;
            continue;
        }
        for (int j = 0; j < k; j++)
            feed_byte(p, (char)s[i + j]);
        i += (size_t)k;
    }
    if (i < n) {   /* an unfinished character: keep it */
        memcpy(p->utf8, s + i, n - i);
        p->nutf8 = n - i;
    }
}

static void
deltas_begin(td_chat_parser_t *p)
{
    p->ndeltas = 0;
    p->dtext.len = 0;
}

/* Point the deltas at their texts (dtext no longer moves) and refresh the reply. */
static td_status_t
deltas_end(td_chat_parser_t *p, const td_chat_delta_t **deltas, size_t *ndeltas)
{
    td_chat_reply_t *r = &p->reply;

    buf_terminate(&p->dtext);
    buf_terminate(&p->content);
    buf_terminate(&p->reasoning);
    for (size_t i = 0; i < r->ncalls; i++) {
        buf_terminate(&p->args[i]);
        if (p->args[i].oom)
            p->oom = true;
        r->calls[i].arguments = p->args[i].p;
        r->calls[i].arguments_len = p->args[i].len;
    }
    if (p->oom || p->dtext.oom || p->content.oom || p->reasoning.oom || p->held.oom ||
        p->name.oom) {
        td_error("chat: out of memory reading the model output");
        p->finished = true;   /* the reply is incomplete; nothing more can be added */
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < p->ndeltas; i++)
        p->deltas[i].text = p->dtext.p + p->doff[i];
    r->content = p->content.p;
    r->content_len = p->content.len;
    r->reasoning = chat_starts_in_reasoning(p->start) ? p->reasoning.p : NULL;
    r->reasoning_len = chat_starts_in_reasoning(p->start) ? p->reasoning.len : 0;
    *deltas = p->deltas;
    *ndeltas = p->ndeltas;
    return TD_OK;
}

/* ---- The parser's public side ------------------------------------------- */

td_status_t
td_chat_parser_create(const td_chat_parse_opts_t *opts, td_chat_parser_t **out)
{
    td_chat_parser_t *p = calloc(1, sizeof(*p));
    td_status_t st = TD_ERR_NOMEM;

    if (p == NULL)
        return TD_ERR_NOMEM;
    if (opts->start > TD_CHAT_START_CONTENT_CONT) {
        td_error("chat: parser: unknown start stage %d", (int)opts->start);
        st = TD_ERR_INVALID;
        goto err_free;
    }
    p->start = opts->start;
    p->tool_calls = opts->tool_calls;
    for (int i = 0; i < PAT_NFIXED; i++)
        if (pat_init(&p->pats[i], chat_fixed_pats[i], strlen(chat_fixed_pats[i])) != TD_OK)
            goto err_free;
    p->stops = calloc(opts->nstop ? opts->nstop : 1, sizeof(*p->stops));
    if (p->stops == NULL)
        goto err_free;
    for (size_t i = 0; i < opts->nstop; i++) {
        if (opts->stop[i] == NULL || opts->stop[i][0] == '\0') {
            td_error("chat: parser: stop string %zu is empty", i);
            st = TD_ERR_INVALID;
            goto err_free;
        }
        char *s = strdup(opts->stop[i]);
        if (s == NULL)
            goto err_free;
        if (pat_init(&p->stops[p->nstop], s, strlen(s)) != TD_OK) {
            free(s);
            goto err_free;
        }
        p->nstop++;
    }
    p->br = calloc(p->nstop + 4, sizeof(*p->br));
    if (p->br == NULL)
        goto err_free;
    p->rng = opts->id_seed;
    if (p->rng == 0 && getrandom(&p->rng, sizeof(p->rng), 0) != (ssize_t)sizeof(p->rng)) {
        struct timespec ts;   /* ids need to be unlikely to repeat, not secret */
        clock_gettime(CLOCK_REALTIME, &ts);
        p->rng = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    }
    if (opts->in_tool_calls)
        stage_enter(p, STAGE_CALLS, false);
    else if (opts->start == TD_CHAT_START_REASONING)
        stage_enter(p, STAGE_REASONING, true);
    else if (opts->start == TD_CHAT_START_REASONING_CONT)
        stage_enter(p, STAGE_REASONING, false);
    else
        stage_enter(p, STAGE_CONTENT, opts->start == TD_CHAT_START_PLAIN);
    buf_terminate(&p->content);
    buf_terminate(&p->reasoning);
    if (p->content.oom || p->reasoning.oom)
        goto err_free;
    p->reply.content = p->content.p;
    p->reply.reasoning = chat_starts_in_reasoning(p->start) ? p->reasoning.p : NULL;
    *out = p;
    return TD_OK;
err_free:
    td_chat_parser_destroy(p);
    return st;
}

void
td_chat_parser_destroy(td_chat_parser_t *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < PAT_NFIXED; i++)
        free(p->pats[i].fail);
    for (size_t i = 0; i < p->nstop; i++) {
        free((char *)p->stops[i].s);
        free(p->stops[i].fail);
    }
    free(p->stops);
    free(p->br);
    free(p->frags);
    buf_free(&p->held);
    buf_free(&p->content);
    buf_free(&p->reasoning);
    buf_free(&p->name);
    for (size_t i = 0; i < p->reply.ncalls; i++) {
        free(p->reply.calls[i].id);
        free(p->reply.calls[i].name);
        buf_free(&p->args[i]);
    }
    free(p->reply.calls);
    free(p->args);
    free(p->deltas);
    free(p->doff);
    buf_free(&p->dtext);
    free(p);
}

td_status_t
td_chat_parser_feed(td_chat_parser_t *p, const char *text, size_t len,
                    const td_chat_delta_t **deltas, size_t *ndeltas)
{
    if (p->finished) {
        td_error("chat: parser: feed after finish");
        return TD_ERR_STATE;
    }
    deltas_begin(p);
    p->frag_open = false;
    if (!p->stopped && len > 0) {   /* after a stop string, the rest is ignored */
        const uint8_t *s = (const uint8_t *)text;
        /* Complete a character left unfinished by the last feed first. */
        while (p->nutf8 && len) {
            p->utf8[p->nutf8++] = *s++;
            len--;
            int k = utf8_char(p->utf8, p->nutf8);
            if (k != 0 || p->nutf8 == 4) {
                uint8_t tmp[4];
                size_t n = p->nutf8;
                memcpy(tmp, p->utf8, n);
                p->nutf8 = 0;
                feed_utf8(p, tmp, n, false);
            }
        }
        feed_utf8(p, s, len, false);
        release_held(p);
    }
    return deltas_end(p, deltas, ndeltas);
}

td_status_t
td_chat_parser_finish(td_chat_parser_t *p, td_chat_finish_t engine,
                      const td_chat_delta_t **deltas, size_t *ndeltas)
{
    if (p->finished) {
        td_error("chat: parser: finished twice");
        return TD_ERR_STATE;
    }
    deltas_begin(p);
    /* A call announced only now, by the final flush, does not make the
     * finish reason "tool_calls" (the reference decides it before). */
    bool had_calls = p->reply.ncalls > 0;
    p->frag_open = false;
    if (!p->stopped) {
        if (p->nutf8) {
            uint8_t tmp[4];
            size_t n = p->nutf8;
            memcpy(tmp, p->utf8, n);
            p->nutf8 = 0;
            feed_utf8(p, tmp, n, true);
        }
        held_release(p, p->held.len);
    }
    if (p->stopped)
        p->reply.finish = TD_CHAT_FINISH_STOP;
    else if (engine == TD_CHAT_FINISH_LENGTH)
        p->reply.finish = TD_CHAT_FINISH_LENGTH;
    else if (had_calls)
        p->reply.finish = TD_CHAT_FINISH_TOOL_CALLS;
    else
        p->reply.finish = TD_CHAT_FINISH_STOP;
    td_status_t st = deltas_end(p, deltas, ndeltas);
    p->finished = true;
    return st;
}

bool
td_chat_parser_stopped(const td_chat_parser_t *p)
{
    return p->stopped;
}

const td_chat_reply_t *
td_chat_parser_reply(const td_chat_parser_t *p)
{
    return &p->reply;
}

const char *
td_chat_finish_str(td_chat_finish_t f)
{
    switch (f) {
    case TD_CHAT_FINISH_STOP:       return "stop";
    case TD_CHAT_FINISH_LENGTH:     return "length";
    case TD_CHAT_FINISH_TOOL_CALLS: return "tool_calls";
    }
    return "stop";
}

void
td_chat_reply_destroy(td_chat_reply_t *r)
{
    if (r == NULL)
        return;
    free(r->content);
    free(r->reasoning);
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r);
}

td_status_t
td_chat_parse(const td_chat_parse_opts_t *opts, const char *text, size_t len,
              td_chat_finish_t engine, td_chat_reply_t **out)
{
    td_chat_parser_t *p = NULL;
    const td_chat_delta_t *d;
    size_t nd;
    td_status_t st;

    st = td_chat_parser_create(opts, &p);
    if (st != TD_OK)
        return st;
    st = td_chat_parser_feed(p, text, len, &d, &nd);
    if (st == TD_OK)
        st = td_chat_parser_finish(p, engine, &d, &nd);
    if (st != TD_OK)
        goto cleanup;
    td_chat_reply_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        st = TD_ERR_NOMEM;
        goto cleanup;
    }
    /* Move the reply's storage out of the parser. */
    *r = p->reply;
    if (r->reasoning != NULL)
        p->reasoning.p = NULL;
    p->content.p = NULL;
    for (size_t i = 0; i < r->ncalls; i++)
        p->args[i].p = NULL;
    p->reply.calls = NULL;
    p->reply.ncalls = 0;
    *out = r;
cleanup:
    td_chat_parser_destroy(p);
    return st;
}

td_status_t
td_chat_reply_json(const td_chat_reply_t *r, json_t **out)
{
    json_t *msg = json_object();
    json_t *calls = NULL;

    if (msg == NULL)
        return TD_ERR_NOMEM;
    if (json_object_set_new(msg, "role", json_string("assistant")) ||
        json_object_set_new(msg, "content",
                            json_stringn(r->content ? r->content : "", r->content_len)))
        goto err_nomem;
    if (r->reasoning &&
        json_object_set_new(msg, "reasoning_content",
                            json_stringn(r->reasoning ? r->reasoning : "", r->reasoning_len)))
        goto err_nomem;
    if (r->ncalls) {
        calls = json_array();
        if (calls == NULL)
            goto err_nomem;
        for (size_t i = 0; i < r->ncalls; i++) {
            const td_chat_tool_call_t *c = &r->calls[i];
            json_t *call = json_pack("{s:I, s:s, s:s, s:{s:s, s:s%}}", "index", (json_int_t)i,
                                     "id", c->id, "type", "function", "function",
                                     "name", c->name, "arguments",
                                     c->arguments ? c->arguments : "", c->arguments_len);
            if (call == NULL || json_array_append_new(calls, call))
                goto err_nomem;
        }
        if (json_object_set_new(msg, "tool_calls", calls)) {
            calls = NULL;
            goto err_nomem;
        }
        calls = NULL;
    }
    *out = msg;
    return TD_OK;
err_nomem:
    json_decref(calls);
    json_decref(msg);
    return TD_ERR_NOMEM;
}

/* ---- The prompt as ids ------------------------------------------------- */

/* Append k ids to *ids (*n used, *cap allocated). */
static td_status_t
chat_ids_append(uint32_t **ids, size_t *n, size_t *cap, const uint32_t *add, size_t k)
{
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *n + k)
            c *= 2;
        uint32_t *v = realloc(*ids, c * sizeof *v);
        if (!v)
            return TD_ERR_NOMEM;
        *ids = v;
        *cap = c;
    }
    memcpy(*ids + *n, add, k * sizeof *add);
    *n += k;
    return TD_OK;
}

td_status_t
td_chat_prompt_ids(const td_chat_prompt_t *p, const td_tokenizer_t *tok, uint32_t **out,
                   size_t *nout)
{
    uint32_t *ids = NULL, *part = NULL;
    size_t n = 0, cap = 0, np, at = 0;
    td_status_t st = TD_OK;

    for (size_t i = 0; st == TD_OK && i <= p->nspecials; i++) {
        size_t end = i < p->nspecials ? p->specials[i].start : p->len;
        if (end > at) {
            st = td_tokenizer_encode(tok, p->text + at, end - at, TD_TOKENIZER_NO_ADDED, &part,
                                     &np);
            if (st == TD_OK)
                st = chat_ids_append(&ids, &n, &cap, part, np);
            free(part);
            part = NULL;
        }
        if (st == TD_OK && i < p->nspecials) {
            uint32_t id;
            const td_chat_span_t *sp = &p->specials[i];
            st = td_tokenizer_find(tok, p->text + sp->start, sp->end - sp->start, &id);
            if (st != TD_OK)
                td_error("chat prompt: the tokenizer has no token \"%.*s\"",
                         (int)(sp->end - sp->start), p->text + sp->start);
            else
                st = chat_ids_append(&ids, &n, &cap, &id, 1);
            at = sp->end;
        }
    }
    if (st == TD_OK && !ids && !(ids = malloc(sizeof *ids)))
        st = TD_ERR_NOMEM;
    if (st != TD_OK) {
        free(ids);
        return st;
    }
    *out = ids;
    *nout = n;
    return TD_OK;
}
