/* tests/unit/test_kernels_cpu.c — the CPU backend's KV pack/unpack against a
 * byte-by-byte reference: block sizes 1 B .. 1 MiB, random block tables,
 * partial blocks, strided spans, and rejected arguments that write nothing;
 * compute pools: two threads bound to their own pools run loops side by side
 * and get the results they get alone; a routed expert (linear_mat, swiglu,
 * linear_mat) gives a row the same bits in a batch of any size as alone,
 * which expert parallelism's bit-exactness rests on. */
#include "check.h"
#include "kernels.h"
#include "numfmt.h"
#include "logcap.h"
#include "rng.h"
#include "status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

static td_rng_t rng = { .state = TD_RNG_GAMMA };

static void
fill(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)td_rng_next(&rng);
}

/* ntable distinct random ids out of nblocks (a shuffled prefix). */
static uint32_t *
random_table(uint32_t nblocks, size_t ntable)
{
    uint32_t *ids = malloc(nblocks * sizeof(*ids));
    for (uint32_t i = 0; i < nblocks; i++)
        ids[i] = i;
    for (uint32_t i = 0; i < nblocks && i < ntable; i++) {
        uint32_t k = i + (uint32_t)(td_rng_next(&rng) % (nblocks - i));
        uint32_t t = ids[i];
        ids[i] = ids[k];
        ids[k] = t;
    }
    return ids;
}

/* The reference: where byte i of the contiguous buffer lives in the pool. */
static size_t
ref_addr(const td_kernels_pool_t *pool, const uint32_t *table,
         const td_kernels_span_t *s, size_t i)
{
    uint64_t e = s->first + i / s->entry_bytes;
    return (size_t)table[e / s->entries_per_block] * pool->block_bytes + s->offset +
           (size_t)(e % s->entries_per_block) * s->entry_bytes + i % s->entry_bytes;
}

typedef struct {
    const char *name;
    size_t block_bytes;
    uint32_t nblocks;
    td_kernels_span_t span;   /* entries_per_block 0: plain, count = bytes */
} kv_case_t;

/* Pack from a random pool, unpack a random buffer into another pool, and
 * round-trip; compare every byte with the reference, both ways. */
static void
check_case(const kv_case_t *c)
{
    const td_kernels_t *k = td_kernels_cpu();
    td_kernels_span_t s = c->span.entries_per_block
                              ? c->span
                              : td_kernels_span_bytes(c->block_bytes, c->span.count);
    size_t total = c->block_bytes * c->nblocks;
    size_t len = (size_t)s.count * s.entry_bytes;
    size_t ntable = s.count ? (size_t)((s.first + s.count - 1) / s.entries_per_block + 1) : 0;
    unsigned char *base = malloc(total), *copy = malloc(total);
    unsigned char *buf = malloc(len + 1), *back = malloc(len + 1);
    uint32_t *table = random_table(c->nblocks, ntable);
    td_kernels_pool_t pool = { base, c->nblocks, c->block_bytes };
    size_t bad = 0;

    fill(base, total);
    memcpy(copy, base, total);
    fill(buf, len + 1);
    unsigned char guard = buf[len];
    CHECK_STATUS(k->kv_pack(&pool, table, ntable, &s, buf, NULL), TD_OK);
    for (size_t i = 0; i < len; i++)
        bad += buf[i] != base[ref_addr(&pool, table, &s, i)];
    CHECK(buf[len] == guard);
    CHECK(memcmp(base, copy, total) == 0);

    fill(buf, len);
    CHECK_STATUS(k->kv_unpack(&pool, table, ntable, &s, buf, NULL), TD_OK);
    for (size_t i = 0; i < len; i++) {
        size_t a = ref_addr(&pool, table, &s, i);
        bad += base[a] != buf[i];
        copy[a] = buf[i];  /* copy becomes the expected pool */
    }
    CHECK(memcmp(base, copy, total) == 0);  /* nothing outside the span moved */

    CHECK_STATUS(k->kv_pack(&pool, table, ntable, &s, back, NULL), TD_OK);
    CHECK(memcmp(back, buf, len) == 0);

    if (bad)
        fprintf(stderr, "case %s: %zu bytes differ from the reference\n", c->name, bad);
    CHECK_EQ_INT(bad, 0);
    free(table);
    free(back);
    free(buf);
    free(copy);
    free(base);
}

/* Bad arguments: the expected status, and neither buffer nor pool written.
 * Pools and buffers near the top of the address space are fake addresses:
 * the check rejects them before any byte moves (an overflowing overlap test
 * would let them through to the copy, which crashes). */
