/* engine/engine.h — what the daemons see of a model: its KV layout, chunked
 * prefill that tells the caller after each layer which entries of the
 * request's KV it finished, adoption of a request prefilled elsewhere, one
 * decode step over a batch, sampling, and the bounded replay that rebuilds a
 * request's fixed state at the end of a cached prefix. A request's KV lives in memory the
 * caller owns (a rank's pools, td_layout_kv_t): the engine reads and writes
 * it there and keeps no copy. Nothing model-specific leaks out: every engine
 * ("synthetic", "deepseek-v41") is an ops table.
 * Ownership: an engine owns its layout; a request belongs to one engine and
 * is destroyed before it; the KV memory and its view outlive the request.
 * Calls on one request are not concurrent; calls on different requests may
 * run on different threads. */
#ifndef TD_ENGINE_H
#define TD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "sample.h"
#include "status.h"

typedef struct td_engine td_engine_t;
typedef struct td_engine_req td_engine_req_t;

/* ---- KV output ---------------------------------------------------------------- */

/* Entries a layer finished: [first, first + count) of segment `seg` (index
 * into the layout), now final in the request's KV memory (td_layout_kv_entry).
 * A fixed segment comes whole (first = 0, count = its slots). */
typedef struct {
    uint32_t seg;
    uint64_t first;
    uint64_t count;
} td_engine_piece_t;

/* Called once per layer, in layer order, as soon as the layer is done
 * (prefill: for every layer of every chunk, npieces possibly 0, before the
 * next layer starts; decode: per layer and row, only when pieces exist). The
 * pieces' bytes are final: a later layer or chunk never rewrites them. A
 * non-OK return stops the prefill/step at this layer boundary; the status is
 * returned and the request is unusable after (destroy it). It is the
 * cancellation point of a prefill. */
typedef td_status_t (*td_engine_layer_fn)(td_engine_req_t *req, uint32_t layer,
                                          const td_engine_piece_t *pieces, size_t npieces,
                                          void *arg);

/* prefill's `last`. */
#define TD_ENGINE_CHUNK_MORE 0   /* more chunks follow */
#define TD_ENGINE_CHUNK_LAST 1   /* the prompt's final chunk */
#define TD_ENGINE_CHUNK_KEEP 2   /* more follow; the fixed state stays in memory */

/* ---- The engine ---------------------------------------------------------------- */

/* A request's state. Callers read these fields; only engine code writes them.
 * An implementation embeds it as the first member of its own request. */
/* A constraint on a request's output (structured output), set by the caller
 * who owns it: consulted at each sampling of the request, and told each
 * token the sequence takes after its first sampled one (the decode step's
 * input). mask: the tokens allowed next (bit i of word i / 64), or NULL
 * when nothing is constrained now (the reasoning before the constraint
 * starts); NULL with *st set: it failed. take: TD_ERR_INVALID when the
 * constraint refuses the token. */
typedef struct {
    void *ctx;
    const uint64_t *(*mask)(void *ctx, td_status_t *st);
    td_status_t (*take)(void *ctx, int32_t token);
} td_engine_cons_t;

struct td_engine_req {
    td_engine_t *engine;
    td_sample_params_t sampling;
    td_layout_kv_t kv;     /* where its KV lives (the caller's memory) */
    uint64_t capacity;     /* tokens kv holds (td_layout_kv_capacity, <= max_context) */
    uint64_t ntokens;      /* tokens in the sequence (prompt + decoded inputs) */
    uint64_t prompt;       /* tokens given by prefill/adopt */
    td_status_t failed;    /* TD_OK, or why the request became unusable */
    void *user;            /* free for the caller */
    td_sample_hist_t hist; /* its tokens, kept when a penalty is on (sample.h) */
    const td_engine_cons_t *cons;  /* NULL, or its constraint (the caller's) */
};

/* One row of a decode step. */
typedef struct {
    td_engine_req_t *req;        /* each request at most once per step */
    int32_t token;               /* in: the last sampled token, appended now */
    int32_t next;                /* out: sampled at the next position */
    td_sample_finish_t finish;   /* out */
    td_sample_pick_t pick;       /* out: next with its log-probabilities (those only
                                    when req->sampling.logprobs) */
} td_engine_row_t;

/* An implementation. Callers use the td_engine_* wrappers, which check state
 * and arguments first. */
