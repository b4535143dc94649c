/* tools/cli.h — what the command-line tools share: reading a whole input
 * stream. Header-only (static functions): each tool is one C file. */
#ifndef TD_TOOLS_CLI_H
#define TD_TOOLS_CLI_H

#include <stdio.h>
#include <stdlib.h>

/* All of f, NUL-terminated (the NUL not counted in *len); 0, or -1 with errno
 * (ENOMEM, or the stream's read error). */
static inline int
cli_read_all(FILE *f, char **out, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);

    if (!buf)
        return -1;
    for (;;) {
        if (cap - n < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

#endif
