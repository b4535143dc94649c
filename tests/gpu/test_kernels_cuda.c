/* tests/gpu/test_kernels_cuda.c — every CUDA op against the CPU backend on
 * random inputs (byte-exact), then GB/s of KV pack/unpack (cudaEvent timing).
 * Needs a GPU; without one it says so and fails. Last line: "N passed, N failed".
 * Built against the SIMT emulation (kernels/cuda/emu) it runs the same
 * checks on the host on smaller sizes, and times nothing. */
#include "kernels.h"
#include "rng.h"
#include "status.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#ifdef TD_SIMT_EMU
/* Under the emulation: blocks up to 64 KiB, 40 random cases, 1 MiB of busy work. */
#define KV_BIG (64 * 1024)
#define KV_RANDOM 40
#define KV_BUSY (1u << 20)
#define KV_NAME "cuda-emu"
#else
#define KV_BIG (1 << 20)
#define KV_RANDOM 200
#define KV_BUSY (256u << 20)
#define KV_NAME "cuda"
#endif

static void
expect(int ok, const char *what)
{
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "FAIL: %s\n", what);   /* a failed op logged why */
    }
}

/* A CUDA runtime call the test itself makes; failing ones end the test. */
#define CUDA_OK(call)                                                         \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) {                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,     \
                    cudaGetErrorString(e_));                                  \
            printf("%d passed, %d failed\n", passed, failed + 1);             \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static td_rng_t rng = { .state = 0x2545f4914f6cdd1dull };

static void
fill(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)td_rng_next(&rng);
}

static void
shuffle(uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ids[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t k = (uint32_t)(td_rng_next(&rng) % i), t = ids[i - 1];
        ids[i - 1] = ids[k];
        ids[k] = t;
    }
}

/* ---- correctness: cuda == cpu ----------------------------------------- */

typedef struct {
    size_t block_bytes;
    uint32_t nblocks;
    td_kernels_span_t span;
    size_t buf_shift;   /* buffer address offset, to hit every copy width */
} kv_case_t;

/* A random geometry: block sizes from 1 B to 1 MiB, entries of 1 B to a
 * block, any offset, first and count inside the table, a misaligned buffer. */
static kv_case_t
random_case(void)
{
    static const size_t sizes[] = { 1, 3, 16, 100, 4096, 37376, 65536, KV_BIG };
    kv_case_t c;
    c.block_bytes = sizes[td_rng_next(&rng) % (sizeof(sizes) / sizeof(sizes[0]))];
    c.nblocks = (uint32_t)(1 + td_rng_next(&rng) % (c.block_bytes >= 65536 ? 8 : 64));
    size_t eb = td_rng_next(&rng) % 2 ? (size_t)1 << (td_rng_next(&rng) % 5) : 1 + td_rng_next(&rng) % c.block_bytes;
    if (eb > c.block_bytes)
        eb = c.block_bytes;
    size_t epb_max = c.block_bytes / eb;
    c.span.entry_bytes = eb;
    c.span.entries_per_block = 1 + td_rng_next(&rng) % epb_max;
    c.span.offset = td_rng_next(&rng) % (c.block_bytes - c.span.entries_per_block * eb + 1);
    uint64_t total = (uint64_t)c.nblocks * c.span.entries_per_block;
    c.span.first = td_rng_next(&rng) % total;
    c.span.count = td_rng_next(&rng) % (total - c.span.first + 1);
    c.buf_shift = td_rng_next(&rng) % 16;
    return c;
}

static void
describe(char *what, size_t size, const char *name, const char *op, const kv_case_t *c)
{
    snprintf(what, size, "%s: %s bb=%zu nb=%u eb=%zu epb=%zu off=%zu first=%llu "
             "count=%llu shift=%zu", name, op, c->block_bytes, c->nblocks,
             c->span.entry_bytes, c->span.entries_per_block, c->span.offset,
             (unsigned long long)c->span.first, (unsigned long long)c->span.count,
             c->buf_shift);
}

/* Run one case on both backends from the same pool and buffer: the packed
 * buffers and the unpacked pools must be identical. */
