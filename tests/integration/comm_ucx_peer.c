/* tests/integration/comm_ucx_peer.c — one rank of a UCX communicator
 * (comm/ucx.h) in its own process; comm_ucx_test.py starts SIZE of them on
 * loopback. They exchange addresses through files in DIR, then:
 *   run     every collective ITERS times with random sizes, each result
 *           checked byte for byte against what this rank computes itself
 *           from (seed, collective number, rank); reduce-scatter bit for bit
 *           against the sum in rank order;
 *   kill    collectives until one fails (the driver SIGKILLs a rank): the
 *           status must be TD_ERR_PEER; prints when it was seen;
 *   stall   the last rank sleeps STALL_MS before collective STALL_AT: the
 *           others must get TD_ERR_TIMEOUT after the deadline;
 *   toobig  rank 0 gives all-to-all #TOOBIG_AT too small a recv_cap: it gets
 *           TD_ERR_TOO_BIG, every other rank TD_ERR_PEER at once;
 *   abort   rank 0 calls td_comm_abort instead of collective #TOOBIG_AT: the
 *           others get TD_ERR_PEER at once, rank 0's later calls
 *           TD_ERR_CANCELED;
 *   mismatch rank 0 calls a barrier where the others call all-to-all
 *           #TOOBIG_AT: TD_ERR_MISMATCH (or TD_ERR_PEER, told by a rank that
 *           saw it first);
 *   moe     the benchmark (bench/comm-ucx): MoE dispatch and combine as two
 *           all-to-alls per step, bytes on the wire against the theory.
 * Usage: comm_ucx_peer MODE DIR RANK SIZE [--tls T] [--iters N]
 *        [--deadline-ms MS] [--chunk B] [--slots K] [--max-payload P]
 *        [--seed S] [--tokens T] [--topk K] [--hidden H] [--experts E]
 *        [--warmup N]
 * Result lines on stdout: "comm_ucx_peer rank=R key=value ...". */
#include "ucx.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "../unit/check.h"
#include "../unit/testutil.h"
#include "log.h"
#include "rng.h"

#define STALL_AT    20     /* stall: the collective the last rank sleeps before */
#define STALL_MS    3000
#define TOOBIG_AT   15     /* toobig, abort: the collective (an all-to-all) rank 0 fails */
#define ADDR_WAIT_S 60     /* for the other ranks' address files */
#define MAX_SEG     (300u << 10)   /* run: the largest segment of one pair */

typedef struct {
    const char *mode, *dir, *tls;
    uint32_t rank, size;
    uint64_t iters, seed, deadline_ms;
    uint32_t chunk, slots, max_payload;
    uint32_t tokens, topk, hidden, experts, warmup;
} peer_args_t;

static peer_args_t A;

