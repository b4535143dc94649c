/* xfer/xfer.c — the UCX transfer engine: one UCP context + worker per rank
 * driven by a libevent loop, registered pools, one-sided transfers (puts, one
 * flush, one terminal active message), peer failure and deadlines. */
#include "xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/timerfd.h>

#include <event2/event.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include "clock.h"
#include "log.h"

/* ======================================================================== */
/* Wire formats (little-endian, fixed layout)                               */
/* ======================================================================== */

#define TD_XFER_AM_ID          7u
#define TD_XFER_NOTE_MAGIC     0x4e584454u  /* "TDXN" */
#define TD_XFER_NOTE_VERSION   2u
#define TD_XFER_NOTE_HDR_LEN   56u          /* see td_xfer_note_hdr_pack */
#define TD_XFER_NOTE_ID_OFF    0u           /* xfer_id, then the token: read first */
#define TD_XFER_NOTE_TOKEN_OFF 8u
#define TD_XFER_LOG_MS         1000u        /* lines a peer can trigger: at most one a second */
#define TD_XFER_POOL_MAGIC     0x50584454u  /* "TDXP" */
#define TD_XFER_POOL_VERSION   1u
#define TD_XFER_POOL_HDR_LEN   40u          /* see td_xfer_pool_export */
#define TD_XFER_MAX_PAYLOAD    65536u
#define TD_XFER_DEFAULT_PAYLOAD 4096u
#define TD_XFER_MAX_RKEY       65536u
#define TD_XFER_MAX_ADDR       (1u << 20)
#define TD_XFER_SWEEP_MS       50
#define TD_XFER_MAP_CHUNK      (4u << 20)   /* td_xfer_on_map: bytes a pass (~1 ms) */
#define TD_XFER_PROGRESS_MAX   64
#define TD_XFER_RETRY_US       200
#define TD_XFER_PENDING_US     50           /* poll period while flushes/notes wait */
#define TD_XFER_SOON_US        1            /* "after the loop's other events" */
#define TD_XFER_RX_SPIN_US     100          /* default td_xfer_config_t.rx_spin_us */
#define TD_XFER_RX_SPIN_CAP    8            /* one spin lasts at most 8 x rx_spin_us */
#define TD_XFER_MAX_RX_SPIN_US 10000
#define TD_XFER_CLOSE_WAIT_MS  2000

static void
td_xfer_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void
td_xfer_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
td_xfer_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t
td_xfer_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t
td_xfer_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t
td_xfer_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ======================================================================== */
/* Objects                                                                  */
/* ======================================================================== */

/* A transfer's life: PUT (puts posted, flush outstanding) -> NOTE (terminal
 * message outstanding) -> ENDED (outcome decided, queued for `done`) -> FREE.
 * `refs` counts UCX requests that still carry the op as user_data plus the
 * done queue's hold; an ENDED op returns to the free list at refs == 0. */
typedef enum {
    TD_XFER_OP_FREE = 0,
    TD_XFER_OP_PUT,
    TD_XFER_OP_NOTE,
    TD_XFER_OP_ENDED,
} td_xfer_op_state_t;

static const char *const td_xfer_op_state_names[] = {
    [TD_XFER_OP_FREE] = "free", [TD_XFER_OP_PUT] = "put",
    [TD_XFER_OP_NOTE] = "note", [TD_XFER_OP_ENDED] = "ended",
};

typedef struct td_xfer_op_s td_xfer_op_t;
struct td_xfer_op_s {
    td_xfer_t *x;
    td_xfer_peer_t *peer;          /* set while in the peer's in-flight list */
    td_xfer_op_t *prev, *next;     /* peer in-flight list / free list */
    td_xfer_op_t *qnext;           /* done queue */
    td_xfer_op_t *all_next;        /* every op ever allocated (for destroy) */
    td_xfer_op_state_t state;
    unsigned refs;
    int counted;                   /* a real transfer (0: reject notification) */
    uint64_t xfer_id;
    td_xfer_token_t token;         /* the receiver's for this transfer */
    uint64_t dst_incarnation;      /* the receiver incarnation targeted */
    uint64_t deadline_ns;          /* 0: none */
    uint64_t bytes;
    td_status_t status;            /* outcome told to the receiver */
    td_status_t result;            /* outcome told to `done` */
    td_xfer_done_fn done;
    void *arg;
    size_t payload_len;
    uint8_t hdr[TD_XFER_NOTE_HDR_LEN];
    uint8_t payload[];             /* [max_payload] */
};

typedef struct {
    uint32_t id;
    uint64_t base;
    uint64_t block_size;
    uint64_t nblocks;
    ucp_rkey_h rkey;
    uint8_t *map;                  /* where UCX mapped it here (shm); NULL: not mapped */
    size_t map_len, map_done;      /* td_xfer_on_map: its pages mapped in so far */
} td_xfer_rpool_t;

struct td_xfer_peer_s {
    td_xfer_t *x;
    td_xfer_peer_t *prev, *next;   /* x->peers */
    td_xfer_peer_t *fail_next;     /* x->fail_q */
    ucp_ep_h ep;                   /* NULL once closed */
    uint64_t incarnation;
    int failed;
    int fail_queued;
    td_status_t fail_status;
    td_xfer_op_t *ops;             /* in flight, oldest first */
    td_xfer_op_t *ops_tail;
    td_xfer_rpool_t *pools;        /* imported pools */
    size_t npools, cap_pools;
    size_t last_pool;              /* lookup cache */
};

struct td_xfer_pool_s {
    td_xfer_t *x;
    td_xfer_pool_t *prev, *next;   /* x->pools */
    uint32_t id;
    td_xfer_mem_t mem;
    void *base;
    size_t block_size;
    uint64_t nblocks;
    ucp_mem_h memh;
};

struct td_xfer_s {
    struct event_base *base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    struct event *ev_worker;       /* worker event fd */
    struct event *ev_sweep;        /* deadline sweep */
    struct event *ev_drain;        /* deliver queued completions */
    struct event *ev_retry;        /* retry_fd readable: progress again */
    struct event *ev_map;          /* map imported pools in, a chunk a pass */
    int map_peer_pools;            /* td_xfer_config_t.map_peer_pools */
    int retry_fd;                  /* timerfd: short re-polls, µs-precise */
    uint64_t retry_at_ns;          /* when retry_fd expires; 0: not armed */
    uint64_t rx_spin_ns;           /* keep polling this long after a notification */
    uint64_t incarnation;
    uint32_t max_payload;
    td_xfer_note_fn note_fn;
    void *note_arg;
    td_xfer_auth_fn auth_fn;
    void *auth_arg;
    td_xfer_expect_fn expect_fn;   /* whether notifications are still expected */
    void *expect_arg;
    td_xfer_token_t rx_token;      /* td_xfer_rx_token */
    td_log_limit_t rx_log;         /* the lines a sender can make this receiver write */
    td_xfer_peer_fail_fn fail_fn;
    void *fail_arg;
    td_xfer_pool_t *pools;
    td_xfer_peer_t *peers;
    td_xfer_op_t *free_ops;
    td_xfer_op_t *all_ops;
    td_xfer_op_t *done_q, *done_q_tail;
    td_xfer_peer_t *fail_q;
    unsigned closing;              /* ep close requests outstanding */
    unsigned reqs;                 /* flush + notification requests outstanding */
    int in_progress;
    int draining;
    int cuda_ok;
    td_xfer_stats_t stats;
    ucp_request_param_t put_param; /* reused by every put: no callback */
};

static td_status_t
td_xfer_status_from_ucs(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:                    return TD_OK;
    case UCS_INPROGRESS:            return TD_INPROGRESS;
    case UCS_ERR_NO_MEMORY:         return TD_ERR_NOMEM;
    case UCS_ERR_INVALID_PARAM:     return TD_ERR_INVALID;
    case UCS_ERR_CANCELED:          return TD_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:         return TD_ERR_TIMEOUT;
    case UCS_ERR_UNSUPPORTED:       return TD_ERR_UNSUPPORTED;
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_EXCEEDS_LIMIT:     return TD_ERR_TOO_BIG;
    case UCS_ERR_NO_RESOURCE:       return TD_ERR_BUSY;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:          return TD_ERR_PEER;
    default:                        return TD_ERR_UCX;
    }
}

static uint64_t
td_xfer_now_ns(void)
{
    return td_clock_ns();
}

/* ======================================================================== */
/* Progress and completion delivery                                         */
/* ======================================================================== */

static void td_xfer_drain(td_xfer_t *x);
static void td_xfer_on_sweep(evutil_socket_t fd, short what, void *arg);
static void td_xfer_on_map(evutil_socket_t fd, short what, void *arg);
static void td_xfer_peer_free(td_xfer_peer_t *peer, int force);

