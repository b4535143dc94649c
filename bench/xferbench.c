/* bench/xferbench.c — moves blocks between two processes through the transfer
 * engine (xfer/xfer.h) over shared memory or TCP on loopback, verifies every
 * byte outside the timed region and prints GB/s (1 GB = 1e9 bytes). */
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "benchutil.h"
#include "clock.h"
#include "log.h"
#include "xfer.h"

#define XFERBENCH_POOL_ID   0
#define XFERBENCH_BLOB_MAX  (1u << 20)   /* cap on an address or pool export */
#define XFERBENCH_RX_INC    2            /* receiver incarnation */
#define XFERBENCH_TX_INC    1            /* sender incarnation */
#define XFERBENCH_BATCH_BYTES (4u << 20) /* default bytes per transfer: a layer push */

typedef struct {
    uint64_t size;          /* block size = bytes per put */
    const char *transport;  /* "shm" or "tcp" */
    const char *tls;        /* UCX transport list given to the engine */
    int distinct;           /* working set: 0 = reuse one block, 1 = distinct blocks */
    uint64_t ws_bytes;      /* distinct working set (source and destination each) */
    uint64_t total;         /* bytes per timed round (0: from iters) */
    uint64_t iters;         /* puts per timed round */
    uint64_t warmup;        /* puts before the timed rounds (UINT64_MAX: default) */
    uint32_t batch;         /* blocks per transfer (one flush + one notification);
                             * 0: as many as make XFERBENCH_BATCH_BYTES */
    uint32_t window;        /* transfers in flight */
    uint32_t rounds;
    int verify;
    int rx_poll;            /* receiver busy-polls instead of sleeping in its loop */
    unsigned timeout_s;     /* both processes die after this (SIGALRM) */
} xferbench_opts_t;

/* Control messages on the socketpair between the two processes. */
typedef enum {
    XFERBENCH_MSG_HELLO = 1,  /* rx -> tx: a = incarnation; then address and pool blobs */
    XFERBENCH_MSG_PHASE,      /* tx -> rx: a = transfers, b = puts */
    XFERBENCH_MSG_READY,      /* rx -> tx: destination prepared */
    XFERBENCH_MSG_RESULT,     /* rx -> tx: a = notes ok, b = notes failed, c = bad blocks */
    XFERBENCH_MSG_END,        /* tx -> rx: exit */
} xferbench_msg_type_t;

typedef struct {
    uint32_t type;
    uint32_t pad;
    uint64_t a, b, c;
} xferbench_msg_t;

/* ---- options -------------------------------------------------------------- */

static void xferbench_usage(FILE *f)
{
    fprintf(f,
        "usage: xferbench [options]\n"
        "Moves blocks from a sender process into a receiver's pool through the\n"
        "transfer engine, verifies every byte (outside the timed region) and\n"
        "prints GB/s, where 1 GB = 1e9 bytes.\n"
        "  --size SIZE            block size = bytes per put (default 64K; K/M/G = 2^10/2^20/2^30)\n"
        "  --transport shm|tcp    shm: UCX_TLS sm,self; tcp: tcp,self over loopback (default shm)\n"
        "  --tls LIST             override the UCX transport list\n"
        "  --working-set reuse|distinct\n"
        "                         reuse: every put reads the same source block and writes the\n"
        "                         same destination block (like ucx_perftest); distinct: WS bytes\n"
        "                         of distinct blocks on each side, touched before timing (default reuse)\n"
        "  --ws BYTES             distinct working set per side (default 1G)\n"
        "  --total BYTES          bytes per timed round (default: reuse 1G, distinct WS)\n"
        "  --iters N              puts per timed round (overrides --total)\n"
        "  --warmup N             puts before timing (default: distinct one pass over WS,\n"
        "                         reuse iters/10)\n"
        "  --batch N              blocks per transfer (one flush + one notification; default:\n"
        "                         as many as make 4 MiB, like one layer's KV push of a batch)\n"
        "  --window N             transfers in flight (default 8)\n"
        "  --rounds N             timed rounds (default 5)\n"
        "  --no-verify            skip the byte check\n"
        "  --rx-poll              the receiver busy-polls its engine (like ucx_perftest's\n"
        "                         server) instead of sleeping in its event loop\n"
        "  --timeout SEC          kill both processes after SEC seconds (default 300)\n"
        "Output: one line per round\n"
        "  xferbench round=R size=B transport=T working_set=W bytes=N seconds=S gbps=G\n"
        "then a summary with the median.\n");
}

