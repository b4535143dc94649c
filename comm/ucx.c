/* comm/ucx.c — the communicator's UCX backend (comm/ucx.h): ranks in
 * different processes, each with a transfer engine of its own that the
 * calling thread drives while a collective waits. Every ordered pair of ranks
 * sends each collective one segment in chunks: puts into the receiver's
 * registered slots (or inline in the message when small), one notification
 * per chunk, slots freed by acknowledgements. docs/comm.md, "UCX backend". */
#include "ucx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "clock.h"
#include "fsm.h"
#include "log.h"

/* ======================================================================== */
/* Wire formats (little-endian, fixed layout; docs/comm.md)                 */
/* ======================================================================== */

/* Address blob: magic u32 "TDCA" | version u8 | 3 reserved bytes |
 * incarnation u64 | token [16] | the worker address. The token is the
 * rank's engine's (td_xfer_rx_token): every message to it carries it, and a
 * message without it is dropped unparsed (the blobs travel over the
 * authenticated control plane, or a private domain directory). */
#define UCX_ADDR_MAGIC    0x41434454u
#define UCX_ADDR_VERSION  2u
#define UCX_ADDR_HDR_LEN  32u
#define UCX_MAX_ADDR      (1u << 20)

/* Message header, the payload of every notification (56 bytes):
 * magic u32 "TDCM" | version u8 | kind u8 | coll u8 | flags u8 | src u32 |
 * len u32 | seq u64 | chunk u64 | off u64 | total u64 | ack u64.
 * DATA: chunk `chunk` of the sender's segment to the receiver in collective
 * `seq` (of kind `coll`): `len` bytes at `off` of `total`; INLINE: the bytes
 * follow the header, else they were put into the receiver's slot
 * chunk % slots for the sender. HELLO: a hello body follows. ABORT: `len`
 * holds the sender's status. Every kind: `ack` = chunks of the receiver's
 * segments the sender has taken in (which frees their slots). */
#define UCX_MSG_MAGIC     0x4d434454u
#define UCX_MSG_VERSION   1u
#define UCX_MSG_HDR_LEN   56u
/* Hello body: size u32 | slots u32 | chunk_bytes u32 | max_payload u32 |
 * the receive pool's export (td_xfer_pool_export). */
#define UCX_HELLO_LEN     16u
/* xfer/xfer.c's notification header (docs/xfer.md), for the wire counts. */
#define UCX_XFER_HDR_LEN  56u

#define UCX_POOL_ID       0x434f4d4du   /* the engine is the communicator's */
#define UCX_MAX_SIZE      4096u
#define UCX_DEFAULT_CHUNK (128u << 10)
#define UCX_DEFAULT_SLOTS 4u
#define UCX_MIN_CHUNK     4096u
#define UCX_MAX_CHUNK     (64u << 20)
#define UCX_MAX_SLOTS     64u
#define UCX_ABORT_WAIT_MS 200u   /* an abort's messages: bounded push-out */
#define UCX_QUIET_WAIT_MS 1000u  /* destroy: messages still in flight */
#define UCX_MAX_WAIT_MS   (1ull << 40)   /* longer deadlines: this (35 years) */

typedef enum {
    UCX_MSG_HELLO = 1,
    UCX_MSG_DATA = 2,
    UCX_MSG_ACK = 3,
    UCX_MSG_ABORT = 4,
} ucx_msg_kind_t;

typedef enum {
    UCX_COLL_BARRIER = 1,
    UCX_COLL_ALLGATHER = 2,
    UCX_COLL_REDUCE_SCATTER = 3,
    UCX_COLL_ALLTOALLV = 4,
} ucx_coll_kind_t;

static const char *const ucx_coll_names[] = {
    [0] = "none", [UCX_COLL_BARRIER] = "barrier", [UCX_COLL_ALLGATHER] = "all-gather",
    [UCX_COLL_REDUCE_SCATTER] = "reduce-scatter", [UCX_COLL_ALLTOALLV] = "all-to-all",
};

#define UCX_FLAG_MORE   1u   /* more chunks of this segment follow */
#define UCX_FLAG_INLINE 2u   /* the bytes follow the header */

typedef struct {
    uint8_t kind, coll, flags;
    uint32_t src, len;
    uint64_t seq, chunk, off, total, ack;
} ucx_msg_t;

static void
ucx_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
ucx_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
ucx_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t
ucx_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void
ucx_msg_pack(uint8_t *h, const ucx_msg_t *m)
{
    ucx_put32(h + 0, UCX_MSG_MAGIC);
    h[4] = UCX_MSG_VERSION;
    h[5] = m->kind;
    h[6] = m->coll;
    h[7] = m->flags;
    ucx_put32(h + 8, m->src);
    ucx_put32(h + 12, m->len);
    ucx_put64(h + 16, m->seq);
    ucx_put64(h + 24, m->chunk);
    ucx_put64(h + 32, m->off);
    ucx_put64(h + 40, m->total);
    ucx_put64(h + 48, m->ack);
}

static int
ucx_msg_unpack(const uint8_t *h, size_t len, ucx_msg_t *m)
{
    if (h == NULL || len < UCX_MSG_HDR_LEN || ucx_get32(h) != UCX_MSG_MAGIC ||
        h[4] != UCX_MSG_VERSION)
        return -1;
    *m = (ucx_msg_t){
        .kind = h[5], .coll = h[6], .flags = h[7],
        .src = ucx_get32(h + 8), .len = ucx_get32(h + 12),
        .seq = ucx_get64(h + 16), .chunk = ucx_get64(h + 24), .off = ucx_get64(h + 32),
        .total = ucx_get64(h + 40), .ack = ucx_get64(h + 48),
    };
    return 0;
}

/* ======================================================================== */
/* Objects                                                                  */
/* ======================================================================== */

/* A chunk that arrived (its bytes in the slot) and waits to be taken in. */
typedef struct {
    int full;
    uint8_t coll, flags;
    uint32_t len;
    uint64_t seq, chunk, off, total;
} ucx_slot_t;