/* Drive UCX without waiting; never re-entered from a UCX callback. Bounded,
 * so that a peer on the same loop (or any other event) gets its turn: returns
 * 1 when UCX still had work after the bound. */
static int
td_xfer_progress_worker(td_xfer_t *x)
{
    if (x->in_progress)
        return 0;
    x->in_progress = 1;
    int n = 0;
    while (n < TD_XFER_PROGRESS_MAX && ucp_worker_progress(x->worker))
        n++;
    x->in_progress = 0;
    return n == TD_XFER_PROGRESS_MAX;
}

/* Progress again in `us` µs (or sooner, if armed for sooner), through the
 * loop: the retry timerfd (see td_xfer_on_retry). */
static void
td_xfer_retry_in(td_xfer_t *x, long us)
{
    uint64_t at = td_xfer_now_ns() + (uint64_t)us * 1000u;
    if (x->retry_at_ns && x->retry_at_ns <= at)
        return;   /* armed already, for sooner */
    struct itimerspec its = { .it_value = { 0, us * 1000 } };
    if (timerfd_settime(x->retry_fd, 0, &its, NULL) == 0)
        x->retry_at_ns = at;
}

/* A flush or notification that waits for room in a peer's shared-memory
 * FIFO gets no wake-up when the peer frees it (UCX's mm transports have no
 * such event, and ucp_worker_arm does not refuse to sleep on it): while
 * UCX holds such requests, come back after a short while. */
static void
td_xfer_poll_pending(td_xfer_t *x)
{
    if (x->reqs)
        td_xfer_retry_in(x, TD_XFER_PENDING_US);
}

/* Whether a notification is still expected (td_xfer_set_note_expect). */
static bool
td_xfer_rx_expected(td_xfer_t *x)
{
    return x->expect_fn == NULL || x->expect_fn(x, x->expect_arg);
}

/* Wake-up coalescing on the receiver: after a pass that delivered
 * notifications, keep polling (not armed) until rx_spin_ns pass without a
 * new one, so that back-to-back notifications arrive without the sender
 * having to signal a sleeping receiver (a sendto per notification over
 * shm); not at all, or no longer, once the receiver expects none (its
 * transfers have ended). Bounded by TD_XFER_RX_SPIN_CAP x rx_spin_ns;
 * returns 1 when notifications were still arriving at the bound. */
static int
td_xfer_rx_spin(td_xfer_t *x)
{
    uint64_t seen = x->stats.notes_received;
    uint64_t start = td_xfer_now_ns(), last = start, now = start;

    if (!td_xfer_rx_expected(x))
        return 0;
    x->stats.rx_spins++;
    while (now - last < x->rx_spin_ns) {
        if (now - start >= TD_XFER_RX_SPIN_CAP * x->rx_spin_ns)
            return 1;
        td_xfer_progress_worker(x);
        now = td_xfer_now_ns();
        if (x->stats.notes_received != seen) {
            seen = x->stats.notes_received;
            last = now;
            if (!td_xfer_rx_expected(x))
                return 0;
        }
    }
    return 0;
}

/* Drain, arm, repeat while UCX reports pending events; when work remains
 * after the bound, come back through the loop instead of spinning here. */
static void
td_xfer_progress_arm(td_xfer_t *x)
{
    if (x->in_progress)
        return;
    uint64_t notes = x->stats.notes_received;
    /* arm says BUSY without progress while a send waits for FIFO room
     * (UCX's mm arbiter is not empty): that is the pending case too */
    long again_us = x->reqs ? TD_XFER_PENDING_US : TD_XFER_RETRY_US;
    for (int round = 0; round < 4; round++) {
        if (td_xfer_progress_worker(x)) {
            again_us = TD_XFER_SOON_US;   /* UCX is making progress: more now */
            break;
        }
        if (x->rx_spin_ns && x->stats.notes_received != notes) {
            if (td_xfer_rx_spin(x)) {
                again_us = TD_XFER_SOON_US;   /* still streaming */
                break;
            }
            notes = x->stats.notes_received;  /* spin once per call */
        }
        ucs_status_t s = ucp_worker_arm(x->worker);
        if (s == UCS_OK) {
            td_xfer_poll_pending(x);
            return;
        }
        if (s != UCS_ERR_BUSY) {
            td_error("xfer %016" PRIx64 ": worker arm failed: %s", x->incarnation,
                     ucs_status_string(s));
            return;
        }
    }
    /* More work right now, or UCX busy without progress (waiting for FIFO
     * room: 50 µs, as above; otherwise 200 µs): come back through the loop,
     * so that its other events get their turn (not a zero libevent timer:
     * libevent runs a re-added one in the same pass forever) */
    td_xfer_retry_in(x, again_us);
}

static void
td_xfer_kick(td_xfer_t *x)
{
    if ((x->done_q || x->fail_q) && !x->draining)
        event_active(x->ev_drain, EV_TIMEOUT, 0);
}

static void
td_xfer_on_worker(evutil_socket_t fd, short what, void *arg)
{
    td_xfer_t *x = arg;
    td_xfer_progress_arm(x);
    td_xfer_drain(x);
}

/* The retry timerfd expired: a libevent timer would do, but libevent
 * (without EVENT_BASE_FLAG_PRECISE_TIMER, which the loop's owner chooses)
 * rounds epoll timeouts up to whole milliseconds: a "50 µs" re-poll slept
 * 1 ms, the stall of a sleeping sender whose FIFO towards the receiver was
 * full. */
static void
td_xfer_on_retry(evutil_socket_t fd, short what, void *arg)
{
    td_xfer_t *x = arg;
    uint64_t expirations;
    if (read(fd, &expirations, sizeof(expirations)) < 0) {
        /* EAGAIN: already consumed; nothing else can fail on a timerfd */
    }
    x->retry_at_ns = 0;
    td_xfer_on_worker(fd, what, arg);
}

static void
td_xfer_on_drain(evutil_socket_t fd, short what, void *arg)
{
    td_xfer_drain(arg);
}

td_status_t
td_xfer_progress(td_xfer_t *x)
{
    td_xfer_progress_worker(x);
    td_xfer_drain(x);
    return TD_OK;
}

/* ======================================================================== */
/* Transfer objects                                                         */
/* ======================================================================== */

static void
td_xfer_op_set_state(td_xfer_op_t *op, td_xfer_op_state_t to)
{
    static const unsigned char ok[4][4] = {
        [TD_XFER_OP_FREE]  = { [TD_XFER_OP_PUT] = 1, [TD_XFER_OP_NOTE] = 1 },
        [TD_XFER_OP_PUT]   = { [TD_XFER_OP_NOTE] = 1, [TD_XFER_OP_ENDED] = 1 },
        [TD_XFER_OP_NOTE]  = { [TD_XFER_OP_ENDED] = 1 },
        [TD_XFER_OP_ENDED] = { [TD_XFER_OP_FREE] = 1 },
    };
    if (!ok[op->state][to]) {
        td_error("xfer %" PRIu64 ": bad state change %s -> %s", op->xfer_id,
                 td_xfer_op_state_names[op->state], td_xfer_op_state_names[to]);
        abort(); /* invariant: our own state machine */
    }
    td_trace("xfer %" PRIu64 ": %s -> %s", op->xfer_id,
             td_xfer_op_state_names[op->state], td_xfer_op_state_names[to]);
    op->state = to;
}

static td_xfer_op_t *
td_xfer_op_get(td_xfer_t *x)
{
    td_xfer_op_t *op = x->free_ops;
    if (op) {
        x->free_ops = op->next;
    } else {
        op = calloc(1, sizeof(*op) + x->max_payload);
        if (!op)
            return NULL;
        op->x = x;
        op->all_next = x->all_ops;
        x->all_ops = op;
    }
    op->peer = NULL;
    op->prev = op->next = op->qnext = NULL;
    op->refs = 0;
    op->status = TD_OK;
    op->result = TD_OK;
    op->deadline_ns = 0;
    op->bytes = 0;
    op->done = NULL;
    op->arg = NULL;
    op->payload_len = 0;
    return op;
}

/* Drop one reference; an ended op with none left is recycled. */
static void
td_xfer_op_unref(td_xfer_op_t *op)
{
    td_xfer_t *x = op->x;
    if (--op->refs || op->state != TD_XFER_OP_ENDED)
        return;
    td_xfer_op_set_state(op, TD_XFER_OP_FREE);
    op->next = x->free_ops;
    x->free_ops = op;
}