static void
say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
say(const char *fmt, ...)
{
    va_list ap;
    printf("comm_ucx_peer rank=%u ", A.rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* ---- addresses through files ------------------------------------------------ */

static int
write_file(const char *path, const void *buf, size_t len)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        return -1;
    int bad = fwrite(buf, 1, len, f) != len;
    bad |= fclose(f) != 0;
    return bad || rename(tmp, path) != 0 ? -1 : 0;
}

static void *
read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (nb == NULL)
                break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Publish this rank's address, then wait for every rank's. */
static int
exchange(td_xfer_t *x, void **blobs, td_comm_ucx_peer_t *peers)
{
    char path[4096];
    void *mine;
    size_t len;

    if (td_comm_ucx_address(x, &mine, &len) != TD_OK)
        return -1;
    snprintf(path, sizeof(path), "%s/addr.%u", A.dir, A.rank);
    int bad = write_file(path, mine, len);
    free(mine);
    if (bad)
        return -1;
    uint64_t until = td_testutil_now_ms() + ADDR_WAIT_S * 1000u;
    for (uint32_t r = 0; r < A.size; r++) {
        snprintf(path, sizeof(path), "%s/addr.%u", A.dir, r);
        while ((blobs[r] = read_file(path, &peers[r].len)) == NULL) {
            if (td_testutil_now_ms() > until) {
                fprintf(stderr, "comm_ucx_peer %u: no address of rank %u in %s\n", A.rank, r,
                        A.dir);
                return -1;
            }
            usleep(10000);
        }
        peers[r].addr = blobs[r];
    }
    return 0;
}

/* ---- what every rank can compute by itself ----------------------------------- */

/* The segment that rank s sends rank d in collective k: its n bytes. */
static void
seg_fill(uint8_t *p, uint64_t k, uint32_t s, uint32_t d, size_t n)
{
    uint64_t key = td_rng_mix64(A.seed ^ (k << 24) ^ ((uint64_t)s << 12) ^ d);
    for (size_t j = 0; j < n; j += 8) {
        uint64_t w = td_rng_mix64(key + j / 8);
        size_t m = n - j < 8 ? n - j : 8;
        memcpy(p + j, &w, m);   /* little-endian: byte i = w >> 8i, as seg_byte */
    }
}

/* Rank s's float i of collective k: varied exponents, so that the order of
 * the sum shows in the bits. */
static float
rs_value(uint64_t k, uint32_t s, size_t i)
{
    uint64_t h = td_rng_mix64(td_rng_mix64(A.seed ^ (k << 24) ^ ((uint64_t)s << 12) ^ 0xf1) + i);
    float m = (float)((int64_t)(h % 2000001) - 1000000) / 1000000.0f;
    return ldexpf(m, (int)((h >> 32) % 41) - 20);
}

/* A random size in [0, max], zero one time in four, often small. */
static size_t
rand_size(td_rng_t *g, size_t max)
{
    uint64_t v = td_rng_next(g);
    switch (v % 4) {
    case 0: return 0;
    case 1: return (v >> 8) % 512;
    case 2: return (v >> 8) % 8192;
    default: return (v >> 8) % (max + 1);
    }
}

/* The sizes of collective k (the same on every rank). */
static size_t
a2a_bytes(uint64_t k, uint32_t s, uint32_t d)
{
    td_rng_t g = td_rng_seed(td_rng_mix64(A.seed ^ (k << 24) ^ ((uint64_t)s << 12) ^ d ^ 0xa2a));
    return rand_size(&g, MAX_SEG);
}

/* ---- run: every collective, checked ----------------------------------------- */

typedef struct {
    uint8_t *send, *recv, *want;
    float *fsend, *frecv;
    size_t *sb, *rb;
    uint64_t count[5];
} run_bufs_t;

static td_status_t
run_one(td_comm_t *c, uint64_t k, run_bufs_t *b)
{
    td_rng_t g = td_rng_seed(td_rng_mix64(A.seed ^ (k << 24) ^ 0xc011));
    uint32_t me = A.rank, n = A.size;
    unsigned kind = (unsigned)(td_rng_next(&g) % 4);
    td_status_t st = TD_OK;

    b->count[kind]++;
    switch (kind) {
    case 0:
        return td_comm_barrier(c);
    case 1: {   /* all-gather, in place one time in three */
        size_t bytes = rand_size(&g, MAX_SEG);
        int in_place = td_rng_next(&g) % 3 == 0;
        memset(b->recv, 0xee, (size_t)n * MAX_SEG);
        uint8_t *send = in_place ? b->recv + (size_t)me * bytes : b->send;
        seg_fill(send, k, me, 0, bytes);
        if ((st = td_comm_allgather(c, send, bytes, b->recv)) != TD_OK)
            return st;
        for (uint32_t s = 0; s < n; s++) {
            seg_fill(b->want, k, s, 0, bytes);
            if (memcmp(b->recv + (size_t)s * bytes, b->want, bytes) != 0) {
                fprintf(stderr, "rank %u: all-gather #%" PRIu64 ": rank %u's %zu bytes differ\n",
                        me, k, s, bytes);
                td_check_failures++;
            }
        }
        return TD_OK;
    }
    case 2: {   /* reduce-scatter against the sum in rank order, in place one time in three */
        size_t count = rand_size(&g, MAX_SEG / sizeof(float));
        float *recv = td_rng_next(&g) % 3 == 0 ? b->fsend + (size_t)me * count : b->frecv;
        for (size_t i = 0; i < (size_t)n * count; i++)
            b->fsend[i] = rs_value(k, me, i);
        if ((st = td_comm_reduce_scatter_f32(c, b->fsend, count, recv)) != TD_OK)
            return st;
        for (size_t i = 0; i < count; i++) {
            float acc = rs_value(k, 0, (size_t)me * count + i);
            for (uint32_t s = 1; s < n; s++)
                acc = acc + rs_value(k, s, (size_t)me * count + i);
            if (memcmp(&acc, &recv[i], sizeof(float)) != 0) {
                fprintf(stderr, "rank %u: reduce-scatter #%" PRIu64 ": element %zu is %a, the "
                        "sum in rank order %a\n", me, k, i, recv[i], acc);
                td_check_failures++;
                break;
            }
        }
        return TD_OK;
    }
    default: {  /* all-to-all with per-destination sizes, zeros included */
        size_t off = 0, want_total = 0;
        for (uint32_t d = 0; d < n; d++) {
            b->sb[d] = a2a_bytes(k, me, d);
            seg_fill(b->send + off, k, me, d, b->sb[d]);
            off += b->sb[d];
        }
        for (uint32_t s = 0; s < n; s++)
            want_total += a2a_bytes(k, s, me);
        size_t cap = td_rng_next(&g) % 2 ? want_total : (size_t)n * MAX_SEG;
        memset(b->rb, 0xff, n * sizeof(size_t));
        if ((st = td_comm_alltoallv(c, b->send, b->sb, b->recv, cap, b->rb)) != TD_OK)
            return st;
        off = 0;
        for (uint32_t s = 0; s < n; s++) {
            size_t want = a2a_bytes(k, s, me);
            if (b->rb[s] != want) {
                fprintf(stderr, "rank %u: all-to-all #%" PRIu64 ": %zu bytes from rank %u, "
                        "want %zu\n", me, k, b->rb[s], s, want);
                td_check_failures++;
                return TD_OK;
            }
            seg_fill(b->want, k, s, me, want);
            if (memcmp(b->recv + off, b->want, want) != 0) {
                fprintf(stderr, "rank %u: all-to-all #%" PRIu64 ": the %zu bytes from rank %u "
                        "differ\n", me, k, want, s);
                td_check_failures++;
            }
            off += want;
        }
        return TD_OK;
    }
    }
}

static int
mode_run(td_comm_t *c)
{
    run_bufs_t b = { 0 };
    size_t n = A.size;
    b.send = malloc(n * MAX_SEG);
    b.recv = malloc(n * MAX_SEG);
    b.want = malloc(MAX_SEG);
    b.fsend = malloc(n * MAX_SEG);
    b.frecv = malloc(MAX_SEG);
    b.sb = calloc(n, sizeof(size_t));
    b.rb = calloc(n, sizeof(size_t));
    if (!b.send || !b.recv || !b.want || !b.fsend || !b.frecv || !b.sb || !b.rb)
        return 1;
    uint64_t t0 = td_testutil_now_us();
    for (uint64_t k = 1; k <= A.iters; k++) {
        td_status_t st = run_one(c, k, &b);
        if (st != TD_OK) {
            fprintf(stderr, "rank %u: collective %" PRIu64 " failed: %s\n", A.rank, k,
                    td_status_str(st));
            td_check_failures++;
            break;
        }
    }
    /* the last one: a barrier, so that no rank leaves while others still wait */
    CHECK_STATUS(td_comm_barrier(c), TD_OK);
    td_comm_stats_t cs;
    td_comm_stats(c, &cs);
    CHECK_EQ_INT(cs.collectives, A.iters + 1);
    say("collectives=%" PRIu64 " barrier=%" PRIu64 " allgather=%" PRIu64 " reduce_scatter=%"
        PRIu64 " alltoallv=%" PRIu64 " bytes_sent=%" PRIu64 " us=%" PRIu64, cs.collectives,
        b.count[0], b.count[1], b.count[2], b.count[3], cs.bytes_sent,
        td_testutil_now_us() - t0);
    free(b.send);
    free(b.recv);
    free(b.want);
    free(b.fsend);
    free(b.frecv);
    free(b.sb);
    free(b.rb);
    return 0;
}

/* ---- kill, stall, toobig, abort, mismatch: failures -------------------------- */

/* Small all-to-alls and barriers until one fails; its status and when. */
static int
mode_fail(td_comm_t *c)
{
    uint32_t n = A.size;
    size_t *sb = calloc(n, sizeof(size_t)), *rb = calloc(n, sizeof(size_t));
    uint8_t *send = calloc(n, 4096), *recv = calloc(n, 4096);
    td_status_t st = TD_OK;
    uint64_t k, t = 0;
    int is_staller = !strcmp(A.mode, "stall") && A.rank == n - 1;

    if (!sb || !rb || !send || !recv)
        return 1;
    for (k = 1; k <= A.iters; k++) {
        if (k == 10)
            say("looping");
        if (is_staller && k == STALL_AT) {
            say("stalling ms=%u", STALL_MS);
            usleep(STALL_MS * 1000);
        }
        size_t cap = (size_t)n * 4096;
        for (uint32_t d = 0; d < n; d++)
            sb[d] = (k + d + A.rank) % 3 ? 1000 + (k * 7 + d) % 3000 : 0;
        if (!strcmp(A.mode, "toobig") && A.rank == 0 && k == TOOBIG_AT)
            cap = 10;
        t = td_clock_ns();
        if (!strcmp(A.mode, "abort") && A.rank == 0 && k == TOOBIG_AT) {
            td_comm_abort(c, TD_ERR_CANCELED);
            st = td_comm_status(c);
            break;
        }
        int a2a = k % 2;
        if (!strcmp(A.mode, "mismatch") && A.rank == 0 && k == TOOBIG_AT)
            a2a = 0;
        st = a2a ? td_comm_alltoallv(c, send, sb, recv, cap, rb) : td_comm_barrier(c);
        if (st != TD_OK)
            break;
    }
    uint64_t now = td_clock_ns();
    say("failed collective=%" PRIu64 " code=%d took_ms=%.1f at_ns=%" PRIu64 " (%s)", k, (int)st,
        (now - t) / 1e6, now, td_status_str(st));
    /* stall: every waiting rank sees its own deadline before this one's
     * closed endpoints could tell it first */
    if (!strcmp(A.mode, "stall") && !is_staller)
        usleep(1000 * 1000);
    /* later calls: refused at once with the same status */
    CHECK_STATUS(td_comm_barrier(c), st);
    CHECK_STATUS(td_comm_status(c), st);
    free(sb);
    free(rb);
    free(send);
    free(recv);
    return 0;
}

/* ---- moe: the benchmark ----------------------------------------------------- */

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Each step: every rank's `tokens` tokens pick `topk` distinct experts of
 * `experts` (expert e on rank e % size); dispatch sends each (token, expert)
 * pair's hidden vector (bf16) to the expert's rank, combine sends as many
 * bytes back. The theory: hidden x 2 bytes per pair whose expert is on
 * another rank, each way; this rank's own pairs never leave it. */
static int
mode_moe(td_comm_t *c)
{
    uint32_t n = A.size, me = A.rank;
    size_t vec = (size_t)A.hidden * 2;
    size_t cap = (size_t)n * A.tokens * A.topk * vec;
    uint8_t *send = malloc((size_t)A.tokens * A.topk * vec), *recv = malloc(cap);
    size_t *sb = calloc(n, sizeof(size_t)), *rb = calloc(n, sizeof(size_t));
    uint64_t *lat = calloc(2 * (size_t)A.iters, sizeof(uint64_t));
    uint32_t *dest = calloc((size_t)A.tokens * A.topk, sizeof(uint32_t));
    uint64_t theory = 0, pairs_remote = 0;
    td_comm_ucx_stats_t w0, w1;

    if (!send || !recv || !sb || !rb || !lat || !dest || A.topk > A.experts)
        return 1;
    memset(send, 0x3c, (size_t)A.tokens * A.topk * vec);
    for (uint64_t step = 0; step < A.warmup + A.iters; step++) {
        int timed = step >= A.warmup;
        td_rng_t g = td_rng_seed(td_rng_mix64(A.seed ^ (step << 20) ^ me));
        memset(sb, 0, n * sizeof(size_t));
        for (uint32_t t = 0; t < A.tokens; t++) {
            for (uint32_t j = 0; j < A.topk; j++) {
                uint32_t e;
                int again;
                do {   /* distinct experts per token */
                    e = (uint32_t)(td_rng_next(&g) % A.experts);
                    again = 0;
                    for (uint32_t i = 0; i < j; i++)
                        again |= dest[t * A.topk + i] == e;
                } while (again);
                dest[t * A.topk + j] = e;
                sb[e % n] += vec;
                if (timed && e % n != me) {
                    theory += 2 * vec;
                    pairs_remote++;
                }
            }
        }
        if (step == A.warmup) {
            CHECK_STATUS(td_comm_barrier(c), TD_OK);
            td_comm_ucx_stats(c, &w0);
        }
        uint64_t t0 = td_clock_ns();
        td_status_t st = td_comm_alltoallv(c, send, sb, recv, cap, rb);   /* dispatch */
        uint64_t t1 = td_clock_ns();
        if (st == TD_OK)
            st = td_comm_alltoallv(c, recv, rb, send, (size_t)A.tokens * A.topk * vec, sb);
        uint64_t t2 = td_clock_ns();
        if (st != TD_OK) {
            fprintf(stderr, "rank %u: moe step %" PRIu64 ": %s\n", me, step, td_status_str(st));
            return 1;
        }
        if (timed) {
            lat[2 * (step - A.warmup)] = t1 - t0;
            lat[2 * (step - A.warmup) + 1] = t2 - t1;
        }
    }
    td_comm_ucx_stats(c, &w1);
    CHECK_STATUS(td_comm_barrier(c), TD_OK);
    uint64_t wire = (w1.header_bytes - w0.header_bytes) + (w1.put_bytes - w0.put_bytes) +
                    (w1.inline_bytes - w0.inline_bytes);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < 2 * A.iters; i++)
        sum += lat[i];
    qsort(lat, 2 * A.iters, sizeof(uint64_t), cmp_u64);
    say("tokens=%" PRIu64 " pairs_remote=%" PRIu64 " theory_bytes=%" PRIu64 " wire_bytes=%"
        PRIu64 " payload_bytes=%" PRIu64 " messages=%" PRIu64 " acks=%" PRIu64
        " alltoallv=%" PRIu64 " lat_mean_us=%.1f lat_p50_us=%.1f lat_p99_us=%.1f",
        (uint64_t)A.tokens * A.iters, pairs_remote, theory, wire,
        (w1.put_bytes - w0.put_bytes) + (w1.inline_bytes - w0.inline_bytes),
        w1.messages - w0.messages, w1.acks - w0.acks, 2 * A.iters,
        sum / 1e3 / (double)(2 * A.iters), lat[A.iters] / 1e3,
        lat[(2 * A.iters * 99) / 100] / 1e3);
    free(send);
    free(recv);
    free(sb);
    free(rb);
    free(lat);
    free(dest);
    return 0;
}

