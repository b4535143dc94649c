/* engine/sample.h — sampling, below the engine interface: the parameters a
 * request samples with (logit_bias, penalties, min_tokens and logprobs
 * included), the token history the penalties read, a next-token
 * distribution and the one sampler over it (O(n): the bias, the min_tokens
 * mask and the penalties, then greedy, min-p, top-k, top-p, the seeded draw
 * per position), the chosen token's log-probabilities, stop tokens and the
 * finish rule. Its inputs are per row (td_sample_row_t: parameters, history,
 * position), so that a batch is rows of them. It knows no engine and no
 * model. */
#ifndef TD_SAMPLE_H
#define TD_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* ---- Parameters and distributions --------------------------------------------- */

#define TD_SAMPLE_MAX_STOP 16
/* The most logit_bias entries a request may carry, and the largest |bias|
 * (OpenAI's range). */
#define TD_SAMPLE_MAX_BIAS 300
#define TD_SAMPLE_BIAS_LIMIT 100.0
/* The most alternatives a step reports (OpenAI's top_logprobs bound). */
#define TD_SAMPLE_MAX_TOP 20

/* One logit_bias entry: bias is added to token id's logit before anything
 * else looks at the distribution. */
typedef struct {
    int32_t id;
    float bias;
} td_sample_bias_t;

/* The bounds of the penalties (OpenAI's for presence and frequency; vLLM
 * takes any repetition_penalty > 0, this server up to 2). */
#define TD_SAMPLE_PENALTY_LIMIT 2.0
#define TD_SAMPLE_REPETITION_MAX 2.0

/* Per-request sampling parameters, copied into each request. */
typedef struct {
    double temperature;   /* 0 = greedy (argmax; ties: lowest id) */
    double top_p;         /* (0, 1]: keep the smallest top set with mass >= top_p */
    uint32_t top_k;       /* 0 = no limit */
    double min_p;         /* [0, 1]: drop the tokens whose weight at the temperature is
                             below min_p times the top one's; 0 = off */
    double repetition_penalty; /* (0, 2], 1 or 0 (unset) = off: vLLM's, over prompt and
                                  output */
    double presence_penalty;   /* [-2, 2], 0 = off: OpenAI's, over the output */
    double frequency_penalty;  /* [-2, 2], 0 = off: OpenAI's, over the output */
    uint32_t min_tokens;  /* the stop ids are masked until this many tokens were
                             generated; 0 = off */
    uint64_t seed;        /* the draw for position p depends on (seed, p) only */
    uint32_t max_tokens;  /* generated tokens, first included; 0 = up to max context */
    uint32_t nstop;
    int32_t stop[TD_SAMPLE_MAX_STOP]; /* token ids that end the request */
    uint32_t nbias;
    td_sample_bias_t bias[TD_SAMPLE_MAX_BIAS]; /* ids ascending, each once */
    bool logprobs;        /* report each chosen token's log-probability */
    uint32_t top_logprobs;/* ... with this many alternatives (<= TD_SAMPLE_MAX_TOP) */
} td_sample_params_t;

/* Greedy, no limits, no penalties. */
td_sample_params_t td_sample_params_greedy(void);

/* Whether sp has a penalty on (repetition not 0 or 1, presence or frequency != 0):
 * its rows need a history. */
bool td_sample_params_penalized(const td_sample_params_t *sp);

typedef enum {
    TD_SAMPLE_FINISH_NONE = 0,  /* go on */
    TD_SAMPLE_FINISH_STOP,      /* the token is a stop token (it is still returned) */
    TD_SAMPLE_FINISH_LENGTH,    /* max_tokens generated or the context is full */
} td_sample_finish_t;

const char *td_sample_finish_str(td_sample_finish_t f);

/* A next-token distribution: n candidates, every other token has logit -inf.
 * Dense engines give ids = NULL (candidate i is token i, n = vocab); the ids
 * of a sparse one are distinct. */
typedef struct {
    uint32_t n;
    const int32_t *ids;   /* [n] or NULL */
    const float *logits;  /* [n] */
} td_sample_dist_t;

/* ---- The token history the penalties read ---------------------------------------- */

/* Which tokens a request's prompt holds and how often each was generated,
 * dense over the vocabulary (a device op takes the same arrays), with the
 * list of the distinct tokens seen so that a penalty touches only those.
 * Zero-initialise, then td_sample_hist_init; the owner frees it. */
