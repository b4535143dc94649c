/* worker/wire.c — Sampling into sampling parameters and picks into (and out
 * of) TokenLogprob, for both worker daemons (wire.h). */
#include "wire.h"

#include <math.h>
#include <stdio.h>

/* Is x a log-probability (-inf included)? A little above 0 is rounding. */
static int
wire_logprob_ok(double x)
{
    return !isnan(x) && x <= 1e-9;
}

td_status_t
td_wire_sampling(const Tandem__Sampling *in, const td_engine_t *e, td_sample_params_t *out,
                 char *why, size_t whylen)
{
    td_sample_bias_t bias[TD_SAMPLE_MAX_BIAS];
    td_sample_params_t s = td_sample_params_greedy();
    char err[128];

    if (in != NULL) {
        s.temperature = in->temperature;
        s.top_p = in->top_p == 0 ? 1.0 : in->top_p;   /* proto3 default: unset */
        s.top_k = in->top_k;
        s.seed = in->seed;
        s.max_tokens = in->max_tokens;
        if (in->n_stop_tokens > TD_SAMPLE_MAX_STOP) {
            snprintf(why, whylen, "%zu stop tokens, at most %d", in->n_stop_tokens,
                     TD_SAMPLE_MAX_STOP);
            return TD_ERR_INVALID;
        }
        for (size_t i = 0; i < in->n_stop_tokens; i++) {
            if (in->stop_tokens[i] < 0 || (uint32_t)in->stop_tokens[i] >= e->vocab) {
                snprintf(why, whylen, "stop token %d outside the vocabulary of %u",
                         in->stop_tokens[i], e->vocab);
                return TD_ERR_INVALID;
            }
            (void)td_sample_stop_add(&s, in->stop_tokens[i]);   /* <= 16: fits */
        }
        if (in->n_logit_bias > TD_SAMPLE_MAX_BIAS) {
            snprintf(why, whylen, "%zu logit_bias entries, at most %d", in->n_logit_bias,
                     TD_SAMPLE_MAX_BIAS);
            return TD_ERR_INVALID;
        }
        for (size_t i = 0; i < in->n_logit_bias; i++) {
            const Tandem__LogitBias *b = in->logit_bias[i];
            if (b->token < 0 || (uint32_t)b->token >= e->vocab) {
                snprintf(why, whylen, "logit_bias token %d outside the vocabulary of %u",
                         b->token, e->vocab);
                return TD_ERR_INVALID;
            }
            bias[i] = (td_sample_bias_t){ b->token, b->bias };
        }
        if (td_sample_bias_set(&s, bias, in->n_logit_bias, err, sizeof(err)) != TD_OK) {
            snprintf(why, whylen, "%s", err);
            return TD_ERR_INVALID;
        }
        s.logprobs = in->logprobs;
        s.top_logprobs = in->top_logprobs;
        s.min_p = in->min_p;
        s.repetition_penalty = in->repetition_penalty;   /* 0: off, as 1 */
        s.presence_penalty = in->presence_penalty;
        s.frequency_penalty = in->frequency_penalty;
        s.min_tokens = in->min_tokens;
        if (s.top_logprobs > 0 && !s.logprobs) {
            snprintf(why, whylen, "top_logprobs without logprobs");
            return TD_ERR_INVALID;
        }
    }
    for (uint32_t i = 0; !(in != NULL && in->ignore_eos) && i < e->nstop; i++) {
        if (td_sample_stop_add(&s, e->stop[i]) != TD_OK) {
            snprintf(why, whylen, "the request's stop tokens and the model's end-of-sequence "
                     "ids are more than %d", TD_SAMPLE_MAX_STOP);
            return TD_ERR_INVALID;
        }
    }
    if (td_sample_check(&s, err, sizeof(err)) != TD_OK) {
        snprintf(why, whylen, "%s", err);
        return TD_ERR_INVALID;
    }
    *out = s;
    return TD_OK;
}

uint32_t
td_wire_choices(const Tandem__Sampling *in)
{
    return in == NULL || in->n == 0 ? 1 : in->n;
}

void
td_wire_logprob_pack(const td_sample_pick_t *pk, td_wire_logprob_t *out)
{
    uint32_t n = pk->ntop <= TD_SAMPLE_MAX_TOP ? pk->ntop : TD_SAMPLE_MAX_TOP;

    tandem__token_logprob__init(&out->msg);
    out->msg.token = pk->token;
    out->msg.logprob = pk->logprob;
    for (uint32_t i = 0; i < n; i++) {
        tandem__top_logprob__init(&out->top[i]);
        out->top[i].token = pk->top[i].id;
        out->top[i].logprob = pk->top[i].logprob;
        out->ptop[i] = &out->top[i];
    }
    out->msg.n_top = n;
    out->msg.top = n ? out->ptop : NULL;
}

td_status_t
td_wire_logprob_unpack(const Tandem__TokenLogprob *in, uint32_t vocab, td_sample_pick_t *out,
                       char *why, size_t whylen)
{
    td_sample_pick_t pk = { 0 };

    if (in->token < 0 || (uint32_t)in->token >= vocab || !wire_logprob_ok(in->logprob)) {
        snprintf(why, whylen, "log-probability of token %d: token outside the vocabulary of "
                 "%u or logprob %g", in->token, vocab, in->logprob);
        return TD_ERR_INVALID;
    }
    if (in->n_top > TD_SAMPLE_MAX_TOP) {
        snprintf(why, whylen, "%zu alternatives, at most %d", in->n_top, TD_SAMPLE_MAX_TOP);
        return TD_ERR_INVALID;
    }
    pk.token = in->token;
    pk.logprob = in->logprob;
    for (size_t i = 0; i < in->n_top; i++) {
        const Tandem__TopLogprob *t = in->top[i];
        if (t->token < 0 || (uint32_t)t->token >= vocab || !wire_logprob_ok(t->logprob)) {
            snprintf(why, whylen, "alternative %zu: token %d outside the vocabulary of %u or "
                     "logprob %g", i, t->token, vocab, t->logprob);
            return TD_ERR_INVALID;
        }
        pk.top[i] = (td_sample_alt_t){ t->token, t->logprob };
    }
    pk.ntop = (uint32_t)in->n_top;
    *out = pk;
    return TD_OK;
}
