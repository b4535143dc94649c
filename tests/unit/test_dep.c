/* tests/unit/test_dep.c — expert parallelism (model/forward.c, docs/dep.md):
 * n rank threads of one process (comm/cpu.c), each with its own model
 * holding only its experts, its requests and their KV, stepping together,
 * give the logits and greedy tokens of one rank bit for bit — chunked
 * prefill and batched decode, requests spread round-robin, ranks without
 * requests joining with no tokens — at DEP 2, 4 and 8 on the tiny presets
 * and on 16 experts top-4 and 6 experts top-3 (uneven over the ranks), with
 * a placement file of replicated experts; the per-expert counts add up; a
 * rank loads 1/n of the expert bytes; a rank that fails stops the others;
 * what is refused is refused with a message. */
#include "cache.h"
#include "check.h"
#include "comm.h"
#include "kvmem.h"
#include "log.h"
#include "logcap.h"
#include "model.h"
#include "placement.h"
#include "sample.h"
#include "testkv.h"
#include "testutil.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/test_dep.XXXXXX";
static char tool[PATH_MAX + 32];
static uint64_t kv_seed = 700;

/* ---- the schedule -----------------------------------------------------------------------
 * R requests with prompts of lens[i] tokens, prefilled in chunks of
 * chunk[i] (every request with prompt left takes its next chunk in each
 * prefill step, all logits kept), then DSTEPS decode steps of the active
 * requests, each fed the greedy token of its last logits. Request i lives
 * on rank i % n. One rank runs the same schedule with every request. */

enum { R = 6, MAXP = 40, DSTEPS = 7 };
static const size_t lens[R] = { 3, 17, 11, 29, 1, 8 };
static const size_t chunk[R] = { 4, 5, 3, 8, 1, 16 };
/* decode steps: which requests take part (a bit per request) */
static const unsigned active[DSTEPS] = { 0x3F, 0x3F, 0x01, 0x3F, 0x0A, 0x3F, 0x30 };

/* What the requests produced: prefill logits [lens[i], V] and decode
 * logits [DSTEPS, V] (rows of inactive steps untouched), tokens fed. */
typedef struct {
    float *pre[R];
    float *dec[R];
    int32_t tok[R][DSTEPS];
} outputs_t;

static int32_t prompts[R][MAXP];

static size_t
prefill_steps(void)
{
    size_t most = 0;
    for (int i = 0; i < R; i++) {
        size_t s = (lens[i] + chunk[i] - 1) / chunk[i];
        most = s > most ? s : most;
    }
    return most;
}

static int
outputs_init(outputs_t *o, size_t V)
{
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < R; i++) {
        o->pre[i] = calloc(lens[i] * V, sizeof(float));
        o->dec[i] = calloc(DSTEPS * V, sizeof(float));
        if (o->pre[i] == NULL || o->dec[i] == NULL)
            return -1;
    }
    return 0;
}

static void
outputs_free(outputs_t *o)
{
    for (int i = 0; i < R; i++) {
        free(o->pre[i]);
        free(o->dec[i]);
    }
}

/* One rank's part: its requests (i % nranks == rank) through the whole
 * schedule, on dep (NULL: td_forward, one rank). */
typedef struct {
    const td_model_t *m;
    td_forward_dep_t *dep;
    uint32_t rank, nranks;
    td_cache_t *caches;        /* [R], those of this rank's requests initialized */
    outputs_t *out;
    td_status_t st;
    uint32_t fail_layer;       /* stop this rank's pass after this layer (0: never) */
    size_t fail_step;
    td_kernels_cpu_pool_t *pool;
} rank_run_t;

static td_status_t
stop_at(const td_forward_done_t *done, void *arg)
{
    const rank_run_t *rr = arg;
    return done->layer + 1 == rr->fail_layer ? TD_ERR_CANCELED : TD_OK;
}

static td_status_t
run_pass(rank_run_t *rr, td_forward_seq_t *seqs, size_t n, size_t step)
{
    td_forward_layer_fn fn = rr->fail_layer && step == rr->fail_step ? stop_at : NULL;

    if (rr->dep != NULL)
        return td_forward_dep(rr->dep, seqs, n, fn, rr);
    return n > 0 ? td_forward(rr->m, seqs, n, fn, rr) : TD_OK;
}

