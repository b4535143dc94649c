/* bench/depbench.c — expert parallelism (DEPn) on the cpu: a DEP group of
 * rank threads decoding requests spread over the ranks (step time, the
 * all-to-all bytes a token moves per MoE layer, a hash of the logits), and
 * the resident memory of one rank's load (its experts only). One JSON
 * object out; bench/dep drives it. docs/dep.md. */
#include "kvmem.h"
#include "model.h"
#include "placement.h"

#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "log.h"

#define DB_MAX_RANKS 64
#define DB_MAX_STEPS 4096

typedef struct {
    const char *cmd;           /* "run" or "rss" */
    const char *model, *placement;
    uint64_t dep, requests, prompt, steps, warmup, rank, threads;
    int no_experts;            /* rss: a rank holding no expert (the dense part alone) */
} db_opts_t;

static void
db_usage(FILE *f)
{
    fprintf(f,
            "usage: depbench run --model DIR [--dep N] [--placement FILE] [--requests R]\n"
            "                    [--prompt P] [--warmup W] [--steps S] [--threads T]\n"
            "       depbench rss --model DIR --dep N --rank K [--placement FILE | --no-experts]\n"
            "  run: R requests (default 8) over N rank threads (default 1: td_forward, no\n"
            "    group), request i on rank i %% N; each prefilled with P tokens (default 32,\n"
            "    untimed), then W untimed (default 2) and S timed (default 16) decode steps of\n"
            "    every request (greedy). A rank's cpu pool has T threads (default: the CPUs\n"
            "    / N, at least 1). Prints the step times, tokens/s, the all-to-all bytes a\n"
            "    token moved per MoE layer in the timed steps (dispatch and combine, all\n"
            "    segments and those to other ranks; the communicator's own count) against\n"
            "    top-k x hidden x 4, and an FNV-1a hash of every timed step's logits.\n"
            "  rss: load rank K's model of an N-rank placement (--no-experts: a rank with\n"
            "    none) and print its expert bytes and the process's resident set (VmRSS).\n");
}

static int
db_parse(int argc, char **argv, db_opts_t *o)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "dep", required_argument, NULL, 'd' },
        { "placement", required_argument, NULL, 'p' },
        { "requests", required_argument, NULL, 'r' },
        { "prompt", required_argument, NULL, 'n' },
        { "steps", required_argument, NULL, 's' },
        { "warmup", required_argument, NULL, 'w' },
        { "rank", required_argument, NULL, 'k' },
        { "threads", required_argument, NULL, 't' },
        { "no-experts", no_argument, NULL, 'x' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    char err[256];
    int c;

    memset(o, 0, sizeof(*o));
    o->dep = 1;
    o->requests = 8;
    o->prompt = 32;
    o->steps = 16;
    o->warmup = 2;
    if (argc < 2 || (strcmp(argv[1], "run") != 0 && strcmp(argv[1], "rss") != 0)) {
        db_usage(stderr);
        return 2;
    }
    o->cmd = argv[1];
    optind = 2;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        td_status_t st = TD_OK;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->placement = optarg; break;
        case 'x': o->no_experts = 1; break;
        case 'd':
            st = td_config_parse_uint("--dep", optarg, 1, DB_MAX_RANKS, &o->dep, err, sizeof(err));
            break;
        case 'r':
            st = td_config_parse_uint("--requests", optarg, 1, 4096, &o->requests, err,
                                      sizeof(err));
            break;
        case 'n':
            st = td_config_parse_uint("--prompt", optarg, 1, 1u << 20, &o->prompt, err,
                                      sizeof(err));
            break;
        case 's':
            st = td_config_parse_uint("--steps", optarg, 1, DB_MAX_STEPS, &o->steps, err,
                                      sizeof(err));
            break;
        case 'w':
            st = td_config_parse_uint("--warmup", optarg, 0, 1000, &o->warmup, err, sizeof(err));
            break;
        case 'k':
            st = td_config_parse_uint("--rank", optarg, 0, DB_MAX_RANKS - 1, &o->rank, err,
                                      sizeof(err));
            break;
        case 't':
            st = td_config_parse_uint("--threads", optarg, 1, 256, &o->threads, err, sizeof(err));
            break;
        case 'h': db_usage(stdout); exit(0);
        default: db_usage(stderr); return 2;
        }
        if (st != TD_OK) {
            fprintf(stderr, "depbench: %s\n", err);
            return 2;
        }
    }
    if (o->model == NULL || optind != argc) {
        db_usage(stderr);
        return 2;
    }
    return 0;
}

