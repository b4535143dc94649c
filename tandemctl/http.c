/* tandemctl/http.c — the admin API client: one HTTP request to routerd with
 * the admin bearer key, on a private libevent loop bounded by --timeout, and
 * the mapping of every way it can fail to one status and one message. */
#include "tandemctl.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Largest answer accepted from the router. */
#define TDCTL_HTTP_MAX_BODY (64u << 20)

typedef struct {
    struct event_base *base;
    bool done;              /* the request callback ran */
    int code;               /* HTTP status; 0 = no response */
    bool req_error;         /* the error callback ran */
    enum evhttp_request_error err;
    struct evbuffer *body;  /* the answer's body */
} http_result_t;

static void
http_on_error(enum evhttp_request_error err, void *arg)
{
    http_result_t *r = arg;
    r->req_error = true;
    r->err = err;
}

static void
http_on_done(struct evhttp_request *req, void *arg)
{
    http_result_t *r = arg;
    r->done = true;
    if (req != NULL) {
        r->code = evhttp_request_get_response_code(req);
        evbuffer_add_buffer(r->body, evhttp_request_get_input_buffer(req));
    }
    event_base_loopbreak(r->base);
}

/* The message of an error answer: {"error":{"message":M}}, {"error":M},
 * {"message":M}, or else the start of the body itself. */
static void
http_error_message(struct evbuffer *body, char *buf, size_t len)
{
    size_t n = evbuffer_get_length(body);
    const char *p = (const char *)evbuffer_pullup(body, -1);
    json_t *j = p != NULL ? json_loadb(p, n, 0, NULL) : NULL;
    const char *msg = NULL;

    if (json_is_object(j)) {
        json_t *e = json_object_get(j, "error");
        if (json_is_object(e))
            msg = json_string_value(json_object_get(e, "message"));
        else if (json_is_string(e))
            msg = json_string_value(e);
        if (msg == NULL)
            msg = json_string_value(json_object_get(j, "message"));
    }
    if (msg != NULL) {
        snprintf(buf, len, "%s", msg);
    } else {
        int w = n > 200 ? 200 : (int)n;
        snprintf(buf, len, "%.*s", w, p != NULL ? p : "");
        for (char *c = buf; *c != '\0'; c++)  /* keep it on one line */
            if (*c == '\n' || *c == '\r')
                *c = ' ';
    }
    json_decref(j);
}

static td_status_t
http_status_of_code(int code)
{
    switch (code) {
    case 401: case 403: return TD_ERR_AUTH;
    case 404: return TD_ERR_NOT_FOUND;
    case 409: return TD_ERR_STATE;
    default:  return TD_ERR_PEER;
    }
}

td_status_t
tdctl_http_call(tdctl_t *ctl, const char *method, const char *path, json_t *body,
                const char *what, json_t **out)
{
    const char *url = ctl->opts.router;
    td_status_t st = TD_ERR_NOMEM;
    http_result_t r = { .code = 0 };
    struct evhttp_uri *uri = NULL;
    struct evhttp_connection *conn = NULL;
    struct evhttp_request *req = NULL;
    char *payload = NULL;
    char auth[600];

    uri = evhttp_uri_parse(url);
    if (uri == NULL || evhttp_uri_get_host(uri) == NULL || evhttp_uri_get_scheme(uri) == NULL ||
        strcmp(evhttp_uri_get_scheme(uri), "http") != 0) {
        td_error("router url \"%s\": expected http://HOST:PORT", url);
        st = TD_ERR_INVALID;
        goto err_free_uri;
    }
    const char *host = evhttp_uri_get_host(uri);
    int port = evhttp_uri_get_port(uri) < 0 ? 80 : evhttp_uri_get_port(uri);

    if ((r.base = event_base_new()) == NULL || (r.body = evbuffer_new()) == NULL)
        goto err_free_base;
    conn = evhttp_connection_base_new(r.base, NULL, host, (unsigned short)port);
    if (conn == NULL)
        goto err_free_base;
    struct timeval tv = { .tv_sec = (time_t)(ctl->opts.timeout_ms / 1000),
                          .tv_usec = (suseconds_t)(ctl->opts.timeout_ms % 1000) * 1000 };
    evhttp_connection_set_timeout_tv(conn, &tv);
    evhttp_connection_set_retries(conn, 0);
    evhttp_connection_set_max_body_size(conn, TDCTL_HTTP_MAX_BODY);

    if ((req = evhttp_request_new(http_on_done, &r)) == NULL)
        goto err_free_conn;
    evhttp_request_set_error_cb(req, http_on_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    snprintf(auth, sizeof(auth), "Bearer %s", ctl->admin_key);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Authorization", auth);
    evhttp_add_header(h, "Accept", "application/json");
    evhttp_add_header(h, "Connection", "close");
    if (body != NULL) {
        if ((payload = json_dumps(body, JSON_COMPACT)) == NULL) {
            evhttp_request_free(req);
            goto err_free_conn;
        }
        evhttp_add_header(h, "Content-Type", "application/json");
        evbuffer_add(evhttp_request_get_output_buffer(req), payload, strlen(payload));
    }
    /* The connection owns req from here, whatever the outcome. */
    if (evhttp_make_request(conn, req, strcmp(method, "POST") == 0 ? EVHTTP_REQ_POST
                                                                 : EVHTTP_REQ_GET,
                            path) != 0) {
        td_error("%s: cannot send the request to %s", what, url);
        st = TD_ERR_IO;
        goto err_free_conn;
    }
    /* Belt and braces: the loop never outlives the timeout by much. */
    struct timeval cap = { .tv_sec = tv.tv_sec + 1, .tv_usec = tv.tv_usec };
    event_base_loopexit(r.base, &cap);
    event_base_dispatch(r.base);

    if (!r.done || r.code == 0) {
        bool timed_out = !r.done || (r.req_error && r.err == EVREQ_HTTP_TIMEOUT);
        if (timed_out)
            td_error("%s: router %s did not answer within %llu ms", what, url,
                     (unsigned long long)ctl->opts.timeout_ms);
        else
            td_error("%s: router %s is unreachable (connection failed or closed)", what, url);
        st = timed_out ? TD_ERR_TIMEOUT : TD_ERR_PEER;
        goto err_free_conn;
    }
    if (r.code < 200 || r.code > 299) {
        char msg[256];
        http_error_message(r.body, msg, sizeof(msg));
        st = http_status_of_code(r.code);
        if (st == TD_ERR_AUTH)
            td_error("%s: router refused the admin key (HTTP %d): %s; check --admin-key-file",
                     what, r.code, msg);
        else
            td_error("%s: %s (HTTP %d)", what, msg, r.code);
        goto err_free_conn;
    }
    json_error_t jerr;
    size_t n = evbuffer_get_length(r.body);
    const char *p = (const char *)evbuffer_pullup(r.body, -1);
    json_t *j = n > 0 ? json_loadb(p, n, 0, &jerr) : json_object();
    if (j == NULL) {
        td_error("%s: router answered with invalid json: %s", what,
                 n > 0 ? jerr.text : "empty body");
        st = TD_ERR_PROTO;
        goto err_free_conn;
    }
    *out = j;
    st = TD_OK;

err_free_conn:
    evhttp_connection_free(conn);
err_free_base:
    if (st == TD_ERR_NOMEM)
        td_error("%s: out of memory", what);
    if (r.body != NULL)
        evbuffer_free(r.body);
    if (r.base != NULL)
        event_base_free(r.base);
    free(payload);
err_free_uri:
    if (uri != NULL)
        evhttp_uri_free(uri);
    return st;
}
