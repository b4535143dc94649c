/* tests/chat/test_chat.c — the chat format (text/chat*.c) unit by unit: every
 * refusal (status, field, message, the OpenAI error body), the settings that
 * override the request, and the output reader's API (misuse, invalid UTF-8,
 * stop strings, tool call ids). */
#include "../unit/check.h"
#include "chat_prompt.h"
#include "log.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- Refusals ------------------------------------------------------------ */

typedef struct {
    const char *body;        /* the request, JSON */
    td_status_t st;
    const char *param;       /* "" for none */
    const char *needle;      /* part of the message */
} refusal_t;

#define TOOL(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"}}"
#define CALL(id) "{\"id\":\"" id "\",\"type\":\"function\",\"function\":{\"name\":\"f\"," \
                 "\"arguments\":\"{}\"}}"
#define U(text) "{\"role\":\"user\",\"content\":\"" text "\"}"

static const refusal_t refusals[] = {
    { "3", TD_ERR_INVALID, "", "JSON object with 'messages'" },
    { "{}", TD_ERR_INVALID, "messages", "expected an array of messages" },
    { "{\"messages\":{}}", TD_ERR_INVALID, "messages", "expected an array" },
    { "{\"messages\":[]}", TD_ERR_INVALID, "messages", "empty array" },
    { "[\"hi\"]", TD_ERR_INVALID, "messages[0]", "expected an object" },
    { "[{\"content\":\"x\"}]", TD_ERR_INVALID, "messages[0].role", "expected one of" },
    { "[{\"role\":\"robot\",\"content\":\"x\"}]", TD_ERR_INVALID, "messages[0].role",
      "'robot' is not one of" },
    { "[{\"role\":\"user\",\"content\":null}]", TD_ERR_INVALID, "messages[0].content",
      "got null" },
    { "[{\"role\":\"user\"}]", TD_ERR_INVALID, "messages[0].content", "got nothing" },
    { "[{\"role\":\"user\",\"content\":3}]", TD_ERR_INVALID, "messages[0].content",
      "got a number" },
    { "[{\"role\":\"user\",\"content\":[\"x\"]}]", TD_ERR_INVALID,
      "messages[0].content[0]", "expected a content part object" },
    { "[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]", TD_ERR_INVALID,
      "messages[0].content[0].type", "expected a string such as 'text'" },
    { "[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]", TD_ERR_INVALID,
      "messages[0].content[0].text", "expected a string" },
    { "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"see\"},"
      "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/y.png\"}}]}]",
      TD_ERR_UNSUPPORTED, "messages[0].content[1].type", "reads text only" },
    { "[{\"role\":\"user\",\"content\":[{\"type\":\"file\",\"file\":{\"file_id\":\"f\"}}]}]",
      TD_ERR_UNSUPPORTED, "messages[0].content[0].type", "'file' are not supported" },
    { "[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":{}}]}]",
      TD_ERR_UNSUPPORTED, "messages[0].content[0].type", "'input_audio' are not supported" },
    { "[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]", TD_ERR_INVALID,
      "messages[0].content[0].type", "'video' is not a content part type" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"},"
      "{\"role\":\"assistant\",\"content\":\"y\",\"prefix\":true}]",
      TD_ERR_INVALID, "messages[3].prefix", "cannot be combined with tools" },
    { "[" U("x") ",{\"role\":\"assistant\"}]", TD_ERR_INVALID, "messages[1]",
      "content or tool_calls must be set" },
    { "[" U("x") ",{\"role\":\"assistant\",\"content\":\"y\",\"reasoning_content\":3}]",
      TD_ERR_INVALID, "messages[1].reasoning_content", "expected a string" },
    { "[" U("x") ",{\"role\":\"assistant\",\"content\":\"y\",\"tool_calls\":{}}]",
      TD_ERR_INVALID, "messages[1].tool_calls", "expected an array" },
    { "[" U("x") ",{\"role\":\"assistant\",\"content\":\"y\",\"tool_calls\":[]}]",
      TD_ERR_INVALID, "messages[1].tool_calls", "empty array" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
      TD_ERR_INVALID, "messages[1].tool_calls[0].id", "expected a string" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"fn\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
      TD_ERR_INVALID, "messages[1].tool_calls[0].type", "expected 'function'" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
      "\"function\":{\"arguments\":\"{}\"}}]}]",
      TD_ERR_INVALID, "messages[1].tool_calls[0].function.name", "expected a string" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
      "\"function\":{\"name\":\"f\",\"arguments\":{\"k\":1}}}]}]",
      TD_ERR_INVALID, "messages[1].tool_calls[0].function.arguments",
      "string holding a JSON object" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "," CALL("a") "]}]",
      TD_ERR_INVALID, "messages[1].tool_calls[1].function.arguments",
      "Duplicate value for 'tool_call_id' of a" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "," CALL("b") "]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"}]",
      TD_ERR_INVALID, "messages", "did not have response messages: b" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "]}," U("y")
      ",{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"}]",
      TD_ERR_INVALID, "messages", "did not have response messages: a" },
    { "[" U("x") ",{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"}]",
      TD_ERR_INVALID, "messages[1].tool_call_id", "must be a response to a preceding" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r\"}]",
      TD_ERR_INVALID, "messages[2].tool_call_id", "'zz' is not the id of a tool call" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"}]",
      TD_ERR_INVALID, "messages[3].tool_call_id", "awaits a result" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "]},"
      "{\"role\":\"tool\",\"content\":\"r\"}]",
      TD_ERR_INVALID, "messages[2].tool_call_id", "needs the string id" },
    { "[" U("x") ",{\"role\":\"assistant\",\"tool_calls\":[" CALL("a") "]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":null}]",
      TD_ERR_INVALID, "messages[2].content", "got null" },
    { "[" U("x") ",{\"role\":\"assistant\",\"content\":\"y\",\"prefix\":true}," U("z") "]",
      TD_ERR_INVALID, "messages[1].prefix", "only the last message" },
    { "[" U("x") ",{\"role\":\"assistant\",\"content\":\"y\",\"prefix\":\"yes\"}]",
      TD_ERR_INVALID, "messages[1].prefix", "expected a boolean" },
    { "{\"messages\":[" U("x") ",{\"role\":\"assistant\",\"content\":\"y\",\"prefix\":true}],"
      "\"tools\":[" TOOL("f") "]}",
      TD_ERR_INVALID, "messages[1].prefix", "cannot be combined with tools" },
    { "[{\"role\":\"latest_reminder\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]",
      TD_ERR_INVALID, "messages[0].content", "takes a string" },
    { "{\"messages\":[" U("x") "],\"tools\":{}}", TD_ERR_INVALID, "tools",
      "expected an array" },
    { "{\"messages\":[" U("x") "],\"tools\":[3]}", TD_ERR_INVALID, "tools[0]",
      "expected an object" },
    { "{\"messages\":[" U("x") "],\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]}",
      TD_ERR_INVALID, "tools[0].type", "expected 'function'" },
    { "{\"messages\":[" U("x") "],\"tools\":[{\"type\":\"function\"}]}", TD_ERR_INVALID,
      "tools[0].function", "expected an object" },
    { "{\"messages\":[" U("x") "],\"tools\":[" TOOL("名前") "]}", TD_ERR_INVALID,
      "tools[0].function.name", "^[a-zA-Z0-9_-]+$" },
    { "{\"messages\":[" U("x") "],\"tools\":[" TOOL("") "]}", TD_ERR_INVALID,
      "tools[0].function.name", "does not match pattern" },
    { "{\"messages\":[" U("x") "],\"tools\":[" TOOL("a") "," TOOL("a") "]}", TD_ERR_INVALID,
      "tools[1].function.name", "must be unique" },
    { "{\"messages\":[" U("x") "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"description\":1}}]}", TD_ERR_INVALID, "tools[0].function.description",
      "expected a string" },
    { "{\"messages\":[" U("x") "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"parameters\":{\"type\":\"string\"}}}]}", TD_ERR_INVALID,
      "tools[0].function.parameters", "'type: \"object\"'" },
    { "{\"messages\":[" U("x") "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"parameters\":[]}}]}", TD_ERR_INVALID, "tools[0].function.parameters",
      "got an array" },
    { "{\"messages\":[" U("x") "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
      "\"parameters\":{\"type\":\"object\"},\"strict\":true}}]}", TD_ERR_UNSUPPORTED,
      "tools[0].function.strict", "Strict function schemas are not supported" },
    { "{\"messages\":[" U("x") "],\"tools\":[" TOOL("f") "],\"tool_choice\":\"required\"}",
      TD_ERR_INVALID, "tool_choice", "Thinking mode does not support" },
    { "{\"messages\":[" U("x") "],\"tools\":[" TOOL("f") "],\"tool_choice\":\"maybe\"}",
      TD_ERR_INVALID, "tool_choice", "'maybe'" },
    { "{\"messages\":[" U("x") "],\"tools\":[" TOOL("f") "],\"thinking\":{\"type\":\"disabled\"},"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
      TD_ERR_INVALID, "tool_choice", "no function named 'g'" },
    { "{\"messages\":[" U("x") "],\"tool_choice\":{\"type\":\"function\"}}",
      TD_ERR_INVALID, "tool_choice", "expected {\"type\": \"function\"" },
    { "{\"messages\":[" U("x") "],\"thinking\":{\"type\":\"auto\"}}", TD_ERR_INVALID,
      "thinking.type", "Invalid 'thinking'" },
    { "{\"messages\":[" U("x") "],\"thinking\":true}", TD_ERR_INVALID, "thinking.type",
      "Invalid 'thinking'" },
    { "{\"messages\":[" U("x") "],\"chat_template_kwargs\":{\"thinking\":1}}", TD_ERR_INVALID,
      "chat_template_kwargs.thinking", "expected a boolean" },
    { "{\"messages\":[" U("x") "],\"reasoning_effort\":\"extreme\"}", TD_ERR_INVALID,
      "reasoning_effort", "'extreme'" },
    { "{\"messages\":[" U("x") "],\"reasoning_effort\":5}", TD_ERR_INVALID,
      "reasoning_effort", "expected a string" },
    { "{\"messages\":[" U("x") "],\"response_format\":{\"type\":\"json_schema\","
      "\"json_schema\":{\"name\":\"a\"}}}", TD_ERR_INVALID,
      "response_format.json_schema.schema", "expected an object with 'schema'" },
    { "{\"messages\":[" U("x") "],\"response_format\":{\"type\":\"yaml\"}}", TD_ERR_INVALID,
      "response_format.type", "Invalid 'response_format'" },
    { "{\"messages\":[" U("x") "],\"stop\":[\"a\",\"\"]}", TD_ERR_INVALID, "stop[1]",
      "empty string" },
    { "{\"messages\":[" U("x") "],\"stop\":[\"a\",1]}", TD_ERR_INVALID, "stop[1]",
      "expected a string" },
    { "{\"messages\":[" U("x") "],\"stop\":3}", TD_ERR_INVALID, "stop",
      "expected a string or an array" },
};

