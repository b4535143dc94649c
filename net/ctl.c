/* net/ctl.c — control connections on libevent bufferevents: handshake
 * state machine, heartbeats and dead-peer detection, Reject on the way out,
 * and a listener serving many connections on one loop. */
#include "ctl.h"

#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <openssl/crypto.h>

#include "frame.h"
#include "clock.h"
#include "log.h"
#include "net.h"

#define CTL_FLUSH_MS 1000u   /* how long a closing connection may take to send its Reject */
#define CTL_ACCEPT_PAUSE_MIN_MS 100u    /* after an accept error, accepting pauses ... */
#define CTL_ACCEPT_PAUSE_MAX_MS 1000u   /* ... doubling up to this while it keeps failing */

/* Our copy of a td_ctl_config_t: defaults applied, strings and secret owned. */
typedef struct {
    td_ctl_config_t cfg;
    char *node_id;
    char *model;
    uint8_t *secret;
} ctl_cfg_t;

struct td_ctl_conn_s {
    struct event_base *base;
    td_ctl_listener_t *lst;          /* owner when accepted, else NULL */
    td_ctl_conn_t *prev, *next;      /* in lst->conns */
    td_ctl_conn_t *uprev, *unext;    /* in lst's handshake list, oldest first */
    uint8_t src[16];                 /* accepted: the peer's address, IPv4 as ::ffff:a.b.c.d */
    struct bufferevent *bev;         /* NULL once the socket is gone */
    struct event *timer;             /* handshake deadline, then heartbeat tick */
    td_ctl_state_t state;
    td_hello_dir_t dir;              /* whether we connected or accepted */
    td_net_addrs_t addrs;            /* initiator: addresses to try, in order */
    size_t next_addr;                /* the next one to try */
    ctl_cfg_t cfg;
    td_ctl_handlers_t h;
    uint8_t nonce[TD_HELLO_NONCE_LEN];
    Tandem__Hello hello;             /* ours; borrows cfg strings and nonce */
    Tandem__Envelope *peer_env;      /* the peer's Hello frame, owned */
    uint64_t hb_seq, hb_rx;
    uint64_t last_rx_ns;             /* CLOCK_MONOTONIC of the last frame received */
    int busy;                        /* depth of libevent/user entry into this conn */
    int doomed;                      /* free once busy == 0 and bev == NULL */
    char addr[64];
    char name[160];
    char reason[TD_HELLO_REASON_MAX];
};

struct td_ctl_listener_s {
    struct event_base *base;
    struct evconnlistener *evl;
    ctl_cfg_t lcfg;                  /* copied once per accepted connection */
    td_ctl_handlers_t h;
    td_ctl_conn_t *conns;
    size_t nconns;
    size_t nunauth;                  /* conns in connecting/hello/auth: */
    td_ctl_conn_t *uhead, *utail;    /*   the list of them, oldest first */
    uint64_t evicted;                /* closed at a handshake cap, this episode */
    struct event *resume;            /* re-enables accepting after an accept error */
    uint32_t pause_ms;               /* current pause; 0 = accepting normally */
    uint16_t port;
};

/* ------------------------------------------------------------------------ */
/* State machine                                                            */
/* ------------------------------------------------------------------------ */

static const char *const ctl_state_names[] = {
    [TD_CTL_CONNECTING]  = "connecting",
    [TD_CTL_HELLO]       = "hello",
    [TD_CTL_AUTH]        = "auth",
    [TD_CTL_ESTABLISHED] = "established",
    [TD_CTL_CLOSED]      = "closed",
};

/* ctl_transitions[from] = bit set of allowed next states. */
static const unsigned ctl_transitions[] = {
    [TD_CTL_CONNECTING]  = 1u << TD_CTL_HELLO | 1u << TD_CTL_CLOSED,
    [TD_CTL_HELLO]       = 1u << TD_CTL_AUTH | 1u << TD_CTL_CLOSED,
    [TD_CTL_AUTH]        = 1u << TD_CTL_ESTABLISHED | 1u << TD_CTL_CLOSED,
    [TD_CTL_ESTABLISHED] = 1u << TD_CTL_CLOSED,
    [TD_CTL_CLOSED]      = 0,
};

const char *
td_ctl_state_str(td_ctl_state_t state)
{
    if ((unsigned)state > TD_CTL_CLOSED)
        return "?";
    return ctl_state_names[state];
}

/* Not authenticated yet (counted against the listener's max_unauth). */
static int
ctl_state_unauth(td_ctl_state_t state)
{
    return state < TD_CTL_ESTABLISHED;
}

/* The listener's count and list of connections in the handshake. */
static void
ctl_unauth_add(td_ctl_listener_t *lst, td_ctl_conn_t *c)
{
    c->unext = NULL;
    c->uprev = lst->utail;
    if (lst->utail)
        lst->utail->unext = c;
    else
        lst->uhead = c;
    lst->utail = c;
    lst->nunauth++;
}

static void
ctl_unauth_del(td_ctl_listener_t *lst, td_ctl_conn_t *c)
{
    if (c->uprev)
        c->uprev->unext = c->unext;
    else
        lst->uhead = c->unext;
    if (c->unext)
        c->unext->uprev = c->uprev;
    else
        lst->utail = c->uprev;
    c->uprev = c->unext = NULL;
    lst->nunauth--;
}

