/* engine/layout.c — KV layouts: the V4.1-shaped segment list built from a
 * config, sizes for n tokens, and the canonical-encoding hash. */
#include "layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* The defaults live once, in the option fragment; this table reads them. */
typedef struct {
    td_layout_config_t l;
} layout_wrap_t;

static const td_config_opt_t layout_opts[] = {
    TD_LAYOUT_CONFIG_OPTS(layout_wrap_t, l),
    TD_CONFIG_OPT_END
};

td_status_t
td_layout_config_defaults(td_layout_config_t *cfg)
{
    layout_wrap_t w;
    char err[TD_CONFIG_ERRLEN];
    td_status_t st = td_config_defaults(layout_opts, &w, err, sizeof(err));

    if (st != TD_OK) {
        td_error("kv layout: defaults: %s", err);
        return st;
    }
    *cfg = w.l;
    return TD_OK;
}

void
td_layout_config_free(td_layout_config_t *cfg)
{
    free(cfg->kv_sources);
    cfg->kv_sources = NULL;
}

/* ---- Building ------------------------------------------------------------- */

static td_status_t
layout_check_seg(const td_layout_seg_t *s, uint32_t layers)
{
    if (s->name[0] == '\0' || memchr(s->name, '\0', sizeof(s->name)) == NULL ||
        (s->kind != TD_LAYOUT_PAGED && s->kind != TD_LAYOUT_FIXED) ||
        s->dtype < TD_LAYOUT_U8 || s->dtype > TD_LAYOUT_I64 || s->layer >= layers ||
        s->entry_bytes == 0 || s->ratio == 0 ||
        (s->kind == TD_LAYOUT_PAGED ? s->entries != 0 : (s->entries == 0 || s->ratio != 1)))
        return TD_ERR_INVALID;
    return TD_OK;
}

td_status_t
td_layout_create_from(uint32_t layers, uint32_t block_entries, const td_layout_seg_t *segs,
                      uint32_t nsegs, td_layout_t **out)
{
    td_layout_t *l;

    if (layers == 0 || block_entries == 0) {
        td_error("kv layout: %u layers, %u entries per block: both must be positive",
                 layers, block_entries);
        return TD_ERR_INVALID;
    }
    for (uint32_t i = 0; i < nsegs; i++) {
        if (layout_check_seg(&segs[i], layers) != TD_OK) {
            td_error("kv layout: segment %u (\"%.*s\") is malformed", i,
                     TD_LAYOUT_NAME_MAX - 1, segs[i].name);
            return TD_ERR_INVALID;
        }
        if (i > 0 && segs[i].layer < segs[i - 1].layer) {
            td_error("kv layout: segment %u (\"%s\") is out of layer order", i, segs[i].name);
            return TD_ERR_INVALID;
        }
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL || (l->segs = calloc(nsegs ? nsegs : 1, sizeof(*l->segs))) == NULL) {
        td_error("kv layout: %u segments: out of memory", nsegs);
        free(l);
        return TD_ERR_NOMEM;
    }
    memcpy(l->segs, segs, nsegs * sizeof(*segs));
    l->layers = layers;
    l->block_entries = block_entries;
    l->nsegs = nsegs;
    l->hash = td_layout_hash(l);
    *out = l;
    return TD_OK;
}

/* Parse "layer:ratio,..." into ratio[layer] (0 = not a source). */
static td_status_t
layout_parse_sources(const char *text, uint32_t layers, uint32_t *ratio)
{
    const char *p = text;

    while (*p != '\0') {
        char *end;
        unsigned long layer, r;

        if (*p < '0' || *p > '9')
            goto err_syntax;
        errno = 0;
        layer = strtoul(p, &end, 10);
        if (end == p || *end != ':' || errno != 0)
            goto err_syntax;
        p = end + 1;
        if (*p < '0' || *p > '9')
            goto err_syntax;
        r = strtoul(p, &end, 10);
        if (end == p || errno != 0 || (*end != ',' && *end != '\0') ||
            (*end == ',' && end[1] == '\0'))
            goto err_syntax;
        p = *end == ',' ? end + 1 : end;
        if (layer >= layers || r == 0 || r > 1024 || ratio[layer] != 0) {
            td_error("kv layout: kv-sources \"%s\": layer %lu ratio %lu: need a distinct "
                     "layer below %u and a ratio in 1..1024", text, layer, r, layers);
            return TD_ERR_INVALID;
        }
        ratio[layer] = (uint32_t)r;
    }
    return TD_OK;

err_syntax:
    td_error("kv layout: kv-sources \"%s\": want layer:ratio pairs separated by commas", text);
    return TD_ERR_INVALID;
}

