/* tests/unit/test_xfer.c — the UCX transfer engine inside one process: two
 * engines (sender, receiver) on one event loop, over shared memory and TCP:
 * integrity, bounds, stale incarnations, pool-export checks, cancel. */
#include "xfer.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "check.h"
#include "testtoken.h"
#include "testutil.h"
#include "log.h"
#include "rng.h"

#define MAX_XFERS 160

typedef struct {
    struct event_base *base;
    td_xfer_t *snd, *rcv;
    td_xfer_peer_t *peer;
    /* receiver's record of notifications, indexed by xfer id */
    int notes[MAX_XFERS];
    td_status_t note_status[MAX_XFERS];
    int notes_total;
    int notes_bad;            /* data or payload mismatch seen at note time */
    /* sender's record of completions */
    int done[MAX_XFERS];
    td_status_t done_status[MAX_XFERS];
    int done_total;
    /* what each transfer should have written, for checking at note time */
    struct {
        const uint8_t *src;
        uint8_t *dst;
        size_t len;
        uint32_t payload;
    } expect[MAX_XFERS];
} env_t;

static td_rng_t rng = { .state = TD_RNG_GAMMA };

static void
fill_random(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = td_rng_next(&rng);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)td_rng_next(&rng);
}

static void
on_note(td_xfer_t *x, const td_xfer_note_t *n, void *arg)
{
    env_t *e = arg;
    if (n->xfer_id >= MAX_XFERS) {
        e->notes_bad++;
        return;
    }
    e->notes[n->xfer_id]++;
    e->note_status[n->xfer_id] = n->status;
    e->notes_total++;
    CHECK(n->src_incarnation == td_xfer_incarnation(e->snd));
    CHECK(n->dst_incarnation == td_xfer_incarnation(e->rcv));
    if (n->status != TD_OK)
        return;
    /* the invariant under test: when the note arrives, every byte is there */
    if (e->expect[n->xfer_id].src &&
        memcmp(e->expect[n->xfer_id].src, e->expect[n->xfer_id].dst, e->expect[n->xfer_id].len))
        e->notes_bad++;
    uint32_t want = e->expect[n->xfer_id].payload;
    if (n->payload_len != sizeof(want) || memcmp(n->payload, &want, sizeof(want)))
        e->notes_bad++;
}

static void
on_done(td_xfer_t *x, uint64_t id, td_status_t st, void *arg)
{
    env_t *e = arg;
    CHECK(id < MAX_XFERS);
    if (id >= MAX_XFERS)
        return;
    e->done[id]++;
    e->done_status[id] = st;
    e->done_total++;
}

/* Run the loop until *counter >= want or timeout; returns 1 when reached. */
static int
run_until(env_t *e, const int *counter, int want, int timeout_ms)
{
    uint64_t until = td_testutil_now_ms() + (uint64_t)timeout_ms;
    while (*counter < want && td_testutil_now_ms() < until)
        event_base_loop(e->base, EVLOOP_ONCE);
    return *counter >= want;
}

static int
env_create(env_t *e, const char *tls, uint64_t target_incarnation)
{
    memset(e, 0, sizeof(*e));
    e->base = event_base_new();
    td_xfer_config_t cs = { .incarnation = 0x1111, .transports = tls };
    td_xfer_config_t cr = { .incarnation = 0x2222, .transports = tls };
    if (!e->base || td_xfer_create(e->base, &cs, &e->snd) != TD_OK)
        return -1;
    if (td_xfer_create(e->base, &cr, &e->rcv) != TD_OK)
        return -1;
    td_xfer_set_note_handler(e->rcv, on_note, e);
    td_xfer_set_note_auth(e->rcv, td_test_token_auth, NULL);
    void *addr;
    size_t alen;
    CHECK_STATUS(td_xfer_address(e->rcv, &addr, &alen), TD_OK);
    td_status_t st = td_xfer_peer_create(e->snd, addr, alen,
                                         target_incarnation ? target_incarnation : 0x2222,
                                         &e->peer);
    free(addr);
    CHECK_STATUS(st, TD_OK);
    return st == TD_OK ? 0 : -1;
}

