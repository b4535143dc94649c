/* tests/unit/test_h1.c — routerd/h1.c: heads accepted or refused with their
 * status (Content-Length, codings, lines, methods, versions), a head's end
 * found across any split, chunked bodies read from any split or refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "h1.h"

#define MAXB 1000

static const struct {
    const char *head;
    int status;                /* 0: accepted */
    td_h1_body_t body;
    uint64_t cl;
    bool close, expect;
} heads[] = {
    { "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, TD_H1_BODY_NONE, 0, false, false },
    { "GET /health HTTP/1.0\r\n\r\n", 0, TD_H1_BODY_NONE, 0, true, false },
    { "GET / HTTP/1.1\n\n", 0, TD_H1_BODY_NONE, 0, false, false },   /* bare LF lines */
    { "POST /v1/x HTTP/1.1\r\nContent-Length: 12\r\n\r\n", 0, TD_H1_BODY_LENGTH, 12, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 0, TD_H1_BODY_NONE, 0, false, false },
    /* the same value twice, in two fields or a list: one length */
    { "POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", 0, TD_H1_BODY_LENGTH, 5, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", 0, TD_H1_BODY_LENGTH, 5, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 5x\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0, TD_H1_BODY_CHUNKED, 0, false, false },
    { "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", 0, TD_H1_BODY_CHUNKED, 0, false, false },
    { "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", 0, TD_H1_BODY_LENGTH, 3, false, true },
    { "POST / HTTP/1.1\r\nExpect: something\r\n\r\n", 417, TD_H1_BODY_NONE, 0, false, false },
    { "POST / HTTP/1.0\r\nExpect: something\r\n\r\n", 0, TD_H1_BODY_NONE, 0, true, false },
    { "GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n", 0, TD_H1_BODY_NONE, 0, true, false },
    /* request lines */
    { "GET / HTTP/2.0\r\n\r\n", 505, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1.2\r\n\r\n", 0, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET /\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET  / HTTP/1.1\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1.1 \r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GARBAGE\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "G(T / HTTP/1.1\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET foo HTTP/1.1\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET http://h/x?q HTTP/1.1\r\n\r\n", 0, TD_H1_BODY_NONE, 0, false, false },
    { "OPTIONS * HTTP/1.1\r\n\r\n", 0, TD_H1_BODY_NONE, 0, false, false },
    { "GET * HTTP/1.1\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "TRACE / HTTP/1.1\r\n\r\n", 405, TD_H1_BODY_NONE, 0, false, false },
    { "CONNECT h:1 HTTP/1.1\r\n\r\n", 405, TD_H1_BODY_NONE, 0, false, false },
    { "BREW / HTTP/1.1\r\n\r\n", 501, TD_H1_BODY_NONE, 0, false, false },
    { "get / HTTP/1.1\r\n\r\n", 501, TD_H1_BODY_NONE, 0, false, false },
    { "GET /\rx HTTP/1.1\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    /* fields */
    { "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1.1\r\n: x\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },           /* obs-fold */
    { "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },              /* bare CR */
    { "GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400, TD_H1_BODY_NONE, 0, false, false },
    { "GET / HTTP/1.1\r\nA: caf\xc3\xa9\t!\r\n\r\n", 0, TD_H1_BODY_NONE, 0, false, false },
};

static void
test_heads(void)
{
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        td_h1_head_t *h = malloc(sizeof *h);
        td_h1_err_t e = { 0, NULL };
        td_status_t st = td_h1_head_parse(heads[i].head, strlen(heads[i].head), MAXB, h, &e);
        int got = st == TD_OK ? 0 : e.status;

        if (got != heads[i].status)
            fprintf(stderr, "head %zu %.40s: status %d, want %d (%s)\n", i, heads[i].head, got,
                    heads[i].status, e.message ? e.message : "");
        CHECK_EQ_INT(got, heads[i].status);
        if (st == TD_OK && heads[i].status == 0) {
            CHECK_EQ_INT(h->body, heads[i].body);
            CHECK_EQ_INT(h->content_length, heads[i].cl);
            CHECK_EQ_INT(h->close, heads[i].close);
            CHECK_EQ_INT(h->expect_continue, heads[i].expect);
        } else {
            CHECK(e.message && e.message[0]);
        }
        free(h);
    }
}

static void
test_head_fields(void)
{
    const char *p = "POST /v1/chat/completions?a=1 HTTP/1.1\r\nHost: h\r\n"
                    "authorization:  Bearer k  \r\nX-Empty:\r\n\r\n";
    td_h1_head_t *h = malloc(sizeof *h);
    td_h1_err_t e;
    const td_h1_field_t *f;

    CHECK_STATUS(td_h1_head_parse(p, strlen(p), MAXB, h, &e), TD_OK);
    CHECK_EQ_INT(h->method, TD_H1_POST);
    CHECK_STR(td_h1_method_str(h->method), "POST");
    CHECK(h->target_len == 24 && memcmp(h->target, "/v1/chat/completions?a=1", 24) == 0);
    CHECK_EQ_INT(h->minor, 1);
    CHECK_EQ_INT(h->nfields, 3);
    f = td_h1_field(h, "Authorization");
    CHECK(f && f->value_len == 8 && memcmp(f->value, "Bearer k", 8) == 0);
    f = td_h1_field(h, "x-empty");
    CHECK(f && f->value_len == 0);
    CHECK(td_h1_field(h, "missing") == NULL);

    /* more than TD_H1_MAX_FIELDS fields: 431 */
    char *big = malloc(64 * 1024);
    size_t n = (size_t)sprintf(big, "GET / HTTP/1.1\r\n");
    for (int i = 0; i <= TD_H1_MAX_FIELDS; i++)
        n += (size_t)sprintf(big + n, "F%d: v\r\n", i);
    n += (size_t)sprintf(big + n, "\r\n");
    CHECK_STATUS(td_h1_head_parse(big, n, MAXB, h, &e), TD_ERR_INVALID);
    CHECK_EQ_INT(e.status, 431);
    /* a request line past TD_H1_MAX_LINE: 414 */
    n = (size_t)sprintf(big, "GET /");
    memset(big + n, 'a', TD_H1_MAX_LINE);
    n += TD_H1_MAX_LINE;
    n += (size_t)sprintf(big + n, " HTTP/1.1\r\n\r\n");
    CHECK_STATUS(td_h1_head_parse(big, n, MAXB, h, &e), TD_ERR_INVALID);
    CHECK_EQ_INT(e.status, 414);
    free(big);
    free(h);
}

/* The end of a head is found wherever the bytes are cut. */
static void
test_head_end(void)
{
    static const struct {
        const char *p;
        size_t end;   /* 0: none */
    } cases[] = {
        { "GET / HTTP/1.1\r\nA: b\r\n\r\nbody", 24 },
        { "GET / HTTP/1.1\n\nbody", 16 },
        { "GET / HTTP/1.1\r\n\nx", 17 },
        { "GET / HTTP/1.1\r\nA: b\r\n", 0 },
        { "GET / HTTP/1.1\r\nA: b\r\n\r", 0 },
        { "GET / HTTP/1.1\r\nA: b\r\r\nC: d\r\n\r\n", 31 },   /* no empty line before */
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = strlen(cases[i].p);
        for (size_t cut = 0; cut <= len; cut++) {
            /* in two pieces: cut, then the rest */
            td_h1_scan_t s = {0};
            bool found = td_h1_head_scan(&s, cases[i].p, cut) ||
                         td_h1_head_scan(&s, cases[i].p + cut, len - cut);
            CHECK_EQ_INT(found, cases[i].end != 0);
            if (found)
                CHECK_EQ_INT(s.len, cases[i].end);
        }
        /* a byte at a time */
        td_h1_scan_t s = {0};
        bool found = false;
        for (size_t k = 0; k < len && !found; k++)
            found = td_h1_head_scan(&s, cases[i].p + k, 1);
        CHECK_EQ_INT(found, cases[i].end != 0);
        if (found)
            CHECK_EQ_INT(s.len, cases[i].end);
    }
    CHECK_EQ_INT(td_h1_skip_empty("\r\n\nGET", 6), 3);
    CHECK_EQ_INT(td_h1_skip_empty("GET", 3), 0);
}

static const struct {
    const char *body;
    int status;           /* 0: accepted */
    const char *data;     /* what it carries */
    size_t rest;          /* bytes after it left unread */
} chunked[] = {
    { "5\r\nhello\r\n0\r\n\r\n", 0, "hello", 0 },
    { "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nGET", 0, "hello world", 3 },
    { "A\r\n0123456789\r\n0\r\n\r\n", 0, "0123456789", 0 },
    { "a;ext=1\r\n0123456789\r\n0;x\r\n\r\n", 0, "0123456789", 0 },
    { "5 ; e\r\nhello\r\n0\r\n\r\n", 0, "hello", 0 },
    { "5\nhello\n0\n\n", 0, "hello", 0 },                          /* bare LF */
    { "0005\r\nhello\r\n0\r\nTrailer: x\r\nMore: y\r\n\r\n", 0, "hello", 0 },
    { "0\r\n\r\n", 0, "", 0 },
    { "zz\r\nhello\r\n0\r\n\r\n", 400, NULL, 0 },                           /* not a size */
    { "\r\nhello\r\n0\r\n\r\n", 400, NULL, 0 },                             /* no digits */
    { "-5\r\nhello\r\n", 400, NULL, 0 },
    { ";x\r\n", 400, NULL, 0 },
    { "5\r\nhelloX\r\n0\r\n\r\n", 400, NULL, 0 },                           /* longer than its size */
    { "5\rxhello", 400, NULL, 0 },                                          /* bare CR */
    { "3e9\r\n", 413, NULL, 0 },                                            /* past max_body */
    { "1f4\r\n", 0, NULL, 0 },                                     /* 500: within, incomplete */
    { "ffffffffffffffffffff\r\n", 413, NULL, 0 },
    { "5\r\nhello\r\n0\r\nA: b\x01\r\n\r\n", 400, NULL, 0 },
    { "5\r\nhello\r\n0\r\n b\r\n\r\n", 400, NULL, 0 },
};

/* Feed s to a chunked reader in pieces of `step` bytes (0: all at once). */
static int
feed(const char *s, size_t len, size_t step, char *out, size_t *outlen, size_t *rest)
{
    td_h1_chunked_t c;
    size_t at = 0;

    td_h1_chunked_init(&c, MAXB, 64);
    *outlen = 0;
    while (at < len) {
        size_t piece = step && step < len - at ? step : len - at, used, data;
        td_h1_err_t e;
        td_status_t st = td_h1_chunked_step(&c, s + at, piece, &used, &data, &e);
        if (st == TD_ERR_INVALID)
            return e.status;
        CHECK(used <= piece);
        CHECK(data == 0 || data == used);
        memcpy(out + *outlen, s + at, data);
        *outlen += data;
        at += used;
        if (st == TD_OK) {
            *rest = len - at;
            return 0;
        }
        CHECK(used > 0 || piece == 0);
    }
    return -1;   /* incomplete */
}

static void
test_chunked(void)
{
    for (size_t i = 0; i < sizeof chunked / sizeof chunked[0]; i++) {
        const char *s = chunked[i].body;
        size_t len = strlen(s);
        for (size_t step = 0; step <= len; step++) {
            char out[MAXB + 64];
            size_t outlen, rest = 0;
            int got = feed(s, len, step, out, &outlen, &rest);
            int want = chunked[i].data || chunked[i].status ? chunked[i].status : -1;
            if (got != want)
                fprintf(stderr, "chunked %zu step %zu: %d, want %d\n", i, step, got, want);
            CHECK_EQ_INT(got, want);
            if (got == 0) {
                CHECK(outlen == strlen(chunked[i].data) &&
                      memcmp(out, chunked[i].data, outlen) == 0);
                CHECK_EQ_INT(rest, chunked[i].rest);
            }
        }
    }
    /* trailer fields past their limit: 431 */
    char t[256];
    size_t outlen, rest;
    char out[64];
    snprintf(t, sizeof t, "0\r\nA: %080d\r\n\r\n", 0);
    CHECK_EQ_INT(feed(t, strlen(t), 0, out, &outlen, &rest), 431);
}

int
main(void)
{
    test_heads();
    test_head_fields();
    test_head_end();
    test_chunked();
    return td_check_exit("test_h1");
}
