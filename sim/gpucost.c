/* sim/gpucost.c — the GPU cost model of gpucost.h: FLOPs and bytes per
 * layer from a DeepSeek-V4.1 or V3 config.json, times from a GPU profile.
 * The formulas, term by term, are in docs/costmodel.md. */
#include "gpucost.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

/* ---- The profile ------------------------------------------------------------------ */

/* Every number of a profile: {"value": x, "source": "..."}. */
enum {
    PF_BF16, PF_FP8, PF_FP4, PF_HBM_BW, PF_HBM_GB, PF_NVL_BW, PF_NVL_DOMAIN, PF_NET_GBIT,
    PF_EFF_GEMM, PF_EFF_ATTN, PF_EFF_HBM, PF_EFF_NVL, PF_EFF_NET, PF_A2A_DISPATCH,
    PF_A2A_COMBINE, PF_COUNT
};

static const struct {
    const char *key;
    double min, max;      /* inclusive */
    const char *unit;
} pf_fields[PF_COUNT] = {
    [PF_BF16]         = {"peak_bf16_tflops", 1e-3, 1e6, "TFLOP/s dense"},
    [PF_FP8]          = {"peak_fp8_tflops", 1e-3, 1e6, "TFLOP/s dense"},
    [PF_FP4]          = {"peak_fp4_tflops", 0, 1e6, "TFLOP/s dense (0: none, fp4 runs at fp8)"},
    [PF_HBM_BW]       = {"hbm_gbytes_per_s", 1e-3, 1e6, "GB/s"},
    [PF_HBM_GB]       = {"hbm_gbytes", 1e-3, 1e6, "GB"},
    [PF_NVL_BW]       = {"nvlink_gbytes_per_s", 1e-3, 1e6, "GB/s per GPU, one direction"},
    [PF_NVL_DOMAIN]   = {"nvlink_domain_gpus", 1, 1e6, "GPUs"},
    [PF_NET_GBIT]     = {"network_gbits_per_s", 1e-3, 1e6, "Gb/s per GPU"},
    [PF_EFF_GEMM]     = {"eff_gemm", 1e-3, 1, "of peak"},
    [PF_EFF_ATTN]     = {"eff_attention", 1e-3, 1, "of peak"},
    [PF_EFF_HBM]      = {"eff_hbm", 1e-3, 1, "of peak"},
    [PF_EFF_NVL]      = {"eff_nvlink", 1e-3, 1, "of peak"},
    [PF_EFF_NET]      = {"eff_network", 1e-3, 1, "of peak"},
    [PF_A2A_DISPATCH] = {"alltoall_dispatch_bytes", 0.1, 8, "bytes per element"},
    [PF_A2A_COMBINE]  = {"alltoall_combine_bytes", 0.1, 8, "bytes per element"},
};

#define PF_NET_DEFAULT 400.0   /* Gb/s: one 400 Gb/s NIC per GPU, when the profile has none */

/* ---- The model -------------------------------------------------------------------- */

/* FLOPs of a term by the precision its weights run at: [CL_DENSE] the
 * dense linears' bits (fp8 in both checkpoints), [CL_BF16] bf16/f32 ones. */
enum { CL_DENSE, CL_BF16, CL_COUNT };

typedef struct {
    uint32_t ratio;        /* V4.1: compress ratio, 0 window only */
    int index_source;      /* V4.1: scores compressed keys */
    int scan_limited;      /* V4.1: an index source after the candidate source */
    int moe;               /* routed experts (else a dense FFN, V3's first layers) */
} gc_layer_t;

struct td_gpucost {
    json_t *profile;               /* owned: the sources, for describe */
    char *profile_name;
    double pf[PF_COUNT];
    int v3;
    char *model_type;

    /* shapes */
    uint32_t layers, hidden, vocab, heads;
    gc_layer_t *layer;             /* [layers] */
    uint32_t moe_layers, experts, topk;
    double expert_params;          /* 3 x hidden x moe_intermediate */

    /* V4.1 attention */
    uint32_t head_dim, window, index_topk, index_heads, index_head_dim;
    uint64_t candidate_keys;       /* candidate_topk_blocks x candidate_block_size */
    double kv_entry, index_entry, window_entry;   /* bytes per paged/window entry */
    /* V3 attention */
    uint32_t kv_lora, qk_nope, qk_rope, v_head;

    /* per token, every layer summed: FLOPs of the non-expert linears */
    double proj_fl[CL_COUNT];      /* attention projections, compressor, indexer projections */
    double shared_fl[CL_COUNT];    /* shared experts, dense FFNs, the router */
    double engram_fl[CL_COUNT];    /* engram wkv (dense), q/k (bf16) */
    double hc_fl;                  /* mHC projections (f32 weights, at the bf16 rate) */
    double dense_weight_bytes;     /* non-expert weights, head included */
    double head_flops;             /* per logits row */
    double engram_gather_bytes;    /* per token */
    double kv_bytes_per_token, kv_fixed_bytes;
    uint32_t dense_bits, expert_bits, kv_bits, attn_bits;
};

/* Bytes a parameter takes at a bit width: fp4 with its one-byte scale per
 * 32 (ue8m0), fp8 with 32x32 block scales (negligible), bf16, f32. */
static double
gc_param_bytes(uint32_t bits)
{
    return bits == 4 ? 0.5 + 1.0 / 32 : bits / 8.0;
}

/* ---- Reading JSON ------------------------------------------------------------------- */

