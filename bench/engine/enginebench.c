/* bench/engine/enginebench.c — forward-pass throughput of the cpu engine on
 * one checkpoint: prefill tokens/s (one request, N tokens in chunks of C) and
 * decode tokens/s at given batch sizes (each row a request at its own
 * position after a prefill); warm-up and repeats, one JSON object out. */
#include "kvmem.h"
#include "model.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "clock.h"
#include "config.h"
#include "log.h"

#define EB_MAX_BATCHES 8
#define EB_MAX_REPEATS 64

typedef struct {
    const char *model;
    size_t prompt, chunk, context, steps;
    size_t batches[EB_MAX_BATCHES], nbatches;
    size_t warmup, repeats;
    uint64_t kv_seed;          /* 0: KV blocks in order; else scattered by this seed */
    unsigned threads;
    const char *prompts, *logits_out;
    int prefill, decode;
} eb_opts_t;

/* prompts[i]: request i's token ids (from --prompts, or generated). */
typedef struct {
    int32_t **ids;
    size_t *len;
    size_t n;
} eb_prompts_t;

static void
eb_usage(FILE *f)
{
    fprintf(f,
            "usage: enginebench --model DIR [--prompt N] [--chunk C] [--context N] [--steps S]\n"
            "                   [--batch B[,B...]] [--warmup W] [--repeats R] [--threads T]\n"
            "                   [--prompts FILE] [--logits-out FILE] [--only prefill|decode]\n"
            "                   [--kv-seed S]\n"
            "  prefill: one request, the first N tokens of prompt 0 (default 512) fed in\n"
            "    chunks of C (default N); W untimed runs (default 1), then R timed (default 3),\n"
            "    each on an emptied cache.\n"
            "  decode: per batch size B (default 1,16), B requests each prefilled with the\n"
            "    first --context tokens (default 256) of its own prompt (untimed), then W\n"
            "    untimed steps and S timed steps (default 32) of greedy tokens, all B\n"
            "    requests in one call per step; R repeats from the same prefilled caches.\n"
            "  --threads: cpu threads of the engine (default: $TD_CPU_THREADS or all CPUs).\n"
            "  --kv-seed: each request's KV blocks at places shuffled by S + its index\n"
            "    (default 0: in order); the hashes stay the same.\n"
            "  --prompts: one request per line, token ids separated by commas or spaces;\n"
            "    default: ids drawn from [3, vocab) by a fixed generator.\n"
            "  --logits-out: the last prefill position's logits of the first timed run, as\n"
            "    little-endian float32 (to compare with another implementation).\n"
            "Prints one JSON object: the runs' seconds, medians, tokens/s and an FNV-1a\n"
            "hash of the logits (prefill: the last position's; decode: every step's of\n"
            "the first repeat), which stays the same while results keep every bit.\n");
}

static int
eb_parse(int argc, char **argv, eb_opts_t *o)
{
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' },
        { "prompt", required_argument, NULL, 'n' },
        { "chunk", required_argument, NULL, 'c' },
        { "context", required_argument, NULL, 'x' },
        { "steps", required_argument, NULL, 's' },
        { "batch", required_argument, NULL, 'b' },
        { "warmup", required_argument, NULL, 'w' },
        { "repeats", required_argument, NULL, 'r' },
        { "threads", required_argument, NULL, 't' },
        { "prompts", required_argument, NULL, 'p' },
        { "logits-out", required_argument, NULL, 'l' },
        { "only", required_argument, NULL, 'o' },
        { "kv-seed", required_argument, NULL, 'k' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    char err[TD_CONFIG_ERRLEN];
    int c, idx = 0;
    uint64_t v = 0;

    memset(o, 0, sizeof(*o));
    o->prompt = 512;
    o->context = 256;
    o->steps = 32;
    o->batches[0] = 1;
    o->batches[1] = 16;
    o->nbatches = 2;
    o->warmup = 1;
    o->repeats = 3;
    o->prefill = o->decode = 1;
    while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompts = optarg; break;
        case 'l': o->logits_out = optarg; break;
        case 'n': case 'c': case 'x': case 's': case 'w': case 'r': case 't': case 'k':
            if (td_config_parse_uint(opts[idx].name, optarg, 0, c == 't' ? 65536 : 0, &v, err,
                                     sizeof(err)) != TD_OK) {
                fprintf(stderr, "enginebench: --%s\n", err);
                return 2;
            }
            if (c == 'n') o->prompt = v;
            if (c == 'c') o->chunk = v;
            if (c == 'x') o->context = v;
            if (c == 's') o->steps = v;
            if (c == 'w') o->warmup = v;
            if (c == 'r') o->repeats = v;
            if (c == 't') o->threads = (unsigned)v;
            if (c == 'k') o->kv_seed = v;
            break;
        case 'b': {
            char *save = NULL, *copy = strdup(optarg);
            o->nbatches = 0;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->nbatches == EB_MAX_BATCHES ||
                    td_config_parse_uint("batch", t, 1, 1u << 20, &v, NULL, 0) != TD_OK) {
                    fprintf(stderr, "enginebench: --batch %s: up to %d sizes >= 1\n", optarg,
                            EB_MAX_BATCHES);
                    free(copy);
                    return 2;
                }
                o->batches[o->nbatches++] = v;
            }
            free(copy);
            break;
        }
        case 'o':
            o->prefill = strcmp(optarg, "prefill") == 0;
            o->decode = strcmp(optarg, "decode") == 0;
            if (!o->prefill && !o->decode) {
                fprintf(stderr, "enginebench: --only %s: prefill or decode\n", optarg);
                return 2;
            }
            break;
        case 'h': eb_usage(stdout); exit(0);
        default: eb_usage(stderr); return 2;
        }
    }
    if (o->model == NULL || optind != argc) {
        eb_usage(stderr);
        return 2;
    }
    if (o->chunk == 0)
        o->chunk = o->prompt;
    if (o->prompt == 0 || o->context == 0 || o->steps == 0 || o->repeats == 0 ||
        o->repeats > EB_MAX_REPEATS) {
        fprintf(stderr, "enginebench: --prompt, --context, --steps must be >= 1, --repeats "
                        "1 .. %d\n", EB_MAX_REPEATS);
        return 2;
    }
    return 0;
}

