/* common/net.h — TCP socket helpers for the control plane: "host:port"
 * parsing, listening on a (possibly OS-chosen) port, non-blocking connect and
 * socket options. errno is converted to td_status_t here, once. */
#ifndef TD_NET_H
#define TD_NET_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define TD_NET_HOST_MAX 256   /* buffer size for a host name or literal */

/* Split "host:port", "[v6addr]:port" or ":port" (host "" = any address) into
 * host and port. Port 0 is allowed (the OS picks one when listening). */
td_status_t td_net_addr_parse(const char *hostport, char *host, size_t host_len,
                              uint16_t *port);

/* Bind and listen on host:port (host NULL or "" = all addresses, port 0 = any
 * free port); the socket is non-blocking and close-on-exec, SO_REUSEADDR set.
 * On success *fd_out is the listening socket (caller closes) and *port_out
 * the port actually bound. Resolves host with getaddrinfo (may block). */
td_status_t td_net_listen(const char *host, uint16_t port, int backlog,
                          int *fd_out, uint16_t *port_out);

/* Start a non-blocking connect to host:port. On success *fd_out is the socket
 * (caller closes) and the result is TD_OK (already connected) or
 * TD_INPROGRESS (completion shows as writability; check td_net_connect_result). */
td_status_t td_net_connect(const char *host, uint16_t port, int *fd_out);

/* After writability: TD_OK when the pending connect succeeded, else why not. */
td_status_t td_net_connect_result(int fd);

td_status_t td_net_set_nonblock(int fd);
td_status_t td_net_set_cloexec(int fd);
td_status_t td_net_set_nodelay(int fd);

/* "ip:port" of the remote end of fd ("?" when unknown) into buf. */
void td_net_peer_name(int fd, char *buf, size_t len);

#endif