static int xferbench_opts_parse(int argc, char **argv, xferbench_opts_t *o)
{
    static const struct option longopts[] = {
        BENCH_SHARED_OPTIONS,
        {"transport", required_argument, NULL, 't'},
        {"tls", required_argument, NULL, 'T'},
        {"working-set", required_argument, NULL, 'W'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'},
        {"batch", required_argument, NULL, 'b'},
        {"window", required_argument, NULL, 'o'},
        {"no-verify", no_argument, NULL, 'V'},
        {"rx-poll", no_argument, NULL, 'P'},
        {"timeout", required_argument, NULL, 'x'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (xferbench_opts_t){
        .size = 64 << 10, .transport = "shm", .ws_bytes = 1ull << 30,
        .warmup = UINT64_MAX, .window = 8, .rounds = 5,
        .verify = 1, .timeout_s = 300,
    };
    char err[TD_CONFIG_ERRLEN];
    int c, idx = 0;
    uint64_t v = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, &idx)) != -1) {
        const char *flag = c == 'h' || c == '?' ? "" : longopts[idx].name;
        td_status_t st = TD_OK;
        switch (c) {
        case 's': case 'S': case 'B': case 'r':
            st = bench_shared_option(c, optarg, &o->size, &o->ws_bytes, &o->total, &o->rounds,
                                     err, sizeof(err));
            break;
        case 'n':
            st = td_config_parse_uint(flag, optarg, 1, 1ull << 40, &o->iters, err, sizeof(err));
            break;
        case 'w':
            st = td_config_parse_uint(flag, optarg, 0, 0, &o->warmup, err, sizeof(err));
            break;
        case 'b': case 'o': case 'x':
            st = td_config_parse_uint(flag, optarg, 1, UINT32_MAX, &v, err, sizeof(err));
            if (c == 'b') o->batch = (uint32_t)v;
            else if (c == 'o') o->window = (uint32_t)v;
            else o->timeout_s = (unsigned)v;
            break;
        case 't': o->transport = optarg; break;
        case 'T': o->tls = optarg; break;
        case 'W':
            if (strcmp(optarg, "reuse") == 0) o->distinct = 0;
            else if (strcmp(optarg, "distinct") == 0) o->distinct = 1;
            else {
                snprintf(err, sizeof(err), "%s: \"%s\": reuse or distinct", flag, optarg);
                st = TD_ERR_INVALID;
            }
            break;
        case 'V': o->verify = 0; break;
        case 'P': o->rx_poll = 1; break;
        case 'h': xferbench_usage(stdout); exit(0);
        default: goto usage;
        }
        if (st != TD_OK) {
            fprintf(stderr, "xferbench: --%s\n", err);
            goto usage;
        }
    }
    if (optind != argc)
        goto usage;
    if (strcmp(o->transport, "shm") == 0) {
        if (!o->tls) o->tls = "sm,self";
    } else if (strcmp(o->transport, "tcp") == 0) {
        if (!o->tls) o->tls = "tcp,self";
    } else {
        fprintf(stderr, "xferbench: --transport must be shm or tcp\n");
        goto usage;
    }
    if (o->size > UINT32_MAX) {
        fprintf(stderr, "xferbench: --size must be below 4 GiB\n");
        goto usage;
    }
    if (o->distinct && o->ws_bytes < o->size) {
        fprintf(stderr, "xferbench: --ws must hold at least one block\n");
        goto usage;
    }
    if (o->iters == 0) {
        uint64_t total = o->total ? o->total
                       : o->distinct ? o->ws_bytes - o->ws_bytes % o->size
                       : 1ull << 30;
        o->iters = total / o->size ? total / o->size : 1;
    }
    if (o->batch == 0)
        o->batch = o->size >= XFERBENCH_BATCH_BYTES ? 1 : (uint32_t)(XFERBENCH_BATCH_BYTES / o->size);
    if (o->warmup == UINT64_MAX)
        o->warmup = o->distinct ? o->ws_bytes / o->size : o->iters / 10;
    return 0;
usage:
    xferbench_usage(stderr);
    return -1;
}

