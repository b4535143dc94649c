/* tests/unit/test_link.c — net/link.c against fake routers (ctl listeners)
 * on the same loop: Register field by field, Registered -> on_up, messages
 * both ways, Load coalescing and refresh, reconnect after a close, two
 * routers, a wrong secret, a router that is down then comes up, bad router
 * lists, and destroy in every state (also from inside on_down). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "check.h"
#include "link.h"
#include "log.h"

#define HB_MS 200u

static const uint8_t secret[] = "unit-test-secret";
static const uint8_t wrong_secret[] = "some-other-secret";
static struct event_base *base;

/* ---- log capture ------------------------------------------------------------ */

static char logbuf[65536];

static void
log_sink(td_log_level_t level, const char *line, void *arg)
{
    size_t n = strlen(logbuf);

    (void)arg;
    if (level <= TD_LOG_INFO && n + strlen(line) + 2 < sizeof(logbuf))
        snprintf(logbuf + n, sizeof(logbuf) - n, "%s\n", line);
}

/* Lines at info or above containing both a and b. */
static int
log_count(const char *a, const char *b)
{
    int n = 0;

    for (const char *p = logbuf; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[2048];

        snprintf(line, sizeof(line), "%.*s", (int)len, p);
        n += strstr(line, a) != NULL && (b == NULL || strstr(line, b) != NULL);
        p += len + (e != NULL);
    }
    return n;
}

/* ---- loop helpers ----------------------------------------------------------- */

static void
expire_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    *(int *)arg = 1;
}

/* Run the loop until *flag >= want or ms pass; returns whether it got there. */
static int
run_until(const int *flag, int want, unsigned ms)
{
    int expired = 0;
    struct event *ev = evtimer_new(base, expire_cb, &expired);
    struct timeval tv = td_ctl_timeval_ms(ms);

    evtimer_add(ev, &tv);
    while ((flag == NULL || *flag < want) && !expired)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(ev);
    return flag != NULL && *flag >= want;
}

static void
run_for(unsigned ms)
{
    run_until(NULL, 0, ms);
}

/* ---- fake router -------------------------------------------------------------- */

typedef struct {
    td_ctl_listener_t *lst;
    uint16_t port;
    int established, closed;
    int registers, loads, others;
    int reply;                   /* answer Register with Registered */
    Tandem__Register *reg;       /* the last Register received (copy) */
    Tandem__Load load;           /* the last Load received */
    Tandem__Envelope__PayloadCase other_case;
    uint64_t other_req;
    td_ctl_conn_t *conn;         /* the last established connection */
    Tandem__Hello peer;          /* scalars of its Hello */
    char peer_node[80];
} router_t;

static void
router_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg)
{
    router_t *rt = arg;

    rt->established++;
    rt->conn = conn;
    rt->peer = *peer;
    snprintf(rt->peer_node, sizeof(rt->peer_node), "%s", peer->node_id);
}

static void
router_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    router_t *rt = arg;

    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_REGISTER) {
        uint8_t buf[4096];
        size_t len = tandem__register__pack(env->register_, buf);

        if (rt->reg)
            tandem__register__free_unpacked(rt->reg, NULL);
        rt->reg = tandem__register__unpack(NULL, len, buf);
        rt->registers++;
        if (rt->reply) {
            Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
            Tandem__Registered ok = TANDEM__REGISTERED__INIT;

            ok.router_id = "router-test";
            out.payload_case = TANDEM__ENVELOPE__PAYLOAD_REGISTERED;
            out.registered = &ok;
            CHECK_STATUS(td_ctl_conn_send(conn, &out), TD_OK);
        }
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_LOAD) {
        rt->load = *env->load;
        rt->loads++;
    } else {
        rt->other_case = env->payload_case;
        rt->other_req = env->payload_case == TANDEM__ENVELOPE__PAYLOAD_TOKENS
                            ? env->tokens->req_id : 0;
        rt->others++;
    }
}

