/* routerd/ireq.h — the one internal request that every protocol adapts
 * onto: its input (a conversation with tools and reasoning, or a prompt),
 * its sampling (the one sampler's parameters), its constraint, its stop
 * rules, its choices (n) and what its reply reports (log-probabilities,
 * special tokens, usage). A protocol adapter (adapt-openai.c: Chat
 * Completions and Completions; the Responses and Messages adapters plug in
 * the same way) parses its body into a td_ireq_t with the shared field
 * table and parse helpers below, so that every field common to them is
 * read, checked and refused in one place; the reply reader (reply.h) and
 * the request's wire parameters (rreq.c) read only the model.
 * No I/O, no logging: a refusal is a td_openai_err_t (status, type, param,
 * code, message) that the protocol's writer formats. */
#ifndef TD_ROUTERD_IREQ_H
#define TD_ROUTERD_IREQ_H

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "openai.h"
#include "status.h"

/* Hard bounds of the model (the configured limits are at most these). */
#define TD_IREQ_MAX_STOP_IDS 16     /* stop_token_ids, the model's EOS ids included */
#define TD_IREQ_MAX_N 64            /* choices of one request (max-n is at most this) */
#define TD_IREQ_DEFAULT_MAX_N 16
/* The bytes a prefill rank's terminal note may carry (the data plane's
 * default payload bound): the first tokens of n choices go in it. */
#define TD_IREQ_NOTE_BUDGET 4096
/* The sampler's bounds (engine/sample.h checks them again on every rank):
 * presence and frequency penalties in [-2, 2], repetition_penalty in (0, 2]. */
#define TD_IREQ_PENALTY_LIMIT 2.0
#define TD_IREQ_REPETITION_MAX 2.0

/* ---- The model ----------------------------------------------------------------- */

/* One message of a conversation; strings owned by the request. */
typedef struct {
    td_openai_role_t role;
    char *content;       /* text; content parts joined with "\n"; "" for an assistant
                            message with only tool_calls */
    char *name;          /* NULL when absent */
    char *tool_call_id;  /* role tool: required; otherwise NULL */
    char *tool_calls;    /* role assistant: the raw JSON array, or NULL */
} td_ireq_msg_t;

/* The one sampler's parameters (engine/sample.h), as the request asked. */
typedef struct {
    double temperature;         /* [0, 2], default 1 */
    double top_p;               /* (0, 1], default 1 */
    uint32_t top_k;             /* 0 = off (the API's -1 and 0) */
    double min_p;               /* [0, 1], 0 = off */
    double repetition_penalty;  /* (0, 2], 1 = off */
    double presence_penalty;    /* [-2, 2], 0 = off */
    double frequency_penalty;   /* [-2, 2], 0 = off */
    bool has_seed;
    int64_t seed;               /* choice i draws with seed + i (mod 2^64) */
    uint32_t max_tokens;        /* per choice; the default when none was given */
    uint32_t min_tokens;        /* no stop token (nor stop string) before this many */
    td_openai_bias_t *logit_bias;   /* [nbias] in the body's order, each token once */
    size_t nbias;
} td_ireq_sampling_t;

/* When a reply ends besides max_tokens. */
typedef struct {
    char *strings[TD_OPENAI_MAX_STOP];  /* stop strings: matched in the text */
    size_t nstrings;
    int32_t token_ids[TD_IREQ_MAX_STOP_IDS];   /* stop_token_ids: end like an EOS id */
    size_t ntoken_ids;
    bool ignore_eos;            /* the model's EOS ids do not end it */
    bool include_stop_str;      /* a matched stop string is part of the text */
} td_ireq_stop_t;

/* A constraint on the output (structured output, docs/api.md and
 * docs/structured-output.md): the one entry point every protocol fills
 * (response_format, vLLM's structured_outputs and guided_*, and the Responses
 * API's text.format map onto it). td_ireq_finish compiles it against the
 * vocabulary (cfg->gvocab) to refuse a bad one with a 400 naming the field
 * and the part, and leaves its wire text; the ranks that sample enforce it.
 * The kinds' values are the wire's Constraint.kind. */
typedef enum {
    TD_IREQ_CONSTRAINT_NONE = 0,
    TD_IREQ_CONSTRAINT_JSON_OBJECT,   /* any JSON object */
    TD_IREQ_CONSTRAINT_JSON_SCHEMA,   /* spec: the schema */
    TD_IREQ_CONSTRAINT_REGEX,         /* spec: a string */
    TD_IREQ_CONSTRAINT_CHOICE,        /* spec: an array of strings */
    TD_IREQ_CONSTRAINT_GRAMMAR,       /* spec: an EBNF grammar string */
} td_ireq_constraint_kind_t;

