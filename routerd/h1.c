/* routerd/h1.c — HTTP/1.1 request framing (RFC 9112), strict where a lax
 * reading could let two parsers disagree on where a request ends (one
 * Content-Length, chunked only, no folding, no bare CR); a lone LF ends a line. */
#include "h1.h"

#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    td_h1_method_t m;
} h1_methods[] = {
    { "GET", TD_H1_GET },       { "HEAD", TD_H1_HEAD },     { "POST", TD_H1_POST },
    { "PUT", TD_H1_PUT },       { "DELETE", TD_H1_DELETE }, { "PATCH", TD_H1_PATCH },
    { "OPTIONS", TD_H1_OPTIONS },
};

const char *
td_h1_method_str(td_h1_method_t m)
{
    for (size_t i = 0; i < sizeof h1_methods / sizeof h1_methods[0]; i++)
        if (h1_methods[i].m == m)
            return h1_methods[i].name;
    return "?";
}

static td_status_t
h1_fail(td_h1_err_t *e, int status, const char *message)
{
    e->status = status;
    e->message = message;
    return TD_ERR_INVALID;
}

/* tchar (RFC 9110 5.6.2) */
static bool
h1_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* a field value's bytes: VCHAR, obs-text, SP, HTAB */
static bool
h1_vchar(unsigned char c)
{
    return c == '\t' || (c >= ' ' && c != 0x7f);
}

static bool
h1_blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool
h1_eq(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp(s, lit, n) == 0;
}

/* ======================================================================= */
/* The head                                                                  */
/* ======================================================================= */

size_t
td_h1_skip_empty(const char *p, size_t n)
{
    size_t i = 0;

    while (i < n && (p[i] == '\r' || p[i] == '\n'))
        i++;
    return i;
}

bool
td_h1_head_scan(td_h1_scan_t *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (p[i]) {
        case '\n':
            if (s->eol) {   /* an empty line: "\n\n" or "\n\r\n" */
                s->len += i + 1;
                return true;
            }
            s->eol = 1;
            break;
        case '\r':
            s->eol = s->eol == 1 ? 2 : 0;
            break;
        default:
            s->eol = 0;
        }
    }
    s->len += n;
    return false;
}

/* The next line of p[*at..len): its start and length without CR LF. A CR
 * anywhere but before the LF is refused. False at the end of the bytes. */
static bool
h1_line(const char *p, size_t len, size_t *at, const char **line, size_t *n, bool *bare_cr)
{
    const char *s = p + *at, *lf;

    if (*at >= len)
        return false;
    lf = memchr(s, '\n', len - *at);
    if (!lf)
        return false;
    *line = s;
    *n = (size_t)(lf - s);
    *at += *n + 1;
    if (*n > 0 && s[*n - 1] == '\r')
        (*n)--;
    *bare_cr = memchr(s, '\r', *n) != NULL;
    return true;
}

static td_status_t
h1_request_line(const char *s, size_t n, td_h1_head_t *h, td_h1_err_t *e)
{
    const char *sp1, *sp2, *v;
    size_t i;

    if (n > TD_H1_MAX_LINE)
        return h1_fail(e, 414, "The request line is too long.");
    sp1 = memchr(s, ' ', n);
    if (!sp1 || sp1 == s)
        return h1_fail(e, 400, "The request line is malformed.");
    for (const char *c = s; c < sp1; c++)
        if (!h1_tchar((unsigned char)*c))
            return h1_fail(e, 400, "The request line is malformed.");
    sp2 = memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - s));
    if (!sp2 || sp2 == sp1 + 1)
        return h1_fail(e, 400, "The request line is malformed.");
    for (const char *c = sp1 + 1; c < sp2; c++)
        if ((unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f)
            return h1_fail(e, 400, "The request line is malformed.");
    v = sp2 + 1;
    if (s + n - v != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' ||
        v[6] != '.' || v[7] < '0' || v[7] > '9')
        return h1_fail(e, 400, "The request line is malformed.");
    if (v[5] != '1')
        return h1_fail(e, 505, "Only HTTP/1.0 and HTTP/1.1 are supported.");
    h->minor = v[7] == '0' ? 0 : 1;

    h->method_tok = s;
    h->method_len = (size_t)(sp1 - s);
    h->method = 0;
    for (i = 0; i < sizeof h1_methods / sizeof h1_methods[0]; i++)
        if (strlen(h1_methods[i].name) == h->method_len &&
            memcmp(h1_methods[i].name, s, h->method_len) == 0)
            h->method = h1_methods[i].m;
    if (!h->method) {
        if ((h->method_len == 5 && memcmp(s, "TRACE", 5) == 0) ||
            (h->method_len == 7 && memcmp(s, "CONNECT", 7) == 0))
            return h1_fail(e, 405, "This method is not allowed.");
        return h1_fail(e, 501, "This method is not implemented.");
    }

    h->target = sp1 + 1;
    h->target_len = (size_t)(sp2 - h->target);
    if (h->target[0] == '/')
        return TD_OK;
    if (h->target_len == 1 && h->target[0] == '*' && h->method == TD_H1_OPTIONS)
        return TD_OK;
    if ((h->target_len > 7 && strncasecmp(h->target, "http://", 7) == 0) ||
        (h->target_len > 8 && strncasecmp(h->target, "https://", 8) == 0))
        return TD_OK;
    return h1_fail(e, 400, "The request target is malformed.");
}

