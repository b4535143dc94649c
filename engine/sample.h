/* engine/sample.h — the next token of each request from a row of logits:
 * argmax for greedy requests, else the engine's sampler (temperature, top-k,
 * top-p, a seeded draw per position; td_engine_sample_logits). */
#ifndef TD_SAMPLE_H
#define TD_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "status.h"

/* The id of the largest of n logits, the lowest id among equals; -1 when n
 * is 0 or a logit is NaN. */
int32_t td_sample_argmax(const float *logits, size_t n);

/* tokens[r] for each of rows rows of logits [rows, vocab]: greedy
 * (temperature 0 or top_k 1) takes the argmax, otherwise
 * td_engine_sample_logits draws with sp[r] at positions[r] (the position of
 * the token being chosen, so a request's draws do not depend on batching).
 * TD_ERR_INVALID for NaN logits or bad parameters (logged, naming the row). */
td_status_t td_sample_rows(const float *logits, size_t rows, size_t vocab,
                           const td_engine_sampling_t *const *sp, const uint64_t *positions,
                           int32_t *tokens);

#endif
