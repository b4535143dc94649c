/* tests/unit/test_hmap.c — base/hmap.h, the one hash table: tables of steps
 * (put, get, del, add, each, del_pair, clear) with what each returns, keys 0
 * and UINT64_MAX, probe runs that wrap past the end of the array and are
 * deleted from, growth across many doublings, reserve and clear, a refused
 * size, the walk over every entry, and 100 000 random operations checked
 * against a plain array (unique keys) and plain lists (several per key). After
 * every change the slot array is checked: at most half full, the count right,
 * every entry reachable from its home without crossing an empty slot. */
#include "check.h"
#include "hmap.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NONE TD_HMAP_NONE

/* ---- The slot array's invariants ------------------------------------------ */

static bool
table_ok(const td_hmap_t *m)
{
    size_t cap = m->slots != NULL ? m->mask + 1 : 0, held = 0;

    if (m->slots == NULL)
        return m->n == 0;
    if (m->n > cap / 2)
        return false;
    for (size_t i = 0; i < cap; i++) {
        if (m->slots[i].val == NONE)
            continue;
        held++;
        for (size_t j = td_hmap_home_(m, m->slots[i].key); j != i; j = (j + 1) & m->mask)
            if (m->slots[j].val == NONE)
                return false;   /* unreachable from its home */
    }
    return held == m->n;
}

/* ---- Steps ------------------------------------------------------------------ */

typedef enum {
    OP_PUT,         /* td_hmap_put(k, v) == st */
    OP_ADD,         /* td_hmap_add(k, v) == st */
    OP_GET,         /* td_hmap_get(k) == v */
    OP_DEL,         /* td_hmap_del(k) == v */
    OP_DELPAIR,     /* td_hmap_del_pair(k, v) == (st == TD_OK) */
    OP_EACH,        /* td_hmap_each(k) gives each[0..] then NONE */
    OP_COUNT,       /* td_hmap_count() == v */
    OP_CLEAR,       /* td_hmap_clear() */
    OP_END
} op_kind_t;

typedef struct {
    op_kind_t op;
    uint64_t k, v;
    td_status_t st;
    uint64_t each[4];   /* OP_EACH: the values in order, NONE after the last */
} op_t;

#define PUT(k, v) { OP_PUT, k, v, TD_OK, { 0 } }
#define ADD(k, v) { OP_ADD, k, v, TD_OK, { 0 } }
#define GET(k, v) { OP_GET, k, v, TD_OK, { 0 } }
#define DEL(k, v) { OP_DEL, k, v, TD_OK, { 0 } }
#define COUNT(n) { OP_COUNT, 0, n, TD_OK, { 0 } }
#define END { OP_END, 0, 0, TD_OK, { 0 } }

