/* routerd/rconv.h — what routerd knows of the conversation states decode
 * ranks keep (decoded's --retain; docs/kvcache.md, "Multi-turn"): per kept
 * state its rank, the id of the request it finished and the token sequence
 * it holds, indexed so that a new prompt finds the longest kept sequence it
 * begins with. A sequence is keyed by the chain hash (kvcache/chainhash.h) of
 * its whole blocks of TD_RCONV_BLOCK tokens plus the tokens after them, so a
 * lookup costs one probe per block of the prompt. A hash only points: the
 * decode rank compares the tokens before it continues a state. No I/O and
 * no logging. Ownership: routerd's request table owns it; ranks are opaque
 * pointers here, removed by the caller when they go. */
#ifndef TD_ROUTERD_RCONV_H
#define TD_ROUTERD_RCONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rcache.h"
#include "status.h"

#define TD_RCONV_BLOCK 16   /* tokens per hashed block of a kept sequence */

typedef struct td_rconv_s td_rconv_t;

/* A kept state a prompt continues. */
typedef struct {
    void *rank;          /* the decode rank keeping it */
    uint64_t id;         /* the request whose state it is */
    uint64_t ntokens;    /* tokens it holds: the prompt's first ntokens */
} td_rconv_hit_t;

/* A table of at most max states (>= 1); the oldest goes first when full. */
td_status_t td_rconv_create(size_t max, td_rconv_t **out);
void td_rconv_destroy(td_rconv_t *t);

/* rank keeps the state of request id: tokens[0..n) (n >= 1), hashed from
 * seed (the chain's seed of the model and KV layout). An id already in the
 * table is replaced. TD_ERR_NOMEM (the table is unchanged). */
td_status_t td_rconv_add(td_rconv_t *t, void *rank, uint64_t id, uint64_t seed,
                         const int32_t *tokens, uint64_t n);
/* The longest kept sequence that p's prompt begins with and is longer than
 * (the prompt must add a token): true and *out, or false. usable(rank, arg)
 * (NULL: any) skips the states of ranks that cannot take work now. */
bool td_rconv_find(td_rconv_t *t, td_rcache_prompt_t *p, bool (*usable)(void *rank, void *arg),
                   void *arg, td_rconv_hit_t *out);
/* Forget request id's state (nothing when unknown). */
void td_rconv_remove(td_rconv_t *t, uint64_t id);
/* Forget every state rank keeps. */
void td_rconv_remove_rank(td_rconv_t *t, void *rank);
/* States held. */
size_t td_rconv_count(const td_rconv_t *t);

#endif