static void
check_rejects(void)
{
    const td_kernels_t *k = td_kernels_cpu();
    enum { BB = 64, NB = 8 };
    static unsigned char base[BB * NB], copy[BB * NB];
    unsigned char buf[4 * BB], bufcopy[4 * BB];
    td_kernels_pool_t pool = { base, NB, BB };
    td_kernels_span_t plain = td_kernels_span_bytes(BB, 3 * BB + 5);
    size_t plain_len = 3 * BB + 5;
    uint32_t good[4] = { 5, 1, 7, 2 };
    uint32_t low[4] = { 3, 1, 0, 2 };            /* for pools of 4 blocks */
    uint32_t last_bad[4] = { 5, 1, 7, NB };      /* bad id in the last block used */
    uint32_t first_bad[4] = { UINT32_MAX, 1, 7, 2 };
    /* pools of 4 blocks around buf = base: right after it, on its last byte */
    td_kernels_pool_t after = { base + plain_len, 4, BB };
    td_kernels_pool_t on_last = { base + plain_len - 1, 4, BB };
    /* fake pools: ending at the top of the address space, BB below it, past it */
    uintptr_t top = UINTPTR_MAX - NB * BB + 1, below = top - BB;
    td_kernels_pool_t at_top = { (void *)top, NB, BB };
    td_kernels_pool_t below_top = { (void *)below, NB, BB };
    td_kernels_pool_t wrapping = { (void *)(UINTPTR_MAX - BB + 1), NB, BB };
    struct {
        const char *name;
        const td_kernels_pool_t *pool;
        const uint32_t *table;
        size_t ntable;
        td_kernels_span_t span;
        void *buf;
        td_status_t want;
        const char *msg;  /* expected in the one error line logged */
    } cases[] = {
        { "last id out of range", &pool, last_bad, 4, plain, buf, TD_ERR_RANGE, "table[3] = 8 >= nblocks 8" },
        { "first id out of range", &pool, first_bad, 4, plain, buf, TD_ERR_RANGE, "table[0]" },
        { "table too short", &pool, good, 3, plain, buf, TD_ERR_RANGE, "span needs 4" },
        { "zero entry bytes", &pool, good, 4, { 0, 4, 0, 0, 4 }, buf, TD_ERR_INVALID, "entry_bytes 0" },
        { "zero entries per block", &pool, good, 4, { 4, 0, 0, 0, 4 }, buf, TD_ERR_INVALID, "entries_per_block 0" },
        { "span wider than block", &pool, good, 4, { 8, 8, 1, 0, 4 }, buf, TD_ERR_INVALID, "exceeds block_bytes" },
        { "offset past block", &pool, good, 4, { 1, 1, BB + 1, 0, 4 }, buf, TD_ERR_INVALID, "exceeds block_bytes" },
        { "entry count overflows", &pool, good, 4, { 2, 32, 0, UINT64_MAX - 2, 4 }, buf, TD_ERR_RANGE, "overflows" },
        { "null buffer", &pool, good, 4, plain, NULL, TD_ERR_INVALID, "NULL" },
        { "null table", &pool, NULL, 4, plain, buf, TD_ERR_INVALID, "NULL" },
        { "buffer inside pool", &pool, good, 4, td_kernels_span_bytes(BB, 8), base + 3 * BB, TD_ERR_INVALID, "overlaps" },
        { "buffer's last byte on the pool's first", &on_last, low, 4, plain, base, TD_ERR_INVALID, "overlaps" },
        { "pool ending at the top, buffer inside", &at_top, good, 4, plain, (void *)(top + BB), TD_ERR_INVALID, "overlaps" },
        { "buffer ending at the top, pool below", &below_top, good, 4, plain,
          (void *)(UINTPTR_MAX - plain_len + 1), TD_ERR_INVALID, "overlaps" },
        { "buffer past the top", &pool, good, 4, plain, (void *)(UINTPTR_MAX - 10), TD_ERR_INVALID, "buffer wraps" },
        { "pool past the top", &wrapping, good, 4, plain, buf, TD_ERR_INVALID, "pool wraps" },
        { "buffer right before the pool", &after, low, 4, plain, base, TD_OK, NULL },
        { "empty span", &pool, NULL, 0, td_kernels_span_bytes(BB, 0), NULL, TD_OK, NULL },
        { "ids past the span unchecked", &pool, last_bad, 4, td_kernels_span_bytes(BB, 3 * BB), buf, TD_OK, NULL },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int pack = 0; pack < 2; pack++) {
            fill(base, sizeof(base));
            memcpy(copy, base, sizeof(base));
            fill(buf, sizeof(buf));
            memcpy(bufcopy, buf, sizeof(buf));
            td_logcap_start();
            td_status_t st = pack ? k->kv_pack(cases[i].pool, cases[i].table, cases[i].ntable,
                                               &cases[i].span, cases[i].buf, NULL)
                                  : k->kv_unpack(cases[i].pool, cases[i].table, cases[i].ntable,
                                                 &cases[i].span, cases[i].buf, NULL);
            td_logcap_stop();
            if (st != cases[i].want)
                fprintf(stderr, "reject case %s (%s): %s\n", cases[i].name,
                        pack ? "pack" : "unpack", td_logcap.last);
            CHECK_STATUS(st, cases[i].want);
            CHECK_EQ_INT(td_logcap.errors, cases[i].want == TD_OK ? 0 : 1);
            if (cases[i].want == TD_OK)
                continue;
            CHECK(strstr(td_logcap.last, pack ? "kv_pack: " : "kv_unpack: ") != NULL);
            CHECK(strstr(td_logcap.last, cases[i].msg) != NULL);
            CHECK(memcmp(base, copy, sizeof(base)) == 0);
            CHECK(memcmp(buf, bufcopy, sizeof(buf)) == 0);
        }
    }
}