static td_status_t
gc_load_text(const char *path, const char *text, const char *what, json_t **out)
{
    json_error_t jerr;
    json_t *root;

    if (text != NULL) {
        root = json_loads(text, 0, &jerr);
    } else {
        struct stat sb;
        char buf[4096];

        if (path == NULL || path[0] == '\0') {
            td_error("gpucost: no %s given", what);
            return TD_ERR_INVALID;
        }
        if (stat(path, &sb) != 0) {
            td_error("gpucost: %s %s: %s", what, path, strerror(errno));
            return errno == ENOENT ? TD_ERR_NOT_FOUND : TD_ERR_IO;
        }
        if (S_ISDIR(sb.st_mode)) {
            snprintf(buf, sizeof(buf), "%s/config.json", path);
            path = buf;
        }
        root = json_load_file(path, 0, &jerr);
    }
    if (root == NULL) {
        td_error("gpucost: %s %s: line %d: %s", what, path ? path : "(text)", jerr.line,
                 jerr.text);
        return TD_ERR_INVALID;
    }
    if (!json_is_object(root)) {
        td_error("gpucost: %s %s: not a JSON object", what, path ? path : "(text)");
        json_decref(root);
        return TD_ERR_INVALID;
    }
    *out = root;
    return TD_OK;
}

static td_status_t
gc_read_profile(td_gpucost_t *c, const char *where)
{
    json_t *name = json_object_get(c->profile, "name");

    if (!json_is_string(name) || json_string_length(name) == 0) {
        td_error("gpucost: profile %s: name: missing or not a string", where);
        return TD_ERR_INVALID;
    }
    c->profile_name = strdup(json_string_value(name));
    if (c->profile_name == NULL)
        return TD_ERR_NOMEM;
    for (int i = 0; i < PF_COUNT; i++) {
        json_t *f = json_object_get(c->profile, pf_fields[i].key), *v, *src;

        if (f == NULL && i == PF_NET_GBIT) {
            c->pf[i] = PF_NET_DEFAULT;
            continue;
        }
        if (!json_is_object(f)) {
            td_error("gpucost: profile %s: %s: %s", where, pf_fields[i].key,
                     f == NULL ? "missing" : "expected {\"value\": number, \"source\": text}");
            return TD_ERR_INVALID;
        }
        v = json_object_get(f, "value");
        src = json_object_get(f, "source");
        if (!json_is_number(v)) {
            td_error("gpucost: profile %s: %s.value: missing or not a number", where,
                     pf_fields[i].key);
            return TD_ERR_INVALID;
        }
        if (!json_is_string(src) || json_string_length(src) == 0) {
            td_error("gpucost: profile %s: %s.source: missing or empty (every constant "
                     "names where it comes from)", where, pf_fields[i].key);
            return TD_ERR_INVALID;
        }
        c->pf[i] = json_number_value(v);
        if (!(c->pf[i] >= pf_fields[i].min && c->pf[i] <= pf_fields[i].max)) {
            td_error("gpucost: profile %s: %s.value: %g is outside [%g, %g] %s", where,
                     pf_fields[i].key, c->pf[i], pf_fields[i].min, pf_fields[i].max,
                     pf_fields[i].unit);
            return TD_ERR_INVALID;
        }
    }
    return TD_OK;
}

/* An integer field of the config: *v = its value, or def when absent and
 * def >= 0; absent without a default, or not an integer in [min, max]:
 * TD_ERR_INVALID, logged. */
static td_status_t
gc_int(json_t *o, const char *where, const char *key, int64_t def, int64_t min, int64_t max,
       int64_t *v)
{
    json_t *f = json_object_get(o, key);

    if (f == NULL && def >= 0) {
        *v = def;
        return TD_OK;
    }
    if (!json_is_integer(f) || json_integer_value(f) < min || json_integer_value(f) > max) {
        td_error("gpucost: model %s: %s: %s, want an integer in [%lld, %lld]", where, key,
                 f == NULL ? "missing" : "bad value", (long long)min, (long long)max);
        return TD_ERR_INVALID;
    }
    *v = json_integer_value(f);
    return TD_OK;
}

/* An integer list of n entries in [min, max] (n 0: any length; *got its length). */
static td_status_t
gc_list(json_t *o, const char *where, const char *key, int64_t min, int64_t max,
        int64_t *v, size_t cap, size_t *got)
{
    json_t *f = json_object_get(o, key), *x;
    size_t i;

    if (!json_is_array(f) || json_array_size(f) > cap) {
        td_error("gpucost: model %s: %s: %s", where, key,
                 f == NULL ? "missing" : "not a list of at most the layer count");
        return TD_ERR_INVALID;
    }
    json_array_foreach(f, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < min || json_integer_value(x) > max) {
            td_error("gpucost: model %s: %s[%zu]: want an integer in [%lld, %lld]", where, key,
                     i, (long long)min, (long long)max);
            return TD_ERR_INVALID;
        }
        v[i] = json_integer_value(x);
    }
    *got = json_array_size(f);
    return TD_OK;
}

#define GC_INT(key, def, min, max, dst)                                            \
    do {                                                                           \
        int64_t v_;                                                                \
        st = gc_int(t, where, key, def, min, max, &v_);                            \
        if (st != TD_OK)                                                           \
            return st;                                                             \
        dst = v_;                                                                  \
    } while (0)

