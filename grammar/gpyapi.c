/* grammar/gpyapi.c — a thin C ABI over grammar/ for Python's ctypes (the library
 * tdgrammar): tests/grammar (the llguidance mask comparison, the units) and
 * bench/grammar call the engine through it, one native call per operation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

typedef struct {
    td_tokenizer_t *tok;
    td_gvocab_t *v;
} tdg_vocab_t;

void *tdg_vocab_load(const char *path, int eos);
void tdg_vocab_free(void *p);
int tdg_compile(void *vp, int kind, const char *spec, size_t len, int strict, int precompute,
                unsigned budget_ms, void **out, char *err, size_t errlen);
void tdg_grammar_free(void *g);
void *tdg_match_new(void *g);
void tdg_match_free(void *m);
int tdg_mask(void *m, uint64_t *out, size_t words);
int tdg_advance(void *m, int token);
int tdg_accepts(void *m);
int tdg_rollback(void *m, int n);
size_t tdg_states(void *g);
void tdg_noop(void);

void *
tdg_vocab_load(const char *path, int eos)
{
    tdg_vocab_t *p = calloc(1, sizeof(*p));
    int32_t e = eos;

    if (p == NULL || td_tokenizer_load(path, &p->tok) != TD_OK ||
        td_gvocab_create(p->tok, &e, 1, &p->v) != TD_OK) {
        tdg_vocab_free(p);
        return NULL;
    }
    return p;
}

void
tdg_vocab_free(void *vp)
{
    tdg_vocab_t *p = vp;
    if (p == NULL)
        return;
    td_gvocab_destroy(p->v);
    td_tokenizer_destroy(p->tok);
    free(p);
}

int
tdg_compile(void *vp, int kind, const char *spec, size_t len, int strict, int precompute,
            unsigned budget_ms, void **out, char *err, size_t errlen)
{
    tdg_vocab_t *p = vp;
    td_grammar_opts_t o = { .strict = strict != 0, .precompute = precompute != 0,
                            .budget_ms = budget_ms };
    td_grammar_err_t e;
    td_grammar_t *g;
    td_status_t st = td_grammar_compile(p->v, (td_grammar_kind_t)kind, spec, len, &o, &g, &e);

    if (st != TD_OK) {
        snprintf(err, errlen, "%s%s%s", e.path, e.path[0] ? ": " : "", e.msg);
        return st;
    }
    *out = g;
    return 0;
}

void
tdg_grammar_free(void *g)
{
    td_grammar_destroy(g);
}

void *
tdg_match_new(void *g)
{
    td_gmatch_t *m;
    return td_gmatch_create(g, &m) == TD_OK ? m : NULL;
}

void
tdg_match_free(void *m)
{
    td_gmatch_destroy(m);
}

int
tdg_mask(void *m, uint64_t *out, size_t words)
{
    const uint64_t *mask = td_gmatch_mask(m);
    if (mask == NULL)
        return -1;
    memcpy(out, mask, words * sizeof(uint64_t));
    return 0;
}

int
tdg_advance(void *m, int token)
{
    return td_gmatch_advance(m, token);
}

int
tdg_accepts(void *m)
{
    return td_gmatch_accepts_eos(m);
}

int
tdg_rollback(void *m, int n)
{
    return td_gmatch_rollback(m, (size_t)n);
}

size_t
tdg_states(void *g)
{
    td_grammar_stats_t s;
    td_grammar_stats(g, &s);
    return s.states;
}

void
tdg_noop(void)
{
}