static void
ctl_set_state(td_ctl_conn_t *c, td_ctl_state_t to)
{
    if (!(ctl_transitions[c->state] & (1u << to))) {
        td_error("ctl %s: invalid transition %s -> %s", c->name,
                 td_ctl_state_str(c->state), td_ctl_state_str(to));
        assert(!"invalid ctl state transition");
        return;
    }
    td_debug("ctl %s: %s -> %s", c->name, td_ctl_state_str(c->state), td_ctl_state_str(to));
    if (c->lst && ctl_state_unauth(c->state) && !ctl_state_unauth(to))
        ctl_unauth_del(c->lst, c);
    c->state = to;
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static uint64_t
ctl_now_ns(clockid_t clk)
{
    struct timespec ts;

    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void
ctl_cfg_free(ctl_cfg_t *c)
{
    free(c->node_id);
    free(c->model);
    if (c->secret)
        OPENSSL_cleanse(c->secret, c->cfg.secret_len);
    free(c->secret);
    memset(c, 0, sizeof(*c));
}

static td_status_t
ctl_cfg_copy(ctl_cfg_t *dst, const td_ctl_config_t *src)
{
    td_status_t st = td_hello_ident_check(&src->ident);

    if (st != TD_OK)
        return st;
    if (src->secret == NULL || src->secret_len == 0) {
        td_error("ctl: a cluster secret is required");
        return TD_ERR_INVALID;
    }
    memset(dst, 0, sizeof(*dst));
    dst->cfg = *src;
    dst->node_id = strdup(src->ident.node_id);
    dst->model = strdup(src->ident.model_fingerprint);
    dst->secret = malloc(src->secret_len);
    if (!dst->node_id || !dst->model || !dst->secret) {
        ctl_cfg_free(dst);
        return TD_ERR_NOMEM;
    }
    memcpy(dst->secret, src->secret, src->secret_len);
    dst->cfg.ident.node_id = dst->node_id;
    dst->cfg.ident.model_fingerprint = dst->model;
    dst->cfg.secret = dst->secret;
    if (dst->cfg.heartbeat_ms == 0)
        dst->cfg.heartbeat_ms = TD_CTL_HEARTBEAT_MS_DEFAULT;
    if (dst->cfg.dead_after == 0)
        dst->cfg.dead_after = TD_CTL_DEAD_AFTER_DEFAULT;
    if (dst->cfg.handshake_ms == 0)
        dst->cfg.handshake_ms = TD_CTL_HANDSHAKE_MS_DEFAULT;
    if (dst->cfg.max_frame == 0)
        dst->cfg.max_frame = TD_FRAME_MAX_DEFAULT;
    if (dst->cfg.max_unauth == 0)
        dst->cfg.max_unauth = TD_CTL_MAX_UNAUTH_DEFAULT;
    if (dst->cfg.max_unauth_per_source == 0)
        dst->cfg.max_unauth_per_source = TD_CTL_MAX_UNAUTH_PER_SOURCE_DEFAULT;
    if (dst->cfg.max_output == 0) {
        uint64_t out = 4 * (uint64_t)dst->cfg.max_frame + TD_CTL_OUTPUT_SLACK;

        dst->cfg.max_output = out > UINT32_MAX ? UINT32_MAX : (uint32_t)out;
    }
    if ((uint64_t)dst->cfg.max_output < (uint64_t)dst->cfg.max_frame + TD_FRAME_HEADER_LEN) {
        td_error("ctl: max_output (%" PRIu32 " bytes) cannot hold one frame of max_frame "
                 "(%" PRIu32 " bytes)", dst->cfg.max_output, dst->cfg.max_frame);
        ctl_cfg_free(dst);
        return TD_ERR_INVALID;
    }
    return TD_OK;
}

static void
ctl_timer_arm(td_ctl_conn_t *c, uint32_t ms)
{
    struct timeval tv = td_ctl_timeval_ms(ms);

    evtimer_add(c->timer, &tv);
}

/* Frame body cap in the current state. */
static uint32_t
ctl_conn_frame_max(const td_ctl_conn_t *c)
{
    return c->state == TD_CTL_ESTABLISHED ? c->cfg.cfg.max_frame : TD_CTL_HELLO_FRAME_MAX;
}

/* Envelope payload case = field number of the oneof member. */
static const char *
ctl_payload_name(Tandem__Envelope__PayloadCase pc)
{
    switch (pc) {
    case TANDEM__ENVELOPE__PAYLOAD_HELLO:      return "hello";
    case TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH: return "hello_auth";
    case TANDEM__ENVELOPE__PAYLOAD_REJECT:     return "reject";
    case TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT:  return "heartbeat";
    default:                                   return "message";
    }
}

/* Status for a Reject code received from the peer. */
static td_status_t
ctl_reject_status(Tandem__RejectCode code)
{
    switch (code) {
    case TANDEM__REJECT_CODE__REJECT_VERSION:
    case TANDEM__REJECT_CODE__REJECT_MODEL:
    case TANDEM__REJECT_CODE__REJECT_LAYOUT:  return TD_ERR_MISMATCH;
    case TANDEM__REJECT_CODE__REJECT_AUTH:    return TD_ERR_AUTH;
    case TANDEM__REJECT_CODE__REJECT_TIMEOUT: return TD_ERR_TIMEOUT;
    default:                                  return TD_ERR_PEER;
    }
}

static void
ctl_conn_drop_bev(td_ctl_conn_t *c)
{
    if (c->bev) {
        bufferevent_free(c->bev);
        c->bev = NULL;
    }
}

static void
ctl_conn_free(td_ctl_conn_t *c)
{
    td_ctl_listener_t *lst = c->lst;

    if (lst) {
        if (c->prev)
            c->prev->next = c->next;
        else
            lst->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        lst->nconns--;
        if (ctl_state_unauth(c->state))
            ctl_unauth_del(lst, c);
    }
    ctl_conn_drop_bev(c);
    if (c->timer)
        event_free(c->timer);
    if (c->peer_env)
        tandem__envelope__free_unpacked(c->peer_env, NULL);
    ctl_cfg_free(&c->cfg);
    free(c);
}

/* Every entry into a connection (libevent callback, public call that may
 * run user callbacks) is bracketed by busy++ / ctl_conn_leave(). */
static void
ctl_conn_leave(td_ctl_conn_t *c)
{
    assert(c->busy > 0);
    if (--c->busy == 0 && c->doomed && c->bev == NULL)
        ctl_conn_free(c);
}

static td_status_t
ctl_conn_write(td_ctl_conn_t *c, const Tandem__Envelope *env)
{
    return td_frame_encode(bufferevent_get_output(c->bev), env, ctl_conn_frame_max(c));
}

/* End the connection: log why, send Reject{code} first when code is set and
 * the socket is connected, call on_closed. */
static void ctl_conn_fail(td_ctl_conn_t *c, td_status_t why, Tandem__RejectCode code,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void
ctl_conn_fail(td_ctl_conn_t *c, td_status_t why, Tandem__RejectCode code, const char *fmt, ...)
{
    va_list ap;
    int flushing = 0;

    if (c->state == TD_CTL_CLOSED)
        return;
    va_start(ap, fmt);
    vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
    va_end(ap);
    if (c->state == TD_CTL_CONNECTING)
        /* The connecting side retries; it logs once per episode (net/link.c). */
        td_debug("ctl %s: closing in state %s: %s", c->name, td_ctl_state_str(c->state), c->reason);
    else if (why == TD_ERR_BUSY)
        /* evicted at a handshake cap: the listener logs the episode once */
        td_debug("ctl %s: closing in state %s: %s", c->name, td_ctl_state_str(c->state), c->reason);
    else if (why == TD_ERR_CLOSED || why == TD_ERR_CANCELED)
        td_info("ctl %s: closing in state %s: %s", c->name, td_ctl_state_str(c->state), c->reason);
    else   /* a peer can end connection after connection this way: rate-limited */
        td_log_peer_every(TD_LOG_WARN, "ctl %s: closing in state %s: %s", c->name,
                          td_ctl_state_str(c->state), c->reason);

    if (c->bev && code != TANDEM__REJECT_CODE__REJECT_UNSPECIFIED &&
        c->state != TD_CTL_CONNECTING) {
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        Tandem__Reject rej = TANDEM__REJECT__INIT;
        struct timeval tv = td_ctl_timeval_ms(CTL_FLUSH_MS);

        rej.code = code;
        rej.reason = c->reason;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_REJECT;
        env.reject = &rej;
        if (ctl_conn_write(c, &env) == TD_OK) {
            bufferevent_disable(c->bev, EV_READ);
            bufferevent_set_timeouts(c->bev, NULL, &tv);
            flushing = 1;   /* write/event callbacks drop the bev once sent */
        }
    }
    if (!flushing)
        ctl_conn_drop_bev(c);
    evtimer_del(c->timer);
    ctl_set_state(c, TD_CTL_CLOSED);
    if (c->lst)
        c->doomed = 1;
    if (c->h.on_closed)
        c->h.on_closed(c, why, c->reason, c->h.arg);
}

static td_status_t ctl_conn_connect_next(td_ctl_conn_t *c);

/* ------------------------------------------------------------------------ */
/* Handshake                                                                */
/* ------------------------------------------------------------------------ */

static void
ctl_conn_start_hello(td_ctl_conn_t *c)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    td_status_t st;

    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_HELLO;
    env.hello = &c->hello;
    ctl_set_state(c, TD_CTL_HELLO);
    st = ctl_conn_write(c, &env);
    if (st != TD_OK)
        ctl_conn_fail(c, st, 0, "cannot send hello: %s", td_status_str(st));
}

/* The two Hellos of the proof transcript, once the peer's arrived. */
static const Tandem__Hello *
ctl_conn_initiator_hello(const td_ctl_conn_t *c)
{
    return c->dir == TD_HELLO_INITIATOR ? &c->hello : c->peer_env->hello;
}

static const Tandem__Hello *
ctl_conn_acceptor_hello(const td_ctl_conn_t *c)
{
    return c->dir == TD_HELLO_ACCEPTOR ? &c->hello : c->peer_env->hello;
}

/* Peer's Hello: check it, prove we know the secret. Takes env. */
static void
ctl_conn_on_hello(td_ctl_conn_t *c, Tandem__Envelope *env)
{
    const Tandem__Hello *peer = env->hello;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
    Tandem__HelloAuth auth = TANDEM__HELLO_AUTH__INIT;
    uint8_t proof[TD_HELLO_PROOF_LEN];
    char reason[TD_HELLO_REASON_MAX];
    Tandem__RejectCode code;
    td_status_t st;

    st = td_hello_check(&c->cfg.cfg.ident, c->nonce, peer, reason, sizeof(reason), &code);
    if (st != TD_OK) {
        tandem__envelope__free_unpacked(env, NULL);
        ctl_conn_fail(c, st, code, "handshake refused: %s", reason);
        return;
    }
    c->peer_env = env;
    snprintf(c->name, sizeof(c->name), "%s %s/%" PRIu32 " (%s)", td_hello_role_str(peer->role),
             peer->node_id, peer->rank_id, c->addr);
    st = td_hello_proof_compute(c->cfg.secret, c->cfg.cfg.secret_len, c->dir,
                                ctl_conn_initiator_hello(c), ctl_conn_acceptor_hello(c), proof);
    if (st != TD_OK) {
        ctl_conn_fail(c, st, 0, "cannot compute hello proof: %s", td_status_str(st));
        return;
    }
    auth.proof.data = proof;
    auth.proof.len = sizeof(proof);
    out.payload_case = TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH;
    out.hello_auth = &auth;
    ctl_set_state(c, TD_CTL_AUTH);
    st = ctl_conn_write(c, &out);
    if (st != TD_OK)
        ctl_conn_fail(c, st, 0, "cannot send hello proof: %s", td_status_str(st));
}

static void
ctl_conn_on_auth(td_ctl_conn_t *c, const Tandem__HelloAuth *auth)
{
    const Tandem__Hello *peer = c->peer_env->hello;
    char reason[TD_HELLO_REASON_MAX];
    td_status_t st;

    st = td_hello_proof_verify(c->cfg.secret, c->cfg.cfg.secret_len,
                               c->dir == TD_HELLO_INITIATOR ? TD_HELLO_ACCEPTOR : TD_HELLO_INITIATOR,
                               ctl_conn_initiator_hello(c), ctl_conn_acceptor_hello(c),
                               &auth->proof, reason, sizeof(reason));
    if (st != TD_OK) {
        ctl_conn_fail(c, st, TANDEM__REJECT_CODE__REJECT_AUTH, "handshake refused: %s", reason);
        return;
    }
    ctl_set_state(c, TD_CTL_ESTABLISHED);
    c->last_rx_ns = td_clock_ns();
    evtimer_del(c->timer);
    ctl_timer_arm(c, c->cfg.cfg.heartbeat_ms);
    td_info("ctl %s: established (incarnation %016" PRIx64 ")", c->name, peer->incarnation);
    if (c->h.on_established)
        c->h.on_established(c, peer, c->h.arg);
}

/* ------------------------------------------------------------------------ */
/* libevent callbacks                                                       */
/* ------------------------------------------------------------------------ */

/* One decoded frame. Returns 1 when it took ownership of env. */
static int
ctl_conn_dispatch(td_ctl_conn_t *c, Tandem__Envelope *env)
{
    Tandem__Envelope__PayloadCase pc = env->payload_case;

    if (pc == TANDEM__ENVELOPE__PAYLOAD_REJECT) {
        char reason[TD_HELLO_REASON_MAX];

        td_hello_printable(reason, sizeof(reason), env->reject->reason,
                           strlen(env->reject->reason));
        ctl_conn_fail(c, ctl_reject_status(env->reject->code), 0, "rejected by peer: %s", reason);
        return 0;
    }
    if (c->state == TD_CTL_HELLO && pc == TANDEM__ENVELOPE__PAYLOAD_HELLO) {
        ctl_conn_on_hello(c, env);
        return 1;
    }
    if (c->state == TD_CTL_AUTH && pc == TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH) {
        ctl_conn_on_auth(c, env->hello_auth);
        return 0;
    }
    if (c->state == TD_CTL_ESTABLISHED && pc == TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT) {
        c->hb_rx++;
        return 0;
    }
    if (c->state == TD_CTL_ESTABLISHED && pc != TANDEM__ENVELOPE__PAYLOAD_HELLO &&
        pc != TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH) {
        if (c->h.on_message)
            c->h.on_message(c, env, c->h.arg);
        return 0;
    }
    ctl_conn_fail(c, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_PROTO,
                  "unexpected %s frame in state %s", ctl_payload_name(pc),
                  td_ctl_state_str(c->state));
    return 0;
}

static void
ctl_conn_read_cb(struct bufferevent *bev, void *arg)
{
    td_ctl_conn_t *c = arg;

    c->busy++;
    /* A callback below may close (state) or destroy (bev) the connection. */
    while (c->bev != NULL && c->state != TD_CTL_CLOSED) {
        struct evbuffer *in = bufferevent_get_input(c->bev);
        int established = c->state == TD_CTL_ESTABLISHED;
        uint32_t max = ctl_conn_frame_max(c), len = 0, field = 0;
        Tandem__Envelope *env = NULL;
        char why[160] = "";
        td_status_t st;

        /* Before authentication, only a frame holding one handshake field is
         * unpacked; anything else is refused from its first key. */
        st = established ? TD_OK : td_frame_peek(in, max, &field, &len);
        if (st == TD_OK && !established && field != TANDEM__ENVELOPE__PAYLOAD_HELLO &&
            field != TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH &&
            field != TANDEM__ENVELOPE__PAYLOAD_REJECT) {
            ctl_conn_fail(c, TD_ERR_PROTO, TANDEM__REJECT_CODE__REJECT_PROTO,
                          "unexpected %s frame (field %" PRIu32 ") in state %s, refused unparsed",
                          ctl_payload_name((Tandem__Envelope__PayloadCase)field), field,
                          td_ctl_state_str(c->state));
            break;
        }
        if (st == TD_OK)
            st = td_frame_decode(in, max, &env, &len, why, sizeof why);

        if (st == TD_INPROGRESS)
            break;
        if (st == TD_ERR_TOO_BIG) {
            ctl_conn_fail(c, st, TANDEM__REJECT_CODE__REJECT_TOO_BIG,
                          "frame of %" PRIu32 " bytes exceeds the %" PRIu32 "-byte limit%s",
                          len, max, established ? "" : " before authentication");
        } else if (st == TD_ERR_RANGE) {
            ctl_conn_fail(c, st, TANDEM__REJECT_CODE__REJECT_TOO_BIG,
                          "frame refused unparsed: %s", why);
        } else if (st == TD_ERR_PROTO) {
            ctl_conn_fail(c, st, TANDEM__REJECT_CODE__REJECT_PROTO,
                          "malformed frame (%s)", why[0] ? why : "not a tandem envelope");
        } else if (st != TD_OK) {
            ctl_conn_fail(c, st, 0, "cannot decode frame: %s", td_status_str(st));
        } else {
            c->last_rx_ns = td_clock_ns();
            if (!ctl_conn_dispatch(c, env))
                tandem__envelope__free_unpacked(env, NULL);
        }
    }
    ctl_conn_leave(c);
}

static void
ctl_conn_write_cb(struct bufferevent *bev, void *arg)
{
    td_ctl_conn_t *c = arg;

    c->busy++;
    if (c->state == TD_CTL_CLOSED && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        ctl_conn_drop_bev(c);   /* the Reject went out */
    ctl_conn_leave(c);
}

static void
ctl_conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
    td_ctl_conn_t *c = arg;
    int err = EVUTIL_SOCKET_ERROR();
    td_status_t st;

    c->busy++;
    if (c->state == TD_CTL_CLOSED) {
        ctl_conn_drop_bev(c);   /* flush of the Reject failed or timed out */
    } else if (what & BEV_EVENT_CONNECTED) {
        td_net_peer_name(bufferevent_getfd(bev), c->addr, sizeof(c->addr));
        ctl_conn_start_hello(c);
    } else if ((what & BEV_EVENT_ERROR) && c->state == TD_CTL_CONNECTING &&
               c->next_addr < c->addrs.n) {
        td_info("ctl %s: connect failed: %s; trying the next address", c->name,
                evutil_socket_error_to_string(err));
        st = ctl_conn_connect_next(c);
        if (st != TD_OK)
            ctl_conn_fail(c, st, 0, "connect failed: %s", td_status_str(st));
    } else if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF)) {
        size_t pending = evbuffer_get_length(bufferevent_get_input(bev));
        char tail[80] = "";

        st = td_status_from_errno(err);

        if (pending)
            snprintf(tail, sizeof(tail), " (%zu bytes of an incomplete frame pending)", pending);
        if (what & BEV_EVENT_ERROR)
            ctl_conn_fail(c, st == TD_ERR_CLOSED ? TD_ERR_PEER : st, 0, "%s: %s%s",
                          c->state == TD_CTL_CONNECTING ? "connect failed" : "connection error",
                          evutil_socket_error_to_string(err), tail);
        else if (pending)
            ctl_conn_fail(c, TD_ERR_PROTO, 0, "peer closed the connection mid-frame%s", tail);
        else if (c->state == TD_CTL_ESTABLISHED)
            ctl_conn_fail(c, TD_ERR_CLOSED, 0, "peer closed the connection");
        else
            ctl_conn_fail(c, TD_ERR_PEER, 0, "peer closed the connection during the handshake");
    }
    ctl_conn_leave(c);
}

