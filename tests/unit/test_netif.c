/* tests/unit/test_netif.c — net/netif.c: which addresses are loopback,
 * which hosts resolve to loopback only, and finding the loopback interface by
 * name, by address and by route. */
#include "check.h"
#include "netif.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

static void
test_addr_is_loopback(void)
{
    static const struct {
        const char *addr;
        bool loopback;
    } cases[] = {
        { "127.0.0.1", true },  { "127.1.2.3", true },   { "::1", true },
        { "::ffff:127.0.0.1", true }, { "0.0.0.0", false }, { "::", false },
        { "192.0.2.7", false }, { "128.0.0.1", false },  { "fd00::1", false },
        { "::ffff:10.0.0.1", false },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sockaddr_storage ss = { 0 };
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        if (inet_pton(AF_INET, cases[i].addr, &in->sin_addr) == 1) {
            ss.ss_family = AF_INET;
        } else {
            CHECK(inet_pton(AF_INET6, cases[i].addr, &in6->sin6_addr) == 1);
            ss.ss_family = AF_INET6;
        }
        if (td_netif_addr_is_loopback((struct sockaddr *)&ss) != cases[i].loopback) {
            fprintf(stderr, "%s: loopback should be %d\n", cases[i].addr, cases[i].loopback);
            td_check_failures++;
        }
    }
}

static void
test_host_is_loopback(void)
{
    static const struct {
        const char *host;
        bool loopback;
    } cases[] = {
        { "127.0.0.1", true }, { "::1", true }, { "localhost", true },
        { "", false },         { "0.0.0.0", false }, { "::", false },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool lo = !cases[i].loopback;
        CHECK_STATUS(td_netif_host_is_loopback(cases[i].host, &lo), TD_OK);
        if (lo != cases[i].loopback) {
            fprintf(stderr, "host \"%s\": loopback should be %d\n", cases[i].host,
                    cases[i].loopback);
            td_check_failures++;
        }
    }
}

static void
test_find(void)
{
    char lo[TD_NETIF_NAME_MAX], name[TD_NETIF_NAME_MAX];
    struct sockaddr_in dst = { .sin_family = AF_INET };

    CHECK_STATUS(td_netif_loopback(lo, sizeof(lo)), TD_OK);
    CHECK(lo[0] != '\0');
    CHECK_STATUS(td_netif_find(lo, name, sizeof(name)), TD_OK);   /* by name */
    CHECK_STR(name, lo);
    name[0] = '\0';
    CHECK_STATUS(td_netif_find("127.0.0.1", name, sizeof(name)), TD_OK);   /* by address */
    CHECK_STR(name, lo);
    CHECK_STATUS(td_netif_find("no-such-if0", name, sizeof(name)), TD_ERR_NOT_FOUND);
    CHECK_STATUS(td_netif_find("192.0.2.254", name, sizeof(name)), TD_ERR_NOT_FOUND);
    name[0] = '\0';
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    CHECK_STATUS(td_netif_route((struct sockaddr *)&dst, sizeof(dst), name, sizeof(name)), TD_OK);
    CHECK_STR(name, lo);
}

int
main(void)
{
    test_addr_is_loopback();
    test_host_is_loopback();
    test_find();
    return td_check_exit("test_netif");
}
