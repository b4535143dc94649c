/* routerd/route-chat.c — POST /v1/chat/completions. */
#include "router.h"
#include "route.h"

void
td_route_chat(td_http_req_t *req, void *router)
{
    td_router_t *r = router;

    td_rreq_serve(r->reqs, req, TD_OPENAI_CHAT);
}
