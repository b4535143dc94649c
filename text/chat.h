/* text/chat.h — DeepSeek-V4.1 chat format: an OpenAI-style chat request
 * (jansson) rendered into the V4.1 prompt text, and the model's output read
 * back, incrementally, into reasoning, content and tool calls. docs/chat.md
 * describes both formats. */
#ifndef TD_CHAT_H
#define TD_CHAT_H

#include "status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Refusals ---------------------------------------------------------- */

/* Why a request was refused, ready for an HTTP 400 in OpenAI's error format:
 * {"error":{"message","type":"invalid_request_error","param","code"}}. */
typedef struct {
    char message[512];
    char param[96];      /* the field at fault ("messages[2].content[0].type"); "" for null */
    const char *code;    /* static: "unsupported_value" for TD_ERR_UNSUPPORTED; NULL for null */
} td_chat_err_t;

/* The error body as a NUL-terminated JSON string (*out malloc'd, caller frees). */
td_status_t td_chat_err_json(const td_chat_err_t *e, char **out);

/* ---- Reading the output ------------------------------------------------ */

/* Where the model's output begins: what the prompt left open. */
typedef enum {
    TD_CHAT_START_PLAIN = 0,      /* thinking off: content (leading newlines dropped) */
    TD_CHAT_START_REASONING,      /* after "<think>": reasoning (leading newlines dropped) */
    TD_CHAT_START_REASONING_CONT, /* continuing a prefix's reasoning */
    TD_CHAT_START_CONTENT_CONT,   /* continuing a prefix's content, thinking on */
} td_chat_start_t;

/* How to read one reply; td_chat_encode fills it from the request. */
typedef struct {
    td_chat_start_t start;
    bool tool_calls;          /* recognise DSML tool-call blocks */
    bool in_tool_calls;       /* the prompt opened the block (tool_choice required/named) */
    const char *const *stop;  /* stop strings (non-empty), matched in content only */
    size_t nstop;
    uint64_t id_seed;         /* 0: tool call ids from the system's randomness;
                                 otherwise a fixed sequence (tests) */
} td_chat_parse_opts_t;

typedef enum {
    TD_CHAT_DELTA_REASONING = 0, /* text */
    TD_CHAT_DELTA_CONTENT,       /* text */
    TD_CHAT_DELTA_TOOL_CALL,     /* index, id, name: a tool call begins */
    TD_CHAT_DELTA_TOOL_ARGS,     /* index, text: the next piece of its arguments JSON */
} td_chat_delta_kind_t;

/* One delta. The pointers stay valid until the next feed/finish/destroy. */
typedef struct {
    td_chat_delta_kind_t kind;
    uint32_t index;       /* TOOL_CALL, TOOL_ARGS: 0, 1, ... in order of appearance */
    const char *id;       /* TOOL_CALL: "call_<index, 2 digits>_<20 alnum><4 digits>",
                             random; with thinking on and no reasoning before the
                             call, "call_<index>_ET_<20 alnum><4 digits>" */
    const char *name;     /* TOOL_CALL */
    const char *text;     /* REASONING, CONTENT, TOOL_ARGS: len bytes (NUL-terminated) */
    size_t len;
} td_chat_delta_t;

typedef enum {
    TD_CHAT_FINISH_STOP = 0,   /* end of sequence, or a stop string matched */
    TD_CHAT_FINISH_LENGTH,     /* max_tokens or the context ran out */
    TD_CHAT_FINISH_TOOL_CALLS, /* ended normally after at least one tool call */
} td_chat_finish_t;

const char *td_chat_finish_str(td_chat_finish_t f);   /* "stop", "length", "tool_calls" */

typedef struct {
    char *id;
    char *name;
    char *arguments;      /* JSON text as the model wrote it (may be unfinished) */
    size_t arguments_len;
} td_chat_tool_call_t;

/* A whole reply, as the deltas add up. Strings are NUL-terminated; content and
 * reasoning may hold NUL bytes, hence the lengths. */
typedef struct {
    char *content;
    size_t content_len;
    char *reasoning;           /* NULL unless the output begins in reasoning (thinking
                                  on, and not a continuation of a prefix's content) */
    size_t reasoning_len;
    td_chat_tool_call_t *calls;
    size_t ncalls;
    td_chat_finish_t finish;
} td_chat_reply_t;

typedef struct td_chat_parser td_chat_parser_t;

/* The strings in opts are copied. */
td_status_t td_chat_parser_create(const td_chat_parse_opts_t *opts, td_chat_parser_t **out);
void td_chat_parser_destroy(td_chat_parser_t *p);