void
td_layout_seg_set(td_layout_seg_t *s, const char *name, td_layout_kind_t kind,
                  td_layout_dtype_t dtype, uint32_t layer, uint32_t ratio, uint32_t entries,
                  uint64_t entry_bytes)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->kind = kind;
    s->dtype = dtype;
    s->layer = layer;
    s->ratio = ratio;
    s->entries = entries;
    s->entry_bytes = (uint32_t)entry_bytes;
}

td_status_t
td_layout_create(const td_layout_config_t *cfg, td_layout_t **out)
{
    uint32_t layers = (uint32_t)cfg->layers, n = 0;
    uint32_t *ratio;
    td_layout_seg_t *segs;
    td_status_t st;

    if (cfg->layers == 0 || cfg->layers > 4096 || cfg->kv_sources == NULL) {
        td_error("kv layout: %llu layers: want 1..4096 and a kv-sources list",
                 (unsigned long long)cfg->layers);
        return TD_ERR_INVALID;
    }
    if (cfg->kv_entry_bytes > UINT32_MAX || cfg->index_entry_bytes > UINT32_MAX ||
        cfg->window_entry_bytes > UINT32_MAX || cfg->partial_entry_bytes > UINT32_MAX ||
        cfg->engram_entry_bytes > UINT32_MAX || cfg->counter_bytes > UINT32_MAX ||
        cfg->window > UINT32_MAX || cfg->engram_tokens > UINT32_MAX ||
        cfg->block_entries > UINT32_MAX) {
        td_error("kv layout: a size does not fit 32 bits");
        return TD_ERR_RANGE;
    }
    ratio = calloc(layers, sizeof(*ratio));
    segs = calloc(4 * (size_t)layers + 2, sizeof(*segs));
    if (ratio == NULL || segs == NULL) {
        td_error("kv layout: %u layers: out of memory", layers);
        st = TD_ERR_NOMEM;
        goto out_free;
    }
    st = layout_parse_sources(cfg->kv_sources, layers, ratio);
    if (st != TD_OK)
        goto out_free;

    for (uint32_t i = 0; i < layers; i++) {
        char name[TD_LAYOUT_NAME_MAX];

        if (ratio[i] != 0) {
            snprintf(name, sizeof(name), "L%u.kv", i);
            td_layout_seg_set(&segs[n++], name, TD_LAYOUT_PAGED, TD_LAYOUT_U8, i, ratio[i], 0,
                              cfg->kv_entry_bytes);
            snprintf(name, sizeof(name), "L%u.index", i);
            td_layout_seg_set(&segs[n++], name, TD_LAYOUT_PAGED, TD_LAYOUT_U8, i, ratio[i], 0,
                              cfg->index_entry_bytes);
            if (ratio[i] > 1) {
                snprintf(name, sizeof(name), "L%u.partial", i);
                td_layout_seg_set(&segs[n++], name, TD_LAYOUT_FIXED, TD_LAYOUT_FP32, i, 1,
                                  ratio[i], cfg->partial_entry_bytes);
            }
        }
        snprintf(name, sizeof(name), "L%u.window", i);
        td_layout_seg_set(&segs[n++], name, TD_LAYOUT_FIXED, TD_LAYOUT_BF16, i, 1,
                          (uint32_t)cfg->window, cfg->window_entry_bytes);
    }
    if (cfg->engram_tokens > 0)
        td_layout_seg_set(&segs[n++], "engram", TD_LAYOUT_FIXED, TD_LAYOUT_I32, layers - 1, 1,
                          (uint32_t)cfg->engram_tokens, cfg->engram_entry_bytes);
    if (cfg->counter_bytes > 0)
        td_layout_seg_set(&segs[n++], "counters", TD_LAYOUT_FIXED, TD_LAYOUT_I64, layers - 1, 1,
                          1, cfg->counter_bytes);
    st = td_layout_create_from(layers, (uint32_t)cfg->block_entries, segs, n, out);

out_free:
    free(segs);
    free(ratio);
    return st;
}

