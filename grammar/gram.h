/* grammar/gram.h — inside the grammar engine: the rule graph every input
 * compiles to (nodes with byte-range, epsilon and rule-call edges; a rule is
 * a start node and an end node), the builder the front ends (JSON Schema,
 * regex, EBNF) use, and the compile context they report errors through. */
#ifndef TD_GRAM_H
#define TD_GRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "hmap.h"

enum { GE_BYTES = 0, GE_EPS = 1, GE_CALL = 2 };

typedef struct {
    uint32_t from, to;     /* nodes */
    uint32_t rule;         /* GE_CALL: the rule called; to is where it returns */
    uint8_t kind, lo, hi;  /* GE_BYTES: the bytes [lo, hi] */
} gedge_t;

typedef struct {
    uint32_t first, n;     /* edges [first, first + n) once sealed */
    uint32_t nbytes;       /* of those, the byte edges (they come first) */
    bool final;            /* a rule's end node */
} gnode_t;

typedef struct {
    uint32_t start, end;
} grule_t;

/* A piece of graph with one entry and one exit node. */
typedef struct {
    uint32_t s, e;
} gfrag_t;

/* The graph, built then sealed (edges sorted by node, byte edges first). */
typedef struct {
    gnode_t *nodes;
    size_t nnodes, cnodes;
    gedge_t *edges;
    size_t nedges, cedges;
    grule_t *rules;
    size_t nrules, crules;
    uint32_t root;         /* the start rule */
} ggraph_t;

/* A compile: the graph being built, its options, the clock and where an
 * error goes. The first error wins; later ones are ignored. */
typedef struct {
    ggraph_t *g;
    const td_grammar_opts_t *opts;
    td_grammar_err_t *err;
    td_status_t st;          /* the first failure, TD_OK until then */
    uint64_t deadline_ns;
    char path[160];          /* the JSON path being compiled (JSON Schema) */
} gctx_t;

