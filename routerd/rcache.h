/* routerd/rcache.h — what routerd knows of one prefill rank's prefix cache:
 * the set of cache block hashes (kvcache/chainhash.h) the rank announced in
 * its CacheEvents, applied in order, and how long a prefix of a prompt's
 * block hashes the set holds. Also a prompt's block hashes, computed once
 * per block size (ranks may differ in it). No I/O and no logging: callers
 * log what a status says. Ownership: the rank (rrank.h) embeds its set; a
 * request owns its td_rcache_prompt_t. */
#ifndef TD_ROUTERD_RCACHE_H
#define TD_ROUTERD_RCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* The default cap of one rank's set (routerd's cache-max-blocks). */
#define TD_RCACHE_MAX_DEFAULT (4u << 20)

/* A set of nonzero 64-bit block hashes (base/hmap.h). Zeroed = empty,
 * holding nothing. */
typedef struct {
    struct td_hmap *set;    /* hash -> 1; NULL until the first hash is added */
    size_t n;           /* hashes held */
    size_t max;         /* hashes held at most (0: none) */
    uint64_t seq;       /* seq of the last event applied (0: none yet) */
    bool over;          /* an added hash was not kept (max) since the set was last emptied */
} td_rcache_t;

/* One CacheEvent's contents (tandem.proto). */
typedef struct {
    uint64_t seq;
    bool cleared;
    const uint64_t *added;
    size_t nadded;
    const uint64_t *removed;
    size_t nremoved;
} td_rcache_event_t;

void td_rcache_init(td_rcache_t *c, size_t max);
void td_rcache_fini(td_rcache_t *c);
/* Forget every hash; seq_too: and the event sequence (a new connection). */
void td_rcache_clear(td_rcache_t *c, bool seq_too);

/* Apply an event: cleared empties the set first, then added, then removed.
 * TD_ERR_PROTO: malformed (seq not the one after the last, or a 0 hash); the
 * set is emptied rather than trusted, seq taken as given, *why says what.
 * TD_ERR_TOO_BIG: applied, but the set reached max and dropped added hashes
 * for the first time since it was last emptied (log it once). TD_ERR_NOMEM:
 * the set could not grow; it is emptied. */
td_status_t td_rcache_apply(td_rcache_t *c, const td_rcache_event_t *ev, const char **why);

bool td_rcache_has(const td_rcache_t *c, uint64_t h);
/* How many of h[0..n) from the first are in the set. */
size_t td_rcache_prefix(const td_rcache_t *c, const uint64_t *h, size_t n);

/* A prompt's block hashes per block size, computed on first ask. */
#define TD_RCACHE_PROMPT_SIZES 4
typedef struct {
    uint64_t seed;              /* td_chain_seed of the model and KV layout */
    const int32_t *tokens;      /* [ntokens], borrowed */
    size_t ntokens;
    struct {
        uint32_t g;             /* block tokens; 0: unused */
        size_t n;
        uint64_t *h;            /* [n] */
    } by[TD_RCACHE_PROMPT_SIZES];
} td_rcache_prompt_t;

void td_rcache_prompt_init(td_rcache_prompt_t *p, uint64_t seed, const int32_t *tokens,
                           size_t ntokens);
void td_rcache_prompt_fini(td_rcache_prompt_t *p);
/* The hashes of blocks of g tokens (*n of them); NULL with *n = 0 when g is
 * 0, the prompt has no whole block, or memory ran out. */
const uint64_t *td_rcache_prompt_hashes(td_rcache_prompt_t *p, uint32_t g, size_t *n);

#endif
