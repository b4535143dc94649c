/* routerd/http.c — routerd's HTTP/1.1 server on libevent bufferevents:
 * listeners (the connection cap, pauses on accept errors), each connection's
 * state machine, the budget of request bytes held, dispatch, answers. */
#include "http.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "anthropic.h"
#include "buf.h"
#include "clock.h"
#include "fsm.h"
#include "log.h"
#include "net.h"

#define HTTP_ACCEPT_PAUSE_MIN_MS 100u   /* after an accept error, accepting pauses ... */
#define HTTP_ACCEPT_PAUSE_MAX_MS 1000u  /* ... doubling up to this while it keeps failing */
#define HTTP_LINGER_MS 2000u            /* a closing connection drains, then reads for this */
#define HTTP_PROBE_FIRST_MS 100u        /* after a half-close: first look for a reset ... */
#define HTTP_PROBE_MS 1000u             /* ... then this often */
#define HTTP_LOG_EPISODE_MS 10000u      /* lines about a listener's episodes */
#define HTTP_LOG_PEER_MS 1000u          /* lines about one peer's connection or request */

/* ======================================================================= */
/* Types                                                                     */
/* ======================================================================= */

typedef enum {
    CONN_IDLE = 0,   /* waiting for a request's first byte */
    CONN_HEAD,       /* reading a request head */
    CONN_BODY,       /* reading its body */
    CONN_SERVE,      /* the request is with its route: no deadline */
    CONN_SEND,       /* the answer is queued; waiting until it is written */
    CONN_CLOSING,    /* no more requests: writing what is queued, then lingering */
    CONN_NSTATES
} conn_state_t;

typedef struct td_http_conn_s td_http_conn_t;

struct td_http_req_s {
    td_http_conn_t *conn;
    td_h1_head_t h;          /* points into head */
    char *head;              /* the head's bytes, its fields NUL-terminated in place,
                                then the path */
    size_t head_len;
    const char *path;
    td_buf_t body;
    td_buf_t out;            /* header lines the route added */
    void (*gone)(td_http_req_t *req, void *arg);
    void *gone_arg;
    void (*drain)(td_http_req_t *req, void *arg);   /* td_http_on_drain */
    void *drain_arg;
    bool started;            /* the answer's status line is queued */
    bool streaming, chunked, sse;
};

struct td_http_conn_s {
    td_http_listener_t *l;
    td_http_conn_t *prev, *next;    /* in l->idle (IDLE, HEAD, BODY) or l->busy */
    bool evictable;                 /* which of the two */
    struct bufferevent *bev;
    evutil_socket_t fd;
    struct event *timer;            /* read deadline, idle limit, probe, linger */
    conn_state_t state;
    uint64_t id;
    char peer[64];
    td_http_req_t *req;             /* HEAD (once parsed) .. SEND */
    td_h1_scan_t scan;              /* the search for the head's end */
    uint64_t body_left;             /* Content-Length bytes still to read */
    td_h1_chunked_t chunked;
    uint64_t held;                  /* bytes counted in the budget */
    size_t out_len;                 /* answer bytes buffered: counted in out_budget */
    bool answered_one;              /* idle now means kept alive */
    bool close_after;               /* no request after the current one */
    bool peer_eof;                  /* the client half-closed */
    bool probed;                    /* after the half-close: the probe is written */
    bool shut;                      /* our side shut down for writing */
};

/* A doubly-linked list of connections, least recently active first. */
typedef struct {
    td_http_conn_t *head, *tail;
} conn_list_t;

struct td_http_listener_s {
    td_http_site_t site;
    const char *name;               /* "http" or "admin" */
    struct evconnlistener *evl;
    struct event *resume;           /* re-enables accepting after an accept error */
    uint32_t pause_ms;              /* current pause; 0 = accepting normally */
    uint64_t accept_failed;         /* this episode */
    uint64_t accept_failed_ns;      /* the last failure (CLOCK_MONOTONIC) */
    conn_list_t idle;               /* evictable: IDLE, HEAD, BODY */
    conn_list_t busy;               /* SERVE, SEND, CLOSING */
    size_t nconns;
    uint64_t refused, evicted;      /* at the cap, this episode */
    uint64_t next_id;
    td_buf_t refusal;               /* the whole 503 sent to a connection over the cap */
    char date[40];                  /* Date header value, refreshed each second */
    time_t date_at;
    uint16_t port;
    td_log_limit_t lim_peer;        /* per-connection and per-request lines */
    td_log_limit_t lim_cap;         /* refusals and evictions at the cap */
    td_log_limit_t lim_accept;      /* accepting again within an episode of failures */
};

static const char *const conn_state_names[] = {
    [CONN_IDLE] = "idle",   [CONN_HEAD] = "head",   [CONN_BODY] = "body",
    [CONN_SERVE] = "serve", [CONN_SEND] = "send",   [CONN_CLOSING] = "closing",
};

static const uint32_t conn_allowed[] = {
    [CONN_IDLE] = TD_FSM_BIT(CONN_HEAD) | TD_FSM_BIT(CONN_CLOSING),
    [CONN_HEAD] = TD_FSM_BIT(CONN_BODY) | TD_FSM_BIT(CONN_SERVE) | TD_FSM_BIT(CONN_CLOSING),
    [CONN_BODY] = TD_FSM_BIT(CONN_SERVE) | TD_FSM_BIT(CONN_CLOSING),
    [CONN_SERVE] = TD_FSM_BIT(CONN_SEND),
    [CONN_SEND] = TD_FSM_BIT(CONN_IDLE) | TD_FSM_BIT(CONN_CLOSING),
    [CONN_CLOSING] = 0,
};

static const td_fsm_t conn_fsm = {
    .what = "http connection",
    .names = conn_state_names,
    .allowed = conn_allowed,
    .nstates = CONN_NSTATES,
};

static void conn_read(td_http_conn_t *c);
static void conn_free(td_http_conn_t *c);

/* ======================================================================= */
/* Small helpers                                                             */
/* ======================================================================= */

static const char *
reason_phrase(int code)
{
    switch (code) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 529: return "Overloaded";
    case 505: return "HTTP Version Not Supported";
    default:  return "Error";
    }
}