static void
td_xfer_peer_unlink_op(td_xfer_op_t *op)
{
    td_xfer_peer_t *peer = op->peer;
    if (!peer)
        return;
    if (op->prev)
        op->prev->next = op->next;
    else
        peer->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        peer->ops_tail = op->prev;
    op->prev = op->next = NULL;
    op->peer = NULL;
}

/* Decide the outcome: the op leaves its peer and waits in the done queue
 * (the queue holds a reference); `done` runs from td_xfer_drain, never
 * inside a UCX callback or inside td_xfer_post. */
static void
td_xfer_op_end(td_xfer_op_t *op, td_status_t result)
{
    td_xfer_t *x = op->x;
    td_xfer_peer_unlink_op(op);
    td_xfer_op_set_state(op, TD_XFER_OP_ENDED);
    op->result = result;
    op->refs++;
    op->qnext = NULL;
    if (x->done_q_tail)
        x->done_q_tail->qnext = op;
    else
        x->done_q = op;
    x->done_q_tail = op;
}

static void
td_xfer_drain(td_xfer_t *x)
{
    if (x->draining)
        return;
    x->draining = 1;
    /* Only the ops queued before this call: a done callback that posts a new
     * transfer which completes inline (shm) queues it again, and draining
     * those too would never return to the loop while the peer keeps up. */
    td_xfer_op_t *batch = x->done_q;
    x->done_q = x->done_q_tail = NULL;
    while (batch) {
        td_xfer_op_t *op = batch;
        batch = op->qnext;
        if (op->counted) {
            x->stats.inflight--;
            if (op->result == TD_OK) {
                x->stats.completed++;
                x->stats.bytes_sent += op->bytes;
            } else {
                x->stats.failed++;
            }
            if (op->done)
                op->done(x, op->xfer_id, op->result, op->arg);
        }
        td_xfer_op_unref(op);
    }
    /* A peer's failure is reported after every transfer on it has ended;
     * one at a time from the list itself (a handler may destroy a peer,
     * which unlinks it). At most one report per peer: this ends. */
    while (!x->done_q && x->fail_q) {
        td_xfer_peer_t *peer = x->fail_q;
        x->fail_q = peer->fail_next;
        peer->fail_queued = 0;
        if (x->fail_fn)
            x->fail_fn(x, peer, peer->fail_status, x->fail_arg);
    }
    x->draining = 0;
    if (x->done_q || x->fail_q)
        td_xfer_retry_in(x, 1);   /* the rest on the loop's next pass, after its I/O */
}

/* ======================================================================== */
/* Terminal notification                                                    */
/* ======================================================================== */

/* The notification header: xfer_id u64 | token [16] | magic u32 | version
 * u16 | 0 u16 | status i32 | payload length u32 | sender incarnation u64 |
 * receiver incarnation u64. The id and token come first: the receiver
 * checks them before it reads anything else. */
static void
td_xfer_note_hdr_pack(td_xfer_op_t *op, uint64_t src_inc, uint64_t dst_inc)
{
    uint8_t *h = op->hdr;
    td_xfer_put64(h + TD_XFER_NOTE_ID_OFF, op->xfer_id);
    memcpy(h + TD_XFER_NOTE_TOKEN_OFF, op->token.b, TD_XFER_TOKEN_LEN);
    td_xfer_put32(h + 24, TD_XFER_NOTE_MAGIC);
    td_xfer_put16(h + 28, TD_XFER_NOTE_VERSION);
    td_xfer_put16(h + 30, 0);
    td_xfer_put32(h + 32, (uint32_t)(int32_t)op->status);
    td_xfer_put32(h + 36, (uint32_t)op->payload_len);
    td_xfer_put64(h + 40, src_inc);
    td_xfer_put64(h + 48, dst_inc);
}

static void
td_xfer_on_note_sent(void *request, ucs_status_t s, void *user_data)
{
    td_xfer_op_t *op = user_data;
    ucp_request_free(request);
    op->x->reqs--;
    if (op->state == TD_XFER_OP_NOTE)
        td_xfer_op_end(op, s == UCS_OK ? op->status : td_xfer_status_from_ucs(s));
    td_xfer_op_unref(op);
}

/* Send the terminal message of `op` (status op->status) on `ep`; ends the op
 * when the send completes inline or fails to start. */
static void
td_xfer_note_send(td_xfer_op_t *op, ucp_ep_h ep)
{
    td_xfer_t *x = op->x;
    td_xfer_op_set_state(op, TD_XFER_OP_NOTE);
    if (op->status != TD_OK)
        op->payload_len = 0;   /* the payload is for a completed transfer */
    td_xfer_note_hdr_pack(op, x->incarnation, op->dst_incarnation);

    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = td_xfer_on_note_sent,
        .user_data = op,
    };
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, TD_XFER_AM_ID, op->hdr, sizeof(op->hdr),
                                         op->payload, op->payload_len, &prm);
    if (UCS_PTR_IS_PTR(r)) {
        op->refs++;
        x->reqs++;
        return;
    }
    if (op->state != TD_XFER_OP_NOTE)
        return;  /* the endpoint failed inside the call and ended the op */
    if (r == NULL) {
        td_xfer_op_end(op, op->status);
    } else {
        td_debug("xfer %" PRIu64 ": notification not sent: %s", op->xfer_id,
                 ucs_status_string(UCS_PTR_STATUS(r)));
        td_xfer_op_end(op, td_xfer_status_from_ucs(UCS_PTR_STATUS(r)));
    }
}

/* A notification arrived (any sender that reached this worker: nothing of it
 * is trusted). Its size first, then its transfer id and token, checked by
 * the owner (td_xfer_auth_fn) before any other byte is read; every line a
 * sender can cause here is rate-limited (x->rx_log). */
static ucs_status_t
td_xfer_on_note(void *arg, const void *header, size_t header_length, void *data,
                size_t length, const ucp_am_recv_param_t *param)
{
    td_xfer_t *x = arg;
    const uint8_t *h = header;
    td_xfer_token_t tok;

    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || header_length != TD_XFER_NOTE_HDR_LEN) {
        x->stats.notes_forged++;
        td_log_limited(&x->rx_log, TD_LOG_WARN, TD_XFER_LOG_MS,
                       "xfer %016" PRIx64 ": notification of %zu + %zu bytes dropped unparsed "
                       "(not a notification's size%s)", x->incarnation, header_length, length,
                       (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? ", by rendezvous" : "");
        return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_UNSUPPORTED : UCS_OK;
    }
    uint64_t xfer_id = td_xfer_get64(h + TD_XFER_NOTE_ID_OFF);
    memcpy(tok.b, h + TD_XFER_NOTE_TOKEN_OFF, TD_XFER_TOKEN_LEN);
    if (x->auth_fn == NULL || !x->auth_fn(x, xfer_id, &tok, x->auth_arg)) {
        x->stats.notes_forged++;
        td_log_limited(&x->rx_log, TD_LOG_WARN, TD_XFER_LOG_MS,
                       "xfer %016" PRIx64 ": notification for xfer %" PRIu64 " without its "
                       "token dropped unparsed", x->incarnation, xfer_id);
        return UCS_OK;
    }
    uint32_t plen = td_xfer_get32(h + 36);
    if (td_xfer_get32(h + 24) != TD_XFER_NOTE_MAGIC ||
        td_xfer_get16(h + 28) != TD_XFER_NOTE_VERSION || plen != length ||
        plen > x->max_payload) {
        x->stats.notes_malformed++;
        td_log_limited(&x->rx_log, TD_LOG_WARN, TD_XFER_LOG_MS,
                       "xfer %016" PRIx64 ": malformed notification for xfer %" PRIu64
                       " dropped (payload %zu bytes, header says %" PRIu32 ", max %" PRIu32 ")",
                       x->incarnation, xfer_id, length, plen, x->max_payload);
        return UCS_OK;
    }
    int32_t st = (int32_t)td_xfer_get32(h + 32);
    td_xfer_note_t note = {
        .xfer_id = xfer_id,
        .src_incarnation = td_xfer_get64(h + 40),
        .dst_incarnation = td_xfer_get64(h + 48),
        .status = (st <= TD_OK && st >= TD_ERR_INTERNAL) ? (td_status_t)st : TD_ERR_PROTO,
    };
    if (note.status == TD_OK && plen) {   /* a payload only with TD_OK (xfer.h) */
        note.payload = data;
        note.payload_len = plen;
    }
    if (note.dst_incarnation != x->incarnation) {
        x->stats.notes_stale++;
        td_log_limited(&x->rx_log, TD_LOG_WARN, TD_XFER_LOG_MS,
                       "xfer %016" PRIx64 ": stale notification for xfer %" PRIu64
                       " (target incarnation %016" PRIx64 ") dropped",
                       x->incarnation, note.xfer_id, note.dst_incarnation);
        return UCS_OK;
    }
    x->stats.notes_received++;
    if (x->note_fn)
        x->note_fn(x, &note, x->note_arg);
    return UCS_OK;
}