/* The common MoE fields of both families. */
static td_status_t
gc_read_moe(td_gpucost_t *c, json_t *t, const char *where, int64_t *inter)
{
    td_status_t st;

    GC_INT("hidden_size", -1, 1, 1 << 20, c->hidden);
    GC_INT("num_hidden_layers", -1, 1, 4096, c->layers);
    GC_INT("num_attention_heads", -1, 1, 1 << 16, c->heads);
    GC_INT("vocab_size", -1, 1, 1 << 30, c->vocab);
    GC_INT("n_routed_experts", -1, 1, 1 << 16, c->experts);
    GC_INT("num_experts_per_tok", -1, 1, 1 << 16, c->topk);
    GC_INT("moe_intermediate_size", -1, 1, 1 << 20, *inter);
    if (c->topk > c->experts) {
        td_error("gpucost: model %s: num_experts_per_tok %u > n_routed_experts %u", where,
                 c->topk, c->experts);
        return TD_ERR_INVALID;
    }
    c->layer = calloc(c->layers, sizeof(*c->layer));
    return c->layer == NULL ? TD_ERR_NOMEM : TD_OK;
}

/* DeepSeek-V3 (MLA, MoE after first_k_dense_replace dense layers). */
static td_status_t
gc_read_v3(td_gpucost_t *c, json_t *t, const char *where)
{
    td_status_t st;
    int64_t inter, ffn, dense_k, q_lora, nshared;
    double H, attn_p, dense_b = gc_param_bytes(c->dense_bits);

    st = gc_read_moe(c, t, where, &inter);
    if (st != TD_OK)
        return st;
    GC_INT("q_lora_rank", -1, 1, 1 << 20, q_lora);
    GC_INT("kv_lora_rank", -1, 1, 1 << 20, c->kv_lora);
    GC_INT("qk_nope_head_dim", -1, 1, 1 << 16, c->qk_nope);
    GC_INT("qk_rope_head_dim", -1, 0, 1 << 16, c->qk_rope);
    GC_INT("v_head_dim", -1, 1, 1 << 16, c->v_head);
    GC_INT("intermediate_size", -1, 1, 1 << 24, ffn);
    GC_INT("first_k_dense_replace", 0, 0, c->layers, dense_k);
    GC_INT("n_shared_experts", 0, 0, 64, nshared);

    H = c->hidden;
    c->expert_params = 3.0 * H * (double)inter;
    /* q_a, q_b, kv_a, kv_b, o */
    attn_p = H * q_lora + (double)q_lora * c->heads * (c->qk_nope + c->qk_rope) +
             H * (c->kv_lora + c->qk_rope) + (double)c->kv_lora * c->heads * (c->qk_nope + c->v_head) +
             (double)c->heads * c->v_head * H;
    for (uint32_t L = 0; L < c->layers; L++) {
        double ffn_p, router_p;

        c->layer[L].moe = L >= (uint32_t)dense_k;
        c->moe_layers += c->layer[L].moe;
        ffn_p = c->layer[L].moe ? (double)nshared * c->expert_params : 3.0 * H * (double)ffn;
        router_p = c->layer[L].moe ? (double)c->experts * H : 0;
        c->proj_fl[CL_DENSE] += 2 * attn_p;
        c->shared_fl[CL_DENSE] += 2 * ffn_p;
        c->shared_fl[CL_BF16] += 2 * router_p;
        c->dense_weight_bytes += (attn_p + ffn_p) * dense_b + router_p * 2;
    }
    /* per token per layer: the compressed latent and the rope key */
    c->kv_bytes_per_token = (double)c->layers * (c->kv_lora + c->qk_rope) * c->kv_bits / 8.0;
    c->kv_fixed_bytes = 0;
    return TD_OK;
}

/* The V4.1 fields beyond the MoE ones, and the per-layer schedule they give. */
typedef struct {
    int64_t q_lora, o_groups, o_lora, nshared, hc, cand_src, cand_blocks, cand_block, ngram,
        eng_heads, eng_dim;
    int64_t ratios[4096];
    char kv_src[4096], idx_src[4096], eng[4096];   /* kv source, index source, engram layer */
    size_t neng;                                   /* engram_layer_ids given: its length */
} gc_v41_t;

/* The scalar fields: attention, indexer, candidates, hyper-connections, engram. */
static td_status_t
gc_read_v41_sizes(td_gpucost_t *c, json_t *t, const char *where, gc_v41_t *v)
{
    td_status_t st;

    GC_INT("head_dim", -1, 1, 1 << 16, c->head_dim);
    GC_INT("q_lora_rank", -1, 1, 1 << 20, v->q_lora);
    GC_INT("o_groups", -1, 1, 1 << 16, v->o_groups);
    GC_INT("o_lora_rank", -1, 1, 1 << 20, v->o_lora);
    GC_INT("sliding_window", -1, 1, 1 << 24, c->window);
    GC_INT("index_n_heads", -1, 1, 1 << 16, c->index_heads);
    GC_INT("index_head_dim", -1, 1, 1 << 16, c->index_head_dim);
    GC_INT("index_topk", -1, 1, 1 << 30, c->index_topk);
    GC_INT("n_shared_experts", 1, 0, 64, v->nshared);
    GC_INT("hc_mult", 1, 1, 64, v->hc);
    GC_INT("candidate_source_layer_id", 0x7fffffff, -1, 0x7fffffff, v->cand_src);
    GC_INT("candidate_topk_blocks", 0, 0, 1 << 30, v->cand_blocks);
    GC_INT("candidate_block_size", 0, 0, 1 << 20, v->cand_block);
    GC_INT("engram_max_ngram_size", 0, 0, 64, v->ngram);
    GC_INT("engram_n_heads", 0, 0, 1 << 10, v->eng_heads);
    GC_INT("engram_head_dim", 0, 0, 1 << 16, v->eng_dim);
    return TD_OK;
}

