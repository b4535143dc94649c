/* tests/model/logit_hashes.c — the forward pass's logits bit for bit: every
 * logit row of fixed prompts (one-shot prefill, all positions) and of 32
 * greedy decode steps (all prompts of a checkpoint decoded as one batch) on
 * tiny, tiny fp8+fp4 and mid fp8+fp4 checkpoints, each row hashed (FNV-1a 64
 * of its f32 bytes) and compared with tests/golden/logit-hashes.txt.
 *
 *   logit_hashes MK_TINY_MODEL FIXTURE            # compare; exit 1 on a difference
 *   logit_hashes MK_TINY_MODEL FIXTURE --write    # rewrite the fixture
 *
 * The fixture records what the cpu backend computes; a change to the forward
 * pass that keeps every bit keeps every line (docs/forward.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "kvmem.h"
#include "log.h"
#include "model.h"

#define LH_STEPS 32
#define LH_MAX_PROMPTS 5

typedef struct {
    const char *name;
    const char *args;                  /* mk-tiny-model's */
    size_t lens[LH_MAX_PROMPTS];       /* prompt lengths; 0 ends */
} lh_config_t;

static const lh_config_t lh_configs[] = {
    { "tiny", "--preset tiny --seed 1 --dtype f32 --init perturbed", { 1, 9, 29, 300, 0 } },
    { "tiny-fp8fp4", "--preset tiny --seed 4 --dtype bf16 --quant fp8+fp4 --init perturbed",
      { 1, 9, 29, 0 } },
    { "mid-fp8fp4", "--preset mid --seed 7 --quant fp8+fp4", { 1, 40, 0 } },
};

static uint64_t
lh_hash(const float *row, size_t n)
{
    const unsigned char *p = (const unsigned char *)row;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static int32_t
lh_argmax(const float *row, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return (int32_t)best;
}

/* Prompt p of length n: a fixed mix of ids below vocab. */
static void
lh_prompt(int32_t *t, size_t n, size_t p, uint32_t vocab)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (p + 1);
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((s >> 33) % vocab);
    }
}

/* Every row of one checkpoint, one line each, to out. */
static int
lh_run(const lh_config_t *cf, const char *dir, FILE *out)
{
    td_model_t *m = NULL;
    if (td_model_load(dir, &m) != TD_OK)
        return -1;
    size_t V = (size_t)m->cfg->vocab_size, np = 0, most = 0;
    while (np < LH_MAX_PROMPTS && cf->lens[np] != 0) {
        most = cf->lens[np] > most ? cf->lens[np] : most;
        np++;
    }
    td_kvmem_t *mem[LH_MAX_PROMPTS] = { 0 };
    td_cache_t caches[LH_MAX_PROMPTS], *cp[LH_MAX_PROMPTS];
    int32_t *tok = malloc(most * sizeof(*tok)), next[LH_MAX_PROMPTS];
    float *lg = malloc(most * V * sizeof(float));
    int rc = tok == NULL || lg == NULL ? -1 : 0;

    for (size_t p = 0; p < np && rc == 0; p++) {
        size_t n = cf->lens[p];
        cp[p] = &caches[p];
        if (td_kvmem_create(m->plan->layout, n + LH_STEPS, 0, &mem[p]) != TD_OK ||
            td_cache_init(cp[p], m->plan, &mem[p]->kv) != TD_OK) {
            rc = -1;
            break;
        }
        td_cache_reset(cp[p]);
        lh_prompt(tok, n, p, (uint32_t)V);
        if (td_forward_prefill(m, cp[p], tok, n, 1, lg) != TD_OK) {
            rc = -1;
            break;
        }
        for (size_t r = 0; r < n; r++)
            fprintf(out, "%s p%zu prefill %zu %016llx\n", cf->name, p, r,
                    (unsigned long long)lh_hash(lg + r * V, V));
        next[p] = lh_argmax(lg + (n - 1) * V, V);
    }
    for (size_t s = 0; s < LH_STEPS && rc == 0; s++) {
        if (td_forward_decode(m, cp, next, np, lg) != TD_OK) {
            rc = -1;
            break;
        }
        for (size_t p = 0; p < np; p++) {
            fprintf(out, "%s p%zu decode %zu %016llx\n", cf->name, p, s,
                    (unsigned long long)lh_hash(lg + p * V, V));
            next[p] = lh_argmax(lg + p * V, V);
        }
    }
    for (size_t p = 0; p < np; p++)
        td_kvmem_destroy(mem[p]);
    free(tok);
    free(lg);
    td_model_destroy(m);
    return rc;
}

int
main(int argc, char **argv)
{
    if (argc < 3 || (argc == 4 && strcmp(argv[3], "--write") != 0) || argc > 4) {
        fprintf(stderr, "usage: logit_hashes MK_TINY_MODEL FIXTURE [--write]\n");
        return 2;
    }
    int write = argc == 4;
    char tmp[] = "/tmp/logit_hashes.XXXXXX", dir[256], cmd[1024];
    char *got = NULL;
    size_t got_len = 0;
    FILE *out = open_memstream(&got, &got_len);
    int rc = 0;

    td_log_set_level(TD_LOG_WARN);
    if (out == NULL || mkdtemp(tmp) == NULL) {
        perror("logit_hashes");
        return 1;
    }
    for (size_t i = 0; i < sizeof(lh_configs) / sizeof(lh_configs[0]) && rc == 0; i++) {
        snprintf(dir, sizeof(dir), "%s/%s", tmp, lh_configs[i].name);
        snprintf(cmd, sizeof(cmd), "'%s' %s '%s' >/dev/null", argv[1], lh_configs[i].args, dir);
        if (system(cmd) != 0 || lh_run(&lh_configs[i], dir, out) != 0) {
            fprintf(stderr, "logit_hashes: %s failed\n", lh_configs[i].name);
            rc = 1;
        }
    }
    fclose(out);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "logit_hashes: could not remove %s\n", tmp);
    if (rc == 0 && write) {
        FILE *f = fopen(argv[2], "w");
        rc = f == NULL || fwrite(got, 1, got_len, f) != got_len;
        if (f != NULL && fclose(f) != 0)
            rc = 1;
        fprintf(stderr, "logit_hashes: %s %s\n", argv[2], rc ? "not written" : "written");
    } else if (rc == 0) {
        FILE *f = fopen(argv[2], "r");
        char line[256];
        size_t at = 0, lines = 0, bad = 0;
        if (f == NULL) {
            fprintf(stderr, "logit_hashes: no fixture %s\n", argv[2]);
            rc = 1;
        }
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            size_t len = strlen(line);
            lines++;
            if (at + len > got_len || memcmp(got + at, line, len) != 0) {
                if (bad++ < 8)
                    fprintf(stderr, "logit_hashes: differs: %s", line);
            }
            const char *nl = at < got_len ? memchr(got + at, '\n', got_len - at) : NULL;
            at = nl ? (size_t)(nl - got) + 1 : got_len;
        }
        if (f != NULL)
            fclose(f);
        if (f != NULL && (bad > 0 || at != got_len || lines == 0)) {
            fprintf(stderr, "logit_hashes: %zu of %zu rows differ%s\n", bad, lines,
                    at != got_len ? " (and the row count)" : "");
            rc = 1;
        } else if (f != NULL) {
            fprintf(stderr, "logit_hashes: %zu rows match\n", lines);
        }
    }
    free(got);
    return rc;
}
