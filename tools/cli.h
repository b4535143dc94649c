/* tools/cli.h — what the command-line tools share: reading a whole input
 * stream. Header-only (static functions): each tool is one C file. */
#ifndef TD_TOOLS_CLI_H
#define TD_TOOLS_CLI_H

#include <errno.h>
#include <stdio.h>

#include "buf.h"

/* All of f, NUL-terminated (the NUL not counted in *len); 0, or -1 with errno
 * (ENOMEM, or the stream's read error). */
static inline int
cli_read_all(FILE *f, char **out, size_t *len)
{
    td_buf_t b = { 0 };
    char chunk[16384];
    size_t r;

    while ((r = fread(chunk, 1, sizeof(chunk), f)) > 0)
        td_buf_append(&b, chunk, r);
    if (ferror(f)) {
        td_buf_free(&b);
        return -1;
    }
    char *p = td_buf_take(&b, len);
    if (p == NULL) {
        errno = ENOMEM;
        return -1;
    }
    *out = p;
    return 0;
}

#endif
