/* net/domjoin.h — a decode domain's address exchange through a router
 * (docs/dep.md, "A domain across processes"; docs/control-plane.md): the
 * bounds of DomainJoin and DomainPeers and their checks, used by both ends,
 * and the client a domain rank runs before it builds its communicator: a
 * control connection of its own to a router, DomainJoin, then the wait for
 * every rank's address (DomainPeers). */
#ifndef TD_DOMJOIN_H
#define TD_DOMJOIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl.h"
#include "status.h"
#include "tandem.pb-c.h"

#define TD_DOMJOIN_SIZE_MAX 256u    /* ranks in a domain */
#define TD_DOMJOIN_ADDR_MAX 8192u   /* bytes of one rank's address */
#define TD_DOMJOIN_ID_MAX   64u     /* bytes of a domain id (printable) */

/* Whether a DomainJoin holds: an id of 1..64 printable bytes, a size of
 * 1..256, a rank below it, an address of 1..8192 bytes; why not in why. */
bool td_domjoin_valid(const Tandem__DomainJoin *j, const char **why);

typedef struct {
    const char *routers;    /* "host:port[,...]": tried in order, the first
                               that takes the join is used (see td_domjoin_run) */
    td_ctl_config_t ctl;    /* Hello identity (role ROLE_TOOL, rank_id the domain
                               rank, the process's incarnation), secret */
    const char *id;         /* the domain */
    uint32_t size;          /* its ranks */
    uint32_t rank;          /* this one */
    uint64_t wait_ms;       /* for every rank's address, from the call */
} td_domjoin_config_t;

/* Join the domain with this rank's address (len bytes) and wait until the
 * router sends every rank's: then addrs[r] (len lens[r], malloc'ed, the
 * caller frees each) for every r < size. Set only on TD_OK. The routers are
 * tried in the list's order: the first whose handshake completes takes the
 * join, and the rank waits there (so every rank of a domain meets at the
 * first router all of them reach); a router lost while waiting: the list
 * again from its start. Blocks up to wait_ms on an event base of its own.
 * TD_ERR_TIMEOUT; TD_ERR_PEER: the router refused the join (DomainRefused);
 * TD_ERR_UNSUPPORTED: the router closed the connection on the join (a
 * routerd that does not know DomainJoin); TD_ERR_PROTO: a malformed
 * DomainPeers. Logged here. */
td_status_t td_domjoin_run(const td_domjoin_config_t *cfg, const void *addr, size_t len,
                           void **addrs, size_t *lens);

#endif