typedef struct {
    td_ireq_constraint_kind_t kind;
    json_t *spec;                /* a reference, or NULL */
    bool strict;                 /* json_schema.strict */
    char param[96];              /* the field that asked for it */
    char *text;                  /* td_ireq_finish: the spec as the grammar engine reads it
                                    (compact JSON, the pattern or the grammar); owned */
} td_ireq_constraint_t;

/* What the reply reports and how. */
typedef struct {
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    bool logprobs;               /* each token's log-probability ... */
    uint32_t top_logprobs;       /* ... with this many alternatives */
    bool skip_special;           /* special tokens left out of the text (default) */
} td_ireq_output_t;

/* Reasoning: the V4.1 chat format's thinking switch and effort. */
typedef struct {
    int thinking;                /* -1: the request's "thinking" object or the default;
                                    0 / 1: chat_template_kwargs.thinking */
    uint32_t budget;             /* most reasoning tokens of a choice (Messages'
                                    thinking.budget_tokens); 0: no cap */
} td_ireq_reasoning_t;

/* A validated request; everything it points to is owned by it and freed by
 * td_ireq_destroy(). Defaults are filled in. */
typedef struct {
    td_openai_kind_t kind;       /* the protocol whose writer answers it */
    char *model;
    /* input: a conversation ... */
    td_ireq_msg_t *msgs;         /* chat: nmsgs >= 1 */
    size_t nmsgs;
    char *tools;                 /* raw JSON array, or NULL */
    char *tool_choice;           /* raw JSON (string or object), or NULL */
    td_ireq_reasoning_t reasoning;
    /* ... or a prompt */
    char *prompt;                /* the prompt text, or NULL when ... */
    int32_t *prompt_ids;         /* ... it was given as token ids: [nprompt_ids], each in
                                    [0, cfg vocab); NULL for a text prompt */
    size_t nprompt_ids;
    td_ireq_sampling_t sampling;
    td_ireq_stop_t stop;
    td_ireq_constraint_t constraint;
    uint32_t n;                  /* choices, 1 .. the configured max-n */
    td_ireq_output_t out;
    int32_t priority;            /* the admission queue's order, higher first */
    json_t *body;                /* the parsed body (a reference): the chat encoder
                                    reads the conversation from it */
    json_t *proto;               /* what the protocol's writer needs of the request
                                    (Responses: the settings its response objects echo,
                                    the conversation a stored response keeps), or NULL */
} td_ireq_t;

/* What the adapters check requests against. */
typedef struct {
    const char *const *models;    /* model ids served, NULL-terminated */
    size_t max_body;              /* a larger body gets 413 */
    uint32_t max_tokens_limit;    /* largest max_tokens accepted (>= 1) */
    uint32_t max_tokens_default;  /* max_tokens when the request has none */
    uint32_t vocab;               /* logit_bias, stop_token_ids and token-id prompt ids
                                     must be below it (0: unchecked) */
    size_t max_stop_bytes;        /* longest stop string (0: TD_OPENAI_STOP_BYTES) */
    uint32_t max_n;               /* most choices (0: TD_IREQ_DEFAULT_MAX_N) */
    bool no_default_thinking;     /* Messages and Responses requests that ask for neither
                                     thinking nor an effort have thinking off (the
                                     reference's default_thinking_mode false) */
    uint32_t nmodel_stop;         /* the model's end-of-sequence ids (they count in */
    const int32_t *model_stop;    /*   TD_IREQ_MAX_STOP_IDS with stop_token_ids) */
    const struct td_gvocab *gvocab; /* constraints are checked against it; NULL: refused */
    size_t max_constraint_bytes;  /* the largest spec (0: TD_GRAMMAR_MAX_SPEC) */
    uint32_t constraint_budget_ms;/* compile time budget (0: TD_GRAMMAR_BUDGET_MS) */
} td_ireq_cfg_t;

void td_ireq_destroy(td_ireq_t *req);

/* The stop ids every choice of req stops at: its stop_token_ids, and the
 * model's EOS ids unless ignore_eos; at most TD_IREQ_MAX_STOP_IDS (checked
 * by td_ireq_finish). Returns how many were written to out. */
size_t td_ireq_stop_ids(const td_ireq_t *req, const td_ireq_cfg_t *cfg,
                        int32_t out[TD_IREQ_MAX_STOP_IDS]);

/* ---- Parsing: what the adapters share ---------------------------------------- */

/* One parse of a body into a request. */
typedef struct {
    const td_ireq_cfg_t *cfg;
    td_ireq_t *req;
    td_openai_err_t *e;
    bool has_model, has_body;            /* model; messages or prompt */
    bool has_stream_options;
    int64_t max_tokens, max_completion;  /* 0: not given */
} td_ireq_parse_t;