/* Record a failure at the current path (the first one only). Returns st. */
td_status_t gctx_fail(gctx_t *c, td_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* TD_ERR_TIMEOUT once the budget has passed (recorded). */
td_status_t gctx_tick(gctx_t *c);

/* ---- Building ---------------------------------------------------------------- */

uint32_t gb_node(gctx_t *c);
void gb_bytes(gctx_t *c, uint32_t from, uint32_t to, uint8_t lo, uint8_t hi);
void gb_eps(gctx_t *c, uint32_t from, uint32_t to);
void gb_call(gctx_t *c, uint32_t from, uint32_t to, uint32_t rule);
/* A new rule with fresh start and end nodes; its body is added later with
 * gb_rule_set. */
uint32_t gb_rule(gctx_t *c);
void gb_rule_set(gctx_t *c, uint32_t rule, gfrag_t body);

gfrag_t gb_empty(gctx_t *c);
gfrag_t gb_lit(gctx_t *c, const char *s, size_t len);
gfrag_t gb_range(gctx_t *c, uint8_t lo, uint8_t hi);
gfrag_t gb_callf(gctx_t *c, uint32_t rule);
gfrag_t gb_seq(gctx_t *c, gfrag_t a, gfrag_t b);
/* Alternatives: start with gb_alt_begin, add each with gb_alt_add. */
gfrag_t gb_alt_begin(gctx_t *c);
void gb_alt_add(gctx_t *c, gfrag_t alt, gfrag_t f);
gfrag_t gb_opt(gctx_t *c, gfrag_t f);
gfrag_t gb_star(gctx_t *c, gfrag_t f);
gfrag_t gb_plus(gctx_t *c, gfrag_t f);
/* rule repeated min..max times (max UINT32_MAX: unbounded). */
gfrag_t gb_repeat(gctx_t *c, uint32_t rule, uint32_t min, uint32_t max);
/* rule repeated min..max times with sep between. */
gfrag_t gb_repeat_sep(gctx_t *c, uint32_t rule, gfrag_t (*sep)(gctx_t *), uint32_t min,
                      uint32_t max);

/* A set of Unicode code points as sorted, disjoint ranges. */
typedef struct {
    uint32_t (*r)[2];
    size_t n, cap;
} gcset_t;

void gcset_add(gcset_t *s, uint32_t lo, uint32_t hi);
void gcset_free(gcset_t *s);
/* Sort and merge. */
void gcset_norm(gcset_t *s);
/* The complement within [0, 0x10FFFF] less the surrogates. */
void gcset_negate(gcset_t *s);
/* The UTF-8 encodings of the code points of s (normalised), as a fragment. */
gfrag_t gb_utf8(gctx_t *c, const gcset_t *s);
/* The same, as JSON string content: each code point as it may appear inside a
 * JSON string (", \ and controls escaped; others literal or \uXXXX-escaped
 * per docs). */
gfrag_t gb_json_chars(gctx_t *c, const gcset_t *s);

/* ---- Front ends ---------------------------------------------------------------- */

/* A regex (whole-match) as a fragment; json: its characters as JSON string
 * content. Errors are recorded in c with `what` naming the pattern's field. */
gfrag_t gregex_build(gctx_t *c, const char *re, size_t len, bool json);
/* A JSON Schema (or json_object when schema is NULL) as the root rule. */
td_status_t gjson_build(gctx_t *c, const char *spec, size_t len, bool object_only);
/* A choice list (a JSON array of strings) as the root rule. */
td_status_t gchoice_build(gctx_t *c, const char *spec, size_t len);
/* A GBNF grammar as the root rule. */
td_status_t gebnf_build(gctx_t *c, const char *spec, size_t len);

/* ---- Sealing and checks ------------------------------------------------------ */

/* Sort the edges by node; check that every rule derives some string
 * (recursion has a base case) and that no rule calls itself before consuming
 * a byte (left recursion). */
td_status_t ggraph_seal(gctx_t *c);
void ggraph_free(ggraph_t *g);

#endif

/* ---- The automaton (gdfa.c) ------------------------------------------------------- */

/* A frame: a position in a rule (node) and the frame to return to when the
 * rule ends (GDFA_ROOT: the start rule's). Interned: equal stacks are one id. */
#define GDFA_ROOT UINT32_MAX
#define GDFA_DEAD 0u   /* state 0: nothing can follow */

typedef struct {
    uint32_t node, parent;
} gframe_t;

/* A state: the frames that can consume a byte next (sorted ids) and whether
 * the text so far is a sentence. Interned by content. */
typedef struct {
    uint32_t off, n;       /* into the frame-id pool */
    bool accept;
    uint32_t *trans;       /* NULL or [256]: 0 not yet known, else the next state + 1 */
    uint64_t *mask;        /* NULL or the state's mask */
} gstate_t;

/* The lazily built DFA over bytes: its states are sets of stacks. One lock
 * guards all of it (a grammar is shared by the requests that use it). */
typedef struct {
    ggraph_t g;
    const td_gvocab_t *v;
    bool *tail;            /* [nodes] ending here is ending the rule (tail calls) */
    gframe_t *frames;
    size_t nframes, cframes;
    td_hmap_t *frame_ix;   /* (node << 32 | parent) -> frame id */
    uint32_t *pool;        /* frame ids of the states */
    size_t npool, cpool;
    gstate_t *states;
    size_t nstates, cstates;
    td_hmap_t *state_ix;   /* content hash -> state ids (a multimap) */
    size_t mask_bytes, max_mask_bytes;
    uint32_t start;        /* the start state */
    td_hmap_t *seen;       /* scratch of closure: frames visited */
    uint32_t *work, *out;  /* scratch of closure */
    size_t cwork, cout;
    uint32_t *walk;        /* scratch of the mask walk: a state per depth */
} gdfa_t;

td_status_t gdfa_init(gdfa_t *d, const td_gvocab_t *v);
void gdfa_free(gdfa_t *d);
/* The state after byte b from state s (GDFA_DEAD: refused); *st on failure. */
uint32_t gdfa_step(gdfa_t *d, uint32_t s, uint8_t b, td_status_t *st);
/* The state after the bytes of token (a special token: refused) from *s:
 * TD_ERR_INVALID when refused (*s unchanged), TD_ERR_NOMEM. */
td_status_t gdfa_token(gdfa_t *d, int32_t token, uint32_t *s);
/* The mask of state s, cached while within the byte bound (else into
 * scratch, of td_gvocab_mask_words words). NULL: out of memory. */
const uint64_t *gdfa_mask(gdfa_t *d, uint32_t s, uint64_t *scratch);
/* Every state reachable from the start, each with its mask, while there are
 * at most max_states: TD_ERR_RANGE past that (the grammar is not
 * finite-state or too large), TD_ERR_TIMEOUT past the deadline. */
td_status_t gdfa_precompute(gdfa_t *d, size_t max_states, uint64_t deadline_ns);
