/* routerd/openai.h — the OpenAI protocols' side of routerd without I/O:
 * errors, responses, stream chunks, model lists and log-probabilities as
 * JSON. Request bodies are parsed into the one request model (ireq.h) by
 * adapt-openai.h. */
#ifndef TD_OPENAI_H
#define TD_OPENAI_H

#include "buf.h"
#include "status.h"

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    TD_OPENAI_CHAT = 0,      /* POST /v1/chat/completions */
    TD_OPENAI_COMPLETION,    /* POST /v1/completions */
    TD_OPENAI_MESSAGES,      /* POST /v1/messages (Anthropic's Messages API: anthropic.h) */
    TD_OPENAI_RESPONSES,     /* POST /v1/responses (OpenAI's Responses API: oresp.h) */
} td_openai_kind_t;

typedef enum {
    TD_OPENAI_ROLE_SYSTEM = 0,
    TD_OPENAI_ROLE_USER,
    TD_OPENAI_ROLE_ASSISTANT,
    TD_OPENAI_ROLE_TOOL,
    TD_OPENAI_ROLE_DEVELOPER,
} td_openai_role_t;

typedef enum {
    TD_OPENAI_FINISH_NONE = 0,   /* still generating: JSON null */
    TD_OPENAI_FINISH_STOP,       /* end of sequence or a stop string */
    TD_OPENAI_FINISH_LENGTH,     /* max_tokens or the context ran out */
    TD_OPENAI_FINISH_TOOL_CALLS, /* chat: the reply ended with tool calls */
} td_openai_finish_t;

#define TD_OPENAI_MAX_STOP 4
#define TD_OPENAI_STOP_BYTES 512          /* the default cap on a stop string's length */
#define TD_OPENAI_MAX_BIAS 300            /* logit_bias entries (this server's bound) */
#define TD_OPENAI_MAX_TOP_LOGPROBS 20     /* chat: top_logprobs */
#define TD_OPENAI_MAX_COMPLETION_LOGPROBS 5  /* completions: logprobs */

/* One logit_bias entry: a token id and the bias added to its logit. */
typedef struct {
    int32_t token;
    float bias;               /* [-100, 100] */
} td_openai_bias_t;

/* ---- Errors ---------------------------------------------------------- */

/* An error the way OpenAI reports it: the HTTP status and
 * {"error":{"message","type","param","code"}}. */
typedef struct {
    int http;                 /* 400, 401, 404, 413, 500, 503 ... */
    const char *type;         /* static: "invalid_request_error", "server_error" */
    const char *code;         /* static, or NULL for JSON null */
    char param[96];           /* "" for JSON null */
    char message[512];
    unsigned retry_after;     /* seconds for a Retry-After header; 0: none */
} td_openai_err_t;