static void
router_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg)
{
    router_t *rt = arg;

    (void)why;
    (void)reason;
    rt->closed++;
    if (rt->conn == conn)
        rt->conn = NULL;
}

static td_hello_ident_t
ident(Tandem__Role role, const char *node, uint32_t rank)
{
    return (td_hello_ident_t){
        .protocol_version = TD_HELLO_PROTOCOL_VERSION,
        .role = role,
        .node_id = node,
        .rank_id = rank,
        .incarnation = 0x1234u + rank + ((uint64_t)role << 16),   /* never the router's */
        .model_fingerprint = "synthetic:test",
        .kv_layout_hash = 0xabcdefu,
    };
}

static void
router_start(router_t *rt, const uint8_t *key, size_t key_len, uint16_t port)
{
    td_ctl_config_t cfg = { .ident = ident(TANDEM__ROLE__ROLE_ROUTER, "router", 0),
                            .secret = key, .secret_len = key_len, .heartbeat_ms = HB_MS };
    td_ctl_handlers_t h = { router_on_established, router_on_message, router_on_closed, rt };

    memset(rt, 0, sizeof(*rt));
    rt->reply = 1;
    CHECK_STATUS(td_ctl_listener_create(base, &cfg, &h, "127.0.0.1", port, &rt->lst), TD_OK);
    rt->port = td_ctl_listener_port(rt->lst);
}

static void
router_stop(router_t *rt)
{
    td_ctl_listener_destroy(rt->lst);
    rt->lst = NULL;
    if (rt->reg)
        tandem__register__free_unpacked(rt->reg, NULL);
    rt->reg = NULL;
}

/* ---- the worker's link ---------------------------------------------------------- */

typedef struct {
    int ups, downs, messages;
    td_status_t down_why;
    td_link_router_t *last_up;
    Tandem__Envelope__PayloadCase msg_case;
    td_link_t *destroy_on_down;   /* destroy this link from inside on_down */
} events_t;

static events_t ev;

static void
on_up(td_link_t *l, td_link_router_t *r, void *arg)
{
    (void)l;
    (void)arg;
    ev.ups++;
    ev.last_up = r;
}

static void
on_message(td_link_t *l, td_link_router_t *r, const Tandem__Envelope *env, void *arg)
{
    (void)l;
    (void)r;
    (void)arg;
    ev.messages++;
    ev.msg_case = env->payload_case;
}

static void
on_down(td_link_t *l, td_link_router_t *r, td_status_t why, void *arg)
{
    (void)r;
    (void)arg;
    ev.downs++;
    ev.down_why = why;
    if (ev.destroy_on_down == l) {
        td_link_destroy(l);
        ev.destroy_on_down = NULL;
    }
}

static const td_link_handlers_t handlers = { on_up, on_message, on_down, NULL };

static uint8_t pool_a[] = { 1, 2, 3 }, pool_b[] = { 4, 5 }, addr_bytes[] = { 9, 8, 7, 6 };
static ProtobufCBinaryData pools[] = { { sizeof(pool_a), pool_a }, { sizeof(pool_b), pool_b } };

static Tandem__Register
reg_make(int draining)
{
    Tandem__Register reg = TANDEM__REGISTER__INIT;

    reg.engine_name = "synthetic";
    reg.engine_kind = "synthetic (test)";
    reg.vocab_size = 1000;
    reg.max_context = 4096;
    reg.draining = draining;
    reg.xfer_address = (ProtobufCBinaryData){ sizeof(addr_bytes), addr_bytes };
    reg.n_pools = 2;
    reg.pools = pools;
    reg.kv_tokens_total = 65536;
    reg.max_batch = 16;
    return reg;
}

