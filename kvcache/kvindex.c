/* kvcache/kvindex.c — the tier's index: the entries (a hash held by the host
 * tier, an SSD file or both) by hash (a base/hmap.h table), the host LRU of
 * entries and the SSD LRU of files, and the events (the hashes that entered
 * or left both tiers since the last drain, by hash too). Everything here runs
 * under mu (kvtier_int.h) but init and free. */
#include "kvtier_int.h"

#include <inttypes.h>
#include <stdlib.h>

#include "clock.h"
#include "log.h"

/* ---- Events ------------------------------------------------------------------ */
struct kvevnode {               /* a hash's net change since the last drain */
    uint64_t hash;              /* its key in evmap */
    int net;                    /* +1 added, -1 removed */
    kvevnode_t *prev, *next;
};

static void
ev_unlink(td_kvtier_t *kt, kvevnode_t *ev)
{
    td_hmap_del_pair(kt->evmap, ev->hash, (uintptr_t)ev);
    if (ev->prev != NULL) ev->prev->next = ev->next; else kt->ev_head = ev->next;
    if (ev->next != NULL) ev->next->prev = ev->prev; else kt->ev_tail = ev->prev;
    free(ev);
}

static void
ev_push(td_kvtier_t *kt, uint64_t hash, int d)
{
    kvevnode_t *ev = kvmap_get(kt->evmap, hash);

    if (ev != NULL) {
        ev->net += d;
        if (ev->net == 0)
            ev_unlink(kt, ev);
        return;
    }
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL || td_hmap_add(kt->evmap, hash, (uintptr_t)ev) != TD_OK) {
        td_log_every(TD_LOG_ERROR, 10000, "kvtier: block %016" PRIx64 ": event lost: out of memory", hash);
        free(ev);
        return;
    }
    ev->hash = hash;
    ev->net = d;
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
            added[na++] = ev->hash;
        } else if (ev->net < 0 && nr < removed_cap) {
            removed[nr++] = ev->hash;
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
    size_t k = 0, pos = 0;
    uint64_t hash, v;

    kvlock_lock(&kt->mu);
    if (td_hmap_count(kt->index) > cap) {
        *n = td_hmap_count(kt->index);
        kvlock_unlock(&kt->mu);
        return TD_ERR_TOO_BIG;
    }
    while (td_hmap_next(kt->index, &pos, &hash, &v))
        out[k++] = hash;
    ev_clear(kt);
    kvlock_unlock(&kt->mu);
    *n = k;
    return TD_OK;
}

/* ---- Entries ----------------------------------------------------------------- */
td_status_t
kvindex_init(td_kvtier_t *kt)
{
    td_status_t st = td_hmap_create(KVMAP_HINT, &kt->index);

    return st == TD_OK ? td_hmap_create(KVMAP_HINT, &kt->evmap) : st;
}

void
kvindex_free(td_kvtier_t *kt)
{
    size_t pos = 0;
    uint64_t hash, v;

    while (kt->index != NULL && td_hmap_next(kt->index, &pos, &hash, &v)) {
        kvent_t *e = (kvent_t *)(uintptr_t)v;

        kvrec_blob_unref(e->host);
        free(e);
    }
    if (kt->evmap != NULL)
        ev_clear(kt);
    td_hmap_destroy(kt->index);
    td_hmap_destroy(kt->evmap);
    kt->index = kt->evmap = NULL;
}

kvent_t *
kvindex_find(td_kvtier_t *kt, uint64_t hash)
{
    return kvmap_get(kt->index, hash);
}

kvent_t *
kvindex_get(td_kvtier_t *kt, uint64_t hash)
{
    kvent_t *e = kvindex_find(kt, hash);

    if (e != NULL)
        return e;
    e = calloc(1, sizeof(*e));
    if (e == NULL || td_hmap_add(kt->index, hash, (uintptr_t)e) != TD_OK) {
        free(e);
        return NULL;
    }
    e->hash = hash;
    ev_push(kt, hash, +1);
    return e;
}

void
kvindex_release(td_kvtier_t *kt, kvent_t *e)
{
    if (e->host != NULL || e->file != NULL)
        return;
    td_hmap_del_pair(kt->index, e->hash, (uintptr_t)e);
    ev_push(kt, e->hash, -1);
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