typedef struct {
    void (*destroy)(td_engine_t *e);
    /* A request whose KV lives in kv (copied view; the memory stays the
     * caller's). Cheap: it touches none of that memory (a decode rank
     * creates it at admission, before the KV arrives). NULL for an
     * identity-only engine (requests: TD_ERR_UNSUPPORTED). */
    td_status_t (*req_create)(td_engine_t *e, const td_layout_kv_t *kv, td_engine_req_t **out);
    void (*req_destroy)(td_engine_req_t *req);
    /* Append tokens[0..n) (n >= 1) and run them through every layer; `last`
     * (TD_ENGINE_CHUNK_*): LAST, this is the prompt's final chunk, so fixed
     * segments come out too; KEEP, more follow, but the fixed segments in the
     * KV memory must hold the state after this chunk when it returns (the
     * caller copies them: a prefix cache's snapshot). The first chunk
     * (ntokens 0) resets the fixed segments (empty rings, zero counters);
     * after seek and replay, prefill continues their state. */
    td_status_t (*prefill)(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
                           td_engine_layer_fn fn, void *arg);
    /* Take over a request whose prefill ran elsewhere: its KV memory holds
     * the state after the prompt tokens[0..n) (received), which becomes the
     * request's cache as it is, nothing copied. The engine checks what it can
     * (engine->checks_kv: every byte; otherwise at least the position the
     * state records) and logs what it refuses (TD_ERR_MISMATCH). An engine
     * that cannot give logits before its first decode step answers logits
     * with TD_ERR_STATE until then. */
    td_status_t (*adopt)(td_engine_req_t *req, const int32_t *tokens, size_t n);
    /* Append each row's token; the entries it completes land in each row's
     * KV memory (fn, when given, is told which). */
    td_status_t (*decode)(td_engine_t *e, td_engine_row_t *rows, size_t n,
                          td_engine_layer_fn fn, void *arg);
    /* The next-token distribution at the request's end; valid until the next
     * call on req. */
    td_status_t (*logits)(td_engine_req_t *req, td_sample_dist_t *out);
    /* A rank of a DEP group only (NULL otherwise; docs/dep.md, "In the
     * daemons"). Every rank of the group makes the same number of passes:
     * each prefill and decode call above is one, and pass_empty is this
     * rank's part of a step it has no rows in (its experts serve the other
     * ranks' tokens). passes counts the passes begun; expert_tokens writes
     * each routed expert's rows on this rank, summed over the layers, into
     * out[min(E, cap)] (0 for the experts it does not hold) and returns E
     * (cap 0: E only; any thread). */
    td_status_t (*pass_empty)(td_engine_t *e);
    uint64_t (*passes)(const td_engine_t *e);
    uint32_t (*expert_tokens)(const td_engine_t *e, uint64_t *out, uint32_t cap);
    /* Bounded replay (docs/kvcache.md, "Replay bound"); all three NULL for
     * an engine that cannot. seek: the fresh request's state placed at
     * position pos of tokens[0..pos) with no forward pass: fixed segments
     * empty but for what needs none (the engram look-back of the last
     * tokens, the counters). replay: one prefill pass of tokens[0..n) at
     * req->ntokens (a DEP rank's one pass) that computes, writes and reports
     * no paged entry whose tokens all lie below frozen and reads those from
     * the KV memory as they are; the first chunk of a fresh request resets
     * its state as prefill's does. replay_bound: the engine's B (>= 1). */
    td_status_t (*seek)(td_engine_req_t *req, const int32_t *tokens, uint64_t pos);
    td_status_t (*replay)(td_engine_req_t *req, const int32_t *tokens, size_t n,
                          uint64_t frozen);
    uint64_t (*replay_bound)(const td_engine_t *e);
} td_engine_ops_t;

struct td_engine {
    const td_engine_ops_t *ops;
    const char *name;          /* "synthetic", "deepseek-v41" */
    const char *kind;          /* what it is, shown in logs and /v1/models */
    const td_layout_t *layout; /* owned by the engine */
    uint32_t vocab;
    uint64_t max_context;
    uint64_t fingerprint;      /* model fingerprint for Hello */
    int checks_kv;             /* adopt recomputes and checks every received byte */
    uint32_t nstop;            /* the model's end-of-sequence ids (its checkpoint's */
    int32_t stop[TD_SAMPLE_MAX_STOP]; /* generation and tokenizer configs); 0: none */
};

void td_engine_destroy(td_engine_t *e);

/* A rank of a DEP group (an engine made by td_engine_create_group): ops
 * pass_empty, passes and expert_tokens are set. */
int td_engine_is_group(const td_engine_t *e);

/* "synthetic (not a model: keyed-hash tokens and KV), 40 layers, 890.0 B/token
 * paged + 2.9 MiB fixed per request, vocab 129280" — snprintf-like. */
size_t td_engine_describe(const td_engine_t *e, char *buf, size_t len);

