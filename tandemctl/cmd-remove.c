/* tandemctl/cmd-remove.c — `remove NODE`: the router drains the node, then
 * forgets it once nothing is in flight there. */
#include "tandemctl.h"

static td_status_t
cmd_remove_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_post(ctl, "remove", "/admin/remove", "node", "node", args[0], "removing");
}

const tdctl_cmd_entry_t tdctl_cmd_remove_entry = {
    .name = "remove", .args = "NODE", .nargs = 1, .exec = cmd_remove_exec,
    .help = "drain NODE, then forget it once nothing is in flight there",
    .details = "The router stops choosing NODE's ranks at once. Once none of them holds a\n"
               "request of this router, it lifts the drain, closes their connections and\n"
               "forgets the node. A worker that is still running registers again, as a\n"
               "new node that takes requests (as after a restart); to keep it out, stop\n"
               "its daemon. Removing a node whose ranks are dead forgets it at once.\n",
};
