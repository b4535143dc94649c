/* engine/kvmem.c — one request's KV memory in one arena for programs without
 * a pool (tools, tests, benchmarks), blocks and slots optionally at shuffled
 * places with guards between them, and copies of a request's state between
 * views. */
#include "kvmem.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rng.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KVMEM_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define KVMEM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define KVMEM_POISON(p, n) ((void)(p), (void)(n))
#define KVMEM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define KVMEM_ALIGN 64u
#define KVMEM_GUARD 64u
#define KVMEM_PATTERN 0xa5

/* ---- The arena ----------------------------------------------------------------- */

/* A block or a slot: segment s, block b (paged) or 0 (fixed), its bytes. */
typedef struct {
    uint32_t seg;
    uint64_t b;
    size_t len;
} kvmem_piece_t;

static size_t
kvmem_round(size_t n)
{
    return (n + KVMEM_ALIGN - 1) / KVMEM_ALIGN * KVMEM_ALIGN;
}

static void
kvmem_guards(const td_kvmem_t *m, int poison)
{
    for (size_t i = 0; i < m->npieces; i++) {
        if (poison)
            KVMEM_POISON(m->ends[i], (size_t)(m->nexts[i] - m->ends[i]));
        else
            KVMEM_UNPOISON(m->ends[i], (size_t)(m->nexts[i] - m->ends[i]));
    }
}

static void
kvmem_free(td_kvmem_t *m, uint32_t nsegs)
{
    if (m->arena != NULL)
        kvmem_guards(m, 0);
    free(m->arena);
    if (m->blocks != NULL)
        for (uint32_t s = 0; s < nsegs; s++)
            free(m->blocks[s]);
    free(m->blocks);
    free(m->nblocks);
    free(m->fixed);
    free(m->ends);
    free(m->nexts);
    free(m);
}

td_status_t
td_kvmem_create(const td_layout_t *l, uint64_t tokens, uint64_t seed, td_kvmem_t **out)
{
    td_kvmem_t *m = calloc(1, sizeof(*m));
    kvmem_piece_t *pieces = NULL;
    size_t np = 0, at = 0;

    if (m == NULL)
        goto err_nomem;
    m->tokens = tokens;
    m->nblocks = calloc(l->nsegs + 1, sizeof(*m->nblocks));
    m->blocks = calloc(l->nsegs + 1, sizeof(*m->blocks));
    m->fixed = calloc(l->nsegs + 1, sizeof(*m->fixed));
    if (m->nblocks == NULL || m->blocks == NULL || m->fixed == NULL)
        goto err_nomem;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];

        if (sg->kind == TD_LAYOUT_PAGED) {
            m->nblocks[s] = td_layout_blocks(l, sg, tokens);
            m->blocks[s] = calloc(m->nblocks[s] + 1, sizeof(*m->blocks[s]));
            if (m->blocks[s] == NULL)
                goto err_nomem;
            np += m->nblocks[s];
        } else {
            np++;
        }
    }
    pieces = calloc(np + 1, sizeof(*pieces));
    m->ends = calloc(np + 1, sizeof(*m->ends));
    m->nexts = calloc(np + 1, sizeof(*m->nexts));
    if (pieces == NULL || m->ends == NULL || m->nexts == NULL)
        goto err_nomem;
    np = 0;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];

        if (sg->kind == TD_LAYOUT_PAGED)
            for (uint64_t b = 0; b < m->nblocks[s]; b++)
                pieces[np++] = (kvmem_piece_t){ s, b,
                                                (size_t)l->block_entries * sg->entry_bytes };
        else
            pieces[np++] = (kvmem_piece_t){ s, 0, (size_t)sg->entries * sg->entry_bytes };
    }
    if (seed != 0) {   /* Fisher-Yates with the test generator */
        td_rng_t rng = td_rng_seed(seed);

        for (size_t i = np; i > 1; i--) {
            size_t j = (size_t)(td_rng_next(&rng) % i);
            kvmem_piece_t t = pieces[i - 1];

            pieces[i - 1] = pieces[j];
            pieces[j] = t;
        }
    }
    for (size_t i = 0; i < np; i++)
        at += kvmem_round(pieces[i].len + KVMEM_GUARD);
    m->bytes = at ? at : KVMEM_ALIGN;
    if (posix_memalign((void **)&m->arena, KVMEM_ALIGN, m->bytes) != 0) {
        m->arena = NULL;
        goto err_nomem;
    }
    memset(m->arena, 0, m->bytes);
    at = 0;
    for (size_t i = 0; i < np; i++) {
        unsigned char *p = m->arena + at;

        if (l->segs[pieces[i].seg].kind == TD_LAYOUT_PAGED)
            m->blocks[pieces[i].seg][pieces[i].b] = p;
        else
            m->fixed[pieces[i].seg] = p;
        at += kvmem_round(pieces[i].len + KVMEM_GUARD);
        m->ends[i] = p + pieces[i].len;
        m->nexts[i] = m->arena + at;
        memset(m->ends[i], KVMEM_PATTERN, (size_t)(m->nexts[i] - m->ends[i]));
    }
    m->npieces = np;
    kvmem_guards(m, 1);
    free(pieces);
    m->kv.layout = l;
    m->kv.nblocks = m->nblocks;
    m->kv.blocks = (uint8_t *const *const *)m->blocks;
    m->kv.fixed = (uint8_t *const *)m->fixed;
    *out = m;
    return TD_OK;

