/* routerd/rcache.c — a prefill rank's announced cache blocks as a hash set
 * (base/hmap.h), CacheEvents applied to it, longest cached prefixes, and a
 * prompt's block hashes per block size (rcache.h). */
#include "rcache.h"

#include <stdlib.h>
#include <string.h>

#include "chainhash.h"
#include "hmap.h"

void
td_rcache_init(td_rcache_t *c, size_t max)
{
    memset(c, 0, sizeof *c);
    c->max = max;
}

void
td_rcache_fini(td_rcache_t *c)
{
    td_hmap_destroy(c->set);
    memset(c, 0, sizeof *c);
}

void
td_rcache_clear(td_rcache_t *c, bool seq_too)
{
    if (c->set != NULL)
        td_hmap_clear(c->set);   /* a set that was large gives its memory back */
    c->n = 0;
    c->over = false;
    if (seq_too)
        c->seq = 0;
}

bool
td_rcache_has(const td_rcache_t *c, uint64_t h)
{
    return c->set != NULL && h != 0 && td_hmap_get(c->set, h) != TD_HMAP_NONE;
}

size_t
td_rcache_prefix(const td_rcache_t *c, const uint64_t *h, size_t n)
{
    size_t i = 0;

    while (i < n && td_rcache_has(c, h[i]))
        i++;
    return i;
}

/* Add h; TD_ERR_TOO_BIG when the set is at max (h not kept). */
static td_status_t
add(td_rcache_t *c, uint64_t h)
{
    td_status_t st;

    if (td_rcache_has(c, h))
        return TD_OK;
    if (c->n >= c->max)
        return TD_ERR_TOO_BIG;
    if (c->set == NULL && (st = td_hmap_create(0, &c->set)) != TD_OK)
        return st;
    if ((st = td_hmap_put(c->set, h, 1)) != TD_OK)
        return st;
    c->n++;
    return TD_OK;
}

static void
del(td_rcache_t *c, uint64_t h)
{
    if (c->set != NULL && td_hmap_del(c->set, h) != TD_HMAP_NONE)
        c->n--;
}

td_status_t
td_rcache_apply(td_rcache_t *c, const td_rcache_event_t *ev, const char **why)
{
    bool was_over = c->over;
    td_status_t st = TD_OK;

    /* a cleared event replaces everything: it may follow a gap (the rank
     * numbers its events over all its routers; one that joined late starts
     * from its first full list) */
    if (ev->seq != c->seq + 1 && !(ev->cleared && ev->seq > c->seq)) {
        *why = ev->seq <= c->seq ? "seq went backwards" : "seq skipped events";
        td_rcache_clear(c, false);
        c->seq = ev->seq;
        return TD_ERR_PROTO;
    }
    c->seq = ev->seq;
    if (ev->cleared) {
        td_rcache_clear(c, false);
        was_over = false;
    }
    for (size_t i = 0; i < ev->nadded; i++) {
        if (ev->added[i] == 0) {
            *why = "hash 0 added";
            td_rcache_clear(c, false);
            return TD_ERR_PROTO;
        }
        st = add(c, ev->added[i]);
        if (st == TD_ERR_TOO_BIG) {
            c->over = true;
        } else if (st != TD_OK) {
            td_rcache_clear(c, false);
            return st;
        }
    }
    for (size_t i = 0; i < ev->nremoved; i++)
        if (ev->removed[i] != 0)
            del(c, ev->removed[i]);
    return c->over && !was_over ? TD_ERR_TOO_BIG : TD_OK;
}

/* ======================================================================= */
/* A prompt's hashes                                                         */
/* ======================================================================= */

void
td_rcache_prompt_init(td_rcache_prompt_t *p, uint64_t seed, const int32_t *tokens,
                      size_t ntokens)
{
    memset(p, 0, sizeof *p);
    p->seed = seed;
    p->tokens = tokens;
    p->ntokens = ntokens;
}

void
td_rcache_prompt_fini(td_rcache_prompt_t *p)
{
    for (size_t i = 0; i < TD_RCACHE_PROMPT_SIZES; i++)
        free(p->by[i].h);
    memset(p, 0, sizeof *p);
}

const uint64_t *
td_rcache_prompt_hashes(td_rcache_prompt_t *p, uint32_t g, size_t *n)
{
    size_t i, nb = g ? p->ntokens / g : 0;

    *n = 0;
    if (nb == 0)
        return NULL;
    for (i = 0; i < TD_RCACHE_PROMPT_SIZES; i++)
        if (p->by[i].g == g || p->by[i].g == 0)
            break;
    if (i == TD_RCACHE_PROMPT_SIZES)   /* more sizes than slots: the last is recomputed */
        i = TD_RCACHE_PROMPT_SIZES - 1;
    if (p->by[i].g != g) {
        uint64_t *h = realloc(p->by[i].h, nb * sizeof *h);
        if (!h)
            return NULL;
        p->by[i].h = h;
        p->by[i].g = g;
        p->by[i].n = td_chain_hashes(p->seed, p->tokens, p->ntokens, g, h, nb);
    }
    *n = p->by[i].n;
    return p->by[i].h;
}
