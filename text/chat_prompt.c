/* text/chat_prompt.c — OpenAI-style chat requests checked (refusals in
 * OpenAI's error format) and rendered into the DeepSeek-V4.1 prompt text, with
 * the byte ranges of its special tokens; the prompt as token ids. The format
 * is described in docs/chat.md. */
#include "chat_prompt.h"
#include "chat.h"
#include "tokenizer.h"

#include "buf.h"
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON text ----------------------------------------------------------
 * The layout the prompt uses for tool schemas and non-string arguments:
 * Python's json.dumps with ", " and ": " separators, non-ASCII kept as is,
 * numbers the way Python prints them. */

static void
json_quote(td_buf_t *b, const char *s, size_t n)
{
    td_buf_append(b, "\"", 1);
    td_chat_json_escape(b, s, n);
    td_buf_append(b, "\"", 1);
}

/* A double as Python's repr() writes it: the shortest digits that read back
 * to the same value; exponent form when the decimal exponent is < -4 or
 * >= 16 ("1e-07", "1e+26"), otherwise fixed with at least one decimal
 * ("100000.0", "0.0001"). JSON has no NaN or infinity. */
static void
py_float(td_buf_t *b, double x)
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
        td_buf_append(b, "-", 1);
    if (decpt <= -4 || decpt > 16) {
        td_buf_append(b, digits, 1);
        if (nd > 1) {
            td_buf_append(b, ".", 1);
            td_buf_append(b, digits + 1, nd - 1);
        }
        td_buf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        td_buf_puts(b, "0.");
        for (int i = 0; i < -decpt; i++)
            td_buf_append(b, "0", 1);
        td_buf_append(b, digits, nd);
    } else if ((size_t)decpt < nd) {
        td_buf_append(b, digits, (size_t)decpt);
        td_buf_append(b, ".", 1);
        td_buf_append(b, digits + decpt, nd - (size_t)decpt);
    } else {
        td_buf_append(b, digits, nd);
        for (size_t i = nd; i < (size_t)decpt; i++)
            td_buf_append(b, "0", 1);
        td_buf_puts(b, ".0");
    }
}

