/* routerd/rtext.c — a request's CPU work for routerd's text threads: the
 * body parsed into the request model, the prompt encoded and tokenized; each
 * choice's generated tokens through the one reply reader (reply.h) into SSE
 * events or the answer (rtext.h says who may touch what, when). */
#include "rtext.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adapt-anthropic.h"
#include "adapt-openai.h"
#include "adapt-responses.h"
#include "anthropic.h"
#include "apikeys.h"
#include "oresp.h"
#include "rstore.h"
#include "chat_prompt.h"
#include "chat_reply.h"
#include "reply.h"

#define RTEXT_SLICE 64   /* tokens decoded between looks at the cancel flag */

/* Tokens waiting for a job, message by message. */
typedef struct {
    uint32_t *ids;          /* [n] */
    double *lp;             /* [n] log-probability of each, when asked */
    uint32_t *ntop;         /* [n] alternatives of each */
    int32_t *top_id;        /* [ntops] the alternatives, token after token */
    double *top_lp;         /* [ntops] */
    size_t *msg_end;        /* [nmsgs] where each message's tokens end */
    uint32_t *msg_choice;   /* [nmsgs] the choice each message is of, bit 31: its last
                               token is a stop token */
    size_t n, ntops, nmsgs;
    size_t cap_ids, cap_lp, cap_ntop, cap_top_id, cap_top_lp, cap_msgs, cap_choice;
    uint64_t end;           /* bit i: choice i ends after these */
    td_openai_finish_t finish[TD_IREQ_MAX_N];
    uint64_t by_us;         /* bit i: ... because max_tokens was reached */
    size_t weight;
    uint64_t cached;        /* > 0: prompt tokens the prefill rank served from its cache */
} rtext_batch_t;

struct td_rtext_s {
    const td_rtext_cfg_t *cfg;
    td_openai_kind_t kind;
    const char *oid;
    atomic_bool canceled;
    char *body;                     /* NUL-terminated, until the prompt job has parsed it */
    size_t body_len;
    td_ireq_t *oreq;                /* once parsed; the caller borrows it */
    int32_t *prompt;                /* until the caller takes it */
    size_t nprompt;
    bool streaming;                 /* td_rtext_stream_start: SSE from now on */
    td_reply_t **replies;           /* [nreplies]: one reader per choice */
    uint32_t nreplies;
    td_openai_stream_t stream;
    td_anthropic_stream_t astream;  /* Messages' stream */
    uint64_t by_string;             /* bit i: a stop string ended choice i */
    bool thinking;                  /* the reply begins in reasoning */
    td_oresp_t oresp;               /* Responses' response (once parsed: output set) */
    uint64_t seq_sent;              /* its events handed out (the loop's copy) */
    bool store;                     /* Responses: the response is stored when done */
    char owner[TD_APIKEYS_OWNER_LEN];   /* the key's digest: what it stores is its own */
    uint64_t cached;                /* prompt tokens served from a prefix cache (usage) */
    bool ended;                     /* every choice is complete: nothing more is decoded */
    rtext_batch_t inbox;            /* the loop's: pushed since the last take */
    rtext_batch_t work;             /* the job's */
    td_rtext_res_t res;
    td_buf_t out;
};

/* ======================================================================= */
/* Life                                                                      */
/* ======================================================================= */

td_status_t
td_rtext_create(const td_rtext_cfg_t *cfg, td_openai_kind_t kind, const char *oid,
                td_http_req_t *hreq, td_rtext_t **out)
{
    td_rtext_t *x = calloc(1, sizeof *x);

    if (!x)
        return TD_ERR_NOMEM;
    x->body = td_http_body_take(hreq, &x->body_len);
    if (!x->body) {
        free(x);
        return TD_ERR_NOMEM;
    }
    x->cfg = cfg;
    x->kind = kind;
    x->oid = oid;
    td_apikeys_owner(td_http_header(hreq, "Authorization"), td_http_header(hreq, "x-api-key"),
                     x->owner);
    atomic_init(&x->canceled, false);
    *out = x;
    return TD_OK;
}

static void
batch_free(rtext_batch_t *b)
{
    free(b->ids);
    free(b->lp);
    free(b->ntop);
    free(b->top_id);
    free(b->top_lp);
    free(b->msg_end);
    free(b->msg_choice);
}

