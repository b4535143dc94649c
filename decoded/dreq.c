/* decoded/dreq.c — the decode request state machine: name table,
 * transition table, the one set_state, and the request's lifetime. */
#include "dreq.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "fsm.h"

static const char *const dreq_state_names[TD_DREQ_NSTATES] = {
    [TD_DREQ_ADMITTED] = "admitted",
    [TD_DREQ_RUNNING] = "running",
    [TD_DREQ_FINISHED] = "finished",
    [TD_DREQ_CANCELED] = "canceled",
    [TD_DREQ_FAILED] = "failed",
    [TD_DREQ_RELEASED] = "released",
};

#define S(x) TD_FSM_BIT(TD_DREQ_##x)
/* allowed[from] = the states it may go to. */
static const uint32_t dreq_allowed[TD_DREQ_NSTATES] = {
    [TD_DREQ_ADMITTED] = S(RUNNING) | S(FINISHED) | S(CANCELED) | S(FAILED),
    [TD_DREQ_RUNNING] = S(FINISHED) | S(CANCELED) | S(FAILED),
    [TD_DREQ_FINISHED] = S(RELEASED),
    [TD_DREQ_CANCELED] = S(RELEASED),
    [TD_DREQ_FAILED] = S(RELEASED),
    [TD_DREQ_RELEASED] = 0,
};
#undef S

static const td_fsm_t dreq_fsm = {
    .what = "decode request",
    .names = dreq_state_names,
    .allowed = dreq_allowed,
    .nstates = TD_DREQ_NSTATES,
};

const char *
td_dreq_state_str(td_dreq_state_t st)
{
    return td_fsm_name(&dreq_fsm, st);
}

td_status_t
td_dreq_create(uint64_t id, const int32_t *prompt, size_t nprompt, td_dreq_t **out)
{
    td_dreq_t *req = calloc(1, sizeof(*req));
    if (req == NULL)
        return TD_ERR_NOMEM;
    req->prompt = malloc(nprompt * sizeof(*prompt));
    if (req->prompt == NULL) {
        free(req);
        return TD_ERR_NOMEM;
    }
    memcpy(req->prompt, prompt, nprompt * sizeof(*prompt));
    req->nprompt = nprompt;
    req->id = id;
    req->state = TD_DREQ_ADMITTED;
    req->nchoices = 1;
    *out = req;
    return TD_OK;
}

void
td_dreq_destroy(td_dreq_t *req)
{
    if (req == NULL)
        return;
    assert(req->res == NULL);
    if (req->grace != NULL)
        event_free(req->grace);
    if (req->ereq != NULL)
        td_engine_req_destroy(req->ereq);
    td_wcons_destroy(req->cons);
    free(req->cons_in.spec);
    free(req->prompt);
    free(req->gen);
    free(req);
}

td_status_t
td_dreq_gen_push(td_dreq_t *req, int32_t token)
{
    if (req->generated >= req->gencap) {
        size_t cap = req->gencap ? 2 * req->gencap : 64;
        while (cap <= req->generated)
            cap *= 2;
        int32_t *g = realloc(req->gen, cap * sizeof(*g));
        if (g == NULL)
            return TD_ERR_NOMEM;
        req->gen = g;
        req->gencap = cap;
    }
    req->gen[req->generated] = token;
    return TD_OK;
}

void
td_dreq_set_state(td_dreq_t *req, td_dreq_state_t to, const char *why)
{
    req->state = td_fsm_step(&dreq_fsm, req->id, req->state, to, why);
}

bool
td_dreq_ended(const td_dreq_t *req)
{
    return req->state == TD_DREQ_FINISHED || req->state == TD_DREQ_CANCELED ||
           req->state == TD_DREQ_FAILED;
}
