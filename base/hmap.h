/* base/hmap.h — the one hash table of the tree: 64-bit keys to 64-bit values,
 * open addressing with linear probing and backward-shift deletion. A value is
 * whatever the caller keeps there: a pointer, an index into its own array, or
 * a few packed numbers; a table keyed by strings keys by their 64-bit hash and
 * compares the strings itself (td_hmap_add / td_hmap_each, below). */
#ifndef TD_HMAP_H
#define TD_HMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "status.h"

/* The one value an entry cannot have: "absent" from the lookups. Every key
 * is allowed, 0 and UINT64_MAX included. */
#define TD_HMAP_NONE UINT64_MAX

/* Growth. The capacity is 0 or a power of two >= 16, and the table is at most
 * half full: an insertion that would pass cap / 2 entries first doubles the
 * capacity and moves every entry into the new array (O(n) for that insertion,
 * O(1) amortized; the old array is freed after). A failed allocation leaves
 * the table as it was and returns TD_ERR_NOMEM; nothing aborts. The table
 * never shrinks by itself: td_hmap_clear() goes back to the capacity made at
 * create. Memory: 16 bytes a slot, so 32 to 64 bytes an entry once grown.
 * An insertion does not allocate while the table holds fewer entries than
 * create's hint or td_hmap_reserve() made room for, nor when it follows a
 * del (the count is back where it was), so those insertions cannot fail.
 *
 * Deletion shifts the later entries of the probe run back into the hole
 * (Knuth's algorithm R) instead of leaving a tombstone: lookups stay as short
 * as in a table that never held the deleted keys, and no rehash is needed to
 * clean up after many deletions (a cache that inserts and evicts forever).
 *
 * Concurrency: none inside. Any number of threads may read (get, each, next,
 * count) at once while none writes; every write (put, add, del, clear,
 * reserve) needs the table to itself. The caller locks.
 *
 * Ownership: the table owns its slot array only; what values point to stays
 * the caller's. */

typedef struct {
    uint64_t key;
    uint64_t val;           /* TD_HMAP_NONE: the slot is empty */
} td_hmap_slot_t;

/* The fields are the inline lookups' below; callers use the functions. */
typedef struct td_hmap {
    td_hmap_slot_t *slots;  /* [mask + 1], or NULL while the capacity is 0 */
    size_t mask;            /* capacity - 1 (0 with no slots) */
    unsigned shift;         /* 64 - log2(capacity) */
    size_t n;               /* entries held */
    size_t base;            /* the capacity made at create, kept by clear */
} td_hmap_t;

/* A table with room for hint entries before it first grows (0: nothing is
 * allocated until the first insertion). TD_ERR_NOMEM. */
td_status_t td_hmap_create(size_t hint, td_hmap_t **out);
void td_hmap_destroy(td_hmap_t *m);

/* key -> val, replacing the value of an entry with that key (the first, in a
 * table that holds several). TD_ERR_INVALID: val is TD_HMAP_NONE;
 * TD_ERR_NOMEM (unchanged). */
td_status_t td_hmap_put(td_hmap_t *m, uint64_t key, uint64_t val);
/* Remove the entry with key (the first, in a table that holds several): its
 * value, or TD_HMAP_NONE when there was none. */
uint64_t td_hmap_del(td_hmap_t *m, uint64_t key);

/* Several entries per key (a multimap: string tables keyed by hash, values
 * that share a key). add inserts another entry even when key is held;
 * td_hmap_each walks the entries of key in the order they were added;
 * del_pair removes the one entry with both key and val (false: none). */
td_status_t td_hmap_add(td_hmap_t *m, uint64_t key, uint64_t val);
bool td_hmap_del_pair(td_hmap_t *m, uint64_t key, uint64_t val);

/* Empty the table; its capacity goes back to the one made at create (a table
 * that grew gives its memory back). Never fails. */
void td_hmap_clear(td_hmap_t *m);
/* Room for n entries in all, so that insertions up to n do not allocate.
 * TD_ERR_NOMEM (unchanged). */
td_status_t td_hmap_reserve(td_hmap_t *m, size_t n);

/* Every entry once, in slot order: *pos starts at 0; true with *key and *val
 * set, false at the end. The table must not change during the walk. */
bool td_hmap_next(const td_hmap_t *m, size_t *pos, uint64_t *key, uint64_t *val);

static inline size_t
td_hmap_count(const td_hmap_t *m)
{
    return m->n;
}

/* The slot a key's probe starts at (private to the table): Fibonacci
 * hashing, the top log2(capacity) bits of key * 2^64 / phi. One multiply;
 * sequential ids, packed pairs and keys that are hashes already all spread. */
static inline size_t
td_hmap_home_(const td_hmap_t *m, uint64_t key)
{
    return (size_t)((key * TD_RNG_GAMMA) >> m->shift);
}

/* The value of key (the first entry's, in a table that holds several), or
 * TD_HMAP_NONE. */
static inline uint64_t
td_hmap_get(const td_hmap_t *m, uint64_t key)
{
    if (m->n == 0)
        return TD_HMAP_NONE;
    for (size_t i = td_hmap_home_(m, key);; i = (i + 1) & m->mask) {
        const td_hmap_slot_t *s = &m->slots[i];
        if (s->val == TD_HMAP_NONE || s->key == key)
            return s->val;
    }
}

/* The next value held under key: *pos starts at 0 and moves on with each
 * call; TD_HMAP_NONE after the last. The table must not change between the
 * calls of one walk. */
static inline uint64_t
td_hmap_each(const td_hmap_t *m, uint64_t key, size_t *pos)
{
    if (m->n == 0)
        return TD_HMAP_NONE;
    for (size_t i = (td_hmap_home_(m, key) + *pos) & m->mask;; i = (i + 1) & m->mask) {
        const td_hmap_slot_t *s = &m->slots[i];
        if (s->val == TD_HMAP_NONE)
            return TD_HMAP_NONE;
        ++*pos;
        if (s->key == key)
            return s->val;
    }
}

#endif