static void
py_dump(td_buf_t *b, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        bool first = true;

        td_buf_append(b, "{", 1);
        json_object_foreach((json_t *)v, key, val) {
            if (!first)
                td_buf_puts(b, ", ");
            first = false;
            json_quote(b, key, strlen(key));
            td_buf_puts(b, ": ");
            py_dump(b, val);
        }
        td_buf_append(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        td_buf_append(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                td_buf_puts(b, ", ");
            py_dump(b, json_array_get(v, i));
        }
        td_buf_append(b, "]", 1);
        break;
    case JSON_STRING:
        json_quote(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        td_buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        py_float(b, json_real_value(v));
        break;
    case JSON_TRUE:
        td_buf_puts(b, "true");
        break;
    case JSON_FALSE:
        td_buf_puts(b, "false");
        break;
    case JSON_NULL:
        td_buf_puts(b, "null");
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

static td_status_t chat_refuse(td_chat_prompt_err_t *err, td_status_t st, const char *param,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Fill err (may be NULL) and return st. A refusal is the client's doing and
 * goes back to it in err; the encoder does not log it (the caller may). */
static td_status_t
chat_refuse(td_chat_prompt_err_t *err, td_status_t st, const char *param, const char *fmt, ...)
{
    td_chat_prompt_err_t local;
    td_chat_prompt_err_t *e = err ? err : &local;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    utf8_trim(e->message);
    utf8_trim(e->param);
    e->code = st == TD_ERR_UNSUPPORTED ? "unsupported_value" : NULL;
    return st;
}

td_status_t
td_chat_prompt_err_json(const td_chat_prompt_err_t *e, char **out)
{
    json_t *inner = json_pack("{s:s, s:s, s:o, s:o}", "message", e->message,
                              "type", "invalid_request_error",
                              "param", e->param[0] ? json_string(e->param) : json_null(),
                              "code", e->code ? json_string(e->code) : json_null());
    json_t *root = inner ? json_pack("{s:o}", "error", inner) : NULL;
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;

    json_decref(root);
    if (s == NULL) {
        td_error("chat prompt: out of memory writing an error body");
        return TD_ERR_NOMEM;
    }
    *out = s;
    return TD_OK;
}

/* ---- Fixed prompt text ------------------------------------------------- */

/* The spellings that count as special tokens inside the fixed texts below. */
static const char *const chat_template_specials[] = {
    TD_CHAT_TOK_DSML, TD_CHAT_TOK_THINK, TD_CHAT_TOK_UNTHINK,
};

#define EFFORT_LINE "Reasoning Effort: %u (range 1-100, the higher the value, the more " \
                    "thorough the reasoning)\n\n"

static const char chat_tools_head[] =
    "\n\n## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke "
    "tools by writing a \"<" TD_CHAT_TOK_DSML " calls>\" block like the following:\n"
    "\n"
    "<" TD_CHAT_TOK_DSML " calls>\n"
    "<" TD_CHAT_TOK_DSML " invoke name=\"$TOOL_NAME\">\n"
    "<" TD_CHAT_TOK_DSML " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
    "$PARAMETER_VALUE</" TD_CHAT_TOK_DSML " parameter>\n"
    "...\n"
    "</" TD_CHAT_TOK_DSML " invoke>\n"
    "<" TD_CHAT_TOK_DSML " invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" TD_CHAT_TOK_DSML " invoke>\n"
    "</" TD_CHAT_TOK_DSML " calls>\n"
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
    int rformat;                /* response_format: 0 text, 1 json_object, 2 json_schema */
    const json_t *rschema;      /* json_schema's schema (rformat 2) */
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
conv_content(const json_t *msg, size_t mi, bool null_ok, td_buf_t *out, bool *present,
             td_chat_prompt_err_t *err)
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
        td_buf_append(out, json_string_value(c), json_string_length(c));
        return TD_OK;
    }
    if (!json_is_array(c))
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': expected a string or an array of content parts, "
                           "got %s.", param, json_type_name(c));
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
            td_buf_puts(out, "\n\n");
        td_buf_append(out, json_string_value(text), json_string_length(text));
    }
    return TD_OK;
}

/* An optional string member; *s NULL when absent or null. */
static td_status_t
conv_opt_string(const json_t *obj, const char *key, const char *param, const char **s,
                size_t *len, td_chat_prompt_err_t *err)
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

/* A string member that must be there. */
static td_status_t
conv_string(const json_t *obj, const char *key, const char *param, const char **s, size_t *len,
            td_chat_prompt_err_t *err)
{
    const json_t *v = json_object_get(obj, key);

    if (!json_is_string(v))
        return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a string.", param);
    *s = json_string_value(v);
    *len = json_string_length(v);
    return TD_OK;
}

