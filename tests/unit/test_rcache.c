/* tests/unit/test_rcache.c — routerd/rcache.c and the prefill choice of
 * routerd/rsched.c: CacheEvents applied in order (cleared, added, removed),
 * malformed ones emptying the set, the cap reported once, deletion keeping
 * every other hash findable, longest cached prefixes per block size, and
 * the cost that weighs a rank's queue against what its cache holds. */
#include <stdlib.h>
#include <string.h>

#include "chainhash.h"
#include "check.h"
#include "rcache.h"
#include "rsched.h"

static td_status_t
ev(td_rcache_t *c, uint64_t seq, bool cleared, const uint64_t *add, size_t na,
   const uint64_t *rem, size_t nr)
{
    td_rcache_event_t e = { seq, cleared, add, na, rem, nr };
    const char *why = NULL;
    td_status_t st = td_rcache_apply(c, &e, &why);

    if (st == TD_ERR_PROTO)
        CHECK(why != NULL);
    return st;
}

static void
test_events(void)
{
    static const struct {
        uint64_t seq;
        bool cleared;
        uint64_t add[3], rem[2];
        td_status_t want;
        size_t n;          /* held after */
        uint64_t has, hasnt;
    } steps[] = {
        { 1, false, { 10, 11, 12 }, { 0, 0 }, TD_OK, 3, 12, 13 },
        { 2, false, { 13, 0, 0 }, { 10, 0 }, TD_OK, 3, 13, 10 },
        { 3, true, { 20, 0, 0 }, { 0, 0 }, TD_OK, 1, 20, 11 },     /* cleared, then added */
        { 3, false, { 21, 0, 0 }, { 0, 0 }, TD_ERR_PROTO, 0, 0, 20 },  /* seq repeated */
        { 4, false, { 22, 0, 0 }, { 0, 0 }, TD_OK, 1, 22, 21 },    /* goes on after it */
        { 9, false, { 23, 0, 0 }, { 0, 0 }, TD_ERR_PROTO, 0, 0, 22 },  /* seq skipped */
        { 2, false, { 23, 0, 0 }, { 0, 0 }, TD_ERR_PROTO, 0, 0, 22 },  /* backwards */
        { 14, true, { 30, 31, 0 }, { 0, 0 }, TD_OK, 2, 31, 23 },    /* a full list skips */
        { 15, false, { 0, 0, 0 }, { 30, 0 }, TD_OK, 1, 31, 30 },
        { 15, true, { 32, 0, 0 }, { 0, 0 }, TD_ERR_PROTO, 0, 0, 32 },  /* but not back */
    };
    td_rcache_t c;

    td_rcache_init(&c, 100);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t na = 0, nr = 0;
        while (na < 3 && steps[i].add[na])
            na++;
        while (nr < 2 && steps[i].rem[nr])
            nr++;
        CHECK_STATUS(ev(&c, steps[i].seq, steps[i].cleared, steps[i].add, na, steps[i].rem, nr),
                     steps[i].want);
        CHECK_EQ_INT(c.n, steps[i].n);
        if (steps[i].has)
            CHECK(td_rcache_has(&c, steps[i].has));
        CHECK(!td_rcache_has(&c, steps[i].hasnt));
    }
    /* a 0 hash is malformed */
    uint64_t z[] = { 5, 0 };
    CHECK_STATUS(ev(&c, 3, false, z, 2, NULL, 0), TD_ERR_PROTO);
    CHECK_EQ_INT(c.n, 0);
    /* a new connection starts at seq 1 again */
    td_rcache_clear(&c, true);
    CHECK_STATUS(ev(&c, 1, false, z, 1, NULL, 0), TD_OK);
    td_rcache_fini(&c);
}

