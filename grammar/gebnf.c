/* grammar/gebnf.c — the EBNF front end: the GBNF dialect (llama.cpp's, the
 * one vLLM hands to xgrammar): `name ::= alternatives` rules, "literals",
 * [classes], (groups), * + ? {m,n}, # comments; the start rule is root.
 * Left recursion is refused (ggraph_seal). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

typedef struct {
    gctx_t *c;
    const char *s;
    size_t len, i;
    td_hmap_t *names;        /* name hash -> index into name/rule arrays (a multimap) */
    const char **name;       /* [n] pointers into s */
    size_t *nlen;
    uint32_t *rule;
    bool *defined;
    size_t n, cap;
    int depth;
} eb_t;

static gfrag_t eb_alt(eb_t *e);

static void
eb_skip(eb_t *e)
{
    while (e->i < e->len) {
        char ch = e->s[e->i];
        if (ch == '#') {
            while (e->i < e->len && e->s[e->i] != '\n')
                e->i++;
        } else if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
            e->i++;
        } else {
            break;
        }
    }
}

static bool
eb_namech(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_';
}

static uint64_t
eb_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The rule of a name, made on first use. */
static uint32_t
eb_rule_of(eb_t *e, const char *nm, size_t n)
{
    uint64_t h = eb_hash(nm, n), v;
    size_t pos = 0;

    while ((v = td_hmap_each(e->names, h, &pos)) != TD_HMAP_NONE)
        if (e->nlen[v] == n && memcmp(e->name[v], nm, n) == 0)
            return e->rule[v];
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 32;
        const char **a = realloc(e->name, nc * sizeof(*a));
        if (a != NULL)
            e->name = a;
        size_t *b = realloc(e->nlen, nc * sizeof(*b));
        if (b != NULL)
            e->nlen = b;
        uint32_t *r = realloc(e->rule, nc * sizeof(*r));
        if (r != NULL)
            e->rule = r;
        bool *d = realloc(e->defined, nc * sizeof(*d));
        if (d != NULL)
            e->defined = d;
        if (a == NULL || b == NULL || r == NULL || d == NULL) {
            gctx_fail(e->c, TD_ERR_NOMEM, "out of memory");
            return 0;
        }
        e->cap = nc;
    }
    e->name[e->n] = nm;
    e->nlen[e->n] = n;
    e->rule[e->n] = gb_rule(e->c);
    e->defined[e->n] = false;
    if (td_hmap_add(e->names, h, e->n) != TD_OK) {
        gctx_fail(e->c, TD_ERR_NOMEM, "out of memory");
        return 0;
    }
    return e->rule[e->n++];
}

static gfrag_t
eb_fail(eb_t *e, const char *what)
{
    size_t line = 1;
    for (size_t k = 0; k < e->i && k < e->len; k++)
        line += e->s[k] == '\n';
    gctx_fail(e->c, TD_ERR_INVALID, "invalid grammar at line %zu: %s", line, what);
    return gb_empty(e->c);
}

/* Whether a rule definition starts here (name ::=). */
static bool
eb_at_def(eb_t *e)
{
    size_t k = e->i;
    while (k < e->len && eb_namech(e->s[k]))
        k++;
    if (k == e->i)
        return false;
    while (k < e->len && (e->s[k] == ' ' || e->s[k] == '\t'))
        k++;
    return k + 3 <= e->len && memcmp(e->s + k, "::=", 3) == 0;
}

/* A "literal" or [class]: the regex front end reads both (a literal's
 * characters quoted). */
static gfrag_t
eb_terminal(eb_t *e)
{
    char open = e->s[e->i], close = open == '"' ? '"' : ']';
    size_t k = e->i + 1;

    while (k < e->len && e->s[k] != close)
        k += e->s[k] == '\\' ? 2 : 1;
    if (k >= e->len)
        return eb_fail(e, open == '"' ? "a literal without its closing quote"
                                      : "a class without its ']'");
    if (open == '[') {
        gfrag_t f = gregex_build(e->c, e->s + e->i, k + 1 - e->i, false);
        e->i = k + 1;
        return f;
    }
    /* a literal: each character taken as itself, escapes as in a regex */
    gfrag_t f = gb_empty(e->c);
    size_t p = e->i + 1;
    while (p < k && e->c->st == TD_OK) {
        size_t q = p + (e->s[p] == '\\' ? 2 : 1);
        if (e->s[p] == '\\' && q <= k && (e->s[p + 1] == 'x' || e->s[p + 1] == 'u'))
            q = p + (e->s[p + 1] == 'x' ? 4 : 6);
        while (e->s[p] != '\\' && q < k && ((uint8_t)e->s[q] & 0xC0) == 0x80)
            q++;
        char buf[16];
        size_t n = q - p;
        if (n > 12 || q > k)
            return eb_fail(e, "a bad escape in a literal");
        bool special = n == 1 && strchr("()[]{}.*+?|^$\\", e->s[p]) != NULL;
        buf[0] = '\\';
        memcpy(buf + special, e->s + p, n);
        f = gb_seq(e->c, f, gregex_build(e->c, buf, n + special, false));
        p = q;
    }
    e->i = k + 1;
    return f;
}

