/* tests/unit/test_ctl.c — control connections on one event loop: handshake
 * accepted; refused with a reason on both sides for each single mismatch
 * and for a client claiming the server's incarnation; a reflected Hello refused; pre-auth frames refused unparsed; send before
 * established and above the output cap; silent and dead peers time out; a
 * bad frame closes only its own connection; the handshake caps (a newcomer
 * closes the oldest silent connection, of its address or of all) and the
 * pause after accept errors; connect falling back to the next address; names
 * refused on the loop; destroy while connected. */
#include "check.h"
#include "testutil.h"
#include "ctl.h"
#include "frame.h"
#include "log.h"
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
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
        .rank_id = 0, .incarnation = 0x700u + (uint64_t)role,   /* distinct per side */
        .model_fingerprint = "model-x", .kv_layout_hash = 99,
    };
    return (td_ctl_config_t){ .ident = *id, .secret = secret, .secret_len = sizeof(secret),
                              .heartbeat_ms = 50, .handshake_ms = 300 };
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
    uint64_t end = td_testutil_now_ms() + ms;

    event_add(tick, &tv);
    while ((flag == NULL || *flag < want) && td_testutil_now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return flag == NULL || *flag >= want;
}

/* Log lines containing `pattern` are counted (all lines still go to stderr). */
static struct {
    const char *pattern;
    int hits;
} log_watch;

static void
log_sink(td_log_level_t level, const char *line, void *arg)
{
    fprintf(stderr, "%s\n", line);
    if (log_watch.pattern && strstr(line, log_watch.pattern))
        log_watch.hits++;
}

static void
log_watch_start(const char *pattern)
{
    log_watch.pattern = pattern;
    log_watch.hits = 0;
}

/* Read what fd has (non-blocking) into buf at *len; returns 0 on EOF, 1 else. */
static int
raw_read(int fd, char *buf, size_t cap, size_t *len, int echo)
{
    ssize_t n = recv(fd, buf + *len, cap - *len, MSG_DONTWAIT);

    if (n == 0)
        return 0;
    if (n > 0) {
        if (echo && send(fd, buf + *len, (size_t)n, MSG_NOSIGNAL) != n)
            return 0;
        *len += (size_t)n;
    }
    return n > 0 || errno == EAGAIN || errno == EWOULDBLOCK;
}

/* Loop and read fd (echoing what arrives when echo is set) until the peer
 * closes it or ms pass; returns 1 when it closed. */
static int
raw_until_closed(struct event_base *base, int fd, char *buf, size_t cap, size_t *len,
                 int echo, unsigned ms)
{
    uint64_t end = td_testutil_now_ms() + ms;

    while (td_testutil_now_ms() < end) {
        run_until(base, NULL, 0, 10);
        if (!raw_read(fd, buf, cap, len, echo))
            return 1;
    }
    return 0;
}

static int
mem_has(const char *buf, size_t len, const char *s)
{
    return memmem(buf, len, s, strlen(s)) != NULL;
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

enum mutation { M_VERSION, M_SECRET, M_MODEL, M_LAYOUT, M_INCARNATION };

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
        /* A client claiming the server's incarnation: each side sees its own. */
        { M_INCARNATION, TD_ERR_AUTH, "peer claims our own incarnation" },
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
        case M_VERSION: ccfg.ident.protocol_version = TD_HELLO_PROTOCOL_VERSION + 1; break;
        case M_SECRET:  ccfg.secret = wrong_secret; break;
        case M_MODEL:   ccfg.ident.model_fingerprint = "model-y"; break;
        case M_LAYOUT:  ccfg.ident.kv_layout_hash = 98; break;
        case M_INCARNATION: ccfg.ident.incarnation = scfg.ident.incarnation; break;
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

    t0 = td_testutil_now_ms();
    CHECK(run_until(base, &ss.closed, 2, 2000));
    CHECK_STATUS(ss.why, TD_ERR_TIMEOUT);
    CHECK(strstr(ss.reason, "handshake not finished within 300 ms") != NULL);
    CHECK(td_testutil_now_ms() - t0 <= 1000);
    close(silent);
    close(bad);

    /* Dead peer: the client sends no heartbeat for 60 s; the server (50 ms x 3) gives up. */
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1", td_ctl_listener_port(lst), &c),
                 TD_OK);
    CHECK(run_until(base, &ss.established, 1, 2000));
    t0 = td_testutil_now_ms();
    CHECK(run_until(base, &ss.closed, 3, 2000));
    CHECK_STATUS(ss.why, TD_ERR_TIMEOUT);
    CHECK(strstr(ss.reason, "peer dead: nothing received for") != NULL);
    CHECK(td_testutil_now_ms() - t0 >= 140 && td_testutil_now_ms() - t0 <= 1500);
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
        { "h: 80", TD_ERR_INVALID, NULL, 0 },
        { "h:\t80", TD_ERR_INVALID, NULL, 0 },
        { "h:+80", TD_ERR_INVALID, NULL, 0 },
        { "h:80 ", TD_ERR_INVALID, NULL, 0 },
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