/* Split a field value into comma-separated elements (blanks around them
 * dropped, empty ones skipped); fn is called on each, and its failure ends
 * the walk. */
typedef td_status_t (*h1_elem_fn)(const char *s, size_t n, void *arg);

static td_status_t
h1_list(const char *s, size_t n, h1_elem_fn fn, void *arg)
{
    size_t i = 0;

    while (i < n) {
        size_t j = i, k;
        while (j < n && s[j] != ',')
            j++;
        k = j;
        while (i < k && h1_blank(s[i]))
            i++;
        while (k > i && h1_blank(s[k - 1]))
            k--;
        if (k > i) {
            td_status_t st = fn(s + i, k - i, arg);
            if (st != TD_OK)
                return st;
        }
        i = j + 1;
    }
    return TD_OK;
}

typedef struct {
    td_h1_head_t *h;
    td_h1_err_t *e;
    bool have_cl, bad_cl, conflict_cl;
    uint64_t cl;
    size_t te_elems;
    bool te_chunked;
} h1_framing_t;

static td_status_t
h1_cl_elem(const char *s, size_t n, void *arg)
{
    h1_framing_t *f = arg;
    uint64_t v = 0;

    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            f->bad_cl = true;
            return TD_OK;
        }
        /* saturate: a value past 2^64 is simply too large (413) */
        v = v > (UINT64_MAX - 9) / 10 ? UINT64_MAX : v * 10 + (uint64_t)(s[i] - '0');
    }
    if (f->have_cl && v != f->cl)
        f->conflict_cl = true;
    f->have_cl = true;
    f->cl = v;
    return TD_OK;
}

static td_status_t
h1_te_elem(const char *s, size_t n, void *arg)
{
    h1_framing_t *f = arg;

    f->te_elems++;
    f->te_chunked = h1_eq(s, n, "chunked");
    return TD_OK;
}

static td_status_t
h1_conn_elem(const char *s, size_t n, void *arg)
{
    h1_framing_t *f = arg;

    if (h1_eq(s, n, "close"))
        f->h->close = true;
    return TD_OK;
}

static td_status_t
h1_field(const char *s, size_t n, h1_framing_t *f)
{
    td_h1_head_t *h = f->h;
    const char *colon = memchr(s, ':', n), *v;
    size_t vn;
    td_h1_field_t *fl;

    if (h1_blank(s[0]))
        return h1_fail(f->e, 400, "Folded header lines are not accepted.");
    if (!colon || colon == s)
        return h1_fail(f->e, 400, "A header line is malformed.");
    for (const char *c = s; c < colon; c++)
        if (!h1_tchar((unsigned char)*c))
            return h1_fail(f->e, 400, "A header name is malformed.");
    v = colon + 1;
    vn = (size_t)(s + n - v);
    while (vn > 0 && h1_blank(*v))
        v++, vn--;
    while (vn > 0 && h1_blank(v[vn - 1]))
        vn--;
    for (size_t i = 0; i < vn; i++)
        if (!h1_vchar((unsigned char)v[i]))
            return h1_fail(f->e, 400, "A header value holds a control character.");
    if (h->nfields == TD_H1_MAX_FIELDS)
        return h1_fail(f->e, 431, "The request has too many header fields.");
    fl = &h->fields[h->nfields++];
    fl->name = s;
    fl->name_len = (size_t)(colon - s);
    fl->value = v;
    fl->value_len = vn;

    if (h1_eq(fl->name, fl->name_len, "content-length")) {
        if (vn == 0)
            f->bad_cl = true;
        return h1_list(v, vn, h1_cl_elem, f);
    }
    if (h1_eq(fl->name, fl->name_len, "transfer-encoding")) {
        if (vn == 0)
            return h1_fail(f->e, 400, "The Transfer-Encoding header is empty.");
        return h1_list(v, vn, h1_te_elem, f);
    }
    if (h1_eq(fl->name, fl->name_len, "connection"))
        return h1_list(v, vn, h1_conn_elem, f);
    if (h1_eq(fl->name, fl->name_len, "expect") && h->minor >= 1) {
        /* HTTP/1.0 requests' Expect is ignored (RFC 9110 10.1.1) */
        if (!h1_eq(v, vn, "100-continue"))
            return h1_fail(f->e, 417, "Only 'Expect: 100-continue' is supported.");
        h->expect_continue = true;
    }
    return TD_OK;
}