/* The process's resident set in KiB (VmRSS), 0 if unknown. */
static uint64_t
db_rss_kib(void)
{
    char line[256];
    uint64_t kib = 0;
    FILE *f = fopen("/proc/self/status", "r");

    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = strtoull(line + 6, NULL, 10);
    if (f != NULL)
        fclose(f);
    return kib;
}

/* The placement of the run: the file, or contiguous ranges. */
static td_status_t
db_placement(const db_opts_t *o, uint32_t experts, td_placement_t **out)
{
    return o->placement ? td_placement_load(o->placement, experts, (uint32_t)o->dep, out)
                        : td_placement_create_ranges(experts, (uint32_t)o->dep, out);
}

static uint32_t
db_experts(const char *dir)
{
    td_modelcfg_t *cfg = NULL;
    uint32_t e = 0;

    if (td_modelcfg_load(dir, &cfg) == TD_OK)
        e = (uint32_t)cfg->n_routed_experts;
    td_modelcfg_destroy(cfg);
    return e;
}

/* ---- rss ------------------------------------------------------------------------------ */

static int
db_rss(const db_opts_t *o)
{
    uint32_t E = db_experts(o->model), n = (uint32_t)o->dep;
    td_placement_t *p = NULL;
    td_model_t *m = NULL;
    td_status_t st;

    if (E == 0)
        return 1;   /* logged */
    if (o->no_experts) {
        /* every expert on rank 0, none on the others: rank 1's load is the dense part */
        char text[8192];
        size_t at = (size_t)snprintf(text, sizeof(text), "{\"ranks\": [[");
        for (uint32_t e = 0; e < E && at < sizeof(text) - 16; e++)
            at += (size_t)snprintf(text + at, sizeof(text) - at, "%s%u", e ? ", " : "", e);
        snprintf(text + at, sizeof(text) - at, "], []]}");
        char err[256];
        st = td_placement_parse(text, strlen(text), E, 2, &p, err, sizeof(err));
        if (st != TD_OK) {
            fprintf(stderr, "depbench: %s\n", err);
            return 1;
        }
    } else if (db_placement(o, E, &p) != TD_OK) {
        return 1;
    }
    uint64_t before = db_rss_kib();
    td_model_opts_t mo = { p, o->no_experts ? 1 : (uint32_t)o->rank };
    st = td_model_load_opts(o->model, &mo, &m);
    if (st != TD_OK) {
        td_placement_destroy(p);
        return 1;
    }
    uint64_t after = db_rss_kib();
    printf("{\"dep\": %u, \"rank\": %u, \"no_experts\": %s, \"experts_held\": %u, "
           "\"experts\": %u, \"expert_bytes\": %zu, \"linear_bytes\": %zu, "
           "\"arena_bytes\": %zu, \"rss_kib_before\": %llu, \"rss_kib\": %llu}\n", n,
           (unsigned)mo.rank, o->no_experts ? "true" : "false", m->experts_held, E,
           m->expert_bytes, m->mat_bytes, m->arena_floats * sizeof(float),
           (unsigned long long)before, (unsigned long long)after);
    td_model_destroy(m);
    td_placement_destroy(p);
    return 0;
}

/* ---- run ------------------------------------------------------------------------------ */

