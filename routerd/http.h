/* routerd/http.h — the HTTP side of routerd on libevent's evhttp: a listener
 * serving a route table given by its caller (routes.h) with the bearer-key
 * check, and the replies every route and request uses (plain, JSON, OpenAI
 * errors). It knows no route and no request. */
#ifndef TD_ROUTERD_HTTP_H
#define TD_ROUTERD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "apikeys.h"
#include "metrics.h"
#include "openai.h"
#include "status.h"

struct event_base;
struct evhttp;
struct evhttp_request;

/* One entry of a route table (ends with path NULL). */
typedef struct {
    const char *path;
    int methods;          /* EVHTTP_REQ_GET | ... */
    bool admin;           /* served on the admin listener, with the admin key */
    bool auth;            /* needs a key */
    void (*fn)(struct evhttp_request *req, void *arg);   /* arg: the site's */
} td_http_route_t;

/* One HTTP listener: the API or the admin API. Everything it points to
 * outlives the listener. */
typedef struct {
    struct event_base *base;
    const td_http_route_t *routes;  /* the entries whose admin flag is this site's */
    bool admin;
    const td_apikeys_t *keys;       /* for routes with auth; NULL: no key needed */
    td_metrics_t *metrics;          /* refusals are counted here */
    size_t max_body;                /* the API's body limit (bodies up to 4x reach the parser) */
    uint64_t request_timeout_ms;    /* idle connections live this + 10 min */
    void *arg;                      /* passed to every route */
} td_http_site_t;

/* Serve site on hostport ("host:port", port 0 = a free one); failures are
 * logged where they happen. */
td_status_t td_http_listen(td_http_site_t *site, const char *hostport, struct evhttp **out,
                           uint16_t *port_out);
/* Shutdown: close http's listening sockets (new connections are refused);
 * the connections open go on being served. */
void td_http_stop_accepting(struct evhttp *http);
/* Replies; each ends the request. */
void td_http_reply(struct evhttp_request *req, int code, const char *ctype,
                   const char *body, size_t len);
void td_http_reply_err(struct evhttp_request *req, const td_openai_err_t *e);
/* A request refused before it was scheduled: counted in m (errors by
 * reason, requests rejected) and answered with e. */
void td_http_refuse(td_metrics_t *m, struct evhttp_request *req, const td_openai_err_t *e);
/* json (stolen; NULL: out of memory, answered 500) as the body. */
void td_http_reply_json(struct evhttp_request *req, int code, json_t *json);
/* The body, NUL-terminated (pulled up in place; valid while req is). */
const char *td_http_body(struct evhttp_request *req, size_t *len);
/* Admin bodies: {"<field>": "<string>"} → the string (copied into buf). */
td_status_t td_http_body_field(struct evhttp_request *req, const char *field, char *buf,
                               size_t len, td_openai_err_t *e);

#endif
