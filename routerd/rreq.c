/* routerd/rreq.c — the request state machine: tokenize, choose ranks,
 * Admit / Prefill, turn Tokens into streamed text (incremental detokenizing,
 * stop strings, the V4.1 reply reader's reasoning / content / tool-call
 * deltas, SSE) or one response, and end every request exactly once:
 * done, failed or canceled, with Cancel to its ranks where they may hold it. */
#include "rreq.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "buf.h"
#include "chat_prompt.h"
#include "clock.h"
#include "daemon.h"
#include "fsm.h"
#include "http.h"
#include "log.h"
#include "rng.h"
#include "rsched.h"
#include "stop.h"

#define REQTAB_BUCKETS 4096u   /* power of two; chains stay short at thousands in flight */

struct td_rreq_s {
    td_rreq_t *hnext;               /* hash chain */
    td_rreq_t *prev, *next;         /* every request in flight */
    td_rreq_tab_t *t;
    uint64_t id;                    /* wire id of the current attempt */
    td_rreq_state_t state;          /* changed by set_state() only */
    td_openai_req_t *oreq;
    struct evhttp_request *http;    /* NULL once answered or the client is gone */
    struct evhttp_connection *evcon;
    struct event *watch;            /* EOF on the client's socket while we work */
    char oid[TD_OPENAI_ID_LEN];     /* chatcmpl-... */
    int32_t *prompt;
    size_t nprompt;
    td_rrank_t *decode, *prefill;   /* bound ranks (td_cluster_rank_bind) */
    uint64_t tried[TD_RSCHED_MAX_TRIED];   /* decode incarnations that refused */
    size_t ntried;
    unsigned attempts;
    bool too_long;                  /* a decode rank said TOO_LONG */
    bool prefill_sent;              /* this attempt's Prefill went out */
    bool streaming;                 /* 200 and the first chunk went out */
    td_tok_dec_t dec;
    td_stop_t *stop;
    td_chat_reply_reader_t *chat;   /* V4.1 chat: reads the reply (stop strings too) */
    td_openai_stream_t stream;
    td_buf_t text;                  /* non-streaming: the answer so far */
    td_buf_t piece;                 /* scratch: decoded text of one message */
    td_buf_t rel;                   /* scratch: text released by the stop matcher */
    Tandem__LogitBias *wbias;       /* [oreq->nbias] the request's logit_bias on the wire */
    Tandem__LogitBias **wbiasp;     /* [oreq->nbias] pointers to them */
    td_openai_logprobs_t *lp;       /* the logprobs not sent yet, or NULL: none asked */
    uint32_t ntokens;               /* completion tokens */
    uint64_t t_start, t_last;       /* ns, CLOCK_MONOTONIC */
    struct event *timer;            /* request timeout, or NULL */
};

struct td_rreq_tab_s {
    td_rreq_config_t cfg;
    td_rreq_t *buckets[REQTAB_BUCKETS];
    td_rreq_t *head;
    size_t n;
    uint64_t id_seq;
    struct evbuffer *chunk;         /* reused for every SSE chunk */
    td_buf_t sse;                   /* reused: one message's SSE events */
    bool stopping;                  /* shutdown: new requests are refused */
    void (*on_idle)(void *arg);     /* then: the last request in flight ended */
    void *idle_arg;
};

/* ======================================================================= */
/* The state machine                                                         */
/* ======================================================================= */

#define S(x) TD_FSM_BIT(TD_RREQ_##x)
/* Allowed transitions: a retry goes back to admitting; terminal states stay. */
static const uint32_t rreq_allowed[TD_RREQ_NSTATES] = {
    [TD_RREQ_NEW] = S(ADMITTING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_ADMITTING] = S(ADMITTING) | S(PREFILLING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_PREFILLING] = S(ADMITTING) | S(DECODING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_DECODING] = S(DONE) | S(FAILED) | S(CANCELED),
};
#undef S

static const char *const rreq_state_names[TD_RREQ_NSTATES] = {
    "new", "admitting", "prefilling", "decoding", "done", "failed", "canceled",
};

static const td_fsm_t rreq_fsm = {
    .what = "request",
    .names = rreq_state_names,
    .allowed = rreq_allowed,
    .nstates = TD_RREQ_NSTATES,
};

const char *
td_rreq_state_str(td_rreq_state_t st)
{
    return td_fsm_name(&rreq_fsm, st);
}

/* The one place a request changes state: an illegal transition is a bug
 * and aborts (common/fsm.h); what peers and clients send is checked
 * against the state before it gets here. */
static void
set_state(td_rreq_t *q, td_rreq_state_t st, const char *why)
{
    q->state = (td_rreq_state_t)td_fsm_step(&rreq_fsm, q->id, q->state, st, why);
}

static bool
is_terminal(td_rreq_state_t st)
{
    return st >= TD_RREQ_DONE;
}

static uint64_t
now_ns(void)
{
    return td_clock_ns();
}

/* ======================================================================= */
/* The table                                                                 */
/* ======================================================================= */

static size_t
bucket_of(uint64_t id)
{
    return (size_t)(td_rng_mix64(id) & (REQTAB_BUCKETS - 1));
}

static td_rreq_t *
req_find(td_rreq_tab_t *t, uint64_t id)
{
    for (td_rreq_t *q = t->buckets[bucket_of(id)]; q; q = q->hnext)
        if (q->id == id)
            return q;
    return NULL;
}

static void
hash_del(td_rreq_tab_t *t, td_rreq_t *q)
{
    for (td_rreq_t **p = &t->buckets[bucket_of(q->id)]; *p; p = &(*p)->hnext)
        if (*p == q) {
            *p = q->hnext;
            return;
        }
}

static void
hash_add(td_rreq_tab_t *t, td_rreq_t *q)
{
    size_t b = bucket_of(q->id);

    q->hnext = t->buckets[b];
    t->buckets[b] = q;
}

/* A fresh router-unique id: router id in the top 16 bits. */
static uint64_t
id_next(td_rreq_tab_t *t)
{
    t->id_seq = (t->id_seq + 1) & 0xffffffffffffull;
    return t->cfg.id_prefix | t->id_seq;
}