/* Fill e; param and code may be NULL. */
void td_openai_err_set(td_openai_err_t *e, int http, const char *type, const char *param,
                       const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* 401. key_given: a bearer key was sent but is not known ("invalid_api_key");
 * otherwise no key was sent. */
void td_openai_err_auth(td_openai_err_t *e, bool key_given);
/* 404 for a path no route serves. */
void td_openai_err_no_route(td_openai_err_t *e, const char *method, const char *path);
/* 413: a body of len bytes (0: unknown) against the limit. */
void td_openai_err_too_big(td_openai_err_t *e, size_t len, size_t limit);
/* 503 with Retry-After: no decode capacity. */
void td_openai_err_overloaded(td_openai_err_t *e, unsigned retry_after);
/* 500: what failed on our side (not shown to be the client's fault). */
void td_openai_err_internal(td_openai_err_t *e, const char *what);

/* The error body, appended to out. */
td_status_t td_openai_err_json(const td_openai_err_t *e, td_buf_t *out);

/* ---- Roles ------------------------------------------------------------ */

const char *td_openai_role_str(td_openai_role_t role);

/* ---- Log-probabilities ------------------------------------------------- */

/* A token of a logprobs list: its spelling (any bytes: shown as text with
 * U+FFFD for what is not UTF-8, and as "bytes") and log-probability (-inf
 * is shown as -9999.0, as OpenAI does). */
typedef struct {
    const char *text;
    size_t len;
    double logprob;
} td_openai_token_lp_t;

/* The logprobs of a request's generated tokens, in OpenAI's shape for its
 * kind: chat {"content":[{token, logprob, bytes, top_logprobs}], "refusal"},
 * completions {tokens, token_logprobs, top_logprobs, text_offset}. Entries
 * are added as tokens arrive and taken by the next response object built
 * with it (a stream chunk takes those not sent yet). */
typedef struct td_openai_logprobs td_openai_logprobs_t;

td_status_t td_openai_logprobs_create(td_openai_kind_t kind, td_openai_logprobs_t **out);
void td_openai_logprobs_destroy(td_openai_logprobs_t *l);
/* Add a generated token and its ntop most likely alternatives. */
td_status_t td_openai_logprobs_add(td_openai_logprobs_t *l, const td_openai_token_lp_t *tok,
                                   const td_openai_token_lp_t *top, size_t ntop);

/* ---- Responses and streams -------------------------------------------- */

/* What every response object of one request carries. */
typedef struct {
    td_openai_kind_t kind;
    const char *id;           /* from td_openai_id_new */
    int64_t created;          /* unix seconds */
    const char *model;
    const char *fingerprint;  /* system_fingerprint; NULL for JSON null */
} td_openai_meta_t;

typedef struct {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;   /* every choice's */
    uint32_t cached_tokens;   /* > 0: prompt_tokens_details.cached_tokens */
} td_openai_usage_t;

#define TD_OPENAI_ID_LEN 48

/* A fresh random id: "chatcmpl-<24 hex>", "cmpl-<24 hex>", "msg_<24 hex>"
 * or "resp_<24 hex>" by kind. buf has
 * TD_OPENAI_ID_LEN bytes. TD_ERR_IO when the system has no randomness. */
td_status_t td_openai_id_new(td_openai_kind_t kind, char buf[TD_OPENAI_ID_LEN]);

/* One choice of a non-streaming response, index-th of the request's: with
 * text (len bytes of valid UTF-8: a completion's "text", a chat message's
 * "content"), or a chat message object ({"role":"assistant",...}, consumed).
 * Its "logprobs": what lp has not sent yet (lp NULL: null). NULL when the
 * text is not UTF-8 or out of memory. */
json_t *td_openai_choice_text(td_openai_kind_t kind, uint32_t index, const char *text,
                              size_t len, td_openai_finish_t finish, td_openai_logprobs_t *lp);
json_t *td_openai_choice_message(uint32_t index, json_t *message, td_openai_finish_t finish,
                                 td_openai_logprobs_t *lp);

/* The non-streaming response (chat.completion or text_completion) with the
 * n choices (consumed; a NULL one: TD_ERR_INVALID), appended to out. */
td_status_t td_openai_response_json(const td_openai_meta_t *m, json_t *const *choices,
                                    size_t n, const td_openai_usage_t *usage, td_buf_t *out);

/* One streamed response. Fill meta and include_usage, zero the rest. Each
 * chunk carries one choice, with its index. */
typedef struct {
    td_openai_meta_t meta;
    bool include_usage;   /* from the request's stream_options */
    uint64_t role_sent;   /* chat: bit i, choice i's first chunk (with delta.role) went out */
} td_openai_stream_t;

/* Append the SSE event of a text chunk of choice index (its logprobs: what
 * lp has not sent yet, lp NULL: null). The first chunk of a chat choice
 * also carries delta.role "assistant"; call with len 0 to send it before
 * any text. */
td_status_t td_openai_stream_text(td_openai_stream_t *s, uint32_t index,
                                  td_openai_logprobs_t *lp, const char *text, size_t len,
                                  td_buf_t *out);
/* Append the SSE event of a chat chunk whose delta is the given object
 * (reasoning_content, tool_calls, content: the chat reader's deltas); the
 * choice's first chunk also gets delta.role. delta is consumed. */
td_status_t td_openai_stream_delta(td_openai_stream_t *s, uint32_t index,
                                   td_openai_logprobs_t *lp, json_t *delta, td_buf_t *out);
/* Append the chunk that ends choice index, with its finish_reason. */
td_status_t td_openai_stream_choice_end(td_openai_stream_t *s, uint32_t index,
                                        td_openai_logprobs_t *lp, td_openai_finish_t finish,
                                        td_buf_t *out);
/* Append the end of the stream once every choice ended: a usage chunk
 * (choices: []) when include_usage, then `data: [DONE]`. */
td_status_t td_openai_stream_end(td_openai_stream_t *s, const td_openai_usage_t *usage,
                                 td_buf_t *out);
/* Append an error in the middle of a stream: `data: {"error":{...}}` then
 * `data: [DONE]` (the OpenAI SDKs raise an APIError on such an event). */
td_status_t td_openai_stream_error(const td_openai_err_t *e, td_buf_t *out);

/* ---- Models ---------------------------------------------------------- */

typedef struct {
    const char *id;
    int64_t created;
    const char *engine;     /* e.g. "synthetic (deterministic stand-in, not the model)" */
    const char *tokenizer;  /* the td_tok_t name */
} td_openai_model_t;

/* GET /v1/models: {"object":"list","data":[{"id","object":"model","created",
 * "owned_by":"tandem","engine","tokenizer"}]}, appended to out. */
td_status_t td_openai_models_json(const td_openai_model_t *models, size_t n,
                                  td_buf_t *out);

#endif