void
td_layout_destroy(td_layout_t *l)
{
    if (l == NULL)
        return;
    free(l->segs);
    free(l);
}

/* ---- Sizes ----------------------------------------------------------------- */

uint64_t
td_layout_entries(const td_layout_seg_t *seg, uint64_t n)
{
    return seg->kind == TD_LAYOUT_PAGED ? n / seg->ratio : seg->entries;
}

uint64_t
td_layout_blocks(const td_layout_t *l, const td_layout_seg_t *seg, uint64_t n)
{
    if (seg->kind != TD_LAYOUT_PAGED)
        return 0;
    return (td_layout_entries(seg, n) + l->block_entries - 1) / l->block_entries;
}

uint64_t
td_layout_seg_bytes(const td_layout_seg_t *seg, uint64_t n)
{
    return td_layout_entries(seg, n) * seg->entry_bytes;
}

double
td_layout_paged_bytes_per_token(const td_layout_t *l)
{
    double b = 0;

    for (uint32_t i = 0; i < l->nsegs; i++)
        if (l->segs[i].kind == TD_LAYOUT_PAGED)
            b += (double)l->segs[i].entry_bytes / l->segs[i].ratio;
    return b;
}

uint64_t
td_layout_fixed_bytes(const td_layout_t *l)
{
    uint64_t b = 0;

    for (uint32_t i = 0; i < l->nsegs; i++)
        if (l->segs[i].kind == TD_LAYOUT_FIXED)
            b += (uint64_t)l->segs[i].entries * l->segs[i].entry_bytes;
    return b;
}

const td_layout_seg_t *
td_layout_find(const td_layout_t *l, const char *name)
{
    for (uint32_t i = 0; i < l->nsegs; i++)
        if (strcmp(l->segs[i].name, name) == 0)
            return &l->segs[i];
    return NULL;
}

/* ---- Hash -------------------------------------------------------------------- */

#define LAYOUT_FNV_OFFSET 0xcbf29ce484222325ull
#define LAYOUT_FNV_PRIME  0x100000001b3ull

static uint64_t
layout_fnv(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= LAYOUT_FNV_PRIME;
    }
    return h;
}

static uint64_t
layout_fnv_u8(uint64_t h, unsigned v)
{
    unsigned char b = (unsigned char)v;

    return layout_fnv(h, &b, 1);
}

static uint64_t
layout_fnv_u32(uint64_t h, uint32_t v)
{
    unsigned char b[4] = { v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24 };

    return layout_fnv(h, b, sizeof(b));
}

uint64_t
td_layout_hash(const td_layout_t *l)
{
    uint64_t h = layout_fnv(LAYOUT_FNV_OFFSET, "tdkv1", 5);

    h = layout_fnv_u32(h, l->layers);
    h = layout_fnv_u32(h, l->block_entries);
    h = layout_fnv_u32(h, l->nsegs);
    for (uint32_t i = 0; i < l->nsegs; i++) {
        const td_layout_seg_t *s = &l->segs[i];
        size_t len = strlen(s->name);

        h = layout_fnv_u8(h, s->kind);
        h = layout_fnv_u8(h, s->dtype);
        h = layout_fnv_u32(h, s->layer);
        h = layout_fnv_u32(h, s->ratio);
        h = layout_fnv_u32(h, s->entries);
        h = layout_fnv_u32(h, s->entry_bytes);
        h = layout_fnv_u8(h, (unsigned)len);
        h = layout_fnv(h, s->name, len);
    }
    return h;
}

uint64_t
td_layout_kv_capacity(const td_layout_kv_t *kv)
{
    const td_layout_t *l = kv->layout;
    uint64_t cap = UINT64_MAX;

    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        uint64_t t;

        if (seg->kind != TD_LAYOUT_PAGED)
            continue;
        /* floor(n / ratio) entries fit while n < (entries + 1) * ratio */
        t = (kv->nblocks[s] * l->block_entries + 1) * seg->ratio - 1;
        if (t < cap)
            cap = t;
    }
    return cap;
}
