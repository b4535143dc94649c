/* bench/serve.c — serving benchmark: open-loop Poisson arrivals against the
 * OpenAI API (routerd), streamed over HTTP from one libevent loop; reports
 * TTFT, TPOT, inter-token latency, throughput and goodput (text and JSON). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "clock.h"
#include "log.h"
#include "rng.h"

/* ---------------------------------------------------------------- options */

typedef enum { DIST_FIXED, DIST_UNIFORM, DIST_NORMAL } dist_kind_t;

typedef struct {
    dist_kind_t kind;
    double a, b; /* fixed: a; uniform: [a, b]; normal: mean a, std b */
    char text[64];
} dist_t;

typedef enum { EP_COMPLETIONS, EP_CHAT, EP_HEALTH } endpoint_t;

typedef struct {
    char host[256];
    int port;
    char api_key[600];
    char model[128];
    endpoint_t endpoint;
    double rate;          /* requests/s */
    double duration;      /* s; 0 = use nrequests */
    uint64_t nrequests;
    dist_t prompt_len, output_len;
    bool stream;
    uint64_t seed;
    double slo_ttft_ms, slo_tpot_ms; /* 0 = no SLO on it */
    const char *json_path;
    uint32_t max_inflight;
    double timeout;       /* s per request */
    const char *label;
    bool visible_first;   /* greedy, prompts whose first token shows at once */
    uint64_t synth_key, synth_vocab;
} opts_t;

/* ------------------------------------------------------------------ state */

typedef enum {
    R_PENDING, R_INFLIGHT, R_OK, R_HTTP_ERROR, R_CONN_ERROR, R_STREAM_ERROR,
    R_TIMEOUT, R_INCOMPLETE, R_NKINDS
} rstate_t;
static const char *const rstate_names[R_NKINDS] = {
    "pending", "inflight", "ok", "http_error", "connection_error", "stream_error",
    "timeout", "incomplete",
};

struct bench;

typedef struct conn {
    struct evhttp_connection *evcon;
    struct conn *next_free;
} conn_t;

typedef struct {
    struct bench *b;
    uint32_t idx;
    double sched;                /* arrival time, s after start */
    double sent, first, last, end; /* absolute CLOCK_MONOTONIC s; 0 = not yet */
    uint32_t prompt_len, max_tokens;
    uint32_t chunks;             /* chunks carrying text */
    int64_t usage_prompt, usage_completion; /* from the usage chunk; -1 = none */
    bool done_seen;              /* [DONE] */
    int http_status;
    rstate_t state;
    conn_t *conn;
    struct evhttp_request *req;
    struct event *timer;
    struct evbuffer *sse;        /* unparsed SSE bytes */
} req_t;

typedef struct { double *v; size_t n, cap; } vec_t;

typedef struct bench {
    opts_t o;
    struct event_base *base;
    struct event *arrive;
    req_t *reqs;
    uint32_t nreqs, next, inflight, finished;
    uint32_t inflight_peak, cap_waits;
    double t0;
    conn_t *conns_free;
    conn_t **conns_all;
    uint32_t nconns;
    vec_t itl, lag;
    char *prompt_pool;           /* random ASCII, sliced for prompts */
    size_t prompt_pool_len;
} bench_t;

