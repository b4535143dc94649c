/* tools/memplan — where a GPU's memory goes when a DeepSeek-V4.1 config is
 * served on a GPU type by a DEP group of N GPUs: the weights every GPU holds
 * (the weight schema, model/weights.h), its share of the routed experts, the
 * engram tables by their placement, the workspace, a reserve, and the KV pool
 * left (the cache plan's layout, model/cacheplan.h), with how many requests
 * of a context it holds, and whether it fits. --checkpoint binds the schema
 * to a real checkpoint and compares its bytes with the plan's.
 * docs/memplan.md. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cacheplan.h"
#include "config.h"
#include "gpucost.h"
#include "layout.h"
#include "kernels.h"
#include "log.h"
#include "model.h"
#include "modelcfg.h"
#include "safetensors.h"
#include "weights.h"

#define GB 1e9
#define GIB (1024.0 * 1024.0 * 1024.0)

static void
usage(FILE *out)
{
    fprintf(out,
            "usage: memplan --model CONFIG --profile FILE [--dep N[,N...]]\n"
            "               [--engram auto|replicate|shard|host] [--context N] [--chunk N]\n"
            "               [--batch N] [--reserve-gib G] [--min-requests N] [--hbm-gb G]\n"
            "               [--checkpoint DIR]\n"
            "       memplan --released [--root DIR]\n"
            "  --model CONFIG   a DeepSeek-V4.1 config.json, or a directory with one\n"
            "  --profile FILE   a GPU profile (deploy/profiles/*.json): its HBM capacity\n"
            "  --dep N,...      GPUs of the DEP group: the routed experts (and sharded engram\n"
            "                   tables) are split among them (default 4,8)\n"
            "  --engram WHERE   engram tables on every GPU, sharded across the group, or in\n"
            "                   host memory; auto: the first of those that fits (default)\n"
            "  --context N      tokens of a request, to count the requests the KV pool holds\n"
            "                   (default 65536)\n"
            "  --chunk N        prefill chunk tokens, for the workspace (default 8192)\n"
            "  --batch N        decode rows per GPU, for the workspace (default 256)\n"
            "  --reserve-gib G  CUDA context, cuBLAS and NCCL buffers, allocator slack (default 4)\n"
            "  --min-requests N requests of --context tokens the pool must hold to fit (default 1)\n"
            "  --hbm-gb G       the GPU memory to plan, GB (1e9), instead of the profile's figure\n"
            "                   (e.g. the total cudaMemGetInfo reports)\n"
            "  --checkpoint DIR also bind the weight schema to this checkpoint and compare bytes\n"
            "  --released       the released V4.1-Flash (deploy/models/deepseek-v41-flash.json) on\n"
            "                   H200, B200 and GB200 at DEP 4 and 8, one table (files under --root)\n");
}

/* ---- Weights ------------------------------------------------------------------------ */

typedef struct {
    double dense;         /* every GPU: the tensors that are not routed experts or tables */
    double embed_head;    /*   of which the embedding and the output head */
    double experts;       /* every routed expert */
    double tables;        /* the engram tables and their scales */
    size_t ntensors;
    int64_t nexperts;
} mp_weights_t;

/* Bytes of an entry as the release stores it: floats at float_bytes (BF16:
 * 2), F32 at 4, fp8 codes 1 byte, fp4 codes half a byte, ue8m0 scales 1
 * byte (F32 when the config's scale_fmt is "float"). */
static double
mp_entry_bytes(const td_weights_entry_t *e, int float_bytes, bool ue8m0)
{
    double n = (double)e->shape[0] * (e->ndim > 1 ? (double)e->shape[1] : 1.0);
    double ns = (double)e->scale_shape[0] * (double)e->scale_shape[1];

    switch (e->format) {
    case TD_WEIGHTS_FLOAT: return n * float_bytes;
    case TD_WEIGHTS_F32: return n * 4;
    case TD_WEIGHTS_FP8_BLOCK: return n + ns * (ue8m0 ? 1 : 4);
    case TD_WEIGHTS_FP4_GROUP: return n / 2 + ns;
    case TD_WEIGHTS_FP8_ROWS: return n + ns;
    }
    return 0;
}