static td_status_t
conv_tool_calls(const json_t *tc, size_t mi, chat_msg_t *m, td_chat_prompt_err_t *err)
{
    char param[96];
    td_status_t st;
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
        if ((st = conv_string(call, "id", param, &cc->id, &cc->id_len, err)) != TD_OK)
            return st;
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
        if ((st = conv_string(fn, "name", param, &cc->name, &cc->name_len, err)) != TD_OK)
            return st;
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
conv_run_close(chat_conv_t *c, chat_run_t *run, td_chat_prompt_err_t *err)
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

/* An assistant message: its content, reasoning, tool calls and prefix flag
 * into cm (role set). On failure cm->calls is freed. */
static td_status_t
conv_assistant(const json_t *m, size_t mi, size_t n, bool had_tools, bool seen_calls,
               chat_msg_t *cm, td_buf_t *text, td_chat_prompt_err_t *err)
{
    char param[96];
    bool present;
    td_status_t st;

    cm->role = ROLE_ASSISTANT;
    st = conv_content(m, mi, true, text, &present, err);
    if (st != TD_OK)
        return st;
    snprintf(param, sizeof(param), "messages[%zu].reasoning_content", mi);
    st = conv_opt_string(m, "reasoning_content", param, &cm->reasoning, &cm->reasoning_len,
                         err);
    if (st != TD_OK)
        return st;
    const json_t *tc = get_opt(m, "tool_calls");
    snprintf(param, sizeof(param), "messages[%zu].tool_calls", mi);
    if (tc != NULL && !json_is_array(tc))
        return chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an array, got %s.",
                           param, json_type_name(tc));
    if (tc != NULL && (st = conv_tool_calls(tc, mi, cm, err)) != TD_OK)
        goto err_calls;
    if (!present && cm->ncalls == 0) {
        snprintf(param, sizeof(param), "messages[%zu]", mi);
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid assistant message '%s': content or tool_calls must be set.",
                           param);
    }
    const json_t *pv = get_opt(m, "prefix");
    snprintf(param, sizeof(param), "messages[%zu].prefix", mi);
    if (pv != NULL && !json_is_boolean(pv)) {
        st = chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected a boolean, got %s.",
                         param, json_type_name(pv));
        goto err_calls;
    }
    cm->prefix = pv != NULL && json_is_true(pv);
    if (cm->prefix && mi + 1 != n) {
        st = chat_refuse(err, TD_ERR_INVALID, param,
                         "Invalid '%s': only the last message may be an assistant message "
                         "with prefix set.", param);
        goto err_calls;
    }
    if (cm->prefix && (had_tools || cm->ncalls || seen_calls)) {
        st = chat_refuse(err, TD_ERR_INVALID, param,
                         "Invalid '%s': a prefix continuation cannot be combined with tools or "
                         "tool calls.", param);
        goto err_calls;
    }
    return TD_OK;
err_calls:
    free(cm->calls);
    cm->calls = NULL;
    return st;
}

/* A tool message: the result of one call of the open run, into cm. */
static td_status_t
conv_tool_result(const chat_conv_t *c, chat_run_t *run, const json_t *m, size_t mi,
                 chat_msg_t *cm, td_buf_t *text, td_chat_prompt_err_t *err)
{
    char param[96];
    bool present;
    td_status_t st;
    const json_t *idv = json_object_get(m, "tool_call_id");

    snprintf(param, sizeof(param), "messages[%zu].tool_call_id", mi);
    if (!json_is_string(idv))
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': a tool message needs the string id of the call it "
                           "answers.", param);
    st = conv_content(m, mi, false, text, &present, err);
    if (st != TD_OK)
        return st;
    if (!run->open)
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Messages with role 'tool' must be a response to a preceding "
                           "message with 'tool_calls' (messages[%zu]).", mi);
    const chat_msg_t *a = &c->msgs[run->assistant];
    size_t k;
    for (k = 0; k < a->ncalls; k++)
        if (a->calls[k].id_len == json_string_length(idv) &&
            memcmp(a->calls[k].id, json_string_value(idv), a->calls[k].id_len) == 0)
            break;
    if (k == a->ncalls || run->answered[k])
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': '%s' is not the id of a tool call of the preceding "
                           "assistant message that awaits a result.", param,
                           json_string_value(idv));
    run->answered[k] = true;
    cm->role = ROLE_TOOL;
    cm->answers = k;
    return TD_OK;
}

/* One message of the request (an object) by its role into cm and text;
 * *skip when it says nothing (an empty system message). A message with
 * another role than tool closes the open run of tool results. */
