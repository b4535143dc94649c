/* grammar/gmatch.c — compiling a grammar (the front end for its kind, then
 * sealing and the automaton's start state, within the size limit and the
 * time budget) and the matcher: a stack of automaton states, one per token
 * taken, so that rollback(n) is popping n of them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "gram.h"
#include "gvocab.h"

struct td_grammar {
    gdfa_t dfa;
    pthread_mutex_t lock;
    bool precomputed;
};

struct td_gmatch {
    td_grammar_t *g;
    uint32_t *hist;        /* [n + 1] the state before each token, then the current */
    size_t n, cap;
    bool ended;            /* an EOS was taken */
    uint64_t *scratch;     /* a mask when the grammar's cache is full */
};

static td_status_t
compile_front(gctx_t *c, td_grammar_kind_t kind, const char *spec, size_t len)
{
    switch (kind) {
    case TD_GRAMMAR_JSON_OBJECT:
        return gjson_build(c, NULL, 0, true);
    case TD_GRAMMAR_JSON_SCHEMA:
        return gjson_build(c, spec, len, false);
    case TD_GRAMMAR_REGEX: {
        uint32_t r = gb_rule(c);
        c->g->root = r;
        gb_rule_set(c, r, gregex_build(c, spec, len, false));
        return c->st;
    }
    case TD_GRAMMAR_CHOICE:
        return gchoice_build(c, spec, len);
    case TD_GRAMMAR_EBNF:
        return gebnf_build(c, spec, len);
    }
    return gctx_fail(c, TD_ERR_INVALID, "unknown grammar kind %d", (int)kind);
}

td_status_t
td_grammar_compile(const td_gvocab_t *v, td_grammar_kind_t kind, const char *spec, size_t len,
                   const td_grammar_opts_t *opts, td_grammar_t **out, td_grammar_err_t *err)
{
    td_grammar_opts_t o = opts != NULL ? *opts : (td_grammar_opts_t){ 0 };
    td_grammar_t *g = calloc(1, sizeof(*g));
    gctx_t c = { .opts = &o, .err = err };
    size_t max = o.max_spec_bytes ? o.max_spec_bytes : TD_GRAMMAR_MAX_SPEC;
    uint64_t budget = (uint64_t)(o.budget_ms ? o.budget_ms : TD_GRAMMAR_BUDGET_MS) * 1000000u;
    td_status_t st;

    if (err != NULL)
        *err = (td_grammar_err_t){ 0 };
    if (g == NULL)
        return TD_ERR_NOMEM;
    c.g = &g->dfa.g;
    c.deadline_ns = td_clock_ns() + budget;
    pthread_mutex_init(&g->lock, NULL);
    if (len > max) {
        st = gctx_fail(&c, TD_ERR_TOO_BIG, "the grammar is %zu bytes, over the limit of %zu",
                       len, max);
        goto err;
    }
    if ((st = compile_front(&c, kind, spec, len)) != TD_OK || (st = ggraph_seal(&c)) != TD_OK)
        goto err;
    if ((st = gdfa_init(&g->dfa, v)) != TD_OK) {
        gctx_fail(&c, st, "out of memory");
        goto err;
    }
    if (o.precompute) {
        st = gdfa_precompute(&g->dfa, 4096, c.deadline_ns);
        if (st == TD_ERR_TIMEOUT) {
            gctx_fail(&c, st, "compiling took longer than the budget of %llu ms",
                      (unsigned long long)(budget / 1000000u));
            goto err;
        }
        g->precomputed = st == TD_OK;   /* not finite-state: masks are made as needed */
    }
    *out = g;
    return TD_OK;
err:
    td_grammar_destroy(g);
    return c.st != TD_OK ? c.st : st;
}