td_status_t
td_h1_head_parse(const char *p, size_t len, uint64_t max_body, td_h1_head_t *h,
                 td_h1_err_t *e)
{
    h1_framing_t f = { .h = h, .e = e };
    size_t at = 0, n;
    const char *line;
    bool bare_cr, ended = false;
    td_status_t st;

    memset(h, 0, sizeof *h);
    if (!h1_line(p, len, &at, &line, &n, &bare_cr))
        return h1_fail(e, 400, "The request head is incomplete.");
    if (bare_cr)
        return h1_fail(e, 400, "The request line is malformed.");
    st = h1_request_line(line, n, h, e);
    if (st != TD_OK)
        return st;
    while (h1_line(p, len, &at, &line, &n, &bare_cr)) {
        if (bare_cr)
            return h1_fail(e, 400, "A header line holds a bare CR.");
        if (n == 0) {
            ended = true;
            break;
        }
        st = h1_field(line, n, &f);
        if (st != TD_OK)
            return st;
    }
    if (!ended || at != len)
        return h1_fail(e, 400, "The request head is incomplete.");

    if (h->minor == 0)
        h->close = true;
    if (f.bad_cl)
        return h1_fail(e, 400, "The Content-Length header is not a number.");
    if (f.conflict_cl)
        return h1_fail(e, 400, "The request has conflicting Content-Length values.");
    if (f.te_elems) {
        /* RFC 9112 6.1 and 6.3: framing that a second parser could read
         * otherwise is refused outright */
        if (h->minor == 0)
            return h1_fail(e, 400, "Transfer-Encoding is not allowed in an HTTP/1.0 request.");
        if (f.have_cl)
            return h1_fail(e, 400, "The request has both Content-Length and Transfer-Encoding.");
        if (f.te_elems != 1 || !f.te_chunked)
            return h1_fail(e, 501, "Only the chunked transfer coding is supported.");
        h->body = TD_H1_BODY_CHUNKED;
        return TD_OK;
    }
    if (f.have_cl && f.cl > max_body)
        return h1_fail(e, 413, "The request body is too large.");
    if (f.have_cl && f.cl > 0) {
        h->body = TD_H1_BODY_LENGTH;
        h->content_length = f.cl;
    }
    return TD_OK;
}

const td_h1_field_t *
td_h1_field(const td_h1_head_t *h, const char *name)
{
    for (size_t i = 0; i < h->nfields; i++)
        if (h1_eq(h->fields[i].name, h->fields[i].name_len, name))
            return &h->fields[i];
    return NULL;
}

/* ======================================================================= */
/* Chunked bodies                                                            */
/* ======================================================================= */

enum {
    CH_SIZE,         /* chunk-size digits */
    CH_EXT,          /* after the digits: extensions, up to the line end */
    CH_SIZE_LF,      /* a CR ended the size line: LF next */
    CH_DATA,
    CH_DATA_END,     /* CR LF (or LF) after a chunk's data */
    CH_DATA_LF,
    CH_TRAILER,      /* the start of a trailer line (or of the final empty line) */
    CH_TRAILER_LINE,
    CH_TRAILER_LF,   /* a CR in a trailer line: LF next */
    CH_END_LF,       /* a CR began the final empty line: LF next */
    CH_DONE,
};

void
td_h1_chunked_init(td_h1_chunked_t *c, uint64_t max_body, size_t max_trailer)
{
    memset(c, 0, sizeof *c);
    c->state = CH_SIZE;
    c->max_body = max_body;
    c->max_trailer = max_trailer;
}