static td_status_t
conv_message(chat_conv_t *c, chat_run_t *run, const json_t *m, size_t mi, size_t n,
             bool had_tools, bool seen_calls, chat_msg_t *cm, td_buf_t *text, bool *skip,
             td_chat_prompt_err_t *err)
{
    char param[96];
    bool present;
    td_status_t st;
    const json_t *rv = json_object_get(m, "role");

    snprintf(param, sizeof(param), "messages[%zu].role", mi);
    if (!json_is_string(rv))
        return chat_refuse(err, TD_ERR_INVALID, param,
                           "Invalid '%s': expected one of 'system', 'developer', 'user', "
                           "'assistant', 'tool', 'latest_reminder'.", param);
    const char *role = json_string_value(rv);
    if (strcmp(role, "tool") != 0 && (st = conv_run_close(c, run, err)) != TD_OK)
        return st;
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
        cm->role = ROLE_SYSTEM;
        st = conv_content(m, mi, false, text, &present, err);
        *skip = st == TD_OK && text->len == 0;
        return st;
    }
    if (strcmp(role, "user") == 0) {
        cm->role = ROLE_USER;
        return conv_content(m, mi, false, text, &present, err);
    }
    if (strcmp(role, "latest_reminder") == 0) {
        const json_t *v = json_object_get(m, "content");
        snprintf(param, sizeof(param), "messages[%zu].content", mi);
        if (!json_is_string(v))
            return chat_refuse(err, TD_ERR_INVALID, param,
                               "Invalid '%s': a latest_reminder message takes a string.", param);
        td_buf_append(text, json_string_value(v), json_string_length(v));
        cm->role = ROLE_REMINDER;
        return TD_OK;
    }
    if (strcmp(role, "assistant") == 0)
        return conv_assistant(m, mi, n, had_tools, seen_calls, cm, text, err);
    if (strcmp(role, "tool") == 0)
        return conv_tool_result(c, run, m, mi, cm, text, err);
    return chat_refuse(err, TD_ERR_INVALID, param,
                       "Invalid value for '%s': '%s' is not one of 'system', 'developer', "
                       "'user', 'assistant', 'tool', 'latest_reminder'.", param, role);
}

/* Keep cm (its text taken from text) in c; an assistant message with tool
 * calls opens the run of their results. */
static td_status_t
conv_keep(chat_conv_t *c, chat_run_t *run, chat_msg_t *cm, td_buf_t *text, size_t mi)
{
    cm->text = td_buf_take(text, &cm->len);   /* text is empty again */
    if (cm->text == NULL || conv_push(c, cm) != TD_OK) {
        free(cm->text);
        free(cm->calls);
        return TD_ERR_NOMEM;
    }
    if (cm->role == ROLE_ASSISTANT && cm->ncalls) {
        free(run->answered);
        run->answered = calloc(cm->ncalls, sizeof(bool));
        if (run->answered == NULL)
            return TD_ERR_NOMEM;
        run->open = true;
        run->assistant = c->nmsgs - 1;
        run->request_mi = mi;
        run->first = c->nmsgs;
    }
    return TD_OK;
}

