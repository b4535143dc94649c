/* common/net.c — TCP socket helpers: address parsing, listen, non-blocking
 * connect, socket options. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

td_status_t
td_net_addr_parse(const char *hostport, char *host, size_t host_len, uint16_t *port)
{
    const char *colon, *hs = hostport, *he;
    char *end;
    unsigned long p;

    if (hostport == NULL)
        return TD_ERR_INVALID;
    if (hostport[0] == '[') {
        hs = hostport + 1;
        he = strchr(hs, ']');
        if (he == NULL || he[1] != ':') {
            td_error("net: bad address \"%s\": expected [v6addr]:port", hostport);
            return TD_ERR_INVALID;
        }
        colon = he + 1;
    } else {
        colon = strrchr(hostport, ':');
        if (colon == NULL || memchr(hostport, ':', (size_t)(colon - hostport))) {
            td_error("net: bad address \"%s\": expected host:port", hostport);
            return TD_ERR_INVALID;
        }
        he = colon;
    }
    errno = 0;
    p = strtoul(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || p > 65535 ||
        colon[1] == '-' || colon[1] == '+') {
        td_error("net: bad port in address \"%s\"", hostport);
        return TD_ERR_INVALID;
    }
    if ((size_t)(he - hs) >= host_len) {
        td_error("net: host in address \"%s\" too long", hostport);
        return TD_ERR_RANGE;
    }
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    *port = (uint16_t)p;
    return TD_OK;
}

/* getaddrinfo for a TCP host:port; host NULL/"" = wildcard (passive). */
static td_status_t
net_resolve(const char *host, uint16_t port, int passive, struct addrinfo **out)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC,
                              .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) };
    char serv[8];
    int rc;

    if (host != NULL && host[0] == '\0')
        host = NULL;
    snprintf(serv, sizeof(serv), "%u", (unsigned)port);
    rc = getaddrinfo(host, serv, &hints, out);
    if (rc != 0) {
        td_error("net: cannot resolve \"%s\": %s", host ? host : "*", gai_strerror(rc));
        return TD_ERR_NOT_FOUND;
    }
    return TD_OK;
}

td_status_t
td_net_listen(const char *host, uint16_t port, int backlog, int *fd_out, uint16_t *port_out)
{
    struct addrinfo *ai, *a;
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    td_status_t st;
    int fd = -1, one = 1, err = 0;

    st = net_resolve(host, port, 1, &ai);
    if (st != TD_OK)
        return st;
    for (a = ai; a != NULL; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        td_error("net: cannot listen on %s:%u: %s", host && host[0] ? host : "*",
                 (unsigned)port, strerror(err));
        return td_status_from_errno(err);
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) {
        err = errno;
        td_error("net: getsockname on listening socket: %s", strerror(err));
        close(fd);
        return td_status_from_errno(err);
    }
    *port_out = ntohs(ss.ss_family == AF_INET6
                          ? ((struct sockaddr_in6 *)&ss)->sin6_port
                          : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return TD_OK;
}

td_status_t
td_net_connect(const char *host, uint16_t port, int *fd_out)
{
    struct addrinfo *ai, *a;
    td_status_t st;
    int fd = -1, err = 0, connected = 0;

    st = net_resolve(host, port, 0, &ai);
    if (st != TD_OK)
        return st;
    for (a = ai; a != NULL; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            connected = 1;
            break;
        }
        if (errno == EINPROGRESS)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        td_error("net: cannot connect to %s:%u: %s", host, (unsigned)port, strerror(err));
        return td_status_from_errno(err);
    }
    (void)td_net_set_nodelay(fd);
    *fd_out = fd;
    return connected ? TD_OK : TD_INPROGRESS;
}

td_status_t
td_net_connect_result(int fd)
{
    int err = 0;
    socklen_t len = sizeof(err);

    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    return td_status_from_errno(err);
}

td_status_t
td_net_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return td_status_from_errno(errno);
    return TD_OK;
}

td_status_t
td_net_set_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFD);

    if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
        return td_status_from_errno(errno);
    return TD_OK;
}

td_status_t
td_net_set_nodelay(int fd)
{
    int one = 1;

    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        return td_status_from_errno(errno);
    return TD_OK;
}

void
td_net_peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    char ip[INET6_ADDRSTRLEN];

    if (getpeername(fd, (struct sockaddr *)&ss, &sslen) != 0) {
        snprintf(buf, len, "?");
        return;
    }
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, (unsigned)ntohs(s6->sin6_port));
    } else if (ss.ss_family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(s4->sin_port));
    } else {
        snprintf(buf, len, "?");
    }
}
