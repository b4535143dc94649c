/* engine/engine.h — what the daemons see of a model: its KV layout, chunked
 * prefill that hands each finished layer's segment data to the caller, one
 * decode step over a batch, and sampling. Nothing model-specific leaks out:
 * every engine ("synthetic", "deepseek-v41") is an ops table.
 * Ownership: an engine owns its layout; a request belongs to one engine and
 * is destroyed before it. Calls on one request are not concurrent; calls on
 * different requests may run on different threads. */
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

/* One segment's data produced by a layer: entries [first, first + count) of
 * segment `seg` (index into the layout), count × entry_bytes contiguous bytes.
 * A fixed segment comes whole (first = 0, count = its slots). */
typedef struct {
    uint32_t seg;
    uint64_t first;
    uint64_t count;
    const void *data;     /* valid during the callback only */
} td_engine_piece_t;

/* Called once per layer, in layer order, when the layer is done (prefill: for
 * every layer of every chunk, npieces possibly 0; decode: per layer and row,
 * only when pieces exist). A non-OK return stops the prefill/step at this
 * layer boundary; the status is returned and the request is unusable after
 * (destroy it). */
typedef td_status_t (*td_engine_layer_fn)(td_engine_req_t *req, uint32_t layer,
                                          const td_engine_piece_t *pieces, size_t npieces,
                                          void *arg);

/* ---- The engine ---------------------------------------------------------------- */

/* A request's state. Callers read these fields; only engine code writes them.
 * An implementation embeds it as the first member of its own request. */
struct td_engine_req {
    td_engine_t *engine;
    td_sample_params_t sampling;
    uint64_t ntokens;      /* tokens in the sequence (prompt + decoded inputs) */
    uint64_t prompt;       /* tokens given by prefill/adopt */
    td_status_t failed;    /* TD_OK, or why the request became unusable */
    void *user;            /* free for the caller */
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
    /* NULL for an identity-only engine (requests: TD_ERR_UNSUPPORTED). */
    td_status_t (*req_create)(td_engine_t *e, td_engine_req_t **out);
    void (*req_destroy)(td_engine_req_t *req);
    /* Append tokens[0..n) (n >= 1) and run them through every layer; `last`:
     * this is the prompt's final chunk, so fixed segments come out too. */
    td_status_t (*prefill)(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
                           td_engine_layer_fn fn, void *arg);
    /* Take over a request whose prefill ran elsewhere: tokens are its prompt,
     * fixed[seg] (NULL, or per segment NULL for paged) the received fixed
     * segments, paged[seg] (NULL, or per segment NULL for fixed) the blocks
     * holding the received paged entries (block b: entries
     * [b * block_entries, ...) of the layout, td_layout_entries(seg, n) in
     * all); each checked or loaded where the engine can. No cost, no output.
     * An engine that cannot give logits before its first decode step
     * answers logits with TD_ERR_STATE until then. */
    td_status_t (*adopt)(td_engine_req_t *req, const int32_t *tokens, size_t n,
                         const void *const *fixed, const void *const *const *paged);
    /* Append each row's token, emit the paged entries it completes. */
    td_status_t (*decode)(td_engine_t *e, td_engine_row_t *rows, size_t n,
                          td_engine_layer_fn fn, void *arg);
    /* Check received bytes of entries [first, first + count) of segment seg
     * against what the engine computes for req's sequence: TD_OK, or
     * TD_ERR_MISMATCH with *bad the offset of the first wrong byte. NULL for
     * an engine that cannot recompute its KV cheaply (a model). */
    td_status_t (*kv_verify)(td_engine_req_t *req, uint32_t seg, uint64_t first,
                             uint64_t count, const void *data, uint64_t *bad);
    /* The next-token distribution at the request's end; valid until the next
     * call on req. */
    td_status_t (*logits)(td_engine_req_t *req, td_sample_dist_t *out);
} td_engine_ops_t;

struct td_engine {
    const td_engine_ops_t *ops;
    const char *name;          /* "synthetic", "deepseek-v41" */
    const char *kind;          /* what it is, shown in logs and /v1/models */
    const td_layout_t *layout; /* owned by the engine */
    uint32_t vocab;
    uint64_t max_context;
    uint64_t fingerprint;      /* model fingerprint for Hello */
    uint32_t nstop;            /* the model's end-of-sequence ids (its checkpoint's */
    int32_t stop[TD_SAMPLE_MAX_STOP]; /* generation and tokenizer configs); 0: none */
};

void td_engine_destroy(td_engine_t *e);

/* "synthetic (not a model: keyed-hash tokens and KV), 40 layers, 890.0 B/token
 * paged + 2.9 MiB fixed per request, vocab 129280" — snprintf-like. */
size_t td_engine_describe(const td_engine_t *e, char *buf, size_t len);

/* A request sampling with sp (td_sample_check; logit_bias ids inside the
 * vocabulary; TD_ERR_INVALID otherwise, logged). */
td_status_t td_engine_req_create(td_engine_t *e, const td_sample_params_t *sp,
                                 td_engine_req_t **out);
void td_engine_req_destroy(td_engine_req_t *req);

/* Prefill a chunk (see ops.prefill). Tokens outside the vocabulary or past
 * max context: TD_ERR_INVALID / TD_ERR_RANGE, nothing appended. */
td_status_t td_engine_prefill(td_engine_req_t *req, const int32_t *tokens, size_t n, int last,
                              td_engine_layer_fn fn, void *arg);
/* Adopt a prompt prefilled elsewhere (see ops.adopt) with the received fixed
 * segments and paged blocks; fixed and paged may be NULL where the engine
 * needs no received KV (synthetic). td_engine_adopt: paged = NULL. */
td_status_t td_engine_adopt_kv(td_engine_req_t *req, const int32_t *tokens, size_t n,
                               const void *const *fixed, const void *const *const *paged);
td_status_t td_engine_adopt(td_engine_req_t *req, const int32_t *tokens, size_t n,
                            const void *const *fixed);
/* Take `token`, sampled elsewhere (the prefill rank), as the token at the
 * request's end: the finish it brings under the request's sampling.
 * TD_ERR_INVALID for a token outside the vocabulary. */
td_status_t td_engine_take(td_engine_req_t *req, int32_t token, td_sample_finish_t *finish);
/* Sample the token at the request's end (the first token after prefill):
 * the engine's distribution through the sampler (td_sample_dist_pick), with
 * its log-probabilities in *pick when the request asks for them. */
td_status_t td_engine_sample_pick(td_engine_req_t *req, td_sample_pick_t *pick,
                                  td_sample_finish_t *finish);
/* td_engine_sample_pick for the token alone. */
td_status_t td_engine_sample(td_engine_req_t *req, int32_t *token, td_sample_finish_t *finish);
td_status_t td_engine_logits(td_engine_req_t *req, td_sample_dist_t *out);
/* Whether e checks received KV bytes (ops.kv_verify), and the check;
 * TD_ERR_UNSUPPORTED where it does not. */
int td_engine_verifies(const td_engine_t *e);
td_status_t td_engine_kv_verify(td_engine_req_t *req, uint32_t seg, uint64_t first,
                                uint64_t count, const void *data, uint64_t *bad);
/* One decode step: append every row's token, then sample each row's next
 * (and its log-probabilities, td_engine_sample_pick).
 * Rows are checked first; on a bad row nothing is appended (TD_ERR_INVALID,
 * TD_ERR_STATE, TD_ERR_RANGE). fn may be NULL. */
td_status_t td_engine_decode_step(td_engine_t *e, td_engine_row_t *rows, size_t n,
                                  td_engine_layer_fn fn, void *arg);

#endif