/* ======================================================================= */
/* Ranks                                                                     */
/* ======================================================================= */

static void
bind_rank(td_rreq_t *q, td_rrank_t **slot, td_rrank_t *rk)
{
    *slot = rk;
    td_cluster_rank_bind(q->t->cfg.cluster, rk);
}

static void
unbind_rank(td_rreq_t *q, td_rrank_t **slot)
{
    td_rrank_t *rk = *slot;

    if (!rk)
        return;
    *slot = NULL;
    td_cluster_rank_release(q->t->cfg.cluster, rk);
}

static void
send_cancel(td_rreq_t *q, td_rrank_t *rk, const char *reason)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    if (!rk || !rk->conn)
        return;
    c.req_id = q->id;
    c.reason = (char *)reason;
    /* no Prefill went out for this attempt: no prefill rank knows the
     * decode rank's blocks, which it may free at once */
    c.prefill_not_sent = !q->prefill_sent && rk == q->decode;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CANCEL;
    env.cancel = &c;
    (void)td_rrank_send(rk, &env);
}

/* Cancel the current attempt at its ranks and let go of them. */
static void
release_ranks(td_rreq_t *q, const char *cancel_reason)
{
    if (cancel_reason) {
        send_cancel(q, q->decode, cancel_reason);
        send_cancel(q, q->prefill, cancel_reason);
    }
    unbind_rank(q, &q->decode);
    unbind_rank(q, &q->prefill);
}

/* The request's Sampling: the API's parameters, the model's stop ids,
 * logit_bias and logprobs (pointers into q and the table's config). */
static void
sampling_fill(Tandem__Sampling *s, const td_rreq_t *q)
{
    tandem__sampling__init(s);
    s->temperature = q->oreq->temperature;
    s->top_p = q->oreq->top_p;
    s->seed = (uint64_t)q->oreq->seed;
    s->max_tokens = q->oreq->max_tokens;
    s->n_stop_tokens = q->t->cfg.nstop_ids;
    s->stop_tokens = (int32_t *)q->t->cfg.stop_ids;
    s->n_logit_bias = q->oreq->nbias;
    s->logit_bias = q->wbiasp;
    s->logprobs = q->oreq->logprobs;
    s->top_logprobs = q->oreq->top_logprobs;
}

/* ======================================================================= */
/* Answers                                                                   */
/* ======================================================================= */

static void rreq_refuse_stopping(td_rreq_tab_t *t, struct evhttp_request *hreq);

static void
http_detach(td_rreq_t *q)
{
    if (q->watch)
        event_free(q->watch);
    q->watch = NULL;
    if (q->evcon)
        evhttp_connection_set_closecb(q->evcon, NULL, NULL);
    q->evcon = NULL;
    q->http = NULL;
}

/* Send the SSE events in the table's sse buffer as one chunk; the buffer is
 * empty (and any failure forgotten) afterwards. */
static void
stream_flush(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;

    if (t->sse.len > 0 && q->http && td_buf_status(&t->sse) == TD_OK) {
        evbuffer_add(t->chunk, t->sse.data, t->sse.len);
        evhttp_send_reply_chunk(q->http, t->chunk);
        evbuffer_drain(t->chunk, evbuffer_get_length(t->chunk));
    }
    td_buf_reset(&t->sse);
}

static void
stream_start(td_rreq_t *q)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(q->http);

    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Request-Id", q->oid);
    evhttp_send_reply_start(q->http, 200, "OK");
    q->streaming = true;
    if (td_openai_stream_text(&q->stream, "", 0, &q->t->sse) == TD_OK)
        stream_flush(q);
}

static void
request_free(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;

    hash_del(t, q);
    if (q->prev)
        q->prev->next = q->next;
    else
        t->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    t->n--;
    http_detach(q);
    if (q->timer)
        event_free(q->timer);
    release_ranks(q, NULL);
    td_stop_destroy(q->stop);
    td_chat_reply_reader_destroy(q->chat);
    td_buf_free(&q->text);
    td_buf_free(&q->piece);
    td_buf_free(&q->rel);
    free(q->wbias);
    free(q->wbiasp);
    td_openai_logprobs_destroy(q->lp);
    free(q->prompt);
    td_openai_req_destroy(q->oreq);
    free(q);
    if (t->n == 0 && t->on_idle)
        t->on_idle(t->idle_arg);
}

static void
count_outcome(td_rreq_t *q, td_outcome_t o)
{
    q->t->cfg.metrics->requests[o]++;
}

/* Answer the client (if still there) with e: a response, or an error event
 * when the stream has started. Events of this message not yet sent are
 * dropped: they would stop short of what failed. */
static void
answer_error(td_rreq_t *q, const td_openai_err_t *e)
{
    struct evhttp_request *h = q->http;

    if (!h)
        return;
    if (q->streaming) {
        td_buf_reset(&q->t->sse);
        if (td_openai_stream_error(e, &q->t->sse) == TD_OK)
            stream_flush(q);
        td_buf_reset(&q->t->sse);   /* when it failed */
        http_detach(q);
        evhttp_send_reply_end(h);
    } else {
        http_detach(q);
        td_http_reply_err(h, e);
    }
}

/* End q with an error: Cancel to its ranks, the error to the client. The
 * one log line of the failure is this one. */
static void
request_fail(td_rreq_t *q, td_errreason_t why, const td_openai_err_t *e)
{
    td_info("request %016" PRIx64 ": failed (%s): %s", q->id, td_metrics_errreason_str(why),
            e->message);
    q->t->cfg.metrics->errors[why]++;
    count_outcome(q, q->state == TD_RREQ_NEW ? TD_OUTCOME_REJECTED : TD_OUTCOME_FAILED);
    set_state(q, TD_RREQ_FAILED, td_metrics_errreason_str(why));
    release_ranks(q, "request failed");
    answer_error(q, e);
    request_free(q);
}

static void
request_fail_simple(td_rreq_t *q, td_errreason_t why, const char *what)
{
    td_openai_err_t e;

    td_openai_err_set(&e, why == TD_ERRREASON_TIMEOUT ? 504 : 500, "server_error", NULL, NULL,
                      "The server had an error while processing your request: %s.", what);
    request_fail(q, why, &e);
}

