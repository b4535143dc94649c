/* engine/kvsum.c — the KV checksum (engine/kvsum.h): XXH3-64 per segment,
 * over memory (td_kvsum_of) or piece by piece (td_kvsum_t). */
#include "kvsum.h"

#include <stdio.h>
#include <stdlib.h>

#include <xxhash.h>

/* The segment digests as 8 little-endian bytes each, hashed once more. */
static uint64_t
kvsum_combine(const uint64_t *digest, uint32_t nsegs, uint8_t *buf)
{
    for (uint32_t s = 0; s < nsegs; s++)
        for (int k = 0; k < 8; k++)
            buf[8 * (size_t)s + k] = (uint8_t)(digest[s] >> (8 * k));
    return XXH3_64bits(buf, 8 * (size_t)nsegs);
}

/* ---- Over memory -------------------------------------------------------------- */

/* Digest of paged segment s's first `entries` entries, block by block. */
static td_status_t
kvsum_paged(const td_layout_kv_t *kv, uint32_t s, uint64_t entries, XXH3_state_t *st,
            uint64_t *out)
{
    const td_layout_t *l = kv->layout;
    uint64_t be = l->block_entries, eb = l->segs[s].entry_bytes;
    uint64_t nb = (entries + be - 1) / be;

    if (nb > kv->nblocks[s])
        return TD_ERR_RANGE;
    (void)XXH3_64bits_reset(st);
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t n = entries - b * be < be ? entries - b * be : be;

        (void)XXH3_64bits_update(st, kv->blocks[s][b], (size_t)(n * eb));
    }
    *out = XXH3_64bits_digest(st);
    return TD_OK;
}

td_status_t
td_kvsum_of(const td_layout_kv_t *kv, uint64_t ntokens, uint64_t *out)
{
    const td_layout_t *l = kv->layout;
    uint64_t *digest = malloc((l->nsegs ? l->nsegs : 1) * sizeof(*digest));
    uint8_t *buf = malloc((l->nsegs ? l->nsegs : 1) * 8);
    XXH3_state_t *st = XXH3_createState();
    td_status_t status = TD_ERR_NOMEM;

    if (digest == NULL || buf == NULL || st == NULL)
        goto out_free;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];

        if (seg->kind == TD_LAYOUT_FIXED) {
            digest[s] = XXH3_64bits(kv->fixed[s], (size_t)seg->entries * seg->entry_bytes);
            continue;
        }
        status = kvsum_paged(kv, s, td_layout_entries(seg, ntokens), st, &digest[s]);
        if (status != TD_OK)
            goto out_free;
    }
    *out = kvsum_combine(digest, l->nsegs, buf);
    status = TD_OK;

out_free:
    XXH3_freeState(st);
    free(buf);
    free(digest);
    return status;
}

/* ---- Piece by piece ------------------------------------------------------------- */

struct td_kvsum_s {
    const td_layout_t *layout;
    XXH3_state_t **state;   /* [nsegs] paged: the running hash; fixed: NULL */
    uint64_t *digest;       /* [nsegs] fixed: digest of the slot given last */
    uint64_t *entries;      /* [nsegs] paged: entries added; fixed: times given */
    int64_t refused;        /* the first refused update's segment, or -1 */
    uint64_t refused_first, refused_count;
};

td_status_t
td_kvsum_create(const td_layout_t *layout, td_kvsum_t **out)
{
    uint32_t n = layout->nsegs ? layout->nsegs : 1;
    td_kvsum_t *s = calloc(1, sizeof(*s));

    if (s == NULL)
        return TD_ERR_NOMEM;
    s->layout = layout;
    s->refused = -1;
    s->state = calloc(n, sizeof(*s->state));
    s->digest = calloc(n, sizeof(*s->digest));
    s->entries = calloc(n, sizeof(*s->entries));
    if (s->state == NULL || s->digest == NULL || s->entries == NULL)
        goto err_destroy;
    for (uint32_t i = 0; i < layout->nsegs; i++) {
        if (layout->segs[i].kind != TD_LAYOUT_PAGED)
            continue;
        s->state[i] = XXH3_createState();
        if (s->state[i] == NULL)
            goto err_destroy;
        (void)XXH3_64bits_reset(s->state[i]);
    }
    *out = s;
    return TD_OK;

err_destroy:
    td_kvsum_destroy(s);
    return TD_ERR_NOMEM;
}

