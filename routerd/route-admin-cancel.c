/* routerd/route-admin-cancel.c — POST /admin/cancel {"id": "<16 hex digits>"}:
 * cancel a request in flight at its ranks and answer its client with an error. */
#include "router.h"
#include "route.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>

void
td_route_admin_cancel(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    char idstr[24], *end;
    td_openai_err_t e;
    uint64_t id;

    if (td_http_body_field(req, "id", idstr, sizeof idstr, &e) != TD_OK) {
        td_http_reply_err(req, &e);
        return;
    }
    errno = 0;
    id = strtoull(idstr, &end, 16);
    if (errno || *end || end == idstr) {
        td_openai_err_set(&e, 400, "invalid_request_error", "id", "invalid_value",
                          "'id' must be a request id in hex, as /admin/requests shows it.");
        td_http_reply_err(req, &e);
        return;
    }
    if (td_rreq_cancel_id(r->reqs, id) != TD_OK) {
        td_openai_err_set(&e, 404, "invalid_request_error", "id", "request_not_found",
                          "No request %s is in flight.", idstr);
        td_http_reply_err(req, &e);
        return;
    }
    td_http_reply_json(req, 200, json_pack("{s:s, s:s}", "id", idstr, "status", "canceled"));
}
