/* tandemctl/cmd-config.c — `config`: the router's effective configuration,
 * printed as `key = value` lines (the config file syntax). */
#include "tandemctl.h"

/* GET /admin/config → {"config": {"key": value, ...}} (or the object itself) */
static td_status_t
config_render(tdctl_t *ctl, const json_t *ans)
{
    const json_t *cfg = json_object_get(ans, "config");
    const char *key;
    const json_t *v;

    if (!json_is_object(cfg))
        cfg = ans;
    json_object_foreach((json_t *)cfg, key, v) {
        char buf[512];
        tdctl_out_cell(ctl, cfg, key, "config", buf, sizeof(buf));
        printf("%s = %s\n", key, buf);
    }
    return TD_OK;
}

static td_status_t
cmd_config_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_get(ctl, "/admin/config", "config", config_render);
}

const tdctl_cmd_entry_t tdctl_cmd_config_entry = {
    .name = "config", .args = "", .nargs = 0, .exec = cmd_config_exec,
    .help = "the router's effective configuration, as config file lines",
};