/* A server's own Hello (and anything after it) echoed back is refused as a
 * reflection, with the reason in its log and in the Reject it sends. */
static void
test_reflect(struct event_base *base)
{
    td_hello_ident_t sid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL };
    side_t ss = { 0 };
    td_ctl_listener_t *lst = NULL;
    char buf[4096];
    size_t len = 0;
    int fd;

    sh.arg = &ss;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    fd = raw_connect(td_ctl_listener_port(lst));
    CHECK(fd >= 0);
    CHECK(raw_until_closed(base, fd, buf, sizeof(buf), &len, 1, 2000));
    CHECK(mem_has(buf, len, "peer nonce equals ours"));   /* in the Reject */
    CHECK_EQ_INT(ss.closed, 1);
    CHECK_EQ_INT(ss.established, 0);
    CHECK_STATUS(ss.why, TD_ERR_AUTH);
    CHECK(strstr(ss.reason, "handshake refused: peer nonce equals ours") != NULL);
    close(fd);
    td_ctl_listener_destroy(lst);
}

/* Before authentication a frame is refused from its first key, without
 * unpacking: a heartbeat whose body protobuf-c could not even parse, and a
 * Hello followed by a second field. */
static void
test_preauth_unparsed(struct event_base *base)
{
    static const struct { const char *name; unsigned char bytes[8]; size_t len; const char *reason; } cases[] = {
        /* field 4 (heartbeat), 2 bytes: 0x08 then a cut varint */
        { "heartbeat", { 0, 0, 0, 4, 0x22, 0x02, 0x08, 0xff }, 8,
          "unexpected heartbeat frame (field 4) in state hello, refused unparsed" },
        /* field 1 (hello), empty, then field 4 (heartbeat), empty */
        { "two fields", { 0, 0, 0, 4, 0x0a, 0x00, 0x22, 0x00 }, 8,
          "malformed frame (not a tandem envelope)" },
        /* field 40 (a future request message), empty */
        { "field 40", { 0, 0, 0, 3, 0xc2, 0x02, 0x00 }, 7,
          "unexpected message frame (field 40) in state hello, refused unparsed" },
    };
    td_hello_ident_t sid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL };
    side_t ss = { 0 };
    td_ctl_listener_t *lst = NULL;

    sh.arg = &ss;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char buf[4096];
        size_t len = 0;
        int fd = raw_connect(td_ctl_listener_port(lst));

        CHECK(fd >= 0 && write(fd, cases[i].bytes, cases[i].len) == (ssize_t)cases[i].len);
        CHECK(raw_until_closed(base, fd, buf, sizeof(buf), &len, 0, 2000));
        CHECK_EQ_INT(ss.closed, (int)i + 1);
        CHECK_STATUS(ss.why, TD_ERR_PROTO);
        if (strstr(ss.reason, cases[i].reason) == NULL)
            fprintf(stderr, "%s: got \"%s\"\n", cases[i].name, ss.reason);
        CHECK(strstr(ss.reason, cases[i].reason) != NULL);
        CHECK(mem_has(buf, len, cases[i].reason));
        close(fd);
    }
    td_ctl_listener_destroy(lst);
}

/* Established pair on base: listener in *lst, client conn in *c, server conn
 * in ss->conn. Returns 1 when both sides are up. */
