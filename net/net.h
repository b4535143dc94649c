/* net/net.h — TCP socket helpers for the control plane: "host:port"
 * parsing, listening on a (possibly OS-chosen) port, non-blocking connect and
 * socket options. errno is converted to td_status_t here, once. */
#ifndef TD_NET_H
#define TD_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "status.h"

#define TD_NET_HOST_MAX  256   /* buffer size for a host name or literal */
#define TD_NET_ADDRS_MAX 8     /* addresses kept from one resolution */

/* One socket address, and the list a resolution yields (tried in order). */
typedef struct {
    struct sockaddr_storage sa;
    socklen_t len;
} td_net_addr_t;

typedef struct {
    size_t n;
    td_net_addr_t a[TD_NET_ADDRS_MAX];
} td_net_addrs_t;

/* Split "host:port", "[v6addr]:port" or ":port" (host "" = any address) into
 * host and port. Port 0 is allowed (the OS picks one when listening). */
td_status_t td_net_addr_parse(const char *hostport, char *host, size_t host_len,
                              uint16_t *port);

/* Resolve host:port to up to TD_NET_ADDRS_MAX TCP addresses (host NULL or ""
 * = loopback). numeric_only: host must be an IPv4/IPv6 literal, and this
 * never blocks (safe on an event loop). Otherwise names are looked up with
 * getaddrinfo, which may block: daemons call it at start-up, before their
 * loops run, and pass the list to td_ctl_conn_connect_addrs(). */
td_status_t td_net_resolve(const char *host, uint16_t port, int numeric_only,
                           td_net_addrs_t *out);

/* Bind and listen on host:port (port 0 = any free port). Host NULL or "" =
 * all addresses: [::] with IPV6_V6ONLY off (IPv4 and IPv6), or 0.0.0.0 where
 * IPv6 is unavailable. The socket is non-blocking and close-on-exec,
 * SO_REUSEADDR set. On success *fd_out is the listening socket (caller
 * closes) and *port_out the port actually bound. Resolves a host name with
 * getaddrinfo (may block: listen at start-up). */
td_status_t td_net_listen(const char *host, uint16_t port, int backlog,
                          int *fd_out, uint16_t *port_out);

/* Start a non-blocking connect to the first of addrs->a[*next..] that can be
 * started; *next moves past every address tried, so after an asynchronous
 * failure (td_net_connect_result) calling again tries the following one.
 * On success *fd_out is the socket (caller closes) and the result is TD_OK
 * (already connected) or TD_INPROGRESS (completion shows as writability);
 * otherwise the error of the last address tried (TD_ERR_NOT_FOUND when none
 * was left). */
td_status_t td_net_connect(const td_net_addrs_t *addrs, size_t *next, int *fd_out);

/* After writability: TD_OK when the pending connect succeeded, else why not. */
td_status_t td_net_connect_result(int fd);

/* "ip:port" or "[v6]:port" of addr into buf (IPv4-mapped IPv6 as IPv4). */
void td_net_addr_str(const td_net_addr_t *addr, char *buf, size_t len);

td_status_t td_net_set_nodelay(int fd);

/* "ip:port" of the remote end of fd ("?" when unknown) into buf. */
void td_net_peer_name(int fd, char *buf, size_t len);

#endif