static const struct {
    const char *name;
    size_t hint;
    op_t ops[16];
} cases[] = {
    { "empty table", 0,
      { GET(0, NONE), GET(NONE, NONE), DEL(7, NONE), COUNT(0),
        { OP_DELPAIR, 7, 1, TD_ERR_NOT_FOUND, { 0 } }, { OP_EACH, 7, 0, TD_OK, { NONE } }, END } },
    { "insert, find, update, delete", 0,
      { PUT(1, 10), PUT(2, 20), GET(1, 10), GET(2, 20), GET(3, NONE), COUNT(2),
        PUT(1, 11), GET(1, 11), COUNT(2), DEL(1, 11), GET(1, NONE), DEL(1, NONE),
        GET(2, 20), COUNT(1), END } },
    { "keys 0 and UINT64_MAX, value 0", 4,
      { PUT(0, 0), PUT(UINT64_MAX, 5), GET(0, 0), GET(UINT64_MAX, 5), COUNT(2),
        DEL(0, 0), GET(0, NONE), GET(UINT64_MAX, 5), DEL(UINT64_MAX, 5), COUNT(0), END } },
    { "the value TD_HMAP_NONE is refused", 0,
      { { OP_PUT, 1, NONE, TD_ERR_INVALID, { 0 } }, { OP_ADD, 1, NONE, TD_ERR_INVALID, { 0 } },
        COUNT(0), GET(1, NONE), END } },
    { "several values per key, in the order added", 0,
      { ADD(9, 1), ADD(9, 2), ADD(8, 7), ADD(9, 3), COUNT(4),
        { OP_EACH, 9, 0, TD_OK, { 1, 2, 3, NONE } }, GET(9, 1),
        { OP_DELPAIR, 9, 2, TD_OK, { 0 } }, { OP_DELPAIR, 9, 2, TD_ERR_NOT_FOUND, { 0 } },
        { OP_EACH, 9, 0, TD_OK, { 1, 3, NONE } }, PUT(9, 4),   /* put replaces the first */
        { OP_EACH, 9, 0, TD_OK, { 4, 3, NONE } }, DEL(9, 4), { OP_EACH, 9, 0, TD_OK, { 3, NONE } },
        { OP_EACH, 8, 0, TD_OK, { 7, NONE } }, END } },
    { "clear, then use again", 0,
      { PUT(1, 1), PUT(2, 2), { OP_CLEAR, 0, 0, TD_OK, { 0 } }, COUNT(0), GET(1, NONE),
        PUT(2, 3), GET(2, 3), COUNT(1), END } },
};

static void
run_step(const char *name, td_hmap_t *m, const op_t *o)
{
    bool ok = true;

    switch (o->op) {
    case OP_PUT:
        CHECK_STATUS(td_hmap_put(m, o->k, o->v), o->st);
        break;
    case OP_ADD:
        CHECK_STATUS(td_hmap_add(m, o->k, o->v), o->st);
        break;
    case OP_GET:
        ok = td_hmap_get(m, o->k) == o->v;
        break;
    case OP_DEL:
        ok = td_hmap_del(m, o->k) == o->v;
        break;
    case OP_DELPAIR:
        ok = td_hmap_del_pair(m, o->k, o->v) == (o->st == TD_OK);
        break;
    case OP_EACH: {
        size_t pos = 0, i = 0;
        uint64_t v;

        do {
            v = td_hmap_each(m, o->k, &pos);
            ok = ok && v == o->each[i];
        } while (v != NONE && ++i < 4);
        break;
    }
    case OP_COUNT:
        ok = td_hmap_count(m) == o->v;
        break;
    case OP_CLEAR:
        td_hmap_clear(m);
        break;
    case OP_END:
        break;
    }
    if (!ok || !table_ok(m)) {
        fprintf(stderr, "case \"%s\": op %d key %llu\n", name, (int)o->op,
                (unsigned long long)o->k);
        CHECK(ok && table_ok(m));
    }
}

static void
test_cases(void)
{
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        td_hmap_t *m = NULL;

        CHECK_STATUS(td_hmap_create(cases[c].hint, &m), TD_OK);
        if (m == NULL)
            continue;
        for (const op_t *o = cases[c].ops; o->op != OP_END; o++)
            run_step(cases[c].name, m, o);
        td_hmap_destroy(m);
    }
    td_hmap_destroy(NULL);
}

/* ---- Probe runs that wrap ------------------------------------------------------ */

/* n keys whose probe starts at slot home of a 16-slot table, from *next on. */
static void
keys_at(const td_hmap_t *m, size_t home, uint64_t *next, uint64_t *out, size_t n)
{
    for (size_t i = 0; i < n; (*next)++)
        if (td_hmap_home_(m, *next) == home)
            out[i++] = *next;
}

/* A run from slot 14 over the end into slots 0..3, deleted from at each of
 * its entries: what is left is found and the run closes up. Slot 0 holds a
 * key whose home is 0: it stays when slot 15 is emptied. */
