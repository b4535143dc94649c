/* tests/unit/test_gpucost.c — the GPU cost model (sim/gpucost.h): the
 * shipped profiles and configs load, V4.1-Flash's KV bytes agree with the
 * layouts, times grow with the work and expert bytes shrink with the ranks,
 * the roofline max rule, bad profiles and configs are refused with a status,
 * and the synthetic engine sleeps the modeled times. */
#include "check.h"
#include "clock.h"
#include "gpucost.h"
#include "logcap.h"
#include "registry.h"

#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cacheplan.h"
#include "kvmem.h"
#include "modelcfg.h"

static char srcroot[PATH_MAX];   /* the source tree, from this file's path */

static void
path_of(char *out, size_t len, const char *rel)
{
    snprintf(out, len, "%s/%s", srcroot, rel);
}

static td_gpucost_t *
load(const char *profile, const char *model)
{
    char p[PATH_MAX + 64], m[PATH_MAX + 64];
    td_gpucost_config_t cfg = {.profile = p, .model = m};
    td_gpucost_t *c = NULL;

    path_of(p, sizeof(p), profile);
    path_of(m, sizeof(m), model);
    CHECK_STATUS(td_gpucost_create(&cfg, &c), TD_OK);
    return c;
}

#define V41 "deploy/models/deepseek-v41-flash.json"
#define V3 "deploy/models/deepseek-v3.json"

/* ---- Loading ------------------------------------------------------------------- */

static void
test_load(void)
{
    static const char *const profiles[] = {
        "deploy/profiles/h800.json", "deploy/profiles/h200.json", "deploy/profiles/b200.json",
        "deploy/profiles/gb200.json",
    };

    for (size_t i = 0; i < sizeof(profiles) / sizeof(profiles[0]); i++) {
        td_gpucost_t *a = load(profiles[i], V41), *b = load(profiles[i], V3);
        td_gpucost_info_t in;

        if (a == NULL || b == NULL) {
            td_gpucost_destroy(a);
            td_gpucost_destroy(b);
            continue;
        }
        CHECK_STATUS(td_gpucost_info(a, &in), TD_OK);
        CHECK_EQ_INT(in.layers, 40);
        CHECK_EQ_INT(in.experts, 384);
        CHECK_EQ_INT(in.topk, 6);
        CHECK(strcmp(in.model_type, "deepseek_v41") == 0);
        CHECK_STATUS(td_gpucost_info(b, &in), TD_OK);
        CHECK_EQ_INT(in.layers, 61);
        CHECK_EQ_INT(in.moe_layers, 58);
        /* V3: 37B active parameters (the published figure), within 3% */
        CHECK(fabs(in.flops_per_token / 2 - 37e9) < 0.03 * 37e9);
        /* its MLA cache: 61 layers x (512 + 64) bf16 */
        CHECK(in.kv_bytes_per_token == 61.0 * 576 * 2);
        td_gpucost_destroy(a);
        td_gpucost_destroy(b);
    }
}

/* ---- KV bytes against the layouts ----------------------------------------------- */