/* Canceled: by the operator (the client still gets an error) or because the
 * client went away. */
static void
request_cancel(td_rreq_t *q, const char *why)
{
    td_openai_err_t e;

    td_info("request %016" PRIx64 ": canceled: %s", q->id, why);
    count_outcome(q, TD_OUTCOME_CANCELED);
    set_state(q, TD_RREQ_CANCELED, why);
    release_ranks(q, why);
    td_openai_err_set(&e, 500, "server_error", NULL, "canceled",
                      "The request was canceled: %s.", why);
    answer_error(q, &e);
    request_free(q);
}

/* Stream the V4.1 reply reader's deltas (non-streaming requests take the
 * whole reply from the reader at the end). */
static td_status_t
chat_emit(td_rreq_t *q, const td_chat_reply_delta_t *d, size_t n)
{
    td_buf_t *sse = &q->t->sse;
    td_status_t st = TD_OK;

    for (size_t i = 0; i < n && st == TD_OK && q->streaming; i++) {
        json_t *delta = NULL;
        switch (d[i].kind) {
        case TD_CHAT_REPLY_DELTA_CONTENT:
            st = td_openai_stream_text(&q->stream, d[i].text, d[i].len, sse);
            continue;
        case TD_CHAT_REPLY_DELTA_REASONING:
            delta = json_pack("{s:s%}", "reasoning_content", d[i].text, d[i].len);
            break;
        case TD_CHAT_REPLY_DELTA_TOOL_CALL:
            delta = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index",
                              (int)d[i].index, "id", d[i].id, "type", "function", "function",
                              "name", d[i].name, "arguments", "");
            break;
        case TD_CHAT_REPLY_DELTA_TOOL_ARGS:
            delta = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", (int)d[i].index,
                              "function", "arguments", d[i].text, d[i].len);
            break;
        }
        st = delta ? td_openai_stream_delta(&q->stream, delta, sse) : TD_ERR_NOMEM;
    }
    return st;
}

/* Text released for the client: through the V4.1 reply reader, or as is. */
static td_status_t
emit_text(td_rreq_t *q, const char *text, size_t len)
{
    if (q->chat) {
        const td_chat_reply_delta_t *d;
        size_t n;
        td_status_t st = td_chat_reply_reader_feed(q->chat, text, len, &d, &n);
        return st == TD_OK ? chat_emit(q, d, n) : st;
    }
    if (q->streaming)
        return td_openai_stream_text(&q->stream, text, len, &q->t->sse);
    return td_buf_append(&q->text, text, len);
}

static td_openai_finish_t
finish_of(Tandem__Finish f)
{
    return f == TANDEM__FINISH__FINISH_LENGTH ? TD_OPENAI_FINISH_LENGTH : TD_OPENAI_FINISH_STOP;
}

/* Generation ended (stop, length, or a stop string: then by_us, and the
 * ranks get a Cancel because they may still be generating). The answer is
 * formatted first: a reply that cannot be finished fails the request. */
static void
request_done(td_rreq_t *q, td_openai_finish_t finish, bool by_us)
{
    td_rreq_tab_t *t = q->t;
    td_openai_usage_t usage = { (uint32_t)q->nprompt, q->ntokens };
    td_buf_t body = {0};
    struct evhttp_request *h;
    td_status_t st;

    td_buf_reset(&q->rel);
    st = td_tok_decode_flush(&q->dec, &q->piece);
    if (st == TD_OK && !by_us) {
        bool matched = false;
        st = td_stop_feed(q->stop, q->piece.data ? q->piece.data : "", q->piece.len, &q->rel,
                          &matched);
        if (st == TD_OK && !matched)
            st = td_stop_flush(q->stop, &q->rel);
    }
    td_buf_reset(&q->piece);
    if (st == TD_OK && q->rel.len)
        st = emit_text(q, q->rel.data, q->rel.len);
    if (st == TD_OK && q->chat) {
        /* the reader releases what it held back and decides the finish reason */
        const td_chat_reply_delta_t *d;
        size_t n;
        st = td_chat_reply_reader_finish(q->chat, finish == TD_OPENAI_FINISH_LENGTH
                                                      ? TD_CHAT_REPLY_FINISH_LENGTH
                                                      : TD_CHAT_REPLY_FINISH_STOP,
                                         &d, &n);
        if (st == TD_OK)
            st = chat_emit(q, d, n);
        if (st == TD_OK) {
            td_chat_reply_finish_t f = td_chat_reply_reader_reply(q->chat)->finish;
            finish = f == TD_CHAT_REPLY_FINISH_TOOL_CALLS ? TD_OPENAI_FINISH_TOOL_CALLS
                   : f == TD_CHAT_REPLY_FINISH_LENGTH     ? TD_OPENAI_FINISH_LENGTH
                                                          : TD_OPENAI_FINISH_STOP;
        }
    }
    if (st == TD_OK && q->http && q->streaming) {
        st = td_openai_stream_finish(&q->stream, finish, &usage, &t->sse);
    } else if (st == TD_OK && q->http && q->chat) {
        json_t *msg = NULL;
        st = td_chat_reply_json(td_chat_reply_reader_reply(q->chat), &msg);
        if (st == TD_OK)
            st = td_openai_response_message_json(&q->stream.meta, msg, finish, &usage, &body);
    } else if (st == TD_OK && q->http) {
        st = td_openai_response_json(&q->stream.meta, q->text.data ? q->text.data : "",
                                     q->text.len, finish, &usage, &body);
    }
    if (st != TD_OK) {
        td_buf_free(&body);
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "could not finish the reply");
        return;
    }
    set_state(q, TD_RREQ_DONE, by_us ? "finished by the router" : "finished by the rank");
    count_outcome(q, TD_OUTCOME_DONE);
    release_ranks(q, by_us ? "finished by the router" : NULL);
    h = q->http;
    if (h && q->streaming) {
        stream_flush(q);
        http_detach(q);
        evhttp_send_reply_end(h);
    } else if (h) {
        http_detach(q);
        evhttp_add_header(evhttp_request_get_output_headers(h), "X-Request-Id", q->oid);
        td_http_reply(h, 200, "application/json", body.data, body.len);
    }
    td_buf_free(&body);
    td_debug("request %016" PRIx64 ": done, %u prompt + %u completion tokens", q->id,
             usage.prompt_tokens, usage.completion_tokens);
    request_free(q);
}

