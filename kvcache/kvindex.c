/* kvcache/kvindex.c — the tier's index: the block map (hash -> entry, an
 * intrusive chained map also used for the events and the read-ahead's
 * blocks), the entries (a hash held by the host tier, an SSD file or both),
 * the host LRU of entries and the SSD LRU of files, and the events (the
 * hashes that entered or left both tiers since the last drain). Everything
 * here runs under mu (kvtier_int.h) but init and free. */
#include "kvtier_int.h"

#include <inttypes.h>
#include <stdlib.h>

#include "clock.h"
#include "log.h"

/* ---- The block map ----------------------------------------------------------- */
static size_t
map_slot(const kvbmap_t *m, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (m->nb - 1);
}

td_status_t
kvbmap_init(kvbmap_t *m)
{
    m->nb = 1024;
    m->n = 0;
    m->b = calloc(m->nb, sizeof(*m->b));
    return m->b != NULL ? TD_OK : TD_ERR_NOMEM;
}

void
kvbmap_free(kvbmap_t *m)
{
    free(m->b);
    m->b = NULL;
    m->nb = m->n = 0;
}

kvbnode_t *
kvbmap_find(const kvbmap_t *m, uint64_t key)
{
    for (kvbnode_t *n = m->b[map_slot(m, key)]; n != NULL; n = n->next)
        if (n->key == key)
            return n;
    return NULL;
}

/* Grows when full; a failed growth only lengthens the chains. */
void
kvbmap_insert(kvbmap_t *m, kvbnode_t *node)
{
    if (m->n >= m->nb) {
        size_t nb = m->nb * 2;
        kvbnode_t **b = calloc(nb, sizeof(*b));

        if (b != NULL) {
            kvbmap_t grown = { b, nb, 0 };

            for (size_t i = 0; i < m->nb; i++)
                for (kvbnode_t *n = m->b[i], *next; n != NULL; n = next) {
                    size_t s = map_slot(&grown, n->key);

                    next = n->next;
                    n->next = b[s];
                    b[s] = n;
                }
            free(m->b);
            m->b = b;
            m->nb = nb;
        }
    }
    size_t s = map_slot(m, node->key);

    node->next = m->b[s];
    m->b[s] = node;
    m->n++;
}

void
kvbmap_remove(kvbmap_t *m, kvbnode_t *node)
{
    for (kvbnode_t **p = &m->b[map_slot(m, node->key)]; *p != NULL; p = &(*p)->next)
        if (*p == node) {
            *p = node->next;
            m->n--;
            return;
        }
}

/* ---- Events ------------------------------------------------------------------ */
struct kvevnode {               /* a hash's net change since the last drain */
    kvbnode_t node;
    int net;                    /* +1 added, -1 removed */
    kvevnode_t *prev, *next;
};

static void
ev_unlink(td_kvtier_t *kt, kvevnode_t *ev)
{
    kvbmap_remove(&kt->evmap, &ev->node);
    if (ev->prev != NULL) ev->prev->next = ev->next; else kt->ev_head = ev->next;
    if (ev->next != NULL) ev->next->prev = ev->prev; else kt->ev_tail = ev->prev;
    free(ev);
}

static void
ev_push(td_kvtier_t *kt, uint64_t hash, int d)
{
    kvevnode_t *ev = (kvevnode_t *)kvbmap_find(&kt->evmap, hash);

    if (ev != NULL) {
        ev->net += d;
        if (ev->net == 0)
            ev_unlink(kt, ev);
        return;
    }
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        td_log_every(TD_LOG_ERROR, 10000, "kvtier: block %016" PRIx64 ": event lost: out of memory", hash);
        return;
    }
    ev->node.key = hash;
    ev->net = d;
    kvbmap_insert(&kt->evmap, &ev->node);
    ev->prev = kt->ev_tail;
    if (kt->ev_tail != NULL) kt->ev_tail->next = ev; else kt->ev_head = ev;
    kt->ev_tail = ev;
}

static void
ev_clear(td_kvtier_t *kt)
{
    while (kt->ev_head != NULL)
        ev_unlink(kt, kt->ev_head);
}

td_status_t
td_kvtier_drain_events(td_kvtier_t *kt, uint64_t *added, size_t added_cap, size_t *n_added,
                       uint64_t *removed, size_t removed_cap, size_t *n_removed)
{
    size_t na = 0, nr = 0;
    td_status_t st = TD_OK;

    kvlock_lock(&kt->mu);
    for (kvevnode_t *ev = kt->ev_head, *next; ev != NULL; ev = next) {
        next = ev->next;
        if (ev->net > 0 && na < added_cap) {
            added[na++] = ev->node.key;
        } else if (ev->net < 0 && nr < removed_cap) {
            removed[nr++] = ev->node.key;
        } else {
            st = TD_INPROGRESS;
            continue;
        }
        ev_unlink(kt, ev);
    }
    kvlock_unlock(&kt->mu);
    *n_added = na;
    *n_removed = nr;
    return st;
}

td_status_t
td_kvtier_snapshot(td_kvtier_t *kt, uint64_t *out, size_t cap, size_t *n)
{
    size_t k = 0;

    kvlock_lock(&kt->mu);
    if (kt->index.n > cap) {
        *n = kt->index.n;
        kvlock_unlock(&kt->mu);
        return TD_ERR_TOO_BIG;
    }
    for (size_t i = 0; i < kt->index.nb; i++)
        for (kvbnode_t *m = kt->index.b[i]; m != NULL; m = m->next)
            out[k++] = m->key;
    ev_clear(kt);
    kvlock_unlock(&kt->mu);
    *n = k;
    return TD_OK;
}

