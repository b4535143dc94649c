/* tests/model/test_modelcfg.c — model/modelcfg against the reference: every case
 * of modelcfg_cases.json (tests/model/regen) resolves or fails as there; then
 * files, to_json round trips, engine checks, features and engram primes. */
#include "check.h"
#include "log.h"
#include "modelcfg.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/test_modelcfg.XXXXXX";

static td_modelcfg_t *
parse_ok(const char *text)
{
    td_modelcfg_t *cfg = NULL;
    char err[1024] = "";
    td_status_t st = td_modelcfg_parse(text, strlen(text), &cfg, err, sizeof(err));

    if (st != TD_OK)
        fprintf(stderr, "parse failed: %s: %s\n", td_status_str(st), err);
    CHECK_STATUS(st, TD_OK);
    return cfg;
}

/* parse must fail with `want`, and the message must contain `needle`. */
static void
parse_fails(const char *text, td_status_t want, const char *needle)
{
    td_modelcfg_t *cfg = NULL;
    char err[1024] = "";
    td_status_t st = td_modelcfg_parse(text, strlen(text), &cfg, err, sizeof(err));

    CHECK_STATUS(st, want);
    CHECK(cfg == NULL);
    if (strstr(err, needle) == NULL) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", err, needle);
        td_check_failures++;
    }
    if (st == TD_OK)
        td_modelcfg_destroy(cfg);
}

/* ---- The reference's cases ---------------------------------------------------- */

static void
test_fixture(const char *path)
{
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    json_t *fields, *cases, *c;
    size_t i, nok = 0, nerr = 0;

    if (doc == NULL) {
        fprintf(stderr, "%s: %s\n", path, jerr.text);
        td_check_failures++;
        return;
    }
    fields = json_object_get(doc, "fields");
    cases = json_object_get(doc, "cases");
    CHECK(json_array_size(fields) > 60);
    CHECK(json_array_size(cases) > 100);
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        char *in = json_dumps(json_object_get(c, "input"), JSON_COMPACT);
        const json_t *want = json_object_get(c, "resolved");
        const json_t *werr = json_object_get(c, "error");
        td_modelcfg_t *cfg = NULL;
        char err[1024] = "";
        td_status_t st = td_modelcfg_parse(in, strlen(in), &cfg, err, sizeof(err));

        if (werr != NULL) {
            const char *field = json_string_value(json_object_get(werr, "field"));
            nerr++;
            if (st != TD_ERR_INVALID || strstr(err, field) == NULL) {
                fprintf(stderr, "case %s: reference raises %s about %s; got %s: \"%s\"\n", name,
                        json_string_value(json_object_get(werr, "type")), field,
                        td_status_str(st), err);
                td_check_failures++;
            }
        } else if (st != TD_OK) {
            fprintf(stderr, "case %s: reference accepts it; got %s: %s\n", name,
                    td_status_str(st), err);
            td_check_failures++;
        } else {
            char *js = td_modelcfg_to_json(cfg);
            json_t *got = js ? json_loads(js, 0, NULL) : NULL;
            size_t k;
            json_t *f;
            nok++;
            CHECK(got != NULL);
            /* the same keys: the text fields and model_type */
            CHECK_EQ_INT(json_object_size(got), json_array_size(fields) + 1);
            json_array_foreach(fields, k, f) {
                const char *key = json_string_value(f);
                const json_t *a = json_object_get(got, key), *b = json_object_get(want, key);
                if (a == NULL || b == NULL || !json_equal(a, b)) {
                    char *sa = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
                    char *sb = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
                    fprintf(stderr, "case %s: %s: got %.300s, reference %.300s\n", name, key,
                            sa ? sa : "(absent)", sb ? sb : "(absent)");
                    free(sa);
                    free(sb);
                    td_check_failures++;
                }
            }
            CHECK(json_equal(json_object_get(got, "model_type"), json_object_get(want, "model_type")));
            if (json_object_get(c, "vision") != NULL) {
                CHECK(cfg->composite);
                CHECK_EQ_INT(cfg->has_vision, json_is_true(json_object_get(c, "vision")));
                CHECK_EQ_INT(cfg->image_token_id,
                             json_integer_value(json_object_get(c, "image_token_id")));
            } else {
                CHECK(!cfg->composite);
            }
            /* to_json is itself a config that resolves to the same values */
            if (js != NULL) {
                td_modelcfg_t *again = parse_ok(js);
                char *js2 = again ? td_modelcfg_to_json(again) : NULL;
                if (js2 == NULL || strcmp(js, js2) != 0) {
                    fprintf(stderr, "case %s: to_json does not round-trip\n", name);
                    td_check_failures++;
                }
                free(js2);
                td_modelcfg_destroy(again);
            }
            json_decref(got);
            free(js);
            td_modelcfg_destroy(cfg);
        }
        free(in);
    }
    fprintf(stderr, "fixture: %zu resolved, %zu refused\n", nok, nerr);
    json_decref(doc);
}