static struct timeval
http_tv_ms(uint64_t ms)
{
    struct timeval tv = { .tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
    return tv;
}

static const char *
http_date(td_http_listener_t *l)
{
    time_t now = time(NULL);

    if (now != l->date_at) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(l->date, sizeof l->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        l->date_at = now;
    }
    return l->date;
}

/* Every error answer counts once: by reason (from its status) and as a
 * request rejected before it was scheduled. */
static void
http_count_refusal(td_metrics_t *m, int status)
{
    td_errreason_t why;

    switch (status) {
    case 401: why = TD_ERRREASON_UNAUTHORIZED; break;
    case 404: why = TD_ERRREASON_NOT_FOUND; break;
    case 413: why = TD_ERRREASON_TOO_LARGE; break;
    case 503: why = TD_ERRREASON_NO_CAPACITY; break;
    default:  why = status < 500 || status == 501 || status == 505 ? TD_ERRREASON_BAD_REQUEST
                                                                   : TD_ERRREASON_INTERNAL;
    }
    m->errors[why]++;
    m->requests[TD_OUTCOME_REJECTED]++;
}

/* The OpenAI error object for a refusal decided by the HTTP layer. */
static void
http_err(td_openai_err_t *e, int status, const char *message)
{
    td_openai_err_set(e, status, status >= 500 ? "server_error" : "invalid_request_error",
                      NULL, status == 413 ? "request_too_large" : NULL, "%s", message);
}

/* ======================================================================= */
/* Connection lists and the budget                                           */
/* ======================================================================= */

static conn_list_t *
conn_list(td_http_conn_t *c)
{
    return c->evictable ? &c->l->idle : &c->l->busy;
}

static void
conn_unlink(td_http_conn_t *c)
{
    conn_list_t *ls = conn_list(c);

    if (c->prev)
        c->prev->next = c->next;
    else
        ls->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        ls->tail = c->prev;
    c->prev = c->next = NULL;
}

/* To the end (most recently active) of the list its state belongs in. */
static void
conn_link(td_http_conn_t *c, bool evictable)
{
    conn_list_t *ls;

    c->evictable = evictable;
    ls = conn_list(c);
    c->prev = ls->tail;
    if (ls->tail)
        ls->tail->next = c;
    else
        ls->head = c;
    ls->tail = c;
}

/* Count what c holds now against the budget: its pending input while it
 * reads a request, the head and the body (all of a Content-Length at once).
 * False (nothing changed) when growing would pass the budget's max. */
static bool
conn_hold(td_http_conn_t *c)
{
    td_http_budget_t *b = c->l->site.budget;
    td_http_req_t *q = c->req;
    uint64_t want = 0;

    if (c->state <= CONN_BODY)
        want += evbuffer_get_length(bufferevent_get_input(c->bev));
    if (q)
        want += q->head_len + (c->state == CONN_BODY && q->h.body == TD_H1_BODY_LENGTH
                                   ? q->h.content_length
                                   : q->body.len);
    if (want > c->held && b->used + (want - c->held) > b->max)
        return false;
    b->used = b->used + want - c->held;
    c->held = want;
    return true;
}

static void
conn_release(td_http_conn_t *c)
{
    c->l->site.budget->used -= c->held;
    c->held = 0;
}

/* ======================================================================= */
/* Requests                                                                  */
/* ======================================================================= */

static void
req_free(td_http_req_t *q)
{
    if (!q)
        return;
    free(q->head);
    td_buf_free(&q->body);
    td_buf_free(&q->out);
    free(q);
}

/* A parsed head p[0..len) as c's request (the head is copied). */
static td_status_t
req_new(td_http_conn_t *c, const char *p, size_t len, td_h1_err_t *e)
{
    td_http_req_t *q = calloc(1, sizeof *q);
    const char *t, *path;
    size_t plen;

    if (!q)
        return TD_ERR_NOMEM;
    q->conn = c;
    q->head_len = len;
    q->head = malloc(2 * len + 2);   /* the head, then the path (shorter than it) */
    if (!q->head) {
        free(q);
        return TD_ERR_NOMEM;
    }
    memcpy(q->head, p, len);
    q->head[len] = '\0';
    if (td_h1_head_parse(q->head, len, c->l->site.max_body, &q->h, e) != TD_OK) {
        req_free(q);
        return TD_ERR_INVALID;
    }
    /* the bytes after each token are a blank, a colon, CR or LF: end them */
    q->head[q->h.method_tok - q->head + q->h.method_len] = '\0';
    q->head[q->h.target - q->head + q->h.target_len] = '\0';
    for (size_t i = 0; i < q->h.nfields; i++) {
        td_h1_field_t *f = &q->h.fields[i];
        q->head[f->name - q->head + f->name_len] = '\0';
        q->head[f->value - q->head + f->value_len] = '\0';
    }
    /* the path: the target without its query, and without scheme and
     * authority in the absolute form */
    t = q->h.target;
    path = t;
    if (t[0] != '/' && t[0] != '*') {
        const char *s = strstr(t, "://") + 3;
        path = strchr(s, '/');
        if (!path)
            path = "/";
    }
    plen = strcspn(path, "?");
    memcpy(q->head + len + 1, path, plen);
    q->head[len + 1 + plen] = '\0';
    q->path = q->head + len + 1;
    c->req = q;
    return TD_OK;
}

const char *
td_http_path(const td_http_req_t *req)
{
    return req->path;
}

int
td_http_method(const td_http_req_t *req)
{
    return (int)req->h.method;
}

const char *
td_http_header(const td_http_req_t *req, const char *name)
{
    const td_h1_field_t *f = td_h1_field(&req->h, name);

    return f ? f->value : NULL;
}

const char *
td_http_body(td_http_req_t *req, size_t *len)
{
    *len = req->body.len;
    return req->body.data ? req->body.data : "";
}

char *
td_http_body_take(td_http_req_t *req, size_t *len)
{
    return td_buf_take(&req->body, len);
}

td_status_t
td_http_body_field(td_http_req_t *req, const char *field, char *buf, size_t len,
                   td_openai_err_t *e)
{
    size_t blen;
    const char *body = td_http_body(req, &blen);
    json_error_t jerr;
    json_t *j = json_loadb(body, blen, 0, &jerr), *v;
    const char *s;

    if (!j) {
        td_openai_err_set(e, 400, "invalid_request_error", NULL, NULL,
                          "We could not parse the JSON body of your request: %s", jerr.text);
        return TD_ERR_INVALID;
    }
    v = json_object_get(j, field);
    s = json_is_string(v) ? json_string_value(v) : NULL;
    if (!s || !*s || strlen(s) >= len) {
        td_openai_err_set(e, 400, "invalid_request_error", field, "invalid_value",
                          "'%s' must be a non-empty string of at most %zu bytes.", field,
                          len - 1);
        json_decref(j);
        return TD_ERR_INVALID;
    }
    memcpy(buf, s, strlen(s) + 1);
    json_decref(j);
    return TD_OK;
}

void
td_http_on_gone(td_http_req_t *req, void (*fn)(td_http_req_t *req, void *arg), void *arg)
{
    req->gone = fn;
    req->gone_arg = arg;
}

/* ======================================================================= */
/* Connection states                                                         */
/* ======================================================================= */

static void
conn_timer(td_http_conn_t *c, uint64_t ms)
{
    struct timeval tv = http_tv_ms(ms);

    evtimer_add(c->timer, &tv);
}

static void
conn_set_state(td_http_conn_t *c, conn_state_t to, const char *why)
{
    bool evictable = to <= CONN_BODY;

    if (!td_fsm_allowed(&conn_fsm, c->state, to))
        td_fsm_step(&conn_fsm, c->id, c->state, to, why);   /* logs and aborts */
    td_trace("%s conn %" PRIu64 " (%s): %s -> %s: %s", c->l->name, c->id, c->peer,
             conn_state_names[c->state], conn_state_names[to], why);
    /* idle and reading connections are ordered by when they last began
     * something, so the one evicted at the cap is the least recently active */
    if (to == CONN_IDLE || to == CONN_HEAD || evictable != c->evictable) {
        conn_unlink(c);
        conn_link(c, evictable);
    }
    c->state = to;
    switch (to) {
    case CONN_IDLE:
        conn_timer(c, c->answered_one ? c->l->site.idle_timeout_ms : c->l->site.read_timeout_ms);
        break;
    case CONN_HEAD:
        conn_timer(c, c->l->site.read_timeout_ms);   /* for the head and the body */
        break;
    case CONN_BODY:
        break;                                       /* the head's deadline goes on */
    case CONN_CLOSING:
        conn_timer(c, HTTP_LINGER_MS);               /* to write what is queued, then linger */
        break;
    default:
        evtimer_del(c->timer);                       /* a request being served has none */
        c->probed = false;
        break;
    }
}

/* The connection ends now: the route of a request being served hears that
 * the client is gone. */
static void
conn_lost(td_http_conn_t *c, const char *why)
{
    td_http_req_t *q = c->req;

    td_log_limited(&c->l->lim_peer, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                   "%s conn %" PRIu64 " (%s): closed in state %s: %s", c->l->name, c->id,
                   c->peer, conn_state_names[c->state], why);
    if (q && c->state == CONN_SERVE && q->gone) {
        q->conn = NULL;
        q->gone(q, q->gone_arg);
    }
    conn_free(c);
}

/* Shut our side for writing once everything queued is written; the client
 * then sees the end of the answers and closes, or the linger ends it. */
static void
conn_shut_if_drained(td_http_conn_t *c)
{
    if (c->shut || evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
        return;
    shutdown(c->fd, SHUT_WR);
    c->shut = true;
    if (c->peer_eof) {
        conn_free(c);
        return;
    }
    conn_timer(c, HTTP_LINGER_MS);
}

static void
conn_close_after_writes(td_http_conn_t *c, const char *why)
{
    conn_set_state(c, CONN_CLOSING, why);
    conn_shut_if_drained(c);
}

/* The request on c is answered (everything queued): free it and wait until
 * the answer is written. */
static void
conn_answered(td_http_conn_t *c)
{
    td_http_req_t *q = c->req;

    if (q->h.close)
        c->close_after = true;
    c->req = NULL;
    req_free(q);
    conn_release(c);
    conn_set_state(c, CONN_SEND, "answered");
    c->answered_one = true;
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        bufferevent_trigger(c->bev, EV_WRITE, BEV_TRIG_DEFER_CALLBACKS);
}

/* Whether route path rp serves path: equal, or rp ends in '*' and is a
 * prefix of path (with something after it). */
static bool
path_match(const char *rp, const char *path)
{
    size_t n = strlen(rp);

    if (n > 0 && rp[n - 1] == '*')
        return strncmp(rp, path, n - 1) == 0 && path[n - 1] != '\0';
    return strcmp(rp, path) == 0;
}

/* The error format of the route serving path (NULL: not known yet). */
static td_http_errfmt_t
path_errfmt(const td_http_site_t *site, const char *path)
{
    for (const td_http_route_t *rt = site->routes; path && rt->path; rt++)
        if (rt->admin == site->admin && path_match(rt->path, path))
            return rt->errfmt;
    return TD_HTTP_ERR_OPENAI;
}

/* e's body in the format of path's route, and the status it is sent with. */
static td_status_t
err_body(const td_http_site_t *site, const char *path, const td_openai_err_t *e,
         td_buf_t *body, int *status)
{
    if (path_errfmt(site, path) == TD_HTTP_ERR_ANTHROPIC) {
        *status = td_anthropic_err_http(e);
        return td_anthropic_err_json(e, body);
    }
    *status = e->http;
    return td_openai_err_json(e, body);
}

/* Answer a request the HTTP layer refuses (malformed, too large, too slow,
 * over the budget) and close the connection: what follows the head cannot be
 * trusted to be a request. */
static void
conn_refuse(td_http_conn_t *c, int status, const char *message)
{
    td_http_listener_t *l = c->l;
    struct evbuffer *o = bufferevent_get_output(c->bev);
    td_openai_err_t e;
    td_buf_t body = {0};

    http_err(&e, status, message);
    if (status == 503)
        e.retry_after = l->site.retry_after_s;
    http_count_refusal(l->site.metrics, status);
    td_log_limited(&l->lim_peer, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                   "%s conn %" PRIu64 " (%s): refused: %d: %s", l->name, c->id, c->peer, status,
                   message);
    if (err_body(&l->site, c->req ? c->req->path : NULL, &e, &body, &status) == TD_OK) {
        evbuffer_add_printf(o, "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n", status,
                            reason_phrase(status), http_date(l), body.len);
        if (status == 503 || status == 529)
            evbuffer_add_printf(o, "Retry-After: %u\r\n", e.retry_after);
        if (status == 405)
            evbuffer_add_printf(o, "Allow: GET, POST\r\n");
        evbuffer_add(o, "\r\n", 2);
        evbuffer_add(o, body.data, body.len);
    }
    td_buf_free(&body);
    req_free(c->req);
    c->req = NULL;
    conn_release(c);
    conn_close_after_writes(c, "refused");
}

/* ======================================================================= */
/* Dispatch                                                                  */
/* ======================================================================= */

static void
conn_dispatch(td_http_conn_t *c)
{
    const td_http_site_t *site = &c->l->site;
    td_http_req_t *q = c->req;
    td_openai_err_t e;

    conn_set_state(c, CONN_SERVE, "request read");
    for (const td_http_route_t *rt = site->routes; rt->path; rt++) {
        if (rt->admin != site->admin || !path_match(rt->path, q->path) ||
            !(rt->methods & (int)q->h.method))
            continue;
        if (rt->auth && site->keys) {
            const char *xkey = rt->errfmt == TD_HTTP_ERR_ANTHROPIC
                                   ? td_http_header(q, "x-api-key") : NULL;
            td_status_t st = xkey ? (td_apikeys_match(site->keys, xkey, strlen(xkey))
                                         ? TD_OK : TD_ERR_AUTH)
                                  : td_apikeys_check_header(site->keys,
                                                            td_http_header(q, "Authorization"));
            if (st != TD_OK) {
                td_openai_err_auth(&e, st == TD_ERR_AUTH);
                td_http_refuse(site->metrics, q, &e);
                return;
            }
        }
        rt->fn(q, site->arg);
        return;
    }
    td_openai_err_no_route(&e, td_h1_method_str(q->h.method), q->path);
    td_http_refuse(site->metrics, q, &e);
}

/* ======================================================================= */
/* Reading requests                                                          */
/* ======================================================================= */

/* The head ends at `end` of the input: parse it, then read the body or
 * serve the request. */
static void
conn_head(td_http_conn_t *c, const char *p, size_t end)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    td_h1_err_t e;
    td_http_req_t *q;
    td_status_t st = req_new(c, p, end, &e);

    if (st == TD_ERR_NOMEM) {
        conn_refuse(c, 500, "The server is out of memory.");
        return;
    }
    if (st != TD_OK) {
        conn_refuse(c, e.status, e.message);
        return;
    }
    q = c->req;
    evbuffer_drain(in, end);
    if (q->h.close)
        c->close_after = true;
    switch (q->h.body) {
    case TD_H1_BODY_NONE:
        if (!conn_hold(c)) {
            conn_refuse(c, 503, "The server holds too many request bytes; retry later.");
            return;
        }
        conn_dispatch(c);
        return;
    case TD_H1_BODY_LENGTH:
        c->body_left = q->h.content_length;   /* memory grows as the bytes come */
        break;
    case TD_H1_BODY_CHUNKED:
        td_h1_chunked_init(&c->chunked, c->l->site.max_body, TD_HTTP_MAX_HEAD);
        break;
    }
    conn_set_state(c, CONN_BODY, "head read");
    if (!conn_hold(c)) {
        conn_refuse(c, 503, "The server holds too many request bytes; retry later.");
        return;
    }
    if (q->h.expect_continue && evbuffer_get_length(in) == 0)
        evbuffer_add_printf(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n");
}

/* Move body bytes from the input into the request; true when it is whole
 * (false also when refused: the state says which). */
static bool
conn_body(td_http_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    td_http_req_t *q = c->req;

    if (q->h.body == TD_H1_BODY_LENGTH) {
        size_t n = evbuffer_get_length(in);
        if (n > c->body_left)
            n = (size_t)c->body_left;
        if (n) {
            if (td_buf_reserve(&q->body, n) != TD_OK) {
                conn_refuse(c, 500, "The server is out of memory.");
                return false;
            }
            evbuffer_remove(in, q->body.data + q->body.len, n);
            q->body.len += n;
            q->body.data[q->body.len] = '\0';
            c->body_left -= n;
        }
        return c->body_left == 0;
    }
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        size_t used, data;
        td_h1_err_t e;
        td_status_t st;

        evbuffer_peek(in, -1, NULL, &v, 1);
        st = td_h1_chunked_step(&c->chunked, v.iov_base, v.iov_len, &used, &data, &e);
        if (st == TD_ERR_INVALID) {
            conn_refuse(c, e.status, e.message);
            return false;
        }
        if (data && td_buf_append(&q->body, v.iov_base, data) != TD_OK) {
            conn_refuse(c, 500, "The server is out of memory.");
            return false;
        }
        evbuffer_drain(in, used);
        if (st == TD_OK)
            return true;
    }
    return false;
}

/* Search the input for the end of the head, going on where the last search
 * stopped, without making it contiguous (a head sent a byte at a time is
 * searched once). True and *end = the head's length when found. */
static bool
conn_head_end(td_http_conn_t *c, struct evbuffer *in, size_t *end)
{
    struct evbuffer_ptr at;
    struct evbuffer_iovec v[8];
    int n;

    if (evbuffer_ptr_set(in, &at, c->scan.len, EVBUFFER_PTR_SET) != 0)
        return false;
    while ((n = evbuffer_peek(in, -1, &at, v, 8)) > 0) {
        size_t seen = 0;
        for (int i = 0; i < n && i < 8; i++) {
            if (td_h1_head_scan(&c->scan, v[i].iov_base, v[i].iov_len)) {
                *end = c->scan.len;
                return true;
            }
            seen += v[i].iov_len;
        }
        if (n <= 8 || evbuffer_ptr_set(in, &at, seen, EVBUFFER_PTR_ADD) != 0)
            break;
    }
    return false;
}

/* Parse what has arrived, as far as the state allows. */
static void
conn_read(td_http_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);

    for (;;) {
        size_t n = evbuffer_get_length(in), end;
        const char *p;

        switch (c->state) {
        case CONN_IDLE: {
            struct evbuffer_iovec v;
            size_t k;
            /* empty lines before a request line are ignored (RFC 9112 2.2) */
            while (evbuffer_peek(in, -1, NULL, &v, 1) > 0 &&
                   (k = td_h1_skip_empty(v.iov_base, v.iov_len)) > 0)
                evbuffer_drain(in, k);
            if (evbuffer_get_length(in) == 0)
                return;
            c->scan = (td_h1_scan_t){0};
            conn_set_state(c, CONN_HEAD, "request begun");
            break;
        }
        case CONN_HEAD:
            if (conn_head_end(c, in, &end) && end <= TD_HTTP_MAX_HEAD) {
                p = (const char *)evbuffer_pullup(in, (ev_ssize_t)end);
                conn_head(c, p, end);
                break;
            }
            if (n > TD_HTTP_MAX_HEAD) {
                struct evbuffer_ptr lf = evbuffer_search_range(in, "\n", 1, NULL, NULL);
                if (lf.pos >= 0 && (size_t)lf.pos < TD_H1_MAX_LINE)
                    conn_refuse(c, 431, "The request head is too large.");
                else
                    conn_refuse(c, 414, "The request line is too long.");
                return;
            }
            if (!conn_hold(c))
                conn_refuse(c, 503, "The server holds too many request bytes; retry later.");
            return;
        case CONN_BODY:
            if (conn_body(c)) {
                if (!conn_hold(c)) {
                    conn_refuse(c, 503, "The server holds too many request bytes; retry later.");
                    return;
                }
                conn_dispatch(c);
                break;
            }
            if (c->state == CONN_BODY && !conn_hold(c))
                conn_refuse(c, 503, "The server holds too many request bytes; retry later.");
            return;
        case CONN_CLOSING:
            evbuffer_drain(in, n);   /* lingering: what the client still sends is dropped */
            return;
        default:   /* SERVE, SEND: a pipelined request waits for the answer */
            return;
        }
    }
}