static void
ctl_conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    td_ctl_conn_t *c = arg;
    const td_ctl_config_t *cfg = &c->cfg.cfg;

    c->busy++;
    if (c->state != TD_CTL_ESTABLISHED) {
        ctl_conn_fail(c, TD_ERR_TIMEOUT, TANDEM__REJECT_CODE__REJECT_TIMEOUT,
                      "handshake not finished within %" PRIu32 " ms", cfg->handshake_ms);
    } else {
        uint64_t idle_ms = (td_clock_ns() - c->last_rx_ns) / 1000000u;

        if (idle_ms >= (uint64_t)cfg->dead_after * cfg->heartbeat_ms) {
            ctl_conn_fail(c, TD_ERR_TIMEOUT, TANDEM__REJECT_CODE__REJECT_TIMEOUT,
                          "peer dead: nothing received for %" PRIu64 " ms (%" PRIu32
                          " heartbeat intervals of %" PRIu32 " ms)",
                          idle_ms, cfg->dead_after, cfg->heartbeat_ms);
        } else {
            Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
            Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
            td_status_t st;

            hb.seq = ++c->hb_seq;
            hb.time_ns = ctl_now_ns(CLOCK_REALTIME);
            env.payload_case = TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT;
            env.heartbeat = &hb;
            st = ctl_conn_write(c, &env);
            if (st != TD_OK)
                ctl_conn_fail(c, st, 0, "cannot send heartbeat: %s", td_status_str(st));
            else
                ctl_timer_arm(c, cfg->heartbeat_ms);
        }
    }
    ctl_conn_leave(c);
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

