/* tests/unit/test_ctl.c — control connections on one event loop: handshake
 * accepted; refused with a reason on both sides for each single mismatch;
 * send before established; silent peer and dead peer time out; a bad frame
 * closes only its own connection; destroy while connected. */
#include "check.h"
#include "ctl.h"
#include "log.h"
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

static const uint8_t secret[] = "unit-test-secret";

/* What happened on one side: filled by the handlers. */
typedef struct {
    int established, closed;
    td_status_t why;
    char reason[TD_HELLO_REASON_MAX];
    td_ctl_conn_t *conn;
} side_t;

static void
on_established(td_ctl_conn_t *c, const Tandem__Hello *peer, void *arg)
{
    side_t *s = arg;

    s->established++;
    s->conn = c;
}

static void
on_closed(td_ctl_conn_t *c, td_status_t why, const char *reason, void *arg)
{
    side_t *s = arg;

    s->closed++;
    s->why = why;
    snprintf(s->reason, sizeof(s->reason), "%s", reason);
    if (s->conn == c)
        s->conn = NULL;
}

static td_ctl_config_t
base_config(td_hello_ident_t *id, const char *node, Tandem__Role role)
{
    *id = (td_hello_ident_t){
        .protocol_version = TD_HELLO_PROTOCOL_VERSION, .role = role, .node_id = node,
        .rank_id = 0, .incarnation = 7, .model_fingerprint = "model-x", .kv_layout_hash = 99,
    };
    return (td_ctl_config_t){ .ident = *id, .secret = secret, .secret_len = sizeof(secret),
                              .heartbeat_ms = 50, .handshake_ms = 300 };
}

static uint64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

/* Run the loop until *flag >= want or ms pass; returns whether it got there. */
static int
run_until(struct event_base *base, const int *flag, int want, unsigned ms)
{
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = { 0, 10000 };
    uint64_t end = now_ms() + ms;

    event_add(tick, &tv);
    while ((flag == NULL || *flag < want) && now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return flag == NULL || *flag >= want;
}

static int
raw_connect(uint16_t port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void
test_handshake_ok(struct event_base *base)
{
    td_hello_ident_t sid, cid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh;
    side_t ss = { 0 }, cs = { 0 };
    td_ctl_listener_t *lst = NULL;
    td_ctl_conn_t *c = NULL;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Hello h = TANDEM__HELLO__INIT;

    sh.arg = &ss;
    ch.arg = &cs;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    CHECK(td_ctl_listener_port(lst) != 0);
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1", td_ctl_listener_port(lst), &c),
                 TD_OK);
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT;
    env.heartbeat = &(Tandem__Heartbeat)TANDEM__HEARTBEAT__INIT;
    CHECK_STATUS(td_ctl_conn_send(c, &env), TD_ERR_STATE);   /* not established yet */
    CHECK_EQ_INT(td_ctl_conn_state(c), TD_CTL_CONNECTING);

    CHECK(run_until(base, &cs.established, 1, 2000));
    CHECK(run_until(base, &ss.established, 1, 2000));
    CHECK_EQ_INT(td_ctl_conn_state(c), TD_CTL_ESTABLISHED);
    CHECK(td_ctl_conn_peer(c) != NULL && strcmp(td_ctl_conn_peer(c)->node_id, "server") == 0);
    CHECK(strstr(td_ctl_conn_name(c), "decode server/0") != NULL);
    CHECK(ss.conn && td_ctl_conn_peer(ss.conn)->role == TANDEM__ROLE__ROLE_PREFILL);
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_HELLO;
    env.hello = &h;
    CHECK_STATUS(td_ctl_conn_send(c, &env), TD_ERR_INVALID);

    /* Heartbeats flow both ways and keep the connection up past the dead time. */
    run_until(base, NULL, 0, 400);
    CHECK(td_ctl_conn_heartbeats_rx(c) >= 4);
    CHECK(ss.conn && td_ctl_conn_heartbeats_rx(ss.conn) >= 4);
    CHECK_EQ_INT(cs.closed + ss.closed, 0);

    /* Destroy while connected: the server sees the close, nothing leaks. */
    td_ctl_conn_destroy(c);
    CHECK(run_until(base, &ss.closed, 1, 2000));
    CHECK_STATUS(ss.why, TD_ERR_CLOSED);
    CHECK_EQ_INT(cs.closed, 0);
    run_until(base, NULL, 0, 50);
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 0);
    td_ctl_listener_destroy(lst);
}

