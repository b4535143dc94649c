/* worker/wcons.c — constraints on a worker: the process's vocabulary, the
 * cache of compiled grammars (by content hash, base/hmap.h, unreferenced
 * ones evicted past the byte bound), and one request's matcher behind the
 * engine's constraint hook. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "hmap.h"
#include "log.h"
#include "wcons.h"

#define WCONS_CACHE_BYTES ((size_t)512 << 20)
#define WCONS_MAX_SPEC ((size_t)1 << 20)    /* routerd's max-constraint-bytes bound */
#define WCONS_BUDGET_MS 60000u              /* routerd's constraint-budget bound */

typedef struct {
    uint32_t kind;
    bool strict;
    char *spec;
    size_t len;
    td_grammar_t *g;
    uint32_t refs;
    bool live;
} wcons_entry_t;

static struct {
    pthread_mutex_t lock;
    td_tokenizer_t *tok;
    td_gvocab_t *v;
    td_hmap_t *ix;           /* content hash -> entry index (a multimap) */
    wcons_entry_t *ents;
    size_t nents, cap;
} wc = { .lock = PTHREAD_MUTEX_INITIALIZER };

struct td_wcons {
    td_engine_cons_t hook;
    size_t ent_ix;
    td_gmatch_t *m;
    int32_t start_after;     /* -1: started */
};

td_status_t
td_wcons_setup(const char *model_dir, const int32_t *eos, size_t neos)
{
    char path[4096];
    td_status_t st;

    if (model_dir == NULL || model_dir[0] == '\0')
        return TD_OK;
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return TD_OK;   /* no tokenizer: constraints are refused, saying so */
    fclose(f);
    if ((st = td_tokenizer_load(path, &wc.tok)) != TD_OK ||
        (st = td_gvocab_create(wc.tok, eos, neos, &wc.v)) != TD_OK ||
        (st = td_hmap_create(64, &wc.ix)) != TD_OK) {
        td_error("constraints: the vocabulary of %s: %s", path, td_status_str(st));
        td_wcons_teardown();
        return st;
    }
    wc.cap = 256;
    wc.ents = calloc(wc.cap, sizeof(*wc.ents));
    return wc.ents != NULL ? TD_OK : TD_ERR_NOMEM;
}

void
td_wcons_teardown(void)
{
    for (size_t i = 0; i < wc.nents; i++) {
        td_grammar_destroy(wc.ents[i].g);
        free(wc.ents[i].spec);
    }
    free(wc.ents);
    td_hmap_destroy(wc.ix);
    td_gvocab_destroy(wc.v);
    td_tokenizer_destroy(wc.tok);
    wc.ents = NULL;
    wc.nents = wc.cap = 0;
    wc.ix = NULL;
    wc.v = NULL;
    wc.tok = NULL;
}