/* ---- refused creates --------------------------------------------------------- */

static void
drop_line(td_log_level_t level, const char *line, void *arg)
{
}

/* Bad arguments and malformed addresses are refused before anything is
 * connected, and leave x as it was (the real create follows). */
static void
bad_creates(td_xfer_t *x, const td_comm_ucx_peer_t *peers, const td_comm_opts_t *opts,
            const td_comm_ucx_config_t *cfg)
{
    uint32_t n = A.size, other = (A.rank + 1) % n;
    td_comm_ucx_peer_t *bad = calloc(n, sizeof(*bad));
    uint8_t *blob = malloc(peers[other].len);
    td_comm_t *c = NULL;
    td_comm_ucx_config_t odd = { .chunk_bytes = 5000 }, one = { .slots = 1 };

    if (bad == NULL || blob == NULL)
        return;
    td_log_set_sink(drop_line, NULL);                  /* the refusals' own messages */
    CHECK_STATUS(td_comm_ucx_create(x, n, n, peers, opts, cfg, &c), TD_ERR_INVALID);
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, NULL, opts, cfg, &c), TD_ERR_INVALID);
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, peers, opts, &odd, &c), TD_ERR_INVALID);
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, peers, opts, &one, &c), TD_ERR_INVALID);
    memcpy(bad, peers, n * sizeof(*bad));
    memcpy(blob, peers[other].addr, peers[other].len);
    blob[0] ^= 0xff;                                   /* magic */
    bad[other].addr = blob;
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, bad, opts, cfg, &c), TD_ERR_PROTO);
    blob[0] ^= 0xff;
    bad[other].len = 16;                               /* no worker address */
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, bad, opts, cfg, &c), TD_ERR_PROTO);
    memset(blob + 8, 0, 8);                            /* incarnation 0 */
    bad[other].len = peers[other].len;
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, bad, opts, cfg, &c), TD_ERR_PROTO);
    if (n > 1) {                                       /* this rank's own is another's */
        memcpy(bad, peers, n * sizeof(*bad));
        bad[A.rank] = peers[other];
        CHECK_STATUS(td_comm_ucx_create(x, A.rank, n, bad, opts, cfg, &c), TD_ERR_INVALID);
    }
    CHECK(c == NULL);
    td_log_set_sink(NULL, NULL);
    free(bad);
    free(blob);
}