static void
mp_weights(const td_weights_schema_t *s, const td_modelcfg_t *cfg, int float_bytes,
           mp_weights_t *w)
{
    memset(w, 0, sizeof(*w));
    w->ntensors = s->n;
    w->nexperts = cfg->n_routed_experts;
    for (size_t i = 0; i < s->n; i++) {
        const td_weights_entry_t *e = &s->entries[i];
        double b = mp_entry_bytes(e, float_bytes, cfg->quant_scale_ue8m0);

        if (e->expert >= 0)
            w->experts += b;
        else if (strstr(e->name, ".engram.embed.") != NULL)
            w->tables += b;
        else
            w->dense += b;
        if (e->layer < 0 && (strstr(e->name, "embed") != NULL || strstr(e->name, "head") != NULL))
            w->embed_head += b;
    }
}

/* The config's torch_dtype: 4 bytes for float32, else 2 (bfloat16, float16). */
static int
mp_float_bytes(const char *model)
{
    char path[4096];
    struct stat sb;
    json_error_t jerr;
    json_t *root;
    int bytes = 2;

    snprintf(path, sizeof(path), "%s%s", model,
             stat(model, &sb) == 0 && S_ISDIR(sb.st_mode) ? "/config.json" : "");
    if ((root = json_load_file(path, 0, &jerr)) == NULL)
        return bytes;
    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));

    if (dt == NULL)
        dt = json_string_value(json_object_get(root, "dtype"));
    if (dt != NULL && strcmp(dt, "float32") == 0)
        bytes = 4;
    json_decref(root);
    return bytes;
}

/* ---- The plan ----------------------------------------------------------------------- */

enum { ENG_AUTO, ENG_REPLICATE, ENG_SHARD, ENG_HOST };
static const char *const eng_names[] = { "auto", "replicate", "shard", "host" };

typedef struct {
    const char *model, *profile, *checkpoint;
    uint32_t deps[16];
    size_t ndeps;
    int engram;
    uint64_t context, chunk, batch, min_requests;
    double reserve_gib;
    double hbm_gb;        /* > 0: instead of the profile's */
} mp_opts_t;

typedef struct {
    td_modelcfg_t *cfg;
    td_weights_schema_t *schema;
    td_cache_plan_t *plan;
    td_gpucost_t *cost;
    mp_weights_t w;
    double hbm, paged_per_token, fixed_per_request;
    int float_bytes;      /* the config's torch_dtype */
    const char *gpu;
} mp_model_t;

typedef struct {
    uint32_t dep;
    int engram;           /* the placement used (never ENG_AUTO) */
    double dense, experts, tables, host_tables, workspace, reserve, pool;
    double requests, tokens;
    bool fits;
} mp_plan_t;

/* Activations of `rows` tokens in flight on one GPU (docs/memplan.md): the
 * hc_mult residual streams in f32 (two copies), the attention's query and
 * output rows in bf16, the MoE's dispatched rows and gate/up outputs in bf16
 * (rows x top-k), and logits in f32 for logit_rows rows. An estimate. */
static double
mp_activations(const td_modelcfg_t *c, double rows, double logit_rows)
{
    double H = (double)c->hidden_size;
    double resid = rows * (double)c->hc_mult * H * 4 * 2;
    double attn = rows * (double)c->num_attention_heads * (double)c->head_dim * 2 * 2;
    double moe = rows * (double)c->num_experts_per_tok *
                 (H + 2.0 * (double)c->moe_intermediate_size) * 2;

    return resid + attn + moe + logit_rows * (double)c->vocab_size * 4;
}

static void
mp_plan(const mp_model_t *m, const mp_opts_t *o, uint32_t dep, int engram, mp_plan_t *p)
{
    double prefill = mp_activations(m->cfg, (double)o->chunk, 1);
    double decode = mp_activations(m->cfg, (double)o->batch, (double)o->batch);
    double per_req = (double)o->context * m->paged_per_token + m->fixed_per_request;

    memset(p, 0, sizeof(*p));
    p->dep = dep;
    p->engram = engram;
    p->dense = m->w.dense;
    p->experts = m->w.experts / dep;
    p->tables = engram == ENG_REPLICATE ? m->w.tables : engram == ENG_SHARD ? m->w.tables / dep : 0;
    p->host_tables = engram == ENG_HOST ? m->w.tables : 0;
    p->workspace = prefill > decode ? prefill : decode;
    p->reserve = o->reserve_gib * GIB;
    p->pool = m->hbm - p->dense - p->experts - p->tables - p->workspace - p->reserve;
    p->tokens = p->pool > 0 ? p->pool / m->paged_per_token : 0;
    p->requests = p->pool > 0 ? (double)(uint64_t)(p->pool / per_req) : 0;
    p->fits = p->requests >= (double)o->min_requests;
}

/* The plan for dep under o's placement (auto: replicate, shard, host, the
 * first that fits; the last tried when none does). */