static void
test_kv_bytes(void)
{
    td_gpucost_t *c = load("deploy/profiles/h200.json", V41);
    static const td_engine_kind_t *const kinds[] = {&td_synth_kind, NULL};
    td_engine_config_t ecfg;
    td_engine_t *e = NULL;
    td_modelcfg_t *mc = NULL;
    td_cache_plan_t *plan = NULL;
    td_gpucost_info_t in;
    char m[PATH_MAX + 64];

    if (c == NULL)
        return;
    td_gpucost_info(c, &in);
    /* the synthetic engine's default layout (V4.1-Flash's schedule) */
    CHECK_STATUS(td_engine_config_defaults(&ecfg), TD_OK);
    CHECK_STATUS(td_engine_create(kinds, &ecfg, &e), TD_OK);
    td_engine_config_free(&ecfg);
    if (e != NULL) {
        double want = td_layout_paged_bytes_per_token(e->layout);

        printf("kv: cost model %.1f B/token, synthetic layout %.1f B/token\n",
               in.kv_bytes_per_token, want);
        CHECK(fabs(in.kv_bytes_per_token - want) <= 0.01 * want);
        td_engine_destroy(e);
    }
    /* the model's own cache plan from the same config.json: exact */
    path_of(m, sizeof(m), V41);
    CHECK_STATUS(td_modelcfg_load(m, &mc), TD_OK);
    if (mc != NULL) {
        CHECK_STATUS(td_cache_plan_create(mc, &plan), TD_OK);
        if (plan != NULL) {
            CHECK(in.kv_bytes_per_token == td_layout_paged_bytes_per_token(plan->layout));
            CHECK(in.kv_fixed_bytes == (double)td_layout_fixed_bytes(plan->layout));
            td_cache_plan_destroy(plan);
        }
        td_modelcfg_destroy(mc);
    }
    /* a transfer: fixed state plus 890 B a token over 400 Gb/s x eff_network */
    {
        double per_tok = (td_gpucost_kv_xfer_s(c, 2000) - td_gpucost_kv_xfer_s(c, 1000)) / 1000;

        CHECK(fabs(per_tok - in.kv_bytes_per_token / (50e9 * 0.88)) < 1e-12);
        CHECK(td_gpucost_kv_xfer_s(c, 0) > 0);   /* the fixed state */
    }
    td_gpucost_destroy(c);
}

/* ---- Monotonicity and the roofline -------------------------------------------------- */

static void
test_shape(void)
{
    td_gpucost_t *c = load("deploy/profiles/h200.json", V41);
    td_gpucost_terms_t t, u;
    double prev;

    if (c == NULL)
        return;
    CHECK(td_gpucost_prefill_s(c, 0, 100, 8) == 0);
    CHECK(td_gpucost_decode_step_s(c, 0, 0, 8) == 0);
    /* more tokens, more context, more rows: more time */
    prev = 0;
    for (uint64_t n = 1; n <= 65536; n *= 4) {
        double s = td_gpucost_prefill_s(c, n, 0, 8);

        CHECK(s > prev);
        prev = s;
    }
    prev = 0;
    for (uint64_t ctx = 0; ctx <= 1u << 20; ctx = ctx ? ctx * 8 : 64) {
        double s = td_gpucost_prefill_s(c, 4096, ctx, 8);

        CHECK(s > prev);
        prev = s;
    }
    prev = 0;
    for (uint64_t rows = 1; rows <= 4096; rows *= 2) {
        double s = td_gpucost_decode_step_s(c, rows, rows * 8192, 8);

        CHECK(s > prev);
        prev = s;
    }
    prev = 0;
    for (uint64_t ctx = 16; ctx <= 1u << 20; ctx *= 4) {
        double s = td_gpucost_decode_step_s(c, 64, 64 * ctx, 8);

        CHECK(s > prev);
        prev = s;
    }
    /* more ranks: fewer expert bytes per rank (the same rows per rank) */
    prev = INFINITY;
    for (uint32_t r = 1; r <= 64; r *= 2) {
        CHECK_STATUS(td_gpucost_decode_terms(c, 32, 32 * 4096, r, &t), TD_OK);
        CHECK(t.b_experts < prev);
        CHECK(t.experts_hit <= 384.0 / r + 1e-9);
        prev = t.b_experts;
    }
    /* the roofline: total = max(compute, memory) + all-to-all; one row is
     * memory-bound, and the share of memory falls as the batch grows */
    for (uint64_t rows = 1; rows <= 4096; rows *= 4) {
        CHECK_STATUS(td_gpucost_decode_terms(c, rows, rows * 4096, 8, &t), TD_OK);
        CHECK(t.total_s == fmax(t.compute_s, t.memory_s) + t.alltoall_s);
        CHECK(t.alltoall_s == td_gpucost_alltoall_s(c, rows, 8));
        if (rows == 1)
            CHECK(t.memory_s > 10 * t.compute_s);
        if (rows > 1)
            CHECK(t.memory_s / t.compute_s < u.memory_s / u.compute_s);
        u = t;
    }
    CHECK(u.compute_s > u.memory_s);   /* 4096 rows: compute-bound */
    CHECK_STATUS(td_gpucost_prefill_terms(c, 8192, 0, 8, &t), TD_OK);
    CHECK(t.total_s == fmax(t.compute_s, t.memory_s) + t.alltoall_s);
    CHECK(t.compute_s > t.memory_s);   /* a long chunk is compute-bound */
    /* the all-to-all: none on one rank; grows with tokens */
    CHECK(td_gpucost_alltoall_s(c, 1000, 1) == 0);
    CHECK(td_gpucost_alltoall_s(c, 2000, 8) > td_gpucost_alltoall_s(c, 1000, 8));
    td_gpucost_destroy(c);

    /* beyond the NVLink domain the network carries most of it: slower */
    c = load("deploy/profiles/h800.json", V3);
    if (c != NULL) {
        CHECK(td_gpucost_alltoall_s(c, 1000, 32) > 2 * td_gpucost_alltoall_s(c, 1000, 8));
        td_gpucost_destroy(c);
    }
}