static uint64_t xferbench_nblocks(const xferbench_opts_t *o)
{
    return o->distinct ? o->ws_bytes / o->size : 1;
}

/* ---- socketpair messages ---------------------------------------------------- */

static int xferbench_io(int fd, void *buf, size_t len, int writing)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            td_error("control socket: %s", n == 0 ? "peer closed" : strerror(errno));
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int xferbench_msg_send(int fd, uint32_t type, uint64_t a, uint64_t b, uint64_t c)
{
    xferbench_msg_t m = {.type = type, .a = a, .b = b, .c = c};
    return xferbench_io(fd, &m, sizeof(m), 1);
}

/* Read one message and check its type. */
static int xferbench_msg_recv(int fd, uint32_t type, xferbench_msg_t *m)
{
    if (xferbench_io(fd, m, sizeof(*m), 0))
        return -1;
    if (m->type != type) {
        td_error("control socket: expected message %u, got %u", type, m->type);
        return -1;
    }
    return 0;
}

static int xferbench_blob_send(int fd, const void *buf, size_t len)
{
    uint64_t n = len;
    return xferbench_io(fd, &n, sizeof(n), 1) || xferbench_io(fd, (void *)buf, len, 1) ? -1 : 0;
}

/* Receive a length-prefixed blob (caller frees). */
static int xferbench_blob_recv(int fd, void **buf, size_t *len)
{
    uint64_t n;
    if (xferbench_io(fd, &n, sizeof(n), 0))
        return -1;
    if (n == 0 || n > XFERBENCH_BLOB_MAX) {
        td_error("control socket: blob of %" PRIu64 " bytes refused", n);
        return -1;
    }
    void *p = malloc(n);
    if (!p || xferbench_io(fd, p, n, 0)) {
        free(p);
        return -1;
    }
    *buf = p;
    *len = n;
    return 0;
}

static td_status_t xferbench_engine_create(const xferbench_opts_t *o, uint64_t inc,
                                           struct event_base **base, td_xfer_t **x)
{
    td_xfer_config_t cfg = {.incarnation = inc, .transports = o->tls};
    struct event_base *b = event_base_new();
    if (!b) {
        td_error("event base: allocation failed");
        return TD_ERR_NOMEM;
    }
    td_status_t st = td_xfer_create(b, &cfg, x);
    if (st != TD_OK) {
        event_base_free(b);
        return st;
    }
    *base = b;
    return TD_OK;
}

/* ---- receiver --------------------------------------------------------------- */

typedef struct {
    const xferbench_opts_t *o;
    int fd;
    struct event_base *base;
    td_xfer_t *x;
    td_xfer_pool_t *pool;
    uint64_t key;            /* pattern key, shared by fork */
    uint64_t expected;       /* transfers of the current phase */
    uint64_t puts;           /* puts of the current phase */
    uint64_t notes_ok, notes_failed, payload_puts;
    int failed;              /* fatal: leave the loop, exit 1 */
    int stop;                /* leave the loop */
} xferbench_rx_t;

/* Blocks [0, min(puts, nblocks)) were written this phase: count the bad ones. */
static uint64_t xferbench_rx_verify(xferbench_rx_t *rx)
{
    const xferbench_opts_t *o = rx->o;
    uint64_t nblocks = xferbench_nblocks(o);
    uint64_t n = rx->puts < nblocks ? rx->puts : nblocks;
    uint64_t bad = 0;
    char *base = td_xfer_pool_base(rx->pool);
    for (uint64_t b = 0; b < n; b++) {
        int64_t off = bench_pattern_check(base + b * o->size, o->size, rx->key, b);
        if (off >= 0) {
            if (bad == 0)
                td_error("receiver: block %" PRIu64 " differs at byte %" PRId64, b, off);
            bad++;
        }
    }
    return bad;
}

static void xferbench_rx_stop(xferbench_rx_t *rx, int failed)
{
    rx->failed |= failed;
    rx->stop = 1;
    event_base_loopbreak(rx->base);
}

