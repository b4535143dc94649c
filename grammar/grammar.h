/* grammar/grammar.h — constrained decoding: a grammar (JSON Schema,
 * json_object, regex, choice list or EBNF) compiled against a tokenizer's
 * vocabulary, and a matcher that walks it token by token and gives the mask
 * of the tokens allowed next (docs/structured-output.md). Lexing is
 * byte-level, so tokens that split a UTF-8 character work. */
#ifndef TD_GRAMMAR_H
#define TD_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

/* ---- The vocabulary -------------------------------------------------------------- */

/* A tokenizer's tokens as a trie of their bytes (special tokens left out),
 * and the end-of-sequence ids. Immutable once made; shared by every grammar
 * compiled against it. */
typedef struct td_gvocab td_gvocab_t;

/* tok stays the caller's and must outlive the vocabulary. eos: the ids the
 * mask allows where the grammar accepts (neos <= 16). TD_ERR_NOMEM,
 * TD_ERR_INVALID. */
td_status_t td_gvocab_create(const td_tokenizer_t *tok, const int32_t *eos, size_t neos,
                             td_gvocab_t **out);
void td_gvocab_destroy(td_gvocab_t *v);
uint32_t td_gvocab_size(const td_gvocab_t *v);
/* Words of a mask: ceil(size / 64). */
size_t td_gvocab_mask_words(const td_gvocab_t *v);

/* ---- Grammars -------------------------------------------------------------------- */

typedef enum {
    TD_GRAMMAR_JSON_OBJECT = 0,  /* any JSON object; spec unused */
    TD_GRAMMAR_JSON_SCHEMA,      /* spec: the schema's JSON text */
    TD_GRAMMAR_REGEX,            /* spec: the pattern (docs: the supported syntax) */
    TD_GRAMMAR_CHOICE,           /* spec: a JSON array of strings */
    TD_GRAMMAR_EBNF,             /* spec: a GBNF grammar, start symbol root */
} td_grammar_kind_t;

/* Compile options. Zero-initialised means the defaults. */
typedef struct {
    bool strict;            /* JSON Schema: additionalProperties absent means false */
    size_t max_spec_bytes;  /* a larger spec is refused (0: TD_GRAMMAR_MAX_SPEC) */
    uint32_t budget_ms;     /* compile time budget (0: TD_GRAMMAR_BUDGET_MS) */
    bool precompute;        /* the compiled-FSM mode: every reachable state's mask
                               made at compile time, when the grammar is finite-state
                               and within the budget */
} td_grammar_opts_t;

#define TD_GRAMMAR_MAX_SPEC (256u << 10)
#define TD_GRAMMAR_BUDGET_MS 2000u

/* A compiled grammar. Its lazily built automaton and mask cache are guarded
 * inside, so any number of matchers on any threads may share one. */
typedef struct td_grammar td_grammar_t;

/* Why a compile failed, for the client: the JSON path of the offending part
 * ("properties.x.patternProperties", "" for the whole spec) and a message
 * ("patternProperties is not supported"). */
typedef struct {
    char path[160];
    char msg[256];
} td_grammar_err_t;

/* TD_ERR_UNSUPPORTED (a feature not supported), TD_ERR_INVALID (a malformed or
 * unsatisfiable spec), TD_ERR_TOO_BIG (over max_spec_bytes), TD_ERR_TIMEOUT
 * (over the budget), TD_ERR_NOMEM; err says which part. Never logs. */
td_status_t td_grammar_compile(const td_gvocab_t *v, td_grammar_kind_t kind, const char *spec,
                               size_t len, const td_grammar_opts_t *opts, td_grammar_t **out,
                               td_grammar_err_t *err);
void td_grammar_destroy(td_grammar_t *g);
const td_gvocab_t *td_grammar_vocab(const td_grammar_t *g);

/* Counters of a grammar's automaton (states made, masks cached). */
typedef struct {
    size_t rules, nodes, frames, states, masks, mask_bytes;
    bool precomputed;
} td_grammar_stats_t;
void td_grammar_stats(td_grammar_t *g, td_grammar_stats_t *out);

/* ---- Matchers -------------------------------------------------------------------- */

/* One walk through a grammar: the tokens taken so far. The grammar must
 * outlive it. One thread at a time per matcher. */
typedef struct td_gmatch td_gmatch_t;

td_status_t td_gmatch_create(td_grammar_t *g, td_gmatch_t **out);
void td_gmatch_destroy(td_gmatch_t *m);

/* The allowed next tokens: bit i of word i/64 for token i, EOS ids set where
 * the grammar accepts. Valid until the next call on m. NULL: out of memory. */
const uint64_t *td_gmatch_mask(td_gmatch_t *m);
/* Whether the text so far is a whole sentence of the grammar. */
bool td_gmatch_accepts_eos(const td_gmatch_t *m);
/* Whether nothing but EOS may follow (the grammar is complete). */
bool td_gmatch_done(td_gmatch_t *m);
/* Take token: TD_ERR_INVALID when the mask does not allow it (m unchanged);
 * an EOS id is allowed where the grammar accepts and ends the walk.
 * TD_ERR_NOMEM. */
td_status_t td_gmatch_advance(td_gmatch_t *m, int32_t token);
/* Undo the last n tokens taken: TD_ERR_RANGE when fewer were taken. */
td_status_t td_gmatch_rollback(td_gmatch_t *m, size_t n);
/* Tokens taken. */
size_t td_gmatch_taken(const td_gmatch_t *m);

#endif
