/* comm/nccl.c — the communicator's NCCL backend: one rank per GPU, the
 * collectives on the rank's own CUDA stream over a non-blocking NCCL
 * communicator, polled until they are done or their deadline passes (then
 * the NCCL communicator is aborted). ncclResult_t and cudaError_t become
 * td_status_t here, once. */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "comm.h"
#include "log.h"
#include "comm_nccl.h"

_Static_assert(TD_COMM_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "TD_COMM_NCCL_ID_BYTES");
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "counts travel as ncclUint64");

/* Polls of a collective before the waiting thread sleeps between them. */
#define NCCL_SPIN 2000
#define NCCL_SLEEP_NS 50000

typedef struct {
    td_comm_t head;
    ncclComm_t nc;          /* NULL once aborted */
    cudaStream_t stream;    /* every collective's work */
    int device;
    int *d_flag;            /* device [1]: the barrier's all-reduce */
    uint64_t *d_rows;       /* device [size][size + 1]: per rank, its bytes to each rank, then its room */
    uint64_t *h_rows;       /* pinned host copy of d_rows */
} nccl_comm_t;

/* ---- Foreign codes, converted once ---------------------------------------------------- */

static td_status_t
nccl_status(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return TD_OK;
    case ncclInProgress:
        return TD_INPROGRESS;
    case ncclUnhandledCudaError:
        return TD_ERR_CUDA;
    case ncclSystemError:
        return TD_ERR_IO;
    case ncclInvalidArgument:
        return TD_ERR_INVALID;
    case ncclInvalidUsage:
        return TD_ERR_STATE;
    case ncclRemoteError:
        return TD_ERR_PEER;
    default:
        return TD_ERR_INTERNAL;
    }
}

static td_status_t
cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return TD_OK;
    case cudaErrorMemoryAllocation:
        return TD_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
        return TD_ERR_UNSUPPORTED;
    default:
        return TD_ERR_CUDA;
    }
}

/* The NCCL communicator is of no more use (an error, a missed deadline, an
 * abort): abort it. */
static void
nccl_kill(nccl_comm_t *n)
{
    if (n->nc != NULL) {
        ncclCommAbort(n->nc);
        n->nc = NULL;
    }
}

/* An NCCL failure: logged with NCCL's words, the communicator aborted. */
static td_status_t
nccl_fail(nccl_comm_t *n, ncclResult_t r, const char *what)
{
    td_error("%s rank %u/%u: %s: nccl: %s (%s)", n->head.name, n->head.rank, n->head.size,
             what, ncclGetErrorString(r), n->nc ? ncclGetLastError(n->nc) : "");
    nccl_kill(n);
    return nccl_status(r);
}

static td_status_t
nccl_cuda_fail(nccl_comm_t *n, cudaError_t e, const char *what)
{
    td_error("%s rank %u/%u: %s: cuda: %s", n->head.name, n->head.rank, n->head.size, what,
             cudaGetErrorString(e));
    nccl_kill(n);
    return cuda_status(e);
}

/* ---- Waiting with a deadline ------------------------------------------------------------ */

static uint64_t
nccl_deadline(const nccl_comm_t *n)
{
    uint64_t now = td_clock_ns();

    if (n->head.deadline_ms > (UINT64_MAX - now) / 1000000u)
        return UINT64_MAX;
    return now + n->head.deadline_ms * 1000000u;
}

/* Wait until NCCL has taken the communicator's last call (it said
 * ncclInProgress) and, with stream, until the stream's work is done; at
 * deadline_ns abort the communicator: TD_ERR_TIMEOUT. */
static td_status_t
nccl_wait(nccl_comm_t *n, uint64_t deadline_ns, bool stream, const char *what)
{
    for (unsigned polls = 0;; polls++) {
        ncclResult_t async = ncclSuccess, r;

        r = ncclCommGetAsyncError(n->nc, &async);
        if (r != ncclSuccess)
            return nccl_fail(n, r, what);
        if (async != ncclSuccess && async != ncclInProgress)
            return nccl_fail(n, async, what);
        if (async == ncclSuccess) {
            cudaError_t e;

            if (!stream)
                return TD_OK;
            e = cudaStreamQuery(n->stream);
            if (e == cudaSuccess)
                return TD_OK;
            if (e != cudaErrorNotReady)
                return nccl_cuda_fail(n, e, what);
        }
        if (td_clock_ns() >= deadline_ns) {
            td_error("%s rank %u/%u: %s: not done within %llu ms; the nccl communicator is "
                     "aborted", n->head.name, n->head.rank, n->head.size, what,
                     (unsigned long long)n->head.deadline_ms);
            nccl_kill(n);
            return TD_ERR_TIMEOUT;
        }
        if (polls >= NCCL_SPIN) {
            struct timespec ts = { 0, NCCL_SLEEP_NS };

            nanosleep(&ts, NULL);
        }
    }
}