typedef struct db_run db_run_t;

/* One rank: model, communicator, DEP context, pool, thread; its requests;
 * its counters at the start and the end of the timed steps. */
typedef struct {
    db_run_t *run;
    uint32_t rank;
    td_model_t *m;
    td_comm_t *comm;
    td_forward_dep_t *dep;
    td_kernels_cpu_pool_t *pool;
    pthread_t th;
    bool started;
    td_forward_seq_t *seqs;    /* [requests] */
    size_t nseqs;
    td_status_t st;
    td_comm_stats_t c0, c1;
    td_forward_dep_stats_t d0, d1;
} db_rank_t;

struct db_run {
    const db_opts_t *o;
    uint32_t n;
    db_rank_t *ranks;
    size_t nsteps;             /* step 0 the prefill, then W warm-up and S timed decode steps */
    size_t first;              /* the first timed step */
    double *step_s;            /* [nsteps] each step's wall time */
    pthread_barrier_t bar;
    td_kvmem_t **mem;          /* [requests] */
    td_cache_t *caches;
    float *logits;             /* [requests, V] */
    int32_t **prompts, *next;
    uint64_t hash;             /* FNV-1a of the timed steps' logits */
};

/* Every rank runs the whole schedule; barriers line the steps up for the
 * clock (the passes line up at every MoE layer anyway). */
static void *
db_rank_main(void *arg)
{
    db_rank_t *k = arg;
    db_run_t *r = k->run;
    const db_opts_t *o = r->o;
    size_t V = (size_t)k->m->cfg->vocab_size, R = (size_t)o->requests;

    td_kernels_cpu_pool_bind(k->pool);
    for (size_t s = 0; s < r->nsteps; s++) {
        k->nseqs = 0;
        for (size_t i = k->rank; i < R; i += r->n)
            k->seqs[k->nseqs++] = s == 0 ? (td_forward_seq_t){ &r->caches[i], r->prompts[i],
                                                               (size_t)o->prompt,
                                                               r->logits + i * V, 0, 0 }
                                         : (td_forward_seq_t){ &r->caches[i], &r->next[i], 1,
                                                               r->logits + i * V, 0, 0 };
        pthread_barrier_wait(&r->bar);
        if (s == r->first && k->dep != NULL) {
            td_comm_stats(k->comm, &k->c0);
            td_forward_dep_stats(k->dep, &k->d0);
        }
        double t0 = td_clock_s();
        if (k->dep != NULL)
            k->st = td_forward_dep(k->dep, k->seqs, k->nseqs, NULL, NULL);
        else
            k->st = td_forward(k->m, k->seqs, k->nseqs, NULL, NULL);
        pthread_barrier_wait(&r->bar);
        if (k->rank == 0)
            r->step_s[s] = td_clock_s() - t0;
        if (k->st != TD_OK) {
            fprintf(stderr, "depbench: rank %u: step %zu: %s\n", k->rank, s,
                    td_status_str(k->st));
            exit(1);   /* the others are stuck or failing too */
        }
        for (size_t i = k->rank; i < R; i += r->n)
            r->next[i] = td_sample_argmax(r->logits + i * V, V);
        pthread_barrier_wait(&r->bar);
        if (k->rank == 0 && s >= r->first) {
            const unsigned char *b = (const unsigned char *)r->logits;
            for (size_t j = 0; j < R * V * sizeof(float); j++)
                r->hash = (r->hash ^ b[j]) * 0x100000001B3ull;
        }
    }
    if (k->dep != NULL) {
        td_comm_stats(k->comm, &k->c1);
        td_forward_dep_stats(k->dep, &k->d1);
    }
    return NULL;
}

