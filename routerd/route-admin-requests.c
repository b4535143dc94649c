/* routerd/route-admin-requests.c — GET /admin/requests: the requests in
 * flight (id, state, ranks, token counts, age). */
#include "router.h"

#include <jansson.h>

void
td_route_admin_requests(td_router_t *r, struct evhttp_request *req)
{
    json_t *list = td_request_list_json(r);

    td_http_reply_json(req, 200, list ? json_pack("{s:o}", "requests", list) : NULL);
}
