/* tandemctl/cmd-status.c — `status`: one line per rank the router knows, with
 * its node, role, state, load, KV blocks used/free and requests in flight
 * (and its prefix cache, when some prefill rank has one; its DEP group and
 * index there, when some rank has one), sorted by node
 * name, role and rank id; then the router's requests in flight, its admission
 * queue, and one line per DEP group. */
#include "tandemctl.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "log.h"

/* GET /admin/status (routerd/route-admin-status.c) →
 * {"requests_in_flight", "nodes": [{"node", "draining", "removing",
 *   "ranks": [{"rank", "role", "state", "inflight", "load": {"running",
 *   "queued", ...} | null, "kv": {"blocks_used", "blocks_free", ...} | null
 *   [, "dep": {"domain", "size", "rank", "passes", "expert_tokens"}]
 *   [, "cache": {"stats": {"pool_bytes", ...} | null, ...} | null]}]}]}
 * (load and kv are null for a dead rank: its last figures no longer hold;
 * dep only on a DEP group's rank, its passes and rows null when it is dead)
 * The outer object of a row is the node's summary built below, with the
 * rank's "dep" and "cache" cells; the CACHE column is shown only when some
 * prefill rank has a prefix cache, the DEP column only when some rank has a
 * DEP group. */
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
    /* only when some decode rank has blocks waiting for a fence */
    { "QUARANTINED", "kv.blocks_quarantined", false },
    { "IN-FLIGHT", "inflight", false },
    { "CACHE", "cache", true },   /* only when some prefill rank has a prefix cache */
    { "DEP", "dep", true },       /* last: only when some rank is a DEP group's */
};
#define STATUS_COL_CACHE (STATUS_NCOLS_ - 2)
#define STATUS_COL_QUAR 9
#define STATUS_NCOLS_ (sizeof(status_cols) / sizeof(status_cols[0]))
#define STATUS_NCOLS STATUS_NCOLS_

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
    json_t *sum = json_pack("{s:s, s:s, s:s}", "state", state, "dep", "-", "cache", "-");
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

/* ---- DEP groups ------------------------------------------------------------ */

/* The rank's group when it is a DEP group's rank with a name: its "dep"
 * object (else NULL; a "domain" neither a string nor null warns). */
static const json_t *
status_dep(tdctl_t *ctl, const json_t *rank, const char *ctx)
{
    const json_t *dep = json_is_object(rank) ? json_object_get(rank, "dep") : NULL;
    const json_t *dom = json_object_get(dep, "domain");

    if (json_is_string(dom))
        return dep;
    if (dom != NULL && !json_is_null(dom)) {
        ctl->warnings++;
        td_warn("%s: field \"dep.domain\" has the wrong type", ctx);
    }
    return NULL;
}

/* The DEP cell of a rank of group dep: "DOMAIN:RANK/SIZE". */
static void
status_dep_cell(tdctl_t *ctl, const json_t *dep, const char *ctx, char *buf, size_t len)
{
    char rank[32], size[32], cctx[96];

    snprintf(cctx, sizeof(cctx), "%s: column DEP", ctx);
    tdctl_out_cell(ctl, dep, "rank", cctx, rank, sizeof(rank));
    tdctl_out_cell(ctl, dep, "size", cctx, size, sizeof(size));
    snprintf(buf, len, "%s:%s/%s", json_string_value(json_object_get(dep, "domain")), rank,
             size);
}

/* One DEP group as the section shows it, summed over its ranks. */
typedef struct {
    const char *domain, *role;   /* borrowed from the answer */
    const json_t *size;          /* the first rank's */
    size_t nstates[5];           /* up, joining, draining, dead, other */
    json_int_t passes_min, passes_max, rows;
    bool passes, has_rows;
    td_buf_t nodes;              /* "node[0-3],node2[4-7]" */
    const char *last_node;       /* the node nodes ends with */
    json_int_t run_lo, run_hi;   /* its open run of dep ranks; run_lo -1: none */
} status_group_t;

static const char *const status_state_names[] = { "up", "joining", "draining", "dead" };