/* The layer lists: compress_ratios, the kv and index sources (by default the
 * first layer of each run of equal non-zero ratios, and the kv sources), the
 * engram layers (none by default; only with an engram shape). */
static td_status_t
gc_read_v41_layers(td_gpucost_t *c, json_t *t, const char *where, gc_v41_t *v)
{
    int64_t ids[4096];
    size_t n, nkv, nidx;
    td_status_t st;

    st = gc_list(t, where, "compress_ratios", 0, 1 << 20, v->ratios, 4096, &n);
    if (st != TD_OK)
        return st;
    if (n < c->layers) {
        td_error("gpucost: model %s: compress_ratios: %zu entries for %u layers", where, n,
                 c->layers);
        return TD_ERR_INVALID;
    }
    if (json_object_get(t, "kv_source_layer_ids") != NULL) {
        st = gc_list(t, where, "kv_source_layer_ids", 0, c->layers - 1, ids, 4096, &nkv);
        if (st != TD_OK)
            return st;
        for (size_t i = 0; i < nkv; i++)
            v->kv_src[ids[i]] = 1;
    } else {
        for (uint32_t L = 0; L < c->layers; L++)
            v->kv_src[L] = v->ratios[L] != 0 && (L == 0 || v->ratios[L - 1] != v->ratios[L]);
    }
    if (json_object_get(t, "index_source_layer_ids") != NULL) {
        st = gc_list(t, where, "index_source_layer_ids", 0, c->layers - 1, ids, 4096, &nidx);
        if (st != TD_OK)
            return st;
        for (size_t i = 0; i < nidx; i++)
            v->idx_src[ids[i]] = 1;
    } else {
        memcpy(v->idx_src, v->kv_src, sizeof(v->idx_src));
    }
    if (json_object_get(t, "engram_layer_ids") != NULL) {
        st = gc_list(t, where, "engram_layer_ids", 0, c->layers - 1, ids, 4096, &v->neng);
        if (st != TD_OK)
            return st;
        for (size_t i = 0; i < v->neng; i++)
            v->eng[ids[i]] = v->ngram > 1 && v->eng_heads > 0 && v->eng_dim > 0;
    }
    return TD_OK;
}

/* Layer L's terms: its projections (attn_p of the attention proper, plus the
 * compressor's and the indexer's), shared expert, router, hyper-connections,
 * engram, and its KV bytes per token and fixed KV bytes. */
static void
gc_add_v41_layer(td_gpucost_t *c, const gc_v41_t *v, uint32_t L, double attn_p, double dense_b)
{
    gc_layer_t *ly = &c->layer[L];
    double H = c->hidden;
    double proj_d = attn_p, proj_b = 0;                 /* fp8 / bf16 parameters */
    double shared_d = (double)v->nshared * c->expert_params, router = c->experts * H;
    double hc_p = 2.0 * (2 + v->hc) * v->hc * (v->hc * H);   /* two sites' projections, f32 */

    ly->moe = 1;
    ly->ratio = (uint32_t)v->ratios[L];
    ly->index_source = ly->ratio != 0 && v->idx_src[L];
    ly->scan_limited = ly->index_source && v->cand_src >= 0 && (int64_t)L > v->cand_src &&
                       c->candidate_keys > 0;
    c->moe_layers++;
    if (v->kv_src[L] && ly->ratio != 0) {
        proj_b += H * c->head_dim * (ly->ratio > 1 ? 2 : 1);   /* compressor wkv, wgate */
        proj_b += (double)c->index_head_dim * c->head_dim;     /* indexer wk */
        c->kv_bytes_per_token += (c->kv_entry + (v->idx_src[L] ? c->index_entry : 0)) / ly->ratio;
        if (ly->ratio > 1)
            c->kv_fixed_bytes += ly->ratio * 2.0 * c->head_dim * 4;   /* partial: f32 kv + gate */
    }
    if (ly->index_source) {
        proj_d += (double)v->q_lora * c->index_heads * c->index_head_dim;   /* indexer wq_b */
        proj_b += (double)c->index_heads * H;                               /* weights_proj */
    }
    c->kv_fixed_bytes += (c->window - 1) * c->window_entry;           /* the window ring */
    c->proj_fl[CL_DENSE] += 2 * proj_d;
    c->proj_fl[CL_BF16] += 2 * proj_b;
    c->shared_fl[CL_DENSE] += 2 * shared_d;
    c->shared_fl[CL_BF16] += 2 * router;
    c->hc_fl += 2 * hc_p;
    c->dense_weight_bytes += (proj_d + shared_d) * dense_b + (proj_b + router) * 2 + hc_p * 4;
    if (v->eng[L]) {
        double rows = (double)(v->ngram - 1) * v->eng_heads;
        double wkv = H * (v->hc + 1) * rows * v->eng_dim;   /* engram wkv, fp8 */
        double qk = 2.0 * v->hc * H;                        /* q_weight, k_weight, bf16 */

        c->engram_fl[CL_DENSE] += 2 * wkv;
        c->engram_fl[CL_BF16] += 2 * qk;
        c->dense_weight_bytes += wkv * dense_b + qk * 2;
        c->engram_gather_bytes += rows * (v->eng_dim + v->eng_dim / 32.0);   /* fp8 rows + scales */
    }
}