static void
test_wrap(void)
{
    static const size_t homes[6] = { 14, 14, 0, 15, 14, 1 };
    uint64_t keys[6], next = 1;
    td_hmap_t *m;

    CHECK_STATUS(td_hmap_create(8, &m), TD_OK);
    CHECK_EQ_INT(m->mask + 1, 16);
    for (size_t i = 0; i < 6; i++)
        keys_at(m, homes[i], &next, &keys[i], 1);
    for (size_t gone = 0; gone < 6; gone++) {
        td_hmap_clear(m);
        for (size_t i = 0; i < 6; i++)
            CHECK_STATUS(td_hmap_put(m, keys[i], i), TD_OK);
        CHECK_EQ_INT(m->slots[0].key, keys[2]);   /* the run wrapped: 14, 15, 0 .. 3 */
        CHECK_EQ_INT(m->slots[3].key, keys[5]);
        CHECK_EQ_INT(td_hmap_del(m, keys[gone]), gone);
        CHECK(table_ok(m));
        for (size_t i = 0; i < 6; i++)
            CHECK_EQ_INT(td_hmap_get(m, keys[i]), i == gone ? NONE : i);
        CHECK_EQ_INT(m->slots[3].val, NONE);      /* the run is one slot shorter */
        if (gone != 2)
            CHECK_EQ_INT(m->slots[0].key, keys[2]);   /* at its home, never before it */
    }
    td_hmap_destroy(m);
}

/* The values of one key over the end of the array keep their order when the
 * table grows. */
static void
test_wrap_order(void)
{
    uint64_t k, other[8], next = 1;
    td_hmap_t *m;
    size_t pos = 0;
    bool ok = true;

    CHECK_STATUS(td_hmap_create(8, &m), TD_OK);
    keys_at(m, 15, &next, &k, 1);
    keys_at(m, 8, &next, other, 8);
    for (uint64_t v = 0; v < 6; v++)
        CHECK_STATUS(td_hmap_add(m, k, v), TD_OK);   /* slots 15, 0 .. 4 */
    CHECK_EQ_INT(m->slots[15].val, 0);
    for (size_t i = 0; i < 8; i++)
        CHECK_STATUS(td_hmap_add(m, other[i], 100), TD_OK);
    CHECK(m->mask + 1 > 16);
    for (uint64_t v = 0; v < 6; v++)
        ok = ok && td_hmap_each(m, k, &pos) == v;
    CHECK(ok && td_hmap_each(m, k, &pos) == NONE);
    td_hmap_destroy(m);
}

/* ---- Growth, reserve, clear, sizes -------------------------------------------- */

static void
test_growth(void)
{
    enum { N = 200000 };   /* 16 -> 524288 slots: 15 doublings */
    td_hmap_t *m;
    size_t doublings = 0, cap = 0;
    bool ok = true;

    CHECK_STATUS(td_hmap_create(0, &m), TD_OK);
    CHECK(m->slots == NULL);
    for (uint64_t i = 0; i < N; i++) {
        CHECK_STATUS(td_hmap_put(m, i * 0x10000, i), TD_OK);   /* low bits all 0 */
        if (m->mask + 1 != cap) {
            doublings += cap != 0;
            cap = m->mask + 1;
        }
    }
    CHECK_EQ_INT(doublings, 15);
    CHECK_EQ_INT(td_hmap_count(m), N);
    CHECK(table_ok(m));
    for (uint64_t i = 0; i < N; i++)
        ok = ok && td_hmap_get(m, i * 0x10000) == i;
    for (uint64_t i = 0; i < N; i += 2)
        ok = ok && td_hmap_del(m, i * 0x10000) == i;
    for (uint64_t i = 0; i < N; i++)
        ok = ok && td_hmap_get(m, i * 0x10000) == (i % 2 ? i : NONE);
    CHECK(ok);
    CHECK(table_ok(m));
    CHECK_EQ_INT(m->mask + 1, 524288);   /* it never shrinks by itself */
    td_hmap_clear(m);                    /* back to the capacity made at create */
    CHECK(m->slots == NULL);
    CHECK_EQ_INT(td_hmap_count(m), 0);
    CHECK_EQ_INT(td_hmap_get(m, 1), NONE);
    td_hmap_destroy(m);
}