void
td_rtext_destroy(td_rtext_t *x)
{
    if (!x)
        return;
    free(x->body);
    free(x->prompt);
    td_oresp_fini(&x->oresp);
    for (uint32_t i = 0; i < x->nreplies; i++)
        td_reply_destroy(x->replies[i]);
    free(x->replies);
    td_ireq_destroy(x->oreq);
    td_buf_free(&x->out);
    batch_free(&x->inbox);
    batch_free(&x->work);
    free(x);
}

void
td_rtext_cancel(td_rtext_t *x)
{
    atomic_store_explicit(&x->canceled, true, memory_order_relaxed);
}

static bool
canceled(td_rtext_t *x)
{
    return atomic_load_explicit(&x->canceled, memory_order_relaxed);
}

size_t
td_rtext_body_len(const td_rtext_t *x)
{
    return x->body ? x->body_len : 0;
}

const td_rtext_res_t *
td_rtext_result(const td_rtext_t *x)
{
    return &x->res;
}

const td_buf_t *
td_rtext_out(const td_rtext_t *x)
{
    return &x->out;
}

void
td_rtext_out_reset(td_rtext_t *x)
{
    td_buf_reset(&x->out);
    x->seq_sent = x->oresp.seq;   /* the loop, no job running: what went out */
}

static void
res_fail(td_rtext_t *x, td_status_t st, const char *what)
{
    x->res.st = st;
    td_openai_err_set(&x->res.err, 500, "server_error", NULL, NULL,
                      "The server had an error while processing your request: %s.", what);
}

/* ======================================================================= */
/* The prompt                                                                */
/* ======================================================================= */

/* The prompt text of the stand-in (no V4.1 tokenizer): chat messages joined
 * as "<role>: <content>\n" followed by "assistant: ". */
static td_status_t
prompt_text(const td_ireq_t *o, td_buf_t *out)
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

/* One reply reader per choice; chat: how the V4.1 reader reads them (NULL:
 * plain text). */