/* A field's parser: reads v (never JSON null: null is the default) into
 * p->req, or fills p->e and returns the failure. */
typedef td_status_t (*td_ireq_field_fn)(td_ireq_parse_t *p, const char *key, const json_t *v);

/* A protocol's field: its name, which of the protocol's kinds take it
 * (a bit per td_openai_kind_t), its parser, and whether null counts as
 * missing (else null is the default). */
typedef struct {
    const char *name;
    unsigned kinds;
    td_ireq_field_fn fn;
    bool required;
} td_ireq_field_t;

#define TD_IREQ_KIND(k) (1u << (k))

/* A fresh request of kind with the defaults (temperature 1, top_p 1, n 1,
 * skip_special, no thinking override). NULL: out of memory. */
td_ireq_t *td_ireq_new(td_openai_kind_t kind);

/* The fields every protocol shares (sampling, stop rules, choices, output
 * options, vLLM's extensions): the entry of name for kind, or NULL. */
const td_ireq_field_t *td_ireq_field_find(td_openai_kind_t kind, const char *name);

/* Parse an object body: each key through the adapter's own table first
 * (own, NULL-name terminated), then the shared one; a key neither knows is
 * refused with 400 naming it (and saying so when it is a vLLM field this
 * server does not support). Then td_ireq_finish. On success *out owns body
 * (a reference is taken). */
td_status_t td_ireq_parse_object(const td_ireq_cfg_t *cfg, td_openai_kind_t kind,
                                 const td_ireq_field_t *own, json_t *body, td_ireq_t **out,
                                 td_openai_err_t *e);

/* The checks that involve more than one field, once every field was read:
 * model and input present, max_tokens vs max_completion_tokens, min_tokens
 * <= max_tokens, the stop ids with the model's within the bound, the
 * constraint (compiled: a bad one is a 400 naming it), the model served
 * (404). Runs on a text thread, never the loop (the compile). */
td_status_t td_ireq_finish(td_ireq_parse_t *p);

/* Field primitives: each checks v and fills p->e on failure (OpenAI's
 * messages and codes). */
td_status_t td_ireq_bad_type(td_ireq_parse_t *p, const char *param, const char *expected,
                             const json_t *v);
td_status_t td_ireq_missing(td_ireq_parse_t *p, const char *param);
td_status_t td_ireq_unsupported(td_ireq_parse_t *p, const char *param, const char *why);
td_status_t td_ireq_nomem(td_ireq_parse_t *p);
td_status_t td_ireq_empty_array(td_ireq_parse_t *p, const char *param);
td_status_t td_ireq_get_int(td_ireq_parse_t *p, const char *param, const json_t *v,
                            int64_t min, int64_t max, int64_t *out);
/* A number in [lo, hi], or (lo, hi] when lo_open. */
td_status_t td_ireq_get_number(td_ireq_parse_t *p, const char *param, const json_t *v,
                               double lo, bool lo_open, double hi, double *out);
td_status_t td_ireq_get_bool(td_ireq_parse_t *p, const char *param, const json_t *v,
                             bool *out);
td_status_t td_ireq_get_string(td_ireq_parse_t *p, const char *param, const json_t *v,
                               char **out);
/* The raw JSON of v, kept for a later stage (the chat encoder). */
td_status_t td_ireq_get_raw(td_ireq_parse_t *p, const json_t *v, char **out);
/* An id in [0, vocab) (vocab 0: below 2^31) at param. */
td_status_t td_ireq_get_token(td_ireq_parse_t *p, const char *param, const json_t *v,
                              int32_t *out);

/* Record the request's constraint (structured output), asked for by param:
 * a second one is refused; td_ireq_finish refuses every constraint until the
 * grammar engine enforces them. spec: a reference is taken (NULL: none). */
td_status_t td_ireq_constraint_set(td_ireq_parse_t *p, const char *param,
                                   td_ireq_constraint_kind_t kind, const json_t *spec);

/* The stand-in's view of a chat-shaped messages array (role and text of
 * each; tool calls kept raw), for adapters whose own input was converted
 * into one (Messages, Responses): the V4.1 encoder reads the converted body
 * itself. */
td_status_t td_ireq_set_msgs(td_ireq_parse_t *p, const json_t *messages);

/* "an integer", "a string", ... for messages. */
const char *td_ireq_json_type(const json_t *v);

/* A parameter path such as "messages[2].content[0].text" (cut to fit). */
typedef char td_ireq_param_t[sizeof(((td_openai_err_t *)0)->param)];
void td_ireq_param_fmt(td_ireq_param_t pp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