static void
env_destroy(env_t *e)
{
    td_xfer_destroy(e->snd);
    td_xfer_destroy(e->rcv);
    event_base_free(e->base);
}

static td_xfer_pool_t *
pool_make(env_t *e, uint32_t id, void *base, size_t bs, uint64_t nb)
{
    td_xfer_pool_t *p = NULL;
    CHECK_STATUS(td_xfer_pool_create(e->rcv, id, TD_XFER_MEM_HOST, base, bs, nb, &p), TD_OK);
    if (!p)
        return NULL;
    void *buf;
    size_t len;
    CHECK_STATUS(td_xfer_pool_export(p, &buf, &len), TD_OK);
    CHECK_STATUS(td_xfer_peer_import_pool(e->peer, buf, len), TD_OK);
    free(buf);
    return p;
}

/* ---- integrity: 130 concurrent transfers, 64 B .. 4 MiB blocks ---------- */

static void
test_integrity(const char *tls)
{
    env_t *e = calloc(1, sizeof(*e));
    if (env_create(e, tls, 0) != 0) {
        CHECK(!"env create");
        free(e);
        return;
    }
    static const struct { size_t bs; uint64_t nb; int user_mem; } geo[] = {
        { 64, 64, 0 }, { 4096, 64, 0 }, { 65536, 40, 1 }, { 4u << 20, 6, 0 },
    };
    enum { NPOOLS = sizeof(geo) / sizeof(geo[0]) };
    td_xfer_pool_t *pools[NPOOLS];
    void *user_mem = NULL;
    uint64_t next_block[NPOOLS] = { 0 };
    size_t total = 0;
    for (int i = 0; i < NPOOLS; i++) {
        void *base = NULL;
        if (geo[i].user_mem)
            base = user_mem = aligned_alloc(4096, geo[i].bs * geo[i].nb);
        pools[i] = pool_make(e, (uint32_t)(10 + i), base, geo[i].bs, geo[i].nb);
        if (!pools[i])
            goto out;
        memset(td_xfer_pool_base(pools[i]), 0, geo[i].bs * geo[i].nb);
        total += geo[i].bs * geo[i].nb;
    }
    uint8_t *src = malloc(total);
    fill_random(src, total);
    size_t src_off = 0;
    int nx = 0;
    for (int k = 0; nx < 130 && k < 1000; k++) {
        int p = k % NPOOLS;
        if (next_block[p] == geo[p].nb)
            continue;
        uint64_t blk = next_block[p]++;
        size_t bs = geo[p].bs;
        /* one block in up to three pieces at random split points */
        size_t cut1 = (size_t)(td_rng_next(&rng) % bs), cut2 = (size_t)(td_rng_next(&rng) % bs);
        if (cut1 > cut2) {
            size_t t = cut1;
            cut1 = cut2;
            cut2 = t;
        }
        size_t cuts[4] = { 0, cut1, cut2, bs };
        td_xfer_desc_t d[3];
        for (int j = 0; j < 3; j++)
            d[j] = (td_xfer_desc_t){ .src = src + src_off + cuts[j], .pool_id = (uint32_t)(10 + p),
                                     .block = blk, .offset = cuts[j], .len = cuts[j + 1] - cuts[j] };
        e->expect[nx].src = src + src_off;
        e->expect[nx].dst = (uint8_t *)td_xfer_pool_base(pools[p]) + blk * bs;
        e->expect[nx].len = bs;
        e->expect[nx].payload = (uint32_t)td_rng_next(&rng);
        src_off += bs;
        CHECK_STATUS(td_xfer_post(e->peer, (uint64_t)nx, td_test_tokp((uint64_t)nx),
                                  d, 3, &e->expect[nx].payload,
                                  sizeof(uint32_t), 10000, on_done, e), TD_OK);
        nx++;
    }
    CHECK_EQ_INT(nx, 130);
    td_xfer_stats_t st;
    td_xfer_stats(e->snd, &st);
    CHECK_EQ_INT(st.inflight, 130); /* done runs only from the loop */
    CHECK_EQ_INT(st.posted, 130);
    CHECK(run_until(e, &e->notes_total, nx, 30000));
    CHECK(run_until(e, &e->done_total, nx, 5000));
    CHECK_EQ_INT(e->notes_bad, 0);
    for (int i = 0; i < nx; i++) {
        CHECK_EQ_INT(e->done[i], 1);
        CHECK_STATUS(e->done_status[i], TD_OK);
        CHECK_EQ_INT(e->notes[i], 1);
        CHECK(memcmp(e->expect[i].src, e->expect[i].dst, e->expect[i].len) == 0);
    }
    td_xfer_stats(e->snd, &st);
    CHECK_EQ_INT(st.completed, 130);
    CHECK_EQ_INT(st.inflight, 0);
    CHECK_EQ_INT(st.failed, 0);
    CHECK_EQ_INT(st.bytes_sent, src_off);
    td_xfer_stats(e->rcv, &st);
    CHECK_EQ_INT(st.notes_received, 130);
    CHECK_EQ_INT(st.notes_stale, 0);
    free(src);
out:
    env_destroy(e);
    free(user_mem);
    free(e);
}