static void
mp_plan_auto(const mp_model_t *m, const mp_opts_t *o, uint32_t dep, mp_plan_t *p)
{
    if (o->engram != ENG_AUTO) {
        mp_plan(m, o, dep, o->engram, p);
        return;
    }
    for (int e = ENG_REPLICATE; e <= ENG_HOST; e++) {
        mp_plan(m, o, dep, e, p);
        if (p->fits || m->w.tables == 0)
            return;
    }
}

static void
mp_model_destroy(mp_model_t *m)
{
    td_gpucost_destroy(m->cost);
    td_cache_plan_destroy(m->plan);
    td_weights_schema_destroy(m->schema);
    td_modelcfg_destroy(m->cfg);
}

/* Loads the config, its weight schema and cache plan, and the profile. */
static int
mp_model_load(const char *model, const char *profile, mp_model_t *m)
{
    td_gpucost_info_t in;
    td_gpucost_config_t gc = { .profile = profile, .model = model };

    memset(m, 0, sizeof(*m));
    if (td_modelcfg_load(model, &m->cfg) != TD_OK)
        return -1;   /* logged */
    if (td_weights_schema_create(m->cfg, &m->schema) != TD_OK ||
        td_cache_plan_create(m->cfg, &m->plan) != TD_OK ||
        td_gpucost_create(&gc, &m->cost) != TD_OK || td_gpucost_info(m->cost, &in) != TD_OK) {
        mp_model_destroy(m);
        return -1;
    }
    m->float_bytes = mp_float_bytes(model);
    mp_weights(m->schema, m->cfg, m->float_bytes, &m->w);
    m->hbm = in.hbm_bytes;
    m->gpu = in.profile_name;
    m->paged_per_token = td_layout_paged_bytes_per_token(m->plan->layout);
    m->fixed_per_request = (double)td_layout_fixed_bytes(m->plan->layout);
    return 0;
}

/* ---- Output ------------------------------------------------------------------------- */

static void
mp_print_plan(const mp_model_t *m, const mp_opts_t *o, const mp_plan_t *p)
{
    const char *where = p->engram == ENG_REPLICATE ? "on every GPU"
                        : p->engram == ENG_SHARD   ? "sharded across the group"
                                                   : "in host memory";

    printf("\n%s, DEP %u, engram tables %s%s\n", m->gpu, p->dep, where,
           o->engram == ENG_AUTO ? " (auto)" : "");
    printf("  %-48s %9s\n", "per GPU", "GB");
    printf("  %-48s %9.2f\n", "HBM", m->hbm / GB);
    printf("  %-48s %9.2f\n", "dense weights (every GPU)", p->dense / GB);
    char what[96];
    snprintf(what, sizeof(what), "routed experts (%" PRId64 " of %" PRId64 ")",
             m->w.nexperts / p->dep, m->w.nexperts);
    printf("  %-48s %9.2f\n", what, p->experts / GB);
    if (m->w.tables > 0) {
        snprintf(what, sizeof(what), "engram tables (%s)",
                 p->engram == ENG_REPLICATE ? "whole" : p->engram == ENG_SHARD ? "a shard" : "none");
        printf("  %-48s %9.2f\n", what, p->tables / GB);
    }
    snprintf(what, sizeof(what), "workspace (%" PRIu64 "-token chunk, %" PRIu64 " rows)", o->chunk,
             o->batch);
    printf("  %-48s %9.2f\n", what, p->workspace / GB);
    /* what the cpu engine's passes take for the same shapes: the function
     * its passes size their one block with (model.h) */
    double cpu_pf = (double)td_forward_workspace_bytes(m->cfg, m->plan, 1, o->chunk, o->context);
    double cpu_dc = (double)td_forward_workspace_bytes(m->cfg, m->plan, o->batch, 1, o->context);
    printf("    cpu engine's pass workspace (td_forward_workspace_bytes, %u threads): prefill "
           "%.3f, decode %.3f\n", td_kernels_cpu_threads(), cpu_pf / GB, cpu_dc / GB);
    snprintf(what, sizeof(what), "reserve (CUDA, cuBLAS, NCCL, slack: %.1f GiB)", o->reserve_gib);
    printf("  %-48s %9.2f\n", what, p->reserve / GB);
    printf("  %-48s %9.2f\n", "KV pool (the rest)", p->pool / GB);
    if (p->pool > 0)
        printf("    %.1f M tokens at %.1f B a token paged; %.2f MB fixed a request:\n"
               "    %.0f requests of %" PRIu64 " tokens\n", p->tokens / 1e6, m->paged_per_token,
               m->fixed_per_request / 1e6, p->requests, o->context);
    if (p->host_tables > 0)
        printf("  host memory: engram tables %.2f GB per node that serves them\n",
               p->host_tables / GB);
    printf("  fits: %s\n", p->fits ? "yes" : "NO: the KV pool holds fewer requests than --min-requests");
}