static void
test_cap(void)
{
    uint64_t h[10];
    td_rcache_t c;

    for (int i = 0; i < 10; i++)
        h[i] = 100 + (uint64_t)i;
    td_rcache_init(&c, 4);
    CHECK_STATUS(ev(&c, 1, false, h, 6, NULL, 0), TD_ERR_TOO_BIG);   /* reported once */
    CHECK_EQ_INT(c.n, 4);
    CHECK_STATUS(ev(&c, 2, false, h + 6, 2, NULL, 0), TD_OK);       /* still over: quiet */
    CHECK_STATUS(ev(&c, 3, true, h, 2, NULL, 0), TD_OK);            /* cleared: under again */
    CHECK_EQ_INT(c.n, 2);
    CHECK_STATUS(ev(&c, 4, false, h + 2, 5, NULL, 0), TD_ERR_TOO_BIG);
    td_rcache_fini(&c);
}

/* Many hashes in few home slots (the low bits equal): deleting some keeps
 * every other one findable (backward shift across wrapped runs). */
static void
test_delete(void)
{
    enum { N = 3000 };
    uint64_t *h = malloc(N * sizeof *h);
    td_rcache_t c;
    uint64_t seq = 1;

    td_rcache_init(&c, N);
    for (size_t i = 0; i < N; i++)
        h[i] = ((uint64_t)(i + 1) << 20) | (i % 7 == 0 ? 1023u : (uint64_t)(i % 5));
    CHECK_STATUS(ev(&c, seq++, false, h, N, NULL, 0), TD_OK);
    CHECK_EQ_INT(c.n, N);
    for (size_t i = 0; i < N; i += 3)
        CHECK_STATUS(ev(&c, seq++, false, NULL, 0, &h[i], 1), TD_OK);
    size_t bad = 0;
    for (size_t i = 0; i < N; i++)
        bad += td_rcache_has(&c, h[i]) != (i % 3 != 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(c.n, N - (N + 2) / 3);
    td_rcache_fini(&c);
    free(h);
}

static void
test_prefix(void)
{
    int32_t tok[40];
    td_rcache_prompt_t p;
    td_rcache_t c;
    const uint64_t *h8, *h16;
    size_t n8, n16;
    uint64_t seed = td_chain_seed("0123456789abcdef", 42);

    for (int i = 0; i < 40; i++)
        tok[i] = i * 7;
    td_rcache_prompt_init(&p, seed, tok, 40);
    h8 = td_rcache_prompt_hashes(&p, 8, &n8);
    h16 = td_rcache_prompt_hashes(&p, 16, &n16);
    CHECK_EQ_INT(n8, 5);
    CHECK_EQ_INT(n16, 2);
    CHECK(td_rcache_prompt_hashes(&p, 8, &n8) == h8);   /* computed once */
    CHECK(td_rcache_prompt_hashes(&p, 64, &n8) == NULL && n8 == 0);   /* no whole block */
    CHECK(td_rcache_prompt_hashes(&p, 0, &n8) == NULL && n8 == 0);
    h8 = td_rcache_prompt_hashes(&p, 8, &n8);
    uint64_t want;
    td_chain_hashes(seed, tok, 40, 8, &want, 1);
    CHECK(h8[0] == want);

    td_rcache_init(&c, 100);
    CHECK_STATUS(ev(&c, 1, false, h8, 3, NULL, 0), TD_OK);   /* blocks 0..2 */
    CHECK_EQ_INT(td_rcache_prefix(&c, h8, n8), 3);
    CHECK_STATUS(ev(&c, 2, false, NULL, 0, &h8[1], 1), TD_OK);   /* a hole at block 1 */
    CHECK_EQ_INT(td_rcache_prefix(&c, h8, n8), 1);
    CHECK_EQ_INT(td_rcache_prefix(&c, h16, n16), 0);   /* other block size, other hashes */
    td_rcache_fini(&c);
    td_rcache_prompt_fini(&p);
}

/* ---- The prefill choice --------------------------------------------------- */

typedef struct {
    td_rrank_t rk;
    Tandem__Register reg;
    td_rrank_node_t node;
} fx_rank_t;

static void
fx_rank(fx_rank_t *f, td_rrank_t *next, uint32_t id, uint32_t g, uint64_t queued)
{
    memset(f, 0, sizeof *f);
    tandem__register__init(&f->reg);
    f->reg.cache_block_tokens = g;
    f->reg.dep_domain = (char *)"";
    snprintf(f->node.name, sizeof f->node.name, "n%u", id);
    f->rk.next = next;
    f->rk.node = &f->node;
    f->rk.rank_id = id;
    f->rk.role = TANDEM__ROLE__ROLE_PREFILL;
    f->rk.conn = (td_ctl_conn_t *)(void *)f;   /* connected (never sent to here) */
    f->rk.reg = &f->reg;
    f->rk.load.queued_tokens = queued;
    td_rcache_init(&f->rk.cache, 1000);
}

static void
test_pick(void)
{
    int32_t tok[64];
    fx_rank_t a, b, c;
    td_rcache_prompt_t p;
    td_rsched_prefill_t pk;
    const uint64_t *h;
    size_t n;

    for (int i = 0; i < 64; i++)
        tok[i] = 1000 + i;
    /* table order c, b, a; a and b have caches of 16-token blocks */
    fx_rank(&a, NULL, 0, 16, 100);
    fx_rank(&b, &a.rk, 1, 16, 10);
    fx_rank(&c, &b.rk, 2, 0, 50);
    td_rcache_prompt_init(&p, 7, tok, 64);

    /* nothing cached anywhere: by load (b, the shortest queue) */
    pk = td_rsched_pick_prefill(&c.rk, &p, 1.0);
    CHECK(pk.rank == &b.rk && pk.cached_tokens == 0 && !pk.by_cache);

    /* a holds 3 of the prompt's 4 blocks: 100 + 64 - 48 = 116 > 10 + 64: still b */
    h = td_rcache_prompt_hashes(&p, 16, &n);
    CHECK_EQ_INT(n, 4);
    CHECK_STATUS(ev(&a.rk.cache, 1, false, h, 3, NULL, 0), TD_OK);
    pk = td_rsched_pick_prefill(&c.rk, &p, 1.0);
    CHECK(pk.rank == &b.rk && !pk.by_cache);
    /* with weight 3: 100 + 64 - 144 = 20 < 74: a, for its cache */
    pk = td_rsched_pick_prefill(&c.rk, &p, 3.0);
    CHECK(pk.rank == &a.rk && pk.cached_tokens == 48 && pk.by_cache);
    /* a's queue shrinks: a at weight 1 too (20 + 64 - 48 = 36 < 74) */
    a.rk.load.queued_tokens = 20;
    pk = td_rsched_pick_prefill(&c.rk, &p, 1.0);
    CHECK(pk.rank == &a.rk && pk.cached_tokens == 48 && pk.by_cache);
    /* weight 0: by load only (the first of the equal queues: c) */
    c.rk.load.queued_tokens = 0;
    pk = td_rsched_pick_prefill(&c.rk, &p, 0.0);
    CHECK(pk.rank == &c.rk && pk.cached_tokens == 0 && !pk.by_cache);
    /* equal cost: the fewest bound requests */
    a.rk.load.queued_tokens = 0;
    c.rk.inflight = 1;
    pk = td_rsched_pick_prefill(&c.rk, &p, 0.0);
    CHECK(pk.rank == &a.rk && !pk.by_cache);
    /* a not up: by load among the others (c: 0 queued) */
    a.rk.conn = NULL;
    pk = td_rsched_pick_prefill(&c.rk, &p, 1.0);
    CHECK(pk.rank == &c.rk && !pk.by_cache);
    /* no prompt (or none up) */
    pk = td_rsched_pick_prefill(NULL, &p, 1.0);
    CHECK(pk.rank == NULL);

    td_rcache_prompt_fini(&p);
    td_rcache_fini(&a.rk.cache);
    td_rcache_fini(&b.rk.cache);
    td_rcache_fini(&c.rk.cache);
}

int
main(void)
{
    test_events();
    test_cap();
    test_delete();
    test_prefix();
    test_pick();
    return td_check_exit("test_rcache");
}
