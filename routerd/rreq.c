/* routerd/rreq.c — the request state machine: have the prompt tokenized,
 * choose ranks, Admit / Prefill, have Tokens turned into streamed text
 * (incremental detokenizing, stop strings, the V4.1 reply reader's
 * reasoning / content / tool-call deltas, SSE) or one response, and end
 * every request exactly once: done, failed or canceled, with Cancel to its
 * ranks where they may hold it. The text work itself (rtext.c) runs on the
 * text threads (net/jobq.h), one job per request at a time. */
#include "rreq.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "anthropic.h"
#include "buf.h"
#include "chat.h"
#include "clock.h"
#include "daemon.h"
#include "fsm.h"
#include "hmap.h"
#include "http.h"
#include "jobq.h"
#include "log.h"
#include "rconv.h"
#include "rqueue.h"
#include "rsched.h"
#include "rtext.h"

#define REQTAB_HINT 4096u   /* requests in flight before the table first grows */

struct td_rreq_s {
    td_rreq_t *prev, *next;         /* every request in flight (or ended, in the
                                       table's zombies, until its text job is back) */
    td_rreq_tab_t *t;
    uint64_t id;                    /* wire id of the current attempt */
    td_rreq_state_t state;          /* changed by set_state() only */
    td_openai_kind_t kind;
    td_ireq_t *oreq;                /* text's (rtext.h), NULL until the prompt job has
                                       parsed the body */
    td_http_req_t *http;            /* NULL once answered or the client is gone */
    char oid[TD_OPENAI_ID_LEN];     /* chatcmpl-... */
    int32_t *prompt;
    size_t nprompt;
    td_rcache_prompt_t cprompt;     /* the prompt's cache block hashes, per block size */
    uint64_t pred_cached;           /* this attempt's prefill rank: the prefix expected cached */
    bool pred_by_cache;             /*   chosen for its cache over the load-only choice */
    td_rrank_t *decode, *prefill;   /* bound ranks (td_cluster_rank_bind) */
    uint64_t tried[TD_RSCHED_MAX_TRIED];   /* decode incarnations that refused */
    size_t ntried;
    unsigned attempts;
    unsigned bounced;               /* admissions a rank turned away for capacity */
    td_rqueue_entry_t qe;           /* its place in the admission queue */
    bool too_long;                  /* a decode rank said TOO_LONG */
    bool prefill_sent;              /* this attempt's Prefill went out */
    bool admit_open;                /* its Admit went out, not answered yet (rrank.h) */
    bool streaming;                 /* 200 and the first chunk went out */
    td_rtext_t *text;               /* its text work: parse, prompt, tokens to text */
    bool text_busy;                 /* a job of text is queued or running */
    uint64_t held_end;              /* choices D ended before P's PrefillDone: their end
                                       waits for it (its cached count is in the usage) */
    uint64_t held_by_us;            /*   those the router cut (max_tokens) */
    td_openai_finish_t *held_finish;/*   [oreq->n] their finish reasons */
    bool text_end;                  /* every choice's end went to the text work */
    bool ended;                     /* answered and out of the table: freed once
                                       text_busy is false */
    Tandem__LogitBias *wbias;       /* [nbias] the request's logit_bias on the wire */
    Tandem__LogitBias **wbiasp;     /* [nbias] pointers to them */
    Tandem__Constraint wcons;       /* its constraint on the wire (kind 0: none; the spec
                                       is oreq's) */
    int32_t stop_ids[TD_IREQ_MAX_STOP_IDS];   /* its stop tokens on the wire */
    size_t nstop_ids;
    uint32_t ntokens;               /* completion tokens received, every choice's */
    uint32_t *choice_tokens;        /* [oreq->n] tokens received per choice */
    uint64_t choice_end;            /* bit i: choice i's end went to the text work */
    int32_t *gen;                   /* [ntokens] those tokens (kept states: rconv.h), or NULL */
    size_t gencap;
    td_rconv_hit_t cont;            /* this attempt continues a kept state (cont.rank != NULL):
                                       its decode rank prefills the prompt's rest */
    bool no_continue;               /* a decode rank turned the continuation away */
    uint64_t t_start, t_last;       /* ns, CLOCK_MONOTONIC */
    struct event *timer;            /* request timeout, or NULL */
    /* backpressure (flow_*): its decode row is paused while its client has
     * more than the stream's share buffered */
    bool paused;
    uint64_t paused_ns;             /* since when */
    struct event *flow_timer;       /* while paused: drained yet? too slow? */
};

struct td_rreq_tab_s {
    td_rreq_config_t cfg;
    td_hmap_t *byid;                /* wire id -> td_rreq_t * */
    td_rreq_t *head;
    size_t n;
    uint64_t id_seq;
    td_rqueue_t *queue;             /* requests waiting for a decode rank with room */
    td_rconv_t *conv;               /* the decode ranks' kept states (NULL: not used) */
    td_buf_t sse;                   /* reused: SSE events made on the loop */
    td_rtext_cfg_t text_cfg;
    td_jobq_t *pool;                /* the text threads */
    td_rreq_t *zombies;             /* ended, their text job not back yet */
    bool closing;                   /* td_rreq_tab_destroy is under way */
    bool stopping;                  /* shutdown: new requests are refused */
    void (*on_idle)(void *arg);     /* then: the last request in flight ended */
    void *idle_arg;
};

/* ======================================================================= */
/* The state machine                                                         */
/* ======================================================================= */

#define S(x) TD_FSM_BIT(TD_RREQ_##x)
/* Allowed transitions: a retry goes back to admitting; a request that finds
 * no room (also after a rank turned it away) waits in the queue, holding no
 * rank; terminal states stay. */
static const uint32_t rreq_allowed[TD_RREQ_NSTATES] = {
    [TD_RREQ_NEW] = S(QUEUED) | S(ADMITTING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_QUEUED] = S(ADMITTING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_ADMITTING] = S(QUEUED) | S(ADMITTING) | S(PREFILLING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_PREFILLING] = S(ADMITTING) | S(DECODING) | S(FAILED) | S(CANCELED),
    [TD_RREQ_DECODING] = S(DONE) | S(FAILED) | S(CANCELED),
};
#undef S