void
td_xfer_set_note_auth(td_xfer_t *x, td_xfer_auth_fn fn, void *arg)
{
    x->auth_fn = fn;
    x->auth_arg = arg;
}

td_status_t
td_xfer_token_draw(td_xfer_token_t *out)
{
    size_t got = 0;

    while (got < TD_XFER_TOKEN_LEN) {
        ssize_t n = getrandom(out->b + got, TD_XFER_TOKEN_LEN - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            td_error("xfer: no random bytes for a transfer token: %s", strerror(errno));
            return TD_ERR_IO;
        }
        got += (size_t)n;
    }
    return TD_OK;
}

bool
td_xfer_token_eq(const td_xfer_token_t *a, const td_xfer_token_t *b)
{
    uint8_t d = 0;

    for (size_t i = 0; i < TD_XFER_TOKEN_LEN; i++)
        d |= (uint8_t)(a->b[i] ^ b->b[i]);
    return d == 0;
}

const td_xfer_token_t *
td_xfer_rx_token(const td_xfer_t *x)
{
    return &x->rx_token;
}

/* ======================================================================== */
/* Engine                                                                   */
/* ======================================================================== */

static td_status_t
td_xfer_config_set(ucp_config_t *uc, const char *name, const char *value)
{
    ucs_status_t s = ucp_config_modify(uc, name, value);
    if (s != UCS_OK) {
        td_error("xfer: ucx config %s=%s: %s", name, value, ucs_status_string(s));
        return TD_ERR_INVALID;
    }
    return TD_OK;
}

/* UCX settings the engine relies on (see docs/xfer.md, "UCX settings"):
 * - MM_ERROR_HANDLING=y: shared-memory transports only take part in PEER
 *   error mode with it; their peer failures are found by keepalive,
 * - KEEPALIVE_INTERVAL=500ms: so that keepalive finds a dead peer quickly,
 * - ADAPTIVE_PROGRESS=n: with adaptive progress, UCX 1.13 switches off an
 *   interface without endpoints (a receiver's mm interface: notifications
 *   arrive without a receiver-side endpoint) and hands its wake-ups to its
 *   async thread, which can leave ucp_worker_arm() returning UCS_OK while
 *   notifications wait in the FIFO: the receiver then sleeps until the next
 *   sweep, and the sender's flush waits for FIFO room meanwhile.
 * An explicit environment setting (UCX_<NAME>) wins. */
static int
td_xfer_tls_has_mm(const char *tls)
{
    if (!tls || tls[0] == '^')
        return 1;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        static const char *const mm[] = { "all", "sm", "shm", "mm", "posix", "sysv" };
        for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++)
            if (strcmp(t, mm[i]) == 0)
                return 1;
    }
    return 0;
}

/* Set UCX_<name> for this context unless the environment sets it. */
static td_status_t
td_xfer_config_default(ucp_config_t *uc, const char *name, const char *value)
{
    char env[64];
    snprintf(env, sizeof(env), "UCX_%s", name);
    return getenv(env) ? TD_OK : td_xfer_config_set(uc, name, value);
}

/* Append dev to the comma-separated list buf unless it is there already. */
static void
td_xfer_devlist_add(char *buf, size_t len, const char *dev)
{
    size_t n = strlen(dev), used = strlen(buf);
    for (const char *p = buf; *p;) {
        size_t tok = strcspn(p, ",");
        if (tok == n && strncmp(p, dev, n) == 0)
            return;
        p += tok + (p[tok] == ',');
    }
    if (used + n + 2 <= len)
        snprintf(buf + used, len - used, "%s%s", used ? "," : "", dev);
}

/* The network devices UCX finds (uct resources of type NET) whose transport
 * is not tcp (RDMA ports: "mlx5_0:1"), appended to buf. Only what a context
 * would open anyway is opened; a component that fails is skipped. */
static void
td_xfer_rdma_devices(char *buf, size_t len)
{
    uct_component_h *comps;
    unsigned ncomps;

    if (uct_query_components(&comps, &ncomps) != UCS_OK)
        return;
    for (unsigned c = 0; c < ncomps; c++) {
        uct_component_attr_t ca = { .field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT };
        if (uct_component_query(comps[c], &ca) != UCS_OK || ca.md_resource_count == 0)
            continue;
        ca.md_resources = calloc(ca.md_resource_count, sizeof(*ca.md_resources));
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        if (ca.md_resources == NULL || uct_component_query(comps[c], &ca) != UCS_OK) {
            free(ca.md_resources);
            continue;
        }
        for (unsigned m = 0; m < ca.md_resource_count; m++) {
            uct_md_config_t *mc;
            uct_md_h md;
            uct_tl_resource_desc_t *tl;
            unsigned ntl;
            if (uct_md_config_read(comps[c], NULL, NULL, &mc) != UCS_OK)
                continue;
            ucs_status_t s = uct_md_open(comps[c], ca.md_resources[m].md_name, mc, &md);
            uct_config_release(mc);
            if (s != UCS_OK)
                continue;
            if (uct_md_query_tl_resources(md, &tl, &ntl) == UCS_OK) {
                for (unsigned t = 0; t < ntl; t++)
                    if (tl[t].dev_type == UCT_DEVICE_TYPE_NET && strcmp(tl[t].tl_name, "tcp") != 0)
                        td_xfer_devlist_add(buf, len, tl[t].dev_name);
                uct_release_tl_resource_list(tl);
            }
            uct_md_close(md);
        }
        free(ca.md_resources);
    }
    uct_release_component_list(comps);
}

/* NET_DEVICES: every network device but the tcp transport's other
 * interfaces, so that its listener is bound on tcp_device alone. */
static td_status_t
td_xfer_config_net_devices(ucp_config_t *uc, const char *tcp_device, char *shown, size_t len)
{
    char list[1024] = "";

    if (getenv("UCX_NET_DEVICES")) {
        snprintf(shown, len, "%s (UCX_NET_DEVICES)", getenv("UCX_NET_DEVICES"));
        return TD_OK;
    }
    td_xfer_rdma_devices(list, sizeof(list));
    td_xfer_devlist_add(list, sizeof(list), tcp_device);
    snprintf(shown, len, "%s", list);
    return td_xfer_config_set(uc, "NET_DEVICES", list);
}

static td_status_t
td_xfer_config_fill(ucp_config_t *uc, const td_xfer_config_t *cfg)
{
    td_status_t st = TD_OK;
    if (cfg->transports)
        st = td_xfer_config_set(uc, "TLS", cfg->transports);
    if (st == TD_OK && td_xfer_tls_has_mm(cfg->transports))
        st = td_xfer_config_default(uc, "MM_ERROR_HANDLING", "y");
    if (st == TD_OK)
        st = td_xfer_config_default(uc, "KEEPALIVE_INTERVAL", "500ms");
    if (st == TD_OK)
        st = td_xfer_config_default(uc, "ADAPTIVE_PROGRESS", "n");
    return st;
}

/* The UCX context for cfg's transports (netdevs[len]: the network devices
 * chosen, for the log); whether it registers CUDA memory. */
static td_status_t
td_xfer_ctx_create(td_xfer_t *x, const td_xfer_config_t *cfg, char *netdevs, size_t len)
{
    ucp_config_t *uc;
    ucs_status_t s = ucp_config_read(NULL, NULL, &uc);
    td_status_t st;

    if (s != UCS_OK) {
        td_error("xfer: ucx config read: %s", ucs_status_string(s));
        return TD_ERR_UCX;
    }
    st = td_xfer_config_fill(uc, cfg);
    if (st == TD_OK && cfg->tcp_device)
        st = td_xfer_config_net_devices(uc, cfg->tcp_device, netdevs, len);
    if (st != TD_OK) {
        ucp_config_release(uc);
        return st;
    }
    ucp_params_t prm = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    s = ucp_init(&prm, uc, &x->ctx);
    ucp_config_release(uc);
    if (s != UCS_OK) {
        td_error("xfer: ucp init (transports %s): %s",
                 cfg->transports ? cfg->transports : "default", ucs_status_string(s));
        return td_xfer_status_from_ucs(s);
    }
    ucp_context_attr_t ca = { .field_mask = UCP_ATTR_FIELD_MEMORY_TYPES };
    if (ucp_context_query(x->ctx, &ca) == UCS_OK)
        x->cuda_ok = !!(ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    return TD_OK;
}

/* The single-threaded worker, its notification handler and its event fd
 * (*efd); on failure no worker is left. */
static td_status_t
td_xfer_worker_create(td_xfer_t *x, int *efd)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t s = ucp_worker_create(x->ctx, &wp, &x->worker);
    const char *what = "worker create";

    if (s != UCS_OK)
        goto fail;
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = TD_XFER_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = td_xfer_on_note,
        .arg = x,
    };
    what = "set am handler";
    s = ucp_worker_set_am_recv_handler(x->worker, &ap);
    if (s == UCS_OK) {
        what = "worker event fd";
        s = ucp_worker_get_efd(x->worker, efd);
    }
    if (s == UCS_OK)
        return TD_OK;
    ucp_worker_destroy(x->worker);
    x->worker = NULL;