/* ======================================================================= */
/* Connection events                                                         */
/* ======================================================================= */

static void
conn_on_read(struct bufferevent *bev, void *arg)
{
    conn_read(arg);
}

static void
conn_on_write(struct bufferevent *bev, void *arg)
{
    td_http_conn_t *c = arg;

    if (c->state == CONN_CLOSING) {
        conn_shut_if_drained(c);
        return;
    }
    if (c->req != NULL && c->req->drain != NULL) {   /* td_http_on_drain: once */
        void (*fn)(td_http_req_t *, void *) = c->req->drain;
        c->req->drain = NULL;
        fn(c->req, c->req->drain_arg);
        return;   /* fn may have answered, and the connection moved on */
    }
    if (c->state != CONN_SEND || evbuffer_get_length(bufferevent_get_output(bev)) > 0)
        return;
    if (c->close_after || c->peer_eof) {
        conn_close_after_writes(c, c->peer_eof ? "answered a half-closed client"
                                               : "answered, not kept alive");
        return;
    }
    bufferevent_setwatermark(bev, EV_WRITE, 0, 0);   /* a stream's, td_http_on_drain */
    conn_set_state(c, CONN_IDLE, "answer written");
    conn_read(c);   /* a pipelined request */
}

/* Whether the kernel has seen the client reset the connection. */
static bool
conn_reset(td_http_conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof err;
    struct tcp_info ti;
    socklen_t tlen = sizeof ti;

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0)
        return true;
    return getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tlen) == 0 &&
           ti.tcpi_state == TCP_CLOSE;
}

