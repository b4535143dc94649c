/* xfer/xfer.h — the UCX transfer engine: one UCP context and worker per
 * rank, driven by that rank's libevent loop; registered pools; one-sided
 * transfers that end in exactly one terminal notification to the receiver.
 *
 * Ownership: td_xfer_t owns its pools and peers (destroying it destroys them).
 * A pool owns its memory when td_xfer_pool_create() allocated it. Exported
 * byte strings are malloc'd and owned by the caller (free()). Every function
 * must be called on the loop thread of the td_xfer_t it belongs to. */
#ifndef TD_XFER_H
#define TD_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct event_base;

typedef struct td_xfer_s td_xfer_t;           /* context + worker of one rank */
typedef struct td_xfer_pool_s td_xfer_pool_t; /* local registered memory, equal blocks */
typedef struct td_xfer_peer_s td_xfer_peer_t; /* endpoint to one remote rank + its pools */

typedef enum {
    TD_XFER_MEM_HOST = 0,
    TD_XFER_MEM_CUDA = 1,   /* device memory; needs UCX built with CUDA */
} td_xfer_mem_t;

typedef struct {
    uint64_t incarnation;      /* this rank's incarnation id (non-zero) */
    const char *transports;    /* UCX transport list like UCX_TLS, NULL = UCX's default */
    /* The one network interface ("lo", "eth1") UCX's tcp transport may use:
     * its listener is bound to that interface's address only. NULL: every
     * interface (UCX's default: one listener on each). Other network devices
     * (RDMA ports) stay usable; UCX_NET_DEVICES in the environment wins. */
    const char *tcp_device;
    uint32_t max_payload;      /* largest user payload in a notification (default 4096) */
    /* Receiver wake-up coalescing: after delivering notifications, keep
     * polling this long for the next one before sleeping (0 = default,
     * 100 µs; TD_XFER_RX_SPIN_OFF: sleep at once). Costs up to that much
     * CPU after the last notification of a burst; latency is unaffected. */
    uint32_t rx_spin_us;
    /* Map in the pages of every imported host pool that UCX maps into this
     * process (shared memory transports: the receiver's pool, attached
     * here), a few MiB per loop pass from the import on, so that this
     * process's resident memory does not grow as transfers first reach
     * them (td_xfer_stats_t.peer_bytes_mapped). 0: as transfers touch them. */
    int map_peer_pools;
} td_xfer_config_t;

#define TD_XFER_RX_SPIN_OFF UINT32_MAX

/* A transfer's token: 16 secret bytes that only its two ends know. The
 * receiver draws them (td_xfer_token_draw) and hands them to the sender over
 * the authenticated control plane (KvDest.xfer_token); every notification
 * of the transfer carries them, and the receiver checks them before it reads
 * anything else of the notification (td_xfer_auth_fn). */
#define TD_XFER_TOKEN_LEN 16u
typedef struct {
    uint8_t b[TD_XFER_TOKEN_LEN];
} td_xfer_token_t;

/* What the receiver learns when a transfer ends: exactly one per transfer. */
typedef struct {
    uint64_t xfer_id;
    uint64_t src_incarnation;  /* sender's incarnation */
    uint64_t dst_incarnation;  /* the receiver incarnation the sender targeted */
    td_status_t status;        /* TD_OK: every byte is in place; else why not */
    const void *payload;       /* user bytes; valid only during the callback */
    size_t payload_len;
} td_xfer_note_t;

/* Receiver side: called on the loop thread for every notification addressed
 * to this incarnation (stale ones are dropped, counted and logged). */
typedef void (*td_xfer_note_fn)(td_xfer_t *x, const td_xfer_note_t *note, void *arg);

/* Receiver side: whether token is transfer xfer_id's (td_xfer_token_eq).
 * Asked first, for every notification that arrives, with nothing else of it
 * read; false: it is dropped unparsed, counted (notes_forged) and logged at
 * most once a second. Without one, every notification is dropped. */
typedef bool (*td_xfer_auth_fn)(td_xfer_t *x, uint64_t xfer_id, const td_xfer_token_t *token,
                                void *arg);