/* What an NCCL call returned: in progress waits until NCCL has taken it. */
static td_status_t
nccl_call(nccl_comm_t *n, ncclResult_t r, uint64_t deadline_ns, const char *what)
{
    if (r == ncclSuccess)
        return TD_OK;
    if (r == ncclInProgress)
        return nccl_wait(n, deadline_ns, false, what);
    return nccl_fail(n, r, what);
}

/* Make device current for the calling thread; *prev is the one to put
 * back with nccl_leave. */
static cudaError_t
nccl_set_device(int device, int *prev)
{
    cudaError_t e = cudaGetDevice(prev);

    if (e == cudaSuccess && *prev != device)
        e = cudaSetDevice(device);
    return e;
}

static void
nccl_leave(int device, int prev)
{
    if (prev != device)
        cudaSetDevice(prev);
}

/* The start of every collective: the rank's device current. */
static td_status_t
nccl_enter(nccl_comm_t *n, int *prev, const char *what)
{
    cudaError_t e;

    if (n->nc == NULL)
        return TD_ERR_STATE;   /* aborted: comm.c refuses the call before */
    e = nccl_set_device(n->device, prev);
    if (e != cudaSuccess)
        return nccl_cuda_fail(n, e, what);
    return TD_OK;
}

/* ---- The collectives --------------------------------------------------------------------- */

static td_status_t
nccl_barrier(td_comm_t *c)
{
    nccl_comm_t *n = (nccl_comm_t *)c;
    uint64_t dl = nccl_deadline(n);
    td_status_t st;
    int prev;

    if ((st = nccl_enter(n, &prev, "barrier")) != TD_OK)
        return st;
    st = nccl_call(n, ncclAllReduce(n->d_flag, n->d_flag, 1, ncclInt32, ncclMax, n->nc,
                                    n->stream), dl, "barrier");
    if (st == TD_OK)
        st = nccl_wait(n, dl, true, "barrier");
    nccl_leave(n->device, prev);
    return st;
}

static td_status_t
nccl_allgather(td_comm_t *c, const void *send, size_t bytes, void *recv)
{
    nccl_comm_t *n = (nccl_comm_t *)c;
    uint64_t dl = nccl_deadline(n);
    td_status_t st;
    int prev;

    if ((st = nccl_enter(n, &prev, "all-gather")) != TD_OK)
        return st;
    st = nccl_call(n, ncclAllGather(send, recv, bytes, ncclUint8, n->nc, n->stream), dl,
                   "all-gather");
    if (st == TD_OK)
        st = nccl_wait(n, dl, true, "all-gather");
    nccl_leave(n->device, prev);
    if (st == TD_OK) {
        c->stats.bytes_sent += (uint64_t)bytes * (c->size - 1);
        c->stats.bytes_recv += (uint64_t)bytes * (c->size - 1);
    }
    return st;
}

static td_status_t
nccl_reduce_scatter_f32(td_comm_t *c, const float *send, size_t count, float *recv)
{
    nccl_comm_t *n = (nccl_comm_t *)c;
    uint64_t dl = nccl_deadline(n);
    td_status_t st;
    int prev;

    if ((st = nccl_enter(n, &prev, "reduce-scatter")) != TD_OK)
        return st;
    st = nccl_call(n, ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, n->nc,
                                        n->stream), dl, "reduce-scatter");
    if (st == TD_OK)
        st = nccl_wait(n, dl, true, "reduce-scatter");
    nccl_leave(n->device, prev);
    if (st == TD_OK) {
        c->stats.bytes_sent += (uint64_t)count * sizeof(float) * (c->size - 1);
        c->stats.bytes_recv += (uint64_t)count * sizeof(float) * (c->size - 1);
    }
    return st;
}

