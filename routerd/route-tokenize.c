/* routerd/route-tokenize.c — POST /tokenize and POST /detokenize (vLLM's
 * shapes; routerd/rtok.c does the work on the text threads). */
#include "router.h"
#include "route.h"

void
td_route_tokenize(td_http_req_t *req, void *router)
{
    td_rtok_serve(((td_router_t *)router)->rtok, req, TD_RTOK_TOKENIZE);
}

void
td_route_detokenize(td_http_req_t *req, void *router)
{
    td_rtok_serve(((td_router_t *)router)->rtok, req, TD_RTOK_DETOKENIZE);
}