/* This rank's view of one rank: the pair both ways. */
typedef struct {
    td_xfer_peer_t *peer;      /* NULL for this rank */
    uint64_t incarnation;
    td_xfer_token_t token;     /* what a message to it carries (its address blob) */
    int hello;                 /* its hello arrived: its pool is imported */
    int lost;                  /* gone: its endpoint failed, or it gave up */
    /* its receive pool, from its hello */
    uint32_t peer_slots, peer_chunk;
    size_t inline_max;         /* a chunk up to this goes inside the message */
    /* to it */
    uint64_t tx_next;          /* index of the next chunk to it (over every collective) */
    uint64_t tx_acked;         /* chunks it has taken in */
    const uint8_t *tx_src;     /* this collective's segment to it */
    size_t tx_len, tx_sent;
    int tx_fin;
    /* from it */
    uint64_t rx_next;          /* chunks of its taken in = the next index expected */
    uint64_t rx_told;          /* rx_next as last told to it */
    ucx_slot_t *slots;         /* [u->slots]: chunk c waits in slots[c % u->slots] */
    int rx_known, rx_fin;      /* this collective's segment from it */
    size_t rx_total, rx_got;
} ucx_rank_t;

/* The current collective's arguments. */
typedef struct {
    ucx_coll_kind_t kind;
    const uint8_t *send;
    const uint8_t *own;        /* reduce-scatter: this rank's contribution */
    size_t bytes;              /* all-gather: per rank; reduce-scatter: count x 4 */
    const size_t *send_bytes;  /* all-to-all */
    uint8_t *recv;
    size_t recv_cap;
    size_t *recv_bytes;        /* all-to-all */
} ucx_coll_t;

typedef enum {
    UCX_CONNECTING = 0,        /* create: hellos out, waiting for every rank's */
    UCX_READY,                 /* collectives run */
    UCX_BROKEN,                /* a failure: every call returns it */
    UCX_CLOSING,               /* destroy */
    UCX_NSTATES,
} ucx_state_t;

static const char *const ucx_state_names[] = {
    [UCX_CONNECTING] = "connecting", [UCX_READY] = "ready", [UCX_BROKEN] = "broken",
    [UCX_CLOSING] = "closing",
};

static const uint32_t ucx_state_allowed[] = {
    [UCX_CONNECTING] = TD_FSM_BIT(UCX_READY) | TD_FSM_BIT(UCX_BROKEN) | TD_FSM_BIT(UCX_CLOSING),
    [UCX_READY] = TD_FSM_BIT(UCX_BROKEN) | TD_FSM_BIT(UCX_CLOSING),
    [UCX_BROKEN] = TD_FSM_BIT(UCX_CLOSING),
    [UCX_CLOSING] = 0,
};

static const td_fsm_t ucx_fsm = {
    .what = "ucx communicator", .names = ucx_state_names, .allowed = ucx_state_allowed,
    .nstates = UCX_NSTATES,
};

typedef struct {
    td_comm_t head;            /* first: comm.h */
    ucx_state_t state;
    td_status_t fail;          /* the first failure (TD_OK) */
    int told_abort;            /* the other ranks were told of it */
    td_xfer_t *x;              /* the caller's, given to us (ucx.h) */
    struct event_base *base;   /* x's */
    struct event *ev_wake;     /* wakes the loop at the deadline */
    td_xfer_pool_t *pool;      /* [size x slots] blocks of chunk_bytes */
    uint8_t *pool_base;        /* slot j for source s: block s x slots + j */
    uint32_t chunk_bytes, slots, max_payload;
    ucx_rank_t *ranks;         /* [size] */
    uint8_t *msg;              /* [max_payload]: the message being built */
    uint8_t *own;              /* [own_cap]: an in-place reduce-scatter's own part */
    size_t own_cap;
    uint32_t hellos;           /* hellos received */
    uint64_t seq;              /* collectives started */
    uint64_t next_id;
    uint32_t tx_inflight;      /* DATA messages not yet done (their sources in use) */
    uint32_t ctl_inflight;     /* other messages not yet done */
    ucx_coll_t cur;
    td_comm_ucx_stats_t wire;
} ucx_comm_t;

static const td_comm_ops_t ucx_ops;

static void
ucx_set_state(ucx_comm_t *u, ucx_state_t to, const char *why)
{
    u->state = td_fsm_step(&ucx_fsm, u->head.rank, u->state, to, why);
}

/* Record the first failure; 1 when this was it (the caller logs why). */
static int
ucx_fail(ucx_comm_t *u, td_status_t st)
{
    if (u->fail != TD_OK)
        return 0;
    u->fail = st;
    if (u->state == UCX_CONNECTING || u->state == UCX_READY)
        ucx_set_state(u, UCX_BROKEN, td_status_str(st));
    return 1;
}

#define ucx_log_fail(u, st, fmt, ...)                                              \
    do {                                                                           \
        if (ucx_fail((u), (st)))                                                   \
            td_warn("%s rank %u/%u: " fmt, (u)->head.name, (u)->head.rank,         \
                    (u)->head.size, __VA_ARGS__);                                  \
    } while (0)

/* ======================================================================== */
/* Sending                                                                  */
/* ======================================================================== */

/* Rank s is gone (its endpoint failed, or it said it gave up). That fails
 * the collective under way when it still needs s, and every later one (each
 * needs every rank): ucx_lost_check. */
static void
ucx_rank_lost(ucx_comm_t *u, uint32_t s, const char *why)
{
    if (u->ranks[s].lost || u->state == UCX_CLOSING)
        return;
    u->ranks[s].lost = 1;
    td_warn("%s rank %u/%u: rank %u is gone: %s", u->head.name, u->head.rank, u->head.size, s,
            why);
}

/* xfer ids: kind (8 bits) | destination rank (16) | a counter (40). */
static void
ucx_on_sent(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg)
{
    ucx_comm_t *u = arg;
    unsigned kind = (unsigned)(xfer_id >> 56);
    uint32_t to = (uint32_t)(xfer_id >> 40) & 0xffffu;

    if (kind == UCX_MSG_DATA)
        u->tx_inflight--;
    else
        u->ctl_inflight--;
    if (status == TD_OK || u->state == UCX_CLOSING)
        return;
    if (status == TD_ERR_PEER || status == TD_ERR_CANCELED)
        ucx_rank_lost(u, to, "a message to it failed");   /* its source is free again */
    else
        ucx_log_fail(u, status, "message to rank %u failed: %s", to, td_status_str(status));
}

/* Send m (src and ack filled in here) to rank `to`. A DATA message's m->len
 * bytes at `data` go inline when m->flags has UCX_FLAG_INLINE, else by put
 * into its slot for this rank; a HELLO's body (m->len bytes) goes inline. */