static td_status_t
link_make(const char *routers, const uint8_t *key, size_t key_len, td_link_t **l)
{
    td_link_config_t cfg = {
        .ctl = { .ident = ident(TANDEM__ROLE__ROLE_DECODE, "worker-1", 3), .secret = key,
                 .secret_len = key_len, .heartbeat_ms = HB_MS },
        .routers = routers,
        .backoff_min_ms = 20,
        .backoff_max_ms = 200,
    };
    Tandem__Register reg = reg_make(0);

    return td_link_create(base, &cfg, &reg, &handlers, l);
}

/* ---- tests -------------------------------------------------------------------- */

static void
check_register(const Tandem__Register *reg, int draining)
{
    CHECK(reg != NULL);
    if (reg == NULL)
        return;
    CHECK_STR(reg->engine_name, "synthetic");
    CHECK_STR(reg->engine_kind, "synthetic (test)");
    CHECK_EQ_INT(reg->vocab_size, 1000);
    CHECK_EQ_INT(reg->max_context, 4096);
    CHECK_EQ_INT(reg->draining, draining);
    CHECK(reg->xfer_address.len == sizeof(addr_bytes) &&
          memcmp(reg->xfer_address.data, addr_bytes, sizeof(addr_bytes)) == 0);
    CHECK_EQ_INT(reg->n_pools, 2);
    if (reg->n_pools == 2) {
        CHECK(reg->pools[0].len == 3 && memcmp(reg->pools[0].data, pool_a, 3) == 0);
        CHECK(reg->pools[1].len == 2 && memcmp(reg->pools[1].data, pool_b, 2) == 0);
    }
    CHECK_EQ_INT(reg->kv_tokens_total, 65536);
    CHECK_EQ_INT(reg->max_batch, 16);
}

static void
test_one_router(void)
{
    router_t rt;
    td_link_t *l;
    char list[64];

    memset(&ev, 0, sizeof(ev));
    router_start(&rt, secret, sizeof(secret), 0);
    snprintf(list, sizeof(list), "127.0.0.1:%u", rt.port);
    CHECK_STATUS(link_make(list, secret, sizeof(secret), &l), TD_OK);
    CHECK_EQ_INT(td_link_routers_up(l), 0);
    CHECK(run_until(&ev.ups, 1, 3000));
    CHECK_EQ_INT(td_link_routers_up(l), 1);
    CHECK_STR(td_link_router_name(ev.last_up), list);

    /* Hello and Register as the router saw them. */
    CHECK_EQ_INT(rt.peer.role, TANDEM__ROLE__ROLE_DECODE);
    CHECK_STR(rt.peer_node, "worker-1");
    CHECK_EQ_INT(rt.peer.rank_id, 3);
    CHECK_EQ_INT(rt.registers, 1);
    check_register(rt.reg, 0);

    /* Messages both ways. */
    {
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        Tandem__Tokens tok = TANDEM__TOKENS__INIT;
        Tandem__Drain drain = TANDEM__DRAIN__INIT;

        tok.req_id = 77;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_TOKENS;
        env.tokens = &tok;
        CHECK_STATUS(td_link_send(l, ev.last_up, &env), TD_OK);
        CHECK(run_until(&rt.others, 1, 2000));
        CHECK_EQ_INT(rt.other_case, TANDEM__ENVELOPE__PAYLOAD_TOKENS);
        CHECK_EQ_INT(rt.other_req, 77);

        drain.draining = 1;
        env = (Tandem__Envelope)TANDEM__ENVELOPE__INIT;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DRAIN;
        env.drain = &drain;
        CHECK_STATUS(td_ctl_conn_send(rt.conn, &env), TD_OK);
        CHECK(run_until(&ev.messages, 1, 2000));
        CHECK_EQ_INT(ev.msg_case, TANDEM__ENVELOPE__PAYLOAD_DRAIN);
    }

    /* A new Register reaches the router; its second Registered is no new on_up. */
    {
        Tandem__Register reg = reg_make(1);

        CHECK_STATUS(td_link_set_register(l, &reg), TD_OK);
        CHECK(run_until(&rt.registers, 2, 2000));
        check_register(rt.reg, 1);
        run_for(50);
        CHECK_EQ_INT(ev.ups, 1);
    }

    /* Load: 100 quick changes become a few frames ending with the latest. */
    {
        Tandem__Load load = TANDEM__LOAD__INIT;
        int before;

        for (uint32_t i = 0; i < 100; i++) {
            load.running = i;
            load.kv_tokens_free = 1000 - i;
            td_link_load(l, &load);
        }
        run_for(150);
        CHECK(rt.loads >= 1 && rt.loads <= 3);
        CHECK_EQ_INT(rt.load.running, 99);
        CHECK_EQ_INT(rt.load.kv_tokens_free, 901);
        /* Unchanged, it is still refreshed once per heartbeat interval. */
        before = rt.loads;
        run_for(HB_MS * 3 + 50);
        CHECK(rt.loads - before >= 2 && rt.loads - before <= 4);
        CHECK_EQ_INT(rt.load.running, 99);
    }

    /* The router ends the connection: on_down, reconnect, Register again, up. */
    CHECK(rt.conn != NULL);
    if (rt.conn)
        td_ctl_conn_close(rt.conn, TANDEM__REJECT_CODE__REJECT_UNSPECIFIED, "test closes");
    CHECK(run_until(&ev.downs, 1, 2000));
    CHECK_EQ_INT(td_link_routers_up(l), 0);
    CHECK(run_until(&ev.ups, 2, 3000));
    CHECK_EQ_INT(rt.registers, 3);
    check_register(rt.reg, 1);   /* the latest Register */
    CHECK(run_until(&rt.loads, rt.loads + 1, 1000));   /* the latest Load after up */
    CHECK_EQ_INT(rt.load.running, 99);

    /* Destroy while connected: the router sees the connection end. */
    int closed = rt.closed;
    td_link_destroy(l);
    CHECK(run_until(&rt.closed, closed + 1, 2000));
    router_stop(&rt);
}

