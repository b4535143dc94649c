/* net/ctl.h — control connections: a libevent bufferevent carrying frames
 * (net/frame.h), the Hello/HelloAuth handshake in both directions
 * (net/hello.h), heartbeats with dead-peer detection, and a listener that
 * serves many connections on one event loop.
 *
 * Ownership: a connection made by td_ctl_conn_connect() belongs to the caller,
 * who calls td_ctl_conn_destroy() exactly once (at any time, also from inside
 * its own callbacks). A connection accepted by a listener belongs to the
 * listener: it is freed after its on_closed callback returns, or by
 * td_ctl_listener_destroy(). Every function runs on the thread of the loop the
 * object was created on; each connection and listener copies its config.
 * libevent writes with writev(2): the process must ignore SIGPIPE. */
#ifndef TD_CTL_H
#define TD_CTL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include "hello.h"
#include "net.h"
#include "status.h"
#include "tandem.pb-c.h"

struct event_base;

typedef struct td_ctl_conn_s td_ctl_conn_t;
typedef struct td_ctl_listener_s td_ctl_listener_t;

typedef enum {
    TD_CTL_CONNECTING = 0,   /* TCP connect in progress */
    TD_CTL_HELLO,            /* our Hello sent; waiting for the peer's */
    TD_CTL_AUTH,             /* peer's Hello checked, our proof sent; waiting for its proof */
    TD_CTL_ESTABLISHED,      /* authenticated: messages flow, heartbeats run */
    TD_CTL_CLOSED,           /* done; on_closed has been called */
} td_ctl_state_t;

#define TD_CTL_HEARTBEAT_MS_DEFAULT 1000u
#define TD_CTL_DEAD_AFTER_DEFAULT   3u
#define TD_CTL_HANDSHAKE_MS_DEFAULT 5000u
#define TD_CTL_HELLO_FRAME_MAX      4096u   /* body cap before authentication */
#define TD_CTL_MAX_UNAUTH_DEFAULT   256u    /* per listener, connections in handshake */
#define TD_CTL_MAX_UNAUTH_PER_SOURCE_DEFAULT 64u   /* ... of them from one address */
#define TD_CTL_OUTPUT_SLACK         (64u << 10)   /* default max_output = 4 x max_frame + this */

typedef struct {
    td_hello_ident_t ident;      /* who we are / what the peer must match */
    const uint8_t *secret;       /* cluster secret, secret_len >= 1 bytes */
    size_t secret_len;
    uint32_t heartbeat_ms;       /* 0 = TD_CTL_HEARTBEAT_MS_DEFAULT */
    uint32_t dead_after;         /* missed intervals before dead; 0 = 3 */
    uint32_t handshake_ms;       /* whole handshake deadline; 0 = 5000 */
    uint32_t max_frame;          /* frame body cap once established; 0 = TD_FRAME_MAX_DEFAULT */
    uint32_t max_output;         /* bytes queued for the peer before send says BUSY;
                                    0 = 4 x max_frame + TD_CTL_OUTPUT_SLACK; must hold
                                    one max_frame frame */
    uint32_t max_unauth;         /* listener: connections still in the handshake; at the
                                    cap a new one closes the oldest; 0 = 256 */
    uint32_t max_unauth_per_source;  /* listener: the same for one peer address (IPv4
                                    and IPv4-mapped IPv6 alike); 0 = 64 */
} td_ctl_config_t;

/* ms as a struct timeval, for libevent timers. */
static inline struct timeval
td_ctl_timeval_ms(uint32_t ms)
{
    return (struct timeval){ .tv_sec = (time_t)(ms / 1000),
                             .tv_usec = (suseconds_t)(ms % 1000 * 1000) };
}