static td_status_t
ucx_send(ucx_comm_t *u, uint32_t to, ucx_msg_t *m, const void *data)
{
    ucx_rank_t *r = &u->ranks[to];
    size_t plen = UCX_MSG_HDR_LEN, ndescs = 0;
    td_xfer_desc_t desc;

    m->src = u->head.rank;
    m->ack = r->rx_next;
    ucx_msg_pack(u->msg, m);
    if (m->kind == UCX_MSG_HELLO || (m->kind == UCX_MSG_DATA && (m->flags & UCX_FLAG_INLINE))) {
        if (m->len)
            memcpy(u->msg + plen, data, m->len);
        plen += m->len;
    } else if (m->kind == UCX_MSG_DATA && m->len) {
        desc = (td_xfer_desc_t){
            .src = data, .pool_id = UCX_POOL_ID,
            .block = (uint64_t)u->head.rank * r->peer_slots + m->chunk % r->peer_slots,
            .offset = 0, .len = m->len,
        };
        ndescs = 1;
    }
    uint64_t id = (uint64_t)m->kind << 56 | (uint64_t)(to & 0xffffu) << 40 |
                  (u->next_id++ & ((1ull << 40) - 1));
    td_status_t st = td_xfer_post(r->peer, id, &r->token, ndescs ? &desc : NULL, ndescs, u->msg,
                                  plen, 0, ucx_on_sent, u);
    if (st == TD_ERR_PEER) {
        ucx_rank_lost(u, to, "its endpoint has failed");
        return st;
    }
    if (st != TD_OK) {
        ucx_log_fail(u, st, "message to rank %u refused: %s", to, td_status_str(st));
        return st;
    }
    r->rx_told = m->ack;
    if (m->kind == UCX_MSG_DATA)
        u->tx_inflight++;
    else
        u->ctl_inflight++;
    u->wire.messages++;
    u->wire.header_bytes += UCX_XFER_HDR_LEN + UCX_MSG_HDR_LEN;
    if (m->kind == UCX_MSG_ACK)
        u->wire.acks++;
    else if (m->kind == UCX_MSG_DATA && ndescs)
        u->wire.put_bytes += m->len;
    else if (m->kind == UCX_MSG_DATA)
        u->wire.inline_bytes += m->len;
    return TD_OK;
}

/* Post every chunk of this collective the receivers have room for. */
static void
ucx_send_more(ucx_comm_t *u)
{
    for (uint32_t d = 0; d < u->head.size && u->fail == TD_OK; d++) {
        ucx_rank_t *r = &u->ranks[d];
        if (d == u->head.rank || r->lost)
            continue;
        while (!r->tx_fin && u->fail == TD_OK && r->tx_next < r->tx_acked + r->peer_slots) {
            size_t left = r->tx_len - r->tx_sent;
            size_t len = left < r->peer_chunk ? left : r->peer_chunk;
            ucx_msg_t m = {
                .kind = UCX_MSG_DATA, .coll = (uint8_t)u->cur.kind,
                .flags = (uint8_t)((len < left ? UCX_FLAG_MORE : 0) |
                                   (len <= r->inline_max ? UCX_FLAG_INLINE : 0)),
                .len = (uint32_t)len, .seq = u->seq, .chunk = r->tx_next, .off = r->tx_sent,
                .total = r->tx_len,
            };
            const uint8_t *src = r->tx_src + r->tx_sent;
            /* counted first: the engine progresses inside the post, and
             * the receiver's acknowledgement of it may arrive right there */
            r->tx_next++;
            r->tx_sent += len;
            r->tx_fin = r->tx_sent == r->tx_len;
            if (ucx_send(u, d, &m, src) != TD_OK)
                break;
        }
    }
}

/* Tell a sender the slots it may use again: while its segment of this
 * collective is still coming (it may be waiting for room), or when what it
 * knows would not let it send its next chunk (so that the next collective's
 * first chunk never waits for us). */
static void
ucx_send_acks(ucx_comm_t *u)
{
    for (uint32_t s = 0; s < u->head.size && u->fail == TD_OK; s++) {
        ucx_rank_t *r = &u->ranks[s];
        if (s == u->head.rank || r->lost || r->rx_next == r->rx_told)
            continue;
        if (!r->rx_fin || r->rx_next - r->rx_told >= u->slots) {
            ucx_msg_t m = { .kind = UCX_MSG_ACK };
            ucx_send(u, s, &m, NULL);
        }
    }
}

/* Best effort: the other ranks learn that this one gave up (their
 * collectives return TD_ERR_PEER at once), pushed out for a short while. */
static void ucx_wait_quiet(ucx_comm_t *u, uint64_t ms);

static void
ucx_tell_abort(ucx_comm_t *u, td_status_t st)
{
    if (u->told_abort)
        return;
    u->told_abort = 1;
    for (uint32_t d = 0; d < u->head.size; d++) {
        ucx_rank_t *r = &u->ranks[d];
        if (d == u->head.rank || r->peer == NULL || r->lost)
            continue;
        ucx_msg_t m = { .kind = UCX_MSG_ABORT, .len = (uint32_t)(int32_t)st };
        ucx_send(u, d, &m, NULL);
    }
    ucx_wait_quiet(u, UCX_ABORT_WAIT_MS);
}

/* ======================================================================== */
/* Receiving (the notification handler, inside the engine's progress)      */
/* ======================================================================== */

static void
ucx_on_hello(ucx_comm_t *u, ucx_rank_t *r, uint32_t s, const uint8_t *b, size_t len)
{
    if (r->hello || len < UCX_HELLO_LEN) {
        ucx_log_fail(u, TD_ERR_PROTO, "rank %u: %s hello", s, r->hello ? "second" : "short");
        return;
    }
    uint32_t size = ucx_get32(b), slots = ucx_get32(b + 4), chunk = ucx_get32(b + 8);
    uint32_t maxp = ucx_get32(b + 12);
    if (size != u->head.size) {
        ucx_log_fail(u, TD_ERR_MISMATCH, "rank %u counts %u ranks, this one %u", s, size,
                     u->head.size);
        return;
    }
    if (slots < 2 || slots > UCX_MAX_SLOTS || chunk < UCX_MIN_CHUNK || chunk > UCX_MAX_CHUNK ||
        chunk % 64 || maxp < UCX_MSG_HDR_LEN) {
        ucx_log_fail(u, TD_ERR_PROTO, "rank %u: hello with bad geometry (%u slots of %u bytes, "
                     "messages of %u)", s, slots, chunk, maxp);
        return;
    }
    td_status_t st = td_xfer_peer_import_pool(r->peer, b + UCX_HELLO_LEN, len - UCX_HELLO_LEN);
    if (st != TD_OK) {
        ucx_log_fail(u, st == TD_ERR_PEER ? st : TD_ERR_PROTO, "rank %u: receive pool: %s", s,
                     td_status_str(st));
        return;
    }
    uint32_t room = (maxp < u->max_payload ? maxp : u->max_payload) - UCX_MSG_HDR_LEN;
    r->peer_slots = slots;
    r->peer_chunk = chunk;
    r->inline_max = room < chunk ? room : chunk;
    r->hello = 1;
    u->hellos++;
    td_debug("%s rank %u/%u: rank %u connected (%u slots of %u bytes, inline up to %zu)",
             u->head.name, u->head.rank, u->head.size, s, slots, chunk, r->inline_max);
}

