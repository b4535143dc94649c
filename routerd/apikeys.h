/* routerd/apikeys.h — API keys: a key file (one key per line, '#' comments),
 * constant-time lookup, reload, and the `Authorization: Bearer` header.
 * The client API and the admin API each load their own file. */
#ifndef TD_ROUTERD_APIKEYS_H
#define TD_ROUTERD_APIKEYS_H

#include "status.h"

#include <stdbool.h>
#include <stddef.h>

/* Longest key accepted, in bytes. */
#define TD_APIKEYS_MAX_LEN 512

typedef struct td_apikeys td_apikeys_t;

/* Read path: keys are trimmed lines; blank lines and lines whose first
 * non-blank character is '#' are skipped; CRLF is accepted. A key with inner
 * whitespace, one longer than TD_APIKEYS_MAX_LEN or a file without keys:
 * TD_ERR_INVALID; a missing file: TD_ERR_NOT_FOUND; another read error:
 * TD_ERR_IO. Each failure is logged here, once, naming the file (and the
 * line: "api keys path:line: ..."); callers pass the status on. The path is
 * kept for reload. */
td_status_t td_apikeys_load(const char *path, td_apikeys_t **out);

/* Read the file again; on failure (logged) the keys in use stay unchanged. */
td_status_t td_apikeys_reload(td_apikeys_t *keys);

void td_apikeys_destroy(td_apikeys_t *keys);

size_t td_apikeys_count(const td_apikeys_t *keys);

/* Whether key (len bytes) is one of the keys. Keys are compared as SHA-256
 * digests with CRYPTO_memcmp against every key, so the time taken does not
 * depend on where or whether the key matched. */
bool td_apikeys_match(const td_apikeys_t *keys, const char *key, size_t len);

/* Check an Authorization header value (NULL when the header is absent):
 * "Bearer <key>" (scheme case-insensitive). TD_OK: a known key;
 * TD_ERR_NOT_FOUND: no bearer key given; TD_ERR_AUTH: a key that is not known. */
td_status_t td_apikeys_check_header(const td_apikeys_t *keys, const char *authorization);

/* Who a request is, for what it owns (stored responses): the hex SHA-256 of
 * its key (x_api_key when not NULL, else the bearer key of authorization),
 * "anonymous" without a key. */
#define TD_APIKEYS_OWNER_LEN 65
void td_apikeys_owner(const char *authorization, const char *x_api_key,
                      char out[TD_APIKEYS_OWNER_LEN]);

#endif
