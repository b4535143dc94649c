/* model/cacheplan.c — the KV layout of a DeepSeek-V4.1 config: which
 * segments each layer has (compressed KV and indexer keys paged; partial
 * groups, window rings, engram look-back and counters fixed), their formats
 * and sizes. The engine's identity needs this and nothing of the weights. */
#include "cacheplan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define CACHE_BLOCK_ENTRIES 64u

size_t
td_cache_fmt_bytes(td_cache_fmt_t f, uint32_t dim)
{
    switch (f) {
    case TD_CACHE_FP8:
        return dim + dim / TD_CACHE_FP8_BLOCK;
    case TD_CACHE_FP4_E4M3:
        return dim / 2 + dim / TD_CACHE_KV_FP4_BLOCK;
    case TD_CACHE_FP4_UE8M0:
        return dim / 2 + dim / TD_CACHE_INDEX_FP4_BLOCK;
    case TD_CACHE_F32:
    default:
        return (size_t)dim * sizeof(float);
    }
}

static td_layout_dtype_t
cache_fmt_dtype(td_cache_fmt_t f)
{
    return f == TD_CACHE_F32 ? TD_LAYOUT_FP32 : TD_LAYOUT_U8;
}

td_status_t
td_cache_plan_create(const td_modelcfg_t *cfg, td_cache_plan_t **out)
{
    td_status_t st = TD_ERR_NOMEM;
    uint32_t nl = (uint32_t)cfg->num_hidden_layers;
    td_layout_seg_t *segs = NULL;
    uint32_t n = 0;
    char name[TD_LAYOUT_NAME_MAX];

    if (cfg->sliding_window < 2) {
        td_error("kv cache: sliding_window %lld: the window ring needs at least 2",
                 (long long)cfg->sliding_window);
        return TD_ERR_UNSUPPORTED;
    }
    td_cache_plan_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->layers = calloc(nl, sizeof(*p->layers))) == NULL ||
        (segs = calloc(4 * (size_t)nl + 2, sizeof(*segs))) == NULL) {
        td_error("kv cache: plan of %u layers: out of memory", nl);
        goto err;
    }
    p->nlayers = nl;

    p->head_dim = (uint32_t)cfg->head_dim;
    p->index_head_dim = (uint32_t)cfg->index_head_dim;
    p->window_slots = (uint32_t)cfg->sliding_window - 1;
    p->window_fmt = p->head_dim % TD_CACHE_FP8_BLOCK == 0 ? TD_CACHE_FP8 : TD_CACHE_F32;
    p->kv_fmt = p->head_dim % TD_CACHE_KV_FP4_BLOCK == 0 ? TD_CACHE_FP4_E4M3 : TD_CACHE_F32;
    p->index_fmt = p->index_head_dim % TD_CACHE_INDEX_FP4_BLOCK == 0 ? TD_CACHE_FP4_UE8M0
                                                                    : TD_CACHE_F32;
    for (uint32_t i = 0; i < nl; i++) {
        const td_modelcfg_layer_t *L = &cfg->layers[i];
        td_cache_layer_t *cl = &p->layers[i];
        uint32_t r = (uint32_t)L->ratio;

        cl->kv = cl->index = cl->partial = cl->window = -1;
        if (L->kv_source) {
            snprintf(name, sizeof(name), "L%u.kv", i);
            td_layout_seg_set(&segs[n], name, TD_LAYOUT_PAGED, cache_fmt_dtype(p->kv_fmt), i, r, 0,
                              td_cache_fmt_bytes(p->kv_fmt, p->head_dim));
            cl->kv = (int32_t)n++;
            if (L->owns_index_k) {
                snprintf(name, sizeof(name), "L%u.index", i);
                td_layout_seg_set(&segs[n], name, TD_LAYOUT_PAGED, cache_fmt_dtype(p->index_fmt), i,
                                  r, 0, td_cache_fmt_bytes(p->index_fmt, p->index_head_dim));
                cl->index = (int32_t)n++;
            }
            if (r > 1) {
                snprintf(name, sizeof(name), "L%u.partial", i);
                td_layout_seg_set(&segs[n], name, TD_LAYOUT_FIXED, TD_LAYOUT_FP32, i, 1, r,
                                  2 * (size_t)p->head_dim * sizeof(float));
                cl->partial = (int32_t)n++;
            }
        }
        snprintf(name, sizeof(name), "L%u.window", i);
        td_layout_seg_set(&segs[n], name, TD_LAYOUT_FIXED, cache_fmt_dtype(p->window_fmt), i, 1,
                          p->window_slots, td_cache_fmt_bytes(p->window_fmt, p->head_dim));
        cl->window = (int32_t)n++;
    }
    p->engram = -1;
    if (cfg->engram_layer_ids.n > 0 && cfg->engram_max_ngram_size > 1) {
        p->engram_slots = (uint32_t)cfg->engram_max_ngram_size - 1;
        td_layout_seg_set(&segs[n], "engram", TD_LAYOUT_FIXED, TD_LAYOUT_I32, nl - 1, 1,
                          p->engram_slots, sizeof(int32_t));
        p->engram = (int32_t)n++;
    }
    td_layout_seg_set(&segs[n], "counters", TD_LAYOUT_FIXED, TD_LAYOUT_I64, nl - 1, 1, 1,
                      sizeof(uint64_t));
    p->counters = (int32_t)n++;

    st = td_layout_create_from(nl, CACHE_BLOCK_ENTRIES, segs, n, &p->layout);   /* logs */
    if (st != TD_OK)
        goto err;
    free(segs);
    *out = p;
    return TD_OK;

err:
    free(segs);
    td_cache_plan_destroy(p);
    return st;
}

void
td_cache_plan_destroy(td_cache_plan_t *p)
{
    if (p == NULL)
        return;
    td_layout_destroy(p->layout);
    free(p->layers);
    free(p);
}
