/* tests/unit/test_des.c — the cluster model (sim/des/des.c) on
 * scenarios checked by hand: a request alone, a prefix cache hit, decode
 * admission waiting for blocks, colocated serving, reproducible Poisson
 * arrivals, and the router's cache-aware pick (routerd's rsched) against
 * load within and beyond the weight. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "des.h"

#define CHECK_NEAR(a, b)                                                     \
    do {                                                                     \
        double a_ = (a), b_ = (b);                                           \
        if (fabs(a_ - b_) > 1e-9) {                                          \
            fprintf(stderr, "%s:%d: %s = %.9f, want %.9f\n", __FILE__, __LINE__, \
                    #a, a_, b_);                                             \
            td_check_failures++;                                             \
        }                                                                    \
    } while (0)

/* prefill = 1 + 0.01 / token; decode step = 0.5; xfer = 0.25 + 0.001 / token */
static td_des_linear_t lin = {
    .prefill_fixed_s = 1, .prefill_token_s = 0.01,
    .decode_fixed_s = 0.5,
    .xfer_fixed_s = 0.25, .xfer_token_s = 0.001,
};

/* Blocks of 16 tokens everywhere; one prefill rank, one decode rank. */
static td_des_config_t
small_config(void)
{
    td_des_config_t c;

    td_des_config_defaults(&c);
    c.prefill_groups = 1;
    c.group_gpus = 1;
    c.decode_gpus = 1;
    c.decode_domain = 1;
    c.chunk_tokens = 1u << 20;
    c.cache_block_tokens = 16;
    c.cache_blocks = 64;
    c.kv_tokens = 1024;
    c.kv_block_tokens = 16;
    c.max_batch = 4;
    c.max_context = 1024;
    c.trace_block_tokens = 16;
    c.cost = td_des_linear_cost(&lin);
    return c;
}

static td_des_req_t
req(double t, uint32_t input, uint32_t output, const uint64_t *ids, uint32_t nids)
{
    return (td_des_req_t){ .t_arrive = t, .input = input, .output = output, .nblocks = nids,
                           .block_ids = ids };
}

static void
run(const td_des_config_t *c, td_des_req_t *r, size_t n)
{
    td_des_t *d;

    CHECK_STATUS(td_des_create(c, &d), TD_OK);
    CHECK_STATUS(td_des_run(d, r, n), TD_OK);
    td_des_destroy(d);
}

/* TTFT = queue 0 + prefill + xfer (the prefill samples the first token, the
 * decode rank sends it when it adopts the KV); TPOT = the decode step. */
static void
test_alone(void)
{
    static const uint64_t ids[] = { 1, 2, 3, 4 };
    td_des_config_t c = small_config();
    td_des_req_t r = req(0, 64, 3, ids, 4);

    run(&c, &r, 1);
    CHECK_EQ_INT(r.outcome, TD_DES_DONE);
    CHECK_NEAR(r.t_admit, 0);
    CHECK_NEAR(r.t_prefill_end, 1 + 0.64);
    CHECK_NEAR(r.t_first, 1 + 0.64 + 0.25 + 0.064);
    CHECK_NEAR(r.t_last - r.t_first, 2 * 0.5);
    CHECK_EQ_INT(r.cached_tokens, 0);

    /* one output token: done at adoption, no decode step */
    r = req(0, 64, 1, ids, 4);
    run(&c, &r, 1);
    CHECK_EQ_INT(r.outcome, TD_DES_DONE);
    CHECK_NEAR(r.t_last, r.t_first);

    /* KV arriving during a step is adopted when the step ends: the second
     * request's prefill waits for the first's (ends 3.28), its xfer ends at
     * 3.594, inside the first's decode steps (1.954 + k * 0.5): adopted at
     * 3.954 */
    static const uint64_t ids2[] = { 5, 6, 7, 8 };
    td_des_req_t two[2] = { req(0, 64, 10, ids, 4), req(0, 64, 3, ids2, 4) };
    run(&c, two, 2);
    CHECK_NEAR(two[1].t_prefill_end, 2 * 1.64);
    CHECK_NEAR(two[1].t_first, 1.954 + 4 * 0.5);
}