typedef struct {
    /* Handshake done; peer is the peer's Hello (valid until the conn is freed). */
    void (*on_established)(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg);
    /* One authenticated message other than Heartbeat; env is freed after return. */
    void (*on_message)(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg);
    /* Called once when the connection ends, with why (TD_ERR_TIMEOUT: dead
     * peer or handshake timeout; TD_ERR_MISMATCH / TD_ERR_AUTH: handshake
     * refused by us or the peer; TD_ERR_CLOSED, TD_ERR_PROTO, ...) and the
     * readable reason that was logged. Not called by destroy. */
    void (*on_closed)(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg);
    void *arg;
} td_ctl_handlers_t;

/* Connect to host:port and run the handshake; *conn_out is set on success
 * (the handshake result arrives through the handlers). This runs on the
 * loop thread, so it never blocks on name resolution: host must be an IPv4 or
 * IPv6 literal (TD_ERR_INVALID, logged, otherwise). Resolve names once at
 * start-up with td_net_resolve() and use td_ctl_conn_connect_addrs(). */
td_status_t td_ctl_conn_connect(struct event_base *base, const td_ctl_config_t *cfg,
                                const td_ctl_handlers_t *handlers, const char *host,
                                uint16_t port, td_ctl_conn_t **conn_out);

/* The same with resolved addresses (copied): each is tried in turn until one
 * connects, also when a connect fails asynchronously; on_closed reports
 * "connect failed" only after the last one. */
td_status_t td_ctl_conn_connect_addrs(struct event_base *base, const td_ctl_config_t *cfg,
                                      const td_ctl_handlers_t *handlers,
                                      const td_net_addrs_t *addrs, td_ctl_conn_t **conn_out);

/* Close (if open, without calling on_closed) and free. */
void td_ctl_conn_destroy(td_ctl_conn_t *conn);

/* Queue one message; TD_ERR_STATE unless ESTABLISHED, TD_ERR_INVALID for a
 * handshake payload, TD_ERR_TOO_BIG over max_frame, TD_ERR_BUSY (nothing
 * queued) when it would take the bytes waiting for the peer above
 * max_output: the peer reads too slowly; try again later or close. */
td_status_t td_ctl_conn_send(td_ctl_conn_t *conn, const Tandem__Envelope *env);

/* End the connection from our side: Reject{code, reason} is sent when the
 * connection is open, then on_closed(TD_ERR_CANCELED, reason). */
void td_ctl_conn_close(td_ctl_conn_t *conn, Tandem__RejectCode code, const char *reason);

td_ctl_state_t td_ctl_conn_state(const td_ctl_conn_t *conn);
const char *td_ctl_state_str(td_ctl_state_t state);
/* "ip:port" before the handshake, "role node/rank (ip:port)" after. */
const char *td_ctl_conn_name(const td_ctl_conn_t *conn);
/* The peer's Hello once it was received, else NULL. */
const Tandem__Hello *td_ctl_conn_peer(const td_ctl_conn_t *conn);
uint64_t td_ctl_conn_heartbeats_rx(const td_ctl_conn_t *conn);

/* Listen on host:port (host NULL/"" = all addresses, port 0 = any free one)
 * and serve each accepted connection with cfg and handlers. A new connection
 * that finds cfg->max_unauth_per_source connections of its address in the
 * handshake, or cfg->max_unauth of all, closes the oldest of them (one whose
 * Hello has not come before one whose has), so a flood of silent connections
 * cannot keep a worker out; when accept fails (EMFILE, ENFILE, ...) accepting pauses for 100 ms, then
 * up to 1 s while it keeps failing; each episode is logged once. Resolves a
 * host name (may block: create listeners at start-up). */
td_status_t td_ctl_listener_create(struct event_base *base, const td_ctl_config_t *cfg,
                                   const td_ctl_handlers_t *handlers, const char *host,
                                   uint16_t port, td_ctl_listener_t **lst_out);
/* Stop listening and free every connection (without on_closed). */
void td_ctl_listener_destroy(td_ctl_listener_t *lst);
uint16_t td_ctl_listener_port(const td_ctl_listener_t *lst);
/* Connections not yet freed (open or flushing a Reject). */
size_t td_ctl_listener_conn_count(const td_ctl_listener_t *lst);

#endif