/* A connection without a socket yet, its handshake deadline running. */
static td_status_t
ctl_conn_new(struct event_base *base, const td_ctl_config_t *cfg,
             const td_ctl_handlers_t *handlers, td_hello_dir_t dir, td_ctl_conn_t **out)
{
    td_ctl_conn_t *c;
    td_status_t st;

    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return TD_ERR_NOMEM;
    st = ctl_cfg_copy(&c->cfg, cfg);
    if (st != TD_OK)
        goto err_free_conn;
    st = td_hello_nonce_make(c->nonce);
    if (st != TD_OK)
        goto err_free_cfg;
    c->base = base;
    c->h = *handlers;
    c->dir = dir;
    c->state = TD_CTL_CONNECTING;
    td_hello_build(&c->hello, &c->cfg.cfg.ident, c->nonce);
    c->timer = evtimer_new(base, ctl_conn_timer_cb, c);
    if (c->timer == NULL) {
        st = TD_ERR_NOMEM;
        goto err_free_cfg;
    }
    ctl_timer_arm(c, c->cfg.cfg.handshake_ms);
    *out = c;
    return TD_OK;

err_free_cfg:
    ctl_cfg_free(&c->cfg);
err_free_conn:
    free(c);
    return st;
}

/* Give c its socket fd (taken: closed on failure too). */
static td_status_t
ctl_conn_attach(td_ctl_conn_t *c, int fd)
{
    c->bev = bufferevent_socket_new(c->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (c->bev == NULL) {
        evutil_closesocket(fd);
        return TD_ERR_NOMEM;
    }
    bufferevent_setcb(c->bev, ctl_conn_read_cb, ctl_conn_write_cb, ctl_conn_event_cb, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return TD_OK;
}

/* Start connecting to the next address that can be tried, replacing the
 * socket of a failed attempt. */
static td_status_t
ctl_conn_connect_next(td_ctl_conn_t *c)
{
    td_status_t st;
    int fd;

    ctl_conn_drop_bev(c);
    st = td_net_connect(&c->addrs, &c->next_addr, &fd);
    if (st != TD_OK && st != TD_INPROGRESS)
        return st;
    td_net_addr_str(&c->addrs.a[c->next_addr - 1], c->addr, sizeof(c->addr));
    snprintf(c->name, sizeof(c->name), "%s", c->addr);
    st = ctl_conn_attach(c, fd);
    if (st != TD_OK)
        return st;
    /* NULL address: the socket is already connecting; report CONNECTED. */
    if (bufferevent_socket_connect(c->bev, NULL, 0) != 0) {
        td_error("ctl %s: cannot watch the connect", c->name);
        return TD_ERR_IO;
    }
    return TD_OK;
}

td_status_t
td_ctl_conn_connect_addrs(struct event_base *base, const td_ctl_config_t *cfg,
                          const td_ctl_handlers_t *handlers, const td_net_addrs_t *addrs,
                          td_ctl_conn_t **conn_out)
{
    td_ctl_conn_t *c;
    td_status_t st;

    st = ctl_conn_new(base, cfg, handlers, TD_HELLO_INITIATOR, &c);
    if (st != TD_OK)
        return st;
    c->addrs = *addrs;
    st = ctl_conn_connect_next(c);
    if (st != TD_OK) {
        td_ctl_conn_destroy(c);
        return st;
    }
    *conn_out = c;
    return TD_OK;
}

td_status_t
td_ctl_conn_connect(struct event_base *base, const td_ctl_config_t *cfg,
                    const td_ctl_handlers_t *handlers, const char *host, uint16_t port,
                    td_ctl_conn_t **conn_out)
{
    td_net_addrs_t addrs;
    td_status_t st = td_net_resolve(host, port, 1, &addrs);

    if (st != TD_OK)
        return st;
    return td_ctl_conn_connect_addrs(base, cfg, handlers, &addrs, conn_out);
}

void
td_ctl_conn_destroy(td_ctl_conn_t *c)
{
    if (c == NULL)
        return;
    if (c->state != TD_CTL_CLOSED)
        td_debug("ctl %s: destroyed in state %s", c->name, td_ctl_state_str(c->state));
    ctl_conn_drop_bev(c);
    evtimer_del(c->timer);
    c->doomed = 1;
    c->h.on_closed = NULL;
    c->h.on_established = NULL;
    c->h.on_message = NULL;
    if (c->busy == 0)
        ctl_conn_free(c);
}

td_status_t
td_ctl_conn_send(td_ctl_conn_t *c, const Tandem__Envelope *env)
{
    size_t size;

    if (c->state != TD_CTL_ESTABLISHED)
        return TD_ERR_STATE;
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_HELLO ||
        env->payload_case == TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH)
        return TD_ERR_INVALID;
    size = tandem__envelope__get_packed_size(env);
    if (size > c->cfg.cfg.max_frame) {
        td_error("ctl %s: %s message of %zu bytes exceeds the %" PRIu32 "-byte frame limit",
                 c->name, ctl_payload_name(env->payload_case), size, c->cfg.cfg.max_frame);
        return TD_ERR_TOO_BIG;
    }
    /* Flow control, not a failure: the caller decides what to do; no log. */
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) + TD_FRAME_HEADER_LEN + size >
        c->cfg.cfg.max_output)
        return TD_ERR_BUSY;
    return ctl_conn_write(c, env);
}

