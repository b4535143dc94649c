/* routerd/routes.c — the route table: path, methods, which listener (API or
 * admin) and whether a key is needed; each handler lives in its route-*.c. */
#include "routes.h"

#include "route.h"

#include <event2/http.h>

const td_http_route_t td_routes[] = {
    { "/v1/chat/completions", EVHTTP_REQ_POST, false, true, td_route_chat },
    { "/v1/completions", EVHTTP_REQ_POST, false, true, td_route_completions },
    { "/v1/models", EVHTTP_REQ_GET, false, true, td_route_models },
    { "/health", EVHTTP_REQ_GET, false, false, td_route_health },
    { "/metrics", EVHTTP_REQ_GET, false, false, td_route_metrics },
    { "/health", EVHTTP_REQ_GET, true, false, td_route_admin_health },
    { "/metrics", EVHTTP_REQ_GET, true, false, td_route_metrics },
    { "/admin/status", EVHTTP_REQ_GET, true, true, td_route_admin_status },
    { "/admin/drain", EVHTTP_REQ_POST, true, true, td_route_admin_drain },
    { "/admin/undrain", EVHTTP_REQ_POST, true, true, td_route_admin_undrain },
    { "/admin/remove", EVHTTP_REQ_POST, true, true, td_route_admin_remove },
    { "/admin/requests", EVHTTP_REQ_GET, true, true, td_route_admin_requests },
    { "/admin/cancel", EVHTTP_REQ_POST, true, true, td_route_admin_cancel },
    { "/admin/config", EVHTTP_REQ_GET, true, true, td_route_admin_config },
    { NULL, 0, false, false, NULL },
};