/* ---- Derived views ------------------------------------------------------------- */

static const char tiny_json[] =
    "{\"model_type\": \"deepseek_v41\", \"text_config\": {"
    "\"vocab_size\": 1000, \"hidden_size\": 64, \"num_hidden_layers\": 8,"
    "\"num_attention_heads\": 4, \"head_dim\": 64, \"q_lora_rank\": 32, \"qk_rope_head_dim\": 16,"
    "\"sliding_window\": 8, \"compress_ratios\": [0, 2, 2, 2, 1, 1, 1, 1],"
    "\"kv_source_layer_ids\": [1, 4], \"index_source_layer_ids\": [1, 3, 4, 6],"
    "\"candidate_source_layer_id\": 4, \"candidate_topk_blocks\": 2, \"candidate_block_size\": 2,"
    "\"index_n_heads\": 2, \"index_head_dim\": 32, \"index_topk\": 4, \"o_groups\": 2,"
    "\"o_lora_rank\": 32, \"moe_intermediate_size\": 32, \"n_routed_experts\": 8,"
    "\"num_experts_per_tok\": 2, \"engram_layer_ids\": [2, 5], \"engram_vocab_size\": 61,"
    "\"engram_num_embeddings\": [272, 348], \"engram_max_ngram_size\": 3, \"engram_n_heads\": 2,"
    "\"engram_head_dim\": 32, \"num_nextn_predict_layers\": 0, \"max_position_embeddings\": 1024,"
    "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": 32, \"beta_slow\": 1,"
    "\"original_max_position_embeddings\": 256}}}";

static void
test_layers(void)
{
    td_modelcfg_t *cfg = parse_ok(tiny_json);
    /* per layer: ratio, kv, index, owns k, candidate src, uses candidates, group, engram */
    static const int want[8][8] = {
        { 0, 0, 0, 0, 0, 0, -1, -1 },
        { 2, 1, 1, 1, 0, 0, 1, -1 },
        { 2, 0, 0, 0, 0, 0, 1, 0 },
        { 2, 0, 1, 0, 0, 0, 1, -1 },
        { 1, 1, 1, 1, 1, 0, 4, -1 },
        { 1, 0, 0, 0, 0, 0, 4, 1 },
        { 1, 0, 1, 0, 0, 1, 4, -1 },
        { 1, 0, 0, 0, 0, 0, 4, -1 },
    };
    char err[512];

    if (cfg == NULL)
        return;
    for (int i = 0; i < 8; i++) {
        const td_modelcfg_layer_t *l = &cfg->layers[i];
        CHECK_EQ_INT(l->ratio, want[i][0]);
        CHECK_EQ_INT(l->kv_source, want[i][1]);
        CHECK_EQ_INT(l->index_source, want[i][2]);
        CHECK_EQ_INT(l->owns_index_k, want[i][3]);
        CHECK_EQ_INT(l->candidate_source, want[i][4]);
        CHECK_EQ_INT(l->uses_candidates, want[i][5]);
        CHECK_EQ_INT(l->group, want[i][6]);
        CHECK_EQ_INT(l->engram, want[i][7]);
    }
    CHECK_STR(cfg->rope_main.rope_type, "default");
    CHECK(cfg->rope_main.has_theta && cfg->rope_main.theta == 10000.0);
    CHECK_STR(cfg->rope_compress.rope_type, "yarn");
    CHECK(cfg->rope_compress.theta == 160000.0 && cfg->rope_compress.factor == 4.0);
    CHECK(cfg->rope_compress.has_attention_factor && cfg->rope_compress.attention_factor == 1.0);
    CHECK(cfg->rope_compress.partial_rotary_factor == 0.25);
    CHECK(!cfg->quantized);
    CHECK_STATUS(td_modelcfg_check(cfg, err, sizeof(err)), TD_OK);
    td_modelcfg_destroy(cfg);
}

