/* prefilld/kvmap.c — KvDest checking and the mapping of engine pieces onto
 * transfer descriptors (prefilld/kvmap.h). Everything from the router is
 * checked here: a bad destination is a status and a reason, never a write. */
#include "kvmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

td_status_t
td_kvmap_create(const td_layout_t *layout, const Tandem__KvDest *dest, uint64_t ntokens,
                td_kvmap_t **out, char *reason, size_t reason_len)
{
    td_kvmap_t *m = calloc(1, sizeof(*m));
    if (!m || !(m->segs = calloc(layout->nsegs, sizeof(*m->segs)))) {
        free(m);
        snprintf(reason, reason_len, "out of memory");
        return TD_ERR_NOMEM;
    }
    m->layout = layout;
    m->ntokens = ntokens;
    if (td_kvsum_create(layout, &m->sum) != TD_OK) {
        snprintf(reason, reason_len, "out of memory");
        td_kvmap_destroy(m);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < dest->n_segs; i++) {
        const Tandem__SegDest *sd = dest->segs[i];
        if (sd->seg >= layout->nsegs) {
            snprintf(reason, reason_len, "kv dest: segment %u outside the layout's %u",
                     sd->seg, layout->nsegs);
            goto err_free;
        }
        td_kvmap_seg_t *s = &m->segs[sd->seg];
        const td_layout_seg_t *ls = &layout->segs[sd->seg];
        if (s->blocks) {
            snprintf(reason, reason_len, "kv dest: segment %s given twice", ls->name);
            goto err_free;
        }
        uint64_t need = ls->kind == TD_LAYOUT_PAGED ? td_layout_blocks(layout, ls, ntokens) : 1;
        if (ls->kind == TD_LAYOUT_FIXED ? sd->n_blocks != 1 : sd->n_blocks < need) {
            snprintf(reason, reason_len, "kv dest: segment %s has %zu blocks, needs %s%llu",
                     ls->name, sd->n_blocks, ls->kind == TD_LAYOUT_FIXED ? "" : "at least ",
                     (unsigned long long)need);
            goto err_free;
        }
        /* at least one element so that an empty paged list still marks "given" */
        s->blocks = malloc((sd->n_blocks ? sd->n_blocks : 1) * sizeof(uint64_t));
        if (!s->blocks) {
            snprintf(reason, reason_len, "out of memory");
            td_kvmap_destroy(m);
            return TD_ERR_NOMEM;
        }
        if (sd->n_blocks)
            memcpy(s->blocks, sd->blocks, sd->n_blocks * sizeof(uint64_t));
        s->nblocks = sd->n_blocks;
        s->pool_id = sd->pool_id;
    }
    for (uint32_t i = 0; i < layout->nsegs; i++) {
        if (!m->segs[i].blocks) {
            snprintf(reason, reason_len, "kv dest: segment %s missing", layout->segs[i].name);
            goto err_free;
        }
    }
    *out = m;
    return TD_OK;

err_free:
    td_kvmap_destroy(m);
    return TD_ERR_INVALID;
}

void
td_kvmap_destroy(td_kvmap_t *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; i < m->layout->nsegs; i++)
        free(m->segs[i].blocks);
    td_kvsum_destroy(m->sum);
    free(m->segs);
    free(m);
}

/* One pass over the pieces: checks every destination and source and counts
 * descriptors and bytes (b == NULL), or fills b's descriptors. */
