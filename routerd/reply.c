/* routerd/reply.c — the one reply reader of reply.h: a choice's tokens
 * through their log-probabilities, the incremental decoder, the stop matcher
 * (text/stopmatch.c) and the V4.1 reply reader (text/chat_reply.c) into
 * deltas, and the end of the choice. */
#include "reply.h"

#include <stdlib.h>
#include <string.h>

#include "stopmatch.h"

struct td_reply {
    td_reply_cfg_t cfg;
    td_tok_dec_t dec;
    td_stopmatch_filter_t *stop;    /* plain replies' stop strings (V4.1: the reader's) */
    td_chat_reply_reader_t *chat;   /* V4.1 chat, or NULL */
    td_openai_logprobs_t *lp;       /* not sent yet; NULL: none asked */
    uint32_t ntokens;
    bool stopped;                   /* a stop string (or the reasoning budget) ended it */
    bool over_budget;               /* the reasoning reached req's reasoning.budget */
    uint32_t nreasoning;            /* tokens fed while the reply was in its reasoning */
    bool ended;
    td_openai_finish_t finish;
    td_buf_t text;                  /* plain reply kept (no emit) */
    td_buf_t piece;                 /* scratch: decoded text */
    td_buf_t rel;                   /* scratch: released by the stop matcher */
};

td_status_t
td_reply_create(const td_reply_cfg_t *cfg, td_reply_t **out)
{
    const td_ireq_t *r = cfg->req;
    td_reply_t *rp = calloc(1, sizeof *rp);
    td_status_t st;

    if (rp == NULL)
        return TD_ERR_NOMEM;
    rp->cfg = *cfg;
    st = td_stopmatch_filter_create((const char *const *)r->stop.strings,
                                    cfg->chat ? 0 : r->stop.nstrings, r->stop.include_stop_str,
                                    &rp->stop);
    if (st == TD_OK && cfg->chat)
        st = td_chat_reply_reader_create(cfg->chat, &rp->chat);
    if (st == TD_OK && r->out.logprobs)
        st = td_openai_logprobs_create(r->kind, &rp->lp);
    if (st != TD_OK) {
        td_reply_destroy(rp);
        return st;
    }
    *out = rp;
    return TD_OK;
}

void
td_reply_destroy(td_reply_t *rp)
{
    if (rp == NULL)
        return;
    td_stopmatch_filter_destroy(rp->stop);
    td_chat_reply_reader_destroy(rp->chat);
    td_openai_logprobs_destroy(rp->lp);
    td_buf_free(&rp->text);
    td_buf_free(&rp->piece);
    td_buf_free(&rp->rel);
    free(rp);
}

/* Text released for the client: through the V4.1 reader's deltas, or as
 * content. */
static td_status_t
reply_out(td_reply_t *rp, const char *text, size_t len, td_reply_emit_fn emit, void *arg)
{
    td_chat_reply_delta_t one = { .kind = TD_CHAT_REPLY_DELTA_CONTENT, .text = text,
                                  .len = len };
    const td_chat_reply_delta_t *d = &one;
    size_t n = 1;
    td_status_t st = TD_OK;

    if (rp->chat != NULL)
        st = td_chat_reply_reader_feed(rp->chat, text, len, &d, &n);
    else if (emit == NULL)
        return td_buf_append(&rp->text, text, len);
    for (size_t i = 0; st == TD_OK && emit != NULL && i < n; i++)
        st = emit(arg, rp, &d[i]);
    return st;
}

/* The log-probabilities of n tokens, for the next chunk. */
static td_status_t
reply_logprobs(td_reply_t *rp, const uint32_t *ids, size_t n, const td_reply_lp_t *lps)
{
    const td_tok_t *tok = rp->cfg.tok;
    td_openai_token_lp_t t, top[TD_OPENAI_MAX_TOP_LOGPROBS];
    td_status_t st = TD_OK;

    for (size_t i = 0; i < n && st == TD_OK; i++) {
        size_t k = 0, ntop = lps[i].ntop;   /* <= top_logprobs <= the maximum: checked */

        t.logprob = lps[i].logprob;
        st = td_tok_spell(tok, ids[i], &t.text, &t.len);
        for (; st == TD_OK && k < ntop; k++) {
            top[k].logprob = lps[i].top_logprobs[k];
            st = td_tok_spell(tok, (uint32_t)lps[i].top_ids[k], &top[k].text, &top[k].len);
        }
        if (st == TD_OK)
            st = td_openai_logprobs_add(rp->lp, &t, top, k);
    }
    return st;
}

/* The text of n tokens through the stop matcher (armed: min_tokens are
 * generated) and out. */
static td_status_t
reply_text(td_reply_t *rp, const uint32_t *ids, size_t n, bool armed, td_reply_emit_fn emit,
           void *arg)
{
    bool matched = false;
    td_status_t st;

    td_buf_reset(&rp->piece);
    td_buf_reset(&rp->rel);
    st = td_tok_decode(rp->cfg.tok, &rp->dec, ids, n, rp->cfg.req->out.skip_special,
                       &rp->piece);
    if (st == TD_OK && rp->piece.len)
        st = td_stopmatch_filter_feed(rp->stop, rp->piece.data, rp->piece.len, armed, &rp->rel,
                                      &matched);
    if (st == TD_OK && rp->chat != NULL)
        td_chat_reply_reader_arm(rp->chat, armed);
    if (st == TD_OK && rp->rel.len)
        st = reply_out(rp, rp->rel.data, rp->rel.len, emit, arg);
    rp->stopped |= matched || (rp->chat != NULL && td_chat_reply_reader_stopped(rp->chat));
    return st;
}

