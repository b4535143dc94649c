/* tests/fuzz/fuzz_ctl.c — the control listener as a peer without the secret
 * meets it: each input is the byte stream a TCP client on loopback sends to a
 * real td_ctl_listener (net/ctl.c) on a libevent loop, in pieces of a size
 * the input chooses. It reaches frame decoding under the pre-authentication
 * cap, td_frame_peek's refusal of non-handshake payloads, Hello checks, the
 * proof check, Reject handling, the state machine and the connection's end.
 * With the first byte's bit 0 set, each HelloAuth frame of the input is
 * re-signed with the right proof over the first Hello of the input and the
 * listener's own Hello, so that the handshake can complete and the frames
 * after it meet an established connection. Checks that every connection is
 * freed once the client is gone. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "ctl.h"
#include "frame.h"
#include "fuzz.h"
#include "hello.h"

static const uint8_t ctl_secret[] = "fuzz-secret";

static struct event_base *ctl_base;
static td_ctl_listener_t *ctl_lst;
static unsigned ctl_established, ctl_closed;

static void
ctl_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg)
{
    FUZZ_CHECK(td_ctl_conn_state(conn) == TD_CTL_ESTABLISHED);
    FUZZ_CHECK(td_ctl_conn_peer(conn) == peer);
    ctl_established++;
}

static void
ctl_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    FUZZ_CHECK(td_ctl_conn_state(conn) == TD_CTL_ESTABLISHED);
    FUZZ_CHECK(env->payload_case != TANDEM__ENVELOPE__PAYLOAD_HELLO &&
               env->payload_case != TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH &&
               env->payload_case != TANDEM__ENVELOPE__PAYLOAD_HEARTBEAT);
}

static void
ctl_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg)
{
    FUZZ_CHECK(why != TD_OK && reason != NULL);
    FUZZ_CHECK(td_ctl_conn_state(conn) == TD_CTL_CLOSED);
    ctl_closed++;
}

static void
ctl_init(void)
{
    td_ctl_config_t cfg = {
        .ident = { .protocol_version = TD_HELLO_PROTOCOL_VERSION,
                   .role = TANDEM__ROLE__ROLE_ROUTER, .node_id = "router0",
                   .incarnation = 0x1111222233334444u,
                   .model_fingerprint = "0123456789abcdef",
                   .kv_layout_hash = 0x5555666677778888u },
        .secret = ctl_secret,
        .secret_len = sizeof(ctl_secret),
        .max_frame = 1u << 16,
    };
    static const td_ctl_handlers_t h = { .on_established = ctl_on_established,
                                         .on_message = ctl_on_message,
                                         .on_closed = ctl_on_closed };

    fuzz_log_quiet();
    signal(SIGPIPE, SIG_IGN);
    ctl_base = event_base_new();
    FUZZ_CHECK(ctl_base != NULL);
    FUZZ_CHECK(td_ctl_listener_create(ctl_base, &cfg, &h, "127.0.0.1", 0, &ctl_lst) == TD_OK);
}

/* A client socket connected to the listener; closing it resets the
 * connection (SO_LINGER 0), so that no TIME_WAIT is left behind. */
