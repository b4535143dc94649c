/* tests/model/fwspace_check.c — the forward pass's workspace: every pass
 * takes exactly td_forward_workspace_bytes (the figure tools/memplan
 * prints) for its shape — a prefill, a 256-row chunk after a cached prefix,
 * a batched decode, a long one-shot prompt split into passes — and the
 * results do not depend on the split.
 *
 *   fwspace_check MK_TINY_MODEL */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "kvmem.h"
#include "log.h"
#include "model.h"

static int failures;

static void
expect(const char *what, size_t got, size_t want)
{
    if (got != want) {
        fprintf(stderr, "fwspace_check: %s: the pass took %zu bytes, the function says %zu\n",
                what, got, want);
        failures++;
    } else {
        fprintf(stderr, "fwspace_check: %s: %zu bytes, as the function says\n", what, got);
    }
}

static td_kvmem_t *
cache(const td_model_t *m, uint64_t cap, td_cache_t *c)
{
    td_kvmem_t *mem = NULL;
    if (td_kvmem_create(m->plan->layout, cap, 0, &mem) != TD_OK ||
        td_cache_init(c, m->plan, &mem->kv) != TD_OK) {
        fprintf(stderr, "fwspace_check: no cache\n");
        exit(1);
    }
    td_cache_reset(c);
    return mem;
}

int
main(int argc, char **argv)
{
    char tmp[] = "/tmp/fwspace_check.XXXXXX", dir[256], cmd[1024];
    td_model_t *m = NULL;

    if (argc != 2) {
        fprintf(stderr, "usage: fwspace_check MK_TINY_MODEL\n");
        return 2;
    }
    td_log_set_level(TD_LOG_WARN);
    if (mkdtemp(tmp) == NULL)
        return 1;
    snprintf(dir, sizeof(dir), "%s/tiny", tmp);
    snprintf(cmd, sizeof(cmd), "'%s' --preset tiny --seed 9 --quant fp8+fp4 '%s' >/dev/null",
             argv[1], dir);
    if (system(cmd) != 0 || td_model_load(dir, &m) != TD_OK)
        return 1;
    const td_modelcfg_t *c = m->cfg;
    size_t V = (size_t)c->vocab_size;
    int32_t *tok = malloc(700 * sizeof(int32_t));
    float *a = malloc(700 * V * sizeof(float)), *b = malloc(700 * V * sizeof(float));
    for (size_t i = 0; i < 700; i++)
        tok[i] = (int32_t)((i * 7919 + 11) % V);
    td_cache_t c1, c2, c3[3];
    td_kvmem_t *m1 = cache(m, 800, &c1), *m2 = cache(m, 800, &c2), *m3[3];

    /* in growing order: td_forward_workspace_peak is the largest so far */
    if (td_forward_prefill(m, &c1, tok, 40, 0, a) != TD_OK)
        return 1;
    expect("prefill of 40", td_forward_workspace_peak(), td_forward_workspace_bytes(c, m->plan, 1, 40, 40));
    for (int i = 0; i < 3; i++) {
        m3[i] = cache(m, 800, &c3[i]);
        if (td_forward_prefill(m, &c3[i], tok + 100 * i, 60, 0, a) != TD_OK)
            return 1;
    }
    td_cache_t *cp[3] = { &c3[0], &c3[1], &c3[2] };
    if (td_forward_decode(m, cp, tok, 3, a) != TD_OK)
        return 1;
    expect("decode of 3 at 61 tokens", td_forward_workspace_peak(),
           td_forward_workspace_bytes(c, m->plan, 1, 60, 60) >
                   td_forward_workspace_bytes(c, m->plan, 3, 1, 61)
               ? td_forward_workspace_bytes(c, m->plan, 1, 60, 60)
               : td_forward_workspace_bytes(c, m->plan, 3, 1, 61));
    if (td_forward_prefill(m, &c1, tok + 40, 256, 0, a) != TD_OK)
        return 1;
    expect("256 rows after 40", td_forward_workspace_peak(),
           td_forward_workspace_bytes(c, m->plan, 1, 256, 296));
    /* one shot of 700 = passes of 256 (T 256, 512) and 188 (T 700) */
    if (td_forward_prefill(m, &c2, tok, 700, 1, a) != TD_OK)
        return 1;
    size_t p2 = td_forward_workspace_bytes(c, m->plan, 1, 256, 512);
    size_t p3 = td_forward_workspace_bytes(c, m->plan, 1, 188, 700);
    expect("700 in one shot", td_forward_workspace_peak(), p2 > p3 ? p2 : p3);
    /* the same prompt in chunks of 100: the same logits bit for bit */
    td_kvmem_destroy(m2);
    m2 = cache(m, 800, &c2);
    for (size_t at = 0; at < 700; at += 100)
        if (td_forward_prefill(m, &c2, tok + at, 100, 1, b + at * V) != TD_OK)
            return 1;
    if (memcmp(a, b, 700 * V * sizeof(float)) != 0) {
        fprintf(stderr, "fwspace_check: one shot of 700 and chunks of 100 differ\n");
        failures++;
    }
    td_kvmem_destroy(m1);
    td_kvmem_destroy(m2);
    for (int i = 0; i < 3; i++)
        td_kvmem_destroy(m3[i]);
    free(tok);
    free(a);
    free(b);
    td_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "fwspace_check: could not remove %s\n", tmp);
    fprintf(stderr, "fwspace_check: %s\n", failures ? "FAILED" : "all checks passed");
    return failures != 0;
}