/* Every rank's row of counts and room, all-gathered into h_rows. */
static td_status_t
nccl_exchange_counts(nccl_comm_t *n, const size_t *send_bytes, size_t recv_cap, uint64_t dl)
{
    uint32_t size = n->head.size, w = size + 1;
    uint64_t *mine = n->h_rows + (size_t)n->head.rank * w;
    cudaError_t e;
    td_status_t st;

    memcpy(mine, send_bytes, size * sizeof *mine);
    mine[size] = recv_cap;
    e = cudaMemcpyAsync(n->d_rows + (size_t)n->head.rank * w, mine, w * sizeof *mine,
                        cudaMemcpyHostToDevice, n->stream);
    if (e != cudaSuccess)
        return nccl_cuda_fail(n, e, "all-to-all counts");
    st = nccl_call(n, ncclAllGather(n->d_rows + (size_t)n->head.rank * w, n->d_rows, w,
                                    ncclUint64, n->nc, n->stream), dl, "all-to-all counts");
    if (st != TD_OK)
        return st;
    e = cudaMemcpyAsync(n->h_rows, n->d_rows, (size_t)size * w * sizeof *mine,
                        cudaMemcpyDeviceToHost, n->stream);
    if (e != cudaSuccess)
        return nccl_cuda_fail(n, e, "all-to-all counts");
    return nccl_wait(n, dl, true, "all-to-all counts");
}

/* Whether rank r gets more than its room (every rank decides the same). */
static bool
nccl_over(const nccl_comm_t *n, uint32_t r)
{
    uint32_t size = n->head.size, w = size + 1;
    uint64_t cap = n->h_rows[(size_t)r * w + size], total = 0;

    for (uint32_t s = 0; s < size; s++) {
        uint64_t b = n->h_rows[(size_t)s * w + r];

        if (b > cap - total)
            return true;
        total += b;
    }
    return false;
}

static td_status_t
nccl_alltoallv(td_comm_t *c, const void *send, const size_t *send_bytes, void *recv,
               size_t recv_cap, size_t *recv_bytes)
{
    nccl_comm_t *n = (nccl_comm_t *)c;
    uint32_t size = c->size, w = size + 1, me = c->rank;
    uint64_t dl = nccl_deadline(n), sent = 0, got = 0;
    size_t soff = 0, roff = 0;
    ncclResult_t r = ncclSuccess, end;
    td_status_t st;
    int prev;

    if ((st = nccl_enter(n, &prev, "all-to-all")) != TD_OK)
        return st;
    st = nccl_exchange_counts(n, send_bytes, recv_cap, dl);
    if (st != TD_OK)
        goto out;
    if (nccl_over(n, me)) {
        td_error("%s rank %u/%u: all-to-all: more than the %zu bytes of room arrive",
                 c->name, me, size, recv_cap);
        st = TD_ERR_TOO_BIG;
        goto out;
    }
    for (uint32_t q = 0; q < size; q++) {
        if (nccl_over(n, q)) {
            st = TD_ERR_PEER;
            goto out;
        }
    }
    r = ncclGroupStart();
    if (r != ncclSuccess) {
        st = nccl_fail(n, r, "all-to-all");
        goto out;
    }
    for (uint32_t p = 0; p < size && r == ncclSuccess; p++) {
        size_t out_b = send_bytes[p], in_b = n->h_rows[(size_t)p * w + me];

        if (p == me) {
            cudaError_t e = out_b ? cudaMemcpyAsync((char *)recv + roff,
                                                    (const char *)send + soff, out_b,
                                                    cudaMemcpyDeviceToDevice, n->stream)
                                  : cudaSuccess;
            if (e != cudaSuccess) {
                ncclGroupEnd();
                st = nccl_cuda_fail(n, e, "all-to-all");
                goto out;
            }
        } else {
            if (out_b)
                r = ncclSend((const char *)send + soff, out_b, ncclUint8, (int)p, n->nc,
                             n->stream);
            if (in_b && r == ncclSuccess)
                r = ncclRecv((char *)recv + roff, in_b, ncclUint8, (int)p, n->nc, n->stream);
            sent += out_b;
            got += in_b;
        }
        soff += out_b;
        roff += in_b;
    }
    end = ncclGroupEnd();
    if (r != ncclSuccess) {
        st = nccl_fail(n, r, "all-to-all");
        goto out;
    }
    st = nccl_call(n, end, dl, "all-to-all");
    if (st == TD_OK)
        st = nccl_wait(n, dl, true, "all-to-all");
    if (st != TD_OK)
        goto out;
    for (uint32_t s = 0; s < size; s++)
        recv_bytes[s] = n->h_rows[(size_t)s * w + me];
    c->stats.bytes_sent += sent;
    c->stats.bytes_recv += got;
out:
    nccl_leave(n->device, prev);
    return st;
}

