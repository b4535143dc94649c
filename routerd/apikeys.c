/* routerd/apikeys.c — the API key set of apikeys.h: a file parsed into
 * SHA-256 digests, compared in constant time. */
#include "apikeys.h"

#include "buf.h"
#include "log.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    unsigned char d[SHA256_DIGEST_LENGTH];
} td_apikeys_digest_t;

struct td_apikeys {
    char                *path;
    td_apikeys_digest_t *digests;  /* one per key, in file order */
    size_t               n;
};

static bool
is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Read the whole file into text (NUL-terminated). */
static td_status_t
apikeys_read_file(const char *path, td_buf_t *text)
{
    td_status_t rc = TD_OK;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        td_error("api keys %s: %s", path, strerror(e));
        return e == ENOENT ? TD_ERR_NOT_FOUND : td_status_from_errno(e);
    }
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        if ((rc = td_buf_append(text, chunk, got)) != TD_OK) {
            td_error("api keys %s: out of memory", path);
            goto out_close;
        }
    if (ferror(f)) {
        rc = TD_ERR_IO;
        td_error("api keys %s: read failed", path);
    } else if ((rc = td_buf_append(text, "", 0)) != TD_OK) {
        td_error("api keys %s: out of memory", path);
    }
out_close:
    fclose(f);
    return rc;
}

static void
apikeys_digest(const char *key, size_t len, td_apikeys_digest_t *out)
{
    SHA256((const unsigned char *)key, len, out->d);
}

/* Parse the key file into a digest array; outputs set only on success. */
static td_status_t
apikeys_parse(const char *path, td_apikeys_digest_t **digests, size_t *n)
{
    td_buf_t text = {0};
    td_apikeys_digest_t *v = NULL;
    size_t nv = 0, cap = 0;
    td_status_t rc = apikeys_read_file(path, &text);
    if (rc != TD_OK)
        goto out_free_text;
    if (memchr(text.data, '\0', text.len) != NULL) {
        rc = TD_ERR_INVALID;
        td_error("api keys %s: contains a NUL byte", path);
        goto out_free_text;
    }
    unsigned lineno = 0;
    for (char *line = text.data; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        char *end = nl ? nl : line + strlen(line);
        char *next = nl ? nl + 1 : NULL;
        lineno++;
        while (line < end && is_blank(*line))
            line++;
        while (end > line && is_blank(end[-1]))
            end--;
        size_t len = (size_t)(end - line);
        if (len == 0 || line[0] == '#') {
            line = next;
            continue;
        }
        for (size_t i = 0; i < len; i++)
            if (is_blank(line[i]) || (unsigned char)line[i] < 0x20) {
                rc = TD_ERR_INVALID;
                td_error("api keys %s:%u: key contains whitespace or a control character",
                         path, lineno);
                goto out_free_digests;
            }
        if (len > TD_APIKEYS_MAX_LEN) {
            rc = TD_ERR_INVALID;
            td_error("api keys %s:%u: key longer than %d bytes", path, lineno,
                     TD_APIKEYS_MAX_LEN);
            goto out_free_digests;
        }
        if (nv == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            td_apikeys_digest_t *p = realloc(v, ncap * sizeof *p);
            if (p == NULL) {
                rc = TD_ERR_NOMEM;
                td_error("api keys %s: out of memory", path);
                goto out_free_digests;
            }
            v = p;
            cap = ncap;
        }
        apikeys_digest(line, len, &v[nv++]);
        line = next;
    }
    if (nv == 0) {
        rc = TD_ERR_INVALID;
        td_error("api keys %s: no keys (one key per line, '#' starts a comment)", path);
        goto out_free_digests;
    }
    *digests = v;
    *n = nv;
    td_buf_free(&text);
    return TD_OK;

out_free_digests:
    free(v);
out_free_text:
    td_buf_free(&text);
    return rc;
}

td_status_t
td_apikeys_load(const char *path, td_apikeys_t **out)
{
    td_apikeys_t *k = calloc(1, sizeof *k);
    if (k == NULL || (k->path = strdup(path)) == NULL) {
        free(k);
        td_error("api keys %s: out of memory", path);
        return TD_ERR_NOMEM;
    }
    td_status_t rc = apikeys_parse(path, &k->digests, &k->n);
    if (rc != TD_OK) {
        td_apikeys_destroy(k);
        return rc;
    }
    *out = k;
    return TD_OK;
}

td_status_t
td_apikeys_reload(td_apikeys_t *keys)
{
    td_apikeys_digest_t *digests;
    size_t n;
    td_status_t rc = apikeys_parse(keys->path, &digests, &n);
    if (rc != TD_OK)
        return rc;
    free(keys->digests);
    keys->digests = digests;
    keys->n = n;
    return TD_OK;
}

void
td_apikeys_destroy(td_apikeys_t *keys)
{
    if (keys == NULL)
        return;
    free(keys->digests);
    free(keys->path);
    free(keys);
}

size_t
td_apikeys_count(const td_apikeys_t *keys)
{
    return keys->n;
}

bool
td_apikeys_match(const td_apikeys_t *keys, const char *key, size_t len)
{
    td_apikeys_digest_t d;
    int found = 0;
    apikeys_digest(key, len, &d);
    for (size_t i = 0; i < keys->n; i++)
        found |= CRYPTO_memcmp(d.d, keys->digests[i].d, sizeof d.d) == 0;
    return found != 0;
}

/* The key of a "Bearer <key>" header value; false when there is none. */
static bool
bearer_key(const char *authorization, const char **key, size_t *keylen)
{
    static const char scheme[] = "bearer";
    const char *p = authorization;
    if (p == NULL)
        return false;
    while (is_blank(*p))
        p++;
    if (strncasecmp(p, scheme, sizeof scheme - 1) != 0 || !is_blank(p[sizeof scheme - 1]))
        return false;
    p += sizeof scheme - 1;
    while (is_blank(*p))
        p++;
    size_t len = strlen(p);
    while (len > 0 && is_blank(p[len - 1]))
        len--;
    *key = p;
    *keylen = len;
    return len > 0;
}

td_status_t
td_apikeys_check_header(const td_apikeys_t *keys, const char *authorization)
{
    const char *k;
    size_t len;

    if (!bearer_key(authorization, &k, &len))
        return TD_ERR_NOT_FOUND;
    return td_apikeys_match(keys, k, len) ? TD_OK : TD_ERR_AUTH;
}

void
td_apikeys_owner(const char *authorization, const char *x_api_key,
                 char out[TD_APIKEYS_OWNER_LEN])
{
    td_apikeys_digest_t d;
    const char *k = x_api_key;
    size_t len = k ? strlen(k) : 0;

    if (k == NULL && !bearer_key(authorization, &k, &len)) {
        snprintf(out, TD_APIKEYS_OWNER_LEN, "anonymous");
        return;
    }
    apikeys_digest(k, len, &d);
    for (size_t i = 0; i < sizeof d.d; i++)
        snprintf(out + 2 * i, 3, "%02x", d.d[i]);
}
