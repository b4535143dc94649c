/* routerd/routes.c — the route table: path, methods, which listener (API or
 * admin) and whether a key is needed; each handler lives in its route-*.c. */
#include "routes.h"

#include "route.h"

const td_http_route_t td_routes[] = {
    { "/v1/chat/completions", TD_H1_POST, false, true, td_route_chat },
    { "/v1/completions", TD_H1_POST, false, true, td_route_completions },
    { "/v1/models", TD_H1_GET, false, true, td_route_models },
    { "/tokenize", TD_H1_POST, false, true, td_route_tokenize },
    { "/detokenize", TD_H1_POST, false, true, td_route_detokenize },
    { "/health", TD_H1_GET, false, false, td_route_health },
    { "/ready", TD_H1_GET, false, false, td_route_ready },
    { "/metrics", TD_H1_GET, false, false, td_route_metrics },
    { "/health", TD_H1_GET, true, false, td_route_admin_health },
    { "/ready", TD_H1_GET, true, false, td_route_admin_ready },
    { "/metrics", TD_H1_GET, true, false, td_route_metrics },
    { "/admin/status", TD_H1_GET, true, true, td_route_admin_status },
    { "/admin/drain", TD_H1_POST, true, true, td_route_admin_drain },
    { "/admin/undrain", TD_H1_POST, true, true, td_route_admin_undrain },
    { "/admin/remove", TD_H1_POST, true, true, td_route_admin_remove },
    { "/admin/requests", TD_H1_GET, true, true, td_route_admin_requests },
    { "/admin/cancel", TD_H1_POST, true, true, td_route_admin_cancel },
    { "/admin/config", TD_H1_GET, true, true, td_route_admin_config },
    { "/admin/cache/flush", TD_H1_POST, true, true, td_route_admin_cache_flush },
    { NULL, 0, false, false, NULL },
};
