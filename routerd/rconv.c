/* routerd/rconv.c — the kept conversation states of the decode ranks, by
 * the hash of their sequence's whole blocks and by request id (two tables of
 * base/hmap.h; rconv.h). */
#include "rconv.h"

#include <stdlib.h>
#include <string.h>

#include "chainhash.h"
#include "hmap.h"

typedef struct ent_s {
    struct ent_s *prev, *next;     /* age: oldest first */
    void *rank;
    uint64_t id;
    uint64_t key;                  /* the chain hash of the whole blocks (the seed: none) */
    uint64_t n;                    /* tokens */
    uint32_t ntail;                /* n % TD_RCONV_BLOCK tokens after the whole blocks */
    int32_t tail[TD_RCONV_BLOCK];
} ent_t;

struct td_rconv_s {
    td_hmap_t *bykey;              /* key -> ent_t *, several per key, oldest first */
    td_hmap_t *byid;               /* id -> ent_t * */
    ent_t *oldest, *newest;
    size_t n, max;
};

td_status_t
td_rconv_create(size_t max, td_rconv_t **out)
{
    td_rconv_t *t = calloc(1, sizeof(*t));

    if (t == NULL || max == 0) {
        free(t);
        return max == 0 ? TD_ERR_INVALID : TD_ERR_NOMEM;
    }
    t->max = max;
    if (td_hmap_create(0, &t->bykey) != TD_OK || td_hmap_create(0, &t->byid) != TD_OK) {
        td_rconv_destroy(t);
        return TD_ERR_NOMEM;
    }
    *out = t;
    return TD_OK;
}

void
td_rconv_destroy(td_rconv_t *t)
{
    if (t == NULL)
        return;
    for (ent_t *e = t->oldest, *next; e != NULL; e = next) {
        next = e->next;
        free(e);
    }
    td_hmap_destroy(t->bykey);
    td_hmap_destroy(t->byid);
    free(t);
}

static void
ent_remove(td_rconv_t *t, ent_t *e)
{
    td_hmap_del_pair(t->bykey, e->key, (uintptr_t)e);
    td_hmap_del(t->byid, e->id);
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        t->oldest = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    else
        t->newest = e->prev;
    t->n--;
    free(e);
}

static ent_t *
find_id(const td_rconv_t *t, uint64_t id)
{
    uint64_t v = td_hmap_get(t->byid, id);

    return v != TD_HMAP_NONE ? (ent_t *)(uintptr_t)v : NULL;
}

td_status_t
td_rconv_add(td_rconv_t *t, void *rank, uint64_t id, uint64_t seed, const int32_t *tokens,
             uint64_t n)
{
    ent_t *e, *old;
    uint64_t key = seed, whole = n / TD_RCONV_BLOCK * TD_RCONV_BLOCK;

    if (n == 0)
        return TD_ERR_INVALID;
    e = calloc(1, sizeof(*e));
    /* room for one more first: the insertions below cannot fail */
    if (e == NULL || td_hmap_reserve(t->bykey, t->n + 1) != TD_OK ||
        td_hmap_reserve(t->byid, t->n + 1) != TD_OK) {
        free(e);
        return TD_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < whole; i += TD_RCONV_BLOCK)
        key = td_chain_hash(key, tokens + i, TD_RCONV_BLOCK);
    e->rank = rank;
    e->id = id;
    e->key = key;
    e->n = n;
    e->ntail = (uint32_t)(n - whole);
    memcpy(e->tail, tokens + whole, e->ntail * sizeof(*tokens));
    if ((old = find_id(t, id)) != NULL)
        ent_remove(t, old);
    if (t->n >= t->max)
        ent_remove(t, t->oldest);
    (void)td_hmap_add(t->bykey, key, (uintptr_t)e);
    (void)td_hmap_put(t->byid, id, (uintptr_t)e);
    e->prev = t->newest;
    if (t->newest != NULL)
        t->newest->next = e;
    else
        t->oldest = e;
    t->newest = e;
    t->n++;
    return TD_OK;
}

bool
td_rconv_find(td_rconv_t *t, td_rcache_prompt_t *p, bool (*usable)(void *rank, void *arg),
              void *arg, td_rconv_hit_t *out)
{
    size_t nh = 0;
    const uint64_t *h;

    if (t->n == 0 || p->ntokens < 2)
        return false;
    h = td_rcache_prompt_hashes(p, TD_RCONV_BLOCK, &nh);
    /* the longest first: k whole blocks, then fewer than a block more */
    for (size_t k = (p->ntokens - 1) / TD_RCONV_BLOCK;; k--) {
        uint64_t key = k == 0 ? p->seed : k <= nh ? h[k - 1] : 0;
        const ent_t *best = NULL;
        size_t pos = 0;
        uint64_t v;

        /* oldest first: of equal lengths the newest wins */
        while (key != 0 && (v = td_hmap_each(t->bykey, key, &pos)) != TD_HMAP_NONE) {
            const ent_t *e = (const ent_t *)(uintptr_t)v;
            uint64_t base = (uint64_t)k * TD_RCONV_BLOCK;
            if (e->n < base || e->n >= p->ntokens ||
                e->n - base != e->ntail || (best != NULL && e->n < best->n) ||
                memcmp(e->tail, p->tokens + base, e->ntail * sizeof(int32_t)) != 0 ||
                (usable != NULL && !usable(e->rank, arg)))
                continue;
            best = e;
        }
        if (best != NULL) {
            *out = (td_rconv_hit_t){ best->rank, best->id, best->n };
            return true;
        }
        if (k == 0)
            return false;
    }
}

void
td_rconv_remove(td_rconv_t *t, uint64_t id)
{
    ent_t *e = find_id(t, id);

    if (e != NULL)
        ent_remove(t, e);
}

void
td_rconv_remove_rank(td_rconv_t *t, void *rank)
{
    for (ent_t *e = t->oldest, *next; e != NULL; e = next) {
        next = e->next;
        if (e->rank == rank)
            ent_remove(t, e);
    }
}

size_t
td_rconv_count(const td_rconv_t *t)
{
    return t->n;
}