fail:
    td_error("xfer: %s: %s", what, ucs_status_string(s));
    return td_xfer_status_from_ucs(s);
}

static void
td_xfer_events_free(td_xfer_t *x)
{
    if (x->ev_worker)
        event_free(x->ev_worker);
    if (x->ev_sweep)
        event_free(x->ev_sweep);
    if (x->ev_drain)
        event_free(x->ev_drain);
    if (x->ev_retry)
        event_free(x->ev_retry);
    if (x->ev_map)
        event_free(x->ev_map);
    close(x->retry_fd);
}

/* The loop's events: the worker's fd (efd), the sweep, the drain, the retry
 * timer and the peer-pool mapping; on failure none is left. */
static td_status_t
td_xfer_events_create(td_xfer_t *x, struct event_base *base, int efd)
{
    struct timeval tv = { 0, TD_XFER_SWEEP_MS * 1000 };

    x->retry_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (x->retry_fd < 0) {
        td_error("xfer: retry timerfd: %s", strerror(errno));
        return TD_ERR_IO;
    }
    x->ev_worker = event_new(base, efd, EV_READ | EV_PERSIST, td_xfer_on_worker, x);
    x->ev_sweep = event_new(base, -1, EV_PERSIST, td_xfer_on_sweep, x);
    x->ev_drain = event_new(base, -1, 0, td_xfer_on_drain, x);
    x->ev_retry = event_new(base, x->retry_fd, EV_READ | EV_PERSIST, td_xfer_on_retry, x);
    x->ev_map = evtimer_new(base, td_xfer_on_map, x);
    if (!x->ev_worker || !x->ev_sweep || !x->ev_drain || !x->ev_retry || !x->ev_map) {
        td_xfer_events_free(x);
        return TD_ERR_NOMEM;
    }
    if (event_add(x->ev_worker, NULL) != 0 || event_add(x->ev_sweep, &tv) != 0 ||
        event_add(x->ev_retry, NULL) != 0) {
        td_error("xfer: cannot add events to the loop");
        td_xfer_events_free(x);
        return TD_ERR_IO;
    }
    return TD_OK;
}

td_status_t
td_xfer_create(struct event_base *base, const td_xfer_config_t *cfg, td_xfer_t **out)
{
    td_status_t st;
    char netdevs[1024] = "every one";
    int efd;

    if (!base || !cfg || cfg->incarnation == 0 || cfg->max_payload > TD_XFER_MAX_PAYLOAD ||
        (cfg->rx_spin_us > TD_XFER_MAX_RX_SPIN_US && cfg->rx_spin_us != TD_XFER_RX_SPIN_OFF)) {
        td_error("xfer: create: need an event base, a non-zero incarnation, "
                 "max_payload <= %u and rx_spin_us <= %u", TD_XFER_MAX_PAYLOAD,
                 TD_XFER_MAX_RX_SPIN_US);
        return TD_ERR_INVALID;
    }
    td_xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        return TD_ERR_NOMEM;
    x->base = base;
    x->incarnation = cfg->incarnation;
    x->max_payload = cfg->max_payload ? cfg->max_payload : TD_XFER_DEFAULT_PAYLOAD;
    x->rx_spin_ns = cfg->rx_spin_us == TD_XFER_RX_SPIN_OFF ? 0 :
                    1000u * (uint64_t)(cfg->rx_spin_us ? cfg->rx_spin_us : TD_XFER_RX_SPIN_US);
    x->map_peer_pools = cfg->map_peer_pools;
    if (td_xfer_token_draw(&x->rx_token) != TD_OK) {
        free(x);
        return TD_ERR_IO;
    }
    st = td_xfer_ctx_create(x, cfg, netdevs, sizeof(netdevs));
    if (st != TD_OK)
        goto err_free;
    st = td_xfer_worker_create(x, &efd);
    if (st != TD_OK)
        goto err_cleanup_ctx;
    st = td_xfer_events_create(x, base, efd);
    if (st != TD_OK)
        goto err_destroy_worker;
    x->put_param.op_attr_mask = 0;
    td_xfer_progress_arm(x);
    td_info("xfer %016" PRIx64 ": worker ready (transports %s, network devices %s)",
            x->incarnation, cfg->transports ? cfg->transports : "default", netdevs);
    *out = x;
    return TD_OK;

err_destroy_worker:
    ucp_worker_destroy(x->worker);
err_cleanup_ctx:
    ucp_cleanup(x->ctx);
err_free:
    free(x);
    return st;
}

/* Ops not yet back on the free list (UCX still holds a request). */
static int
td_xfer_ops_busy(const td_xfer_t *x)
{
    for (const td_xfer_op_t *op = x->all_ops; op; op = op->all_next)
        if (op->state != TD_XFER_OP_FREE)
            return 1;
    return 0;
}

void
td_xfer_destroy(td_xfer_t *x)
{
    if (!x)
        return;
    while (x->peers)
        td_xfer_peer_free(x->peers, 1);
    td_xfer_drain(x);
    /* wait (bounded) for force-closed endpoints and their requests */
    uint64_t until = td_xfer_now_ns() + (uint64_t)TD_XFER_CLOSE_WAIT_MS * 1000000u;
    while ((x->closing || td_xfer_ops_busy(x)) && td_xfer_now_ns() < until) {
        td_xfer_progress_worker(x);
        td_xfer_drain(x);   /* ops ended by the progress wait in the done queue */
    }
    if (x->closing)
        td_warn("xfer %016" PRIx64 ": %u endpoint close(s) still pending at destroy",
                x->incarnation, x->closing);
    while (x->pools)
        td_xfer_pool_destroy(x->pools);
    td_xfer_events_free(x);
    ucp_worker_destroy(x->worker);
    ucp_cleanup(x->ctx);
    while (x->all_ops) {
        td_xfer_op_t *op = x->all_ops;
        x->all_ops = op->all_next;
        free(op);
    }
    free(x);
}

void
td_xfer_set_note_handler(td_xfer_t *x, td_xfer_note_fn fn, void *arg)
{
    x->note_fn = fn;
    x->note_arg = arg;
}

void
td_xfer_set_note_expect(td_xfer_t *x, td_xfer_expect_fn fn, void *arg)
{
    x->expect_fn = fn;
    x->expect_arg = arg;
}

void
td_xfer_set_peer_fail_handler(td_xfer_t *x, td_xfer_peer_fail_fn fn, void *arg)
{
    x->fail_fn = fn;
    x->fail_arg = arg;
}

td_status_t
td_xfer_address(td_xfer_t *x, void **buf, size_t *len)
{
    ucp_address_t *a;
    size_t n;
    ucs_status_t s = ucp_worker_get_address(x->worker, &a, &n);
    if (s != UCS_OK) {
        td_error("xfer %016" PRIx64 ": worker address: %s", x->incarnation,
                 ucs_status_string(s));
        return td_xfer_status_from_ucs(s);
    }
    void *copy = malloc(n);
    if (copy)
        memcpy(copy, a, n);
    ucp_worker_release_address(x->worker, a);
    if (!copy)
        return TD_ERR_NOMEM;
    *buf = copy;
    *len = n;
    return TD_OK;
}

uint64_t
td_xfer_incarnation(const td_xfer_t *x)
{
    return x->incarnation;
}

struct event_base *
td_xfer_base(const td_xfer_t *x)
{
    return x->base;
}

uint32_t
td_xfer_max_payload(const td_xfer_t *x)
{
    return x->max_payload;
}

void
td_xfer_stats(const td_xfer_t *x, td_xfer_stats_t *out)
{
    *out = x->stats;
}

/* ======================================================================== */
/* Pools                                                                    */
/* ======================================================================== */