static void
check_case(const td_kernels_t *gpu, const kv_case_t *c, const char *name)
{
    const td_kernels_t *cpu = td_kernels_cpu();
    const td_kernels_span_t *s = &c->span;
    size_t total = c->block_bytes * c->nblocks;
    size_t len = (size_t)s->count * s->entry_bytes;
    unsigned char *hpool = malloc(total), *hbuf = malloc(len + 1);
    unsigned char *gpool_back = malloc(total), *gbuf_back = malloc(len + 1);
    uint32_t *table = malloc(c->nblocks * sizeof(*table));
    unsigned char *dpool, *dbuf_alloc;
    char what[160];

    shuffle(table, c->nblocks);
    fill(hpool, total);
    CUDA_OK(cudaMalloc((void **)&dpool, total));
    CUDA_OK(cudaMalloc((void **)&dbuf_alloc, len + 16));
    unsigned char *dbuf = dbuf_alloc + c->buf_shift;
    CUDA_OK(cudaMemcpy(dpool, hpool, total, cudaMemcpyHostToDevice));
    td_kernels_pool_t hp = { hpool, c->nblocks, c->block_bytes };
    td_kernels_pool_t dp = { dpool, c->nblocks, c->block_bytes };

    describe(what, sizeof(what), name, "pack", c);
    td_status_t st = gpu->kv_pack(&dp, table, c->nblocks, s, dbuf, NULL);
    if (st == TD_OK)
        st = gpu->sync(NULL);
    expect(st == TD_OK && cpu->kv_pack(&hp, table, c->nblocks, s, hbuf, NULL) == TD_OK,
           what);
    CUDA_OK(cudaMemcpy(gbuf_back, dbuf, len, cudaMemcpyDeviceToHost));
    expect(memcmp(gbuf_back, hbuf, len) == 0, what);

    describe(what, sizeof(what), name, "unpack", c);
    fill(hbuf, len);
    CUDA_OK(cudaMemcpy(dbuf, hbuf, len, cudaMemcpyHostToDevice));
    st = gpu->kv_unpack(&dp, table, c->nblocks, s, dbuf, NULL);
    if (st == TD_OK)
        st = gpu->sync(NULL);
    expect(st == TD_OK && cpu->kv_unpack(&hp, table, c->nblocks, s, hbuf, NULL) == TD_OK,
           what);
    CUDA_OK(cudaMemcpy(gpool_back, dpool, total, cudaMemcpyDeviceToHost));
    expect(memcmp(gpool_back, hpool, total) == 0, what);

    CUDA_OK(cudaFree(dbuf_alloc));
    CUDA_OK(cudaFree(dpool));
    free(table);
    free(gbuf_back);
    free(gpool_back);
    free(hbuf);
    free(hpool);
}

/* An out-of-range id: TD_ERR_RANGE from the host check, device memory untouched. */
static void
check_reject(const td_kernels_t *gpu)
{
    enum { BB = 4096, NB = 8 };
    unsigned char *h = malloc(BB * NB), *back = malloc(BB * NB), *dpool, *dbuf;
    uint32_t table[3] = { 2, 5, NB };
    td_kernels_span_t s = td_kernels_span_bytes(BB, 3 * BB);

    fill(h, BB * NB);
    CUDA_OK(cudaMalloc((void **)&dpool, BB * NB));
    CUDA_OK(cudaMalloc((void **)&dbuf, 3 * BB));
    CUDA_OK(cudaMemcpy(dpool, h, BB * NB, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dbuf, 0xa5, 3 * BB));
    td_kernels_pool_t dp = { dpool, NB, BB };
    expect(gpu->kv_pack(&dp, table, 3, &s, dbuf, NULL) == TD_ERR_RANGE,
           "pack with id >= nblocks is rejected");
    expect(gpu->kv_unpack(&dp, table, 3, &s, dbuf, NULL) == TD_ERR_RANGE,
           "unpack with id >= nblocks is rejected");
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(back, dpool, BB * NB, cudaMemcpyDeviceToHost));
    expect(memcmp(back, h, BB * NB) == 0, "rejected unpack wrote nothing");
    CUDA_OK(cudaMemcpy(back, dbuf, 3 * BB, cudaMemcpyDeviceToHost));
    int untouched = 1;
    for (size_t i = 0; i < 3 * BB; i++)
        untouched &= back[i] == 0xa5;
    expect(untouched, "rejected pack wrote nothing");
    CUDA_OK(cudaFree(dbuf));
    CUDA_OK(cudaFree(dpool));
    free(back);
    free(h);
}

/* The table is read before the op returns: with the stream held busy by
 * earlier work, overwrite the caller's table (a different valid permutation)
 * right after the op returns and before sync; the result must follow the
 * original table. A pinned table is the case an asynchronous upload would get
 * wrong; 40 ids fit one launch, 2500 take several. */
