/* routerd/route-admin-requests.c — GET /admin/requests: the requests in
 * flight (id, state, ranks, token counts, age). */
#include "router.h"
#include "route.h"

#include <jansson.h>

void
td_route_admin_requests(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    json_t *list = td_rreq_list_json(r->reqs);

    td_http_reply_json(req, 200, list ? json_pack("{s:o}", "requests", list) : NULL);
}