static void
test_refusals(void)
{
    for (size_t i = 0; i < sizeof(refusals) / sizeof(*refusals); i++) {
        const refusal_t *r = &refusals[i];
        json_error_t jerr;
        json_t *req = json_loads(r->body, JSON_DECODE_ANY, &jerr);
        td_chat_prompt_t *p = NULL;
        td_chat_prompt_err_t err;

        CHECK(req != NULL);
        if (req == NULL) {
            fprintf(stderr, "case %zu: %s\n", i, jerr.text);
            continue;
        }
        memset(&err, 0, sizeof(err));
        td_status_t st = td_chat_prompt_encode(req, NULL, &p, &err);
        if (st != r->st || strcmp(err.param, r->param) != 0 ||
            strstr(err.message, r->needle) == NULL)
            fprintf(stderr, "case %zu %s: got %s param '%s' message '%s'\n", i, r->body,
                    td_status_str(st), err.param, err.message);
        CHECK_STATUS(st, r->st);
        CHECK_STR(err.param, r->param);
        CHECK(strstr(err.message, r->needle) != NULL);
        CHECK(p == NULL);
        if (r->st == TD_ERR_UNSUPPORTED)
            CHECK_STR(err.code, "unsupported_value");
        else
            CHECK(err.code == NULL);

        /* The error body: OpenAI's shape, the same message. */
        char *body = NULL;
        CHECK_STATUS(td_chat_prompt_err_json(&err, &body), TD_OK);
        json_t *e = body ? json_loads(body, 0, &jerr) : NULL;
        json_t *inner = json_object_get(e, "error");
        CHECK_STR(json_string_value(json_object_get(inner, "message")), err.message);
        CHECK_STR(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
        if (r->param[0])
            CHECK_STR(json_string_value(json_object_get(inner, "param")), r->param);
        else
            CHECK(json_is_null(json_object_get(inner, "param")));
        json_decref(e);
        free(body);

        /* Without an error struct: the same status, nothing else. */
        CHECK_STATUS(td_chat_prompt_encode(req, NULL, &p, NULL), r->st);
        json_decref(req);
    }
    td_chat_prompt_t *p = NULL;
    CHECK_STATUS(td_chat_prompt_encode(NULL, NULL, &p, NULL), TD_ERR_INVALID);
}

/* A message that would pass its buffer is cut on a character boundary, and
 * its error body is still valid JSON. */
static void
test_long_message(void)
{
    size_t n = 400;
    char *role = malloc(n * 2 + 1);
    for (size_t i = 0; i < n; i++)
        memcpy(role + 2 * i, "\xc3\xa9", 2);   /* é */
    role[2 * n] = '\0';
    json_t *req = json_pack("[{s:s, s:s}]", "role", role, "content", "x");
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t err;
    char *body = NULL;
    json_error_t jerr;

    CHECK_STATUS(td_chat_prompt_encode(req, NULL, &p, &err), TD_ERR_INVALID);
    CHECK(strlen(err.message) < sizeof(err.message));
    CHECK_STATUS(td_chat_prompt_err_json(&err, &body), TD_OK);
    json_t *e = body ? json_loads(body, 0, &jerr) : NULL;
    CHECK(e != NULL);
    json_decref(e);
    free(body);
    json_decref(req);
    free(role);
}

/* ---- Settings that override the request ----------------------------------- */

static char *
encode_text(const char *body, const td_chat_prompt_opts_t *opts, td_chat_prompt_t **keep)
{
    json_error_t jerr;
    json_t *req = json_loads(body, 0, &jerr);
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t err;
    char *text = NULL;

    CHECK(req != NULL);
    td_status_t st = td_chat_prompt_encode(req, opts, &p, &err);
    CHECK_STATUS(st, TD_OK);
    if (st != TD_OK)
        fprintf(stderr, "%s: %s\n", body, err.message);
    if (p)
        text = strdup(p->text);
    if (keep)
        *keep = p;
    else
        td_chat_prompt_destroy(p);
    json_decref(req);
    return text;
}

/* opts act as if the request carried the fields: compare with such requests. */
static void
test_overrides(void)
{
    static const struct {
        const char *plain;      /* request without the fields */
        td_chat_prompt_opts_t opts;
        const char *equal;      /* the same request carrying them */
    } cases[] = {
        { "[" U("x") "]", { 0, NULL },
          "{\"messages\":[" U("x") "],\"thinking\":{\"type\":\"disabled\"}}" },
        { "{\"messages\":[" U("x") "],\"thinking\":{\"type\":\"disabled\"}}", { 1, NULL },
          "{\"messages\":[" U("x") "],\"thinking\":{\"type\":\"enabled\"}}" },
        { "[" U("x") "]", { -1, "max" },
          "{\"messages\":[" U("x") "],\"reasoning_effort\":\"max\"}" },
        { "{\"messages\":[" U("x") "],\"reasoning_effort\":\"max\"}", { -1, "low" },
          "{\"messages\":[" U("x") "],\"reasoning_effort\":\"low\"}" },
        { "[" U("x") "]", { -1, "none" },
          "{\"messages\":[" U("x") "],\"reasoning_effort\":\"none\"}" },
        { "[" U("x") "]", { 1, "none" },
          "{\"messages\":[" U("x") "],\"reasoning_effort\":\"none\","
          "\"thinking\":{\"type\":\"enabled\"}}" },
        { "[{\"role\":\"developer\",\"content\":\"d\"}," U("x") "]", { -1, NULL },
          "[{\"role\":\"system\",\"content\":\"d\"}," U("x") "]" },
        /* chat_template_kwargs.thinking (vLLM's switch) wins over "thinking" */
        { "[" U("x") "]", { 0, NULL },
          "{\"messages\":[" U("x") "],\"chat_template_kwargs\":{\"thinking\":false}}" },
        { "[" U("x") "]", { 0, NULL },
          "{\"messages\":[" U("x") "],\"thinking\":{\"type\":\"enabled\"},"
          "\"chat_template_kwargs\":{\"thinking\":false}}" },
        { "[" U("x") "]", { 1, NULL },
          "{\"messages\":[" U("x") "],\"thinking\":{\"type\":\"disabled\"},"
          "\"chat_template_kwargs\":{\"thinking\":true}}" },
        { "[" U("x") "]", { -1, NULL },
          "{\"messages\":[" U("x") "],\"chat_template_kwargs\":{\"thinking\":null}}" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        char *a = encode_text(cases[i].plain, &cases[i].opts, NULL);
        char *b = encode_text(cases[i].equal, NULL, NULL);
        CHECK(a && b && strcmp(a, b) == 0);
        free(a);
        free(b);
    }
    json_t *req = json_loads("[" U("x") "]", 0, NULL);
    td_chat_prompt_opts_t bad = { -1, "extreme" };
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t err;
    CHECK_STATUS(td_chat_prompt_encode(req, &bad, &p, &err), TD_ERR_INVALID);
    CHECK_STR(err.param, "reasoning_effort");
    json_decref(req);

    /* What the encoder tells the reader. */
    td_chat_prompt_t *kp = NULL;
    char *t = encode_text("{\"messages\":[" U("x") "],\"stop\":\"END\",\"tools\":[" TOOL("f")
                          "],\"reasoning_effort\":\"low\"}", NULL, &kp);
    CHECK(kp && kp->thinking && kp->effort == 50 && kp->reply.tool_calls &&
          !kp->reply.in_tool_calls && kp->reply.start == TD_CHAT_REPLY_START_REASONING &&
          kp->reply.nstop == 1 && strcmp(kp->reply.stop[0], "END") == 0);
    CHECK(kp && kp->nspecials > 0 && kp->specials[0].start == 0 &&
          kp->specials[kp->nspecials - 1].end == kp->len);
    free(t);
    td_chat_prompt_destroy(kp);
}

/* A NUL inside a string travels through (lengths, not C strings). */
static void
test_nul(void)
{
    json_error_t jerr;
    json_t *req = json_loads("[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]", JSON_ALLOW_NUL,
                             &jerr);
    td_chat_prompt_t *p = NULL;

    CHECK(req != NULL);
    CHECK_STATUS(td_chat_prompt_encode(req, NULL, &p, NULL), TD_OK);
    CHECK(p && memmem(p->text, p->len, "a\0b", 3) != NULL);
    td_chat_prompt_destroy(p);
    json_decref(req);
}

/* ---- The reader ------------------------------------------------------------ */

static char logged[1024];

static void
capture(td_log_level_t level, const char *line, void *arg)
{
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof(logged) - n, "%s\n", line);
}

static void
test_parser_api(void)
{
    td_chat_reply_reader_t *p = NULL;
    const td_chat_reply_delta_t *d;
    size_t nd;
    const char *empty[] = { "" };
    td_chat_reply_opts_t bad = { .start = TD_CHAT_REPLY_START_PLAIN, .stop = empty, .nstop = 1 };
    td_chat_reply_opts_t wrong = { .start = (td_chat_reply_start_t)9 };
    td_chat_reply_opts_t plain = { .start = TD_CHAT_REPLY_START_PLAIN };

    /* Misuse is logged once, where it is found. */
    td_log_set_sink(capture, NULL);
    CHECK_STATUS(td_chat_reply_reader_create(&bad, &p), TD_ERR_INVALID);
    CHECK_STATUS(td_chat_reply_reader_create(&wrong, &p), TD_ERR_INVALID);
    CHECK(p == NULL);
    CHECK_STATUS(td_chat_reply_reader_create(&plain, &p), TD_OK);
    CHECK_STATUS(td_chat_reply_reader_feed(p, "hi", 2, &d, &nd), TD_OK);
    CHECK(nd == 1 && d[0].kind == TD_CHAT_REPLY_DELTA_CONTENT && d[0].len == 2);
    CHECK_STATUS(td_chat_reply_reader_finish(p, TD_CHAT_REPLY_FINISH_STOP, &d, &nd), TD_OK);
    CHECK_STATUS(td_chat_reply_reader_feed(p, "x", 1, &d, &nd), TD_ERR_STATE);
    CHECK_STATUS(td_chat_reply_reader_finish(p, TD_CHAT_REPLY_FINISH_STOP, &d, &nd), TD_ERR_STATE);
    td_log_set_sink(NULL, NULL);
    CHECK(strstr(logged, "stop string 0 is empty") != NULL);
    CHECK(strstr(logged, "unknown start stage 9") != NULL);
    CHECK(strstr(logged, "feed after finish") != NULL);
    CHECK(strstr(logged, "finished twice") != NULL);
    CHECK(td_chat_reply_reader_reply(p)->reasoning == NULL);
    CHECK_STR(td_chat_reply_reader_reply(p)->content, "hi");
    td_chat_reply_reader_destroy(p);
    td_chat_reply_reader_destroy(NULL);
    td_chat_reply_destroy(NULL);
}

/* Invalid UTF-8 becomes U+FFFD (one per ill-formed sequence, as a lossy
 * decoder does); a character cut between feeds is joined first. */
static void
test_utf8(void)
{
    static const struct {
        const char *in;
        size_t len;
        const char *out;
    } cases[] = {
        { "a\xffz", 3, "a\xef\xbf\xbdz" },
        { "a\xc3", 2, "a\xef\xbf\xbd" },                    /* cut at the end */
        { "\xe2\x82\xac", 3, "\xe2\x82\xac" },              /* € */
        { "\xe2\x82z", 3, "\xef\xbf\xbdz" },                /* one U+FFFD for two bytes */
        { "\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" }, /* a surrogate */
        { "\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd" },      /* overlong */
        { "\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80" },      /* 😀 */
    };
    td_chat_reply_opts_t plain = { .start = TD_CHAT_REPLY_START_PLAIN };

    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        /* whole, then one byte per feed */
        for (int split = 0; split < 2; split++) {
            td_chat_reply_reader_t *p = NULL;
            const td_chat_reply_delta_t *d;
            size_t nd;
            CHECK_STATUS(td_chat_reply_reader_create(&plain, &p), TD_OK);
            if (p == NULL)
                continue;
            if (split) {
                for (size_t k = 0; k < cases[i].len; k++)
                    CHECK_STATUS(td_chat_reply_reader_feed(p, cases[i].in + k, 1, &d, &nd), TD_OK);
            } else {
                CHECK_STATUS(td_chat_reply_reader_feed(p, cases[i].in, cases[i].len, &d, &nd),
                             TD_OK);
            }
            CHECK_STATUS(td_chat_reply_reader_finish(p, TD_CHAT_REPLY_FINISH_STOP, &d, &nd), TD_OK);
            const td_chat_reply_t *r = td_chat_reply_reader_reply(p);
            if (strcmp(r->content, cases[i].out) != 0)
                fprintf(stderr, "utf8 case %zu split %d: wrong content\n", i, split);
            CHECK_STR(r->content, cases[i].out);
            td_chat_reply_reader_destroy(p);
        }
    }
}