/* ---- bounds: refused before anything is written; receiver told ---------- */

static void
test_bounds(void)
{
    env_t *e = calloc(1, sizeof(*e));
    if (env_create(e, "shm,self", 0) != 0) {
        CHECK(!"env create");
        free(e);
        return;
    }
    enum { BS = 4096, NB = 4 };
    td_xfer_pool_t *p = pool_make(e, 1, NULL, BS, NB);
    uint8_t *pool = td_xfer_pool_base(p);
    memset(pool, 0xa5, BS * NB);
    static uint8_t src[2 * BS];
    memset(src, 0x3c, sizeof(src));
    static const struct {
        const char *name;
        uint32_t pool;
        uint64_t block, offset, len;
        td_status_t want;
    } cases[] = {
        { "block past the pool", 1, NB, 0, 16, TD_ERR_RANGE },
        { "huge block index", 1, UINT64_MAX, 0, 16, TD_ERR_RANGE },
        { "piece past the block", 1, 0, BS - 8, 16, TD_ERR_RANGE },
        { "longer than a block", 1, 1, 0, BS + 1, TD_ERR_RANGE },
        { "offset past the block", 1, 2, BS + 1, 0, TD_ERR_RANGE },
        { "offset + len overflows", 1, 0, UINT64_MAX - 8, 16, TD_ERR_RANGE },
        { "len overflows", 1, 0, 8, UINT64_MAX - 4, TD_ERR_RANGE },
        { "unknown pool", 77, 0, 0, 16, TD_ERR_NOT_FOUND },
    };
    enum { NCASES = sizeof(cases) / sizeof(cases[0]) };
    for (int i = 0; i < NCASES; i++) {
        /* a valid first piece: nothing at all may be written when a later one is bad */
        td_xfer_desc_t d[2] = {
            { .src = src, .pool_id = 1, .block = 3, .offset = 0, .len = 64 },
            { .src = src, .pool_id = cases[i].pool, .block = cases[i].block,
              .offset = cases[i].offset, .len = cases[i].len },
        };
        td_status_t got = td_xfer_post(e->peer, (uint64_t)i, td_test_tokp((uint64_t)i),
                                       d, 2, NULL, 0, 0, on_done, e);
        if (got != cases[i].want)
            fprintf(stderr, "bounds case '%s'\n", cases[i].name);
        CHECK_STATUS(got, cases[i].want);
    }
    /* payload larger than max_payload */
    char big[8192] = { 0 };
    td_xfer_desc_t ok = { .src = src, .pool_id = 1, .block = 0, .offset = 0, .len = 64 };
    CHECK_STATUS(td_xfer_post(e->peer, NCASES, td_test_tokp(NCASES),
                              &ok, 1, big, sizeof(big), 0, on_done, e),
                 TD_ERR_TOO_BIG);
    CHECK(run_until(e, &e->notes_total, NCASES + 1, 5000));
    for (int i = 0; i <= NCASES; i++) {
        CHECK_EQ_INT(e->notes[i], 1);
        CHECK(e->note_status[i] == (i < NCASES ? cases[i].want : TD_ERR_TOO_BIG));
        CHECK_EQ_INT(e->done[i], 0);
    }
    int untouched = 1;
    for (size_t i = 0; i < BS * NB; i++)
        untouched &= pool[i] == 0xa5;
    CHECK(untouched);
    td_xfer_stats_t st;
    td_xfer_stats(e->snd, &st);
    CHECK_EQ_INT(st.rejected, NCASES + 1);
    CHECK_EQ_INT(st.posted, 0);
    /* a zero-length piece at the very end of the pool is in bounds */
    td_xfer_desc_t edge = { .src = src, .pool_id = 1, .block = NB - 1, .offset = BS, .len = 0 };
    CHECK_STATUS(td_xfer_post(e->peer, 100, td_test_tokp(100),
                              &edge, 1, NULL, 0, 0, on_done, e), TD_OK);
    CHECK(run_until(e, &e->done_total, 1, 5000));
    CHECK_STATUS(e->done_status[100], TD_OK);
    env_destroy(e);
    free(e);
}