/* Feed the next len bytes of output text, normally one token's text (any
 * split works, also inside a UTF-8 character; invalid UTF-8 becomes U+FFFD).
 * *deltas (owned by p) gets what is now certain: text that may be the start
 * of a marker is held back, and with it the rest of what the same feed
 * brought, as the reference reader does; the deltas of every feed equal the
 * reference's. Adjacent deltas of one kind are merged. Once a stop string has
 * matched (td_chat_parser_stopped), the rest of the output is ignored. */
td_status_t td_chat_parser_feed(td_chat_parser_t *p, const char *text, size_t len,
                                const td_chat_delta_t **deltas, size_t *ndeltas);
/* End of output; engine says why generation ended (STOP or LENGTH). Releases
 * what was held back and fixes the finish reason. Feeding after it:
 * TD_ERR_STATE. */
td_status_t td_chat_parser_finish(td_chat_parser_t *p, td_chat_finish_t engine,
                                  const td_chat_delta_t **deltas, size_t *ndeltas);
/* A stop string matched: the caller should end generation. */
bool td_chat_parser_stopped(const td_chat_parser_t *p);
/* Everything so far (finish set after td_chat_parser_finish); owned by p. */
const td_chat_reply_t *td_chat_parser_reply(const td_chat_parser_t *p);

/* One shot: the whole output at once. *out: free with td_chat_reply_destroy. */
td_status_t td_chat_parse(const td_chat_parse_opts_t *opts, const char *text, size_t len,
                          td_chat_finish_t engine, td_chat_reply_t **out);
void td_chat_reply_destroy(td_chat_reply_t *r);

/* The reply as an OpenAI chat message: {"role":"assistant","content",
 * "reasoning_content" (when r->reasoning is set),"tool_calls" (when there
 * are: index, id, type "function", function {name, arguments})}.
 * *out: a new reference. */
td_status_t td_chat_reply_json(const td_chat_reply_t *r, json_t **out);

/* ---- Encoding ---------------------------------------------------------- */

/* Every special token a prompt or a reply of this format may spell (*n of
 * them): a tokenizer must have each as a token to serve the format. */
const char *const *td_chat_special_tokens(size_t *n);

/* Settings that override the request's own, as if it had carried them. */
typedef struct {
    int thinking;          /* -1: the request's "thinking" (default on); 0: off; 1: on */
    const char *effort;    /* NULL: the request's "reasoning_effort"; else a level name:
                              none, minimal, low, medium, high, xhigh, ultra, max */
} td_chat_opts_t;

/* A byte range [start, end) of the prompt that spells one special token;
 * everything outside the ranges is plain text (tokenize it without the
 * special-token vocabulary, so that user text cannot forge a marker). */
typedef struct {
    size_t start, end;
} td_chat_span_t;

/* A rendered prompt; owns everything it points to. */
typedef struct {
    char *text;                  /* UTF-8, NUL-terminated; len bytes */
    size_t len;
    td_chat_span_t *specials;    /* ascending, disjoint */
    size_t nspecials;
    bool thinking;
    unsigned effort;             /* "Reasoning Effort" value 50/75/100; 0 with thinking off */
    td_chat_parse_opts_t parse;  /* how to read the reply (stop strings owned here) */
} td_chat_prompt_t;

/* Render request: a chat completion request object ({"messages":[...],
 * "tools", "tool_choice", "thinking", "reasoning_effort", "stop",
 * "response_format"}; other fields are ignored) or a bare messages array.
 * opts may be NULL. On success *out is set (td_chat_prompt_destroy). A request
 * the format cannot express: TD_ERR_INVALID (malformed) or TD_ERR_UNSUPPORTED
 * (images, files, strict schemas, JSON output modes), err filled; err may be
 * NULL. TD_ERR_NOMEM. */
td_status_t td_chat_encode(const json_t *request, const td_chat_opts_t *opts,
                           td_chat_prompt_t **out, td_chat_err_t *err);
void td_chat_prompt_destroy(td_chat_prompt_t *p);

struct td_tokenizer;
/* The prompt as token ids: each special-token range is that token (a
 * tokenizer without it: TD_ERR_NOT_FOUND, logged), the text between ranges is
 * tokenized without the added vocabulary, so that text from a request cannot
 * forge a marker (as the reference's prompt encoding does). *ids malloc'd
 * (non-NULL even when *n is 0). */
td_status_t td_chat_prompt_ids(const td_chat_prompt_t *p, const struct td_tokenizer *tok,
                               uint32_t **ids, size_t *n);

#endif