/* Close the open run of ranks ("lo-hi" or "lo") of g's last node. */
static void
status_group_run_end(status_group_t *g)
{
    if (g->run_lo < 0)
        return;
    if (g->run_hi > g->run_lo)
        td_buf_printf(&g->nodes, "%" JSON_INTEGER_FORMAT "-%" JSON_INTEGER_FORMAT, g->run_lo,
                      g->run_hi);
    else
        td_buf_printf(&g->nodes, "%" JSON_INTEGER_FORMAT, g->run_lo);
    g->run_lo = -1;
}

/* Add one rank (rows are in node order, a node's ranks in rank order). */
static void
status_group_add(status_group_t *g, const char *node, const json_t *rank, const json_t *dep)
{
    const char *state = json_string_value(json_object_get(rank, "state"));
    const json_t *idx = json_object_get(dep, "rank");
    const json_t *passes = json_object_get(dep, "passes");
    const json_t *rows = json_object_get(dep, "expert_tokens");
    size_t s = 0, i;
    const json_t *v;

    while (s < 4 && (state == NULL || strcmp(state, status_state_names[s]) != 0))
        s++;
    g->nstates[s]++;
    if (g->last_node == NULL || strcmp(g->last_node, node) != 0) {
        status_group_run_end(g);
        if (g->last_node != NULL)
            td_buf_puts(&g->nodes, "],");
        td_buf_printf(&g->nodes, "%s[", node);
        g->last_node = node;
    }
    if (json_is_integer(idx)) {
        json_int_t r = json_integer_value(idx);
        if (g->run_lo >= 0 && r == g->run_hi + 1) {
            g->run_hi = r;
        } else {
            if (g->run_lo >= 0) {
                status_group_run_end(g);
                td_buf_puts(&g->nodes, ",");
            }
            g->run_lo = g->run_hi = r;
        }
    }
    if (json_is_integer(passes)) {
        json_int_t p = json_integer_value(passes);
        g->passes_min = !g->passes || p < g->passes_min ? p : g->passes_min;
        g->passes_max = !g->passes || p > g->passes_max ? p : g->passes_max;
        g->passes = true;
    }
    json_array_foreach(rows, i, v) {
        g->rows += json_is_integer(v) ? json_integer_value(v) : 0;
        g->has_rows = true;
    }
}

/* domain name (natural order), then role */
static int
status_group_cmp(const void *pa, const void *pb)
{
    const status_group_t *a = pa, *b = pb;
    int c = strverscmp(a->domain, b->domain);

    return c != 0 ? c : strcmp(a->role, b->role);
}

static const tdctl_col_t status_group_cols[] = {
    { "DEP-GROUP", "domain", false }, { "ROLE", "role", false }, { "SIZE", "size", false },
    { "STATE", "state", false }, { "NODES", "nodes", false }, { "PASSES", "passes", false },
    { "EXPERT-ROWS", "rows", false },
};
#define STATUS_GROUP_NCOLS (sizeof(status_group_cols) / sizeof(status_group_cols[0]))

/* g's line of the section, as a JSON object for tdctl_out_row: STATE is the
 * ranks' one state when every rank of the group is known and in it, else
 * "N up, N dead, N missing"; PASSES "N", or "MIN..MAX" when they differ. */
static json_t *
status_group_json(const status_group_t *g)
{
    td_buf_t st = { 0 };
    char passes[64] = "-", rows[32] = "-";
    size_t known = 0, i;

    for (i = 0; i < 5; i++)
        known += g->nstates[i];
    json_int_t size = json_is_integer(g->size) ? json_integer_value(g->size) : -1;
    for (i = 0; i < 5; i++) {
        if (g->nstates[i] == known && (json_int_t)known == size) {
            td_buf_puts(&st, i < 4 ? status_state_names[i] : "?");
            break;
        }
        if (g->nstates[i] > 0)
            td_buf_printf(&st, "%s%zu %s", st.len ? ", " : "", g->nstates[i],
                          i < 4 ? status_state_names[i] : "other");
    }
    if (i == 5 && size > (json_int_t)known)
        td_buf_printf(&st, "%s%" JSON_INTEGER_FORMAT " missing", st.len ? ", " : "",
                      size - (json_int_t)known);
    if (g->passes && g->passes_min == g->passes_max)
        snprintf(passes, sizeof(passes), "%" JSON_INTEGER_FORMAT, g->passes_min);
    else if (g->passes)
        snprintf(passes, sizeof(passes), "%" JSON_INTEGER_FORMAT "..%" JSON_INTEGER_FORMAT,
                 g->passes_min, g->passes_max);
    if (g->has_rows)
        snprintf(rows, sizeof(rows), "%" JSON_INTEGER_FORMAT, g->rows);
    json_t *o = json_pack("{s:s, s:s, s:O, s:s, s:s, s:s, s:s}", "domain", g->domain,
                          "role", g->role, "size", g->size ? g->size : json_null(),
                          "state", st.data ? st.data : "", "nodes",
                          g->nodes.data ? g->nodes.data : "", "passes", passes, "rows", rows);
    td_buf_free(&st);
    return o;
}

