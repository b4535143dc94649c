/* routerd/route-chat.c — POST /v1/chat/completions. */
#include "router.h"

void
td_route_chat(td_router_t *r, struct evhttp_request *req)
{
    td_request_serve(r, req, TD_OPENAI_CHAT);
}