/* The reply is in its reasoning: token by token, to count them (usage) and
 * to stop at the request's cap. */
static bool
in_reasoning(const td_reply_t *rp)
{
    return rp->chat != NULL && td_chat_reply_reader_in_reasoning(rp->chat);
}

td_status_t
td_reply_feed(td_reply_t *rp, const uint32_t *ids, size_t n, bool last_stop,
              const td_reply_lp_t *lps, td_reply_emit_fn emit, void *arg, bool *stopped)
{
    uint32_t min = rp->cfg.req->sampling.min_tokens;
    size_t ntext = last_stop && !rp->cfg.req->stop.include_stop_str ? n - 1 : n;
    td_status_t st = TD_OK;

    *stopped = false;
    if (rp->ended || rp->stopped || n == 0)
        return TD_OK;
    if (rp->lp != NULL && lps != NULL)
        st = reply_logprobs(rp, ids, n, lps);   /* they go out with the next chunk */
    /* a stop string counts once more than min_tokens tokens are generated
     * (vLLM's rule): token by token until then, so that it is armed at the
     * token that passes it */
    size_t i = 0;
    while (st == TD_OK && i < ntext && !rp->stopped) {
        bool watch = in_reasoning(rp);
        size_t k = rp->ntokens >= min && !watch ? ntext - i : 1;

        rp->ntokens += (uint32_t)k;
        st = reply_text(rp, ids + i, k, rp->ntokens > min, emit, arg);
        i += k;
        if (watch && ++rp->nreasoning >= rp->cfg.req->reasoning.budget &&
            rp->cfg.req->reasoning.budget > 0 && in_reasoning(rp))
            rp->stopped = rp->over_budget = true;
    }
    rp->ntokens += (uint32_t)(n - i);   /* past a stop string, or the stop token: counted */
    *stopped = rp->stopped;
    return st;
}

td_status_t
td_reply_end(td_reply_t *rp, td_openai_finish_t finish, td_reply_emit_fn emit, void *arg)
{
    td_status_t st;

    if (rp->ended)
        return TD_OK;
    td_buf_reset(&rp->rel);
    td_buf_reset(&rp->piece);
    st = td_tok_decode_flush(&rp->dec, &rp->piece);
    if (st == TD_OK && !rp->stopped) {
        bool matched = false;
        st = td_stopmatch_filter_feed(rp->stop, rp->piece.data ? rp->piece.data : "",
                                      rp->piece.len, rp->ntokens > rp->cfg.req->sampling.min_tokens,
                                      &rp->rel, &matched);
        if (st == TD_OK && !matched)
            st = td_stopmatch_filter_flush(rp->stop, &rp->rel);
        rp->stopped |= matched;
    }
    if (st == TD_OK && rp->rel.len)
        st = reply_out(rp, rp->rel.data, rp->rel.len, emit, arg);
    if (rp->stopped)
        finish = rp->over_budget ? TD_OPENAI_FINISH_LENGTH : TD_OPENAI_FINISH_STOP;
    if (st == TD_OK && rp->chat != NULL) {
        /* the reader releases what it held back and decides the finish reason */
        const td_chat_reply_delta_t *d;
        size_t n;
        td_chat_reply_finish_t f;

        st = td_chat_reply_reader_finish(rp->chat, finish == TD_OPENAI_FINISH_LENGTH
                                                       ? TD_CHAT_REPLY_FINISH_LENGTH
                                                       : TD_CHAT_REPLY_FINISH_STOP, &d, &n);
        for (size_t i = 0; st == TD_OK && emit != NULL && i < n; i++)
            st = emit(arg, rp, &d[i]);
        f = td_chat_reply_reader_reply(rp->chat)->finish;
        finish = f == TD_CHAT_REPLY_FINISH_TOOL_CALLS ? TD_OPENAI_FINISH_TOOL_CALLS
               : f == TD_CHAT_REPLY_FINISH_LENGTH     ? TD_OPENAI_FINISH_LENGTH
                                                      : TD_OPENAI_FINISH_STOP;
    }
    rp->ended = true;
    rp->finish = finish;
    return st;
}

const char *
td_reply_stop_string(const td_reply_t *rp)
{
    if (rp->over_budget)
        return NULL;
    return rp->chat != NULL ? td_chat_reply_reader_stop(rp->chat)
                            : td_stopmatch_filter_which(rp->stop);
}

uint32_t
td_reply_nreasoning(const td_reply_t *rp)
{
    return rp->nreasoning;
}

bool
td_reply_over_budget(const td_reply_t *rp)
{
    return rp->over_budget;
}

uint32_t
td_reply_index(const td_reply_t *rp)
{
    return rp->cfg.index;
}

bool
td_reply_ended(const td_reply_t *rp)
{
    return rp->ended;
}

uint32_t
td_reply_ntokens(const td_reply_t *rp)
{
    return rp->ntokens;
}

td_openai_finish_t
td_reply_finish_reason(const td_reply_t *rp)
{
    return rp->finish;
}

td_openai_logprobs_t *
td_reply_logprobs(td_reply_t *rp)
{
    return rp->lp;
}

const td_chat_reply_t *
td_reply_chat(const td_reply_t *rp)
{
    return rp->chat ? td_chat_reply_reader_reply(rp->chat) : NULL;
}

const td_buf_t *
td_reply_text(const td_reply_t *rp)
{
    return &rp->text;
}