static void
test_two_routers(void)
{
    router_t a, b;
    td_link_t *l;
    char list[96];
    Tandem__Load load = TANDEM__LOAD__INIT;

    memset(&ev, 0, sizeof(ev));
    router_start(&a, secret, sizeof(secret), 0);
    router_start(&b, secret, sizeof(secret), 0);
    snprintf(list, sizeof(list), "127.0.0.1:%u, 127.0.0.1:%u", a.port, b.port);
    CHECK_STATUS(link_make(list, secret, sizeof(secret), &l), TD_OK);
    CHECK(run_until(&ev.ups, 2, 3000));
    CHECK_EQ_INT(td_link_routers_up(l), 2);
    CHECK_EQ_INT(a.registers, 1);
    CHECK_EQ_INT(b.registers, 1);
    load.queued = 5;
    td_link_load(l, &load);
    CHECK(run_until(&a.loads, 1, 1000));
    CHECK(run_until(&b.loads, 1, 1000));
    CHECK_EQ_INT(a.load.queued, 5);
    CHECK_EQ_INT(b.load.queued, 5);

    /* One router goes away: the other stays up. */
    router_stop(&b);
    CHECK(run_until(&ev.downs, 1, 2000));
    CHECK_EQ_INT(td_link_routers_up(l), 1);
    td_link_destroy(l);
    router_stop(&a);
}

static void
test_wrong_secret(void)
{
    router_t rt;
    td_link_t *l;
    char list[64];

    memset(&ev, 0, sizeof(ev));
    logbuf[0] = '\0';
    router_start(&rt, wrong_secret, sizeof(wrong_secret), 0);
    snprintf(list, sizeof(list), "127.0.0.1:%u", rt.port);
    CHECK_STATUS(link_make(list, secret, sizeof(secret), &l), TD_OK);
    CHECK(run_until(&rt.closed, 4, 3000));   /* retried */
    CHECK_EQ_INT(ev.ups, 0);
    CHECK_EQ_INT(rt.registers, 0);
    /* Logged with its reason, once, however many attempts. */
    CHECK_EQ_INT(log_count("link router 127.0.0.1:", NULL), 1);
    CHECK_EQ_INT(log_count("link router 127.0.0.1:", "auth"), 1);
    td_link_destroy(l);   /* while waiting or connecting */
    run_for(20);
    router_stop(&rt);
}

