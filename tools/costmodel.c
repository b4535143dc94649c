/* tools/costmodel — the GPU cost model (sim/gpucost.h) from the command
 * line: per-term tables of a prefill chunk and a decode step for a model and
 * a GPU profile, and --check, the model against published per-GPU figures
 * of DeepSeek-V3 deployments (docs/costmodel.md). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gpucost.h"

static void
usage(FILE *out)
{
    fprintf(out,
            "usage: costmodel --profile FILE --model CONFIG [--ranks N] [--chunk N] [--context N]\n"
            "                 [--batch N] [--dense-bits B] [--expert-bits B] [--kv-bits B]\n"
            "                 [--attn-bits B]\n"
            "       costmodel --check [--root DIR]\n"
            "  --profile FILE   a GPU profile (deploy/profiles/*.json)\n"
            "  --model CONFIG   a config.json (deploy/models/*.json), or a directory with one\n"
            "  --ranks N        GPUs of the DEP group / decode domain (default 8)\n"
            "  --chunk N        prefill chunk tokens (default 4096)\n"
            "  --context N      tokens before the chunk; a decode row's context (default 4096)\n"
            "  --batch N        decode rows per GPU (default 128)\n"
            "  --*-bits B       precision overrides: 16, 8 or 4 (default: the model's)\n"
            "  --check          the published-figure comparison (files under --root, default .)\n");
}

/* ---- --check ---------------------------------------------------------------------- */

typedef struct {
    const char *what;
    const char *profile, *model;
    uint32_t expert_bits, kv_bits, attn_bits;
    uint32_t prefill_ranks, decode_ranks;
    uint64_t prompt;           /* tokens per request */
    double hit;                /* share of the prompt found in the prefix cache */
    uint64_t decode_context;   /* mean context of a decode row */
    double pub_prefill, pub_decode;   /* published tok/s/GPU */
    const char *source;
} check_t;

static const check_t checks[] = {
    {"DeepSeek-V3 on H800 (DeepSeek's service)", "deploy/profiles/h800.json",
     "deploy/models/deepseek-v3.json", 0, 0, 0, 32, 144, 4096, 0.563, 4989, 73.7e3 / 8,
     14.8e3 / 8,
     "DeepSeek, 'Day 6: DeepSeek-V3/R1 Inference System Overview' (2025-03-01): per H800 node "
     "73.7k input tok/s in prefill incl. cache hits (56.3% hit rate), 14.8k output tok/s in "
     "decode; prefill EP32 (4 nodes), decode EP144 (18 nodes); mean KV length per output "
     "token 4,989"},
    {"DeepSeek-V3 on GB200 NVL72 (SGLang, FP8 attention, NVFP4 MoE)", "deploy/profiles/gb200.json",
     "deploy/models/deepseek-v3.json", 4, 8, 8, 8, 48, 2000, 0, 2000, 26156, 13386,
     "LMSYS blog 'Deploying DeepSeek on GB200 NVL72 with PD and Large Scale EP (Part II)' "
     "(2025-09-25): 26,156 input and 13,386 output tok/s/GPU for 2,000-token inputs; "
     "prefill groups of 2 trays (8 GPUs), decode groups of 12 trays (48 GPUs)"},
};

/* Decode rows one GPU holds: HBM less the weights on the rank, over a
 * row's KV at the context. */
static double
check_rows(const td_gpucost_t *c, uint32_t ranks, uint64_t ctx)
{
    td_gpucost_info_t in;
    double free_b;

    td_gpucost_info(c, &in);
    free_b = in.hbm_bytes - in.dense_weight_bytes - in.expert_weight_bytes / ranks;
    return floor(free_b / (ctx * in.kv_bytes_per_token + in.kv_fixed_bytes));
}

static int
run_check(const char *root)
{
    int rc = 0;

    printf("# published per-GPU figures vs the cost model (efficiencies fixed beforehand, not fitted)\n\n");
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        const check_t *k = &checks[i];
        char prof[4096], model[4096];
        td_gpucost_config_t cfg = {.profile = prof, .model = model, .expert_bits = k->expert_bits,
                                   .kv_bits = k->kv_bits, .attn_bits = k->attn_bits};
        td_gpucost_t *c;
        td_gpucost_terms_t pt, dt;
        uint64_t cached = (uint64_t)llround(k->prompt * k->hit), fresh = k->prompt - cached;
        double rows, pre, dec, dec_ovl;

        snprintf(prof, sizeof(prof), "%s/%s", root, k->profile);
        snprintf(model, sizeof(model), "%s/%s", root, k->model);
        if (td_gpucost_create(&cfg, &c) != TD_OK) {
            rc = 1;
            continue;
        }
        td_gpucost_prefill_terms(c, fresh, cached, k->prefill_ranks, &pt);
        rows = check_rows(c, k->decode_ranks, k->decode_context);
        td_gpucost_decode_terms(c, (uint64_t)rows, (uint64_t)rows * k->decode_context,
                                k->decode_ranks, &dt);
        pre = k->prompt / pt.total_s;   /* input tokens, cache hits included */
        dec = rows / dt.total_s;
        dec_ovl = rows / fmax(dt.compute_s, dt.memory_s);
        printf("## %s\n", k->what);
        printf("source: %s\n", k->source);
        printf("assumed: prompt %llu tokens, %.1f%% cached (%llu new after %llu); prefill DEP%u; "
               "decode DEP%u, %.0f rows/GPU (HBM less the rank's weights over a row's KV at "
               "%llu tokens), one token per step (no MTP)\n",
               (unsigned long long)k->prompt, 100 * k->hit, (unsigned long long)fresh,
               (unsigned long long)cached, k->prefill_ranks, k->decode_ranks, rows,
               (unsigned long long)k->decode_context);
        printf("| phase | predicted tok/s/GPU | published | ratio | predicted, all-to-all hidden | ratio |\n");
        printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
        printf("| prefill (input, incl. cache hits) | %.0f | %.0f | %.2f | %.0f | %.2f |\n", pre,
               k->pub_prefill, pre / k->pub_prefill,
               k->prompt / fmax(pt.compute_s, pt.memory_s),
               k->prompt / fmax(pt.compute_s, pt.memory_s) / k->pub_prefill);
        printf("| decode (output) | %.0f | %.0f | %.2f | %.0f | %.2f |\n\n", dec, k->pub_decode,
               dec / k->pub_decode, dec_ovl, dec_ovl / k->pub_decode);
        td_gpucost_terms_print(&pt, "prefill: one request's new tokens on one GPU", stdout);
        td_gpucost_terms_print(&dt, "decode: one step on one GPU", stdout);
        printf("decode rows/GPU sweep (tok/s/GPU, serial all-to-all):");
        for (uint64_t b = 32; b <= 2048; b *= 2)
            printf(" %llu: %.0f", (unsigned long long)b,
                   b / td_gpucost_decode_step_s(c, b, b * k->decode_context, k->decode_ranks));
        printf("\n\n");
        td_gpucost_destroy(c);
    }
    return rc;
}