static td_status_t
conv_messages(chat_conv_t *c, const json_t *msgs, bool had_tools, td_chat_prompt_err_t *err)
{
    chat_run_t run = { 0 };
    td_buf_t text = { 0 };
    bool seen_calls = false;    /* an earlier assistant message called tools */
    td_status_t st = TD_OK;
    size_t n = json_array_size(msgs);
    char param[96];

    for (size_t mi = 0; mi < n; mi++) {
        const json_t *m = json_array_get(msgs, mi);
        chat_msg_t cm = { 0 };
        bool skip = false;

        snprintf(param, sizeof(param), "messages[%zu]", mi);
        if (!json_is_object(m)) {
            st = chat_refuse(err, TD_ERR_INVALID, param, "Invalid '%s': expected an object.",
                             param);
            goto out;
        }
        td_buf_truncate(&text, 0);
        st = conv_message(c, &run, m, mi, n, had_tools, seen_calls, &cm, &text, &skip, err);
        if (st != TD_OK)
            goto out;
        if (skip)
            continue;
        seen_calls = seen_calls || cm.ncalls > 0;
        if ((st = conv_keep(c, &run, &cm, &text, mi)) != TD_OK)
            goto out;
    }
    st = conv_run_close(c, &run, err);
out:
    free(run.answered);
    td_buf_free(&text);
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
conv_tools(chat_conv_t *c, const json_t *tools, td_chat_prompt_err_t *err)
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

/* "response_format": text, json_object or json_schema; the two JSON ones
 * are told to the model in the system part, as the reference encoding does
 * (the sampler's constraint then enforces them: docs/structured-output.md). */
static td_status_t
conv_response_format(chat_conv_t *c, const json_t *rf, const char *type,
                     td_chat_prompt_err_t *err)
{
    if (type != NULL && strcmp(type, "json_object") == 0) {
        c->rformat = 1;
        return TD_OK;
    }
    if (type != NULL && strcmp(type, "json_schema") == 0) {
        const json_t *js = json_object_get(rf, "json_schema");
        const json_t *schema = json_is_object(js) ? get_opt(js, "schema") : NULL;
        if (schema == NULL)
            return chat_refuse(err, TD_ERR_INVALID, "response_format.json_schema.schema",
                               "Invalid 'response_format.json_schema': expected an object "
                               "with 'schema'.");
        c->rformat = 2;
        c->rschema = schema;
        return TD_OK;
    }
    if (type == NULL || strcmp(type, "text") != 0)
        return chat_refuse(err, TD_ERR_INVALID, "response_format.type",
                           "Invalid 'response_format': expected a type of 'text', "
                           "'json_object' or 'json_schema'.");
    return TD_OK;
}

/* "tool_choice": auto (default), none (the tools are not shown), required or
 * a named function (thinking off only: the prompt opens the tool-call block;
 * a named function is the only one shown). Without tools it does nothing. */
static td_status_t
conv_tool_choice(chat_conv_t *c, const json_t *tc, td_chat_prompt_err_t *err)
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

/* chat_template_kwargs.thinking, the V4.1 template's switch as vLLM's
 * clients pass it: -1 when absent (or null), else 0 / 1; a value that is not
 * a boolean is refused. */
static td_status_t
conv_template_thinking(const json_t *req, int *thinking, td_chat_prompt_err_t *err)
{
    const json_t *k = get_opt(req, "chat_template_kwargs");
    const json_t *t = json_is_object(k) ? get_opt(k, "thinking") : NULL;

    *thinking = -1;
    if (t == NULL)
        return TD_OK;
    if (!json_is_boolean(t))
        return chat_refuse(err, TD_ERR_INVALID, "chat_template_kwargs.thinking",
                           "Invalid 'chat_template_kwargs.thinking': expected a boolean, got "
                           "%s.", json_type_name(t));
    *thinking = json_is_true(t);
    return TD_OK;
}

/* Thinking and its effort: chat_template_kwargs.thinking wins, then an
 * explicit "thinking"; without either, effort "none" turns thinking off.
 * Effort minimal/low -> 50, ultra/max -> 100, anything else (or none given)
 * -> 75. */
static td_status_t
conv_thinking(chat_conv_t *c, const json_t *req, const td_chat_prompt_opts_t *opts,
              td_chat_prompt_err_t *err)
{
    int thinking = opts ? opts->thinking : -1;
    const char *effort = opts ? opts->effort : NULL;
    td_status_t st;

    if (thinking < 0 && req != NULL &&
        (st = conv_template_thinking(req, &thinking, err)) != TD_OK)
        return st;
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
conv_stop(chat_conv_t *c, const json_t *stop, td_chat_prompt_err_t *err)
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
conv_build(chat_conv_t *c, const json_t *request, const td_chat_prompt_opts_t *opts,
           td_chat_prompt_err_t *err)
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
            st = conv_response_format(c, rf, s, err);
            if (st != TD_OK)
                return st;
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
    td_buf_t text;
    td_chat_prompt_span_t *spans;
    size_t nspans, cap;
    bool oom;
} chat_out_t;

static void
out_text(chat_out_t *o, const char *s, size_t n)
{
    td_buf_append(&o->text, s, n);
}

static void
out_texts(chat_out_t *o, const char *s)
{
    td_buf_puts(&o->text, s);
}

static void
out_special(chat_out_t *o, const char *tok)
{
    size_t start = o->text.len;

    td_buf_puts(&o->text, tok);
    if (o->nspans == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 32;
        td_chat_prompt_span_t *n = realloc(o->spans, cap * sizeof(*n));
        if (n == NULL) {
            o->oom = true;
            return;
        }
        o->spans = n;
        o->cap = cap;
    }
    o->spans[o->nspans++] = (td_chat_prompt_span_t){ start, o->text.len };
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

/* The response format's section of the system part (json_object, json_schema). */
static void
render_response_format(chat_out_t *o, const chat_conv_t *c)
{
    if (c->rformat == 0)
        return;
    out_texts(o, "\n\n## Response Format:\n\nYou MUST strictly adhere to the following "
                 "schema to reply:\n");
    if (c->rformat == 1)
        out_texts(o, "{\"type\": \"json_object\"}");
    else
        py_dump(&o->text, c->rschema);
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
    if (c->ntools == 0) {
        render_response_format(o, c);
        return;
    }
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
    render_response_format(o, c);
}


static void
render_param(chat_out_t *o, const char *name, size_t name_len, bool string)
{
    out_template(o, "<" TD_CHAT_TOK_DSML " parameter name=\"");
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

    out_template(o, "<" TD_CHAT_TOK_DSML " invoke name=\"");
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
            out_template(o, "</" TD_CHAT_TOK_DSML " parameter>");
        }
    } else {
        render_param(o, "arguments", 9, true);
        out_text(o, call->args, call->args_len);
        out_template(o, "</" TD_CHAT_TOK_DSML " parameter>");
    }
    json_decref(args);
    out_texts(o, "\n");
    out_template(o, "</" TD_CHAT_TOK_DSML " invoke>\n");
}

