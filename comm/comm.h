/* comm/comm.h — the communicator: the collectives expert parallelism needs
 * (all-gather, reduce-scatter, all-to-all with per-destination counts,
 * barrier) over the ranks of one DEP group, with one interface and several
 * backends: rank threads of one process (comm/cpu.c), processes over UCX
 * (comm/ucx.c) and NCCL (comm/nccl.c, one rank per GPU).
 *
 * Every rank of a group calls the same collectives in the same order (SPMD);
 * a collective returns when this rank's part is done. Every collective has a
 * deadline (td_comm_opts_t); a collective that misses it returns
 * TD_ERR_TIMEOUT instead of hanging. A rank that is gone (its thread called
 * td_comm_abort, its process lost its connection) makes the collectives of
 * every other rank return TD_ERR_PEER, at once and not only at the deadline.
 * After any failure the communicator is broken: every later call returns the
 * same status without communicating; destroy it and create a new one.
 *
 * Ownership: the caller owns every buffer; a collective reads and writes
 * them only until it returns. A td_comm_t is used by one thread at a time. */
#ifndef TD_COMM_H
#define TD_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* The default deadline of one collective: generous, since on a busy 2-core
 * machine a slow rank is not a dead one. */
#define TD_COMM_DEADLINE_MS 60000u

typedef struct td_comm_s td_comm_t;

typedef struct {
    uint64_t deadline_ms;   /* per collective; 0: TD_COMM_DEADLINE_MS */
    const char *name;       /* in log lines ("decode domain 3"); NULL: "comm" */
} td_comm_opts_t;

/* ---- Backends: creation ----------------------------------------------------------------- */

/* Rank threads of one process: a group is created once with its size, then
 * each rank thread takes its communicator from it. The group outlives its
 * communicators. Destroying a rank's communicator takes the rank out of the
 * group: the other ranks' later collectives return TD_ERR_PEER. */
typedef struct td_comm_group_s td_comm_group_t;

td_status_t td_comm_group_create(uint32_t size, const td_comm_opts_t *opts,
                                 td_comm_group_t **out);
void td_comm_group_destroy(td_comm_group_t *g);
/* rank's communicator (each rank exactly once). */
td_status_t td_comm_cpu_create(td_comm_group_t *g, uint32_t rank, td_comm_t **out);

/* ---- The collectives --------------------------------------------------------------------- */

uint32_t td_comm_rank(const td_comm_t *c);
uint32_t td_comm_size(const td_comm_t *c);
/* Which backend ("cpu", "ucx", "nccl"). */
const char *td_comm_backend(const td_comm_t *c);

/* Every rank has reached the barrier. */
td_status_t td_comm_barrier(td_comm_t *c);

/* recv[r * bytes .. (r + 1) * bytes) = rank r's send, for every rank r
 * (recv holds size * bytes; send may be recv + rank * bytes). */
td_status_t td_comm_allgather(td_comm_t *c, const void *send, size_t bytes, void *recv);

/* recv[i] = sum over ranks r, in rank order 0, 1, ..., of rank r's
 * send[rank * count + i], for i < count (send holds size * count floats).
 * The fixed order makes the sum the same bits on every backend that keeps it. */
td_status_t td_comm_reduce_scatter_f32(td_comm_t *c, const float *send, size_t count,
                                       float *recv);

/* All-to-all with per-destination counts. send holds one segment per
 * destination rank, in rank order, send_bytes[d] bytes for rank d (0 is
 * allowed: nothing goes to d). recv gets one segment per source rank, in
 * rank order, packed; recv_bytes[s] is set to what rank s sent here. The
 * total received must fit recv_cap: else TD_ERR_TOO_BIG on this rank (and
 * the communicator is broken). Only the segments go over the wire, plus one
 * count per pair. */
td_status_t td_comm_alltoallv(td_comm_t *c, const void *send, const size_t *send_bytes,
                              void *recv, size_t recv_cap, size_t *recv_bytes);

/* This rank gives up (its thread fails, the process stops): the other ranks'
 * collectives return TD_ERR_PEER, this one's later calls return st. */
void td_comm_abort(td_comm_t *c, td_status_t st);

/* TD_OK, or the status that broke the communicator. */
td_status_t td_comm_status(const td_comm_t *c);

/* Bytes this rank has sent to other ranks (not counting its own segments),
 * and collectives run: for benchmarks and /metrics. */
typedef struct {
    uint64_t bytes_sent;
    uint64_t bytes_recv;
    uint64_t collectives;
} td_comm_stats_t;
void td_comm_stats(const td_comm_t *c, td_comm_stats_t *out);

void td_comm_destroy(td_comm_t *c);

/* ---- For backends ------------------------------------------------------------------------ */

/* What a backend provides: a table of operations behind td_comm_t, and the
 * shared part (rank, size, deadline, the broken status, the counters) that
 * comm/comm.c keeps for every backend. Callers use the functions above. */
typedef struct {
    const char *name;   /* "cpu", "ucx", "nccl" */
    td_status_t (*barrier)(td_comm_t *c);
    td_status_t (*allgather)(td_comm_t *c, const void *send, size_t bytes, void *recv);
    td_status_t (*reduce_scatter_f32)(td_comm_t *c, const float *send, size_t count,
                                      float *recv);
    td_status_t (*alltoallv)(td_comm_t *c, const void *send, const size_t *send_bytes,
                             void *recv, size_t recv_cap, size_t *recv_bytes);
    /* tell the other ranks this one is gone (may be NULL) */
    void (*abort)(td_comm_t *c, td_status_t st);
    void (*destroy)(td_comm_t *c);
} td_comm_ops_t;

/* The head of every backend's communicator (the backend's struct starts
 * with it). */
struct td_comm_s {
    const td_comm_ops_t *ops;
    uint32_t rank, size;
    uint64_t deadline_ms;
    char name[48];
    _Atomic int broken;   /* a td_status_t: TD_OK until the first failure */
    td_comm_stats_t stats;
};

/* Fill the head (opts may be NULL). */
void td_comm_init(td_comm_t *c, const td_comm_ops_t *ops, uint32_t rank, uint32_t size,
                  const td_comm_opts_t *opts);


#endif