void
td_xfer_pool_prefault(td_xfer_pool_t *pool)
{
    size_t len = pool->block_size * (size_t)pool->nblocks, page = (size_t)sysconf(_SC_PAGESIZE);
    volatile uint8_t *p = pool->base;

    if (pool->mem != TD_XFER_MEM_HOST || len == 0)
        return;
#ifdef MADV_POPULATE_WRITE
    uintptr_t a = (uintptr_t)pool->base & ~(uintptr_t)(page - 1);
    if (madvise((void *)a, len + ((uintptr_t)pool->base - a), MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (size_t i = 0; i < len; i += page)
        p[i] = p[i];   /* the same byte back: the page is ours now */
}

td_status_t
td_xfer_pool_create(td_xfer_t *x, uint32_t pool_id, td_xfer_mem_t mem, void *base,
                    size_t block_size, uint64_t nblocks, td_xfer_pool_t **out)
{
    if (block_size == 0 || nblocks == 0 || nblocks > SIZE_MAX / block_size) {
        td_error("xfer pool %" PRIu32 ": bad geometry %zu x %" PRIu64, pool_id,
                 block_size, nblocks);
        return TD_ERR_INVALID;
    }
    for (td_xfer_pool_t *p = x->pools; p; p = p->next) {
        if (p->id == pool_id) {
            td_error("xfer pool %" PRIu32 ": id already registered", pool_id);
            return TD_ERR_INVALID;
        }
    }
    if (mem == TD_XFER_MEM_CUDA && !x->cuda_ok) {
        td_error("xfer pool %" PRIu32 ": cuda memory not supported by this ucx "
                 "(no cuda transports loaded)", pool_id);
        return TD_ERR_UNSUPPORTED;
    }
    if (mem != TD_XFER_MEM_HOST && mem != TD_XFER_MEM_CUDA)
        return TD_ERR_INVALID;
    td_xfer_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return TD_ERR_NOMEM;
    size_t len = block_size * (size_t)nblocks;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = base,
        .length = len,
        .flags = base ? 0 : UCP_MEM_MAP_ALLOCATE,
        .memory_type = mem == TD_XFER_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
    };
    ucs_status_t s = ucp_mem_map(x->ctx, &mp, &pool->memh);
    if (s != UCS_OK) {
        td_error("xfer pool %" PRIu32 ": map %zu bytes: %s", pool_id, len,
                 ucs_status_string(s));
        free(pool);
        return td_xfer_status_from_ucs(s);
    }
    ucp_mem_attr_t ma = { .field_mask = UCP_MEM_ATTR_FIELD_ADDRESS };
    s = ucp_mem_query(pool->memh, &ma);
    if (s != UCS_OK) {
        td_error("xfer pool %" PRIu32 ": query: %s", pool_id, ucs_status_string(s));
        ucp_mem_unmap(x->ctx, pool->memh);
        free(pool);
        return td_xfer_status_from_ucs(s);
    }
    pool->x = x;
    pool->id = pool_id;
    pool->mem = mem;
    pool->base = ma.address;
    pool->block_size = block_size;
    pool->nblocks = nblocks;
    pool->next = x->pools;
    if (x->pools)
        x->pools->prev = pool;
    x->pools = pool;
    td_debug("xfer pool %" PRIu32 ": %" PRIu64 " blocks of %zu bytes at %p (%s)", pool_id,
             nblocks, block_size, pool->base, base ? "registered" : "ucx-allocated");
    *out = pool;
    return TD_OK;
}

void
td_xfer_pool_destroy(td_xfer_pool_t *pool)
{
    if (!pool)
        return;
    td_xfer_t *x = pool->x;
    if (pool->prev)
        pool->prev->next = pool->next;
    else
        x->pools = pool->next;
    if (pool->next)
        pool->next->prev = pool->prev;
    ucp_mem_unmap(x->ctx, pool->memh);
    free(pool);
}

void *
td_xfer_pool_base(const td_xfer_pool_t *pool)
{
    return pool->base;
}

size_t
td_xfer_pool_block_size(const td_xfer_pool_t *pool)
{
    return pool->block_size;
}

uint64_t
td_xfer_pool_nblocks(const td_xfer_pool_t *pool)
{
    return pool->nblocks;
}

/* Layout: magic u32, version u16, mem u16, pool_id u32, rkey_len u32,
 * base u64, block_size u64, nblocks u64, rkey bytes. */
td_status_t
td_xfer_pool_export(const td_xfer_pool_t *pool, void **buf, size_t *len)
{
    void *rk;
    size_t rk_len;
    ucs_status_t s = ucp_rkey_pack(pool->x->ctx, pool->memh, &rk, &rk_len);
    if (s != UCS_OK) {
        td_error("xfer pool %" PRIu32 ": rkey pack: %s", pool->id, ucs_status_string(s));
        return td_xfer_status_from_ucs(s);
    }
    uint8_t *b = malloc(TD_XFER_POOL_HDR_LEN + rk_len);
    if (!b) {
        ucp_rkey_buffer_release(rk);
        return TD_ERR_NOMEM;
    }
    td_xfer_put32(b + 0, TD_XFER_POOL_MAGIC);
    td_xfer_put16(b + 4, TD_XFER_POOL_VERSION);
    td_xfer_put16(b + 6, (uint16_t)pool->mem);
    td_xfer_put32(b + 8, pool->id);
    td_xfer_put32(b + 12, (uint32_t)rk_len);
    td_xfer_put64(b + 16, (uint64_t)(uintptr_t)pool->base);
    td_xfer_put64(b + 24, pool->block_size);
    td_xfer_put64(b + 32, pool->nblocks);
    memcpy(b + TD_XFER_POOL_HDR_LEN, rk, rk_len);
    ucp_rkey_buffer_release(rk);
    *buf = b;
    *len = TD_XFER_POOL_HDR_LEN + rk_len;
    return TD_OK;
}

/* ======================================================================== */
/* Peers                                                                    */
/* ======================================================================== */

static void
td_xfer_on_close(void *request, ucs_status_t s, void *user_data)
{
    td_xfer_t *x = user_data;
    x->closing--;
    ucp_request_free(request);
}

static void
td_xfer_ep_close(td_xfer_t *x, ucp_ep_h ep, int force)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
        .cb.send = td_xfer_on_close,
        .user_data = x,
    };
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(r))
        x->closing++;
    else if (UCS_PTR_IS_ERR(r))
        td_debug("xfer %016" PRIx64 ": endpoint close: %s", x->incarnation,
                 ucs_status_string(UCS_PTR_STATUS(r)));
}

/* Close the endpoint (if open) and end every transfer still on it: expired
 * ones with `expired_status`, the rest with `status`. The ops are detached
 * first so that UCX callbacks fired by the forced close see them ENDED. */
static void
td_xfer_peer_close(td_xfer_peer_t *peer, int force)
{
    td_xfer_t *x = peer->x;
    td_status_t status = peer->failed ? TD_ERR_PEER : TD_ERR_CANCELED;
    uint64_t now = td_xfer_now_ns();
    td_xfer_op_t *ops = peer->ops;
    peer->ops = peer->ops_tail = NULL;
    for (td_xfer_op_t *op = ops; op; op = op->next) {
        op->peer = NULL;
        td_xfer_op_set_state(op, TD_XFER_OP_ENDED);  /* callbacks only unref */
        op->refs++;                                   /* held until queued */
    }
    if (peer->ep) {
        ucp_ep_h ep = peer->ep;
        peer->ep = NULL;
        td_xfer_ep_close(x, ep, force || ops != NULL);
    }
    while (ops) {
        td_xfer_op_t *op = ops;
        ops = op->next;
        op->next = op->prev = NULL;
        td_status_t st = status;
        if (peer->fail_status == TD_ERR_TIMEOUT && op->deadline_ns && op->deadline_ns <= now)
            st = TD_ERR_TIMEOUT;
        op->result = st;
        op->qnext = NULL;
        if (x->done_q_tail)
            x->done_q_tail->qnext = op;
        else
            x->done_q = op;
        x->done_q_tail = op;     /* the hold taken above becomes the queue's */
    }
    td_xfer_kick(x);
}

/* The endpoint failed (UCX error callback) or a deadline passed: close it by
 * force, fail its transfers, report the peer once. */
static void
td_xfer_peer_fail(td_xfer_peer_t *peer, td_status_t why)
{
    td_xfer_t *x = peer->x;
    if (peer->failed)
        return;
    peer->failed = 1;
    peer->fail_status = why;
    x->stats.peers_failed++;
    td_warn("xfer %016" PRIx64 ": peer %016" PRIx64 " failed: %s", x->incarnation,
            peer->incarnation, td_status_str(why));
    td_xfer_peer_close(peer, 1);
    peer->fail_queued = 1;
    peer->fail_next = x->fail_q;
    x->fail_q = peer;
    td_xfer_kick(x);
}

