/* routerd/rconv.c — the kept conversation states of the decode ranks, by
 * the hash of their sequence's whole blocks and by request id (rconv.h). */
#include "rconv.h"

#include <stdlib.h>
#include <string.h>

#include "chainhash.h"

typedef struct ent_s {
    struct ent_s *knext, *inext;   /* chains: by key, by id */
    struct ent_s *prev, *next;     /* age: oldest first */
    void *rank;
    uint64_t id;
    uint64_t key;                  /* the chain hash of the whole blocks (the seed: none) */
    uint64_t n;                    /* tokens */
    uint32_t ntail;                /* n % TD_RCONV_BLOCK tokens after the whole blocks */
    int32_t tail[TD_RCONV_BLOCK];
} ent_t;

struct td_rconv_s {
    ent_t **bykey, **byid;         /* [nb] chains */
    size_t nb;                     /* a power of two */
    ent_t *oldest, *newest;
    size_t n, max;
};

static size_t
bucket(const td_rconv_t *t, uint64_t h)
{
    return (size_t)((h * 0x9e3779b97f4a7c15ull) >> 17) & (t->nb - 1);
}

td_status_t
td_rconv_create(size_t max, td_rconv_t **out)
{
    td_rconv_t *t = calloc(1, sizeof(*t));

    if (t == NULL || max == 0) {
        free(t);
        return max == 0 ? TD_ERR_INVALID : TD_ERR_NOMEM;
    }
    t->max = max;
    t->nb = 64;
    while (t->nb < max && t->nb < ((size_t)1 << 24))
        t->nb <<= 1;
    t->bykey = calloc(t->nb, sizeof(*t->bykey));
    t->byid = calloc(t->nb, sizeof(*t->byid));
    if (t->bykey == NULL || t->byid == NULL) {
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
    free(t->bykey);
    free(t->byid);
    free(t);
}

static void
unchain(ent_t **head, ent_t *e, size_t off)
{
    for (ent_t **pp = head; *pp != NULL; pp = (ent_t **)((char *)*pp + off))
        if (*pp == e) {
            *pp = *(ent_t **)((char *)e + off);
            return;
        }
}

static void
ent_remove(td_rconv_t *t, ent_t *e)
{
    unchain(&t->bykey[bucket(t, e->key)], e, offsetof(ent_t, knext));
    unchain(&t->byid[bucket(t, e->id)], e, offsetof(ent_t, inext));
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
    for (ent_t *e = t->byid[bucket(t, id)]; e != NULL; e = e->inext)
        if (e->id == id)
            return e;
    return NULL;
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
    if (e == NULL)
        return TD_ERR_NOMEM;
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
    e->knext = t->bykey[bucket(t, key)];
    t->bykey[bucket(t, key)] = e;
    e->inext = t->byid[bucket(t, id)];
    t->byid[bucket(t, id)] = e;
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

        for (const ent_t *e = key ? t->bykey[bucket(t, key)] : NULL; e != NULL; e = e->knext) {
            uint64_t base = (uint64_t)k * TD_RCONV_BLOCK;
            if (e->key != key || e->n < base || e->n >= p->ntokens ||
                e->n - base != e->ntail || (best != NULL && e->n <= best->n) ||
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