/* ======================================================================= */
/* Admission                                                                 */
/* ======================================================================= */

/* Choose a prefill and a decode rank and send Admit; on no capacity the
 * request ends (503, or 400 when no rank has a context that long). */
static void
admit_next(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;
    unsigned retry_after = t->cfg.retry_after_s;
    uint64_t need = q->nprompt + q->oreq->max_tokens;

    for (;;) {
        td_rrank_t *p, *d;
        bool too_long = false;

        if (q->attempts >= t->cfg.max_attempts || q->ntried >= TD_RSCHED_MAX_TRIED) {
            td_openai_err_t e;
            td_openai_err_overloaded(&e, retry_after);
            request_fail(q, TD_ERRREASON_NO_CAPACITY, &e);
            return;
        }
        p = td_rsched_pick_prefill(t->cfg.cluster->ranks);
        d = p ? td_rsched_pick_decode(t->cfg.cluster->ranks, need, q->tried, q->ntried,
                                     &too_long)
              : NULL;
        if (!d) {
            td_openai_err_t e;
            if (too_long || (q->too_long && p)) {
                td_openai_err_set(&e, 400, "invalid_request_error", "messages",
                                  "context_length_exceeded",
                                  "This model's maximum context length is exceeded: the prompt "
                                  "has %zu tokens and max_tokens is %u.",
                                  q->nprompt, q->oreq->max_tokens);
                request_fail(q, TD_ERRREASON_TOO_LONG, &e);
            } else {
                td_openai_err_overloaded(&e, retry_after);
                if (!p) {   /* the cause is no prefill rank, not decode capacity */
                    td_openai_err_set(&e, 503, "server_error", NULL, NULL,
                                      "The server is overloaded (no prefill rank up); retry "
                                      "after %u s.", retry_after);
                    e.retry_after = retry_after;
                }
                request_fail(q, TD_ERRREASON_NO_CAPACITY, &e);
            }
            return;
        }
        if (q->attempts > 0) {   /* a new wire id: the old one may live on at a rank */
            hash_del(t, q);
            q->id = id_next(t);
            hash_add(t, q);
            t->cfg.metrics->retries++;
        }
        q->attempts++;
        q->prefill_sent = false;
        bind_rank(q, &q->decode, d);
        bind_rank(q, &q->prefill, p);

        Tandem__Admit a = TANDEM__ADMIT__INIT;
        Tandem__Sampling s;
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        sampling_fill(&s, q);
        a.req_id = q->id;
        a.n_tokens = q->nprompt;
        a.tokens = q->prompt;
        a.sampling = &s;
        a.prefill_node = p->node->name;
        a.prefill_rank = p->rank_id;
        a.prefill_incarnation = p->incarnation;
        a.prefill_deadline_ms = p->reg ? p->reg->xfer_deadline_ms : 0;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT;
        env.admit = &a;
        if (td_rrank_send(d, &env) == TD_OK) {
            d->pend_tokens += need;
            d->pend_reqs++;
            set_state(q, TD_RREQ_ADMITTING, "admit sent");
            return;
        }
        q->tried[q->ntried++] = d->incarnation;   /* td_rrank_send logged why */
        release_ranks(q, NULL);
    }
}

/* The current attempt is lost before any token reached the client: try
 * again on other ranks (new Admit, new id), or fail. A decoding request has
 * streamed (or may have) and is never retried. what is the one log line of
 * the loss. */
static void
retry_or_fail(td_rreq_t *q, td_errreason_t why, const char *what)
{
    if (q->state != TD_RREQ_DECODING && q->ntokens == 0 &&
        q->attempts < q->t->cfg.max_attempts) {
        td_info("request %016" PRIx64 ": %s; retrying", q->id, what);
        release_ranks(q, what);
        if (q->state != TD_RREQ_ADMITTING)
            set_state(q, TD_RREQ_ADMITTING, "retry");
        admit_next(q);
        return;
    }
    request_fail_simple(q, why, what);
}

/* ======================================================================= */
/* Messages from the ranks                                                   */
/* ======================================================================= */

/* The handlers below run only for a message that fits the request's state
 * and comes from the rank the request is bound to for it (rreq_msgs[]). */

static void
on_admit_ok(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__AdmitOk *ok = env->admit_ok;
    Tandem__Prefill pf = TANDEM__PREFILL__INIT;
    Tandem__Sampling s;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;

    if (!ok->dest) {
        retry_or_fail(q, TD_ERRREASON_RANK_LOST, "admit without a kv destination");
        return;
    }
    sampling_fill(&s, q);
    pf.req_id = q->id;
    pf.n_tokens = q->nprompt;
    pf.tokens = q->prompt;
    pf.dest = ok->dest;
    pf.sampling = &s;
    out.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL;
    out.prefill = &pf;
    /* bound since admit_next; let go of only when the attempt ends */
    if (td_rrank_send(q->prefill, &out) != TD_OK) {
        retry_or_fail(q, TD_ERRREASON_RANK_LOST, "prefill rank unreachable");
        return;
    }
    q->prefill_sent = true;
    q->prefill->pend_tokens += q->nprompt;
    q->prefill->pend_reqs++;
    set_state(q, TD_RREQ_PREFILLING, "prefill sent");
    if (q->oreq->stream && q->http && !q->streaming)
        stream_start(q);
}

static void
on_admit_reject(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__AdmitReject *rej = env->admit_reject;

    td_info("request %016" PRIx64 ": %s rank %s/%u: admit rejected (%d): %s", q->id,
            td_hello_role_str(rk->role), rk->node->name, rk->rank_id, (int)rej->code,
            rej->reason);
    if (rej->code == TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_TOO_LONG)
        q->too_long = true;
    q->tried[q->ntried++] = rk->incarnation;
    release_ranks(q, NULL);
    admit_next(q);
}

