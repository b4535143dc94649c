/* routerd/route.h — the routes, one file each (route-*.c): every handler
 * takes the HTTP request and the router (router.h). The table that lists
 * them is routes.c. */
#ifndef TD_ROUTERD_ROUTE_H
#define TD_ROUTERD_ROUTE_H

#include "http.h"

void td_route_chat(td_http_req_t *req, void *router);
void td_route_completions(td_http_req_t *req, void *router);
void td_route_messages(td_http_req_t *req, void *router);
void td_route_messages_count(td_http_req_t *req, void *router);
void td_route_responses(td_http_req_t *req, void *router);
void td_route_responses_id(td_http_req_t *req, void *router);
void td_route_tokenize(td_http_req_t *req, void *router);
void td_route_detokenize(td_http_req_t *req, void *router);
void td_route_models(td_http_req_t *req, void *router);
void td_route_health(td_http_req_t *req, void *router);
void td_route_admin_health(td_http_req_t *req, void *router);
void td_route_ready(td_http_req_t *req, void *router);
void td_route_admin_ready(td_http_req_t *req, void *router);
void td_route_metrics(td_http_req_t *req, void *router);
void td_route_admin_status(td_http_req_t *req, void *router);
void td_route_admin_drain(td_http_req_t *req, void *router);
void td_route_admin_undrain(td_http_req_t *req, void *router);
void td_route_admin_remove(td_http_req_t *req, void *router);
void td_route_admin_requests(td_http_req_t *req, void *router);
void td_route_admin_cancel(td_http_req_t *req, void *router);
void td_route_admin_config(td_http_req_t *req, void *router);
void td_route_admin_cache_flush(td_http_req_t *req, void *router);

#endif