void
td_grammar_destroy(td_grammar_t *g)
{
    if (g == NULL)
        return;
    gdfa_free(&g->dfa);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

const td_gvocab_t *
td_grammar_vocab(const td_grammar_t *g)
{
    return g->dfa.v;
}

void
td_grammar_stats(td_grammar_t *g, td_grammar_stats_t *out)
{
    pthread_mutex_lock(&g->lock);
    *out = (td_grammar_stats_t){ .rules = g->dfa.g.nrules, .nodes = g->dfa.g.nnodes,
                                 .frames = g->dfa.nframes, .states = g->dfa.nstates,
                                 .mask_bytes = g->dfa.mask_bytes,
                                 .precomputed = g->precomputed };
    out->masks = g->dfa.mask_bytes / (td_gvocab_mask_words(g->dfa.v) * sizeof(uint64_t));
    pthread_mutex_unlock(&g->lock);
}

/* ---- Matchers -------------------------------------------------------------------- */

td_status_t
td_gmatch_create(td_grammar_t *g, td_gmatch_t **out)
{
    td_gmatch_t *m = calloc(1, sizeof(*m));

    if (m == NULL)
        return TD_ERR_NOMEM;
    m->g = g;
    m->cap = 64;
    m->hist = malloc(m->cap * sizeof(uint32_t));
    m->scratch = malloc(td_gvocab_mask_words(g->dfa.v) * sizeof(uint64_t));
    if (m->hist == NULL || m->scratch == NULL) {
        td_gmatch_destroy(m);
        return TD_ERR_NOMEM;
    }
    m->hist[0] = g->dfa.start;
    *out = m;
    return TD_OK;
}

void
td_gmatch_destroy(td_gmatch_t *m)
{
    if (m == NULL)
        return;
    free(m->hist);
    free(m->scratch);
    free(m);
}

static uint32_t
match_state(const td_gmatch_t *m)
{
    return m->hist[m->n];
}

const uint64_t *
td_gmatch_mask(td_gmatch_t *m)
{
    const uint64_t *r;

    if (m->ended) {   /* nothing follows an EOS */
        memset(m->scratch, 0, td_gvocab_mask_words(m->g->dfa.v) * sizeof(uint64_t));
        return m->scratch;
    }
    pthread_mutex_lock(&m->g->lock);
    r = gdfa_mask(&m->g->dfa, match_state(m), m->scratch);
    if (r != NULL && r != m->scratch) {   /* cached masks live while the grammar does */
        memcpy(m->scratch, r, td_gvocab_mask_words(m->g->dfa.v) * sizeof(uint64_t));
        r = m->scratch;
    }
    pthread_mutex_unlock(&m->g->lock);
    return r;
}

bool
td_gmatch_accepts_eos(const td_gmatch_t *m)
{
    return !m->ended && m->g->dfa.states[match_state(m)].accept;
}

bool
td_gmatch_done(td_gmatch_t *m)
{
    bool done;

    pthread_mutex_lock(&m->g->lock);
    done = m->ended || m->g->dfa.states[match_state(m)].n == 0;
    pthread_mutex_unlock(&m->g->lock);
    return done;
}

static bool
is_eos(const td_gvocab_t *v, int32_t token)
{
    for (size_t i = 0; i < v->neos; i++)
        if (v->eos[i] == token)
            return true;
    return false;
}

td_status_t
td_gmatch_advance(td_gmatch_t *m, int32_t token)
{
    const td_gvocab_t *v = m->g->dfa.v;
    td_status_t st = TD_OK;
    uint32_t s;

    if (m->ended || token < 0 || (uint32_t)token >= v->size)
        return TD_ERR_INVALID;
    if (m->n + 2 > m->cap) {
        uint32_t *h = realloc(m->hist, m->cap * 2 * sizeof(uint32_t));
        if (h == NULL)
            return TD_ERR_NOMEM;
        m->hist = h;
        m->cap *= 2;
    }
    pthread_mutex_lock(&m->g->lock);
    s = match_state(m);
    if (is_eos(v, token)) {
        st = m->g->dfa.states[s].accept ? TD_OK : TD_ERR_INVALID;
        m->ended = st == TD_OK;
    } else {
        st = gdfa_token(&m->g->dfa, token, &s);
    }
    pthread_mutex_unlock(&m->g->lock);
    if (st != TD_OK)
        return st;
    m->hist[++m->n] = s;
    return TD_OK;
}

td_status_t
td_gmatch_rollback(td_gmatch_t *m, size_t n)
{
    if (n > m->n)
        return TD_ERR_RANGE;
    if (n > 0)
        m->ended = false;   /* an EOS is always the last token taken */
    m->n -= n;
    return TD_OK;
}

size_t
td_gmatch_taken(const td_gmatch_t *m)
{
    return m->n;
}
