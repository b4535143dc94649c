/* model/model.c — loading a DeepSeek-V4.1 backbone: weights dequantized (the
 * linears into the ops' prepared matrices, the rest into one f32 arena), the
 * default and YaRN rope tables as transformers computes them, the engram hash
 * state with numpy's hash multipliers. */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "progress.h"
#include "quant.h"
#include "safetensors.h"
#include "tokmap.h"
#include "v41id.h"
#include "weights.h"

/* ---- numpy's Generator(PCG64).integers ----------------------------------------
 * SeedSequence (numpy/random/bit_generator.pyx) turns the seed into four
 * 64-bit words, PCG64 (XSL-RR 128/64) draws, and integers(0, bound) uses
 * Lemire's bounded method (numpy/random/src/distributions). */

__extension__ typedef unsigned __int128 model_u128;

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_POOL 4

static uint32_t
ss_hashmix(uint32_t v, uint32_t *hc)
{
    v ^= *hc;
    *hc *= SS_MULT_A;
    v *= *hc;
    v ^= v >> 16;
    return v;
}

static uint32_t
ss_mix(uint32_t x, uint32_t y)
{
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> 16);
}

/* SeedSequence(seed).generate_state(n64, uint64) for a non-negative seed. */
static void
ss_generate(uint64_t seed, uint64_t *out, size_t n64)
{
    uint32_t ent[2], pool[SS_POOL], hc = SS_INIT_A;
    size_t nent = 0;

    if (seed == 0)
        ent[nent++] = 0;
    while (seed != 0) {
        ent[nent++] = (uint32_t)seed;
        seed >>= 32;
    }
    for (size_t i = 0; i < SS_POOL; i++)
        pool[i] = ss_hashmix(i < nent ? ent[i] : 0, &hc);
    for (size_t s = 0; s < SS_POOL; s++)
        for (size_t d = 0; d < SS_POOL; d++)
            if (s != d)
                pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    hc = SS_INIT_B;
    for (size_t i = 0; i < 2 * n64; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hc;
        hc *= SS_MULT_B;
        v *= hc;
        v ^= v >> 16;
        if (i % 2 == 0)
            out[i / 2] = v;
        else
            out[i / 2] |= (uint64_t)v << 32;
    }
}

typedef struct {
    model_u128 state, inc;
    int has32;
    uint32_t buf32;
} model_pcg_t;