/* Tool call ids: the documented shape; a seed gives the same ids again. */
static void
test_ids(void)
{
    const char *out = "r</think><\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>\n"
                      "<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"a\">\n"
                      "</\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke>\n"
                      "<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"b\">\n"
                      "</\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke>\n"
                      "</\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>";
    td_chat_reply_opts_t o = { .start = TD_CHAT_REPLY_START_REASONING, .tool_calls = true,
                               .id_seed = 42 };
    td_chat_reply_t *a = NULL, *b = NULL, *c = NULL;

    CHECK_STATUS(td_chat_reply_parse(&o, out, strlen(out), TD_CHAT_REPLY_FINISH_STOP, &a), TD_OK);
    CHECK_STATUS(td_chat_reply_parse(&o, out, strlen(out), TD_CHAT_REPLY_FINISH_STOP, &b), TD_OK);
    o.id_seed = 0;
    CHECK_STATUS(td_chat_reply_parse(&o, out, strlen(out), TD_CHAT_REPLY_FINISH_STOP, &c), TD_OK);
    if (a && b && c) {
        CHECK(a->ncalls == 2 && b->ncalls == 2 && c->ncalls == 2);
        CHECK_STR(a->calls[0].id, b->calls[0].id);
        CHECK_STR(a->calls[1].id, b->calls[1].id);
        CHECK(strcmp(a->calls[0].id, a->calls[1].id) != 0);
        CHECK(strcmp(a->calls[0].id, c->calls[0].id) != 0);
        CHECK(strncmp(a->calls[1].id, "call_01_", 8) == 0 && strlen(a->calls[1].id) == 32);
        CHECK_STR(a->calls[0].name, "a");
        CHECK_STR(a->calls[0].arguments, "{}");
        CHECK(a->finish == TD_CHAT_REPLY_FINISH_TOOL_CALLS);
        CHECK_STR(a->reasoning, "r");
    }
    td_chat_reply_destroy(a);
    td_chat_reply_destroy(b);
    td_chat_reply_destroy(c);
}

