/* tests/unit/test_wire.c — worker/wire, the one conversion of the wire's
 * sampling parameters both worker daemons use: a table of Sampling messages
 * and what each becomes or why it is refused (more than 16 stop ids is a
 * refusal on either side), the model's stop ids joined in, logit_bias
 * checked and sorted; min_p, the penalties, min_tokens, ignore_eos and n;
 * TokenLogprob packed, sent as bytes and read back. */
#include "check.h"
#include "registry.h"
#include "status.h"
#include "wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const td_engine_kind_t *const wire_kinds[] = { &td_synth_kind, NULL };

typedef struct {
    const char *what;
    double temperature, top_p;
    uint32_t max_tokens;
    size_t nstop;           /* stop ids 10, 11, ... (or `stop` when given) */
    int32_t stop;           /* one stop id other than those: -1 none */
    size_t nbias;           /* bias entries on ids 900, 899, ... (descending) */
    int32_t bias_id;        /* one more entry on this id: -1 none */
    float bias;             /* its bias */
    int logprobs;
    uint32_t top_logprobs;
    uint32_t model_stops;   /* the engine's end-of-sequence ids: 1, 2, ... */
    const char *refused;    /* NULL: accepted; else a part of the reason */
} wire_case_t;

static const wire_case_t cases[] = {
    { "defaults", 0, 0, 5, 0, -1, 0, -1, 0, 0, 0, 0, NULL },
    { "16 stop ids", 1, 0.9, 5, 16, -1, 0, -1, 0, 0, 0, 0, NULL },
    { "17 stop ids: refused (prefilld used to cut them to 16)", 1, 1, 5, 17, -1, 0, -1, 0,
      0, 0, 0, "17 stop tokens" },
    { "a stop id outside the vocabulary", 1, 1, 5, 0, 1000, 0, -1, 0, 0, 0, 0,
      "outside the vocabulary" },
    { "the model's stop ids are joined in", 0, 1, 5, 3, -1, 0, -1, 0, 0, 0, 2, NULL },
    { "a model stop id already asked for is not repeated", 0, 1, 5, 0, 1, 0, -1, 0, 0, 0,
      2, NULL },
    { "16 asked + one of the model's: too many", 0, 1, 5, 16, -1, 0, -1, 0, 0, 0, 1,
      "more than 16" },
    { "300 bias entries, sorted", 0.7, 1, 5, 0, -1, 300, -1, 0, 0, 0, 0, NULL },
    { "301 bias entries", 0.7, 1, 5, 0, -1, 301, -1, 0, 0, 0, 0, "301 logit_bias entries" },
    { "bias on a token outside the vocabulary", 1, 1, 5, 0, -1, 0, 1000, 5, 0, 0, 0,
      "outside the vocabulary" },
    { "bias on a token twice", 1, 1, 5, 0, -1, 3, 900, 5, 0, 0, 0, "twice" },
    { "bias above 100", 1, 1, 5, 0, -1, 0, 3, 100.5f, 0, 0, 0, "outside [-100, 100]" },
    { "bias -100", 1, 1, 5, 0, -1, 0, 3, -100, 0, 0, 0, NULL },
    { "bias NaN", 1, 1, 5, 0, -1, 0, 3, NAN, 0, 0, 0, "outside [-100, 100]" },
    { "logprobs with 20 alternatives", 1, 1, 5, 0, -1, 0, -1, 0, 1, 20, 0, NULL },
    { "21 alternatives", 1, 1, 5, 0, -1, 0, -1, 0, 1, 21, 0, "top_logprobs" },
    { "alternatives without logprobs", 1, 1, 5, 0, -1, 0, -1, 0, 0, 3, 0, "without logprobs" },
    { "negative temperature", -1, 1, 5, 0, -1, 0, -1, 0, 0, 0, 0, "temperature" },
    { "top_p above 1", 1, 1.5, 5, 0, -1, 0, -1, 0, 0, 0, 0, "top_p" },
};

