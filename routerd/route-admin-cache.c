/* routerd/route-admin-cache.c — POST /admin/cache/flush with {"node": NAME}:
 * CacheFlush to every prefill rank of the node that has a prefix cache
 * (docs/kvrouting.md); answers how many ranks it was sent to. */
#include "router.h"
#include "route.h"

#include <jansson.h>

void
td_route_admin_cache_flush(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    char name[TD_HELLO_NODE_ID_MAX + 1];
    td_openai_err_t e;
    unsigned sent = 0;

    if (td_http_body_field(req, "node", name, sizeof name, &e) != TD_OK) {
        td_http_reply_err(req, &e);
        return;
    }
    if (td_cluster_node_cache_flush(&r->cluster, name, "flushed by the operator", &sent) ==
        TD_ERR_NOT_FOUND) {
        td_openai_err_set(&e, 404, "invalid_request_error", "node", "node_not_found",
                          "No node named '%s' has registered.", name);
        td_http_reply_err(req, &e);
        return;
    }
    td_http_reply_json(req, 200, json_pack("{s:s, s:s, s:I}", "node", name, "status", "flushing",
                                           "ranks", (json_int_t)sent));
}