static int
db_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int
db_run(const db_opts_t *o)
{
    uint32_t E = db_experts(o->model), n = (uint32_t)o->dep;
    size_t R = (size_t)o->requests;
    td_placement_t *p = NULL;
    td_comm_group_t *g = NULL;
    db_run_t r = { .o = o, .n = n, .hash = 0xCBF29CE484222325ull };
    int rc = 1, barrier = 0;

    if (E == 0)
        return 1;   /* logged */
    r.first = 1 + (size_t)o->warmup;
    r.nsteps = r.first + (size_t)o->steps;
    r.ranks = calloc(n, sizeof(*r.ranks));
    r.step_s = calloc(r.nsteps, sizeof(double));
    r.mem = calloc(R, sizeof(*r.mem));
    r.caches = calloc(R, sizeof(*r.caches));
    r.prompts = calloc(R, sizeof(*r.prompts));
    r.next = calloc(R, sizeof(*r.next));
    if (r.ranks == NULL || r.step_s == NULL || r.mem == NULL || r.caches == NULL ||
        r.prompts == NULL || r.next == NULL)
        goto out;
    if (n > 1 && (db_placement(o, E, &p) != TD_OK || td_comm_group_create(n, NULL, &g) != TD_OK))
        goto out;   /* logged */
    unsigned threads = o->threads ? (unsigned)o->threads : td_kernels_cpu_threads() / n;
    double t_load = td_clock_s();
    for (uint32_t k = 0; k < n; k++) {
        db_rank_t *rk = &r.ranks[k];
        td_model_opts_t mo = { p, k };
        rk->run = &r;
        rk->rank = k;
        if (td_model_load_opts(o->model, n > 1 ? &mo : NULL, &rk->m) != TD_OK)
            goto out;
        if (n > 1 && (td_comm_cpu_create(g, k, &rk->comm) != TD_OK ||
                      td_forward_dep_create(rk->m, rk->comm, p, &rk->dep) != TD_OK))
            goto out;
        if (td_kernels_cpu_pool_create(threads ? threads : 1, &rk->pool) != TD_OK)
            goto out;
        if ((rk->seqs = calloc(R, sizeof(*rk->seqs))) == NULL)
            goto out;
    }
    t_load = td_clock_s() - t_load;
    const td_modelcfg_t *cfg = r.ranks[0].m->cfg;
    size_t V = (size_t)cfg->vocab_size;
    r.logits = calloc(R * V, sizeof(float));
    if (r.logits == NULL)
        goto out;
    for (size_t i = 0; i < R; i++) {
        const td_model_t *m = r.ranks[i % n].m;
        r.prompts[i] = malloc((size_t)o->prompt * sizeof(int32_t));
        if (r.prompts[i] == NULL)
            goto out;
        for (size_t j = 0; j < o->prompt; j++)
            r.prompts[i][j] = (int32_t)(3 + (i * 7919 + j * 104729) % (V - 3));
        if (td_kvmem_create(m->plan->layout, o->prompt + r.nsteps + 1, 0, &r.mem[i]) != TD_OK ||
            td_cache_init(&r.caches[i], m->plan, &r.mem[i]->kv) != TD_OK)
            goto out;
        td_cache_reset(&r.caches[i]);
    }
    if (pthread_barrier_init(&r.bar, NULL, n) != 0)
        goto out;
    barrier = 1;
    for (uint32_t k = 0; k < n; k++)
        r.ranks[k].started = pthread_create(&r.ranks[k].th, NULL, db_rank_main,
                                            &r.ranks[k]) == 0;
    for (uint32_t k = 0; k < n; k++)
        if (r.ranks[k].started)
            pthread_join(r.ranks[k].th, NULL);
        else
            goto out;   /* (the others wait forever at the barrier: exit) */

    /* the timed steps */
    size_t S = (size_t)o->steps;
    double *ts = malloc(S * sizeof(double)), sum = 0;
    if (ts == NULL)
        goto out;
    memcpy(ts, r.step_s + r.first, S * sizeof(double));
    for (size_t i = 0; i < S; i++)
        sum += ts[i];
    qsort(ts, S, sizeof(double), db_cmp);
    double med = ts[S / 2], mean = sum / (double)S, best = ts[0];
    free(ts);
    /* the all-to-all bytes of the timed steps, per token and MoE layer */
    uint64_t disp = 0, comb = 0, disp_r = 0, comb_r = 0, wire = 0, passes = 0;
    for (uint32_t k = 0; k < n && r.ranks[k].dep != NULL; k++) {
        const db_rank_t *rk = &r.ranks[k];
        disp += rk->d1.dispatch_bytes - rk->d0.dispatch_bytes;
        comb += rk->d1.combine_bytes - rk->d0.combine_bytes;
        disp_r += rk->d1.dispatch_remote - rk->d0.dispatch_remote;
        comb_r += rk->d1.combine_remote - rk->d0.combine_remote;
        wire += rk->c1.bytes_sent - rk->c0.bytes_sent;
        passes += rk->d1.passes - rk->d0.passes;
    }
    double tl = (double)(R * S) * (double)cfg->num_hidden_layers;
    double theory = (double)cfg->num_experts_per_tok * (double)cfg->hidden_size * 4.0;
    printf("{\"dep\": %u, \"placement\": \"%s\", \"requests\": %zu, \"prompt\": %llu, "
           "\"steps\": %zu, \"threads_per_rank\": %u, \"load_s\": %.3f, "
           "\"step_ms\": {\"median\": %.3f, \"mean\": %.3f, \"min\": %.3f}, "
           "\"tok_s\": %.1f, \"hidden\": %lld, \"topk\": %lld, \"layers\": %lld, "
           "\"a2a_bytes_per_token_layer\": {\"theory_each_way\": %.1f, \"dispatch\": %.1f, "
           "\"combine\": %.1f, \"dispatch_remote\": %.1f, \"combine_remote\": %.1f, "
           "\"comm_bytes_sent\": %.1f, \"allgather\": %.1f}, \"logits_fnv\": \"%016llx\"}\n",
           n, o->placement ? o->placement : (n > 1 ? "ranges" : "none"), R,
           (unsigned long long)o->prompt, S, threads ? threads : 1, t_load, med * 1e3,
           mean * 1e3, best * 1e3, (double)R / med, (long long)cfg->hidden_size,
           (long long)cfg->num_experts_per_tok, (long long)cfg->num_hidden_layers, theory,
           (double)disp / tl, (double)comb / tl, (double)disp_r / tl, (double)comb_r / tl,
           (double)wire / tl, (double)(passes * 8 * (n - 1)) / tl, (unsigned long long)r.hash);
    rc = 0;
out:
    if (barrier)
        pthread_barrier_destroy(&r.bar);
    for (size_t i = 0; i < R && r.mem != NULL; i++) {
        td_kvmem_destroy(r.mem[i]);
        free(r.prompts ? r.prompts[i] : NULL);
    }
    for (uint32_t k = 0; r.ranks != NULL && k < n; k++) {
        td_forward_dep_destroy(r.ranks[k].dep);
        td_comm_destroy(r.ranks[k].comm);
        td_kernels_cpu_pool_destroy(r.ranks[k].pool);
        td_model_destroy(r.ranks[k].m);
        free(r.ranks[k].seqs);
    }
    td_comm_group_destroy(g);
    td_placement_destroy(p);
    free(r.ranks);
    free(r.step_s);
    free(r.mem);
    free(r.caches);
    free(r.prompts);
    free(r.next);
    free(r.logits);
    return rc;
}

int
main(int argc, char **argv)
{
    db_opts_t o;
    int rc;

    td_log_set_ident("depbench");
    td_log_set_level(TD_LOG_WARN);
    rc = db_parse(argc, argv, &o);
    if (rc != 0)
        return rc;
    return strcmp(o.cmd, "rss") == 0 ? db_rss(&o) : db_run(&o);
}
