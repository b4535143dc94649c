/* routerd/rstore.h — stored responses (the Responses API's store): one file
 * per response in a directory, so that they outlive a routerd and several
 * routers can share them. Each file (0600) is written to a temporary name
 * and renamed into place, so a reader never sees part of one; a response
 * belongs to the key that made it and is not found by any other; the store
 * keeps within a byte budget and an age limit, the oldest dropped first.
 * Threads: every call does file I/O and runs on a text thread, never on a
 * loop thread; calls may run at once (the trim is serialized by a mutex;
 * other routers' trims race harmlessly: a file gone is a file gone). */
#ifndef TD_ROUTERD_RSTORE_H
#define TD_ROUTERD_RSTORE_H

#include <jansson.h>

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

typedef struct td_rstore td_rstore_t;

typedef struct {
    const char *dir;          /* created (0700) when missing */
    uint64_t max_bytes;       /* the files' bytes together */
    uint64_t max_age_s;       /* older responses are gone */
} td_rstore_cfg_t;

/* TD_ERR_IO (logged) when dir cannot be made or is not writable. */
td_status_t td_rstore_create(const td_rstore_cfg_t *cfg, td_rstore_t **out);
void td_rstore_destroy(td_rstore_t *s);

/* An id that can name a stored response: [A-Za-z0-9_-], 1..96 bytes. */
bool td_rstore_id_ok(const char *id);

/* Store rec (an object; "owner" and "created" are added) as id, then trim
 * the store to its budget. TD_ERR_IO / TD_ERR_NOMEM (logged). */
td_status_t td_rstore_put(td_rstore_t *s, const char *id, const char *owner, json_t *rec);
/* The record of id when owner owns it (*rec: a new reference);
 * TD_ERR_NOT_FOUND when there is none, another owns it, or it expired. */
td_status_t td_rstore_get(td_rstore_t *s, const char *id, const char *owner, json_t **rec);
/* What the last trim found, after it: the stored responses' bytes and
 * files (0 before the first write), and the budget. Any thread. */
typedef struct {
    uint64_t bytes, files, max_bytes, dropped;   /* dropped: by the budget or age, so far */
} td_rstore_stats_t;
void td_rstore_stats(const td_rstore_t *s, td_rstore_stats_t *out);

/* Remove id when owner owns it; TD_ERR_NOT_FOUND otherwise. */
td_status_t td_rstore_delete(td_rstore_t *s, const char *id, const char *owner);

#endif
