/* tandemctl/cmd.c — what the commands (cmd-*.c) share: the GET-and-print
 * shape of status, requests and config, and the POST {"key": VALUE} shape
 * that drain, undrain, remove and cancel share. */
#include "tandemctl.h"

#include "log.h"

td_status_t
tdctl_cmd_post(tdctl_t *ctl, const char *verb, const char *path, const char *key,
               const char *obj, const char *value, const char *done)
{
    char what[200];
    json_t *ans = NULL;
    json_t *body = json_pack("{s:s}", key, value);

    snprintf(what, sizeof(what), "%s %s %s", verb, obj, value);
    if (body == NULL) {
        td_error("%s: out of memory", what);
        return TD_ERR_NOMEM;
    }
    td_status_t st = tdctl_http_call(ctl, "POST", path, body, what, &ans);
    json_decref(body);
    if (st != TD_OK)
        return st;
    if (ctl->opts.json) {
        tdctl_out_json(ans);
    } else {
        /* The router's word for the outcome ({"status": ...}), else ours. */
        const char *status = json_string_value(json_object_get(ans, "status"));
        printf("%s %s: %s\n", obj, value, status ? status : done);
    }
    json_decref(ans);
    return TD_OK;
}

td_status_t
tdctl_cmd_get(tdctl_t *ctl, const char *path, const char *what, tdctl_render_fn render)
{
    json_t *ans = NULL;
    td_status_t st = tdctl_http_call(ctl, "GET", path, NULL, what, &ans);
    if (st != TD_OK)
        return st;
    if (ctl->opts.json)
        tdctl_out_json(ans);
    else
        st = render(ctl, ans);
    json_decref(ans);
    return st;
}

