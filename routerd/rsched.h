/* routerd/rsched.h — choosing the ranks of a request from the rank table:
 * only up ranks, a decode rank with room, a prefill rank with the least
 * prefill work (its queue, less what its prefix cache holds of the prompt).
 * Reads the table, changes nothing. */
#ifndef TD_ROUTERD_RSCHED_H
#define TD_ROUTERD_RSCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rcache.h"
#include "rrank.h"

/* Decode incarnations one request may skip (and so its admissions, at most). */
#define TD_RSCHED_MAX_TRIED 16

/* The prefill rank chosen for a prompt. */
typedef struct {
    td_rrank_t *rank;           /* NULL: no prefill rank is up */
    uint64_t cached_tokens;     /* of the prompt, the prefix its cache holds (expected) */
    bool by_cache;              /* the load-only rule would have chosen another rank */
} td_rsched_prefill_t;

/* Prefill rank for prompt (NULL, or weight 0: by load only) with the least
 *   cost = queued tokens + prompt tokens - weight * cached tokens
 * where queued tokens are its last Load's plus those this router sent it
 * since, and cached tokens the prompt's longest prefix of whole blocks that
 * its announced cache blocks hold (block hashes computed once per block
 * size); ties: the fewest requests bound, then the first in the table.
 * Without a cache anywhere this is the load-only rule. */
td_rsched_prefill_t td_rsched_pick_prefill(td_rrank_t *ranks, td_rcache_prompt_t *prompt,
                                           double weight);
/* Whether a request can have a decode rank now, later, or never. */
typedef enum {
    TD_RSCHED_FITS = 0,   /* *out: a rank with room now */
    TD_RSCHED_BUSY,       /* an up rank it has not tried could hold it once capacity frees */
    TD_RSCHED_TOO_LONG,   /* ranks are up, none with a context or a whole KV that long */
    TD_RSCHED_NONE,       /* no up decode rank, or every one that could hold it was tried */
} td_rsched_fit_t;

const char *td_rsched_fit_str(td_rsched_fit_t f);

/* Decode rank for need tokens (prompt + max_tokens), skipping the
 * incarnations tried[ntried]: of those with free KV for need and a free batch
 * row (the last Load less what this router sent since) and that did not turn
 * a request away since that Load, the least loaded, then the one with the
 * most free KV. The ranks of one DEP domain (Register's dep_domain) step
 * together, so a domain offers only its rank with the most free KV (then the
 * fewest rows), which competes with the other ranks by the same rule. */
td_rsched_fit_t td_rsched_pick_decode(td_rrank_t *ranks, uint64_t need, const uint64_t *tried,
                                      size_t ntried, td_rrank_t **out);

/* The longest request (prompt + max_tokens) an up decode rank could ever
 * hold: its context and its whole KV; 0 when none is up. */
uint64_t td_rsched_longest(const td_rrank_t *ranks);

#endif