static void
mp_print_weights(const mp_model_t *m, const char *model)
{
    const td_modelcfg_t *c = m->cfg;

    printf("model %s: %" PRId64 " layers, hidden %" PRId64 ", %" PRId64 " heads x %" PRId64
           ", %" PRId64 " routed experts of %" PRId64 " (top %" PRId64 "), %s weights%s\n",
           model, c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->head_dim,
           c->n_routed_experts, c->moe_intermediate_size, c->num_experts_per_tok,
           !c->quantized ? "float" : c->quant_experts_fp4 ? "fp8 dense + fp4 experts" : "fp8",
           m->float_bytes == 4 ? " (floats f32)" : "");
    printf("weights: %zu tensors, %.2f GB: dense %.2f GB (embedding and head %.2f), routed "
           "experts %.2f GB, engram tables %.2f GB (%.0f bytes in all)\n",
           m->w.ntensors, (m->w.dense + m->w.experts + m->w.tables) / GB, m->w.dense / GB,
           m->w.embed_head / GB, m->w.experts / GB, m->w.tables / GB,
           m->w.dense + m->w.experts + m->w.tables);
    if (c->num_nextn_predict_layers > 0)
        printf("not planned: the %" PRId64 " draft (MTP) layers, which nothing here runs\n",
               c->num_nextn_predict_layers);
    printf("KV: %.1f bytes a token paged (compressed KV and indexer keys), %.0f bytes fixed a "
           "request (windows, partial groups, engram look-back, counters)\n",
           m->paged_per_token, m->fixed_per_request);
}

/* Binds the schema to the checkpoint at dir and compares its bytes with the
 * plan's: 0 when equal. */
static int
mp_check_checkpoint(const mp_model_t *m, const char *dir)
{
    td_weights_t *w = NULL;
    td_st_t *st = NULL;
    double planned = m->w.dense + m->w.experts + m->w.tables;
    int rc = -1;

    if (td_st_open(dir, &st) != TD_OK)
        return -1;   /* logged */
    if (td_weights_bind(m->schema, st, NULL, NULL, &w) == TD_OK) {
        printf("checkpoint %s: %" PRIu64 " bytes bound, %.0f planned: %s\n", dir, w->bytes,
               planned, (double)w->bytes == planned ? "equal" : "DIFFERENT");
        rc = (double)w->bytes == planned ? 0 : -1;
    }
    td_weights_destroy(w);
    td_st_close(st);
    return rc;
}

/* ---- --released ------------------------------------------------------------------ */

static int
run_released(const char *root, mp_opts_t *o)
{
    static const char *const profiles[] = { "h200", "b200", "gb200" };
    char model[4096];
    int rc = 0;

    snprintf(model, sizeof(model), "%s/deploy/models/deepseek-v41-flash.json", root);
    printf("# the released DeepSeek-V4.1-Flash, per GPU (GB); %" PRIu64 "-token requests; "
           "workspace: %" PRIu64 "-token chunk or %" PRIu64 " decode rows; reserve %.1f GiB\n\n",
           o->context, o->chunk, o->batch, o->reserve_gib);
    printf("| GPU | DEP | engram tables | dense | experts | engram | workspace | reserve | "
           "KV pool | requests | fits |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof(profiles) / sizeof(profiles[0]); i++) {
        char profile[4096];
        mp_model_t m;

        snprintf(profile, sizeof(profile), "%s/deploy/profiles/%s.json", root, profiles[i]);
        if (mp_model_load(model, profile, &m) != 0)
            return 1;
        if (o->hbm_gb > 0)
            m.hbm = o->hbm_gb * GB;
        for (size_t d = 0; d < o->ndeps; d++)
            for (int e = ENG_REPLICATE; e <= ENG_HOST; e++) {
                mp_plan_t p;

                if (o->engram != ENG_AUTO && e != o->engram)
                    continue;
                mp_plan(&m, o, o->deps[d], e, &p);
                printf("| %s | %u | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %s |\n",
                       m.gpu, p.dep, eng_names[e], p.dense / GB, p.experts / GB, p.tables / GB,
                       p.workspace / GB, p.reserve / GB, p.pool / GB, p.requests,
                       p.fits ? "yes" : "no");
            }
        mp_model_destroy(&m);
    }
    return rc;
}