err_nomem:
    td_error("kv memory: %llu tokens of a %u-segment layout: out of memory",
             (unsigned long long)tokens, l->nsegs);
    free(pieces);
    if (m != NULL)
        kvmem_free(m, l->nsegs);
    return TD_ERR_NOMEM;
}

void
td_kvmem_destroy(td_kvmem_t *m)
{
    if (m != NULL)
        kvmem_free(m, m->kv.layout->nsegs);
}

td_status_t
td_kvmem_check(const td_kvmem_t *m)
{
    td_status_t st = TD_OK;

    kvmem_guards(m, 0);
    for (size_t i = 0; i < m->npieces && st == TD_OK; i++)
        for (const unsigned char *p = m->ends[i]; p < m->nexts[i]; p++)
            if (*p != KVMEM_PATTERN) {
                td_error("kv memory: a write past a block or slot, %zu bytes after it",
                         (size_t)(p - m->ends[i]));
                st = TD_ERR_MISMATCH;
                break;
            }
    kvmem_guards(m, 1);
    return st;
}

/* ---- A request's state ------------------------------------------------------------ */

/* Runs of contiguous bytes: segment seg from entry (or slot) e, len bytes at p. */
typedef void (*kvmem_run_fn)(const td_layout_kv_t *kv, uint32_t seg, uint64_t e,
                             unsigned char *p, size_t len, void *arg);

/* The state after n tokens as runs (a fixed segment whole, a paged one block
 * by block), in the fixed order. */
static void
kvmem_walk(const td_layout_kv_t *kv, uint64_t n, kvmem_run_fn fn, void *arg)
{
    const td_layout_t *l = kv->layout;

    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *sg = &l->segs[s];
        uint64_t count = td_layout_entries(sg, n);

        if (sg->kind == TD_LAYOUT_FIXED) {
            fn(kv, s, 0, kv->fixed[s], (size_t)count * sg->entry_bytes, arg);
            continue;
        }
        for (uint64_t e = 0; e < count; e += l->block_entries) {
            uint64_t k = count - e < l->block_entries ? count - e : l->block_entries;

            fn(kv, s, e, td_layout_kv_entry(kv, s, e), (size_t)k * sg->entry_bytes, arg);
        }
    }
}

uint64_t
td_kvmem_state_bytes(const td_layout_t *l, uint64_t n)
{
    uint64_t b = 0;

    for (uint32_t s = 0; s < l->nsegs; s++)
        b += td_layout_seg_bytes(&l->segs[s], n);
    return b;
}

static void
kvmem_pack_run(const td_layout_kv_t *kv, uint32_t seg, uint64_t e, unsigned char *p,
               size_t len, void *arg)
{
    unsigned char **out = arg;

    (void)kv;
    (void)seg;
    (void)e;
    memcpy(*out, p, len);
    *out += len;
}

static void
kvmem_unpack_run(const td_layout_kv_t *kv, uint32_t seg, uint64_t e, unsigned char *p,
                 size_t len, void *arg)
{
    const unsigned char **in = arg;

    (void)kv;
    (void)seg;
    (void)e;
    memcpy(p, *in, len);
    *in += len;
}

/* A run of the source lands at the same entries of the destination: one
 * layout, so the same block size, so one block there too. */
static void
kvmem_copy_run(const td_layout_kv_t *kv, uint32_t seg, uint64_t e, unsigned char *p,
               size_t len, void *arg)
{
    const td_layout_kv_t *dst = arg;

    (void)kv;
    memcpy(td_layout_kv_entry(dst, seg, e), p, len);
}

void
td_kvmem_pack(const td_layout_kv_t *kv, uint64_t n, void *out)
{
    unsigned char *o = out;

    kvmem_walk(kv, n, kvmem_pack_run, &o);
}

void
td_kvmem_unpack(const td_layout_kv_t *kv, uint64_t n, const void *in)
{
    const unsigned char *i = in;

    kvmem_walk(kv, n, kvmem_unpack_run, &i);
}

void
td_kvmem_copy(const td_layout_kv_t *dst, const td_layout_kv_t *src, uint64_t n)
{
    kvmem_walk(src, n, kvmem_copy_run, (void *)dst);
}