static void
test_sampling(td_engine_t *e)
{
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const wire_case_t *k = &cases[c];
        Tandem__Sampling s = TANDEM__SAMPLING__INIT;
        int32_t stops[32];
        Tandem__LogitBias b[400], *pb[400];
        td_sample_params_t sp = td_sample_params_greedy();
        char why[160] = "";
        size_t n = 0;

        s.temperature = k->temperature;
        s.top_p = k->top_p;
        s.max_tokens = k->max_tokens;
        s.seed = 77;
        for (size_t i = 0; i < k->nstop; i++)
            stops[n++] = (int32_t)(10 + i);
        if (k->stop >= 0)
            stops[n++] = k->stop;
        s.n_stop_tokens = n;
        s.stop_tokens = stops;
        n = 0;
        for (size_t i = 0; i < k->nbias; i++) {
            tandem__logit_bias__init(&b[n]);
            b[n].token = (int32_t)(900 - i);
            b[n].bias = (float)(i % 7) - 3.0f;
            pb[n] = &b[n];
            n++;
        }
        if (k->bias_id >= 0) {
            tandem__logit_bias__init(&b[n]);
            b[n].token = k->bias_id;
            b[n].bias = k->bias;
            pb[n] = &b[n];
            n++;
        }
        s.n_logit_bias = n;
        s.logit_bias = pb;
        s.logprobs = k->logprobs;
        s.top_logprobs = k->top_logprobs;
        e->nstop = k->model_stops;
        for (uint32_t i = 0; i < k->model_stops; i++)
            e->stop[i] = (int32_t)(1 + i);

        td_status_t st = td_wire_sampling(&s, e, &sp, why, sizeof(why));
        if (k->refused != NULL) {
            if (st != TD_ERR_INVALID || strstr(why, k->refused) == NULL) {
                fprintf(stderr, "%s: %s \"%s\", want refused with \"%s\"\n", k->what,
                        td_status_str(st), why, k->refused);
                td_check_failures++;
            }
            continue;
        }
        if (st != TD_OK) {
            fprintf(stderr, "%s: refused: %s\n", k->what, why);
            td_check_failures++;
            continue;
        }
        CHECK(sp.temperature == k->temperature && sp.seed == 77 &&
              sp.max_tokens == k->max_tokens);
        CHECK(sp.top_p == (k->top_p == 0 ? 1.0 : k->top_p));   /* proto3 unset: 1 */
        /* every stop asked for and every model stop, once each */
        for (uint32_t i = 0; i < s.n_stop_tokens; i++) {
            unsigned found = 0;
            for (uint32_t j = 0; j < sp.nstop; j++)
                found += sp.stop[j] == s.stop_tokens[i];
            CHECK_EQ_INT(found, 1);
        }
        for (uint32_t i = 0; i < k->model_stops; i++) {
            unsigned found = 0;
            for (uint32_t j = 0; j < sp.nstop; j++)
                found += sp.stop[j] == e->stop[i];
            CHECK_EQ_INT(found, 1);
        }
        CHECK_EQ_INT(sp.nbias, n);
        for (uint32_t i = 1; i < sp.nbias; i++)
            CHECK(sp.bias[i - 1].id < sp.bias[i].id);
        CHECK(sp.logprobs == (k->logprobs != 0) && sp.top_logprobs == k->top_logprobs);
    }
    e->nstop = 0;

    /* no message (a Prefill may come without one): greedy, the model's stops */
    td_sample_params_t sp;
    char why[160];
    e->nstop = 1;
    e->stop[0] = 7;
    CHECK_STATUS(td_wire_sampling(NULL, e, &sp, why, sizeof(why)), TD_OK);
    CHECK(sp.temperature == 0 && sp.top_p == 1 && sp.max_tokens == 0 && sp.nstop == 1 &&
          sp.stop[0] == 7);
    e->nstop = 0;
}

/* The sampler's other steps cross the wire as they are; 0 is off for each;
 * ignore_eos leaves the model's end-of-sequence ids out; n 0 is 1. */
static void
test_sampling_steps(td_engine_t *e)
{
    Tandem__Sampling s = TANDEM__SAMPLING__INIT;
    td_sample_params_t sp;
    char why[160] = "";
    int32_t stop = 9;

    e->nstop = 2;
    e->stop[0] = 1;
    e->stop[1] = 2;
    s.temperature = 1;
    s.min_p = 0.25;
    s.repetition_penalty = 1.5;
    s.presence_penalty = -0.5;
    s.frequency_penalty = 1.25;
    s.min_tokens = 7;
    s.n_stop_tokens = 1;
    s.stop_tokens = &stop;
    CHECK_EQ_INT(td_wire_choices(&s), 1);
    CHECK_STATUS(td_wire_sampling(&s, e, &sp, why, sizeof(why)), TD_OK);
    CHECK(sp.min_p == 0.25 && sp.repetition_penalty == 1.5 && sp.presence_penalty == -0.5 &&
          sp.frequency_penalty == 1.25 && sp.min_tokens == 7 && sp.nstop == 3);
    CHECK(td_sample_params_penalized(&sp));
    s.ignore_eos = true;
    s.n = 3;
    CHECK_EQ_INT(td_wire_choices(&s), 3);
    CHECK_STATUS(td_wire_sampling(&s, e, &sp, why, sizeof(why)), TD_OK);
    CHECK(sp.nstop == 1 && sp.stop[0] == 9);
    s.repetition_penalty = 0;   /* unset: off */
    s.presence_penalty = s.frequency_penalty = 0;
    CHECK_STATUS(td_wire_sampling(&s, e, &sp, why, sizeof(why)), TD_OK);
    CHECK(!td_sample_params_penalized(&sp));
    s.min_p = 1.5;
    CHECK_STATUS(td_wire_sampling(&s, e, &sp, why, sizeof(why)), TD_ERR_INVALID);
    CHECK(strstr(why, "min_p") != NULL);
    s.min_p = 0;
    s.frequency_penalty = 2.5;
    CHECK_STATUS(td_wire_sampling(&s, e, &sp, why, sizeof(why)), TD_ERR_INVALID);
    CHECK(strstr(why, "frequency_penalty") != NULL);
    e->nstop = 0;
}

