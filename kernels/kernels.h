/* kernels/kernels.h — the op interface: one table of function pointers per
 * backend (cpu, cuda). The engine is written once against td_kernels_t; the
 * only project header kernels include is the leaf base/status.h. */
#ifndef TD_KERNELS_H
#define TD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A view of a paged KV pool (owns nothing): nblocks blocks of block_bytes
 * each, back to back. Host memory for the cpu backend, device-accessible
 * memory (cudaMalloc, or mapped pinned host memory) for cuda. */
typedef struct {
    void    *base;          /* [nblocks, block_bytes] bytes */
    uint32_t nblocks;
    size_t   block_bytes;
} td_kernels_pool_t;

/* Which entries of a paged segment move, and where they sit in a block.
 * Entry e, for first <= e < first + count, lives in block
 * table[e / entries_per_block] at byte
 *     offset + (e % entries_per_block) * entry_bytes
 * and in the contiguous buffer at byte (e - first) * entry_bytes.
 * offset lets several segments share one block (e.g. a block holding
 * [layers, entries_per_block, entry_bytes]); first lets a decode step append
 * in the middle of a block. td_kernels_span_bytes() is the plain case. */
typedef struct {
    size_t   entry_bytes;       /* > 0 */
    size_t   entries_per_block; /* > 0; offset + entries_per_block * entry_bytes <= block_bytes */
    size_t   offset;            /* byte offset of the segment inside every block */
    uint64_t first;             /* first entry moved */
    uint64_t count;             /* entries moved; 0 moves nothing */
} td_kernels_span_t;

/* The plain case: `bytes` bytes filling whole blocks in table order, the last
 * block partly when bytes is not a multiple of block_bytes. */
static inline td_kernels_span_t
td_kernels_span_bytes(size_t block_bytes, uint64_t bytes)
{
    td_kernels_span_t s = { 1, block_bytes, 0, 0, bytes };
    return s;
}

/* One backend. Every op validates its arguments on the host before touching
 * memory: a block id >= pool->nblocks, or a table shorter than the span needs,
 * gives TD_ERR_RANGE and writes nothing; malformed spans, NULL pointers, a
 * buffer overlapping the pool, or a buffer or pool running past the top of
 * the address space give TD_ERR_INVALID. The table is host memory (pageable
 * or pinned), read before the op returns, so the caller may overwrite or free
 * it as soon as the op returns, even while a cuda op is still running; it
 * holds distinct ids (not checked: the pool's accounting guarantees it;
 * duplicates make unpack's result unspecified).
 *
 * stream: NULL for cpu (ignored); for cuda a cudaStream_t, NULL meaning the
 * legacy default stream. cuda ops are asynchronous: TD_OK means enqueued, the
 * pool and buffer must stay alive until sync(stream) returns. A cuda op
 * carries the block ids by value in its kernel launch parameters (one launch
 * per 1000 blocks touched): it allocates nothing, copies nothing ahead of the
 * kernel and never waits for the stream. A launch error after the first of
 * several launches leaves the earlier ones enqueued (the span's content is
 * then unspecified, as after an error from sync). cpu ops are done when they
 * return. On failure the op has logged why (td_kernels_fail) and returns the
 * status; the caller passes it up and logs nothing more. */
typedef struct td_kernels {
    const char *name;  /* "cpu", "cuda" */

    /* Gather: buf[(e - first) * entry_bytes ...] = entry e of the span.
     * table: [ntable] block ids; buf: [span->count, span->entry_bytes]. */
    td_status_t (*kv_pack)(const td_kernels_pool_t *pool, const uint32_t *table,
                           size_t ntable, const td_kernels_span_t *span,
                           void *buf, void *stream);
    /* Scatter: the inverse of kv_pack; bytes of the blocks outside the span
     * are left as they were. buf: [span->count, span->entry_bytes]. */
    td_status_t (*kv_unpack)(const td_kernels_pool_t *pool, const uint32_t *table,
                             size_t ntable, const td_kernels_span_t *span,
                             const void *buf, void *stream);
    /* Wait until every op enqueued on stream is done. */
    td_status_t (*sync)(void *stream);
} td_kernels_t;