/* DeepSeek-V4.1 (composite config.json with text_config, or flat). */
static td_status_t
gc_read_v41(td_gpucost_t *c, json_t *t, const char *where)
{
    gc_v41_t v = {0};
    td_status_t st;
    int64_t inter;
    double H, attn_p, dense_b = gc_param_bytes(c->dense_bits);

    if ((st = gc_read_moe(c, t, where, &inter)) != TD_OK ||
        (st = gc_read_v41_sizes(c, t, where, &v)) != TD_OK ||
        (st = gc_read_v41_layers(c, t, where, &v)) != TD_OK)
        return st;
    H = c->hidden;
    c->expert_params = 3.0 * H * (double)inter;
    /* wq_a, wq_b, wkv, wo_a (grouped), wo_b */
    attn_p = H * v.q_lora + (double)v.q_lora * c->heads * c->head_dim + H * c->head_dim +
             (double)c->heads * c->head_dim * v.o_lora + (double)v.o_groups * v.o_lora * H;
    c->candidate_keys = (uint64_t)v.cand_blocks * (uint64_t)v.cand_block;
    c->kv_entry = c->head_dim / 2.0 + c->head_dim / 16.0;           /* e2m1 + e4m3 per 16 */
    c->index_entry = c->index_head_dim / 2.0 + c->index_head_dim / 32.0;  /* e2m1 + ue8m0 per 32 */
    c->window_entry = c->head_dim + c->head_dim / 32.0;             /* e4m3 + ue8m0 per 32 */
    c->kv_fixed_bytes = 8;                                          /* the counter */
    for (uint32_t L = 0; L < c->layers; L++)
        gc_add_v41_layer(c, &v, L, attn_p, dense_b);
    if (v.ngram > 1 && v.neng > 0)
        c->kv_fixed_bytes += (v.ngram - 1) * 4.0;    /* engram look-back token ids */
    return TD_OK;
}

static td_status_t
gc_read_model(td_gpucost_t *c, json_t *root, const char *where, const td_gpucost_config_t *cfg)
{
    json_t *t = json_object_get(root, "text_config"), *mt, *q;
    const char *type;

    if (!json_is_object(t))
        t = root;
    mt = json_object_get(t, "model_type");
    if (!json_is_string(mt))
        mt = json_object_get(root, "model_type");
    type = json_is_string(mt) ? json_string_value(mt) : "";
    if (strcmp(type, "deepseek_v3") == 0) {
        c->v3 = 1;
    } else if (strcmp(type, "deepseek_v41") != 0 && strcmp(type, "deepseek_v41_text") != 0) {
        td_error("gpucost: model %s: model_type '%s': want deepseek_v41 or deepseek_v3", where,
                 type);
        return TD_ERR_UNSUPPORTED;
    }
    c->model_type = strdup(c->v3 ? "deepseek_v3" : "deepseek_v41");
    if (c->model_type == NULL)
        return TD_ERR_NOMEM;
    /* precisions: the checkpoint's (fp8 linears; V4.1's experts fp4 when
     * quantization_config says so; V3's KV bf16), else the overrides */
    q = json_object_get(root, "quantization_config");
    c->dense_bits = cfg->dense_bits ? cfg->dense_bits : 8;
    c->expert_bits = cfg->expert_bits ? cfg->expert_bits : 8;
    if (cfg->expert_bits == 0 && json_is_object(q)) {
        json_t *ed = json_object_get(q, "expert_dtype");

        if (json_is_string(ed) && strcmp(json_string_value(ed), "fp4") == 0)
            c->expert_bits = 4;
    }
    c->kv_bits = cfg->kv_bits ? cfg->kv_bits : 16;
    c->attn_bits = cfg->attn_bits ? cfg->attn_bits : 16;
    for (int i = 0; i < 4; i++) {
        uint32_t b = (uint32_t[]){c->dense_bits, c->expert_bits, c->kv_bits, c->attn_bits}[i];

        if (b != 4 && b != 8 && b != 16) {
            td_error("gpucost: %s bits %u: want 4, 8 or 16",
                     (const char *[]){"dense", "expert", "kv", "attention"}[i], b);
            return TD_ERR_INVALID;
        }
    }
    return c->v3 ? gc_read_v3(c, t, where) : gc_read_v41(c, t, where);
}

void
td_gpucost_destroy(td_gpucost_t *c)
{
    if (c == NULL)
        return;
    json_decref(c->profile);
    free(c->profile_name);
    free(c->model_type);
    free(c->layer);
    free(c);
}

td_status_t
td_gpucost_create(const td_gpucost_config_t *cfg, td_gpucost_t **out)
{
    td_gpucost_t *c = calloc(1, sizeof(*c));
    json_t *model = NULL;
    const char *pwhere = cfg->profile_json ? "(text)" : cfg->profile;
    const char *mwhere = cfg->model_json ? "(text)" : cfg->model;
    td_status_t st;

    if (c == NULL)
        return TD_ERR_NOMEM;
    st = gc_load_text(cfg->profile, cfg->profile_json, "profile", &c->profile);
    if (st != TD_OK)
        goto err_free;
    st = gc_read_profile(c, pwhere);
    if (st != TD_OK)
        goto err_free;
    st = gc_load_text(cfg->model, cfg->model_json, "model", &model);
    if (st != TD_OK)
        goto err_free;
    st = gc_read_model(c, model, mwhere, cfg);
    json_decref(model);
    if (st != TD_OK)
        goto err_free;
    /* the output head: bf16 [vocab, hidden] */
    c->head_flops = 2.0 * c->hidden * c->vocab;
    c->dense_weight_bytes += (double)c->hidden * c->vocab * 2;
    *out = c;
    return TD_OK;

err_free:
    td_gpucost_destroy(c);
    return st;
}

