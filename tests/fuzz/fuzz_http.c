/* tests/fuzz/fuzz_http.c — routerd's HTTP request path on raw bytes: each
 * input is what a client sends on one connection to routerd's listener
 * (routerd/http.c and h1.c: head parsing and framing, chunked bodies, the
 * body limits and byte budget, pipelining and keep-alive, dispatch through a
 * route table, the bearer-key check of routerd/apikeys.c), delivered in
 * pieces over a UNIX socket added to that listener. The routes stand in for
 * routerd's chat and completions routes up to scheduling: the body is parsed
 * by the request model's OpenAI adapter (routerd/adapt-openai.c) and, for chat, rendered by the V4.1
 * chat encoder and tokenized with the tiny checkpoint's tokenizer
 * ($TD_FUZZ_TINY), completions through routerd's tokenizer layer; errors go
 * out through td_http_refuse. With bit 7 of the first byte set, the rest is
 * "request line and headers" FUZZ_SEP "body" and the harness adds a matching
 * Content-Length, so that mutations of the body keep reaching the routes. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "apikeys.h"
#include "chat_prompt.h"
#include "fuzz.h"
#include "http.h"
#include "metrics.h"
#include "adapt-openai.h"
#include "ireq.h"
#include "openai.h"
#include "tok.h"
#include "tok_bpe.h"
#include "tokenizer.h"

#define HTTP_MAX_BODY 8192u   /* small, so that 413s and the byte budget are reached */

typedef struct {
    struct event_base *base;
    td_http_listener_t *listener;
    td_http_site_t site;
    td_http_budget_t budget;
    td_metrics_t metrics;
    td_apikeys_t *keys;
    td_tok_t *tok;
    const td_tokenizer_t *v41;
    const char *models[2];
    td_ireq_cfg_t api;
    struct sockaddr_un addr;
    socklen_t addr_len;
} fuzz_http_t;

static fuzz_http_t H;

/* What routerd does with a body before it schedules the request. */
static void
http_serve(td_http_req_t *req, td_openai_kind_t kind)
{
    size_t len;
    const char *body = td_http_body(req, &len);
    td_ireq_t *o = NULL;
    td_openai_err_t e;
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st;

    memset(&e, 0, sizeof e);
    st = td_adapt_openai_parse(&H.api, kind, body, len, &o, &e);
    if (st != TD_OK) {
        FUZZ_CHECK(o == NULL && e.http >= 400 && e.message[0]);
        td_http_refuse(&H.metrics, req, &e);
        return;
    }
    if (kind == TD_OPENAI_CHAT) {
        td_chat_prompt_t *p = NULL;
        td_chat_prompt_err_t ce;

        memset(&ce, 0, sizeof ce);
        st = td_chat_prompt_encode(o->body, NULL, &p, &ce);
        if (st == TD_OK)
            st = td_chat_prompt_ids(p, H.v41, &ids, &n);
        else
            td_openai_err_set(&e, 400, "invalid_request_error", ce.param[0] ? ce.param : NULL,
                              ce.code, "%s", ce.message);
        td_chat_prompt_destroy(p);
    } else {
        st = td_tok_encode(H.tok, o->prompt, strlen(o->prompt), &ids, &n);
    }
    if (st == TD_OK) {
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] < H.tok->vocab_size);
        td_http_reply_json(req, 200, json_pack("{s:I}", "prompt_tokens", (json_int_t)n));
    } else {
        if (e.http == 0)
            td_openai_err_internal(&e, "could not encode the prompt");
        td_http_refuse(&H.metrics, req, &e);
    }
    free(ids);
    td_ireq_destroy(o);
}

static void
http_route_chat(td_http_req_t *req, void *arg)
{
    http_serve(req, TD_OPENAI_CHAT);
}

static void
http_route_completions(td_http_req_t *req, void *arg)
{
    http_serve(req, TD_OPENAI_COMPLETION);
}

static void
http_route_health(td_http_req_t *req, void *arg)
{
    td_http_reply(req, 200, "text/plain", "ok\n", 3);
}

/* An admin-style body: {"node": "<name>"}. */
static void
http_route_field(td_http_req_t *req, void *arg)
{
    char node[64];
    td_openai_err_t e;

    if (td_http_body_field(req, "node", node, sizeof node, &e) != TD_OK) {
        td_http_refuse(&H.metrics, req, &e);
        return;
    }
    FUZZ_CHECK(node[0] && strlen(node) < sizeof node);
    td_http_reply(req, 200, "text/plain", node, strlen(node));
}