void
td_ctl_conn_close(td_ctl_conn_t *c, Tandem__RejectCode code, const char *reason)
{
    c->busy++;
    ctl_conn_fail(c, TD_ERR_CANCELED, code, "%s", reason);
    ctl_conn_leave(c);
}

td_ctl_state_t
td_ctl_conn_state(const td_ctl_conn_t *c)
{
    return c->state;
}

const char *
td_ctl_conn_name(const td_ctl_conn_t *c)
{
    return c->name;
}

const Tandem__Hello *
td_ctl_conn_peer(const td_ctl_conn_t *c)
{
    return c->peer_env ? c->peer_env->hello : NULL;
}

uint64_t
td_ctl_conn_heartbeats_rx(const td_ctl_conn_t *c)
{
    return c->hb_rx;
}

/* ------------------------------------------------------------------------ */
/* Listener                                                                 */
/* ------------------------------------------------------------------------ */

/* The peer's address as the per-source key: IPv6, IPv4 as ::ffff:a.b.c.d
 * (what a dual-stack socket reports for it). */
static void
ctl_source_key(const struct sockaddr *sa, uint8_t key[16])
{
    memset(key, 0, 16);
    if (sa->sa_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    }
}

/* The connection a newcomer from src closes, or NULL when there is room: at
 * the per-source cap the oldest of src's, else at the global cap the oldest
 * of all; of those, one whose Hello has not come (state hello) before one
 * whose has. *cap names the cap. */