static void
test_reserve(void)
{
    td_hmap_t *m = NULL;
    const td_hmap_slot_t *slots;

    CHECK_STATUS(td_hmap_create(1000, &m), TD_OK);
    CHECK_EQ_INT(m->mask + 1, 2048);
    slots = m->slots;
    for (uint64_t i = 0; i < 1000; i++)
        CHECK_STATUS(td_hmap_put(m, i, i), TD_OK);
    CHECK(m->slots == slots);   /* the hint's entries fit without a move */
    CHECK_STATUS(td_hmap_put(m, 1000, 0), TD_OK);
    CHECK(m->slots == slots);   /* 1025 fit in 2048 */
    CHECK_STATUS(td_hmap_reserve(m, 5000), TD_OK);
    CHECK_EQ_INT(m->mask + 1, 16384);
    slots = m->slots;
    for (uint64_t i = 1001; i < 5000; i++)
        CHECK_STATUS(td_hmap_put(m, i, i), TD_OK);
    CHECK(m->slots == slots);
    for (uint64_t i = 5000; i < 8192; i++)   /* full: 8192 in 16384 slots */
        CHECK_STATUS(td_hmap_put(m, i, i), TD_OK);
    CHECK(m->slots == slots);
    CHECK_EQ_INT(td_hmap_del(m, 7), 7);      /* one out, another in: no move */
    CHECK_STATUS(td_hmap_put(m, 9000, 1), TD_OK);
    CHECK(m->slots == slots);
    CHECK_STATUS(td_hmap_put(m, 9001, 1), TD_OK);   /* one more: it doubles */
    CHECK(m->slots != NULL && m->mask + 1 == 32768);
    slots = m->slots;
    CHECK_STATUS(td_hmap_reserve(m, SIZE_MAX / 4), TD_ERR_NOMEM);   /* unchanged */
    CHECK(m->slots == slots && td_hmap_count(m) == 8193 && td_hmap_get(m, 4999) == 4999);
    td_hmap_clear(m);
    CHECK_EQ_INT(m->mask + 1, 2048);   /* the capacity made at create */
    CHECK(table_ok(m));
    td_hmap_destroy(m);

    m = NULL;
    CHECK_STATUS(td_hmap_create(SIZE_MAX / 8, &m), TD_ERR_NOMEM);
    CHECK(m == NULL);
}

/* ---- The walk --------------------------------------------------------------------- */

static void
test_next(void)
{
    enum { N = 3000 };
    static uint8_t seen[N];
    td_hmap_t *m;
    size_t pos = 0, n = 0;
    uint64_t k, v;
    bool ok = true;

    CHECK_STATUS(td_hmap_create(0, &m), TD_OK);
    CHECK(!td_hmap_next(m, &pos, &k, &v));   /* no slots yet */
    for (uint64_t i = 0; i < N; i++)
        CHECK_STATUS(td_hmap_put(m, i * 7 + 1, i), TD_OK);
    for (uint64_t i = 0; i < N; i += 3)
        td_hmap_del(m, i * 7 + 1);
    pos = 0;
    while (td_hmap_next(m, &pos, &k, &v)) {
        ok = ok && v < N && k == v * 7 + 1 && v % 3 != 0 && !seen[v];
        if (v < N)
            seen[v] = 1;
        n++;
    }
    CHECK(ok);
    CHECK_EQ_INT(n, N - (N + 2) / 3);
    CHECK(!td_hmap_next(m, &pos, &k, &v));   /* the end stays the end */
    td_hmap_destroy(m);
}

/* ---- Random operations against a reference ------------------------------------------ */