static const td_http_route_t http_routes[] = {
    { "/v1/chat/completions", TD_H1_POST, false, true, http_route_chat, TD_HTTP_ERR_OPENAI },
    { "/v1/completions", TD_H1_POST, false, true, http_route_completions, TD_HTTP_ERR_OPENAI },
    { "/health", TD_H1_GET, false, false, http_route_health, TD_HTTP_ERR_OPENAI },
    { "/admin/drain", TD_H1_POST, false, true, http_route_field, TD_HTTP_ERR_OPENAI },
    { NULL, 0, false, false, NULL, TD_HTTP_ERR_OPENAI },
};

static void
http_init(void)
{
    const char *tiny = fuzz_env_path("TD_FUZZ_TINY", "a tools/mk-tiny-model checkpoint");
    char keys[] = "/tmp/td-fuzz-keys-XXXXXX";
    int kfd = mkstemp(keys), lfd;

    fuzz_log_quiet();
    signal(SIGPIPE, SIG_IGN);
    FUZZ_CHECK(kfd >= 0 && write(kfd, "# fuzz\nsk-fuzz\n", 15) == 15);
    close(kfd);
    FUZZ_CHECK(td_apikeys_load(keys, &H.keys) == TD_OK);
    unlink(keys);
    FUZZ_CHECK(td_tok_bpe_create(tiny, &H.tok) == TD_OK);
    H.v41 = td_tok_bpe_tokenizer(H.tok);
    H.models[0] = "tandem-fuzz";
    H.api = (td_ireq_cfg_t){ .models = H.models, .max_body = HTTP_MAX_BODY,
                               .max_tokens_limit = 4096, .max_tokens_default = 16,
                               .vocab = H.tok->vocab_size };
    H.base = event_base_new();
    FUZZ_CHECK(H.base != NULL);
    /* A budget a little over one largest request, so that pipelined requests
     * reach it. */
    H.budget.max = TD_HTTP_MAX_HEAD + 2 * HTTP_MAX_BODY;
    H.site = (td_http_site_t){ .base = H.base, .routes = http_routes, .admin = false,
                               .keys = H.keys, .metrics = &H.metrics,
                               .max_body = HTTP_MAX_BODY, .max_conns = 8,
                               .read_timeout_ms = 60000, .idle_timeout_ms = 60000,
                               .write_timeout_ms = 60000, .retry_after_s = 1,
                               .budget = &H.budget, .arg = &H };

    /* The server on an abstract UNIX socket: no TCP handshake or TIME_WAIT
     * per input. */
    H.addr.sun_family = AF_UNIX;
    H.addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                             (size_t)snprintf(H.addr.sun_path + 1, sizeof(H.addr.sun_path) - 1,
                                              "td-fuzz-http-%d", (int)getpid()));
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(lfd >= 0);
    FUZZ_CHECK(bind(lfd, (struct sockaddr *)&H.addr, H.addr_len) == 0 && listen(lfd, 16) == 0);
    FUZZ_CHECK(td_http_listen_fd(&H.site, lfd, &H.listener) == TD_OK);
}

/* Read what the server sent into rx; 0 once it closed. */
static int
http_drain(int fd, struct evbuffer *rx)
{
    char buf[4096];

    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);

        if (n > 0) {
            evbuffer_add(rx, buf, (size_t)n);
            continue;
        }
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
}

/* The length of the chunked body at p (up to and with its last CRLF), or 0
 * when it is not whole. */
static size_t
http_chunked_len(const char *p, size_t n)
{
    size_t at = 0;

    for (;;) {
        char *end;
        const char *crlf = memmem(p + at, n - at, "\r\n", 2);
        unsigned long len;

        if (crlf == NULL)
            return 0;
        len = strtoul(p + at, &end, 16);
        FUZZ_CHECK(end == crlf);   /* our own chunk sizes carry no extensions */
        at = (size_t)(crlf - p) + 2;
        if (len == 0)
            return n - at >= 2 && memcmp(p + at, "\r\n", 2) == 0 ? at + 2 : 0;
        if (n - at < len + 2)
            return 0;
        FUZZ_CHECK(memcmp(p + at + len, "\r\n", 2) == 0);
        at += len + 2;
    }
}