/* The second prompt shares three blocks: its prefill computes only the
 * fourth, and the router expected it (the rank announced its blocks). */
static void
test_prefix_hit(void)
{
    static const uint64_t a[] = { 1, 2, 3, 4 }, b[] = { 1, 2, 3, 9 };
    td_des_config_t c = small_config();
    td_des_req_t r[2] = { req(0, 64, 2, a, 4), req(10, 64, 2, b, 4) };

    run(&c, r, 2);
    CHECK_EQ_INT(r[1].outcome, TD_DES_DONE);
    CHECK_EQ_INT(r[1].cached_tokens, 48);
    CHECK_EQ_INT(r[1].pred_cached, 48);
    CHECK_NEAR(r[1].t_prefill_end - r[1].t_prefill_start, 1 + 0.16);
    CHECK_NEAR(r[1].t_first - r[1].t_arrive, 1 + 0.16 + 0.25 + 0.064);

    /* a whole cached prompt still computes its last block: at most (n - 1) / G */
    td_des_req_t s[2] = { req(0, 64, 2, a, 4), req(10, 64, 2, a, 4) };
    run(&c, s, 2);
    CHECK_EQ_INT(s[1].cached_tokens, 48);

    /* no cache: no hit */
    c.cache_blocks = 0;
    run(&c, r, 2);
    CHECK_EQ_INT(r[1].cached_tokens, 0);
}

/* 8 blocks of KV: the first request holds 6 (64 + 32 tokens), the second
 * waits in the admission queue until the first ends. */
static void
test_decode_waits(void)
{
    static const uint64_t a[] = { 1, 2, 3, 4 }, b[] = { 5, 6, 7, 8 };
    td_des_config_t c = small_config();
    td_des_req_t r[2] = { req(0, 64, 32, a, 4), req(0.1, 64, 32, b, 4) };

    c.kv_tokens = 128;
    run(&c, r, 2);
    CHECK_EQ_INT(r[0].outcome, TD_DES_DONE);
    CHECK_EQ_INT(r[1].outcome, TD_DES_DONE);
    CHECK_NEAR(r[1].t_admit, r[0].t_last);
    CHECK(r[1].t_first > r[0].t_last);

    /* one that no rank could ever hold is refused as too long */
    td_des_req_t big = req(0, 200, 32, a, 4);
    run(&c, &big, 1);
    CHECK_EQ_INT(big.outcome, TD_DES_TOO_LONG);

    /* batch rows: max_batch 1, plenty of KV: the second waits for the row */
    c = small_config();
    c.max_batch = 1;
    run(&c, r, 2);
    CHECK_NEAR(r[1].t_admit, r[0].t_last);
}

/* Colocated: the decode rank prefills (one step; its first token then),
 * then decodes. */
static void
test_colocated(void)
{
    static const uint64_t a[] = { 1, 2, 3, 4 };
    td_des_config_t c = small_config();
    td_des_req_t r = req(0, 64, 3, a, 4);

    c.colocated = true;
    run(&c, &r, 1);
    CHECK_EQ_INT(r.outcome, TD_DES_DONE);
    CHECK_NEAR(r.t_prefill_end, 1.64);
    CHECK_NEAR(r.t_first, 1.64);
    CHECK_NEAR(r.t_last, 1.64 + 2 * 0.5);
}

static void
test_poisson(void)
{
    enum { N = 20000 };
    static td_des_req_t a[N], b[N];

    td_des_poisson(a, N, 4.0, 7);
    td_des_poisson(b, N, 4.0, 7);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_NEAR(a[0].t_arrive, 0);
    double mean = a[N - 1].t_arrive / (N - 1);
    CHECK(fabs(mean - 0.25) < 0.25 * 0.03);
    td_des_poisson(b, N, 4.0, 8);
    CHECK(a[N - 1].t_arrive != b[N - 1].t_arrive);
}

/* prefilld's scheduler: chunks round robin over the running tasks, so a
 * short prompt behind a long one waits one chunk, not the whole prompt;
 * with one running task it waits for all of it. Chunks of 16: 1.16 s. */