/* The reference backend: plain C, memcpy; always available, never NULL. */
const td_kernels_t *td_kernels_cpu(void);

/* The CUDA backend on the current device. Defined only when kernels/cuda is
 * built (td_kernels_cuda_dep defines TD_HAVE_CUDA). TD_ERR_UNSUPPORTED when
 * there is no usable device or no kernel image for it; *out set on TD_OK. */
td_status_t td_kernels_cuda(const td_kernels_t **out);

/* ---- compute ops ------------------------------------------------------
 * The forward pass's arithmetic, one table per backend (td_kernels_ops_t is
 * kept apart from the KV-movement table above so that a backend can grow its
 * compute ops one by one). Every pointer is backend memory (host for cpu);
 * tensors are row-major f32 unless said otherwise, shapes in brackets. An op
 * with a NULL pointer (where one is required) or a zero or inconsistent size
 * returns TD_ERR_INVALID, the reason logged once, and writes
 * nothing. cpu ops are synchronous; `out` may alias an input only where an
 * op says so. Numerics follow the PyTorch reference of DeepSeek-V4.1 (fp32
 * throughout; docs/forward.md); the quantizers are bit-exact. */

/* Router scoring functions (transformers' ACT2FN names). */
typedef enum {
    TD_KERNELS_SCORE_SQRTSOFTPLUS = 0,  /* sqrt(softplus(x)), softplus(x) = x for x > 20 */
    TD_KERNELS_SCORE_SIGMOID = 1,
} td_kernels_score_t;

/* A linear's weights in the layout the backend's linear_mat reads (cpu:
 * bf16 when every value is one, which is exact; 16-column k-major panels or
 * rows, by shape). Made by mat_create, owned by its caller. */
typedef struct td_kernels_mat td_kernels_mat_t;

/* The stored formats a linear's weights come in (the release's, docs/weights.md). */
typedef enum {
    TD_KERNELS_W_F32 = 0,       /* data: f32 [N, k] (tables only) */
    TD_KERNELS_W_BF16 = 1,      /* data: bf16 [N, k] */
    TD_KERNELS_W_FP8_BLOCK = 2, /* data: e4m3 codes [N, k]; scales: ue8m0
                                 * [ceil(N / block_rows), ceil(k / block_cols)] */
    TD_KERNELS_W_FP4_K32 = 3,   /* data: e2m1 codes [N, k / 2], element 2i in the
                                 * low nibble; scales: ue8m0 [N, k / 32] */
    TD_KERNELS_W_FP8_ROWS = 4,  /* data: e4m3 codes [N, k]; scales: ue8m0 [N, k / 32]
                                 * (tables only: the engram rows) */
} td_kernels_wfmt_t;

/* A linear's weights as stored: N = groups * n rows of k values. Host
 * memory, any alignment, read only during mat_create_fmt. */
typedef struct {
    td_kernels_wfmt_t fmt;
    const void *data;
    const uint8_t *scales;      /* NULL for bf16 */
    size_t block_rows, block_cols; /* fp8 only; block_cols a multiple of 32 */
} td_kernels_wsrc_t;