static const model_u128 pcg_mult =
    ((model_u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;

static void
pcg_step(model_pcg_t *g)
{
    g->state = g->state * pcg_mult + g->inc;
}

static void
pcg_seed(model_pcg_t *g, uint64_t seed)
{
    uint64_t v[4];

    ss_generate(seed, v, 4);
    memset(g, 0, sizeof(*g));
    g->inc = ((((model_u128)v[2] << 64) | v[3]) << 1) | 1u;
    pcg_step(g);
    g->state += ((model_u128)v[0] << 64) | v[1];
    pcg_step(g);
}

static uint64_t
pcg_next64(model_pcg_t *g)
{
    pcg_step(g);
    uint64_t x = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    unsigned r = (unsigned)(g->state >> 122);
    return (x >> r) | (x << ((64 - r) & 63));
}

static uint32_t
pcg_next32(model_pcg_t *g)
{
    if (g->has32) {
        g->has32 = 0;
        return g->buf32;
    }
    uint64_t v = pcg_next64(g);
    g->has32 = 1;
    g->buf32 = (uint32_t)(v >> 32);
    return (uint32_t)v;
}

/* A value in [0, rng] (numpy's random_bounded_uint64_fill, unmasked). */
static uint64_t
pcg_bounded(model_pcg_t *g, uint64_t rng)
{
    if (rng == 0)
        return 0;
    if (rng <= 0xFFFFFFFFull) {
        if (rng == 0xFFFFFFFFull)
            return pcg_next32(g);
        uint32_t excl = (uint32_t)rng + 1;
        uint64_t m = (uint64_t)pcg_next32(g) * excl;
        uint32_t left = (uint32_t)m;
        if (left < excl) {
            uint32_t th = (UINT32_MAX - (uint32_t)rng) % excl;
            while (left < th) {
                m = (uint64_t)pcg_next32(g) * excl;
                left = (uint32_t)m;
            }
        }
        return m >> 32;
    }
    if (rng == UINT64_MAX)
        return pcg_next64(g);
    uint64_t excl = rng + 1;
    model_u128 m = (model_u128)pcg_next64(g) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        uint64_t th = (UINT64_MAX - rng) % excl;
        while (left < th) {
            m = (model_u128)pcg_next64(g) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

td_status_t
td_model_hash_multipliers(uint64_t layer_id, uint32_t max_ngram, uint64_t vocab, int64_t *out)
{
    model_pcg_t g;

    if (vocab == 0 || layer_id > UINT64_MAX / 10007 || out == NULL) {
        td_error("engram: hash multipliers of layer %llu, vocabulary %llu",
                 (unsigned long long)layer_id, (unsigned long long)vocab);
        return TD_ERR_INVALID;
    }
    uint64_t bound = ((uint64_t)INT64_MAX / vocab) / 2;
    if (bound < 1)
        bound = 1;
    pcg_seed(&g, 10007 * layer_id);
    for (uint32_t i = 0; i < max_ngram; i++)
        out[i] = (int64_t)pcg_bounded(&g, bound - 1) * 2 + 1;
    return TD_OK;
}

/* ---- rope ---------------------------------------------------------------------- */

/* base ** (arange(0, dim, 2) / dim) in f32, as torch computes it. */
static float
rope_pos_freq(double base, uint32_t i, uint32_t dim)
{
    return powf((float)base, (float)(2 * i) / (float)dim);
}

/* transformers' _compute_yarn_parameters: find_correction_dim. */
static double
rope_correction_dim(double rot, uint32_t dim, double base, double max_pos)
{
    return (dim * log(max_pos / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

/* Fill inv_freq [dim / 2] and *scale for one rope entry of the config. */
static td_status_t
rope_table(const td_modelcfg_t *cfg, const td_modelcfg_rope_t *r, const char *which,
           float *inv_freq, float *scale)
{
    uint32_t dim = (uint32_t)cfg->qk_rope_head_dim;
    double base = r->has_theta ? r->theta : cfg->rope_theta.v;

    *scale = 1.0f;
    if (r->rope_type == NULL || strcmp(r->rope_type, "default") == 0) {
        for (uint32_t i = 0; i < dim / 2; i++)
            inv_freq[i] = 1.0f / rope_pos_freq(base, i, dim);
        return TD_OK;
    }
    if (strcmp(r->rope_type, "yarn") != 0) {
        td_error("rope %s: rope_type '%s' is not implemented (default and yarn are)", which,
                 r->rope_type);
        return TD_ERR_UNSUPPORTED;
    }
    double factor = r->has_factor ? r->factor : 0.0;
    double orig = r->has_original_max ? r->original_max_position_embeddings
                                      : (double)cfg->max_position_embeddings;
    if (!r->has_factor)
        factor = (double)cfg->max_position_embeddings / orig;
    double attn;
    if (r->has_attention_factor) {
        attn = r->attention_factor;
    } else {
        double ms = r->has_mscale ? r->mscale : 0.0, msa = r->has_mscale_all_dim ? r->mscale_all_dim : 0.0;
#define YARN_MSCALE(s, m) ((s) <= 1.0 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
        if (ms != 0.0 && msa != 0.0)
            attn = YARN_MSCALE(factor, ms) / YARN_MSCALE(factor, msa);
        else
            attn = YARN_MSCALE(factor, 1.0);
#undef YARN_MSCALE
    }
    double beta_fast = r->has_beta_fast && r->beta_fast != 0.0 ? r->beta_fast : 32.0;
    double beta_slow = r->has_beta_slow && r->beta_slow != 0.0 ? r->beta_slow : 1.0;
    double low = floor(rope_correction_dim(beta_fast, dim, base, orig));
    double high = ceil(rope_correction_dim(beta_slow, dim, base, orig));
    if (low < 0.0)
        low = 0.0;
    if (high > dim - 1)
        high = dim - 1;
    if (low == high)
        high += 0.001;
    for (uint32_t i = 0; i < dim / 2; i++) {
        float pf = rope_pos_freq(base, i, dim);
        float extra = 1.0f / pf, inter = 1.0f / ((float)factor * pf);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - ef) + extra * ef;
    }
    *scale = (float)attn;
    return TD_OK;
}

/* ---- weights --------------------------------------------------------------------- */

typedef struct {
    const td_weights_schema_t *schema;
    float **ptr;           /* [schema->n] each entry's f32 copy (NULL for linears) */
    td_kernels_mat_t **mat;/* [schema->n] each linear's prepared matrix */
    td_kernels_wsrc_t *tab;/* [schema->n] each table kept as stored (data NULL: f32 in ptr) */
    td_status_t st;
} model_bind_t;

typedef enum { MODEL_F32, MODEL_MAT } model_form_t;

/* The tensor named by fmt in the form asked: its f32 copy (MODEL_F32, a
 * float *) or its prepared matrix (MODEL_MAT, a td_kernels_mat_t *, see
 * model_linear_groups). NULL, and b->st set, when the schema has no such
 * tensor or it was not prepared that way. model_get and model_mat say which. */
__attribute__((format(printf, 3, 4))) static void *
model_tensor(model_bind_t *b, model_form_t form, const char *fmt, ...)
{
    char name[TD_WEIGHTS_NAME_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    const td_weights_entry_t *e = td_weights_schema_find(b->schema, name);
    if (e == NULL) {
        td_error("model: tensor '%s' is not in the weight schema", name);
        b->st = TD_ERR_INTERNAL;
        return NULL;
    }
    size_t i = (size_t)(e - b->schema->entries);
    if (form == MODEL_F32)
        return b->ptr[i];
    if (b->mat[i] == NULL) {   /* model_linear_groups misses it */
        td_error("model: tensor '%s' was not prepared as a linear", name);
        b->st = TD_ERR_INTERNAL;
    }
    return b->mat[i];
}

#define model_get(b, ...) ((float *)model_tensor((b), MODEL_F32, __VA_ARGS__))

/* A gathered table (the embedding, an engram table) as the ops read it: as
 * stored where model_table_src kept it so, else its f32 copy. */
__attribute__((format(printf, 2, 3))) static td_kernels_wsrc_t
model_table(model_bind_t *b, const char *fmt, ...)
{
    char name[TD_WEIGHTS_NAME_MAX];
    va_list ap;
    td_kernels_wsrc_t t = { TD_KERNELS_W_F32, NULL, NULL, 0, 0 };

    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    const td_weights_entry_t *e = td_weights_schema_find(b->schema, name);
    if (e == NULL) {
        td_error("model: tensor '%s' is not in the weight schema", name);
        b->st = TD_ERR_INTERNAL;
        return t;
    }
    size_t i = (size_t)(e - b->schema->entries);
    if (b->tab[i].data != NULL)
        return b->tab[i];
    t.data = b->ptr[i];
    return t;
}
#define model_mat(b, ...) ((td_kernels_mat_t *)model_tensor((b), MODEL_MAT, __VA_ARGS__))

/* Groups of the linear a tensor is the weight of (wo_a: o_groups; other
 * linears: 1), or 0 for a tensor that is not a linear's weight (kept f32). */
static size_t
model_linear_groups(const td_modelcfg_t *c, const td_weights_entry_t *e)
{
    static const char *const suffixes[] = {
        ".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_b.weight",
        ".compressor.wkv.weight", ".compressor.wgate.weight", ".indexer.wq_b.weight",
        ".indexer.weights_proj.weight", ".indexer.wk.weight", ".ffn.gate.weight",
        ".w1.weight", ".w2.weight", ".w3.weight", ".engram.wkv.weight", ".hc_attn_fn",
        ".hc_ffn_fn",
    };
    static const char wo_a[] = ".attn.wo_a.weight";
    size_t len = strlen(e->name);

    if (e->ndim != 2)
        return 0;
    if (strcmp(e->name, "head.weight") == 0)
        return 1;
    if (len >= sizeof(wo_a) - 1 && strcmp(e->name + len - (sizeof(wo_a) - 1), wo_a) == 0)
        return (size_t)c->o_groups;
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        size_t sl = strlen(suffixes[i]);
        if (len >= sl && strcmp(e->name + len - sl, suffixes[i]) == 0)
            return 1;
    }
    return 0;
}

/* Out of memory while loading: logged here, once, with what was being built. */
static td_status_t
model_nomem(const char *what)
{
    td_error("model: out of memory (%s)", what);
    return TD_ERR_NOMEM;
}

/* Keep a prepared matrix in the model (which destroys it). */
static td_status_t
model_keep_mat(td_model_t *m, td_kernels_mat_t *mat)
{
    td_kernels_mat_t **n = realloc(m->mats, (m->nmats + 1) * sizeof(*n));
    if (n == NULL) {
        m->ops->mat_destroy(mat);
        return model_nomem("the prepared linears");
    }
    m->mats = n;
    m->mats[m->nmats++] = mat;
    m->mat_bytes += m->ops->mat_bytes(mat);
    return TD_OK;
}

/* The checkpoint bytes of one bound tensor (weights and scales): what
 * loading reads. */
static uint64_t
model_tensor_bytes(const td_weights_bound_t *t)
{
    return (uint64_t)t->w->nbytes + (t->scale ? (uint64_t)t->scale->nbytes : 0);
}

/* Whether the model keeps tensor e: all but the routed experts another rank
 * holds (m->expert_held). */
static bool
model_keeps(const td_model_t *m, const td_weights_entry_t *e)
{
    return e->expert < 0 || m->expert_held[e->expert];
}

/* Whether tensor e is a table the ops gather rows from (embed_fmt) and can
 * read as stored: bf16, or fp8 rows with ue8m0 scales per 32 channels. */
static int
model_table_src(const td_weights_entry_t *e, const td_weights_bound_t *t, td_kernels_wsrc_t *src)
{
    static const char eg[] = ".engram.embed.weight";
    size_t len = strlen(e->name);
    const td_st_tensor_t *w = t->w, *sc = t->scale;

    if (strcmp(e->name, "embed.weight") != 0 &&
        (len < sizeof(eg) - 1 || strcmp(e->name + len - (sizeof(eg) - 1), eg) != 0))
        return 0;
    if (w->ndim != 2)
        return 0;
    if (sc == NULL && w->dtype == TD_DT_BF16) {
        *src = (td_kernels_wsrc_t){ TD_KERNELS_W_BF16, w->data, NULL, 0, 0 };
        return 1;
    }
    if (sc != NULL && w->dtype == TD_DT_F8_E4M3 && e->format == TD_WEIGHTS_FP8_ROWS &&
        (sc->dtype == TD_DT_E8M0 || sc->dtype == TD_DT_U8) && sc->ndim == 2 &&
        w->shape[1] % 32 == 0 && sc->shape[0] == w->shape[0] && sc->shape[1] == w->shape[1] / 32) {
        *src = (td_kernels_wsrc_t){ TD_KERNELS_W_FP8_ROWS, w->data, sc->data, 0, 0 };
        return 1;
    }
    return 0;
}

/* A copy of table src (its codes and scales) the model keeps; *out points
 * into it. */
static td_status_t
model_keep_table(td_model_t *m, const td_weights_bound_t *t, const td_kernels_wsrc_t *src,
                 td_kernels_wsrc_t *out)
{
    size_t wb = t->w->nbytes, sb = src->scales != NULL ? t->scale->nbytes : 0;
    void **n = realloc(m->blobs, (m->nblobs + 1) * sizeof(*n));
    if (n == NULL)
        return model_nomem("the tables");
    m->blobs = n;
    unsigned char *p = malloc(wb + sb ? wb + sb : 1);
    if (p == NULL)
        return model_nomem("the tables");
    m->blobs[m->nblobs++] = p;
    memcpy(p, src->data, wb);
    if (sb)
        memcpy(p + wb, src->scales, sb);
    m->table_bytes += wb + sb;
    *out = (td_kernels_wsrc_t){ src->fmt, p, sb ? p + wb : NULL, 0, 0 };
    return TD_OK;
}

/* The stored form of a linear's weights that mat_create_fmt takes as they
 * are: bf16, fp8 blocks with ue8m0 scales, fp4 with ue8m0 scales per 32.
 * 0 when the checkpoint has them otherwise (f32, other scale types, a shape
 * td_quant_dequant would reject): those go through td_quant_dequant. */
static int
model_wsrc(const td_weights_schema_t *s, const td_weights_entry_t *e, const td_weights_bound_t *t,
           td_kernels_wsrc_t *src)
{
    const td_st_tensor_t *w = t->w, *sc = t->scale;

    if (w->ndim != 2 || e->ndim != 2)
        return 0;
    int64_t R = w->shape[0], C = w->shape[1];
    if (sc == NULL) {
        *src = (td_kernels_wsrc_t){ TD_KERNELS_W_BF16, w->data, NULL, 0, 0 };
        return w->dtype == TD_DT_BF16;
    }
    if (sc->ndim != 2 || (sc->dtype != TD_DT_E8M0 && sc->dtype != TD_DT_U8))
        return 0;
    if (w->dtype == TD_DT_F8_E4M3 && e->format == TD_WEIGHTS_FP8_BLOCK) {
        int64_t br = (int64_t)s->block_rows, bc = (int64_t)s->block_cols;
        if (br <= 0 || bc <= 0 || bc % 32 != 0 || sc->shape[0] != (R + br - 1) / br ||
            sc->shape[1] != (C + bc - 1) / bc)
            return 0;
        *src = (td_kernels_wsrc_t){ TD_KERNELS_W_FP8_BLOCK, w->data, sc->data, (size_t)br,
                                    (size_t)bc };
        return 1;
    }
    int64_t K = w->dtype == TD_DT_F4 ? C : 2 * C;
    if ((w->dtype != TD_DT_I8 && w->dtype != TD_DT_U8 && w->dtype != TD_DT_F4) ||
        e->format != TD_WEIGHTS_FP4_GROUP || K != e->shape[1] || K % 32 != 0 ||
        sc->shape[0] != R || sc->shape[1] != K / 32)
        return 0;
    *src = (td_kernels_wsrc_t){ TD_KERNELS_W_FP4_K32, w->data, sc->data, 0, 0 };
    return 1;
}

/* The checkpoint bytes of one tensor go out of the process's memory once
 * read (the mapping's pages are dropped; read again, they come back). */
static void
model_release(const td_weights_bound_t *t)
{
    td_st_release(t->w);
    if (t->scale != NULL)
        td_st_release(t->scale);
}

/* Tensor i, a linear of `groups` groups: kept in its stored format where
 * the ops take it (model_wsrc), else dequantized into scratch first. */
static td_status_t
model_make_mat(td_model_t *m, const td_weights_t *w, size_t i, size_t groups, float *scratch,
               td_kernels_mat_t **out)
{
    const td_weights_schema_t *s = w->schema;
    const td_weights_entry_t *e = &s->entries[i];
    td_kernels_wsrc_t src;
    size_t n = (size_t)e->shape[0] / groups, k = (size_t)e->shape[1];

    if (e->shape[0] % (int64_t)groups != 0) {
        td_error("model: tensor '%s': %lld rows in %zu groups", e->name,
                 (long long)e->shape[0], groups);
        return TD_ERR_INVALID;
    }
    if (model_wsrc(s, e, &w->t[i], &src))
        return m->ops->mat_create_fmt(&src, groups, n, k, out);   /* the op logs why */
    int br = e->format == TD_WEIGHTS_FP8_BLOCK ? (int)s->block_rows : 0;
    int bc = e->format == TD_WEIGHTS_FP8_BLOCK ? (int)s->block_cols : 0;
    td_status_t st = td_quant_dequant(w->t[i].w, w->t[i].scale, br, bc, scratch);
    if (st != TD_OK)
        return st;   /* logged, naming the tensor */
    return m->ops->mat_create(scratch, groups, n, k, out);
}

/* Load every tensor the model keeps: the linears one at a time into
 * prepared matrices (mat; model_make_mat), the rest dequantized into the f32
 * arena (ptr), each tensor's checkpoint pages dropped once read. Routed
 * experts of other ranks are not read (their pages of the mapped checkpoint
 * are never touched). */
static td_status_t
model_dequant_all(td_model_t *m, const td_weights_t *w, model_bind_t *b, td_progress_t *prog)
{
    const td_weights_schema_t *s = w->schema;
    size_t total = 0, most = 0;
    float *scratch = NULL;
    td_status_t st = TD_OK;

    for (size_t i = 0; i < w->n; i++) {
        int64_t cnt = td_quant_dequant_count(w->t[i].w, w->t[i].scale);
        td_kernels_wsrc_t src;
        if (cnt <= 0 || (uint64_t)cnt > SIZE_MAX / sizeof(float) - total) {
            td_error("model: tensor '%s': %lld elements", s->entries[i].name, (long long)cnt);
            return TD_ERR_INVALID;
        }
        if (!model_keeps(m, &s->entries[i]))
            continue;
        if (model_table_src(&s->entries[i], &w->t[i], &src))
            continue;   /* kept as stored */
        if (model_linear_groups(m->cfg, &s->entries[i]) == 0)
            total += (size_t)cnt;
        else if ((size_t)cnt > most && !model_wsrc(s, &s->entries[i], &w->t[i], &src))
            most = (size_t)cnt;
    }
    m->arena = malloc((total ? total : 1) * sizeof(float));
    scratch = malloc((most ? most : 1) * sizeof(float));
    if (m->arena == NULL || scratch == NULL) {
        td_error("model: cannot allocate %zu MiB of f32 weights",
                 (total + most) * sizeof(float) >> 20);
        free(scratch);
        return TD_ERR_NOMEM;
    }
    m->arena_floats = total;
    size_t at = 0;
    uint64_t bytes_done = 0;
    for (size_t i = 0; i < w->n && st == TD_OK; i++) {
        const td_weights_entry_t *e = &s->entries[i];
        if (i > 0)
            td_progress_step(prog, i, bytes_done);
        bytes_done += model_tensor_bytes(&w->t[i]);
        if (!model_keeps(m, e))
            continue;
        size_t groups = model_linear_groups(m->cfg, e);
        td_kernels_wsrc_t src;
        if (model_table_src(e, &w->t[i], &src)) {
            st = model_keep_table(m, &w->t[i], &src, &b->tab[i]);
        } else if (groups == 0) {
            int br = e->format == TD_WEIGHTS_FP8_BLOCK ? (int)s->block_rows : 0;
            int bc = e->format == TD_WEIGHTS_FP8_BLOCK ? (int)s->block_cols : 0;
            st = td_quant_dequant(w->t[i].w, w->t[i].scale, br, bc, m->arena + at);
            b->ptr[i] = m->arena + at;
            at += (size_t)td_quant_dequant_count(w->t[i].w, w->t[i].scale);
        } else {
            st = model_make_mat(m, w, i, groups, scratch, &b->mat[i]);
            if (st == TD_OK)
                st = model_keep_mat(m, b->mat[i]);
            if (st == TD_OK && e->expert >= 0)
                m->expert_bytes += m->ops->mat_bytes(b->mat[i]);
        }
        if (st == TD_OK)
            model_release(&w->t[i]);
    }
    free(scratch);
    return st;
}

static td_status_t
model_bind_layer(td_model_t *m, model_bind_t *b, int64_t i)
{
    const td_modelcfg_t *c = m->cfg;
    const td_modelcfg_layer_t *cl = &c->layers[i];
    td_model_layer_t *L = &m->layers[i];
    const char *p = "layers.";
    size_t E = (size_t)c->n_routed_experts;

    L->attn_norm = model_get(b, "%s%lld.attn_norm.weight", p, (long long)i);
    L->wq_a = model_mat(b, "%s%lld.attn.wq_a.weight", p, (long long)i);
    L->q_norm = model_get(b, "%s%lld.attn.q_norm.weight", p, (long long)i);
    L->wq_b = model_mat(b, "%s%lld.attn.wq_b.weight", p, (long long)i);
    L->wkv = model_mat(b, "%s%lld.attn.wkv.weight", p, (long long)i);
    L->kv_norm = model_get(b, "%s%lld.attn.kv_norm.weight", p, (long long)i);
    L->wo_a = model_mat(b, "%s%lld.attn.wo_a.weight", p, (long long)i);
    L->wo_b = model_mat(b, "%s%lld.attn.wo_b.weight", p, (long long)i);
    L->attn_sink = model_get(b, "%s%lld.attn.attn_sink", p, (long long)i);
    if (cl->kv_source) {
        L->cmp_wkv = model_mat(b, "%s%lld.attn.compressor.wkv.weight", p, (long long)i);
        if (cl->ratio > 1)
            L->cmp_wgate = model_mat(b, "%s%lld.attn.compressor.wgate.weight", p, (long long)i);
        L->cmp_norm = model_get(b, "%s%lld.attn.compressor.norm.weight", p, (long long)i);
    }
    if (cl->index_source) {
        L->idx_wq_b = model_mat(b, "%s%lld.attn.indexer.wq_b.weight", p, (long long)i);
        L->idx_wproj = model_mat(b, "%s%lld.attn.indexer.weights_proj.weight", p, (long long)i);
        if (cl->owns_index_k) {
            L->idx_wk = model_mat(b, "%s%lld.attn.indexer.wk.weight", p, (long long)i);
            L->idx_k_norm = model_get(b, "%s%lld.attn.indexer.k_norm.weight", p, (long long)i);
        }
    }
    L->ffn_norm = model_get(b, "%s%lld.ffn_norm.weight", p, (long long)i);
    L->gate = model_mat(b, "%s%lld.ffn.gate.weight", p, (long long)i);
    L->gate_bias = model_get(b, "%s%lld.ffn.gate.bias", p, (long long)i);
    L->w1 = calloc(E, sizeof(*L->w1));
    L->w2 = calloc(E, sizeof(*L->w2));
    L->w3 = calloc(E, sizeof(*L->w3));
    if (L->w1 == NULL || L->w2 == NULL || L->w3 == NULL)
        return model_nomem("the expert tables");
    for (size_t e = 0; e < E; e++) {
        if (!m->expert_held[e])
            continue;   /* another rank's */
        L->w1[e] = model_mat(b, "%s%lld.ffn.experts.%zu.w1.weight", p, (long long)i, e);
        L->w2[e] = model_mat(b, "%s%lld.ffn.experts.%zu.w2.weight", p, (long long)i, e);
        L->w3[e] = model_mat(b, "%s%lld.ffn.experts.%zu.w3.weight", p, (long long)i, e);
    }
    L->sw1 = model_mat(b, "%s%lld.ffn.shared_experts.w1.weight", p, (long long)i);
    L->sw2 = model_mat(b, "%s%lld.ffn.shared_experts.w2.weight", p, (long long)i);
    L->sw3 = model_mat(b, "%s%lld.ffn.shared_experts.w3.weight", p, (long long)i);
    if (cl->engram >= 0) {
        size_t hc = (size_t)c->hc_mult, H = (size_t)c->hidden_size;
        L->eg_table = model_table(b, "%s%lld.engram.embed.weight", p, (long long)i);
        L->eg_rows = (uint64_t)c->engram_num_embeddings.v[cl->engram];
        L->eg_wkv = model_mat(b, "%s%lld.engram.wkv.weight", p, (long long)i);
        const float *q = model_get(b, "%s%lld.engram.q_weight", p, (long long)i);
        const float *k = model_get(b, "%s%lld.engram.k_weight", p, (long long)i);
        L->eg_qk = malloc(hc * H * sizeof(float));
        if (L->eg_qk == NULL)
            return model_nomem("the engram keys");
        if (q != NULL && k != NULL)
            for (size_t j = 0; j < hc * H; j++)
                L->eg_qk[j] = q[j] * k[j];
    }
    L->hc_attn_fn = model_mat(b, "%s%lld.hc_attn_fn", p, (long long)i);
    L->hc_attn_base = model_get(b, "%s%lld.hc_attn_base", p, (long long)i);
    L->hc_attn_scale = model_get(b, "%s%lld.hc_attn_scale", p, (long long)i);
    L->hc_ffn_fn = model_mat(b, "%s%lld.hc_ffn_fn", p, (long long)i);
    L->hc_ffn_base = model_get(b, "%s%lld.hc_ffn_base", p, (long long)i);
    L->hc_ffn_scale = model_get(b, "%s%lld.hc_ffn_scale", p, (long long)i);
    return b->st;
}

/* ---- engram hash state ---------------------------------------------------------------- */

static td_status_t
model_engram_init(td_model_t *m, const char *dir)
{
    const td_modelcfg_t *c = m->cfg;
    td_model_engram_t *g = &m->engram;
    uint32_t nl = c->engram_layer_ids.n, nb = (uint32_t)c->engram_max_ngram_size;
    uint32_t cols = (nb - 1) * (uint32_t)c->engram_n_heads, ncls;
    td_status_t st;

    if (m->tok == NULL) {
        td_error("model %s: the engram layers need the tokenizer (tokenizer.json) to build "
                 "their n-gram hash state", dir);
        return TD_ERR_INVALID;
    }
    st = td_tokmap_build(m->tok, &g->token_map, &ncls);
    if (st != TD_OK)
        return st;
    g->map_size = td_tokenizer_vocab_size(m->tok);
    if ((int64_t)ncls != c->engram_compressed_vocab_size) {
        td_error("model %s: the tokenizer-derived compressed vocabulary size (%u) does not "
                 "match engram_compressed_vocab_size (%lld); the hash multipliers would "
                 "rehash the whole engram table", dir, ncls,
                 (long long)c->engram_compressed_vocab_size);
        return TD_ERR_INVALID;
    }
    if (c->engram_pad_id < 0 || (uint64_t)c->engram_pad_id >= g->map_size) {
        td_error("model %s: engram_pad_id %lld outside the tokenizer's %u ids", dir,
                 (long long)c->engram_pad_id, g->map_size);
        return TD_ERR_INVALID;
    }
    g->pad_class = g->token_map[c->engram_pad_id];
    g->mult = calloc((size_t)nl * nb, sizeof(*g->mult));
    g->primes = calloc((size_t)nl * cols, sizeof(*g->primes));
    g->offsets = calloc((size_t)nl * cols, sizeof(*g->offsets));
    if (g->mult == NULL || g->primes == NULL || g->offsets == NULL)
        return model_nomem("the engram hash state");
    for (uint32_t k = 0; k < nl; k++) {
        uint64_t total = 0;
        st = td_modelcfg_engram_primes(c, k, g->primes + (size_t)k * cols, &total);
        if (st != TD_OK)
            return st;
        uint64_t at = 0;
        for (uint32_t j = 0; j < cols; j++) {
            g->offsets[(size_t)k * cols + j] = at;
            at += g->primes[(size_t)k * cols + j];
        }
        st = td_model_hash_multipliers((uint64_t)c->engram_layer_ids.v[k], nb, ncls,
                                       g->mult + (size_t)k * nb);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* ---- load / destroy ------------------------------------------------------------------------ */

td_status_t
td_model_load(const char *dir, td_model_t **out)
{
    return td_model_load_opts(dir, NULL, out);
}

/* Which routed experts the model keeps: all, or those opts' placement gives
 * its rank. */
static td_status_t
model_experts_init(td_model_t *m, const char *dir, const td_model_opts_t *opts)
{
    const td_modelcfg_t *c = m->cfg;
    uint32_t E = (uint32_t)c->n_routed_experts;
    const td_placement_t *p = opts ? opts->placement : NULL;

    m->expert_held = calloc(E ? E : 1, 1);
    if (m->expert_held == NULL)
        return model_nomem("the expert table");
    if (p != NULL && (td_placement_experts(p) != E || opts->rank >= td_placement_ranks(p))) {
        td_error("model %s: a placement of %u experts over %u ranks for rank %u of a model "
                 "with %u experts", dir, td_placement_experts(p), td_placement_ranks(p),
                 opts->rank, E);
        return TD_ERR_INVALID;
    }
    for (uint32_t e = 0; e < E; e++)
        m->expert_held[e] = p == NULL || td_placement_holds(p, opts->rank, e);
    for (uint32_t e = 0; e < E; e++)
        m->experts_held += m->expert_held[e];
    return TD_OK;
}

/* The config (checked, with an implemented scoring function), the routed
 * experts this rank keeps and the tokenizer when the folder has one. */
static td_status_t
model_cfg_init(td_model_t *m, const char *dir, const td_model_opts_t *opts)
{
    char path[4096], err[512];
    td_status_t st = td_modelcfg_load(dir, &m->cfg);

    if (st != TD_OK)
        return st;
    st = td_modelcfg_check(m->cfg, err, sizeof(err));
    if (st != TD_OK) {
        td_error("model %s: %s", dir, err);
        return st;
    }
    const td_modelcfg_t *c = m->cfg;
    if (strcmp(c->scoring_func, "sqrtsoftplus") != 0 && strcmp(c->scoring_func, "sigmoid") != 0) {
        td_error("model %s: scoring_func '%s' is not implemented (the reference's ACT2FN has "
                 "sqrtsoftplus and sigmoid)", dir, c->scoring_func);
        return TD_ERR_UNSUPPORTED;
    }
    st = model_experts_init(m, dir, opts);
    if (st != TD_OK)
        return st;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return TD_OK;
    fclose(f);
    return td_tokenizer_load(path, &m->tok);
}

/* The head: its own tensor, or a linear made from the embedding when tied. */
static td_status_t
model_bind_head(td_model_t *m, model_bind_t *b, const char *dir)
{
    const td_modelcfg_t *c = m->cfg;

    if (!c->tie_word_embeddings) {
        m->head = model_mat(b, "head.weight");
        return TD_OK;
    }
    if (m->embed.data == NULL)
        return TD_OK;   /* b->st says why */
    td_status_t st = m->embed.fmt == TD_KERNELS_W_F32
        ? m->ops->mat_create(m->embed.data, 1, (size_t)c->vocab_size, (size_t)c->hidden_size,
                             &m->head)
        : m->ops->mat_create_fmt(&m->embed, 1, (size_t)c->vocab_size, (size_t)c->hidden_size,
                                 &m->head);
    if (st != TD_OK)
        return st;   /* the op logged why */
    st = model_keep_mat(m, m->head);
    if (st != TD_OK)
        td_error("model %s: the head from the embedding: %s", dir, td_status_str(st));
    return st;
}

/* Read the checkpoint in dir: every tensor the model keeps, bound to its
 * place in m (embedding, head, norms, every layer's). */
static td_status_t
model_load_weights(td_model_t *m, const char *dir)
{
    const td_modelcfg_t *c = m->cfg;
    td_weights_schema_t *schema = NULL;
    td_st_t *st_file = NULL;
    td_weights_t *w = NULL;
    model_bind_t b = { 0 };
    td_progress_t prog;
    bool loading = false;   /* prog has begun */
    char what[4096];
    td_status_t st;

    st = td_weights_schema_create(c, &schema);
    if (st == TD_OK)
        st = td_st_open(dir, &st_file);
    if (st == TD_OK)
        st = td_weights_bind(schema, st_file, NULL, NULL, &w);   /* logs every problem */
    if (st != TD_OK)
        goto out;
    b.schema = schema;
    b.ptr = calloc(schema->n ? schema->n : 1, sizeof(*b.ptr));
    b.mat = calloc(schema->n ? schema->n : 1, sizeof(*b.mat));
    b.tab = calloc(schema->n ? schema->n : 1, sizeof(*b.tab));
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof(*m->layers));
    if (b.ptr == NULL || b.mat == NULL || b.tab == NULL || m->layers == NULL) {
        st = model_nomem("the tensor tables");
        goto out;
    }
    snprintf(what, sizeof(what), "model %s", dir);
    td_progress_begin(&prog, what, "tensors", w->n, w->bytes);
    loading = true;
    st = model_dequant_all(m, w, &b, &prog);
    if (st != TD_OK)
        goto out;
    m->embed = model_table(&b, "embed.weight");
    m->norm = model_get(&b, "norm.weight");
    st = model_bind_head(m, &b, dir);
    for (int64_t i = 0; i < c->num_hidden_layers && st == TD_OK; i++)
        st = model_bind_layer(m, &b, i);
    if (st == TD_OK)
        st = b.st;
out:
    if (loading)
        td_progress_end(&prog, st);
    free(b.ptr);
    free(b.mat);
    free(b.tab);
    td_weights_destroy(w);
    td_st_close(st_file);
    td_weights_schema_destroy(schema);
    return st;
}

/* What the forward pass derives from the config: the rope tables, the
 * engram hash state and the cache plan. */
static td_status_t
model_tables_init(td_model_t *m, const char *dir)
{
    const td_modelcfg_t *c = m->cfg;
    size_t half = (size_t)c->qk_rope_head_dim / 2;
    td_status_t st;

    m->inv_freq_main = calloc(half ? half : 1, sizeof(float));
    m->inv_freq_compress = calloc(half ? half : 1, sizeof(float));
    if (m->inv_freq_main == NULL || m->inv_freq_compress == NULL)
        return model_nomem("the rope tables");
    st = rope_table(c, &c->rope_main, "main", m->inv_freq_main, &m->rope_scale_main);
    if (st == TD_OK)
        st = rope_table(c, &c->rope_compress, "compress", m->inv_freq_compress,
                        &m->rope_scale_compress);
    if (st == TD_OK && c->engram_layer_ids.n > 0)
        st = model_engram_init(m, dir);
    if (st != TD_OK)
        return st;
    td_cache_plan_t *plan;
    st = td_cache_plan_create(c, &plan);
    if (st == TD_OK)
        m->plan = plan;
    return st;
}

td_status_t
td_model_load_opts(const char *dir, const td_model_opts_t *opts, td_model_t **out)
{
    td_model_t *m = calloc(1, sizeof(*m));
    td_status_t st;

    if (m == NULL)
        return model_nomem(dir);
    m->ops = td_kernels_cpu_ops();
    st = model_cfg_init(m, dir, opts);
    if (st == TD_OK)
        st = model_load_weights(m, dir);
    if (st == TD_OK)
        st = model_tables_init(m, dir);
    if (st != TD_OK) {
        td_model_destroy(m);
        return st;
    }
    const td_modelcfg_t *c = m->cfg;
    td_info("model %s: %lld layers, hidden %lld, vocab %lld, %zu MiB of f32 weights and "
            "%zu MiB of linears (%u of %lld routed experts: %zu MiB)", dir,
            (long long)c->num_hidden_layers, (long long)c->hidden_size,
            (long long)c->vocab_size, m->arena_floats * sizeof(float) >> 20,
            m->mat_bytes >> 20, m->experts_held, (long long)c->n_routed_experts,
            m->expert_bytes >> 20);
    *out = m;
    return TD_OK;
}

void
td_model_destroy(td_model_t *m)
{
    if (m == NULL)
        return;
    if (m->layers != NULL)
        for (int64_t i = 0; i < m->cfg->num_hidden_layers; i++) {
            free(m->layers[i].w1);
            free(m->layers[i].w2);
            free(m->layers[i].w3);
            free(m->layers[i].eg_qk);
        }
    free(m->layers);
    free(m->expert_held);
    free(m->inv_freq_main);
    free(m->inv_freq_compress);
    free(m->engram.token_map);
    free(m->engram.mult);
    free(m->engram.primes);
    free(m->engram.offsets);
    for (size_t i = 0; i < m->nmats; i++)
        m->ops->mat_destroy(m->mats[i]);
    free(m->mats);
    for (size_t i = 0; i < m->nblobs; i++)
        free(m->blobs[i]);
    free(m->blobs);
    free(m->arena);
    td_cache_plan_destroy((td_cache_plan_t *)m->plan);
    td_tokenizer_destroy(m->tok);
    td_modelcfg_destroy(m->cfg);
    free(m);
}

/* ---- End of sequence ---------------------------------------------------------- */

/* The V4 tokenizer's end of sequence, used when config.json names none. */
#define MODEL_EOS_TOKEN "<｜end▁of▁sentence｜>"

td_status_t
td_model_stop_eos(const td_modelcfg_t *cfg, const td_tokenizer_t *tok, td_sample_params_t *sp)
{
    td_sample_params_t s = *sp;
    int32_t ids[TD_SAMPLE_MAX_STOP];
    uint32_t n = 0, id;
    td_status_t st = td_v41_eos_ids(NULL, cfg, ids, &n);   /* logs why */

    if (st == TD_ERR_NOT_FOUND) {
        if (tok == NULL ||
            td_tokenizer_find(tok, MODEL_EOS_TOKEN, strlen(MODEL_EOS_TOKEN), &id) != TD_OK) {
            td_warn("model: config eos_token_id is null and the tokenizer has no %s: no "
                    "end-of-sequence token", MODEL_EOS_TOKEN);
            return TD_ERR_NOT_FOUND;
        }
        if ((int64_t)id >= cfg->vocab_size) {
            td_error("model: tokenizer %s is id %u, outside the vocabulary (%lld ids)",
                     MODEL_EOS_TOKEN, id, (long long)cfg->vocab_size);
            return TD_ERR_INVALID;
        }
        ids[n++] = (int32_t)id;
        st = TD_OK;
    }
    if (st != TD_OK)
        return st;
    for (uint32_t i = 0; i < n; i++) {
        if (td_sample_stop_add(&s, ids[i]) != TD_OK) {
            td_error("model: end-of-sequence ids: more than %d stop tokens", TD_SAMPLE_MAX_STOP);
            return TD_ERR_RANGE;
        }
    }
    *sp = s;
    return TD_OK;
}
