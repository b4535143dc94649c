/* engine/sample.h — sampling, below the engine interface: the parameters a
 * request samples with, a next-token distribution and the generic sampler
 * over it, the seeded draw per position, argmax for greedy rows, the chosen
 * token's log-probabilities, stop tokens and the finish rule. It knows no
 * engine and no model. */
#ifndef TD_SAMPLE_H
#define TD_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* ---- Parameters and distributions --------------------------------------------- */

#define TD_SAMPLE_MAX_STOP 16

/* Per-request sampling parameters, copied into each request. */
typedef struct {
    double temperature;   /* 0 = greedy (argmax; ties: lowest id) */
    double top_p;         /* (0, 1]: keep the smallest top set with mass >= top_p */
    uint32_t top_k;       /* 0 = no limit */
    uint64_t seed;        /* the draw for position p depends on (seed, p) only */
    uint32_t max_tokens;  /* generated tokens, first included; 0 = up to max context */
    uint32_t nstop;
    int32_t stop[TD_SAMPLE_MAX_STOP]; /* token ids that end the request */
} td_sample_params_t;

/* Greedy, no limits. */
td_sample_params_t td_sample_params_greedy(void);

typedef enum {
    TD_SAMPLE_FINISH_NONE = 0,  /* go on */
    TD_SAMPLE_FINISH_STOP,      /* the token is a stop token (it is still returned) */
    TD_SAMPLE_FINISH_LENGTH,    /* max_tokens generated or the context is full */
} td_sample_finish_t;

const char *td_sample_finish_str(td_sample_finish_t f);

/* A next-token distribution: n candidates, every other token has logit -inf.
 * Dense engines give ids = NULL (candidate i is token i, n = vocab). */
typedef struct {
    uint32_t n;
    const int32_t *ids;   /* [n] or NULL */
    const float *logits;  /* [n] */
} td_sample_dist_t;

/* The generic sampler over a distribution: greedy when temperature == 0 or
 * top_k == 1; else sort by logit (desc, ties by id), keep top_k, softmax at
 * temperature, keep the top_p prefix, draw u = td_sample_draw(seed, position).
 * TD_ERR_INVALID for an empty distribution or bad parameters. */
td_status_t td_sample_dist(const td_sample_dist_t *lg, const td_sample_params_t *sp,
                           uint64_t position, int32_t *token);

/* The uniform draw in [0, 1) for (seed, position) (53 bits of a keyed mix). */
double td_sample_draw(uint64_t seed, uint64_t position);

/* ---- Rows of logits ------------------------------------------------------------- */

/* The id of the largest of n logits, the lowest id among equals; -1 when n
 * is 0 or a logit is NaN. */
int32_t td_sample_argmax(const float *logits, size_t n);

/* tokens[r] for each of rows rows of logits [rows, vocab]: greedy
 * (temperature 0 or top_k 1) takes the argmax, otherwise
 * td_sample_dist draws with sp[r] at positions[r] (the position of
 * the token being chosen, so a request's draws do not depend on batching).
 * TD_ERR_INVALID for a row with a NaN or +inf logit or no finite one, or for
 * bad parameters (logged, naming the row). */
td_status_t td_sample_rows(const float *logits, size_t rows, size_t vocab,
                           const td_sample_params_t *const *sp, const uint64_t *positions,
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
td_status_t td_sample_pick(const float *logits, size_t n, const td_sample_params_t *sp,
                           uint64_t position, uint32_t ntop, td_sample_pick_t *out);

/* ---- Stopping ------------------------------------------------------------------ */

/* Check sampling parameters: temperature finite and >= 0, top_p in (0, 1],
 * nstop <= TD_SAMPLE_MAX_STOP, stop ids >= 0. TD_ERR_INVALID, with the
 * offending field in err (err may be NULL). */
td_status_t td_sample_check(const td_sample_params_t *sp, char *err, size_t errlen);

/* Add id to sp's stop tokens unless it is there: TD_ERR_RANGE when
 * TD_SAMPLE_MAX_STOP are there already (sp unchanged). */
td_status_t td_sample_stop_add(td_sample_params_t *sp, int32_t id);

/* Why generation ends once token was chosen as the generated-th token
 * (1-based), making the sequence seq_len tokens long: STOP when token is one
 * of sp's stop ids; else LENGTH when sp->max_tokens (non-zero) is reached or
 * seq_len reaches context (non-zero); else NONE. */
td_sample_finish_t td_sample_finish(const td_sample_params_t *sp, int32_t token,
                                    uint64_t generated, uint64_t seq_len, uint64_t context);

#endif