static void xferbench_rx_note(td_xfer_t *x, const td_xfer_note_t *note, void *arg)
{
    xferbench_rx_t *rx = arg;
    uint64_t puts;
    if (note->status == TD_OK && note->payload_len == sizeof(puts)) {
        memcpy(&puts, note->payload, sizeof(puts));
        rx->payload_puts += puts;
        rx->notes_ok++;
    } else {
        if (rx->notes_failed == 0)
            td_error("receiver: transfer %" PRIu64 " ended with %s (payload %zu bytes)",
                     note->xfer_id, td_status_str(note->status), note->payload_len);
        rx->notes_failed++;
    }
    if (rx->notes_ok + rx->notes_failed != rx->expected)
        return;
    uint64_t bad = 0;
    if (rx->payload_puts != rx->puts) {
        td_error("receiver: notifications carry %" PRIu64 " puts, expected %" PRIu64,
                 rx->payload_puts, rx->puts);
        bad = 1;
    } else if (rx->o->verify) {
        bad = xferbench_rx_verify(rx);
    }
    if (xferbench_msg_send(rx->fd, XFERBENCH_MSG_RESULT, rx->notes_ok, rx->notes_failed, bad))
        xferbench_rx_stop(rx, 1);
}

/* Poison the destination so that a phase's check sees only its own writes. */
static void xferbench_rx_prepare(xferbench_rx_t *rx)
{
    memset(td_xfer_pool_base(rx->pool), 0xa5, xferbench_nblocks(rx->o) * rx->o->size);
}

static void xferbench_rx_on_ctl(evutil_socket_t fd, short what, void *arg)
{
    xferbench_rx_t *rx = arg;
    xferbench_msg_t m;
    if (xferbench_io(fd, &m, sizeof(m), 0)) {
        xferbench_rx_stop(rx, 1);
        return;
    }
    if (m.type == XFERBENCH_MSG_END) {
        xferbench_rx_stop(rx, 0);
        return;
    }
    if (m.type != XFERBENCH_MSG_PHASE || m.a == 0) {
        td_error("receiver: unexpected control message %u", m.type);
        xferbench_rx_stop(rx, 1);
        return;
    }
    rx->expected = m.a;
    rx->puts = m.b;
    rx->notes_ok = rx->notes_failed = rx->payload_puts = 0;
    if (rx->o->verify)
        xferbench_rx_prepare(rx);
    if (xferbench_msg_send(rx->fd, XFERBENCH_MSG_READY, 0, 0, 0))
        xferbench_rx_stop(rx, 1);
}

/* Every transfer of the benchmark carries this token: its two processes are
 * the only ends, and no third party talks to them, so a fixed one serves. */
static const td_xfer_token_t xferbench_token = { .b = "xferbench-token" };

static bool
xferbench_auth(td_xfer_t *x, uint64_t xfer_id, const td_xfer_token_t *token, void *arg)
{
    (void)x, (void)xfer_id, (void)arg;
    return td_xfer_token_eq(token, &xferbench_token);
}

/* The receiver process: owns the destination pool, driven by its event loop. */
static int xferbench_rx_run(const xferbench_opts_t *o, int fd, uint64_t key)
{
    xferbench_rx_t rx = {.o = o, .fd = fd, .key = key};
    void *addr = NULL, *exp = NULL;
    size_t addr_len, exp_len;
    struct event *ev = NULL;
    int rc = 1;

    td_log_set_ident("xferbench-rx");
    if (xferbench_engine_create(o, XFERBENCH_RX_INC, &rx.base, &rx.x) != TD_OK)
        return 1;
    td_xfer_set_note_handler(rx.x, xferbench_rx_note, &rx);
    td_xfer_set_note_auth(rx.x, xferbench_auth, NULL);
    if (td_xfer_pool_create(rx.x, XFERBENCH_POOL_ID, TD_XFER_MEM_HOST, NULL, o->size,
                            xferbench_nblocks(o), &rx.pool) != TD_OK)
        goto err_destroy_engine;
    xferbench_rx_prepare(&rx);   /* fault every page in before timing */
    if (td_xfer_address(rx.x, &addr, &addr_len) != TD_OK ||
        td_xfer_pool_export(rx.pool, &exp, &exp_len) != TD_OK)
        goto err_free_blobs;
    if (xferbench_msg_send(fd, XFERBENCH_MSG_HELLO, XFERBENCH_RX_INC, 0, 0) ||
        xferbench_blob_send(fd, addr, addr_len) || xferbench_blob_send(fd, exp, exp_len))
        goto err_free_blobs;
    ev = event_new(rx.base, fd, EV_READ | EV_PERSIST, xferbench_rx_on_ctl, &rx);
    if (!ev || event_add(ev, NULL) != 0) {
        td_error("receiver: control event setup failed");
        goto err_free_event;
    }
    while (!rx.stop) {
        if (o->rx_poll)
            td_xfer_progress(rx.x);
        if (event_base_loop(rx.base, o->rx_poll ? EVLOOP_NONBLOCK : EVLOOP_ONCE) < 0) {
            td_error("receiver: event loop failed");
            rx.failed = 1;
            break;
        }
    }
    rc = rx.failed;
err_free_event:
    if (ev)
        event_free(ev);
err_free_blobs:
    free(exp);
    free(addr);
err_destroy_engine:
    td_xfer_destroy(rx.x);   /* destroys the pool too */
    event_base_free(rx.base);
    return rc;
}