static void
test_logprob(void)
{
    td_sample_pick_t pk = { .token = 42, .logprob = -0.25, .ntop = 3 }, back;
    td_wire_logprob_t lp;
    Tandem__Tokens t = TANDEM__TOKENS__INIT, *u;
    Tandem__TokenLogprob *plp = &lp.msg;
    int32_t tok = 42;
    uint8_t buf[1024];
    char why[160];

    pk.top[0] = (td_sample_alt_t){ 42, -0.25 };
    pk.top[1] = (td_sample_alt_t){ 7, -1.5 };
    pk.top[2] = (td_sample_alt_t){ 900, -INFINITY };
    td_wire_logprob_pack(&pk, &lp);
    t.req_id = 5;
    t.n_tokens = 1;
    t.tokens = &tok;
    t.n_logprobs = 1;
    t.logprobs = &plp;
    CHECK(tandem__tokens__get_packed_size(&t) <= sizeof(buf));
    size_t len = tandem__tokens__pack(&t, buf);
    u = tandem__tokens__unpack(NULL, len, buf);
    CHECK(u != NULL && u->n_logprobs == 1);
    if (u == NULL || u->n_logprobs != 1)
        return;
    CHECK_STATUS(td_wire_logprob_unpack(u->logprobs[0], 1000, &back, why, sizeof(why)), TD_OK);
    CHECK(back.token == 42 && back.logprob == -0.25 && back.ntop == 3);
    for (int i = 0; i < 3; i++)
        CHECK(back.top[i].id == pk.top[i].id && back.top[i].logprob == pk.top[i].logprob);
    /* a peer's bad numbers */
    CHECK_STATUS(td_wire_logprob_unpack(u->logprobs[0], 900, &back, why, sizeof(why)),
                 TD_ERR_INVALID);   /* alternative 900 outside a vocabulary of 900 */
    u->logprobs[0]->logprob = 0.5;
    CHECK_STATUS(td_wire_logprob_unpack(u->logprobs[0], 1000, &back, why, sizeof(why)),
                 TD_ERR_INVALID);
    u->logprobs[0]->logprob = NAN;
    CHECK_STATUS(td_wire_logprob_unpack(u->logprobs[0], 1000, &back, why, sizeof(why)),
                 TD_ERR_INVALID);
    u->logprobs[0]->logprob = -1;
    u->logprobs[0]->token = -3;
    CHECK_STATUS(td_wire_logprob_unpack(u->logprobs[0], 1000, &back, why, sizeof(why)),
                 TD_ERR_INVALID);
    tandem__tokens__free_unpacked(u, NULL);

    Tandem__TokenLogprob many = TANDEM__TOKEN_LOGPROB__INIT;
    Tandem__TopLogprob tops[TD_SAMPLE_MAX_TOP + 1], *ptops[TD_SAMPLE_MAX_TOP + 1];
    for (int i = 0; i <= TD_SAMPLE_MAX_TOP; i++) {
        tandem__top_logprob__init(&tops[i]);
        tops[i].token = i;
        tops[i].logprob = -i;
        ptops[i] = &tops[i];
    }
    many.n_top = TD_SAMPLE_MAX_TOP + 1;
    many.top = ptops;
    CHECK_STATUS(td_wire_logprob_unpack(&many, 1000, &back, why, sizeof(why)), TD_ERR_INVALID);
    many.n_top = TD_SAMPLE_MAX_TOP;
    CHECK_STATUS(td_wire_logprob_unpack(&many, 1000, &back, why, sizeof(why)), TD_OK);
    CHECK_EQ_INT(back.ntop, TD_SAMPLE_MAX_TOP);
}

int
main(void)
{
    td_engine_config_t cfg;
    td_engine_t *e = NULL;

    CHECK_STATUS(td_engine_config_defaults(&cfg), TD_OK);
    cfg.synth.vocab = 1000;
    CHECK_STATUS(td_engine_create(wire_kinds, &cfg, &e), TD_OK);
    td_engine_config_free(&cfg);
    if (e == NULL)
        return td_check_exit("test_wire");
    test_sampling(e);
    test_sampling_steps(e);
    test_logprob();
    td_engine_destroy(e);
    return td_check_exit("test_wire");
}