/* Receiver side: whether any notification is still expected (a transfer
 * under way). Asked when the wake-up coalescing (rx_spin_us) would poll on
 * after a notification: it stops at once when none is, instead of spending
 * rx_spin_us of CPU on a burst that has ended. Unset: always expected. */
typedef bool (*td_xfer_expect_fn)(td_xfer_t *x, void *arg);
/* Sender side: called exactly once per accepted transfer, on the loop thread,
 * when the source regions may be reused (status TD_OK or the failure). */
typedef void (*td_xfer_done_fn)(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg);

/* Called once when a peer's endpoint fails (after its transfers have failed). */
typedef void (*td_xfer_peer_fail_fn)(td_xfer_t *x, td_xfer_peer_t *peer, td_status_t status, void *arg);

/* One piece of a transfer: len bytes from src into block `block` of the
 * peer's pool `pool_id`, starting `offset` bytes into that block. The piece
 * must lie inside one block. */
typedef struct {
    const void *src;
    uint32_t pool_id;
    uint64_t block;
    uint64_t offset;
    uint64_t len;
} td_xfer_desc_t;

typedef struct {
    uint64_t posted;           /* transfers accepted by td_xfer_post */
    uint64_t completed;        /* ended with TD_OK on the sender */
    uint64_t failed;           /* ended with a failure on the sender */
    uint64_t rejected;         /* refused by td_xfer_post before posting */
    uint64_t inflight;         /* accepted and not yet ended */
    uint64_t bytes_sent;       /* payload bytes of completed transfers */
    uint64_t notes_received;   /* notifications delivered to the handler */
    uint64_t notes_stale;      /* notifications dropped for a stale incarnation */
    uint64_t notes_forged;     /* dropped unparsed: no transfer of that id and token */
    uint64_t notes_malformed;  /* authenticated, but not a well-formed notification */
    uint64_t rx_spins;         /* polls on after a notification (rx_spin_us) begun */
    uint64_t peers_failed;     /* endpoints that failed */
    uint64_t peer_bytes_mapped;/* of imported pools, mapped in (map_peer_pools) */
} td_xfer_stats_t;

/* ---- engine ------------------------------------------------------------- */

td_status_t td_xfer_create(struct event_base *base, const td_xfer_config_t *cfg,
                           td_xfer_t **out);
/* Closes every peer (forced), fails their transfers, unregisters pools. */
void td_xfer_destroy(td_xfer_t *x);

void td_xfer_set_note_handler(td_xfer_t *x, td_xfer_note_fn fn, void *arg);
void td_xfer_set_note_auth(td_xfer_t *x, td_xfer_auth_fn fn, void *arg);
void td_xfer_set_note_expect(td_xfer_t *x, td_xfer_expect_fn fn, void *arg);
/* 16 random bytes from the kernel (getrandom): a new transfer's token.
 * TD_ERR_IO when the kernel gives none (logged). */
td_status_t td_xfer_token_draw(td_xfer_token_t *out);
/* Whether a and b are equal, in time independent of where they differ. */
bool td_xfer_token_eq(const td_xfer_token_t *a, const td_xfer_token_t *b);
/* The engine's own token, drawn at create: for peers that authenticate by
 * receiver rather than by transfer (the communicator: comm/ucx.c). */
const td_xfer_token_t *td_xfer_rx_token(const td_xfer_t *x);
void td_xfer_set_peer_fail_handler(td_xfer_t *x, td_xfer_peer_fail_fn fn, void *arg);

/* This worker's address, to publish on the control plane (caller frees). */
td_status_t td_xfer_address(td_xfer_t *x, void **buf, size_t *len);

uint64_t td_xfer_incarnation(const td_xfer_t *x);
/* The loop the engine was created on. */
struct event_base *td_xfer_base(const td_xfer_t *x);
/* The largest payload a notification of this engine carries (and accepts). */
uint32_t td_xfer_max_payload(const td_xfer_t *x);
void td_xfer_stats(const td_xfer_t *x, td_xfer_stats_t *out);

/* Drive progress once without waiting (the loop does this by itself; tests
 * and benchmarks that spin may call it). Returns TD_OK. */