static const char *const rreq_state_names[TD_RREQ_NSTATES] = {
    "new", "queued", "admitting", "prefilling", "decoding", "done", "failed", "canceled",
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
 * and aborts (base/fsm.h); what peers and clients send is checked
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

static td_rreq_t *
req_find(td_rreq_tab_t *t, uint64_t id)
{
    uint64_t v = td_hmap_get(t->byid, id);

    return v != TD_HMAP_NONE ? (td_rreq_t *)(uintptr_t)v : NULL;
}

static void
hash_del(td_rreq_tab_t *t, td_rreq_t *q)
{
    td_hmap_del(t->byid, q->id);
}

/* TD_ERR_NOMEM; never after a hash_del (hmap.h: no allocation then). */
static td_status_t
hash_add(td_rreq_tab_t *t, td_rreq_t *q)
{
    return td_hmap_put(t->byid, q->id, (uintptr_t)q);
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

/* The KV tokens q's Admit asks for: the prompt, and max_tokens for each of
 * its n choices (they share the prompt's blocks; each grows its own). */
static uint64_t
admit_need(const td_rreq_t *q)
{
    return q->nprompt + (uint64_t)q->oreq->n * q->oreq->sampling.max_tokens;
}

/* The decode rank answered this attempt's Admit, or q waits for the answer
 * no more: its room is counted from the Loads again (rrank.h). */
static void
admit_answered(td_rreq_t *q)
{
    if (q->admit_open && q->decode)
        td_rrank_admit_answered(q->decode, admit_need(q));
    q->admit_open = false;
}

static void
unbind_rank(td_rreq_t *q, td_rrank_t **slot)
{
    td_rrank_t *rk = *slot;

    if (!rk)
        return;
    if (slot == &q->decode)
        admit_answered(q);
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

/* Every choice of q, as a mask. */
static uint64_t
choices_all(const td_rreq_t *q)
{
    return q->oreq->n >= 64 ? ~0ull : (1ull << q->oreq->n) - 1;
}

/* End the choices in mask at the decode rank (the router has what it needs
 * of them); the request's others go on. */
static void
send_cancel_choices(td_rreq_t *q, uint64_t mask)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    uint32_t which[TD_IREQ_MAX_N];
    size_t n = 0;

    if (!q->decode || !q->decode->conn)
        return;
    for (uint32_t i = 0; i < q->oreq->n; i++)
        if (mask >> i & 1)
            which[n++] = i;
    c.req_id = q->id;
    c.reason = (char *)"choice finished by the router";
    c.n_choices = n;
    c.choices = which;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CANCEL;
    env.cancel = &c;
    (void)td_rrank_send(q->decode, &env);
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

/* The request's Sampling: the model's parameters (ireq.h) as the wire takes
 * them, its stop tokens (stop_token_ids and the model's EOS ids unless
 * ignore_eos), logit_bias, logprobs and choices (pointers into q). */
static void
sampling_fill(Tandem__Sampling *s, const td_rreq_t *q)
{
    const td_ireq_sampling_t *sp = &q->oreq->sampling;

    tandem__sampling__init(s);
    s->temperature = sp->temperature;
    s->top_p = sp->top_p;
    s->top_k = sp->top_k;
    s->min_p = sp->min_p;
    s->repetition_penalty = sp->repetition_penalty;
    s->presence_penalty = sp->presence_penalty;
    s->frequency_penalty = sp->frequency_penalty;
    s->min_tokens = sp->min_tokens;
    s->seed = (uint64_t)sp->seed;
    s->max_tokens = sp->max_tokens;
    s->n_stop_tokens = q->nstop_ids;
    s->stop_tokens = (int32_t *)q->stop_ids;
    s->ignore_eos = q->oreq->stop.ignore_eos;
    s->n_logit_bias = sp->nbias;
    s->logit_bias = q->wbiasp;
    s->logprobs = q->oreq->out.logprobs;
    s->top_logprobs = q->oreq->out.top_logprobs;
    s->n = q->oreq->n > 1 ? q->oreq->n : 0;   /* 0: one (as every rank reads it) */
    s->constraint = q->wcons.kind != 0 ? (Tandem__Constraint *)&q->wcons : NULL;
}

/* The constraint on the wire: the kind, the spec text, strict; a prompt that
 * opens the reasoning (it ends with <think>) is free until </think>. */
static void
constraint_fill(td_rreq_t *q)
{
    const td_ireq_constraint_t *c = &q->oreq->constraint;
    const td_tokenizer_t *v41 = q->t->cfg.v41;
    uint32_t think, unthink;

    tandem__constraint__init(&q->wcons);
    if (c->kind == TD_IREQ_CONSTRAINT_NONE)
        return;
    q->wcons.kind = (uint32_t)c->kind;
    q->wcons.spec = c->text;
    q->wcons.strict = c->strict;
    if (v41 != NULL && q->nprompt > 0 &&
        td_tokenizer_find(v41, TD_CHAT_TOK_THINK, strlen(TD_CHAT_TOK_THINK), &think) == TD_OK &&
        td_tokenizer_find(v41, TD_CHAT_TOK_UNTHINK, strlen(TD_CHAT_TOK_UNTHINK), &unthink) ==
            TD_OK &&
        q->prompt[q->nprompt - 1] == (int32_t)think)
        q->wcons.start_after = (int32_t)unthink + 1;
}

/* ======================================================================= */
/* Answers                                                                   */
/* ======================================================================= */

static void rreq_refuse_stopping(td_rreq_tab_t *t, td_http_req_t *hreq);

static void
http_detach(td_rreq_t *q)
{
    if (q->http)
        td_http_on_gone(q->http, NULL, NULL);
    q->http = NULL;
}

static void flow_check(td_rreq_t *q);
static void flow_end(td_rreq_t *q);

/* Send SSE events as one chunk (nothing when the client is gone or making
 * them failed). */
static void
stream_send(td_rreq_t *q, const td_buf_t *events)
{
    if (events->len > 0 && q->http && td_buf_status(events) == TD_OK) {
        td_http_stream_send(q->http, events->data, events->len);
        flow_check(q);
    }
}

/* Send the SSE events in the table's sse buffer; the buffer is empty (and
 * any failure forgotten) afterwards. */
static void
stream_flush(td_rreq_t *q)
{
    stream_send(q, &q->t->sse);
    td_buf_reset(&q->t->sse);
}

/* The headers and the first chunk. Only at AdmitOk, which comes before any
 * Tokens: no text job runs (they run for a new or a decoding request). */
static void
stream_start(td_rreq_t *q)
{
    td_http_add_header(q->http, "Content-Type", "text/event-stream");
    td_http_add_header(q->http, "Cache-Control", "no-cache");
    td_http_add_header(q->http, "X-Request-Id", q->oid);
    td_http_stream_start(q->http, 200);
    q->streaming = true;
    if (td_rtext_stream_start(q->text, &q->t->sse) == TD_OK)
        stream_flush(q);
    td_buf_reset(&q->t->sse);   /* when it failed */
}

/* Free what q holds; it is out of the table and no text job of it runs. */
static void
request_release(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;

    if (q->ended) {   /* a zombie: off that list */
        if (q->prev)
            q->prev->next = q->next;
        else if (t->zombies == q)
            t->zombies = q->next;
        if (q->next)
            q->next->prev = q->prev;
    }
    td_rtext_destroy(q->text);
    free(q->wbias);
    free(q->wbiasp);
    free(q->choice_tokens);
    free(q->held_finish);
    td_rcache_prompt_fini(&q->cprompt);
    free(q->prompt);
    free(q->gen);
    free(q);
}

/* q has been answered (or its client is gone): out of the table, its
 * client, timer and ranks let go of. Freed now, or when its text job comes
 * back (a job queued then does nothing, a running one stops early). */
static void
request_end(td_rreq_t *q)
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
    td_rqueue_entry_fini(&q->qe);
    if (q->timer)
        event_free(q->timer);
    q->timer = NULL;
    flow_end(q);
    release_ranks(q, NULL);
    if (!q->text_busy) {
        request_release(q);
    } else {
        q->ended = true;
        if (q->text)
            td_rtext_cancel(q->text);
        q->prev = NULL;
        q->next = t->zombies;
        if (t->zombies)
            t->zombies->prev = q;
        t->zombies = q;
    }
    if (t->n == 0 && t->on_idle)
        t->on_idle(t->idle_arg);
}

static void
count_outcome(td_rreq_t *q, td_outcome_t o)
{
    q->t->cfg.metrics->requests[o]++;
}

/* Answer the client (if still there) with e: a response, or an error event
 * when the stream has started. Events not yet sent (those of a text job still
 * running) are dropped: they would stop short of what failed. */
static void
answer_error(td_rreq_t *q, const td_openai_err_t *e)
{
    td_http_req_t *h = q->http;

    if (!h)
        return;
    if (q->streaming) {
        td_buf_reset(&q->t->sse);
        if (td_rtext_stream_error(q->text, e, &q->t->sse) == TD_OK)
            stream_flush(q);
        td_buf_reset(&q->t->sse);   /* when it failed */
        http_detach(q);
        td_http_stream_end(h);
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
    /* refused before any rank had it: from the start, or from the queue */
    count_outcome(q, q->state == TD_RREQ_NEW || (q->state == TD_RREQ_QUEUED && q->attempts == 0)
                         ? TD_OUTCOME_REJECTED : TD_OUTCOME_FAILED);
    set_state(q, TD_RREQ_FAILED, td_metrics_errreason_str(why));
    release_ranks(q, "request failed");
    answer_error(q, e);
    request_end(q);
}

static void
request_fail_simple(td_rreq_t *q, td_errreason_t why, const char *what)
{
    td_openai_err_t e;

    td_openai_err_set(&e, why == TD_ERRREASON_TIMEOUT ? 504 : 500, "server_error", NULL, NULL,
                      "The server had an error while processing your request: %s.", what);
    request_fail(q, why, &e);
}

/* The parser refused the body: answered as an HTTP refusal (counted as
 * rejected, a 4xx logged at debug), as before any request existed. */
static void
request_refuse(td_rreq_t *q, const td_openai_err_t *e)
{
    td_http_req_t *h = q->http;

    set_state(q, TD_RREQ_FAILED, "body refused");
    http_detach(q);
    if (h)
        td_http_refuse(q->t->cfg.metrics, h, e);
    request_end(q);
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
    request_end(q);
}

/* ======================================================================= */
/* Backpressure: a stream whose client reads slower than it is generated     */
/* pauses its decode row (docs/routerd.md, "Backpressure")                   */
/* ======================================================================= */

#define FLOW_POLL_MS 50u

static void
flow_pause_send(td_rreq_t *q, bool paused)
{
    Tandem__Pause p = TANDEM__PAUSE__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    if (q->decode == NULL)
        return;
    p.req_id = q->id;
    p.paused = paused;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PAUSE;
    env.pause = &p;
    (void)td_rrank_send(q->decode, &env);
}

/* The stream ends: it is paused no more. */
static void
flow_end(td_rreq_t *q)
{
    if (q->paused)
        q->t->cfg.metrics->paused_now--;
    q->paused = false;
    if (q->flow_timer)
        event_free(q->flow_timer);
    q->flow_timer = NULL;
}

/* Cancel a stream whose client reads too slowly: paused past the timeout,
 * or the oldest paused one when a budget was full (evicted: the decode
 * rank's paused KV, or every stream's bytes together). Its connection ends
 * at once, the bytes buffered for it dropped (a client that slow would hold
 * them for as long as it likes). One log line (request_fail's) and a metric. */
static void
flow_slow_fail(td_rreq_t *q, bool evicted)
{
    td_openai_err_t e;
    double paused_s = (double)(td_clock_ns() - q->paused_ns) / 1e9;
    td_http_req_t *h = q->http;

    http_detach(q);
    if (h != NULL)
        td_http_abort(h, "its client read the stream too slowly");

    if (evicted)
        q->t->cfg.metrics->slow_evicted++;
    else
        q->t->cfg.metrics->slow_timeout++;
    td_openai_err_set(&e, 408, "server_error", NULL, "slow_reader",
                      "The stream was canceled: the client read it too slowly (paused %.0f s%s).",
                      paused_s, evicted ? ", and the decode rank needed the room" : "");
    request_fail(q, TD_ERRREASON_SLOW_READER, &e);
}

/* The client has read most of it: the row resumes. */
static void
flow_resume(td_rreq_t *q)
{
    td_metrics_t *m = q->t->cfg.metrics;

    q->paused = false;
    m->paused_now--;
    m->streams_resumed++;
    evtimer_del(q->flow_timer);
    td_http_on_drain(q->http, NULL, NULL);
    flow_pause_send(q, false);
}

/* http.c: the stream drained to a quarter of its cap. */
static void
flow_on_drain(td_http_req_t *h, void *arg)
{
    td_rreq_t *q = arg;

    (void)h;
    if (q->paused && q->http != NULL && td_http_stream_drained(q->http))
        flow_resume(q);   /* else the total is over: the timer looks again */
}

static void
flow_on_timer(evutil_socket_t fd, short what, void *arg)
{
    td_rreq_t *q = arg;
    uint64_t limit = q->t->cfg.slow_reader_timeout_ms ? q->t->cfg.slow_reader_timeout_ms
                                                      : 60000;
    struct timeval tv = { 0, FLOW_POLL_MS * 1000 };

    (void)fd, (void)what;
    if (!q->paused || q->http == NULL)
        return;
    if (td_http_stream_drained(q->http)) {
        flow_resume(q);
        return;
    }
    if (td_clock_ns() - q->paused_ns > limit * 1000000u) {
        flow_slow_fail(q, false);
        return;
    }
    evtimer_add(q->flow_timer, &tv);
}

/* Every stream together is over the budget: the oldest paused one is
 * canceled (its buffered bytes go with its connection's end), or the
 * streams that read would starve behind those that do not. */
static void
flow_evict_oldest(td_rreq_tab_t *t)
{
    td_rreq_t *old = NULL;

    for (td_rreq_t *q = t->head; q != NULL; q = q->next)
        if (q->paused && (old == NULL || q->paused_ns < old->paused_ns))
            old = q;
    if (old != NULL)
        flow_slow_fail(old, true);
}

/* After a piece of the stream went out: when the client has more than the
 * stream's share buffered (or every stream together more than theirs), its
 * decode row pauses; a timer looks for the drain. */
static void
flow_check(td_rreq_t *q)
{
    struct timeval tv = { 0, FLOW_POLL_MS * 1000 };

    if (q->paused || q->http == NULL || q->decode == NULL || q->state != TD_RREQ_DECODING ||
        q->text_end || !td_http_stream_over(q->http))
        return;
    if (q->flow_timer == NULL &&
        (q->flow_timer = evtimer_new(q->t->cfg.base, flow_on_timer, q)) == NULL)
        return;   /* out of memory: the stream goes on unpaused */
    if (td_http_out_full(q->http))
        flow_evict_oldest(q->t);   /* the budget is held by paused streams: make room */
    q->paused = true;
    q->paused_ns = td_clock_ns();
    q->t->cfg.metrics->streams_paused++;
    q->t->cfg.metrics->paused_now++;
    flow_pause_send(q, true);
    td_http_on_drain(q->http, flow_on_drain, q);
    evtimer_add(q->flow_timer, &tv);
}

static td_openai_finish_t
finish_of(Tandem__Finish f)
{
    return f == TANDEM__FINISH__FINISH_LENGTH ? TD_OPENAI_FINISH_LENGTH : TD_OPENAI_FINISH_STOP;
}

/* Generation ended (stop, length, or a stop string: then by_us, and the
 * ranks get a Cancel because they may still be generating); the text job
 * has made the end of the reply: the rest of a stream, or the answer. */
static void
request_done(td_rreq_t *q, bool by_us)
{
    const td_buf_t *out = td_rtext_out(q->text);
    td_http_req_t *h;

    set_state(q, TD_RREQ_DONE, by_us ? "finished by the router" : "finished by the rank");
    count_outcome(q, TD_OUTCOME_DONE);
    release_ranks(q, by_us ? "finished by the router" : NULL);
    h = q->http;
    if (h && q->streaming) {
        stream_send(q, out);
        http_detach(q);
        td_http_stream_end(h);
    } else if (h) {
        http_detach(q);
        td_http_add_header(h, "X-Request-Id", q->oid);
        td_http_reply(h, 200, "application/json", out->data, out->len);
    }
    td_debug("request %016" PRIx64 ": done, %zu prompt + %u completion tokens", q->id,
             q->nprompt, q->ntokens);
    request_end(q);
}

/* ======================================================================= */
/* Admission                                                                 */
/* ======================================================================= */

/* 400 context_length_exceeded: prompt + max_tokens over limit (0: not
 * known), the model's context or every decode rank's whole KV. */
static void
fail_too_long(td_rreq_t *q, uint64_t limit)
{
    td_openai_err_t e;
    const char *param = q->oreq->kind == TD_OPENAI_COMPLETION ? "prompt"
                        : q->oreq->kind == TD_OPENAI_RESPONSES ? "input" : "messages";
    char most[64] = "";

    if (limit)
        snprintf(most, sizeof most, " of %" PRIu64 " tokens", limit);
    td_openai_err_set(&e, 400, "invalid_request_error", param, "context_length_exceeded",
                      "This model's maximum context length%s is exceeded: you requested %" PRIu64
                      " tokens (%zu in the prompt, %u in the completion). Please reduce the "
                      "length of the prompt or max_tokens.", most,
                      (uint64_t)q->nprompt + q->oreq->sampling.max_tokens, q->nprompt,
                      q->oreq->sampling.max_tokens);
    request_fail(q, TD_ERRREASON_TOO_LONG, &e);
}

static bool queue_wait(td_rreq_t *q);

/* A new attempt of q: a new wire id after the first (the old one may live on
 * at a rank), nothing sent yet, no kept state continued. */
static void
attempt_begin(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;

    if (q->attempts > 0) {
        hash_del(t, q);
        q->id = id_next(t);
        (void)hash_add(t, q);   /* one out, one in: no allocation */
        t->cfg.metrics->retries++;
    }
    q->attempts++;
    q->prefill_sent = false;
    q->pred_cached = 0;
    q->pred_by_cache = false;
    q->cont.rank = NULL;
}

/* Send the attempt's Admit to its decode rank: with its prefill rank, or
 * continuing the kept state q->cont. Whether it went out (td_rrank_send
 * logs why not). */
static bool
admit_send(td_rreq_t *q, uint64_t need)
{
    td_rrank_t *d = q->decode, *p = q->prefill;
    Tandem__Admit a = TANDEM__ADMIT__INIT;
    Tandem__Sampling s;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    sampling_fill(&s, q);
    a.req_id = q->id;
    a.n_tokens = q->nprompt;
    a.tokens = q->prompt;
    a.sampling = &s;
    if (p != NULL) {
        a.prefill_node = p->node->name;
        a.prefill_rank = p->rank_id;
        a.prefill_incarnation = p->incarnation;
        a.prefill_deadline_ms = p->reg ? p->reg->xfer_deadline_ms : 0;
    } else {
        a.continue_from = q->cont.id;
        a.continue_tokens = q->cont.ntokens;
    }
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT;
    env.admit = &a;
    if (td_rrank_send(d, &env) != TD_OK)
        return false;
    td_rrank_admit_sent(d, need);
    q->admit_open = true;
    set_state(q, TD_RREQ_ADMITTING, p != NULL ? "admit sent" : "admit sent: continues a kept state");
    return true;
}

/* A decode rank whose kept states a request may continue now. */
static bool
continue_usable(void *rank, void *arg)
{
    td_rrank_t *rk = rank;
    td_rreq_t *q = arg;

    if (rk->role != TANDEM__ROLE__ROLE_DECODE || td_rrank_state(rk) != TD_RRANK_UP ||
        rk->load.draining)
        return false;
    for (size_t i = 0; i < q->ntried; i++)
        if (q->tried[i] == rk->incarnation)
            return false;
    return true;
}

/* Conditional disaggregation (docs/kvcache.md, "Multi-turn"): when q's
 * prompt continues a decode rank's kept state by at most
 * continue_max_suffix tokens, and the state holds at least as much of it as
 * the best prefill rank's cache (prefill_cached tokens), that decode rank
 * takes q and prefills the rest itself. Whether the Admit went out. */
static bool
continue_try(td_rreq_t *q, uint64_t prefill_cached, uint64_t need)
{
    td_rreq_tab_t *t = q->t;
    td_rconv_hit_t hit;

    if (t->conv == NULL || q->no_continue || q->oreq->n > 1 ||
        !td_rconv_find(t->conv, &q->cprompt, continue_usable, q, &hit) ||
        q->nprompt - hit.ntokens > t->cfg.continue_max_suffix || hit.ntokens < prefill_cached)
        return false;
    td_rconv_remove(t->conv, hit.id);   /* the new request's from now on, or gone */
    td_rqueue_remove(&q->qe);
    attempt_begin(q);
    q->cont = hit;
    bind_rank(q, &q->decode, hit.rank);
    if (admit_send(q, need)) {
        t->cfg.metrics->continue_sent++;
        return true;
    }
    release_ranks(q, NULL);
    q->cont.rank = NULL;
    q->no_continue = true;
    return false;
}

/* Choose a prefill and a decode rank and send Admit. When no decode rank has
 * room, or requests queued before it wait, q waits in the queue; when no
 * rank could ever hold it, or none is up, it ends (400 / 503). Returns
 * whether q waits (false: admitted, or ended and freed). */
static bool
admit_try(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;
    unsigned retry_after = t->cfg.retry_after_s;
    uint64_t need = admit_need(q);

    if (t->cfg.max_context && need > t->cfg.max_context) {
        fail_too_long(q, t->cfg.max_context);
        return false;
    }
    for (;;) {
        td_rrank_t *p, *d = NULL;
        td_rsched_prefill_t pick;
        td_rsched_fit_t fit;

        if (q->attempts - q->bounced >= t->cfg.max_attempts ||
            q->ntried >= TD_RSCHED_MAX_TRIED) {
            td_openai_err_t e;
            td_openai_err_overloaded(&e, retry_after);
            request_fail(q, TD_ERRREASON_NO_CAPACITY, &e);
            return false;
        }
        pick = td_rsched_pick_prefill(t->cfg.cluster->ranks, &q->cprompt, t->cfg.cache_weight);
        p = pick.rank;
        if (continue_try(q, pick.cached_tokens, need))
            return false;
        fit = p ? td_rsched_pick_decode(t->cfg.cluster->ranks, need, q->tried, q->ntried, &d)
                : TD_RSCHED_NONE;
        /* a request not in the queue goes behind the ones waiting before it */
        if (fit == TD_RSCHED_FITS && !q->qe.q && td_rqueue_ahead(t->queue, &q->qe))
            fit = TD_RSCHED_BUSY;
        if (fit == TD_RSCHED_BUSY)
            return queue_wait(q);
        if (fit != TD_RSCHED_FITS) {
            td_openai_err_t e;
            if (fit == TD_RSCHED_TOO_LONG || (q->too_long && p)) {
                fail_too_long(q, td_rsched_longest(t->cfg.cluster->ranks));
                return false;
            }
            td_openai_err_overloaded(&e, retry_after);
            if (!p) {   /* the cause is no prefill rank, not decode capacity */
                td_openai_err_set(&e, 503, "server_error", NULL, NULL,
                                  "The server is overloaded (no prefill rank up); retry "
                                  "after %u s.", retry_after);
                e.retry_after = retry_after;
            }
            request_fail(q, TD_ERRREASON_NO_CAPACITY, &e);
            return false;
        }
        td_rqueue_remove(&q->qe);   /* its turn came (nothing when it did not wait) */
        attempt_begin(q);
        q->pred_cached = pick.cached_tokens;
        q->pred_by_cache = pick.by_cache;
        bind_rank(q, &q->decode, d);
        bind_rank(q, &q->prefill, p);
        if (admit_send(q, need))
            return false;
        q->tried[q->ntried++] = d->incarnation;   /* td_rrank_send logged why */
        release_ranks(q, NULL);
    }
}

static void
admit_next(td_rreq_t *q)
{
    (void)admit_try(q);
}

/* ======================================================================= */
/* The admission queue (rqueue.h): who waits, for how long, and the passes   */
/* that place waiting requests when capacity frees                          */
/* ======================================================================= */

static td_rreq_t *
queue_req(td_rqueue_entry_t *e)
{
    return (td_rreq_t *)(void *)((char *)e - offsetof(td_rreq_t, qe));
}

/* End q with the 503 of the queue's refusal st: TD_ERR_BUSY full (or no
 * queue: max-queued 0), TD_ERR_TIMEOUT its deadline passed, else out of
 * memory (500). */
static void
queue_refuse(td_rreq_t *q, td_status_t st)
{
    const td_rreq_config_t *cfg = &q->t->cfg;
    td_errreason_t why = TD_ERRREASON_QUEUE_FULL;
    td_openai_err_t e;

    td_openai_err_overloaded(&e, cfg->retry_after_s);
    if (st == TD_ERR_BUSY && cfg->max_queued > 0) {
        td_openai_err_set(&e, 503, "server_error", NULL, NULL,
                          "The server is overloaded: no decode rank has room and %zu requests "
                          "wait already; retry after %u s.", cfg->max_queued,
                          cfg->retry_after_s);
    } else if (st == TD_ERR_TIMEOUT) {
        why = TD_ERRREASON_QUEUE_TIMEOUT;
        td_openai_err_set(&e, 503, "server_error", NULL, NULL,
                          "The server is overloaded: no decode rank had room within %" PRIu64
                          " ms; retry after %u s.", cfg->queue_timeout_ms, cfg->retry_after_s);
    } else if (st == TD_ERR_BUSY) {
        why = TD_ERRREASON_NO_CAPACITY;   /* no queue (max-queued 0): as without one */
    } else {
        why = TD_ERRREASON_INTERNAL;
        td_openai_err_internal(&e, "out of memory for the admission queue");
    }
    if (e.http == 503)
        e.retry_after = cfg->retry_after_s;
    request_fail(q, why, &e);
}

/* q found no decode rank with room (or others wait before it): into the
 * queue, unless it is full (a request that was admitted once keeps its turn
 * and is not refused) or q's deadline has passed. Returns whether q waits
 * (false: it ended with a 503 and is freed). */
static bool
queue_wait(td_rreq_t *q)
{
    td_status_t st;

    if (q->qe.q)
        return true;   /* waiting already: a pass found no room yet */
    st = td_rqueue_push(q->t->queue, &q->qe, q->attempts == 0);
    if (st != TD_OK) {
        queue_refuse(q, st);
        return false;
    }
    /* queued already when its Admit could not be sent: back in its place */
    if (q->state != TD_RREQ_QUEUED)
        set_state(q, TD_RREQ_QUEUED, "no decode rank has room");
    return true;
}

static void
queue_on_expired(td_rqueue_entry_t *qe, void *arg)
{
    queue_refuse(queue_req(qe), TD_ERR_TIMEOUT);
}

/* Place requests from the head until one has to wait on: strict order, so a
 * request the ranks cannot take yet holds back the ones behind it (none
 * starves). Each step admits or ends the head, so the pass ends. */
static void
queue_pass(td_rqueue_t *rq, void *arg)
{
    td_rqueue_entry_t *qe;

    while ((qe = td_rqueue_head(rq)) != NULL && !admit_try(queue_req(qe)))
        ;
}

void
td_rreq_on_capacity(td_rreq_tab_t *t)
{
    td_rqueue_kick(t->queue);
}

void
td_rreq_queue_stats(td_rreq_tab_t *t, td_rqueue_stats_t *out)
{
    td_rqueue_stats(t->queue, out);
}

/* The current attempt is lost before any token reached the client: try
 * again on other ranks (new Admit, new id), or fail. A decoding request has
 * streamed (or may have) and is never retried. what is the one log line of
 * the loss. */
static void
retry_or_fail(td_rreq_t *q, td_errreason_t why, const char *what)
{
    if (q->state != TD_RREQ_DECODING && q->ntokens == 0 &&
        q->attempts - q->bounced < q->t->cfg.max_attempts) {
        td_info("request %016" PRIx64 ": %s; retrying", q->id, what);
        release_ranks(q, what);
        q->qe.t_first_ns = 0;   /* a new attempt: should it wait, its deadline starts now */
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

    admit_answered(q);
    if (q->cont.rank != NULL) {   /* the decode rank prefills the rest of the prompt */
        q->t->cfg.metrics->continue_kept_tokens += q->cont.ntokens;
        q->t->cfg.metrics->continue_suffix_tokens += q->nprompt - q->cont.ntokens;
        td_rtext_push_cached(q->text, q->cont.ntokens);
        set_state(q, TD_RREQ_PREFILLING, "the decode rank prefills the prompt's rest");
        if (q->oreq->out.stream && q->http && !q->streaming)
            stream_start(q);
        return;
    }
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
    /* the prefill work it was sent: the prompt less what its cache holds */
    q->prefill->pend_tokens += q->nprompt - q->pred_cached;
    q->prefill->pend_reqs++;
    td_rrank_cache_counters_t *cc = &q->prefill->cache_ctr;
    cc->placed++;
    cc->prompt_tokens += q->nprompt;
    cc->predicted_cached += q->pred_cached;
    cc->by_cache += q->pred_by_cache;
    set_state(q, TD_RREQ_PREFILLING, "prefill sent");
    if (q->oreq->out.stream && q->http && !q->streaming)
        stream_start(q);
}

static void
on_admit_reject(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__AdmitReject *rej = env->admit_reject;

    td_info("request %016" PRIx64 ": %s rank %s/%u: admit rejected (%d): %s", q->id,
            td_hello_role_str(rk->role), rk->node->name, rk->rank_id, (int)rej->code,
            rej->reason);
    admit_answered(q);
    td_rrank_admit_freed(rk, admit_need(q));   /* it holds no row of q's */
    if (q->cont.rank != NULL) {   /* admitted anew, as any request */
        q->no_continue = true;
        q->t->cfg.metrics->continue_refused++;
    }
    if (rej->code == TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_TOO_LONG)
        q->too_long = true;
    if (rej->code == TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NOT_KEPT) {
        q->bounced++;   /* no failed attempt: the rank is fine */
    } else if (rej->code == TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY) {
        /* full after all: not chosen again until its next Load; q goes
         * elsewhere or waits, and the bounce is no failed attempt */
        rk->refused = true;
        q->bounced++;
    } else {
        q->tried[q->ntried++] = rk->incarnation;
    }
    release_ranks(q, NULL);
    admit_next(q);
}

static void text_kick(td_rreq_t *q);

/* The prefill rank let go of the request (PrefillDone, or it was lost): the
 * choices' ends held for it go to the text work now. */
static void
end_release(td_rreq_t *q)
{
    if (q->held_end == 0)
        return;
    for (uint32_t c = 0; c < q->oreq->n; c++)
        if (q->held_end >> c & 1)
            td_rtext_push_end(q->text, c, q->held_finish[c], (q->held_by_us >> c & 1) != 0);
    q->held_end = q->held_by_us = 0;
    text_kick(q);
}

static void
on_prefill_done(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__PrefillDone *pd = env->prefill_done;
    td_rreq_tab_t *t = q->t;
    char what[300];

    if (pd->status == TD_OK) {
        rk->cache_ctr.reported_cached += pd->cached_tokens;
        if (pd->cached_tokens > 0)   /* for the usage's prompt_tokens_details */
            td_rtext_push_cached(q->text, pd->cached_tokens < q->nprompt ? pd->cached_tokens
                                                                         : q->nprompt);
        t->cfg.metrics->kv_bytes_moved +=
            (uint64_t)(t->cfg.kv_bytes_per_token * (double)q->nprompt) + t->cfg.kv_fixed_bytes;
        unbind_rank(q, &q->prefill);   /* P holds nothing of it any more */
        end_release(q);
        return;
    }
    snprintf(what, sizeof what, "prefill failed at %s/%u: %s (%s)", rk->node->name, rk->rank_id,
             pd->reason, td_status_str((td_status_t)pd->status));
    if (q->state == TD_RREQ_PREFILLING) {
        retry_or_fail(q, TD_ERRREASON_PREFILL_FAILED, what);
    } else {   /* decoding already: D has the KV; the failure came late */
        td_info("request %016" PRIx64 ": %s; decoding goes on", q->id, what);
        unbind_rank(q, &q->prefill);
        end_release(q);
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
    if (tk->choice >= q->oreq->n) {
        snprintf(why, whylen, "choice %u of a request of %u", tk->choice, q->oreq->n);
        return why;
    }
    if (!q->oreq->out.logprobs)
        return NULL;
    if (tk->n_logprobs != tk->n_tokens) {
        snprintf(why, whylen, "%zu log-probabilities for %zu tokens", tk->n_logprobs,
                 tk->n_tokens);
        return why;
    }
    for (size_t i = 0; i < tk->n_logprobs; i++) {
        const Tandem__TokenLogprob *lp = tk->logprobs[i];
        if (lp->token != tk->tokens[i] || lp->n_top > q->oreq->out.top_logprobs) {
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

/* ======================================================================= */
/* Text jobs                                                                 */
/* ======================================================================= */

/* Bodies larger than this are long jobs (td_jobq_post_long): a thread stays
 * free for the others. 64 KiB take about 3 ms to parse, encode and tokenize. */
#define TEXT_LONG_BODY (64u << 10)

static void serve_prompt(td_rreq_t *q);

static void
text_prompt_run(void *arg)
{
    td_rtext_prompt_run(((td_rreq_t *)arg)->text);
}

static void
text_tokens_run(void *arg)
{
    td_rtext_tokens_run(((td_rreq_t *)arg)->text);
}

/* A text job is back: false when the request is no longer there to use it
 * (ended: freed now; or the table is being destroyed). */
static bool
text_back(td_rreq_t *q)
{
    q->text_busy = false;
    if (q->ended) {
        request_release(q);
        return false;
    }
    return !q->t->closing;
}

/* The prompt job is back: refuse, fail, or go on to admission. */
static void
text_prompt_done(void *arg)
{
    td_rreq_t *q = arg;
    const td_rtext_res_t *r;

    if (!text_back(q))
        return;
    r = td_rtext_result(q->text);
    if (r->refused) {
        request_refuse(q, &r->err);
        return;
    }
    if (r->st != TD_OK) {
        request_fail(q, r->err.http == 400 ? TD_ERRREASON_BAD_REQUEST : TD_ERRREASON_INTERNAL,
                     &r->err);
        return;
    }
    q->oreq = td_rtext_req(q->text);
    q->prompt = td_rtext_take_prompt(q->text, &q->nprompt);
    td_rcache_prompt_init(&q->cprompt, q->t->cfg.cache_seed, q->prompt, q->nprompt);
    serve_prompt(q);
}

/* What a tokens job made: sent; the request done, failed, or the next
 * batch taken. */
static void
text_tokens_apply(td_rreq_t *q)
{
    const td_rtext_res_t *r = td_rtext_result(q->text);

    if (r->st != TD_OK) {
        request_fail(q, TD_ERRREASON_INTERNAL, &r->err);
        return;
    }
    if (r->cut & ~q->choice_end) {   /* a stop string ended them: their tokens are ignored */
        uint64_t cut = r->cut & ~q->choice_end;
        q->choice_end |= r->cut;
        q->text_end = q->choice_end == choices_all(q);
        if (!r->ended)
            send_cancel_choices(q, cut);
    }
    if (r->ended) {
        request_done(q, r->by_us);
        return;
    }
    if (q->streaming)
        stream_send(q, td_rtext_out(q->text));
    td_rtext_out_reset(q->text);
    text_kick(q);
}

static void
text_tokens_done(void *arg)
{
    td_rreq_t *q = arg;

    if (text_back(q))
        text_tokens_apply(q);
}

/* Turn the tokens pushed so far into text: a batch of weight up to
 * text_inline_max (tokens times 1 + alternatives, rtext.h) at once, a larger
 * one on a text thread; never two jobs of one request at a time, so its
 * text stays in order (what arrives meanwhile waits for the next job). */
static void
text_kick(td_rreq_t *q)
{
    size_t weight;

    if (q->text_busy)
        return;
    weight = td_rtext_tokens_take(q->text);
    if (weight == 0)
        return;
    if (weight <= q->t->cfg.text_inline_max && !td_rtext_off_loop(q->text)) {
        /* cheaper than a thread and back */
        td_rtext_tokens_run(q->text);
        text_tokens_apply(q);
        return;
    }
    if (td_jobq_post(q->t->pool, text_tokens_run, text_tokens_done, q) != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    q->text_busy = true;
}

/* Append n received tokens to q->gen (once it failed, never again). */
static td_status_t
gen_push(td_rreq_t *q, const int32_t *tokens, size_t n)
{
    if (n == 0 || (q->gen == NULL && q->ntokens > 0))
        return TD_OK;   /* nothing, or dropped before */
    if (q->ntokens + n > q->gencap) {
        size_t cap = q->gencap ? q->gencap : 64;
        while (cap < q->ntokens + n)
            cap *= 2;
        int32_t *g = realloc(q->gen, cap * sizeof(*g));
        if (g == NULL)
            return TD_ERR_NOMEM;
        q->gen = g;
        q->gencap = cap;
    }
    memcpy(q->gen + q->ntokens, tokens, n * sizeof(*tokens));
    return TD_OK;
}

/* rk keeps q's state over its first n tokens (prompt, then completion):
 * into the table, for a next turn to find. */
static void
kept_note(td_rreq_t *q, td_rrank_t *rk, uint64_t n)
{
    td_rreq_tab_t *t = q->t;
    int32_t *seq;

    if (t->conv == NULL || q->gen == NULL || n < q->nprompt || n > q->nprompt + q->ntokens) {
        if (t->conv != NULL)
            td_debug("request %016" PRIx64 ": kept state of %" PRIu64 " tokens not noted",
                     q->id, n);
        return;
    }
    seq = malloc(n * sizeof(*seq));
    if (seq == NULL)
        return;
    memcpy(seq, q->prompt, q->nprompt * sizeof(*seq));
    memcpy(seq + q->nprompt, q->gen, (n - q->nprompt) * sizeof(*seq));
    if (td_rconv_add(t->conv, rk, q->id, t->cfg.cache_seed, seq, n) == TD_OK)
        t->cfg.metrics->kept_noted++;
    free(seq);
}

/* A Tokens message that fits: its tokens (never more than max_tokens per
 * choice) to the text work, with the choice's end when it ends here. */
static void
tokens_take(td_rreq_t *q, td_rrank_t *rk, const Tandem__Tokens *tk)
{
    uint32_t c = tk->choice, max = q->oreq->sampling.max_tokens;
    size_t n = tk->n_tokens;

    if (q->choice_tokens[c] + n > max)   /* never more than asked for */
        n = max - q->choice_tokens[c];
    if (q->t->conv != NULL && q->oreq->n == 1 && gen_push(q, tk->tokens, n) != TD_OK) {
        free(q->gen);   /* its state cannot be found again: not noted */
        q->gen = NULL;
        q->gencap = 0;
    }
    q->choice_tokens[c] += (uint32_t)n;
    q->ntokens += (uint32_t)n;
    q->t->cfg.metrics->completion_tokens += n;
    if (tk->retained_tokens > 0 && tk->finish != TANDEM__FINISH__FINISH_NONE &&
        q->oreq->n == 1) {
        kept_note(q, rk, tk->retained_tokens);
        /* no Released follows: the row is free now, the blocks yield to admissions */
        td_rrank_admit_freed(rk, admit_need(q));
        td_rqueue_kick(q->t->queue);
    }
    /* a stop token ends it (never one cut by max_tokens: then it is not last) */
    if (td_rtext_push(q->text, c, tk->tokens, n,
                      tk->finish == TANDEM__FINISH__FINISH_STOP && n == tk->n_tokens,
                      q->oreq->out.logprobs ? tk->logprobs : NULL) != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    if (tk->finish != TANDEM__FINISH__FINISH_NONE || q->choice_tokens[c] >= max) {
        td_openai_finish_t finish = tk->finish != TANDEM__FINISH__FINISH_NONE
                                        ? finish_of(tk->finish) : TD_OPENAI_FINISH_LENGTH;
        bool by_us = tk->finish == TANDEM__FINISH__FINISH_NONE;

        q->choice_end |= 1ull << c;
        q->text_end = q->choice_end == choices_all(q);
        if (q->prefill != NULL) {   /* PrefillDone not in yet: its cached count is wanted */
            q->held_end |= 1ull << c;
            q->held_by_us |= (uint64_t)by_us << c;
            q->held_finish[c] = finish;
        } else {
            td_rtext_push_end(q->text, c, finish, by_us);
        }
    }
    text_kick(q);
}

static void
on_tokens(td_rreq_t *q, td_rrank_t *rk, const Tandem__Envelope *env)
{
    const Tandem__Tokens *tk = env->tokens;
    td_metrics_t *m = q->t->cfg.metrics;
    uint64_t now = now_ns();
    char why[160];

    if (q->text_end) {   /* the reply is being finished; the ranks get Cancel after */
        td_debug("request %016" PRIx64 ": tokens after the end of the reply: ignored", q->id);
        return;
    }
    if (q->paused && tk->finish == TANDEM__FINISH__FINISH_CANCELED) {
        unbind_rank(q, &q->decode);   /* the rank ended it for its paused budget */
        flow_slow_fail(q, true);
        return;
    }
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
    if (q->choice_end >> tk->choice & 1) {   /* the router ended that choice already */
        td_debug("request %016" PRIx64 ": tokens of choice %u after its end: ignored", q->id,
                 tk->choice);
        return;
    }
    tokens_take(q, rk, tk);
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

    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_FORGET) {
        for (size_t i = 0; t->conv != NULL && i < env->forget->n_req_ids; i++)
            td_rconv_remove(t->conv, env->forget->req_ids[i]);
        return;
    }
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
            td_log_peer(&rk->log, TD_LOG_WARN, "%s: %s for request %016" PRIx64
                           ", which is %s: does not fit; ignored", td_ctl_conn_name(rk->conn),
                           rreq_msgs[i].name, id, td_rreq_state_str(q->state));
            return;
        }
        if (rk != (rreq_msgs[i].from_decode ? q->decode : q->prefill)) {
            td_log_peer(&rk->log, TD_LOG_WARN, "%s: %s for request %016" PRIx64
                           ": not its %s rank; ignored", td_ctl_conn_name(rk->conn),
                           rreq_msgs[i].name, id, rreq_msgs[i].from_decode ? "decode"
                                                                           : "prefill");
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
            else
                end_release(q);
        }
        q = next;
    }
    if (t->conv != NULL)
        td_rconv_remove_rank(t->conv, rk);
    td_rqueue_kick(t->queue);   /* the waiting may have no rank left */
}

/* ======================================================================= */
/* Serving                                                                   */
/* ======================================================================= */

/* The client went away before its answer was complete (http.c frees the
 * HTTP request once this returns). */
static void
on_client_gone(td_http_req_t *hreq, void *arg)
{
    td_rreq_t *q = arg;

    q->http = NULL;
    request_cancel(q, "client disconnected");
}

static void
on_timeout(evutil_socket_t fd, short what, void *arg)
{
    request_fail_simple(arg, TD_ERRREASON_TIMEOUT, "the request timed out");
}

/* Watch the client and the clock while q is served: a client that goes away
 * or a timeout ends q even while its prompt is being tokenized. */
static td_status_t
serve_watch(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;

    if (t->cfg.request_timeout_ms) {
        struct timeval tv = td_ctl_timeval_ms((uint32_t)t->cfg.request_timeout_ms);
        q->timer = evtimer_new(t->cfg.base, on_timeout, q);
        if (!q->timer)
            return TD_ERR_NOMEM;
        evtimer_add(q->timer, &tv);
    }
    td_http_on_gone(q->http, on_client_gone, q);
    return TD_OK;
}

/* Take the request: in the table at once (state new: the admin API lists
 * it, a cancel, a timeout or the client going away end it), its body parsed
 * and its prompt encoded and tokenized by a text thread, or by the loop for a
 * body of at most text_inline_body bytes (text_prompt_done goes on). */
void
td_rreq_serve(td_rreq_tab_t *t, td_http_req_t *hreq, td_openai_kind_t kind)
{
    td_openai_err_t e;
    td_rreq_t *q;
    td_status_t st;

    if (t->stopping) {
        rreq_refuse_stopping(t, hreq);
        return;
    }
    q = calloc(1, sizeof *q);
    if (q)
        q->id = id_next(t);
    if (!q || hash_add(t, q) != TD_OK) {
        free(q);
        td_openai_err_internal(&e, "out of memory");
        td_http_refuse(t->cfg.metrics, hreq, &e);
        return;
    }
    q->t = t;
    q->kind = kind;
    q->http = hreq;
    q->t_start = now_ns();
    q->t_last = q->t_start;
    td_rqueue_entry_init(t->queue, &q->qe, 0);   /* its place; its priority once parsed */
    q->next = t->head;
    if (t->head)
        t->head->prev = q;
    t->head = q;
    t->n++;

    if (td_openai_id_new(kind, q->oid) != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "no randomness for the request id");
        return;
    }
    if (td_rtext_create(&t->text_cfg, kind, q->oid, hreq,
                        &q->text) != TD_OK ||
        serve_watch(q) != TD_OK) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    q->text_busy = true;
    if (td_rtext_body_len(q->text) <= t->cfg.text_inline_body &&
        !td_rtext_prompt_off_loop(q->text)) {
        /* a small body: cheaper on the loop than a thread and back */
        text_prompt_run(q);
        text_prompt_done(q);
        return;
    }
    st = td_rtext_body_len(q->text) > TEXT_LONG_BODY
             ? td_jobq_post_long(t->pool, text_prompt_run, text_prompt_done, q)
             : td_jobq_post(t->pool, text_prompt_run, text_prompt_done, q);
    if (st != TD_OK) {
        q->text_busy = false;
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
    }
}

/* The prompt is tokenized: the request's wire parameters, then admission. */
static void
serve_prompt(td_rreq_t *q)
{
    td_rreq_tab_t *t = q->t;
    td_ireq_t *oreq = q->oreq;
    td_openai_err_t e;

    if (!oreq->sampling.has_seed)
        oreq->sampling.seed = (int64_t)td_daemon_random64();
    q->qe.priority = oreq->priority;   /* its place in the queue was taken on arrival */
    if (q->nprompt == 0) {
        td_openai_err_set(&e, 400, "invalid_request_error", "prompt", "invalid_value",
                          "The prompt is empty.");
        request_fail(q, TD_ERRREASON_BAD_REQUEST, &e);
        return;
    }
    q->nstop_ids = td_ireq_stop_ids(oreq, t->cfg.api, q->stop_ids);
    if ((q->choice_tokens = calloc(oreq->n, sizeof *q->choice_tokens)) == NULL ||
        (q->held_finish = calloc(oreq->n, sizeof *q->held_finish)) == NULL) {
        request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
        return;
    }
    if (oreq->sampling.nbias > 0) {
        q->wbias = calloc(oreq->sampling.nbias, sizeof *q->wbias);
        q->wbiasp = calloc(oreq->sampling.nbias, sizeof *q->wbiasp);
        if (!q->wbias || !q->wbiasp) {
            request_fail_simple(q, TD_ERRREASON_INTERNAL, "out of memory");
            return;
        }
        for (size_t i = 0; i < oreq->sampling.nbias; i++) {
            tandem__logit_bias__init(&q->wbias[i]);
            q->wbias[i].token = oreq->sampling.logit_bias[i].token;
            q->wbias[i].bias = oreq->sampling.logit_bias[i].bias;
            q->wbiasp[i] = &q->wbias[i];
        }
    }
    constraint_fill(q);
    t->cfg.metrics->prompt_tokens += q->nprompt;
    td_debug("request %016" PRIx64 ": %s, %zu prompt tokens, max_tokens %u%s", q->id,
             oreq->kind == TD_OPENAI_CHAT ? "chat" : "completion", q->nprompt,
             oreq->sampling.max_tokens, oreq->out.stream ? ", streamed" : "");
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
rreq_refuse_stopping(td_rreq_tab_t *t, td_http_req_t *hreq)
{
    td_openai_err_t e;

    shutdown_err(t, &e, "it takes no new requests");
    t->cfg.metrics->errors[TD_ERRREASON_SHUTDOWN]++;
    t->cfg.metrics->requests[TD_OUTCOME_REJECTED]++;
    td_debug("request refused: the router is shutting down");
    td_http_add_header(hreq, "Connection", "close");
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

td_jobq_t *
td_rreq_text_pool(td_rreq_tab_t *t)
{
    return t->pool;
}

const td_rtext_cfg_t *
td_rreq_text_cfg(const td_rreq_tab_t *t)
{
    return &t->text_cfg;
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
            "{s:s, s:s, s:s, s:s, s:b, s:I, s:I, s:I, s:o, s:o, s:I, s:I, s:i}",
            "id", id, "openai_id", q->oid, "state", td_rreq_state_str(q->state),
            "kind", q->kind == TD_OPENAI_CHAT ? "chat" : "completion",
            "stream", q->oreq && q->oreq->out.stream, "prompt_tokens", (json_int_t)q->nprompt,
            "completion_tokens", (json_int_t)q->ntokens,
            "max_tokens", (json_int_t)(q->oreq ? q->oreq->sampling.max_tokens : 0),
            "decode", rank_ref(q->decode), "prefill", rank_ref(q->prefill),
            "attempts", (json_int_t)q->attempts,
            "age_ms", (json_int_t)((now - q->t_start) / 1000000u),
            "priority", (int)q->qe.priority));
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
    const td_rqueue_config_t qc = { .base = cfg->base, .max_queued = cfg->max_queued,
                                    .timeout_ms = cfg->queue_timeout_ms,
                                    .wait = &cfg->metrics->queue_wait };
    td_rreq_tab_t *t = calloc(1, sizeof *t);
    td_status_t st;

    if (!t) {
        td_error("requests: out of memory for the request table");
        return TD_ERR_NOMEM;
    }
    t->cfg = *cfg;
    if ((st = td_hmap_create(REQTAB_HINT, &t->byid)) != TD_OK) {
        td_error("requests: out of memory for the request table");
        goto err_free_tab;
    }
    t->text_cfg = (td_rtext_cfg_t){ .api = cfg->api, .tok = cfg->tok, .v41 = cfg->v41,
                                    .model = cfg->model, .fingerprint = cfg->fingerprint,
                                    .store = cfg->store };
    st = td_jobq_create_pool(cfg->base, "rtext", cfg->text_threads ? cfg->text_threads : 1,
                             NULL, NULL, &t->pool);   /* logs */
    if (st != TD_OK)
        goto err_free_tab;
    st = td_rqueue_create(&qc, &(td_rqueue_handlers_t){ .on_pass = queue_pass,
                                                        .on_expired = queue_on_expired,
                                                        .arg = t },
                          &t->queue);
    if (st != TD_OK)
        goto err_free_pool;
    if (cfg->continue_max_suffix > 0 &&
        (st = td_rconv_create(cfg->continue_max_states, &t->conv)) != TD_OK) {
        td_error("requests: out of memory for the kept-state table");
        td_rqueue_destroy(t->queue);
        goto err_free_pool;
    }
    *out = t;
    return TD_OK;

err_free_pool:
    td_jobq_destroy(t->pool);
err_free_tab:
    td_hmap_destroy(t->byid);
    free(t);
    return st;
}

void
td_rreq_tab_destroy(td_rreq_tab_t *t)
{
    if (!t)
        return;
    t->on_idle = NULL;   /* exiting: nobody waits for the table to empty */
    /* the text threads first: the jobs that ran come back (text_back frees
     * the ended requests and leaves the others), those not started are
     * dropped; then nothing runs and every request can go */
    t->closing = true;
    td_jobq_destroy(t->pool);
    while (t->head) {
        td_rreq_t *q = t->head;
        http_detach(q);   /* the listeners, closed after, free the HTTP side */
        q->text_busy = false;
        request_end(q);
    }
    while (t->zombies)
        request_release(t->zombies);
    td_rqueue_destroy(t->queue);
    td_rconv_destroy(t->conv);
    td_buf_free(&t->sse);
    td_hmap_destroy(t->byid);
    free(t);
}