static void *
rank_main(void *arg)
{
    rank_run_t *rr = arg;
    size_t V = (size_t)rr->m->cfg->vocab_size, step = 0;
    td_forward_seq_t seqs[R];
    int32_t next[R];

    if (rr->pool != NULL)
        td_kernels_cpu_pool_bind(rr->pool);
    rr->st = TD_OK;
    for (size_t s = 0, np = prefill_steps(); s < np; s++, step++) {
        size_t n = 0;
        for (int i = 0; i < R; i++) {
            size_t at = s * chunk[i];
            if ((uint32_t)i % rr->nranks != rr->rank || at >= lens[i])
                continue;
            size_t k = lens[i] - at < chunk[i] ? lens[i] - at : chunk[i];
            seqs[n++] = (td_forward_seq_t){ &rr->caches[i], prompts[i] + at, k,
                                            rr->out->pre[i] + at * V, 1, 0 };
        }
        rr->st = run_pass(rr, seqs, n, step);
        if (rr->st != TD_OK)
            return NULL;
    }
    for (int i = 0; i < R; i++)
        next[i] = td_sample_argmax(rr->out->pre[i] + (lens[i] - 1) * V, V);
    for (size_t d = 0; d < DSTEPS; d++, step++) {
        size_t n = 0;
        for (int i = 0; i < R; i++) {
            if ((uint32_t)i % rr->nranks != rr->rank || !(active[d] >> i & 1))
                continue;
            rr->out->tok[i][d] = next[i];
            seqs[n++] = (td_forward_seq_t){ &rr->caches[i], &rr->out->tok[i][d], 1,
                                            rr->out->dec[i] + d * V, 0, 0 };
        }
        rr->st = run_pass(rr, seqs, n, step);
        if (rr->st != TD_OK)
            return NULL;
        for (int i = 0; i < R; i++)
            if ((uint32_t)i % rr->nranks == rr->rank && active[d] >> i & 1)
                next[i] = td_sample_argmax(rr->out->dec[i] + d * V, V);
    }
    return NULL;
}

/* Compare o with the one-rank reference; 1 when every bit is the same. */
static int
outputs_same(const char *what, const outputs_t *o, const outputs_t *ref, size_t V)
{
    for (int i = 0; i < R; i++) {
        for (size_t r = 0; r < lens[i]; r++)
            if (memcmp(o->pre[i] + r * V, ref->pre[i] + r * V, V * sizeof(float)) != 0) {
                fprintf(stderr, "%s: request %d: prefill row %zu differs from one rank\n", what,
                        i, r);
                return 0;
            }
        for (size_t d = 0; d < DSTEPS; d++) {
            if (!(active[d] >> i & 1))
                continue;
            if (o->tok[i][d] != ref->tok[i][d] ||
                memcmp(o->dec[i] + d * V, ref->dec[i] + d * V, V * sizeof(float)) != 0) {
                fprintf(stderr, "%s: request %d: decode step %zu differs from one rank (token "
                        "%d, one rank %d)\n", what, i, d, o->tok[i][d], ref->tok[i][d]);
                return 0;
            }
        }
    }
    return 1;
}

/* ---- one configuration ------------------------------------------------------------------ */

typedef struct {
    const char *dir;
    const td_model_t *full;      /* every expert: the one-rank reference */
    outputs_t ref;
    size_t V;
} ckpt_t;

/* The reference: one rank, td_forward, every request. */
static int
reference(ckpt_t *ck)
{
    td_cache_t caches[R];
    td_kvmem_t *mem[R] = { 0 };
    rank_run_t rr = { .m = ck->full, .rank = 0, .nranks = 1, .caches = caches, .out = &ck->ref };
    int ok = 0;

    ck->V = (size_t)ck->full->cfg->vocab_size;
    if (outputs_init(&ck->ref, ck->V) != 0)
        goto out;
    for (int i = 0; i < R; i++)
        if ((mem[i] = td_testkv_cache(ck->full, 64, &kv_seed, &caches[i])) == NULL)
            goto out;
    rank_main(&rr);
    CHECK_STATUS(rr.st, TD_OK);
    ok = rr.st == TD_OK;
out:
    for (int i = 0; i < R; i++)
        td_testkv_done(mem[i]);
    return ok;
}

typedef struct {
    int n;                       /* ranks */
    const char *placement;       /* JSON text, or NULL: contiguous ranges */
    uint32_t fail_rank, fail_layer;   /* fail_layer > 0: that rank stops its pass there */
} dep_case_t;

/* The schedule at DEP c->n against the reference; with a failing rank,
 * every rank's run must end with an error instead. */
