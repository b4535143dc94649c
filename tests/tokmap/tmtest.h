/* tests/tokmap/tmtest.h — what the token map tests share: reading a gzip'd
 * fixture whole (through gzip -dc) and splitting it into lines. */
#ifndef TD_TMTEST_H
#define TD_TMTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The decompressed file (malloc'd, NUL-terminated), or NULL with a message. */
static inline char *
tmtest_read_gz(const char *path, size_t *len)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "gzip -dc -- '%s'", path);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 20, n = 0;
    char *buf = p ? malloc(cap) : NULL;
    while (buf) {
        if (cap - n < 65536) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, p);
        if (r == 0)
            break;
        n += r;
    }
    if (!p || pclose(p) != 0 || !buf || n == 0) {
        fprintf(stderr, "cannot read %s through gzip -dc\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The next line of *cur (NUL-terminated in place), or NULL at the end. */
static inline char *
tmtest_line(char **cur)
{
    char *s = *cur, *e;
    if (!s || !*s)
        return NULL;
    e = strchr(s, '\n');
    if (e) {
        *e = '\0';
        *cur = e + 1;
    } else {
        *cur = s + strlen(s);
    }
    return s;
}

#endif
