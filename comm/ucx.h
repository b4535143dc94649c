/* comm/ucx.h — the communicator across processes: ranks in different
 * processes (or hosts) exchange their collectives' bytes over UCX, through
 * the transfer engine (xfer/xfer.h). docs/comm.md, "UCX backend".
 *
 * Threading: the communicator has a transfer engine of its own, on an event
 * base of its own, and the thread that calls a collective runs that base
 * itself while it waits (nothing else runs it). So no thread hand-off is
 * involved and the rank's other loop and engine (the KV transfers) stay as
 * they are.
 *
 * Set-up, per rank:
 *   base = event_base_new(); td_xfer_create(base, &cfg, &x);
 *   td_comm_ucx_address(x, &blob, &len);         publish blob (control plane)
 *   ... gather every rank's blob ...
 *   td_comm_ucx_create(x, rank, size, peers, &opts, NULL, &c);
 *   ... collectives (comm.h) ...
 *   td_comm_destroy(c); td_xfer_destroy(x); event_base_free(base);
 *
 * Ownership: the caller owns x and its event base, and gives them to the
 * communicator for its whole life: from td_comm_ucx_create until
 * td_comm_destroy nothing else may use x (the communicator sets its
 * notification and peer-failure handlers, registers a pool, makes peers) or
 * run its base. Destroy the communicator before x. The address blobs are
 * read only during td_comm_ucx_create. */
#ifndef TD_COMM_UCX_H
#define TD_COMM_UCX_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "xfer.h"

/* One rank's address: the bytes td_comm_ucx_address gave on that rank
 * (checked: untrusted bytes get TD_ERR_PROTO, never a crash). */
typedef struct {
    const void *addr;
    size_t len;
} td_comm_ucx_peer_t;

/* What the UCX backend adds to td_comm_opts_t (NULL or zero fields: the
 * defaults). */
typedef struct {
    /* The receive pool: every rank keeps `slots` slots of `chunk_bytes` per
     * source rank. A pair's segment larger than a slot goes in chunks, at
     * most `slots` in flight per pair, each slot freed by the receiver's
     * acknowledgement. chunk_bytes: a multiple of 64 in [4 KiB, 64 MiB]
     * (0: 128 KiB); slots: 2..64 (0: 4). */
    uint32_t chunk_bytes;
    uint32_t slots;
    /* Deadline of td_comm_ucx_create's handshake with every other rank
     * (0: TD_COMM_DEADLINE_MS): ranks start at different times, so it may
     * be longer than the collectives' deadline. */
    uint64_t connect_ms;
} td_comm_ucx_config_t;

/* This rank's address for the other ranks: the transfer engine's
 * incarnation and worker address, packed (caller frees). x is the engine
 * the communicator will be created on. */
td_status_t td_comm_ucx_address(td_xfer_t *x, void **buf, size_t *len);

/* The communicator of rank `rank` of `size`, over x. peers[r] is rank r's
 * address (peers[rank] this rank's own, which must name x's incarnation).
 * Connects to every other rank and waits until each has answered (the
 * handshake: version, size, its receive pool) within cfg->connect_ms:
 * TD_ERR_TIMEOUT past it, TD_ERR_PEER when a rank's endpoint fails,
 * TD_ERR_PROTO for a malformed address or answer, TD_ERR_MISMATCH when a
 * rank counts another size. On failure nothing of the communicator is left
 * on x; a create refused before it connected (bad arguments or addresses)
 * may be tried again on x, any other failure needs a new engine (messages
 * of the other ranks may have been taken in and lost). */
td_status_t td_comm_ucx_create(td_xfer_t *x, uint32_t rank, uint32_t size,
                               const td_comm_ucx_peer_t *peers, const td_comm_opts_t *opts,
                               const td_comm_ucx_config_t *cfg, td_comm_t **out);

/* What went over the wire from this rank, for benchmarks: every message
 * (one per chunk, acknowledgement, handshake, abort) with its headers
 * (the transfer engine's notification header + this backend's), and the
 * segment bytes, by put or inline in the message. Not counted: UCX's own
 * protocol bytes below the transfer engine. */
typedef struct {
    uint64_t messages;       /* notifications sent (every kind) */
    uint64_t acks;           /* of which acknowledgements (a freed slot) */
    uint64_t header_bytes;   /* messages x (engine header + backend header) */
    uint64_t put_bytes;      /* segment bytes sent by one-sided put */
    uint64_t inline_bytes;   /* segment bytes sent inside a message */
} td_comm_ucx_stats_t;

/* c must be a communicator of this backend. */
void td_comm_ucx_stats(const td_comm_t *c, td_comm_ucx_stats_t *out);

#endif