static td_status_t
replies_create(td_rtext_t *x, const td_chat_reply_opts_t *chat)
{
    td_chat_reply_opts_t opts;

    if (chat != NULL) {
        opts = *chat;
        opts.stop_include = x->oreq->stop.include_stop_str;
        /* the Messages and Responses events carry the arguments piece by piece */
        opts.split_args = x->kind == TD_OPENAI_MESSAGES || x->kind == TD_OPENAI_RESPONSES;
    }
    x->replies = calloc(x->oreq->n, sizeof *x->replies);
    if (x->replies == NULL)
        return TD_ERR_NOMEM;
    for (; x->nreplies < x->oreq->n; x->nreplies++) {
        td_reply_cfg_t rc = { .tok = x->cfg->tok, .req = x->oreq,
                              .chat = chat ? &opts : NULL, .index = x->nreplies };
        td_status_t st = td_reply_create(&rc, &x->replies[x->nreplies]);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

/* With the V4.1 tokenizer, a chat request is rendered in the V4.1 chat
 * format (its reply read back by the V4.1 reader: *chat); a request the
 * format cannot express gets a 400. */
static td_status_t
encode_chat(const td_rtext_cfg_t *cfg, const td_ireq_t *o, uint32_t **ids, size_t *n,
            td_chat_prompt_t **chat, td_openai_err_t *err)
{
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t ce;
    td_chat_prompt_opts_t opts = { .thinking = o->reasoning.thinking };
    td_status_t st;

    memset(&ce, 0, sizeof ce);
    st = td_chat_prompt_encode(o->body, &opts, &p, &ce);
    if (st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED) {
        td_openai_err_set(err, 400, "invalid_request_error", ce.param[0] ? ce.param : NULL,
                          ce.code, "%s", ce.message);
        return st;
    }
    if (st == TD_OK)
        st = td_chat_prompt_ids(p, cfg->v41, ids, n);
    if (st == TD_OK && chat != NULL)
        *chat = p;
    else
        td_chat_prompt_destroy(p);
    if (st != TD_OK)
        td_openai_err_internal(err, "could not encode the chat prompt");
    return st;
}

td_status_t
td_rtext_prompt_ids(const td_rtext_cfg_t *cfg, const td_ireq_t *o, uint32_t **ids, size_t *n,
                    td_chat_prompt_t **chat, td_openai_err_t *err)
{
    td_buf_t text = {0};
    td_status_t st;

    if (chat != NULL)
        *chat = NULL;
    if (cfg->v41 && o->kind != TD_OPENAI_COMPLETION)
        return encode_chat(cfg, o, ids, n, chat, err);
    if (o->prompt_ids) {   /* token ids, checked against the vocabulary by the parser */
        if ((*ids = malloc(o->nprompt_ids * sizeof **ids)) == NULL) {
            td_openai_err_internal(err, "out of memory");
            return TD_ERR_NOMEM;
        }
        memcpy(*ids, o->prompt_ids, o->nprompt_ids * sizeof **ids);
        *n = o->nprompt_ids;
        return TD_OK;
    }
    st = prompt_text(o, &text);
    if (st == TD_OK)
        st = td_tok_encode(cfg->tok, text.data ? text.data : "", text.len, ids, n);
    td_buf_free(&text);
    if (st != TD_OK)
        td_openai_err_internal(err, "could not tokenize the prompt");
    return st;
}

/* The request's prompt ids, and its reply readers. */
static td_status_t
prompt_tokens(td_rtext_t *x)
{
    td_chat_prompt_t *chat = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st = td_rtext_prompt_ids(x->cfg, x->oreq, &ids, &n, &chat, &x->res.err);

    if (st != TD_OK)
        return x->res.st = st;
    st = replies_create(x, chat ? &chat->reply : NULL);
    x->thinking = chat && chat->reply.start == TD_CHAT_REPLY_START_REASONING;
    td_chat_prompt_destroy(chat);
    if (st != TD_OK) {
        free(ids);
        res_fail(x, st, "out of memory");
        return st;
    }
    x->prompt = (int32_t *)ids;   /* ids < vocab_size <= INT32_MAX: same bits */
    x->nprompt = n;
    return TD_OK;
}

/* A Responses body: the conversation of its previous_response_id from the
 * store (this thread is a text thread: the store's I/O may run here), then
 * the adapter. */
static td_status_t
responses_parse(td_rtext_t *x)
{
    json_error_t jerr;
    json_t *body, *rec = NULL;
    const char *prev;
    td_status_t st;

    if (x->body_len > x->cfg->api->max_body) {
        td_openai_err_too_big(&x->res.err, x->body_len, x->cfg->api->max_body);
        return TD_ERR_TOO_BIG;
    }
    body = json_loadb(x->body, x->body_len, 0, &jerr);
    if (!json_is_object(body)) {
        td_openai_err_set(&x->res.err, 400, "invalid_request_error", NULL, NULL,
                          "We could not parse the JSON body of your request: %s. The API "
                          "expects a JSON object.", body ? "not an object" : jerr.text);
        json_decref(body);
        return TD_ERR_INVALID;
    }
    st = td_adapt_responses_prev_id(body, &prev, &x->res.err);
    if (st == TD_OK && prev != NULL &&
        (x->cfg->store == NULL || td_rstore_get(x->cfg->store, prev, x->owner, &rec) != TD_OK)) {
        td_openai_err_set(&x->res.err, 404, "invalid_request_error", "previous_response_id",
                          "previous_response_not_found",
                          "Previous response with id '%.96s' not found.%s", prev,
                          x->cfg->store ? "" : " (This server stores no responses: it runs "
                                               "without responses-dir.)");
        st = TD_ERR_NOT_FOUND;
    }
    if (st == TD_OK)
        st = td_adapt_responses_parse(x->cfg->api, body, json_object_get(rec, "conv"),
                                      &x->oreq, &x->res.err);
    x->store = st == TD_OK && x->cfg->store != NULL &&
               json_is_true(json_object_get(x->oreq->proto, "store"));
    json_decref(rec);
    json_decref(body);
    return st;
}

bool
td_rtext_off_loop(const td_rtext_t *x)
{
    return x->store;
}

bool
td_rtext_prompt_off_loop(const td_rtext_t *x)
{
    return x->kind == TD_OPENAI_RESPONSES && x->cfg->store != NULL;
}

void
td_rtext_prompt_run(td_rtext_t *x)
{
    const td_ireq_t *o;
    td_status_t st;

    memset(&x->res, 0, sizeof x->res);
    if (canceled(x))
        return;
    st = x->kind == TD_OPENAI_MESSAGES
             ? td_adapt_anthropic_parse(x->cfg->api, false, x->body, x->body_len, &x->oreq,
                                        &x->res.err)
         : x->kind == TD_OPENAI_RESPONSES
             ? responses_parse(x)
             : td_adapt_openai_parse(x->cfg->api, x->kind, x->body, x->body_len, &x->oreq,
                                     &x->res.err);
    free(x->body);
    x->body = NULL;
    if (st != TD_OK) {
        x->res.st = st;
        x->res.refused = true;
        return;
    }
    o = x->oreq;
    if (prompt_tokens(x) != TD_OK)
        return;
    x->stream.meta = (td_openai_meta_t){ .kind = o->kind, .id = x->oid,
                                         .created = (int64_t)time(NULL),
                                         .model = x->cfg->model,
                                         .fingerprint = x->cfg->fingerprint };
    x->stream.include_usage = o->out.include_usage;
    x->astream = (td_anthropic_stream_t){ .id = x->oid, .model = x->cfg->model,
                                          .thinking = x->thinking };
    if (o->kind == TD_OPENAI_RESPONSES &&
        td_oresp_init(&x->oresp, x->oid, x->stream.meta.created,
                      json_object_get(o->proto, "echo"), x->store) != TD_OK)
        res_fail(x, TD_ERR_NOMEM, "out of memory");
}

td_ireq_t *
td_rtext_req(td_rtext_t *x)
{
    return x->oreq;
}

int32_t *
td_rtext_take_prompt(td_rtext_t *x, size_t *n)
{
    int32_t *p = x->prompt;

    *n = x->nprompt;
    x->prompt = NULL;
    return p;
}

/* ======================================================================= */
/* Pushing tokens (the loop)                                                 */
/* ======================================================================= */

/* Room for need elements of size sz in *arr (capacity *cap). */
static td_status_t
grow(void **arr, size_t *cap, size_t need, size_t sz)
{
    size_t c = *cap ? *cap : 16;
    void *p;

    if (need <= *cap)
        return TD_OK;
    while (c < need)
        c *= 2;
    p = realloc(*arr, c * sz);
    if (!p)
        return TD_ERR_NOMEM;
    *arr = p;
    *cap = c;
    return TD_OK;
}

#define RTEXT_MSG_STOP (1u << 31)

td_status_t
td_rtext_push(td_rtext_t *x, uint32_t choice, const int32_t *ids, size_t n, bool last_stop,
              Tandem__TokenLogprob *const *lps)
{
    rtext_batch_t *b = &x->inbox;
    size_t ntop = 0;

    if (lps)
        for (size_t i = 0; i < n; i++)
            ntop += lps[i]->n_top;
    if (grow((void **)&b->ids, &b->cap_ids, b->n + n, sizeof *b->ids) != TD_OK ||
        grow((void **)&b->msg_end, &b->cap_msgs, b->nmsgs + 1, sizeof *b->msg_end) != TD_OK ||
        grow((void **)&b->msg_choice, &b->cap_choice, b->nmsgs + 1, sizeof *b->msg_choice) !=
            TD_OK)
        return TD_ERR_NOMEM;
    if (lps && (grow((void **)&b->lp, &b->cap_lp, b->n + n, sizeof *b->lp) != TD_OK ||
                grow((void **)&b->ntop, &b->cap_ntop, b->n + n, sizeof *b->ntop) != TD_OK ||
                grow((void **)&b->top_id, &b->cap_top_id, b->ntops + ntop, sizeof *b->top_id) !=
                    TD_OK ||
                grow((void **)&b->top_lp, &b->cap_top_lp, b->ntops + ntop, sizeof *b->top_lp) !=
                    TD_OK))
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        b->ids[b->n + i] = (uint32_t)ids[i];
        if (!lps)
            continue;
        b->lp[b->n + i] = lps[i]->logprob;
        b->ntop[b->n + i] = (uint32_t)lps[i]->n_top;
        for (size_t k = 0; k < lps[i]->n_top; k++) {
            b->top_id[b->ntops] = lps[i]->top[k]->token;
            b->top_lp[b->ntops++] = lps[i]->top[k]->logprob;
        }
    }
    b->n += n;
    b->msg_choice[b->nmsgs] = choice | (last_stop && n > 0 ? RTEXT_MSG_STOP : 0);
    b->msg_end[b->nmsgs++] = b->n;
    b->weight += n + ntop;
    return TD_OK;
}

void
td_rtext_push_end(td_rtext_t *x, uint32_t choice, td_openai_finish_t finish, bool by_us)
{
    if (choice >= TD_IREQ_MAX_N)
        return;
    x->inbox.end |= 1ull << choice;
    x->inbox.finish[choice] = finish;
    if (by_us)
        x->inbox.by_us |= 1ull << choice;
    x->inbox.weight++;
}

void
td_rtext_push_cached(td_rtext_t *x, uint64_t n)
{
    x->inbox.cached = n;
}

size_t
td_rtext_tokens_take(td_rtext_t *x)
{
    rtext_batch_t t = x->work;
    size_t w = x->inbox.weight;

    /* swap, so that both keep their arrays; the new inbox starts empty */
    x->work = x->inbox;
    x->inbox = t;
    x->inbox.n = x->inbox.ntops = x->inbox.nmsgs = x->inbox.weight = 0;
    x->inbox.end = x->inbox.by_us = 0;
    x->inbox.cached = 0;
    return w;
}

/* ======================================================================= */
/* Tokens to text (the job)                                                  */
/* ======================================================================= */

/* A streamed reply's delta as its protocol's chunk (the reply reader's
 * emit function; non-streaming requests take the whole reply at the end). */
static td_status_t
reply_emit(void *arg, td_reply_t *rp, const td_chat_reply_delta_t *d)
{
    td_rtext_t *x = arg;
    uint32_t i = td_reply_index(rp);
    td_openai_logprobs_t *lp = td_reply_logprobs(rp);
    json_t *delta = NULL;

    if (x->kind == TD_OPENAI_MESSAGES)
        return td_anthropic_stream_delta(&x->astream, d, &x->out);
    if (x->kind == TD_OPENAI_RESPONSES)
        return td_oresp_delta(&x->oresp, d, &x->out);
    switch (d->kind) {
    case TD_CHAT_REPLY_DELTA_CONTENT:
        return td_openai_stream_text(&x->stream, i, lp, d->text, d->len, &x->out);
    case TD_CHAT_REPLY_DELTA_REASONING:
        delta = json_pack("{s:s%}", "reasoning_content", d->text, d->len);
        break;
    case TD_CHAT_REPLY_DELTA_TOOL_CALL:
        delta = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index",
                          (int)d->index, "id", d->id, "type", "function", "function",
                          "name", d->name, "arguments", "");
        break;
    case TD_CHAT_REPLY_DELTA_TOOL_ARGS:
        delta = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", (int)d->index,
                          "function", "arguments", d->text, d->len);
        break;
    }
    return delta ? td_openai_stream_delta(&x->stream, i, lp, delta, &x->out) : TD_ERR_NOMEM;
}