static void
on_prefill_done(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__PrefillDone *pd = env->prefill_done;
    td_rreq_tab_t *t = q->t;
    char what[300];

    if (pd->status == TD_OK) {
        t->cfg.metrics->kv_bytes_moved +=
            (uint64_t)(t->cfg.kv_bytes_per_token * (double)q->nprompt) + t->cfg.kv_fixed_bytes;
        unbind_rank(q, &q->prefill);   /* P holds nothing of it any more */
        return;
    }
    snprintf(what, sizeof what, "prefill failed at %s/%u: %s (%s)", rk->node->name, rk->rank_id,
             pd->reason, td_status_str((td_status_t)pd->status));
    if (q->state == TD_RREQ_PREFILLING) {
        retry_or_fail(q, TD_ERRREASON_PREFILL_FAILED, what);
    } else {   /* decoding already: D has the KV; the failure came late */
        td_info("request %016" PRIx64 ": %s; decoding goes on", q->id, what);
        unbind_rank(q, &q->prefill);
    }
}

/* The text of n generated ids (each inside the vocabulary: on_tokens
 * checked them). */
static void
tokens_text(td_rreq_t *q, const int32_t *ids, size_t n, td_status_t *st)
{
    const td_tok_t *tok = q->t->cfg.tok;
    uint32_t buf[64];

    for (size_t i = 0; i < n && *st == TD_OK;) {
        size_t k = 0;
        for (; k < 64 && i < n; k++, i++)
            buf[k] = (uint32_t)ids[i];
        *st = td_tok_decode(tok, &q->dec, buf, k, &q->piece);
    }
}

/* Why a Tokens message cannot be applied (NULL: it can): every id inside
 * the tokenizer's vocabulary; when logprobs were asked, one entry per token,
 * naming that token, its alternatives inside the vocabulary too. */
static const char *
tokens_check(const td_rreq_t *q, const Tandem__Tokens *tk, char *why, size_t whylen)
{
    uint32_t vocab = q->t->cfg.tok->vocab_size;

    for (size_t i = 0; i < tk->n_tokens; i++)
        if (tk->tokens[i] < 0 || (uint32_t)tk->tokens[i] >= vocab) {
            snprintf(why, whylen, "token %d outside the vocabulary of %u", tk->tokens[i],
                     vocab);
            return why;
        }
    if (!q->lp)
        return NULL;
    if (tk->n_logprobs != tk->n_tokens) {
        snprintf(why, whylen, "%zu log-probabilities for %zu tokens", tk->n_logprobs,
                 tk->n_tokens);
        return why;
    }
    for (size_t i = 0; i < tk->n_logprobs; i++) {
        const Tandem__TokenLogprob *lp = tk->logprobs[i];
        if (lp->token != tk->tokens[i] || lp->n_top > q->oreq->top_logprobs) {
            snprintf(why, whylen, "log-probability %zu: token %d for %d, %zu alternatives", i,
                     lp->token, tk->tokens[i], lp->n_top);
            return why;
        }
        for (size_t j = 0; j < lp->n_top; j++)
            if (lp->top[j]->token < 0 || (uint32_t)lp->top[j]->token >= vocab) {
                snprintf(why, whylen, "alternative token %d outside the vocabulary of %u",
                         lp->top[j]->token, vocab);
                return why;
            }
    }
    return NULL;
}

/* The log-probabilities of the first n tokens of tk, for the next chunk. */
static td_status_t
tokens_logprobs(td_rreq_t *q, const Tandem__Tokens *tk, size_t n)
{
    const td_tok_t *tok = q->t->cfg.tok;
    td_openai_token_lp_t t, top[TD_OPENAI_MAX_TOP_LOGPROBS];
    td_status_t st = TD_OK;

    for (size_t i = 0; i < n && st == TD_OK; i++) {
        const Tandem__TokenLogprob *lp = tk->logprobs[i];
        size_t k = 0;

        t.logprob = lp->logprob;
        st = td_tok_spell(tok, (uint32_t)lp->token, &t.text, &t.len);
        for (; st == TD_OK && k < lp->n_top; k++) {
            top[k].logprob = lp->top[k]->logprob;
            st = td_tok_spell(tok, (uint32_t)lp->top[k]->token, &top[k].text, &top[k].len);
        }
        if (st == TD_OK)
            st = td_openai_logprobs_add(q->lp, &t, top, k);
    }
    return st;
}

static void
on_tokens(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__Tokens *tk = env->tokens;
    td_metrics_t *m = q->t->cfg.metrics;
    td_status_t st = TD_OK;
    bool matched = false;
    size_t n = tk->n_tokens;
    uint64_t now = now_ns();
    char why[160];

    if (tk->finish == TANDEM__FINISH__FINISH_ERROR ||
        tk->finish == TANDEM__FINISH__FINISH_CANCELED) {
        char what[300];
        snprintf(what, sizeof what, "decode rank %s/%u: %s", rk->node->name, rk->rank_id,
                 tk->error[0] ? tk->error : "canceled by the rank");
        unbind_rank(q, &q->decode);   /* D ended it: no Cancel needed there */
        if (q->state == TD_RREQ_PREFILLING)
            retry_or_fail(q, TD_ERRREASON_DECODE_FAILED, what);
        else
            request_fail_simple(q, TD_ERRREASON_DECODE_FAILED, what);
        return;
    }
    if (tokens_check(q, tk, why, sizeof why) != NULL) {   /* a protocol error */
        char what[300];
        snprintf(what, sizeof what, "decode rank %s/%u sent a bad Tokens message: %s",
                 rk->node->name, rk->rank_id, why);
        request_fail_simple(q, TD_ERRREASON_DECODE_FAILED, what);
        return;
    }
    if (q->state == TD_RREQ_PREFILLING) {
        set_state(q, TD_RREQ_DECODING, "first tokens");
        td_metrics_observe(&m->ttft, (double)(now - q->t_start) / 1e9);
    } else {
        td_metrics_observe(&m->itl, (double)(now - q->t_last) / 1e9);
    }
    q->t_last = now;
    if (q->ntokens + n > q->oreq->max_tokens)   /* never more than asked for */
        n = q->oreq->max_tokens - q->ntokens;
    q->ntokens += (uint32_t)n;
    m->completion_tokens += n;
    td_buf_reset(&q->piece);
    td_buf_reset(&q->rel);
    if (q->lp)
        st = tokens_logprobs(q, tk, n);   /* they go out with the next chunk */
    tokens_text(q, tk->tokens, n, &st);
    if (st == TD_OK && q->piece.len)
        st = td_stop_feed(q->stop, q->piece.data, q->piece.len, &q->rel, &matched);
    td_buf_reset(&q->piece);
    if (st == TD_OK && q->rel.len) {
        st = emit_text(q, q->rel.data, q->rel.len);
        td_buf_reset(&q->rel);
    }
    if (st == TD_OK && q->chat && td_chat_reply_reader_stopped(q->chat))
        matched = true;
    if (st != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "could not decode the tokens");
        return;
    }
    if (q->streaming)
        stream_flush(q);
    if (matched)
        request_done(q, TD_OPENAI_FINISH_STOP, true);
    else if (tk->finish != TANDEM__FINISH__FINISH_NONE)
        request_done(q, finish_of(tk->finish), false);
    else if (q->ntokens >= q->oreq->max_tokens)
        request_done(q, TD_OPENAI_FINISH_LENGTH, true);
}