static void
render_assistant(chat_out_t *o, const chat_conv_t *c, const chat_msg_t *m, bool first)
{
    const char *rc = m->reasoning ? m->reasoning : "";
    size_t rc_len = m->reasoning ? m->reasoning_len : 0;

    out_special(o, TD_CHAT_TOK_ASSISTANT);
    if (!c->thinking) {
        out_special(o, TD_CHAT_TOK_UNTHINK);
    } else if (m->prefix && !first) {
        /* A continuation: reasoning left open while there is no content yet
         * (not when the conversation starts with it: then it is dropped). */
        out_special(o, TD_CHAT_TOK_THINK);
        out_text(o, rc, rc_len);
        if (m->len)
            out_special(o, TD_CHAT_TOK_UNTHINK);
    } else if (c->ntools) {
        /* With tools, every turn keeps its reasoning; otherwise it is dropped. */
        out_special(o, TD_CHAT_TOK_THINK);
        out_text(o, rc, rc_len);
        out_special(o, TD_CHAT_TOK_UNTHINK);
    } else {
        out_special(o, TD_CHAT_TOK_UNTHINK);
    }
    out_text(o, m->text, m->len);
    if (m->ncalls) {
        out_template(o, "\n\n<" TD_CHAT_TOK_DSML " calls>\n");
        for (size_t k = 0; k < m->ncalls; k++)
            render_call(o, &m->calls[k]);
        out_template(o, "</" TD_CHAT_TOK_DSML " calls>");
    }
    if (!m->prefix)
        out_special(o, TD_CHAT_TOK_EOS);
}

