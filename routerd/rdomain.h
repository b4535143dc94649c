/* routerd/rdomain.h — the decode domains being assembled through this router
 * (docs/dep.md, "A domain across processes"): per domain id, the ranks that
 * joined (DomainJoin) on a live control connection, each with its address;
 * once every rank of an id joined, each gets the same DomainPeers and the id
 * is forgotten. A connection that ends takes its join with it.
 * Ownership: the table owns its copies of the addresses; it never owns a
 * connection (the listener does: cluster.c tells it when one ends). */
#ifndef TD_ROUTERD_RDOMAIN_H
#define TD_ROUTERD_RDOMAIN_H

#include <stddef.h>
#include <stdint.h>

#include "ctl.h"
#include "status.h"
#include "tandem.pb-c.h"

#define TD_RDOMAIN_HELD_MAX 4096u   /* joins held at once, over every id */

typedef struct td_rdomain_table_s td_rdomain_table_t;

td_status_t td_rdomain_table_create(td_rdomain_table_t **out);
/* Frees the joins; touches no connection. NULL: nothing. */
void td_rdomain_table_destroy(td_rdomain_table_t *t);

/* A DomainJoin on conn (an established connection). Held, or refused: a
 * malformed join, an incarnation other than the connection's Hello, a second
 * join on one connection, a size other than the id's other joins', a rank
 * held by another (live) connection, the table full: logged, DomainRefused
 * with the reason, then the connection closed (td_ctl_conn_close: its
 * on_closed may run before this returns). The join that makes the domain
 * whole sends every member DomainPeers. */
void td_rdomain_join(td_rdomain_table_t *t, td_ctl_conn_t *conn, const Tandem__DomainJoin *j);

/* conn ended: its join, if it has one, goes (logged). */
void td_rdomain_conn_gone(td_rdomain_table_t *t, const td_ctl_conn_t *conn);

/* Joins held now, over every id; domains assembled since the start. */
size_t td_rdomain_held(const td_rdomain_table_t *t);
uint64_t td_rdomain_rounds(const td_rdomain_table_t *t);

#endif