/* Nothing the client sent is the server's fault: what came back is a
 * sequence of whole HTTP/1.1 answers (the last one may be cut by the harness
 * closing early; 100 Continue is a head alone), none of them a 500, and no
 * error whose JSON could not be made (http.c then answers 500 "out of
 * memory"). An answer to HEAD has no
 * body whatever its Content-Length says: when the client sent HEAD
 * somewhere, an answer followed at once by the next one is taken as that. */
static void
http_check_replies(struct evbuffer *rx, bool sent_head)
{
    size_t n = evbuffer_get_length(rx);
    const char *p = (const char *)evbuffer_pullup(rx, (ev_ssize_t)n);

    FUZZ_CHECK(H.metrics.errors[TD_ERRREASON_INTERNAL] == 0);
    while (n > 0) {
        const char *end = memmem(p, n, "\r\n\r\n", 4), *cl, *te;
        size_t head, body;

        FUZZ_CHECK(n < 9 || memcmp(p, "HTTP/1.1 ", 9) == 0);
        if (end == NULL || n < 12)
            return;   /* cut */
        FUZZ_CHECK(memcmp(p + 9, "500", 3) != 0);
        head = (size_t)(end - p) + 4;
        if (p[9] == '1') {   /* 100 Continue: a head alone */
            p += head;
            n -= head;
            continue;
        }
        cl = memmem(p, head, "\r\nContent-Length: ", 18);
        te = memmem(p, head, "\r\nTransfer-Encoding: chunked\r\n", 30);
        FUZZ_CHECK((cl == NULL) != (te == NULL));
        if (cl != NULL) {
            body = strtoul(cl + 18, NULL, 10);
            if (sent_head && n - head >= 9 && memcmp(p + head, "HTTP/1.1 ", 9) == 0)
                body = 0;
            if (n - head < body)
                return;
        } else {
            body = http_chunked_len(p + head, n - head);
            if (body == 0)
                return;
        }
        p += head + body;
        n -= head + body;
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = { data, size };
    uint8_t mode = fuzz_u8(&in);
    size_t piece = mode & 0x7f;
    struct evbuffer *tx = evbuffer_new(), *rx = evbuffer_new();
    int fd, alive = 1, stuck = 0;

    if (H.base == NULL)
        http_init();
    FUZZ_CHECK(tx != NULL && rx != NULL);
    if (mode & 0x80) {
        fuzz_in_t head = fuzz_piece(&in);

        evbuffer_add(tx, head.p, head.n);
        evbuffer_add_printf(tx, "Content-Length: %zu\r\n\r\n", in.n);
    }
    evbuffer_add(tx, in.p, in.n);

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(connect(fd, (struct sockaddr *)&H.addr, H.addr_len) == 0);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    event_base_loop(H.base, EVLOOP_NONBLOCK);   /* accept */

    while (alive && evbuffer_get_length(tx) > 0) {
        size_t want = piece && piece < evbuffer_get_length(tx) ? piece : evbuffer_get_length(tx);
        ssize_t n = send(fd, evbuffer_pullup(tx, (ev_ssize_t)want), want, MSG_NOSIGNAL);

        if (n > 0)
            evbuffer_drain(tx, (size_t)n);
        else
            FUZZ_CHECK(errno == EAGAIN || errno == EWOULDBLOCK || errno == EPIPE ||
                       errno == ECONNRESET);
        event_base_loop(H.base, EVLOOP_NONBLOCK);
        event_base_loop(H.base, EVLOOP_NONBLOCK);
        /* A server that stopped reading (over the budget, or closing) */
        stuck = n > 0 ? 0 : stuck + 1;
        alive = http_drain(fd, rx) && stuck < 16;
    }
    event_base_loop(H.base, EVLOOP_NONBLOCK);
    http_drain(fd, rx);
    close(fd);
    /* The server reads the end of the connection and frees it, and with it
     * every byte it held of the budget. */
    for (int i = 0; i < 4 && H.budget.used > 0; i++)
        event_base_loop(H.base, EVLOOP_NONBLOCK);
    FUZZ_CHECK(H.budget.used == 0);
    http_check_replies(rx, memmem(data, size, "HEAD", 4) != NULL);
    evbuffer_free(tx);
    evbuffer_free(rx);
    return 0;
}