/* A client half-closed while its request is served: it may still wait for
 * the answer (shutdown(SHUT_WR), nc -N), or be gone, which TCP shows only
 * when something is sent to it. So send something it ignores — an interim
 * 100 (Continue) before the answer starts (HTTP/1.1), an SSE comment in an
 * event stream — and look for the reset a gone client answers with. Called
 * at the half-close and then by the timer, until the answer is queued. False
 * when the connection has ended. */
static bool
conn_probe(td_http_conn_t *c)
{
    td_http_req_t *q = c->req;
    struct evbuffer *o = bufferevent_get_output(c->bev);

    if (conn_reset(c)) {
        conn_lost(c, "reset after a half-close");
        return false;
    }
    /* a write in progress finds a reset itself */
    if (!c->probed && evbuffer_get_length(o) == 0) {
        if (!q->started && q->h.minor >= 1) {
            evbuffer_add_printf(o, "HTTP/1.1 100 Continue\r\n\r\n");
            c->probed = true;
        } else if (q->started && q->streaming && q->sse) {
            evbuffer_add_printf(o, q->chunked ? "e\r\n: keep-alive\n\n\r\n" : ": keep-alive\n\n");
            c->probed = true;
        }
        if (c->probed) {
            conn_timer(c, HTTP_PROBE_FIRST_MS);
            return true;
        }
    }
    conn_timer(c, HTTP_PROBE_MS);
    return true;
}