typedef struct {
    uint32_t vocab;
    uint8_t *in_prompt;   /* [vocab / 8 bits] */
    uint32_t *count;      /* [vocab] times generated */
    int32_t *seen;        /* [nseen] distinct tokens of prompt and output, as first seen */
    uint32_t nseen, cap;
} td_sample_hist_t;

/* TD_ERR_NOMEM (h left empty). */
td_status_t td_sample_hist_init(td_sample_hist_t *h, uint32_t vocab);
void td_sample_hist_free(td_sample_hist_t *h);
/* Note n tokens of the prompt (output false) or generated ones (true).
 * Tokens outside the vocabulary are the caller's bug: TD_ERR_RANGE, the
 * history unchanged past them. TD_ERR_NOMEM. */
td_status_t td_sample_hist_add(td_sample_hist_t *h, const int32_t *tokens, size_t n,
                               bool output);

/* One row of sampling: what the sampler reads besides the distribution. */
typedef struct {
    const td_sample_params_t *sp;
    const td_sample_hist_t *hist;   /* the request's tokens so far; NULL: none (then
                                       no penalty may be on) */
    uint64_t position;              /* of the token being chosen: the draw's */
    uint64_t generated;             /* tokens generated before this one (min_tokens) */
    const uint64_t *allow;          /* NULL, or the tokens a constraint allows (bit i of
                                       word i / 64 for token i): every other is -inf,
                                       after the bias, min_tokens and the penalties */
} td_sample_row_t;

/* ---- Log-probabilities --------------------------------------------------------- */

typedef struct {
    int32_t id;
    double logprob;
} td_sample_alt_t;

/* A chosen token with its log-probabilities: log_softmax of the logits after
 * logit_bias, the min_tokens mask and the penalties (the distribution the
 * token is drawn from; temperature, min-p, top-k and top-p do not enter),
 * computed in double. */
typedef struct {
    int32_t token;
    double logprob;                         /* log_softmax(logits)[token]; -inf possible */
    uint32_t ntop;                          /* entries of top: min(asked, candidates) */
    td_sample_alt_t top[TD_SAMPLE_MAX_TOP]; /* most likely first; equal logits: lowest id */
} td_sample_pick_t;

/* ---- The sampler ----------------------------------------------------------------- */

/* The one sampler, for every engine and tool. The distribution's logits l,
 * in float, become the row's:
 *   + sp's logit_bias;
 *   while generated < min_tokens, every stop id at -inf (min_tokens);
 *   for a token of the prompt or the output (repetition_penalty r):
 *   l > 0 ? l / r : l * r (vLLM's); then - frequency_penalty * c -
 *   presence_penalty * (c > 0), c = the times it was generated (OpenAI's);
 *   a token the row's allow mask leaves out at -inf (structured output);
 * then in the order (logit desc, id asc):
 *   greedy (temperature 0 or top_k 1): the first;
 *   otherwise: weights w = exp((l - l_max) / temperature) in double; keep
 *   the finite ones with w >= min_p (the probability at the temperature at
 *   least min_p times the top one's) among the first top_k (all when 0);
 *   Z = their sum in the distribution's index order; with top_p < 1, keep
 *   the shortest prefix whose running sum of w / Z reaches top_p, then S =
 *   the sum of its w in order (top_p = 1: S = Z); u =
 *   td_sample_draw(seed, position) * S; the first in order whose running
 *   sum of w exceeds u (the last kept if none).
 * Expected O(n) (only the drawn prefix is ever sorted); greedy is one pass.
 * A logit NaN or +inf, no finite one, bad parameters, a penalty without a
 * history or a dense distribution with a bias id outside it:
 * TD_ERR_INVALID, logged. out->logprob / out->top with ntop alternatives
 * (ntop <= TD_SAMPLE_MAX_TOP, else TD_ERR_RANGE); ntop = -1: as sp asks
 * (sp->logprobs: sp->top_logprobs; none: out->token only, ntop 0). */
td_status_t td_sample_row_pick(const td_sample_dist_t *lg, const td_sample_row_t *row,
                               int ntop, td_sample_pick_t *out);

/* td_sample_row_pick of a row with no history and nothing generated before
 * (penalties and min_tokens must be off: TD_ERR_INVALID otherwise), for the
 * token alone. */
td_status_t td_sample_dist(const td_sample_dist_t *lg, const td_sample_params_t *sp,
                           uint64_t position, int32_t *token);