static void
dep_run(ckpt_t *ck, const char *name, const dep_case_t *c)
{
    uint32_t n = (uint32_t)c->n, E = (uint32_t)ck->full->cfg->n_routed_experts;
    uint32_t L = (uint32_t)ck->full->cfg->num_hidden_layers;
    uint32_t K = (uint32_t)ck->full->cfg->num_experts_per_tok;
    td_placement_t *p = NULL;
    td_comm_group_t *g = NULL;
    td_comm_t *comm[8] = { 0 };
    td_model_t *models[8] = { 0 };
    td_forward_dep_t *deps[8] = { 0 };
    rank_run_t runs[8];
    pthread_t th[8];
    td_cache_t caches[R];
    td_kvmem_t *mem[R] = { 0 };
    outputs_t out;
    char what[160], err[256];
    size_t expert_bytes = 0;

    snprintf(what, sizeof(what), "%s DEP %d%s%s", name, c->n, c->placement ? " (file)" : "",
             c->fail_layer ? " (a rank fails)" : "");
    if (outputs_init(&out, ck->V) != 0) {
        td_check_failures++;
        goto out;
    }
    if (c->placement != NULL)
        CHECK_STATUS(td_placement_parse(c->placement, strlen(c->placement), E, n, &p, err,
                                        sizeof(err)), TD_OK);
    else
        CHECK_STATUS(td_placement_create_ranges(E, n, &p), TD_OK);
    CHECK_STATUS(td_comm_group_create(n, &(td_comm_opts_t){ .deadline_ms = 30000,
                                                             .name = "test dep" }, &g), TD_OK);
    if (p == NULL || g == NULL)
        goto out;
    for (uint32_t r = 0; r < n; r++) {
        td_model_opts_t mo = { p, r };
        CHECK_STATUS(td_model_load_opts(ck->dir, &mo, &models[r]), TD_OK);
        CHECK_STATUS(td_comm_cpu_create(g, r, &comm[r]), TD_OK);
        if (models[r] == NULL || comm[r] == NULL)
            goto out;
        CHECK_EQ_INT(models[r]->experts_held, td_placement_held(p, r));
        expert_bytes += models[r]->expert_bytes;
        CHECK_STATUS(td_forward_dep_create(models[r], comm[r], p, &deps[r]), TD_OK);
        if (deps[r] == NULL)
            goto out;
    }
    /* a rank loads only its experts: without replicas the ranks' expert
     * bytes add up to one whole model's */
    if (c->placement == NULL)
        CHECK_EQ_INT(expert_bytes, ck->full->expert_bytes);
    for (int i = 0; i < R; i++)
        if ((mem[i] = td_testkv_cache(models[(uint32_t)i % n], 64, &kv_seed, &caches[i])) ==
            NULL)
            goto out;
    for (uint32_t r = 0; r < n; r++) {
        runs[r] = (rank_run_t){ .m = models[r], .dep = deps[r], .rank = r, .nranks = n,
                                .caches = caches, .out = &out };
        if (c->fail_layer && r == c->fail_rank) {
            runs[r].fail_layer = c->fail_layer;
            runs[r].fail_step = 2;
        }
        CHECK_STATUS(td_kernels_cpu_pool_create(1, &runs[r].pool), TD_OK);
    }
    td_logcap_start();   /* the failing case's lines */
    for (uint32_t r = 0; r < n; r++)
        CHECK(pthread_create(&th[r], NULL, rank_main, &runs[r]) == 0);
    for (uint32_t r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    td_logcap_stop();
    if (c->fail_layer) {
        /* the failing rank returns its own status, every other one the peer's */
        int stopped = 1;
        for (uint32_t r = 0; r < n; r++) {
            td_status_t want = r == c->fail_rank ? TD_ERR_CANCELED : TD_ERR_PEER;
            CHECK_STATUS(runs[r].st, want);
            stopped &= runs[r].st == want;
        }
        fprintf(stderr, "test_dep: %s: every rank stopped: %s\n", what, stopped ? "yes" : "NO");
        goto out;
    }
    int ok = 1;
    for (uint32_t r = 0; r < n; r++) {
        if (runs[r].st != TD_OK) {
            fprintf(stderr, "%s: rank %u: %s\n", what, r, td_status_str(runs[r].st));
            ok = 0;
        }
    }
    ok = ok && outputs_same(what, &out, &ck->ref, ck->V);
    if (!ok)
        td_check_failures++;

    /* the counters: each token's K experts ran once per layer, somewhere */
    uint64_t *cnt = calloc((size_t)L * E, sizeof(uint64_t)), *sum = calloc(L, sizeof(uint64_t));
    uint64_t tokens = 0, wire = 0, dispatched = 0, combined = 0;
    size_t rows = 0;
    for (int i = 0; i < R; i++) {
        rows += lens[i];
        for (size_t d = 0; d < DSTEPS; d++)
            rows += active[d] >> i & 1;
    }
    for (uint32_t r = 0; cnt != NULL && sum != NULL && r < n; r++) {
        td_forward_dep_stats_t ds;
        td_comm_stats_t cs;
        td_forward_dep_expert_tokens(deps[r], cnt);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t e = 0; e < E; e++) {
                sum[l] += cnt[(size_t)l * E + e];
                if (cnt[(size_t)l * E + e] != 0 && !td_placement_holds(p, r, e)) {
                    fprintf(stderr, "%s: rank %u ran expert %u it does not hold\n", what, r, e);
                    td_check_failures++;
                }
            }
        td_forward_dep_stats(deps[r], &ds);
        td_comm_stats(comm[r], &cs);
        CHECK_EQ_INT(ds.passes, prefill_steps() + DSTEPS);
        /* what crossed to other ranks: the all-to-alls' remote segments and
         * the all-gather of the row counts (8 bytes to each other rank a pass) */
        CHECK(ds.dispatch_remote <= ds.dispatch_bytes && ds.combine_remote <= ds.combine_bytes);
        CHECK_EQ_INT(cs.bytes_sent, ds.dispatch_remote + ds.combine_remote +
                                        ds.passes * 8 * (n - 1));
        tokens += ds.tokens;
        dispatched += ds.dispatch_bytes;
        combined += ds.combine_bytes;
        wire += cs.bytes_sent;
    }
    CHECK_EQ_INT(tokens, rows);
    for (uint32_t l = 0; sum != NULL && l < L; l++)
        CHECK_EQ_INT(sum[l], rows * K);
    free(cnt);
    free(sum);
    fprintf(stderr, "test_dep: %s: %zu prefill and %d decode steps, %zu rows: %s; a row a "
            "layer: dispatch %.0f B, combine %.0f B (own rank included), %.0f B to other "
            "ranks\n", what, prefill_steps(), DSTEPS, rows,
            ok ? "bitwise equal to one rank" : "DIFFERENT",
            (double)dispatched / (double)(rows * L), (double)combined / (double)(rows * L),
            (double)wire / (double)(rows * L));
out:
    for (uint32_t r = 0; r < n; r++) {
        td_forward_dep_destroy(deps[r]);
        td_comm_destroy(comm[r]);
        td_kernels_cpu_pool_destroy(runs[r].pool);
    }
    for (int i = 0; i < R; i++)
        td_testkv_done(mem[i]);
    for (uint32_t r = 0; r < n; r++)
        td_model_destroy(models[r]);
    td_comm_group_destroy(g);
    td_placement_destroy(p);
    outputs_free(&out);
}

