/* routerd/strbuf.h — a growable byte string that the API layer appends its
 * output to (SSE frames, decoded text, released stream text). */
#ifndef TD_STRBUF_H
#define TD_STRBUF_H

#include "status.h"

#include <stddef.h>

/* Zero-initialise ({0}) before use. data is NUL-terminated whenever it is
 * non-NULL; the owner of the struct frees data with td_strbuf_free(). */
typedef struct {
    char  *data;
    size_t len;
    size_t cap;
} td_strbuf_t;

/* Append len bytes; on TD_ERR_NOMEM the buffer is unchanged. */
td_status_t td_strbuf_append(td_strbuf_t *b, const void *data, size_t len);
/* Keep the first len bytes (len <= b->len); undoes a partial append. */
void td_strbuf_truncate(td_strbuf_t *b, size_t len);
/* Forget the contents, keep the memory. */
void td_strbuf_reset(td_strbuf_t *b);
/* Release the memory; the buffer is empty ({0}) afterwards. */
void td_strbuf_free(td_strbuf_t *b);

#endif
