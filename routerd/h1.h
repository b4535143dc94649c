/* routerd/h1.h — HTTP/1.1 request framing (RFC 9112): a request head and a
 * chunked body parsed from bytes with no I/O (tested and fuzzed on their own);
 * each refusal carries the status to answer and a message for the client. */
#ifndef TD_ROUTERD_H1_H
#define TD_ROUTERD_H1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define TD_H1_MAX_FIELDS 100    /* header fields in a head; more: 431 */
#define TD_H1_MAX_LINE 8192     /* a longer request line: 414 */
#define TD_H1_MAX_CHUNK_LINE 4096   /* a chunk-size line with its extensions */

/* The methods served, as bits (a route's methods are a set of them). */
typedef enum {
    TD_H1_GET = 1 << 0,
    TD_H1_HEAD = 1 << 1,
    TD_H1_POST = 1 << 2,
    TD_H1_PUT = 1 << 3,
    TD_H1_DELETE = 1 << 4,
    TD_H1_PATCH = 1 << 5,
    TD_H1_OPTIONS = 1 << 6,
} td_h1_method_t;

/* "GET", ...; "?" for anything else. */
const char *td_h1_method_str(td_h1_method_t m);

/* Why a request is refused: the status to answer and what to tell the client
 * (a static string, one sentence). */
typedef struct {
    int status;
    const char *message;
} td_h1_err_t;

/* One header field; name and value point into the parsed bytes, the value
 * without its surrounding blanks. */
typedef struct {
    const char *name, *value;
    size_t name_len, value_len;
} td_h1_field_t;

typedef enum {
    TD_H1_BODY_NONE = 0,
    TD_H1_BODY_LENGTH,        /* content_length bytes follow the head */
    TD_H1_BODY_CHUNKED,       /* a chunked body follows (td_h1_chunked_*) */
} td_h1_body_t;

/* A parsed request head. Pointers are into the bytes given to the parser. */
typedef struct {
    td_h1_method_t method;
    const char *method_tok;    /* the method as sent (for messages) */
    size_t method_len;
    const char *target;        /* the request target as sent: "/v1/models?x" */
    size_t target_len;
    unsigned minor;            /* HTTP/1.minor: 0 or 1 (1.2 and up read as 1.1) */
    td_h1_field_t fields[TD_H1_MAX_FIELDS];
    size_t nfields;
    td_h1_body_t body;
    uint64_t content_length;   /* TD_H1_BODY_LENGTH */
    bool expect_continue;      /* HTTP/1.1 "Expect: 100-continue" */
    bool close;                /* no further request on the connection: HTTP/1.0 or
                                  "Connection: close" */
} td_h1_head_t;

/* The search for the end of a head (the empty line after its fields), fed
 * the bytes as they arrive, cut anywhere. Zero-initialise it per head. */
typedef struct {
    size_t len;     /* bytes scanned so far; the head's length once found */
    int eol;        /* 0: inside a line, 1: at a line's start, 2: CR at a line's start */
} td_h1_scan_t;

/* Scan p[0..n), the bytes after those already scanned. True when the head
 * ends in them: it is s->len bytes long (through its empty line), and the
 * bytes of p after it were not scanned. Leading empty lines must have been
 * dropped (td_h1_skip_empty). */
bool td_h1_head_scan(td_h1_scan_t *s, const char *p, size_t n);

/* How many of p[0..n)'s first bytes are CR and LF (the empty lines a client
 * may send before a request line, which are ignored). */
size_t td_h1_skip_empty(const char *p, size_t n);

/* Parse the head p[0..len) (through its empty line). A Content-Length above
 * max_body is refused (413) here, before any of the body is read. TD_OK, or
 * TD_ERR_INVALID with e filled. */
td_status_t td_h1_head_parse(const char *p, size_t len, uint64_t max_body, td_h1_head_t *h,
                             td_h1_err_t *e);

/* The first field named name (case-insensitive), or NULL. */
const td_h1_field_t *td_h1_field(const td_h1_head_t *h, const char *name);

/* A chunked body being read: sizes, extensions (ignored), data, and the
 * trailer section (checked, then dropped). */
typedef struct {
    int state;
    uint64_t size;             /* the chunk being read: bytes left of it */
    uint64_t total;            /* data bytes so far */
    uint64_t max_body;
    size_t line;               /* bytes of the current size or trailer line */
    size_t trailer;            /* bytes of trailer fields so far */
    size_t max_trailer;
    bool digits;               /* the size line has its digits */
} td_h1_chunked_t;

void td_h1_chunked_init(td_h1_chunked_t *c, uint64_t max_body, size_t max_trailer);

/* One step over p[0..n) (n > 0): *used bytes are consumed, and the first
 * *data of them are body bytes (*data is 0, or equal to *used). TD_INPROGRESS:
 * more to come (call again with the bytes after the used ones); TD_OK: the
 * body has ended (its trailer section and last line consumed); TD_ERR_INVALID:
 * refused, e says why (413 when the data pass max_body). */
td_status_t td_h1_chunked_step(td_h1_chunked_t *c, const char *p, size_t n, size_t *used,
                               size_t *data, td_h1_err_t *e);

#endif
