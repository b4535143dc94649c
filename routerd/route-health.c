/* routerd/route-health.c — GET /health: liveness (always 200 while the loop
 * runs), which listener answers (the api or the admin api: a client pointed
 * at the wrong port can tell), whether any prefill and decode rank takes
 * requests, and whether the router is shutting down. */
#include "router.h"
#include "route.h"

#include <jansson.h>

static void
health(td_http_req_t *req, td_router_t *r, const char *listener)
{
    json_int_t up[2] = {0, 0};

    for (const td_rrank_t *rk = r->cluster.ranks; rk; rk = rk->next)
        if (td_rrank_state(rk) == TD_RRANK_UP)
            up[rk->role == TANDEM__ROLE__ROLE_DECODE]++;
    td_http_reply_json(req, 200, json_pack("{s:s, s:s, s:b, s:b, s:I, s:I}", "status", "ok",
                                           "listener", listener,
                                           "ready", !r->stopping && up[0] > 0 && up[1] > 0,
                                           "stopping", r->stopping,
                                           "prefill_ranks_up", up[0],
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
