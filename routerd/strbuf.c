/* routerd/strbuf.c — the growable byte string of strbuf.h. */
#include "strbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

td_status_t
td_strbuf_append(td_strbuf_t *b, const void *data, size_t len)
{
    if (len > SIZE_MAX / 2 - b->len)
        return TD_ERR_NOMEM;
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (p == NULL)
            return TD_ERR_NOMEM;
        b->data = p;
        b->cap = cap;
    }
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return TD_OK;
}

void
td_strbuf_truncate(td_strbuf_t *b, size_t len)
{
    if (len < b->len) {
        b->len = len;
        b->data[len] = '\0';
    }
}

void
td_strbuf_reset(td_strbuf_t *b)
{
    td_strbuf_truncate(b, 0);
}

void
td_strbuf_free(td_strbuf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