/* ---- Refused inputs ------------------------------------------------------------------ */

/* The h200 profile's text with key removed (key NULL: unchanged), or
 * key.field set to value (a JSON text). Caller frees. */
static char *
profile_variant(const char *key, const char *field, const char *value)
{
    char p[PATH_MAX + 64];
    json_t *root, *v;
    char *s;

    path_of(p, sizeof(p), "deploy/profiles/h200.json");
    root = json_load_file(p, 0, NULL);
    if (root == NULL)
        return NULL;
    if (key != NULL && field == NULL) {
        json_object_del(root, key);
    } else if (key != NULL) {
        v = json_loads(value, JSON_DECODE_ANY, NULL);
        json_object_set_new(json_object_get(root, key), field, v);
    }
    s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static void
test_refused(void)
{
    static const struct {
        const char *key, *field, *value, *says;
    } bad[] = {
        {"eff_hbm", NULL, NULL, "eff_hbm: missing"},
        {"peak_fp8_tflops", NULL, NULL, "peak_fp8_tflops: missing"},
        {"eff_gemm", "value", "1.5", "eff_gemm.value: 1.5 is outside"},
        {"hbm_gbytes_per_s", "value", "-3", "hbm_gbytes_per_s.value"},
        {"hbm_gbytes_per_s", "value", "\"fast\"", "not a number"},
        {"eff_nvlink", "source", "\"\"", "eff_nvlink.source: missing or empty"},
        {"name", NULL, NULL, "name: missing"},
    };
    char m[PATH_MAX + 64];
    td_gpucost_t *c = NULL;

    path_of(m, sizeof(m), V41);
    td_logcap_start();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *text = profile_variant(bad[i].key, bad[i].field, bad[i].value);
        td_gpucost_config_t cfg = {.profile_json = text, .model = m};

        CHECK(text != NULL);
        td_logcap_reset();
        c = NULL;
        CHECK_STATUS(td_gpucost_create(&cfg, &c), TD_ERR_INVALID);
        CHECK(c == NULL);
        if (strstr(td_logcap.last, bad[i].says) == NULL)
            fprintf(stderr, "case %zu: logged \"%s\", want \"%s\"\n", i, td_logcap.last,
                    bad[i].says);
        CHECK(strstr(td_logcap.last, bad[i].says) != NULL);
        free(text);
    }
    {   /* junk, a missing file, a bad model */
        td_gpucost_config_t junk = {.profile_json = "{\"name\": \"x\", peak", .model = m};
        td_gpucost_config_t arr = {.profile_json = "[1, 2]", .model = m};
        td_gpucost_config_t none = {.profile = "/nonexistent/h900.json", .model = m};
        char *ok = profile_variant(NULL, NULL, NULL);
        td_gpucost_config_t llama = {.profile_json = ok, .model_json = "{\"model_type\": \"llama\"}"};
        td_gpucost_config_t v3miss = {.profile_json = ok,
                                      .model_json = "{\"model_type\": \"deepseek_v3\", "
                                                    "\"hidden_size\": 64}"};
        td_gpucost_config_t bits = {.profile_json = ok, .model = m, .expert_bits = 3};

        CHECK_STATUS(td_gpucost_create(&junk, &c), TD_ERR_INVALID);
        CHECK_STATUS(td_gpucost_create(&arr, &c), TD_ERR_INVALID);
        CHECK_STATUS(td_gpucost_create(&none, &c), TD_ERR_NOT_FOUND);
        CHECK(strstr(td_logcap.last, "/nonexistent/h900.json") != NULL);
        CHECK_STATUS(td_gpucost_create(&llama, &c), TD_ERR_UNSUPPORTED);
        CHECK_STATUS(td_gpucost_create(&v3miss, &c), TD_ERR_INVALID);
        CHECK(strstr(td_logcap.last, "num_hidden_layers: missing") != NULL);
        CHECK_STATUS(td_gpucost_create(&bits, &c), TD_ERR_INVALID);
        free(ok);
    }
    td_logcap_stop();
}