/* ---- Main --------------------------------------------------------------------------- */

static int
parse_deps(const char *s, mp_opts_t *o)
{
    char *copy = strdup(s), *save = NULL;

    o->ndeps = 0;
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        uint64_t v;

        if (o->ndeps == 16 || td_config_parse_uint("--dep", t, 1, 4096, &v, NULL, 0) != TD_OK) {
            free(copy);
            return -1;
        }
        o->deps[o->ndeps++] = (uint32_t)v;
    }
    free(copy);
    return o->ndeps > 0 ? 0 : -1;
}

int
main(int argc, char **argv)
{
    mp_opts_t o = { .deps = { 4, 8 }, .ndeps = 2, .engram = ENG_AUTO, .context = 65536,
                    .chunk = 8192, .batch = 256, .min_requests = 1, .reserve_gib = 4 };
    static const struct option longopts[] = {
        { "model", required_argument, NULL, 'm' },      { "profile", required_argument, NULL, 'p' },
        { "dep", required_argument, NULL, 'd' },        { "engram", required_argument, NULL, 'e' },
        { "context", required_argument, NULL, 'c' },    { "chunk", required_argument, NULL, 'k' },
        { "batch", required_argument, NULL, 'b' },      { "reserve-gib", required_argument, NULL, 'r' },
        { "min-requests", required_argument, NULL, 'n' },
        { "checkpoint", required_argument, NULL, 'C' }, { "released", no_argument, NULL, 'R' },
        { "root", required_argument, NULL, 'o' },       { "help", no_argument, NULL, 'h' },
        { "hbm-gb", required_argument, NULL, 'g' },
        { NULL, 0, NULL, 0 },
    };
    const char *root = ".";
    bool released = false;
    int c, rc = 0;

    td_log_set_level(TD_LOG_WARN);
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end = NULL;

        switch (c) {
        case 'm': o.model = optarg; break;
        case 'p': o.profile = optarg; break;
        case 'C': o.checkpoint = optarg; break;
        case 'o': root = optarg; break;
        case 'R': released = true; break;
        case 'd':
            if (parse_deps(optarg, &o) != 0) {
                fprintf(stderr, "memplan: --dep %s: GPU counts 1..4096, comma-separated\n", optarg);
                return 2;
            }
            break;
        case 'e':
            o.engram = -1;
            for (int i = 0; i < 4; i++)
                if (strcmp(optarg, eng_names[i]) == 0)
                    o.engram = i;
            if (o.engram < 0) {
                fprintf(stderr, "memplan: --engram %s: auto, replicate, shard or host\n", optarg);
                return 2;
            }
            break;
        case 'c':
        case 'k':
        case 'b':
        case 'n': {
            uint64_t v;
            const char *name = c == 'c' ? "--context" : c == 'k' ? "--chunk" : c == 'b' ? "--batch"
                                                                                : "--min-requests";

            if (td_config_parse_uint(name, optarg, 1, 1ull << 40, &v, NULL, 0) != TD_OK) {
                fprintf(stderr, "memplan: %s %s: a whole number of at least 1\n", name, optarg);
                return 2;
            }
            *(c == 'c' ? &o.context : c == 'k' ? &o.chunk : c == 'b' ? &o.batch : &o.min_requests) = v;
            break;
        }
        case 'r':
            o.reserve_gib = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || o.reserve_gib < 0 || o.reserve_gib > 1024) {
                fprintf(stderr, "memplan: --reserve-gib %s: GiB, 0..1024\n", optarg);
                return 2;
            }
            break;
        case 'g':
            o.hbm_gb = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(o.hbm_gb >= 1 && o.hbm_gb <= 1e6)) {
                fprintf(stderr, "memplan: --hbm-gb %s: GB, 1..1000000\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || (!released && (o.model == NULL || o.profile == NULL))) {
        usage(stderr);
        return 2;
    }
    if (released)
        return run_released(root, &o);

    mp_model_t m;
    if (mp_model_load(o.model, o.profile, &m) != 0)
        return 1;
    if (o.hbm_gb > 0)
        m.hbm = o.hbm_gb * GB;
    mp_print_weights(&m, o.model);
    if (o.checkpoint != NULL && mp_check_checkpoint(&m, o.checkpoint) != 0)
        rc = 1;
    for (size_t d = 0; d < o.ndeps; d++) {
        mp_plan_t p;

        mp_plan_auto(&m, &o, o.deps[d], &p);
        mp_print_plan(&m, &o, &p);
        if (!p.fits)
            rc = rc ? rc : 3;
    }
    mp_model_destroy(&m);
    return rc;
}