static void
ucx_on_data(ucx_comm_t *u, ucx_rank_t *r, uint32_t s, const ucx_msg_t *m, const uint8_t *data,
            size_t len)
{
    int inl = !!(m->flags & UCX_FLAG_INLINE);
    if (m->chunk < r->rx_next || m->chunk - r->rx_next >= u->slots) {
        ucx_log_fail(u, TD_ERR_PROTO, "rank %u: chunk %" PRIu64 " outside the window [%" PRIu64
                     ", +%u)", s, m->chunk, r->rx_next, u->slots);
        return;
    }
    ucx_slot_t *slot = &r->slots[m->chunk % u->slots];
    if (slot->full || m->len > u->chunk_bytes || m->off > m->total ||
        (m->len == 0 && (m->flags & UCX_FLAG_MORE)) ||
        m->len > m->total - m->off || !(m->flags & UCX_FLAG_MORE) != (m->off + m->len == m->total) ||
        len != (inl ? m->len : 0)) {
        ucx_log_fail(u, TD_ERR_PROTO, "rank %u: bad chunk %" PRIu64 " (%u bytes at %" PRIu64
                     " of %" PRIu64 ", flags %#x, %zu inline)", s, m->chunk, m->len, m->off,
                     m->total, m->flags, len);
        return;
    }
    if (inl && m->len)
        memcpy(u->pool_base + ((size_t)s * u->slots + m->chunk % u->slots) * u->chunk_bytes,
               data, m->len);
    *slot = (ucx_slot_t){
        .full = 1, .coll = m->coll, .flags = m->flags, .len = m->len, .seq = m->seq,
        .chunk = m->chunk, .off = m->off, .total = m->total,
    };
}

/* A message is for this rank when it carries this engine's token (in the
 * address blob the other ranks got). */
static bool
ucx_note_auth(td_xfer_t *x, uint64_t xfer_id, const td_xfer_token_t *token, void *arg)
{
    (void)xfer_id;
    (void)arg;
    return td_xfer_token_eq(token, td_xfer_rx_token(x));
}

static void
ucx_on_note(td_xfer_t *x, const td_xfer_note_t *note, void *arg)
{
    ucx_comm_t *u = arg;
    ucx_msg_t m;

    if (u->fail != TD_OK)
        return;
    if (note->status != TD_OK) {
        ucx_log_fail(u, TD_ERR_PEER, "a message from incarnation %016" PRIx64 " failed: %s",
                     note->src_incarnation, td_status_str(note->status));
        return;
    }
    const uint8_t *p = note->payload;
    if (ucx_msg_unpack(p, note->payload_len, &m) != 0 || m.src >= u->head.size ||
        m.src == u->head.rank || note->src_incarnation != u->ranks[m.src].incarnation) {
        ucx_log_fail(u, TD_ERR_PROTO, "malformed message (%zu bytes) from incarnation %016"
                     PRIx64, note->payload_len, note->src_incarnation);
        return;
    }
    ucx_rank_t *r = &u->ranks[m.src];
    if (m.ack > r->tx_next) {
        ucx_log_fail(u, TD_ERR_PROTO, "rank %u acknowledges %" PRIu64 " chunks of %" PRIu64
                     " sent", m.src, m.ack, r->tx_next);
        return;
    }
    if (m.ack > r->tx_acked)
        r->tx_acked = m.ack;
    const uint8_t *body = p + UCX_MSG_HDR_LEN;
    size_t blen = note->payload_len - UCX_MSG_HDR_LEN;
    switch (m.kind) {
    case UCX_MSG_HELLO:
        ucx_on_hello(u, r, m.src, body, blen);
        break;
    case UCX_MSG_DATA:
        ucx_on_data(u, r, m.src, &m, body, blen);
        break;
    case UCX_MSG_ACK:
        break;
    case UCX_MSG_ABORT: {
        int32_t st = (int32_t)m.len;
        char why[64];
        snprintf(why, sizeof(why), "it gave up (%s)",
                 st < TD_OK && st >= TD_ERR_INTERNAL ? td_status_str((td_status_t)st) : "?");
        ucx_rank_lost(u, m.src, why);
        break;
    }
    default:
        ucx_log_fail(u, TD_ERR_PROTO, "rank %u: message of unknown kind %u", m.src, m.kind);
    }
}

static void
ucx_on_peer_fail(td_xfer_t *x, td_xfer_peer_t *peer, td_status_t status, void *arg)
{
    ucx_comm_t *u = arg;
    for (uint32_t s = 0; s < u->head.size; s++)
        if (u->ranks[s].peer == peer)
            ucx_rank_lost(u, s, status == TD_ERR_PEER ? "its endpoint failed" :
                          td_status_str(status));
}

/* ======================================================================== */
/* Waiting: the calling thread runs the engine's loop                       */
/* ======================================================================== */

static void
ucx_on_wake(evutil_socket_t fd, short what, void *arg)
{
    /* nothing: the loop returns and the waiter looks at the clock */
}

/* ms from now, as an absolute CLOCK_MONOTONIC deadline. */
static uint64_t
ucx_deadline(uint64_t ms)
{
    return td_clock_ns() + (ms < UCX_MAX_WAIT_MS ? ms : UCX_MAX_WAIT_MS) * 1000000u;
}

/* Run the loop once: until something happened, or until deadline_ns. */
static void
ucx_wait_once(ucx_comm_t *u, uint64_t deadline_ns)
{
    uint64_t now = td_clock_ns(), left = deadline_ns > now ? deadline_ns - now : 0;
    struct timeval tv = { (time_t)(left / 1000000000u), (suseconds_t)(left % 1000000000u / 1000u) };

    evtimer_add(u->ev_wake, &tv);
    event_base_loop(u->base, EVLOOP_ONCE);
}

/* Run the loop until nothing of ours is in flight, for at most ms. */
static void
ucx_wait_quiet(ucx_comm_t *u, uint64_t ms)
{
    uint64_t until = ucx_deadline(ms);
    while ((u->tx_inflight || u->ctl_inflight) && td_clock_ns() < until)
        ucx_wait_once(u, until);
    evtimer_del(u->ev_wake);
}

