/* routerd/routes.c — the route table: path, methods, which listener (API or
 * admin) and whether a key is needed; each handler lives in its route-*.c. */
#include "routes.h"

#include "route.h"

const td_http_route_t td_routes[] = {
    { "/v1/chat/completions", TD_H1_POST, false, true, td_route_chat, TD_HTTP_ERR_OPENAI },
    { "/v1/completions", TD_H1_POST, false, true, td_route_completions, TD_HTTP_ERR_OPENAI },
    { "/v1/models", TD_H1_GET, false, true, td_route_models, TD_HTTP_ERR_OPENAI },
    { "/v1/messages", TD_H1_POST, false, true, td_route_messages, TD_HTTP_ERR_ANTHROPIC },
    { "/v1/messages/count_tokens", TD_H1_POST, false, true, td_route_messages_count,
      TD_HTTP_ERR_ANTHROPIC },
    { "/v1/responses", TD_H1_POST, false, true, td_route_responses, TD_HTTP_ERR_OPENAI },
    { "/v1/responses/*", TD_H1_GET | TD_H1_DELETE | TD_H1_POST, false, true,
      td_route_responses_id, TD_HTTP_ERR_OPENAI },
    { "/tokenize", TD_H1_POST, false, true, td_route_tokenize, TD_HTTP_ERR_OPENAI },
    { "/detokenize", TD_H1_POST, false, true, td_route_detokenize, TD_HTTP_ERR_OPENAI },
    { "/health", TD_H1_GET, false, false, td_route_health, TD_HTTP_ERR_OPENAI },
    { "/ready", TD_H1_GET, false, false, td_route_ready, TD_HTTP_ERR_OPENAI },
    { "/metrics", TD_H1_GET, false, false, td_route_metrics, TD_HTTP_ERR_OPENAI },
    { "/health", TD_H1_GET, true, false, td_route_admin_health, TD_HTTP_ERR_OPENAI },
    { "/ready", TD_H1_GET, true, false, td_route_admin_ready, TD_HTTP_ERR_OPENAI },
    { "/metrics", TD_H1_GET, true, false, td_route_metrics, TD_HTTP_ERR_OPENAI },
    { "/admin/status", TD_H1_GET, true, true, td_route_admin_status, TD_HTTP_ERR_OPENAI },
    { "/admin/drain", TD_H1_POST, true, true, td_route_admin_drain, TD_HTTP_ERR_OPENAI },
    { "/admin/undrain", TD_H1_POST, true, true, td_route_admin_undrain, TD_HTTP_ERR_OPENAI },
    { "/admin/remove", TD_H1_POST, true, true, td_route_admin_remove, TD_HTTP_ERR_OPENAI },
    { "/admin/requests", TD_H1_GET, true, true, td_route_admin_requests, TD_HTTP_ERR_OPENAI },
    { "/admin/cancel", TD_H1_POST, true, true, td_route_admin_cancel, TD_HTTP_ERR_OPENAI },
    { "/admin/config", TD_H1_GET, true, true, td_route_admin_config, TD_HTTP_ERR_OPENAI },
    { "/admin/cache/flush", TD_H1_POST, true, true, td_route_admin_cache_flush, TD_HTTP_ERR_OPENAI },
    { NULL, 0, false, false, NULL, TD_HTTP_ERR_OPENAI },
};
