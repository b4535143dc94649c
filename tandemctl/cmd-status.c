/* tandemctl/cmd-status.c — `status`: one line per rank the router knows, with
 * its node, role, state, load, KV blocks used/free and requests in flight,
 * sorted by node name, role and rank id; then the router's requests in flight
 * and its admission queue. */
#include "tandemctl.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

/* GET /admin/status (routerd/route-admin-status.c) →
 * {"requests_in_flight", "nodes": [{"node", "draining", "removing",
 *   "ranks": [{"rank", "role", "state", "inflight", "load": {"running",
 *   "queued", ...} | null, "kv": {"blocks_used", "blocks_free", ...} | null}]}]}
 * (load and kv are null for a dead rank: its last figures no longer hold)
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

/* One rank's row before sorting: the node's summary, the rank, and where
 * they were in the answer (for warnings, and to keep ties in order). */
typedef struct {
    const json_t *sum;
    const json_t *rank;
    const char *node;   /* "" when not a string */
    size_t ni, ri;
} status_row_t;

/* node name (natural order: decode2 before decode10), role, rank id */
static int
status_row_cmp(const void *pa, const void *pb)
{
    const status_row_t *a = pa, *b = pb;
    const char *ra = json_string_value(json_object_get(a->rank, "role"));
    const char *rb = json_string_value(json_object_get(b->rank, "role"));
    const json_t *ia = json_object_get(a->rank, "rank"), *ib = json_object_get(b->rank, "rank");
    int c = strverscmp(a->node, b->node);

    if (c == 0)
        c = strcmp(ra ? ra : "", rb ? rb : "");
    if (c == 0 && json_is_integer(ia) != json_is_integer(ib))
        c = json_is_integer(ia) ? -1 : 1;
    if (c == 0 && json_is_integer(ia) && json_integer_value(ia) != json_integer_value(ib))
        c = json_integer_value(ia) < json_integer_value(ib) ? -1 : 1;
    if (c == 0)
        c = a->ni != b->ni ? (a->ni < b->ni ? -1 : 1) : a->ri < b->ri ? -1 : a->ri > b->ri;
    return c;
}

static td_status_t
status_render(tdctl_t *ctl, const json_t *ans)
{
    td_status_t st = TD_ERR_NOMEM;
    size_t i, j, nranks = 0, cap = 0;
    const json_t *node, *rank;
    const json_t *nodes = tdctl_out_array(ctl, ans, "nodes", "status");
    json_t *sums = json_array();   /* owns the node summaries */
    status_row_t *rows = NULL;
    tdctl_table_t *t = tdctl_out_table_create(status_cols, STATUS_NCOLS);
    if (t == NULL || sums == NULL)
        goto err_nomem;

    json_array_foreach(nodes, i, node) {
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "status: node #%zu", i);
        json_t *sum = status_node_summary(ctl, node, ctx);
        if (sum == NULL || json_array_append_new(sums, sum) != 0)
            goto err_nomem;
        const json_t *ranks = tdctl_out_array(ctl, node, "ranks", ctx);
        const char *name = json_string_value(json_object_get(node, "node"));
        json_array_foreach(ranks, j, rank) {
            if (nranks == cap) {
                status_row_t *r = realloc(rows, (cap ? 2 * cap : 16) * sizeof(*rows));
                if (r == NULL)
                    goto err_nomem;
                rows = r;
                cap = cap ? 2 * cap : 16;
            }
            rows[nranks++] = (status_row_t){ .sum = sum, .rank = rank,
                                             .node = name ? name : "", .ni = i, .ri = j };
        }
    }
    if (nranks > 0)
        qsort(rows, nranks, sizeof(*rows), status_row_cmp);
    for (i = 0; i < nranks; i++) {
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "status: node #%zu rank #%zu", rows[i].ni, rows[i].ri);
        if (tdctl_out_row(ctl, t, status_cols, STATUS_NCOLS, rows[i].sum, rows[i].rank,
                          ctx) != TD_OK)
            goto err_nomem;
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
    free(rows);
    json_decref(sums);
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
    .details = "One line per rank, sorted by node name, role and rank id. NODE-STATE is the\n"
               "router's view of the node (active, draining, removing); STATE the rank's\n"
               "(joining, up, draining, dead). RUNNING and QUEUED are requests, KV-USED\n"
               "and KV-FREE blocks, from the rank's latest load report; a dead rank\n"
               "shows \"-\" there. IN-FLIGHT counts this router's requests bound to it.\n",
};