/* The section: one line per DEP group (its ranks grouped by "domain" and
 * role), after an empty line; nothing when no rank is a group's. */
static td_status_t
status_groups(tdctl_t *ctl, const status_row_t *rows, size_t nrows, const json_t **deps)
{
    td_status_t st = TD_ERR_NOMEM;
    status_group_t *gs = calloc(nrows ? nrows : 1, sizeof(*gs));
    size_t ng = 0, i, k;
    tdctl_table_t *t = NULL;

    if (gs == NULL)
        return TD_ERR_NOMEM;
    for (i = 0; i < nrows; i++) {
        if (deps[i] == NULL)
            continue;
        const char *dom = json_string_value(json_object_get(deps[i], "domain"));
        const char *role = json_string_value(json_object_get(rows[i].rank, "role"));
        role = role ? role : "?";
        for (k = 0; k < ng && (strcmp(gs[k].domain, dom) != 0 || strcmp(gs[k].role, role) != 0);
             k++)
            ;
        if (k == ng) {
            gs[ng++] = (status_group_t){ .domain = dom, .role = role, .run_lo = -1,
                                         .size = json_object_get(deps[i], "size") };
        }
        status_group_add(&gs[k], rows[i].node, rows[i].rank, deps[i]);
    }
    if (ng == 0) {
        st = TD_OK;
        goto out_free;
    }
    qsort(gs, ng, sizeof(*gs), status_group_cmp);
    if ((t = tdctl_out_table_create(status_group_cols, STATUS_GROUP_NCOLS)) == NULL)
        goto out_free;
    for (k = 0; k < ng; k++) {
        status_group_run_end(&gs[k]);
        td_buf_puts(&gs[k].nodes, "]");
        json_t *o = status_group_json(&gs[k]);
        if (o == NULL || td_buf_status(&gs[k].nodes) != TD_OK ||
            tdctl_out_row(ctl, t, status_group_cols, STATUS_GROUP_NCOLS, NULL, o,
                          "status: dep group") != TD_OK) {
            json_decref(o);
            goto out_free;
        }
        json_decref(o);
    }
    printf("\n");
    tdctl_table_print(t, stdout);
    st = TD_OK;
out_free:
    tdctl_table_destroy(t);
    for (k = 0; k < ng; k++)
        td_buf_free(&gs[k].nodes);
    free(gs);
    return st;
}

/* ---- The command ------------------------------------------------------------ */

/* The columns shown: CACHE, QUARANTINED and DEP only when some rank has one. */
static size_t
status_pick_cols(bool any_cache, bool any_dep, bool any_quar, tdctl_col_t *cols)
{
    size_t n = 0;

    for (size_t i = 0; i < STATUS_NCOLS; i++)
        if ((i != STATUS_COL_CACHE || any_cache) && (i != STATUS_NCOLS - 1 || any_dep) &&
            (i != STATUS_COL_QUAR || any_quar))
            cols[n++] = status_cols[i];
    return n;
}

