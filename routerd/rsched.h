/* routerd/rsched.h — choosing the ranks of a request from the rank table:
 * only up ranks, a decode rank with room, a prefill rank with the shortest
 * queue. Reads the table, changes nothing. */
#ifndef TD_ROUTERD_RSCHED_H
#define TD_ROUTERD_RSCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rrank.h"

/* Decode incarnations one request may skip (and so its admissions, at most). */
#define TD_RSCHED_MAX_TRIED 16

/* Prefill rank in the list ranks with the fewest queued tokens, or NULL. */
td_rrank_t *td_rsched_pick_prefill(td_rrank_t *ranks);
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