static void
render(chat_out_t *o, const chat_conv_t *c)
{
    bool system_extra = c->thinking || c->ntools > 0 || c->rformat != 0;
    const chat_msg_t *last = c->nmsgs ? &c->msgs[c->nmsgs - 1] : NULL;
    chat_role_t prev = ROLE_SYSTEM;
    bool have_prev = false;

    out_special(o, TD_CHAT_TOK_BOS);
    /* Without any message, the effort line alone makes no system block. */
    if (c->nmsgs == 0 ? c->ntools > 0 : system_extra && c->msgs[0].role != ROLE_SYSTEM) {
        out_special(o, TD_CHAT_TOK_SYSTEM);
        render_system_body(o, c, "", 0);
    }
    for (size_t i = 0; i < c->nmsgs; i++) {
        const chat_msg_t *m = &c->msgs[i];
        bool user_block = have_prev && (prev == ROLE_USER || prev == ROLE_TOOL);

        switch (m->role) {
        case ROLE_SYSTEM:
            out_special(o, TD_CHAT_TOK_SYSTEM);
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
                out_special(o, TD_CHAT_TOK_USER);
            if (m->role == ROLE_TOOL)
                out_texts(o, "<tool_result>");
            out_text(o, m->text, m->len);
            if (m->role == ROLE_TOOL)
                out_texts(o, "</tool_result>");
            break;
        case ROLE_REMINDER:
            /* Of several reminders in a row, the first is shown. */
            if (!(have_prev && prev == ROLE_REMINDER)) {
                out_special(o, TD_CHAT_TOK_REMINDER);
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
        out_special(o, TD_CHAT_TOK_ASSISTANT);
        out_special(o, c->thinking ? TD_CHAT_TOK_THINK : TD_CHAT_TOK_UNTHINK);
        if (c->in_tool_calls)
            out_template(o, "\n\n<" TD_CHAT_TOK_DSML " calls>\n");
    }
}

void
td_chat_prompt_destroy(td_chat_prompt_t *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->reply.nstop; i++)
        free((char *)p->reply.stop[i]);
    free((void *)p->reply.stop);
    free(p->text);
    free(p->specials);
    free(p);
}

td_status_t
td_chat_prompt_encode(const json_t *request, const td_chat_prompt_opts_t *opts,
                      td_chat_prompt_t **out, td_chat_prompt_err_t *err)
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
    if (o.oom || td_buf_reserve(&o.text, 0) != TD_OK) {
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
    p->reply.tool_calls = c.ntools > 0;
    p->reply.in_tool_calls = c.in_tool_calls;
    const chat_msg_t *last = c.nmsgs ? &c.msgs[c.nmsgs - 1] : NULL;
    if (!c.thinking)
        p->reply.start = TD_CHAT_REPLY_START_PLAIN;
    else if (last && last->role == ROLE_ASSISTANT && last->prefix)
        p->reply.start = last->len ? TD_CHAT_REPLY_START_CONTENT_CONT
                         : last->reasoning_len ? TD_CHAT_REPLY_START_REASONING_CONT
                         : TD_CHAT_REPLY_START_REASONING;
    else
        p->reply.start = TD_CHAT_REPLY_START_REASONING;
    if (c.nstop) {
        char **stop = calloc(c.nstop, sizeof(*stop));
        p->reply.stop = (const char *const *)stop;
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
            p->reply.nstop = i + 1;
        }
    }
    p->text = td_buf_take(&o.text, &p->len);
    p->specials = o.spans;
    p->nspecials = o.nspans;
    o.spans = NULL;
    *out = p;
    p = NULL;
    st = TD_OK;
cleanup:
    if (st == TD_ERR_NOMEM)
        td_error("chat prompt: out of memory encoding a request");
    td_chat_prompt_destroy(p);
    td_buf_free(&o.text);
    free(o.spans);
    conv_free(&c);
    return st;
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
            const td_chat_prompt_span_t *sp = &p->specials[i];
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

