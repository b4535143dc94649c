/* tests/fuzz/fuzz_modelcfg.c — the DeepSeek-V4.1 config reader
 * (model/modelcfg.c) on arbitrary config.json text: td_modelcfg_parse, then
 * for a config it resolves the support check, the feature checks, the engram
 * bucket layout and the resolved config written back as JSON. Checks: an
 * error has a message; the written-back config parses again and writes back
 * the same (resolution is idempotent); a config that passes the check has a
 * layer table whose groups and sources agree, and engram buckets that fit
 * their tables. Input: the config text. */
#include <jansson.h>
#include <stdlib.h>

#include "fuzz.h"
#include "modelcfg.h"

static void
mc_check_layers(const td_modelcfg_t *cfg)
{
    for (int64_t i = 0; i < cfg->num_hidden_layers; i++) {
        const td_modelcfg_layer_t *l = &cfg->layers[i];

        FUZZ_CHECK(l->ratio == cfg->compress_ratios.v[i]);
        FUZZ_CHECK(l->ratio == 0 ? l->group == -1 : l->group >= 0 && l->group <= i);
        if (l->group >= 0)
            FUZZ_CHECK(cfg->layers[l->group].kv_source);
        FUZZ_CHECK(l->engram < 0 || (uint32_t)l->engram < cfg->engram_layer_ids.n);
    }
    for (uint32_t k = 0; k < cfg->engram_layer_ids.n; k++) {
        uint64_t per = (uint64_t)(cfg->engram_max_ngram_size - 1) *
                       (uint64_t)cfg->engram_n_heads;
        uint64_t *primes = malloc(per * sizeof(*primes)), total = 0, sum = 0;

        FUZZ_CHECK(primes != NULL);
        FUZZ_CHECK(td_modelcfg_engram_primes(cfg, k, primes, &total) == TD_OK);
        for (uint64_t i = 0; i < per; i++) {
            FUZZ_CHECK(primes[i] >= (uint64_t)cfg->engram_vocab_size);
            FUZZ_CHECK(i == 0 || primes[i] > primes[i - 1]);
            sum += primes[i];
        }
        FUZZ_CHECK(sum == total && total <= (uint64_t)cfg->engram_num_embeddings.v[k]);
        free(primes);
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    td_modelcfg_t *cfg = NULL, *again = NULL;
    char err[512] = "", err2[512] = "";
    char *json, *json2;
    td_status_t st;

    if (!init) {
        fuzz_log_quiet();
        init = 1;
    }
    st = td_modelcfg_parse((const char *)data, size, &cfg, err, sizeof err);
    if (st != TD_OK) {
        FUZZ_CHECK(cfg == NULL);
        FUZZ_CHECK(st == TD_ERR_NOMEM || err[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(cfg != NULL);
    json = td_modelcfg_to_json(cfg);
    FUZZ_CHECK(json != NULL);
    st = td_modelcfg_parse(json, strlen(json), &again, err2, sizeof err2);
    if (st != TD_OK)
        fprintf(stderr, "written back, refused: %s\n%s\n", err2, json);
    FUZZ_CHECK(st == TD_OK);
    json2 = td_modelcfg_to_json(again);
    FUZZ_CHECK(json2 != NULL);
    if (strcmp(json, json2) != 0)
        fprintf(stderr, "written back twice, differs:\n%s\n%s\n", json, json2);
    FUZZ_CHECK(strcmp(json, json2) == 0);
    free(json2);
    td_modelcfg_destroy(again);
    free(json);

    (void)td_modelcfg_require(cfg, TD_MODELCFG_FEATURE_IMAGES, err, sizeof err);
    (void)td_modelcfg_require(cfg, TD_MODELCFG_FEATURE_DRAFTING, err, sizeof err);
    st = td_modelcfg_check(cfg, err, sizeof err);
    if (st == TD_OK)
        mc_check_layers(cfg);
    else
        FUZZ_CHECK((st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED) && err[0] != '\0');
    td_modelcfg_destroy(cfg);
    return 0;
}
