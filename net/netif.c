/* net/netif.c — this host's network interfaces (netif.h): loopback
 * addresses, the interface holding an address (getifaddrs), the interface
 * a destination is routed through (a connected UDP socket's source). */
#include "netif.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "net.h"

bool
td_netif_addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

td_status_t
td_netif_host_is_loopback(const char *host, bool *out)
{
    td_net_addrs_t addrs;
    td_status_t st;

    if (host == NULL || host[0] == '\0') {   /* every address */
        *out = false;
        return TD_OK;
    }
    st = td_net_resolve(host, 0, 0, &addrs);   /* logs why not */
    if (st != TD_OK)
        return st;
    for (size_t i = 0; i < addrs.n; i++)
        if (!td_netif_addr_is_loopback((const struct sockaddr *)&addrs.a[i].sa)) {
            *out = false;
            return TD_OK;
        }
    *out = true;
    return TD_OK;
}

/* Whether the interface address ifa is the address a (same family). */
static bool
netif_same_addr(const struct sockaddr *ifa, const struct sockaddr *a)
{
    if (ifa->sa_family != a->sa_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)ifa)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)a)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)ifa)->sin6_addr,
                      &((const struct sockaddr_in6 *)a)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

/* The first interface that matches: by name (name != NULL), by address
 * (addr != NULL) or the loopback one. */
static td_status_t
netif_scan(const char *want_name, const struct sockaddr *addr, bool loopback, char *name,
           size_t len)
{
    struct ifaddrs *ifs, *i;
    td_status_t st = TD_ERR_NOT_FOUND;

    if (getifaddrs(&ifs) != 0)
        return td_status_from_errno(errno);
    for (i = ifs; i != NULL; i = i->ifa_next) {
        bool hit;
        if (want_name != NULL)
            hit = strcmp(i->ifa_name, want_name) == 0;
        else if (addr != NULL)
            hit = i->ifa_addr != NULL && netif_same_addr(i->ifa_addr, addr);
        else
            hit = loopback && (i->ifa_flags & IFF_LOOPBACK) && i->ifa_addr != NULL &&
                  td_netif_addr_is_loopback(i->ifa_addr);
        if (hit && strlen(i->ifa_name) < len) {
            snprintf(name, len, "%s", i->ifa_name);
            st = TD_OK;
            break;
        }
    }
    freeifaddrs(ifs);
    return st;
}

td_status_t
td_netif_find(const char *spec, char *name, size_t len)
{
    struct sockaddr_storage ss = { 0 };
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

    if (netif_scan(spec, NULL, false, name, len) == TD_OK)
        return TD_OK;
    if (inet_pton(AF_INET, spec, &in->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, spec, &in6->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    else
        return TD_ERR_NOT_FOUND;
    return netif_scan(NULL, (const struct sockaddr *)&ss, false, name, len);
}

td_status_t
td_netif_route(const struct sockaddr *sa, socklen_t salen, char *name, size_t len)
{
    struct sockaddr_storage dst, src;
    socklen_t srclen = sizeof(src);
    td_status_t st = TD_ERR_NOT_FOUND;
    int fd;

    if (salen > sizeof(dst) || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
        return TD_ERR_INVALID;
    memcpy(&dst, sa, salen);
    /* a connected UDP socket takes the kernel's route and source address;
     * the port only has to be non-zero */
    if (dst.ss_family == AF_INET && ((struct sockaddr_in *)&dst)->sin_port == 0)
        ((struct sockaddr_in *)&dst)->sin_port = htons(9);
    if (dst.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&dst)->sin6_port == 0)
        ((struct sockaddr_in6 *)&dst)->sin6_port = htons(9);
    fd = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return td_status_from_errno(errno);
    if (connect(fd, (struct sockaddr *)&dst, salen) == 0 &&
        getsockname(fd, (struct sockaddr *)&src, &srclen) == 0)
        st = td_netif_addr_is_loopback((struct sockaddr *)&src)
                 ? td_netif_loopback(name, len)
                 : netif_scan(NULL, (struct sockaddr *)&src, false, name, len);
    close(fd);
    return st;
}

td_status_t
td_netif_loopback(char *name, size_t len)
{
    return netif_scan(NULL, NULL, true, name, len);
}