static td_ctl_conn_t *
ctl_listener_victim(const td_ctl_listener_t *lst, const uint8_t src[16], const char **cap)
{
    td_ctl_conn_t *src_old = NULL, *src_silent = NULL, *silent = NULL;
    size_t nsrc = 0;

    for (td_ctl_conn_t *c = lst->uhead; c; c = c->unext) {
        bool quiet = c->state == TD_CTL_HELLO;
        if (quiet && !silent)
            silent = c;
        if (memcmp(c->src, src, sizeof(c->src)) != 0)
            continue;
        nsrc++;
        if (!src_old)
            src_old = c;
        if (quiet && !src_silent)
            src_silent = c;
    }
    if (nsrc >= lst->lcfg.cfg.max_unauth_per_source) {
        *cap = "max_unauth_per_source";
        return src_silent ? src_silent : src_old;
    }
    if (lst->nunauth >= lst->lcfg.cfg.max_unauth) {
        *cap = "max_unauth";
        return silent ? silent : lst->uhead;
    }
    return NULL;
}

/* Close victim to make room for a newcomer from addr; the episode is logged
 * once (a warning), each connection at debug. */
static void
ctl_listener_evict(td_ctl_listener_t *lst, td_ctl_conn_t *victim, const char *cap,
                   const char *addr)
{
    if (lst->evicted++ == 0)
        td_warn("ctl listener :%u: %zu connections in the handshake; at %s (%s) each new one "
                "closes the oldest unauthenticated one", (unsigned)lst->port, lst->nunauth, cap,
                addr);
    victim->busy++;
    ctl_conn_fail(victim, TD_ERR_BUSY, 0, "closed for a newer connection from %s (%s)", addr,
                  cap);
    ctl_conn_leave(victim);
}

