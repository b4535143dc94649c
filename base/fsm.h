/* base/fsm.h — the one transition check of every state machine in the
 * daemons (routerd's, prefilld's and decoded's requests): a table of allowed
 * transitions and names, each change logged, and an illegal transition
 * treated as the bug it is — logged and aborted, in release builds too
 * (docs/design.md, "State machines"). Input from a peer never reaches here
 * unchecked: callers test the state first and answer a message that does not
 * fit it with an error. */
#ifndef TD_FSM_H
#define TD_FSM_H

#include <stdint.h>

/* A machine's description, usually a static const. */
typedef struct {
    const char *what;            /* "decode request": names the object in logs */
    const char *const *names;    /* [nstates] */
    const uint32_t *allowed;     /* [nstates]: bit `to` set when from -> to is allowed */
    unsigned nstates;            /* at most 32 */
} td_fsm_t;

#define TD_FSM_BIT(s) (1u << (s))

/* The name of state st ("?" outside the table). */
const char *td_fsm_name(const td_fsm_t *m, unsigned st);

/* Whether from -> to is allowed. */
int td_fsm_allowed(const td_fsm_t *m, unsigned from, unsigned to);

/* The checked transition of object id from `from` to `to`: logs it at debug
 * level with why (may be NULL) and returns to; an illegal transition is logged
 * as an error and aborts the process. */
unsigned td_fsm_step(const td_fsm_t *m, uint64_t id, unsigned from, unsigned to,
                     const char *why);

#endif
