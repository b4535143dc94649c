/* net/link.c — a worker rank's control connections to its routers:
 * connect, Register, Registered -> up, Load coalescing and refresh, and
 * reconnection with exponential backoff and jitter, each state change logged once. */
#include "link.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "clock.h"
#include "daemon.h"
#include "log.h"
#include "netif.h"

#define LINK_LOAD_GAP_MS         50u     /* at most one Load per router per this */
#define LINK_BACKOFF_MIN_DEFAULT 100u
#define LINK_BACKOFF_MAX_DEFAULT 2000u

/* One router connection's state. */
typedef enum {
    LINK_R_WAIT = 0,     /* no connection; the retry timer is armed */
    LINK_R_CONNECTING,   /* TCP connect and handshake in progress */
    LINK_R_REGISTERING,  /* established, Register sent, waiting for Registered */
    LINK_R_UP,           /* Registered received: work flows */
} link_rstate_t;

static const char *const link_rstate_names[] = {
    [LINK_R_WAIT] = "wait",
    [LINK_R_CONNECTING] = "connecting",
    [LINK_R_REGISTERING] = "registering",
    [LINK_R_UP] = "up",
};

/* Allowed transitions: bit `to` set in link_rstate_next[from]. */
static const unsigned link_rstate_next[] = {
    [LINK_R_WAIT] = 1u << LINK_R_CONNECTING | 1u << LINK_R_WAIT,
    [LINK_R_CONNECTING] = 1u << LINK_R_REGISTERING | 1u << LINK_R_WAIT,
    [LINK_R_REGISTERING] = 1u << LINK_R_UP | 1u << LINK_R_WAIT,
    [LINK_R_UP] = 1u << LINK_R_WAIT,
};

struct td_link_router_s {
    td_link_t *l;
    char name[TD_NET_HOST_MAX + 8];   /* "host:port" as configured */
    td_net_addrs_t addrs;
    link_rstate_t state;
    td_ctl_conn_t *conn;              /* NULL in WAIT */
    struct event *retry;              /* backoff timer */
    struct event *load;               /* Load pacing: coalescing gap and refresh */
    uint32_t backoff_ms;              /* next retry delay, before jitter */
    uint64_t load_sent_ms;            /* monotonic time of the last Load sent */
    uint64_t load_sent_seq;           /* l->load_seq of that Load */
    td_status_t fail_why;             /* the failure last logged above debug */
    char fail_reason[TD_HELLO_REASON_MAX];
};

struct td_link_s {
    struct event_base *base;
    td_ctl_config_t ctl;              /* copy; strings and secret below are ours */
    char *node_id;
    char *fingerprint;
    uint8_t *secret;
    td_link_handlers_t h;
    Tandem__Register *reg;            /* deep copy (unpacked from our packing) */
    Tandem__Load load;                /* latest published (scalars only) */
    uint64_t load_seq;                /* 0 = none published yet */
    uint32_t backoff_min, backoff_max, refresh_ms;
    size_t n;
    td_link_router_t *routers;        /* [n] */
    int busy;                         /* depth of calls that may reach a handler */
    int doomed;                       /* destroy was called while busy */
};

static void link_free(td_link_t *l);

static uint64_t
link_now_ms(void)
{
    return td_clock_ns() / 1000000u;
}

/* Guard around anything that may call a handler (which may destroy the
 * link): link_leave returns 1 when the link was freed. */
static void
link_enter(td_link_t *l)
{
    l->busy++;
}

static int
link_leave(td_link_t *l)
{
    if (--l->busy == 0 && l->doomed) {
        link_free(l);
        return 1;
    }
    return 0;
}

static void
link_set_state(td_link_router_t *r, link_rstate_t to)
{
    if (!(link_rstate_next[r->state] & (1u << to))) {
        td_error("link router %s: bad transition %s -> %s", r->name,
                 link_rstate_names[r->state], link_rstate_names[to]);
        abort();   /* an invariant of this file, not input */
    }
    td_debug("link router %s: %s -> %s", r->name, link_rstate_names[r->state],
             link_rstate_names[to]);
    r->state = to;
}

static void
link_timer_ms(struct event *ev, uint64_t ms)
{
    struct timeval tv = td_ctl_timeval_ms((uint32_t)ms);

    evtimer_add(ev, &tv);
}

