/* net/netif.h — this host's network interfaces, for choosing where a
 * daemon listens: whether an address is loopback, which interface holds an
 * address, which one the kernel routes a destination through. Every call may
 * read the interface list or resolve names: use them at start-up. */
#ifndef TD_NETIF_H
#define TD_NETIF_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "status.h"

#define TD_NETIF_NAME_MAX 16   /* IFNAMSIZ */

/* 127.0.0.0/8, ::1 or an IPv4-mapped 127.x address. */
bool td_netif_addr_is_loopback(const struct sockaddr *sa);

/* Whether a listener on host ("" = every address) is reachable from this
 * host only: every address host resolves to is loopback. A name that does
 * not resolve is logged and returned. */
td_status_t td_netif_host_is_loopback(const char *host, bool *out);

/* The interface named spec, or the one that holds the address spec (an IPv4
 * or IPv6 literal); TD_ERR_NOT_FOUND when this host has neither. Not logged. */
td_status_t td_netif_find(const char *spec, char *name, size_t len);

/* The interface the kernel sends to sa through (the one holding the source
 * address it picks); sa unreachable or that address on no interface:
 * TD_ERR_NOT_FOUND. Not logged. No packet is sent. */
td_status_t td_netif_route(const struct sockaddr *sa, socklen_t salen, char *name, size_t len);

/* The loopback interface ("lo" on Linux); TD_ERR_NOT_FOUND without one. */
td_status_t td_netif_loopback(char *name, size_t len);

#endif