static int
pair_up(struct event_base *base, td_ctl_config_t *scfg, td_ctl_config_t *ccfg,
        td_ctl_handlers_t *sh, td_ctl_handlers_t *ch, td_ctl_listener_t **lst,
        td_ctl_conn_t **c)
{
    side_t *ss = sh->arg, *cs = ch->arg;

    *lst = NULL;
    *c = NULL;
    if (td_ctl_listener_create(base, scfg, sh, "127.0.0.1", 0, lst) != TD_OK)
        return 0;
    if (td_ctl_conn_connect(base, ccfg, ch, "127.0.0.1", td_ctl_listener_port(*lst), c) != TD_OK)
        return 0;
    return run_until(base, &cs->established, 1, 2000) && run_until(base, &ss->established, 1, 2000);
}

/* A peer that does not read: send says BUSY once max_output bytes wait, and
 * accepts again once they went out. */
static void
test_output_cap(struct event_base *base)
{
    td_hello_ident_t sid, cid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh;
    side_t ss = { 0 }, cs = { 0 };
    td_ctl_listener_t *lst;
    td_ctl_conn_t *c;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    size_t frame, sent = 0;
    td_status_t st = TD_OK;

    sh.arg = &ss;
    ch.arg = &cs;
    ccfg.max_frame = 1024;
    ccfg.max_output = 8192;
    hb.seq = 1;
    hb.time_ns = 1;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT;
    env.heartbeat = &hb;
    frame = TD_FRAME_HEADER_LEN + tandem__envelope__get_packed_size(&env);
    CHECK(pair_up(base, &scfg, &ccfg, &sh, &ch, &lst, &c));
    if (c == NULL || cs.established == 0)
        goto out;
    /* Without the loop running nothing is written: the buffer only grows. */
    while (sent < 100000 && (st = td_ctl_conn_send(c, &env)) == TD_OK)
        sent++;
    CHECK_STATUS(st, TD_ERR_BUSY);
    CHECK(sent * frame <= 8192 && (sent + 1) * frame > 8192);
    run_until(base, NULL, 0, 50);
    CHECK_STATUS(td_ctl_conn_send(c, &env), TD_OK);
    /* A max_output that cannot hold one frame is refused. */
    ccfg.max_output = 1024;
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1", td_ctl_listener_port(lst),
                                     &(td_ctl_conn_t *){ NULL }), TD_ERR_INVALID);
out:
    td_ctl_conn_destroy(c);
    td_ctl_listener_destroy(lst);
}

/* Whether fd is still open after the loop ran a little (what it had is read). */
static int
raw_open(struct event_base *base, int fd)
{
    char buf[4096];
    size_t len = 0;

    run_until(base, NULL, 0, 30);
    return raw_read(fd, buf, sizeof(buf), &len, 0);
}

/* max_unauth = 2: a new connection in the handshake closes the oldest one
 * whose Hello has not come, never before one whose Hello came; one warning
 * for the episode; a client gets in while silent connections hold the cap. */
static void
test_unauth_cap(struct event_base *base)
{
    td_hello_ident_t sid, cid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh, kh = sh;
    side_t ss = { 0 }, cs = { 0 }, ks = { 0 };
    struct event_base *kbase = event_base_new();
    td_ctl_listener_t *lst = NULL;
    td_ctl_conn_t *c = NULL, *stuck = NULL;
    char buf[4096];
    size_t len = 0;
    uint16_t port;
    int fd[2];

    sh.arg = &ss;
    ch.arg = &cs;
    kh.arg = &ks;
    scfg.max_unauth = 2;
    scfg.handshake_ms = 5000;
    ccfg.handshake_ms = 5000;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL || kbase == NULL)
        goto out;
    port = td_ctl_listener_port(lst);
    log_watch_start("closes the oldest unauthenticated one");
    /* A peer whose Hello came: its own loop does not run again, so it never
     * sends its proof and stays in the handshake (auth) at the server. */
    CHECK_STATUS(td_ctl_conn_connect(kbase, &ccfg, &kh, "127.0.0.1", port, &stuck), TD_OK);
    run_until(kbase, NULL, 0, 50);
    run_until(base, NULL, 0, 50);
    fd[0] = raw_connect(port);
    CHECK(fd[0] >= 0);
    run_until(base, NULL, 0, 30);
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 2);
    fd[1] = raw_connect(port);   /* at the cap: closes fd[0], the silent one */
    CHECK(fd[1] >= 0);
    CHECK(raw_until_closed(base, fd[0], buf, sizeof(buf), &len, 0, 1000));
    CHECK(len > 0);                                  /* it had our Hello */
    CHECK(raw_open(base, fd[1]));
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 2);
    CHECK_EQ_INT(ss.closed, 1);
    /* A client while the cap is held: it closes fd[1] and gets in. */
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "127.0.0.1", port, &c), TD_OK);
    CHECK(run_until(base, &cs.established, 1, 2000));
    CHECK(run_until(base, &ss.established, 1, 2000));
    len = 0;
    CHECK(raw_until_closed(base, fd[1], buf, sizeof(buf), &len, 0, 1000));
    CHECK_EQ_INT(ss.closed, 2);
    CHECK_EQ_INT(ks.closed, 0);   /* the peer in auth was kept */
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 2);
    CHECK_EQ_INT(log_watch.hits, 1);
    log_watch_start(NULL);
    close(fd[0]);
    close(fd[1]);
