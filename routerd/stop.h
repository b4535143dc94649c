/* routerd/stop.h — stop strings on streamed text: releases text as soon as it
 * can no longer be the start of a stop string, holds back a possible partial
 * match, and cuts at the first stop string to complete. */
#ifndef TD_STOP_H
#define TD_STOP_H

#include "buf.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct td_stop td_stop_t;

/* stops: n non-empty strings, copied. n may be 0 (everything passes through).
 * *out is freed with td_stop_destroy(). Empty string: TD_ERR_INVALID. */
td_status_t td_stop_create(const char *const *stops, size_t n, td_stop_t **out);
void td_stop_destroy(td_stop_t *m);

/* Feed the next len bytes of generated text; append to out what may be sent
 * to the client now. The match is the first stop string to complete in
 * generation order (earliest end; at equal ends the longest), so the result
 * does not depend on how the text is cut into pieces. On a match, out gets the
 * text before it, *matched is set, and later feeds append nothing.
 * *matched is written on success only. */
td_status_t td_stop_feed(td_stop_t *m, const char *text, size_t len, td_buf_t *out,
                         bool *matched);

/* Generation ended without a match: release the held-back text. */
td_status_t td_stop_flush(td_stop_t *m, td_buf_t *out);

#endif
