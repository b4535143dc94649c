/* tests/integration/ctl_peer.c — a real control-plane peer for black-box
 * tests. "server" listens (port 0 = any), prints "port N" and serves until
 * SIGTERM/SIGINT; "client" connects, prints "established", holds the
 * connection for --hold-ms, then prints "alive heartbeats=N" (exit 0) — or
 * "closed: STATUS: REASON" (exit 1) as soon as the connection ends. The
 * incarnation is random per process, as in the daemons, unless given. */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "ctl.h"
#include "daemon.h"
#include "log.h"

typedef struct {
    struct event_base *base;
    td_ctl_conn_t *conn;
    struct event *hold;          /* client: ends the run hold_ms after established */
    unsigned long hold_ms;
    int exit_code;
} peer_t;

static void
peer_on_established(td_ctl_conn_t *c, const Tandem__Hello *h, void *arg)
{
    peer_t *p = arg;

    if (p->conn == c) {
        struct timeval tv = td_ctl_timeval_ms((uint32_t)p->hold_ms);

        printf("established\n");
        fflush(stdout);
        evtimer_add(p->hold, &tv);
    }
}

static void
peer_on_closed(td_ctl_conn_t *c, td_status_t why, const char *reason, void *arg)
{
    peer_t *p = arg;

    if (p->conn == c) {   /* client: report, let a Reject go out, stop */
        struct timeval flush = td_ctl_timeval_ms(200);

        printf("closed: %s: %s\n", td_status_str(why), reason);
        fflush(stdout);
        p->exit_code = 1;
        evtimer_del(p->hold);
        event_base_loopexit(p->base, &flush);
    }
}

static void
peer_on_stop(evutil_socket_t sig, short what, void *arg)
{
    peer_t *p = arg;

    td_info("ctl_peer: signal %d, stopping", (int)sig);
    event_base_loopbreak(p->base);
}

static void
peer_on_hold_done(evutil_socket_t fd, short what, void *arg)
{
    peer_t *p = arg;

    printf("alive heartbeats=%" PRIu64 "\n", td_ctl_conn_heartbeats_rx(p->conn));
    fflush(stdout);
    p->exit_code = td_ctl_conn_state(p->conn) == TD_CTL_ESTABLISHED ? 0 : 1;
    event_base_loopbreak(p->base);
}

static int
peer_usage(void)
{
    fprintf(stderr, "usage: ctl_peer server|client [--host H] [--port N] [--secret S]\n"
                    "  [--version N] [--model M] [--layout N] [--node ID] [--hb-ms N]\n"
                    "  [--handshake-ms N] [--hold-ms N] [--incarnation N]\n");
    return 2;
}

int
main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "host", required_argument, NULL, 'H' },    { "port", required_argument, NULL, 'p' },
        { "secret", required_argument, NULL, 's' },  { "version", required_argument, NULL, 'v' },
        { "model", required_argument, NULL, 'm' },   { "layout", required_argument, NULL, 'l' },
        { "node", required_argument, NULL, 'n' },    { "hb-ms", required_argument, NULL, 'b' },
        { "handshake-ms", required_argument, NULL, 'k' },
        { "hold-ms", required_argument, NULL, 'o' },
        { "incarnation", required_argument, NULL, 'i' }, { NULL, 0, NULL, 0 },
    };
    const char *host = "127.0.0.1", *secret = "test-cluster-secret";
    td_ctl_config_t cfg = {
        .ident = { .protocol_version = TD_HELLO_PROTOCOL_VERSION, .node_id = "peer",
                   .incarnation = td_daemon_random64(), .model_fingerprint = "test-model",
                   .kv_layout_hash = 1 },
    };
    td_ctl_handlers_t h = { peer_on_established, NULL, peer_on_closed, NULL };
    peer_t p = { 0 };
    unsigned long port = 0;
    struct event *sigterm = NULL, *sigint = NULL;
    td_ctl_listener_t *lst = NULL;
    td_net_addrs_t addrs;
    int server, opt;

    if (argc < 2 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0))
        return peer_usage();
    server = strcmp(argv[1], "server") == 0;
    td_log_set_ident(server ? "ctl_peer-server" : "ctl_peer-client");
    optind = 2;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'H': host = optarg; break;
        case 'p': port = strtoul(optarg, NULL, 10); break;
        case 's': secret = optarg; break;
        case 'v': cfg.ident.protocol_version = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'm': cfg.ident.model_fingerprint = optarg; break;
        case 'l': cfg.ident.kv_layout_hash = strtoull(optarg, NULL, 0); break;
        case 'n': cfg.ident.node_id = optarg; break;
        case 'b': cfg.heartbeat_ms = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'k': cfg.handshake_ms = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'o': p.hold_ms = strtoul(optarg, NULL, 10); break;
        case 'i': cfg.ident.incarnation = strtoull(optarg, NULL, 0); break;
        default: return peer_usage();
        }
    }
    if (port > 65535 || (!server && port == 0))
        return peer_usage();
    /* Names are resolved here, before the loop runs (ctl.h). */
    if (!server && td_net_resolve(host, (uint16_t)port, 0, &addrs) != TD_OK)
        return 1;
    cfg.ident.role = server ? TANDEM__ROLE__ROLE_DECODE : TANDEM__ROLE__ROLE_TOOL;
    cfg.secret = (const uint8_t *)secret;
    cfg.secret_len = strlen(secret);
    signal(SIGPIPE, SIG_IGN);

    p.base = event_base_new();
    p.exit_code = 1;
    h.arg = &p;
    if (p.base == NULL)
        return 1;
    sigterm = evsignal_new(p.base, SIGTERM, peer_on_stop, &p);
    sigint = evsignal_new(p.base, SIGINT, peer_on_stop, &p);
    p.hold = evtimer_new(p.base, peer_on_hold_done, &p);
    if (!sigterm || !sigint || !p.hold)
        goto out_free_events;
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);

    if (server) {
        if (td_ctl_listener_create(p.base, &cfg, &h, host, (uint16_t)port, &lst) != TD_OK)
            goto out_free_events;
        printf("port %u\n", (unsigned)td_ctl_listener_port(lst));
        fflush(stdout);
        p.exit_code = 0;
    } else if (td_ctl_conn_connect_addrs(p.base, &cfg, &h, &addrs, &p.conn) != TD_OK) {
        goto out_free_events;
    }
    event_base_dispatch(p.base);

    td_ctl_listener_destroy(lst);
    td_ctl_conn_destroy(p.conn);
out_free_events:
    if (p.hold)
        event_free(p.hold);
    if (sigint)
        event_free(sigint);
    if (sigterm)
        event_free(sigterm);
    event_base_free(p.base);
    return p.exit_code;
}