/* ---- sender ----------------------------------------------------------------- */

typedef struct xferbench_tx_s xferbench_tx_t;

typedef struct {
    xferbench_tx_t *tx;
    uint32_t idx;
    uint64_t puts;           /* notification payload: puts in this transfer */
    td_xfer_desc_t *descs;   /* [batch]: owned by this slot while in flight */
} xferbench_slot_t;

struct xferbench_tx_s {
    const xferbench_opts_t *o;
    int fd;
    struct event_base *base;
    td_xfer_t *x;
    td_xfer_peer_t *peer;
    td_xfer_pool_t *src;     /* local pool used as source memory */
    xferbench_slot_t *slots; /* [window] */
    td_xfer_desc_t *descs;   /* [window * batch] */
    uint32_t *free_slots;    /* stack of free slot indices */
    uint32_t nfree;
    uint64_t next_id;        /* xfer_id of the next transfer */
    uint64_t failed;
    td_status_t first_failure;
};

static void xferbench_tx_done(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg)
{
    xferbench_slot_t *slot = arg;
    xferbench_tx_t *tx = slot->tx;
    if (status != TD_OK && tx->failed++ == 0)
        tx->first_failure = status;
    tx->free_slots[tx->nfree++] = slot->idx;
}

/* Drive the engine once: progress, and now and then the libevent loop. */
static void xferbench_tx_progress(xferbench_tx_t *tx, uint64_t *spins)
{
    td_xfer_progress(tx->x);
    if ((++*spins & 63) == 0)
        event_base_loop(tx->base, EVLOOP_NONBLOCK);
}

/* Wait for a control message while keeping the engine going. */
static int xferbench_tx_wait(xferbench_tx_t *tx, uint32_t type, xferbench_msg_t *m)
{
    struct pollfd p = {.fd = tx->fd, .events = POLLIN};
    uint64_t spins = 0;
    for (;;) {
        xferbench_tx_progress(tx, &spins);
        int n = poll(&p, 1, 1);
        if (n > 0)
            return xferbench_msg_recv(tx->fd, type, m);
        if (n < 0 && errno != EINTR) {
            td_error("control socket: poll: %s", strerror(errno));
            return -1;
        }
    }
}

/* Post transfer t of a phase of `puts` puts: puts k in [t*batch, ...) write
 * block k % nblocks from the same source block. */
static td_status_t xferbench_tx_post(xferbench_tx_t *tx, uint64_t t, uint64_t puts)
{
    const xferbench_opts_t *o = tx->o;
    uint64_t nblocks = xferbench_nblocks(o);
    uint64_t k0 = t * o->batch;
    uint64_t n = puts - k0 < o->batch ? puts - k0 : o->batch;
    xferbench_slot_t *slot = &tx->slots[tx->free_slots[--tx->nfree]];
    char *src = td_xfer_pool_base(tx->src);
    for (uint64_t j = 0; j < n; j++) {
        uint64_t b = (k0 + j) % nblocks;
        slot->descs[j] = (td_xfer_desc_t){
            .src = src + b * o->size, .pool_id = XFERBENCH_POOL_ID,
            .block = b, .offset = 0, .len = o->size,
        };
    }
    slot->puts = n;
    td_status_t st = td_xfer_post(tx->peer, tx->next_id++, &xferbench_token, slot->descs, n,
                                  &slot->puts, sizeof(slot->puts), 0, xferbench_tx_done, slot);
    if (st != TD_OK) {
        tx->nfree++;
        td_error("sender: transfer %" PRIu64 " refused: %s", t, td_status_str(st));
    }
    return st;
}