/* ------------------------------------------------------------------------ */
/* Register and Load                                                        */
/* ------------------------------------------------------------------------ */

/* Deep copy of reg through its packed form. */
static td_status_t
link_reg_copy(const Tandem__Register *reg, Tandem__Register **out)
{
    size_t len = tandem__register__get_packed_size(reg);
    uint8_t *buf = malloc(len ? len : 1);
    Tandem__Register *copy;

    if (buf == NULL)
        return TD_ERR_NOMEM;
    tandem__register__pack(reg, buf);
    copy = tandem__register__unpack(NULL, len, buf);
    free(buf);
    if (copy == NULL) {
        td_error("link: register message does not survive packing");
        return TD_ERR_INVALID;
    }
    *out = copy;
    return TD_OK;
}

static td_status_t
link_send_register(td_link_router_t *r)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_REGISTER;
    env.register_ = r->l->reg;
    return td_ctl_conn_send(r->conn, &env);
}

/* Send the latest Load now (also unchanged: the refresh), then arm the
 * refresh timer. A full output buffer retries after the gap. */
static void
link_load_send(td_link_router_t *r)
{
    td_link_t *l = r->l;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    td_status_t st;

    if (l->load_seq == 0 || r->state != LINK_R_UP)
        return;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_LOAD;
    env.load = &l->load;
    st = td_ctl_conn_send(r->conn, &env);
    if (st != TD_OK) {
        td_debug("link router %s: load not sent: %s; retrying", r->name, td_status_str(st));
        link_timer_ms(r->load, LINK_LOAD_GAP_MS);
        return;
    }
    r->load_sent_ms = link_now_ms();
    r->load_sent_seq = l->load_seq;
    link_timer_ms(r->load, l->refresh_ms);
}

/* A new Load was published: send it now, or when the gap since the last
 * one has passed (later ones published meanwhile replace it). */
static void
link_load_kick(td_link_router_t *r)
{
    uint64_t elapsed;

    if (r->state != LINK_R_UP || r->load_sent_seq == r->l->load_seq)
        return;
    elapsed = link_now_ms() - r->load_sent_ms;
    if (elapsed >= LINK_LOAD_GAP_MS)
        link_load_send(r);
    else
        link_timer_ms(r->load, LINK_LOAD_GAP_MS - elapsed);
}

static void
link_load_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    link_load_send(arg);
}

/* ------------------------------------------------------------------------ */
/* Connection life                                                          */
/* ------------------------------------------------------------------------ */

static void link_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg);
static void link_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg);
static void link_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg);

/* Arm the retry timer: a delay drawn from [backoff/2, backoff], then the
 * backoff doubles up to its cap. */
static void
link_retry_later(td_link_router_t *r)
{
    td_link_t *l = r->l;
    uint32_t half = r->backoff_ms / 2;
    uint64_t delay = half + td_daemon_random64() % (half + 1u);

    link_set_state(r, LINK_R_WAIT);
    link_timer_ms(r->retry, delay ? delay : 1u);
    td_debug("link router %s: retry in %llu ms", r->name, (unsigned long long)delay);
    r->backoff_ms = r->backoff_ms >= l->backoff_max / 2 ? l->backoff_max : r->backoff_ms * 2;
}

/* A connection attempt (or connection) failed: log it when it differs from
 * the failure logged last, so that a router that stays down costs one line. */
static void
link_failed(td_link_router_t *r, td_status_t why, const char *reason)
{
    if (why == r->fail_why && strcmp(reason, r->fail_reason) == 0) {
        td_debug("link router %s: still failing: %s", r->name, reason);
    } else {
        td_warn("link router %s: %s (%s); retrying with backoff up to %u ms", r->name,
                reason, td_status_str(why), r->l->backoff_max);
        r->fail_why = why;
        snprintf(r->fail_reason, sizeof(r->fail_reason), "%s", reason);
    }
    link_retry_later(r);
}

