/* routerd/stop.c — the stop-string matcher of stop.h. Text not yet released
 * stays in `hold`; after each feed hold is only the longest suffix that is a
 * proper prefix of some stop string, so it is shorter than the longest stop. */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

struct td_stop {
    char      **stops;
    size_t     *lens;
    size_t      n;
    td_buf_t hold;     /* text fed but not released */
    bool        matched;  /* a stop string completed; nothing more is released */
};

td_status_t
td_stop_create(const char *const *stops, size_t n, td_stop_t **out)
{
    for (size_t i = 0; i < n; i++)
        if (stops[i] == NULL || stops[i][0] == '\0')
            return TD_ERR_INVALID;
    td_stop_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return TD_ERR_NOMEM;
    m->stops = calloc(n ? n : 1, sizeof *m->stops);
    m->lens = calloc(n ? n : 1, sizeof *m->lens);
    if (m->stops == NULL || m->lens == NULL)
        goto err_free_matcher;
    for (m->n = 0; m->n < n; m->n++) {
        m->lens[m->n] = strlen(stops[m->n]);
        if ((m->stops[m->n] = strdup(stops[m->n])) == NULL)
            goto err_free_matcher;
    }
    *out = m;
    return TD_OK;

err_free_matcher:
    td_stop_destroy(m);
    return TD_ERR_NOMEM;
}

void
td_stop_destroy(td_stop_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n; i++)
        free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    td_buf_free(&m->hold);
    free(m);
}

/* Start of the first stop string to complete in h[0..len), or -1. */
static long
stop_first_match(const td_stop_t *m, const char *h, size_t len)
{
    for (size_t end = 1; end <= len; end++) {
        size_t best = 0;
        for (size_t i = 0; i < m->n; i++)
            if (m->lens[i] <= end && m->lens[i] > best &&
                memcmp(h + end - m->lens[i], m->stops[i], m->lens[i]) == 0)
                best = m->lens[i];
        if (best)
            return (long)(end - best);
    }
    return -1;
}

/* Start of the longest suffix of h[0..len) that is a proper prefix of a stop
 * string (len when there is none): where the text to hold back begins. */
static size_t
stop_partial_start(const td_stop_t *m, const char *h, size_t len)
{
    for (size_t start = 0; start < len; start++) {
        size_t tail = len - start;
        for (size_t i = 0; i < m->n; i++)
            if (tail < m->lens[i] && memcmp(h + start, m->stops[i], tail) == 0)
                return start;
    }
    return len;
}

/* Release hold[0..cut) to out and keep hold[cut..). */
static td_status_t
stop_release(td_stop_t *m, size_t cut, td_buf_t *out)
{
    td_status_t rc = td_buf_append(out, m->hold.data, cut);
    if (rc != TD_OK)
        return rc;
    memmove(m->hold.data, m->hold.data + cut, m->hold.len - cut + 1);
    m->hold.len -= cut;
    return TD_OK;
}

td_status_t
td_stop_feed(td_stop_t *m, const char *text, size_t len, td_buf_t *out, bool *matched)
{
    td_status_t rc;
    if (m->matched || len == 0) {
        *matched = m->matched;
        return TD_OK;
    }
    if ((rc = td_buf_append(&m->hold, text, len)) != TD_OK)
        return rc;
    long at = stop_first_match(m, m->hold.data, m->hold.len);
    if (at >= 0) {
        if ((rc = td_buf_append(out, m->hold.data, (size_t)at)) != TD_OK)
            return rc;
        m->matched = true;
        td_buf_free(&m->hold);
    } else {
        size_t cut = stop_partial_start(m, m->hold.data, m->hold.len);
        if ((rc = stop_release(m, cut, out)) != TD_OK)
            return rc;
    }
    *matched = m->matched;
    return TD_OK;
}

td_status_t
td_stop_flush(td_stop_t *m, td_buf_t *out)
{
    if (m->matched || m->hold.len == 0)
        return TD_OK;
    return stop_release(m, m->hold.len, out);
}
