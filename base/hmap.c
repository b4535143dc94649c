/* base/hmap.c — the hash table of hmap.h: growth, insertion, backward-shift
 * deletion, clearing and the walk over every entry. */
#include "hmap.h"

#include <stdlib.h>
#include <string.h>

#define HMAP_MIN_CAP 16u

/* The capacity that holds n entries at most half full: 0 for none, else a
 * power of two >= HMAP_MIN_CAP; 0 too when it would not fit a size_t. */
static size_t
hmap_cap_for(size_t n)
{
    size_t cap = HMAP_MIN_CAP;

    if (n == 0)
        return 0;
    if (n > SIZE_MAX / 2 / sizeof(td_hmap_slot_t))
        return 0;
    while (cap / 2 < n)
        cap *= 2;
    return cap;
}

static size_t
hmap_cap(const td_hmap_t *m)
{
    return m->slots != NULL ? m->mask + 1 : 0;
}

/* An array of cap empty slots, or NULL. */
static td_hmap_slot_t *
hmap_slots_new(size_t cap)
{
    td_hmap_slot_t *s = malloc(cap * sizeof(*s));

    if (s != NULL)
        memset(s, 0xff, cap * sizeof(*s));   /* every val TD_HMAP_NONE */
    return s;
}

/* The first empty slot of key's probe run. The table is at most half full,
 * so there is one. */
static size_t
hmap_free_slot(const td_hmap_t *m, uint64_t key)
{
    size_t i = td_hmap_home_(m, key);

    while (m->slots[i].val != TD_HMAP_NONE)
        i = (i + 1) & m->mask;
    return i;
}

/* Move every entry into an array of cap slots (cap holds them at most half
 * full). The old array is read from just after an empty slot, so the
 * entries of one key keep the order they were added in. */
static td_status_t
hmap_resize(td_hmap_t *m, size_t cap)
{
    td_hmap_slot_t *old = m->slots, *s = hmap_slots_new(cap);
    size_t oldcap = hmap_cap(m), start = 0;

    if (s == NULL)
        return TD_ERR_NOMEM;
    while (start < oldcap && old[start].val != TD_HMAP_NONE)
        start++;
    m->slots = s;
    m->mask = cap - 1;
    m->shift = 64 - (unsigned)__builtin_ctzll(cap);
    for (size_t k = 1; k <= oldcap; k++) {
        const td_hmap_slot_t *o = &old[(start + k) & (oldcap - 1)];

        if (o->val != TD_HMAP_NONE)
            m->slots[hmap_free_slot(m, o->key)] = *o;
    }
    free(old);
    return TD_OK;
}

td_status_t
td_hmap_reserve(td_hmap_t *m, size_t n)
{
    size_t cap = hmap_cap_for(n);

    if (n > 0 && cap == 0)
        return TD_ERR_NOMEM;   /* more than memory can hold */
    if (cap <= hmap_cap(m))
        return TD_OK;
    return hmap_resize(m, cap);
}

td_status_t
td_hmap_create(size_t hint, td_hmap_t **out)
{
    td_hmap_t *m = calloc(1, sizeof(*m));
    td_status_t st;

    if (m == NULL)
        return TD_ERR_NOMEM;
    if ((st = td_hmap_reserve(m, hint)) != TD_OK) {
        free(m);
        return st;
    }
    m->base = hmap_cap(m);
    *out = m;
    return TD_OK;
}

void
td_hmap_destroy(td_hmap_t *m)
{
    if (m == NULL)
        return;
    free(m->slots);
    free(m);
}

/* Room for one entry more: the capacity doubles past half full. */
static td_status_t
hmap_room(td_hmap_t *m)
{
    size_t cap = hmap_cap(m);

    if ((m->n + 1) <= cap / 2)
        return TD_OK;
    if (cap == 0)
        return hmap_resize(m, HMAP_MIN_CAP);
    if (cap > SIZE_MAX / 2 / sizeof(td_hmap_slot_t))
        return TD_ERR_NOMEM;
    return hmap_resize(m, cap * 2);
}