/* td_sample_dist, with the log-probabilities. */
td_status_t td_sample_dist_pick(const td_sample_dist_t *lg, const td_sample_params_t *sp,
                                uint64_t position, int ntop, td_sample_pick_t *out);

/* The uniform draw in [0, 1) for (seed, position) (53 bits of a keyed mix). */
double td_sample_draw(uint64_t seed, uint64_t position);

/* ---- Rows of logits ------------------------------------------------------------- */

/* The id of the largest of n logits, the lowest id among equals; -1 when n
 * is 0 or a logit is NaN. */
int32_t td_sample_argmax(const float *logits, size_t n);

/* tokens[r] for each of rows rows of logits [rows, vocab]: td_sample_dist
 * with sp[r] at positions[r] (the position of the token being chosen, so a
 * request's draws do not depend on batching). TD_ERR_INVALID for a row with
 * a NaN or +inf logit or no finite one, or for bad parameters (logged,
 * naming the row). */
td_status_t td_sample_rows(const float *logits, size_t rows, size_t vocab,
                           const td_sample_params_t *const *sp, const uint64_t *positions,
                           int32_t *tokens);

/* out[r] for each of rows rows of logits [rows, vocab]: td_sample_row_pick
 * of row[r], as its parameters ask for log-probabilities. */
td_status_t td_sample_rows_pick(const float *logits, size_t rows, size_t vocab,
                                const td_sample_row_t *row, td_sample_pick_t *out);

/* log Σ exp(logits[i]) over n logits, in double (max-shifted; -inf logits add
 * nothing). TD_ERR_INVALID for n = 0, a NaN or +inf logit, or no finite one. */
td_status_t td_sample_logsumexp(const float *logits, size_t n, double *lse);

/* out->logprob of token and out->top, the ntop (<= TD_SAMPLE_MAX_TOP) most
 * likely of the n ids; out->token = token. TD_ERR_RANGE for a token outside
 * [0, n) or ntop above the bound; TD_ERR_INVALID as td_sample_logsumexp. */
td_status_t td_sample_logprobs(const float *logits, size_t n, int32_t token, uint32_t ntop,
                               td_sample_pick_t *out);

/* Choose the token at `position` from one row as td_sample_rows does, and
 * report its log-probabilities with ntop alternatives (td_sample_dist_pick). */
td_status_t td_sample_pick(const float *logits, size_t n, const td_sample_params_t *sp,
                           uint64_t position, uint32_t ntop, td_sample_pick_t *out);

/* ---- Parameters and stopping ---------------------------------------------------- */

/* Check sampling parameters: temperature finite and >= 0, top_p in (0, 1],
 * min_p in [0, 1], repetition_penalty in [0, 2], presence and frequency
 * penalties in [-2, 2], nstop <= TD_SAMPLE_MAX_STOP, stop ids >= 0, nbias <=
 * TD_SAMPLE_MAX_BIAS with ids >= 0 ascending and each bias in [-100, 100],
 * top_logprobs <= TD_SAMPLE_MAX_TOP. TD_ERR_INVALID, with the offending
 * field in err (err may be NULL). */
td_status_t td_sample_check(const td_sample_params_t *sp, char *err, size_t errlen);

/* Add id to sp's stop tokens unless it is there: TD_ERR_RANGE when
 * TD_SAMPLE_MAX_STOP are there already (sp unchanged). */
td_status_t td_sample_stop_add(td_sample_params_t *sp, int32_t id);

/* Set sp's logit_bias from n (id, bias) pairs in any order: sorted by id.
 * TD_ERR_INVALID for an id given twice, a negative id, a bias outside
 * [-100, 100] or more than TD_SAMPLE_MAX_BIAS (err says which; sp unchanged). */
td_status_t td_sample_bias_set(td_sample_params_t *sp, const td_sample_bias_t *bias, size_t n,
                               char *err, size_t errlen);

/* Why generation ends once token was chosen as the generated-th token
 * (1-based), making the sequence seq_len tokens long: STOP when token is one
 * of sp's stop ids and generated > min_tokens (a stop id drawn before, which
 * only a -inf row can give, ends nothing); else LENGTH when sp->max_tokens
 * (non-zero) is reached or seq_len reaches context (non-zero); else NONE. */
td_sample_finish_t td_sample_finish(const td_sample_params_t *sp, int32_t token,
                                    uint64_t generated, uint64_t seq_len, uint64_t context);

#endif
