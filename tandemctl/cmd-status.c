/* tandemctl/cmd-status.c — `status`: one line per rank the router knows, with
 * its node, role, state, load, KV blocks used/free and requests in flight;
 * then the router's requests in flight and its admission queue. */
#include "tandemctl.h"

#include <string.h>

#include "log.h"

/* GET /admin/status (routerd/route-admin-status.c) →
 * {"requests_in_flight", "nodes": [{"node", "draining", "removing",
 *   "ranks": [{"rank", "role", "state", "inflight", "load": {"running",
 *   "queued", ...}, "kv": {"blocks_used", "blocks_free", ...}}]}]}
 * The outer object of a row is the node's summary built below. */
static const tdctl_col_t status_cols[] = {
    { "NODE", "node", true },
    { "NODE-STATE", "state", true },
    { "ROLE", "role", false },
    { "RANK", "rank", false },
    { "STATE", "state", false },
    { "RUNNING", "load.running", false },
    { "QUEUED", "load.queued", false },
    { "KV-USED", "kv.blocks_used", false },
    { "KV-FREE", "kv.blocks_free", false },
    { "IN-FLIGHT", "inflight", false },
};
#define STATUS_NCOLS (sizeof(status_cols) / sizeof(status_cols[0]))

/* {"node", "state": removing | draining | active | ?} for one node. */
static json_t *
status_node_summary(tdctl_t *ctl, const json_t *node, const char *ctx)
{
    const json_t *drain = json_object_get(node, "draining");
    const json_t *rm = json_object_get(node, "removing");
    const char *state = "?";

    if (json_is_boolean(drain) && json_is_boolean(rm))
        state = json_is_true(rm) ? "removing" : json_is_true(drain) ? "draining" : "active";
    else if (json_is_object(node)) {
        ctl->warnings++;
        td_warn("%s: fields \"draining\" and \"removing\" should be booleans", ctx);
    }
    json_t *sum = json_pack("{s:s}", "state", state);
    const json_t *name = json_object_get(node, "node");
    if (sum != NULL && name != NULL && json_object_set(sum, "node", (json_t *)name) != 0) {
        json_decref(sum);
        return NULL;
    }
    return sum;
}

/* "queue: N waiting (max M), longest wait X ms; mean wait Y ms over Z waits" from
 * {"queue": {"length", "max", "oldest_ms", "waited", "mean_wait_ms"}}; nothing
 * from a router without a queue. */
static void
status_queue(tdctl_t *ctl, const json_t *ans)
{
    static const char *const keys[] = { "length", "max", "oldest_ms", "mean_wait_ms", "waited" };
    const json_t *q = json_object_get(ans, "queue");
    char v[5][32];

    if (q == NULL)
        return;
    for (size_t i = 0; i < 5; i++)
        tdctl_out_cell(ctl, q, keys[i], "status: queue", v[i], sizeof(v[i]));
    printf("queue: %s waiting (max %s), longest wait %s ms; mean wait %s ms over %s waits\n",
           v[0], v[1], v[2], v[3], v[4]);
}

static td_status_t
status_render(tdctl_t *ctl, const json_t *ans)
{
    td_status_t st = TD_ERR_NOMEM;
    size_t i, j, nranks = 0;
    const json_t *node, *rank;
    const json_t *nodes = tdctl_out_array(ctl, ans, "nodes", "status");
    tdctl_table_t *t = tdctl_out_table_create(status_cols, STATUS_NCOLS);
    if (t == NULL)
        goto err_nomem;

    json_array_foreach(nodes, i, node) {
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "status: node #%zu", i);
        json_t *sum = status_node_summary(ctl, node, ctx);
        if (sum == NULL)
            goto err_nomem;
        const json_t *ranks = tdctl_out_array(ctl, node, "ranks", ctx);
        json_array_foreach(ranks, j, rank) {
            snprintf(ctx, sizeof(ctx), "status: node #%zu rank #%zu", i, j);
            if (tdctl_out_row(ctl, t, status_cols, STATUS_NCOLS, sum, rank, ctx) != TD_OK) {
                json_decref(sum);
                goto err_nomem;
            }
            nranks++;
        }
        json_decref(sum);
    }
    char inflight[32];
    tdctl_out_cell(ctl, ans, "requests_in_flight", "status", inflight, sizeof(inflight));
    tdctl_table_print(t, stdout);
    printf("%zu node%s, %zu rank%s, %s request%s in flight\n", json_array_size(nodes),
           json_array_size(nodes) == 1 ? "" : "s", nranks, nranks == 1 ? "" : "s", inflight,
           strcmp(inflight, "1") == 0 ? "" : "s");
    status_queue(ctl, ans);
    st = TD_OK;
    goto out_destroy;

err_nomem:
    td_error("status: out of memory");
out_destroy:
    tdctl_table_destroy(t);
    return st;
}

static td_status_t
cmd_status_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_get(ctl, "/admin/status", "status", status_render);
}

const tdctl_cmd_entry_t tdctl_cmd_status_entry = {
    .name = "status", .args = "", .nargs = 0, .exec = cmd_status_exec,
    .help = "nodes and ranks: state, load, kv blocks used/free, requests in flight, the "
            "admission queue",
};
