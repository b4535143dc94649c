/* text/chat_reply.h — the DeepSeek-V4.1 model's output read back, incrementally,
 * into reasoning, content and DSML tool calls, as OpenAI chat deltas and an
 * OpenAI assistant message. docs/chat.md describes the format. */
#ifndef TD_CHAT_REPLY_H
#define TD_CHAT_REPLY_H

#include "status.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where the model's output begins: what the prompt left open. */
typedef enum {
    TD_CHAT_REPLY_START_PLAIN = 0,      /* thinking off: content (leading newlines dropped) */
    TD_CHAT_REPLY_START_REASONING,      /* after "<think>": reasoning (leading newlines dropped) */
    TD_CHAT_REPLY_START_REASONING_CONT, /* continuing a prefix's reasoning */
    TD_CHAT_REPLY_START_CONTENT_CONT,   /* continuing a prefix's content, thinking on */
} td_chat_reply_start_t;

/* How to read one reply; td_chat_prompt_encode fills it from the request. */
typedef struct {
    td_chat_reply_start_t start;
    bool tool_calls;          /* recognise DSML tool-call blocks */
    bool in_tool_calls;       /* the prompt opened the block (tool_choice required/named) */
    const char *const *stop;  /* stop strings (non-empty), matched in content only */
    size_t nstop;
    bool stop_include;        /* a matched stop string ends the content (vLLM's
                                 include_stop_str_in_output); else it is left out */
    bool split_args;          /* each piece of a call's arguments JSON (punctuation, a
                                 name, a value) its own TOOL_ARGS delta, as the
                                 reference's Messages and Responses generators send
                                 them; else adjacent pieces are merged */
    uint64_t id_seed;         /* 0: tool call ids from the system's randomness;
                                 otherwise a fixed sequence (tests) */
} td_chat_reply_opts_t;

typedef enum {
    TD_CHAT_REPLY_DELTA_REASONING = 0, /* text */
    TD_CHAT_REPLY_DELTA_CONTENT,       /* text */
    TD_CHAT_REPLY_DELTA_TOOL_CALL,     /* index, id, name: a tool call begins */
    TD_CHAT_REPLY_DELTA_TOOL_ARGS,     /* index, text: the next piece of its arguments JSON */
} td_chat_reply_delta_kind_t;

/* One delta. The pointers stay valid until the next feed/finish/destroy. */
typedef struct {
    td_chat_reply_delta_kind_t kind;
    uint32_t index;       /* TOOL_CALL, TOOL_ARGS: 0, 1, ... in order of appearance */
    const char *id;       /* TOOL_CALL: "call_<index, 2 digits>_<20 alnum><4 digits>",
                             random; with thinking on and no reasoning before the
                             call, "call_<index>_ET_<20 alnum><4 digits>" */
    const char *name;     /* TOOL_CALL */
    const char *text;     /* REASONING, CONTENT, TOOL_ARGS: len bytes (NUL-terminated) */
    size_t len;
} td_chat_reply_delta_t;

typedef enum {
    TD_CHAT_REPLY_FINISH_STOP = 0,   /* end of sequence, or a stop string matched */
    TD_CHAT_REPLY_FINISH_LENGTH,     /* max_tokens or the context ran out */
    TD_CHAT_REPLY_FINISH_TOOL_CALLS, /* ended normally after at least one tool call */
} td_chat_reply_finish_t;

/* "stop", "length", "tool_calls". */
const char *td_chat_reply_finish_str(td_chat_reply_finish_t f);

typedef struct {
    char *id;
    char *name;
    char *arguments;      /* JSON text as the model wrote it (may be unfinished) */
    size_t arguments_len;
} td_chat_reply_call_t;

/* A whole reply, as the deltas add up. Strings are NUL-terminated; content and
 * reasoning may hold NUL bytes, hence the lengths. */
typedef struct {
    char *content;
    size_t content_len;
    char *reasoning;           /* NULL unless the output begins in reasoning (thinking
                                  on, and not a continuation of a prefix's content) */
    size_t reasoning_len;
    td_chat_reply_call_t *calls;
    size_t ncalls;
    td_chat_reply_finish_t finish;
} td_chat_reply_t;

/* ---- The streaming reader ---------------------------------------------- */

typedef struct td_chat_reply_reader td_chat_reply_reader_t;

/* The strings in opts are copied. An opts the reader cannot use (an unknown
 * start, an empty stop string): TD_ERR_INVALID, logged. */
td_status_t td_chat_reply_reader_create(const td_chat_reply_opts_t *opts,
                                        td_chat_reply_reader_t **out);
void td_chat_reply_reader_destroy(td_chat_reply_reader_t *rd);

/* Feed the next len bytes of output text, normally one token's text (any
 * split works, also inside a UTF-8 character; invalid UTF-8 becomes U+FFFD).
 * *deltas (owned by rd) gets what is now certain: text that may be the start
 * of a marker is held back, and with it the rest of what the same feed
 * brought, as the reference reader does; the deltas of every feed equal the
 * reference's. Adjacent deltas of one kind are merged. Once a stop string has
 * matched (td_chat_reply_reader_stopped), the rest of the output is ignored.
 * Feeding after td_chat_reply_reader_finish: TD_ERR_STATE; out of memory:
 * TD_ERR_NOMEM (the reader takes nothing more); both logged. */
td_status_t td_chat_reply_reader_feed(td_chat_reply_reader_t *rd, const char *text, size_t len,
                                      const td_chat_reply_delta_t **deltas, size_t *ndeltas);
/* End of output; engine says why generation ended (STOP or LENGTH). Releases
 * what was held back and fixes the finish reason. A second finish:
 * TD_ERR_STATE, logged. */
td_status_t td_chat_reply_reader_finish(td_chat_reply_reader_t *rd, td_chat_reply_finish_t engine,
                                        const td_chat_reply_delta_t **deltas, size_t *ndeltas);
/* armed false: a stop string that completes does not count (the request's
 * min_tokens are not reached yet); what may still become one is held all the
 * same. A reader starts armed. */
void td_chat_reply_reader_arm(td_chat_reply_reader_t *rd, bool armed);
/* The output is in its reasoning now (what comes next is reasoning). */
bool td_chat_reply_reader_in_reasoning(const td_chat_reply_reader_t *rd);
/* The stop string that matched (owned by rd), or NULL. */
const char *td_chat_reply_reader_stop(const td_chat_reply_reader_t *rd);
/* A stop string matched: the caller should end generation. */
bool td_chat_reply_reader_stopped(const td_chat_reply_reader_t *rd);
/* Everything so far (finish set after td_chat_reply_reader_finish); owned by rd. */
const td_chat_reply_t *td_chat_reply_reader_reply(const td_chat_reply_reader_t *rd);

/* ---- One shot ---------------------------------------------------------- */

/* The whole output at once. *out: free with td_chat_reply_destroy. */
td_status_t td_chat_reply_parse(const td_chat_reply_opts_t *opts, const char *text, size_t len,
                                td_chat_reply_finish_t engine, td_chat_reply_t **out);
void td_chat_reply_destroy(td_chat_reply_t *r);

/* The reply as an OpenAI chat message: {"role":"assistant","content",
 * "reasoning_content" (when r->reasoning is set),"tool_calls" (when there
 * are: index, id, type "function", function {name, arguments})}.
 * *out: a new reference. TD_ERR_NOMEM, logged. */
td_status_t td_chat_reply_json(const td_chat_reply_t *r, json_t **out);

#endif