td_status_t
td_hmap_add(td_hmap_t *m, uint64_t key, uint64_t val)
{
    td_status_t st;

    if (val == TD_HMAP_NONE)
        return TD_ERR_INVALID;
    if ((st = hmap_room(m)) != TD_OK)
        return st;
    m->slots[hmap_free_slot(m, key)] = (td_hmap_slot_t){ key, val };
    m->n++;
    return TD_OK;
}

/* The slot of key's first entry, or of the empty slot ending its run. */
static size_t
hmap_find(const td_hmap_t *m, uint64_t key)
{
    size_t i = td_hmap_home_(m, key);

    while (m->slots[i].val != TD_HMAP_NONE && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    return i;
}

td_status_t
td_hmap_put(td_hmap_t *m, uint64_t key, uint64_t val)
{
    if (val == TD_HMAP_NONE)
        return TD_ERR_INVALID;
    if (m->n > 0) {
        size_t i = hmap_find(m, key);

        if (m->slots[i].val != TD_HMAP_NONE) {
            m->slots[i].val = val;
            return TD_OK;
        }
    }
    return td_hmap_add(m, key, val);
}

/* Empty slot i: each later entry of the run whose home is not cyclically in
 * (i, j] moves back into the hole, which moves on to where it was. */
static void
hmap_del_at(td_hmap_t *m, size_t i)
{
    for (size_t j = i;;) {
        j = (j + 1) & m->mask;
        if (m->slots[j].val == TD_HMAP_NONE)
            break;
        size_t k = td_hmap_home_(m, m->slots[j].key);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        m->slots[i] = m->slots[j];
        i = j;
    }
    m->slots[i].val = TD_HMAP_NONE;
    m->n--;
}

uint64_t
td_hmap_del(td_hmap_t *m, uint64_t key)
{
    size_t i;
    uint64_t val;

    if (m->n == 0)
        return TD_HMAP_NONE;
    i = hmap_find(m, key);
    val = m->slots[i].val;
    if (val != TD_HMAP_NONE)
        hmap_del_at(m, i);
    return val;
}

bool
td_hmap_del_pair(td_hmap_t *m, uint64_t key, uint64_t val)
{
    if (m->n == 0 || val == TD_HMAP_NONE)
        return false;
    for (size_t i = td_hmap_home_(m, key); m->slots[i].val != TD_HMAP_NONE;
         i = (i + 1) & m->mask)
        if (m->slots[i].key == key && m->slots[i].val == val) {
            hmap_del_at(m, i);
            return true;
        }
    return false;
}

void
td_hmap_clear(td_hmap_t *m)
{
    size_t cap = hmap_cap(m);
    td_hmap_slot_t *s;

    if (cap > m->base) {
        s = m->base > 0 ? hmap_slots_new(m->base) : NULL;
        if (s != NULL || m->base == 0) {
            free(m->slots);
            m->slots = s;
            m->mask = m->base > 0 ? m->base - 1 : 0;
            m->shift = m->base > 0 ? 64 - (unsigned)__builtin_ctzll(m->base) : 0;
            m->n = 0;
            return;
        }
        /* no memory for the smaller array: keep the larger one */
    }
    if (m->n > 0)
        memset(m->slots, 0xff, cap * sizeof(*m->slots));
    m->n = 0;
}

bool
td_hmap_next(const td_hmap_t *m, size_t *pos, uint64_t *key, uint64_t *val)
{
    size_t cap = hmap_cap(m);

    while (*pos < cap) {
        const td_hmap_slot_t *s = &m->slots[(*pos)++];

        if (s->val != TD_HMAP_NONE) {
            *key = s->key;
            *val = s->val;
            return true;
        }
    }
    return false;
}
