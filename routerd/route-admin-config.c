/* routerd/route-admin-config.c — GET /admin/config: the effective
 * configuration through the option table, as the config file writes it;
 * paths to secrets and keys are redacted. */
#include "router.h"
#include "route.h"

#include <jansson.h>
#include <string.h>

static bool
is_secret(const char *name)
{
    static const char *const secret[] = { "secret-file", "api-keys-file", "admin-key-file" };

    for (size_t i = 0; i < sizeof secret / sizeof secret[0]; i++)
        if (strcmp(name, secret[i]) == 0)
            return true;
    return false;
}

void
td_route_admin_config(td_http_req_t *req, void *router)
{
    td_router_t *r = router;
    json_t *obj = json_object();

    for (const td_config_opt_t *o = r->table; obj && o->name; o++) {
        char buf[1024];
        if (is_secret(o->name))
            snprintf(buf, sizeof buf, "(redacted)");
        else if (o->type == TD_CONFIG_STRING)   /* as is, without the file's quotes */
            snprintf(buf, sizeof buf, "%s", *(char *const *)((const char *)r->cfg + o->offset));
        else if (td_config_format(o, r->cfg, buf, sizeof buf) >= sizeof buf)
            snprintf(buf, sizeof buf, "(too long to show)");
        json_object_set_new(obj, o->name, json_string(buf));
    }
    td_http_reply_json(req, 200, obj ? json_pack("{s:o}", "config", obj) : NULL);
}
