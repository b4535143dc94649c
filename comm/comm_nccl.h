/* comm/comm_nccl.h — the communicator's NCCL backend (comm/nccl.c): one rank
 * per GPU, in any process; built only where the build has CUDA and NCCL (then
 * td_comm_nccl_dep defines TD_HAVE_NCCL).
 *
 * Differences from the interface in comm.h:
 * - send and recv of every collective are device memory on the rank's GPU;
 *   the all-to-all's send_bytes and recv_bytes stay host arrays.
 * - td_comm_reduce_scatter_f32: NCCL does not promise to sum in rank order
 *   (its ring and tree orders depend on the topology and the size), so the
 *   bits may differ from the CPU backend's and between runs with other
 *   sizes; with one rank it is a copy.
 * - td_comm_abort aborts this rank's NCCL communicator; NCCL sends no word
 *   of it, so the other ranks see an NCCL error (TD_ERR_PEER and others) or
 *   reach their deadline (TD_ERR_TIMEOUT), not always at once.
 * - A collective that misses its deadline aborts the NCCL communicator
 *   (ncclCommAbort) and returns TD_ERR_TIMEOUT.
 * - The all-to-all first all-gathers every rank's counts and room, so every
 *   rank knows when one has too little: that rank returns TD_ERR_TOO_BIG,
 *   the others TD_ERR_PEER, and nothing else is sent. */
#ifndef TD_COMM_NCCL_H
#define TD_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* The size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define TD_COMM_NCCL_ID_BYTES 128

/* A fresh unique id in out (len >= TD_COMM_NCCL_ID_BYTES): made by one rank
 * (rank 0), handed to the others by the caller's own channel. */
td_status_t td_comm_nccl_unique_id(void *out, size_t len);

/* This rank's communicator on CUDA device cuda_device: every rank of the
 * group calls it with the same size and unique_id (TD_COMM_NCCL_ID_BYTES
 * bytes from td_comm_nccl_unique_id), and it returns once all have joined,
 * or TD_ERR_TIMEOUT at the deadline of opts. The communicator owns its NCCL
 * communicator, a CUDA stream and small device and pinned buffers; each
 * collective sets the calling thread's current device for its duration. */
td_status_t td_comm_nccl_create(uint32_t rank, uint32_t size, const void *unique_id,
                                int cuda_device, const td_comm_opts_t *opts, td_comm_t **out);

#endif
