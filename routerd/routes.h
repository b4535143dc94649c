/* routerd/routes.h — the route table (routes.c) that main.c hands to the
 * HTTP listeners: path, methods, listener, key, and a handler of route.h. */
#ifndef TD_ROUTERD_ROUTES_H
#define TD_ROUTERD_ROUTES_H

#include "http.h"

extern const td_http_route_t td_routes[];

#endif