static void
td_xfer_on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t s)
{
    td_xfer_peer_t *peer = arg;
    td_debug("xfer: peer %016" PRIx64 " endpoint error: %s", peer->incarnation,
             ucs_status_string(s));
    td_xfer_peer_fail(peer, TD_ERR_PEER);
}

static void
td_xfer_on_sweep(evutil_socket_t fd, short what, void *arg)
{
    td_xfer_t *x = arg;
    uint64_t now = td_xfer_now_ns();
    /* every listed op: transfers and the failure notes of refused posts */
    for (td_xfer_peer_t *peer = x->peers; peer; peer = peer->next) {
        for (td_xfer_op_t *op = peer->ops; op; op = op->next) {
            if (op->deadline_ns && op->deadline_ns <= now) {
                td_warn("xfer %" PRIu64 " to peer %016" PRIx64 ": deadline passed",
                        op->xfer_id, peer->incarnation);
                td_xfer_peer_fail(peer, TD_ERR_TIMEOUT);
                break;
            }
        }
    }
    td_xfer_progress_arm(x);
    td_xfer_drain(x);
}

td_status_t
td_xfer_peer_create(td_xfer_t *x, const void *addr, size_t addr_len,
                    uint64_t peer_incarnation, td_xfer_peer_t **out)
{
    if (!addr || addr_len == 0 || addr_len > TD_XFER_MAX_ADDR || peer_incarnation == 0) {
        td_error("xfer %016" PRIx64 ": peer create: bad address (%zu bytes) or incarnation",
                 x->incarnation, addr_len);
        return TD_ERR_INVALID;
    }
    td_xfer_peer_t *peer = calloc(1, sizeof(*peer));
    if (!peer)
        return TD_ERR_NOMEM;
    peer->x = x;
    peer->incarnation = peer_incarnation;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = { .cb = td_xfer_on_ep_error, .arg = peer },
    };
    ucs_status_t s = ucp_ep_create(x->worker, &ep, &peer->ep);
    if (s != UCS_OK) {
        td_error("xfer %016" PRIx64 ": peer %016" PRIx64 ": endpoint create: %s",
                 x->incarnation, peer_incarnation, ucs_status_string(s));
        free(peer);
        return td_xfer_status_from_ucs(s);
    }
    peer->next = x->peers;
    if (x->peers)
        x->peers->prev = peer;
    x->peers = peer;
    td_debug("xfer %016" PRIx64 ": peer %016" PRIx64 " connected", x->incarnation,
             peer_incarnation);
    *out = peer;
    return TD_OK;
}

td_status_t
td_xfer_peer_import_pool(td_xfer_peer_t *peer, const void *buf, size_t len)
{
    td_xfer_t *x = peer->x;
    const uint8_t *b = buf;
    if (!b || len < TD_XFER_POOL_HDR_LEN || td_xfer_get32(b) != TD_XFER_POOL_MAGIC ||
        td_xfer_get16(b + 4) != TD_XFER_POOL_VERSION) {
        td_warn("xfer: peer %016" PRIx64 ": pool export malformed (%zu bytes)",
                peer->incarnation, len);
        return TD_ERR_PROTO;
    }
    td_xfer_rpool_t rp = {
        .id = td_xfer_get32(b + 8),
        .base = td_xfer_get64(b + 16),
        .block_size = td_xfer_get64(b + 24),
        .nblocks = td_xfer_get64(b + 32),
    };
    uint32_t rk_len = td_xfer_get32(b + 12);
    uint16_t mem = td_xfer_get16(b + 6);
    if (rk_len == 0 || rk_len > TD_XFER_MAX_RKEY || rk_len != len - TD_XFER_POOL_HDR_LEN ||
        mem > TD_XFER_MEM_CUDA || rp.block_size == 0 || rp.nblocks == 0 ||
        rp.nblocks > UINT64_MAX / rp.block_size ||
        rp.base > UINT64_MAX - rp.block_size * rp.nblocks) {
        td_warn("xfer: peer %016" PRIx64 ": pool %" PRIu32 " export has bad fields "
                "(rkey %" PRIu32 " of %zu bytes, %" PRIu64 " x %" PRIu64 ")",
                peer->incarnation, rp.id, rk_len, len, rp.nblocks, rp.block_size);
        return TD_ERR_PROTO;
    }
    for (size_t i = 0; i < peer->npools; i++) {
        if (peer->pools[i].id == rp.id) {
            td_warn("xfer: peer %016" PRIx64 ": pool %" PRIu32 " already imported",
                    peer->incarnation, rp.id);
            return TD_ERR_INVALID;
        }
    }
    if (!peer->ep) {
        td_warn("xfer: peer %016" PRIx64 ": import on a closed endpoint", peer->incarnation);
        return TD_ERR_PEER;
    }
    if (peer->npools == peer->cap_pools) {
        size_t cap = peer->cap_pools ? 2 * peer->cap_pools : 8;
        td_xfer_rpool_t *np = realloc(peer->pools, cap * sizeof(*np));
        if (!np)
            return TD_ERR_NOMEM;
        peer->pools = np;
        peer->cap_pools = cap;
    }
    ucs_status_t s = ucp_ep_rkey_unpack(peer->ep, b + TD_XFER_POOL_HDR_LEN, &rp.rkey);
    if (s != UCS_OK) {
        td_warn("xfer: peer %016" PRIx64 ": pool %" PRIu32 " rkey unpack: %s",
                peer->incarnation, rp.id, ucs_status_string(s));
        return TD_ERR_PROTO;
    }
    void *map = NULL;
    if (x->map_peer_pools && mem == TD_XFER_MEM_HOST &&
        ucp_rkey_ptr(rp.rkey, rp.base, &map) == UCS_OK && map != NULL) {
        rp.map = map;
        rp.map_len = rp.block_size * rp.nblocks;
        struct timeval now = { 0, 0 };
        evtimer_add(x->ev_map, &now);
    }
    peer->pools[peer->npools++] = rp;
    td_debug("xfer %016" PRIx64 ": peer %016" PRIx64 ": pool %" PRIu32 " imported%s",
             x->incarnation, peer->incarnation, rp.id, map ? " (mapped here)" : "");
    return TD_OK;
}

/* Map in the next chunk of rp's pages (the pool is the peer's memory that
 * UCX attached here): after it, a transfer that first reaches them adds
 * nothing to this process's resident memory. Reads only: a page fault per
 * page, nothing written. Returns the bytes done. */
static size_t
td_xfer_map_chunk(td_xfer_rpool_t *rp)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = rp->map_len - rp->map_done;
    uintptr_t a = (uintptr_t)(rp->map + rp->map_done) & ~(uintptr_t)(page - 1);
    volatile const uint8_t *p = (const uint8_t *)a;

    if (n > TD_XFER_MAP_CHUNK)
        n = TD_XFER_MAP_CHUNK;
    size_t span = n + ((uintptr_t)(rp->map + rp->map_done) - a);
#ifdef MADV_POPULATE_READ
    if (madvise((void *)a, span, MADV_POPULATE_READ) != 0)
#endif
        for (size_t i = 0; i < span; i += page)
            (void)p[i];
    rp->map_done += n;
    return n;
}

/* A chunk a pass (then the loop's other events get their turn) until every
 * imported pool that UCX mapped here is mapped in. */
static void
td_xfer_on_map(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    td_xfer_t *x = arg;
    for (td_xfer_peer_t *peer = x->peers; peer; peer = peer->next) {
        for (size_t i = 0; i < peer->npools; i++) {
            td_xfer_rpool_t *rp = &peer->pools[i];
            if (rp->map == NULL || rp->map_done >= rp->map_len)
                continue;
            x->stats.peer_bytes_mapped += td_xfer_map_chunk(rp);
            struct timeval next = { 0, 0 };   /* the next pass */
            evtimer_add(x->ev_map, &next);
            return;
        }
    }
}

static void
td_xfer_peer_free(td_xfer_peer_t *peer, int force)
{
    td_xfer_t *x = peer->x;
    if (peer->ep && td_log_threshold >= TD_LOG_TRACE)
        ucp_ep_print_info(peer->ep, stderr);  /* lanes as wired up by now */
    td_xfer_peer_close(peer, force);
    for (size_t i = 0; i < peer->npools; i++)
        ucp_rkey_destroy(peer->pools[i].rkey);
    free(peer->pools);
    if (peer->fail_queued) {
        td_xfer_peer_t **pp = &x->fail_q;
        while (*pp != peer)
            pp = &(*pp)->fail_next;
        *pp = peer->fail_next;
    }
    if (peer->prev)
        peer->prev->next = peer->next;
    else
        x->peers = peer->next;
    if (peer->next)
        peer->next->prev = peer->prev;
    free(peer);
}

