/* routerd/rtext.c — a request's CPU work for routerd's text threads: the
 * body parsed, the prompt encoded and tokenized; generated tokens
 * detokenized through the stop matcher and the V4.1 reply reader into SSE
 * events or the answer (rtext.h says who may touch what, when). */
#include "rtext.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_prompt.h"
#include "chat_reply.h"
#include "stopmatch.h"

#define RTEXT_SLICE 64   /* tokens decoded between looks at the cancel flag */

/* An alternative of a generated token, as the rank sent it. */
typedef struct {
    int32_t token;
    double logprob;
} rtext_alt_t;

/* Tokens waiting for a job, message by message. */
typedef struct {
    uint32_t *ids;          /* [n] */
    double *lp;             /* [n] log-probability of each, when asked */
    uint32_t *ntop;         /* [n] alternatives of each */
    rtext_alt_t *top;       /* [ntops] the alternatives, token after token */
    size_t *msg_end;        /* [nmsgs] where each message's tokens end */
    size_t n, ntops, nmsgs;
    size_t cap_ids, cap_lp, cap_ntop, cap_top, cap_msgs;
    bool end;               /* the reply ends after these */
    td_openai_finish_t finish;
    bool by_us;
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
    td_openai_req_t *oreq;          /* once parsed; the caller borrows it */
    int32_t *prompt;                /* until the caller takes it */
    size_t nprompt;
    bool streaming;                 /* td_rtext_stream_start: SSE from now on */
    td_tok_dec_t dec;
    td_stopmatch_filter_t *stop;
    td_chat_reply_reader_t *chat;   /* V4.1 chat: reads the reply (stop strings too) */
    td_openai_logprobs_t *lp;       /* the logprobs not sent yet, or NULL: none asked */
    td_openai_stream_t stream;
    uint32_t ntokens;               /* completion tokens decoded */
    uint64_t cached;                /* prompt tokens served from a prefix cache (usage) */
    bool ended;                     /* the reply is complete: nothing more is decoded */
    td_buf_t text;                  /* no stream: the answer so far */
    td_buf_t piece;                 /* scratch: decoded text of one message */
    td_buf_t rel;                   /* scratch: text released by the stop matcher */
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
    free(b->top);
    free(b->msg_end);
}

