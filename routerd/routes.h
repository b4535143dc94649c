/* routerd/routes.h — the route table (routes.c) that main.c hands to the
 * HTTP listeners, and the routes, one file each (route-*.c). Every route
 * gets the router (router.h) as its argument. */
#ifndef TD_ROUTERD_ROUTES_H
#define TD_ROUTERD_ROUTES_H

#include "http.h"

struct evhttp_request;

extern const td_http_route_t td_routes[];

void td_route_chat(struct evhttp_request *req, void *router);
void td_route_completions(struct evhttp_request *req, void *router);
void td_route_models(struct evhttp_request *req, void *router);
void td_route_health(struct evhttp_request *req, void *router);
void td_route_metrics(struct evhttp_request *req, void *router);
void td_route_admin_status(struct evhttp_request *req, void *router);
void td_route_admin_drain(struct evhttp_request *req, void *router);
void td_route_admin_undrain(struct evhttp_request *req, void *router);
void td_route_admin_remove(struct evhttp_request *req, void *router);
void td_route_admin_requests(struct evhttp_request *req, void *router);
void td_route_admin_cancel(struct evhttp_request *req, void *router);
void td_route_admin_config(struct evhttp_request *req, void *router);

#endif
