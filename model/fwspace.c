/* model/fwspace.c — what the forward pass takes its memory from and the
 * entry points around it: the workspace blocks (grown here before a pass,
 * never during one: forward.c allocates nothing), td_forward splitting a
 * long call into passes of at most TD_FORWARD_PASS_ROWS rows, the DEP
 * context, and the prefill and decode shorthands. */
#include "fwspace.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

td_status_t
td_fwspace_reserve(td_fwspace_t *s, size_t bytes, const char *what)
{
    s->used = 0;
    if (s->base != NULL && s->cap >= bytes)
        return TD_OK;
    free(s->base);
    size_t cap = ((bytes ? bytes : 1) + TD_FWSPACE_ALIGN - 1) / TD_FWSPACE_ALIGN * TD_FWSPACE_ALIGN;
    s->base = aligned_alloc(TD_FWSPACE_ALIGN, cap);
    s->cap = s->base != NULL ? cap : 0;
    if (s->base == NULL) {
        td_error("forward: out of memory for %s (%zu bytes)", what, bytes);
        return TD_ERR_NOMEM;
    }
    return TD_OK;
}

void
td_fwspace_release(td_fwspace_t *s)
{
    free(s->base);
    memset(s, 0, sizeof(*s));
}

/* ---- td_forward -------------------------------------------------------------------------- */

/* A call of more than TD_FORWARD_PASS_ROWS rows without a hook: passes of
 * at most that many rows, each taking the next tokens of every request that
 * has some left (chunked prefill equals one shot bit for bit, and a row's
 * result does not depend on the others of its pass). */
static td_status_t
fw_run_passes(const td_model_t *m, td_forward_seq_t *seqs, size_t nseqs)
{
    td_forward_seq_t *part = calloc(nseqs, sizeof(*part));
    size_t *done = calloc(nseqs, sizeof(*done));
    td_status_t st = td_forward_check(m, NULL, seqs, nseqs);
    size_t V = (size_t)m->cfg->vocab_size;

    if (st == TD_OK && (part == NULL || done == NULL)) {
        st = TD_ERR_NOMEM;
        td_error("forward: out of memory for the passes of %zu requests", nseqs);
    }
    while (st == TD_OK) {
        size_t np = 0, rows = 0;
        for (size_t s = 0; s < nseqs && rows < TD_FORWARD_PASS_ROWS; s++) {
            const td_forward_seq_t *q = &seqs[s];
            if (done[s] == q->n)
                continue;
            size_t room = TD_FORWARD_PASS_ROWS - rows;
            size_t take = q->n - done[s] < room ? q->n - done[s] : room;
            part[np] = (td_forward_seq_t){ q->cache, q->tokens + done[s], take, NULL,
                                           q->all_logits, q->frozen };
            if (q->logits != NULL && q->all_logits)
                part[np].logits = q->logits + done[s] * V;
            else if (done[s] + take == q->n)
                part[np].logits = q->logits;
            done[s] += take;
            rows += take;
            np++;
        }
        if (np == 0)
            break;
        st = td_forward_pass(m, NULL, part, np, NULL, NULL);
    }
    free(part);
    free(done);
    return st;
}

td_status_t
td_forward(const td_model_t *m, td_forward_seq_t *seqs, size_t nseqs, td_forward_layer_fn fn,
           void *arg)
{
    size_t rows = 0;
    for (size_t s = 0; seqs != NULL && s < nseqs; s++)
        rows += seqs[s].n;
    if (fn == NULL && rows > TD_FORWARD_PASS_ROWS)
        return fw_run_passes(m, seqs, nseqs);
    return td_forward_pass(m, NULL, seqs, nseqs, fn, arg);
}

/* ---- DEPn: one rank's context ------------------------------------------------------------ */

