/* routerd/route-messages.c — POST /v1/messages and POST
 * /v1/messages/count_tokens (Anthropic's Messages API; errors in its
 * format, the route table says so): the anthropic-version header checked,
 * beta headers ignored, then the request as every other (rreq.c), or the
 * count on a text thread (rtok.c). */
#include <string.h>

#include "anthropic.h"
#include "router.h"
#include "route.h"

/* A version other than the one this server speaks is refused (absent: that
 * one). */
static bool
version_ok(td_http_req_t *req, td_router_t *r)
{
    const char *v = td_http_header(req, "anthropic-version");
    td_openai_err_t e;

    if (v == NULL || strcmp(v, TD_ANTHROPIC_VERSION) == 0)
        return true;
    td_openai_err_set(&e, 400, "invalid_request_error", "anthropic-version", NULL,
                      "anthropic-version: '%.64s' is not a version this server speaks; it "
                      "speaks " TD_ANTHROPIC_VERSION ".", v);
    td_http_refuse(&r->metrics, req, &e);
    return false;
}

void
td_route_messages(td_http_req_t *req, void *router)
{
    td_router_t *r = router;

    if (version_ok(req, r))
        td_rreq_serve(r->reqs, req, TD_OPENAI_MESSAGES);
}

void
td_route_messages_count(td_http_req_t *req, void *router)
{
    td_router_t *r = router;

    if (version_ok(req, r))
        td_rtok_serve(r->rtok, req, TD_RTOK_COUNT_MESSAGES);
}
