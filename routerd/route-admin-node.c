/* routerd/route-admin-node.c — POST /admin/drain, /admin/undrain and
 * /admin/remove with {"node": NAME}: one handler, three routes. */
#include "router.h"
#include "route.h"

#include <jansson.h>

typedef enum { NODE_DRAIN, NODE_UNDRAIN, NODE_REMOVE } node_op_t;

static void
node_op(td_router_t *r, td_http_req_t *req, node_op_t op)
{
    static const char *const done[] = { "draining", "undrained", "removing" };
    char name[TD_HELLO_NODE_ID_MAX + 1];
    td_openai_err_t e;
    td_status_t st;

    if (td_http_body_field(req, "node", name, sizeof name, &e) != TD_OK) {
        td_http_reply_err(req, &e);
        return;
    }
    st = op == NODE_REMOVE ? td_cluster_node_remove(&r->cluster, name)
                           : td_cluster_node_drain(&r->cluster, name, op == NODE_DRAIN);
    if (st == TD_ERR_NOT_FOUND) {
        td_openai_err_set(&e, 404, "invalid_request_error", "node", "node_not_found",
                          "No node named '%s' has registered.", name);
        td_http_reply_err(req, &e);
        return;
    }
    td_http_reply_json(req, 200, json_pack("{s:s, s:s}", "node", name, "status", done[op]));
}

void
td_route_admin_drain(td_http_req_t *req, void *router)
{
    node_op(router, req, NODE_DRAIN);
}

void
td_route_admin_undrain(td_http_req_t *req, void *router)
{
    node_op(router, req, NODE_UNDRAIN);
}

void
td_route_admin_remove(td_http_req_t *req, void *router)
{
    node_op(router, req, NODE_REMOVE);
}