#define FITS(x) TD_FSM_BIT(TD_RREQ_##x)
/* Which message fits which states, and which of the request's ranks sends
 * it: anything else is a peer's mistake (or a late message of an attempt
 * that has moved on) and is ignored, never applied. */
static const struct {
    Tandem__Envelope__PayloadCase payload;
    const char *name;
    uint32_t states;    /* TD_FSM_BIT of each state it fits */
    bool from_decode;   /* sent by the request's decode rank, else its prefill rank */
    void (*fn)(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env);
} rreq_msgs[] = {
    { TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, "AdmitOk", FITS(ADMITTING), true, on_admit_ok },
    { TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, "AdmitReject", FITS(ADMITTING), true,
      on_admit_reject },
    { TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE, "PrefillDone", FITS(PREFILLING) | FITS(DECODING),
      false, on_prefill_done },
    { TANDEM__ENVELOPE__PAYLOAD_TOKENS, "Tokens", FITS(PREFILLING) | FITS(DECODING), true,
      on_tokens },
};
#undef FITS

static uint64_t
message_req_id(const Tandem__Envelope *env)
{
    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK:     return env->admit_ok->req_id;
    case TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT: return env->admit_reject->req_id;
    case TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE: return env->prefill_done->req_id;
    case TANDEM__ENVELOPE__PAYLOAD_TOKENS:       return env->tokens->req_id;
    default:                                     return 0;
    }
}

void
td_rreq_on_message(td_rreq_tab_t *t, td_rrank_t *rk, const Tandem__Envelope *env)
{
    uint64_t id = message_req_id(env);
    td_rreq_t *q;

    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_RELEASED) {
        td_debug("%s: request %016" PRIx64 ": blocks released", td_ctl_conn_name(rk->conn),
                 env->released->req_id);
        return;
    }
    for (size_t i = 0; i < sizeof rreq_msgs / sizeof rreq_msgs[0]; i++) {
        if (rreq_msgs[i].payload != env->payload_case)
            continue;
        q = req_find(t, id);
        if (!q) {   /* ended already (canceled, failed, retried under a new id) */
            td_debug("%s: %s for request %016" PRIx64 ", not in flight: ignored",
                     td_ctl_conn_name(rk->conn), rreq_msgs[i].name, id);
            return;
        }
        if (!(rreq_msgs[i].states & TD_FSM_BIT(q->state))) {
            td_warn("%s: %s for request %016" PRIx64 ", which is %s: does not fit; ignored",
                    td_ctl_conn_name(rk->conn), rreq_msgs[i].name, id,
                    td_rreq_state_str(q->state));
            return;
        }
        if (rk != (rreq_msgs[i].from_decode ? q->decode : q->prefill)) {
            td_warn("%s: %s for request %016" PRIx64 ": not its %s rank; ignored",
                    td_ctl_conn_name(rk->conn), rreq_msgs[i].name, id,
                    rreq_msgs[i].from_decode ? "decode" : "prefill");
            return;
        }
        rreq_msgs[i].fn(q, rk, env);
        return;
    }
}

void
td_rreq_on_rank_lost(td_rreq_tab_t *t, td_rrank_t *rk)
{
    td_rreq_t *q = t->head;

    while (q) {
        td_rreq_t *next = q->next;   /* q may end here; later ones stay */
        char what[200];

        if (q->decode == rk) {
            snprintf(what, sizeof what, "decode rank %s/%u lost", rk->node->name, rk->rank_id);
            unbind_rank(q, &q->decode);
            if (q->state == TD_RREQ_DECODING)
                request_fail_simple(q, TD_ERRREASON_RANK_LOST, what);
            else
                retry_or_fail(q, TD_ERRREASON_RANK_LOST, what);
        } else if (q->prefill == rk) {
            snprintf(what, sizeof what, "prefill rank %s/%u lost", rk->node->name, rk->rank_id);
            unbind_rank(q, &q->prefill);
            if (q->state == TD_RREQ_ADMITTING || q->state == TD_RREQ_PREFILLING)
                retry_or_fail(q, TD_ERRREASON_RANK_LOST, what);
        }
        q = next;
    }
}

/* ======================================================================= */
/* Serving                                                                   */
/* ======================================================================= */

static void
on_client_closed(struct evhttp_connection *evcon, void *arg)
{
    td_rreq_t *q = arg;
    struct evhttp_request *h = q->http;

    q->evcon = NULL;
    q->http = NULL;
    /* A request libevent detached from its dying connection is ours to free. */
    if (h && !evhttp_request_get_connection(h))
        evhttp_request_free(h);
    request_cancel(q, "client disconnected");
}

/* evhttp reads nothing while a request is being answered, so a client that
 * goes away is seen only when a write fails. We watch the socket ourselves:
 * EOF or an error ends the request and the connection; pipelined bytes are
 * left to evhttp (and the watch stops). */
static void
on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    td_rreq_t *q = arg;
    struct evhttp_connection *evcon = q->evcon;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

    if (n > 0) {
        event_del(q->watch);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    http_detach(q);
    request_cancel(q, "client disconnected");
    evhttp_connection_free(evcon);
}

