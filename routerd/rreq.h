/* routerd/rreq.h — the requests in flight and their state machine: tokenize,
 * choose ranks (rsched.h), Admit / Prefill, stream Tokens back as SSE or one
 * response, and end every request exactly once. Messages from the ranks come
 * in through td_rreq_on_message / td_rreq_on_rank_lost (the caller wires
 * them to the cluster's handlers); the HTTP side is http.h's. The text work
 * (rtext.h) runs on the table's text threads; everything here runs on the
 * loop thread.
 * Ownership: the table owns every request in flight and its text threads,
 * and frees them (without answering) when destroyed; what the config points
 * to outlives the table (the tokenizer is used by several threads at once). */
#ifndef TD_ROUTERD_RREQ_H
#define TD_ROUTERD_RREQ_H

#include <stdint.h>

#include <jansson.h>

#include "cluster.h"
#include "http.h"
#include "ireq.h"
#include "metrics.h"
#include "openai.h"
#include "rqueue.h"
#include "rrank.h"
#include "rstore.h"
#include "rtext.h"
#include "status.h"
#include "tandem.pb-c.h"
#include "tok.h"
#include "tokenizer.h"

struct event_base;

typedef enum {
    TD_RREQ_NEW = 0,     /* received; its body parsed and prompt tokenized on a text thread */
    TD_RREQ_QUEUED,      /* waiting for a decode rank with room (rqueue.h); holds no rank */
    TD_RREQ_ADMITTING,   /* Admit sent to a decode rank */
    TD_RREQ_PREFILLING,  /* AdmitOk; Prefill sent to a prefill rank */
    TD_RREQ_DECODING,    /* first tokens arrived */
    TD_RREQ_DONE,        /* finished (stop / length) and answered */
    TD_RREQ_FAILED,      /* answered with an error */
    TD_RREQ_CANCELED,    /* client gone or canceled by the operator */
    TD_RREQ_NSTATES
} td_rreq_state_t;

typedef struct td_rreq_s td_rreq_t;
typedef struct td_rreq_tab_s td_rreq_tab_t;

/* What the requests need from the daemon (pointers kept, not copied). */
typedef struct {
    struct event_base *base;
    td_cluster_t *cluster;          /* ranks are chosen from it and bound in it */
    td_metrics_t *metrics;          /* counted into */
    const td_ireq_cfg_t *api;       /* request validation (and the model's stop ids) */
    const td_tok_t *tok;
    const td_tokenizer_t *v41;      /* the V4.1 tokenizer behind tok, or NULL */
    const char *model;              /* id in responses */
    const char *fingerprint;        /* system_fingerprint */
    uint64_t id_prefix;             /* top 16 bits of every request id */
    uint64_t request_timeout_ms;    /* 0 = none */
    unsigned retry_after_s;         /* Retry-After of a 503 */
    unsigned max_attempts;          /* admissions per request, <= TD_RSCHED_MAX_TRIED
                                       (those a rank turned away for capacity not counted) */
    size_t max_queued;              /* admission queue: requests waiting (0: none wait) */
    uint64_t queue_timeout_ms;      /*   the longest wait (>= 1) */
    uint64_t max_context;           /* the model's context in tokens (0: not known) */
    double kv_bytes_per_token;      /* paged KV bytes per token, for kv_bytes_moved */
    uint64_t kv_fixed_bytes;        /* fixed KV bytes per request */
    unsigned text_threads;          /* threads that parse, encode, tokenize and detokenize */
    uint64_t text_inline_max;       /* token batches up to this weight (rtext.h) are
                                       detokenized on the loop; 0: never */
    uint64_t text_inline_body;      /* request bodies up to this many bytes are parsed,
                                       encoded and tokenized on the loop; 0: never */
    double cache_weight;            /* prefill placement's weight of cached tokens
                                       (rsched.h; 0: by load only) */
    uint64_t cache_seed;            /* td_chain_seed of the model and KV layout */
    uint64_t continue_max_suffix;   /* a prompt that continues a decode rank's kept state
                                       by at most this many tokens is prefilled there
                                       (docs/kvcache.md, "Multi-turn"); 0: never */
    size_t continue_max_states;     /* kept states tracked (>= 1 when the above is on) */
    td_rstore_t *store;             /* stored responses (borrowed), or NULL */
    uint64_t slow_reader_timeout_ms;    /* a stream paused this long is canceled (0: 60 s) */
} td_rreq_config_t;

/* Starts the text threads. TD_ERR_NOMEM or TD_ERR_IO (logged). */
td_status_t td_rreq_tab_create(const td_rreq_config_t *cfg, td_rreq_tab_t **out);
void td_rreq_tab_destroy(td_rreq_tab_t *t);

const char *td_rreq_state_str(td_rreq_state_t st);

/* Parse hreq's body as a request of kind and serve it (answers errors). */
void td_rreq_serve(td_rreq_tab_t *t, td_http_req_t *hreq, td_openai_kind_t kind);
/* A message about a request from worker rank rk (AdmitOk, AdmitReject,
 * PrefillDone, Tokens, Released, Forget). One that does not fit the request's state
 * or comes from a rank the request is not bound to is ignored (logged); a
 * Tokens message with an id outside the tokenizer's vocabulary (or
 * log-probabilities that do not match its tokens) fails the request. */
void td_rreq_on_message(td_rreq_tab_t *t, td_rrank_t *rk, const Tandem__Envelope *env);
/* rk's connection ended: retry or fail every request bound to it. */
void td_rreq_on_rank_lost(td_rreq_tab_t *t, td_rrank_t *rk);
/* Admin cancel: TD_ERR_NOT_FOUND when no such request is in flight. */
td_status_t td_rreq_cancel_id(td_rreq_tab_t *t, uint64_t id);
/* Admin view: a JSON array of the requests in flight (NULL: out of memory). */
json_t *td_rreq_list_json(td_rreq_tab_t *t);
/* Requests in flight per state, for /metrics and the admin status. */
void td_rreq_count_states(td_rreq_tab_t *t, uint64_t counts[TD_RREQ_NSTATES]);
/* Capacity may have freed (the cluster's on_capacity): waiting requests are
 * placed on the next loop iteration. */
void td_rreq_on_capacity(td_rreq_tab_t *t);
/* The admission queue now, for /metrics and the admin status. */
void td_rreq_queue_stats(td_rreq_tab_t *t, td_rqueue_stats_t *out);

/* Shutdown. stop: from now on a new request is refused (503, code
 * "shutting_down", Connection: close); the ones in flight go on, and
 * on_idle(arg) runs once none is left (at once when none is). */
void td_rreq_tab_stop(td_rreq_tab_t *t, void (*on_idle)(void *arg), void *arg);
/* The drain deadline: every request still in flight ends now with an error
 * (mid-stream an error event and [DONE], else a 503 JSON error), its ranks
 * canceled. */
void td_rreq_tab_fail_all(td_rreq_tab_t *t);
/* Requests in flight. */
size_t td_rreq_tab_count(const td_rreq_tab_t *t);

/* The text threads and what their work reads, for the other text jobs
 * (rtok.h); they stop with the table. */
struct td_jobq_s *td_rreq_text_pool(td_rreq_tab_t *t);
const td_rtext_cfg_t *td_rreq_text_cfg(const td_rreq_tab_t *t);

#endif