/* ---- Entries ----------------------------------------------------------------- */
td_status_t
kvindex_init(td_kvtier_t *kt)
{
    td_status_t st = kvbmap_init(&kt->index);

    return st == TD_OK ? kvbmap_init(&kt->evmap) : st;
}

void
kvindex_free(td_kvtier_t *kt)
{
    for (size_t i = 0; kt->index.b != NULL && i < kt->index.nb; i++)
        for (kvbnode_t *n = kt->index.b[i], *next; n != NULL; n = next) {
            kvent_t *e = (kvent_t *)n;

            next = n->next;
            kvrec_blob_unref(e->host);
            free(e);
        }
    if (kt->evmap.b != NULL)
        ev_clear(kt);
    kvbmap_free(&kt->index);
    kvbmap_free(&kt->evmap);
}

kvent_t *
kvindex_find(td_kvtier_t *kt, uint64_t hash)
{
    return (kvent_t *)kvbmap_find(&kt->index, hash);
}

kvent_t *
kvindex_get(td_kvtier_t *kt, uint64_t hash)
{
    kvent_t *e = kvindex_find(kt, hash);

    if (e != NULL)
        return e;
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->node.key = hash;
    kvbmap_insert(&kt->index, &e->node);
    ev_push(kt, hash, +1);
    return e;
}

void
kvindex_release(td_kvtier_t *kt, kvent_t *e)
{
    if (e->host != NULL || e->file != NULL)
        return;
    kvbmap_remove(&kt->index, &e->node);
    ev_push(kt, e->node.key, -1);
    free(e);
}

kvwhere_t
kvindex_where(const kvent_t *e)
{
    return (kvwhere_t){ e->file->name, e->file->gen, e->off, e->payload, e->snapshot, e->g };
}

unsigned
td_kvtier_has(td_kvtier_t *kt, uint64_t hash)
{
    unsigned tiers = 0;

    kvlock_lock(&kt->mu);
    kvent_t *e = kvindex_find(kt, hash);

    if (e != NULL)
        tiers = (e->host != NULL ? TD_KVTIER_HOST : 0) | (e->file != NULL ? TD_KVTIER_SSD : 0);
    kvlock_unlock(&kt->mu);
    return tiers;
}

/* ---- The LRU lists ----------------------------------------------------------- */
void
kvindex_lru_append(kvlru_t *l, kvent_t *e)
{
    e->hprev = l->tail;
    e->hnext = NULL;
    if (l->tail != NULL)
        l->tail->hnext = e;
    else
        l->head = e;
    l->tail = e;
}

void
kvindex_lru_unlink(kvlru_t *l, kvent_t *e)
{
    if (e->hprev != NULL)
        e->hprev->hnext = e->hnext;
    else
        l->head = e->hnext;
    if (e->hnext != NULL)
        e->hnext->hprev = e->hprev;
    else
        l->tail = e->hprev;
    e->hprev = e->hnext = NULL;
}

void
kvindex_lru_touch(kvlru_t *l, kvent_t *e)
{
    if (l->tail != e) {
        kvindex_lru_unlink(l, e);
        kvindex_lru_append(l, e);
    }
}

static void
flru_append(kvflru_t *l, kvfile_t *f)
{
    f->prev = l->tail;
    f->next = NULL;
    if (l->tail != NULL)
        l->tail->next = f;
    else
        l->head = f;
    l->tail = f;
}

static void
flru_unlink(kvflru_t *l, kvfile_t *f)
{
    if (f->prev != NULL)
        f->prev->next = f->next;
    else
        l->head = f->next;
    if (f->next != NULL)
        f->next->prev = f->prev;
    else
        l->tail = f->prev;
    f->prev = f->next = NULL;
}

void
kvindex_flru_touch(kvflru_t *l, kvfile_t *f)
{
    if (l->tail != f) {
        flru_unlink(l, f);
        flru_append(l, f);
    }
}

/* ---- Files ------------------------------------------------------------------- */
void
kvindex_file_add(td_kvtier_t *kt, kvfile_t *f, const kvtable_t *t)
{
    f->gen = ++kt->gen;
    f->mtime_ns = td_clock_ns();
    flru_append(&kt->ssd_lru, f);
    kt->st.ssd_bytes += f->bytes;
    kt->st.ssd_files++;
    for (uint32_t i = 0; i < f->nrec; i++) {
        kvent_t *e = kvindex_get(kt, f->hashes[i]);

        if (e == NULL || e->file != NULL)
            continue;   /* out of memory, or held by another file: that one serves it */
        e->file = f;
        e->off = t->offs[i];
        e->g = t->gs[i];
        e->payload = t->pays[i];
        e->snapshot = t->snaps[i];
        kt->st.ssd_records++;
    }
}

void
kvindex_file_remove(td_kvtier_t *kt, kvfile_t *f)
{
    flru_unlink(&kt->ssd_lru, f);
    kt->st.ssd_bytes -= f->bytes;
    kt->st.ssd_files--;
    for (uint32_t i = 0; i < f->nrec; i++) {
        kvent_t *e = kvindex_find(kt, f->hashes[i]);

        if (e == NULL || e->file != f)
            continue;
        e->file = NULL;
        kt->st.ssd_records--;
        kvindex_release(kt, e);
    }
}
