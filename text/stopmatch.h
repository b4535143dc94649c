/* text/stopmatch.h — the one matcher of stop strings: an Aho–Corasick
 * automaton over byte strings, fed a stream one byte at a time in linear
 * time (the V4.1 reply reader matches its markers and a request's stop
 * strings with it), and the streaming stop filter routerd puts the text of a
 * reply through: it releases text as soon as it can no longer begin a stop
 * string, holds back a possible partial match, and cuts at the first stop
 * string to complete. */
#ifndef TD_STOPMATCH_H
#define TD_STOPMATCH_H

#include "buf.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- The automaton ---------------------------------------------------------- */

/* Immutable once made: any number of streams (states) may walk it at once. */
typedef struct td_stopmatch td_stopmatch_t;

/* The state of a stream before its first byte. */
#define TD_STOPMATCH_START 0u

/* n non-empty patterns of lens[i] bytes (any bytes; lens NULL: NUL-terminated
 * strings), copied. n may be 0 (nothing ever matches). An empty pattern:
 * TD_ERR_INVALID; TD_ERR_NOMEM. Logs nothing. */
td_status_t td_stopmatch_create(const char *const *pats, const size_t *lens, size_t n,
                                td_stopmatch_t **out);
void td_stopmatch_destroy(td_stopmatch_t *m);

/* The state after byte c in state s. Amortized O(1) per byte over a stream. */
uint32_t td_stopmatch_step(const td_stopmatch_t *m, uint32_t s, unsigned char c);
/* Bytes of the longest suffix of the stream so far that is a prefix of a
 * pattern: what may still become a match. */
size_t td_stopmatch_depth(const td_stopmatch_t *m, uint32_t s);
/* The longest pattern that ends at the stream's last byte: its length (0:
 * none) and, when which is not NULL, its index. */
size_t td_stopmatch_hit(const td_stopmatch_t *m, uint32_t s, size_t *which);
/* Pattern i (lens: td_stopmatch_len). */
const char *td_stopmatch_pattern(const td_stopmatch_t *m, size_t i);
size_t td_stopmatch_len(const td_stopmatch_t *m, size_t i);
size_t td_stopmatch_count(const td_stopmatch_t *m);

/* ---- The streaming stop filter ---------------------------------------------- */

typedef struct td_stopmatch_filter td_stopmatch_filter_t;

/* Stop strings stops[0..n) (non-empty, NUL-terminated, copied; n may be 0:
 * everything passes through). include: a matched stop string is released
 * too (vLLM's include_stop_str_in_output). TD_ERR_INVALID for an empty one. */
td_status_t td_stopmatch_filter_create(const char *const *stops, size_t n, bool include,
                                       td_stopmatch_filter_t **out);
void td_stopmatch_filter_destroy(td_stopmatch_filter_t *f);

/* Feed the next len bytes of generated text; append to out what may be sent
 * now. The match is the first stop string to complete in generation order
 * (the earliest end; at equal ends the longest), so the result does not
 * depend on how the text is cut into pieces. armed false: a stop string that
 * completes now does not count (min_tokens not reached yet); what may still
 * become one is held all the same. On a match out gets the text before it
 * (and it, with include), *matched is set, and later feeds append nothing.
 * *matched is written on success only. O(len) amortized. */
td_status_t td_stopmatch_filter_feed(td_stopmatch_filter_t *f, const char *text, size_t len,
                                     bool armed, td_buf_t *out, bool *matched);
/* The stop string that matched (NUL-terminated, owned by f), or NULL. */
const char *td_stopmatch_filter_which(const td_stopmatch_filter_t *f);
/* Generation ended without a match: release the held-back text. */
td_status_t td_stopmatch_filter_flush(td_stopmatch_filter_t *f, td_buf_t *out);

#endif
