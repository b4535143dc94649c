/* routerd/cluster.h — membership: the control listener worker ranks connect
 * to and the table of their nodes and ranks (registration, load, draining,
 * death), DecodePeer news to prefill ranks, the prefill ranks' announced
 * cache blocks (CacheEvent) and admin drain / undrain / remove / cache
 * flush, and the decode domains being assembled (rdomain.h). What concerns requests leaves through the handlers it was given
 * (as net/link.h's do): the cluster knows no request.
 * Ownership: the cluster owns its listener, every node and rank; a rank
 * stays valid until no request is bound to it (td_cluster_rank_release). */
#ifndef TD_ROUTERD_CLUSTER_H
#define TD_ROUTERD_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "ctl.h"
#include "rdomain.h"
#include "rrank.h"
#include "status.h"
#include "tandem.pb-c.h"

struct event_base;

typedef struct td_cluster_s td_cluster_t;

typedef struct {
    /* A message about a request (AdmitOk, AdmitReject, PrefillDone, Tokens,
     * Released) from registered rank rk; env is freed after return. */
    void (*on_message)(td_cluster_t *c, td_rrank_t *rk, const Tandem__Envelope *env, void *arg);
    /* rk's connection ended (it is dead now): let go of it. rk stays valid
     * during the call; the cluster may forget it once nothing is bound. */
    void (*on_rank_lost)(td_cluster_t *c, td_rrank_t *rk, void *arg);
    /* Capacity may have changed: a rank registered or sent a Load, a node
     * was drained or undrained (waiting requests may be placed, or may have
     * no rank left). */
    void (*on_capacity)(td_cluster_t *c, void *arg);
    void *arg;
} td_cluster_handlers_t;

typedef struct {
    td_ctl_config_t ctl;        /* identity, secret, heartbeats, frame cap */
    const char *host;           /* control listener address; port 0: a free one */
    uint16_t port;
    const char *router_id;      /* sent in Registered (copied) */
    size_t cache_max_blocks;    /* cache block hashes kept per prefill rank */
} td_cluster_config_t;

/* Read by the admin and metrics routes; changed only by cluster.c. */
struct td_cluster_s {
    td_cluster_handlers_t h;
    char router_id[96];
    td_ctl_listener_t *lst;
    td_rrank_t *ranks;
    td_rrank_node_t *nodes;
    unsigned hold;      /* > 0: no node is forgotten (a rank is being torn down) */
    size_t cache_max_blocks;
    td_rdomain_table_t *domains;   /* decode domains being assembled (DomainJoin) */
};

/* Start listening (failures are logged where they happen). */
td_status_t td_cluster_init(td_cluster_t *c, struct event_base *base,
                            const td_cluster_config_t *cfg, const td_cluster_handlers_t *h);
void td_cluster_fini(td_cluster_t *c);
uint16_t td_cluster_port(const td_cluster_t *c);

/* Admin: drain / undrain / remove a node (TD_ERR_NOT_FOUND when unknown). */
td_status_t td_cluster_node_drain(td_cluster_t *c, const char *name, bool draining);
td_status_t td_cluster_node_remove(td_cluster_t *c, const char *name);
/* Admin: CacheFlush (reason) to every connected prefill rank of the node
 * that has a prefix cache; *sent: how many got it. TD_ERR_NOT_FOUND when
 * the node is unknown. */
td_status_t td_cluster_node_cache_flush(td_cluster_t *c, const char *name, const char *reason,
                                        unsigned *sent);

/* A request is bound to rk / let go of it; a removed node is forgotten once
 * none of its ranks holds a request. */
void td_cluster_rank_bind(td_cluster_t *c, td_rrank_t *rk);
void td_cluster_rank_release(td_cluster_t *c, td_rrank_t *rk);

#endif