void
td_rtext_destroy(td_rtext_t *x)
{
    if (!x)
        return;
    free(x->body);
    free(x->prompt);
    td_openai_req_destroy(x->oreq);
    td_stopmatch_filter_destroy(x->stop);
    td_chat_reply_reader_destroy(x->chat);
    td_openai_logprobs_destroy(x->lp);
    td_buf_free(&x->text);
    td_buf_free(&x->piece);
    td_buf_free(&x->rel);
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
 * format and its reply read back by td_chat_reply_reader; a request the
 * format cannot express gets a 400. */
static td_status_t
chat_prompt_tokens(td_rtext_t *x)
{
    td_chat_prompt_t *p = NULL;
    td_chat_prompt_err_t ce;
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st;

    memset(&ce, 0, sizeof ce);
    st = td_chat_prompt_encode(x->oreq->body, NULL, &p, &ce);
    if (st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED) {
        td_openai_err_set(&x->res.err, 400, "invalid_request_error",
                          ce.param[0] ? ce.param : NULL, ce.code, "%s", ce.message);
        return x->res.st = st;
    }
    if (st == TD_OK)
        st = td_chat_prompt_ids(p, x->cfg->v41, &ids, &n);
    if (st == TD_OK)
        st = td_chat_reply_reader_create(&p->reply, &x->chat);
    td_chat_prompt_destroy(p);
    if (st != TD_OK) {
        free(ids);
        res_fail(x, st, "could not encode the chat prompt");
        return st;
    }
    x->prompt = (int32_t *)ids;   /* ids < vocab_size <= INT32_MAX: same bits */
    x->nprompt = n;
    return TD_OK;
}

/* A completion whose prompt came as token ids (checked against the
 * vocabulary by the parser): taken as they are, nothing tokenized. */
static td_status_t
prompt_given_ids(td_rtext_t *x)
{
    size_t n = x->oreq->nprompt_ids;

    if ((x->prompt = malloc(n * sizeof *x->prompt)) == NULL) {
        res_fail(x, TD_ERR_NOMEM, "out of memory");
        return TD_ERR_NOMEM;
    }
    memcpy(x->prompt, x->oreq->prompt_ids, n * sizeof *x->prompt);
    x->nprompt = n;
    return TD_OK;
}

static td_status_t
prompt_tokens(td_rtext_t *x)
{
    td_buf_t text = {0};
    uint32_t *ids = NULL;
    size_t n = 0;
    td_status_t st;

    if (x->cfg->v41 && x->oreq->kind == TD_OPENAI_CHAT)
        return chat_prompt_tokens(x);
    if (x->oreq->prompt_ids)
        return prompt_given_ids(x);
    st = prompt_text(x->oreq, &text);
    if (st == TD_OK)
        st = td_tok_encode(x->cfg->tok, text.data ? text.data : "", text.len, &ids, &n);
    td_buf_free(&text);
    if (st != TD_OK) {
        res_fail(x, st, "could not tokenize the prompt");
        return st;
    }
    x->prompt = (int32_t *)ids;   /* ids < vocab_size <= INT32_MAX: same bits */
    x->nprompt = n;
    return TD_OK;
}

void
td_rtext_prompt_run(td_rtext_t *x)
{
    const td_openai_req_t *o;
    size_t len;
    const char *body;
    td_status_t st;

    memset(&x->res, 0, sizeof x->res);
    if (canceled(x))
        return;
    len = x->body_len;
    body = x->body;
    st = td_openai_req_parse(x->cfg->api, x->kind, body, len, &x->oreq, &x->res.err);
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
    /* V4.1 chat: the reply reader matches stop strings (in content only) */
    if (td_stopmatch_filter_create((const char *const *)o->stop, x->chat ? 0 : o->nstop, false,
                                   &x->stop) !=
            TD_OK ||
        (o->logprobs && td_openai_logprobs_create(o->kind, &x->lp) != TD_OK)) {
        res_fail(x, TD_ERR_NOMEM, "out of memory");
        return;
    }
    x->stream.meta = (td_openai_meta_t){ .kind = o->kind, .id = x->oid,
                                         .created = (int64_t)time(NULL),
                                         .model = x->cfg->model,
                                         .fingerprint = x->cfg->fingerprint,
                                         .logprobs = x->lp };
    x->stream.include_usage = o->include_usage;
}

td_openai_req_t *
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

td_status_t
td_rtext_push(td_rtext_t *x, const int32_t *ids, size_t n, Tandem__TokenLogprob *const *lps)
{
    rtext_batch_t *b = &x->inbox;
    size_t ntop = 0;

    if (lps)
        for (size_t i = 0; i < n; i++)
            ntop += lps[i]->n_top;
    if (grow((void **)&b->ids, &b->cap_ids, b->n + n, sizeof *b->ids) != TD_OK ||
        grow((void **)&b->msg_end, &b->cap_msgs, b->nmsgs + 1, sizeof *b->msg_end) != TD_OK)
        return TD_ERR_NOMEM;
    if (lps && (grow((void **)&b->lp, &b->cap_lp, b->n + n, sizeof *b->lp) != TD_OK ||
                grow((void **)&b->ntop, &b->cap_ntop, b->n + n, sizeof *b->ntop) != TD_OK ||
                grow((void **)&b->top, &b->cap_top, b->ntops + ntop, sizeof *b->top) != TD_OK))
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        b->ids[b->n + i] = (uint32_t)ids[i];
        if (!lps)
            continue;
        b->lp[b->n + i] = lps[i]->logprob;
        b->ntop[b->n + i] = (uint32_t)lps[i]->n_top;
        for (size_t k = 0; k < lps[i]->n_top; k++)
            b->top[b->ntops++] = (rtext_alt_t){ lps[i]->top[k]->token, lps[i]->top[k]->logprob };
    }
    b->n += n;
    b->msg_end[b->nmsgs++] = b->n;
    b->weight += n + ntop;
    return TD_OK;
}

void
td_rtext_push_end(td_rtext_t *x, td_openai_finish_t finish, bool by_us)
{
    x->inbox.end = true;
    x->inbox.finish = finish;
    x->inbox.by_us = by_us;
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
    x->inbox.end = false;
    x->inbox.cached = 0;
    return w;
}