/* ---- a notification for another incarnation is dropped ------------------ */

static void
test_stale(void)
{
    env_t *e = calloc(1, sizeof(*e));
    /* the sender believes the receiver is incarnation 0x2221 (its predecessor) */
    if (env_create(e, "shm,self", 0x2221) != 0) {
        CHECK(!"env create");
        free(e);
        return;
    }
    td_xfer_pool_t *p = pool_make(e, 1, NULL, 256, 2);
    (void)p;
    static uint8_t src[256];
    td_xfer_desc_t d = { .src = src, .pool_id = 1, .block = 0, .offset = 0, .len = 256 };
    CHECK_STATUS(td_xfer_post(e->peer, 5, td_test_tokp(5), &d, 1, NULL, 0, 0, on_done, e), TD_OK);
    CHECK(run_until(e, &e->done_total, 1, 5000));
    td_xfer_stats_t st;
    uint64_t until = td_testutil_now_ms() + 5000;
    do {
        event_base_loop(e->base, EVLOOP_NONBLOCK);
        td_xfer_stats(e->rcv, &st);
    } while (st.notes_stale == 0 && td_testutil_now_ms() < until);
    CHECK_EQ_INT(st.notes_stale, 1);
    CHECK_EQ_INT(st.notes_received, 0);
    CHECK_EQ_INT(e->notes_total, 0);
    env_destroy(e);
    free(e);
}

/* ---- the receiver polls on after a note only while it expects more ------ */

static bool
expect_none(td_xfer_t *x, void *arg)
{
    (void)x;
    ++*(int *)arg;
    return false;
}

/* One transfer of rounds: the receiver's rx_spins after them. */
static uint64_t
spins_after(env_t *e, int rounds)
{
    static uint8_t src[256];
    td_xfer_desc_t d = { .src = src, .pool_id = 1, .block = 0, .offset = 0, .len = 256 };
    td_xfer_stats_t st;
    int want = e->notes_total + rounds;

    for (int i = 0; i < rounds; i++) {
        uint32_t id = (uint32_t)(e->notes_total + 1);
        e->expect[id].payload = id;
        CHECK_STATUS(td_xfer_post(e->peer, id, td_test_tokp(id), &d, 1, &e->expect[id].payload,
                                  sizeof(uint32_t), 0, on_done, e), TD_OK);
        CHECK(run_until(e, &e->notes_total, e->notes_total + 1, 5000));
    }
    CHECK_EQ_INT(e->notes_total, want);
    td_xfer_stats(e->rcv, &st);
    return st.rx_spins;
}

static void
test_note_expect(const char *tls)
{
    env_t *e = calloc(1, sizeof(*e));
    int asked = 0;

    if (env_create(e, tls, 0) != 0) {
        CHECK(!"env create");
        free(e);
        return;
    }
    (void)pool_make(e, 1, NULL, 256, 2);
    uint64_t before = spins_after(e, 3);   /* unset: always expected */
    CHECK(before > 0);
    td_xfer_set_note_expect(e->rcv, expect_none, &asked);
    CHECK_EQ_INT(spins_after(e, 3), before);   /* none expected: no polling on */
    CHECK(asked >= 3);
    CHECK_EQ_INT(e->notes_bad, 0);
    env_destroy(e);
    free(e);
}

