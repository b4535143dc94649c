/* routerd/rrank.c — one worker rank as routerd sees it: its state from its
 * connection, registration and draining, and sending it a message. */
#include "rrank.h"

#include "log.h"

static const char *const rrank_state_names[] = {
    [TD_RRANK_UP] = "up", [TD_RRANK_JOINING] = "joining",
    [TD_RRANK_DRAINING] = "draining", [TD_RRANK_DEAD] = "dead",
};

const char *
td_rrank_state_str(td_rrank_state_t st)
{
    return (unsigned)st <= TD_RRANK_DEAD ? rrank_state_names[st] : "?";
}

td_rrank_state_t
td_rrank_state(const td_rrank_t *rk)
{
    if (!rk->conn)
        return TD_RRANK_DEAD;
    if (!rk->reg)
        return TD_RRANK_JOINING;
    if (rk->node->draining || rk->load.draining || rk->reg->draining)
        return TD_RRANK_DRAINING;
    return TD_RRANK_UP;
}

td_status_t
td_rrank_send(td_rrank_t *rk, const Tandem__Envelope *env)
{
    td_status_t st;

    if (!rk->conn) {
        td_debug("%s rank %s/%u: not connected; message (payload %d) not sent",
                 td_hello_role_str(rk->role), rk->node->name, rk->rank_id,
                 (int)env->payload_case);
        return TD_ERR_CLOSED;
    }
    st = td_ctl_conn_send(rk->conn, env);
    /* an oversized frame was logged by the control connection, which decided it */
    if (st != TD_OK && st != TD_ERR_TOO_BIG)
        td_warn("%s: message (payload %d) not sent: %s", td_ctl_conn_name(rk->conn),
                (int)env->payload_case, td_status_str(st));
    return st;
}
