/* grammar/gbuild.c — the rule graph: building it (nodes, edges, fragments,
 * code-point sets as UTF-8 and as JSON string content), sealing it, and the
 * checks every grammar passes before use: each rule derives some string, and
 * none calls itself before consuming a byte. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "gram.h"

/* ---- Errors and the budget ------------------------------------------------------ */

td_status_t
gctx_fail(gctx_t *c, td_status_t st, const char *fmt, ...)
{
    va_list ap;

    if (c->st != TD_OK)
        return c->st;
    c->st = st;
    if (c->err != NULL) {
        snprintf(c->err->path, sizeof(c->err->path), "%s", c->path);
        va_start(ap, fmt);
        vsnprintf(c->err->msg, sizeof(c->err->msg), fmt, ap);
        va_end(ap);
    }
    return st;
}

td_status_t
gctx_tick(gctx_t *c)
{
    if (c->st == TD_OK && td_clock_ns() > c->deadline_ns)
        gctx_fail(c, TD_ERR_TIMEOUT, "compiling took longer than the budget of %u ms",
                  c->opts->budget_ms ? c->opts->budget_ms : TD_GRAMMAR_BUDGET_MS);
    return c->st;
}

/* ---- Nodes, edges, rules -------------------------------------------------------- */

/* Grow *p (of *cap elements of size sz) to hold n + 1. */
static bool
grow(gctx_t *c, void **p, size_t *cap, size_t n, size_t sz)
{
    if (n < *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 64;
    void *q = realloc(*p, nc * sz);
    if (q == NULL) {
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        return false;
    }
    *p = q;
    *cap = nc;
    return true;
}

uint32_t
gb_node(gctx_t *c)
{
    ggraph_t *g = c->g;

    if (!grow(c, (void **)&g->nodes, &g->cnodes, g->nnodes, sizeof(gnode_t)))
        return 0;
    g->nodes[g->nnodes] = (gnode_t){ 0 };
    return (uint32_t)g->nnodes++;
}

static void
gb_edge(gctx_t *c, gedge_t e)
{
    ggraph_t *g = c->g;

    if (c->st != TD_OK || !grow(c, (void **)&g->edges, &g->cedges, g->nedges, sizeof(gedge_t)))
        return;
    g->edges[g->nedges++] = e;
}

void
gb_bytes(gctx_t *c, uint32_t from, uint32_t to, uint8_t lo, uint8_t hi)
{
    gb_edge(c, (gedge_t){ .from = from, .to = to, .kind = GE_BYTES, .lo = lo, .hi = hi });
}

void
gb_eps(gctx_t *c, uint32_t from, uint32_t to)
{
    gb_edge(c, (gedge_t){ .from = from, .to = to, .kind = GE_EPS });
}

void
gb_call(gctx_t *c, uint32_t from, uint32_t to, uint32_t rule)
{
    gb_edge(c, (gedge_t){ .from = from, .to = to, .kind = GE_CALL, .rule = rule });
}

uint32_t
gb_rule(gctx_t *c)
{
    ggraph_t *g = c->g;
    uint32_t s = gb_node(c), e = gb_node(c);

    if (c->st != TD_OK || !grow(c, (void **)&g->rules, &g->crules, g->nrules, sizeof(grule_t)))
        return 0;
    g->nodes[e].final = true;
    g->rules[g->nrules] = (grule_t){ s, e };
    return (uint32_t)g->nrules++;
}

void
gb_rule_set(gctx_t *c, uint32_t rule, gfrag_t body)
{
    if (c->st != TD_OK)
        return;
    gb_eps(c, c->g->rules[rule].start, body.s);
    gb_eps(c, body.e, c->g->rules[rule].end);
}

/* ---- Fragments ------------------------------------------------------------------ */

gfrag_t
gb_empty(gctx_t *c)
{
    uint32_t n = gb_node(c);
    return (gfrag_t){ n, n };
}

gfrag_t
gb_lit(gctx_t *c, const char *s, size_t len)
{
    gfrag_t f = gb_empty(c);

    for (size_t i = 0; i < len; i++) {
        uint32_t n = gb_node(c);
        gb_bytes(c, f.e, n, (uint8_t)s[i], (uint8_t)s[i]);
        f.e = n;
    }
    return f;
}

gfrag_t
gb_range(gctx_t *c, uint8_t lo, uint8_t hi)
{
    gfrag_t f = { gb_node(c), gb_node(c) };
    gb_bytes(c, f.s, f.e, lo, hi);
    return f;
}

gfrag_t
gb_callf(gctx_t *c, uint32_t rule)
{
    gfrag_t f = { gb_node(c), gb_node(c) };
    gb_call(c, f.s, f.e, rule);
    return f;
}

gfrag_t
gb_seq(gctx_t *c, gfrag_t a, gfrag_t b)
{
    gb_eps(c, a.e, b.s);
    return (gfrag_t){ a.s, b.e };
}

gfrag_t
gb_alt_begin(gctx_t *c)
{
    return (gfrag_t){ gb_node(c), gb_node(c) };
}

void
gb_alt_add(gctx_t *c, gfrag_t alt, gfrag_t f)
{
    gb_eps(c, alt.s, f.s);
    gb_eps(c, f.e, alt.e);
}

gfrag_t
gb_opt(gctx_t *c, gfrag_t f)
{
    gfrag_t a = gb_alt_begin(c);
    gb_alt_add(c, a, f);
    gb_eps(c, a.s, a.e);
    return a;
}

gfrag_t
gb_star(gctx_t *c, gfrag_t f)
{
    gfrag_t a = gb_alt_begin(c);
    gb_eps(c, a.s, f.s);
    gb_eps(c, f.e, a.s);
    gb_eps(c, a.s, a.e);
    return a;
}

gfrag_t
gb_plus(gctx_t *c, gfrag_t f)
{
    gfrag_t a = gb_alt_begin(c);
    gb_eps(c, a.s, f.s);
    gb_eps(c, f.e, a.s);
    gb_eps(c, f.e, a.e);
    return a;
}

gfrag_t
gb_repeat_sep(gctx_t *c, uint32_t rule, gfrag_t (*sep)(gctx_t *), uint32_t min, uint32_t max)
{
    gfrag_t f = gb_empty(c);
    gfrag_t out = gb_alt_begin(c);

    gb_eps(c, out.s, f.s);
    for (uint32_t i = 0; c->st == TD_OK && (i < min || (max != UINT32_MAX && i < max)); i++) {
        if (i >= min)
            gb_eps(c, f.e, out.e);
        if (i > 0 && sep != NULL)
            f = gb_seq(c, f, sep(c));
        f = gb_seq(c, f, gb_callf(c, rule));
        if ((i & 255) == 255)
            gctx_tick(c);
    }
    if (max == UINT32_MAX) {   /* then (sep rule)* */
        gfrag_t more = gb_callf(c, rule);
        if (sep != NULL && min > 0)
            more = gb_seq(c, sep(c), more);
        if (sep != NULL && min == 0) {   /* (rule (sep rule)*)? */
            gfrag_t tail = gb_star(c, gb_seq(c, sep(c), gb_callf(c, rule)));
            gb_eps(c, f.e, out.e);
            f = gb_seq(c, f, gb_seq(c, gb_callf(c, rule), tail));
        } else {
            f = gb_seq(c, f, gb_star(c, more));
        }
    }
    gb_eps(c, f.e, out.e);
    return out;
}

gfrag_t
gb_repeat(gctx_t *c, uint32_t rule, uint32_t min, uint32_t max)
{
    return gb_repeat_sep(c, rule, NULL, min, max);
}

/* ---- Code-point sets ------------------------------------------------------------- */

void
gcset_add(gcset_t *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return;
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        void *q = realloc(s->r, nc * sizeof(*s->r));
        if (q == NULL)
            return;   /* the set stays smaller; the caller's nomem check is the graph's */
        s->r = q;
        s->cap = nc;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

void
gcset_free(gcset_t *s)
{
    free(s->r);
    *s = (gcset_t){ 0 };
}

static int
range_cmp(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void
gcset_norm(gcset_t *s)
{
    size_t k = 0;

    qsort(s->r, s->n, sizeof(*s->r), range_cmp);
    for (size_t i = 0; i < s->n; i++) {
        if (k > 0 && s->r[i][0] <= s->r[k - 1][1] + 1) {
            if (s->r[i][1] > s->r[k - 1][1])
                s->r[k - 1][1] = s->r[i][1];
        } else {
            s->r[k][0] = s->r[i][0];
            s->r[k][1] = s->r[i][1];
            k++;
        }
    }
    s->n = k;
}

void
gcset_negate(gcset_t *s)
{
    gcset_t o = { 0 };
    uint32_t next = 0;

    gcset_norm(s);
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next)
            gcset_add(&o, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= 0x10FFFF)
        gcset_add(&o, next, 0x10FFFF);
    gcset_free(s);
    *s = o;
}

/* The UTF-8 bytes of cp; their count. */
static int
utf8_enc(uint32_t cp, uint8_t b[4])
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | cp >> 18);
    b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* [lo, hi] (no surrogates) as byte-range sequences, each an alternative of alt:
 * split where the encoded length changes, then where the ranges of the
 * continuation bytes stop being whole, until every byte position is a range. */
static void
utf8_range(gctx_t *c, gfrag_t alt, uint32_t lo, uint32_t hi)
{
    static const uint32_t maxs[] = { 0x7F, 0x7FF, 0xFFFF };
    uint8_t a[4], b[4];

    for (int i = 0; i < 3; i++)
        if (lo <= maxs[i] && hi > maxs[i]) {
            utf8_range(c, alt, lo, maxs[i]);
            utf8_range(c, alt, maxs[i] + 1, hi);
            return;
        }
    int n = utf8_enc(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(c, alt, lo, lo | m);
                utf8_range(c, alt, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(c, alt, lo, (hi & ~m) - 1);
                utf8_range(c, alt, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_enc(hi, b);
    gfrag_t f = gb_empty(c);
    for (int i = 0; i < n; i++)
        f = gb_seq(c, f, gb_range(c, a[i], b[i]));
    gb_alt_add(c, alt, f);
}

/* s's ranges without the surrogates, into alt. */
static void
utf8_set(gctx_t *c, gfrag_t alt, const gcset_t *s, uint32_t from)
{
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0] < from ? from : s->r[i][0], hi = s->r[i][1];
        if (hi > 0x10FFFF)
            hi = 0x10FFFF;
        if (lo > hi)
            continue;
        if (lo < 0xD800 && hi >= 0xD800) {
            utf8_range(c, alt, lo, 0xD7FF);
            lo = 0xD800;
        }
        if (lo <= 0xDFFF && hi >= 0xD800)
            lo = 0xE000;
        if (lo <= hi)
            utf8_range(c, alt, lo, hi);
    }
}

gfrag_t
gb_utf8(gctx_t *c, const gcset_t *s)
{
    gfrag_t alt = gb_alt_begin(c);
    utf8_set(c, alt, s, 0);
    return alt;
}

static bool
cset_has(const gcset_t *s, uint32_t cp)
{
    for (size_t i = 0; i < s->n; i++)
        if (cp >= s->r[i][0] && cp <= s->r[i][1])
            return true;
    return false;
}

/* A control character's JSON escape: its short form where JSON has one,
 * else \u00XX (lower-case hex). */
static void
json_escape_cp(gctx_t *c, gfrag_t alt, uint32_t cp)
{
    static const char *const shorts[] = { ['\b'] = "\\b", ['\f'] = "\\f", ['\n'] = "\\n",
                                          ['\r'] = "\\r", ['\t'] = "\\t", ['"'] = "\\\"",
                                          ['\\'] = "\\\\" };
    char buf[8];

    if (cp < sizeof shorts / sizeof shorts[0] && shorts[cp] != NULL) {
        gb_alt_add(c, alt, gb_lit(c, shorts[cp], 2));
        return;
    }
    snprintf(buf, sizeof buf, "\\u%04x", (unsigned)cp);
    gb_alt_add(c, alt, gb_lit(c, buf, 6));
}

gfrag_t
gb_json_chars(gctx_t *c, const gcset_t *s)
{
    gfrag_t alt = gb_alt_begin(c);
    gcset_t lit = { 0 };

    for (uint32_t cp = 0; cp < 0x20; cp++)
        if (cset_has(s, cp))
            json_escape_cp(c, alt, cp);
    if (cset_has(s, '"'))
        json_escape_cp(c, alt, '"');
    if (cset_has(s, '\\'))
        json_escape_cp(c, alt, '\\');
    if (cset_has(s, 0x7F))
        json_escape_cp(c, alt, 0x7F);
    for (size_t i = 0; i < s->n; i++) {   /* the rest, literal: not ", \, DEL nor controls */
        uint32_t lo = s->r[i][0] < 0x20 ? 0x20 : s->r[i][0], hi = s->r[i][1];
        static const uint32_t cuts[] = { '"', '\\', 0x7F };
        for (size_t k = 0; k < 3; k++) {
            uint32_t cut = cuts[k];
            if (lo <= cut && hi >= cut) {
                gcset_add(&lit, lo, cut - 1);
                lo = cut + 1;
            }
        }
        gcset_add(&lit, lo, hi);
    }
    utf8_set(c, alt, &lit, 0x20);
    gcset_free(&lit);
    return alt;
}

/* ---- Sealing and checks -------------------------------------------------------- */

static int
edge_cmp(const void *a, const void *b)
{
    const gedge_t *x = a, *y = b;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    if ((x->kind == GE_BYTES) != (y->kind == GE_BYTES))
        return x->kind == GE_BYTES ? -1 : 1;
    return 0;
}

static void
seal_index(ggraph_t *g)
{
    qsort(g->edges, g->nedges, sizeof(gedge_t), edge_cmp);
    for (size_t i = 0; i < g->nnodes; i++)
        g->nodes[i].first = g->nodes[i].n = g->nodes[i].nbytes = 0;
    for (size_t i = g->nedges; i-- > 0;) {
        gnode_t *n = &g->nodes[g->edges[i].from];
        n->first = (uint32_t)i;
        n->n++;
        n->nbytes += g->edges[i].kind == GE_BYTES;
    }
}

/* Nodes from which the end of their rule can be reached (done[]), through
 * byte and epsilon edges and calls of rules whose start can; fixpoint over
 * the edges, later ones first (fragments are built forwards). */
static td_status_t
seal_productive(gctx_t *c, bool *done)
{
    ggraph_t *g = c->g;
    bool changed = true;

    for (size_t i = 0; i < g->nnodes; i++)
        done[i] = g->nodes[i].final;
    while (changed) {
        changed = false;
        for (size_t i = g->nedges; i-- > 0;) {
            const gedge_t *e = &g->edges[i];
            if (done[e->from] || !done[e->to])
                continue;
            if (e->kind == GE_CALL && !done[g->rules[e->rule].start])
                continue;
            done[e->from] = changed = true;
        }
        if (gctx_tick(c) != TD_OK)
            return c->st;
    }
    return TD_OK;
}

/* Drop the edges into nodes that cannot finish and the calls of rules that
 * derive nothing: every state a matcher reaches can then be completed. */
static void
seal_prune(ggraph_t *g, const bool *done)
{
    size_t k = 0;

    for (size_t i = 0; i < g->nedges; i++) {
        const gedge_t *e = &g->edges[i];
        if (!done[e->to] || (e->kind == GE_CALL && !done[g->rules[e->rule].start]))
            continue;
        g->edges[k++] = *e;
    }
    g->nedges = k;
}

/* Whether rule r can derive the empty string (nullable[] of the rules known
 * so far), by a walk over epsilon edges and nullable calls. */
static bool
rule_nullable(const ggraph_t *g, uint32_t r, const bool *nullable, uint32_t *stack,
              uint32_t *seen, uint32_t gen)
{
    size_t sp = 0;
    bool found = false;

    stack[sp++] = g->rules[r].start;
    seen[g->rules[r].start] = gen;
    while (sp > 0 && !found) {
        uint32_t n = stack[--sp];
        const gnode_t *nd = &g->nodes[n];
        found = n == g->rules[r].end;
        for (uint32_t i = nd->nbytes; i < nd->n; i++) {
            const gedge_t *e = &g->edges[nd->first + i];
            if ((e->kind == GE_EPS || nullable[e->rule]) && seen[e->to] != gen) {
                seen[e->to] = gen;
                stack[sp++] = e->to;
            }
        }
    }
    return found;
}

/* Rules called from rule r before a byte is consumed: calls[] gets them
 * (marked, with ncalls). */
static size_t
rule_left_calls(const ggraph_t *g, uint32_t r, const bool *nullable, uint32_t *stack,
                uint32_t *seen, uint32_t gen, uint32_t *calls)
{
    size_t sp = 0, ncalls = 0;

    stack[sp++] = g->rules[r].start;
    seen[g->rules[r].start] = gen;
    while (sp > 0) {
        const gnode_t *nd = &g->nodes[stack[--sp]];
        for (uint32_t i = nd->nbytes; i < nd->n; i++) {
            const gedge_t *e = &g->edges[nd->first + i];
            if (e->kind == GE_CALL)
                calls[ncalls++] = e->rule;
            if ((e->kind == GE_EPS || nullable[e->rule]) && seen[e->to] != gen) {
                seen[e->to] = gen;
                stack[sp++] = e->to;
            }
        }
    }
    return ncalls;
}

/* Left recursion: the rules each rule calls before consuming a byte form a
 * graph that must have no cycle (Kahn's order leaves the rules of a cycle). */
static td_status_t
seal_left_recursion(gctx_t *c, const bool *nullable, uint32_t *stack, uint32_t *seen)
{
    ggraph_t *g = c->g;
    size_t nr = g->nrules;
    uint32_t *off = calloc(nr + 1, sizeof(uint32_t)), *calls = malloc((g->nedges + 1) * 4);
    uint32_t *indeg = calloc(nr, sizeof(uint32_t)), *queue = malloc((nr + 1) * 4);
    size_t ncalls = 0, qh = 0, qt = 0;

    if (off == NULL || calls == NULL || indeg == NULL || queue == NULL) {
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t r = 0; r < nr; r++) {
        off[r] = (uint32_t)ncalls;
        ncalls += rule_left_calls(g, (uint32_t)r, nullable, stack, seen, (uint32_t)(nr + r + 2),
                                  calls + ncalls);
    }
    off[nr] = (uint32_t)ncalls;
    for (size_t i = 0; i < ncalls; i++)
        indeg[calls[i]]++;
    for (size_t r = 0; r < nr; r++)
        if (indeg[r] == 0)
            queue[qt++] = (uint32_t)r;
    while (qh < qt) {
        uint32_t r = queue[qh++];
        for (uint32_t i = off[r]; i < off[r + 1]; i++)
            if (--indeg[calls[i]] == 0)
                queue[qt++] = calls[i];
    }
    for (size_t r = 0; qt < nr && r < nr; r++)
        if (indeg[r] != 0) {
            gctx_fail(c, TD_ERR_UNSUPPORTED, "left recursion (rule %zu calls itself before "
                      "consuming any input) is not supported", r);
            break;
        }
out:
    free(off);
    free(calls);
    free(indeg);
    free(queue);
    return c->st;
}

td_status_t
ggraph_seal(gctx_t *c)
{
    ggraph_t *g = c->g;
    bool *done = NULL, *nullable = NULL;
    uint32_t *stack = NULL, *seen = NULL;
    bool changed = true;

    if (c->st != TD_OK)
        return c->st;
    seal_index(g);
    done = malloc(g->nnodes + 1);
    nullable = calloc(g->nrules + 1, 1);
    stack = malloc((g->nnodes + g->nedges + 1) * sizeof(uint32_t));
    seen = calloc(g->nnodes + 1, sizeof(uint32_t));
    if (done == NULL || nullable == NULL || stack == NULL || seen == NULL) {
        gctx_fail(c, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (seal_productive(c, done) != TD_OK)
        goto out;
    if (!done[g->rules[g->root].start]) {
        c->path[0] = '\0';
        gctx_fail(c, TD_ERR_INVALID, "the grammar matches no finite string (recursion "
                  "without a base case, or an unsatisfiable part)");
        goto out;
    }
    seal_prune(g, done);
    seal_index(g);
    while (changed) {
        changed = false;
        for (size_t r = 0; r < g->nrules; r++)
            if (!nullable[r] && rule_nullable(g, (uint32_t)r, nullable, stack, seen,
                                              (uint32_t)(r + 1)))
                nullable[r] = changed = true;
        if (gctx_tick(c) != TD_OK)
            goto out;
        memset(seen, 0, (g->nnodes + 1) * sizeof(uint32_t));
    }
    seal_left_recursion(c, nullable, stack, seen);
out:
    free(done);
    free(nullable);
    free(stack);
    free(seen);
    return c->st;
}

void
ggraph_free(ggraph_t *g)
{
    free(g->nodes);
    free(g->edges);
    free(g->rules);
    *g = (ggraph_t){ 0 };
}