static void
ctl_listener_accept_cb(struct evconnlistener *evl, evutil_socket_t fd,
                       struct sockaddr *sa, int salen, void *arg)
{
    td_ctl_listener_t *lst = arg;
    td_ctl_conn_t *c, *victim;
    const char *cap = NULL;
    uint8_t src[16];
    char addr[64];

    if (lst->pause_ms) {
        td_info("ctl listener :%u: accepting again", (unsigned)lst->port);
        lst->pause_ms = 0;
    }
    td_net_peer_name(fd, addr, sizeof(addr));
    ctl_source_key(sa, src);
    victim = ctl_listener_victim(lst, src, &cap);
    if (victim) {
        ctl_listener_evict(lst, victim, cap, addr);
    } else if (lst->evicted) {
        td_info("ctl listener :%u: below the handshake caps again after closing %" PRIu64
                " unauthenticated connections", (unsigned)lst->port, lst->evicted);
        lst->evicted = 0;
    }
    (void)td_net_set_nodelay(fd);
    if (ctl_conn_new(lst->base, &lst->lcfg.cfg, &lst->h, TD_HELLO_ACCEPTOR, &c) != TD_OK) {
        evutil_closesocket(fd);
        td_warn("ctl listener :%u: dropped an incoming connection from %s", (unsigned)lst->port,
                addr);
        return;
    }
    if (ctl_conn_attach(c, fd) != TD_OK) {
        td_warn("ctl listener :%u: dropped an incoming connection from %s", (unsigned)lst->port,
                addr);
        td_ctl_conn_destroy(c);
        return;
    }
    c->lst = lst;
    c->next = lst->conns;
    if (lst->conns)
        lst->conns->prev = c;
    lst->conns = c;
    lst->nconns++;
    memcpy(c->src, src, sizeof(c->src));
    ctl_unauth_add(lst, c);
    snprintf(c->addr, sizeof(c->addr), "%s", addr);
    snprintf(c->name, sizeof(c->name), "%s", c->addr);
    td_debug("ctl listener :%u: accepted %s", (unsigned)lst->port, c->addr);
    c->busy++;
    ctl_conn_start_hello(c);
    ctl_conn_leave(c);
}

