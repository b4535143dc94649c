/* tandemctl/cmd-requests.c — `requests`: the requests in flight at the
 * router, one line each: id, state, prefill and decode ranks, token counts. */
#include "tandemctl.h"

#include "log.h"

/* GET /admin/requests (routerd/request.c) → {"requests": [{"id", "state",
 * "kind", "prefill": {"node", "rank"} | null, "decode": ..., "prompt_tokens",
 * "completion_tokens", "max_tokens", "age_ms", ...}]} */
static const tdctl_col_t requests_cols[] = {
    { "ID", "id", false },
    { "STATE", "state", false },
    { "KIND", "kind", false },
    { "PREFILL", "prefill", false },
    { "DECODE", "decode", false },
    { "PROMPT", "prompt_tokens", false },
    { "GENERATED", "completion_tokens", false },
    { "MAX", "max_tokens", false },
    { "AGE-MS", "age_ms", false },
};
#define REQUESTS_NCOLS (sizeof(requests_cols) / sizeof(requests_cols[0]))

static td_status_t
requests_render(tdctl_t *ctl, const json_t *ans)
{
    size_t i;
    const json_t *req;
    const json_t *reqs = tdctl_out_array(ctl, ans, "requests", "requests");
    tdctl_table_t *t = tdctl_out_table_create(requests_cols, REQUESTS_NCOLS);
    if (t == NULL)
        goto err_nomem;

    json_array_foreach(reqs, i, req) {
        char ctx[64];
        snprintf(ctx, sizeof(ctx), "requests: #%zu", i);
        if (tdctl_out_row(ctl, t, requests_cols, REQUESTS_NCOLS, NULL, req, ctx) != TD_OK)
            goto err_nomem;
    }
    tdctl_table_print(t, stdout);
    printf("%zu request%s in flight\n", json_array_size(reqs),
           json_array_size(reqs) == 1 ? "" : "s");
    tdctl_table_destroy(t);
    return TD_OK;

err_nomem:
    td_error("requests: out of memory");
    tdctl_table_destroy(t);
    return TD_ERR_NOMEM;
}

static td_status_t
cmd_requests_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_get(ctl, "/admin/requests", "requests", requests_render);
}

const tdctl_cmd_entry_t tdctl_cmd_requests_entry = {
    .name = "requests", .args = "", .nargs = 0, .exec = cmd_requests_exec,
    .help = "requests in flight: id, state, prefill and decode ranks, tokens",
};
