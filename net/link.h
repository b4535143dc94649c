/* net/link.h — a worker rank's links to its routers: one control
 * connection per configured router, reconnected with backoff; Register is
 * sent each time one is established, Load on change (coalesced to at most one
 * per 50 ms) and at least once per heartbeat interval. Messages from any
 * router reach one handler together with the router they came from, so that
 * replies (Tokens, PrefillDone, Released) go back to the router that owns the
 * request. Everything runs on the rank's loop thread.
 * Ownership: the link owns its connections and its copy of the config; a
 * td_link_router_t lives until on_down returns (do not keep it after). */
#ifndef TD_LINK_H
#define TD_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "ctl.h"
#include "status.h"
#include "tandem.pb-c.h"

struct event_base;

typedef struct td_link_s td_link_t;
typedef struct td_link_router_s td_link_router_t;  /* one router connection */

typedef struct {
    /* Registered{} received from this router: it will send work now. */
    void (*on_up)(td_link_t *l, td_link_router_t *r, void *arg);
    /* One message other than Registered (Admit, Prefill, Cancel, Drain,
     * DecodePeer, ...); env is freed after return. */
    void (*on_message)(td_link_t *l, td_link_router_t *r, const Tandem__Envelope *env,
                       void *arg);
    /* The connection to this router ended (after on_up, or a failed attempt
     * never reaches here); the link reconnects by itself. */
    void (*on_down)(td_link_t *l, td_link_router_t *r, td_status_t why, void *arg);
    void *arg;
} td_link_handlers_t;

typedef struct {
    td_ctl_config_t ctl;          /* identity, secret, heartbeats (copied) */
    const char *routers;          /* "host:port[,host:port...]" (names resolved at create) */
    uint32_t backoff_min_ms;      /* first retry delay; 0 = 100 */
    uint32_t backoff_max_ms;      /* cap; 0 = 2000 */
} td_link_config_t;

/* Resolve every router address (a bad one: TD_ERR_INVALID, logged) and start
 * connecting. reg is packed now and re-sent on every (re)connection; it is
 * not referenced after the call. */
td_status_t td_link_create(struct event_base *base, const td_link_config_t *cfg,
                           const Tandem__Register *reg, const td_link_handlers_t *h,
                           td_link_t **out);
void td_link_destroy(td_link_t *l);

/* Replace what Register says (e.g. draining changed); sent to every router. */
td_status_t td_link_set_register(td_link_t *l, const Tandem__Register *reg);

/* Send to one router; TD_ERR_STATE when that router is not up. */
td_status_t td_link_send(td_link_t *l, td_link_router_t *r, const Tandem__Envelope *env);

/* Send to every router that is up; how many took it. */
size_t td_link_broadcast(td_link_t *l, const Tandem__Envelope *env);

/* Publish the current load to every router that is up (coalesced). */
void td_link_load(td_link_t *l, const Tandem__Load *load);

/* The network interface this host reaches routers ("host:port[,...]", as
 * td_link_create takes them) through: the loopback one when every router
 * resolves to loopback only, else the one the kernel routes the first
 * router's first address through. A bad list: TD_ERR_INVALID, logged; no
 * such interface: TD_ERR_NOT_FOUND, not logged. May resolve names: start-up. */
td_status_t td_link_routers_netif(const char *routers, char *ifname, size_t len);

/* One router of a list as td_link_create takes it: "host:port" and its
 * resolved addresses. */
typedef struct {
    char name[TD_NET_HOST_MAX + 8];
    td_net_addrs_t addrs;
} td_link_addr_t;

/* Parse and resolve "host:port[,host:port...]" as td_link_create does:
 * *out (the caller frees it) holds *n routers, in the list's order. A bad
 * list: TD_ERR_INVALID, logged. May resolve names: start-up. */
td_status_t td_link_routers_resolve(const char *routers, td_link_addr_t **out, size_t *n);

/* "host:port" of the router, for logs. */
const char *td_link_router_name(const td_link_router_t *r);
size_t td_link_routers_up(const td_link_t *l);

#endif