typedef struct td_kernels_ops {
    const char *name;  /* "cpu" */

    /* Prepare w [groups, n, k] (f32, row-major) for linear_mat: groups
     * independent [n, k] blocks (1: a plain linear; more: a block-diagonal
     * one, as linear_grouped). w is copied; *out on TD_OK. */
    td_status_t (*mat_create)(const float *w, size_t groups, size_t n, size_t k,
                              td_kernels_mat_t **out);
    /* The same from weights in a stored format: kept as codes and scales
     * (the cpu backend dequantizes them inside linear_mat, sixteen columns
     * at a time, into registers), or, where the backend cannot keep a
     * matrix so and stay exact, widened to the values the checkpoint
     * reader gives. linear_mat's results are those of mat_create on those
     * values, bit for bit. */
    td_status_t (*mat_create_fmt)(const td_kernels_wsrc_t *w, size_t groups, size_t n,
                                  size_t k, td_kernels_mat_t **out);
    void (*mat_destroy)(td_kernels_mat_t *w);
    /* Bytes the prepared weights take. */
    size_t (*mat_bytes)(const td_kernels_mat_t *w);
    /* y [m, groups, n] = x [m, groups, k] . w^T group by group; the same
     * values as linear / linear_grouped on the weights w was made from. y
     * must not alias x. Every output element is summed in an order fixed by
     * (n, k) alone: a row's result does not depend on the other rows. */
    td_status_t (*linear_mat)(const float *x, const td_kernels_mat_t *w, float *y, size_t m);

    /* y[m, n] = x[m, k] . w[n, k]^T (a bias-free nn.Linear); with acc,
     * y += that. y must not alias x or w. (Prepares w on every call: the
     * forward pass uses linear_mat.) */
    td_status_t (*linear)(const float *x, const float *w, float *y,
                          size_t m, size_t n, size_t k, int acc);
    /* Block-diagonal linear: x [m, g, k], w [g, n, k] -> y [m, g, n]
     * (y[r, j] = w[j] . x[r, j] for every group j). */
    td_status_t (*linear_grouped)(const float *x, const float *w, float *y,
                                  size_t m, size_t g, size_t n, size_t k);
    /* y[r] = table[ids[r]]: table [rows, d], ids [n], y [n, d]; an id >=
     * rows (or < 0) is TD_ERR_RANGE. */
    td_status_t (*embed)(const float *table, size_t rows, size_t d,
                         const int64_t *ids, size_t n, float *y);
    /* The same over a table in its stored format (f32, bf16, fp8 rows with
     * ue8m0 scales per 32 channels): each row's values made as the
     * checkpoint reader makes them (one product of code and scale). */
    td_status_t (*embed_fmt)(const td_kernels_wsrc_t *table, size_t rows, size_t d,
                             const int64_t *ids, size_t n, float *y);
    /* y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) (* w when w is not NULL):
     * x, y [n, d], w [d]; y may be x. */
    td_status_t (*rmsnorm)(const float *x, const float *w, float eps,
                           size_t n, size_t d, float *y);
    /* Interleaved-pair RoPE in place on the last rd channels of every head:
     * x [n, h, d], pos [n], inv_freq [rd / 2]. Pair i of token r turns by
     * a = inv_freq[i] * pos[r] (f32), with cos(a) * scale and sin(a) * scale;
     * inverse turns the other way. rd even, rd <= d. */
    td_status_t (*rope)(float *x, size_t n, size_t h, size_t d, size_t rd,
                        const int64_t *pos, const float *inv_freq, float scale,
                        int inverse);
    /* Attention over one shared K = V head with a per-head sink logit:
     * q [n, h, d], kv [t, d], mask [n, t] added to the scaled scores (0 or
     * -inf; NULL: none), sink [h], out [n, h, d]. The sink joins the softmax
     * as an extra logit and is dropped: out = sum_j p_j kv_j with
     * p = softmax([s, sink])[:t]. A row whose every key is masked gives 0. */
    td_status_t (*attention)(const float *q, const float *kv, const float *mask,
                             const float *sink, float scale, size_t n, size_t h,
                             size_t t, size_t d, float *out);

    /* fp8 e4m3 with one power-of-two (ue8m0) scale per block of b channels:
     * x [n, d] -> codes [n, d], scales [n, d / b] (biased exponents); the
     * scale is 2^ceil(log2(max(amax, 1e-4) / 448)), values clamped to +-448
     * and rounded to nearest even. d % b == 0. dequant: y = e4m3 * scale. */
    td_status_t (*quant_fp8)(const float *x, size_t n, size_t d, size_t b,
                             uint8_t *codes, uint8_t *scales);
    td_status_t (*dequant_fp8)(const uint8_t *codes, const uint8_t *scales,
                               size_t n, size_t d, size_t b, float *y);
    /* fp4 e2m1 with one scale per block of b channels: x [n, d] -> packed
     * [n, d / 2] (channel 2i in the low nibble), scales [n, d / b]. e4m3:
     * scale = e4m3(max(amax, 6 * 2^-9) / 6) (e4m3 codes); else ue8m0 2^ceil(
     * log2(max(amax, 6 * 2^-126) / 6)) (biased exponents). d % b == 0, b even. */
    td_status_t (*quant_fp4)(const float *x, size_t n, size_t d, size_t b,
                             int e4m3_scales, uint8_t *packed, uint8_t *scales);
    td_status_t (*dequant_fp4)(const uint8_t *packed, const uint8_t *scales,
                               size_t n, size_t d, size_t b, int e4m3_scales,
                               float *y);

    /* SwiGLU with the training clamps: out = silu(min(g, limit)) *
     * clamp(u, -limit, limit) (no clamp when limit <= 0), times w[r] when w
     * is not NULL. g, u, out [n, f], w [n]; out may be g or u. */
    td_status_t (*swiglu)(const float *g, const float *u, const float *w,
                          size_t n, size_t f, float limit, float *out);
    /* Router scores in place: x [n, e] -> fn(x / temp). */
    td_status_t (*score)(float *x, size_t n, size_t e, td_kernels_score_t fn,
                         float temp);
    /* The MoE router in one op, per token r: scores = fn(logits / temp) in
     * place (logits [n, e]); the k experts of the largest scores + bias[e]
     * (topk's ties); their weights, the unbiased scores, divided by their
     * sum + 1e-20 when norm and k > 1, times scale; experts [n, k] and
     * weights [n, k] in ascending expert id. ws: [n, e] floats and [n, k]
     * int64 of workspace (td_kernels_route_ws_bytes). */
    td_status_t (*route)(float *logits, const float *bias, size_t n, size_t e, size_t k,
                         td_kernels_score_t fn, float temp, int norm, float scale,
                         void *ws, int32_t *experts, float *weights);
    /* The k largest of each row of x [n, m] -> idx [n, k], largest first;
     * equal values go lowest index first (NaN counts as the largest), so
     * the choice does not depend on the row's width. torch.topk agrees
     * wherever no tie straddles the k-th place (docs/forward.md).
     * 1 <= k <= m. */
    td_status_t (*topk)(const float *x, size_t n, size_t m, size_t k, int64_t *idx);

    /* Hyper-connection coefficients from the mix projections: mixes [n,
     * (2 + hc) * hc], scale [3], base [(2 + hc) * hc] -> pre [n, hc] =
     * sigmoid(..) + eps, post [n, hc] = 2 sigmoid(..), comb [n, hc, hc] =
     * softmax rows + eps, then column / row normalizations (iters in all). */
    td_status_t (*hc_mixes)(const float *mixes, const float *scale, const float *base,
                            size_t n, size_t hc, int iters, float eps,
                            float *pre, float *post, float *comb);
    /* out[r] = sum_j pre[r, j] * s[r, j]: s [n, hc, d], pre [n, hc], out [n, d]. */
    td_status_t (*hc_collapse)(const float *s, const float *pre, size_t n,
                               size_t hc, size_t d, float *out);
    /* out[r, k] = post[r, k] * x[r] + sum_j comb[r, j, k] * res[r, j]:
     * x [n, d], res, out [n, hc, d] (distinct), post [n, hc], comb [n, hc, hc]. */
    td_status_t (*hc_expand)(const float *x, const float *res, const float *post,
                             const float *comb, size_t n, size_t hc, size_t d,
                             float *out);
    /* Engram injection in place: s [n, hc, d] += gate[r, j] * value[r] with
     * gate = sigmoid(signed sqrt(max(|dot|, 1e-6))), dot = sum(s * qk * key)
     * * rsqrt(mean(s^2) + eps) * rsqrt(mean(key^2) + eps) / sqrt(d) per
     * (token, stream): key [n, hc, d], value [n, d], qk [hc, d]. */
    td_status_t (*engram_mix)(float *s, const float *key, const float *value,
                              const float *qk, size_t n, size_t hc, size_t d,
                              float eps);
    /* Softmax-gated pooling: kv, gate [g, r, d] -> out [g, d] = sum_i kv_i *
     * softmax_i(gate) per channel. */
    td_status_t (*gate_pool)(const float *kv, const float *gate, size_t g,
                             size_t r, size_t d, float *out);
    /* Indexer scores: out[r, t] = sum_j relu(q[r, j] . k[t]) * scale * w[r, j]:
     * q [n, h, d], k [t, d], w [n, h], out [n, t]. */
    td_status_t (*index_scores)(const float *q, const float *k, const float *w,
                                size_t n, size_t h, size_t t, size_t d, float scale,
                                float *out);
    /* y[i] += x[i], n floats. */
    td_status_t (*add)(float *y, const float *x, size_t n);
} td_kernels_ops_t;