static int
ctl_client(void)
{
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons(td_ctl_listener_port(ctl_lst)),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    struct linger lg = { .l_onoff = 1, .l_linger = 0 };
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    FUZZ_CHECK(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        /* A signal (libFuzzer's timer) interrupts connect, which goes on
         * in the background: wait for it to end. */
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        int err = errno;
        socklen_t len = sizeof err;

        while (err == EINTR && poll(&p, 1, -1) < 0 && errno == EINTR)
            ;
        if (err == EINTR && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
            goto connected;
        fprintf(stderr, "fuzz_ctl: connect to the listener: %s\n", strerror(err ? err : errno));
        abort();
    }
connected:
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Read what the listener sent; 0 once it closed its side. */
static int
ctl_client_read(int fd, struct evbuffer *in)
{
    char buf[4096];

    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);

        if (n > 0) {
            evbuffer_add(in, buf, (size_t)n);
            continue;
        }
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
}

/* The input stream with each HelloAuth frame re-signed (see the top). */
static void
ctl_sign(const uint8_t *p, size_t n, const Tandem__Hello *server, struct evbuffer *out)
{
    Tandem__Envelope *first = NULL;

    while (n >= TD_FRAME_HEADER_LEN) {
        uint32_t len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        Tandem__Envelope *env;

        if (len > n - TD_FRAME_HEADER_LEN)
            break;
        env = tandem__envelope__unpack(NULL, len, p + TD_FRAME_HEADER_LEN);
        if (env && env->payload_case == TANDEM__ENVELOPE__PAYLOAD_HELLO && first == NULL) {
            first = env;
            env = NULL;
        } else if (env && env->payload_case == TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH && first) {
            Tandem__Envelope e = TANDEM__ENVELOPE__INIT;
            Tandem__HelloAuth auth = TANDEM__HELLO_AUTH__INIT;
            uint8_t proof[TD_HELLO_PROOF_LEN];

            if (td_hello_proof_compute(ctl_secret, sizeof(ctl_secret), TD_HELLO_INITIATOR,
                                       first->hello, server, proof) == TD_OK) {
                auth.proof.data = proof;
                auth.proof.len = sizeof(proof);
                e.payload_case = TANDEM__ENVELOPE__PAYLOAD_HELLO_AUTH;
                e.hello_auth = &auth;
                FUZZ_CHECK(td_frame_encode(out, &e, UINT32_MAX) == TD_OK);
                tandem__envelope__free_unpacked(env, NULL);
                p += TD_FRAME_HEADER_LEN + len;
                n -= TD_FRAME_HEADER_LEN + len;
                continue;
            }
        }
        if (env)
            tandem__envelope__free_unpacked(env, NULL);
        evbuffer_add(out, p, TD_FRAME_HEADER_LEN + len);
        p += TD_FRAME_HEADER_LEN + len;
        n -= TD_FRAME_HEADER_LEN + len;
    }
    evbuffer_add(out, p, n);
    if (first)
        tandem__envelope__free_unpacked(first, NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = { data, size };
    uint8_t flags = fuzz_u8(&in), piece = fuzz_u8(&in);
    struct evbuffer *rx = evbuffer_new(), *tx = evbuffer_new();
    Tandem__Envelope *server = NULL;
    int fd, alive = 1;

    if (ctl_base == NULL)
        ctl_init();
    FUZZ_CHECK(rx && tx);
    FUZZ_CHECK(td_ctl_listener_conn_count(ctl_lst) == 0);
    fd = ctl_client();

    /* Accept; the listener speaks first: its Hello. */
    while (server == NULL) {
        td_status_t st;

        FUZZ_CHECK(event_base_loop(ctl_base, EVLOOP_ONCE) == 0);
        FUZZ_CHECK(ctl_client_read(fd, rx));
        st = td_frame_decode(rx, TD_CTL_HELLO_FRAME_MAX, &server, NULL, NULL, 0);
        FUZZ_CHECK(st == TD_OK || st == TD_INPROGRESS);
    }
    FUZZ_CHECK(server->payload_case == TANDEM__ENVELOPE__PAYLOAD_HELLO);
    FUZZ_CHECK(td_ctl_listener_conn_count(ctl_lst) == 1);

    if (flags & 1)
        ctl_sign(in.p, in.n, server->hello, tx);
    else
        evbuffer_add(tx, in.p, in.n);

    /* The stream in pieces, the loop run after each. */
    while (alive && evbuffer_get_length(tx) > 0) {
        size_t want = piece ? piece : evbuffer_get_length(tx);
        ssize_t n;

        if (want > evbuffer_get_length(tx))
            want = evbuffer_get_length(tx);
        n = send(fd, evbuffer_pullup(tx, (ev_ssize_t)want), want, 0);
        if (n > 0)
            evbuffer_drain(tx, (size_t)n);
        else
            FUZZ_CHECK(errno == EAGAIN || errno == EWOULDBLOCK || errno == EPIPE ||
                       errno == ECONNRESET);
        event_base_loop(ctl_base, EVLOOP_NONBLOCK);
        event_base_loop(ctl_base, EVLOOP_NONBLOCK);
        alive = ctl_client_read(fd, rx) && td_ctl_listener_conn_count(ctl_lst) > 0;
    }
    event_base_loop(ctl_base, EVLOOP_NONBLOCK);
    ctl_client_read(fd, rx);
    close(fd);

    /* Gone: the connection ends (reset, or the handshake deadline) and is freed. */
    for (int i = 0; i < 1000 && td_ctl_listener_conn_count(ctl_lst) > 0; i++)
        event_base_loop(ctl_base, EVLOOP_ONCE);
    FUZZ_CHECK(td_ctl_listener_conn_count(ctl_lst) == 0);

    tandem__envelope__free_unpacked(server, NULL);
    evbuffer_free(rx);
    evbuffer_free(tx);
    return 0;
}
