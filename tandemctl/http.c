/* tandemctl/http.c — the admin API client: one HTTP request to routerd with
 * the admin bearer key, on a private libevent loop bounded by --timeout, and
 * the mapping of every way it can fail to one status and one message (with
 * a hint when the URL is routerd's API port instead of its admin port). */
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

/* One exchange with the router: the request, with the admin key when
 * with_key, on a private loop bounded by timeout_ms. On TD_OK r->code and
 * r->body hold the answer (any HTTP status); TD_ERR_TIMEOUT or TD_ERR_PEER
 * (unreachable) when there is none, TD_ERR_INVALID for a URL that is not
 * http://HOST:PORT, TD_ERR_NOMEM, TD_ERR_IO. Logs nothing: the callers say
 * what failed, or keep quiet. The caller frees r->base and r->body
 * (http_result_free). */
static td_status_t
http_exchange(tdctl_t *ctl, const char *method, const char *path, const char *payload,
              bool with_key, uint64_t timeout_ms, http_result_t *r)
{
    const char *url = ctl->opts.router;
    td_status_t st = TD_ERR_NOMEM;
    struct evhttp_uri *uri = NULL;
    struct evhttp_connection *conn = NULL;
    struct evhttp_request *req = NULL;
    char auth[600];

    uri = evhttp_uri_parse(url);
    if (uri == NULL || evhttp_uri_get_host(uri) == NULL || evhttp_uri_get_scheme(uri) == NULL ||
        strcmp(evhttp_uri_get_scheme(uri), "http") != 0) {
        st = TD_ERR_INVALID;
        goto out_free_uri;
    }
    const char *host = evhttp_uri_get_host(uri);
    int port = evhttp_uri_get_port(uri) < 0 ? 80 : evhttp_uri_get_port(uri);

    if ((r->base = event_base_new()) == NULL || (r->body = evbuffer_new()) == NULL)
        goto out_free_uri;
    conn = evhttp_connection_base_new(r->base, NULL, host, (unsigned short)port);
    if (conn == NULL)
        goto out_free_uri;
    struct timeval tv = { .tv_sec = (time_t)(timeout_ms / 1000),
                          .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000 };
    evhttp_connection_set_timeout_tv(conn, &tv);
    evhttp_connection_set_retries(conn, 0);
    evhttp_connection_set_max_body_size(conn, TDCTL_HTTP_MAX_BODY);

    if ((req = evhttp_request_new(http_on_done, r)) == NULL)
        goto out_free_conn;
    evhttp_request_set_error_cb(req, http_on_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", host);
    if (with_key) {
        snprintf(auth, sizeof(auth), "Bearer %s", ctl->admin_key);
        evhttp_add_header(h, "Authorization", auth);
    }
    evhttp_add_header(h, "Accept", "application/json");
    evhttp_add_header(h, "Connection", "close");
    if (payload != NULL) {
        evhttp_add_header(h, "Content-Type", "application/json");
        evbuffer_add(evhttp_request_get_output_buffer(req), payload, strlen(payload));
    }
    /* The connection owns req from here, whatever the outcome. */
    if (evhttp_make_request(conn, req, strcmp(method, "POST") == 0 ? EVHTTP_REQ_POST
                                                                 : EVHTTP_REQ_GET,
                            path) != 0) {
        st = TD_ERR_IO;
        goto out_free_conn;
    }
    /* Belt and braces: the loop never outlives the timeout by much. */
    struct timeval cap = { .tv_sec = tv.tv_sec + 1, .tv_usec = tv.tv_usec };
    event_base_loopexit(r->base, &cap);
    event_base_dispatch(r->base);

    if (!r->done || r->code == 0)
        st = !r->done || (r->req_error && r->err == EVREQ_HTTP_TIMEOUT) ? TD_ERR_TIMEOUT
                                                                        : TD_ERR_PEER;
    else
        st = TD_OK;

out_free_conn:
    evhttp_connection_free(conn);
out_free_uri:
    if (uri != NULL)
        evhttp_uri_free(uri);
    return st;
}

static void
http_result_free(http_result_t *r)
{
    if (r->body != NULL)
        evbuffer_free(r->body);
    if (r->base != NULL)
        event_base_free(r->base);
}

/* After a 401 or 404 for an admin path: is the router's URL its OpenAI API
 * listener rather than its admin one? Its /health (no key) says which
 * listener answers; a server that does not route /admin at all answers
 * "Invalid URL" (routerd's API port before /health said so). */
static bool
http_is_api_port(tdctl_t *ctl, int code, const char *msg)
{
    http_result_t r = { .code = 0 };
    bool api = false;

    if (http_exchange(ctl, "GET", "/health", NULL, false,
                      ctl->opts.timeout_ms < 2000 ? ctl->opts.timeout_ms : 2000, &r) == TD_OK &&
        r.code == 200) {
        size_t n = evbuffer_get_length(r.body);
        const char *p = (const char *)evbuffer_pullup(r.body, -1);
        json_t *j = p != NULL ? json_loadb(p, n, 0, NULL) : NULL;
        const char *listener = json_string_value(json_object_get(j, "listener"));
        api = listener != NULL && strcmp(listener, "api") == 0;
        json_decref(j);
    }
    http_result_free(&r);
    return api || (code == 404 && strncmp(msg, "Invalid URL", 11) == 0);
}

td_status_t
tdctl_http_call(tdctl_t *ctl, const char *method, const char *path, json_t *body,
                const char *what, json_t **out)
{
    const char *url = ctl->opts.router;
    http_result_t r = { .code = 0 };
    char *payload = NULL;
    td_status_t st;

    if (body != NULL && (payload = json_dumps(body, JSON_COMPACT)) == NULL) {
        td_error("%s: out of memory", what);
        return TD_ERR_NOMEM;
    }
    st = http_exchange(ctl, method, path, payload, true, ctl->opts.timeout_ms, &r);
    free(payload);
    switch (st) {
    case TD_OK:
        break;
    case TD_ERR_INVALID:
        td_error("router url \"%s\": expected http://HOST:PORT", url);
        goto out_free;
    case TD_ERR_TIMEOUT:
        td_error("%s: router %s did not answer within %llu ms", what, url,
                 (unsigned long long)ctl->opts.timeout_ms);
        goto out_free;
    case TD_ERR_PEER:
        td_error("%s: router %s is unreachable (connection failed or closed)", what, url);
        goto out_free;
    case TD_ERR_IO:
        td_error("%s: cannot send the request to %s", what, url);
        goto out_free;
    default:
        td_error("%s: out of memory", what);
        goto out_free;
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
        if ((r.code == 401 || r.code == 404) && strncmp(path, "/admin", 6) == 0 &&
            http_is_api_port(ctl, r.code, msg))
            td_error("hint: %s is routerd's OpenAI API listener (http-listen); --router "
                     "wants its admin API listener (admin-listen, default "
                     "http://127.0.0.1:8001)", url);
        goto out_free;
    }
    json_error_t jerr;
    size_t n = evbuffer_get_length(r.body);
    const char *p = (const char *)evbuffer_pullup(r.body, -1);
    json_t *j = n > 0 ? json_loadb(p, n, 0, &jerr) : json_object();
    if (j == NULL) {
        td_error("%s: router answered with invalid json: %s", what,
                 n > 0 ? jerr.text : "empty body");
        st = TD_ERR_PROTO;
        goto out_free;
    }
    *out = j;
    st = TD_OK;

out_free:
    http_result_free(&r);
    return st;
}

td_status_t
tdctl_http_probe(tdctl_t *ctl, const char *path, uint64_t timeout_ms, int *code, json_t **out)
{
    http_result_t r = { .code = 0 };
    td_status_t st = http_exchange(ctl, "GET", path, NULL, false, timeout_ms, &r);

    *code = 0;
    *out = NULL;
    if (st == TD_OK) {
        size_t n = evbuffer_get_length(r.body);
        const char *p = (const char *)evbuffer_pullup(r.body, -1);
        *code = r.code;
        *out = p != NULL && n > 0 ? json_loadb(p, n, 0, NULL) : NULL;
    }
    http_result_free(&r);
    return st;
}
