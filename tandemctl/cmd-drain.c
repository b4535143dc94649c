/* tandemctl/cmd-drain.c — `drain NODE` (the router stops choosing the node's
 * ranks; they finish what they have) and `undrain NODE` (reverses it). */
#include "tandemctl.h"

static td_status_t
cmd_drain_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_post(ctl, "drain", "/admin/drain", "node", "node", args[0], "draining");
}

static td_status_t
cmd_undrain_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_post(ctl, "undrain", "/admin/undrain", "node", "node", args[0],
                          "undrained");
}

const tdctl_cmd_entry_t tdctl_cmd_drain_entry = {
    .name = "drain", .args = "NODE", .nargs = 1, .exec = cmd_drain_exec,
    .help = "stop sending new requests to NODE's ranks; running ones finish",
    .details = "The router sends the node's ranks Drain: they refuse new work and report\n"
               "themselves draining (to every router). `undrain NODE` reverses it.\n",
};

const tdctl_cmd_entry_t tdctl_cmd_undrain_entry = {
    .name = "undrain", .args = "NODE", .nargs = 1, .exec = cmd_undrain_exec,
    .help = "let the router choose NODE's ranks again",
};