static void
conn_on_event(struct bufferevent *bev, short what, void *arg)
{
    td_http_conn_t *c = arg;

    if (what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
        conn_lost(c, what & BEV_EVENT_TIMEOUT ? "the answer's writes made no progress"
                                              : evutil_socket_error_to_string(
                                                    EVUTIL_SOCKET_ERROR()));
        return;
    }
    if (!(what & BEV_EVENT_EOF))
        return;
    /* the client closed its side */
    switch (c->state) {
    case CONN_SERVE:
        /* it may only have half-closed (shutdown(SHUT_WR), nc -N) and still
         * wait for the answer: go on, and close after it */
        c->peer_eof = true;
        c->close_after = true;
        td_log_limited(&c->l->lim_peer, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                       "%s conn %" PRIu64 " (%s): half-closed while served: probing",
                       c->l->name, c->id, c->peer);
        conn_probe(c);
        return;
    case CONN_SEND:
        c->peer_eof = true;
        c->close_after = true;
        return;
    case CONN_CLOSING:
        if (!c->shut) {
            c->peer_eof = true;   /* closed once our answer is written */
            return;
        }
        conn_free(c);
        return;
    default:
        conn_lost(c, c->state == CONN_IDLE ? "closed by the client"
                                           : "closed by the client inside a request");
        return;
    }
}

static void
conn_on_timer(evutil_socket_t fd, short what, void *arg)
{
    td_http_conn_t *c = arg;

    switch (c->state) {
    case CONN_IDLE:
        conn_lost(c, c->answered_one ? "idle timeout" : "no request within the read timeout");
        return;
    case CONN_HEAD:
    case CONN_BODY:
        conn_refuse(c, 408, "The request was not received within the read timeout.");
        return;
    case CONN_SERVE:
        if (c->peer_eof)
            conn_probe(c);
        return;
    case CONN_CLOSING:
        conn_free(c);
        return;
    default:
        return;
    }
}