/* ======================================================================= */
/* Tokens to text (the job)                                                  */
/* ======================================================================= */

/* Stream the V4.1 reply reader's deltas (non-streaming requests take the
 * whole reply from the reader at the end). */
static td_status_t
chat_emit(td_rtext_t *x, const td_chat_reply_delta_t *d, size_t n)
{
    td_status_t st = TD_OK;

    for (size_t i = 0; i < n && st == TD_OK && x->streaming; i++) {
        json_t *delta = NULL;
        switch (d[i].kind) {
        case TD_CHAT_REPLY_DELTA_CONTENT:
            st = td_openai_stream_text(&x->stream, d[i].text, d[i].len, &x->out);
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
        st = delta ? td_openai_stream_delta(&x->stream, delta, &x->out) : TD_ERR_NOMEM;
    }
    return st;
}

/* Text released for the client: through the V4.1 reply reader, or as is. */
static td_status_t
emit_text(td_rtext_t *x, const char *text, size_t len)
{
    if (x->chat) {
        const td_chat_reply_delta_t *d;
        size_t n;
        td_status_t st = td_chat_reply_reader_feed(x->chat, text, len, &d, &n);
        return st == TD_OK ? chat_emit(x, d, n) : st;
    }
    if (x->streaming)
        return td_openai_stream_text(&x->stream, text, len, &x->out);
    return td_buf_append(&x->text, text, len);
}

td_status_t
td_rtext_stream_start(td_rtext_t *x, td_buf_t *out)
{
    x->streaming = true;
    return td_openai_stream_text(&x->stream, "", 0, out);
}

/* The log-probabilities of work tokens [from, to), for the next chunk. */
static td_status_t
tokens_logprobs(td_rtext_t *x, size_t from, size_t to, size_t *top_at)
{
    const td_tok_t *tok = x->cfg->tok;
    const rtext_batch_t *b = &x->work;
    td_openai_token_lp_t t, top[TD_OPENAI_MAX_TOP_LOGPROBS];
    td_status_t st = TD_OK;

    for (size_t i = from; i < to && st == TD_OK; i++) {
        size_t k = 0, ntop = b->ntop[i];   /* <= top_logprobs <= the maximum: checked */

        t.logprob = b->lp[i];
        st = td_tok_spell(tok, b->ids[i], &t.text, &t.len);
        for (; st == TD_OK && k < ntop; k++) {
            top[k].logprob = b->top[*top_at + k].logprob;
            st = td_tok_spell(tok, (uint32_t)b->top[*top_at + k].token, &top[k].text,
                              &top[k].len);
        }
        *top_at += b->ntop[i];
        if (st == TD_OK)
            st = td_openai_logprobs_add(x->lp, &t, top, k);
    }
    return st;
}

/* The text of work tokens [from, to) appended to piece, in slices between
 * which a cancel is seen. */
static td_status_t
tokens_text(td_rtext_t *x, size_t from, size_t to)
{
    td_status_t st = TD_OK;

    for (size_t i = from; i < to && st == TD_OK && !canceled(x); i += RTEXT_SLICE) {
        size_t k = to - i < RTEXT_SLICE ? to - i : RTEXT_SLICE;
        st = td_tok_decode(x->cfg->tok, &x->dec, x->work.ids + i, k, &x->piece);
    }
    return st;
}

/* One message's tokens: log-probabilities, text, stop strings, deltas.
 * *matched: a stop string (or the reader's) matched. */
static td_status_t
tokens_message(td_rtext_t *x, size_t from, size_t to, size_t *top_at, bool *matched)
{
    td_status_t st = TD_OK;

    td_buf_reset(&x->piece);
    td_buf_reset(&x->rel);
    x->ntokens += (uint32_t)(to - from);
    if (x->lp)
        st = tokens_logprobs(x, from, to, top_at);   /* they go out with the next chunk */
    if (st == TD_OK)
        st = tokens_text(x, from, to);
    if (st == TD_OK && x->piece.len)
        st = td_stopmatch_filter_feed(x->stop, x->piece.data, x->piece.len, true, &x->rel,
                                      matched);
    td_buf_reset(&x->piece);
    if (st == TD_OK && x->rel.len) {
        st = emit_text(x, x->rel.data, x->rel.len);
        td_buf_reset(&x->rel);
    }
    if (st == TD_OK && x->chat && td_chat_reply_reader_stopped(x->chat))
        *matched = true;
    return st;
}

/* The end of the reply (the rank's finish, max_tokens, or a stop string:
 * then by_us): what the decoder, the stop matcher and the reader held back,
 * then the finish chunk, usage and [DONE] of a stream, or the whole answer. */
static td_status_t
tokens_finish(td_rtext_t *x, td_openai_finish_t finish, bool by_us)
{
    td_openai_usage_t usage = { (uint32_t)x->nprompt, x->ntokens, (uint32_t)x->cached };
    td_status_t st;

    td_buf_reset(&x->rel);
    st = td_tok_decode_flush(&x->dec, &x->piece);
    if (st == TD_OK && !by_us) {
        bool matched = false;
        st = td_stopmatch_filter_feed(x->stop, x->piece.data ? x->piece.data : "", x->piece.len,
                                      true, &x->rel, &matched);
        if (st == TD_OK && !matched)
            st = td_stopmatch_filter_flush(x->stop, &x->rel);
    }
    td_buf_reset(&x->piece);
    if (st == TD_OK && x->rel.len)
        st = emit_text(x, x->rel.data, x->rel.len);
    if (st == TD_OK && x->chat) {
        /* the reader releases what it held back and decides the finish reason */
        const td_chat_reply_delta_t *d;
        size_t n;
        st = td_chat_reply_reader_finish(x->chat, finish == TD_OPENAI_FINISH_LENGTH
                                                      ? TD_CHAT_REPLY_FINISH_LENGTH
                                                      : TD_CHAT_REPLY_FINISH_STOP,
                                         &d, &n);
        if (st == TD_OK)
            st = chat_emit(x, d, n);
        if (st == TD_OK) {
            td_chat_reply_finish_t f = td_chat_reply_reader_reply(x->chat)->finish;
            finish = f == TD_CHAT_REPLY_FINISH_TOOL_CALLS ? TD_OPENAI_FINISH_TOOL_CALLS
                   : f == TD_CHAT_REPLY_FINISH_LENGTH     ? TD_OPENAI_FINISH_LENGTH
                                                          : TD_OPENAI_FINISH_STOP;
        }
    }
    if (st == TD_OK && x->streaming) {
        st = td_openai_stream_finish(&x->stream, finish, &usage, &x->out);
    } else if (st == TD_OK && x->chat) {
        json_t *msg = NULL;
        td_buf_reset(&x->out);
        st = td_chat_reply_json(td_chat_reply_reader_reply(x->chat), &msg);
        if (st == TD_OK)
            st = td_openai_response_message_json(&x->stream.meta, msg, finish, &usage, &x->out);
    } else if (st == TD_OK) {
        td_buf_reset(&x->out);
        st = td_openai_response_json(&x->stream.meta, x->text.data ? x->text.data : "",
                                     x->text.len, finish, &usage, &x->out);
    }
    x->ended = true;
    x->res.ended = true;
    x->res.finish = finish;
    x->res.by_us = by_us;
    return st;
}

void
td_rtext_tokens_run(td_rtext_t *x)
{
    const rtext_batch_t *b = &x->work;
    size_t from = 0, top_at = 0;
    bool matched = false;
    td_status_t st = TD_OK;

    memset(&x->res, 0, sizeof x->res);
    if (b->cached > 0)
        x->cached = b->cached;
    if (x->ended || canceled(x))
        return;
    for (size_t m = 0; m < b->nmsgs && st == TD_OK && !matched && !canceled(x); m++) {
        st = tokens_message(x, from, b->msg_end[m], &top_at, &matched);
        from = b->msg_end[m];
    }
    if (st != TD_OK) {
        res_fail(x, st, "could not decode the tokens");
        return;
    }
    if (canceled(x) || (!matched && !b->end))
        return;
    st = matched ? tokens_finish(x, TD_OPENAI_FINISH_STOP, true)
                 : tokens_finish(x, b->finish, b->by_us);
    if (st != TD_OK)
        res_fail(x, st, "could not finish the reply");
}