/* One phase: `puts` puts in transfers of `batch`, `window` in flight. The
 * clock runs from the first post to the last done callback (every byte flushed
 * to the receiver); the receiver then checks its notifications and bytes. */
static int xferbench_tx_phase(xferbench_tx_t *tx, uint64_t puts, double *seconds)
{
    const xferbench_opts_t *o = tx->o;
    uint64_t nxfers = (puts + o->batch - 1) / o->batch;
    uint64_t next = 0, spins = 0;
    xferbench_msg_t m;

    if (xferbench_msg_send(tx->fd, XFERBENCH_MSG_PHASE, nxfers, puts, 0) ||
        xferbench_tx_wait(tx, XFERBENCH_MSG_READY, &m))
        return -1;
    tx->failed = 0;
    double t0 = td_clock_s();
    while (next < nxfers || tx->nfree < o->window) {
        while (tx->nfree > 0 && next < nxfers) {
            if (xferbench_tx_post(tx, next++, puts) != TD_OK)
                return -1;
        }
        xferbench_tx_progress(tx, &spins);
    }
    double t1 = td_clock_s();
    if (tx->failed) {
        td_error("sender: %" PRIu64 " transfers failed, first: %s", tx->failed,
                 td_status_str(tx->first_failure));
        return -1;
    }
    if (xferbench_tx_wait(tx, XFERBENCH_MSG_RESULT, &m))
        return -1;
    if (m.a != nxfers || m.b != 0 || m.c != 0) {
        td_error("sender: receiver saw %" PRIu64 "/%" PRIu64 " good notifications, %" PRIu64
                 " failed, %" PRIu64 " bad blocks", m.a, nxfers, m.b, m.c);
        return -1;
    }
    *seconds = t1 - t0;
    return 0;
}

static int xferbench_tx_rounds(xferbench_tx_t *tx)
{
    const xferbench_opts_t *o = tx->o;
    double secs, *gbps = calloc(o->rounds, sizeof(*gbps));
    const char *ws = o->distinct ? "distinct" : "reuse";
    uint64_t bytes = o->iters * o->size;
    int rc = -1;

    if (!gbps)
        return -1;
    if (o->warmup > 0 && xferbench_tx_phase(tx, o->warmup, &secs))
        goto out;
    for (uint32_t r = 0; r < o->rounds; r++) {
        if (xferbench_tx_phase(tx, o->iters, &secs))
            goto out;
        gbps[r] = (double)bytes / secs / 1e9;
        printf("xferbench round=%u size=%" PRIu64 " transport=%s working_set=%s batch=%u"
               " window=%u bytes=%" PRIu64 " seconds=%.6f gbps=%.3f\n",
               r + 1, o->size, o->transport, ws, o->batch, o->window, bytes, secs, gbps[r]);
        fflush(stdout);
    }
    double lo = gbps[0], hi = gbps[0];
    for (uint32_t r = 1; r < o->rounds; r++) {
        lo = gbps[r] < lo ? gbps[r] : lo;
        hi = gbps[r] > hi ? gbps[r] : hi;
    }
    printf("# xferbench: %s (UCX_TLS %s), %s working set, %" PRIu64 "-byte blocks, batch %u,"
           " window %u: median %.3f GB/s (min %.3f, max %.3f) over %u rounds of %" PRIu64
           " bytes; GB = 1e9 bytes; %s\n",
           o->transport, o->tls, ws, o->size, o->batch, o->window,
           bench_median(gbps, o->rounds), lo, hi, o->rounds, bytes,
           o->verify ? "every byte verified" : "not verified");
    rc = 0;
out:
    free(gbps);
    return rc;
}

