/* routerd/http.h — routerd's HTTP/1.1 server: listeners serving a route
 * table given by the caller (routes.h) with the bearer-key check, and the
 * answers every route and request uses (plain, JSON, OpenAI errors, streams). */
#ifndef TD_ROUTERD_HTTP_H
#define TD_ROUTERD_HTTP_H

/* It knows no route and no request of the API. Each connection reads one
 * request at a time under a deadline (read_timeout for the head and body,
 * idle_timeout between requests), then hands it to its route with no deadline
 * at all: a stream may stay quiet for as long as its request runs. A listener
 * holds at most max_conns connections (the least recently active idle or
 * reading one is closed to take a new one, else the new one gets a 503); the
 * bytes of requests held (heads and bodies) are capped across listeners (a
 * td_http_budget_t); accept() failures (EMFILE, ...) pause accepting with a
 * bounded backoff. Every refusal is an OpenAI error object with its status;
 * the framing rules are h1.h's. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "apikeys.h"
#include "h1.h"
#include "metrics.h"
#include "openai.h"
#include "status.h"

struct event_base;

/* A request: owned by its connection; valid from the route's call until the
 * route answers it (td_http_reply*, td_http_stream_end) or until its gone
 * callback (td_http_on_gone) returns. */
typedef struct td_http_req_s td_http_req_t;
typedef struct td_http_listener_s td_http_listener_t;

/* The format of a route's errors, also of the refusals made before the
 * route ran (a bad head, a timeout, a missing key) for a request to its path. */
typedef enum {
    TD_HTTP_ERR_OPENAI = 0,    /* {"error":{"message","type","param","code"}} */
    TD_HTTP_ERR_ANTHROPIC,     /* {"type":"error","error":{"type","message"}}, 503 as 529;
                                  a key also by x-api-key */
} td_http_errfmt_t;

/* One entry of a route table (ends with path NULL). */
typedef struct {
    const char *path;     /* the path; ending in '*': every longer path with this prefix */
    int methods;          /* TD_H1_GET | ... */
    bool admin;           /* served on the admin listener, with the admin key */
    bool auth;            /* needs a key */
    void (*fn)(td_http_req_t *req, void *arg);   /* arg: the site's */
    td_http_errfmt_t errfmt;
} td_http_route_t;

/* Bytes of requests held (heads and bodies being read or served), across
 * the listeners that share it. */
typedef struct {
    uint64_t max;
    uint64_t used;
} td_http_budget_t;

/* What a listener serves and its limits. Everything it points to outlives
 * the listener. */
typedef struct {
    struct event_base *base;
    const td_http_route_t *routes;  /* the entries whose admin flag is this site's */
    bool admin;
    const td_apikeys_t *keys;       /* for routes with auth; NULL: no key needed */
    td_metrics_t *metrics;          /* refusals are counted here */
    size_t max_body;                /* larger bodies get 413 before they are read */
    size_t max_conns;               /* open connections; 0: no cap */
    uint64_t read_timeout_ms;       /* a request's head and body arrive within this */
    uint64_t idle_timeout_ms;       /* between requests on a kept-alive connection */
    uint64_t write_timeout_ms;      /* an answer whose bytes make no progress that
                                       long ends its connection; 0: none */
    /* Backpressure for streams (td_http_stream_over): a stream's answer bytes
     * buffered (not yet taken by the kernel), at most stream_max (0: no cap),
     * and every answer's together, at most out_budget->max (NULL: no cap);
     * a streaming socket's kernel send buffer is set to stream_sndbuf (0:
     * the kernel's), so that the bytes waiting are ours to count. */
    size_t stream_max;
    td_http_budget_t *out_budget;
    int stream_sndbuf;
    unsigned retry_after_s;         /* in the 503 of a refused connection */
    td_http_budget_t *budget;
    void *arg;                      /* passed to every route */
} td_http_site_t;

/* The largest request head (request line and fields) read. */
#define TD_HTTP_MAX_HEAD (64u * 1024u)

/* Serve site on hostport ("host:port", port 0 = a free one); failures are
 * logged where they happen. site is copied. */
td_status_t td_http_listen(const td_http_site_t *site, const char *hostport,
                           td_http_listener_t **out, uint16_t *port_out);
/* Serve site on fd, a listening socket of any family (taken over: closed
 * with the listener, or at once on failure); for tests and harnesses. */
