/* tests/tokmap/test_tokmap_normalize.c — td_tokmap_normalize against the
 * normalizer of transformers' build_compressed_token_map, as HF tokenizers runs
 * it (normalize.tsv.gz, made by tests/tokmap/regen): every code point alone, and
 * ~5000 strings; then what the fixture cannot say (input that is not UTF-8). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "log.h"
#include "tokmap.h"
#include "tokref.h"
#include "tmtest.h"

#define SHOW_MAX 20

static int shown;

static void
show_hex(const char *what, const char *s, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %02x", (unsigned char)s[i]);
    fprintf(stderr, "\n");
}

/* Normalize in; 1 when it gives want (wn bytes), else 0 (shown). */
static int
check_one(const char *label, const char *in, size_t n, const char *want, size_t wn)
{
    char *got = NULL;
    size_t gn = 0;
    td_status_t st = td_tokmap_normalize(in, n, &got, &gn);
    int ok = st == TD_OK && gn == wn && memcmp(got, want, wn) == 0 && got[gn] == '\0';

    if (!ok && shown++ < SHOW_MAX) {
        fprintf(stderr, "mismatch %s (status %s)\n", label, td_status_str(st));
        show_hex("input", in, n);
        show_hex("tokenizers", want, wn);
        if (st == TD_OK)
            show_hex("td_tokmap", got, gn);
    }
    free(got);
    return ok;
}

static size_t
utf8_put(uint32_t c, char *o)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12);
        o[1] = (char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static void
check_fixture(const char *path)
{
    size_t len, ncp = 0, nstr = 0, bad_cp = 0, bad_str = 0;
    char *text = tokref_read_gz(path, &len), *cur = text, *line;
    uint32_t next_cp = 0;   /* every code point below is checked already */

    CHECK(text != NULL);
    if (!text)
        return;
    while ((line = tmtest_line(&cur)) != NULL) {
        char label[64];
        if (line[0] == 'C' && line[1] == ' ') {
            char *end, *hex;
            uint32_t cp = (uint32_t)strtoul(line + 2, &end, 16);
            size_t wn;
            CHECK(*end == ' ' && cp >= next_cp && cp <= 0x10FFFF);
            if (*end != ' ' || cp < next_cp || cp > 0x10FFFF)
                break;
            /* The code points between are their own normalization. */
            for (; next_cp <= cp; next_cp++) {
                char in[4];
                size_t n;
                if (next_cp >= 0xD800 && next_cp < 0xE000)
                    continue;
                n = utf8_put(next_cp, in);
                snprintf(label, sizeof label, "U+%04X", (unsigned)next_cp);
                hex = end + 1;
                char *want = next_cp == cp ? tokref_unhex(hex, strlen(hex), &wn) : NULL;
                if (next_cp == cp && !want) {
                    CHECK(want != NULL);
                    continue;
                }
                if (!check_one(label, in, n, want ? want : in, want ? wn : n))
                    bad_cp++;
                ncp++;
                free(want);
            }
        } else if (line[0] == 'S' && line[1] == ' ') {
            char *hin = line + 2, *sp = strchr(hin, ' ');
            size_t in_n, want_n;
            CHECK(sp != NULL);
            if (!sp)
                break;
            char *in = tokref_unhex(hin, (size_t)(sp - hin), &in_n);
            char *want = tokref_unhex(sp + 1, strlen(sp + 1), &want_n);
            CHECK(in != NULL && want != NULL);
            snprintf(label, sizeof label, "string %zu", nstr);
            if (in && want && !check_one(label, in, in_n, want, want_n))
                bad_str++;
            nstr++;
            free(in);
            free(want);
        } else {
            fprintf(stderr, "%s: unreadable line \"%.40s\"\n", path, line);
            CHECK(0);
            break;
        }
    }
    for (; next_cp <= 0x10FFFF; next_cp++) {
        char in[4], label[64];
        size_t n;
        if (next_cp >= 0xD800 && next_cp < 0xE000)
            continue;
        n = utf8_put(next_cp, in);
        snprintf(label, sizeof label, "U+%04X", (unsigned)next_cp);
        if (!check_one(label, in, n, in, n))
            bad_cp++;
        ncp++;
    }
    fprintf(stderr, "normalize: %zu code points, %zu differ from tokenizers; "
                    "%zu strings, %zu differ\n", ncp, bad_cp, nstr, bad_str);
    CHECK_EQ_INT(ncp, 0x110000 - 0x800);
    CHECK(nstr >= 5000);
    CHECK_EQ_INT(bad_cp, 0);
    CHECK_EQ_INT(bad_str, 0);
    free(text);
}

static void
quiet(td_log_level_t level, const char *line, void *arg)
{
    (void)level;
    (void)line;
    (void)arg;
}

/* Not UTF-8 as Rust reads it: refused, outputs untouched. */
static void
check_invalid(void)
{
    static const struct {
        const char *s;
        size_t n;
    } cases[] = {
        {"\xff", 1},              /* never a UTF-8 byte */
        {"\x80", 1},              /* continuation without a lead */
        {"\xc0\x80", 2},          /* overlong NUL */
        {"\xc1\xbf", 2},          /* overlong */
        {"\xe0\x9f\xbf", 3},      /* overlong 3-byte */
        {"\xf0\x8f\xbf\xbf", 4},  /* overlong 4-byte */
        {"\xed\xa0\x80", 3},      /* surrogate D800 */
        {"\xed\xbf\xbf", 3},      /* surrogate DFFF */
        {"\xf4\x90\x80\x80", 4},  /* above U+10FFFF */
        {"\xf5\x80\x80\x80", 4},
        {"a\xe2\x82", 3},         /* cut short */
        {"\xe2\x82\xac\xe2", 4},  /* cut short after a whole one */
        {"\xe2\x28\xa1", 3},      /* continuation missing */
    };
    char *out = (char *)&cases;
    size_t outlen = 12345;

    td_log_set_sink(quiet, NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_STATUS(td_tokmap_normalize(cases[i].s, cases[i].n, &out, &outlen),
                     TD_ERR_INVALID);
        CHECK(out == (char *)&cases && outlen == 12345);
    }
    CHECK_STATUS(td_tokmap_normalize("a", 1, NULL, &outlen), TD_ERR_INVALID);
    CHECK_STATUS(td_tokmap_normalize(NULL, 1, &out, &outlen), TD_ERR_INVALID);
    td_log_set_sink(NULL, NULL);

    /* The edges of what is valid are read, not refused. */
    static const char *valid[] = {"\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf",
                                  "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
                                  "\xf4\x8f\xbf\xbf"};
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        out = NULL;
        CHECK_STATUS(td_tokmap_normalize(valid[i], strlen(valid[i]), &out, &outlen), TD_OK);
        free(out);
    }
    /* NULL text of no bytes is the empty text. */
    out = NULL;
    CHECK_STATUS(td_tokmap_normalize(NULL, 0, &out, &outlen), TD_OK);
    CHECK(out != NULL && outlen == 0 && out[0] == '\0');
    free(out);
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_tokmap_normalize normalize.tsv.gz\n");
        return 2;
    }
    check_fixture(argv[1]);
    check_invalid();
    return td_check_exit("test_tokmap_normalize");
}