static void vec_push(vec_t *v, double x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        double *nv = realloc(v->v, cap * sizeof(*nv));
        if (!nv) {
            td_error("serve: out of memory for %zu samples", cap);
            exit(1);
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

/* -------------------------------------------------------------------- rng */

static td_rng_t rng;   /* seeded with --seed */

static double rng_unit(void) /* (0, 1) */
{
    return ((double)(td_rng_next(&rng) >> 11) + 0.5) * 0x1p-53;
}

static uint32_t dist_sample(const dist_t *d)
{
    double x;
    switch (d->kind) {
    case DIST_UNIFORM:
        x = d->a + floor(rng_unit() * (d->b - d->a + 1));
        break;
    case DIST_NORMAL:
        x = round(d->a + d->b * sqrt(-2.0 * log(rng_unit())) * cos(2 * M_PI * rng_unit()));
        break;
    default:
        x = d->a;
    }
    return x < 1 ? 1 : x > 1e6 ? 1000000 : (uint32_t)x; /* clipped to [1, 1e6] */
}

/* "N", "fixed:N", "uniform:A:B", "normal:MEAN:STD". */
static int dist_parse(const char *s, dist_t *out)
{
    dist_t d = {0};
    char *end;
    const char *p = s;
    if (strncmp(s, "fixed:", 6) == 0) {
        p = s + 6;
    } else if (strncmp(s, "uniform:", 8) == 0) {
        d.kind = DIST_UNIFORM;
        p = s + 8;
    } else if (strncmp(s, "normal:", 7) == 0) {
        d.kind = DIST_NORMAL;
        p = s + 7;
    }
    errno = 0;
    d.a = strtod(p, &end);
    if (errno || end == p)
        return -1;
    if (d.kind != DIST_FIXED) {
        if (*end != ':')
            return -1;
        p = end + 1;
        d.b = strtod(p, &end);
        if (errno || end == p)
            return -1;
    }
    if (*end || d.a < 1 || d.b < 0 ||
        (d.kind == DIST_UNIFORM && d.b < d.a) || d.a > 1e6 || d.b > 1e6)
        return -1;
    snprintf(d.text, sizeof(d.text), "%s", s);
    *out = d;
    return 0;
}

/* ------------------------------------------------------------ connections */

static conn_t *conn_get(bench_t *b)
{
    conn_t *c = b->conns_free;
    if (c) {
        b->conns_free = c->next_free;
        return c;
    }
    c = calloc(1, sizeof(*c));
    conn_t **all = realloc(b->conns_all, (b->nconns + 1) * sizeof(*all));
    if (!c || !all) {
        td_error("serve: out of memory for connection %u", b->nconns);
        exit(1);
    }
    b->conns_all = all;
    c->evcon = evhttp_connection_base_new(b->base, NULL, b->o.host, (uint16_t)b->o.port);
    if (!c->evcon) {
        td_error("serve: cannot create a connection to %s:%d", b->o.host, b->o.port);
        exit(1);
    }
    b->conns_all[b->nconns++] = c;
    return c;
}

static void conn_put(bench_t *b, conn_t *c)
{
    c->next_free = b->conns_free;
    b->conns_free = c;
}

/* ------------------------------------------------------------- SSE events */

/* The integer after "key": in json, or -1. */
static int64_t json_int(const char *json, const char *key)
{
    const char *p = strstr(json, key);
    if (!p)
        return -1;
    p += strlen(key);
    char *end;
    long long v = strtoll(p, &end, 10);
    return end == p ? -1 : v;
}

/* Whether the string field `key` (e.g. "\"text\":\"") is present and non-empty. */
static bool json_nonempty_str(const char *json, const char *key)
{
    const char *p = strstr(json, key);
    return p && p[strlen(key)] != '"' && p[strlen(key)] != '\0';
}

/* One SSE event's data at time t. The role chunk routerd sends at admission
 * (empty text) is not a token: TTFT and ITL are taken at chunks with text. */
static void req_on_event(req_t *r, const char *data, double t)
{
    if (strcmp(data, "[DONE]") == 0) {
        r->done_seen = true;
        return;
    }
    if (strncmp(data, "{\"error\"", 8) == 0) {
        r->state = R_STREAM_ERROR;
        return;
    }
    const char *key = r->b->o.endpoint == EP_CHAT ? "\"content\":\"" : "\"text\":\"";
    if (json_nonempty_str(data, key)) {
        if (r->chunks == 0) {
            r->first = t;
        } else {
            vec_push(&r->b->itl, t - r->last);
        }
        r->last = t;
        r->chunks++;
    }
    int64_t c = json_int(data, "\"completion_tokens\":");
    if (c >= 0) {
        r->usage_completion = c;
        r->usage_prompt = json_int(data, "\"prompt_tokens\":");
    }
}

/* Parse every whole event ("...\n\n") buffered so far. */
static void req_parse_sse(req_t *r, double t)
{
    struct evbuffer_ptr end;
    while ((end = evbuffer_search(r->sse, "\n\n", 2, NULL)).pos >= 0) {
        size_t len = (size_t)end.pos;
        char *ev = malloc(len + 1);
        if (!ev) {
            td_error("serve: out of memory for an event of %zu bytes", len);
            exit(1);
        }
        evbuffer_remove(r->sse, ev, len);
        evbuffer_drain(r->sse, 2);
        ev[len] = '\0';
        for (char *line = strtok(ev, "\n"); line; line = strtok(NULL, "\n"))
            if (strncmp(line, "data: ", 6) == 0)
                req_on_event(r, line + 6, t);
        free(ev);
    }
}

/* ------------------------------------------------------------ one request */

static void bench_send_due(bench_t *b);

static void req_finish(req_t *r, rstate_t st, double t)
{
    bench_t *b = r->b;
    if (r->state == R_INFLIGHT || st == R_TIMEOUT || st == R_CONN_ERROR)
        r->state = st;
    r->end = t;
    r->req = NULL;
    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }
    evbuffer_free(r->sse);
    r->sse = NULL;
    b->inflight--;
    b->finished++;
    if (b->finished == b->nreqs)
        event_base_loopbreak(b->base);
    else
        bench_send_due(b); /* a request held back by --max-inflight */
}

static void req_on_chunk(struct evhttp_request *req, void *arg)
{
    req_t *r = arg;
    double t = td_clock_s();
    if (r->b->o.endpoint == EP_HEALTH || !r->b->o.stream) {
        if (r->first == 0)
            r->first = t;
        r->last = t;
        evbuffer_add_buffer(r->sse, evhttp_request_get_input_buffer(req));
        return;
    }
    evbuffer_add_buffer(r->sse, evhttp_request_get_input_buffer(req));
    req_parse_sse(r, t);
}

static void req_on_done(struct evhttp_request *req, void *arg)
{
    req_t *r = arg;
    bench_t *b = r->b;
    double t = td_clock_s();
    if (!r->req)
        return; /* timed out and cancelled */
    conn_put(b, r->conn);
    r->conn = NULL;
    if (!req || evhttp_request_get_response_code(req) == 0) {
        req_finish(r, R_CONN_ERROR, t);
        return;
    }
    r->http_status = evhttp_request_get_response_code(req);
    evbuffer_add_buffer(r->sse, evhttp_request_get_input_buffer(req));
    if (r->http_status != 200) {
        req_finish(r, R_HTTP_ERROR, t);
        return;
    }
    rstate_t st = R_OK;
    if (b->o.endpoint == EP_HEALTH) {
        if (r->first == 0)
            r->first = r->last = t;
    } else if (b->o.stream) {
        req_parse_sse(r, t);
        if (r->state == R_INFLIGHT && (!r->done_seen || r->chunks == 0))
            st = R_INCOMPLETE;
    } else {
        size_t len = evbuffer_get_length(r->sse);
        char *body = malloc(len + 1);
        if (!body) {
            td_error("serve: out of memory for a body of %zu bytes", len);
            exit(1);
        }
        evbuffer_remove(r->sse, body, len);
        body[len] = '\0';
        r->first = r->last = t; /* the whole answer arrives at once */
        r->usage_completion = json_int(body, "\"completion_tokens\":");
        r->usage_prompt = json_int(body, "\"prompt_tokens\":");
        if (r->usage_completion < 0)
            st = R_INCOMPLETE;
        free(body);
    }
    req_finish(r, st, t);
}

static void req_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    req_t *r = arg;
    /* Cancelling resets the connection; it is not returned to the free
     * list (conns_all still owns it). r->req = NULL first: should libevent
     * call req_on_done for the cancelled request, it is ignored there. */
    struct evhttp_request *req = r->req;
    r->req = NULL;
    r->conn = NULL;
    evhttp_cancel_request(req);
    req_finish(r, R_TIMEOUT, td_clock_s());
}

