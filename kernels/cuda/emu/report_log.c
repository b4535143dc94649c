/* kernels/cuda/emu/report_log.c — the SIMT emulation's reports go to td_base's
 * log from here: log.h is C (stdatomic.h), the emulation C++. */
#include "simt_emu.h"

#include "log.h"

void
td_simt_log_error(const char *line)
{
    td_error("%s", line);
}