static void
test_config(const char *name, const char *args, const dep_case_t *cases, size_t ncases)
{
    char dir[PATH_MAX + 64];
    td_model_t *full = NULL;
    ckpt_t ck = { 0 };

    if (td_testutil_mk_model(tool, tmpdir, name, args, dir, sizeof(dir)) != 0)
        return;
    CHECK_STATUS(td_model_load(dir, &full), TD_OK);
    if (full == NULL)
        return;
    ck.dir = dir;
    ck.full = full;
    for (int i = 0; i < R; i++)
        for (size_t j = 0; j < lens[i]; j++)
            prompts[i][j] = (int32_t)((i * 131 + j * 17 + 5) % (size_t)full->cfg->vocab_size);
    if (reference(&ck))
        for (size_t c = 0; c < ncases; c++)
            dep_run(&ck, name, &cases[c]);
    outputs_free(&ck.ref);
    td_model_destroy(full);
}

/* ---- what is refused -------------------------------------------------------------------- */

static void
test_refused(void)
{
    char dir[PATH_MAX + 64];
    td_placement_t *p4 = NULL, *p8 = NULL;
    td_model_t *part = NULL, *full = NULL;
    td_comm_group_t *g = NULL;
    td_comm_t *c0 = NULL;
    td_forward_dep_t *d = NULL;

    if (td_testutil_mk_model(tool, tmpdir, "refused",
                             "--preset tiny-noengram --experts 6 --topk 3", dir,
                             sizeof(dir)) != 0)
        return;
    CHECK_STATUS(td_placement_create_ranges(6, 4, &p4), TD_OK);
    CHECK_STATUS(td_placement_create_ranges(8, 4, &p8), TD_OK);
    CHECK_STATUS(td_comm_group_create(4, NULL, &g), TD_OK);
    if (p4 == NULL || p8 == NULL || g == NULL)
        goto out;
    CHECK_STATUS(td_comm_cpu_create(g, 0, &c0), TD_OK);
    td_logcap_start();
    /* a placement of another expert count, a rank outside it */
    CHECK_STATUS(td_model_load_opts(dir, &(td_model_opts_t){ p8, 0 }, &part), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "a placement of 8 experts") != NULL);
    CHECK_STATUS(td_model_load_opts(dir, &(td_model_opts_t){ p4, 4 }, &part), TD_ERR_INVALID);
    CHECK(part == NULL);
    td_logcap_stop();
    CHECK_STATUS(td_model_load_opts(dir, &(td_model_opts_t){ p4, 2 }, &part), TD_OK);
    CHECK_STATUS(td_model_load(dir, &full), TD_OK);
    if (part == NULL || full == NULL || c0 == NULL)
        goto out;
    CHECK_EQ_INT(part->experts_held, 1);
    CHECK(part->layers[0].w1[4] != NULL && part->layers[0].w1[0] == NULL &&
          part->layers[0].w2[5] == NULL);
    /* rank 2's own experts: a quarter or so of the bytes */
    CHECK(part->expert_bytes * 6 == full->expert_bytes);
    CHECK(part->mat_bytes < full->mat_bytes);
    td_logcap_start();
    /* a model without all its experts cannot run alone */
    td_kvmem_t *mem;
    td_cache_t cache;
    int32_t tok = 3;
    mem = td_testkv_cache(part, 16, &kv_seed, &cache);
    td_logcap_start();
    CHECK_STATUS(td_forward_prefill(part, &cache, &tok, 1, 0, NULL), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "holds 1 of 6 experts") != NULL);
    /* a rank's model lacking an expert the placement gives the rank */
    CHECK_STATUS(td_forward_dep_create(part, c0, p4, &d), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "rank 0 holds expert 0 by the placement") != NULL);
    /* a placement of another group size */
    CHECK_STATUS(td_forward_dep_create(full, c0, p8, &d), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "a placement of 8 experts over 4 ranks") != NULL);
    td_logcap_stop();
    CHECK(d == NULL);
    td_testkv_done(mem);
