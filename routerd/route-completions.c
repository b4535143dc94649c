/* routerd/route-completions.c — POST /v1/completions. */
#include "router.h"

void
td_route_completions(td_router_t *r, struct evhttp_request *req)
{
    td_request_serve(r, req, TD_OPENAI_COMPLETION);
}