/* ---- exported pool bytes are untrusted ---------------------------------- */
static void
test_import_checks(void)
{
    env_t *e = calloc(1, sizeof(*e));
    if (env_create(e, "shm,self", 0) != 0) {
        CHECK(!"env create");
        free(e);
        return;
    }
    td_xfer_pool_t *p = NULL;
    CHECK_STATUS(td_xfer_pool_create(e->rcv, 3, TD_XFER_MEM_HOST, NULL, 1024, 8, &p), TD_OK);
    CHECK_STATUS(td_xfer_pool_create(e->rcv, 3, TD_XFER_MEM_HOST, NULL, 1024, 8, &p),
                 TD_ERR_INVALID);
    CHECK_STATUS(td_xfer_pool_create(e->rcv, 4, TD_XFER_MEM_HOST, NULL, 0, 8, &p),
                 TD_ERR_INVALID);
    CHECK_STATUS(td_xfer_pool_create(e->rcv, 4, TD_XFER_MEM_HOST, NULL, SIZE_MAX / 2, 4, &p),
                 TD_ERR_INVALID);
    CHECK(td_xfer_pool_nblocks(p) == 8 && td_xfer_pool_block_size(p) == 1024);
    uint8_t *buf;
    size_t len;
    CHECK_STATUS(td_xfer_pool_export(p, (void **)&buf, &len), TD_OK);
    uint8_t *bad = malloc(len);
    static const struct { const char *name; size_t at; uint8_t val; size_t len_delta; td_status_t want; } cases[] = {
        { "bad magic", 0, 0x00, 0, TD_ERR_PROTO },
        { "bad version", 4, 0x09, 0, TD_ERR_PROTO },
        { "bad memory type", 6, 0x07, 0, TD_ERR_PROTO },
        { "rkey length too long", 15, 0x01, 0, TD_ERR_PROTO },
        { "zero block size", 24, 0, 0, TD_ERR_PROTO }, /* whole field zeroed below */
        { "geometry overflows", 39, 0xff, 0, TD_ERR_PROTO },
        { "truncated", 0, 0, 1, TD_ERR_PROTO },
        { "header only", 0, 0, (size_t)-1, TD_ERR_PROTO },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, buf, len);
        size_t blen = len;
        if (cases[i].len_delta == (size_t)-1)
            blen = 40;
        else if (cases[i].len_delta)
            blen = len - cases[i].len_delta;
        else if (cases[i].at == 24)
            memset(bad + 24, 0, 8);
        else
            bad[cases[i].at] = cases[i].val;
        td_status_t got = td_xfer_peer_import_pool(e->peer, bad, blen);
        if (got != cases[i].want)
            fprintf(stderr, "import case '%s'\n", cases[i].name);
        CHECK_STATUS(got, cases[i].want);
    }
    CHECK_STATUS(td_xfer_peer_import_pool(e->peer, buf, 7), TD_ERR_PROTO);
    CHECK_STATUS(td_xfer_peer_import_pool(e->peer, buf, len), TD_OK);
    CHECK_STATUS(td_xfer_peer_import_pool(e->peer, buf, len), TD_ERR_INVALID);
    free(bad);
    free(buf);
    /* engine arguments */
    td_xfer_t *x = NULL;
    td_xfer_config_t c0 = { .incarnation = 0 };
    CHECK_STATUS(td_xfer_create(e->base, &c0, &x), TD_ERR_INVALID);
    CHECK(x == NULL);
    td_xfer_config_t spin = { .incarnation = 5, .transports = "tcp,self", .rx_spin_us = 20000 };
    CHECK_STATUS(td_xfer_create(e->base, &spin, &x), TD_ERR_INVALID); /* > 10 ms */
    CHECK(x == NULL);
    spin.rx_spin_us = TD_XFER_RX_SPIN_OFF;
    CHECK_STATUS(td_xfer_create(e->base, &spin, &x), TD_OK);
    td_xfer_destroy(x);
    CHECK_STATUS(td_xfer_pool_create(e->rcv, 9, TD_XFER_MEM_CUDA, NULL, 1024, 1, &p),
                 TD_ERR_UNSUPPORTED); /* no GPU transports on the test machines */
    env_destroy(e);
    free(e);
}