td_status_t
td_gpucost_info(const td_gpucost_t *c, td_gpucost_info_t *out)
{
    memset(out, 0, sizeof(*out));
    out->model_type = c->model_type;
    out->profile_name = c->profile_name;
    out->layers = c->layers;
    out->moe_layers = c->moe_layers;
    out->experts = c->experts;
    out->topk = c->topk;
    out->hidden = c->hidden;
    out->kv_bytes_per_token = c->kv_bytes_per_token;
    out->kv_fixed_bytes = c->kv_fixed_bytes;
    out->dense_weight_bytes = c->dense_weight_bytes;
    out->expert_weight_bytes = (double)c->moe_layers * c->experts * c->expert_params *
                               gc_param_bytes(c->expert_bits);
    out->flops_per_token = c->proj_fl[CL_DENSE] + c->proj_fl[CL_BF16] + c->shared_fl[CL_DENSE] +
                           c->shared_fl[CL_BF16] + c->engram_fl[CL_DENSE] + c->engram_fl[CL_BF16] +
                           c->hc_fl + (double)c->moe_layers * c->topk * 2 * c->expert_params +
                           c->head_flops;
    out->hbm_bytes = c->pf[PF_HBM_GB] * 1e9;
    out->nvlink_domain = c->pf[PF_NVL_DOMAIN];
    return TD_OK;
}

/* ---- Rates -------------------------------------------------------------------------- */

/* FLOP/s of tensor-core math at a bit width (fp4 without fp4 units: fp8). */
static double
gc_rate(const td_gpucost_t *c, uint32_t bits, double eff)
{
    double peak = bits == 16 ? c->pf[PF_BF16]
                : bits == 8 || c->pf[PF_FP4] <= 0 ? c->pf[PF_FP8] : c->pf[PF_FP4];

    return peak * 1e12 * eff;
}

static double
gc_hbm_rate(const td_gpucost_t *c)
{
    return c->pf[PF_HBM_BW] * 1e9 * c->pf[PF_EFF_HBM];
}

/* sum over p in [a, b) of min(s * (p + 1), cap) (cap INFINITY: none). */
static double
gc_sum_min_lin(double a, double b, double s, double cap)
{
    double lo = a + 1, hi = b, xs, h1, l2, sum = 0;

    if (b <= a)
        return 0;
    xs = s > 0 ? floor(cap / s) : hi;
    h1 = fmin(hi, xs);
    if (h1 >= lo)
        sum += s * (lo + h1) * (h1 - lo + 1) / 2;
    l2 = fmax(lo, h1 + 1);
    if (hi >= l2)
        sum += cap * (hi - l2 + 1);
    return sum;
}

/* Attention work of the queries at positions [a, b) of one request: key
 * counts summed over the queries, per layer kind, and the KV bytes their
 * keys are read from (once per query: decode; prefill passes a = b - n and
 * counts KV reads separately). */
typedef struct {
    double attn_flops, index_flops, kv_read;
} gc_attn_t;

static gc_attn_t
gc_attention(const td_gpucost_t *c, double a, double b)
{
    gc_attn_t r = {0, 0, 0};

    if (c->v3) {
        /* MLA: every earlier key. Prefill (not absorbed): qk over nope + rope,
         * pv over v. Decode (absorbed, one query): over the latent + rope and
         * the latent. Callers pick by the query count. */
        double keys = gc_sum_min_lin(a, b, 1, INFINITY);
        double per_key = b - a > 1 ? 2.0 * (c->qk_nope + c->qk_rope) + 2.0 * c->v_head
                                   : 2.0 * (c->kv_lora + c->qk_rope) + 2.0 * c->kv_lora;

        r.attn_flops = c->layers * keys * c->heads * per_key;
        r.kv_read = c->layers * keys * (c->kv_lora + c->qk_rope) * c->kv_bits / 8.0;
        return r;
    }
    for (uint32_t L = 0; L < c->layers; L++) {
        const gc_layer_t *ly = &c->layer[L];
        double wkeys = gc_sum_min_lin(a, b, 1, c->window);
        double ckeys = 0, scanned = 0;

        if (ly->ratio != 0) {
            double s = 1.0 / ly->ratio;

            ckeys = gc_sum_min_lin(a, b, s, c->index_topk);
            if (ly->index_source)
                scanned = gc_sum_min_lin(a, b, s, ly->scan_limited ? (double)c->candidate_keys
                                                                   : INFINITY);
        }
        /* MQA, K = V of head_dim: qk and pv per head */
        r.attn_flops += 4.0 * c->heads * c->head_dim * (wkeys + ckeys);
        r.index_flops += 2.0 * c->index_heads * c->index_head_dim * scanned;
        r.kv_read += (wkeys - (b - a)) * c->window_entry + ckeys * c->kv_entry +
                     scanned * c->index_entry;
    }
    return r;
}

/* Expected distinct experts of one MoE layer a pass hits on one rank:
 * `tokens` tokens on each of `ranks` ranks, each choosing top-k of E
 * uniformly; the rank holds E / ranks of them. */