static void
check_table_reuse_case(const td_kernels_t *gpu, unsigned char *dbusy, size_t busy,
                       int pinned, uint32_t n, int pack)
{
    enum { BB = 256 };
    const td_kernels_t *cpu = td_kernels_cpu();
    td_kernels_span_t s = td_kernels_span_bytes(BB, (uint64_t)n * BB - 7);
    size_t total = (size_t)n * BB, len = (size_t)s.count;
    unsigned char *hpool = malloc(total), *hbuf = malloc(len);
    unsigned char *back = malloc(total), *dpool, *dbuf;
    uint32_t *orig = malloc(n * sizeof(*orig)), *table;
    char what[96];

    if (pinned)
        CUDA_OK(cudaHostAlloc((void **)&table, n * sizeof(*table), cudaHostAllocDefault));
    else
        table = malloc(n * sizeof(*table));
    shuffle(orig, n);
    memcpy(table, orig, n * sizeof(*table));
    fill(hpool, total);
    fill(hbuf, len);
    CUDA_OK(cudaMalloc((void **)&dpool, total));
    CUDA_OK(cudaMalloc((void **)&dbuf, len));
    CUDA_OK(cudaMemcpy(dpool, hpool, total, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dbuf, hbuf, len, cudaMemcpyHostToDevice));
    td_kernels_pool_t hp = { hpool, n, BB }, dp = { dpool, n, BB };

    for (int i = 0; i < 4; i++)  /* ~1 GiB of memset ahead of the op */
        CUDA_OK(cudaMemsetAsync(dbusy, i, busy, NULL));
    td_status_t st = pack ? gpu->kv_pack(&dp, table, n, &s, dbuf, NULL)
                          : gpu->kv_unpack(&dp, table, n, &s, dbuf, NULL);
    for (uint32_t i = 0; i < n; i++)
        table[i] = orig[(i + 1) % n];
    cudaError_t busy_left = cudaStreamQuery(NULL);
    (void)cudaGetLastError();  /* NotReady is no error; leave none behind */
    if (st == TD_OK)
        st = gpu->sync(NULL);
    snprintf(what, sizeof(what), "%s with a %s table of %u ids reused after return",
             pack ? "pack" : "unpack", pinned ? "pinned" : "pageable", n);
    expect(st == TD_OK && (pack ? cpu->kv_pack(&hp, orig, n, &s, hbuf, NULL)
                                : cpu->kv_unpack(&hp, orig, n, &s, hbuf, NULL)) == TD_OK,
           what);
    if (pack)
        CUDA_OK(cudaMemcpy(back, dbuf, len, cudaMemcpyDeviceToHost));
    else
        CUDA_OK(cudaMemcpy(back, dpool, total, cudaMemcpyDeviceToHost));
    expect(memcmp(back, pack ? hbuf : hpool, pack ? len : total) == 0, what);
    if (busy_left != cudaErrorNotReady)  /* the test proves nothing then */
        fprintf(stderr, "warning: %s: the stream was idle before the table was "
                "overwritten\n", what);

    CUDA_OK(cudaFree(dbuf));
    CUDA_OK(cudaFree(dpool));
    if (pinned)
        CUDA_OK(cudaFreeHost(table));
    else
        free(table);
    free(orig);
    free(back);
    free(hbuf);
    free(hpool);
}

static void
check_table_reuse(const td_kernels_t *gpu)
{
    static const uint32_t sizes[] = { 40, 2500 };
    size_t busy = KV_BUSY;
    unsigned char *dbusy;

    CUDA_OK(cudaMalloc((void **)&dbusy, busy));
    for (int pinned = 0; pinned < 2; pinned++)
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            for (int pack = 0; pack < 2; pack++)
                check_table_reuse_case(gpu, dbusy, busy, pinned, sizes[i], pack);
    CUDA_OK(cudaFree(dbusy));
}

/* ---- throughput --------------------------------------------------------- */

/* GB/s of payload (bytes moved, each read once and written once) for pack
 * and unpack of a whole pool in shuffled block order. */