/* ---- destroying a peer ends its transfers exactly once ------------------ */

static void
test_peer_destroy(void)
{
    env_t *e = calloc(1, sizeof(*e));
    if (env_create(e, "tcp,self", 0) != 0) {
        CHECK(!"env create");
        free(e);
        return;
    }
    enum { BS = 1u << 20 };
    pool_make(e, 1, NULL, BS, 16);
    uint8_t *src = calloc(1, BS);
    for (int i = 0; i < 16; i++) {
        td_xfer_desc_t d = { .src = src, .pool_id = 1, .block = (uint64_t)i, .len = BS };
        CHECK_STATUS(td_xfer_post(e->peer, (uint64_t)i, td_test_tokp((uint64_t)i),
                                  &d, 1, NULL, 0, 0, on_done, e), TD_OK);
    }
    td_xfer_peer_destroy(e->peer);
    e->peer = NULL;
    CHECK(run_until(e, &e->done_total, 16, 5000));
    for (int i = 0; i < 16; i++) {
        CHECK_EQ_INT(e->done[i], 1);
        CHECK(e->done_status[i] == TD_OK || e->done_status[i] == TD_ERR_CANCELED);
    }
    td_xfer_stats_t st;
    td_xfer_stats(e->snd, &st);
    CHECK_EQ_INT(st.inflight, 0);
    CHECK_EQ_INT(st.completed + st.failed, 16);
    CHECK(st.failed > 0); /* 16 MiB over TCP cannot all finish inline */
    env_destroy(e);
    free(src);
    free(e);
}

static void
on_peer_fail(td_xfer_t *x, td_xfer_peer_t *peer, td_status_t st, void *arg)
{
    (*(int *)arg)++;
}

/* Post 64 KiB transfers until one stays in flight: the stalled receiver's
 * shared-memory FIFO (or TCP socket) is full. Returns the number posted. */
static int
fifo_fill(env_t *e, uint32_t pool_id, const void *src)
{
    td_xfer_stats_t st = { 0 };
    td_xfer_desc_t d = { .src = src, .pool_id = pool_id, .len = 65536 };
    int posted = 0;
    while (posted < 4096 && st.inflight == 0) {
        d.block = (uint64_t)posted % 4;
        CHECK_STATUS(td_xfer_post(e->peer, 0, td_test_tokp(0),
                                  &d, 1, NULL, 0, 0, on_done, e), TD_OK);
        posted++;
        td_xfer_progress(e->snd);
        td_xfer_stats(e->snd, &st);
    }
    CHECK(st.inflight > 0);
    return posted;
}

/* ---- a receiver that stops taking notifications (its loop stalled) ------- */

/* With the receiver's FIFO full, a refused post's failure note cannot go out:
 * it carries the post's deadline (the sweep fails the peer), and destroying
 * the sender with such a note pending does not wait out the close timeout. */
