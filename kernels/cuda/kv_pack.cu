/* kernels/cuda/kv_pack.cu — KV pack/unpack on the GPU: gather a span of a paged
 * segment into a contiguous buffer, or scatter it back. One CTA per (block, chunk),
 * copying with the widest word (16 B .. 1 B) both sides are mutually aligned to. */
#include "backend.h"
#include "simt.h"

#include <string.h>

namespace td_cuda {

static constexpr unsigned KV_THREADS = 256;       /* threads per CTA */
static constexpr size_t KV_CHUNK_MIN = 64 * 1024; /* bytes per CTA at least */
static constexpr size_t KV_GRID_Y_MAX = 65535;    /* chunks per block run at most */
static constexpr unsigned KV_UNROLL = 4;          /* words in flight per thread */

/* One launch: up to KV_IDS of the span's runs, block j of the table being
 * CTA column j - jfirst. A run is the span's entries inside one block,
 * contiguous on both sides. The block ids travel by value in the kernel
 * parameters: the launch copies them when it is enqueued, so the caller's
 * table is free as soon as the op returns, and no device memory, upload or
 * synchronisation is needed. Parameters stay within the 4 KiB every CUDA
 * version and device accepts; a span touching more blocks takes several
 * launches of KV_IDS runs. */
static constexpr size_t KV_PARAM_MAX = 4096;      /* bytes of kernel parameters */
static constexpr unsigned KV_IDS = 1000;          /* block ids per launch */

struct kv_args {
    unsigned char *base;       /* [nblocks, block_bytes] */
    unsigned char *buf;        /* [count, entry_bytes] */
    size_t block_bytes, entry_bytes, epb, offset;
    uint64_t first, count, jfirst;
    size_t chunk;              /* bytes per CTA, a multiple of 16 */
    uint32_t ids[KV_IDS];      /* [gridDim.x] = table[jfirst ..] */
};
static_assert(sizeof(kv_args) <= KV_PARAM_MAX, "kv_args exceeds 4 KiB of kernel parameters");

/* Copy len bytes; dst and src are congruent modulo sizeof(W): bytes up to the
 * first W-aligned address, then W-words, then the tail bytes. */
template <typename W>
__device__ static void
kv_copy_words(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
              size_t len)
{
    size_t head = (sizeof(W) - ((uintptr_t)dst & (sizeof(W) - 1))) & (sizeof(W) - 1);
    if (head > len)
        head = len;
    size_t nw = (len - head) / sizeof(W);
    unsigned char *d = dst + head;
    const unsigned char *s = src + head;

    for (size_t i = threadIdx.x; i < head; i += blockDim.x)
        dst[i] = src[i];
    /* KV_UNROLL loads issued before their stores, for memory-level parallelism */
    for (size_t i = threadIdx.x; i < nw; i += KV_UNROLL * blockDim.x) {
        W v[KV_UNROLL];
#pragma unroll
        for (unsigned k = 0; k < KV_UNROLL; k++)
            if (i + k * blockDim.x < nw)
                v[k] = td_ld<W>(s + (i + k * blockDim.x) * sizeof(W));
#pragma unroll
        for (unsigned k = 0; k < KV_UNROLL; k++)
            if (i + k * blockDim.x < nw)
                td_st<W>(d + (i + k * blockDim.x) * sizeof(W), v[k]);
    }
    for (size_t i = head + nw * sizeof(W) + threadIdx.x; i < len; i += blockDim.x)
        dst[i] = src[i];
}

__device__ static void
kv_copy(unsigned char *dst, const unsigned char *src, size_t len)
{
    uintptr_t mis = (uintptr_t)dst ^ (uintptr_t)src;

    if ((mis & 15) == 0)
        kv_copy_words<uint4>(dst, src, len);
    else if ((mis & 7) == 0)
        kv_copy_words<uint2>(dst, src, len);
    else if ((mis & 3) == 0)
        kv_copy_words<uint32_t>(dst, src, len);
    else if ((mis & 1) == 0)
        kv_copy_words<uint16_t>(dst, src, len);
    else
        kv_copy_words<unsigned char>(dst, src, len);
}

/* a is read in place from the parameter space (__grid_constant__: no
 * per-thread copy of the id array). */
template <bool PACK>
__global__ static void
kv_copy_kernel(const __grid_constant__ kv_args a)
{
    uint64_t j = a.jfirst + blockIdx.x;
    uint64_t end = a.first + a.count;
    uint64_t lo = j * a.epb > a.first ? j * a.epb : a.first;
    uint64_t hi = (j + 1) * a.epb < end ? (j + 1) * a.epb : end;
    size_t len = (size_t)(hi - lo) * a.entry_bytes;
    size_t c0 = (size_t)blockIdx.y * a.chunk;

    if (c0 >= len)
        return;
    size_t n = len - c0 < a.chunk ? len - c0 : a.chunk;
    unsigned char *blk = a.base + (size_t)a.ids[blockIdx.x] * a.block_bytes +
                         a.offset + (size_t)(lo - j * a.epb) * a.entry_bytes + c0;
    unsigned char *b = a.buf + (size_t)(lo - a.first) * a.entry_bytes + c0;

    if (PACK)
        kv_copy(b, blk, n);
    else
        kv_copy(blk, b, n);
}

/* Check on the host, then launch the span's runs KV_IDS at a time, each
 * launch carrying its block ids by value. */
static td_status_t
kv_launch(const char *op, bool pack, const td_kernels_pool_t *pool,
          const uint32_t *table, size_t ntable, const td_kernels_span_t *span,
          const void *buf, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    td_status_t st;

    st = td_kernels_kv_check(op, pool, table, ntable, span, buf);
    if (st != TD_OK || span->count == 0)
        return st;

    kv_args a = {};    /* 4 KiB on the stack: no state shared between calls */
    a.base = (unsigned char *)pool->base;
    a.buf = (unsigned char *)buf;
    a.block_bytes = pool->block_bytes;
    a.entry_bytes = span->entry_bytes;
    a.epb = span->entries_per_block;
    a.offset = span->offset;
    a.first = span->first;
    a.count = span->count;

    size_t run_max = (size_t)(a.count < a.epb ? a.count : a.epb) * a.entry_bytes;
    size_t chunk = (run_max + KV_GRID_Y_MAX - 1) / KV_GRID_Y_MAX;
    chunk = (chunk + 15) & ~(size_t)15;
    a.chunk = chunk > KV_CHUNK_MIN ? chunk : KV_CHUNK_MIN;
    unsigned nchunks = (unsigned)((run_max + a.chunk - 1) / a.chunk);

    uint64_t jlast = (span->first + span->count - 1) / a.epb;
    for (a.jfirst = span->first / a.epb;; a.jfirst += KV_IDS) {
        uint64_t rest = jlast - a.jfirst;  /* runs after this launch's first */
        unsigned n = rest < KV_IDS ? (unsigned)rest + 1 : KV_IDS;

        memcpy(a.ids, table + a.jfirst, n * sizeof(*table));
        dim3 grid(n, nchunks);
        cudaError_t e = pack ? TD_LAUNCH(kv_copy_kernel<true>, grid, KV_THREADS, 0, s, a)
                             : TD_LAUNCH(kv_copy_kernel<false>, grid, KV_THREADS, 0, s, a);
        st = td_kernels_cuda_status(e, op);
        if (st != TD_OK || rest < KV_IDS)
            return st;
    }
}

td_status_t
td_kernels_cuda_kv_pack(const td_kernels_pool_t *pool, const uint32_t *table,
                        size_t ntable, const td_kernels_span_t *span, void *buf,
                        void *stream)
{
    return kv_launch("kv_pack", true, pool, table, ntable, span, buf, stream);
}

td_status_t
td_kernels_cuda_kv_unpack(const td_kernels_pool_t *pool, const uint32_t *table,
                          size_t ntable, const td_kernels_span_t *span,
                          const void *buf, void *stream)
{
    return kv_launch("kv_unpack", false, pool, table, ntable, span, buf, stream);
}

cudaError_t
td_kernels_cuda_kv_probe(void)
{
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, kv_copy_kernel<true>);
}

}  // namespace td_cuda