static double
gc_experts_hit(const td_gpucost_t *c, double tokens, double ranks)
{
    double p_miss = pow(1.0 - (double)c->topk / c->experts, tokens * ranks);

    return (double)c->experts / ranks * (1.0 - p_miss);
}

/* The token-proportional terms of a pass over `tokens` tokens, plus the
 * weight bytes; attention is added by the caller. */
static void
gc_pass(const td_gpucost_t *c, double tokens, double logits_rows, double ranks,
        td_gpucost_terms_t *t)
{
    double dense = gc_rate(c, c->dense_bits, c->pf[PF_EFF_GEMM]);
    double bf16 = gc_rate(c, 16, c->pf[PF_EFF_GEMM]);
    double expert = gc_rate(c, c->expert_bits, c->pf[PF_EFF_GEMM]);
    double moe_flops = tokens * c->moe_layers * c->topk * 2 * c->expert_params;

    t->t_proj = tokens * (c->proj_fl[CL_DENSE] / dense + c->proj_fl[CL_BF16] / bf16);
    t->t_shared = tokens * (c->shared_fl[CL_DENSE] / dense + c->shared_fl[CL_BF16] / bf16);
    t->t_hc = tokens * c->hc_fl / bf16;
    t->t_engram = tokens * (c->engram_fl[CL_DENSE] / dense + c->engram_fl[CL_BF16] / bf16);
    t->t_moe = moe_flops / expert;
    t->t_head = logits_rows * c->head_flops / bf16;
    t->flops = tokens * (c->proj_fl[CL_DENSE] + c->proj_fl[CL_BF16] + c->shared_fl[CL_DENSE] +
                         c->shared_fl[CL_BF16] + c->hc_fl + c->engram_fl[CL_DENSE] +
                         c->engram_fl[CL_BF16]) + moe_flops + logits_rows * c->head_flops;
    t->experts_hit = c->moe_layers ? gc_experts_hit(c, tokens, ranks) : 0;
    t->b_weights = c->dense_weight_bytes;
    t->b_experts = c->moe_layers * t->experts_hit * c->expert_params *
                   gc_param_bytes(c->expert_bits);
    t->b_engram = tokens * c->engram_gather_bytes;
}

static void
gc_finish(const td_gpucost_t *c, td_gpucost_terms_t *t)
{
    t->compute_s = t->t_proj + t->t_attn + t->t_indexer + t->t_moe + t->t_shared + t->t_hc +
                   t->t_engram + t->t_head;
    t->bytes = t->b_weights + t->b_experts + t->b_kv + t->b_engram;
    t->memory_s = t->bytes / gc_hbm_rate(c);
    t->total_s = fmax(t->compute_s, t->memory_s) + t->alltoall_s;
}

/* ---- The public terms ---------------------------------------------------------------- */

double
td_gpucost_alltoall_s(const td_gpucost_t *c, uint64_t tokens, uint32_t ranks)
{
    double R = ranks ? ranks : 1, dom = fmin(R, c->pf[PF_NVL_DOMAIN]);
    double bytes, nvl, net;

    if (R <= 1 || tokens == 0 || c->moe_layers == 0)
        return 0;
    bytes = (double)tokens * c->topk * c->hidden *
            (c->pf[PF_A2A_DISPATCH] + c->pf[PF_A2A_COMBINE]);
    nvl = bytes * (dom - 1) / R / (c->pf[PF_NVL_BW] * 1e9 * c->pf[PF_EFF_NVL]);
    net = bytes * (R - dom) / R / (c->pf[PF_NET_GBIT] / 8 * 1e9 * c->pf[PF_EFF_NET]);
    return c->moe_layers * fmax(nvl, net);
}

td_status_t
td_gpucost_prefill_terms(const td_gpucost_t *c, uint64_t ntokens_new, uint64_t ncontext_before,
                         uint32_t ranks, td_gpucost_terms_t *t)
{
    double n = (double)ntokens_new, c0 = (double)ncontext_before, R = ranks ? ranks : 1;
    gc_attn_t a;

    memset(t, 0, sizeof(*t));
    if (ntokens_new == 0)
        return TD_OK;
    gc_pass(c, n, 1, R, t);
    a = gc_attention(c, c0, c0 + n);
    t->t_attn = a.attn_flops / gc_rate(c, c->attn_bits, c->pf[PF_EFF_ATTN]);
    t->t_indexer = a.index_flops / gc_rate(c, 8, c->pf[PF_EFF_GEMM]);
    t->flops += a.attn_flops + a.index_flops;
    /* the earlier tokens' KV read once, the chunk's written once */
    t->b_kv = (c0 + n) * c->kv_bytes_per_token + c->kv_fixed_bytes;
    t->alltoall_s = td_gpucost_alltoall_s(c, ntokens_new, (uint32_t)R);
    gc_finish(c, t);
    return TD_OK;
}

td_status_t
td_gpucost_decode_terms(const td_gpucost_t *c, uint64_t batch_rows, uint64_t sum_context_tokens,
                        uint32_t ranks_in_domain, td_gpucost_terms_t *t)
{
    double rows = (double)batch_rows, R = ranks_in_domain ? ranks_in_domain : 1, ctx;
    gc_attn_t a;

    memset(t, 0, sizeof(*t));
    if (batch_rows == 0)
        return TD_OK;
    ctx = (double)sum_context_tokens / rows;   /* every row at the mean context */
    gc_pass(c, rows, rows, R, t);
    a = gc_attention(c, ctx, ctx + 1);
    t->t_attn = rows * a.attn_flops / gc_rate(c, c->attn_bits, c->pf[PF_EFF_ATTN]);
    t->t_indexer = rows * a.index_flops / gc_rate(c, 8, c->pf[PF_EFF_GEMM]);
    t->flops += rows * (a.attn_flops + a.index_flops);
    /* every row reads its keys; V4.1 rows also their fixed state */
    t->b_kv = rows * (a.kv_read + (c->v3 ? 0 : c->kv_fixed_bytes) + c->kv_bytes_per_token);
    t->alltoall_s = td_gpucost_alltoall_s(c, batch_rows, (uint32_t)R);
    gc_finish(c, t);
    return TD_OK;
}