static void
on_timeout(evutil_socket_t fd, short what, void *arg)
{
    request_fail_simple(arg, TD_ERRREASON_TIMEOUT, "the request timed out");
}

/* The prompt text of the stand-in (no V4.1 tokenizer): chat messages joined
 * as "<role>: <content>\n" followed by "assistant: ". */
static td_status_t
prompt_text(const td_openai_req_t *o, td_buf_t *out)
{
    td_status_t st = TD_OK;

    if (o->kind == TD_OPENAI_COMPLETION)
        return td_buf_append(out, o->prompt, strlen(o->prompt));
    for (size_t i = 0; st == TD_OK && i < o->nmsgs; i++) {
        const char *role = td_openai_role_str(o->msgs[i].role);
        st = td_buf_append(out, role, strlen(role));
        if (st == TD_OK)
            st = td_buf_append(out, ": ", 2);
        if (st == TD_OK)
            st = td_buf_append(out, o->msgs[i].content, strlen(o->msgs[i].content));
        if (st == TD_OK)
            st = td_buf_append(out, "\n", 1);
    }
    if (st == TD_OK)
        st = td_buf_append(out, "assistant: ", 11);
    return st;
}

/* With the V4.1 tokenizer, a chat request is rendered in the V4.1 chat
 * format and its reply read back by td_chat_reply_reader; a request the format
 * cannot express gets e (400). */
static td_status_t
chat_prompt_tokens(td_rreq_t *q, td_openai_err_t *e)
{
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t ce;
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st;

    memset(&ce, 0, sizeof ce);
    st = td_chat_prompt_encode(q->oreq->body, NULL, &p, &ce);
    if (st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED) {
        td_openai_err_set(e, 400, "invalid_request_error", ce.param[0] ? ce.param : NULL,
                          ce.code, "%s", ce.message);
        return st;
    }
    if (st == TD_OK)
        st = td_chat_prompt_ids(p, q->t->cfg.v41, &ids, &n);
    if (st == TD_OK)
        st = td_chat_reply_reader_create(&p->reply, &q->chat);
    td_chat_prompt_destroy(p);
    if (st != TD_OK) {
        free(ids);
        td_openai_err_internal(e, "could not encode the chat prompt");
        return st;
    }
    q->prompt = (int32_t *)ids;   /* ids < vocab_size <= INT32_MAX: same bits */
    q->nprompt = n;
    return TD_OK;
}

static td_status_t
prompt_tokens(td_rreq_t *q, td_openai_err_t *e)
{
    td_buf_t text = {0};
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st;

    if (q->t->cfg.v41 && q->oreq->kind == TD_OPENAI_CHAT)
        return chat_prompt_tokens(q, e);
    st = prompt_text(q->oreq, &text);
    if (st == TD_OK)
        st = td_tok_encode(q->t->cfg.tok, text.data ? text.data : "", text.len, &ids, &n);
    td_buf_free(&text);
    if (st != TD_OK) {
        td_openai_err_internal(e, "could not tokenize the prompt");
        return st;
    }
    q->prompt = (int32_t *)ids;   /* ids < vocab_size <= INT32_MAX: same bits */
    q->nprompt = n;
    return TD_OK;
}