td_status_t
td_rtext_stream_start(td_rtext_t *x, td_buf_t *out)
{
    td_status_t st = TD_OK;

    x->streaming = true;
    if (x->kind == TD_OPENAI_MESSAGES) {
        td_anthropic_usage_t u = { .input_tokens = (uint32_t)x->nprompt };
        return td_anthropic_stream_start(&x->astream, &u, out);
    }
    if (x->kind == TD_OPENAI_RESPONSES) {
        st = td_oresp_start(&x->oresp, out);
        x->seq_sent = x->oresp.seq;
        return st;
    }
    for (uint32_t i = 0; st == TD_OK && i < x->nreplies; i++)
        st = td_openai_stream_text(&x->stream, i, td_reply_logprobs(x->replies[i]), "", 0, out);
    return st;
}

/* One message's tokens through its choice's reader; the choice ends when a
 * stop string matched. */
static td_status_t
tokens_message(td_rtext_t *x, uint32_t m, size_t from, size_t to, size_t *top_at)
{
    const rtext_batch_t *b = &x->work;
    uint32_t c = m & ~RTEXT_MSG_STOP;
    td_reply_t *rp = c < x->nreplies ? x->replies[c] : NULL;
    td_reply_lp_t lps[RTEXT_SLICE];
    bool stopped = false;
    td_status_t st = TD_OK;

    for (size_t i = from; i < to && st == TD_OK && !canceled(x); i += RTEXT_SLICE) {
        size_t k = to - i < RTEXT_SLICE ? to - i : RTEXT_SLICE;

        for (size_t j = 0; b->lp != NULL && x->oreq->out.logprobs && j < k; j++) {
            lps[j] = (td_reply_lp_t){ b->lp[i + j], b->ntop[i + j], b->top_id + *top_at,
                                      b->top_lp + *top_at };
            *top_at += b->ntop[i + j];
        }
        if (rp != NULL && !td_reply_ended(rp))
            st = td_reply_feed(rp, b->ids + i, k, (m & RTEXT_MSG_STOP) && i + k == to,
                               x->oreq->out.logprobs ? lps : NULL,
                               x->streaming ? reply_emit : NULL, x, &stopped);
        if (st == TD_OK && stopped) {
            x->res.cut |= 1ull << c;
            x->by_string |= 1ull << c;
            x->res.by_us = true;
            st = td_reply_end(rp, TD_OPENAI_FINISH_STOP, x->streaming ? reply_emit : NULL, x);
            if (st == TD_OK && x->streaming && x->kind < TD_OPENAI_MESSAGES)
                st = td_openai_stream_choice_end(&x->stream, c, td_reply_logprobs(rp),
                                                 td_reply_finish_reason(rp), &x->out);
        }
    }
    return st;
}

