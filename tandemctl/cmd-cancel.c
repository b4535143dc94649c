/* tandemctl/cmd-cancel.c — `cancel ID`: the router cancels one request (as a
 * client disconnect would); its KV blocks return once the peers are done. */
#include "tandemctl.h"

static td_status_t
cmd_cancel_exec(tdctl_t *ctl, char **args)
{
    return tdctl_cmd_post(ctl, "cancel", "/admin/cancel", "id", "request", args[0], "canceled");
}

const tdctl_cmd_entry_t tdctl_cmd_cancel_entry = {
    .name = "cancel", .args = "ID", .nargs = 1, .exec = cmd_cancel_exec,
    .help = "cancel request ID (see `requests`)",
    .details = "ID is the 16-hex-digit id `tandemctl requests` shows. The client gets an\n"
               "error (code \"canceled\"); the ranks free the request's blocks.\n",
};