/* The synthetic engine's greedy first token after `prompt` (docs/engine.md:
 * prefix hash P[n], candidate c_0 = mix64(P[n] + GAMMA) mod vocab), as the
 * byte routerd shows (id mod 256). A lead byte of a UTF-8 sequence (>= 0xC0)
 * is held back by routerd's incremental decoder until the next token, which
 * would add a decode step to the measured TTFT. */
static bool synth_first_visible(const opts_t *o, const char *prompt, size_t n)
{
    uint64_t h = td_rng_mix64(o->synth_key ^ 0x7464707265666978ull);
    for (size_t i = 0; i < n; i++)
        h = td_rng_mix64(h ^ td_rng_mix64((uint64_t)(unsigned char)prompt[i] + TD_RNG_GAMMA));
    return td_rng_mix64(h + TD_RNG_GAMMA) % o->synth_vocab % 256 < 0xC0;
}

static void json_escape_into(struct evbuffer *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            evbuffer_add_printf(out, "\\%c", c);
        else if (c < 0x20)
            evbuffer_add_printf(out, "\\u%04x", c);
        else
            evbuffer_add(out, &s[i], 1);
    }
}

static void req_send(bench_t *b, req_t *r)
{
    const opts_t *o = &b->o;
    r->conn = conn_get(b);
    r->sse = evbuffer_new();
    r->req = evhttp_request_new(req_on_done, r);
    r->timer = evtimer_new(b->base, req_on_timeout, r);
    if (!r->sse || !r->req || !r->timer) {
        td_error("serve: request %u: out of memory", r->idx);
        exit(1);
    }
    evhttp_request_set_chunked_cb(r->req, req_on_chunk);
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
    char hostport[300], auth[620];
    snprintf(hostport, sizeof(hostport), "%s:%d", o->host, o->port);
    evhttp_add_header(h, "Host", hostport);
    const char *path = "/health";
    enum evhttp_cmd_type cmd = EVHTTP_REQ_GET;
    if (o->endpoint != EP_HEALTH) {
        cmd = EVHTTP_REQ_POST;
        path = o->endpoint == EP_CHAT ? "/v1/chat/completions" : "/v1/completions";
        if (o->api_key[0]) {
            snprintf(auth, sizeof(auth), "Bearer %s", o->api_key);
            evhttp_add_header(h, "Authorization", auth);
        }
        evhttp_add_header(h, "Content-Type", "application/json");
        struct evbuffer *body = evhttp_request_get_output_buffer(r->req);
        /* A prompt of prompt_len bytes = prompt_len tokens (byte-level
         * tokenizer), a slice of the random ASCII pool. */
        size_t off = (size_t)(td_rng_next(&rng) % (b->prompt_pool_len - r->prompt_len + 1));
        for (int tries = 0; o->visible_first && tries < 64 &&
                            !synth_first_visible(o, b->prompt_pool + off, r->prompt_len); tries++)
            off = (size_t)(td_rng_next(&rng) % (b->prompt_pool_len - r->prompt_len + 1));
        evbuffer_add_printf(body, "{\"model\":\"%s\",", o->model);
        if (o->endpoint == EP_CHAT)
            evbuffer_add_printf(body, "\"messages\":[{\"role\":\"user\",\"content\":\"");
        else
            evbuffer_add_printf(body, "\"prompt\":\"");
        json_escape_into(body, b->prompt_pool + off, r->prompt_len);
        evbuffer_add_printf(body, "\"%s,\"max_tokens\":%u,%s\"stream\":%s%s}",
                            o->endpoint == EP_CHAT ? "}]" : "", r->max_tokens,
                            o->visible_first ? "\"temperature\":0," : "",
                            o->stream ? "true" : "false",
                            o->stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
    }
    struct timeval tv = { (time_t)o->timeout,
                          (suseconds_t)((o->timeout - floor(o->timeout)) * 1e6) };
    evtimer_add(r->timer, &tv);
    r->state = R_INFLIGHT;
    r->sent = td_clock_s();
    vec_push(&b->lag, r->sent - b->t0 - r->sched);
    b->inflight++;
    if (b->inflight > b->inflight_peak)
        b->inflight_peak = b->inflight;
    if (evhttp_make_request(r->conn->evcon, r->req, cmd, path) != 0) {
        /* libevent has freed the request */
        r->req = NULL;
        conn_put(b, r->conn);
        r->conn = NULL;
        req_finish(r, R_CONN_ERROR, td_clock_s());
    }
}

/* -------------------------------------------------------------- arrivals */

/* Send every request whose arrival time has come (within the in-flight cap),
 * then arm the timer for the next arrival on the absolute schedule. */
static void bench_send_due(bench_t *b)
{
    double t = td_clock_s();
    while (b->next < b->nreqs && b->t0 + b->reqs[b->next].sched <= t) {
        if (b->o.max_inflight && b->inflight >= b->o.max_inflight) {
            b->cap_waits++;
            return; /* sent when a request finishes */
        }
        req_send(b, &b->reqs[b->next]);
        b->next++;
        t = td_clock_s();
    }
    if (b->next < b->nreqs && !evtimer_pending(b->arrive, NULL)) {
        double dt = b->t0 + b->reqs[b->next].sched - t;
        if (dt < 0)
            dt = 0;
        struct timeval tv = { (time_t)dt, (suseconds_t)((dt - floor(dt)) * 1e6) };
        evtimer_add(b->arrive, &tv);
    }
}

static void bench_on_arrive(evutil_socket_t fd, short what, void *arg)
{
    bench_send_due(arg);
}

/* ----------------------------------------------------------------- report */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const double pcts[] = { 1, 5, 10, 25, 50, 75, 90, 95, 99 };
#define NPCTS (sizeof(pcts) / sizeof(pcts[0]))

typedef struct {
    size_t n;
    double mean, min, max, p[NPCTS];
} stats_t;

/* Percentiles with linear interpolation between order statistics (numpy's
 * default, which aiperf uses too). Sorts v. Values scaled by `scale`. */
static stats_t stats_of(double *v, size_t n, double scale)
{
    stats_t s = { .n = n };
    if (n == 0)
        return s;
    qsort(v, n, sizeof(*v), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    s.mean = sum / (double)n * scale;
    s.min = v[0] * scale;
    s.max = v[n - 1] * scale;
    for (size_t k = 0; k < NPCTS; k++) {
        double pos = pcts[k] / 100.0 * (double)(n - 1);
        size_t lo = (size_t)pos;
        size_t hi = lo + 1 < n ? lo + 1 : lo;
        s.p[k] = (v[lo] + (v[hi] - v[lo]) * (pos - (double)lo)) * scale;
    }
    return s;
}

static double stats_p(const stats_t *s, double pct)
{
    for (size_t k = 0; k < NPCTS; k++)
        if (pcts[k] == pct)
            return s->p[k];
    return NAN;
}

static void stats_json(FILE *f, const char *name, const stats_t *s, bool last)
{
    fprintf(f, "    \"%s\": {\"n\": %zu", name, s->n);
    if (s->n) {
        fprintf(f, ", \"mean\": %.6g, \"min\": %.6g, \"max\": %.6g", s->mean, s->min, s->max);
        for (size_t k = 0; k < NPCTS; k++)
            fprintf(f, ", \"p%g\": %.6g", pcts[k], s->p[k]);
    }
    fprintf(f, "}%s\n", last ? "" : ",");
}

static void stats_line(const char *name, const char *unit, const stats_t *s)
{
    if (!s->n) {
        printf("  %-22s (no samples)\n", name);
        return;
    }
    printf("  %-22s mean %9.3f  p50 %9.3f  p90 %9.3f  p99 %9.3f  max %9.3f %s  (n=%zu)\n",
           name, s->mean, stats_p(s, 50), stats_p(s, 90), stats_p(s, 99), s->max, unit, s->n);
}

/* HTTP error statuses, for the report: whether request i is the first with
 * its status, and how many have it (quadratic, over failed requests only). */
static bool http_status_first(const bench_t *b, uint32_t i)
{
    for (uint32_t j = 0; j < i; j++)
        if (b->reqs[j].state == R_HTTP_ERROR && b->reqs[j].http_status == b->reqs[i].http_status)
            return false;
    return true;
}

static uint32_t http_status_count(const bench_t *b, uint32_t i)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < b->nreqs; j++)
        n += b->reqs[j].state == R_HTTP_ERROR && b->reqs[j].http_status == b->reqs[i].http_status;
    return n;
}