/* A choice the rank (or max_tokens) ended: what its reader held back, and
 * its finish chunk. */
static td_status_t
choice_end(td_rtext_t *x, uint32_t c, td_openai_finish_t finish)
{
    td_reply_t *rp = x->replies[c];
    td_status_t st;

    if (td_reply_ended(rp))
        return TD_OK;
    st = td_reply_end(rp, finish, x->streaming ? reply_emit : NULL, x);
    if (st == TD_OK && x->streaming && x->kind < TD_OPENAI_MESSAGES)
        st = td_openai_stream_choice_end(&x->stream, c, td_reply_logprobs(rp),
                                         td_reply_finish_reason(rp), &x->out);
    return st;
}

/* A Messages reply's end: message_delta and message_stop of a stream, or
 * the message (one choice). */
static td_status_t
messages_finish(td_rtext_t *x, const td_openai_usage_t *usage)
{
    td_reply_t *rp = x->replies[0];
    td_anthropic_usage_t u = { usage->prompt_tokens, usage->completion_tokens,
                               usage->cached_tokens };
    td_anthropic_stop_t stop = { .finish = td_reply_finish_reason(rp),
                                 .by_stop_string = x->by_string & 1,
                                 .stop = td_reply_stop_string(rp) };
    const td_chat_reply_t *cr = td_reply_chat(rp);
    td_chat_reply_t plain = {0};

    if (x->streaming)
        return td_anthropic_stream_end(&x->astream, &stop, &u, &x->out);
    if (cr == NULL) {   /* the stand-in's plain text */
        plain.content = td_reply_text(rp)->data ? td_reply_text(rp)->data : "";
        plain.content_len = td_reply_text(rp)->len;
        cr = &plain;
    }
    td_buf_reset(&x->out);
    return td_anthropic_message_json(x->oid, x->cfg->model, cr, &stop, &u, &x->out);
}