static gfrag_t
eb_atom(eb_t *e)
{
    char ch = e->s[e->i];

    if (ch == '"' || ch == '[')
        return eb_terminal(e);
    if (ch == '(') {
        e->i++;
        if (++e->depth > 128)
            return eb_fail(e, "groups nested too deep");
        gfrag_t f = eb_alt(e);
        e->depth--;
        eb_skip(e);
        if (e->i >= e->len || e->s[e->i] != ')')
            return eb_fail(e, "a group without its ')'");
        e->i++;
        return f;
    }
    if (ch == '.') {
        e->i++;
        return gregex_build(e->c, "(.|\\n)", 6, false);
    }
    if (eb_namech(ch)) {
        size_t k = e->i;
        while (k < e->len && eb_namech(e->s[k]))
            k++;
        uint32_t r = eb_rule_of(e, e->s + e->i, k - e->i);
        e->i = k;
        return gb_callf(e->c, r);
    }
    return eb_fail(e, "expected a literal, a class, a group or a rule name");
}

static gfrag_t
eb_piece(eb_t *e)
{
    gfrag_t f = eb_atom(e);

    while (e->i < e->len && e->c->st == TD_OK) {
        char q = e->s[e->i];
        if (q == '*' || q == '+' || q == '?') {
            e->i++;
            f = q == '*' ? gb_star(e->c, f) : q == '+' ? gb_plus(e->c, f) : gb_opt(e->c, f);
        } else if (q == '{') {
            size_t k = e->i;
            while (k < e->len && e->s[k] != '}')
                k++;
            if (k >= e->len)
                return eb_fail(e, "a {m,n} without its '}'");
            /* the regex front end reads the bounds: x{m,n} over a rule */
            char buf[40];
            size_t n = k + 1 - e->i;
            if (n + 1 > sizeof buf)
                return eb_fail(e, "a bad {m,n}");
            buf[0] = 'x';
            memcpy(buf + 1, e->s + e->i, n);
            unsigned long a = 0, b = 0;
            int got = sscanf(buf + 2, "%lu,%lu", &a, &b);
            bool open = got == 1 && memchr(buf, ',', n + 1) != NULL;
            if (got < 1 || a > 10000 || (got == 2 && (b < a || b > 10000)))
                return eb_fail(e, "a bad {m,n} (at most 10000)");
            uint32_t rule = gb_rule(e->c);
            gb_rule_set(e->c, rule, f);
            f = gb_repeat(e->c, rule, (uint32_t)a, open ? UINT32_MAX : got == 2 ? (uint32_t)b
                                                                               : (uint32_t)a);
            e->i = k + 1;
        } else {
            break;
        }
    }
    return f;
}

static gfrag_t
eb_seq(eb_t *e)
{
    gfrag_t f = gb_empty(e->c);

    for (;;) {
        eb_skip(e);
        if (e->i >= e->len || e->s[e->i] == '|' || e->s[e->i] == ')' || eb_at_def(e) ||
            e->c->st != TD_OK)
            return f;
        f = gb_seq(e->c, f, eb_piece(e));
    }
}

static gfrag_t
eb_alt(eb_t *e)
{
    gfrag_t alt = gb_alt_begin(e->c);

    gb_alt_add(e->c, alt, eb_seq(e));
    while (e->i < e->len && e->s[e->i] == '|' && e->c->st == TD_OK) {
        e->i++;
        gb_alt_add(e->c, alt, eb_seq(e));
    }
    return alt;
}

td_status_t
gebnf_build(gctx_t *c, const char *spec, size_t len)
{
    eb_t e = { .c = c, .s = spec, .len = len };
    td_status_t st;

    if ((st = td_hmap_create(64, &e.names)) != TD_OK)
        return gctx_fail(c, st, "out of memory");
    c->g->root = eb_rule_of(&e, "root", 4);
    for (eb_skip(&e); e.i < len && c->st == TD_OK; eb_skip(&e)) {
        size_t k = e.i;
        if (!eb_at_def(&e)) {
            eb_fail(&e, "expected a rule: name ::= ...");
            break;
        }
        while (eb_namech(spec[k]))
            k++;
        uint32_t r = eb_rule_of(&e, spec + e.i, k - e.i);
        size_t ix = e.n;
        for (size_t q = 0; q < e.n; q++)
            if (e.rule[q] == r)
                ix = q;
        if (e.defined[ix]) {
            eb_fail(&e, "a rule defined twice");
            break;
        }
        e.defined[ix] = true;
        e.i = (size_t)((const char *)memmem(spec + k, len - k, "::=", 3) - spec) + 3;
        gb_rule_set(c, r, eb_alt(&e));
        eb_skip(&e);
        if (e.i < len && e.s[e.i] == ')')
            eb_fail(&e, "an unmatched ')'");
    }
    for (size_t q = 0; q < e.n && c->st == TD_OK; q++)
        if (!e.defined[q])
            gctx_fail(c, TD_ERR_INVALID, "rule %.*s is used but not defined", (int)e.nlen[q],
                      e.name[q]);
    td_hmap_destroy(e.names);
    free(e.name);
    free(e.nlen);
    free(e.rule);
    free(e.defined);
    return c->st;
}