static void
test_round_robin(void)
{
    static const uint64_t a[] = { 1, 2, 3, 4 }, b[] = { 5 };
    td_des_config_t c = small_config();
    td_des_req_t r[2] = { req(0, 64, 2, a, 4), req(0.01, 16, 2, b, 1) };

    c.chunk_tokens = 16;
    run(&c, r, 2);
    CHECK_NEAR(r[1].t_prefill_end, 2 * 1.16);
    CHECK_NEAR(r[0].t_prefill_end, 5 * 1.16);
    c.prefill_max_running = 1;
    run(&c, r, 2);
    CHECK_NEAR(r[0].t_prefill_end, 4 * 1.16);
    CHECK_NEAR(r[1].t_prefill_end, 5 * 1.16);
}

/* Two prefill ranks. A warms rank 0's cache; X (another prompt) then keeps
 * rank 0 busy with 40 queued tokens when B, sharing 48 tokens with A,
 * arrives: cost on rank 0 = 40 + 64 - w * 48, on rank 1 = 64. Weight 1:
 * rank 0 (the cache won against the load); weight 0.5: rank 1. */
static void
test_pick(void)
{
    static const uint64_t a[] = { 1, 2, 3, 4 }, x[] = { 100, 101, 102 }, b[] = { 1, 2, 3, 9 };
    td_des_config_t c = small_config();
    td_des_req_t r[3] = { req(0, 64, 2, a, 4), req(5, 40, 2, x, 3), req(5.01, 64, 2, b, 4) };

    c.group_gpus = 2;
    run(&c, r, 3);
    CHECK_EQ_INT(r[0].prefill_rank, 0);
    CHECK_EQ_INT(r[1].prefill_rank, 0);
    CHECK_EQ_INT(r[2].prefill_rank, 0);
    CHECK(r[2].by_cache);
    CHECK_EQ_INT(r[2].pred_cached, 48);

    c.cache_weight = 0.5;
    run(&c, r, 3);
    CHECK_EQ_INT(r[2].prefill_rank, 1);
    CHECK(!r[2].by_cache);
}

/* Decode domains asked one by one choose what the whole table chooses:
 * the same run either way, under load (requests wait, domains fill). */
static void
test_pick_domains(void)
{
    enum { N = 300 };
    static td_des_req_t a[N], b[N];
    static uint64_t ids[N][8];
    uint64_t s = 12345;
    td_des_config_t c = small_config();

    c.decode_gpus = 11;
    c.decode_domain = 3;
    c.group_gpus = 2;
    c.prefill_groups = 2;
    c.max_batch = 3;
    c.kv_tokens = 512;
    td_des_poisson(a, N, 20.0, 3);
    for (size_t i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t nb = 1 + (uint32_t)(s >> 33) % 8;
        for (uint32_t k = 0; k < nb; k++)
            ids[i][k] = k < 2 ? (s >> 40) % 4 + k * 10 : i * 8 + k;
        a[i] = req(a[i].t_arrive, nb * 16 - (uint32_t)(s >> 50) % 8, 1 + (uint32_t)(s >> 20) % 40,
                   ids[i], nb);
    }
    memcpy(b, a, sizeof a);
    run(&c, a, N);
    c.pick_full = true;
    run(&c, b, N);
    size_t waited = 0;
    for (size_t i = 0; i < N; i++) {
        CHECK_EQ_INT(a[i].outcome, TD_DES_DONE);
        CHECK_EQ_INT(a[i].decode_rank, b[i].decode_rank);
        CHECK_EQ_INT(a[i].prefill_rank, b[i].prefill_rank);
        CHECK(a[i].t_last == b[i].t_last);
        waited += a[i].t_admit > a[i].t_arrive;
    }
    CHECK(waited > N / 10);
}

int
main(void)
{
    test_alone();
    test_prefix_hit();
    test_decode_waits();
    test_colocated();
    test_poisson();
    test_round_robin();
    test_pick();
    test_pick_domains();
    return td_check_exit("test_des");
}