/* ---- Engram buckets -------------------------------------------------------------- */

static void
test_engram_primes(void)
{
    /* the released table sizes (reference config docstring): the per-layer
     * sums of the prime bucket sizes drawn above engram_vocab_size */
    const char *flash = "{\"engram_layer_ids\": [1, 14], "
                        "\"engram_num_embeddings\": [384006168, 384016682]}";
    td_modelcfg_t *cfg = parse_ok(flash);
    uint64_t primes[24], total = 0;
    char err[512];

    if (cfg == NULL)
        return;
    CHECK_STATUS(td_modelcfg_engram_primes(cfg, 0, primes, &total), TD_OK);
    CHECK_EQ_INT(total, 384006168);
    CHECK_EQ_INT(primes[0], 16000057);   /* the first prime above 16,000,000 */
    for (int i = 1; i < 24; i++)
        CHECK(primes[i] > primes[i - 1]);
    CHECK_STATUS(td_modelcfg_engram_primes(cfg, 1, primes, &total), TD_OK);
    CHECK_EQ_INT(total, 384016682);
    CHECK_STATUS(td_modelcfg_engram_primes(cfg, 2, primes, &total), TD_ERR_INVALID);
    CHECK_STATUS(td_modelcfg_check(cfg, err, sizeof(err)), TD_OK);
    td_modelcfg_destroy(cfg);

    /* a table smaller than its buckets is refused by the check */
    cfg = parse_ok("{\"engram_layer_ids\": [1, 14], \"engram_num_embeddings\": [384006168, 5]}");
    if (cfg != NULL) {
        CHECK_STATUS(td_modelcfg_check(cfg, err, sizeof(err)), TD_ERR_INVALID);
        CHECK(strstr(err, "engram_num_embeddings[1]: 5 rows") != NULL);
        CHECK(strstr(err, "384016682") != NULL);
        td_modelcfg_destroy(cfg);
    }
    /* tiny: 61 -> primes 61 67 71 73 | 79 83 89 97 */
    cfg = parse_ok(tiny_json);
    if (cfg != NULL) {
        CHECK_STATUS(td_modelcfg_engram_primes(cfg, 0, primes, &total), TD_OK);
        CHECK_EQ_INT(primes[0], 61);
        CHECK_EQ_INT(primes[3], 73);
        CHECK_EQ_INT(total, 61 + 67 + 71 + 73);
        CHECK_STATUS(td_modelcfg_engram_primes(cfg, 1, primes, &total), TD_OK);
        CHECK_EQ_INT(total, 79 + 83 + 89 + 97);
        td_modelcfg_destroy(cfg);
    }
}

/* ---- What the engine refuses ------------------------------------------------------ */