static void
nccl_abort(td_comm_t *c, td_status_t st)
{
    nccl_comm_t *n = (nccl_comm_t *)c;
    int prev;

    td_warn("%s rank %u/%u: aborted (%s); the nccl communicator is aborted", c->name,
            c->rank, c->size, td_status_str(st));
    if (nccl_set_device(n->device, &prev) == cudaSuccess) {
        nccl_kill(n);
        nccl_leave(n->device, prev);
    } else {
        nccl_kill(n);
    }
}

/* ---- Lifetime ---------------------------------------------------------------------------- */

/* Free what nccl_comm_create made (after the NCCL communicator is gone). */
static void
nccl_free(nccl_comm_t *n)
{
    if (n->h_rows != NULL)
        cudaFreeHost(n->h_rows);
    if (n->d_rows != NULL)
        cudaFree(n->d_rows);
    if (n->d_flag != NULL)
        cudaFree(n->d_flag);
    if (n->stream != NULL)
        cudaStreamDestroy(n->stream);
    free(n);
}

/* A healthy communicator is finalized (its work flushed, at most until the
 * deadline) and destroyed; a broken one aborted. */
static void
nccl_destroy(td_comm_t *c)
{
    nccl_comm_t *n = (nccl_comm_t *)c;
    int device = n->device, prev = device;

    if (nccl_set_device(device, &prev) != cudaSuccess)
        prev = device;
    if (n->nc != NULL && td_comm_status(c) == TD_OK &&
        nccl_call(n, ncclCommFinalize(n->nc), nccl_deadline(n), "finalize") == TD_OK) {
        ncclCommDestroy(n->nc);
        n->nc = NULL;
    }
    nccl_kill(n);
    nccl_free(n);
    nccl_leave(device, prev);
}

static const td_comm_ops_t nccl_ops = {
    .name = "nccl",
    .barrier = nccl_barrier,
    .allgather = nccl_allgather,
    .reduce_scatter_f32 = nccl_reduce_scatter_f32,
    .alltoallv = nccl_alltoallv,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

td_status_t
td_comm_nccl_unique_id(void *out, size_t len)
{
    ncclUniqueId id;
    ncclResult_t r;

    if (out == NULL || len < sizeof id) {
        td_error("comm: nccl unique id: needs %zu bytes, got %zu", sizeof id, len);
        return TD_ERR_INVALID;
    }
    r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        td_error("comm: nccl unique id: %s", ncclGetErrorString(r));
        return nccl_status(r);
    }
    memcpy(out, &id, sizeof id);
    return TD_OK;
}

td_status_t
td_comm_nccl_create(uint32_t rank, uint32_t size, const void *unique_id, int cuda_device,
                    const td_comm_opts_t *opts, td_comm_t **out)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    nccl_comm_t *n;
    size_t rows;
    cudaError_t e;
    td_status_t st;
    int prev;

    if (size == 0 || size >= INT_MAX || rank >= size || unique_id == NULL) {
        td_error("%s: nccl rank %u of %u: invalid", opts && opts->name ? opts->name : "comm",
                 rank, size);
        return TD_ERR_INVALID;
    }
    n = calloc(1, sizeof *n);
    if (n == NULL) {
        td_error("%s rank %u/%u: %s", opts && opts->name ? opts->name : "comm", rank, size,
                 td_status_str(TD_ERR_NOMEM));
        return TD_ERR_NOMEM;
    }
    td_comm_init(&n->head, &nccl_ops, rank, size, opts);
    n->device = cuda_device;
    rows = (size_t)size * (size + 1) * sizeof *n->h_rows;

    e = nccl_set_device(cuda_device, &prev);
    if (e != cudaSuccess) {
        st = nccl_cuda_fail(n, e, "set device");
        free(n);
        return st;
    }
    if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc((void **)&n->d_flag, sizeof *n->d_flag)) != cudaSuccess ||
        (e = cudaMemset(n->d_flag, 0, sizeof *n->d_flag)) != cudaSuccess ||
        (e = cudaMalloc((void **)&n->d_rows, rows)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&n->h_rows, rows)) != cudaSuccess) {
        st = nccl_cuda_fail(n, e, "buffers");
        goto err_free;
    }

    memcpy(&id, unique_id, sizeof id);
    cfg.blocking = 0;
    st = nccl_call(n, ncclCommInitRankConfig(&n->nc, (int)size, id, (int)rank, &cfg),
                   nccl_deadline(n), "init");
    if (st != TD_OK)
        goto err_free;
    nccl_leave(cuda_device, prev);
    *out = &n->head;
    return TD_OK;

err_free:
    nccl_kill(n);
    nccl_free(n);
    nccl_leave(cuda_device, prev);
    return st;
}
