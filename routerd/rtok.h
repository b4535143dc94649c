/* routerd/rtok.h — POST /tokenize and POST /detokenize in vLLM's shapes
 * (and the Messages API's count_tokens): a
 * prompt or a conversation turned into the ids routerd would send the model
 * for it (the request model's adapter and encoder, so the ids are exactly a
 * completion's or a chat's prompt), and ids back into text. The work runs on
 * routerd's text threads (one job per request); the loop only answers.
 * Ownership: the router owns the td_rtok_t and destroys it after the text
 * threads are stopped (td_rreq_tab_destroy); it owns the jobs in flight and
 * frees those whose done never came. */
#ifndef TD_ROUTERD_RTOK_H
#define TD_ROUTERD_RTOK_H

#include <stdbool.h>
#include <stdint.h>

#include "http.h"
#include "jobq.h"
#include "metrics.h"
#include "rstore.h"
#include "rtext.h"
#include "status.h"

typedef struct td_rtok_s td_rtok_t;

typedef struct {
    td_jobq_t *pool;            /* the text threads (borrowed) */
    const td_rtext_cfg_t *text; /* the request model's config, tokenizer, model id */
    td_metrics_t *metrics;      /* refusals counted */
    uint64_t max_context;       /* max_model_len of /tokenize (0: not known) */
    td_rstore_t *store;         /* stored responses (borrowed), or NULL */
} td_rtok_cfg_t;

/* TD_ERR_NOMEM. */
td_status_t td_rtok_create(const td_rtok_cfg_t *cfg, td_rtok_t **out);
void td_rtok_destroy(td_rtok_t *x);

typedef enum {
    TD_RTOK_TOKENIZE = 0,       /* /tokenize */
    TD_RTOK_DETOKENIZE,         /* /detokenize */
    TD_RTOK_COUNT_MESSAGES,     /* /v1/messages/count_tokens: {"input_tokens"} of a
                                   Messages request's prompt */
    TD_RTOK_RESPONSE_GET,       /* GET /v1/responses/{id}: the stored response */
    TD_RTOK_RESPONSE_DELETE,    /* DELETE /v1/responses/{id} */
    TD_RTOK_RESPONSE_CANCEL,    /* POST /v1/responses/{id}/cancel */
} td_rtok_mode_t;

/* Serve such a request: its body goes to a text thread, the answer (or a
 * 4xx in the route's error format) comes back on the loop. */
void td_rtok_serve(td_rtok_t *x, td_http_req_t *hreq, td_rtok_mode_t mode);
/* A stored response's: id (copied), owned by the request's key. */
void td_rtok_serve_stored(td_rtok_t *x, td_http_req_t *hreq, td_rtok_mode_t mode,
                          const char *id);

#endif