static void
link_connect(td_link_router_t *r)
{
    static const td_ctl_handlers_t handlers_tmpl = {
        .on_established = link_on_established,
        .on_message = link_on_message,
        .on_closed = link_on_closed,
    };
    td_ctl_handlers_t h = handlers_tmpl;
    td_status_t st;

    h.arg = r;
    link_set_state(r, LINK_R_CONNECTING);
    st = td_ctl_conn_connect_addrs(r->l->base, &r->l->ctl, &h, &r->addrs, &r->conn);
    if (st != TD_OK) {
        r->conn = NULL;
        link_failed(r, st, "cannot start connecting");
    }
}

static void
link_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    link_connect(arg);
}

static void
link_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg)
{
    td_link_router_t *r = arg;
    td_link_t *l = r->l;
    td_status_t st;

    link_enter(l);
    if (peer->role != TANDEM__ROLE__ROLE_ROUTER) {
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_IDENTITY,
                          "a worker's router link reached a peer that is not a router");
    } else {
        link_set_state(r, LINK_R_REGISTERING);
        st = link_send_register(r);
        if (st != TD_OK)
            td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_UNSPECIFIED,
                              "cannot send register");
    }
    link_leave(l);
}

static void
link_on_registered(td_link_router_t *r, const Tandem__Registered *msg)
{
    td_link_t *l = r->l;
    char id[TD_HELLO_REASON_MAX];

    if (r->state == LINK_R_UP) {
        td_debug("link router %s: registered again", r->name);   /* answer to set_register */
        return;
    }
    td_hello_printable(id, sizeof(id), msg->router_id, strlen(msg->router_id));
    link_set_state(r, LINK_R_UP);
    td_info("link router %s: up (router id \"%s\")", r->name, id);
    r->backoff_ms = l->backoff_min;
    r->fail_why = TD_OK;
    r->fail_reason[0] = '\0';
    r->load_sent_ms = 0;
    r->load_sent_seq = 0;
    link_load_send(r);
    if (l->h.on_up)
        l->h.on_up(l, r, l->h.arg);
}

static void
link_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    td_link_router_t *r = arg;
    td_link_t *l = r->l;

    link_enter(l);
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_REGISTERED) {
        link_on_registered(r, env->registered);
    } else if (r->state != LINK_R_UP) {
        td_ctl_conn_close(conn, TANDEM__REJECT_CODE__REJECT_PROTO,
                          "message before registered");
    } else if (l->h.on_message) {
        l->h.on_message(l, r, env, l->h.arg);
    }
    link_leave(l);
}

static void
link_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg)
{
    td_link_router_t *r = arg;
    td_link_t *l = r->l;
    int was_up = r->state == LINK_R_UP;

    link_enter(l);
    td_ctl_conn_destroy(conn);
    r->conn = NULL;
    evtimer_del(r->load);
    if (was_up) {
        td_warn("link router %s: down: %s", r->name, reason);
        r->backoff_ms = l->backoff_min;
        r->fail_why = why;
        snprintf(r->fail_reason, sizeof(r->fail_reason), "%s", reason);
        link_retry_later(r);
        if (l->h.on_down)
            l->h.on_down(l, r, why, l->h.arg);
    } else {
        link_failed(r, why, reason);
    }
    link_leave(l);
}

/* ------------------------------------------------------------------------ */
/* Create / destroy                                                         */
/* ------------------------------------------------------------------------ */

/* Copy the ctl config with the strings and the secret it borrows. */
static td_status_t
link_ctl_copy(td_link_t *l, const td_ctl_config_t *ctl)
{
    if (ctl->secret == NULL || ctl->secret_len == 0 || ctl->ident.node_id == NULL) {
        td_error("link: a secret and a node id are required");
        return TD_ERR_INVALID;
    }
    l->ctl = *ctl;
    l->node_id = strdup(ctl->ident.node_id);
    l->fingerprint = strdup(ctl->ident.model_fingerprint ? ctl->ident.model_fingerprint : "");
    l->secret = malloc(ctl->secret_len);
    if (l->node_id == NULL || l->fingerprint == NULL || l->secret == NULL)
        return TD_ERR_NOMEM;
    memcpy(l->secret, ctl->secret, ctl->secret_len);
    l->ctl.ident.node_id = l->node_id;
    l->ctl.ident.model_fingerprint = l->fingerprint;
    l->ctl.secret = l->secret;
    return td_hello_ident_check(&l->ctl.ident) == TD_OK ? TD_OK : TD_ERR_INVALID;
}

/* The number of routers "host:port[,host:port...]" names; 0 (logged) for
 * an empty list. */