/* The record a stored response keeps: the response, and the conversation
 * its next turn continues (the request's, then the reply). */
static void
responses_store(td_rtext_t *x, json_t *resp)
{
    const td_chat_reply_t *cr = td_reply_chat(x->replies[0]);
    json_t *conv = json_deep_copy(json_object_get(x->oreq->proto, "conv")), *msg = NULL;
    json_t *rec;

    if (cr != NULL)
        td_chat_reply_json(cr, &msg);
    else   /* the stand-in's plain text */
        msg = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                        td_reply_text(x->replies[0])->data ? td_reply_text(x->replies[0])->data
                                                           : "",
                        td_reply_text(x->replies[0])->len);
    if (conv && msg)
        json_array_append(conv, msg);
    json_decref(msg);
    rec = json_pack("{s:O, s:o?}", "response", resp, "conv", conv);
    if (rec != NULL)
        (void)td_rstore_put(x->cfg->store, x->oid, x->owner, rec);   /* logs */
    json_decref(rec);
}

/* A Responses reply's end: its last events, or the response object; stored
 * when asked (the store's I/O: this job runs on a text thread, rreq.c). */
static td_status_t
responses_finish(td_rtext_t *x, const td_openai_usage_t *usage)
{
    td_reply_t *rp = x->replies[0];
    td_oresp_usage_t u = { usage->prompt_tokens, usage->cached_tokens,
                           usage->completion_tokens, td_reply_nreasoning(rp) };
    const td_chat_reply_t *cr = td_reply_chat(rp);
    td_chat_reply_t plain = {0};
    td_buf_t scratch = {0};
    json_t *resp = NULL;
    td_status_t st = TD_OK;

    if (!x->streaming) {   /* the reply's items, as a stream would have made them */
        if (cr == NULL) {
            plain.content = td_reply_text(rp)->data ? td_reply_text(rp)->data : "";
            plain.content_len = td_reply_text(rp)->len;
            cr = &plain;
        }
        st = td_oresp_reply(&x->oresp, cr, &scratch);
    }
    if (st == TD_OK)
        st = td_oresp_end(&x->oresp, td_reply_finish_reason(rp), &u, (int64_t)time(NULL),
                          x->streaming ? &x->out : &scratch, &resp);
    td_buf_free(&scratch);
    if (st == TD_OK && !x->streaming) {
        char *s = json_dumps(resp, JSON_COMPACT);
        td_buf_reset(&x->out);
        st = s ? td_buf_append(&x->out, s, strlen(s)) : TD_ERR_NOMEM;
        free(s);
    }
    if (st == TD_OK && x->store)
        responses_store(x, resp);
    json_decref(resp);
    return st;
}