/* ======================================================================= */
/* Answers                                                                   */
/* ======================================================================= */

/* The status line and headers of q's answer; len is the body's length, or
 * -1 for a stream. */
static void
resp_head(td_http_req_t *q, int code, const char *ctype, ssize_t len)
{
    td_http_conn_t *c = q->conn;
    struct evbuffer *o = bufferevent_get_output(c->bev);
    bool close = c->close_after || c->peer_eof;

    evbuffer_add_printf(o, "HTTP/1.1 %d %s\r\nDate: %s\r\n", code, reason_phrase(code),
                        http_date(c->l));
    if (ctype)
        evbuffer_add_printf(o, "Content-Type: %s\r\n", ctype);
    if (q->out.len)
        evbuffer_add(o, q->out.data, q->out.len);
    if (len >= 0) {
        evbuffer_add_printf(o, "Content-Length: %zd\r\n", len);
    } else if (q->h.minor >= 1) {
        q->chunked = true;
        evbuffer_add_printf(o, "Transfer-Encoding: chunked\r\n");
    } else {
        close = c->close_after = true;   /* HTTP/1.0: the stream ends with the connection */
    }
    if (close)
        evbuffer_add_printf(o, "Connection: close\r\n");
    evbuffer_add(o, "\r\n", 2);
    q->started = true;
}

void
td_http_add_header(td_http_req_t *req, const char *name, const char *value)
{
    if (req->started)
        return;
    if (strcasecmp(name, "Connection") == 0 && strcasecmp(value, "close") == 0) {
        if (req->conn)
            req->conn->close_after = true;   /* resp_head says so */
        return;
    }
    td_buf_printf(&req->out, "%s: %s\r\n", name, value);
    if (strcasecmp(name, "Content-Type") == 0)
        req->sse = strncasecmp(value, "text/event-stream", 17) == 0;
}

void
td_http_reply(td_http_req_t *req, int code, const char *ctype, const char *body, size_t len)
{
    td_http_conn_t *c = req->conn;

    if (!c || req->started) {   /* not served by us (a bug): drop it */
        td_error("http: a request answered twice, or after its client went");
        return;
    }
    resp_head(req, code, ctype, (ssize_t)len);
    if (len && req->h.method != TD_H1_HEAD)
        evbuffer_add(bufferevent_get_output(c->bev), body, len);
    conn_answered(c);
}

void
td_http_reply_err(td_http_req_t *req, const td_openai_err_t *e)
{
    td_buf_t body = {0};

    if (e->retry_after) {
        char s[24];
        snprintf(s, sizeof s, "%u", e->retry_after);
        td_http_add_header(req, "Retry-After", s);
    }
    int status = e->http;

    if ((req->conn ? err_body(&req->conn->l->site, req->path, e, &body, &status)
                   : td_openai_err_json(e, &body)) == TD_OK)
        td_http_reply(req, status, "application/json", body.data, body.len);
    else
        td_http_reply(req, 500, "text/plain", "out of memory\n", 14);
    td_buf_free(&body);
}

void
td_http_refuse(td_metrics_t *m, td_http_req_t *req, const td_openai_err_t *e)
{
    http_count_refusal(m, e->http);
    /* the client's mistakes are the client's to see; ours are logged */
    td_log_every(e->http >= 500 ? TD_LOG_WARN : TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                 "http %s %s: %d: %s", td_h1_method_str(req->h.method), req->h.target,
                 e->http, e->message);
    td_http_reply_err(req, e);
}

void
td_http_reply_json(td_http_req_t *req, int code, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

    if (s) {
        td_http_reply(req, code, "application/json", s, strlen(s));
        free(s);
    } else {
        td_openai_err_t e;
        td_openai_err_internal(&e, "out of memory");
        td_http_reply_err(req, &e);
    }
    json_decref(j);
}

void
td_http_stream_start(td_http_req_t *req, int code)
{
    int sndbuf;

    if (!req->conn || req->started)
        return;
    req->streaming = true;
    if (req->conn->l->site.stream_max)   /* conn_on_write at a quarter: td_http_on_drain */
        bufferevent_setwatermark(req->conn->bev, EV_WRITE, req->conn->l->site.stream_max / 4, 0);
    sndbuf = req->conn->l->site.stream_sndbuf;
    if (sndbuf > 0 &&
        setsockopt(req->conn->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) != 0)
        td_debug("http conn %" PRIu64 ": SO_SNDBUF %d: %s", req->conn->id, sndbuf,
                 strerror(errno));
    resp_head(req, code, NULL, -1);
}

void
td_http_stream_send(td_http_req_t *req, const void *data, size_t len)
{
    struct evbuffer *o;

    if (!req->conn || !req->streaming || len == 0)
        return;
    o = bufferevent_get_output(req->conn->bev);
    if (req->chunked)
        evbuffer_add_printf(o, "%zx\r\n", len);
    evbuffer_add(o, data, len);
    if (req->chunked)
        evbuffer_add(o, "\r\n", 2);
}

void
td_http_on_drain(td_http_req_t *req, void (*fn)(td_http_req_t *req, void *arg), void *arg)
{
    req->drain = fn;
    req->drain_arg = arg;
}

size_t
td_http_stream_pending(const td_http_req_t *req)
{
    return req->conn ? evbuffer_get_length(bufferevent_get_output(req->conn->bev)) : 0;
}

bool
td_http_stream_over(const td_http_req_t *req)
{
    const td_http_site_t *s;

    if (!req->conn)
        return false;
    s = &req->conn->l->site;
    return (s->stream_max && td_http_stream_pending(req) > s->stream_max) ||
           (s->out_budget && s->out_budget->used > s->out_budget->max);
}

void
td_http_abort(td_http_req_t *req, const char *why)
{
    td_http_conn_t *c = req->conn;

    if (c == NULL)
        return;
    req->gone = NULL;
    conn_lost(c, why);
}

bool
td_http_out_full(const td_http_req_t *req)
{
    const td_http_site_t *s = req->conn ? &req->conn->l->site : NULL;

    return s != NULL && s->out_budget != NULL && s->out_budget->used > s->out_budget->max;
}