static uint64_t
rnd(td_rng_t *r, uint64_t n)
{
    return td_rng_next(r) % n;
}

/* One value per key: a domain of 2048 keys (0 and UINT64_MAX among them), a plain
 * array of their values as the reference. */
static void
test_random_unique(void)
{
    enum { DOMAIN = 2048, OPS = 100000 };
    static uint64_t key[DOMAIN], ref[DOMAIN];
    td_rng_t r = td_rng_seed(42);
    td_hmap_t *m;
    size_t held = 0, bad = 0;

    for (size_t i = 0; i < DOMAIN; i++) {
        /* half small and dense, half spread; all distinct */
        key[i] = i == 1 ? UINT64_MAX : i < DOMAIN / 2 ? i : td_rng_mix64(i);
        ref[i] = NONE;
    }
    CHECK_STATUS(td_hmap_create(16, &m), TD_OK);
    for (size_t op = 0; op < OPS; op++) {
        size_t i = rnd(&r, DOMAIN), what = rnd(&r, 100);
        uint64_t v = rnd(&r, 1000);

        if (what < 45) {
            bad += td_hmap_put(m, key[i], v) != TD_OK;
            held += ref[i] == NONE;
            ref[i] = v;
        } else if (what < 80) {
            bad += td_hmap_del(m, key[i]) != ref[i];
            held -= ref[i] != NONE;
            ref[i] = NONE;
        } else if (what < 99 || op % 1000 != 999) {
            bad += td_hmap_get(m, key[i]) != ref[i];
        } else {
            td_hmap_clear(m);
            for (size_t j = 0; j < DOMAIN; j++)
                ref[j] = NONE;
            held = 0;
        }
        bad += td_hmap_count(m) != held;
        if (op % 4096 == 0)
            bad += !table_ok(m);
    }
    for (size_t i = 0; i < DOMAIN; i++)
        bad += td_hmap_get(m, key[i]) != ref[i];
    CHECK_EQ_INT(bad, 0);
    CHECK(table_ok(m));
    td_hmap_destroy(m);
}

/* Several values per key: 64 keys whose probe runs share slots, a list of
 * values per key in the order added as the reference. */
static void
test_random_multi(void)
{
    enum { KEYS = 64, MAXV = 32, OPS = 100000 };
    static uint64_t ref[KEYS][MAXV];
    static size_t nref[KEYS];
    td_rng_t r = td_rng_seed(7);
    td_hmap_t *m;
    uint64_t seq = 0;
    size_t bad = 0;

    CHECK_STATUS(td_hmap_create(0, &m), TD_OK);
    for (size_t op = 0; op < OPS; op++) {
        size_t k = rnd(&r, KEYS), what = rnd(&r, 100);

        if (what < 40 && nref[k] < MAXV) {
            bad += td_hmap_add(m, k, seq) != TD_OK;
            ref[k][nref[k]++] = seq++;
        } else if (what < 75 && nref[k] > 0) {
            size_t j = rnd(&r, nref[k]);

            bad += !td_hmap_del_pair(m, k, ref[k][j]);
            memmove(&ref[k][j], &ref[k][j + 1], (nref[k] - j - 1) * sizeof(ref[k][0]));
            nref[k]--;
        } else {
            size_t pos = 0, j = 0;
            uint64_t v;

            while ((v = td_hmap_each(m, k, &pos)) != NONE)
                bad += j >= nref[k] || v != ref[k][j++];
            bad += j != nref[k];
            bad += td_hmap_get(m, k) != (nref[k] ? ref[k][0] : NONE);
        }
        if (op % 4096 == 0)
            bad += !table_ok(m);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(table_ok(m));
    td_hmap_destroy(m);
}

int
main(void)
{
    test_cases();
    test_wrap();
    test_wrap_order();
    test_growth();
    test_reserve();
    test_next();
    test_random_unique();
    test_random_multi();
    return td_check_exit("test_hmap");
}