static int bench_report(bench_t *b, double t_end)
{
    const opts_t *o = &b->o;
    uint32_t kinds[R_NKINDS] = {0};
    vec_t ttft = {0}, tpot = {0}, e2e = {0}, otoks = {0};
    double first_sent = INFINITY, last_end = 0;
    uint64_t out_tokens = 0, good = 0;
    for (uint32_t i = 0; i < b->nreqs; i++) {
        req_t *r = &b->reqs[i];
        kinds[r->state]++;
        if (r->sent && r->sent < first_sent)
            first_sent = r->sent;
        if (r->end > last_end)
            last_end = r->end;
        if (r->state != R_OK)
            continue;
        double rt = r->first - r->sent;
        vec_push(&ttft, rt);
        vec_push(&e2e, r->end - r->sent);
        /* Output tokens: the server's usage count (a chunk may carry
         * several tokens, or none for a partial UTF-8 character). */
        int64_t n = r->usage_completion >= 0 ? r->usage_completion : r->chunks;
        out_tokens += (uint64_t)n;
        vec_push(&otoks, (double)n);
        double tp = NAN;
        if (n > 1 && r->chunks > 1) {
            tp = (r->last - r->first) / (double)(n - 1);
            vec_push(&tpot, tp);
        }
        bool ok_ttft = o->slo_ttft_ms <= 0 || rt * 1e3 <= o->slo_ttft_ms;
        bool ok_tpot = o->slo_tpot_ms <= 0 || isnan(tp) || tp * 1e3 <= o->slo_tpot_ms;
        good += ok_ttft && ok_tpot;
    }
    double span = last_end > first_sent ? last_end - first_sent : 0;
    double sched_span = b->nreqs > 1 ? b->reqs[b->nreqs - 1].sched : 0;
    double last_sent = 0;
    for (uint32_t i = 0; i < b->nreqs; i++)
        if (b->reqs[i].sent > last_sent)
            last_sent = b->reqs[i].sent;
    double achieved_rate = b->nreqs > 1 && last_sent > first_sent
                               ? (double)(b->nreqs - 1) / (last_sent - first_sent) : 0;
    stats_t s_ttft = stats_of(ttft.v, ttft.n, 1e3), s_tpot = stats_of(tpot.v, tpot.n, 1e3),
            s_itl = stats_of(b->itl.v, b->itl.n, 1e3), s_e2e = stats_of(e2e.v, e2e.n, 1e3),
            s_lag = stats_of(b->lag.v, b->lag.n, 1e3), s_otok = stats_of(otoks.v, otoks.n, 1);
    double req_tput = span > 0 ? kinds[R_OK] / span : 0;
    double tok_tput = span > 0 ? (double)out_tokens / span : 0;
    double goodput = span > 0 ? (double)good / span : 0;

    printf("serve: %u requests at %.1f req/s (%s, prompt %s, output %s, %s) -> %s:%d\n",
           b->nreqs, o->rate,
           o->endpoint == EP_HEALTH ? "GET /health" : o->endpoint == EP_CHAT ? "chat" : "completions",
           o->prompt_len.text, o->output_len.text, o->stream ? "stream" : "no stream",
           o->host, o->port);
    printf("  achieved arrival rate %.1f req/s (scheduled span %.2f s), wall %.2f s\n",
           achieved_rate, sched_span, t_end - b->t0);
    printf("  outcomes:");
    for (int k = R_OK; k < R_NKINDS; k++)
        if (kinds[k])
            printf(" %s=%u", rstate_names[k], kinds[k]);
    for (uint32_t i = 0; i < b->nreqs; i++) /* each HTTP error status once */
        if (b->reqs[i].state == R_HTTP_ERROR && http_status_first(b, i))
            printf(" [HTTP %d x%u]", b->reqs[i].http_status, http_status_count(b, i));
    printf("\n  peak in flight %u%s\n", b->inflight_peak,
           b->cap_waits ? " (--max-inflight reached: arrivals were held back, not open loop)" : "");
    stats_line("client sched lag", "ms", &s_lag);
    stats_line("TTFT", "ms", &s_ttft);
    if (o->endpoint != EP_HEALTH && o->stream) {
        stats_line("TPOT", "ms", &s_tpot);
        stats_line("inter-token latency", "ms", &s_itl);
    }
    stats_line("end-to-end latency", "ms", &s_e2e);
    printf("  throughput %.2f req/s, %.1f output tok/s; goodput %.2f req/s (%" PRIu64
           " of %u meet TTFT<=%g ms, TPOT<=%g ms; 0 = no SLO)\n",
           req_tput, tok_tput, goodput, good, b->nreqs, o->slo_ttft_ms, o->slo_tpot_ms);

    int rc = 0;
    if (o->json_path) {
        FILE *f = fopen(o->json_path, "w");
        if (!f) {
            td_error("serve: cannot write %s: %s", o->json_path, strerror(errno));
            rc = 1;
            goto free_vecs;
        }
        fprintf(f, "{\n  \"tool\": \"bench/serve\",\n  \"label\": \"%s\",\n", o->label);
        fprintf(f, "  \"config\": {\"url\": \"http://%s:%d\", \"endpoint\": \"%s\", \"model\": \"%s\", "
                   "\"rate\": %g, \"requests\": %u, \"prompt_len\": \"%s\", \"output_len\": \"%s\", "
                   "\"stream\": %s, \"seed\": %" PRIu64 ", \"slo_ttft_ms\": %g, \"slo_tpot_ms\": %g, "
                   "\"max_inflight\": %u, \"timeout_s\": %g, \"visible_first_token\": %s},\n",
                o->host, o->port,
                o->endpoint == EP_HEALTH ? "health" : o->endpoint == EP_CHAT ? "chat" : "completions",
                o->model, o->rate, b->nreqs, o->prompt_len.text, o->output_len.text,
                o->stream ? "true" : "false", o->seed, o->slo_ttft_ms, o->slo_tpot_ms,
                o->max_inflight, o->timeout, o->visible_first ? "true" : "false");
        fprintf(f, "  \"outcomes\": {");
        for (int k = R_OK; k < R_NKINDS; k++)
            fprintf(f, "%s\"%s\": %u", k == R_OK ? "" : ", ", rstate_names[k], kinds[k]);
        fprintf(f, "},\n  \"http_errors\": {");
        bool any = false;
        for (uint32_t i = 0; i < b->nreqs; i++)
            if (b->reqs[i].state == R_HTTP_ERROR && http_status_first(b, i)) {
                fprintf(f, "%s\"%d\": %u", any ? ", " : "", b->reqs[i].http_status,
                        http_status_count(b, i));
                any = true;
            }
        fprintf(f, "},\n");
        fprintf(f, "  \"achieved_rate\": %.6g,\n  \"wall_s\": %.6g,\n  \"span_s\": %.6g,\n",
                achieved_rate, t_end - b->t0, span);
        fprintf(f, "  \"peak_inflight\": %u,\n  \"max_inflight_reached\": %s,\n", b->inflight_peak,
                b->cap_waits ? "true" : "false");
        fprintf(f, "  \"request_throughput\": %.6g,\n  \"output_token_throughput\": %.6g,\n"
                   "  \"goodput\": %.6g,\n  \"good_requests\": %" PRIu64 ",\n  \"output_tokens\": %" PRIu64 ",\n",
                req_tput, tok_tput, goodput, good, out_tokens);
        fprintf(f, "  \"metrics_ms\": {\n");
        stats_json(f, "sched_lag", &s_lag, false);
        stats_json(f, "ttft", &s_ttft, false);
        stats_json(f, "tpot", &s_tpot, false);
        stats_json(f, "itl", &s_itl, false);
        stats_json(f, "e2e", &s_e2e, true);
        fprintf(f, "  },\n  \"output_tokens_per_request\": {\n");
        stats_json(f, "tokens", &s_otok, true);
        fprintf(f, "  }\n}\n");
        if (fclose(f) != 0) {
            td_error("serve: cannot write %s: %s", o->json_path, strerror(errno));
            rc = 1;
        }
    }
free_vecs:
    free(ttft.v);
    free(tpot.v);
    free(e2e.v);
    free(otoks.v);
    return rc ? rc : kinds[R_OK] == b->nreqs ? 0 : 3;
}