static void
test_stalled_receiver(const char *tls)
{
    env_t *e = calloc(1, sizeof(*e));
    struct event_base *rbase = event_base_new();
    e->base = event_base_new();
    td_xfer_config_t cs = { .incarnation = 0x1111, .transports = tls };
    td_xfer_config_t cr = { .incarnation = 0x2222, .transports = tls };
    if (!e->base || !rbase || td_xfer_create(e->base, &cs, &e->snd) != TD_OK ||
        td_xfer_create(rbase, &cr, &e->rcv) != TD_OK) {
        CHECK(!"env create");
        return;
    }
    int fails = 0;
    td_xfer_set_peer_fail_handler(e->snd, on_peer_fail, &fails);
    void *addr;
    size_t alen;
    CHECK_STATUS(td_xfer_address(e->rcv, &addr, &alen), TD_OK);
    CHECK_STATUS(td_xfer_peer_create(e->snd, addr, alen, 0x2222, &e->peer), TD_OK);
    pool_make(e, 1, NULL, 65536, 4);
    uint8_t *src = calloc(1, 65536);
    td_xfer_desc_t bad = { .src = src, .pool_id = 1, .block = 99, .len = 64 };

    fifo_fill(e, 1, src);
    CHECK_STATUS(td_xfer_post(e->peer, 1, td_test_tokp(1),
                              &bad, 1, NULL, 0, 100, on_done, e), TD_ERR_RANGE);
    uint64_t t0 = td_testutil_now_ms();
    CHECK(run_until(e, &fails, 1, 3000));   /* the note's deadline failed the peer */
    CHECK(td_testutil_now_ms() - t0 < 1000);
    CHECK_EQ_INT(e->done[1], 0);            /* a refused post has no done */
    td_xfer_peer_destroy(e->peer);

    /* again with no deadline, then destroy the sender with the note pending */
    CHECK_STATUS(td_xfer_peer_create(e->snd, addr, alen, 0x2222, &e->peer), TD_OK);
    free(addr);
    pool_make(e, 2, NULL, 65536, 4);
    bad.pool_id = 2;
    fifo_fill(e, 2, src);
    CHECK_STATUS(td_xfer_post(e->peer, 2, td_test_tokp(2),
                              &bad, 1, NULL, 0, 0, on_done, e), TD_ERR_RANGE);
    t0 = td_testutil_now_ms();
    td_xfer_destroy(e->snd);
    CHECK(td_testutil_now_ms() - t0 < 1000);
    td_xfer_destroy(e->rcv);
    event_base_free(e->base);
    event_base_free(rbase);
    free(src);
    free(e);
}

/* ---- map_peer_pools: a pool that shm attaches to the sender is mapped in - */

static void
test_map_peer_pools(const char *tls, int mapped)
{
    struct event_base *base = event_base_new();
    td_xfer_config_t cs = { .incarnation = 0x1111, .transports = tls, .map_peer_pools = 1 };
    td_xfer_config_t cr = { .incarnation = 0x2222, .transports = tls };
    td_xfer_t *snd = NULL, *rcv = NULL;
    td_xfer_peer_t *peer = NULL;   /* tcp: nothing is attached here, nothing to map */
    td_xfer_pool_t *pool = NULL;
    void *buf = NULL;
    size_t len = 0;
    const size_t bs = 1 << 20, nb = 24;   /* 6 chunks */

    CHECK_STATUS(td_xfer_create(base, &cs, &snd), TD_OK);
    CHECK_STATUS(td_xfer_create(base, &cr, &rcv), TD_OK);
    CHECK_STATUS(td_xfer_address(rcv, &buf, &len), TD_OK);
    CHECK_STATUS(td_xfer_peer_create(snd, buf, len, 0x2222, &peer), TD_OK);
    free(buf);
    CHECK_STATUS(td_xfer_pool_create(rcv, 7, TD_XFER_MEM_HOST, NULL, bs, nb, &pool), TD_OK);
    CHECK_STATUS(td_xfer_pool_export(pool, &buf, &len), TD_OK);
    CHECK_STATUS(td_xfer_peer_import_pool(peer, buf, len), TD_OK);
    free(buf);
    td_xfer_stats_t st;
    uint64_t until = td_testutil_now_ms() + (mapped ? 5000 : 200);
    do {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        td_xfer_stats(snd, &st);
    } while (st.peer_bytes_mapped < bs * nb && td_testutil_now_ms() < until);
    CHECK(st.peer_bytes_mapped == (mapped ? bs * nb : 0));
    td_xfer_destroy(snd);   /* and its peer */
    td_xfer_destroy(rcv);
    event_base_free(base);
}

int
main(void)
{
    td_log_set_ident("test_xfer");
    td_log_set_level(getenv("TD_LOG") ? TD_LOG_TRACE : TD_LOG_ERROR);
    test_integrity("shm,self");
    test_integrity("tcp,self");
    test_bounds();
    test_stale();
    test_note_expect("shm,self");
    test_note_expect("tcp,self");
    test_import_checks();
    test_peer_destroy();
    test_stalled_receiver("shm,self");
    test_stalled_receiver("tcp,self");
    test_map_peer_pools("shm,self", 1);
    test_map_peer_pools("tcp,self", 0);
    return td_check_exit("test_xfer");
}