static int
h1_hex(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* The size line has ended: a chunk of c->size bytes follows, or the trailer. */
static td_status_t
h1_size_done(td_h1_chunked_t *c, td_h1_err_t *e)
{
    if (!c->digits)
        return h1_fail(e, 400, "A chunk size is malformed.");
    c->line = 0;
    c->digits = false;
    c->state = c->size ? CH_DATA : CH_TRAILER;
    return TD_OK;
}

/* One byte of a size line: the digits (CH_SIZE), the extensions (CH_EXT),
 * the LF after a CR (CH_SIZE_LF). */
static td_status_t
h1_size_byte(td_h1_chunked_t *c, char ch, td_h1_err_t *e)
{
    int d;

    if (c->state == CH_SIZE_LF) {
        if (ch != '\n')
            return h1_fail(e, 400, "A chunk size line has a bare CR.");
        return h1_size_done(c, e);
    }
    if (++c->line > TD_H1_MAX_CHUNK_LINE)
        return h1_fail(e, 400, "A chunk size line is too long.");
    if (ch == '\r') {
        c->state = CH_SIZE_LF;
        return TD_OK;
    }
    if (ch == '\n')
        return h1_size_done(c, e);
    if (c->state == CH_EXT) {
        if (!h1_vchar((unsigned char)ch))
            return h1_fail(e, 400, "A chunk extension holds a control character.");
        return TD_OK;
    }
    if ((d = h1_hex(ch)) >= 0) {
        c->digits = true;
        c->size = c->size * 16 + (uint64_t)d;
        if (c->size > c->max_body - c->total)
            return h1_fail(e, 413, "The request body is too large.");
    } else if (ch == ';' || h1_blank(ch)) {
        if (!c->digits)
            return h1_fail(e, 400, "A chunk size is malformed.");
        c->state = CH_EXT;
    } else {
        return h1_fail(e, 400, "A chunk size is malformed.");
    }
    return TD_OK;
}

/* One byte of the line end after a chunk's data (CH_DATA_END, CH_DATA_LF). */
static td_status_t
h1_data_end_byte(td_h1_chunked_t *c, char ch, td_h1_err_t *e)
{
    if (ch == '\n')
        c->state = CH_SIZE;
    else if (ch == '\r' && c->state == CH_DATA_END)
        c->state = CH_DATA_LF;
    else
        return h1_fail(e, 400, "A chunk is longer than its size.");
    return TD_OK;
}

/* One byte of the trailer: a line's start (CH_TRAILER), its rest
 * (CH_TRAILER_LINE), the LF after a CR in it (CH_TRAILER_LF) or after the CR
 * of the final empty line (CH_END_LF). */
static td_status_t
h1_trailer_byte(td_h1_chunked_t *c, char ch, td_h1_err_t *e)
{
    switch (c->state) {
    case CH_TRAILER:
        if (ch == '\r') {
            c->state = CH_END_LF;
            return TD_OK;
        }
        if (ch == '\n') {
            c->state = CH_DONE;
            return TD_OK;
        }
        if (h1_blank(ch))
            return h1_fail(e, 400, "Folded trailer lines are not accepted.");
        c->state = CH_TRAILER_LINE;   /* and this byte is its first: */
        /* fall through */
    case CH_TRAILER_LINE:
        if (++c->trailer > c->max_trailer)
            return h1_fail(e, 431, "The request's trailer fields are too large.");
        if (ch == '\r')
            c->state = CH_TRAILER_LF;
        else if (ch == '\n')
            c->state = CH_TRAILER;
        else if (!h1_vchar((unsigned char)ch))
            return h1_fail(e, 400, "A trailer line holds a control character.");
        return TD_OK;
    case CH_TRAILER_LF:
        if (ch != '\n')
            return h1_fail(e, 400, "A trailer line holds a bare CR.");
        c->state = CH_TRAILER;
        return TD_OK;
    default:   /* CH_END_LF */
        if (ch != '\n')
            return h1_fail(e, 400, "The chunked body ends with a bare CR.");
        c->state = CH_DONE;
        return TD_OK;
    }
}

td_status_t
td_h1_chunked_step(td_h1_chunked_t *c, const char *p, size_t n, size_t *used, size_t *data,
                   td_h1_err_t *e)
{
    size_t i = 0;
    td_status_t st;

    *data = 0;
    if (c->state == CH_DATA) {
        size_t k = n < c->size ? n : (size_t)c->size;
        c->size -= k;
        c->total += k;
        if (c->size == 0)
            c->state = CH_DATA_END;
        *used = *data = k;
        return TD_INPROGRESS;
    }
    for (; i < n && c->state != CH_DATA && c->state != CH_DONE; i++) {
        switch (c->state) {
        case CH_SIZE:
        case CH_EXT:
        case CH_SIZE_LF:
            st = h1_size_byte(c, p[i], e);
            break;
        case CH_DATA_END:
        case CH_DATA_LF:
            st = h1_data_end_byte(c, p[i], e);
            break;
        case CH_TRAILER:
        case CH_TRAILER_LINE:
        case CH_TRAILER_LF:
        case CH_END_LF:
            st = h1_trailer_byte(c, p[i], e);
            break;
        default:
            return h1_fail(e, 500, "The chunked body reader is in no known state.");
        }
        if (st != TD_OK)
            return st;
    }
    *used = i;
    return c->state == CH_DONE ? TD_OK : TD_INPROGRESS;
}
