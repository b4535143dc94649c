/* tests/unit/test_domjoin.c — net/domjoin.c: which DomainJoins hold (the
 * bounds both ends apply), and the client against a stand-in router on a
 * thread: every rank's address taken, a malformed DomainPeers, a refusal,
 * a router that closes the connection on the join (an older routerd), no
 * answer before the deadline, and an unreachable first router skipped. */
#include "check.h"
#include "domjoin.h"
#include "log.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

static void
test_valid(void)
{
    static char id65[66];
    static uint8_t big[TD_DOMJOIN_ADDR_MAX + 1];
    static const struct {
        const char *id;
        uint32_t size, rank;
        size_t addr_len;
        const char *why;   /* NULL: valid */
    } cases[] = {
        { "d0", 2, 1, 10, NULL },
        { "d0", 256, 255, TD_DOMJOIN_ADDR_MAX, NULL },
        { id65 + 1, 1, 0, 1, NULL },            /* 64 bytes */
        { id65, 1, 0, 1, "domain id" },         /* 65 bytes */
        { "", 2, 0, 10, "domain id" },
        { "d\x01", 2, 0, 10, "domain id" },
        { "d0", 0, 0, 10, "domain size" },
        { "d0", 257, 0, 10, "domain size" },
        { "d0", 2, 2, 10, "rank outside" },
        { "d0", 2, 0, 0, "address" },
        { "d0", 2, 0, TD_DOMJOIN_ADDR_MAX + 1, "address" },
    };

    memset(id65, 'x', 65);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Tandem__DomainJoin j = TANDEM__DOMAIN_JOIN__INIT;
        const char *why = NULL;
        j.domain_id = (char *)cases[i].id;
        j.size = cases[i].size;
        j.rank = cases[i].rank;
        j.address = (ProtobufCBinaryData){ cases[i].addr_len, big };
        bool ok = td_domjoin_valid(&j, &why);
        CHECK(ok == (cases[i].why == NULL));
        if (!ok && cases[i].why != NULL)
            CHECK(why != NULL && strstr(why, cases[i].why) != NULL);
    }
}

/* ---- A stand-in router -------------------------------------------------------- */

typedef enum { R_PEERS, R_PEERS_BAD, R_REFUSE, R_REJECT, R_SILENT } router_mode_t;

static router_mode_t mode;
static const uint8_t secret[] = "domjoin-test-secret";
static struct event_base *rbase;

static td_ctl_config_t
cfg_for(Tandem__Role role, uint64_t incarnation, uint32_t rank)
{
    td_ctl_config_t c = { .secret = secret, .secret_len = sizeof(secret) - 1 };
    c.ident = (td_hello_ident_t){ TD_HELLO_PROTOCOL_VERSION, role, "test", rank, incarnation,
                                  "fp", 7 };
    return c;
}

/* Answers a join of rank 0 of a domain of 2 as the mode says; rank 1's
 * address is "B". */
static void
router_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    const Tandem__DomainJoin *j = env->domain_join;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
    Tandem__DomainPeers p = TANDEM__DOMAIN_PEERS__INIT;
    Tandem__DomainRefused r = TANDEM__DOMAIN_REFUSED__INIT;
    ProtobufCBinaryData addrs[2];
    uint64_t incs[2];

    (void)arg;
    if (env->payload_case != TANDEM__ENVELOPE__PAYLOAD_DOMAIN_JOIN)
        return;
    switch (mode) {
    case R_PEERS:
    case R_PEERS_BAD:
        addrs[0] = j->address;
        addrs[1] = (ProtobufCBinaryData){ 1, (uint8_t *)"B" };
        incs[0] = j->incarnation;
        incs[1] = 99;
        p.domain_id = j->domain_id;
        p.size = mode == R_PEERS ? j->size : j->size + 1;
        p.n_addresses = p.n_incarnations = 2;
        p.addresses = addrs;
        p.incarnations = incs;
        p.round = 1;
        out.payload_case = TANDEM__ENVELOPE__PAYLOAD_DOMAIN_PEERS;
        out.domain_peers = &p;
        CHECK_STATUS(td_ctl_conn_send(conn, &out), TD_OK);
        break;
    case R_REFUSE:
        r.domain_id = j->domain_id;
        r.reason = "size 2, but the domain's other joins say 3";
        out.payload_case = TANDEM__ENVELOPE__PAYLOAD_DOMAIN_REFUSED;
        out.domain_refused = &r;
        CHECK_STATUS(td_ctl_conn_send(conn, &out), TD_OK);
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO, "refused");
        break;
    case R_REJECT:   /* what an older routerd does with an unknown payload */
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO,
                          "malformed frame (not a tandem envelope)");
        break;
    case R_SILENT:
        break;
    }
}