/* ---- The synthetic engine sleeps the model's times ------------------------------------ */

/* tools/mk-tiny-model's config (tests/model/tiny_configs.json, "tiny"): its
 * modeled times are microseconds, dilated into milliseconds below. */
static const char tiny_json[] =
    "{\"model_type\": \"deepseek_v41\", \"text_config\": {\"model_type\": \"deepseek_v41_text\","
    " \"vocab_size\": 671, \"hidden_size\": 64, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 4, \"head_dim\": 64, \"q_lora_rank\": 32,"
    " \"sliding_window\": 8, \"compress_ratios\": [0, 2, 2, 2, 1, 1, 1, 1],"
    " \"kv_source_layer_ids\": [1, 4], \"index_source_layer_ids\": [1, 3, 4, 6],"
    " \"candidate_source_layer_id\": 4, \"candidate_topk_blocks\": 2, \"candidate_block_size\": 2,"
    " \"index_n_heads\": 2, \"index_head_dim\": 32, \"index_topk\": 4, \"o_groups\": 2,"
    " \"o_lora_rank\": 32, \"moe_intermediate_size\": 32, \"n_routed_experts\": 8,"
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"hc_mult\": 4}}";

static td_status_t
layer_ok(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *pieces, size_t n,
         void *arg)
{
    (void)req, (void)layer, (void)pieces, (void)n;
    (*(int *)arg)++;
    return TD_OK;
}