static uint64_t
wcons_hash(uint32_t kind, bool strict, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ (kind * 2u + strict);
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* Free the compiled grammars no request uses while the cache holds more
 * than its bound (lock held). */
static void
wcons_evict(void)
{
    size_t bytes = 0;
    td_grammar_stats_t s;

    for (size_t i = 0; i < wc.nents; i++)
        if (wc.ents[i].live) {
            td_grammar_stats(wc.ents[i].g, &s);
            bytes += s.mask_bytes + wc.ents[i].len;
        }
    for (size_t i = 0; i < wc.nents && bytes > WCONS_CACHE_BYTES; i++) {
        wcons_entry_t *e = &wc.ents[i];
        if (!e->live || e->refs > 0)
            continue;
        td_grammar_stats(e->g, &s);
        bytes -= s.mask_bytes + e->len;
        td_hmap_del_pair(wc.ix, wcons_hash(e->kind, e->strict, e->spec, e->len), i);
        td_grammar_destroy(e->g);
        free(e->spec);
        *e = (wcons_entry_t){ 0 };
    }
}

/* The cache entry of (kind, strict, spec), compiled if new (lock held while
 * looking; the compile runs unlocked on the caller's thread). */
static td_status_t
wcons_entry(const Tandem__Constraint *in, size_t *ix, char *why, size_t whylen)
{
    size_t len = strlen(in->spec), pos = 0;
    uint64_t h = wcons_hash(in->kind, in->strict, in->spec, len), v;
    /* routerd checked the spec within its own limits: a worker only guards
     * against a spec no router would send */
    td_grammar_opts_t o = { .strict = in->strict, .max_spec_bytes = WCONS_MAX_SPEC,
                            .budget_ms = WCONS_BUDGET_MS };
    td_grammar_err_t e;
    td_grammar_t *g;
    td_status_t st;

    pthread_mutex_lock(&wc.lock);
    while ((v = td_hmap_each(wc.ix, h, &pos)) != TD_HMAP_NONE) {
        wcons_entry_t *en = &wc.ents[v];
        if (en->live && en->kind == in->kind && en->strict == in->strict && en->len == len &&
            memcmp(en->spec, in->spec, len) == 0) {
            en->refs++;
            *ix = v;
            pthread_mutex_unlock(&wc.lock);
            return TD_OK;
        }
    }
    pthread_mutex_unlock(&wc.lock);
    st = td_grammar_compile(wc.v, (td_grammar_kind_t)(in->kind - 1), in->spec, len, &o, &g, &e);
    if (st != TD_OK) {
        snprintf(why, whylen, "constraint: %s%s%s", e.path, e.path[0] ? ": " : "", e.msg);
        return st;
    }
    pthread_mutex_lock(&wc.lock);
    wcons_evict();
    size_t i = 0;
    while (i < wc.nents && wc.ents[i].live)
        i++;
    char *spec = strdup(in->spec);
    if (i == wc.cap || spec == NULL || td_hmap_add(wc.ix, h, i) != TD_OK) {
        pthread_mutex_unlock(&wc.lock);
        free(spec);
        td_grammar_destroy(g);
        snprintf(why, whylen, "constraint: the cache of compiled grammars is full");
        return TD_ERR_BUSY;
    }
    wc.ents[i] = (wcons_entry_t){ in->kind, in->strict, spec, len, g, 1, true };
    if (i == wc.nents)
        wc.nents++;
    *ix = i;
    pthread_mutex_unlock(&wc.lock);
    return TD_OK;
}

static const uint64_t *
wcons_mask(void *ctx, td_status_t *st)
{
    td_wcons_t *c = ctx;
    const uint64_t *m;

    if (c->start_after >= 0)
        return NULL;   /* the reasoning is free */
    m = td_gmatch_mask(c->m);
    if (m == NULL)
        *st = TD_ERR_NOMEM;
    return m;
}

static td_status_t
wcons_take(void *ctx, int32_t token)
{
    td_wcons_t *c = ctx;

    if (c->start_after >= 0) {
        if (token == c->start_after)
            c->start_after = -1;
        return TD_OK;
    }
    return td_gmatch_advance(c->m, token);
}

td_status_t
td_wcons_create(const Tandem__Constraint *in, td_wcons_t **out, char *why, size_t whylen)
{
    td_wcons_t *c;
    size_t ix;
    td_status_t st;

    *out = NULL;
    if (in == NULL || in->kind == 0)
        return TD_OK;
    if (in->kind > 5 || in->spec == NULL) {
        snprintf(why, whylen, "constraint: kind %u is not one", in->kind);
        return TD_ERR_INVALID;
    }
    if (wc.v == NULL) {
        snprintf(why, whylen, "constraint: structured output needs the model's tokenizer "
                 "(tokenizer.json in the model directory); this worker has none");
        return TD_ERR_UNSUPPORTED;
    }
    if ((st = wcons_entry(in, &ix, why, whylen)) != TD_OK)
        return st;
    c = calloc(1, sizeof(*c));
    pthread_mutex_lock(&wc.lock);
    td_grammar_t *g = wc.ents[ix].g;
    pthread_mutex_unlock(&wc.lock);
    if (c == NULL || td_gmatch_create(g, &c->m) != TD_OK) {
        free(c);
        pthread_mutex_lock(&wc.lock);
        wc.ents[ix].refs--;
        pthread_mutex_unlock(&wc.lock);
        snprintf(why, whylen, "constraint: out of memory");
        return TD_ERR_NOMEM;
    }
    c->ent_ix = ix;
    c->start_after = in->start_after > 0 ? in->start_after - 1 : -1;
    c->hook = (td_engine_cons_t){ c, wcons_mask, wcons_take };
    *out = c;
    return TD_OK;
}

void
td_wcons_destroy(td_wcons_t *c)
{
    if (c == NULL)
        return;
    td_gmatch_destroy(c->m);
    pthread_mutex_lock(&wc.lock);
    wc.ents[c->ent_ix].refs--;
    pthread_mutex_unlock(&wc.lock);
    free(c);
}

const td_engine_cons_t *
td_wcons_hook(td_wcons_t *c)
{
    return &c->hook;
}