static size_t
link_routers_count(const char *list)
{
    size_t n = 1;

    if (list == NULL || list[strspn(list, " \t")] == '\0') {
        td_error("link: no routers given");
        return 0;
    }
    for (const char *c = list; *c; c++)
        n += *c == ',';
    return n;
}

/* Router i of list, at *p (moved past it): trimmed into name, parsed and
 * resolved into addrs. A bad entry is logged. */
static td_status_t
link_router_next(const char *list, size_t i, const char **p, char *name, size_t namelen,
                 td_net_addrs_t *addrs)
{
    size_t tok = strcspn(*p, ","), len = tok;
    const char *s = *p;
    char host[TD_NET_HOST_MAX];
    uint16_t port;

    *p += tok + ((*p)[tok] == ',');
    while (len > 0 && (*s == ' ' || *s == '\t'))
        s++, len--;
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    if (len == 0 || len >= namelen) {
        td_error("link: router %zu of \"%s\": empty or too long", i + 1, list);
        return TD_ERR_INVALID;
    }
    memcpy(name, s, len);
    name[len] = '\0';
    if (td_net_addr_parse(name, host, sizeof(host), &port) != TD_OK)
        return TD_ERR_INVALID;   /* logged by net */
    if (port == 0) {
        td_error("link: router %s: port 0", name);
        return TD_ERR_INVALID;
    }
    if (td_net_resolve(host, port, 0, addrs) != TD_OK)
        return TD_ERR_INVALID;   /* logged by net */
    return TD_OK;
}

/* Parse and resolve "host:port[,host:port...]" into l->routers. */
static td_status_t
link_routers_parse(td_link_t *l, const char *list)
{
    const char *p = list;
    size_t n = link_routers_count(list);

    if (n == 0)
        return TD_ERR_INVALID;
    l->routers = calloc(n, sizeof(*l->routers));
    if (l->routers == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        td_link_router_t *r = &l->routers[i];
        td_status_t st = link_router_next(list, i, &p, r->name, sizeof(r->name), &r->addrs);

        if (st != TD_OK)
            return st;
        r->l = l;
        r->backoff_ms = l->backoff_min;
        r->retry = evtimer_new(l->base, link_retry_cb, r);
        r->load = evtimer_new(l->base, link_load_cb, r);
        l->n = i + 1;   /* link_free releases routers [0, n) */
        if (r->retry == NULL || r->load == NULL)
            return TD_ERR_NOMEM;
    }
    return TD_OK;
}

td_status_t
td_link_routers_resolve(const char *routers, td_link_addr_t **out, size_t *n_out)
{
    const char *p = routers;
    size_t n = link_routers_count(routers);
    td_link_addr_t *a;

    if (n == 0)
        return TD_ERR_INVALID;
    if ((a = calloc(n, sizeof(*a))) == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        if (link_router_next(routers, i, &p, a[i].name, sizeof(a[i].name), &a[i].addrs) != TD_OK) {
            free(a);
            return TD_ERR_INVALID;
        }
    *out = a;
    *n_out = n;
    return TD_OK;
}

td_status_t
td_link_routers_netif(const char *routers, char *ifname, size_t len)
{
    const char *p = routers;
    size_t n = link_routers_count(routers);
    td_net_addrs_t addrs, first = { 0 };
    char name[TD_NET_HOST_MAX + 8];
    bool loopback = true;

    if (n == 0)
        return TD_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (link_router_next(routers, i, &p, name, sizeof(name), &addrs) != TD_OK)
            return TD_ERR_INVALID;
        if (i == 0)
            first = addrs;
        for (size_t j = 0; j < addrs.n; j++)
            loopback &= td_netif_addr_is_loopback((const struct sockaddr *)&addrs.a[j].sa);
    }
    if (loopback)
        return td_netif_loopback(ifname, len);
    return td_netif_route((const struct sockaddr *)&first.a[0].sa, first.a[0].len, ifname, len);
}

