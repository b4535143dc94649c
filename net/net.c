/* net/net.c — TCP socket helpers: address parsing, listen, non-blocking
 * connect, socket options. */
#include "net.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
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
    /* A digit first: strtoul would skip spaces and take a sign. */
    if (!isdigit((unsigned char)colon[1]) || *end != '\0' || errno != 0 || p > 65535) {
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

td_status_t
td_net_resolve(const char *host, uint16_t port, int numeric_only, td_net_addrs_t *out)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC,
                              .ai_flags = AI_NUMERICSERV | (numeric_only ? AI_NUMERICHOST : 0) };
    struct addrinfo *ai, *a;
    td_net_addrs_t addrs = { 0 };
    const char *shown;
    char serv[8];
    int rc;

    if (host != NULL && host[0] == '\0')
        host = NULL;
    shown = host ? host : "localhost";   /* getaddrinfo's meaning of NULL */
    snprintf(serv, sizeof(serv), "%u", (unsigned)port);
    rc = getaddrinfo(host, serv, &hints, &ai);
    if (rc == EAI_NONAME && numeric_only) {
        td_error("net: \"%s\": host must be an address; resolve names before starting "
                 "the loop (td_net_resolve)", shown);
        return TD_ERR_INVALID;
    }
    if (rc != 0) {
        td_error("net: cannot resolve \"%s\": %s", shown, gai_strerror(rc));
        return TD_ERR_NOT_FOUND;
    }
    for (a = ai; a != NULL && addrs.n < TD_NET_ADDRS_MAX; a = a->ai_next) {
        if (a->ai_addrlen > sizeof(addrs.a[0].sa))
            continue;
        memcpy(&addrs.a[addrs.n].sa, a->ai_addr, a->ai_addrlen);
        addrs.a[addrs.n++].len = a->ai_addrlen;
    }
    freeaddrinfo(ai);
    if (addrs.n == 0) {
        td_error("net: \"%s\" has no usable address", shown);
        return TD_ERR_NOT_FOUND;
    }
    *out = addrs;
    return TD_OK;
}

/* What to do with a fresh socket for one address: 0 when it worked, else errno. */
typedef int (*net_attempt_fn)(int fd, const td_net_addr_t *a, void *arg);

/* For each of addrs->a[*next..]: open a non-blocking close-on-exec TCP socket
 * and run attempt on it. Returns the fd of the first success (*next is past
 * it), or -1 with *err = the last errno when no address is left. */
static int
net_try_each(const td_net_addrs_t *addrs, size_t *next, net_attempt_fn attempt, void *arg,
             int *err)
{
    *err = ENOENT;
    while (*next < addrs->n) {
        const td_net_addr_t *a = &addrs->a[(*next)++];
        int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

        if (fd < 0) {
            *err = errno;
            continue;
        }
        *err = attempt(fd, a, arg);
        if (*err == 0)
            return fd;
        close(fd);
    }
    return -1;
}

static int
net_listen_attempt(int fd, const td_net_addr_t *a, void *arg)
{
    int one = 1, zero = 0;

    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* [::] serves IPv4 too, whatever net.ipv6.bindv6only says. */
    if (a->sa.ss_family == AF_INET6)
        (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, (const struct sockaddr *)&a->sa, a->len) != 0 ||
        listen(fd, *(const int *)arg) != 0)
        return errno;
    return 0;
}

static int
net_connect_attempt(int fd, const td_net_addr_t *a, void *arg)
{
    if (connect(fd, (const struct sockaddr *)&a->sa, a->len) == 0)
        *(int *)arg = 1;
    else if (errno != EINPROGRESS)
        return errno;
    return 0;
}

/* [::]:port, then 0.0.0.0:port for hosts without IPv6. */
static void
net_wildcard(uint16_t port, td_net_addrs_t *out)
{
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&out->a[0].sa;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&out->a[1].sa;

    memset(out, 0, sizeof(*out));
    s6->sin6_family = AF_INET6;
    s6->sin6_addr = in6addr_any;
    s6->sin6_port = htons(port);
    out->a[0].len = sizeof(*s6);
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_ANY);
    s4->sin_port = htons(port);
    out->a[1].len = sizeof(*s4);
    out->n = 2;
}

static uint16_t
net_addr_port(const struct sockaddr_storage *ss)
{
    return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
                                           : ((const struct sockaddr_in *)ss)->sin_port);
}

td_status_t
td_net_listen(const char *host, uint16_t port, int backlog, int *fd_out, uint16_t *port_out)
{
    td_net_addrs_t addrs;
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    size_t next = 0;
    int fd, err;

    if (host == NULL || host[0] == '\0') {
        host = "*";
        net_wildcard(port, &addrs);
    } else {
        td_status_t st = td_net_resolve(host, port, 0, &addrs);

        if (st != TD_OK)
            return st;
    }
    fd = net_try_each(&addrs, &next, net_listen_attempt, &backlog, &err);
    if (fd < 0) {
        td_error("net: cannot listen on %s:%u: %s", host, (unsigned)port, strerror(err));
        return td_status_from_errno(err);
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) {
        err = errno;
        td_error("net: getsockname on listening socket: %s", strerror(err));
        close(fd);
        return td_status_from_errno(err);
    }
    *port_out = net_addr_port(&ss);
    *fd_out = fd;
    return TD_OK;
}

td_status_t
td_net_connect(const td_net_addrs_t *addrs, size_t *next, int *fd_out)
{
    char name[INET6_ADDRSTRLEN + 8] = "(no address)";
    int fd, err, connected = 0;

    fd = net_try_each(addrs, next, net_connect_attempt, &connected, &err);
    if (fd < 0) {
        if (*next > 0)
            td_net_addr_str(&addrs->a[*next - 1], name, sizeof(name));
        td_debug("net: cannot connect to %s: %s", name, strerror(err)); /* the caller retries and logs */
        return err == ENOENT ? TD_ERR_NOT_FOUND : td_status_from_errno(err);
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
td_net_set_nodelay(int fd)
{
    int one = 1;

    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        return td_status_from_errno(errno);
    return TD_OK;
}

void
td_net_addr_str(const td_net_addr_t *addr, char *buf, size_t len)
{
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&addr->sa;
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)&addr->sa;
    char ip[INET6_ADDRSTRLEN];

    if (addr->sa.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
        inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(s6->sin6_port));
    } else if (addr->sa.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, (unsigned)ntohs(s6->sin6_port));
    } else if (addr->sa.ss_family == AF_INET) {
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(s4->sin_port));
    } else {
        snprintf(buf, len, "?");
    }
}

void
td_net_peer_name(int fd, char *buf, size_t len)
{
    td_net_addr_t a;

    a.len = sizeof(a.sa);
    if (getpeername(fd, (struct sockaddr *)&a.sa, &a.len) != 0) {
        snprintf(buf, len, "?");
        return;
    }
    td_net_addr_str(&a, buf, len);
}
