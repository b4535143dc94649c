/* grammar/gdfa.c — the grammar's automaton over bytes, built as it is used:
 * a state is a set of stacks (interned frames: a node and the frame to return
 * to), a transition is the byte-closure of a state, computed once and kept in
 * the state's row; a state's token mask is one walk of the vocabulary trie
 * through those rows, kept while within a byte bound. Every map and set here
 * is a base/hmap.h table. */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "gram.h"
#include "gvocab.h"

#define GDFA_MAX_MASK_BYTES ((size_t)256 << 20)

static bool
dgrow(void **p, size_t *cap, size_t n, size_t sz)
{
    if (n < *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 256;
    while (nc <= n)
        nc *= 2;
    void *q = realloc(*p, nc * sz);
    if (q == NULL)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

/* The frame (node, parent), made once. UINT32_MAX: out of memory. */
static uint32_t
frame_of(gdfa_t *d, uint32_t node, uint32_t parent)
{
    uint64_t key = (uint64_t)node << 32 | parent;
    uint64_t id = td_hmap_get(d->frame_ix, key);

    if (id != TD_HMAP_NONE)
        return (uint32_t)id;
    if (!dgrow((void **)&d->frames, &d->cframes, d->nframes, sizeof(gframe_t)) ||
        td_hmap_put(d->frame_ix, key, d->nframes) != TD_OK)
        return UINT32_MAX;
    d->frames[d->nframes] = (gframe_t){ node, parent };
    return (uint32_t)d->nframes++;
}

static int
u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t
set_hash(const uint32_t *ids, size_t n, bool accept)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (accept ? 0x5bd1e995u : 0) ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= ids[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

/* The state of the sorted frame ids (n of them) and accept, made once.
 * UINT32_MAX: out of memory. */
static uint32_t
state_of(gdfa_t *d, const uint32_t *ids, size_t n, bool accept)
{
    uint64_t h = set_hash(ids, n, accept), v;
    size_t pos = 0;

    if (n == 0 && !accept)
        return GDFA_DEAD;
    while ((v = td_hmap_each(d->state_ix, h, &pos)) != TD_HMAP_NONE) {
        const gstate_t *s = &d->states[v];
        if (s->n == n && s->accept == accept &&
            memcmp(d->pool + s->off, ids, n * sizeof(uint32_t)) == 0)
            return (uint32_t)v;
    }
    if (!dgrow((void **)&d->pool, &d->cpool, d->npool + n, sizeof(uint32_t)) ||
        !dgrow((void **)&d->states, &d->cstates, d->nstates, sizeof(gstate_t)) ||
        td_hmap_add(d->state_ix, h, d->nstates) != TD_OK)
        return UINT32_MAX;
    memcpy(d->pool + d->npool, ids, n * sizeof(uint32_t));
    d->states[d->nstates] = (gstate_t){ .off = (uint32_t)d->npool, .n = (uint32_t)n,
                                        .accept = accept };
    d->npool += n;
    return (uint32_t)d->nstates++;
}

/* Visit frame f in a closure: once (the seen set). */
static bool
closure_push(gdfa_t *d, size_t *nw, uint32_t f)
{
    if (f == UINT32_MAX || td_hmap_get(d->seen, f) != TD_HMAP_NONE)
        return f != UINT32_MAX;
    if (td_hmap_put(d->seen, f, 1) != TD_OK ||
        !dgrow((void **)&d->work, &d->cwork, *nw, sizeof(uint32_t)))
        return false;
    d->work[(*nw)++] = f;
    return true;
}

/* The closure of the seed frames (d->work[0 .. nw)): follow epsilon edges,
 * enter called rules (a call whose return is a tail returns where the caller
 * would: no frame for it), leave ended rules to their parent frame. The
 * frames at nodes with byte edges make the state; ending the start rule
 * makes it accepting. UINT32_MAX: out of memory. */
static uint32_t
closure(gdfa_t *d, size_t nw)
{
    const ggraph_t *g = &d->g;
    size_t nout = 0;
    bool accept = false, ok = true;

    td_hmap_clear(d->seen);
    for (size_t i = 0; i < nw; i++)
        td_hmap_put(d->seen, d->work[i], 1);
    while (nw > 0 && ok) {
        uint32_t f = d->work[--nw];
        gframe_t fr = d->frames[f];
        const gnode_t *nd = &g->nodes[fr.node];
        if (nd->nbytes > 0) {
            ok = dgrow((void **)&d->out, &d->cout, nout, sizeof(uint32_t));
            if (ok)
                d->out[nout++] = f;
        }
        if (nd->final) {
            if (fr.parent == GDFA_ROOT)
                accept = true;
            else
                ok = ok && closure_push(d, &nw, fr.parent);
        }
        for (uint32_t i = nd->nbytes; ok && i < nd->n; i++) {
            const gedge_t *e = &g->edges[nd->first + i];
            uint32_t nf;
            if (e->kind == GE_EPS) {
                nf = frame_of(d, e->to, fr.parent);
            } else {
                uint32_t ret = d->tail[e->to] ? fr.parent : frame_of(d, e->to, fr.parent);
                nf = ret == UINT32_MAX && !d->tail[e->to]
                         ? UINT32_MAX : frame_of(d, g->rules[e->rule].start, ret);
            }
            ok = closure_push(d, &nw, nf);
        }
    }
    if (!ok)
        return UINT32_MAX;
    qsort(d->out, nout, sizeof(uint32_t), u32_cmp);
    return state_of(d, d->out, nout, accept);
}

uint32_t
gdfa_step(gdfa_t *d, uint32_t s, uint8_t b, td_status_t *st)
{
    gstate_t *S = &d->states[s];
    size_t nw = 0;

    if (S->trans != NULL && S->trans[b] != 0)
        return S->trans[b] - 1;
    if (S->trans == NULL && (S->trans = calloc(256, sizeof(uint32_t))) == NULL)
        goto nomem;
    for (uint32_t i = 0; i < S->n; i++) {
        gframe_t fr = d->frames[d->pool[S->off + i]];
        const gnode_t *nd = &d->g.nodes[fr.node];
        for (uint32_t k = 0; k < nd->nbytes; k++) {
            const gedge_t *e = &d->g.edges[nd->first + k];
            if (b < e->lo || b > e->hi)
                continue;
            uint32_t f = frame_of(d, e->to, fr.parent);
            if (f == UINT32_MAX || !dgrow((void **)&d->work, &d->cwork, nw, sizeof(uint32_t)))
                goto nomem;
            d->work[nw++] = f;
        }
    }
    uint32_t ns = closure(d, nw);
    if (ns == UINT32_MAX)
        goto nomem;
    S = &d->states[s];   /* closure may have moved the states */
    S->trans[b] = ns + 1;
    return ns;
nomem:
    *st = TD_ERR_NOMEM;
    return GDFA_DEAD;
}

td_status_t
gdfa_token(gdfa_t *d, int32_t token, uint32_t *s)
{
    const char *b;
    size_t len;
    uint32_t cur = *s;
    td_status_t st = TD_OK;

    if (td_gvocab_is_control(d->v->tok, (uint32_t)token) ||
        td_tokenizer_piece(d->v->tok, (uint32_t)token, &b, &len) != TD_OK || len == 0)
        return TD_ERR_INVALID;
    for (size_t i = 0; i < len && cur != GDFA_DEAD; i++)
        cur = gdfa_step(d, cur, (uint8_t)b[i], &st);
    if (st != TD_OK)
        return st;
    if (cur == GDFA_DEAD)
        return TD_ERR_INVALID;
    *s = cur;
    return TD_OK;
}

/* The walk of the trie from state s: a token is allowed when every byte of
 * it leads to a live state; a refused byte skips its whole subtree. */
static td_status_t
mask_walk(gdfa_t *d, uint32_t s, uint64_t *mask)
{
    const td_gvocab_t *v = d->v;
    td_status_t st = TD_OK;

    memset(mask, 0, td_gvocab_mask_words(v) * sizeof(uint64_t));
    d->walk[0] = s;
    for (size_t i = 0; i < v->nnodes;) {
        uint32_t from = d->walk[v->depth[i] - 1];
        const gstate_t *S = &d->states[from];
        uint32_t t = S->trans != NULL ? S->trans[v->byte[i]] : 0;
        uint32_t ns = t != 0 ? t - 1 : gdfa_step(d, from, v->byte[i], &st);
        if (st != TD_OK)
            return st;
        if (ns == GDFA_DEAD) {
            i = v->end[i];
            continue;
        }
        d->walk[v->depth[i]] = ns;
        for (uint32_t k = v->tok_off[i]; k < v->tok_off[i + 1]; k++)
            mask[v->toks[k] >> 6] |= 1ull << (v->toks[k] & 63);
        i++;
    }
    if (d->states[s].accept)
        for (size_t k = 0; k < v->neos; k++)
            mask[v->eos[k] >> 6] |= 1ull << (v->eos[k] & 63);
    return TD_OK;
}

const uint64_t *
gdfa_mask(gdfa_t *d, uint32_t s, uint64_t *scratch)
{
    size_t bytes = td_gvocab_mask_words(d->v) * sizeof(uint64_t);
    uint64_t *m;

    if (d->states[s].mask != NULL)
        return d->states[s].mask;
    m = d->mask_bytes + bytes <= d->max_mask_bytes ? malloc(bytes) : NULL;
    if (m == NULL && scratch == NULL)
        return NULL;
    if (mask_walk(d, s, m != NULL ? m : scratch) != TD_OK) {
        free(m);
        return NULL;
    }
    if (m == NULL)
        return scratch;
    d->states[s].mask = m;
    d->mask_bytes += bytes;
    return m;
}

td_status_t
gdfa_precompute(gdfa_t *d, size_t max_states, uint64_t deadline_ns)
{
    td_status_t st = TD_OK;

    /* Breadth first: the states are numbered as found, so walking the ids in
     * order visits each once; each step may add more. */
    for (size_t s = 1; s < d->nstates; s++) {
        if (d->nstates > max_states)
            return TD_ERR_RANGE;
        if (td_clock_ns() > deadline_ns)
            return TD_ERR_TIMEOUT;
        for (unsigned b = 0; b < 256; b++) {
            gdfa_step(d, (uint32_t)s, (uint8_t)b, &st);
            if (st != TD_OK)
                return st;
        }
    }
    for (size_t s = 1; s < d->nstates; s++) {
        if (td_clock_ns() > deadline_ns)
            return TD_ERR_TIMEOUT;
        if (gdfa_mask(d, (uint32_t)s, NULL) == NULL)
            return TD_ERR_NOMEM;
    }
    return TD_OK;
}

/* Nodes where a rule may as well have ended: its end, or nodes with only
 * epsilon edges into such nodes (a call returning there needs no frame). */
static void
dfa_tails(gdfa_t *d)
{
    const ggraph_t *g = &d->g;
    bool changed = true;

    for (size_t n = 0; n < g->nnodes; n++)
        d->tail[n] = g->nodes[n].final;
    while (changed) {
        changed = false;
        for (size_t n = g->nnodes; n-- > 0;) {
            const gnode_t *nd = &g->nodes[n];
            bool t = !d->tail[n] && nd->n > 0 && nd->nbytes == 0;
            for (uint32_t i = 0; t && i < nd->n; i++) {
                const gedge_t *e = &g->edges[nd->first + i];
                t = e->kind == GE_EPS && d->tail[e->to];
            }
            if (t)
                d->tail[n] = changed = true;
        }
    }
}

td_status_t
gdfa_init(gdfa_t *d, const td_gvocab_t *v)
{
    td_status_t st;

    d->v = v;
    d->max_mask_bytes = GDFA_MAX_MASK_BYTES;
    d->tail = calloc(d->g.nnodes + 1, sizeof(bool));
    d->walk = calloc(v->max_len + 2, sizeof(uint32_t));
    if (d->tail == NULL || d->walk == NULL)
        return TD_ERR_NOMEM;
    dfa_tails(d);
    if ((st = td_hmap_create(1024, &d->frame_ix)) != TD_OK ||
        (st = td_hmap_create(256, &d->state_ix)) != TD_OK ||
        (st = td_hmap_create(256, &d->seen)) != TD_OK)
        return st;
    /* state 0 is the dead state: made by hand, never interned */
    if (!dgrow((void **)&d->states, &d->cstates, 0, sizeof(gstate_t)))
        return TD_ERR_NOMEM;
    d->states[0] = (gstate_t){ 0 };
    d->nstates = 1;
    uint32_t f = frame_of(d, d->g.rules[d->g.root].start, GDFA_ROOT);
    if (f == UINT32_MAX || !dgrow((void **)&d->work, &d->cwork, 0, sizeof(uint32_t)))
        return TD_ERR_NOMEM;
    d->work[0] = f;
    d->start = closure(d, 1);
    return d->start == UINT32_MAX ? TD_ERR_NOMEM : TD_OK;
}

void
gdfa_free(gdfa_t *d)
{
    for (size_t s = 0; s < d->nstates; s++) {
        free(d->states[s].trans);
        free(d->states[s].mask);
    }
    free(d->states);
    free(d->pool);
    free(d->frames);
    free(d->tail);
    free(d->walk);
    free(d->work);
    free(d->out);
    td_hmap_destroy(d->frame_ix);
    td_hmap_destroy(d->state_ix);
    td_hmap_destroy(d->seen);
    ggraph_free(&d->g);
}
