/* decoded/request.c — the decode request state machine: name table,
 * transition table, the one set_state, and the request's lifetime. */
#include "request.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "log.h"

static const char *const request_state_names[TD_REQUEST_NSTATES] = {
    [TD_REQUEST_ADMITTED] = "admitted",
    [TD_REQUEST_RUNNING] = "running",
    [TD_REQUEST_FINISHED] = "finished",
    [TD_REQUEST_CANCELED] = "canceled",
    [TD_REQUEST_FAILED] = "failed",
    [TD_REQUEST_RELEASED] = "released",
};

#define S(x) (1u << TD_REQUEST_##x)
/* allowed[from] = the states it may go to. */
static const unsigned request_allowed[TD_REQUEST_NSTATES] = {
    [TD_REQUEST_ADMITTED] = S(RUNNING) | S(FINISHED) | S(CANCELED) | S(FAILED),
    [TD_REQUEST_RUNNING] = S(FINISHED) | S(CANCELED) | S(FAILED),
    [TD_REQUEST_FINISHED] = S(RELEASED),
    [TD_REQUEST_CANCELED] = S(RELEASED),
    [TD_REQUEST_FAILED] = S(RELEASED),
    [TD_REQUEST_RELEASED] = 0,
};
#undef S

const char *
td_request_state_str(td_request_state_t st)
{
    return (unsigned)st < TD_REQUEST_NSTATES ? request_state_names[st] : "?";
}

td_status_t
td_request_create(uint64_t id, const int32_t *prompt, size_t nprompt, td_request_t **out)
{
    td_request_t *req = calloc(1, sizeof(*req));
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
    req->state = TD_REQUEST_ADMITTED;
    *out = req;
    return TD_OK;
}

void
td_request_destroy(td_request_t *req)
{
    if (req == NULL)
        return;
    assert(req->res == NULL);
    if (req->grace != NULL)
        event_free(req->grace);
    if (req->ereq != NULL)
        td_engine_req_destroy(req->ereq);
    free(req->prompt);
    free(req);
}

void
td_request_set_state(td_request_t *req, td_request_state_t to, const char *why)
{
    assert((unsigned)to < TD_REQUEST_NSTATES);
    if (!(request_allowed[req->state] & (1u << to))) {
        td_error("decode request %016llx: illegal transition %s -> %s",
                 (unsigned long long)req->id, td_request_state_str(req->state),
                 td_request_state_str(to));
        assert(!"illegal decode request state transition");
    }
    td_debug("decode request %016llx: %s -> %s%s%s", (unsigned long long)req->id,
             td_request_state_str(req->state), td_request_state_str(to), why ? ": " : "",
             why ? why : "");
    req->state = to;
}

bool
td_request_ended(const td_request_t *req)
{
    return req->state == TD_REQUEST_FINISHED || req->state == TD_REQUEST_CANCELED ||
           req->state == TD_REQUEST_FAILED;
}
