/* engine/sample.h — the next token of each request from a row of logits:
 * argmax for greedy requests, else the engine's sampler (temperature, top-k,
 * top-p, a seeded draw per position; td_engine_sample_logits), with the
 * chosen token's log-probabilities, stop tokens and the finish rule. */
#ifndef TD_SAMPLE_H
#define TD_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "modelcfg.h"
#include "status.h"
#include "tokenizer.h"

/* The id of the largest of n logits, the lowest id among equals; -1 when n
 * is 0 or a logit is NaN. */
int32_t td_sample_argmax(const float *logits, size_t n);

/* tokens[r] for each of rows rows of logits [rows, vocab]: greedy
 * (temperature 0 or top_k 1) takes the argmax, otherwise
 * td_engine_sample_logits draws with sp[r] at positions[r] (the position of
 * the token being chosen, so a request's draws do not depend on batching).
 * TD_ERR_INVALID for a row with a NaN or +inf logit or no finite one, or for
 * bad parameters (logged, naming the row). */
td_status_t td_sample_rows(const float *logits, size_t rows, size_t vocab,
                           const td_engine_sampling_t *const *sp, const uint64_t *positions,
                           int32_t *tokens);

/* ---- Log-probabilities --------------------------------------------------------- */

/* The most alternatives a step reports (OpenAI's top_logprobs bound). */
#define TD_SAMPLE_MAX_TOP 20

typedef struct {
    int32_t id;
    double logprob;
} td_sample_alt_t;

/* A chosen token with its log-probabilities under the model's distribution:
 * log_softmax of the raw logits (temperature, top-k and top-p do not enter),
 * computed in double. */
typedef struct {
    int32_t token;
    double logprob;                         /* log_softmax(logits)[token]; -inf possible */
    uint32_t ntop;                          /* entries of top: min(asked, vocab) */
    td_sample_alt_t top[TD_SAMPLE_MAX_TOP]; /* most likely first; equal logits: lowest id */
} td_sample_pick_t;

/* log Σ exp(logits[i]) over n logits, in double (max-shifted; -inf logits add
 * nothing). TD_ERR_INVALID for n = 0, a NaN or +inf logit, or no finite one. */
td_status_t td_sample_logsumexp(const float *logits, size_t n, double *lse);

/* out->logprob of token and out->top, the ntop (<= TD_SAMPLE_MAX_TOP) most
 * likely of the n ids; out->token = token. TD_ERR_RANGE for a token outside
 * [0, n) or ntop above the bound; TD_ERR_INVALID as td_sample_logsumexp. */
td_status_t td_sample_logprobs(const float *logits, size_t n, int32_t token, uint32_t ntop,
                               td_sample_pick_t *out);

/* Choose the token at `position` from one row as td_sample_rows does, and
 * report its log-probabilities with ntop alternatives (td_sample_logprobs). */
td_status_t td_sample_pick(const float *logits, size_t n, const td_engine_sampling_t *sp,
                           uint64_t position, uint32_t ntop, td_sample_pick_t *out);

/* ---- Stopping ------------------------------------------------------------------ */

/* Check sampling parameters: temperature finite and >= 0, top_p in (0, 1],
 * nstop <= TD_ENGINE_MAX_STOP, stop ids >= 0. TD_ERR_INVALID, with the
 * offending field in err (err may be NULL). */
td_status_t td_sample_check(const td_engine_sampling_t *sp, char *err, size_t errlen);

/* Add the end-of-sequence ids to sp's stop tokens (those already there are
 * not repeated): config.json's eos_token_id (an int or a list), or, when it
 * is null, the tokenizer's "<｜end▁of▁sentence｜>" (tok may be NULL). An id
 * outside [0, vocab_size): TD_ERR_INVALID; more stops than
 * TD_ENGINE_MAX_STOP: TD_ERR_RANGE; neither source names one:
 * TD_ERR_NOT_FOUND (a warning: the caller may go on without). Logged; sp
 * unchanged on error. */
td_status_t td_sample_stop_eos(const td_modelcfg_t *cfg, const td_tokenizer_t *tok,
                               td_engine_sampling_t *sp);

/* Why generation ends once token was chosen as the generated-th token
 * (1-based), making the sequence seq_len tokens long: STOP when token is one
 * of sp's stop ids; else LENGTH when sp->max_tokens (non-zero) is reached or
 * seq_len reaches context (non-zero); else NONE. */
td_engine_finish_t td_sample_finish(const td_engine_sampling_t *sp, int32_t token,
                                    uint64_t generated, uint64_t seq_len, uint64_t context);

#endif
