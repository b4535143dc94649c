/* routerd/route-health.c — GET /health: liveness (always 200 while the loop
 * runs), which listener answers (the api or the admin api: a client pointed
 * at the wrong port can tell), whether any prefill and decode rank takes
 * requests, and whether the router is shutting down. GET /ready: readiness
 * for a load balancer, 200 only while the router can serve (a prefill and a
 * decode rank up, not shutting down), else 503 with the reason. */
#include "router.h"
#include "route.h"

#include <jansson.h>

/* Ranks up by role ([0] prefill, [1] decode), and whether any rank ever
 * connected (dead ones stay in the table for the admin view). */
static void
ranks_up(const td_router_t *r, json_int_t up[2], bool *any)
{
    up[0] = up[1] = 0;
    *any = r->cluster.ranks != NULL;
    for (const td_rrank_t *rk = r->cluster.ranks; rk; rk = rk->next)
        if (td_rrank_state(rk) == TD_RRANK_UP)
            up[rk->role == TANDEM__ROLE__ROLE_DECODE]++;
}

/* Why r cannot serve now, or NULL when it can. */
static const char *
not_ready_why(const td_router_t *r, const json_int_t up[2], bool any)
{
    if (r->stopping)
        return "shutting down";
    if (!any)
        return "no rank has registered yet";
    if (up[0] == 0 && up[1] == 0)
        return "no prefill rank and no decode rank up";
    if (up[0] == 0)
        return "no prefill rank up";
    if (up[1] == 0)
        return "no decode rank up";
    return NULL;
}

static void
health(td_http_req_t *req, td_router_t *r, const char *listener)
{
    json_int_t up[2];
    bool any;

    ranks_up(r, up, &any);
    td_http_reply_json(req, 200, json_pack("{s:s, s:s, s:b, s:b, s:I, s:I}", "status", "ok",
                                           "listener", listener,
                                           "ready", not_ready_why(r, up, any) == NULL,
                                           "stopping", r->stopping,
                                           "prefill_ranks_up", up[0],
                                           "decode_ranks_up", up[1]));
}

static void
ready(td_http_req_t *req, td_router_t *r, const char *listener)
{
    json_int_t up[2];
    bool any;
    const char *why;

    ranks_up(r, up, &any);
    why = not_ready_why(r, up, any);
    td_http_reply_json(req, why ? 503 : 200,
                       json_pack("{s:s, s:s, s:b, s:s?, s:I, s:I}", "status",
                                 why ? "not ready" : "ready", "listener", listener, "ready",
                                 why == NULL, "reason", why, "prefill_ranks_up", up[0],
                                 "decode_ranks_up", up[1]));
}

void
td_route_health(td_http_req_t *req, void *router)
{
    health(req, router, "api");
}

void
td_route_admin_health(td_http_req_t *req, void *router)
{
    health(req, router, "admin");
}

void
td_route_ready(td_http_req_t *req, void *router)
{
    ready(req, router, "api");
}

void
td_route_admin_ready(td_http_req_t *req, void *router)
{
    ready(req, router, "admin");
}
