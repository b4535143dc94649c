/* tandemctl/cmd-ready.c — `ready [SECONDS]`: whether the router can serve
 * (GET /ready, no key): prints "ready" or "not ready: REASON" and succeeds
 * only when ready; with SECONDS it asks every second until the router is
 * ready or SECONDS have passed. For systemd (deploy/systemd/tandem-ready.service)
 * and scripts that wait for a cluster. */
#include "tandemctl.h"

#include <time.h>

#include "clock.h"
#include "config.h"

/* One ask: 1 ready, 0 not (why in why), -1 no answer (why too). */
static int
ready_ask(tdctl_t *ctl, char *why, size_t len)
{
    int code;
    json_t *j = NULL;
    td_status_t st = tdctl_http_probe(ctl, "/ready", ctl->opts.timeout_ms, &code, &j);
    int ready = -1;

    if (st != TD_OK) {
        snprintf(why, len, "router %s: %s", ctl->opts.router,
                 st == TD_ERR_TIMEOUT ? "no answer in time"
                 : st == TD_ERR_INVALID ? "not an http://HOST:PORT url" : "unreachable");
    } else if (code == 200 || code == 503) {
        const char *r = json_string_value(json_object_get(j, "reason"));
        ready = code == 200;
        snprintf(why, len, "%s", r != NULL ? r : code == 200 ? "" : "no reason given");
    } else {
        snprintf(why, len, "router %s: /ready answered HTTP %d (a routerd without /ready?)",
                 ctl->opts.router, code);
    }
    if (ctl->opts.json && j != NULL)
        tdctl_out_json(j);
    json_decref(j);
    return ready;
}

static td_status_t
cmd_ready_exec(tdctl_t *ctl, char **args)
{
    uint64_t wait_s = 0;
    char err[256], why[256];
    int ready;

    if (ctl->nargs > 0 &&
        td_config_parse_uint("SECONDS", args[0], 0, 86400, &wait_s, err, sizeof err) != TD_OK) {
        td_error("ready: %s", err);
        return TD_ERR_INVALID;
    }
    uint64_t until = td_clock_ns() + wait_s * 1000000000ull;
    while ((ready = ready_ask(ctl, why, sizeof why)) != 1 && td_clock_ns() < until) {
        struct timespec one = { 1, 0 };
        nanosleep(&one, NULL);
    }
    if (ready == 1) {
        if (!ctl->opts.json)
            printf("ready\n");
        return TD_OK;
    }
    td_error("%s%s", ready == 0 ? "not ready: " : "", why);
    return TD_ERR_STATE;
}

const tdctl_cmd_entry_t tdctl_cmd_ready_entry = {
    .name = "ready", .args = "[SECONDS]", .nargs = 0, .nargs_max = 1, .no_key = true,
    .exec = cmd_ready_exec,
    .help = "whether the router can serve (GET /ready); wait up to SECONDS for it",
    .details = "Ready: a prefill and a decode rank up, the router not shutting down (no\n"
               "admin key needed). Exit 0 when ready, 1 otherwise, with the router's reason.\n"
               "With SECONDS, asks once a second until ready or SECONDS have passed.\n",
};