/* ---- Tables ---------------------------------------------------------------------- */

int
main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"profile", required_argument, NULL, 'p'}, {"model", required_argument, NULL, 'm'},
        {"ranks", required_argument, NULL, 'r'},   {"chunk", required_argument, NULL, 'n'},
        {"context", required_argument, NULL, 'x'}, {"batch", required_argument, NULL, 'b'},
        {"dense-bits", required_argument, NULL, 'D'}, {"expert-bits", required_argument, NULL, 'E'},
        {"kv-bits", required_argument, NULL, 'K'}, {"attn-bits", required_argument, NULL, 'A'},
        {"check", no_argument, NULL, 'c'},         {"root", required_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    td_gpucost_config_t cfg = {0};
    uint64_t ranks = 8, chunk = 4096, ctx = 4096, batch = 128, v;
    const char *root = ".";
    char err[TD_CONFIG_ERRLEN];
    td_gpucost_t *c;
    td_gpucost_terms_t t;
    td_gpucost_info_t in;
    int opt, check = 0;
    char title[256];

    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'p': cfg.profile = optarg; break;
        case 'm': cfg.model = optarg; break;
        case 'c': check = 1; break;
        case 'R': root = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'r': case 'n': case 'x': case 'b': case 'D': case 'E': case 'K': case 'A':
            if (td_config_parse_uint("value", optarg, 0, 0, &v, err, sizeof(err)) != TD_OK ||
                (opt == 'r' && (v == 0 || v > 1u << 20))) {
                fprintf(stderr, "costmodel: bad value \"%s\"\n", optarg);
                return 2;
            }
            if (opt == 'r') ranks = v;
            if (opt == 'n') chunk = v;
            if (opt == 'x') ctx = v;
            if (opt == 'b') batch = v;
            if (opt == 'D') cfg.dense_bits = (uint32_t)v;
            if (opt == 'E') cfg.expert_bits = (uint32_t)v;
            if (opt == 'K') cfg.kv_bits = (uint32_t)v;
            if (opt == 'A') cfg.attn_bits = (uint32_t)v;
            break;
        default: usage(stderr); return 2;
        }
    }
    if (check)
        return run_check(root);
    if (cfg.profile == NULL || cfg.model == NULL) {
        usage(stderr);
        return 2;
    }
    if (td_gpucost_create(&cfg, &c) != TD_OK)
        return 1;
    td_gpucost_describe(c, stdout);
    td_gpucost_info(c, &in);
    printf("\n");
    td_gpucost_prefill_terms(c, chunk, ctx, (uint32_t)ranks, &t);
    snprintf(title, sizeof(title), "prefill: %llu new tokens after %llu, DEP%llu (%.0f tok/s/GPU)",
             (unsigned long long)chunk, (unsigned long long)ctx, (unsigned long long)ranks,
             chunk / t.total_s);
    td_gpucost_terms_print(&t, title, stdout);
    td_gpucost_decode_terms(c, batch, batch * ctx, (uint32_t)ranks, &t);
    snprintf(title, sizeof(title),
             "decode step: %llu rows at %llu tokens, domain of %llu (%.0f tok/s/GPU)",
             (unsigned long long)batch, (unsigned long long)ctx, (unsigned long long)ranks,
             batch / t.total_s);
    td_gpucost_terms_print(&t, title, stdout);
    printf("all-to-all of %llu tokens over %llu ranks: %.3f ms\n", (unsigned long long)batch,
           (unsigned long long)ranks, 1e3 * td_gpucost_alltoall_s(c, batch, (uint32_t)ranks));
    printf("KV transfer of a %llu-token request: %.3f ms (%.0f B)\n", (unsigned long long)ctx,
           1e3 * td_gpucost_kv_xfer_s(c, ctx), ctx * in.kv_bytes_per_token + in.kv_fixed_bytes);
    td_gpucost_destroy(c);
    return 0;
}