/* Workspace bytes of route for n tokens, e experts, k chosen. */
static inline size_t
td_kernels_route_ws_bytes(size_t n, size_t e, size_t k)
{
    return (n * e * sizeof(float) + 7) / 8 * 8 + n * k * sizeof(int64_t);
}

/* The cpu compute ops; never NULL. */
const td_kernels_ops_t *td_kernels_cpu_ops(void);

/* ---- cpu threads ------------------------------------------------------------
 * The cpu ops split their work into parallel loops that run on a pool of
 * threads: the pool the calling thread is bound to, else the process's
 * default pool. Results do not depend on the pool or its size: every output
 * element is computed by one thread, in an order fixed by the shapes alone.
 * A pool runs one loop at a time; a loop that finds its pool busy (another
 * thread bound to it is running one) or is started inside a task runs its
 * tasks one by one in the caller. Threads bound to different pools (a
 * process's ranks, each with its own pool) run their loops side by side.
 * Workers start on a pool's first loop and spin briefly between loops before
 * they sleep. */
typedef struct td_kernels_cpu_pool td_kernels_cpu_pool_t;

/* Threads of the default pool, the calling thread included: n in 1 .. 256
 * (TD_ERR_RANGE otherwise). Before any call, $TD_CPU_THREADS or else the
 * online CPUs. */