static td_status_t
kvmap_walk(const td_kvmap_t *m, const td_layout_kv_t *kv, const td_engine_piece_t *pieces,
           size_t npieces, td_kvmap_batch_t *b, size_t *ndescs, uint64_t *bytes, char *reason,
           size_t reason_len)
{
    const td_layout_t *l = m->layout;
    size_t nd = 0;
    uint64_t nb = 0;
    for (size_t i = 0; i < npieces; i++) {
        const td_engine_piece_t *p = &pieces[i];
        if (p->seg >= l->nsegs || p->count == 0) {
            snprintf(reason, reason_len, "engine piece %zu: segment %u, %llu entries", i,
                     p->seg, (unsigned long long)p->count);
            return TD_ERR_INTERNAL;
        }
        const td_layout_seg_t *ls = &l->segs[p->seg];
        const td_kvmap_seg_t *s = &m->segs[p->seg];
        uint64_t eb = ls->entry_bytes;
        if (ls->kind == TD_LAYOUT_FIXED) {
            if (p->first != 0 || p->count != ls->entries) {
                snprintf(reason, reason_len, "segment %s: fixed piece [%llu, +%llu) not whole",
                         ls->name, (unsigned long long)p->first, (unsigned long long)p->count);
                return TD_ERR_INTERNAL;
            }
            if (b)
                b->descs[nd] = (td_xfer_desc_t){ .src = kv->fixed[p->seg], .pool_id = s->pool_id,
                                                 .block = s->blocks[0], .offset = 0,
                                                 .len = p->count * eb };
            nd++;
            nb += p->count * eb;
            continue;
        }
        uint64_t be = l->block_entries;
        uint64_t last = p->first + p->count - 1;
        if (last < p->first || last / be >= s->nblocks || last / be >= kv->nblocks[p->seg]) {
            snprintf(reason, reason_len,
                     "segment %s: entries [%llu, %llu] outside the %llu blocks of the kv dest "
                     "or the %llu of the request", ls->name, (unsigned long long)p->first,
                     (unsigned long long)last, (unsigned long long)s->nblocks,
                     (unsigned long long)kv->nblocks[p->seg]);
            return TD_ERR_RANGE;
        }
        for (uint64_t e = p->first; e <= last;) {
            uint64_t in_block = be - e % be;
            uint64_t n = last - e + 1 < in_block ? last - e + 1 : in_block;
            if (b)
                b->descs[nd] = (td_xfer_desc_t){ .src = td_layout_kv_entry(kv, p->seg, e),
                                                 .pool_id = s->pool_id,
                                                 .block = s->blocks[e / be],
                                                 .offset = (e % be) * eb, .len = n * eb };
            nd++;
            nb += n * eb;
            e += n;
        }
    }
    *ndescs = nd;
    *bytes = nb;
    return TD_OK;
}

/* Add a batch's pieces to the checksum, from the bytes the puts send (in
 * the request's KV memory), one block run at a time. A refusal sticks in the
 * sum and is reported by td_kvmap_sum. */
void
td_kvmap_sum_add(td_kvmap_t *m, const td_layout_kv_t *kv, const td_engine_piece_t *pieces,
                 size_t npieces)
{
    uint64_t be = m->layout->block_entries;

    for (size_t i = 0; i < npieces; i++) {
        const td_engine_piece_t *p = &pieces[i];
        if (m->layout->segs[p->seg].kind == TD_LAYOUT_FIXED) {
            (void)td_kvsum_update(m->sum, p->seg, p->first, p->count, kv->fixed[p->seg]);
            continue;
        }
        for (uint64_t e = p->first; e < p->first + p->count;) {
            uint64_t n = be - e % be;
            if (n > p->first + p->count - e)
                n = p->first + p->count - e;
            (void)td_kvsum_update(m->sum, p->seg, e, n, td_layout_kv_entry(kv, p->seg, e));
            e += n;
        }
    }
}

td_status_t
td_kvmap_batch_create(td_kvmap_t *m, const td_layout_kv_t *kv,
                      const td_engine_piece_t *pieces, size_t npieces, td_kvmap_batch_t **out,
                      char *reason, size_t reason_len)
{
    size_t nd;
    uint64_t nb;
    td_status_t st = kvmap_walk(m, kv, pieces, npieces, NULL, &nd, &nb, reason, reason_len);
    if (st != TD_OK)
        return st;
    td_kvmap_batch_t *b = malloc(sizeof(*b) + nd * sizeof(td_xfer_desc_t));
    if (!b) {
        snprintf(reason, reason_len, "out of memory for %zu descriptors", nd);
        return TD_ERR_NOMEM;
    }
    b->descs = (td_xfer_desc_t *)(b + 1);
    b->user = NULL;
    st = kvmap_walk(m, kv, pieces, npieces, b, &b->ndescs, &b->bytes, reason, reason_len);
    if (st != TD_OK) {
        free(b);
        return st;
    }
    *out = b;
    return TD_OK;
}

void
td_kvmap_batch_free(td_kvmap_batch_t *b)
{
    free(b);
}

td_status_t
td_kvmap_sum(const td_kvmap_t *m, uint64_t *out, char *reason, size_t reason_len)
{
    return td_kvsum_final(m->sum, m->ntokens, out, reason, reason_len);
}
