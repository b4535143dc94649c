/* tests/tokmap/tmtest.h — what the token map tests share: splitting a
 * fixture (read by tokref_read_gz) into lines. */
#ifndef TD_TMTEST_H
#define TD_TMTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