/* ---- prompts ------------------------------------------------------------------ */

static void
eb_prompts_free(eb_prompts_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->ids[i]);
    free(p->ids);
    free(p->len);
}

static int
eb_prompts_add(eb_prompts_t *p, int32_t *ids, size_t len)
{
    int32_t **ni = realloc(p->ids, (p->n + 1) * sizeof(*ni));
    if (ni == NULL)
        return -1;
    p->ids = ni;
    size_t *nl = realloc(p->len, (p->n + 1) * sizeof(*nl));
    if (nl == NULL)
        return -1;
    p->len = nl;
    p->ids[p->n] = ids;
    p->len[p->n++] = len;
    return 0;
}

static int
eb_prompts_read(const char *path, int64_t vocab, eb_prompts_t *p)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc = -1;

    if (f == NULL) {
        fprintf(stderr, "enginebench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    while ((got = getline(&line, &cap, f)) >= 0) {
        int32_t *ids = malloc(((size_t)got / 2 + 1) * sizeof(int32_t));
        size_t n = 0;
        if (ids == NULL)
            goto out;
        for (char *s = line, *end; *s; s = end) {
            while (*s == ',' || *s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')
                s++;
            if (*s == '\0')
                break;
            long v = strtol(s, &end, 10);
            if (end == s) {
                fprintf(stderr, "enginebench: %s: line %zu: not a token id at byte %zu\n", path,
                        p->n + 1, (size_t)(s - line));
                free(ids);
                goto out;
            }
            if (v < 0 || v >= vocab) {
                fprintf(stderr, "enginebench: %s: line %zu: token id %ld outside the vocabulary "
                                "of %lld\n", path, p->n + 1, v, (long long)vocab);
                free(ids);
                goto out;
            }
            ids[n++] = (int32_t)v;
        }
        if (n == 0) {
            free(ids);
            continue;
        }
        if (eb_prompts_add(p, ids, n) != 0) {
            free(ids);
            goto out;
        }
    }
    rc = 0;
out:
    free(line);
    fclose(f);
    return rc;
}

static int
eb_prompts_generate(size_t count, size_t len, int64_t vocab, eb_prompts_t *p)
{
    for (size_t i = 0; i < count; i++) {
        int32_t *ids = malloc(len * sizeof(int32_t));
        if (ids == NULL)
            return -1;
        for (size_t j = 0; j < len; j++)
            ids[j] = 3 + (int32_t)(bench_pattern_word(0x5eed, i, j) % (uint64_t)(vocab - 3));
        if (eb_prompts_add(p, ids, len) != 0) {
            free(ids);
            return -1;
        }
    }
    return 0;
}

/* ---- runs ------------------------------------------------------------------------- */

/* FNV-1a over the bytes of n floats, folded into h: a fingerprint of the
 * logits, to see that a change kept every bit. */
static uint64_t
eb_hash(uint64_t h, const float *x, size_t n)
{
    const unsigned char *p = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#define EB_HASH0 0xcbf29ce484222325ull

static int32_t
eb_argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* Feed prompt[0, n) to c in chunks; the last position's logits into logits. */
static td_status_t
eb_prefill(const td_model_t *m, td_cache_t *c, const int32_t *ids, size_t n, size_t chunk,
           float *logits)
{
    for (size_t a = 0; a < n; a += chunk) {
        size_t k = n - a < chunk ? n - a : chunk;
        td_status_t st = td_forward_prefill(m, c, ids + a, k, 0, logits);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

static void
eb_print_runs(const double *s, size_t n)
{
    printf("[");
    for (size_t i = 0; i < n; i++)
        printf("%s%.6f", i ? ", " : "", s[i]);
    printf("]");
}

/* A cache over KV memory of its own for cap tokens (the benchmark owns the
 * memory, as a rank's pools would), its blocks in order, or scattered by
 * seed (not 0). */
static td_kvmem_t *
eb_cache(const td_model_t *m, uint64_t cap, uint64_t seed, td_cache_t *c)
{
    td_kvmem_t *mem = NULL;

    if (td_kvmem_create(m->plan->layout, cap, seed, &mem) != TD_OK)   /* logs why */
        return NULL;
    if (td_cache_init(c, m->plan, &mem->kv) != TD_OK) {
        td_kvmem_destroy(mem);
        return NULL;
    }
    td_cache_reset(c);
    return mem;
}

static int
eb_run_prefill(const eb_opts_t *o, const td_model_t *m, const eb_prompts_t *p, size_t V)
{
    td_cache_t cache, *c = &cache;
    td_kvmem_t *mem = NULL;
    float *logits = malloc(V * sizeof(float));
    double secs[EB_MAX_REPEATS], sorted[EB_MAX_REPEATS];
    uint64_t hash = EB_HASH0;
    int rc = 1;

    if (p->len[0] < o->prompt) {
        fprintf(stderr, "enginebench: prompt 0 has %zu tokens, --prompt wants %zu\n",
                p->len[0], o->prompt);
        goto out;
    }
    if (logits == NULL || (mem = eb_cache(m, o->prompt, o->kv_seed, c)) == NULL)
        goto out;
    for (size_t r = 0; r < o->warmup + o->repeats; r++) {
        td_cache_reset(c);
        double t0 = td_clock_s();
        if (eb_prefill(m, c, p->ids[0], o->prompt, o->chunk, logits) != TD_OK) {
            fprintf(stderr, "enginebench: prefill failed\n");
            goto out;
        }
        double dt = td_clock_s() - t0;
        if (r >= o->warmup)
            secs[r - o->warmup] = dt;
        if (r == o->warmup)
            hash = eb_hash(hash, logits, V);
        if (r == o->warmup && o->logits_out != NULL) {
            FILE *f = fopen(o->logits_out, "wb");
            if (f == NULL || fwrite(logits, sizeof(float), V, f) != V) {
                fprintf(stderr, "enginebench: cannot write %s\n", o->logits_out);
                if (f)
                    fclose(f);
                goto out;
            }
            fclose(f);
        }
    }
    memcpy(sorted, secs, o->repeats * sizeof(double));
    double med = bench_median(sorted, o->repeats);
    printf("\"prefill\": {\"tokens\": %zu, \"chunk\": %zu, \"seconds\": ", o->prompt, o->chunk);
    eb_print_runs(secs, o->repeats);
    printf(", \"median_s\": %.6f, \"tok_s\": %.2f, \"logits_fnv\": \"%016llx\"}", med,
           (double)o->prompt / med, (unsigned long long)hash);
    rc = 0;
out:
    td_kvmem_destroy(mem);
    free(logits);
    return rc;
}

static int
eb_run_decode(const eb_opts_t *o, const td_model_t *m, const eb_prompts_t *p, size_t V,
              size_t B)
{
    td_cache_t *caches = calloc(B, sizeof(*caches)), **c = calloc(B, sizeof(*c));
    td_kvmem_t **mem = calloc(B, sizeof(*mem)), **snap = calloc(B, sizeof(*snap));
    int32_t *tok = malloc(B * sizeof(int32_t)), *tok0 = malloc(B * sizeof(int32_t));
    float *logits = malloc(B * V * sizeof(float));
    double secs[EB_MAX_REPEATS], sorted[EB_MAX_REPEATS];
    size_t cap = o->context + o->warmup + o->steps;
    uint64_t hash = EB_HASH0;
    int rc = 1;

    if (caches == NULL || c == NULL || mem == NULL || snap == NULL || tok == NULL ||
        tok0 == NULL || logits == NULL)
        goto out;
    if (p->n < B) {
        fprintf(stderr, "enginebench: batch %zu needs %zu prompts, have %zu\n", B, B, p->n);
        goto out;
    }
    for (size_t i = 0; i < B; i++) {
        if (p->len[i] < o->context) {
            fprintf(stderr, "enginebench: prompt %zu has %zu tokens, --context wants %zu\n", i,
                    p->len[i], o->context);
            goto out;
        }
        c[i] = &caches[i];
        if ((mem[i] = eb_cache(m, cap, o->kv_seed ? o->kv_seed + i : 0, c[i])) == NULL ||
            eb_prefill(m, c[i], p->ids[i], o->context, o->context, logits) != TD_OK)
            goto out;
        tok0[i] = eb_argmax(logits, V);
        /* the state after the context, to start each repeat from */
        if (td_kvmem_create(m->plan->layout, o->context, 0, &snap[i]) != TD_OK)
            goto out;
        td_kvmem_copy(&snap[i]->kv, &mem[i]->kv, o->context);
    }
    for (size_t r = 0; r < o->repeats; r++) {
        for (size_t i = 0; i < B; i++)
            td_kvmem_copy(&mem[i]->kv, &snap[i]->kv, o->context);
        memcpy(tok, tok0, B * sizeof(int32_t));
        double t0 = 0.0;
        for (size_t s = 0; s < o->warmup + o->steps; s++) {
            if (s == o->warmup)
                t0 = td_clock_s();
            if (td_forward_decode(m, c, tok, B, logits) != TD_OK) {
                fprintf(stderr, "enginebench: decode step failed\n");
                goto out;
            }
            for (size_t i = 0; i < B; i++)
                tok[i] = eb_argmax(logits + i * V, V);
            if (r == 0)
                hash = eb_hash(hash, logits, B * V);
        }
        secs[r] = td_clock_s() - t0;
    }
    memcpy(sorted, secs, o->repeats * sizeof(double));
    double med = bench_median(sorted, o->repeats);
    printf("{\"batch\": %zu, \"context\": %zu, \"steps\": %zu, \"seconds\": ", B, o->context,
           o->steps);
    eb_print_runs(secs, o->repeats);
    printf(", \"median_s\": %.6f, \"ms_per_step\": %.3f, \"tok_s\": %.2f, "
           "\"logits_fnv\": \"%016llx\"}", med, 1e3 * med / (double)o->steps,
           (double)(B * o->steps) / med, (unsigned long long)hash);
    rc = 0;
out:
    for (size_t i = 0; mem != NULL && i < B; i++)
        td_kvmem_destroy(mem[i]);
    for (size_t i = 0; snap != NULL && i < B; i++)
        td_kvmem_destroy(snap[i]);
    free(caches);
    free(c);
    free(mem);
    free(snap);
    free(tok);
    free(tok0);
    free(logits);
    return rc;
}

int
main(int argc, char **argv)
{
    eb_opts_t o;
    eb_prompts_t p = { 0 };
    td_model_t *m = NULL;
    int rc = eb_parse(argc, argv, &o);

    if (rc != 0)
        return rc;
    td_log_set_level(TD_LOG_WARN);
    if (o.threads > 0 && td_kernels_cpu_set_threads(o.threads) != TD_OK)
        return 2;   /* logged: "threads: N outside 1 .. M" */
    double t0 = td_clock_s();
    if (td_model_load(o.model, &m) != TD_OK) {
        fprintf(stderr, "enginebench: cannot load %s\n", o.model);
        return 1;
    }
    double load_s = td_clock_s() - t0;
    size_t V = (size_t)m->cfg->vocab_size, maxb = 1;
    for (size_t i = 0; i < o.nbatches; i++)
        maxb = o.batches[i] > maxb ? o.batches[i] : maxb;
    size_t plen = o.prompt > o.context ? o.prompt : o.context;
    rc = 1;
    if (o.prompts != NULL ? eb_prompts_read(o.prompts, m->cfg->vocab_size, &p) != 0
                          : eb_prompts_generate(maxb, plen, m->cfg->vocab_size, &p) != 0)
        goto out;
    if (p.n == 0) {
        fprintf(stderr, "enginebench: %s holds no prompt\n", o.prompts);
        goto out;
    }
    printf("{\"impl\": \"tandem\", \"model\": \"%s\", \"threads\": %u, \"load_s\": %.3f, "
           "\"warmup\": %zu, \"repeats\": %zu", o.model, td_kernels_cpu_threads(), load_s,
           o.warmup, o.repeats);
    if (o.prefill) {
        printf(", ");
        if (eb_run_prefill(&o, m, &p, V) != 0)
            goto out;
    }
    if (o.decode) {
        printf(", \"decode\": [");
        for (size_t i = 0; i < o.nbatches; i++) {
            if (i)
                printf(", ");
            if (eb_run_decode(&o, m, &p, V, o.batches[i]) != 0)
                goto out;
        }
        printf("]");
    }
    printf("}\n");
    rc = 0;
out:
    fflush(stdout);
    eb_prompts_free(&p);
    td_model_destroy(m);
    return rc;
}
