/* decoded/dreq.h — a request on a decode rank and its state machine:
 * ADMITTED (blocks reserved, waiting for KV) -> RUNNING (KV verified and
 * adopted, in the batch) -> FINISHED / CANCELED / FAILED -> RELEASED (blocks
 * freed, Released sent). Every change goes through td_dreq_set_state,
 * which checks the transition and logs it.
 * Ownership: the rank owns its requests; a request owns its prompt copy, its
 * engine request and its grace timer, and holds (does not own) its block
 * reservation, which the rank releases. */
#ifndef TD_DREQ_H
#define TD_DREQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "kvpool.h"
#include "status.h"
#include "wcons.h"
#include "xfer.h"

struct event;

typedef enum {
    TD_DREQ_ADMITTED = 0,  /* blocks reserved; the prefill writes into them */
    TD_DREQ_RUNNING,       /* KV verified and adopted; decoding in the batch */
    TD_DREQ_FINISHED,      /* stop token or length; blocks held until P's note */
    TD_DREQ_CANCELED,      /* by the router (or its loss) */
    TD_DREQ_FAILED,        /* bad KV, failed transfer, engine error */
    TD_DREQ_RELEASED,      /* blocks freed; about to be destroyed */
    TD_DREQ_NSTATES
} td_dreq_state_t;

typedef struct {
    uint64_t id;                 /* the router's request id */
    uint64_t xfer_id;            /* the id the prefill's transfers carry (random, non-zero,
                                    unique among the rank's live requests) */
    td_xfer_token_t token;       /* its transfers' token (KvDest.xfer_token): a note
                                    without it is dropped unparsed */
    uint64_t prefill_inc;        /* the prefill incarnation its notes must come from */
    td_dreq_state_t state;
    void *router;                /* the router that admitted it; NULL once it is gone */
    td_kvpool_res_t *res;        /* the reserved blocks; NULL once released */
    int32_t *prompt;             /* [nprompt] */
    size_t nprompt;
    td_engine_req_t *ereq;       /* the engine's request over res->kv (adopted on KV arrival) */
    Tandem__Constraint cons_in;  /* its Sampling's constraint (spec owned); kind 0: none */
    td_wcons_t *cons;            /* compiled on the compute thread before its first token */
    char cons_why[200];          /* why the constraint was refused */
    int32_t last;                /* the last sampled token (input of the next step) */
    uint64_t generated;          /* tokens sent, the first included */
    int32_t *gen;                /* [generated] those tokens, when the rank keeps finished
                                    requests' state (NULL otherwise) */
    size_t gencap;
    uint32_t choice;             /* which of its request's choices this row decodes: 0, the
                                    lead, whose blocks the prefill writes and whose id the
                                    notes name; 1.. its siblings, which share the lead's
                                    whole prompt blocks (docs/decoded.md, "n choices") */
    uint32_t nchoices;           /* the request's choices (Sampling.n; 1 for most) */
    uint64_t cont;               /* a continued conversation: the prompt's first cont
                                    tokens are the kept state the request took over
                                    (its suffix is prefilled here); 0: prefilled elsewhere */
    bool keep;                   /* finished with its state kept (Tokens.retained_tokens) */
    bool kv_done;                /* P's terminal note came (or P is gone and the
                                    grace period passed): no peer writes any more */
    bool busy;                   /* in a job on the compute thread (adopt or a
                                    step): its engine request and blocks are in use */
    struct event *grace;         /* grace timer once P is reported gone */
    void *rank;                  /* the rank it lives on (for timers) */
    uint32_t grace_ms;           /* its grace period (decoded/drank.c) */
    char prefill[96];            /* "node/rank#incarnation", for the logs */
    char prefill_node[65];       /* its prefill rank, for a Fence ("" when it prefills
                                    here: a continued conversation) */
    uint32_t prefill_rank;
    bool paused;                 /* its client reads slowly (Pause): out of the batch,
                                    its blocks kept (docs/decoded.md, "Paused rows") */
    bool resume_wanted;          /*   resumed by the router, waiting for a free row */
    uint64_t paused_ns;          /*   since when (CLOCK_MONOTONIC) */
    bool quarantined;            /* P missed its deadline: the blocks wait for a fence
                                    (docs/decoded.md, "Fencing"); holds no batch row */
} td_dreq_t;

const char *td_dreq_state_str(td_dreq_state_t st);

/* A fresh ADMITTED request (prompt copied, no blocks yet). */
td_status_t td_dreq_create(uint64_t id, const int32_t *prompt, size_t nprompt,
                              td_dreq_t **out);
/* Append a generated token to req->gen (growing it). TD_ERR_NOMEM. */
td_status_t td_dreq_gen_push(td_dreq_t *req, int32_t token);
/* Frees the prompt, the engine request and the grace timer; res must have
 * been released (asserted). */
void td_dreq_destroy(td_dreq_t *req);

/* The one door of every state change (base/fsm.h): logs it with why (may
 * be NULL); an illegal transition is a bug, logged and aborted in every
 * build. Callers check the state before acting on a peer's message. */
void td_dreq_set_state(td_dreq_t *req, td_dreq_state_t to, const char *why);

/* FINISHED, CANCELED or FAILED: the request has left (or never joined) the
 * batch and waits only for its blocks to be freed. */
bool td_dreq_ended(const td_dreq_t *req);

#endif
