/* bench/prefixbench.c — what a prefix-cache hit costs on the cpu engine
 * against a cold prefill of the same prompt, with the fixed state restored
 * from a snapshot and rebuilt by bounded replay (docs/kvcache.md, "Snapshot
 * or replay"). The cached prefix's paged entries are the cold prefill's own
 * bytes (copied in untimed, as the pool shares them); each timed hit
 * computes the uncached suffix, and the replay hit the engine's replay
 * bound before it. The three end with the same logits, checked bit for bit. */
#include "engine.h"
#include "kvmem.h"
#include "v41engine.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "rng.h"

typedef struct {
    const char *model;
    uint64_t prompt, prefix, chunk, reps;
} pb_opts_t;

static void
pb_usage(FILE *f)
{
    fprintf(f,
            "usage: prefixbench --model DIR [--prompt N] [--prefix P] [--chunk C] [--reps R]\n"
            "  A prompt of N tokens (default 2048) whose first P (default the last 128-token\n"
            "  block end before N) are cached: a cold prefill of all N, a hit whose fixed\n"
            "  state comes from a snapshot at P, a hit that replays the engine's bound\n"
            "  before P; chunks of C tokens (default 512); R repetitions (default 3), the\n"
            "  median printed. The logits at the end must agree bit for bit.\n");
}

static int
pb_parse(int argc, char **argv, pb_opts_t *o)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "prompt", required_argument, NULL, 'n' },
        { "prefix", required_argument, NULL, 'p' },
        { "chunk", required_argument, NULL, 'c' },
        { "reps", required_argument, NULL, 'r' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;

    *o = (pb_opts_t){ .prompt = 2048, .chunk = 512, .reps = 3 };
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'n': o->prompt = strtoull(optarg, NULL, 10); break;
        case 'p': o->prefix = strtoull(optarg, NULL, 10); break;
        case 'c': o->chunk = strtoull(optarg, NULL, 10); break;
        case 'r': o->reps = strtoull(optarg, NULL, 10); break;
        case 'h': pb_usage(stdout); exit(0);
        default: pb_usage(stderr); return -1;
        }
    }
    if (o->model == NULL || o->prompt < 2 || o->chunk == 0 || o->reps == 0) {
        pb_usage(stderr);
        return -1;
    }
    if (o->prefix == 0)
        o->prefix = (o->prompt - 1) / 128 * 128;
    if (o->prefix == 0 || o->prefix >= o->prompt) {
        fprintf(stderr, "prefixbench: --prefix must be in [1, N)\n");
        return -1;
    }
    return 0;
}

static td_status_t
pb_quiet(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *p, size_t n, void *arg)
{
    (void)req;
    (void)layer;
    (void)p;
    (void)n;
    (void)arg;
    return TD_OK;
}

/* Prefill tokens[from, to) in chunks of c; the last chunk is `last`, and
 * a chunk ends at `keep` (0: none) with the fixed state left in memory. */
static td_status_t
pb_prefill(td_engine_req_t *r, const int32_t *tokens, uint64_t from, uint64_t to, uint64_t c,
           int last, uint64_t keep)
{
    for (uint64_t at = from; at < to;) {
        uint64_t k = to - at < c ? to - at : c;
        int kind;
        td_status_t st;

        if (keep > at && keep < at + k)
            k = keep - at;
        kind = at + k == to && last ? TD_ENGINE_CHUNK_LAST
               : at + k == keep     ? TD_ENGINE_CHUNK_KEEP
                                    : TD_ENGINE_CHUNK_MORE;
        if ((st = td_engine_prefill(r, tokens + at, k, kind, pb_quiet, NULL)) != TD_OK)
            return st;
        at += k;
    }
    return TD_OK;
}