double
td_gpucost_prefill_s(const td_gpucost_t *c, uint64_t ntokens_new, uint64_t ncontext_before,
                     uint32_t ranks)
{
    td_gpucost_terms_t t;

    td_gpucost_prefill_terms(c, ntokens_new, ncontext_before, ranks, &t);
    return t.total_s;
}

double
td_gpucost_decode_step_s(const td_gpucost_t *c, uint64_t batch_rows,
                         uint64_t sum_context_tokens, uint32_t ranks_in_domain)
{
    td_gpucost_terms_t t;

    td_gpucost_decode_terms(c, batch_rows, sum_context_tokens, ranks_in_domain, &t);
    return t.total_s;
}

double
td_gpucost_kv_xfer_s(const td_gpucost_t *c, uint64_t ntokens)
{
    double bytes = (double)ntokens * c->kv_bytes_per_token + c->kv_fixed_bytes;

    return bytes / (c->pf[PF_NET_GBIT] / 8 * 1e9 * c->pf[PF_EFF_NET]);
}

/* ---- Printing ---------------------------------------------------------------------- */

td_status_t
td_gpucost_describe(const td_gpucost_t *c, FILE *out)
{
    td_gpucost_info_t in;

    td_gpucost_info(c, &in);
    fprintf(out, "model %s: %u layers (%u MoE), hidden %u, %u experts top-%u\n", in.model_type,
            in.layers, in.moe_layers, in.hidden, in.experts, in.topk);
    if (c->v3)
        fprintf(out, "  precision bits: dense %u, experts %u, kv %u, attention %u\n",
                c->dense_bits, c->expert_bits, c->kv_bits, c->attn_bits);
    else
        fprintf(out, "  precision bits: dense %u, experts %u, attention %u; kv in the model's "
                "formats (fp4 compressed entries, fp8 window)\n", c->dense_bits, c->expert_bits,
                c->attn_bits);
    fprintf(out, "  linear FLOPs/token %.2f G (2 x active parameters, head included)\n",
            in.flops_per_token / 1e9);
    fprintf(out, "  weights: dense (every rank) %.2f GB, routed experts %.2f GB\n",
            in.dense_weight_bytes / 1e9, in.expert_weight_bytes / 1e9);
    fprintf(out, "  KV: %.1f B/token paged, %.0f B fixed per request\n", in.kv_bytes_per_token,
            in.kv_fixed_bytes);
    fprintf(out, "profile %s\n", c->profile_name);
    for (int i = 0; i < PF_COUNT; i++) {
        json_t *f = json_object_get(c->profile, pf_fields[i].key);
        json_t *src = json_is_object(f) ? json_object_get(f, "source") : NULL;

        fprintf(out, "  %-24s %10g %-28s %s\n", pf_fields[i].key, c->pf[i], pf_fields[i].unit,
                json_is_string(src) ? json_string_value(src)
                                    : "default: one 400 Gb/s NIC per GPU");
    }
    return TD_OK;
}

td_status_t
td_gpucost_terms_print(const td_gpucost_terms_t *t, const char *title, FILE *out)
{
    const struct {
        const char *name;
        double s;
    } rows[] = {
        {"attention projections", t->t_proj}, {"attention core", t->t_attn},
        {"indexer scoring", t->t_indexer},    {"routed experts", t->t_moe},
        {"shared/dense ffn+router", t->t_shared}, {"mHC mixing", t->t_hc},
        {"engram projections", t->t_engram},  {"output head", t->t_head},
    };

    fprintf(out, "%s\n", title);
    fprintf(out, "  %-26s %10s %6s\n", "compute term", "ms", "share");
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        fprintf(out, "  %-26s %10.3f %5.1f%%\n", rows[i].name, rows[i].s * 1e3,
                t->compute_s > 0 ? 100 * rows[i].s / t->compute_s : 0);
    fprintf(out, "  %-26s %10.3f   (%.2f TFLOP)\n", "compute", t->compute_s * 1e3, t->flops / 1e12);
    fprintf(out, "  %-26s %10s   weights %.2f GB, experts %.2f GB (%.1f hit/layer), kv %.2f GB, "
            "engram %.3f GB\n", "bytes", "", t->b_weights / 1e9, t->b_experts / 1e9,
            t->experts_hit, t->b_kv / 1e9, t->b_engram / 1e9);
    fprintf(out, "  %-26s %10.3f   (%.2f GB)\n", "memory", t->memory_s * 1e3, t->bytes / 1e9);
    fprintf(out, "  %-26s %10.3f\n", "all-to-all", t->alltoall_s * 1e3);
    fprintf(out, "  %-26s %10.3f   = max(compute, memory) + all-to-all (%s-bound)\n", "total",
            t->total_s * 1e3, t->compute_s >= t->memory_s ? "compute" : "memory");
    return TD_OK;
}
