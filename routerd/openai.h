/* routerd/openai.h — the OpenAI-compatible API of routerd, without I/O: request
 * bodies of /v1/chat/completions and /v1/completions parsed and validated into
 * plain C structs; responses, stream chunks, model lists and errors as JSON. */
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

/* ---- Requests -------------------------------------------------------- */

/* One chat message; the strings are owned by the request. */
typedef struct {
    td_openai_role_t role;
    char *content;       /* text; array-of-parts content joined with "\n";
                            "" for an assistant message with only tool_calls */
    char *name;          /* NULL when absent */
    char *tool_call_id;  /* role tool: required; otherwise NULL */
    char *tool_calls;    /* role assistant: the raw JSON array, or NULL */
} td_openai_msg_t;

/* A validated request; everything it points to is owned by it and freed by
 * td_openai_req_destroy(). Defaults are filled in. */
typedef struct {
    td_openai_kind_t kind;
    char *model;
    td_openai_msg_t *msgs;    /* chat: nmsgs >= 1 */
    size_t nmsgs;
    char *prompt;             /* completion: the prompt text, or NULL when ... */
    int32_t *prompt_ids;      /* ... it was given as token ids: [nprompt_ids], each in
                                 [0, cfg vocab); NULL for a text prompt */
    size_t nprompt_ids;
    bool stream;
    bool include_usage;       /* stream_options.include_usage */
    uint32_t max_tokens;      /* max_tokens / max_completion_tokens, or the default */
    double temperature;       /* [0, 2], default 1 */
    double top_p;             /* (0, 1], default 1 */
    bool has_seed;
    int64_t seed;
    int32_t priority;         /* extension: the admission queue's order, higher
                                 first; default 0 (docs/api.md) */
    double presence_penalty;  /* [-2, 2], default 0; passed on to the sampler */
    double frequency_penalty; /* [-2, 2], default 0; passed on to the sampler */
    char *stop[TD_OPENAI_MAX_STOP];
    size_t nstop;
    td_openai_bias_t *logit_bias; /* [nbias] in the body's order, each token once */
    size_t nbias;
    bool logprobs;            /* chat: logprobs; completions: logprobs given (0..5) */
    uint32_t top_logprobs;    /* chat: top_logprobs (0..20); completions: logprobs */
    char *tools;              /* chat: raw JSON array, or NULL */
    char *tool_choice;        /* chat: raw JSON (string or object), or NULL */
    json_t *body;             /* the parsed request body (a reference; the V4.1
                                 chat encoder reads it) */
} td_openai_req_t;

/* What the parser checks requests against. */
typedef struct {
    const char *const *models;    /* model ids served, NULL-terminated */
    size_t max_body;              /* a larger body gets 413 */
    uint32_t max_tokens_limit;    /* largest max_tokens accepted (>= 1) */
    uint32_t max_tokens_default;  /* max_tokens when the request has none */
    uint32_t vocab;               /* logit_bias and token-id prompt ids must be below it
                                     (0: unchecked) */
    size_t max_stop_bytes;        /* longest stop string (0: TD_OPENAI_STOP_BYTES) */
} td_openai_cfg_t;

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

/* ---- Parsing ---------------------------------------------------------- */

/* Parse and validate a request body of kind. On success *out is set (free
 * it with td_openai_req_destroy). On failure e is filled and the status says
 * which: TD_ERR_TOO_BIG (413), TD_ERR_INVALID (400), TD_ERR_UNSUPPORTED (400,
 * a feature this server does not have), TD_ERR_NOT_FOUND (404, unknown model),
 * TD_ERR_NOMEM (500). Unknown top-level fields are rejected like OpenAI does
 * ("Unrecognized request argument supplied: x"). Nothing logs. */
td_status_t td_openai_req_parse(const td_openai_cfg_t *cfg, td_openai_kind_t kind,
                                const char *body, size_t len, td_openai_req_t **out,
                                td_openai_err_t *e);
void td_openai_req_destroy(td_openai_req_t *req);

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
    td_openai_logprobs_t *logprobs; /* NULL: "logprobs": null; else the choice of the
                                       next object built takes its entries not yet sent */
} td_openai_meta_t;

typedef struct {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;   /* > 0: prompt_tokens_details.cached_tokens */
} td_openai_usage_t;

#define TD_OPENAI_ID_LEN 48

/* A fresh random id: "chatcmpl-<24 hex>" or "cmpl-<24 hex>". buf has
 * TD_OPENAI_ID_LEN bytes. TD_ERR_IO when the system has no randomness. */
td_status_t td_openai_id_new(td_openai_kind_t kind, char buf[TD_OPENAI_ID_LEN]);

/* The non-streaming response (chat.completion or text_completion) with text
 * (len bytes of valid UTF-8; otherwise TD_ERR_INVALID), appended to out. */
td_status_t td_openai_response_json(const td_openai_meta_t *m, const char *text, size_t len,
                                    td_openai_finish_t finish, const td_openai_usage_t *usage,
                                    td_buf_t *out);

/* One streamed response. Fill meta and include_usage, zero the rest. */
typedef struct {
    td_openai_meta_t meta;
    bool include_usage;   /* from the request's stream_options */
    bool role_sent;       /* chat: the first chunk (with delta.role) went out */
} td_openai_stream_t;

/* Append the SSE event of a text chunk. The first chunk of a chat stream also
 * carries delta.role "assistant"; call with len 0 to send it before any text. */
td_status_t td_openai_stream_text(td_openai_stream_t *s, const char *text, size_t len,
                                  td_buf_t *out);
/* Append the SSE event of a chat chunk whose delta is the given object
 * (reasoning_content, tool_calls, content: the chat reader's deltas); the
 * first chunk also gets delta.role. delta is consumed (its reference stolen). */
td_status_t td_openai_stream_delta(td_openai_stream_t *s, json_t *delta, td_buf_t *out);

/* The non-streaming chat.completion whose choice carries the given message
 * object ({"role":"assistant","content",...}); message is consumed. */
td_status_t td_openai_response_message_json(const td_openai_meta_t *m, json_t *message,
                                            td_openai_finish_t finish,
                                            const td_openai_usage_t *usage, td_buf_t *out);

/* Append the end of the stream: the chunk with finish_reason, a usage chunk
 * (choices: []) when include_usage, then `data: [DONE]`. */
td_status_t td_openai_stream_finish(td_openai_stream_t *s, td_openai_finish_t finish,
                                    const td_openai_usage_t *usage, td_buf_t *out);
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