void
td_xfer_peer_destroy(td_xfer_peer_t *peer)
{
    if (peer)
        td_xfer_peer_free(peer, 0);
}

bool
td_xfer_quiet(const td_xfer_t *x, uint64_t dst_incarnation, uint64_t xfer_id)
{
    if (x->closing > 0)
        return false;
    for (const td_xfer_peer_t *p = x->peers; p != NULL; p = p->next) {
        if (p->incarnation != dst_incarnation)
            continue;
        for (const td_xfer_op_t *op = p->ops; op != NULL; op = op->next)
            if (op->xfer_id == xfer_id)
                return false;
    }
    return true;
}

int
td_xfer_peer_failed(const td_xfer_peer_t *peer)
{
    return peer->failed;
}

/* ======================================================================== */
/* Transfers                                                                */
/* ======================================================================== */

static const td_xfer_rpool_t *
td_xfer_peer_pool(td_xfer_peer_t *peer, uint32_t id)
{
    if (peer->last_pool < peer->npools && peer->pools[peer->last_pool].id == id)
        return &peer->pools[peer->last_pool];
    for (size_t i = 0; i < peer->npools; i++) {
        if (peer->pools[i].id == id) {
            peer->last_pool = i;
            return &peer->pools[i];
        }
    }
    return NULL;
}

/* Every piece inside one block of a known pool; logs the first bad one. */
static td_status_t
td_xfer_descs_check(td_xfer_peer_t *peer, uint64_t xfer_id, const td_xfer_desc_t *d,
                    size_t n, uint64_t *bytes)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const td_xfer_rpool_t *rp = td_xfer_peer_pool(peer, d[i].pool_id);
        if (!rp) {
            td_warn("xfer %" PRIu64 " to peer %016" PRIx64 ": piece %zu: unknown pool %" PRIu32,
                    xfer_id, peer->incarnation, i, d[i].pool_id);
            return TD_ERR_NOT_FOUND;
        }
        if (d[i].block >= rp->nblocks || d[i].offset > rp->block_size ||
            d[i].len > rp->block_size - d[i].offset) {
            td_warn("xfer %" PRIu64 " to peer %016" PRIx64 ": piece %zu (block %" PRIu64
                    " offset %" PRIu64 " len %" PRIu64 ") outside pool %" PRIu32
                    " (%" PRIu64 " blocks of %" PRIu64 ")", xfer_id, peer->incarnation, i,
                    d[i].block, d[i].offset, d[i].len, d[i].pool_id, rp->nblocks,
                    rp->block_size);
            return TD_ERR_RANGE;
        }
        if (d[i].len && !d[i].src) {
            td_warn("xfer %" PRIu64 ": piece %zu has no source", xfer_id, i);
            return TD_ERR_INVALID;
        }
        total += d[i].len;
    }
    *bytes = total;
    return TD_OK;
}

/* Put op at the tail of the peer's in-flight list (the sweep checks its
 * deadline; closing the peer ends it). */
static void
td_xfer_peer_link_op(td_xfer_peer_t *peer, td_xfer_op_t *op, uint32_t deadline_ms)
{
    if (deadline_ms)
        op->deadline_ns = td_xfer_now_ns() + (uint64_t)deadline_ms * 1000000u;
    op->peer = peer;
    op->prev = peer->ops_tail;
    if (peer->ops_tail)
        peer->ops_tail->next = op;
    else
        peer->ops = op;
    peer->ops_tail = op;
}

/* A refused transfer still ends in one failure notification to the receiver
 * (best effort: no `done`, not counted as a transfer). It is on the peer's
 * list with the post's deadline, so that a receiver that stops taking
 * notifications fails the peer instead of keeping the note pending. */
static void
td_xfer_note_reject(td_xfer_peer_t *peer, uint64_t xfer_id, const td_xfer_token_t *token,
                    td_status_t why, uint32_t deadline_ms)
{
    td_xfer_op_t *op = td_xfer_op_get(peer->x);
    if (!op)
        return;
    op->counted = 0;
    op->xfer_id = xfer_id;
    op->token = *token;
    op->status = why;
    op->dst_incarnation = peer->incarnation;
    td_xfer_peer_link_op(peer, op, deadline_ms);
    td_xfer_note_send(op, peer->ep);
}

static void
td_xfer_on_flushed(void *request, ucs_status_t s, void *user_data)
{
    td_xfer_op_t *op = user_data;
    ucp_request_free(request);
    op->x->reqs--;
    if (op->state == TD_XFER_OP_PUT) {
        if (s != UCS_OK && op->status == TD_OK)
            op->status = td_xfer_status_from_ucs(s);
        td_xfer_note_send(op, op->peer->ep);
    }
    td_xfer_op_unref(op);
}

td_status_t
td_xfer_post(td_xfer_peer_t *peer, uint64_t xfer_id, const td_xfer_token_t *token,
             const td_xfer_desc_t *descs, size_t ndescs, const void *payload,
             size_t payload_len, uint32_t deadline_ms, td_xfer_done_fn done, void *arg)
{
    td_xfer_t *x = peer->x;
    td_status_t st;
    uint64_t bytes = 0;
    if (peer->failed || !peer->ep) {
        td_warn("xfer %" PRIu64 ": peer %016" PRIx64 " has failed", xfer_id,
                peer->incarnation);
        x->stats.rejected++;
        return TD_ERR_PEER;
    }
    if (payload_len > x->max_payload || (payload_len && !payload)) {
        td_warn("xfer %" PRIu64 ": payload of %zu bytes refused (max %" PRIu32 ")", xfer_id,
                payload_len, x->max_payload);
        st = payload_len > x->max_payload ? TD_ERR_TOO_BIG : TD_ERR_INVALID;
        goto err_reject;
    }
    if ((ndescs && !descs) || !done) {
        td_warn("xfer %" PRIu64 ": no pieces or no done callback", xfer_id);
        st = TD_ERR_INVALID;
        goto err_reject;
    }
    st = td_xfer_descs_check(peer, xfer_id, descs, ndescs, &bytes);
    if (st != TD_OK)
        goto err_reject;
    td_xfer_op_t *op = td_xfer_op_get(x);
    if (!op) {
        st = TD_ERR_NOMEM;
        goto err_reject;
    }
    op->counted = 1;
    op->xfer_id = xfer_id;
    op->token = *token;
    op->dst_incarnation = peer->incarnation;
    op->bytes = bytes;
    op->done = done;
    op->arg = arg;
    op->payload_len = payload_len;
    if (payload_len)
        memcpy(op->payload, payload, payload_len);
    td_xfer_peer_link_op(peer, op, deadline_ms);
    x->stats.posted++;
    x->stats.inflight++;
    td_xfer_op_set_state(op, TD_XFER_OP_PUT);

    /* UCX may call the endpoint error handler inside any of these calls,
     * which ends the op (state ENDED, endpoint gone): check after each. */
    for (size_t i = 0; i < ndescs && op->state == TD_XFER_OP_PUT; i++) {
        if (descs[i].len == 0)
            continue;
        const td_xfer_rpool_t *rp = td_xfer_peer_pool(peer, descs[i].pool_id);
        uint64_t raddr = rp->base + descs[i].block * rp->block_size + descs[i].offset;
        ucs_status_ptr_t r = ucp_put_nbx(peer->ep, descs[i].src, descs[i].len, raddr,
                                         rp->rkey, &x->put_param);
        if (UCS_PTR_IS_ERR(r)) {
            op->status = td_xfer_status_from_ucs(UCS_PTR_STATUS(r));
            td_warn("xfer %" PRIu64 ": put %zu failed: %s", xfer_id, i,
                    ucs_status_string(UCS_PTR_STATUS(r)));
            break;
        }
        if (r != NULL)
            ucp_request_free(r); /* completion is covered by the flush */
    }
    if (op->state == TD_XFER_OP_PUT) {
        ucp_request_param_t fp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = td_xfer_on_flushed,
            .user_data = op,
        };
        ucs_status_ptr_t r = ucp_ep_flush_nbx(peer->ep, &fp);
        if (UCS_PTR_IS_PTR(r)) {
            op->refs++;
            x->reqs++;
        } else if (op->state == TD_XFER_OP_PUT) {
            if (UCS_PTR_IS_ERR(r) && op->status == TD_OK)
                op->status = td_xfer_status_from_ucs(UCS_PTR_STATUS(r));
            td_xfer_note_send(op, peer->ep);
        }
    }
    td_xfer_progress_worker(x);
    td_xfer_poll_pending(x);
    td_xfer_kick(x);
    return TD_OK;

err_reject:
    x->stats.rejected++;
    td_xfer_note_reject(peer, xfer_id, token, st, deadline_ms);
    td_xfer_kick(x);
    return st;
}