/* accept() failed for a reason that retrying at once will not fix (EMFILE,
 * ENFILE, ENOBUFS, ...): stop accepting, and try again after a pause that
 * doubles while the failures go on. Logged once per episode. */
static void
ctl_listener_error_cb(struct evconnlistener *evl, void *arg)
{
    td_ctl_listener_t *lst = arg;
    int err = EVUTIL_SOCKET_ERROR();
    struct timeval tv;

    if (lst->pause_ms == 0) {
        lst->pause_ms = CTL_ACCEPT_PAUSE_MIN_MS;
        td_warn("ctl listener :%u: accept failed: %s; pausing accepts (%u ms, up to %u ms "
                "while it keeps failing)", (unsigned)lst->port,
                evutil_socket_error_to_string(err), CTL_ACCEPT_PAUSE_MIN_MS,
                CTL_ACCEPT_PAUSE_MAX_MS);
    } else {
        lst->pause_ms = lst->pause_ms * 2 > CTL_ACCEPT_PAUSE_MAX_MS ? CTL_ACCEPT_PAUSE_MAX_MS
                                                                    : lst->pause_ms * 2;
        td_debug("ctl listener :%u: accept failed again: %s; pausing %" PRIu32 " ms",
                 (unsigned)lst->port, evutil_socket_error_to_string(err), lst->pause_ms);
    }
    evconnlistener_disable(evl);
    tv = td_ctl_timeval_ms(lst->pause_ms);
    evtimer_add(lst->resume, &tv);
}

static void
ctl_listener_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    td_ctl_listener_t *lst = arg;

    evconnlistener_enable(lst->evl);
}

td_status_t
td_ctl_listener_create(struct event_base *base, const td_ctl_config_t *cfg,
                       const td_ctl_handlers_t *handlers, const char *host, uint16_t port,
                       td_ctl_listener_t **lst_out)
{
    td_ctl_listener_t *lst;
    td_status_t st;
    int fd;

    lst = calloc(1, sizeof(*lst));
    if (lst == NULL)
        return TD_ERR_NOMEM;
    st = ctl_cfg_copy(&lst->lcfg, cfg);
    if (st != TD_OK)
        goto err_free_lst;
    lst->base = base;
    lst->h = *handlers;
    lst->resume = evtimer_new(base, ctl_listener_resume_cb, lst);
    if (lst->resume == NULL) {
        st = TD_ERR_NOMEM;
        goto err_free_cfg;
    }
    st = td_net_listen(host, port, 128, &fd, &lst->port);
    if (st != TD_OK)
        goto err_free_resume;
    lst->evl = evconnlistener_new(base, ctl_listener_accept_cb, lst,
                                  LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
    if (lst->evl == NULL) {
        td_error("ctl listener :%u: cannot watch the socket", (unsigned)lst->port);
        evutil_closesocket(fd);
        st = TD_ERR_NOMEM;
        goto err_free_resume;
    }
    evconnlistener_set_error_cb(lst->evl, ctl_listener_error_cb);
    td_info("ctl listener: listening on %s:%u", host && host[0] ? host : "*",
            (unsigned)lst->port);
    *lst_out = lst;
    return TD_OK;

err_free_resume:
    event_free(lst->resume);
err_free_cfg:
    ctl_cfg_free(&lst->lcfg);
err_free_lst:
    free(lst);
    return st;
}

void
td_ctl_listener_destroy(td_ctl_listener_t *lst)
{
    if (lst == NULL)
        return;
    evconnlistener_free(lst->evl);
    event_free(lst->resume);
    while (lst->conns) {
        td_ctl_conn_t *c = lst->conns;

        /* Unlink first: a conn busy in a callback frees itself on leave. */
        lst->conns = c->next;
        c->prev = c->next = NULL;
        c->lst = NULL;
        lst->nconns--;
        if (ctl_state_unauth(c->state))
            ctl_unauth_del(lst, c);
        td_ctl_conn_destroy(c);
    }
    ctl_cfg_free(&lst->lcfg);
    free(lst);
}

uint16_t
td_ctl_listener_port(const td_ctl_listener_t *lst)
{
    return lst->port;
}

size_t
td_ctl_listener_conn_count(const td_ctl_listener_t *lst)
{
    return lst->nconns;
}