out:
    td_ctl_conn_destroy(c);
    td_ctl_conn_destroy(stuck);
    td_ctl_listener_destroy(lst);
    if (kbase)
        event_base_free(kbase);
}

/* raw_connect from a loopback address of our choice (127.0.0.0/8 all loops
 * back on Linux); -1 when it cannot. */
static int
raw_connect_from(uint16_t port, const char *src)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    struct sockaddr_in me = { .sin_family = AF_INET };
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && (inet_pton(AF_INET, src, &me.sin_addr) != 1 ||
                    bind(fd, (struct sockaddr *)&me, sizeof(me)) != 0 ||
                    connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* max_unauth_per_source = 2: a third silent connection from one address
 * closes that address's oldest; another address's connection stays. */
static void
test_unauth_per_source(struct event_base *base)
{
    td_hello_ident_t sid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL };
    side_t ss = { 0 };
    td_ctl_listener_t *lst = NULL;
    char buf[4096];
    size_t len = 0;
    uint16_t port;
    int other, fd[3];

    sh.arg = &ss;
    scfg.max_unauth = 16;
    scfg.max_unauth_per_source = 2;
    scfg.handshake_ms = 5000;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, NULL, 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    port = td_ctl_listener_port(lst);
    other = raw_connect_from(port, "127.0.0.2");
    CHECK(other >= 0);
    run_until(base, NULL, 0, 30);
    for (int i = 0; i < 3; i++) {
        fd[i] = raw_connect_from(port, "127.0.0.1");
        CHECK(fd[i] >= 0);
        run_until(base, NULL, 0, 30);
    }
    CHECK(raw_until_closed(base, fd[0], buf, sizeof(buf), &len, 0, 1000));
    CHECK(raw_open(base, fd[1]) && raw_open(base, fd[2]) && raw_open(base, other));
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 3);
    CHECK_EQ_INT(ss.closed, 1);
    CHECK(strstr(ss.reason, "max_unauth_per_source") != NULL);
    CHECK_STATUS(ss.why, TD_ERR_BUSY);
    for (int i = 0; i < 3; i++)
        close(fd[i]);
    close(other);
    td_ctl_listener_destroy(lst);
}

/* accept() failing with EMFILE pauses the listener (one warning, a handful
 * of retries, no busy loop) and it accepts again once descriptors free up. */
static void
test_accept_emfile(struct event_base *base)
{
    td_hello_ident_t sid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL };
    side_t ss = { 0 };
    td_ctl_listener_t *lst = NULL;
    struct rlimit old, low;
    int fill[64], nfill = 0, raw, probe, failures;

    sh.arg = &ss;
    scfg.handshake_ms = 5000;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &lst), TD_OK);
    if (lst == NULL)
        return;
    run_until(base, NULL, 0, 50);   /* libevent closes freed sockets from the loop */
    raw = raw_connect(td_ctl_listener_port(lst));   /* waits in the backlog */
    CHECK(raw >= 0);
    probe = open("/dev/null", O_RDONLY);
    CHECK(probe >= 0 && getrlimit(RLIMIT_NOFILE, &old) == 0);
    low = old;
    low.rlim_cur = (rlim_t)probe + 16;
    close(probe);
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    while (nfill < 64 && (fill[nfill] = open("/dev/null", O_RDONLY)) >= 0)
        nfill++;
    CHECK(nfill < 64 && errno == EMFILE);

    td_log_set_level(TD_LOG_DEBUG);
    log_watch_start("accept failed");
    run_until(base, NULL, 0, 700);
    failures = log_watch.hits;
    log_watch_start("accept failed: ");   /* the warning, not the debug lines */
    td_log_set_level(TD_LOG_INFO);
    /* 100 + 200 + 400 ms pauses: 3 or 4 attempts in 700 ms, not thousands. */
    CHECK(failures >= 2 && failures <= 6);
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 0);

    while (nfill > 0)
        close(fill[--nfill]);
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    log_watch_start("accepting again");
    run_until(base, NULL, 0, 1200);
    CHECK_EQ_INT(log_watch.hits, 1);
    CHECK_EQ_INT(td_ctl_listener_conn_count(lst), 1);
    log_watch_start(NULL);
    close(raw);
    td_ctl_listener_destroy(lst);
}

