/* base/buf.h — the one growable byte buffer of the tree: appends that
 * double the allocation, a NUL after the contents, and a sticky failure so a
 * writer may append many pieces and check once at the end. */
#ifndef TD_BUF_H
#define TD_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "status.h"

/* Zero-initialise ({0}) before use. data is NUL-terminated whenever it is
 * non-NULL; the owner frees it with td_buf_free() (or takes it with
 * td_buf_take()). failed is set by the first append that could not grow the
 * buffer; later appends do nothing until td_buf_reset(). */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
    int failed;
} td_buf_t;

/* Make room for len more bytes (and the NUL). TD_ERR_NOMEM sets failed. */
td_status_t td_buf_reserve(td_buf_t *b, size_t len);
/* Append len bytes; TD_ERR_NOMEM (contents unchanged) when it cannot grow
 * or an earlier append failed. */
td_status_t td_buf_append(td_buf_t *b, const void *data, size_t len);
/* Append a NUL-terminated string. */
td_status_t td_buf_puts(td_buf_t *b, const char *s);
/* Append printf-style text. */
td_status_t td_buf_printf(td_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
td_status_t td_buf_vprintf(td_buf_t *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* TD_ERR_NOMEM when an append failed since the last reset, else TD_OK. */
td_status_t td_buf_status(const td_buf_t *b);
/* Keep the first len bytes (len <= b->len); undoes a partial append. */
void td_buf_truncate(td_buf_t *b, size_t len);
/* Forget the contents and any failure, keep the memory. */
void td_buf_reset(td_buf_t *b);
/* Hand the contents (NUL-terminated, malloc'd; an empty string when nothing
 * was appended) to the caller and leave the buffer empty ({0}); NULL when an
 * append failed or no memory (the buffer is freed either way). */
char *td_buf_take(td_buf_t *b, size_t *len);
/* Release the memory; the buffer is empty ({0}) afterwards. */
void td_buf_free(td_buf_t *b);

#endif