/* After a stop string the rest is ignored; the caller sees it at once. */
static void
test_stop(void)
{
    const char *stops[] = { "END" };
    td_chat_reply_opts_t o = { .start = TD_CHAT_REPLY_START_PLAIN, .stop = stops, .nstop = 1 };
    td_chat_reply_reader_t *p = NULL;
    const td_chat_reply_delta_t *d;
    size_t nd;

    CHECK_STATUS(td_chat_reply_reader_create(&o, &p), TD_OK);
    if (p == NULL)
        return;
    CHECK_STATUS(td_chat_reply_reader_feed(p, "abcEN", 5, &d, &nd), TD_OK);
    CHECK(!td_chat_reply_reader_stopped(p));
    CHECK_STATUS(td_chat_reply_reader_feed(p, "Dxyz", 4, &d, &nd), TD_OK);
    CHECK(td_chat_reply_reader_stopped(p));
    CHECK(nd == 1 && d[0].kind == TD_CHAT_REPLY_DELTA_CONTENT && d[0].len == 3 &&
          memcmp(d[0].text, "abc", 3) == 0);
    CHECK_STATUS(td_chat_reply_reader_feed(p, "more", 4, &d, &nd), TD_OK);
    CHECK(nd == 0);
    CHECK_STATUS(td_chat_reply_reader_finish(p, TD_CHAT_REPLY_FINISH_LENGTH, &d, &nd), TD_OK);
    CHECK(nd == 0);
    CHECK(td_chat_reply_reader_reply(p)->finish == TD_CHAT_REPLY_FINISH_STOP);
    CHECK_STR(td_chat_reply_reader_reply(p)->content, "abc");
    td_chat_reply_reader_destroy(p);

    /* include_stop_str_in_output: the stop string ends the content; not
     * armed (min_tokens), a completed one is content and the reader goes on */
    o.stop_include = true;
    p = NULL;
    CHECK_STATUS(td_chat_reply_reader_create(&o, &p), TD_OK);
    if (p == NULL)
        return;
    td_chat_reply_reader_arm(p, false);
    CHECK_STATUS(td_chat_reply_reader_feed(p, "xEND", 4, &d, &nd), TD_OK);
    CHECK(!td_chat_reply_reader_stopped(p));
    td_chat_reply_reader_arm(p, true);
    CHECK_STATUS(td_chat_reply_reader_feed(p, "yEN", 3, &d, &nd), TD_OK);
    CHECK_STATUS(td_chat_reply_reader_feed(p, "Dz", 2, &d, &nd), TD_OK);
    CHECK(td_chat_reply_reader_stopped(p));
    CHECK_STATUS(td_chat_reply_reader_finish(p, TD_CHAT_REPLY_FINISH_STOP, &d, &nd), TD_OK);
    CHECK_STR(td_chat_reply_reader_reply(p)->content, "xENDyEND");
    td_chat_reply_reader_destroy(p);
}

int
main(void)
{
    test_refusals();
    test_long_message();
    test_overrides();
    test_nul();
    test_parser_api();
    test_utf8();
    test_ids();
    test_stop();
    return td_check_exit("test_chat");
}