enum mutation { M_VERSION, M_SECRET, M_MODEL, M_LAYOUT, M_ROLE };

static void
test_handshake_refused(struct event_base *base)
{
    static const struct {
        enum mutation m;
        td_status_t why;
        const char *reason;       /* substring expected on both sides */
    } cases[] = {
        { M_VERSION, TD_ERR_MISMATCH, "protocol version differs" },
        { M_SECRET, TD_ERR_AUTH, "cluster secret proof failed" },
        { M_MODEL, TD_ERR_MISMATCH, "model fingerprint differs" },
        { M_LAYOUT, TD_ERR_MISMATCH, "kv layout hash differs" },
    };
    static const uint8_t wrong_secret[] = "unit-test-secreT";

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        td_hello_ident_t sid, cid;
        td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
        td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
        td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh;
        side_t ss = { 0 }, cs = { 0 };
        td_ctl_listener_t *lst = NULL;
        td_ctl_conn_t *c = NULL;

        switch (cases[i].m) {
        case M_VERSION: ccfg.ident.protocol_version = 2; break;
        case M_SECRET:  ccfg.secret = wrong_secret; break;
        case M_MODEL:   ccfg.ident.model_fingerprint = "model-y"; break;
        case M_LAYOUT:  ccfg.ident.kv_layout_hash = 98; break;
        default: break;
        }
        sh.arg = &ss;
        ch.arg = &cs;
        CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
        if (lst == NULL)
            return;
        CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1",
                                         td_ctl_listener_port(lst), &c), TD_OK);
        CHECK(run_until(base, &cs.closed, 1, 2000));
        CHECK(run_until(base, &ss.closed, 1, 2000));
        if (ss.why != cases[i].why || cs.why != cases[i].why ||
            !strstr(ss.reason, cases[i].reason) || !strstr(cs.reason, cases[i].reason))
            fprintf(stderr, "case %zu: server %s \"%s\", client %s \"%s\"\n", i,
                    td_status_str(ss.why), ss.reason, td_status_str(cs.why), cs.reason);
        CHECK_STATUS(ss.why, cases[i].why);
        CHECK_STATUS(cs.why, cases[i].why);
        CHECK(strstr(ss.reason, cases[i].reason) != NULL);
        CHECK(strstr(cs.reason, cases[i].reason) != NULL);
        CHECK_EQ_INT(ss.established + cs.established, 0);
        CHECK_EQ_INT(td_ctl_conn_state(c), TD_CTL_CLOSED);
        td_ctl_conn_destroy(c);
        run_until(base, NULL, 0, 50);
        CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 0);
        td_ctl_listener_destroy(lst);
    }
}

/* A silent raw peer is closed at the handshake deadline; a raw peer sending a
 * bad frame is closed at once; a good client on the same listener lives on;
 * a client that stops heartbeating is declared dead. */