static void
router_keep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static void *
router_thread(void *arg)
{
    (void)arg;
    event_base_dispatch(rbase);
    return NULL;
}

static td_status_t
join(const char *routers, void **addrs, size_t *lens, uint64_t wait_ms)
{
    td_domjoin_config_t jc = { .routers = routers,
                               .ctl = cfg_for(TANDEM__ROLE__ROLE_TOOL, 0x1111, 0),
                               .id = "d0", .size = 2, .rank = 0, .wait_ms = wait_ms };
    return td_domjoin_run(&jc, "A", 1, addrs, lens);
}

static void
test_client(void)
{
    td_ctl_config_t rc = cfg_for(TANDEM__ROLE__ROLE_ROUTER, 0x2222, 0);
    td_ctl_handlers_t h = { .on_message = router_on_message };
    td_ctl_listener_t *lst = NULL;
    pthread_t th;
    char list[128];
    void *addrs[2] = { 0 };
    size_t lens[2] = { 0 };

    rbase = event_base_new();
    CHECK_STATUS(td_ctl_listener_create(rbase, &rc, &h, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    /* a keep-alive timer so that the loop runs while no connection is open */
    struct event *keep = event_new(rbase, -1, EV_PERSIST, router_keep, NULL);
    struct timeval sec = { 1, 0 };
    event_add(keep, &sec);
    CHECK(pthread_create(&th, NULL, router_thread, NULL) == 0);
    /* an unreachable router first: skipped for the second */
    snprintf(list, sizeof(list), "127.0.0.1:1, 127.0.0.1:%u", td_ctl_listener_port(lst));

    mode = R_PEERS;
    CHECK_STATUS(join(list, addrs, lens, 5000), TD_OK);
    CHECK(lens[0] == 1 && addrs[0] != NULL && memcmp(addrs[0], "A", 1) == 0);
    CHECK(lens[1] == 1 && addrs[1] != NULL && memcmp(addrs[1], "B", 1) == 0);
    free(addrs[0]);
    free(addrs[1]);
    addrs[0] = addrs[1] = NULL;

    static const struct {
        router_mode_t mode;
        td_status_t want;
    } fails[] = {
        { R_PEERS_BAD, TD_ERR_PROTO },
        { R_REFUSE, TD_ERR_PEER },
        { R_REJECT, TD_ERR_UNSUPPORTED },
        { R_SILENT, TD_ERR_TIMEOUT },
    };
    for (size_t i = 0; i < sizeof(fails) / sizeof(fails[0]); i++) {
        mode = fails[i].mode;
        CHECK_STATUS(join(list, addrs, lens, 700), fails[i].want);
        CHECK(addrs[0] == NULL && addrs[1] == NULL);   /* set only on TD_OK */
    }
    /* no router reachable at all: the deadline */
    CHECK_STATUS(join("127.0.0.1:1", addrs, lens, 500), TD_ERR_TIMEOUT);

    event_base_loopexit(rbase, NULL);
    pthread_join(th, NULL);
    event_free(keep);
    td_ctl_listener_destroy(lst);
    event_base_free(rbase);
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    test_valid();
    test_client();
    libevent_global_shutdown();
    return td_check_exit("test_domjoin");
}
