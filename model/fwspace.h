/* model/fwspace.h — the forward pass's workspace, private to model/: one
 * block a pass takes every buffer from (forward.c allocates nothing; the
 * blocks are grown here, in fwspace.c, before a pass and never during one),
 * and the internal entry points fwspace.c builds td_forward and its DEP
 * context on. */
#ifndef TD_MODEL_FWSPACE_H
#define TD_MODEL_FWSPACE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* A block and how much of it is taken. With base NULL it only counts: a
 * pass's carving run on such a space measures the bytes it needs. */
typedef struct {
    unsigned char *base;
    size_t cap, used;
} td_fwspace_t;

#define TD_FWSPACE_ALIGN 64

/* bytes (rounded up to TD_FWSPACE_ALIGN, at least one unit) from s: NULL
 * when s only counts or has no room (then s->used still grows, so a count
 * can be read). */
static inline void *
td_fwspace_take(td_fwspace_t *s, size_t bytes)
{
    size_t b = bytes ? (bytes + TD_FWSPACE_ALIGN - 1) / TD_FWSPACE_ALIGN * TD_FWSPACE_ALIGN
                     : TD_FWSPACE_ALIGN;
    void *p = s->base != NULL && s->used <= s->cap && b <= s->cap - s->used ? s->base + s->used
                                                                            : NULL;
    s->used += b;
    return p;
}

/* Make s hold at least bytes (grown, never shrunk; what it held is lost)
 * and take nothing yet. TD_ERR_NOMEM, logged, when it cannot. */
td_status_t td_fwspace_reserve(td_fwspace_t *s, size_t bytes, const char *what);
void td_fwspace_release(td_fwspace_t *s);

/* The MoE workspace of a pass: one forward's (td_forward), or kept by a DEP
 * context from pass to pass, in one block (space) grown to the largest
 * pass. N = the pass's rows, R = rows one expert may get, S = expert slots
 * run here. */
typedef struct fw_moe_ws {
    td_fwspace_t space;
    float *sc;                  /* [N, E] router logits, then scores */
    void *route_ws;             /* the route op's workspace */
    int32_t *sexp;              /* [N, K] each token's experts, ascending */
    float *swt;                 /* [N, K] their weights */
    float *xe, *ye, *ge, *ue;   /* [R, H], [R, H], [R, I], [R, I] one expert's rows */
    float *we;                  /* [R] their weights */
    size_t *bucket;             /* [2 E + 1] slots per expert: starts, then cursors */
    size_t *order;              /* [S] slots grouped by expert */
    /* DEP */
    unsigned char *send, *recv; /* dispatch records out, in */
    size_t recv_cap;
    const float **ax;           /* [S] each received slot's hidden vector (in recv) */
    float *aw;                  /* [S] its weight */
    int32_t *ae;                /* [S] its expert */
    size_t scap;                /* S's bound */
    float *out;                 /* [S, H] expert outputs, in arrival order */
    float *back;                /* [N * K, H] outputs back at the token's rank */
    size_t *slot;               /* [N, K] each token's slot's row in back */
    uint32_t *dest;             /* [N, K] each slot's rank */
} fw_moe_ws_t;

/* One rank's side of a DEP group (model.h); made and freed by fwspace.c. */
struct td_forward_dep {
    const td_model_t *m;
    td_comm_t *comm;
    const td_placement_t *p;
    uint32_t rank, size, held;
    fw_moe_ws_t ws;
    uint64_t *ntok;             /* [size] each rank's rows this pass */
    size_t *sbytes, *rbytes;    /* [size] dispatch bytes to / from each rank */
    size_t *cbytes, *cback;     /* [size] combine bytes to each rank, expected from each */
    size_t *first;              /* [size + 1] each source's first received slot */
    _Atomic uint64_t *expert_tokens;   /* [layers, E] rows run by this rank's experts */
    _Atomic uint64_t passes, tokens, dispatch_bytes, combine_bytes;
    _Atomic uint64_t dispatch_remote, combine_remote;   /* of those, to other ranks */
};


/* One pass of forward.c: td_forward (dep NULL) or one rank's part of a
 * DEP step; at most as many rows as the caller gives (fwspace.c splits
 * long calls). */
td_status_t td_forward_pass(const td_model_t *m, td_forward_dep_t *dep, td_forward_seq_t *seqs,
                            size_t nseqs, td_forward_layer_fn fn, void *arg);
/* The checks td_forward makes of its arguments (forward.c), logged. */
td_status_t td_forward_check(const td_model_t *m, const td_forward_dep_t *dep,
                             const td_forward_seq_t *seqs, size_t nseqs);

/* Rows of one pass of td_forward: a call with more (a long prompt in one
 * shot) runs as consecutive passes of at most this many rows, so the pass's
 * workspace is bounded by it, not by the prompt (docs/forward.md). */
#define TD_FORWARD_PASS_ROWS 256

#endif