bool
td_http_stream_drained(const td_http_req_t *req)
{
    const td_http_site_t *s;

    if (!req->conn)
        return true;
    s = &req->conn->l->site;
    return (!s->stream_max || td_http_stream_pending(req) <= s->stream_max / 4) &&
           (!s->out_budget || s->out_budget->used <= s->out_budget->max);
}

void
td_http_stream_end(td_http_req_t *req)
{
    td_http_conn_t *c = req->conn;

    if (!c || !req->streaming)
        return;
    if (req->chunked)
        evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
    conn_answered(c);
}

/* ======================================================================= */
/* Connections                                                               */
/* ======================================================================= */

static void
conn_free(td_http_conn_t *c)
{
    td_http_listener_t *l = c->l;

    conn_unlink(c);
    l->nconns--;
    conn_release(c);
    if (l->site.out_budget != NULL)
        l->site.out_budget->used -= c->out_len;
    event_free(c->timer);
    bufferevent_free(c->bev);   /* closes the socket */
    req_free(c->req);
    free(c);
}

/* The output buffer grew or shrank: the answer bytes every connection
 * holds, counted in the site's out_budget. */
static void
conn_on_out(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    td_http_conn_t *c = arg;
    td_http_budget_t *b = c->l->site.out_budget;

    (void)buf;
    c->out_len = c->out_len + info->n_added - info->n_deleted;
    b->used = b->used + info->n_added - info->n_deleted;
}

