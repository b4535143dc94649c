/* base/buf.c — the growable byte buffer of buf.h. */
#include "buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

td_status_t
td_buf_reserve(td_buf_t *b, size_t len)
{
    size_t cap;
    char *p;

    if (b->failed)
        return TD_ERR_NOMEM;
    /* the guard first: len + 1 bytes more must not overflow, nor the doubling */
    if (len >= SIZE_MAX / 4 - b->len)
        goto err_fail;
    if (b->data != NULL && b->len + len + 1 <= b->cap)
        return TD_OK;
    cap = b->cap ? b->cap : 64;
    while (cap < b->len + len + 1)
        cap *= 2;
    p = realloc(b->data, cap);
    if (p == NULL)
        goto err_fail;
    if (b->data == NULL)
        p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return TD_OK;
err_fail:
    b->failed = 1;
    return TD_ERR_NOMEM;
}

td_status_t
td_buf_append(td_buf_t *b, const void *data, size_t len)
{
    td_status_t st = td_buf_reserve(b, len);

    if (st != TD_OK)
        return st;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return TD_OK;
}

td_status_t
td_buf_puts(td_buf_t *b, const char *s)
{
    return td_buf_append(b, s, strlen(s));
}

td_status_t
td_buf_vprintf(td_buf_t *b, const char *fmt, va_list ap)
{
    va_list ap2;
    int n;
    td_status_t st;

    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->failed = 1;
        return TD_ERR_INVALID;
    }
    st = td_buf_reserve(b, (size_t)n);
    if (st != TD_OK)
        return st;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return TD_OK;
}

td_status_t
td_buf_printf(td_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    td_status_t st;

    va_start(ap, fmt);
    st = td_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return st;
}

td_status_t
td_buf_status(const td_buf_t *b)
{
    return b->failed ? TD_ERR_NOMEM : TD_OK;
}

void
td_buf_truncate(td_buf_t *b, size_t len)
{
    if (len < b->len) {
        b->len = len;
        b->data[len] = '\0';
    }
}

void
td_buf_reset(td_buf_t *b)
{
    td_buf_truncate(b, 0);
    b->failed = 0;
}

char *
td_buf_take(td_buf_t *b, size_t *len)
{
    char *p;

    if (!b->failed && b->data == NULL)
        td_buf_reserve(b, 0);
    if (b->failed) {
        td_buf_free(b);
        return NULL;
    }
    p = b->data;
    if (len != NULL)
        *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void
td_buf_free(td_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}
