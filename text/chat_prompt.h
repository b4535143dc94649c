/* text/chat_prompt.h — an OpenAI-style chat request (jansson) checked and
 * rendered into the DeepSeek-V4.1 prompt text, with the byte ranges of its
 * special tokens and how to read the reply; a request the format cannot
 * express is refused with an OpenAI-style error. docs/chat.md. */
#ifndef TD_CHAT_PROMPT_H
#define TD_CHAT_PROMPT_H

#include "chat_reply.h"
#include "status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Why a request was refused, ready for an HTTP 400 in OpenAI's error format:
 * {"error":{"message","type":"invalid_request_error","param","code"}}. A
 * refusal is the client's doing: the encoder fills this and logs nothing; the
 * caller decides what to log. */
typedef struct {
    char message[512];
    char param[96];      /* the field at fault ("messages[2].content[0].type"); "" for null */
    const char *code;    /* static: "unsupported_value" for TD_ERR_UNSUPPORTED; NULL for null */
} td_chat_prompt_err_t;

/* The error body as a NUL-terminated JSON string (*out malloc'd, caller
 * frees). TD_ERR_NOMEM, logged. */
td_status_t td_chat_prompt_err_json(const td_chat_prompt_err_t *e, char **out);

/* Settings that override the request's own, as if it had carried them. */
typedef struct {
    int thinking;          /* -1: the request's "thinking" (default on); 0: off; 1: on */
    const char *effort;    /* NULL: the request's "reasoning_effort"; else a level name:
                              none, minimal, low, medium, high, xhigh, ultra, max */
} td_chat_prompt_opts_t;

/* A byte range [start, end) of the prompt that spells one special token;
 * everything outside the ranges is plain text (tokenize it without the
 * special-token vocabulary, so that user text cannot forge a marker). */
typedef struct {
    size_t start, end;
} td_chat_prompt_span_t;

/* A rendered prompt; owns everything it points to. */
typedef struct {
    char *text;                     /* UTF-8, NUL-terminated; len bytes */
    size_t len;
    td_chat_prompt_span_t *specials; /* ascending, disjoint */
    size_t nspecials;
    bool thinking;
    unsigned effort;                /* "Reasoning Effort" value 50/75/100; 0 with thinking off */
    td_chat_reply_opts_t reply;     /* how to read the reply (stop strings owned here) */
} td_chat_prompt_t;

/* Render request: a chat completion request object ({"messages":[...],
 * "tools", "tool_choice", "thinking", "reasoning_effort", "stop",
 * "response_format"}; other fields are ignored) or a bare messages array.
 * opts may be NULL. On success *out is set (td_chat_prompt_destroy). A request
 * the format cannot express: TD_ERR_INVALID (malformed) or TD_ERR_UNSUPPORTED
 * (images, files, strict schemas, JSON output modes), err filled (err may be
 * NULL), nothing logged. TD_ERR_NOMEM, logged. */
td_status_t td_chat_prompt_encode(const json_t *request, const td_chat_prompt_opts_t *opts,
                                  td_chat_prompt_t **out, td_chat_prompt_err_t *err);
void td_chat_prompt_destroy(td_chat_prompt_t *p);

struct td_tokenizer;
/* The prompt as token ids: each special-token range is that token (a
 * tokenizer without it: TD_ERR_NOT_FOUND, logged), the text between ranges is
 * tokenized without the added vocabulary, so that text from a request cannot
 * forge a marker (as the reference's prompt encoding does); the tokenizer's
 * failures are its own, logged there. *ids malloc'd (non-NULL even when *n is
 * 0). */
td_status_t td_chat_prompt_ids(const td_chat_prompt_t *p, const struct td_tokenizer *tok,
                               uint32_t **ids, size_t *n);

#endif
