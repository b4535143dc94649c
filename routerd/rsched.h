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
/* Decode rank with room for need tokens (prompt + max_tokens), least loaded,
 * skipping the incarnations tried[ntried]; NULL with *too_long set when some
 * rank is up but none has a context that long. */
td_rrank_t *td_rsched_pick_decode(td_rrank_t *ranks, uint64_t need, const uint64_t *tried,
                                 size_t ntried, bool *too_long);

#endif