/* The sender process: imports the receiver's pool, runs the rounds. */
static int xferbench_tx_run(const xferbench_opts_t *o, int fd, uint64_t key)
{
    xferbench_tx_t tx = {.o = o, .fd = fd};
    xferbench_msg_t hello;
    void *addr = NULL, *exp = NULL;
    size_t addr_len, exp_len;
    uint64_t nblocks = xferbench_nblocks(o);
    int rc = 1;

    td_log_set_ident("xferbench-tx");
    if (xferbench_msg_recv(fd, XFERBENCH_MSG_HELLO, &hello) ||
        xferbench_blob_recv(fd, &addr, &addr_len))
        return 1;
    if (xferbench_blob_recv(fd, &exp, &exp_len))
        goto err_free_blobs;
    if (xferbench_engine_create(o, XFERBENCH_TX_INC, &tx.base, &tx.x) != TD_OK)
        goto err_free_blobs;   /* the receiver sees the socket close */
    if (td_xfer_peer_create(tx.x, addr, addr_len, hello.a, &tx.peer) != TD_OK ||
        td_xfer_peer_import_pool(tx.peer, exp, exp_len) != TD_OK)
        goto err_destroy_engine;
    /* The source is UCX-allocated too, like ucx_perftest's send buffer. */
    if (td_xfer_pool_create(tx.x, XFERBENCH_POOL_ID, TD_XFER_MEM_HOST, NULL, o->size,
                            nblocks, &tx.src) != TD_OK)
        goto err_destroy_engine;
    for (uint64_t b = 0; b < nblocks; b++)
        bench_pattern_fill((char *)td_xfer_pool_base(tx.src) + b * o->size, o->size, key, b);

    tx.slots = calloc(o->window, sizeof(*tx.slots));
    tx.descs = calloc((size_t)o->window * o->batch, sizeof(*tx.descs));
    tx.free_slots = calloc(o->window, sizeof(*tx.free_slots));
    if (!tx.slots || !tx.descs || !tx.free_slots) {
        td_error("sender: out of memory for %u transfer slots", o->window);
        goto err_free_slots;
    }
    for (uint32_t i = 0; i < o->window; i++) {
        tx.slots[i] = (xferbench_slot_t){.tx = &tx, .idx = i, .descs = tx.descs + (size_t)i * o->batch};
        tx.free_slots[tx.nfree++] = o->window - 1 - i;
    }
    if (xferbench_tx_rounds(&tx) == 0)
        rc = 0;
err_free_slots:
    free(tx.free_slots);
    free(tx.descs);
    free(tx.slots);
err_destroy_engine:
    if (tx.peer)
        td_xfer_peer_destroy(tx.peer);   /* flushed while the receiver still runs */
    if (xferbench_msg_send(fd, XFERBENCH_MSG_END, 0, 0, 0))
        rc = 1;
    td_xfer_destroy(tx.x);
    event_base_free(tx.base);
err_free_blobs:
    free(exp);
    free(addr);
    return rc;
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    xferbench_opts_t o;
    int sv[2];

    if (xferbench_opts_parse(argc, argv, &o))
        return 2;
    uint64_t key = ((uint64_t)getpid() << 32) ^ (uint64_t)(td_clock_s() * 1e9);
    printf("# xferbench: %s (UCX_TLS %s), %s working set, %" PRIu64 "-byte blocks,"
           " %" PRIu64 " puts per round, %" PRIu64 " warmup puts, batch %u, window %u\n",
           o.transport, o.tls, o.distinct ? "distinct" : "reuse", o.size, o.iters,
           o.warmup, o.batch, o.window);
    fflush(stdout);

    /* Fork before any UCX initialisation: each process builds its own. */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("xferbench: socketpair");
        return 1;
    }
    alarm(o.timeout_s);
    pid_t pid = fork();
    if (pid < 0) {
        perror("xferbench: fork");
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(o.timeout_s);
        _exit(xferbench_rx_run(&o, sv[1], key));
    }
    close(sv[1]);
    int rc = xferbench_tx_run(&o, sv[0], key);
    close(sv[0]);
    int wst;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
        fprintf(stderr, "xferbench: receiver %s %d\n",
                WIFEXITED(wst) ? "exited with" : "killed by signal",
                WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
        rc = 1;
    }
    return rc;
}