/* ======================================================================== */
/* Collectives                                                              */
/* ======================================================================== */

/* The chunk of rank s's segment that comes next, if it has arrived and
 * belongs to this collective (else the communicator fails). */
static ucx_slot_t *
ucx_head(ucx_comm_t *u, uint32_t s)
{
    ucx_rank_t *r = &u->ranks[s];
    ucx_slot_t *slot = &r->slots[r->rx_next % u->slots];

    if (r->rx_fin || !slot->full)
        return NULL;
    if (slot->seq != u->seq || slot->coll != u->cur.kind) {
        ucx_log_fail(u, TD_ERR_MISMATCH, "%s #%" PRIu64 ": rank %u sent chunk %" PRIu64 " of %s #%"
                     PRIu64 ": the ranks do not call the same collectives",
                     ucx_coll_names[u->cur.kind], u->seq, s, slot->chunk,
                     slot->coll < UCX_COLL_ALLTOALLV + 1 ? ucx_coll_names[slot->coll] : "?",
                     slot->seq);
        return NULL;
    }
    if (slot->chunk != r->rx_next || slot->off != r->rx_got ||
        (r->rx_known && slot->total != r->rx_total)) {
        ucx_log_fail(u, TD_ERR_PROTO, "%s #%" PRIu64 ": rank %u sent chunk %" PRIu64 " at %"
                     PRIu64 " of %" PRIu64 ", expected chunk %" PRIu64 " at %zu",
                     ucx_coll_names[u->cur.kind], u->seq, s, slot->chunk, slot->off,
                     slot->total, r->rx_next, r->rx_got);
        return NULL;
    }
    if (!r->rx_known) {
        r->rx_known = 1;
        r->rx_total = slot->total;
    }
    return slot;
}

static const uint8_t *
ucx_slot_bytes(const ucx_comm_t *u, uint32_t s, const ucx_slot_t *slot)
{
    return u->pool_base + ((size_t)s * u->slots + slot->chunk % u->slots) * u->chunk_bytes;
}

/* The slot's chunk is taken in: free it. */
static void
ucx_slot_done(ucx_comm_t *u, uint32_t s, ucx_slot_t *slot)
{
    ucx_rank_t *r = &u->ranks[s];
    r->rx_got += slot->len;
    r->rx_fin = !(slot->flags & UCX_FLAG_MORE);
    r->rx_next++;
    slot->full = 0;
}

/* Rank s's segment must be `want` bytes (all-gather, reduce-scatter). */
static int
ucx_total_ok(ucx_comm_t *u, uint32_t s, size_t want)
{
    if (u->ranks[s].rx_total == want)
        return 1;
    ucx_log_fail(u, TD_ERR_MISMATCH, "%s #%" PRIu64 ": rank %u sends %zu bytes, this rank expects %zu",
                 ucx_coll_names[u->cur.kind], u->seq, s, u->ranks[s].rx_total, want);
    return 0;
}

