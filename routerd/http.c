/* routerd/http.c — the HTTP side of routerd on libevent's evhttp: listeners
 * for the API and the admin API, dispatch through the route table each was
 * given, with the bearer-key check, and replies (plain, JSON, OpenAI errors). */
#include "http.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "buf.h"
#include "log.h"
#include "net.h"

static const char *
reason_phrase(int code)
{
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default:  return "Error";
    }
}

static const char *
method_str(enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET:     return "GET";
    case EVHTTP_REQ_POST:    return "POST";
    case EVHTTP_REQ_HEAD:    return "HEAD";
    case EVHTTP_REQ_PUT:     return "PUT";
    case EVHTTP_REQ_DELETE:  return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PATCH:   return "PATCH";
    default:                 return "?";
    }
}

/* ======================================================================= */
/* Replies                                                                   */
/* ======================================================================= */

void
td_http_reply(struct evhttp_request *req, int code, const char *ctype, const char *body,
              size_t len)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    if (len)
        evbuffer_add(evhttp_request_get_output_buffer(req), body, len);
    evhttp_send_reply(req, code, reason_phrase(code), NULL);
}

void
td_http_reply_err(struct evhttp_request *req, const td_openai_err_t *e)
{
    td_buf_t body = {0};

    if (e->retry_after) {
        char s[24];
        snprintf(s, sizeof s, "%u", e->retry_after);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", s);
    }
    if (td_openai_err_json(e, &body) == TD_OK)
        td_http_reply(req, e->http, "application/json", body.data, body.len);
    else
        td_http_reply(req, 500, "text/plain", "out of memory\n", 14);
    td_buf_free(&body);
}

void
td_http_refuse(td_metrics_t *m, struct evhttp_request *req, const td_openai_err_t *e)
{
    td_errreason_t why;

    switch (e->http) {
    case 400: why = TD_ERRREASON_BAD_REQUEST; break;
    case 401: why = TD_ERRREASON_UNAUTHORIZED; break;
    case 404: why = TD_ERRREASON_NOT_FOUND; break;
    case 413: why = TD_ERRREASON_TOO_LARGE; break;
    case 503: why = TD_ERRREASON_NO_CAPACITY; break;
    default:  why = TD_ERRREASON_INTERNAL; break;
    }
    m->errors[why]++;
    m->requests[TD_OUTCOME_REJECTED]++;
    /* the client's mistakes are the client's to see; ours are logged */
    td_log(e->http >= 500 ? TD_LOG_WARN : TD_LOG_DEBUG, "http %s %s: %d: %s",
           method_str(evhttp_request_get_command(req)), evhttp_request_get_uri(req), e->http,
           e->message);
    td_http_reply_err(req, e);
}

void
td_http_reply_json(struct evhttp_request *req, int code, json_t *j)
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

const char *
td_http_body(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(b);
    const char *p;

    if (evbuffer_add(b, "", 1) != 0)   /* NUL-terminate for the parsers */
        return *len = 0, "";
    p = (const char *)evbuffer_pullup(b, (ev_ssize_t)(n + 1));
    *len = n;
    return p ? p : "";
}

td_status_t
td_http_body_field(struct evhttp_request *req, const char *field, char *buf, size_t len,
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

/* ======================================================================= */
/* Dispatch                                                                  */
/* ======================================================================= */

static void
http_dispatch(struct evhttp_request *req, void *arg)
{
    td_http_site_t *site = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    td_openai_err_t e;

    if (!path || !*path)
        path = "/";
    for (const td_http_route_t *rt = site->routes; rt->path; rt++) {
        if (rt->admin != site->admin || strcmp(rt->path, path) != 0 || !(rt->methods & (int)m))
            continue;
        if (rt->auth && site->keys) {
            const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req),
                                                  "Authorization");
            td_status_t st = td_apikeys_check_header(site->keys, auth);
            if (st != TD_OK) {
                td_openai_err_auth(&e, st == TD_ERR_AUTH);
                td_http_refuse(site->metrics, req, &e);
                return;
            }
        }
        rt->fn(req, site->arg);
        return;
    }
    td_openai_err_no_route(&e, method_str(m), path);
    td_http_refuse(site->metrics, req, &e);
}

td_status_t
td_http_listen(td_http_site_t *site, const char *hostport, struct evhttp **out,
               uint16_t *port_out)
{
    char host[TD_NET_HOST_MAX];
    uint16_t port;
    int fd;
    struct evhttp *http;
    td_status_t st = td_net_addr_parse(hostport, host, sizeof host, &port);

    if (st == TD_OK)   /* each logs what failed (the address, the bind) */
        st = td_net_listen(host, port, 512, &fd, &port);
    if (st != TD_OK)
        return st;
    /* Accepted sockets inherit TCP_NODELAY: an SSE chunk must not wait for
     * the client's delayed ACK of the previous one (Nagle, 40 ms). */
    (void)td_net_set_nodelay(fd);
    http = evhttp_new(site->base);
    if (!http)
        goto err_close;
    /* Bodies up to max_body get our 413 JSON; far larger ones are cut off by
     * evhttp (its own 413) before they are buffered. */
    evhttp_set_max_body_size(http, (ev_ssize_t)(site->admin ? 65536 : 4 * site->max_body + 4096));
    evhttp_set_max_headers_size(http, 65536);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                         EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                         EVHTTP_REQ_PATCH | EVHTTP_REQ_OPTIONS);
    /* Long generations keep a connection quiet for a while. */
    evhttp_set_timeout(http, (int)(site->request_timeout_ms / 1000 + 600));
    evhttp_set_gencb(http, http_dispatch, site);
    if (!evhttp_accept_socket_with_handle(http, fd)) {
        evhttp_free(http);
        goto err_close;
    }
    *out = http;
    *port_out = port;
    return TD_OK;

err_close:
    td_error("%s listen %s: cannot start the http server", site->admin ? "admin" : "http",
             hostport);
    close(fd);
    return TD_ERR_NOMEM;
}

/* ======================================================================= */
/* Shutdown                                                                  */
/* ======================================================================= */

#define HTTP_BOUND_MAX 8

typedef struct {
    struct evhttp_bound_socket *b[HTTP_BOUND_MAX];
    size_t n;
} http_bound_list_t;

static void
http_bound_collect(struct evhttp_bound_socket *b, void *arg)
{
    http_bound_list_t *l = arg;

    if (l->n < HTTP_BOUND_MAX)
        l->b[l->n++] = b;
}

void
td_http_stop_accepting(struct evhttp *http)
{
    http_bound_list_t l = { .n = 0 };

    if (!http)
        return;
    /* collected first: deleting while evhttp walks its list is not allowed */
    evhttp_foreach_bound_socket(http, http_bound_collect, &l);
    for (size_t i = 0; i < l.n; i++)
        evhttp_del_accept_socket(http, l.b[i]);   /* closes the socket */
}