td_status_t
td_link_create(struct event_base *base, const td_link_config_t *cfg,
               const Tandem__Register *reg, const td_link_handlers_t *h, td_link_t **out)
{
    td_link_t *l = calloc(1, sizeof(*l));
    td_status_t st;

    if (l == NULL)
        return TD_ERR_NOMEM;
    l->base = base;
    l->h = *h;
    l->backoff_min = cfg->backoff_min_ms ? cfg->backoff_min_ms : LINK_BACKOFF_MIN_DEFAULT;
    l->backoff_max = cfg->backoff_max_ms ? cfg->backoff_max_ms : LINK_BACKOFF_MAX_DEFAULT;
    if (l->backoff_max < l->backoff_min)
        l->backoff_max = l->backoff_min;
    l->refresh_ms = cfg->ctl.heartbeat_ms ? cfg->ctl.heartbeat_ms : TD_CTL_HEARTBEAT_MS_DEFAULT;
    l->load = (Tandem__Load)TANDEM__LOAD__INIT;
    st = link_ctl_copy(l, &cfg->ctl);
    if (st != TD_OK)
        goto err_free_link;
    st = link_reg_copy(reg, &l->reg);
    if (st != TD_OK)
        goto err_free_link;
    st = link_routers_parse(l, cfg->routers);
    if (st != TD_OK)
        goto err_free_link;
    for (size_t i = 0; i < l->n; i++)
        link_connect(&l->routers[i]);
    *out = l;
    return TD_OK;

err_free_link:
    link_free(l);
    return st;
}

static void
link_free(td_link_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        td_link_router_t *r = &l->routers[i];

        if (r->conn)
            td_ctl_conn_destroy(r->conn);
        if (r->retry)
            event_free(r->retry);
        if (r->load)
            event_free(r->load);
    }
    free(l->routers);
    if (l->reg)
        tandem__register__free_unpacked(l->reg, NULL);
    if (l->secret) {
        explicit_bzero(l->secret, l->ctl.secret_len);
        free(l->secret);
    }
    free(l->fingerprint);
    free(l->node_id);
    free(l);
}

void
td_link_destroy(td_link_t *l)
{
    if (l == NULL)
        return;
    if (l->busy) {
        l->doomed = 1;   /* freed when the handler in progress returns */
        return;
    }
    link_free(l);
}

/* ------------------------------------------------------------------------ */
/* Use                                                                      */
/* ------------------------------------------------------------------------ */

td_status_t
td_link_set_register(td_link_t *l, const Tandem__Register *reg)
{
    Tandem__Register *copy;
    td_status_t st = link_reg_copy(reg, &copy);

    if (st != TD_OK)
        return st;
    tandem__register__free_unpacked(l->reg, NULL);
    l->reg = copy;
    link_enter(l);
    for (size_t i = 0; i < l->n && !l->doomed; i++) {
        td_link_router_t *r = &l->routers[i];

        if (r->state != LINK_R_REGISTERING && r->state != LINK_R_UP)
            continue;
        st = link_send_register(r);
        if (st != TD_OK)   /* the router must not keep the old one: reconnect */
            td_ctl_conn_close(r->conn, TANDEM__REJECT_CODE__REJECT_UNSPECIFIED,
                              "cannot send the new register");
    }
    link_leave(l);
    return TD_OK;
}

td_status_t
td_link_send(td_link_t *l, td_link_router_t *r, const Tandem__Envelope *env)
{
    (void)l;
    if (r->state != LINK_R_UP)
        return TD_ERR_STATE;
    return td_ctl_conn_send(r->conn, env);
}

size_t
td_link_broadcast(td_link_t *l, const Tandem__Envelope *env)
{
    size_t sent = 0;

    for (size_t i = 0; i < l->n; i++)
        if (l->routers[i].state == LINK_R_UP && td_ctl_conn_send(l->routers[i].conn, env) == TD_OK)
            sent++;
    return sent;
}

void
td_link_load(td_link_t *l, const Tandem__Load *load)
{
    l->load = *load;
    l->load.base.n_unknown_fields = 0;
    l->load.base.unknown_fields = NULL;
    l->load_seq++;
    for (size_t i = 0; i < l->n; i++)
        link_load_kick(&l->routers[i]);
}

const char *
td_link_router_name(const td_link_router_t *r)
{
    return r->name;
}

size_t
td_link_routers_up(const td_link_t *l)
{
    size_t up = 0;

    for (size_t i = 0; i < l->n; i++)
        up += l->routers[i].state == LINK_R_UP;
    return up;
}
