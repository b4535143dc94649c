/* tandemctl/cmd-cache.c — `cache` (or `cache status`): one line per prefill
 * rank with a prefix cache, its figures and this router's placements on it
 * (from /admin/status); `cache flush NODE`: the router sends CacheFlush to
 * every prefill rank of NODE that has a prefix cache (docs/kvrouting.md). */
#include "tandemctl.h"

#include <string.h>

/* A row's cells, built from the rank's "cache" object of /admin/status
 * (routerd/route-admin-status.c): {"block_tokens", "blocks_tracked",
 * "stats": {...} | null, "placed", "prompt_tokens", "predicted_cached_tokens",
 * "reported_cached_tokens", "placed_by_cache"}. */
static const tdctl_col_t cache_cols[] = {
    { "NODE", "node", true },
    { "RANK", "rank", false },
    { "STATE", "state", false },
    { "BLOCK", "cache.block_tokens", false },
    { "TRACKED", "cache.blocks_tracked", false },
    { "CACHE", "summary", true },
    { "PLACED", "cache.placed", false },
    { "BY-CACHE", "cache.placed_by_cache", false },
    { "PROMPT-TOK", "cache.prompt_tokens", false },
    { "EXPECTED", "cache.predicted_cached_tokens", false },
    { "REPORTED", "cache.reported_cached_tokens", false },
};
#define CACHE_NCOLS (sizeof(cache_cols) / sizeof(cache_cols[0]))

static td_status_t
cache_render(tdctl_t *ctl, const json_t *ans)
{
    const json_t *nodes = tdctl_out_array(ctl, ans, "nodes", "cache");
    tdctl_table_t *t = tdctl_out_table_create(cache_cols, CACHE_NCOLS);
    const json_t *node, *rank;
    size_t i, j, n = 0;

    if (t == NULL)
        goto err_nomem;
    json_array_foreach(nodes, i, node) {
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "cache: node #%zu", i);
        const json_t *ranks = tdctl_out_array(ctl, node, "ranks", ctx);
        json_array_foreach(ranks, j, rank) {
            const json_t *cache = json_object_get(rank, "cache");
            char cell[160];
            if (!json_is_object(cache))
                continue;   /* not a prefill rank, or one without a prefix cache */
            tdctl_out_cache(cache, cell, sizeof(cell));
            json_t *outer = json_pack("{s:O, s:s}", "node", json_object_get(node, "node"),
                                      "summary", cell);
            snprintf(ctx, sizeof(ctx), "cache: node #%zu rank #%zu", i, j);
            td_status_t st = outer ? tdctl_out_row(ctl, t, cache_cols, CACHE_NCOLS, outer,
                                                   rank, ctx)
                                   : TD_ERR_NOMEM;
            json_decref(outer);
            if (st != TD_OK)
                goto err_nomem;
            n++;
        }
    }
    if (n == 0)
        printf("no prefill rank with a prefix cache\n");
    else
        tdctl_table_print(t, stdout);
    tdctl_table_destroy(t);
    return TD_OK;

err_nomem:
    td_error("cache: out of memory");
    tdctl_table_destroy(t);
    return TD_ERR_NOMEM;
}

static td_status_t
cmd_cache_exec(tdctl_t *ctl, char **args)
{
    if (ctl->nargs == 0 || (ctl->nargs == 1 && strcmp(args[0], "status") == 0))
        return tdctl_cmd_get(ctl, "/admin/status", "cache status", cache_render);
    if (ctl->nargs == 2 && strcmp(args[0], "flush") == 0)
        return tdctl_cmd_post(ctl, "flush the cache of", "/admin/cache/flush", "node", "node",
                              args[1], "flushing");
    td_error("usage: tandemctl cache [status | flush NODE] (tandemctl cache --help)");
    return TD_ERR_INVALID;
}

const tdctl_cmd_entry_t tdctl_cmd_cache_entry = {
    .name = "cache", .args = "[flush NODE]", .nargs = 0, .nargs_max = 2,
    .exec = cmd_cache_exec,
    .help = "prefill ranks' prefix caches; flush NODE's",
    .details = "`cache` (or `cache status`): one line per prefill rank with a prefix cache.\n"
               "BLOCK is its cache block in tokens, TRACKED the blocks the router knows it\n"
               "holds (from its cache events), CACHE its last report (bytes in its kv pool,\n"
               "host memory and ssd tiers, and the share of looked-up prompt tokens it\n"
               "found). PLACED counts the prefills this router sent it, BY-CACHE those it\n"
               "got for its cache (load alone would have chosen another rank), PROMPT-TOK\n"
               "their prompt tokens, EXPECTED the tokens the router expected cached and\n"
               "REPORTED those the rank said it served from its cache.\n"
               "`cache flush NODE`: the router sends every prefill rank of NODE with a\n"
               "prefix cache a CacheFlush; they empty it in every tier (blocks a running\n"
               "request uses stay until it ends) and report it cleared. The answer says to\n"
               "how many ranks it was sent (--json: {\"node\", \"status\", \"ranks\"}).\n",
};