void
td_rreq_serve(td_rreq_tab_t *t, struct evhttp_request *hreq, td_openai_kind_t kind)
{
    td_openai_err_t e;
    td_openai_req_t *oreq;
    size_t len;
    const char *body = td_http_body(hreq, &len);
    td_rreq_t *q;

    if (t->stopping) {
        rreq_refuse_stopping(t, hreq);
        return;
    }
    if (td_openai_req_parse(t->cfg.api, kind, body, len, &oreq, &e) != TD_OK) {
        td_http_refuse(t->cfg.metrics, hreq, &e);
        return;
    }
    q = calloc(1, sizeof *q);
    if (!q) {
        td_openai_req_destroy(oreq);
        td_openai_err_internal(&e, "out of memory");
        td_http_refuse(t->cfg.metrics, hreq, &e);
        return;
    }
    q->t = t;
    q->oreq = oreq;
    q->http = hreq;
    q->id = id_next(t);
    q->t_start = now_ns();
    q->t_last = q->t_start;
    if (!oreq->has_seed)
        oreq->seed = (int64_t)td_daemon_random64();
    hash_add(t, q);
    q->next = t->head;
    if (t->head)
        t->head->prev = q;
    t->head = q;
    t->n++;

    if (td_openai_id_new(oreq->kind, q->oid) != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "no randomness for the request id");
        return;
    }
    if (prompt_tokens(q, &e) != TD_OK) {
        request_fail(q, e.http == 400 ? TD_ERRREASON_BAD_REQUEST : TD_ERRREASON_INTERNAL, &e);
        return;
    }
    /* V4.1 chat: the reply reader matches stop strings (in content only) */
    if (td_stop_create((const char *const *)oreq->stop, q->chat ? 0 : oreq->nstop, &q->stop) !=
        TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    if (q->nprompt == 0) {
        td_openai_err_set(&e, 400, "invalid_request_error", "prompt", "invalid_value",
                          "The prompt is empty.");
        request_fail(q, TD_ERRREASON_BAD_REQUEST, &e);
        return;
    }
    if (oreq->nbias > 0) {
        q->wbias = calloc(oreq->nbias, sizeof *q->wbias);
        q->wbiasp = calloc(oreq->nbias, sizeof *q->wbiasp);
        if (!q->wbias || !q->wbiasp) {
            request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
            return;
        }
        for (size_t i = 0; i < oreq->nbias; i++) {
            tandem__logit_bias__init(&q->wbias[i]);
            q->wbias[i].token = oreq->logit_bias[i].token;
            q->wbias[i].bias = oreq->logit_bias[i].bias;
            q->wbiasp[i] = &q->wbias[i];
        }
    }
    if (oreq->logprobs && td_openai_logprobs_create(oreq->kind, &q->lp) != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    q->stream.meta = (td_openai_meta_t){ .kind = oreq->kind, .id = q->oid,
                                         .created = (int64_t)time(NULL), .model = t->cfg.model,
                                         .fingerprint = t->cfg.fingerprint,
                                         .logprobs = q->lp };
    q->stream.include_usage = oreq->include_usage;
    t->cfg.metrics->prompt_tokens += q->nprompt;
    if (t->cfg.request_timeout_ms) {
        struct timeval tv = td_ctl_timeval_ms((uint32_t)t->cfg.request_timeout_ms);
        q->timer = evtimer_new(t->cfg.base, on_timeout, q);
        if (!q->timer) {
            request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
            return;
        }
        evtimer_add(q->timer, &tv);
    }
    q->evcon = evhttp_request_get_connection(hreq);
    evhttp_connection_set_closecb(q->evcon, on_client_closed, q);
    q->watch = event_new(t->cfg.base, bufferevent_getfd(evhttp_connection_get_bufferevent(q->evcon)),
                         EV_READ | EV_PERSIST, on_client_readable, q);
    if (!q->watch || event_add(q->watch, NULL) != 0) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    td_debug("request %016" PRIx64 ": %s, %zu prompt tokens, max_tokens %u%s", q->id,
             oreq->kind == TD_OPENAI_CHAT ? "chat" : "completion", q->nprompt,
             oreq->max_tokens, oreq->stream ? ", streamed" : "");
    admit_next(q);
}

/* ======================================================================= */
/* Admin and metrics views, life                                             */
/* ======================================================================= */

/* ======================================================================= */
/* Shutdown                                                                  */
/* ======================================================================= */

static void
shutdown_err(td_rreq_tab_t *t, td_openai_err_t *e, const char *what)
{
    td_openai_err_set(e, 503, "server_error", NULL, "shutting_down",
                      "The server is shutting down: %s; retry after %u s.", what,
                      t->cfg.retry_after_s);
    e->retry_after = t->cfg.retry_after_s;
}

/* A request that arrives on a connection still open while the router
 * drains: refused, and the connection closed after the answer. */
static void
rreq_refuse_stopping(td_rreq_tab_t *t, struct evhttp_request *hreq)
{
    td_openai_err_t e;

    shutdown_err(t, &e, "it takes no new requests");
    t->cfg.metrics->errors[TD_ERRREASON_SHUTDOWN]++;
    t->cfg.metrics->requests[TD_OUTCOME_REJECTED]++;
    td_debug("request refused: the router is shutting down");
    evhttp_add_header(evhttp_request_get_output_headers(hreq), "Connection", "close");
    td_http_reply_err(hreq, &e);
}

void
td_rreq_tab_stop(td_rreq_tab_t *t, void (*on_idle)(void *arg), void *arg)
{
    t->stopping = true;
    t->on_idle = on_idle;
    t->idle_arg = arg;
    if (t->n == 0 && on_idle)
        on_idle(arg);
}

void
td_rreq_tab_fail_all(td_rreq_tab_t *t)
{
    td_openai_err_t e;

    shutdown_err(t, &e, "the request did not finish within the drain deadline");
    /* each request_fail frees the request it ends */
    while (t->head)
        request_fail(t->head, TD_ERRREASON_SHUTDOWN, &e);
}

size_t
td_rreq_tab_count(const td_rreq_tab_t *t)
{
    return t->n;
}

td_status_t
td_rreq_cancel_id(td_rreq_tab_t *t, uint64_t id)
{
    td_rreq_t *q = req_find(t, id);

    if (!q || is_terminal(q->state))
        return TD_ERR_NOT_FOUND;
    request_cancel(q, "canceled by the operator");
    return TD_OK;
}

static json_t *
rank_ref(const td_rrank_t *rk)
{
    return rk ? json_pack("{s:s, s:i}", "node", rk->node->name, "rank", (json_int_t)rk->rank_id)
              : json_null();
}

json_t *
td_rreq_list_json(td_rreq_tab_t *t)
{
    json_t *arr = json_array();
    uint64_t now = now_ns();

    for (td_rreq_t *q = t->head; arr && q; q = q->next) {
        char id[20];
        snprintf(id, sizeof id, "%016" PRIx64, q->id);
        json_array_append_new(arr, json_pack(
            "{s:s, s:s, s:s, s:s, s:b, s:I, s:I, s:I, s:o, s:o, s:I, s:I}",
            "id", id, "openai_id", q->oid, "state", td_rreq_state_str(q->state),
            "kind", q->oreq->kind == TD_OPENAI_CHAT ? "chat" : "completion",
            "stream", q->oreq->stream, "prompt_tokens", (json_int_t)q->nprompt,
            "completion_tokens", (json_int_t)q->ntokens,
            "max_tokens", (json_int_t)q->oreq->max_tokens,
            "decode", rank_ref(q->decode), "prefill", rank_ref(q->prefill),
            "attempts", (json_int_t)q->attempts,
            "age_ms", (json_int_t)((now - q->t_start) / 1000000u)));
    }
    return arr;
}

void
td_rreq_count_states(td_rreq_tab_t *t, uint64_t counts[TD_RREQ_NSTATES])
{
    memset(counts, 0, sizeof(uint64_t) * TD_RREQ_NSTATES);
    for (td_rreq_t *q = t->head; q; q = q->next)
        counts[q->state]++;
}

td_status_t
td_rreq_tab_create(const td_rreq_config_t *cfg, td_rreq_tab_t **out)
{
    td_rreq_tab_t *t = calloc(1, sizeof *t);

    if (!t)
        goto err_nomem;
    t->cfg = *cfg;
    t->chunk = evbuffer_new();
    if (!t->chunk)
        goto err_free_tab;
    *out = t;
    return TD_OK;

err_free_tab:
    free(t);
err_nomem:
    td_error("requests: out of memory for the request table");
    return TD_ERR_NOMEM;
}

void
td_rreq_tab_destroy(td_rreq_tab_t *t)
{
    if (!t)
        return;
    t->on_idle = NULL;   /* exiting: nobody waits for the table to empty */
    while (t->head) {
        td_rreq_t *q = t->head;
        http_detach(q);   /* evhttp_free answers and frees the HTTP side */
        request_free(q);
    }
    evbuffer_free(t->chunk);
    td_buf_free(&t->sse);
    free(t);
}