td_status_t td_kernels_cpu_set_threads(unsigned n);
/* Threads of the calling thread's pool (bound, else the default one). */
unsigned td_kernels_cpu_threads(void);

/* A pool of nthreads threads (1 .. 256), the calling thread of each loop
 * included, so nthreads - 1 workers. The caller owns it; destroy it after
 * every thread bound to it has stopped using it (destroy joins the workers;
 * the destroying thread's own binding to it is undone). */
td_status_t td_kernels_cpu_pool_create(unsigned nthreads, td_kernels_cpu_pool_t **out);
void td_kernels_cpu_pool_destroy(td_kernels_cpu_pool_t *p);
/* Bind the calling thread to p (NULL: the default pool): its ops' loops run
 * there from now on. Returns the previous binding. */
td_kernels_cpu_pool_t *td_kernels_cpu_pool_bind(td_kernels_cpu_pool_t *p);
unsigned td_kernels_cpu_pool_threads(const td_kernels_cpu_pool_t *p);

/* Run fn(arg, i) for every i in [0, n) on the calling thread's pool (the
 * caller included) and return when all are done: host work of any backend,
 * e.g. the requests of one pass. Tasks run in any order on any thread, so
 * each must write only what no other task touches. */
typedef void (*td_kernels_task_fn)(void *arg, size_t i);
void td_kernels_cpu_parallel(size_t n, td_kernels_task_fn fn, void *arg);

/* ---- for backends ---------------------------------------------------- */

/* The one way a kernel reports a failure: logs "kernels: " and the message
 * (e.g. "kv_pack: table[3] = 17 >= nblocks 16") once, at error level, where
 * the failure is decided, and returns st. */
td_status_t td_kernels_fail(td_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The checks every backend runs first (see td_kernels_t); op names the op
 * in the message. buf is the contiguous buffer (read or written). */
td_status_t td_kernels_kv_check(const char *op, const td_kernels_pool_t *pool,
                                const uint32_t *table, size_t ntable,
                                const td_kernels_span_t *span, const void *buf);

#ifdef __cplusplus
}
#endif

#endif