/* recv[off ..] += (or =, for the first rank) the floats of the chunk. */
static void
ucx_reduce_chunk(float *dst, const uint8_t *src, size_t bytes, int first)
{
    const float *f = (const float *)(const void *)src;
    size_t n = bytes / sizeof(float);

    if (first)
        memcpy(dst, f, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = dst[i] + f[i];
}

/* Take in every chunk that may be taken in now (per the collective's order
 * rules); this rank's own part at its turn. */
static void
ucx_take(ucx_comm_t *u)
{
    ucx_coll_t *c = &u->cur;
    uint32_t me = u->head.rank;
    size_t at = 0;   /* all-to-all: where the next rank's segment goes */

    for (uint32_t s = 0; s < u->head.size && u->fail == TD_OK; s++) {
        ucx_rank_t *r = &u->ranks[s];
        ucx_slot_t *slot;
        if (s == me) {
            if (r->rx_fin) {
                at += r->rx_total;
                continue;
            }
            switch (c->kind) {
            case UCX_COLL_BARRIER:
                break;
            case UCX_COLL_ALLGATHER:
                if (c->send != c->recv + (size_t)me * c->bytes && c->bytes)
                    memmove(c->recv + (size_t)me * c->bytes, c->send, c->bytes);
                break;
            case UCX_COLL_REDUCE_SCATTER:
                if (c->bytes)
                    ucx_reduce_chunk((float *)(void *)c->recv, c->own, c->bytes, me == 0);
                break;
            case UCX_COLL_ALLTOALLV:
                if (r->rx_total > c->recv_cap - at)
                    goto too_big;
                if (r->rx_total)
                    memcpy(c->recv + at, r->tx_src, r->rx_total);
                c->recv_bytes[s] = r->rx_total;
                at += r->rx_total;
                break;
            }
            r->rx_fin = 1;
            continue;
        }
        if (c->kind == UCX_COLL_ALLTOALLV) {
            if (!r->rx_fin && ucx_head(u, s) == NULL && !r->rx_known)
                return;   /* where later ranks' segments go is not known yet */
            if (r->rx_total > c->recv_cap - at)   /* at <= recv_cap: checked before */
                goto too_big;
            c->recv_bytes[s] = r->rx_total;
        }
        while ((slot = ucx_head(u, s)) != NULL) {
            const uint8_t *b = ucx_slot_bytes(u, s, slot);
            switch (c->kind) {
            case UCX_COLL_BARRIER:
                if (!ucx_total_ok(u, s, 0))
                    return;
                break;
            case UCX_COLL_ALLGATHER:
                if (!ucx_total_ok(u, s, c->bytes))
                    return;
                if (slot->len)
                    memcpy(c->recv + (size_t)s * c->bytes + slot->off, b, slot->len);
                break;
            case UCX_COLL_REDUCE_SCATTER:
                if (!ucx_total_ok(u, s, c->bytes))
                    return;
                if (slot->off % sizeof(float) || slot->len % sizeof(float)) {
                    ucx_log_fail(u, TD_ERR_PROTO, "reduce-scatter #%" PRIu64 ": rank %u sent "
                                 "a chunk that splits a float", u->seq, s);
                    return;
                }
                ucx_reduce_chunk((float *)(void *)(c->recv + slot->off), b, slot->len, s == 0);
                break;
            case UCX_COLL_ALLTOALLV:
                if (slot->len)
                    memcpy(c->recv + at + slot->off, b, slot->len);
                break;
            }
            ucx_slot_done(u, s, slot);
        }
        if (c->kind == UCX_COLL_REDUCE_SCATTER && !r->rx_fin)
            return;   /* the sum goes in rank order */
        at += r->rx_total;
    }
    return;

too_big:
    ucx_log_fail(u, TD_ERR_TOO_BIG, "all-to-all #%" PRIu64 ": more than recv_cap (%zu bytes) "
                 "arrives", u->seq, c->recv_cap);
}

/* Every segment sent (and its source free again) and every one taken in. */
static int
ucx_coll_done(const ucx_comm_t *u)
{
    if (u->tx_inflight)
        return 0;
    for (uint32_t s = 0; s < u->head.size; s++)
        if (!u->ranks[s].rx_fin || (s != u->head.rank && !u->ranks[s].tx_fin))
            return 0;
    return 1;
}

static void
ucx_log_timeout(ucx_comm_t *u)
{
    char who[256] = "";
    size_t n = 0;

    for (uint32_t s = 0; s < u->head.size && n + 16 < sizeof(who); s++) {
        const ucx_rank_t *r = &u->ranks[s];
        if (!r->rx_fin || (s != u->head.rank && !r->tx_fin))
            n += (size_t)snprintf(who + n, sizeof(who) - n, "%s%u%s", n ? ", " : "", s,
                                  r->rx_fin ? " (room)" : "");
    }
    ucx_log_fail(u, TD_ERR_TIMEOUT, "%s #%" PRIu64 ": deadline of %" PRIu64 " ms passed "
                 "waiting for rank(s) %s", ucx_coll_names[u->cur.kind], u->seq,
                 u->head.deadline_ms, n ? who : "(sends in flight)");
}

/* A rank that is gone fails the collective while it still needs that rank:
 * its segment, or room or a segment to send it (at the start: all of it). */
static void
ucx_lost_check(ucx_comm_t *u)
{
    for (uint32_t s = 0; s < u->head.size && u->fail == TD_OK; s++) {
        const ucx_rank_t *r = &u->ranks[s];
        if (r->lost && (!r->rx_fin || !r->tx_fin))
            ucx_log_fail(u, TD_ERR_PEER, "%s #%" PRIu64 ": rank %u is gone",
                         ucx_coll_names[u->cur.kind], u->seq, s);
    }
}

/* Run the collective set up in u->cur to its end. A failure other than the
 * deadline is told to the other ranks. */
static td_status_t
ucx_run(ucx_comm_t *u)
{
    uint32_t me = u->head.rank;
    uint64_t deadline = ucx_deadline(u->head.deadline_ms);

    size_t prefix = 0;   /* all-to-all: where rank s's segment starts in send */

    if (u->fail != TD_OK)
        return u->fail;
    u->seq++;
    for (uint32_t s = 0; s < u->head.size; s++) {
        ucx_rank_t *r = &u->ranks[s];
        size_t seg = u->cur.bytes;
        const uint8_t *src = u->cur.send;
        if (u->cur.kind == UCX_COLL_ALLTOALLV) {
            seg = u->cur.send_bytes[s];
            src += prefix;
            prefix += seg;
        } else if (u->cur.kind == UCX_COLL_REDUCE_SCATTER) {
            src += (size_t)s * u->cur.bytes;
        }
        r->tx_src = src;
        r->tx_len = seg;
        r->tx_sent = 0;
        r->tx_fin = 0;
        r->rx_known = s == me;
        r->rx_total = s == me ? seg : 0;
        r->rx_got = 0;
        r->rx_fin = 0;
    }
    for (;;) {
        ucx_send_more(u);
        ucx_take(u);
        ucx_send_acks(u);
        ucx_send_more(u);   /* acknowledgements may have come meanwhile */
        ucx_lost_check(u);
        if (u->fail != TD_OK)
            break;
        if (ucx_coll_done(u)) {
            evtimer_del(u->ev_wake);
            for (uint32_t s = 0; s < u->head.size; s++) {
                if (s == me)
                    continue;
                u->head.stats.bytes_sent += u->ranks[s].tx_len;
                u->head.stats.bytes_recv += u->ranks[s].rx_total;
            }
            return TD_OK;
        }
        if (td_clock_ns() >= deadline) {
            ucx_log_timeout(u);
            break;
        }
        ucx_wait_once(u, deadline);
    }
    evtimer_del(u->ev_wake);
    if (u->fail != TD_ERR_TIMEOUT)
        ucx_tell_abort(u, u->fail);
    return u->fail;
}

static td_status_t
ucx_bad_args(ucx_comm_t *u, const char *what)
{
    ucx_log_fail(u, TD_ERR_INVALID, "%s: bad arguments", what);
    ucx_tell_abort(u, TD_ERR_INVALID);
    return TD_ERR_INVALID;
}

static td_status_t
ucx_barrier(td_comm_t *c)
{
    ucx_comm_t *u = (ucx_comm_t *)c;
    u->cur = (ucx_coll_t){ .kind = UCX_COLL_BARRIER };
    return ucx_run(u);
}

static td_status_t
ucx_allgather(td_comm_t *c, const void *send, size_t bytes, void *recv)
{
    ucx_comm_t *u = (ucx_comm_t *)c;
    if (bytes && (send == NULL || recv == NULL || bytes > SIZE_MAX / c->size))
        return ucx_bad_args(u, "all-gather");
    u->cur = (ucx_coll_t){ .kind = UCX_COLL_ALLGATHER, .send = send, .bytes = bytes, .recv = recv };
    return ucx_run(u);
}

static td_status_t
ucx_reduce_scatter_f32(td_comm_t *c, const float *send, size_t count, float *recv)
{
    ucx_comm_t *u = (ucx_comm_t *)c;
    if (count && (send == NULL || recv == NULL || count > SIZE_MAX / sizeof(float) / c->size))
        return ucx_bad_args(u, "reduce-scatter");
    u->cur = (ucx_coll_t){
        .kind = UCX_COLL_REDUCE_SCATTER, .send = (const uint8_t *)send,
        .own = (const uint8_t *)(send + (size_t)c->rank * count),
        .bytes = count * sizeof(float), .recv = (uint8_t *)recv,
    };
    /* In place (recv over this rank's own part of send): the sum of the
     * ranks before it would overwrite that part before its turn, so it is
     * kept aside first. */
    const uint8_t *rb = u->cur.recv, *ob = u->cur.own;
    size_t n = u->cur.bytes;
    if (n && rb < ob + n && ob < rb + n) {
        if (n > u->own_cap) {
            uint8_t *p = realloc(u->own, n);
            if (p == NULL) {
                ucx_log_fail(u, TD_ERR_NOMEM, "reduce-scatter: %zu bytes to keep", n);
                ucx_tell_abort(u, TD_ERR_NOMEM);
                return TD_ERR_NOMEM;
            }
            u->own = p;
            u->own_cap = n;
        }
        memcpy(u->own, ob, n);
        u->cur.own = u->own;
    }
    return ucx_run(u);
}

static td_status_t
ucx_alltoallv(td_comm_t *c, const void *send, const size_t *send_bytes, void *recv,
              size_t recv_cap, size_t *recv_bytes)
{
    ucx_comm_t *u = (ucx_comm_t *)c;
    size_t total = 0;
    if (send_bytes == NULL || recv_bytes == NULL || (recv_cap && recv == NULL))
        return ucx_bad_args(u, "all-to-all");
    for (uint32_t d = 0; d < c->size; d++) {
        if (send_bytes[d] > SIZE_MAX - total)
            return ucx_bad_args(u, "all-to-all");
        total += send_bytes[d];
    }
    if (total && send == NULL)
        return ucx_bad_args(u, "all-to-all");
    u->cur = (ucx_coll_t){
        .kind = UCX_COLL_ALLTOALLV, .send = send, .send_bytes = send_bytes, .recv = recv,
        .recv_cap = recv_cap, .recv_bytes = recv_bytes,
    };
    return ucx_run(u);
}

static void
ucx_abort(td_comm_t *c, td_status_t st)
{
    ucx_comm_t *u = (ucx_comm_t *)c;
    ucx_log_fail(u, st, "aborted: %s", td_status_str(st));
    ucx_tell_abort(u, st);
}

/* ======================================================================== */
/* Create and destroy                                                       */
/* ======================================================================== */

static void
ucx_free(ucx_comm_t *u)
{
    if (u->state != UCX_CLOSING)
        ucx_set_state(u, UCX_CLOSING, "destroy");
    int peers = 0;
    for (uint32_t s = 0; u->ranks && s < u->head.size; s++) {
        if (u->ranks[s].peer) {
            td_xfer_peer_destroy(u->ranks[s].peer);
            peers++;
        }
    }
    /* The ended messages' callbacks, while u lives. Not before anything
     * was connected: a refused create leaves x as it was, and progress here
     * would hand the other ranks' first messages to this dead communicator. */
    if (peers)
        td_xfer_progress(u->x);
    td_xfer_set_note_handler(u->x, NULL, NULL);
    td_xfer_set_note_auth(u->x, NULL, NULL);
    td_xfer_set_peer_fail_handler(u->x, NULL, NULL);
    if (u->ev_wake)
        event_free(u->ev_wake);
    td_xfer_pool_destroy(u->pool);
    for (uint32_t s = 0; u->ranks && s < u->head.size; s++)
        free(u->ranks[s].slots);
    free(u->ranks);
    free(u->msg);
    free(u->own);
    free(u);
}

static void
ucx_destroy(td_comm_t *c)
{
    ucx_comm_t *u = (ucx_comm_t *)c;
    ucx_wait_quiet(u, u->fail == TD_OK ? UCX_QUIET_WAIT_MS : UCX_ABORT_WAIT_MS);
    ucx_free(u);
}

static const td_comm_ops_t ucx_ops = {
    .name = "ucx",
    .barrier = ucx_barrier,
    .allgather = ucx_allgather,
    .reduce_scatter_f32 = ucx_reduce_scatter_f32,
    .alltoallv = ucx_alltoallv,
    .abort = ucx_abort,
    .destroy = ucx_destroy,
};

td_status_t
td_comm_ucx_address(td_xfer_t *x, void **buf, size_t *len)
{
    void *addr;
    size_t alen;
    td_status_t st = td_xfer_address(x, &addr, &alen);

    if (st != TD_OK)
        return st;
    uint8_t *b = malloc(UCX_ADDR_HDR_LEN + alen);
    if (b == NULL) {
        free(addr);
        return TD_ERR_NOMEM;
    }
    ucx_put32(b, UCX_ADDR_MAGIC);
    b[4] = UCX_ADDR_VERSION;
    b[5] = b[6] = b[7] = 0;
    ucx_put64(b + 8, td_xfer_incarnation(x));
    memcpy(b + 16, td_xfer_rx_token(x)->b, TD_XFER_TOKEN_LEN);
    memcpy(b + UCX_ADDR_HDR_LEN, addr, alen);
    free(addr);
    *buf = b;
    *len = UCX_ADDR_HDR_LEN + alen;
    return TD_OK;
}

/* Rank r's address blob: its incarnation, token and worker address. */
static td_status_t
ucx_addr_parse(const td_comm_ucx_peer_t *p, uint32_t r, ucx_rank_t *rk, const void **addr,
               size_t *alen)
{
    const uint8_t *b = p->addr;

    if (b == NULL || p->len <= UCX_ADDR_HDR_LEN || p->len - UCX_ADDR_HDR_LEN > UCX_MAX_ADDR ||
        ucx_get32(b) != UCX_ADDR_MAGIC || b[4] != UCX_ADDR_VERSION || ucx_get64(b + 8) == 0) {
        td_error("comm ucx: rank %u's address is malformed (%zu bytes)", r, p->len);
        return TD_ERR_PROTO;
    }
    rk->incarnation = ucx_get64(b + 8);
    memcpy(rk->token.b, b + 16, TD_XFER_TOKEN_LEN);
    *addr = b + UCX_ADDR_HDR_LEN;
    *alen = p->len - UCX_ADDR_HDR_LEN;
    return TD_OK;
}

static int
ucx_all_hellos(const ucx_comm_t *u)
{
    return u->hellos + 1 == u->head.size;
}

/* Connect to every other rank, send it this rank's hello, wait for theirs. */
static td_status_t
ucx_connect(ucx_comm_t *u, const td_comm_ucx_peer_t *peers, uint64_t connect_ms)
{
    uint32_t me = u->head.rank;
    void *exp;
    size_t elen;
    td_status_t st;

    for (uint32_t s = 0; s < u->head.size; s++) {
        const void *addr;
        size_t alen;
        if ((st = ucx_addr_parse(&peers[s], s, &u->ranks[s], &addr, &alen)) != TD_OK)
            return st;
        if (s == me && u->ranks[s].incarnation != td_xfer_incarnation(u->x)) {
            td_error("%s rank %u/%u: its own address names incarnation %016" PRIx64
                     ", the engine is %016" PRIx64, u->head.name, me, u->head.size,
                     u->ranks[s].incarnation, td_xfer_incarnation(u->x));
            return TD_ERR_INVALID;
        }
    }
    if ((st = td_xfer_pool_export(u->pool, &exp, &elen)) != TD_OK)
        return st;
    if (UCX_MSG_HDR_LEN + UCX_HELLO_LEN + elen > u->max_payload) {
        td_error("%s rank %u/%u: the hello (%zu bytes) does not fit a message (max_payload %u)",
                 u->head.name, me, u->head.size, UCX_MSG_HDR_LEN + UCX_HELLO_LEN + elen,
                 u->max_payload);
        free(exp);
        return TD_ERR_TOO_BIG;
    }
    for (uint32_t s = 0; s < u->head.size && st == TD_OK; s++) {
        const void *addr;
        size_t alen;
        if (s == me)
            continue;
        ucx_addr_parse(&peers[s], s, &u->ranks[s], &addr, &alen);
        st = td_xfer_peer_create(u->x, addr, alen, u->ranks[s].incarnation, &u->ranks[s].peer);
    }
    uint8_t *hello = malloc(UCX_HELLO_LEN + elen);
    if (hello == NULL) {
        free(exp);
        return TD_ERR_NOMEM;
    }
    ucx_put32(hello, u->head.size);
    ucx_put32(hello + 4, u->slots);
    ucx_put32(hello + 8, u->chunk_bytes);
    ucx_put32(hello + 12, u->max_payload);
    memcpy(hello + UCX_HELLO_LEN, exp, elen);
    free(exp);
    for (uint32_t s = 0; s < u->head.size && st == TD_OK; s++) {
        ucx_msg_t m = { .kind = UCX_MSG_HELLO, .len = (uint32_t)(UCX_HELLO_LEN + elen) };
        if (s != me)
            st = ucx_send(u, s, &m, hello);
    }
    free(hello);
    if (st != TD_OK)
        return st;
    uint64_t deadline = ucx_deadline(connect_ms);
    while (u->fail == TD_OK && !ucx_all_hellos(u) && td_clock_ns() < deadline) {
        ucx_wait_once(u, deadline);
        for (uint32_t s = 0; s < u->head.size && u->fail == TD_OK; s++)
            if (u->ranks[s].lost)
                ucx_log_fail(u, TD_ERR_PEER, "rank %u is gone before it answered", s);
    }
    evtimer_del(u->ev_wake);
    if (u->fail != TD_OK)
        return u->fail;
    if (!ucx_all_hellos(u)) {
        td_error("%s rank %u/%u: %u of %u ranks answered within %" PRIu64 " ms", u->head.name,
                 me, u->head.size, u->hellos, u->head.size - 1, connect_ms);
        return TD_ERR_TIMEOUT;
    }
    return TD_OK;
}

td_status_t
td_comm_ucx_create(td_xfer_t *x, uint32_t rank, uint32_t size, const td_comm_ucx_peer_t *peers,
                   const td_comm_opts_t *opts, const td_comm_ucx_config_t *cfg, td_comm_t **out)
{
    td_comm_ucx_config_t cf = cfg ? *cfg : (td_comm_ucx_config_t){ 0 };
    td_status_t st = TD_ERR_NOMEM;

    if (!cf.chunk_bytes)
        cf.chunk_bytes = UCX_DEFAULT_CHUNK;
    if (!cf.slots)
        cf.slots = UCX_DEFAULT_SLOTS;
    if (!cf.connect_ms)
        cf.connect_ms = TD_COMM_DEADLINE_MS;
    if (x == NULL || peers == NULL || size == 0 || size > UCX_MAX_SIZE || rank >= size ||
        cf.chunk_bytes < UCX_MIN_CHUNK || cf.chunk_bytes > UCX_MAX_CHUNK || cf.chunk_bytes % 64 ||
        cf.slots < 2 || cf.slots > UCX_MAX_SLOTS ||
        td_xfer_max_payload(x) < UCX_MSG_HDR_LEN + UCX_HELLO_LEN) {
        td_error("comm ucx: create: need an engine, rank < size <= %u, the peers' addresses, "
                 "chunk_bytes a multiple of 64 in [%u, %u], slots in [2, %u]", UCX_MAX_SIZE,
                 UCX_MIN_CHUNK, UCX_MAX_CHUNK, UCX_MAX_SLOTS);
        return TD_ERR_INVALID;
    }
    ucx_comm_t *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return TD_ERR_NOMEM;
    td_comm_init(&u->head, &ucx_ops, rank, size, opts);
    u->state = UCX_CONNECTING;
    u->x = x;
    u->base = td_xfer_base(x);
    u->chunk_bytes = cf.chunk_bytes;
    u->slots = cf.slots;
    u->max_payload = td_xfer_max_payload(x);
    u->ranks = calloc(size, sizeof(*u->ranks));
    u->msg = malloc(u->max_payload);
    u->ev_wake = evtimer_new(u->base, ucx_on_wake, u);
    if (u->ranks == NULL || u->msg == NULL || u->ev_wake == NULL)
        goto err_free;
    for (uint32_t s = 0; s < size; s++) {
        if ((u->ranks[s].slots = calloc(cf.slots, sizeof(ucx_slot_t))) == NULL)
            goto err_free;
        u->ranks[s].peer_slots = cf.slots;   /* this rank's own: never used to send */
        u->ranks[s].peer_chunk = cf.chunk_bytes;
    }
    st = td_xfer_pool_create(x, UCX_POOL_ID, TD_XFER_MEM_HOST, NULL, cf.chunk_bytes,
                             (uint64_t)size * cf.slots, &u->pool);
    if (st != TD_OK)
        goto err_free;
    u->pool_base = td_xfer_pool_base(u->pool);
    td_xfer_set_note_handler(x, ucx_on_note, u);
    td_xfer_set_note_auth(x, ucx_note_auth, u);
    td_xfer_set_peer_fail_handler(x, ucx_on_peer_fail, u);
    if ((st = ucx_connect(u, peers, cf.connect_ms)) != TD_OK)
        goto err_free;
    ucx_set_state(u, UCX_READY, "every rank answered");
    td_info("%s rank %u/%u: ucx communicator ready (%u slots of %u bytes per rank, deadline %"
            PRIu64 " ms)", u->head.name, rank, size, u->slots, u->chunk_bytes,
            u->head.deadline_ms);
    *out = &u->head;
    return TD_OK;

err_free:
    ucx_free(u);
    return st;
}

void
td_comm_ucx_stats(const td_comm_t *c, td_comm_ucx_stats_t *out)
{
    const ucx_comm_t *u = (const ucx_comm_t *)c;

    *out = u->wire;
}