/* ---- main --------------------------------------------------------------------- */

static int
parse_args(int argc, char **argv)
{
    A = (peer_args_t){ .iters = 200, .seed = 1, .tokens = 32, .topk = 6, .hidden = 4096,
                       .experts = 256, .warmup = 20 };
    if (argc < 5)
        return -1;
    A.mode = argv[1];
    A.dir = argv[2];
    A.rank = (uint32_t)strtoul(argv[3], NULL, 10);
    A.size = (uint32_t)strtoul(argv[4], NULL, 10);
    for (int i = 5; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        unsigned long long n = strtoull(v, NULL, 0);
        if (!strcmp(k, "--tls"))
            A.tls = v;
        else if (!strcmp(k, "--iters"))
            A.iters = n;
        else if (!strcmp(k, "--deadline-ms"))
            A.deadline_ms = n;
        else if (!strcmp(k, "--chunk"))
            A.chunk = (uint32_t)n;
        else if (!strcmp(k, "--slots"))
            A.slots = (uint32_t)n;
        else if (!strcmp(k, "--max-payload"))
            A.max_payload = (uint32_t)n;
        else if (!strcmp(k, "--seed"))
            A.seed = n;
        else if (!strcmp(k, "--tokens"))
            A.tokens = (uint32_t)n;
        else if (!strcmp(k, "--topk"))
            A.topk = (uint32_t)n;
        else if (!strcmp(k, "--hidden"))
            A.hidden = (uint32_t)n;
        else if (!strcmp(k, "--experts"))
            A.experts = (uint32_t)n;
        else if (!strcmp(k, "--warmup"))
            A.warmup = (uint32_t)n;
        else
            return -1;
    }
    if ((argc - 5) % 2 || A.size == 0 || A.rank >= A.size || A.iters == 0 ||
        (strcmp(A.mode, "run") && strcmp(A.mode, "kill") && strcmp(A.mode, "stall") &&
         strcmp(A.mode, "toobig") && strcmp(A.mode, "abort") && strcmp(A.mode, "mismatch") &&
         strcmp(A.mode, "moe")))
        return -1;
    return 0;
}