static td_status_t
status_render(tdctl_t *ctl, const json_t *ans)
{
    td_status_t st = TD_ERR_NOMEM;
    size_t i, j, nranks = 0, cap = 0;
    bool any_dep = false, any_cache = false, any_quar = false;
    tdctl_col_t cols[STATUS_NCOLS];
    size_t ncols;
    const json_t *node, *rank;
    const json_t *nodes = tdctl_out_array(ctl, ans, "nodes", "status");
    json_t *sums = json_array();   /* owns the node summaries and rows' own ones */
    status_row_t *rows = NULL;
    const json_t **deps = NULL;    /* [nranks] each row's DEP group, or NULL */
    tdctl_table_t *t = NULL;
    if (sums == NULL)
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
            json_t *q = json_object_get(json_object_get(rank, "kv"), "blocks_quarantined");
            any_quar = any_quar || (json_is_integer(q) && json_integer_value(q) > 0);
        }
    }
    if (nranks > 0)
        qsort(rows, nranks, sizeof(*rows), status_row_cmp);
    if ((deps = calloc(nranks ? nranks : 1, sizeof(*deps))) == NULL)
        goto err_nomem;
    /* a group's rank, a prefill rank with a cache: its own summary, with its
     * DEP and CACHE cells */
    for (i = 0; i < nranks; i++) {
        char ctx[64], cell[128], cache[160];
        const json_t *c = json_object_get(rows[i].rank, "cache");
        snprintf(ctx, sizeof(ctx), "status: node #%zu rank #%zu", rows[i].ni, rows[i].ri);
        deps[i] = status_dep(ctl, rows[i].rank, ctx);
        if (deps[i] == NULL && !json_is_object(c))
            continue;
        json_t *own = json_copy((json_t *)rows[i].sum);
        if (own == NULL || json_array_append_new(sums, own) != 0)
            goto err_nomem;
        if (deps[i] != NULL) {
            status_dep_cell(ctl, deps[i], ctx, cell, sizeof(cell));
            if (json_object_set_new(own, "dep", json_string(cell)) != 0)
                goto err_nomem;
            any_dep = true;
        }
        if (json_is_object(c)) {
            tdctl_out_cache(c, cache, sizeof(cache));
            if (json_object_set_new(own, "cache", json_string(cache)) != 0)
                goto err_nomem;
            any_cache = true;
        }
        rows[i].sum = own;
    }
    ncols = status_pick_cols(any_cache, any_dep, any_quar, cols);
    if ((t = tdctl_out_table_create(cols, ncols)) == NULL)
        goto err_nomem;
    for (i = 0; i < nranks; i++) {
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "status: node #%zu rank #%zu", rows[i].ni, rows[i].ri);
        if (tdctl_out_row(ctl, t, cols, ncols, rows[i].sum, rows[i].rank, ctx) != TD_OK)
            goto err_nomem;
    }
    char inflight[32];
    tdctl_out_cell(ctl, ans, "requests_in_flight", "status", inflight, sizeof(inflight));
    tdctl_table_print(t, stdout);
    printf("%zu node%s, %zu rank%s, %s request%s in flight\n", json_array_size(nodes),
           json_array_size(nodes) == 1 ? "" : "s", nranks, nranks == 1 ? "" : "s", inflight,
           strcmp(inflight, "1") == 0 ? "" : "s");
    status_queue(ctl, ans);
    if (status_groups(ctl, rows, nranks, deps) != TD_OK)
        goto err_nomem;
    st = TD_OK;
    goto out_destroy;

err_nomem:
    td_error("status: out of memory");
out_destroy:
    free(deps);
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
    .help = "ranks (state, load, kv blocks, requests in flight), the queue, dep groups",
    .details = "One line per rank, sorted by node name, role and rank id. NODE-STATE is the\n"
               "router's view of the node (active, draining, removing); STATE the rank's\n"
               "(joining, up, draining, dead). RUNNING and QUEUED are requests, KV-USED\n"
               "and KV-FREE blocks, from the rank's latest load report; a dead rank\n"
               "shows \"-\" there. QUARANTINED, shown when some decode rank has any, are\n"
               "blocks whose prefill rank went silent past its deadline and that wait\n"
               "for a fence (docs/decoded.md). IN-FLIGHT counts this router's requests\n"
               "bound to it.\n"
               "CACHE, shown when some prefill rank has a prefix cache, is that cache from\n"
               "the rank's latest report: bytes in its kv pool, host and ssd tiers and the\n"
               "share of looked-up prompt tokens found (\"-\": no cache; `tandemctl cache`\n"
               "has more).\n"
               "DEP, shown when some rank belongs to a DEP group (--dep), is the group and\n"
               "the rank's index in it, DOMAIN:RANK/SIZE (a decode domain's --domain-id,\n"
               "else the node). A last table has one line per group: its size, its ranks'\n"
               "state (one word when all SIZE ranks are in it, else counts and those not\n"
               "registered as missing), its nodes with their ranks in the group, the\n"
               "passes its ranks made (MIN..MAX when they differ) and the rows its experts\n"
               "ran, summed over its ranks.\n",
};