static void
bench(const td_kernels_t *gpu, const char *name, size_t block_bytes,
      uint32_t nblocks, td_kernels_span_t span)
{
    enum { ITERS = 20 };
    size_t total = block_bytes * nblocks;
    size_t len = (size_t)span.count * span.entry_bytes;
    uint32_t *table = malloc(nblocks * sizeof(*table));
    unsigned char *dpool, *dbuf;
    cudaEvent_t t0, t1;
    float ms[2];

    shuffle(table, nblocks);
    CUDA_OK(cudaMalloc((void **)&dpool, total));
    CUDA_OK(cudaMalloc((void **)&dbuf, len));
    CUDA_OK(cudaMemset(dpool, 1, total));
    CUDA_OK(cudaEventCreate(&t0));
    CUDA_OK(cudaEventCreate(&t1));
    td_kernels_pool_t dp = { dpool, nblocks, block_bytes };
    for (int unpack = 0; unpack < 2; unpack++) {
        td_status_t st = TD_OK;
        for (int i = 0; i < ITERS + 1 && st == TD_OK; i++) {  /* first one warms up */
            if (i == 1)
                CUDA_OK(cudaEventRecord(t0, NULL));
            st = unpack ? gpu->kv_unpack(&dp, table, nblocks, &span, dbuf, NULL)
                        : gpu->kv_pack(&dp, table, nblocks, &span, dbuf, NULL);
        }
        CUDA_OK(cudaEventRecord(t1, NULL));
        CUDA_OK(cudaEventSynchronize(t1));
        CUDA_OK(cudaEventElapsedTime(&ms[unpack], t0, t1));
        expect(st == TD_OK, name);
    }
    printf("bench %-34s %8.1f MiB  pack %7.1f GB/s  unpack %7.1f GB/s\n", name,
           len / 1048576.0, len * (double)ITERS / (ms[0] * 1e6),
           len * (double)ITERS / (ms[1] * 1e6));
    CUDA_OK(cudaEventDestroy(t1));
    CUDA_OK(cudaEventDestroy(t0));
    CUDA_OK(cudaFree(dbuf));
    CUDA_OK(cudaFree(dpool));
    free(table);
}

/* Exit status of a test that cannot run here (meson's SKIP). */
#define SKIP_STATUS 77

int
main(int argc, char **argv)
{
    const td_kernels_t *gpu;
    td_status_t st = td_kernels_cuda(&gpu);
    /* --skip-without-device: the meson test (suite "gpu") on a machine
     * without a GPU is a skip; tests/gpu/run, meant for a GPU machine,
     * fails instead. */
    int skip = argc > 1 && strcmp(argv[1], "--skip-without-device") == 0;

    if (st != TD_OK) {
        fprintf(stderr, "test_kernels_cuda: no usable CUDA device (%s; the reason is "
                "logged above)%s\n", td_status_str(st), skip ? ": SKIP" : "");
        if (skip)
            return SKIP_STATUS;
        printf("0 passed, 1 failed\n");
        return 1;
    }
    int dev;
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaGetDeviceProperties(&prop, dev));
    printf("device %d: %s, sm_%d%d, %.1f GiB\n", dev, prop.name, prop.major,
           prop.minor, prop.totalGlobalMem / 1073741824.0);
    expect(strcmp(gpu->name, KV_NAME) == 0, "backend name");

    static const struct { const char *name; kv_case_t c; } fixed[] = {
        { "empty", { 64, 4, { 1, 64, 0, 0, 0 }, 0 } },
        { "1 B blocks", { 1, 64, { 1, 1, 0, 0, 50 }, 3 } },
        { "4 KiB, partial last", { 4096, 16, { 1, 4096, 0, 0, 5 * 4096 + 17 }, 0 } },
        { "big blocks, partial last", { KV_BIG, 4, { 1, KV_BIG, 0, 0, 3 * KV_BIG + 5 }, 8 } },
        { "strided v4.1 kv", { 64 * 584, 24, { 584, 64, 0, 0, 1000 }, 0 } },
        { "strided, layer 1 of 3", { 64, 8, { 5, 4, 20, 6, 9 }, 1 } },
        { "decode append", { 64 * 584, 24, { 584, 64, 0, 500, 1 }, 0 } },
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        check_case(gpu, &fixed[i].c, fixed[i].name);
    for (int i = 0; i < KV_RANDOM; i++) {
        kv_case_t c = random_case();
        check_case(gpu, &c, "random");
    }
    check_reject(gpu);
    check_table_reuse(gpu);
#ifdef TD_SIMT_EMU
    printf("no timing under the emulation\n");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
#endif

    enum { KiB = 1024, MiB = 1024 * 1024 };
    bench(gpu, "4 KiB blocks x 16384", 4 * KiB, 16384, td_kernels_span_bytes(4 * KiB, 64ull * MiB));
    bench(gpu, "64 KiB blocks x 1024", 64 * KiB, 1024, td_kernels_span_bytes(64 * KiB, 64ull * MiB));
    bench(gpu, "1 MiB blocks x 256", MiB, 256, td_kernels_span_bytes(MiB, 256ull * MiB));
    td_kernels_span_t v41 = { 584, 64, 0, 0, 64ull * 2048 };
    bench(gpu, "v4.1 kv 584 B x 64 x 2048 blocks", 64 * 584, 2048, v41);
    td_kernels_span_t layer = { 512, 64, 512 * 64 * 3, 0, 64ull * 2048 };
    bench(gpu, "strided layer 3 of 8 (512 B)", 8 * 64 * 512, 2048, layer);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
