/* routerd/route-responses.c — the Responses API: POST /v1/responses (the
 * request as every other, rreq.c), GET and DELETE /v1/responses/{id} and
 * POST /v1/responses/{id}/cancel (the store's work on a text thread,
 * rtok.c). */
#include <stdio.h>
#include <string.h>

#include "router.h"
#include "route.h"

void
td_route_responses(td_http_req_t *req, void *router)
{
    td_router_t *r = router;

    td_rreq_serve(r->reqs, req, TD_OPENAI_RESPONSES);
}

void
td_route_responses_id(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    const char *rest = td_http_path(req) + strlen("/v1/responses/");
    const char *slash = strchr(rest, '/');
    int method = td_http_method(req);
    char id[100];
    td_openai_err_t e;

    snprintf(id, sizeof id, "%.*s", slash ? (int)(slash - rest) : (int)strlen(rest), rest);
    if (slash == NULL && method == TD_H1_GET)
        td_rtok_serve_stored(r->rtok, req, TD_RTOK_RESPONSE_GET, id);
    else if (slash == NULL && method == TD_H1_DELETE)
        td_rtok_serve_stored(r->rtok, req, TD_RTOK_RESPONSE_DELETE, id);
    else if (slash != NULL && strcmp(slash, "/cancel") == 0 && method == TD_H1_POST)
        td_rtok_serve_stored(r->rtok, req, TD_RTOK_RESPONSE_CANCEL, id);
    else {
        td_openai_err_no_route(&e, td_h1_method_str(method), td_http_path(req));
        td_http_refuse(&r->metrics, req, &e);
    }
}