static td_status_t
conn_new(td_http_listener_t *l, evutil_socket_t fd, const char *peer)
{
    td_http_conn_t *c = calloc(1, sizeof *c);
    struct timeval wtv;

    if (!c)
        return TD_ERR_NOMEM;
    c->l = l;
    c->fd = fd;
    c->id = ++l->next_id;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->bev = bufferevent_socket_new(l->site.base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(l->site.base, conn_on_timer, c);
    if (!c->bev || !c->timer) {
        if (c->bev)
            bufferevent_free(c->bev);   /* closes fd */
        else
            evutil_closesocket(fd);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return TD_ERR_NOMEM;
    }
    bufferevent_setcb(c->bev, conn_on_read, conn_on_write, conn_on_event, c);
    if (l->site.out_budget != NULL)
        evbuffer_add_cb(bufferevent_get_output(c->bev), conn_on_out, c);
    /* what is read ahead of a request being served stays small */
    bufferevent_setwatermark(c->bev, EV_READ, 0, TD_HTTP_MAX_HEAD + 1);
    if (l->site.write_timeout_ms) {
        wtv = http_tv_ms(l->site.write_timeout_ms);
        bufferevent_set_timeouts(c->bev, NULL, &wtv);
    }
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    l->nconns++;
    c->state = CONN_IDLE;
    conn_link(c, true);
    conn_timer(c, l->site.read_timeout_ms);
    return TD_OK;
}

/* ======================================================================= */
/* Listeners                                                                 */
/* ======================================================================= */

static void
listener_accept_cb(struct evconnlistener *evl, evutil_socket_t fd, struct sockaddr *sa,
                   int salen, void *arg)
{
    td_http_listener_t *l = arg;
    td_net_addr_t addr = { .len = (socklen_t)salen };
    char peer[64];

    if (l->pause_ms) {
        td_log_limited(&l->lim_accept, TD_LOG_INFO, HTTP_LOG_EPISODE_MS,
                       "%s listener :%u: accepting again (%" PRIu64 " failed accepts so far)",
                       l->name, (unsigned)l->port, l->accept_failed);
        l->pause_ms = 0;
    }
    memcpy(&addr.sa, sa, (size_t)salen < sizeof addr.sa ? (size_t)salen : sizeof addr.sa);
    td_net_addr_str(&addr, peer, sizeof peer);
    if (l->site.max_conns && l->nconns >= l->site.max_conns) {
        td_http_conn_t *victim = l->idle.head;
        if (!victim) {
            /* every connection has a request in hand: refuse this one, and
             * cheaply — a 503 in one send(), no buffering, closed at once */
            ssize_t w = send(fd, l->refusal.data, l->refusal.len, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
            evutil_closesocket(fd);
            http_count_refusal(l->site.metrics, 503);
            if (l->refused++ == 0)
                td_warn("%s listener :%u: %zu connections, all busy (the cap): refusing new "
                        "ones with 503", l->name, (unsigned)l->port, l->nconns);
            td_log_limited(&l->lim_cap, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                           "%s listener :%u: refused %s: at the cap", l->name,
                           (unsigned)l->port, peer);
            return;
        }
        if (l->evicted++ == 0)
            td_info("%s listener :%u: at its cap of %zu connections: closing the least "
                    "recently active idle one for each new one", l->name, (unsigned)l->port,
                    l->site.max_conns);
        td_log_limited(&l->lim_cap, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                       "%s listener :%u: closed conn %" PRIu64 " (%s, %s) for %s", l->name,
                       (unsigned)l->port, victim->id, victim->peer,
                       conn_state_names[victim->state], peer);
        conn_free(victim);
    } else if (l->refused || l->evicted) {
        td_info("%s listener :%u: below its cap again; %" PRIu64 " connections refused, %" PRIu64
                " idle ones closed meanwhile", l->name, (unsigned)l->port, l->refused,
                l->evicted);
        l->refused = l->evicted = 0;
    }
    if (conn_new(l, fd, peer) != TD_OK) {
        td_log_every(TD_LOG_WARN, HTTP_LOG_EPISODE_MS,
                     "%s listener :%u: out of memory for a connection from %s", l->name,
                     (unsigned)l->port, peer);
        return;
    }
    td_log_limited(&l->lim_peer, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                   "%s listener :%u: accepted conn %" PRIu64 " from %s", l->name,
                   (unsigned)l->port, l->next_id, peer);
}

/* accept() failed for a reason that retrying at once will not fix (EMFILE,
 * ENFILE, ENOBUFS, ...): stop accepting, close the least recently active
 * idle connection (if the descriptors are ours, the next accept gets one),
 * and try again after a pause that doubles while the failures go on. An
 * episode lasts until accepts have not failed for HTTP_LOG_EPISODE_MS; it is
 * logged once when it begins (and, limited, when accepting works again). */
static void
listener_error_cb(struct evconnlistener *evl, void *arg)
{
    td_http_listener_t *l = arg;
    int err = EVUTIL_SOCKET_ERROR();
    uint64_t now = td_clock_ns();
    struct timeval tv;

    if (l->accept_failed == 0 ||
        now - l->accept_failed_ns > (uint64_t)HTTP_LOG_EPISODE_MS * 1000000u) {
        l->accept_failed = 0;
        td_warn("%s listener :%u: accept failed: %s; pausing accepts (%u ms, up to %u ms "
                "while it keeps failing) and closing idle connections", l->name,
                (unsigned)l->port, evutil_socket_error_to_string(err), HTTP_ACCEPT_PAUSE_MIN_MS,
                HTTP_ACCEPT_PAUSE_MAX_MS);
    } else {
        td_log_limited(&l->lim_cap, TD_LOG_DEBUG, HTTP_LOG_PEER_MS,
                       "%s listener :%u: accept failed again: %s", l->name, (unsigned)l->port,
                       evutil_socket_error_to_string(err));
    }
    l->accept_failed++;
    l->accept_failed_ns = now;
    l->pause_ms = l->pause_ms == 0 ? HTTP_ACCEPT_PAUSE_MIN_MS
                : l->pause_ms * 2 > HTTP_ACCEPT_PAUSE_MAX_MS ? HTTP_ACCEPT_PAUSE_MAX_MS
                                                             : l->pause_ms * 2;
    if (l->idle.head)
        conn_free(l->idle.head);
    evconnlistener_disable(evl);
    tv = http_tv_ms(l->pause_ms);
    evtimer_add(l->resume, &tv);
}

static void
listener_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    td_http_listener_t *l = arg;

    if (l->evl)
        evconnlistener_enable(l->evl);
}

/* The 503 a connection over the cap gets, built once. */
static td_status_t
listener_refusal(td_http_listener_t *l)
{
    td_openai_err_t e;
    td_buf_t body = {0};

    td_openai_err_set(&e, 503, "server_error", NULL, NULL,
                      "The server has too many open connections; retry after %u s.",
                      l->site.retry_after_s);
    td_openai_err_json(&e, &body);
    td_buf_printf(&l->refusal, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                  "application/json\r\nContent-Length: %zu\r\nRetry-After: %u\r\nConnection: "
                  "close\r\n\r\n%s", body.len, l->site.retry_after_s, body.data ? body.data : "");
    td_buf_free(&body);
    return td_buf_status(&l->refusal);
}

td_status_t
td_http_listen_fd(const td_http_site_t *site, int fd, td_http_listener_t **out)
{
    td_http_listener_t *l = calloc(1, sizeof *l);
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;

    if (!l)
        goto err_close;
    l->site = *site;
    l->name = site->admin ? "admin" : "http";
    if (getsockname(fd, (struct sockaddr *)&sa, &salen) == 0 &&
        (sa.ss_family == AF_INET || sa.ss_family == AF_INET6))
        l->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                                : ((struct sockaddr_in6 *)&sa)->sin6_port);
    l->resume = evtimer_new(site->base, listener_resume_cb, l);
    if (!l->resume || listener_refusal(l) != TD_OK)
        goto err_free;
    l->evl = evconnlistener_new(site->base, listener_accept_cb, l,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
    if (!l->evl)
        goto err_free;
    evconnlistener_set_error_cb(l->evl, listener_error_cb);
    *out = l;
    return TD_OK;

err_free:
    if (l->resume)
        event_free(l->resume);
    td_buf_free(&l->refusal);
    free(l);
err_close:
    td_error("%s listener: cannot start the http server: out of memory",
             site->admin ? "admin" : "http");
    close(fd);
    return TD_ERR_NOMEM;
}

td_status_t
td_http_listen(const td_http_site_t *site, const char *hostport, td_http_listener_t **out,
               uint16_t *port_out)
{
    char host[TD_NET_HOST_MAX];
    uint16_t port;
    int fd;
    td_status_t st = td_net_addr_parse(hostport, host, sizeof host, &port);

    if (st == TD_OK)   /* each logs what failed (the address, the bind) */
        st = td_net_listen(host, port, 512, &fd, &port);
    if (st != TD_OK)
        return st;
    /* Accepted sockets inherit TCP_NODELAY: an SSE chunk must not wait for
     * the client's delayed ACK of the previous one (Nagle, 40 ms). */
    (void)td_net_set_nodelay(fd);
    st = td_http_listen_fd(site, fd, out);   /* logs a failure */
    if (st == TD_OK)
        *port_out = port;
    return st;
}

void
td_http_stop_accepting(td_http_listener_t *l)
{
    if (!l || !l->evl)
        return;
    evtimer_del(l->resume);
    evconnlistener_free(l->evl);   /* closes the socket */
    l->evl = NULL;
    td_info("%s listener :%u: closed; %zu connections still served", l->name,
            (unsigned)l->port, l->nconns);
}

void
td_http_listener_destroy(td_http_listener_t *l)
{
    if (!l)
        return;
    if (l->evl)
        evconnlistener_free(l->evl);
    event_free(l->resume);
    while (l->idle.head || l->busy.head) {
        td_http_conn_t *c = l->busy.head ? l->busy.head : l->idle.head;
        conn_lost(c, "the listener is closing");
    }
    td_buf_free(&l->refusal);
    free(l);
}

void
td_http_fit_fd_limit(size_t *api_conns, size_t *admin_conns, size_t reserve)
{
    struct rlimit rl;
    size_t nofile, avail, api = *api_conns, admin = *admin_conns;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return;
    nofile = (size_t)rl.rlim_cur;
    avail = nofile > 2 * reserve ? nofile - reserve : nofile / 2;
    if (admin && api && admin + api > avail) {
        if (admin > avail / 4)
            admin = avail / 4 ? avail / 4 : 1;
        api = avail - admin > 0 ? avail - admin : 1;
    } else if (api && !admin && api > avail) {
        api = avail;
    } else if (admin && !api && admin > avail) {
        admin = avail;
    }
    if (api != *api_conns || admin != *admin_conns)
        td_info("http: connection caps lowered to %zu (api) and %zu (admin) to fit the "
                "file-descriptor limit of %zu, %zu kept for the rest (raise LimitNOFILE / "
                "ulimit -n for more)", api, admin, nofile, reserve);
    *api_conns = api;
    *admin_conns = admin;
}