static void
test_check(void)
{
    static const struct {
        const char *json;
        td_status_t want;
        const char *needle;
    } cases[] = {
        { "{\"hidden_size\": -5}", TD_ERR_INVALID, "hidden_size: -5 is not a size" },
        { "{\"vocab_size\": 0}", TD_ERR_INVALID, "vocab_size: 0 is not a size" },
        { "{\"qk_rope_head_dim\": 63, \"rope_parameters\": null}", TD_ERR_INVALID,
          "qk_rope_head_dim: 63 must be even" },
        { "{\"o_groups\": 7}", TD_ERR_INVALID, "o_groups: 7 does not divide" },
        { "{\"num_experts_per_tok\": 400}", TD_ERR_INVALID, "num_experts_per_tok: 400" },
        { "{\"n_shared_experts\": 2}", TD_ERR_UNSUPPORTED, "n_shared_experts: 2" },
        { "{\"hidden_act\": \"gelu\"}", TD_ERR_UNSUPPORTED, "hidden_act: \"gelu\"" },
        { "{\"scoring_func\": \"relu\"}", TD_ERR_UNSUPPORTED, "scoring_func: \"relu\"" },
        { "{\"topk_method\": \"greedy\"}", TD_ERR_UNSUPPORTED, "topk_method: \"greedy\"" },
        { "{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}", TD_ERR_UNSUPPORTED,
          "rope_parameters.compress.rope_type: \"linear\"" },
        { "{\"rope_parameters\": {\"main\": {\"rope_type\": \"dynamic\", \"factor\": 2.0},"
          " \"compress\": {}}}", TD_ERR_UNSUPPORTED, "rope_parameters.main.rope_type: \"dynamic\"" },
        { "{\"rope_parameters\": {\"main\": {}, \"compress\": {}}}", TD_ERR_UNSUPPORTED,
          "partial_rotary_factor: 1 rotates 512 channels" },
        { "{\"rope_parameters\": {\"main\": {\"rope_theta\": \"x\", \"partial_rotary_factor\": 0.125},"
          " \"compress\": {}}}", TD_ERR_INVALID, "rope_parameters.main.rope_theta" },
        { "{\"num_hidden_layers\": 4, \"compress_ratios\": [0, 2, -1, 2]}", TD_ERR_INVALID,
          "compress_ratios[2]: -1" },
        { "{\"engram_layer_ids\": [1, 1], \"engram_num_embeddings\": [384006168, 384016682]}",
          TD_ERR_INVALID, "layer 1 is listed twice" },
        { "{\"engram_layer_ids\": [50], \"engram_num_embeddings\": [384006168]}", TD_ERR_INVALID,
          "engram_layer_ids[0]: 50" },
        { "{\"engram_layer_ids\": [1], \"engram_num_embeddings\": [384006168],"
          " \"engram_head_dim\": 48}", TD_ERR_INVALID, "engram_head_dim: 48" },
        { "{\"engram_layer_ids\": [1], \"engram_num_embeddings\": [384006168],"
          " \"engram_max_ngram_size\": 1}", TD_ERR_INVALID, "engram_max_ngram_size: 1" },
        { "{\"model_type\": \"deepseek_v41\", \"text_config\": {\"hidden_size\": 0}}",
          TD_ERR_INVALID, "text_config.hidden_size: 0" },
        /* the candidate source scores ratio-2 keys (layer 14's), index source 20
         * and those after it ratio-1 keys (layer 20's): forward.c would refuse
         * the mask at the first pass that has both */
        { "{\"candidate_source_layer_id\": 14}", TD_ERR_UNSUPPORTED,
          "candidate_source_layer_id: layer 14's candidate mask covers the indexer keys of "
          "layer 14 (compress_ratios 2), but index source layer 20 scores those of layer 20 "
          "(compress_ratios 1)" },
        /* another group at the same ratio: the widths agree, applied as the
         * reference applies it */
        { "{\"candidate_source_layer_id\": 8, \"index_source_layer_ids\": [2, 8, 14]}",
          TD_OK, "" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        td_modelcfg_t *cfg = parse_ok(cases[i].json);
        char err[512] = "";
        if (cfg == NULL)
            continue;
        CHECK_STATUS(td_modelcfg_check(cfg, err, sizeof(err)), cases[i].want);
        if (strstr(err, cases[i].needle) == NULL) {
            fprintf(stderr, "check of %s: \"%s\" lacks \"%s\"\n", cases[i].json, err,
                    cases[i].needle);
            td_check_failures++;
        }
        td_modelcfg_destroy(cfg);
    }
}

/* ---- Parse errors of our own (beyond the reference) ------------------------------- */

static void
test_parse_errors(void)
{
    parse_fails("", TD_ERR_INVALID, "not valid JSON");
    parse_fails("{\"hidden_size\": 5,}", TD_ERR_INVALID, "not valid JSON: line 1");
    parse_fails("[1, 2]", TD_ERR_INVALID, "expected a JSON object at the top, got a list");
    parse_fails("{\"model_type\": \"deepseek_v4\"}", TD_ERR_UNSUPPORTED,
                "model_type \"deepseek_v4\" is not DeepSeek-V4.1");
    parse_fails("{\"num_local_experts\": \"x\"}", TD_ERR_INVALID,
                "num_local_experts: expected an integer, got a string (\"x\")");
    parse_fails("{\"compress_ratios\": [0, 2, 2.5]}", TD_ERR_INVALID,
                "compress_ratios[2]: expected an integer, got a float (2.5)");
    parse_fails("{\"model_type\": \"deepseek_v41\", \"text_config\": {\"gate_temp\": 1}}",
                TD_ERR_INVALID, "text_config.gate_temp: expected a float, got an integer (1)");
    /* a 30-byte config must not make the loader build schedules of millions
     * of layers (found by tests/fuzz: seconds, and gigabytes further up) */
    parse_fails("{\"num_hidden_layers\": 100000}", TD_ERR_INVALID,
                "num_hidden_layers + num_nextn_predict_layers: 100000 + 3 is too large "
                "(at most 65536 each)");
    parse_fails("{\"num_nextn_predict_layers\": 2000000000}", TD_ERR_INVALID, "is too large");
    parse_fails("{\"num_hidden_layers\": 4, \"index_source_layer_ids\": [9],"
                " \"compress_ratios\": [0, 2, 2, 1]}", TD_ERR_INVALID,
                "index_source_layer_ids: [9]: 9 is out of range [0, 4)");
    /* quantization_config, as transformers' FineGrainedFP8Config reads it */
    parse_fails("{\"quantization_config\": {\"quant_method\": \"gptq\"}}", TD_ERR_UNSUPPORTED,
                "quantization_config.quant_method: \"gptq\" is not supported");
    parse_fails("{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [32]}}",
                TD_ERR_INVALID, "weight_block_size: [32] is not two positive integers");
    parse_fails("{\"quantization_config\": {\"quant_method\": \"fp8\", \"scale_fmt\": \"e4m3\"}}",
                TD_ERR_INVALID, "scale_fmt: \"e4m3\"");
    parse_fails("{\"quantization_config\": {\"quant_method\": \"fp8\", \"expert_dtype\": \"int4\"}}",
                TD_ERR_INVALID, "expert_dtype: \"int4\"");
    parse_fails("{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"int8\"}}",
                TD_ERR_UNSUPPORTED, "quantization_config.fmt: \"int8\" is not supported");
    parse_fails("{\"quantization_config\": {\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}}",
                TD_ERR_UNSUPPORTED, "activation_scheme: \"static\" is not supported");
    parse_fails("{\"quantization_config\": {\"quant_method\": \"fp8\","
                " \"modules_to_not_convert\": [\"head\"]}}", TD_ERR_UNSUPPORTED,
                "modules_to_not_convert");
    parse_fails("{\"quantization_config\": 3}", TD_ERR_INVALID,
                "quantization_config: expected an object, got an integer (3)");
    parse_fails("{\"quantization_config\": {}}", TD_ERR_UNSUPPORTED, "quant_method: (absent)");

    td_modelcfg_t *cfg = parse_ok("{\"model_type\": \"deepseek_v41\", \"text_config\": {},"
                                  " \"quantization_config\": {\"quant_method\": \"fp8\","
                                  " \"weight_block_size\": [32, 16], \"scale_fmt\": \"ue8m0\","
                                  " \"expert_dtype\": \"fp4\"}}");
    if (cfg != NULL) {
        CHECK(cfg->quantized && cfg->quant_scale_ue8m0 && cfg->quant_experts_fp4);
        CHECK_EQ_INT(cfg->quant_block_rows, 32);
        CHECK_EQ_INT(cfg->quant_block_cols, 16);
        td_modelcfg_destroy(cfg);
    }
    cfg = parse_ok("{\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\","
                   " \"activation_scheme\": \"dynamic\"}}");
    if (cfg != NULL) {
        CHECK(cfg->quantized && !cfg->quant_scale_ue8m0 && !cfg->quant_experts_fp4);
        CHECK_EQ_INT(cfg->quant_block_rows, 128);
        td_modelcfg_destroy(cfg);
    }
    /* no message buffer: the message is dropped (parse never logs); still an error */
    td_modelcfg_t *none = NULL;
    CHECK_STATUS(td_modelcfg_parse("{\"hidden_size\": \"x\"}", 19, &none, NULL, 0), TD_ERR_INVALID);
    CHECK(none == NULL);
}

/* ---- Features and loading ----------------------------------------------------------- */

static int info_vision, info_drafting, debug_unknown;

static void
sink(td_log_level_t level, const char *line, void *arg)
{
    (void)arg;
    if (strstr(line, "image inputs are not supported; text only") != NULL && level == TD_LOG_INFO)
        info_vision++;
    if (strstr(line, "DSpark draft layers are present but drafting is not implemented") != NULL)
        info_drafting++;
    if (strstr(line, "unknown fields, ignored: foo_bar, mtp_x") != NULL && level == TD_LOG_DEBUG)
        debug_unknown++;
}

static void
write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

static void
test_load_and_features(void)
{
    char dir[256], file[300], err[512];
    td_modelcfg_t *cfg = NULL;

    snprintf(dir, sizeof(dir), "%s/model", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(file, sizeof(file), "%s/config.json", dir);
    write_text(file, "{\"model_type\": \"deepseek_v41\", \"text_config\": {\"foo_bar\": 1,"
                     " \"mtp_x\": 2}, \"vision_config\": {\"patch_size\": 14}}");

    td_log_set_sink(sink, NULL);
    td_log_set_level(TD_LOG_DEBUG);
    CHECK_STATUS(td_modelcfg_load(dir, &cfg), TD_OK);   /* a directory */
    td_log_set_level(TD_LOG_WARN);
    td_log_set_sink(NULL, NULL);
    CHECK_EQ_INT(info_vision, 1);
    CHECK_EQ_INT(info_drafting, 1);
    CHECK_EQ_INT(debug_unknown, 1);
    if (cfg != NULL) {
        CHECK(cfg->has_vision);
        CHECK_STATUS(td_modelcfg_require(cfg, TD_MODELCFG_FEATURE_IMAGES, err, sizeof(err)),
                     TD_ERR_UNSUPPORTED);
        CHECK(strstr(err, "image inputs are not supported; text only") != NULL);
        CHECK_STATUS(td_modelcfg_require(cfg, TD_MODELCFG_FEATURE_DRAFTING, err, sizeof(err)),
                     TD_ERR_UNSUPPORTED);
        CHECK(strstr(err, "DSpark drafting is not implemented; the 3 draft layers") != NULL);
        td_modelcfg_destroy(cfg);
    }
    cfg = NULL;
    CHECK_STATUS(td_modelcfg_load(file, &cfg), TD_OK);  /* the file itself */
    td_modelcfg_destroy(cfg);

    cfg = parse_ok("{\"num_nextn_predict_layers\": 0, \"compress_ratios\": [0, 0, 2, 2, 2, 2, 2, 2,"
                   " 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,"
                   " 1, 1, 1, 1, 1, 1]}");
    if (cfg != NULL) {
        CHECK_STATUS(td_modelcfg_require(cfg, TD_MODELCFG_FEATURE_DRAFTING, err, sizeof(err)),
                     TD_ERR_UNSUPPORTED);
        CHECK(strstr(err, "no DSpark draft layers") != NULL);
        CHECK_STATUS(td_modelcfg_require(cfg, TD_MODELCFG_FEATURE_IMAGES, err, sizeof(err)),
                     TD_ERR_UNSUPPORTED);
        CHECK(strstr(err, "has no vision_config") != NULL);
        td_modelcfg_destroy(cfg);
    }

    /* files that are not there, not regular, broken */
    cfg = NULL;
    snprintf(file, sizeof(file), "%s/absent.json", tmpdir);
    CHECK_STATUS(td_modelcfg_load(file, &cfg), TD_ERR_NOT_FOUND);
    snprintf(file, sizeof(file), "%s/bad.json", tmpdir);
    write_text(file, "{\"kv_source_layer_ids\": [0]}");
    CHECK_STATUS(td_modelcfg_load(file, &cfg), TD_ERR_INVALID);
    CHECK(cfg == NULL);
    snprintf(file, sizeof(file), "%s/config.json", dir);
    unlink(file);
    CHECK_STATUS(td_modelcfg_load(dir, &cfg), TD_ERR_NOT_FOUND);
    rmdir(dir);
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_modelcfg modelcfg_cases.json\n");
        return 2;
    }
    td_log_set_level(TD_LOG_WARN);
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_fixture(argv[1]);
    test_layers();
    test_engram_primes();
    test_check();
    test_parse_errors();
    test_load_and_features();
    rmdir(tmpdir);
    return td_check_exit("test_modelcfg");
}