static void
test_bad_peers(struct event_base *base)
{
    td_hello_ident_t sid, cid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh;
    side_t ss = { 0 }, cs = { 0 };
    td_ctl_listener_t *lst = NULL;
    td_ctl_conn_t *c = NULL;
    static const unsigned char too_big[] = { 0x00, 0x10, 0x00, 0x00 };   /* 1 MiB before auth */
    uint64_t t0;
    int silent, bad;

    sh.arg = &ss;
    ch.arg = &cs;
    ccfg.heartbeat_ms = 60000;   /* the client will go quiet once established */
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    silent = raw_connect(td_ctl_listener_port(lst));
    bad = raw_connect(td_ctl_listener_port(lst));
    CHECK(silent >= 0 && bad >= 0);
    CHECK(write(bad, too_big, sizeof(too_big)) == (ssize_t)sizeof(too_big));
    CHECK(run_until(base, &ss.closed, 1, 2000));
    CHECK_STATUS(ss.why, TD_ERR_TOO_BIG);
    CHECK(strstr(ss.reason, "frame of 1048576 bytes exceeds the 4096-byte limit") != NULL);

    t0 = now_ms();
    CHECK(run_until(base, &ss.closed, 2, 2000));
    CHECK_STATUS(ss.why, TD_ERR_TIMEOUT);
    CHECK(strstr(ss.reason, "handshake not finished within 300 ms") != NULL);
    CHECK(now_ms() - t0 <= 1000);
    close(silent);
    close(bad);

    /* Dead peer: the client sends no heartbeat for 60 s; the server (50 ms x 3) gives up. */
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1", td_ctl_listener_port(lst), &c),
                 TD_OK);
    CHECK(run_until(base, &ss.established, 1, 2000));
    t0 = now_ms();
    CHECK(run_until(base, &ss.closed, 3, 2000));
    CHECK_STATUS(ss.why, TD_ERR_TIMEOUT);
    CHECK(strstr(ss.reason, "peer dead: nothing received for") != NULL);
    CHECK(now_ms() - t0 >= 140 && now_ms() - t0 <= 1500);
    /* The client hears why. */
    CHECK(run_until(base, &cs.closed, 1, 2000));
    CHECK_STATUS(cs.why, TD_ERR_TIMEOUT);
    CHECK(strstr(cs.reason, "rejected by peer: peer dead") != NULL);
    td_ctl_conn_destroy(c);

    /* Refused connect reports it. */
    {
        uint16_t port = td_ctl_listener_port(lst);
        side_t rs = { 0 };
        td_ctl_handlers_t rh = { on_established, NULL, on_closed, &rs };

        td_ctl_listener_destroy(lst);
        lst = NULL;
        c = NULL;
        if (td_ctl_conn_connect(base, &ccfg, &rh, "127.0.0.1", port, &c) == TD_OK) {
            CHECK(run_until(base, &rs.closed, 1, 2000));
            CHECK(strstr(rs.reason, "connect failed") != NULL);
            td_ctl_conn_destroy(c);
        }
    }
}

/* "host:port" parsing used by every daemon's --listen / --peer flags. */
static void
test_addr_parse(void)
{
    static const struct { const char *in; td_status_t st; const char *host; unsigned port; } cases[] = {
        { "127.0.0.1:8080", TD_OK, "127.0.0.1", 8080 },
        { "[::1]:0", TD_OK, "::1", 0 },
        { ":9000", TD_OK, "", 9000 },
        { "node-a:65535", TD_OK, "node-a", 65535 },
        { "node-a:65536", TD_ERR_INVALID, NULL, 0 },
        { "node-a", TD_ERR_INVALID, NULL, 0 },
        { "node-a:", TD_ERR_INVALID, NULL, 0 },
        { "node-a:-1", TD_ERR_INVALID, NULL, 0 },
        { "::1:80", TD_ERR_INVALID, NULL, 0 },
        { "[::1]80", TD_ERR_INVALID, NULL, 0 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char host[TD_NET_HOST_MAX] = "unset";
        uint16_t port = 1;

        CHECK_STATUS(td_net_addr_parse(cases[i].in, host, sizeof(host), &port), cases[i].st);
        if (cases[i].st == TD_OK) {
            CHECK_STR(host, cases[i].host);
            CHECK_EQ_INT(port, cases[i].port);
        }
    }
}

/* A listener destroyed with live and half-open connections frees them all. */
static void
test_destroy_busy(struct event_base *base)
{
    td_hello_ident_t sid, cid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh;
    side_t ss = { 0 }, cs = { 0 };
    td_ctl_listener_t *lst = NULL;
    td_ctl_conn_t *c = NULL;
    int raw;

    sh.arg = &ss;
    ch.arg = &cs;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    raw = raw_connect(td_ctl_listener_port(lst));
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1", td_ctl_listener_port(lst), &c),
                 TD_OK);
    CHECK(run_until(base, &cs.established, 1, 2000));
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 2);
    td_ctl_listener_destroy(lst);
    CHECK(run_until(base, &cs.closed, 1, 2000));
    CHECK_STATUS(cs.why, TD_ERR_CLOSED);
    CHECK_EQ_INT(ss.closed, 0);   /* destroy does not call on_closed */
    td_ctl_conn_destroy(c);
    close(raw);
}

int
main(void)
{
    struct event_base *base;

    signal(SIGPIPE, SIG_IGN);   /* as in every daemon: see ctl.h */
    base = event_base_new();
    test_addr_parse();
    test_handshake_ok(base);
    test_handshake_refused(base);
    test_bad_peers(base);
    test_destroy_busy(base);
    event_base_free(base);
    return td_check_exit("test_ctl");
}
