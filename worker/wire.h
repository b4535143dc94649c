/* worker/wire.h — the worker daemons' one conversion between the wire and the
 * sampler: a Sampling message into checked sampling parameters (with the
 * engine's stop ids), and a chosen token's log-probabilities into and out of
 * a TokenLogprob. Both prefilld and decoded use it, so a request samples the
 * same on either side of the transfer. No allocation, no logging: a peer's
 * bytes get a reason the caller sends back. */
#ifndef TD_WIRE_H
#define TD_WIRE_H

#include <stddef.h>

#include "engine.h"
#include "sample.h"
#include "status.h"
#include "tandem.pb-c.h"

/* in (NULL: greedy, max_tokens 0) as parameters for engine e: top_p 0 is
 * proto3's unset (1), as a repetition_penalty of 0 is off; stop_tokens (at
 * most TD_SAMPLE_MAX_STOP, inside the vocabulary) joined by e's
 * end-of-sequence ids unless ignore_eos; min_p, the penalties and
 * min_tokens as the sampler checks them; logit_bias inside the
 * vocabulary, each token once, in [-100, 100]; top_logprobs <= 20; then
 * td_sample_check. TD_ERR_INVALID with why (out set only on success). The
 * caller decides what max_tokens 0 means to it. */
td_status_t td_wire_sampling(const Tandem__Sampling *in, const td_engine_t *e,
                             td_sample_params_t *out, char *why, size_t whylen);

/* The most choices (rows) of one request a worker takes. */
#define TD_WIRE_MAX_CHOICES 64

/* The choices (rows) of a request: Sampling.n, 0 (unset) being 1. The
 * caller bounds it (TD_WIRE_MAX_CHOICES, its batch rows). */
uint32_t td_wire_choices(const Tandem__Sampling *in);

/* A TokenLogprob of a pick, and the storage it points into. */
typedef struct {
    Tandem__TokenLogprob msg;
    Tandem__TopLogprob top[TD_SAMPLE_MAX_TOP];
    Tandem__TopLogprob *ptop[TD_SAMPLE_MAX_TOP];
} td_wire_logprob_t;

/* out->msg describes pk (its pointers into out: keep out in place). */
void td_wire_logprob_pack(const td_sample_pick_t *pk, td_wire_logprob_t *out);

/* A received TokenLogprob as a pick: its token and alternatives inside the
 * vocabulary, at most TD_SAMPLE_MAX_TOP of them, no logprob NaN or above 0.
 * TD_ERR_INVALID with why. */
td_status_t td_wire_logprob_unpack(const Tandem__TokenLogprob *in, uint32_t vocab,
                                   td_sample_pick_t *out, char *why, size_t whylen);

#endif
