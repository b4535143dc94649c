/* routerd/sse.c — SSE event framing (see sse.h). */
#include "sse.h"

#include <string.h>

td_status_t
td_sse_event(td_buf_t *out, const char *data, size_t len)
{
    size_t start = out->len;
    td_status_t rc = TD_OK;
    for (size_t i = 0;;) {
        size_t j = i;
        while (j < len && data[j] != '\n' && data[j] != '\r')
            j++;
        if ((rc = td_buf_append(out, "data: ", 6)) != TD_OK ||
            (rc = td_buf_append(out, data + i, j - i)) != TD_OK ||
            (rc = td_buf_append(out, "\n", 1)) != TD_OK)
            goto err_truncate;
        if (j == len)
            break;
        if (data[j] == '\r' && j + 1 < len && data[j + 1] == '\n')
            j++;
        i = j + 1;
    }
    if ((rc = td_buf_append(out, "\n", 1)) != TD_OK)
        goto err_truncate;
    return TD_OK;

err_truncate:
    td_buf_truncate(out, start);
    return rc;
}

td_status_t
td_sse_named(td_buf_t *out, const char *name, const char *data, size_t len)
{
    size_t start = out->len;
    td_status_t rc;

    if (strpbrk(name, "\r\n") != NULL)
        return TD_ERR_INVALID;
    if ((rc = td_buf_append(out, "event: ", 7)) != TD_OK ||
        (rc = td_buf_append(out, name, strlen(name))) != TD_OK ||
        (rc = td_buf_append(out, "\n", 1)) != TD_OK ||
        (rc = td_sse_event(out, data, len)) != TD_OK)
        td_buf_truncate(out, start);
    return rc;
}

td_status_t
td_sse_done(td_buf_t *out)
{
    return td_buf_append(out, TD_SSE_DONE, strlen(TD_SSE_DONE));
}

td_status_t
td_sse_comment(td_buf_t *out, const char *text)
{
    if (strpbrk(text, "\r\n") != NULL)
        return TD_ERR_INVALID;
    size_t start = out->len;
    td_status_t rc;
    if ((rc = td_buf_append(out, ": ", 2)) != TD_OK ||
        (rc = td_buf_append(out, text, strlen(text))) != TD_OK ||
        (rc = td_buf_append(out, "\n\n", 2)) != TD_OK)
        td_buf_truncate(out, start);
    return rc;
}