int
main(int argc, char **argv)
{
    if (parse_args(argc, argv) != 0) {
        fprintf(stderr, "usage: comm_ucx_peer run|kill|stall|toobig|abort|mismatch|moe DIR RANK SIZE "
                "[--tls T] [--iters N] [--deadline-ms MS] [--chunk B] [--slots K] "
                "[--max-payload P] [--seed S] [--tokens T] [--topk K] [--hidden H] "
                "[--experts E] [--warmup N]\n");
        return 2;
    }
    char ident[32];
    snprintf(ident, sizeof(ident), "comm_ucx_peer %u", A.rank);
    td_log_set_ident(ident);
    td_log_set_level(getenv("TD_LOG") ? TD_LOG_DEBUG : TD_LOG_WARN);

    struct event_base *base = event_base_new();
    td_xfer_t *x = NULL;
    td_comm_t *c = NULL;
    void **blobs = calloc(A.size, sizeof(void *));
    td_comm_ucx_peer_t *peers = calloc(A.size, sizeof(*peers));
    td_xfer_config_t xc = {
        .incarnation = ((uint64_t)getpid() << 20) | ((uint64_t)A.rank + 1),
        .transports = A.tls, .tcp_device = "lo", .max_payload = A.max_payload,
    };
    int rc = 1;
    if (base == NULL || blobs == NULL || peers == NULL)
        goto out;
    CHECK_STATUS(td_xfer_create(base, &xc, &x), TD_OK);
    if (x == NULL || exchange(x, blobs, peers) != 0)
        goto out;
    td_comm_opts_t opts = { .deadline_ms = A.deadline_ms, .name = "test comm" };
    td_comm_ucx_config_t cfg = { .chunk_bytes = A.chunk, .slots = A.slots };
    if (!strcmp(A.mode, "run"))
        bad_creates(x, peers, &opts, &cfg);
    uint64_t t0 = td_testutil_now_us();
    CHECK_STATUS(td_comm_ucx_create(x, A.rank, A.size, peers, &opts, &cfg, &c), TD_OK);
    if (c == NULL)
        goto out;
    CHECK_STR(td_comm_backend(c), "ucx");
    CHECK_EQ_INT(td_comm_rank(c), A.rank);
    CHECK_EQ_INT(td_comm_size(c), A.size);
    say("ready connect_us=%" PRIu64, td_testutil_now_us() - t0);
    if (!strcmp(A.mode, "run"))
        rc = mode_run(c);
    else if (!strcmp(A.mode, "moe"))
        rc = mode_moe(c);
    else
        rc = mode_fail(c);
out:
    td_comm_destroy(c);
    td_xfer_destroy(x);
    if (base)
        event_base_free(base);
    for (uint32_t r = 0; blobs && r < A.size; r++)
        free(blobs[r]);
    free(blobs);
    free(peers);
    if (rc != 0)
        td_check_failures++;
    say("exit failures=%d", td_check_failures);
    return td_check_exit("comm_ucx_peer");
}
