/* routerd/sse.h — Server-Sent Events framing for streamed responses:
 * `data: <payload>\n\n` events, the `data: [DONE]` terminator, comments. */
#ifndef TD_SSE_H
#define TD_SSE_H

#include "buf.h"
#include "status.h"

#include <stddef.h>

#define TD_SSE_DONE "data: [DONE]\n\n"

/* Append one event carrying data (len bytes); a payload with line breaks
 * becomes one `data:` line per line, as the SSE spec reassembles it. */
td_status_t td_sse_event(td_buf_t *out, const char *data, size_t len);

/* The same with an event name first (`event: <name>`), as the Messages and
 * Responses streams name theirs; a name with a line break: TD_ERR_INVALID. */
td_status_t td_sse_named(td_buf_t *out, const char *name, const char *data, size_t len);

/* Append `data: [DONE]\n\n`, the end of an OpenAI stream. */
td_status_t td_sse_done(td_buf_t *out);

/* Append a comment line (`: text\n\n`), ignored by clients: a keep-alive.
 * text must not contain a line break (TD_ERR_INVALID). */
td_status_t td_sse_comment(td_buf_t *out, const char *text);

#endif