td_status_t
td_forward_dep_create(const td_model_t *m, td_comm_t *comm, const td_placement_t *p,
                      td_forward_dep_t **out)
{
    const td_modelcfg_t *c = m->cfg;
    uint32_t E = (uint32_t)c->n_routed_experts, size = td_comm_size(comm);
    uint32_t rank = td_comm_rank(comm);
    size_t nl = (size_t)c->num_hidden_layers;

    if (td_placement_experts(p) != E || td_placement_ranks(p) != size) {
        td_error("forward: a placement of %u experts over %u ranks for a group of %u ranks and "
                 "a model of %u experts", td_placement_experts(p), td_placement_ranks(p), size,
                 E);
        return TD_ERR_INVALID;
    }
    for (uint32_t e = 0; e < E; e++)
        if (td_placement_holds(p, rank, e) && !m->expert_held[e]) {
            td_error("forward: rank %u holds expert %u by the placement, but its model was "
                     "loaded without it", rank, e);
            return TD_ERR_INVALID;
        }
    td_forward_dep_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        goto nomem;
    d->m = m;
    d->comm = comm;
    d->p = p;
    d->rank = rank;
    d->size = size;
    d->held = td_placement_held(p, rank);
    d->ntok = calloc(size, sizeof(*d->ntok));
    d->sbytes = calloc(size, sizeof(size_t));
    d->rbytes = calloc(size, sizeof(size_t));
    d->cbytes = calloc(size, sizeof(size_t));
    d->cback = calloc(size, sizeof(size_t));
    d->first = calloc((size_t)size + 1, sizeof(size_t));
    d->expert_tokens = calloc(nl * E, sizeof(*d->expert_tokens));
    if (d->ntok == NULL || d->sbytes == NULL || d->rbytes == NULL || d->cbytes == NULL ||
        d->cback == NULL || d->first == NULL || d->expert_tokens == NULL) {
        td_forward_dep_destroy(d);
        goto nomem;
    }
    for (size_t i = 0; i < nl * E; i++)
        atomic_init(&d->expert_tokens[i], 0);
    atomic_init(&d->passes, 0);
    atomic_init(&d->tokens, 0);
    atomic_init(&d->dispatch_bytes, 0);
    atomic_init(&d->combine_bytes, 0);
    atomic_init(&d->dispatch_remote, 0);
    atomic_init(&d->combine_remote, 0);
    *out = d;
    return TD_OK;
nomem:
    td_error("forward: rank %u of %u: out of memory for the DEP context", rank, size);
    return TD_ERR_NOMEM;
}

void
td_forward_dep_destroy(td_forward_dep_t *d)
{
    if (d == NULL)
        return;
    td_fwspace_release(&d->ws.space);
    free(d->ntok);
    free(d->sbytes);
    free(d->rbytes);
    free(d->cbytes);
    free(d->cback);
    free(d->first);
    free(d->expert_tokens);
    free(d);
}

td_status_t
td_forward_dep(td_forward_dep_t *d, td_forward_seq_t *seqs, size_t nseqs,
               td_forward_layer_fn fn, void *arg)
{
    td_status_t st = td_comm_status(d->comm);

    if (st != TD_OK) {
        td_error("forward: rank %u of %u: the DEP group's communicator is broken (%s)",
                 d->rank, d->size, td_status_str(st));
        return st;
    }
    st = td_forward_pass(d->m, d, seqs, nseqs, fn, arg);
    if (st != TD_OK && d->size > 1)
        td_comm_abort(d->comm, st);   /* the other ranks stop at their next collective */
    return st;
}

td_status_t
td_forward_prefill(const td_model_t *m, td_cache_t *c, const int32_t *tokens, size_t n,
                   int all_logits, float *logits)
{
    td_forward_seq_t s = { c, tokens, n, logits, all_logits, 0 };
    return td_forward(m, &s, 1, NULL, NULL);
}

td_status_t
td_forward_decode(const td_model_t *m, td_cache_t *const *caches, const int32_t *tokens,
                  size_t n, float *logits)
{
    td_status_t st;

    if (caches == NULL || tokens == NULL || n == 0) {
        td_error("forward: decode of %zu requests without caches or tokens", n);
        return TD_ERR_INVALID;
    }
    td_forward_seq_t *s = calloc(n, sizeof(*s));
    if (s == NULL) {
        td_error("forward: decode of %zu requests: out of memory", n);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        s[i].cache = caches[i];
        s[i].tokens = &tokens[i];
        s[i].n = 1;
        s[i].logits = logits ? logits + i * (size_t)m->cfg->vocab_size : NULL;
        s[i].all_logits = 0;
    }
    st = td_forward(m, s, n, NULL, NULL);
    free(s);
    return st;
}