td_status_t td_xfer_progress(td_xfer_t *x);

/* ---- pools (receiver) ----------------------------------------------------- */

/* Register nblocks × block_size bytes as pool `pool_id` (unique per engine).
 * base == NULL: UCX allocates the memory, so that same-host peers can map it
 * (fastest shared-memory path); otherwise the caller's memory is registered
 * and must outlive the pool. */
td_status_t td_xfer_pool_create(td_xfer_t *x, uint32_t pool_id, td_xfer_mem_t mem,
                                void *base, size_t block_size, uint64_t nblocks,
                                td_xfer_pool_t **out);
void td_xfer_pool_destroy(td_xfer_pool_t *pool);
/* Fault every page of a host pool in now (MADV_POPULATE_WRITE, else a
 * write to each page), so that the process's resident memory does not grow
 * under load as requests first reach its blocks. Nothing for CUDA memory. */
void td_xfer_pool_prefault(td_xfer_pool_t *pool);
void *td_xfer_pool_base(const td_xfer_pool_t *pool);
size_t td_xfer_pool_block_size(const td_xfer_pool_t *pool);
uint64_t td_xfer_pool_nblocks(const td_xfer_pool_t *pool);

/* Describe the pool for a peer: id, remote address, geometry, packed rkey
 * (caller frees). */
td_status_t td_xfer_pool_export(const td_xfer_pool_t *pool, void **buf, size_t *len);

/* ---- peers (sender) ------------------------------------------------------ */

/* Connect to a remote worker. peer_incarnation is the incarnation the
 * receiver announced; every notification carries it. */
td_status_t td_xfer_peer_create(td_xfer_t *x, const void *addr, size_t addr_len,
                                uint64_t peer_incarnation, td_xfer_peer_t **out);
/* Import one exported pool (bytes from td_xfer_pool_export, untrusted:
 * checked, never crash). */
td_status_t td_xfer_peer_import_pool(td_xfer_peer_t *peer, const void *buf, size_t len);
/* Close the endpoint: flushed if healthy, forced if failed. Transfers still
 * in flight end with TD_ERR_CANCELED (or their real outcome if it comes
 * first). */
void td_xfer_peer_destroy(td_xfer_peer_t *peer);
int td_xfer_peer_failed(const td_xfer_peer_t *peer);

/* Whether nothing of transfer xfer_id towards receiver incarnation dst_inc
 * can land any more: none of its ops is in flight on an endpoint to that
 * receiver (every one posted ended: puts flushed, or failed and the
 * endpoint closed), and no endpoint of this engine is still closing. A
 * fence (docs/decoded.md, "Fencing") is answered only then. */
bool td_xfer_quiet(const td_xfer_t *x, uint64_t dst_incarnation, uint64_t xfer_id);

/* ---- transfers ----------------------------------------------------------- */

/* Post a transfer: the pieces as batched one-sided puts, then a flush, then
 * one terminal notification carrying (xfer_id, token, both incarnations,
 * status, payload) to the receiver's handler. token is the receiver's for
 * this transfer (copied).
 * `descs` and `payload` are used only during the call (the payload is
 * copied); the source regions the pieces point at must stay unchanged until
 * `done`.
 * Returns TD_OK when accepted: `done` is then called exactly once.
 * Returns an error when refused (a piece outside a pool or a block, unknown
 * pool, payload too big, peer failed): nothing is written, `done` is not
 * called, and the receiver is still sent a failure notification for xfer_id
 * when the endpoint is usable.
 * deadline_ms > 0: a transfer not ended by then fails with TD_ERR_TIMEOUT; as
 * UCX cannot cancel one-sided puts, the endpoint is closed by force and every
 * transfer on it fails (the peer is reported failed). */
td_status_t td_xfer_post(td_xfer_peer_t *peer, uint64_t xfer_id, const td_xfer_token_t *token,
                         const td_xfer_desc_t *descs, size_t ndescs,
                         const void *payload, size_t payload_len,
                         uint32_t deadline_ms, td_xfer_done_fn done, void *arg);

#endif
