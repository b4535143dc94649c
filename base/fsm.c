/* base/fsm.c — the checked state transition of fsm.h. */
#include "fsm.h"

#include <stdlib.h>

#include "log.h"

const char *
td_fsm_name(const td_fsm_t *m, unsigned st)
{
    return st < m->nstates && m->names[st] != NULL ? m->names[st] : "?";
}

int
td_fsm_allowed(const td_fsm_t *m, unsigned from, unsigned to)
{
    return from < m->nstates && to < m->nstates && (m->allowed[from] & TD_FSM_BIT(to)) != 0;
}

unsigned
td_fsm_step(const td_fsm_t *m, uint64_t id, unsigned from, unsigned to, const char *why)
{
    if (!td_fsm_allowed(m, from, to)) {
        td_error("%s %016llx: illegal transition %s -> %s%s%s: a bug, aborting", m->what,
                 (unsigned long long)id, td_fsm_name(m, from), td_fsm_name(m, to),
                 why ? ": " : "", why ? why : "");
        abort();
    }
    td_debug("%s %016llx: %s -> %s%s%s", m->what, (unsigned long long)id, td_fsm_name(m, from),
             td_fsm_name(m, to), why ? ": " : "", why ? why : "");
    return to;
}
