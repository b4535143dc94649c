/* tandemctl/cmds.c — the command table the CLI walks (one file per command:
 * cmd-*.c) and its lookup by name. */
#include "tandemctl.h"

#include <string.h>

const tdctl_cmd_entry_t *const tdctl_cmds_table[] = {
    &tdctl_cmd_status_entry,
    &tdctl_cmd_drain_entry,
    &tdctl_cmd_undrain_entry,
    &tdctl_cmd_remove_entry,
    &tdctl_cmd_requests_entry,
    &tdctl_cmd_cancel_entry,
    &tdctl_cmd_config_entry,
    &tdctl_cmd_cache_entry,
    &tdctl_cmd_ready_entry,
    NULL,
};

const tdctl_cmd_entry_t *
tdctl_cmds_find(const char *name)
{
    for (size_t i = 0; tdctl_cmds_table[i] != NULL; i++)
        if (strcmp(tdctl_cmds_table[i]->name, name) == 0)
            return tdctl_cmds_table[i];
    return NULL;
}
