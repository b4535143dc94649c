/* routerd/route.h — the routes, one file each (route-*.c): every handler
 * takes the evhttp request and the router (router.h). The table that lists
 * them is routes.c. */
#ifndef TD_ROUTERD_ROUTE_H
#define TD_ROUTERD_ROUTE_H

struct evhttp_request;

void td_route_chat(struct evhttp_request *req, void *router);
void td_route_completions(struct evhttp_request *req, void *router);
void td_route_models(struct evhttp_request *req, void *router);
void td_route_health(struct evhttp_request *req, void *router);
void td_route_admin_health(struct evhttp_request *req, void *router);
void td_route_metrics(struct evhttp_request *req, void *router);
void td_route_admin_status(struct evhttp_request *req, void *router);
void td_route_admin_drain(struct evhttp_request *req, void *router);
void td_route_admin_undrain(struct evhttp_request *req, void *router);
void td_route_admin_remove(struct evhttp_request *req, void *router);
void td_route_admin_requests(struct evhttp_request *req, void *router);
void td_route_admin_cancel(struct evhttp_request *req, void *router);
void td_route_admin_config(struct evhttp_request *req, void *router);

#endif
