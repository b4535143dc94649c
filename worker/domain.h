/* worker/domain.h — a DEP domain across worker processes (decoded
 * --domain-size): each rank's communicator over UCX, the ranks' addresses
 * exchanged through a router (DomainJoin / DomainPeers, net/domjoin.h) or
 * through a directory (DIR/ID.addr.RANK, written whole by rename, a header
 * line naming the writer, then the address).
 * docs/dep.md, "A domain across processes". */
#ifndef TD_WORKER_DOMAIN_H
#define TD_WORKER_DOMAIN_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "ctl.h"
#include "ucx.h"
#include "xfer.h"

struct event_base;

typedef struct {
    const char *id;         /* names the domain (and its files) */
    const char *dir;        /* where every process of the domain reads and writes them;
                               NULL or "": the exchange goes through a router */
    uint32_t size;          /* ranks in the domain */
    uint64_t wait_ms;       /* for the other ranks' addresses, then their handshake */
    const char *routers;    /* without dir: "host:port[,...]" (td_domjoin_run) */
    const td_ctl_config_t *ctl;   /* without dir: the Hello identity and secret; the
                               role and rank_id are set here (tool, the domain rank) */
} td_worker_domain_t;

/* One rank's communicator and what it runs on (owned together). */
typedef struct {
    struct event_base *base;
    td_xfer_t *x;
    td_comm_t *comm;
    char path[4200];        /* its address file, removed by destroy; "": none */
} td_worker_domain_comm_t;

/* Rank `rank` of domain d: its own transfer engine (xc) on its own event
 * base; its address joined at a router and every rank's from there
 * (td_domjoin_run), or, with a dir, its address in DIR/ID.addr.RANK and
 * every other rank's read from there (waiting up to d->wait_ms); the UCX
 * communicator. Blocks until every rank
 * has answered or the wait is over (TD_ERR_TIMEOUT). Logged. */
td_status_t td_worker_domain_create(const td_worker_domain_t *d, uint32_t rank,
                                    const td_xfer_config_t *xc, const td_comm_opts_t *opts,
                                    td_worker_domain_comm_t *out);
/* The communicator, then its engine and base, and its address file (a
 * zeroed one: nothing). A process killed leaves its files; each names its
 * writer (pid, start time, boot id, host), and create ignores a file whose
 * writer ran on this host and is gone, so a domain restarts in the same
 * directory under the same id. */
void td_worker_domain_destroy(td_worker_domain_comm_t *dc);
/* Remove the rank's address file now (if it is still this process's), so
 * that a restarted domain does not find this broken one's address; the
 * communicator stays. Done when the domain breaks, and by destroy. */
void td_worker_domain_withdraw(td_worker_domain_comm_t *dc);
/* DIR/ID.addr.RANK. */
void td_worker_domain_path(const td_worker_domain_t *d, uint32_t rank, char *out, size_t len);

#endif