static void
test_synth_sleeps(void)
{
    static const td_engine_kind_t *const kinds[] = {&td_synth_kind, NULL};
    char prof[PATH_MAX + 64], model[] = "/tmp/test_gpucost_XXXXXX";
    td_gpucost_config_t gc = {.profile = prof, .model = model};
    td_engine_config_t cfg;
    td_engine_t *e = NULL;
    td_gpucost_t *c = NULL;
    td_sample_params_t sp = td_sample_params_greedy();
    td_engine_req_t *req[4] = {0};
    td_kvmem_t *mem[4] = {0};
    td_engine_row_t rows[4];
    int32_t tok[100];
    double k, pre_ms, dec_ms, best, ms;
    int fd = mkstemp(model);
    uint64_t t0, ctx;
    int calls = 0;

    path_of(prof, sizeof(prof), "deploy/profiles/h200.json");
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(write(fd, tiny_json, strlen(tiny_json)) == (ssize_t)strlen(tiny_json));
    close(fd);
    CHECK_STATUS(td_gpucost_create(&gc, &c), TD_OK);
    if (c == NULL)
        goto out;
    /* a dilation that makes the 100-token prefill 20 ms */
    k = 0.020 / td_gpucost_prefill_s(c, 100, 0, 1);
    pre_ms = 20.0;

    /* a profile without a model is refused */
    CHECK_STATUS(td_engine_config_defaults(&cfg), TD_OK);
    free(cfg.synth.gpu_profile);
    cfg.synth.gpu_profile = strdup(prof);
    td_logcap_start();
    CHECK_STATUS(td_engine_create(kinds, &cfg, &e), TD_ERR_INVALID);
    CHECK(strstr(td_logcap.last, "synth-gpu-model") != NULL);
    td_logcap_stop();
    free(cfg.synth.gpu_model);
    cfg.synth.gpu_model = strdup(model);
    cfg.synth.time_dilation = k;
    free(cfg.synth.layout.kv_sources);
    cfg.synth.layout.kv_sources = strdup("2:2");
    cfg.synth.layout.layers = 6;
    CHECK_STATUS(td_engine_create(kinds, &cfg, &e), TD_OK);
    td_engine_config_free(&cfg);
    if (e == NULL)
        goto out;
    for (size_t i = 0; i < 100; i++)
        tok[i] = (int32_t)(i * 7 % e->vocab);
    best = 1e9;
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(td_kvmem_create(e->layout, 256, (uint64_t)i + 1, &mem[i]), TD_OK);
        CHECK_STATUS(td_engine_req_create(e, &sp, &mem[i]->kv, &req[i]), TD_OK);
        if (req[i] == NULL)
            goto out;
        t0 = td_clock_ns();
        CHECK_STATUS(td_engine_prefill(req[i], tok, 100, 1, layer_ok, &calls), TD_OK);
        ms = (td_clock_ns() - t0) / 1e6;
        CHECK(ms >= pre_ms);
        best = fmin(best, ms);
        rows[i] = (td_engine_row_t){.req = req[i], .token = 1};
    }
    CHECK_EQ_INT(calls, 4 * 6);   /* the layer callbacks still come, one per layer */
    printf("synthetic engine: prefill of 100 tokens, modeled %.2f ms x dilation: %.2f ms "
           "(best of 4)\n", pre_ms, best);
    CHECK(best < pre_ms * 1.9);
    best = 1e9;
    for (int i = 0; i < 4; i++) {
        ctx = 0;
        for (int r = 0; r < 4; r++)
            ctx += req[r]->ntokens;
        dec_ms = td_gpucost_decode_step_s(c, 4, ctx, 1) * k * 1e3;
        t0 = td_clock_ns();
        CHECK_STATUS(td_engine_decode_step(e, rows, 4, NULL, NULL), TD_OK);
        ms = (td_clock_ns() - t0) / 1e6;
        CHECK(ms >= dec_ms);
        best = fmin(best, ms / dec_ms);
        for (int r = 0; r < 4; r++)
            rows[r].token = rows[r].next;
    }
    printf("synthetic engine: decode step of 4 rows: best %.2f x the modeled time\n", best);
    CHECK(best < 1.9);
out:
    for (int i = 0; i < 4; i++) {
        if (req[i] != NULL)
            td_engine_req_destroy(req[i]);
        td_kvmem_destroy(mem[i]);
    }
    if (e != NULL)
        td_engine_destroy(e);
    td_gpucost_destroy(c);
    unlink(model);
}

int
main(void)
{
    char src[PATH_MAX];

    snprintf(src, sizeof(src), "%s", __FILE__);
    snprintf(srcroot, sizeof(srcroot), "%s/../..", dirname(src));
    if (access(srcroot, R_OK) != 0) {
        fprintf(stderr, "SKIP: source tree %s not found\n", srcroot);
        return 77;
    }
    test_load();
    test_kv_bytes();
    test_shape();
    test_refused();
    test_synth_sleeps();
    return td_check_exit("test_gpucost");
}
