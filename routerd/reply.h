/* routerd/reply.h — the one reply reader: one choice's generated tokens
 * turned into what every protocol shows of them, written once: the
 * tokens' log-probabilities, their text (incremental, UTF-8-safe, special
 * tokens left out or spelled as the request asks), the request's stop
 * strings (the one stop matcher; armed once min_tokens are generated; the
 * string kept or cut), the V4.1 reply reader's reasoning / content / tool
 * calls, the finish reason. What is certain is handed to the caller's emit
 * function as deltas (plain text: content deltas), which the protocol's
 * writer turns into its events; at the end the whole reply is there for a
 * non-streaming answer.
 * Threads: a reader is used by one thread at a time (the request's text
 * job). Ownership: the reader owns its decoder state, matcher, V4.1 reader
 * and log-probabilities; what its config points to outlives it. */
#ifndef TD_ROUTERD_REPLY_H
#define TD_ROUTERD_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "chat_reply.h"
#include "ireq.h"
#include "openai.h"
#include "status.h"
#include "tok.h"

typedef struct td_reply td_reply_t;

typedef struct {
    const td_tok_t *tok;
    const td_ireq_t *req;                /* stop rules, min_tokens, output options */
    const td_chat_reply_opts_t *chat;    /* V4.1 chat: read the reply back (its stop
                                            strings, matched in content); NULL: plain
                                            text with req's stop strings */
    uint32_t index;                      /* the choice */
} td_reply_cfg_t;

/* A token's log-probabilities as a rank sent them. */
typedef struct {
    double logprob;
    uint32_t ntop;
    const int32_t *top_ids;      /* [ntop] */
    const double *top_logprobs;  /* [ntop] */
} td_reply_lp_t;

/* Where certain output goes, delta by delta (a plain reply's text comes as
 * CONTENT deltas); the reader's log-probabilities not yet sent are in
 * td_reply_logprobs. */
typedef td_status_t (*td_reply_emit_fn)(void *arg, td_reply_t *rp,
                                        const td_chat_reply_delta_t *d);

/* TD_ERR_NOMEM; TD_ERR_INVALID for options the V4.1 reader refuses. */
td_status_t td_reply_create(const td_reply_cfg_t *cfg, td_reply_t **out);
void td_reply_destroy(td_reply_t *rp);

/* The next n tokens of the choice (lps: n entries, or NULL when the request
 * asked for none): log-probabilities, text, stop strings, deltas through
 * emit (NULL: the reply is only kept, for a non-streaming answer).
 * last_stop: the last one is a stop token (an EOS id or one of
 * stop_token_ids, the rank's finish STOP): its text is left out unless
 * include_stop_str_in_output (vLLM's rule; an EOS id's text is empty anyway
 * while special tokens are skipped). *stopped: a stop string ended the
 * choice (the rest of its output does not count). Tokens after the choice
 * ended are ignored. */
td_status_t td_reply_feed(td_reply_t *rp, const uint32_t *ids, size_t n, bool last_stop,
                          const td_reply_lp_t *lps, td_reply_emit_fn emit, void *arg,
                          bool *stopped);
/* The choice ends: finish from the rank (STOP or LENGTH), or a stop string
 * (then STOP). What the decoder, the matcher and the V4.1 reader held back
 * goes out; the finish reason is fixed (td_reply_finish_reason). */
td_status_t td_reply_end(td_reply_t *rp, td_openai_finish_t finish, td_reply_emit_fn emit,
                         void *arg);

uint32_t td_reply_index(const td_reply_t *rp);
/* The reasoning reached the request's reasoning.budget tokens: the choice
 * ended there, as by max_tokens (finish LENGTH; *stopped was set). */
bool td_reply_over_budget(const td_reply_t *rp);
/* The stop string that ended the choice, or NULL. */
const char *td_reply_stop_string(const td_reply_t *rp);
/* Tokens generated while the reply was in its reasoning. */
uint32_t td_reply_nreasoning(const td_reply_t *rp);
bool td_reply_ended(const td_reply_t *rp);
/* Tokens the choice generated (what its usage counts). */
uint32_t td_reply_ntokens(const td_reply_t *rp);
/* After td_reply_end: stop, length or tool_calls. */
td_openai_finish_t td_reply_finish_reason(const td_reply_t *rp);
/* The log-probabilities not sent yet (NULL: none asked). */
td_openai_logprobs_t *td_reply_logprobs(td_reply_t *rp);
/* The whole reply so far: the V4.1 reader's (NULL for a plain reply), or
 * the plain text. */
const td_chat_reply_t *td_reply_chat(const td_reply_t *rp);
const td_buf_t *td_reply_text(const td_reply_t *rp);

#endif