td_status_t
td_rtext_stream_error(td_rtext_t *x, const td_openai_err_t *e, td_buf_t *out)
{
    if (x != NULL && x->kind == TD_OPENAI_MESSAGES)
        return td_anthropic_stream_error(e, out);
    if (x != NULL && x->kind == TD_OPENAI_RESPONSES)   /* a job may run: not its seq */
        return td_oresp_stream_error(e, x->seq_sent, out);
    return td_openai_stream_error(e, out);
}

/* Every choice ended: usage and [DONE] of a stream, or the whole answer. */
static td_status_t
tokens_finish(td_rtext_t *x)
{
    td_openai_usage_t usage = { (uint32_t)x->nprompt, 0, (uint32_t)x->cached };
    json_t *choices[TD_IREQ_MAX_N];
    td_status_t st = TD_OK;

    for (uint32_t i = 0; i < x->nreplies; i++)
        usage.completion_tokens += td_reply_ntokens(x->replies[i]);
    x->ended = true;
    x->res.ended = true;
    if (x->kind == TD_OPENAI_MESSAGES)
        return messages_finish(x, &usage);
    if (x->kind == TD_OPENAI_RESPONSES)
        return responses_finish(x, &usage);
    if (x->streaming)
        return td_openai_stream_end(&x->stream, &usage, &x->out);
    for (uint32_t i = 0; i < x->nreplies; i++) {
        td_reply_t *rp = x->replies[i];
        const td_chat_reply_t *cr = td_reply_chat(rp);
        json_t *msg = NULL;

        if (cr != NULL) {
            st = td_chat_reply_json(cr, &msg);
            choices[i] = st == TD_OK ? td_openai_choice_message(i, msg,
                                                                td_reply_finish_reason(rp),
                                                                td_reply_logprobs(rp))
                                     : NULL;
        } else {
            const td_buf_t *t = td_reply_text(rp);
            choices[i] = td_openai_choice_text(x->oreq->kind, i, t->data ? t->data : "",
                                               t->len, td_reply_finish_reason(rp),
                                               td_reply_logprobs(rp));
        }
    }
    td_buf_reset(&x->out);
    return td_openai_response_json(&x->stream.meta, choices, x->nreplies, &usage, &x->out);
}

void
td_rtext_tokens_run(td_rtext_t *x)
{
    const rtext_batch_t *b = &x->work;
    size_t from = 0, top_at = 0;
    bool all = true;
    td_status_t st = TD_OK;

    memset(&x->res, 0, sizeof x->res);
    if (b->cached > 0)
        x->cached = b->cached;
    if (x->ended || canceled(x))
        return;
    for (size_t m = 0; m < b->nmsgs && st == TD_OK && !canceled(x); m++) {
        st = tokens_message(x, b->msg_choice[m], from, b->msg_end[m], &top_at);
        from = b->msg_end[m];
    }
    for (uint32_t c = 0; st == TD_OK && !canceled(x) && c < x->nreplies; c++) {
        if (b->end >> c & 1) {
            x->res.by_us |= (b->by_us >> c & 1) != 0;
            st = choice_end(x, c, b->finish[c]);
        }
        all &= td_reply_ended(x->replies[c]);
    }
    if (st != TD_OK) {
        res_fail(x, st, "could not decode the tokens");
        return;
    }
    if (canceled(x) || !all)
        return;
    if ((st = tokens_finish(x)) != TD_OK)
        res_fail(x, st, "could not finish the reply");
}