static void
test_router_comes_up(void)
{
    router_t rt;
    td_link_t *l;
    char list[64];
    uint16_t port;

    /* A port with nobody listening. */
    memset(&ev, 0, sizeof(ev));
    router_start(&rt, secret, sizeof(secret), 0);
    port = rt.port;
    router_stop(&rt);
    logbuf[0] = '\0';
    snprintf(list, sizeof(list), "127.0.0.1:%u", port);
    CHECK_STATUS(link_make(list, secret, sizeof(secret), &l), TD_OK);
    run_for(600);   /* many attempts at up to 200 ms */
    CHECK_EQ_INT(ev.ups, 0);
    CHECK_EQ_INT(log_count("link router 127.0.0.1:", NULL), 1);

    /* The operator starts the router: the link finds it. */
    router_start(&rt, secret, sizeof(secret), port);
    CHECK(run_until(&ev.ups, 1, 3000));
    CHECK_EQ_INT(log_count("link router 127.0.0.1:", ": up ("), 1);

    /* on_down may destroy the link. */
    ev.destroy_on_down = l;
    router_stop(&rt);
    CHECK(run_until(&ev.downs, 1, 2000));
    CHECK(ev.destroy_on_down == NULL);
    run_for(20);
}

static void
test_destroy_early(void)
{
    router_t rt;
    td_link_t *l;
    char list[64];

    router_start(&rt, secret, sizeof(secret), 0);
    snprintf(list, sizeof(list), "127.0.0.1:%u", rt.port);
    /* Right after create: TCP connect in progress. */
    CHECK_STATUS(link_make(list, secret, sizeof(secret), &l), TD_OK);
    td_link_destroy(l);
    /* In the handshake or registering. */
    rt.reply = 0;
    CHECK_STATUS(link_make(list, secret, sizeof(secret), &l), TD_OK);
    CHECK(run_until(&rt.registers, 1, 2000));
    td_link_destroy(l);
    run_for(20);
    router_stop(&rt);
}

static void
test_bad_lists(void)
{
    static const char *const bad[] = {
        "", "  ", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:7000,", "127.0.0.1:x", ",127.0.0.1:7000",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        td_link_t *l = NULL;

        CHECK_STATUS(link_make(bad[i], secret, sizeof(secret), &l), TD_ERR_INVALID);
        CHECK(l == NULL);
    }
    {
        td_link_t *l = NULL;

        CHECK_STATUS(link_make("127.0.0.1:7000", secret, 0, &l), TD_ERR_INVALID);
        CHECK(l == NULL);
    }
    {
        /* An identity Hello would refuse fails at create, not at every retry. */
        td_link_config_t cfg = {
            .ctl = { .ident = ident(TANDEM__ROLE__ROLE_DECODE, "bad id", 0), .secret = secret,
                     .secret_len = sizeof(secret) },
            .routers = "127.0.0.1:7000",
        };
        Tandem__Register reg = reg_make(0);
        td_link_t *l = NULL;

        CHECK_STATUS(td_link_create(base, &cfg, &reg, &handlers, &l), TD_ERR_INVALID);
        CHECK(l == NULL);
    }
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);   /* libevent writes with writev */
    base = event_base_new();
    td_log_set_sink(log_sink, NULL);
    test_one_router();
    test_two_routers();
    test_wrong_secret();
    test_router_comes_up();
    test_destroy_early();
    test_bad_lists();
    td_log_set_sink(NULL, NULL);
    if (td_check_failures)
        fprintf(stderr, "captured log:\n%s", logbuf);
    event_base_free(base);
    return td_check_exit("test_link");
}