void
td_kvsum_destroy(td_kvsum_t *s)
{
    if (s == NULL)
        return;
    for (uint32_t i = 0; s->state != NULL && i < s->layout->nsegs; i++)
        XXH3_freeState(s->state[i]);
    free(s->state);
    free(s->digest);
    free(s->entries);
    free(s);
}

td_status_t
td_kvsum_update(td_kvsum_t *s, uint32_t seg, uint64_t first, uint64_t count, const void *data)
{
    const td_layout_t *l = s->layout;
    const td_layout_seg_t *ls = seg < l->nsegs ? &l->segs[seg] : NULL;
    int fits;

    if (ls == NULL || count == 0)
        fits = 0;
    else if (ls->kind == TD_LAYOUT_FIXED)
        fits = first == 0 && count == ls->entries;
    else
        fits = first == s->entries[seg] && count <= (SIZE_MAX - 1) / ls->entry_bytes;
    if (!fits || s->refused >= 0) {
        if (s->refused < 0) {
            s->refused = seg;
            s->refused_first = first;
            s->refused_count = count;
        }
        return TD_ERR_RANGE;
    }
    if (ls->kind == TD_LAYOUT_FIXED)
        s->digest[seg] = XXH3_64bits(data, (size_t)count * ls->entry_bytes);
    else
        (void)XXH3_64bits_update(s->state[seg], data, (size_t)(count * ls->entry_bytes));
    s->entries[seg] += ls->kind == TD_LAYOUT_FIXED ? 1 : count;
    return TD_OK;
}

td_status_t
td_kvsum_final(const td_kvsum_t *s, uint64_t ntokens, uint64_t *out, char *why, size_t why_len)
{
    const td_layout_t *l = s->layout;
    uint64_t *digest;
    uint8_t *buf;

    if (s->refused >= 0) {
        if ((uint64_t)s->refused < l->nsegs)
            snprintf(why, why_len, "segment %s: entries [%llu, +%llu) out of order (%llu in)",
                     l->segs[s->refused].name, (unsigned long long)s->refused_first,
                     (unsigned long long)s->refused_count,
                     (unsigned long long)s->entries[s->refused]);
        else
            snprintf(why, why_len, "segment %lld outside the layout's %u",
                     (long long)s->refused, l->nsegs);
        return TD_ERR_RANGE;
    }
    for (uint32_t i = 0; i < l->nsegs; i++) {
        const td_layout_seg_t *ls = &l->segs[i];
        uint64_t want = ls->kind == TD_LAYOUT_PAGED ? td_layout_entries(ls, ntokens) : 1;

        if (ls->kind == TD_LAYOUT_PAGED ? s->entries[i] != want : s->entries[i] == 0) {
            if (ls->kind == TD_LAYOUT_PAGED)
                snprintf(why, why_len, "segment %s: %llu entries for %llu tokens, want %llu",
                         ls->name, (unsigned long long)s->entries[i],
                         (unsigned long long)ntokens, (unsigned long long)want);
            else
                snprintf(why, why_len, "segment %s: never given", ls->name);
            return TD_ERR_RANGE;
        }
    }
    digest = malloc((l->nsegs ? l->nsegs : 1) * sizeof(*digest));
    buf = malloc((l->nsegs ? l->nsegs : 1) * 8);
    if (digest == NULL || buf == NULL) {
        free(digest);
        free(buf);
        snprintf(why, why_len, "out of memory");
        return TD_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < l->nsegs; i++)
        digest[i] = l->segs[i].kind == TD_LAYOUT_PAGED ? XXH3_64bits_digest(s->state[i])
                                                       : s->digest[i];
    *out = kvsum_combine(digest, l->nsegs, buf);
    free(buf);
    free(digest);
    return TD_OK;
}
