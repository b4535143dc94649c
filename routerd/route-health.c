/* routerd/route-health.c — GET /health: liveness (always 200 while the loop
 * runs) and whether any prefill and decode rank takes requests. */
#include "router.h"
#include "route.h"

#include <jansson.h>

void
td_route_health(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    json_int_t up[2] = {0, 0};

    for (const td_rrank_t *rk = r->cluster.ranks; rk; rk = rk->next)
        if (td_rrank_state(rk) == TD_RRANK_UP)
            up[rk->role == TANDEM__ROLE__ROLE_DECODE]++;
    td_http_reply_json(req, 200, json_pack("{s:s, s:b, s:I, s:I}", "status", "ok",
                                           "ready", up[0] > 0 && up[1] > 0,
                                           "prefill_ranks_up", up[0],
                                           "decode_ranks_up", up[1]));
}