/* A request with sampling sp whose KV lives in kv (a view of the caller's
 * memory for this layout; ops.req_create). Its capacity in tokens is
 * td_layout_kv_capacity(kv), at most max_context. With a penalty on, the
 * request keeps its tokens' history (prompt and generated) for the sampler.
 * Sampling as td_sample_check checks it, logit_bias ids inside the
 * vocabulary (TD_ERR_INVALID otherwise, logged). */
td_status_t td_engine_req_create(td_engine_t *e, const td_sample_params_t *sp,
                                 const td_layout_kv_t *kv, td_engine_req_t **out);
void td_engine_req_destroy(td_engine_req_t *req);

/* Prefill a chunk (see ops.prefill). Tokens outside the vocabulary, or past
 * max context or the KV memory's capacity: TD_ERR_INVALID / TD_ERR_RANGE,
 * nothing appended. */
td_status_t td_engine_prefill(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
                              td_engine_layer_fn fn, void *arg);
/* Adopt a prompt prefilled elsewhere whose KV arrived in the request's KV
 * memory (see ops.adopt). */
td_status_t td_engine_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n);
/* ---- Bounded replay (docs/kvcache.md, "Replay bound") --------------------------
 * A request whose paged entries of a prompt prefix tokens[0..p) are given
 * (a prefix cache's shared blocks, read-only) rebuilds the fixed state at p
 * (window rings, partial groups, engram look-back, counters) bit for bit as
 * a cold prefill of tokens[0..p) leaves it: td_engine_seek(req, tokens, s)
 * with s = p - B (0 when p < B, B = td_engine_replay_bound), then
 * td_engine_replay of tokens[s..p) with frozen = p, in one chunk or several;
 * td_engine_prefill then continues with tokens[p..] as it would after the
 * cold prefill (same logits, same entries). Neither call writes a paged
 * entry below p. An engine without replay answers both with
 * TD_ERR_UNSUPPORTED (logged) and its bound is 0. */

/* B: the fewest tokens whose replay gives the fixed state at every p >= B
 * exactly; 0: the engine cannot replay. */
uint64_t td_engine_replay_bound(const td_engine_t *e);
/* Place a fresh request (no tokens yet) at position pos of tokens[0..pos)
 * with nothing computed: fixed segments empty, the engram look-back holding
 * tokens[pos - E..pos), counters pos; ntokens and prompt become pos.
 * TD_ERR_STATE for a request with tokens; tokens outside the vocabulary or
 * pos past the capacity: TD_ERR_INVALID / TD_ERR_RANGE. */
td_status_t td_engine_seek(td_engine_req_t *req, const int32_t *tokens, uint64_t pos);
/* One prefill chunk of tokens[0..n) (n >= 1) continuing at req->ntokens,
 * one forward pass, no layer callback, no logits: every paged entry whose
 * tokens all lie below frozen is neither written nor reported and is read
 * as the KV memory holds it. req->ntokens + n <= frozen (TD_ERR_RANGE);
 * after a decode step: TD_ERR_STATE. A failure makes the request unusable. */
td_status_t td_engine_replay(td_engine_req_t *req, const int32_t *tokens, size_t n,
                             uint64_t frozen);

/* Take `token`, sampled elsewhere (the prefill rank), as the token at the
 * request's end: the finish it brings under the request's sampling.
 * TD_ERR_INVALID for a token outside the vocabulary. */
td_status_t td_engine_take(td_engine_req_t *req, int32_t token, td_sample_finish_t *finish);
/* Sample the token at the request's end (the first token after prefill):
 * the engine's distribution through the sampler (td_sample_dist_pick), with
 * its log-probabilities in *pick when the request asks for them. */
td_status_t td_engine_sample_pick(td_engine_req_t *req, td_sample_pick_t *pick,
                                  td_sample_finish_t *finish);
/* td_engine_sample_pick with another seed (a sibling choice of an n > 1
 * request drawn from the same distribution: seed S + i). */
td_status_t td_engine_sample_pick_seed(td_engine_req_t *req, uint64_t seed,
                                       td_sample_pick_t *pick, td_sample_finish_t *finish);
/* td_engine_sample_pick for the token alone. */
td_status_t td_engine_sample(td_engine_req_t *req, int32_t *token, td_sample_finish_t *finish);
td_status_t td_engine_logits(td_engine_req_t *req, td_sample_dist_t *out);
/* One decode step: append every row's token, then sample each row's next
 * (and its log-probabilities, td_engine_sample_pick).
 * Rows are checked first; on a bad row nothing is appended (TD_ERR_INVALID,
 * TD_ERR_STATE, TD_ERR_RANGE). fn may be NULL. */
td_status_t td_engine_decode_step(td_engine_t *e, td_engine_row_t *rows, size_t n,
                                  td_engine_layer_fn fn, void *arg);

#endif