/* The first address refuses (asynchronously on loopback), the second one
 * serves; a listener on all addresses takes IPv4 and IPv6; names are refused
 * on the loop with a reason. */
static void
test_connect_fallback(struct event_base *base)
{
    td_hello_ident_t sid, cid;
    td_ctl_config_t scfg = base_config(&sid, "server", TANDEM__ROLE__ROLE_DECODE);
    td_ctl_config_t ccfg = base_config(&cid, "client", TANDEM__ROLE__ROLE_PREFILL);
    td_ctl_handlers_t sh = { on_established, NULL, on_closed, NULL }, ch = sh;
    side_t ss = { 0 }, cs = { 0 };
    td_ctl_listener_t *lst = NULL, *dead = NULL;
    td_ctl_conn_t *c = NULL;
    td_net_addrs_t addrs, good;
    uint16_t dead_port;

    sh.arg = &ss;
    ch.arg = &cs;
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, NULL, 0, &lst), TD_OK);
    CHECK_STATUS(td_ctl_listener_create(base, &scfg, &sh, "127.0.0.1", 0, &dead), TD_OK);
    if (lst == NULL || dead == NULL)
        return;
    dead_port = td_ctl_listener_port(dead);
    td_ctl_listener_destroy(dead);   /* nothing listens there now */
    CHECK_STATUS(td_net_resolve("127.0.0.1", dead_port, 1, &addrs), TD_OK);
    CHECK_STATUS(td_net_resolve("127.0.0.1", td_ctl_listener_port(lst), 1, &good), TD_OK);
    addrs.a[addrs.n++] = good.a[0];
    log_watch_start("trying the next address");
    CHECK_STATUS(td_ctl_conn_connect_addrs(base, &ccfg, &ch, &addrs, &c), TD_OK);
    CHECK(run_until(base, &cs.established, 1, 2000));
    CHECK_EQ_INT(log_watch.hits, 1);
    CHECK_EQ_INT(cs.closed, 0);
    CHECK(strstr(td_ctl_conn_name(c), "127.0.0.1:") != NULL);
    td_ctl_conn_destroy(c);
    c = NULL;

    /* IPv6 loopback to the same all-addresses listener, when this host has it. */
    if (td_ctl_conn_connect(base, &ccfg, &ch, "::1", td_ctl_listener_port(lst), &c) == TD_OK) {
        CHECK(run_until(base, &cs.established, 2, 2000));
        CHECK(strstr(td_ctl_conn_name(c), "[::1]:") != NULL);
        td_ctl_conn_destroy(c);
        c = NULL;
    }

    log_watch_start("host must be an address; resolve names before starting the loop");
    CHECK_STATUS(td_ctl_conn_connect(base, &ccfg, &ch, "localhost", td_ctl_listener_port(lst), &c),
                 TD_ERR_INVALID);
    CHECK(c == NULL);
    CHECK_EQ_INT(log_watch.hits, 1);
    log_watch_start(NULL);
    run_until(base, NULL, 0, 50);
    td_ctl_listener_destroy(lst);
}

int
main(void)
{
    struct event_base *base;

    signal(SIGPIPE, SIG_IGN);   /* as in every daemon: see ctl.h */
    base = event_base_new();
    td_log_set_sink(log_sink, NULL);
    test_addr_parse();
    test_handshake_ok(base);
    test_handshake_refused(base);
    test_reflect(base);
    test_preauth_unparsed(base);
    test_bad_peers(base);
    test_destroy_busy(base);
    test_output_cap(base);
    test_unauth_cap(base);
    test_unauth_per_source(base);
    test_accept_emfile(base);
    test_connect_fallback(base);
    event_base_free(base);
    td_log_set_sink(NULL, NULL);
    return td_check_exit("test_ctl");
}