td_status_t td_http_listen_fd(const td_http_site_t *site, int fd, td_http_listener_t **out);
/* Close the listener and every connection (the gone callbacks of requests
 * still held are called). NULL is a no-op. */
void td_http_listener_destroy(td_http_listener_t *l);
/* Shutdown: close l's listening socket (new connections are refused); the
 * connections open go on being served. NULL is a no-op. */
void td_http_stop_accepting(td_http_listener_t *l);
/* Lower the connection caps so that both fit in the file-descriptor limit
 * (RLIMIT_NOFILE) with `reserve` descriptors left for everything else (the
 * control port, files); a lowered cap is logged. 0 (no cap) stays. */
void td_http_fit_fd_limit(size_t *api_conns, size_t *admin_conns, size_t reserve);

/* ---- The request ---------------------------------------------------------- */

/* The first field named name (case-insensitive), or NULL. */
const char *td_http_header(const td_http_req_t *req, const char *name);
/* The request's path (without the query) and method (a TD_H1_* bit). */
const char *td_http_path(const td_http_req_t *req);
int td_http_method(const td_http_req_t *req);
/* The body, NUL-terminated (valid while req is). */
const char *td_http_body(td_http_req_t *req, size_t *len);
/* The body handed over (NUL-terminated, malloc'd, the caller frees it; NULL
 * when out of memory): for work off the loop, which must not touch req. The
 * request's body is empty afterwards. */
char *td_http_body_take(td_http_req_t *req, size_t *len);
/* Admin bodies: {"<field>": "<string>"} → the string (copied into buf). */
td_status_t td_http_body_field(td_http_req_t *req, const char *field, char *buf, size_t len,
                               td_openai_err_t *e);

/* fn(req, arg) is called if the client goes away before the answer is
 * complete (a reset, a failed or stalled write, or a half-close whose probe
 * comes back reset); req is freed when it returns. fn NULL: none. A request
 * held past the route's return needs one; one without is answered before
 * the loop runs again. */
void td_http_on_gone(td_http_req_t *req, void (*fn)(td_http_req_t *req, void *arg), void *arg);

/* ---- Answers: each reply ends the request ------------------------------- */

/* A header of the answer (before it starts). "Connection: close" closes the
 * connection after the answer. */
void td_http_add_header(td_http_req_t *req, const char *name, const char *value);
void td_http_reply(td_http_req_t *req, int code, const char *ctype, const char *body,
                   size_t len);
void td_http_reply_err(td_http_req_t *req, const td_openai_err_t *e);
/* A request refused before it was scheduled: counted in m (errors by
 * reason, requests rejected) and answered with e. */
void td_http_refuse(td_metrics_t *m, td_http_req_t *req, const td_openai_err_t *e);
/* json (stolen; NULL: out of memory, answered 500) as the body. */
void td_http_reply_json(td_http_req_t *req, int code, json_t *json);

/* A streamed answer (chunked; to an HTTP/1.0 client, until the connection
 * closes): start with the status and the headers added, send pieces, end. */
void td_http_stream_start(td_http_req_t *req, int code);
void td_http_stream_send(td_http_req_t *req, const void *data, size_t len);
void td_http_stream_end(td_http_req_t *req);
/* The stream's bytes not yet taken by the kernel. */
size_t td_http_stream_pending(const td_http_req_t *req);
/* Whether the producer of req's stream should stop: more than stream_max
 * buffered for it, or more than the budget for every answer together. */
bool td_http_stream_over(const td_http_req_t *req);
/* End req's connection now, its buffered bytes dropped (a stream whose
 * client reads too slowly: waiting for it to read them would hold them for
 * as long as it likes). Its gone callback is not called; req is freed. */
void td_http_abort(td_http_req_t *req, const char *why);
/* Whether every answer together is over the budget (out_budget). */
bool td_http_out_full(const td_http_req_t *req);
/* Whether a stopped producer may go on: at most a quarter of stream_max
 * buffered for it (room to spare, so that it does not stop again at once),
 * and every answer together within the budget. */
bool td_http_stream_drained(const td_http_req_t *req);
/* fn(req, arg), once, when req's stream has drained to a quarter of
 * stream_max (it may still be over the total budget: td_http_stream_drained
 * says); NULL: none. */
void td_http_on_drain(td_http_req_t *req, void (*fn)(td_http_req_t *req, void *arg), void *arg);

#endif
