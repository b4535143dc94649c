/* routerd/rtext.h — the CPU work of one request, which runs on routerd's
 * text threads: parsing and validating the body, encoding a chat and
 * tokenizing the prompt; turning generated tokens into text (incremental
 * detokenizing, log-probabilities, stop strings, the V4.1 reply reader's
 * deltas) and that text into SSE events or the answer; the end of the reply.
 * It knows no socket, timer or request state: rreq.c decides what runs when
 * and sends what comes out.
 *
 * Threads and ownership: the request (rreq.c) owns its td_rtext_t and runs
 * at most one job of it at a time (td_rtext_prompt_run, td_rtext_tokens_run),
 * on a text thread or inline on the loop. While a job runs, only the job
 * touches the td_rtext_t, except td_rtext_push / td_rtext_push_end (the loop
 * adds to an inbox the job does not read) and td_rtext_cancel (any thread).
 * Everything else is called on the loop thread with no job running. What a
 * job leaves (td_rtext_result, td_rtext_out) is read after it, on the loop
 * (the job queue's mutex orders the two). */
#ifndef TD_ROUTERD_RTEXT_H
#define TD_ROUTERD_RTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "chat_prompt.h"
#include "http.h"
#include "ireq.h"
#include "openai.h"
#include "status.h"
#include "tandem.pb-c.h"
#include "tok.h"
#include "tokenizer.h"


/* What every request's text work reads (pointers kept; they outlive it). */
typedef struct {
    const td_ireq_cfg_t *api;       /* request validation */
    const td_tok_t *tok;
    const td_tokenizer_t *v41;      /* the V4.1 tokenizer behind tok, or NULL */
    const char *model;              /* id in responses */
    const char *fingerprint;        /* system_fingerprint */
    struct td_rstore *store;        /* stored responses, or NULL */
} td_rtext_cfg_t;

typedef struct td_rtext_s td_rtext_t;

/* What the last job found. */
typedef struct {
    td_status_t st;             /* TD_OK, else the request fails with err */
    td_openai_err_t err;        /* st != TD_OK: what the client is told */
    bool refused;               /* the parser refused the body (err is its 4xx/413) */
    bool ended;                 /* tokens: every choice is complete; out holds the end */
    bool by_us;                 /* ended: a choice was ended here (a stop string or
                                   max_tokens), not by the rank */
    uint64_t cut;               /* choices a stop string ended in this job (bit i: choice
                                   i), which the rank may go on generating */
} td_rtext_res_t;

/* The text work of a request of kind with id oid (kept: it must outlive the
 * td_rtext_t); the body moves out of hreq (td_http_body_take: the HTTP
 * request may go away with its client while the prompt job runs).
 * TD_ERR_NOMEM (not logged). Loop thread. */
td_status_t td_rtext_create(const td_rtext_cfg_t *cfg, td_openai_kind_t kind, const char *oid,
                            td_http_req_t *hreq, td_rtext_t **out);
void td_rtext_destroy(td_rtext_t *x);

/* The request has ended: a job not started yet does nothing, a running one
 * stops at the next slice of 64 tokens (a prompt's tokenizing runs to its
 * end). Any thread. */
void td_rtext_cancel(td_rtext_t *x);

/* Bytes of the body, for choosing td_jobq_post_long. */
size_t td_rtext_body_len(const td_rtext_t *x);

/* ---- The prompt ---------------------------------------------------------- */

/* The job: parse and validate the body, encode the chat (V4.1 format) or
 * take the prompt text, tokenize it (a completion's token-id prompt is taken
 * as it is); set up the stop matcher, the reply reader, the
 * log-probabilities and the stream's metadata. */
void td_rtext_prompt_run(td_rtext_t *x);
/* The prompt of a parsed request as ids (*ids malloc'd, the caller frees):
 * a V4.1 chat encoded (then *chat, when chat is not NULL, is the encoding,
 * which says how to read the reply: the caller destroys it), token ids as
 * given, text tokenized. Fails with err filled: a 400 the chat format
 * cannot express, else 500. Any thread. */
td_status_t td_rtext_prompt_ids(const td_rtext_cfg_t *cfg, const td_ireq_t *o, uint32_t **ids,
                                size_t *n, td_chat_prompt_t **chat, td_openai_err_t *err);

/* After it succeeded: the parsed request (x's: valid while x lives, read by
 * both sides, changed by neither but for the seed, which the text work does
 * not read) and the prompt's ids (moved to the caller, who frees them). */
td_ireq_t *td_rtext_req(td_rtext_t *x);
int32_t *td_rtext_take_prompt(td_rtext_t *x, size_t *n);

/* ---- Generated tokens ------------------------------------------------------ */

/* The SSE events that start a stream (each choice's first chunk: a chat's
 * delta.role), appended to out; from now on the text goes out as SSE
 * events. */
td_status_t td_rtext_stream_start(td_rtext_t *x, td_buf_t *out);

/* One Tokens message's first n ids of choice (< the request's n) for the
 * next job, with their log-probabilities (lps: n entries whose tokens the
 * caller checked, or NULL when none were asked for); last_stop: the last is
 * a stop token (the rank's finish STOP). TD_ERR_NOMEM. Loop thread, a job
 * may run. */
td_status_t td_rtext_push(td_rtext_t *x, uint32_t choice, const int32_t *ids, size_t n,
                          bool last_stop, Tandem__TokenLogprob *const *lps);
/* The choice ends after what was pushed: finish from the rank, or by_us
 * (max_tokens reached). Loop thread, a job may run. */
void td_rtext_push_end(td_rtext_t *x, uint32_t choice, td_openai_finish_t finish, bool by_us);
/* The prefill rank served n prompt tokens from its prefix cache: the usage
 * says so (prompt_tokens_details.cached_tokens). Loop thread, a job may run. */
void td_rtext_push_cached(td_rtext_t *x, uint64_t n);
/* Hand what was pushed to the next job; returns its weight, tokens times (1
 * + alternatives each), with 1 for the end of the reply: 0 means nothing
 * to do. Loop thread, no job running. */
size_t td_rtext_tokens_take(td_rtext_t *x);
/* The job: message by message, each through its choice's reply reader, as
 * SSE events (streaming) or kept for the answer; a choice that ends (pushed,
 * or a stop string matched) gets its finish chunk; once every choice has
 * ended, usage and [DONE], or the whole answer's JSON. */
void td_rtext_tokens_run(td_rtext_t *x);

/* The job that ends the reply must run on a text thread (never inline on
 * the loop): it stores the response (Responses with store). */
bool td_rtext_off_loop(const td_rtext_t *x);
/* The prompt job must run on a text thread, whatever the body's size: it may
 * read the store (a Responses request's previous_response_id). */
bool td_rtext_prompt_off_loop(const td_rtext_t *x);

/* An error in the middle of the stream, in the protocol's form (x NULL:
 * OpenAI's chunk); the events of a job still running are dropped (it is
 * numbered after those sent). Loop thread. */
td_status_t td_rtext_stream_error(td_rtext_t *x, const td_openai_err_t *e, td_buf_t *out);

/* ---- After a job ----------------------------------------------------------- */

const td_rtext_res_t *td_rtext_result(const td_rtext_t *x);
/* What the last job made: SSE events to send, or once ended without a
 * stream the answer's JSON. Emptied by td_rtext_out_reset. */
const td_buf_t *td_rtext_out(const td_rtext_t *x);
void td_rtext_out_reset(td_rtext_t *x);

#endif