/* ---- compute pools ------------------------------------------------------------- */

/* Wait (up to 5 s) until *v >= want; 0 on time out. */
static int
wait_at_least(_Atomic int *v, int want)
{
    uint64_t t0 = td_clock_ns();
    while (atomic_load(v) < want) {
        if (td_clock_ns() - t0 > 5000000000ull)
            return 0;
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* Two loops at once: A's tasks meet (two of its threads inside) and A's
 * first task waits for B's whole loop, whose tasks meet too. On one shared
 * pool B's loop would find the pool busy and run its tasks one by one in
 * its caller, and its tasks could never meet. */
static struct {
    _Atomic int a_in, b_in, b_done, timeouts;
} side;

static void
side_a_task(void *arg, size_t i)
{
    (void)arg;
    atomic_fetch_add(&side.a_in, 1);
    if (!wait_at_least(&side.a_in, 2))
        atomic_fetch_add(&side.timeouts, 1);
    if (i == 0 && !wait_at_least(&side.b_done, 1))
        atomic_fetch_add(&side.timeouts, 1);
}

static void
side_b_task(void *arg, size_t i)
{
    (void)arg;
    (void)i;
    atomic_fetch_add(&side.b_in, 1);
    if (!wait_at_least(&side.b_in, 2))
        atomic_fetch_add(&side.timeouts, 1);
}

static void *
side_a(void *arg)
{
    td_kernels_cpu_pool_bind(arg);
    td_kernels_cpu_parallel(2, side_a_task, NULL);
    return NULL;
}

static void *
side_b(void *arg)
{
    td_kernels_cpu_pool_bind(arg);
    if (!wait_at_least(&side.a_in, 2))   /* A's loop is running */
        atomic_fetch_add(&side.timeouts, 1);
    td_kernels_cpu_parallel(2, side_b_task, NULL);
    atomic_store(&side.b_done, 1);
    return NULL;
}

/* A linear big enough to split, run again and again on a pool. */
typedef struct {
    td_kernels_cpu_pool_t *pool;
    const td_kernels_mat_t *w;
    const float *x;
    const float *want;
    size_t m, n;
    int rounds, differ, threads_ok;
} lin_job_t;

static void *
lin_run(void *arg)
{
    lin_job_t *j = arg;
    float *y = malloc(j->m * j->n * sizeof(float));

    td_kernels_cpu_pool_bind(j->pool);
    j->threads_ok = td_kernels_cpu_threads() == td_kernels_cpu_pool_threads(j->pool);
    for (int r = 0; r < j->rounds; r++) {
        if (td_kernels_cpu_ops()->linear_mat(j->x, j->w, y, j->m) != TD_OK ||
            memcmp(y, j->want, j->m * j->n * sizeof(float)) != 0)
            j->differ++;
    }
    free(y);
    return NULL;
}

static void
test_pools(void)
{
    const td_kernels_ops_t *k = td_kernels_cpu_ops();
    td_kernels_cpu_pool_t *pa = NULL, *pb = NULL, *was;
    pthread_t ta, tb;
    enum { M = 40, N = 304, KD = 256 };
    float *w = malloc((size_t)N * KD * sizeof(float)), *x = malloc((size_t)M * KD * sizeof(float));
    float *want = malloc((size_t)M * N * sizeof(float));
    td_kernels_mat_t *mat = NULL;

    td_logcap_start();
    CHECK_STATUS(td_kernels_cpu_pool_create(0, &pa), TD_ERR_RANGE);
    td_logcap_stop();
    CHECK(strstr(td_logcap.last, "pool: 0 threads") != NULL);
    CHECK_STATUS(td_kernels_cpu_pool_create(2, &pa), TD_OK);
    CHECK_STATUS(td_kernels_cpu_pool_create(2, &pb), TD_OK);
    if (pa == NULL || pb == NULL || w == NULL || x == NULL || want == NULL)
        goto out;

    /* side by side */
    CHECK(pthread_create(&ta, NULL, side_a, pa) == 0);
    CHECK(pthread_create(&tb, NULL, side_b, pb) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_EQ_INT(atomic_load(&side.timeouts), 0);
    CHECK_EQ_INT(atomic_load(&side.a_in), 2);
    CHECK_EQ_INT(atomic_load(&side.b_in), 2);

    /* the same bits alone on the default pool and concurrently on two pools
     * of other sizes */
    for (size_t i = 0; i < (size_t)N * KD; i++)
        w[i] = td_rng_range(&rng, -1.0f, 1.0f);
    for (size_t i = 0; i < (size_t)M * KD; i++)
        x[i] = td_rng_range(&rng, -1.0f, 1.0f);
    CHECK_STATUS(k->mat_create(w, 1, N, KD, &mat), TD_OK);
    if (mat == NULL)
        goto out;
    CHECK_STATUS(k->linear_mat(x, mat, want, M), TD_OK);
    td_kernels_cpu_pool_destroy(pb);
    pb = NULL;
    CHECK_STATUS(td_kernels_cpu_pool_create(3, &pb), TD_OK);
    if (pb == NULL)
        goto out;
    lin_job_t ja = { pa, mat, x, want, M, N, 30, 0, 0 };
    lin_job_t jb = { pb, mat, x, want, M, N, 30, 0, 0 };
    CHECK(pthread_create(&ta, NULL, lin_run, &ja) == 0);
    CHECK(pthread_create(&tb, NULL, lin_run, &jb) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_EQ_INT(ja.differ + jb.differ, 0);
    CHECK(ja.threads_ok && jb.threads_ok);

    /* binding returns the previous pool; destroy undoes the caller's own */
    was = td_kernels_cpu_pool_bind(pa);
    CHECK(was == NULL);
    CHECK_EQ_INT(td_kernels_cpu_threads(), 2);
    td_kernels_cpu_pool_destroy(pa);
    pa = NULL;
    CHECK(td_kernels_cpu_pool_bind(NULL) == NULL);
out:
    if (mat != NULL)
        k->mat_destroy(mat);
    td_kernels_cpu_pool_destroy(pa);
    td_kernels_cpu_pool_destroy(pb);
    free(w);
    free(x);
    free(want);
}

/* ---- row-count independence -------------------------------------------------------- */

/* One expert's weights, prepared: w1, w3 [I, H], w2 [H, I]. */
typedef struct {
    td_kernels_mat_t *w1, *w3, *w2;
    size_t H, I;
} expert_t;

/* Weights in [-1, 1]; bf16: rounded to bf16 values (the prepared form is
 * then bf16, as for a checkpoint's weights), else f32. */
static td_kernels_mat_t *
rand_mat(size_t n, size_t k, int bf16)
{
    float *w = malloc(n * k * sizeof(float));
    td_kernels_mat_t *m = NULL;

    if (w == NULL)
        return NULL;
    for (size_t i = 0; i < n * k; i++) {
        w[i] = td_rng_range(&rng, -1.0f, 1.0f);
        if (bf16) {
            uint32_t u;
            memcpy(&u, &w[i], 4);
            u &= 0xFFFF0000u;
            memcpy(&w[i], &u, 4);
        }
    }
    CHECK_STATUS(td_kernels_cpu_ops()->mat_create(w, 1, n, k, &m), TD_OK);
    free(w);
    return m;
}

/* y [m, H] = w2 . swiglu(w1 . x, w3 . x) * wt, as the forward pass runs an expert. */
static void
expert_run(const expert_t *e, const float *x, const float *wt, size_t m, float *g, float *u,
           float *y)
{
    const td_kernels_ops_t *k = td_kernels_cpu_ops();

    CHECK_STATUS(k->linear_mat(x, e->w1, g, m), TD_OK);
    CHECK_STATUS(k->linear_mat(x, e->w3, u, m), TD_OK);
    CHECK_STATUS(k->swiglu(g, u, wt, m, e->I, 10.0f, g), TD_OK);
    CHECK_STATUS(k->linear_mat(g, e->w2, y, m), TD_OK);
}

/* Each row of a batch of m rows, for every m of the list, equals that row
 * run alone, bit for bit: the tiles, task splits and code paths linear_mat
 * takes for a row count change nothing. The shapes: the tiny presets'
 * experts (w1/w3 in the lanes order, w2 in panels) and the mid preset's
 * (panels), with bf16 and f32 weights, and a router [16, H]. */
static void
test_rows_independent(void)
{
    static const struct {
        size_t H, I;
        int bf16;
        size_t ms[48];   /* batch sizes, 0-terminated */
    } cases[] = {
        { 64, 32, 1, { 1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                       17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                       33, 34, 35, 36, 37, 38, 39, 40, 95, 96, 97, 192, 200, 0 } },
        { 64, 32, 0, { 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 24, 25, 33, 96, 97, 200, 0 } },
        { 1024, 256, 1, { 2, 3, 4, 5, 8, 12, 13, 16, 25, 96, 97, 130, 0 } },
        { 1024, 256, 0, { 3, 13, 97, 0 } },
    };
    enum { MMAX = 200 };

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t H = cases[c].H, I = cases[c].I, differ = 0, rows = 0;
        expert_t e = { rand_mat(I, H, cases[c].bf16), rand_mat(I, H, cases[c].bf16),
                       rand_mat(H, I, cases[c].bf16), H, I };
        td_kernels_mat_t *gate = rand_mat(16, H, cases[c].bf16);
        float *x = malloc(MMAX * H * sizeof(float)), *wt = malloc(MMAX * sizeof(float));
        float *alone = malloc(MMAX * H * sizeof(float)), *y = malloc(MMAX * H * sizeof(float));
        float *g = malloc(MMAX * I * sizeof(float)), *u = malloc(MMAX * I * sizeof(float));
        float *ga = malloc(MMAX * 16 * sizeof(float)), *gb = malloc(MMAX * 16 * sizeof(float));
        if (e.w1 == NULL || e.w3 == NULL || e.w2 == NULL || gate == NULL || x == NULL ||
            wt == NULL || alone == NULL || y == NULL || g == NULL || u == NULL || ga == NULL ||
            gb == NULL) {
            td_check_failures++;
            goto next;
        }
        for (size_t i = 0; i < MMAX * H; i++)
            x[i] = td_rng_range(&rng, -2.0f, 2.0f);
        for (size_t r = 0; r < MMAX; r++)
            wt[r] = td_rng_range(&rng, 0.0f, 1.5f);
        for (size_t r = 0; r < MMAX; r++) {
            expert_run(&e, x + r * H, wt + r, 1, g, u, alone + r * H);
            CHECK_STATUS(td_kernels_cpu_ops()->linear_mat(x + r * H, gate, ga + r * 16, 1), TD_OK);
        }
        size_t i = 0;
        for (; cases[c].ms[i] != 0; i++) {
            size_t m = cases[c].ms[i];
            expert_run(&e, x, wt, m, g, u, y);
            CHECK_STATUS(td_kernels_cpu_ops()->linear_mat(x, gate, gb, m), TD_OK);
            for (size_t r = 0; r < m; r++, rows++) {
                int same = memcmp(y + r * H, alone + r * H, H * sizeof(float)) == 0 &&
                           memcmp(gb + r * 16, ga + r * 16, 16 * sizeof(float)) == 0;
                if (!same && differ++ == 0)
                    fprintf(stderr, "expert [%zu, %zu] %s: row %zu of a batch of %zu differs "
                            "from the row alone\n", I, H, cases[c].bf16 ? "bf16" : "f32", r, m);
            }
        }
        CHECK_EQ_INT(differ, 0);
        fprintf(stderr, "test_kernels_cpu: expert [%zu, %zu] %s: %zu rows in batches of %zu "
                "sizes: %s\n", I, H, cases[c].bf16 ? "bf16" : "f32", rows, (size_t)i,
                differ ? "DIFFERENT" : "the same bits as alone");
next:
        td_kernels_cpu_ops()->mat_destroy(e.w1);
        td_kernels_cpu_ops()->mat_destroy(e.w3);
        td_kernels_cpu_ops()->mat_destroy(e.w2);
        td_kernels_cpu_ops()->mat_destroy(gate);
        free(x);
        free(wt);
        free(alone);
        free(y);
        free(g);
        free(u);
        free(ga);
        free(gb);
    }
}

/* ---- weights kept in their stored formats -------------------------------------------- */

/* Value (r, i) of a stored [N, k] matrix, as the checkpoint reader computes it. */
static float
fmt_value(const td_kernels_wsrc_t *s, size_t k, size_t r, size_t i)
{
    const uint8_t *q = s->data;
    if (s->fmt == TD_KERNELS_W_BF16)
        return td_numfmt_bf16_to_f32((uint16_t)(q[2 * (r * k + i)] | q[2 * (r * k + i) + 1] << 8));
    if (s->fmt == TD_KERNELS_W_FP8_BLOCK) {
        size_t sc = (k + s->block_cols - 1) / s->block_cols;
        return td_numfmt_e4m3_to_f32(q[r * k + i]) *
               td_numfmt_e8m0_to_f32(s->scales[(r / s->block_rows) * sc + i / s->block_cols]);
    }
    size_t e = r * k + i;
    return td_numfmt_e2m1_to_f32((uint8_t)(q[e / 2] >> (4 * (e & 1))) & 0xF) *
           td_numfmt_e8m0_to_f32(s->scales[r * (k / 32) + i / 32]);
}

/* mat_create_fmt over random codes and scales gives linear_mat the bits of
 * mat_create over the values the codes stand for: every format, shapes with
 * partial panels and 32-row blocks, k blocks that start off a 32 boundary
 * (k = 672: 320, 176, 176), groups, row counts of every tile; scales that
 * the kernels cannot take exactly (0, > 134) and NaN codes go the widened way. */
static void
test_mat_fmt(void)
{
    static const struct { size_t groups, n, k; } shapes[] = {
        { 1, 48, 64 }, { 1, 100, 672 }, { 2, 40, 96 }, { 1, 1024, 128 }, { 1, 17, 64 },
        { 4, 16, 64 },   /* each group in the lanes order, 64 rows in all */
    };
    static const size_t ms[] = { 1, 3, 4, 13, 29 };
    const td_kernels_ops_t *K = td_kernels_cpu_ops();

    for (int fmt = TD_KERNELS_W_BF16; fmt <= TD_KERNELS_W_FP4_K32; fmt++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            for (int odd = 0; odd < 2; odd++) {
                size_t G = shapes[si].groups, n = shapes[si].n, k = shapes[si].k, N = G * n;
                size_t ns = fmt == TD_KERNELS_W_FP8_BLOCK ? ((N + 31) / 32) * ((k + 31) / 32)
                                                          : N * (k / 32);
                uint8_t *data = malloc(2 * N * k), *sc = malloc(ns + 1);
                float *wf = malloc(N * k * sizeof(float)), *x = malloc(29 * G * k * sizeof(float));
                float *y1 = malloc(29 * N * sizeof(float)), *y2 = malloc(29 * N * sizeof(float));
                td_kernels_mat_t *a = NULL, *b = NULL;
                for (size_t i = 0; i < 2 * N * k; i++)
                    data[i] = (uint8_t)td_rng_next(&rng);
                for (size_t i = 0; i < N * k && fmt == TD_KERNELS_W_FP8_BLOCK; i++)
                    if ((data[i] & 0x7F) == 0x7F)
                        data[i] ^= odd && i == 5 ? 0 : 1;   /* odd: one NaN code */
                for (size_t i = 0; i < ns; i++)
                    sc[i] = (uint8_t)(110 + td_rng_next(&rng) % 24);
                if (odd)
                    sc[ns / 2] = fmt == TD_KERNELS_W_FP4_K32 ? 0 : 140;
                td_kernels_wsrc_t src = { (td_kernels_wfmt_t)fmt, data,
                                          fmt == TD_KERNELS_W_BF16 ? NULL : sc, 32, 32 };
                for (size_t r = 0; r < N; r++)
                    for (size_t i = 0; i < k; i++)
                        wf[r * k + i] = fmt_value(&src, k, r, i);
                for (size_t i = 0; i < 29 * G * k; i++)
                    x[i] = td_rng_range(&rng, -1.0f, 1.0f);
                CHECK_STATUS(K->mat_create_fmt(&src, G, n, k, &a), TD_OK);
                CHECK_STATUS(K->mat_create(wf, G, n, k, &b), TD_OK);
                for (size_t mi = 0; a != NULL && b != NULL && mi < sizeof(ms) / sizeof(ms[0]); mi++) {
                    CHECK_STATUS(K->linear_mat(x, a, y1, ms[mi]), TD_OK);
                    CHECK_STATUS(K->linear_mat(x, b, y2, ms[mi]), TD_OK);
                    if (memcmp(y1, y2, ms[mi] * N * sizeof(float)) != 0) {
                        fprintf(stderr, "mat_fmt: format %d, %zu x [%zu, %zu], %zu rows%s: "
                                "results differ\n", fmt, G, n, k, ms[mi], odd ? " (odd)" : "");
                        td_check_failures++;
                    }
                }
                if (fmt != TD_KERNELS_W_BF16 && !odd && n > 37)
                    CHECK(K->mat_bytes(a) < K->mat_bytes(b));   /* kept as codes */
                K->mat_destroy(a);
                K->mat_destroy(b);
                free(data);
                free(sc);
                free(wf);
                free(x);
                free(y1);
                free(y2);
            }
    td_kernels_wsrc_t bad = { TD_KERNELS_W_FP4_K32, "x", NULL, 0, 0 };
    td_kernels_mat_t *m = NULL;
    td_logcap_start();
    CHECK_STATUS(K->mat_create_fmt(&bad, 1, 4, 64, &m), TD_ERR_INVALID);
    CHECK(td_logcap.errors == 1);
    td_logcap_stop();
}

/* embed_fmt gathers the rows of a stored table as the checkpoint reader
 * makes them: f32, bf16 and fp8 rows with ue8m0 scales per 32 channels. */
static void
test_embed_fmt(void)
{
    enum { ROWS = 37, D = 64, N = 9 };
    const td_kernels_ops_t *K = td_kernels_cpu_ops();
    static uint8_t data[ROWS * D * 4], sc[ROWS * D / 32];
    float want[N * D], got[N * D];
    int64_t ids[N] = { 0, 36, 5, 5, 17, 1, 30, 2, 36 };

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(td_rng_next(&rng) & 0x77);   /* no NaN codes, no NaN bf16 */
    for (size_t i = 0; i < sizeof(sc); i++)
        sc[i] = (uint8_t)(100 + td_rng_next(&rng) % 40);
    for (int fmt = TD_KERNELS_W_F32; fmt <= TD_KERNELS_W_FP8_ROWS; fmt++) {
        if (fmt == TD_KERNELS_W_FP8_BLOCK || fmt == TD_KERNELS_W_FP4_K32)
            continue;
        td_kernels_wsrc_t t = { (td_kernels_wfmt_t)fmt, data, sc, 0, 0 };
        for (size_t r = 0; r < N; r++)
            for (size_t i = 0; i < D; i++) {
                size_t e = (size_t)ids[r] * D + i;
                float v;
                if (fmt == TD_KERNELS_W_F32)
                    memcpy(&v, data + 4 * e, 4);
                else if (fmt == TD_KERNELS_W_BF16)
                    v = td_numfmt_bf16_to_f32((uint16_t)(data[2 * e] | data[2 * e + 1] << 8));
                else
                    v = td_numfmt_e4m3_to_f32(data[e]) * td_numfmt_e8m0_to_f32(sc[e / 32]);
                want[r * D + i] = v;
            }
        CHECK_STATUS(K->embed_fmt(&t, ROWS, D, ids, N, got), TD_OK);
        CHECK(memcmp(want, got, sizeof(got)) == 0);
    }
    td_kernels_wsrc_t t = { TD_KERNELS_W_BF16, data, NULL, 0, 0 };
    ids[3] = ROWS;
    td_logcap_start();
    CHECK_STATUS(K->embed_fmt(&t, ROWS, D, ids, N, got), TD_ERR_RANGE);
    td_logcap_stop();
}

/* route: the router's steps as score, a biased topk and a plain sum, one
 * token at a time; ties (equal biased scores) go to the lower expert id. */
static void
test_route(void)
{
    enum { N = 7, E = 16, KK = 4 };
    const td_kernels_ops_t *K = td_kernels_cpu_ops();
    float lg[N * E], sc[N * E], bias[E], b2[N * E], w[N * KK];
    int64_t ws[(N * E + 1) / 2 + N * KK];   /* td_kernels_route_ws_bytes, 8-aligned */
    int32_t ex[N * KK];
    int64_t idx[N * KK];

    for (size_t i = 0; i < N * E; i++)
        lg[i] = td_rng_range(&rng, -3.0f, 3.0f);
    lg[3] = lg[5];   /* a tie in token 0 */
    for (size_t j = 0; j < E; j++)
        bias[j] = j % 3 == 0 ? 0.0f : td_rng_range(&rng, -0.5f, 0.5f);
    memcpy(sc, lg, sizeof(sc));
    CHECK_STATUS(K->route(lg, bias, N, E, KK, TD_KERNELS_SCORE_SQRTSOFTPLUS, 1.5f, 1, 2.5f, ws,
                          ex, w), TD_OK);
    CHECK_STATUS(K->score(sc, N, E, TD_KERNELS_SCORE_SQRTSOFTPLUS, 1.5f), TD_OK);
    CHECK(memcmp(sc, lg, sizeof(sc)) == 0);   /* the scores, in place */
    for (size_t i = 0; i < N * E; i++)
        b2[i] = sc[i] + bias[i % E];
    CHECK_STATUS(K->topk(b2, N, E, KK, idx), TD_OK);
    for (size_t r = 0; r < N; r++) {
        float sum = 0.0f, want[E];
        int chosen[E] = { 0 };
        for (size_t j = 0; j < KK; j++) {
            sum += sc[r * E + (size_t)idx[r * KK + j]];
            chosen[idx[r * KK + j]] = 1;
        }
        for (size_t e = 0; e < E; e++)
            want[e] = sc[r * E + e] / (sum + 1e-20f) * 2.5f;
        for (size_t j = 0; j < KK; j++) {
            CHECK(chosen[ex[r * KK + j]]);
            CHECK(j == 0 || ex[r * KK + j - 1] < ex[r * KK + j]);
            CHECK(memcmp(&w[r * KK + j], &want[ex[r * KK + j]], sizeof(float)) == 0);
        }
    }
}

int
main(void)
{
    enum { KiB = 1024, MiB = 1024 * 1024 };
    /* plain spans: { 0, 0, 0, 0, bytes }; strided: { eb, epb, offset, first, count } */
    static const kv_case_t cases[] = {
        { "1 B blocks", 1, 16, { 0, 0, 0, 0, 11 } },
        { "3 B blocks, partial last", 3, 16, { 0, 0, 0, 0, 40 } },
        { "empty", 7, 4, { 0, 0, 0, 0, 0 } },
        { "64 B blocks, whole", 64, 32, { 0, 0, 0, 0, 64 * 10 } },
        { "one partial block", 4 * KiB, 4, { 0, 0, 0, 0, 100 } },
        { "4 KiB blocks, partial last", 4 * KiB, 16, { 0, 0, 0, 0, 5 * 4 * KiB + 17 } },
        { "64 KiB blocks, 1 byte in last", 64 * KiB, 8, { 0, 0, 0, 0, 3 * 64 * KiB + 1 } },
        { "1 MiB blocks, partial last", MiB, 4, { 0, 0, 0, 0, 2 * MiB + 12345 } },
        { "1 MiB blocks, all", MiB, 3, { 0, 0, 0, 0, 3 * MiB } },
        /* a block of [3 layers, 4 entries, 5 B] + 4 B padding; layer 1, entries 6..14 */
        { "strided, layer 1 of 3", 64, 8, { 5, 4, 20, 6, 9 } },
        { "strided, one entry mid-block", 64, 8, { 5, 4, 40, 13, 1 } },
        { "strided, starts on a block edge", 64, 8, { 5, 4, 0, 8, 12 } },
        { "strided, empty", 64, 8, { 5, 4, 0, 3, 0 } },
        /* V4.1-like: 64 entries of 584 B per block, a 1000-token ratio-2 prefix */
        { "strided, v4.1 compressed kv", 64 * 584, 24, { 584, 64, 0, 0, 500 } },
        { "strided, decode append", 64 * 584, 24, { 584, 64, 0, 500, 1 } },
    };

    CHECK_STR(td_kernels_cpu()->name, "cpu");
    CHECK_STATUS(td_kernels_cpu()->sync(NULL), TD_OK);
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            check_case(&cases[i]);
    check_rejects();
    test_pools();
    test_rows_independent();
    test_mat_fmt();
    test_embed_fmt();
    test_route();
    return td_check_exit("test_kernels_cpu");
}