/* ------------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
"usage: serve --url URL [options]\n"
"  --url URL             routerd's API, e.g. http://127.0.0.1:8000 (a trailing /v1 is ignored)\n"
"  --api-key KEY | --api-key-file FILE   Bearer key (the file's first line)\n"
"  --model NAME          default tandem-synthetic\n"
"  --endpoint E          completions (default), chat, or health (GET /health: the\n"
"                        client+HTTP baseline, no model)\n"
"  --rate R              arrivals per second, Poisson (exponential gaps), default 10\n"
"  --duration S | --requests N   how many arrivals (default --requests 100)\n"
"  --prompt-len D        prompt tokens (= bytes: byte-level tokenizer), default 128\n"
"  --output-len D        max_tokens per request, default 64\n"
"                        D: N | fixed:N | uniform:A:B | normal:MEAN:STD (clipped to >= 1)\n"
"  --stream | --no-stream   default stream\n"
"  --seed N              arrivals, lengths and prompts (default 1)\n"
"  --slo-ttft-ms X --slo-tpot-ms Y   goodput SLOs (0 = none)\n"
"  --max-inflight N      safety cap on requests in flight (0 = none, default 4096);\n"
"                        reaching it holds arrivals back and is reported\n"
"  --timeout S           per request, default 60\n"
"  --json FILE           write the results as JSON\n"
"  --label TEXT          stored in the JSON\n"
"  --visible-first-token synthetic engine only (completions): greedy sampling and\n"
"                        prompts whose first output byte is not a UTF-8 lead byte,\n"
"                        so TTFT is not delayed by a held-back partial character\n"
"  --synth-key K --synth-vocab V   the cluster's synth-key/-vocab (4096, 256)\n"
"Exit status: 0 all requests ok, 3 some failed, 1 error, 2 usage.\n");
}

static int parse_url(const char *url, opts_t *o)
{
    struct evhttp_uri *u = evhttp_uri_parse(url);
    if (!u)
        return -1;
    const char *scheme = evhttp_uri_get_scheme(u), *host = evhttp_uri_get_host(u);
    int rc = -1;
    if (scheme && strcmp(scheme, "http") == 0 && host && strlen(host) < sizeof(o->host)) {
        snprintf(o->host, sizeof(o->host), "%s", host);
        o->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : 80;
        rc = 0;
    }
    evhttp_uri_free(u);
    return rc;
}

static int read_key_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "serve: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[1024] = "";
    char *got = fgets(line, sizeof(line), f);
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    if (!got || !line[0] || strlen(line) >= cap) {
        fprintf(stderr, "serve: %s: no key on its first line\n", path);
        return -1;
    }
    snprintf(out, cap, "%s", line);
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    enum { O_URL = 256, O_KEY, O_KEYFILE, O_MODEL, O_EP, O_RATE, O_DUR, O_REQS, O_PL, O_OL,
           O_STREAM, O_NOSTREAM, O_SEED, O_STTFT, O_STPOT, O_JSON, O_MAXIF, O_TMO, O_LABEL, O_VIS, O_SKEY, O_SVOCAB, O_HELP };
    static const struct option lo[] = {
        {"url", 1, 0, O_URL}, {"api-key", 1, 0, O_KEY}, {"api-key-file", 1, 0, O_KEYFILE},
        {"model", 1, 0, O_MODEL}, {"endpoint", 1, 0, O_EP}, {"rate", 1, 0, O_RATE},
        {"duration", 1, 0, O_DUR}, {"requests", 1, 0, O_REQS}, {"prompt-len", 1, 0, O_PL},
        {"output-len", 1, 0, O_OL}, {"stream", 0, 0, O_STREAM}, {"no-stream", 0, 0, O_NOSTREAM},
        {"seed", 1, 0, O_SEED}, {"slo-ttft-ms", 1, 0, O_STTFT}, {"slo-tpot-ms", 1, 0, O_STPOT},
        {"json", 1, 0, O_JSON}, {"max-inflight", 1, 0, O_MAXIF}, {"timeout", 1, 0, O_TMO},
        {"label", 1, 0, O_LABEL}, {"visible-first-token", 0, 0, O_VIS},
        {"synth-key", 1, 0, O_SKEY}, {"synth-vocab", 1, 0, O_SVOCAB},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0},
    };
    *o = (opts_t){ .rate = 10, .nrequests = 100, .stream = true, .seed = 1,
                   .max_inflight = 4096, .timeout = 60, .label = "",
                   .synth_key = 4096, .synth_vocab = 256 };
    snprintf(o->model, sizeof(o->model), "tandem-synthetic");
    dist_parse("128", &o->prompt_len);
    dist_parse("64", &o->output_len);
    bool have_url = false;
    int c;
    double v;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_URL: bad = parse_url(optarg, o); have_url = !bad; break;
        case O_KEY:
            bad = strlen(optarg) >= sizeof(o->api_key);
            if (!bad)
                snprintf(o->api_key, sizeof(o->api_key), "%s", optarg);
            break;
        case O_KEYFILE:
            if (read_key_file(optarg, o->api_key, sizeof(o->api_key)) != 0)
                return 1;
            break;
        case O_MODEL:
            bad = strlen(optarg) >= sizeof(o->model) || strpbrk(optarg, "\"\\");
            if (!bad)
                snprintf(o->model, sizeof(o->model), "%s", optarg);
            break;
        case O_EP:
            if (strcmp(optarg, "completions") == 0) o->endpoint = EP_COMPLETIONS;
            else if (strcmp(optarg, "chat") == 0) o->endpoint = EP_CHAT;
            else if (strcmp(optarg, "health") == 0) o->endpoint = EP_HEALTH;
            else bad = 1;
            break;
        case O_RATE: bad = parse_double(optarg, 1e-3, 1e6, &o->rate); break;
        case O_DUR: bad = parse_double(optarg, 1e-3, 86400, &o->duration); break;
        case O_REQS:
            bad = parse_double(optarg, 1, 1e7, &v);
            o->nrequests = (uint64_t)v;
            o->duration = 0;
            break;
        case O_PL: bad = dist_parse(optarg, &o->prompt_len); break;
        case O_OL: bad = dist_parse(optarg, &o->output_len); break;
        case O_STREAM: o->stream = true; break;
        case O_NOSTREAM: o->stream = false; break;
        case O_SEED: bad = parse_double(optarg, 0, 1e18, &v); o->seed = (uint64_t)v; break;
        case O_STTFT: bad = parse_double(optarg, 0, 1e9, &o->slo_ttft_ms); break;
        case O_STPOT: bad = parse_double(optarg, 0, 1e9, &o->slo_tpot_ms); break;
        case O_JSON: o->json_path = optarg; break;
        case O_MAXIF: bad = parse_double(optarg, 0, 1e6, &v); o->max_inflight = (uint32_t)v; break;
        case O_TMO: bad = parse_double(optarg, 1e-3, 86400, &o->timeout); break;
        case O_LABEL: bad = strpbrk(optarg, "\"\\") != NULL; o->label = optarg; break;
        case O_VIS: o->visible_first = true; break;
        case O_SKEY: bad = parse_double(optarg, 0, 1.8e19, &v); o->synth_key = (uint64_t)v; break;
        case O_SVOCAB: bad = parse_double(optarg, 256, 1e9, &v); o->synth_vocab = (uint64_t)v; break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "serve: bad value '%s' for --%s\n", optarg, lo[c - O_URL].name);
            return 2;
        }
    }
    if (optind != argc || !have_url) {
        fprintf(stderr, "serve: %s\n", have_url ? "unexpected arguments" : "--url is required");
        usage(stderr);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_t b = {0};
    int rc = parse_opts(argc, argv, &b.o);
    if (rc)
        return rc;
    td_log_set_ident("serve");
    rng = td_rng_seed(b.o.seed);

    /* The schedule: exponential gaps (Poisson process), lengths sampled
     * up front, so a seed gives the same load whatever the server does. */
    size_t cap = b.o.duration > 0 ? (size_t)(b.o.duration * b.o.rate * 1.5 + 64) : b.o.nrequests;
    b.reqs = calloc(cap, sizeof(*b.reqs));
    if (!b.reqs) {
        td_error("serve: out of memory for %zu requests", cap);
        return 1;
    }
    double t = 0;
    uint32_t max_prompt = 1;
    for (size_t i = 0; i < cap; i++) {
        if (i > 0)
            t += -log(rng_unit()) / b.o.rate;
        if (b.o.duration > 0 && t >= b.o.duration)
            break;
        req_t *r = &b.reqs[b.nreqs++];
        *r = (req_t){ .b = &b, .idx = (uint32_t)i, .sched = t, .state = R_PENDING,
                      .usage_prompt = -1, .usage_completion = -1 };
        r->prompt_len = dist_sample(&b.o.prompt_len);
        r->max_tokens = dist_sample(&b.o.output_len);
        if (r->prompt_len > max_prompt)
            max_prompt = r->prompt_len;
    }
    /* Random lower-case words: printable ASCII, one byte = one token. */
    b.prompt_pool_len = (size_t)max_prompt + 4096;
    b.prompt_pool = malloc(b.prompt_pool_len);
    if (!b.prompt_pool) {
        td_error("serve: out of memory for the prompt pool");
        rc = 1;
        goto free_reqs;
    }
    for (size_t i = 0; i < b.prompt_pool_len; i++) {
        uint64_t x = td_rng_next(&rng) % 32;
        b.prompt_pool[i] = x < 26 ? (char)('a' + x) : ' ';
    }

    struct event_config *cfg = event_config_new();
    if (cfg) /* timerfd: arrivals at µs, not epoll's ms, resolution */
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    b.base = cfg ? event_base_new_with_config(cfg) : NULL;
    if (cfg)
        event_config_free(cfg);
    b.arrive = b.base ? evtimer_new(b.base, bench_on_arrive, &b) : NULL;
    if (!b.arrive) {
        td_error("serve: cannot create the event loop");
        rc = 1;
        goto free_base;
    }
    b.t0 = td_clock_s() + 0.05;
    bench_send_due(&b);
    event_base_dispatch(b.base);
    double t_end = td_clock_s();
    rc = bench_report(&b, t_end);

free_base:
    if (b.arrive)
        event_free(b.arrive);
    for (uint32_t i = 0; i < b.nconns; i++) {
        evhttp_connection_free(b.conns_all[i]->evcon);
        free(b.conns_all[i]);
    }
    free(b.conns_all);
    if (b.base)
        event_base_free(b.base);
    free(b.prompt_pool);
free_reqs:
    free(b.reqs);
    free(b.itl.v);
    free(b.lag.v);
    return rc;
}