static double
pb_median(double *v, uint64_t n)
{
    for (uint64_t i = 1; i < n; i++)
        for (uint64_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

int
main(int argc, char **argv)
{
    pb_opts_t o;
    td_engine_t *e = NULL;
    td_kvmem_t *ma = NULL, *mb = NULL, *mc = NULL;
    td_engine_req_t *a = NULL, *b = NULL, *c = NULL;
    td_sample_params_t sp = td_sample_params_greedy();
    td_sample_dist_t da, db, dc;
    int32_t *tok = NULL;
    uint8_t *snap = NULL;
    double *t_cold = NULL, *t_snap = NULL, *t_replay = NULL;
    uint64_t snap_bytes = 0, B, from;
    int rc = 1, exact = 1;
    td_rng_t rng = td_rng_seed(7);

    if (pb_parse(argc, argv, &o) != 0)
        return 2;
    td_log_set_level(TD_LOG_WARN);
    if (td_v41_engine_open(o.model, NULL, &e) != TD_OK)
        return 1;
    B = td_engine_replay_bound(e);
    from = o.prefix > B ? o.prefix - B : 0;
    tok = malloc(o.prompt * sizeof(*tok));
    t_cold = calloc(o.reps, sizeof(double));
    t_snap = calloc(o.reps, sizeof(double));
    t_replay = calloc(o.reps, sizeof(double));
    snap_bytes = td_kvmem_state_bytes(e->layout, 0);   /* the fixed segments */
    snap = malloc(snap_bytes);
    if (tok == NULL || t_cold == NULL || t_snap == NULL || t_replay == NULL || snap == NULL)
        goto out;
    for (uint64_t i = 0; i < o.prompt; i++)
        tok[i] = (int32_t)(td_rng_next(&rng) % e->vocab);
    if (td_kvmem_create(e->layout, o.prompt, 0, &ma) != TD_OK ||
        td_kvmem_create(e->layout, o.prompt, 0, &mb) != TD_OK ||
        td_kvmem_create(e->layout, o.prompt, 0, &mc) != TD_OK)
        goto out;
    printf("prefixbench: %s: prompt %" PRIu64 ", cached prefix %" PRIu64 ", chunks of %" PRIu64
           ", replay bound %" PRIu64 " (replay from %" PRIu64 "), snapshot %.1f KiB\n",
           o.model, o.prompt, o.prefix, o.chunk, B, from, snap_bytes / 1024.0);
    fflush(stdout);
    for (uint64_t rep = 0; rep < o.reps; rep++) {
        uint64_t t0;

        /* cold: the whole prompt; the state at the prefix end kept as the
         * snapshot (a copy, not timed: the cold prefill pays it once) */
        if (td_engine_req_create(e, &sp, &ma->kv, &a) != TD_OK)
            goto out;
        t0 = td_clock_ns();
        if (pb_prefill(a, tok, 0, o.prefix, o.chunk, 0, o.prefix) != TD_OK)
            goto out;
        t_cold[rep] = (double)(td_clock_ns() - t0);
        td_kvmem_pack(&ma->kv, 0, snap);
        t0 = td_clock_ns();
        if (pb_prefill(a, tok, o.prefix, o.prompt, o.chunk, 1, 0) != TD_OK ||
            td_engine_logits(a, &da) != TD_OK)
            goto out;
        t_cold[rep] += (double)(td_clock_ns() - t0);
        /* the hits' paged prefix: the cold prefill's bytes */
        td_kvmem_copy(&mb->kv, &ma->kv, o.prefix);
        td_kvmem_copy(&mc->kv, &ma->kv, o.prefix);
        /* snapshot hit */
        if (td_engine_req_create(e, &sp, &mb->kv, &b) != TD_OK)
            goto out;
        t0 = td_clock_ns();
        td_kvmem_unpack(&mb->kv, 0, snap);
        if (td_engine_adopt(b, tok, o.prefix) != TD_OK ||
            pb_prefill(b, tok, o.prefix, o.prompt, o.chunk, 1, 0) != TD_OK ||
            td_engine_logits(b, &db) != TD_OK)
            goto out;
        t_snap[rep] = (double)(td_clock_ns() - t0);
        /* replay hit */
        if (td_engine_req_create(e, &sp, &mc->kv, &c) != TD_OK)
            goto out;
        t0 = td_clock_ns();
        if (td_engine_seek(c, tok, from) != TD_OK)
            goto out;
        for (uint64_t at = from; at < o.prefix;) {
            uint64_t k = o.prefix - at < o.chunk ? o.prefix - at : o.chunk;

            if (td_engine_replay(c, tok + at, k, o.prefix) != TD_OK)
                goto out;
            at += k;
        }
        if (pb_prefill(c, tok, o.prefix, o.prompt, o.chunk, 1, 0) != TD_OK ||
            td_engine_logits(c, &dc) != TD_OK)
            goto out;
        t_replay[rep] = (double)(td_clock_ns() - t0);
        exact = exact && memcmp(da.logits, db.logits, e->vocab * sizeof(float)) == 0 &&
                memcmp(da.logits, dc.logits, e->vocab * sizeof(float)) == 0;
        printf("  rep %" PRIu64 ": cold %.1f ms, snapshot hit %.1f ms, replay hit %.1f ms\n", rep,
               t_cold[rep] / 1e6, t_snap[rep] / 1e6, t_replay[rep] / 1e6);
        fflush(stdout);
        td_engine_req_destroy(a);
        td_engine_req_destroy(b);
        td_engine_req_destroy(c);
        a = b = c = NULL;
    }
    double mc0 = pb_median(t_cold, o.reps) / 1e6, ms = pb_median(t_snap, o.reps) / 1e6,
           mr = pb_median(t_replay, o.reps) / 1e6;
    printf("| path | tokens computed | median ms | / cold |\n|---|---|---|---|\n");
    printf("| cold prefill | %" PRIu64 " | %.1f | 1.00 |\n", o.prompt, mc0);
    printf("| hit, snapshot at the prefix end | %" PRIu64 " | %.1f | %.3f |\n",
           o.prompt - o.prefix, ms, ms / mc0);
    printf("| hit, bounded replay | %" PRIu64 " + %" PRIu64 " | %.1f | %.3f |\n",
           o.prefix - from, o.prompt - o.prefix, mr, mr / mc0);
    printf("logits equal bit for bit: %s\n", exact ? "yes" : "NO");
    rc = exact ? 0 : 1;
out:
    if (rc != 0 && exact)
        fprintf(stderr, "prefixbench: failed\n");
    td_engine_req_destroy(a);
    td_engine_req_destroy(b);
    td_engine_req_destroy(c);
    td_kvmem_destroy(ma);
    td_kvmem_destroy(mb);
    td_kvmem_destroy(mc);
    td_engine_destroy(e);
    free(snap);
    free(tok);
    free(t_cold);
    free(t_snap);
    free(t_replay);
    return rc;
}