out:
    td_comm_destroy(c0);
    td_comm_group_destroy(g);
    td_model_destroy(part);
    td_model_destroy(full);
    td_placement_destroy(p4);
    td_placement_destroy(p8);
}

int
main(void)
{
    td_log_set_level(TD_LOG_WARN);
    if (!td_testutil_build_tool("TD_MK_TINY_MODEL", "mk-tiny-model", tool, sizeof(tool))) {
        fprintf(stderr, "test_dep: mk-tiny-model not found (%s); set TD_MK_TINY_MODEL\n", tool);
        return 1;
    }
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    static const dep_case_t c248[] = { { 2, NULL, 0, 0 }, { 4, NULL, 0, 0 }, { 8, NULL, 0, 0 } };
    test_config("tiny", "--dtype f32 --init perturbed --seed 21", c248, 3);
    test_config("tiny-fp4", "--quant fp8+fp4 --init perturbed --seed 22", c248, 2);
    test_config("tiny-noengram", "--preset tiny-noengram --init perturbed --seed 23", c248 + 1,
                1);
    /* 16 experts top-4: 8, 4, 2 a rank */
    test_config("e16k4", "--preset tiny-noengram --experts 16 --topk 4 --init perturbed --seed 24",
                c248, 3);
    /* 6 experts top-3: a group of one (td_forward_dep sends nothing), 3, 3 / 2, 2, 1, 1 /
     * 1, 1, 1, 1, 1, 1, 0, 0; then replicas from a file (rank 3 holds a replica of 5 and
     * 2, rank 0 of 4, ...) and a rank that fails */
    static const dep_case_t c6[] = {
        { 1, NULL, 0, 0 }, { 2, NULL, 0, 0 }, { 4, NULL, 0, 0 }, { 8, NULL, 0, 0 },
        { 4, "{\"experts\": 6, \"ranks\": [[0, 1, 4], [2, 3, 0], [4, 1], [5, 2, 0]]}", 0, 0 },
        { 3, "{\"ranks\": [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [5]]}", 0, 0 },
        { 4, NULL, 1, 3 },
    };
    test_config("e6k3", "--experts 6 --topk 3 --init perturbed --seed 25", c6, 7);
    test_refused();

    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_dep: could not remove %s\n", tmpdir);
    return td_check_exit("test_dep");
}
