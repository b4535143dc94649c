/* decoded/drank.c — one decode rank: pools registered with UCX (the engine's
 * KV cache: requests decode in the blocks the prefill wrote into), admission
 * by block reservation, the request state machines, adoption when the
 * prefill's terminal note arrives, the continuous batch stepped on the rank's
 * compute thread while the loop thread keeps serving I/O, and the block-reuse
 * invariant (docs/decoded.md): blocks are freed only once no peer may write
 * and no job uses them. */
#include "drank.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <event2/event.h>

#include "clock.h"
#include "dreq.h"
#include "jobq.h"
#include "kvsum.h"
#include "log.h"
#include "rng.h"
#include "wire.h"

/* A finished request's state kept for a next turn (cfg.retain): its blocks
 * and fixed slot, and the token sequence they hold; in a list, oldest
 * first (the first to go when an admission needs room). */
typedef struct drank_kept_s {
    struct drank_kept_s *prev, *next;
    void *router;                    /* the router whose request it was */
    uint64_t id;                     /* that request's id */
    int32_t *tokens;                 /* [ntokens]: prompt + generated but the last */
    uint64_t ntokens;
    td_kvpool_res_t *res;
} drank_kept_t;

struct td_drank_s {
    struct event_base *base;
    td_engine_t *engine;
    const td_layout_t *layout;
    td_drank_config_t cfg;
    char *node_id;
    td_drank_io_t io;
    td_xfer_t *xfer;
    td_kvpool_t *kp;
    td_xfer_pool_t **pools;          /* [nsegs], pool id = segment index */
    uint8_t **pool_base;             /* [nsegs] */
    ProtobufCBinaryData *exports;    /* [nsegs] */
    ProtobufCBinaryData address;
    td_dreq_t **slots;               /* [nslots]: live requests by slot */
    uint32_t nslots;                 /* the pool's fixed slots: max_batch + retain */
    drank_kept_t *kept_head, *kept_tail;   /* kept states, oldest first */
    uint32_t nkept;
    td_engine_row_t *rows;           /* [max_batch] */
    td_dreq_t **row_req;             /* [max_batch] */
    size_t nrows;                    /* rows of the step on the compute thread */
    td_status_t step_st;             /* what that step returned */
    td_jobq_t *jq;                   /* the compute thread */
    td_rng_t xfer_ids;               /* transfer ids: seeded from getrandom at create */
    struct event *step_ev;
    struct event *fence_ev;       /* Fences again, while requests are quarantined */
    uint32_t nquar;               /* quarantined requests, their KV tokens and blocks */
    uint64_t quar_tokens, quar_blocks;
    bool step_scheduled;          /* step_ev is active or pending */
    bool stepping;                /* a step is on the compute thread */
    bool closing;                 /* destroying: jobs' ends only clean up */
    FILE *trace;                  /* cfg.trace_path, or NULL */
    bool draining;
    bool stopping;
    bool idle_told;               /* io.idle ran (after td_drank_stop) */
    td_drank_stats_t stats;
    td_log_limit_t peer_log;         /* lines a prefill's notes make us write */
    td_log_limit_t fail_log;         /* requests' failures (peers can cause them) */
    Tandem__Load last_load;
    bool load_sent;
};

static void drank_release(td_drank_t *r, td_dreq_t *req);
static void drank_check_idle(td_drank_t *r);
static void drank_end_siblings(td_drank_t *r, const void *router, uint64_t id,
                               td_dreq_state_t to, Tandem__Finish finish, const char *why);
static void drank_step_schedule(td_drank_t *r);
static void drank_grace_start(td_drank_t *r, td_dreq_t *req);
static void drank_fence_schedule(td_drank_t *r, bool now);
static void drank_quarantine_lift(td_drank_t *r, td_dreq_t *req);
static void drank_resume_waiting(td_drank_t *r);

/* ---- Small helpers -------------------------------------------------------- */

/* A trace line (cfg.trace_path) about req's blocks: what ("admit",
 * "quarantine", "release") and every block of its reservation, seg:b,b,...
 * per segment (a fixed segment's one block is its slot). */
static void
drank_trace_blocks(td_drank_t *r, const char *what, const td_dreq_t *req)
{
    if (r->trace == NULL || req->res == NULL)
        return;
    fprintf(r->trace, "%s req=%016llx xfer=%llu t=%llu blocks=", what,
            (unsigned long long)req->id, (unsigned long long)req->xfer_id,
            (unsigned long long)td_clock_ns());
    for (uint32_t s = 0; s < req->res->nsegs; s++) {
        fprintf(r->trace, "%s%u:", s ? ";" : "", s);
        for (uint64_t i = 0; i < req->res->nblocks[s]; i++)
            fprintf(r->trace, "%s%llu", i ? "," : "", (unsigned long long)req->res->blocks[s][i]);
    }
    fputc('\n', r->trace);
}

/* A request by the router that sent it and its id (ids are unique per
 * router only): its lead row (choice 0). */
static td_dreq_t *
drank_find(const td_drank_t *r, const void *router, uint64_t id)
{
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i] != NULL && r->slots[i]->id == id && r->slots[i]->router == router &&
            r->slots[i]->choice == 0)
            return r->slots[i];
    return NULL;
}

static td_dreq_t *
drank_find_xfer(const td_drank_t *r, uint64_t xfer_id)
{
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i] != NULL && r->slots[i]->xfer_id == xfer_id)
            return r->slots[i];
    return NULL;
}

/* Requests holding a batch row: every live one, ended ones waiting for
 * their blocks to be freed included (kept states and quarantined requests
 * hold none). */
static uint32_t
drank_live(const td_drank_t *r)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < r->nslots; i++)
        n += r->slots[i] != NULL && !r->slots[i]->quarantined &&
             (!r->slots[i]->paused || r->slots[i]->resume_wanted);
    return n;
}

/* Batch rows in use now: drank_live less the paused requests that wait for
 * a row to resume in. */
static uint32_t
drank_rows(const td_drank_t *r)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < r->nslots; i++)
        n += r->slots[i] != NULL && !r->slots[i]->quarantined && !r->slots[i]->paused;
    return n;
}

/* The KV bytes of req's reservation (every block of every segment). */
static uint64_t
drank_req_bytes(const td_drank_t *r, const td_dreq_t *req)
{
    uint64_t b = 0;

    for (uint32_t s = 0; req->res != NULL && s < req->res->nsegs; s++)
        b += req->res->nblocks[s] * td_kvpool_seg_block_bytes(r->kp, s);
    return b;
}

/* The KV tokens quarantined requests may hold before admission waits. */
static uint64_t
drank_quar_budget(const td_drank_t *r)
{
    return r->cfg.quarantine_max_tokens ? r->cfg.quarantine_max_tokens : r->cfg.kv_tokens / 4;
}

static bool
drank_quar_over(const td_drank_t *r)
{
    return r->nquar > 0 && r->quar_tokens >= drank_quar_budget(r);
}

/* A fresh transfer id: random (a stale or forged note cannot guess it),
 * never 0, unique among the rank's live requests. The stream is splitmix64
 * from a getrandom seed: distinct values for 2^64 draws. */
static uint64_t
drank_xfer_id(td_drank_t *r)
{
    uint64_t id;
    do
        id = td_rng_next(&r->xfer_ids);
    while (id == 0 || drank_find_xfer(r, id) != NULL);
    return id;
}

static void
drank_publish_load(td_drank_t *r)
{
    td_kvpool_counts_t c;
    td_kvpool_counts(r->kp, &c);
    Tandem__Load load = TANDEM__LOAD__INIT;
    load.kv_tokens_used = c.tokens_used;
    /* kept states yield to admissions: their tokens count as free */
    uint64_t kept = 0;
    for (const drank_kept_t *k = r->kept_head; k != NULL; k = k->next) {
        kept += k->res->ntokens;
        load.kept_tokens += k->ntokens;
    }
    load.kept = r->nkept;
    kept += c.tokens_free;
    load.kv_tokens_free = r->draining || drank_quar_over(r) ? 0
                          : kept < c.tokens_total ? kept : c.tokens_total;
    load.quarantined = r->nquar;
    load.kv_tokens_quarantined = r->quar_tokens;
    load.kv_blocks_quarantined = r->quar_blocks;
    load.kv_blocks_used = c.blocks_used;
    load.kv_blocks_free = c.blocks_free;
    uint32_t running = 0, waiting = 0;
    for (uint32_t i = 0; i < r->nslots; i++) {
        if (r->slots[i] == NULL || r->slots[i]->quarantined)
            continue;
        if (r->slots[i]->paused) {
            load.paused++;
            load.kv_bytes_paused += drank_req_bytes(r, r->slots[i]);
            if (!r->slots[i]->resume_wanted)
                continue;
        }
        running += r->slots[i]->state == TD_DREQ_RUNNING;
        /* waiting for their KV, or ended and waiting for their blocks: rows */
        waiting += r->slots[i]->state != TD_DREQ_RUNNING;
    }
    load.running = running;
    load.queued = waiting;
    load.draining = r->draining;
    if (r->load_sent && memcmp(&load, &r->last_load, sizeof(load)) == 0)
        return;
    r->last_load = load;
    r->load_sent = true;
    if (r->io.load != NULL)
        r->io.load(&load, r->io.arg);
}

static void
drank_send(td_drank_t *r, td_dreq_t *req, const Tandem__Envelope *env)
{
    if (req->router == NULL)
        return;
    td_status_t st = r->io.send(req->router, env, r->io.arg);
    if (st != TD_OK) {
        td_warn("decode rank %u: request %016llx: send to router failed: %s", r->cfg.rank_id,
                (unsigned long long)req->id, td_status_str(st));
    }
}

/* pick: the one token's log-probabilities, when the request asks for them
 * (else NULL); retained: Tokens.retained_tokens (the last message). */
static td_status_t
drank_send_tokens_kept(td_drank_t *r, td_dreq_t *req, const int32_t *tokens, size_t n,
                       Tandem__Finish finish, const char *error, const td_sample_pick_t *pick,
                       uint64_t retained)
{
    if (req->router == NULL)
        return TD_OK;
    Tandem__Tokens t = TANDEM__TOKENS__INIT;
    td_wire_logprob_t lp;
    Tandem__TokenLogprob *plp = &lp.msg;
    t.req_id = req->id;
    t.n_tokens = n;
    t.tokens = (int32_t *)tokens;
    t.finish = finish;
    t.error = (char *)(error ? error : "");
    t.retained_tokens = retained;
    t.choice = req->choice;
    if (pick != NULL && n == 1) {
        td_wire_logprob_pack(pick, &lp);
        t.n_logprobs = 1;
        t.logprobs = &plp;
    }
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_TOKENS;
    env.tokens = &t;
    return r->io.send(req->router, &env, r->io.arg);
}

static td_status_t
drank_send_tokens(td_drank_t *r, td_dreq_t *req, const int32_t *tokens, size_t n,
                  Tandem__Finish finish, const char *error, const td_sample_pick_t *pick)
{
    return drank_send_tokens_kept(r, req, tokens, n, finish, error, pick, 0);
}

/* ---- Kept states (cfg.retain; docs/kvcache.md, "Multi-turn") ---------------- */

static drank_kept_t *
drank_kept_find(const td_drank_t *r, const void *router, uint64_t id)
{
    for (drank_kept_t *k = r->kept_head; k != NULL; k = k->next)
        if (k->id == id && k->router == router)
            return k;
    return NULL;
}

/* Unlink k, free its blocks (those a continued request shares stay with
 * it) and k. */
static void
drank_kept_free(td_drank_t *r, drank_kept_t *k)
{
    if (k->prev != NULL)
        k->prev->next = k->next;
    else
        r->kept_head = k->next;
    if (k->next != NULL)
        k->next->prev = k->prev;
    else
        r->kept_tail = k->prev;
    r->nkept--;
    td_kvpool_release(r->kp, k->res);
    free(k->tokens);
    free(k);
}

/* Drop a kept state the router may still count on: Forget tells it (unless
 * its router is gone). */
static void
drank_kept_drop(td_drank_t *r, drank_kept_t *k, const char *why)
{
    uint64_t id = k->id;
    void *router = k->router;

    td_debug("decode rank %u: kept state of %016llx (%llu tokens) dropped: %s", r->cfg.rank_id,
             (unsigned long long)id, (unsigned long long)k->ntokens, why);
    drank_kept_free(r, k);
    r->stats.kept_dropped++;
    if (router != NULL) {
        Tandem__Forget fg = TANDEM__FORGET__INIT;
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        fg.n_req_ids = 1;
        fg.req_ids = &id;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FORGET;
        env.forget = &fg;
        if (r->io.send(router, &env, r->io.arg) != TD_OK)
            td_warn("decode rank %u: forget %016llx not sent", r->cfg.rank_id,
                    (unsigned long long)id);
    }
}

/* Drop every kept state (router NULL) or that router's; gone: the router
 * is gone, nobody to tell. */
static void
drank_kept_drop_all(td_drank_t *r, void *router, bool gone, const char *why)
{
    drank_kept_t *k = r->kept_head, *next;

    for (; k != NULL; k = next) {
        next = k->next;
        if (router != NULL && k->router != router)
            continue;
        if (gone)
            k->router = NULL;
        drank_kept_drop(r, k, why);
    }
}

/* Reserve blocks for a request as td_kvpool_reserve_prefix does, dropping
 * kept states, oldest first (never spare), while the pool lacks room. */
static td_status_t
drank_reserve(td_drank_t *r, uint64_t owner, uint64_t ntokens, const uint64_t *nprefix,
              const uint64_t *const *prefix, const drank_kept_t *spare,
              td_kvpool_res_t **out, const char **why)
{
    for (;;) {
        td_status_t st = td_kvpool_reserve_prefix(r->kp, owner, ntokens, nprefix, prefix, out,
                                                  why);
        drank_kept_t *k = r->kept_head;

        if (k == spare && k != NULL)
            k = k->next;
        if (st != TD_ERR_BUSY || k == NULL)
            return st;
        drank_kept_drop(r, k, "room for a new request");
    }
}

/* Whether a request finishing now keeps its state: the rank keeps states,
 * takes work, the router is there, no peer writes any more, and the engine
 * request holds exactly the prompt and every generated token but the last. */
static bool
drank_keep_ok(const td_drank_t *r, const td_dreq_t *req)
{
    return r->cfg.retain > 0 && !r->draining && req->router != NULL && req->kv_done &&
           req->nchoices == 1 &&
           req->gen != NULL && req->ereq != NULL && req->ereq->failed == TD_OK &&
           req->generated >= 1 && req->ereq->ntokens == req->nprompt + req->generated - 1;
}

/* The finished req's blocks and slot become a kept state (the oldest one
 * goes when retain are kept already); req is destroyed. false: out of
 * memory, nothing done (the caller releases req). */
static bool
drank_keep(td_drank_t *r, td_dreq_t *req)
{
    drank_kept_t *k = calloc(1, sizeof(*k));
    uint64_t n = req->ereq->ntokens;

    if (k != NULL)
        k->tokens = malloc(n * sizeof(*k->tokens));
    if (k == NULL || k->tokens == NULL) {
        free(k);
        td_warn("decode rank %u: request %016llx: out of memory keeping its state",
                r->cfg.rank_id, (unsigned long long)req->id);
        return false;
    }
    if (r->nkept >= r->cfg.retain)
        drank_kept_drop(r, r->kept_head, "kept states full");
    memcpy(k->tokens, req->prompt, req->nprompt * sizeof(*k->tokens));
    memcpy(k->tokens + req->nprompt, req->gen, (n - req->nprompt) * sizeof(*k->tokens));
    k->ntokens = n;
    k->router = req->router;
    k->id = req->id;
    k->res = req->res;
    k->prev = r->kept_tail;
    if (r->kept_tail != NULL)
        r->kept_tail->next = k;
    else
        r->kept_head = k;
    r->kept_tail = k;
    r->nkept++;
    r->stats.kept++;
    td_dreq_set_state(req, TD_DREQ_RELEASED, "state kept");
    r->slots[req->res->slot] = NULL;
    req->res = NULL;
    td_dreq_destroy(req);
    drank_publish_load(r);
    return true;
}

/* The request leaves the batch (or never joins it): FINISHED, CANCELED or
 * FAILED, with the final Tokens when the router should hear of it; its
 * blocks are freed at once only when no peer may still write into them
 * (then req is gone on return). Logs nothing but the transition (debug):
 * a failure is logged by drank_fail, a cancel where it is received. */
static void
drank_end(td_drank_t *r, td_dreq_t *req, td_dreq_state_t to, Tandem__Finish finish,
          const char *error, bool tell_router)
{
    /* a lead that ends before its KV is adopted takes its choices with it */
    bool siblings = req->choice == 0 && req->nchoices > 1 && req->state == TD_DREQ_ADMITTED;
    const void *router = req->router;
    uint64_t id = req->id;

    td_dreq_set_state(req, to, error);
    if (to == TD_DREQ_FINISHED)
        r->stats.finished++;
    else if (to == TD_DREQ_CANCELED)
        r->stats.canceled++;
    else
        r->stats.failed++;
    if (tell_router)
        (void)drank_send_tokens(r, req, NULL, 0, finish, error, NULL);
    if (req->kv_done)
        drank_release(r, req);
    else
        drank_publish_load(r);
    if (siblings)
        drank_end_siblings(r, router, id, to, finish, error);
    drank_check_idle(r);
}

/* The one way a request fails: the reason is logged once, at `level`, and
 * is the error of its final Tokens (when tell_router). req may be gone on
 * return (drank_end). */
static void __attribute__((format(printf, 5, 6)))
drank_fail(td_drank_t *r, td_dreq_t *req, td_log_level_t level, bool tell_router,
           const char *fmt, ...)
{
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    td_log_peer(&r->fail_log, level, "decode rank %u: request %016llx: "
                   "failed: %s", r->cfg.rank_id, (unsigned long long)req->id, why);
    drank_end(r, req, TD_DREQ_FAILED, TANDEM__FINISH__FINISH_ERROR, why, tell_router);
}

/* One generated token to the router (with its log-probabilities in pick
 * when the request asks for them); the request ends when the sampler says
 * so (FINISHED) or the token could not be sent (FAILED). Returns whether it
 * is still RUNNING (if not, req may be gone). */
static bool
drank_emit(td_drank_t *r, td_dreq_t *req, int32_t token, td_sample_finish_t fin,
           const td_sample_pick_t *pick)
{
    Tandem__Finish f = fin == TD_SAMPLE_FINISH_STOP     ? TANDEM__FINISH__FINISH_STOP
                       : fin == TD_SAMPLE_FINISH_LENGTH ? TANDEM__FINISH__FINISH_LENGTH
                                                        : TANDEM__FINISH__FINISH_NONE;
    req->last = token;
    /* the tokens a kept state holds (once a push failed: none, not kept) */
    if (r->cfg.retain > 0 && (req->gen != NULL || req->generated == 0) &&
        td_dreq_gen_push(req, token) != TD_OK) {
        free(req->gen);
        req->gen = NULL;
        req->gencap = 0;
    }
    req->generated++;
    if (f != TANDEM__FINISH__FINISH_NONE)
        req->keep = drank_keep_ok(r, req);
    td_status_t st = drank_send_tokens_kept(r, req, &token, 1, f, NULL,
                                            req->ereq->sampling.logprobs ? pick : NULL,
                                            req->keep ? req->ereq->ntokens : 0);
    if (st != TD_OK) {
        drank_fail(r, req, TD_LOG_WARN, false, "tokens not sent: %s", td_status_str(st));
        return false;
    }
    if (f != TANDEM__FINISH__FINISH_NONE) {
        drank_end(r, req, TD_DREQ_FINISHED, f, td_sample_finish_str(fin), false);
        return false;
    }
    return true;
}

/* The invariant's only door: blocks are freed here, after P's terminal
 * note (kv_done) — or P known gone and the grace period passed — and once no
 * job on the compute thread uses them (a busy request is released when its
 * job comes back). */
static void
drank_release(td_drank_t *r, td_dreq_t *req)
{
    assert(req->kv_done && td_dreq_ended(req));
    if (req->busy)
        return;
    if (req->keep && req->state == TD_DREQ_FINISHED && drank_keep(r, req))
        return;   /* no Released: its blocks are the kept state's */
    if (req->quarantined)
        drank_quarantine_lift(r, req);
    drank_trace_blocks(r, "release", req);
    td_dreq_set_state(req, TD_DREQ_RELEASED, NULL);
    uint32_t slot = req->res->slot;
    assert(r->slots[slot] == req);
    Tandem__Released rel = TANDEM__RELEASED__INIT;
    rel.req_id = req->id;
    rel.tokens = req->res->ntokens;
    td_kvpool_release(r->kp, req->res);
    req->res = NULL;
    r->slots[slot] = NULL;
    r->stats.released++;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_RELEASED;
    env.released = &rel;
    if (req->choice == 0)   /* one Released per request: its lead's */
        drank_send(r, req, &env);
    td_dreq_destroy(req);
    drank_resume_waiting(r);   /* a row is free */
    drank_publish_load(r);
}

/* ---- Admission ------------------------------------------------------------ */

static void
drank_reject(td_drank_t *r, void *router, uint64_t id, Tandem__AdmitRejectCode code,
             const char *reason)
{
    r->stats.rejected++;
    td_log_peer_every(TD_LOG_INFO, "decode rank %u: admit %016llx rejected: %s",
                 r->cfg.rank_id, (unsigned long long)id, reason);
    Tandem__AdmitReject rej = TANDEM__ADMIT_REJECT__INIT;
    rej.req_id = id;
    rej.code = code;
    rej.reason = (char *)reason;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT;
    env.admit_reject = &rej;
    td_status_t st = r->io.send(router, &env, r->io.arg);
    if (st != TD_OK)
        td_log_peer_every(TD_LOG_WARN, "decode rank %u: admit %016llx: reject not "
                     "sent: %s", r->cfg.rank_id, (unsigned long long)id, td_status_str(st));
}

/* Sampling from the wire, checked (a peer's bytes: a reason, never an abort):
 * worker/wire.h's conversion, as prefilld reads it, and a positive
 * max_tokens (the reservation's size). */
static const char *
drank_sampling(const td_drank_t *r, const Tandem__Sampling *in, td_sample_params_t *out,
               char *why, size_t whylen)
{
    if (in == NULL)
        return "no sampling parameters";
    if (td_wire_sampling(in, r->engine, out, why, whylen) != TD_OK)
        return why;
    if (out->max_tokens == 0)
        return "max_tokens must be positive";
    return NULL;
}

/* The grace period of a request whose prefill rank named prefill_deadline_ms
 * (0: unknown): TD_DRANK_GRACE_DEADLINES × D, D the larger of it and ours,
 * the last D replaced by the margin when one is configured (drank.h). */
static uint32_t
drank_grace_ms(const td_drank_t *r, uint32_t prefill_deadline_ms)
{
    uint64_t d = r->cfg.xfer_deadline_ms > prefill_deadline_ms ? r->cfg.xfer_deadline_ms
                                                               : prefill_deadline_ms;
    uint64_t g = (TD_DRANK_GRACE_DEADLINES - 1) * d +
                 (r->cfg.grace_margin_ms ? r->cfg.grace_margin_ms : d);
    return g > UINT32_MAX ? UINT32_MAX : (uint32_t)g;
}

/* The prefill deadline a names (a router's value: at most the configured
 * cap, or a huge one would pin the blocks for weeks). */
static uint32_t
drank_deadline_clamp(td_drank_t *r, const Tandem__Admit *a)
{
    uint32_t max = r->cfg.prefill_deadline_max_ms ? r->cfg.prefill_deadline_max_ms
                                                  : TD_DRANK_PREFILL_DEADLINE_MAX_MS;

    if (a->prefill_deadline_ms <= max)
        return a->prefill_deadline_ms;
    r->stats.deadlines_clamped++;
    td_log_peer_every(TD_LOG_WARN, "decode rank %u: admit %016llx: prefill deadline %u ms "
                 "clamped to %u ms (prefill-deadline-max)", r->cfg.rank_id,
                 (unsigned long long)a->req_id, a->prefill_deadline_ms, max);
    return max;
}

/* A live request of a's prompt in reservation res (the caller's until this
 * succeeds): its engine request computes in res's blocks — they are its
 * cache, and what a prefill writes lands there — it takes res's slot and
 * counts as admitted. On failure nothing is made: *code and *why are the
 * reject. */
static td_status_t
drank_req_new(td_drank_t *r, void *router, const Tandem__Admit *a,
              const td_sample_params_t *sp, td_kvpool_res_t *res, td_dreq_t **out,
              Tandem__AdmitRejectCode *code, const char **why)
{
    td_engine_req_t *ereq = NULL;
    td_dreq_t *req = NULL;
    td_xfer_token_t token;

    if (td_xfer_token_draw(&token) != TD_OK) {   /* logged */
        *code = TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY;
        *why = "no random bytes for a transfer token";
        return TD_ERR_IO;
    }
    if (td_engine_req_create(r->engine, sp, &res->kv, &ereq) != TD_OK) {
        *code = TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID;
        *why = "bad sampling parameters";
        return TD_ERR_INVALID;
    }
    if (td_dreq_create(a->req_id, a->tokens, a->n_tokens, &req) != TD_OK) {
        td_engine_req_destroy(ereq);
        *code = TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY;
        *why = "out of memory";
        return TD_ERR_NOMEM;
    }
    req->ereq = ereq;
    req->rank = r;
    ereq->user = req;
    if (a->sampling != NULL && a->sampling->constraint != NULL &&
        a->sampling->constraint->kind != 0) {   /* compiled on the compute thread */
        req->cons_in = *a->sampling->constraint;
        req->cons_in.spec = strdup(req->cons_in.spec ? req->cons_in.spec : "");
        if (req->cons_in.spec == NULL) {
            td_dreq_destroy(req);
            *code = TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY;
            *why = "out of memory";
            return TD_ERR_NOMEM;
        }
    }
    req->res = res;
    req->router = router;
    req->xfer_id = drank_xfer_id(r);
    req->token = token;
    r->slots[res->slot] = req;
    r->stats.admitted++;
    *out = req;
    return TD_OK;
}

/* AdmitOk of request id to router, with dest (NULL: none, a continued
 * request that no prefill rank writes). */
static td_status_t
drank_admit_ok(td_drank_t *r, void *router, uint64_t id, Tandem__KvDest *dest)
{
    Tandem__AdmitOk ok = TANDEM__ADMIT_OK__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    ok.req_id = id;
    ok.dest = dest;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK;
    env.admit_ok = &ok;
    return r->io.send(router, &env, r->io.arg);
}

/* AdmitOk{KvDest} of an admitted lead: per segment its pool (id = segment
 * index) and blocks. When it cannot be sent the request ends (no peer knows
 * its blocks) and the status says so. */
static td_status_t
drank_admit_dest(td_drank_t *r, void *router, const Tandem__Admit *a, td_dreq_t *req)
{
    const td_kvpool_res_t *res = req->res;
    uint32_t nsegs = r->layout->nsegs;
    Tandem__SegDest *segs = calloc(nsegs, sizeof(*segs));
    Tandem__SegDest **segp = calloc(nsegs, sizeof(*segp));
    Tandem__KvDest dest = TANDEM__KV_DEST__INIT;
    td_status_t st;

    if (segs == NULL || segp == NULL) {
        free(segs);
        free(segp);
        req->kv_done = true;   /* nothing was announced: no peer can write */
        drank_end(r, req, TD_DREQ_FAILED, TANDEM__FINISH__FINISH_ERROR, "out of memory",
                  false);
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY,
                     "out of memory");
        return TD_ERR_NOMEM;
    }
    for (uint32_t s = 0; s < nsegs; s++) {
        tandem__seg_dest__init(&segs[s]);
        segs[s].seg = s;
        segs[s].pool_id = s;
        segs[s].n_blocks = res->nblocks[s];
        segs[s].blocks = res->blocks[s];
        segp[s] = &segs[s];
    }
    dest.node_id = r->node_id;
    dest.rank_id = r->cfg.rank_id;
    dest.incarnation = td_xfer_incarnation(r->xfer);
    dest.xfer_id = req->xfer_id;
    dest.xfer_token.data = req->token.b;
    dest.xfer_token.len = TD_XFER_TOKEN_LEN;
    dest.n_segs = nsegs;
    dest.segs = segp;
    st = drank_admit_ok(r, router, a->req_id, &dest);
    free(segs);
    free(segp);
    if (st != TD_OK) {
        /* The router never learnt the destination: no peer can write. */
        req->kv_done = true;
        drank_fail(r, req, TD_LOG_WARN, false, "admit ok not sent: %s", td_status_str(st));
        return st;
    }
    drank_trace_blocks(r, "admit", req);
    return st;
}

static void drank_admit_continue(td_drank_t *r, void *router, const Tandem__Admit *a,
                                 const td_sample_params_t *sp, uint64_t ntokens);
static td_status_t drank_admit_choices(td_drank_t *r, void *router, const Tandem__Admit *a,
                                       const td_sample_params_t *sp, td_dreq_t *lead,
                                       uint64_t ntokens, const char **why);

static void
drank_admit(td_drank_t *r, void *router, const Tandem__Admit *a)
{
    td_sample_params_t sp;
    char reason[160];
    const char *bad = NULL;
    if (a->n_tokens == 0)
        bad = "empty prompt";
    else if (drank_find(r, router, a->req_id) != NULL)
        bad = "request id already known";
    else if (a->continue_from == 0 && a->prefill_incarnation == 0)
        bad = "no prefill incarnation";
    else
        bad = drank_sampling(r, a->sampling, &sp, reason, sizeof(reason));
    for (size_t i = 0; bad == NULL && i < a->n_tokens; i++)
        if (a->tokens[i] < 0 || (uint64_t)a->tokens[i] >= r->engine->vocab)
            bad = "prompt token outside the vocabulary";
    if (bad != NULL) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID, bad);
        return;
    }
    if (r->draining) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_DRAINING,
                    "decode rank is draining");
        return;
    }
    uint64_t ntokens = (uint64_t)a->n_tokens + sp.max_tokens;
    if (ntokens > r->engine->max_context) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_TOO_LONG,
                    "prompt + max_tokens over the model's max context");
        return;
    }
    uint32_t nchoices = td_wire_choices(a->sampling);
    if (nchoices > r->cfg.max_batch || nchoices > TD_WIRE_MAX_CHOICES ||
        (nchoices > 1 && a->continue_from != 0)) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID,
                     nchoices > 1 && a->continue_from != 0
                         ? "n choices do not continue a kept state"
                         : "more choices than the rank has batch rows");
        return;
    }
    if (drank_live(r) + nchoices > r->cfg.max_batch) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY,
                     "no batch row free");
        return;
    }
    if (drank_quar_over(r)) {   /* waits for fences rather than reuse a block */
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY,
                     "quarantined kv over its budget: waiting for fences");
        return;
    }
    if (a->continue_from != 0) {
        drank_admit_continue(r, router, a, &sp, ntokens);
        return;
    }
    td_dreq_t *req = NULL;
    td_kvpool_res_t *res = NULL;
    const char *why = NULL;
    if (drank_reserve(r, a->req_id, ntokens, NULL, NULL, NULL, &res, &why) != TD_OK) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY,
                     why);
        return;
    }
    Tandem__AdmitRejectCode code;
    if (drank_req_new(r, router, a, &sp, res, &req, &code, &why) != TD_OK) {
        td_kvpool_release(r->kp, res);
        drank_reject(r, router, a->req_id, code, why);
        return;
    }
    req->prefill_inc = a->prefill_incarnation;
    req->grace_ms = drank_grace_ms(r, drank_deadline_clamp(r, a));
    snprintf(req->prefill_node, sizeof(req->prefill_node), "%.64s",
             a->prefill_node ? a->prefill_node : "");
    req->prefill_rank = a->prefill_rank;
    snprintf(req->prefill, sizeof(req->prefill), "%.64s/%u#%016" PRIx64,
             a->prefill_node ? a->prefill_node : "?", a->prefill_rank,
             a->prefill_incarnation);
    req->nchoices = nchoices;
    if (nchoices > 1 && drank_admit_choices(r, router, a, &sp, req, ntokens, &why) != TD_OK) {
        req->kv_done = true;   /* nothing was announced: no peer can write */
        drank_end(r, req, TD_DREQ_FAILED, TANDEM__FINISH__FINISH_ERROR, why, false);
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY,
                     why);
        return;
    }

    if (drank_admit_dest(r, router, a, req) == TD_OK)
        td_info("decode rank %u: request %016llx admitted: %zu prompt + %u tokens, slot %u, "
                "prefill %s, xfer %llu, %u choices", r->cfg.rank_id,
                (unsigned long long)req->id, req->nprompt, sp.max_tokens, res->slot,
                req->prefill, (unsigned long long)req->xfer_id, nchoices);
    drank_publish_load(r);
}

/* ---- n choices (docs/decoded.md, "n choices") --------------------------------------
 * A request of n choices is n rows: its lead (choice 0), whose reservation
 * the prefill writes into, and n - 1 siblings admitted with it, each with
 * its own reservation that shares the lead's whole prompt blocks (by
 * reference: td_kvpool_reserve_prefix) and its own fixed slot. The sibling
 * copies the lead's partly filled last block and fixed slot when the KV has
 * arrived (copy-on-write at the first block they do not share), adopts the
 * prompt, and takes its first token from the prefill rank's note (drawn
 * with seed + i). No peer writes a sibling's own blocks, so a sibling may
 * be freed at any time; the shared ones stay while any row holds them. */

/* Row c of the request id of router (NULL: none). */
static td_dreq_t *
drank_choice(const td_drank_t *r, const void *router, uint64_t id, uint32_t c)
{
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i] != NULL && r->slots[i]->id == id && r->slots[i]->router == router &&
            r->slots[i]->choice == c)
            return r->slots[i];
    return NULL;
}

/* End every live sibling of the request the same way, telling nobody (the
 * lead's end tells the router). */
static void
drank_end_siblings(td_drank_t *r, const void *router, uint64_t id, td_dreq_state_t to,
                   Tandem__Finish finish, const char *why)
{
    for (uint32_t i = 0; i < r->nslots; i++) {
        td_dreq_t *sib = r->slots[i];
        if (sib != NULL && sib->id == id && sib->router == router && sib->choice > 0 &&
            !td_dreq_ended(sib))
            drank_end(r, sib, to, finish, why, false);
    }
}

/* Paged blocks of a prompt of n tokens that are whole: what the choices
 * share (per segment; fixed segments 0). */
static void
drank_prompt_blocks(const td_drank_t *r, uint64_t n, uint64_t *nprefix)
{
    for (uint32_t s = 0; s < r->layout->nsegs; s++)
        nprefix[s] = r->layout->segs[s].kind == TD_LAYOUT_PAGED
                         ? td_layout_entries(&r->layout->segs[s], n) / r->layout->block_entries
                         : 0;
}

/* The siblings of an admitted lead (choices 1 .. n - 1): reservations that
 * share its whole prompt blocks, rows with seed + i. On failure the ones
 * made are ended and *why says what was short. */
static td_status_t
drank_admit_choices(td_drank_t *r, void *router, const Tandem__Admit *a,
                    const td_sample_params_t *sp, td_dreq_t *lead, uint64_t ntokens,
                    const char **why)
{
    uint64_t *nprefix = calloc(r->layout->nsegs, sizeof(*nprefix));
    td_status_t st = TD_OK;

    if (nprefix == NULL) {
        *why = "out of memory";
        return TD_ERR_NOMEM;
    }
    drank_prompt_blocks(r, a->n_tokens, nprefix);
    for (uint32_t c = 1; st == TD_OK && c < lead->nchoices; c++) {
        td_sample_params_t sc = *sp;
        td_kvpool_res_t *res = NULL;
        td_dreq_t *sib = NULL;
        Tandem__AdmitRejectCode code;

        sc.seed = sp->seed + c;
        st = drank_reserve(r, a->req_id, ntokens, nprefix,
                           (const uint64_t *const *)lead->res->blocks, NULL, &res, why);
        if (st == TD_OK && (st = drank_req_new(r, router, a, &sc, res, &sib, &code, why)) != TD_OK)
            td_kvpool_release(r->kp, res);
        if (st != TD_OK)
            break;
        sib->choice = c;
        sib->nchoices = lead->nchoices;
        sib->kv_done = true;   /* no peer ever writes its own blocks */
        sib->prefill_inc = lead->prefill_inc;
        snprintf(sib->prefill, sizeof(sib->prefill), "%s", lead->prefill);
    }
    free(nprefix);
    if (st != TD_OK)
        drank_end_siblings(r, router, a->req_id, TD_DREQ_FAILED, TANDEM__FINISH__FINISH_ERROR,
                           "admission of its choices failed");
    return st;
}

/* ---- KV arrival ------------------------------------------------------------- */

/* Bytes of a request's KV for its prompt: every segment's entries. */
static uint64_t
drank_prompt_bytes(const td_drank_t *r, const td_dreq_t *req)
{
    uint64_t b = 0;

    for (uint32_t s = 0; s < r->layout->nsegs; s++)
        b += td_layout_seg_bytes(&r->layout->segs[s], req->nprompt);
    return b;
}

/* The adopt job: what it did on the compute thread. */
typedef struct {
    td_dreq_t *req;
    uint64_t t_note, t_start, t_end;   /* ns: note in, adoption began, ended */
    int32_t note_first;          /* P's first token */
    uint64_t want_sum, got_sum;  /* the checksum P sent, and ours over the blocks */
    td_sample_pick_t note_pick;  /* P's first token with its log-probabilities */
    bool have_note_pick;         /* P sent them */
    td_sample_pick_t pick;       /* the first token: ours, or P's taken */
    int32_t first;               /* pick.token */
    td_sample_finish_t fin;
    td_status_t st;
    const char *what;            /* the step that failed */
    uint32_t nsibs;              /* the lead's siblings (n choices), adopted after it */
    uint64_t *nprefix;           /* [nsegs] the whole prompt blocks they share */
    struct drank_adopt_sib {
        td_dreq_t *req;
        int32_t note_first;      /* P's first token of this choice */
        td_sample_pick_t note_pick;
        td_sample_pick_t pick;   /* ours, or P's taken */
        td_sample_finish_t fin;
    } sibs[];
} drank_adopt_t;

static bool drank_note_sender_ok(td_drank_t *r, const td_dreq_t *req,
                                 const td_xfer_note_t *note);

static void
drank_adopt_free(drank_adopt_t *j)
{
    if (j != NULL)
        free(j->nprefix);
    free(j);
}

static void drank_kept_copy(td_drank_t *r, const td_kvpool_res_t *from,
                            const td_kvpool_res_t *to, uint64_t n, const uint64_t *nprefix);

/* Compute thread, after the lead's adoption: each sibling copies what it
 * does not share of the lead's prompt state (the partly filled last block,
 * the fixed slot), adopts the prompt, and takes its first token as the lead
 * did (re-drawn and compared where the engine can, else P's). */
/* Compute thread: req's constraint compiled (or found compiled) and hooked
 * into its engine request, once, before its first token; *what says why
 * when it is refused. */
static td_status_t
drank_cons_attach(td_dreq_t *req, const char **what)
{
    td_status_t st;

    if (req->cons_in.kind == 0 || req->cons != NULL)
        return TD_OK;
    st = td_wcons_create(&req->cons_in, &req->cons, req->cons_why, sizeof(req->cons_why));
    if (st != TD_OK) {
        *what = req->cons_why;
        return st;
    }
    req->ereq->cons = td_wcons_hook(req->cons);
    return TD_OK;
}

static void
drank_adopt_siblings(drank_adopt_t *j)
{
    td_dreq_t *lead = j->req;
    td_drank_t *r = lead->rank;

    for (uint32_t i = 0; j->st == TD_OK && i < j->nsibs; i++) {
        struct drank_adopt_sib *sb = &j->sibs[i];
        td_engine_req_t *e;

        if (sb->req == NULL)
            continue;
        e = sb->req->ereq;
        drank_kept_copy(r, lead->res, sb->req->res, lead->nprompt, j->nprefix);
        j->what = "a choice's copy of the received kv";
        j->st = td_engine_adopt(e, lead->prompt, lead->nprompt);
        if (j->st != TD_OK)
            break;
        j->what = "a choice's first token";
        j->st = drank_cons_attach(sb->req, &j->what);
        if (j->st == TD_OK)
            j->st = td_engine_sample_pick(e, &sb->pick, &sb->fin);
        if (j->st == TD_OK && sb->pick.token != sb->note_first)
            j->st = TD_ERR_MISMATCH;
        if (j->st == TD_ERR_STATE && e->failed == TD_OK) {
            sb->pick = sb->note_pick;
            j->st = td_engine_take(e, sb->note_first, &sb->fin);
        }
    }
}

/* Compute thread: adopt the prompt whose KV is in the request's blocks (the
 * engine checks what it can: the synthetic engine every byte), then the
 * first token. An engine with a distribution right after adopt (synthetic)
 * must agree with P's first token; one without (TD_ERR_STATE: a real model,
 * whose logits come from the pass P ran) takes P's token. */
static void
drank_adopt_run(void *arg)
{
    drank_adopt_t *j = arg;
    td_engine_req_t *ereq = j->req->ereq;
    uint64_t got = 0;

    j->t_start = td_clock_ns();
    /* the checksum first: the bytes in the blocks must be the bytes P sent */
    j->st = td_kvsum_of(&j->req->res->kv, j->req->nprompt, &got);
    j->got_sum = got;
    j->t_end = td_clock_ns();
    if (j->st != TD_OK) {
        j->what = "no checksum of the received kv";
        return;
    }
    if (got != j->want_sum) {
        j->st = TD_ERR_MISMATCH;
        j->what = "received kv checksum mismatch";
        return;
    }
    j->st = td_engine_adopt(ereq, j->req->prompt, j->req->nprompt);
    j->t_end = td_clock_ns();
    if (j->st != TD_OK) {
        j->what = j->st == TD_ERR_MISMATCH ? "received kv does not verify"
                                           : "received kv refused by the engine";
        return;
    }
    j->what = "first token";
    j->st = drank_cons_attach(j->req, &j->what);
    if (j->st == TD_OK)
        j->st = td_engine_sample_pick(ereq, &j->pick, &j->fin);
    if (j->st == TD_ERR_STATE && ereq->failed == TD_OK) {
        /* P's token, and its log-probabilities as P computed them */
        j->pick = j->note_pick;
        j->st = td_engine_take(ereq, j->note_first, &j->fin);
        if (j->st == TD_OK && ereq->sampling.logprobs && !j->have_note_pick) {
            j->st = TD_ERR_PROTO;
            j->what = "first token's log-probability from the prefill rank: missing";
        }
    }
    j->first = j->pick.token;
    if (j->st == TD_OK && j->nsibs > 0)
        drank_adopt_siblings(j);
}

/* Loop thread: the siblings of an adopt job that came back. lead_ok: each
 * still live runs from its first token; else the lead ended (and ended them
 * with it), and those ended while the job ran are released now. */
static void
drank_adopt_siblings_done(td_drank_t *r, drank_adopt_t *j, bool lead_ok)
{
    for (uint32_t i = 0; i < j->nsibs; i++) {
        td_dreq_t *sib = j->sibs[i].req;

        if (sib == NULL)
            continue;
        if (td_dreq_ended(sib)) {
            drank_release(r, sib);   /* kv_done: no peer writes its own blocks */
        } else if (lead_ok) {
            td_dreq_set_state(sib, TD_DREQ_RUNNING, "kv adopted (a choice)");
            (void)drank_emit(r, sib, j->sibs[i].pick.token, j->sibs[i].fin, &j->sibs[i].pick);
        }
    }
}

/* Loop thread: the adopt job came back. */
static void
drank_adopt_done(void *arg)
{
    drank_adopt_t *j = arg;
    td_dreq_t *req = j->req;
    td_drank_t *r = req->rank;

    req->busy = false;
    for (uint32_t i = 0; i < j->nsibs; i++)
        if (j->sibs[i].req != NULL)
            j->sibs[i].req->busy = false;
    if (r->closing)
        goto out;
    if (r->trace != NULL)   /* status: the td_status_t code, 0 ok */
        fprintf(r->trace, "adopt req=%016llx tokens=%zu note=%llu start=%llu end=%llu status=%d\n",
                (unsigned long long)req->id, req->nprompt, (unsigned long long)j->t_note,
                (unsigned long long)j->t_start, (unsigned long long)j->t_end, (int)j->st);
    if (td_dreq_ended(req)) {          /* canceled meanwhile */
        if (req->kv_done)
            drank_release(r, req);
        drank_adopt_siblings_done(r, j, false);
        goto out;
    }
    if (j->st == TD_ERR_MISMATCH && j->got_sum != j->want_sum) {
        r->stats.kv_sum_mismatch++;
        drank_fail(r, req, TD_LOG_ERROR, true, "%s: %016llx over %zu prompt tokens, prefill %s "
                   "sent %016llx", j->what, (unsigned long long)j->got_sum, req->nprompt,
                   req->prefill, (unsigned long long)j->want_sum);
        goto out;
    }
    if (j->st != TD_OK) {
        drank_fail(r, req, TD_LOG_ERROR, true, "%s (prefill %s): %s", j->what, req->prefill,
                   td_status_str(j->st));
        goto out;
    }
    if (j->first != j->note_first) {
        drank_fail(r, req, TD_LOG_ERROR, true, "first token %d from prefill %s, expected %d",
                   j->note_first, req->prefill, j->first);
        goto out;
    }
    if (r->engine->checks_kv) {
        uint64_t verified = drank_prompt_bytes(r, req);
        r->stats.verified_bytes += verified;
        td_debug("decode rank %u: request %016llx: %llu kv bytes verified", r->cfg.rank_id,
                 (unsigned long long)req->id, (unsigned long long)verified);
    }
    td_dreq_set_state(req, TD_DREQ_RUNNING, "kv adopted");
    (void)drank_emit(r, req, j->first, j->fin, &j->pick);
    drank_adopt_siblings_done(r, j, true);
    drank_publish_load(r);
    drank_step_schedule(r);
out:
    drank_adopt_free(j);
}

/* The note's first tokens of choices 1 .. n - 1 (and their
 * log-probabilities, when the request asks) into the job, with the rows
 * they are for; a note that does not match the request: TD_ERR_PROTO. */
static td_status_t
drank_adopt_note_choices(td_drank_t *r, td_dreq_t *req, const Tandem__KvNote *kn,
                         drank_adopt_t *j, char *why, size_t whylen)
{
    bool lps = req->ereq->sampling.logprobs;

    if (kn->n_more_first_tokens != req->nchoices - 1 ||
        (lps && kn->n_more_first_logprobs != req->nchoices - 1)) {
        snprintf(why, whylen, "%zu first tokens (%zu log-probabilities) for %u choices",
                 kn->n_more_first_tokens + 1, kn->n_more_first_logprobs, req->nchoices);
        return TD_ERR_PROTO;
    }
    drank_prompt_blocks(r, req->nprompt, j->nprefix);
    j->nsibs = req->nchoices - 1;
    for (uint32_t i = 0; i < j->nsibs; i++) {
        struct drank_adopt_sib *sb = &j->sibs[i];
        int32_t tok = kn->more_first_tokens[i];

        sb->req = drank_choice(r, req->router, req->id, i + 1);
        if (sb->req != NULL && td_dreq_ended(sb->req))
            sb->req = NULL;
        sb->note_first = tok;
        sb->note_pick.token = tok;
        if (tok < 0 || (uint32_t)tok >= r->engine->vocab) {
            snprintf(why, whylen, "choice %u's first token %d outside the vocabulary", i + 1,
                     tok);
            return TD_ERR_PROTO;
        }
        if (lps && (kn->more_first_logprobs[i]->token != tok ||
                    td_wire_logprob_unpack(kn->more_first_logprobs[i], r->engine->vocab,
                                           &sb->note_pick, why, whylen) != TD_OK)) {
            if (kn->more_first_logprobs[i]->token != tok)
                snprintf(why, whylen, "choice %u's log-probability for another token", i + 1);
            return TD_ERR_PROTO;
        }
    }
    return TD_OK;
}

/* P's terminal note for an ADMITTED request: adopt on the compute thread. */
static void
drank_kv_arrived(td_drank_t *r, td_dreq_t *req, const Tandem__KvNote *kn)
{
    uint32_t nsibs = req->nchoices - 1;
    drank_adopt_t *j = calloc(1, sizeof(*j) + nsibs * sizeof(j->sibs[0]));
    char why[160];

    if (j == NULL || (nsibs > 0 && (j->nprefix = calloc(r->layout->nsegs,
                                                         sizeof(uint64_t))) == NULL)) {
        free(j);
        drank_fail(r, req, TD_LOG_ERROR, true, "out of memory adopting its kv");
        return;
    }
    j->req = req;
    j->t_note = td_clock_ns();
    j->note_first = kn->first_token;
    j->note_pick.token = kn->first_token;
    j->want_sum = kn->kv_sum;
    if (kn->first_logprob != NULL) {
        if (kn->first_logprob->token != kn->first_token ||
            td_wire_logprob_unpack(kn->first_logprob, r->engine->vocab, &j->note_pick, why,
                                   sizeof(why)) != TD_OK) {
            drank_adopt_free(j);
            drank_fail(r, req, TD_LOG_WARN, true, "first token's log-probability from "
                       "prefill %s: %s", req->prefill,
                       kn->first_logprob->token != kn->first_token ? "for another token" : why);
            return;
        }
        j->have_note_pick = true;
    }
    if (nsibs > 0 && drank_adopt_note_choices(r, req, kn, j, why, sizeof(why)) != TD_OK) {
        drank_adopt_free(j);
        drank_fail(r, req, TD_LOG_WARN, true, "kv note from prefill %s: %s", req->prefill, why);
        return;
    }
    if (td_jobq_post(r->jq, drank_adopt_run, drank_adopt_done, j) != TD_OK) {
        drank_adopt_free(j);
        drank_fail(r, req, TD_LOG_ERROR, true, "cannot hand its adoption to the compute thread");
        return;
    }
    req->busy = true;
    for (uint32_t i = 0; i < j->nsibs; i++)
        if (j->sibs[i].req != NULL)
            j->sibs[i].req->busy = true;
}

/* ---- A next turn on a kept state (conditional disaggregation) ------------------ */

/* The suffix prefill's layer callback: nothing leaves this rank. */
static td_status_t
drank_suffix_layer(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *pieces,
                   size_t npieces, void *arg)
{
    (void)req, (void)layer, (void)pieces, (void)npieces, (void)arg;
    return TD_OK;
}

/* Compute thread, one pass of a DEP group: the kept state is the request's
 * cache as it is (adopt, checked as a received one), the prompt's rest is
 * prefilled on it in one chunk, then the first token. */
static void
drank_continue_run(void *arg)
{
    drank_adopt_t *j = arg;
    td_dreq_t *req = j->req;

    j->t_start = td_clock_ns();
    j->what = "kept state refused by the engine";
    j->st = td_engine_adopt(req->ereq, req->prompt, req->cont);
    if (j->st == TD_OK) {
        j->what = "prefill of the prompt's rest";
        j->st = td_engine_prefill(req->ereq, req->prompt + req->cont, req->nprompt - req->cont,
                                  TD_ENGINE_CHUNK_LAST, drank_suffix_layer, NULL);
    }
    if (j->st == TD_OK) {
        j->what = "first token";
        j->st = drank_cons_attach(req, &j->what);
        if (j->st == TD_OK)
            j->st = td_engine_sample_pick(req->ereq, &j->pick, &j->fin);
    }
    j->first = j->note_first = j->pick.token;
    j->t_end = td_clock_ns();
}

/* Copy what the new reservation does not share of a kept state of n
 * tokens: each paged segment's partly filled block (past its nprefix[s]
 * shared ones) and every fixed slot. */
static void
drank_kept_copy(td_drank_t *r, const td_kvpool_res_t *from, const td_kvpool_res_t *to,
                uint64_t n, const uint64_t *nprefix)
{
    for (uint32_t s = 0; s < r->layout->nsegs; s++) {
        const td_layout_seg_t *sg = &r->layout->segs[s];
        uint64_t bytes = td_kvpool_seg_block_bytes(r->kp, s);

        if (sg->kind == TD_LAYOUT_FIXED) {
            memcpy(td_kvpool_block_mem(r->kp, s, to->slot),
                   td_kvpool_block_mem(r->kp, s, from->slot), bytes);
        } else if (td_layout_entries(sg, n) > nprefix[s] * r->layout->block_entries) {
            memcpy(td_kvpool_block_mem(r->kp, s, to->blocks[s][nprefix[s]]),
                   td_kvpool_block_mem(r->kp, s, from->blocks[s][nprefix[s]]), bytes);
        }
    }
}

/* Admit a's prompt as the next turn of the kept state continue_from: a
 * reservation for the whole prompt + max_tokens that shares the kept
 * state's whole blocks, the partial ones and the slot copied, the kept
 * state gone; AdmitOk without a destination (no prefill rank writes), and
 * the prompt's rest prefilled on the compute thread. A kept state that is
 * not there or that the prompt does not continue: NOT_KEPT (the router
 * admits the request anew). */
static void
drank_admit_continue(td_drank_t *r, void *router, const Tandem__Admit *a,
                     const td_sample_params_t *sp, uint64_t ntokens)
{
    drank_kept_t *k = drank_kept_find(r, router, a->continue_from);
    uint32_t nsegs = r->layout->nsegs;
    uint64_t *nprefix = NULL;
    td_kvpool_res_t *res = NULL;
    td_dreq_t *req = NULL;
    drank_adopt_t *j = NULL;
    Tandem__AdmitRejectCode code = TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY;
    const char *why = NULL;

    if (k == NULL || a->continue_tokens != k->ntokens || a->n_tokens <= k->ntokens ||
        memcmp(a->tokens, k->tokens, k->ntokens * sizeof(*k->tokens)) != 0) {
        drank_reject(r, router, a->req_id, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NOT_KEPT,
                     k == NULL ? "no kept state of that request"
                               : "the prompt does not continue the kept state");
        return;
    }
    nprefix = calloc(nsegs, sizeof(*nprefix));
    j = calloc(1, sizeof(*j));
    if (nprefix == NULL || j == NULL) {
        why = "out of memory";
        goto err;
    }
    for (uint32_t s = 0; s < nsegs; s++)
        if (r->layout->segs[s].kind == TD_LAYOUT_PAGED)
            nprefix[s] = td_layout_entries(&r->layout->segs[s], k->ntokens) /
                         r->layout->block_entries;
    if (drank_reserve(r, a->req_id, ntokens, nprefix, (const uint64_t *const *)k->res->blocks,
                      k, &res, &why) != TD_OK)
        goto err;
    drank_kept_copy(r, k->res, res, k->ntokens, nprefix);
    if (drank_req_new(r, router, a, sp, res, &req, &code, &why) != TD_OK)
        goto err;
    req->cont = k->ntokens;
    req->kv_done = true;   /* nobody else writes into its blocks */
    snprintf(req->prefill, sizeof(req->prefill), "this rank (continues %016" PRIx64 ")",
             k->id);
    r->stats.continued++;
    r->stats.continue_tokens += a->n_tokens - k->ntokens;
    td_info("decode rank %u: request %016llx admitted: continues %016llx, %llu kept + %llu "
            "prompt tokens prefilled here + %u tokens, slot %u", r->cfg.rank_id,
            (unsigned long long)req->id, (unsigned long long)k->id,
            (unsigned long long)k->ntokens, (unsigned long long)(a->n_tokens - k->ntokens),
            sp->max_tokens, res->slot);
    drank_kept_free(r, k);   /* its whole blocks live on in res */
    free(nprefix);

    td_status_t st = drank_admit_ok(r, router, a->req_id, NULL);
    if (st != TD_OK) {
        free(j);
        drank_fail(r, req, TD_LOG_WARN, false, "admit ok not sent: %s", td_status_str(st));
        return;
    }
    j->req = req;
    j->t_note = td_clock_ns();
    if (td_jobq_post_pass(r->jq, drank_continue_run, drank_adopt_done, j) != TD_OK) {
        free(j);
        drank_fail(r, req, TD_LOG_ERROR, true, "cannot hand its prefill to the compute thread");
        return;
    }
    req->busy = true;
    drank_publish_load(r);
    return;
err:
    if (res != NULL)
        td_kvpool_release(r->kp, res);
    free(nprefix);
    free(j);
    drank_reject(r, router, a->req_id, code, why);
}

/* Every transfer of a request ends in a note; the terminal one carries a
 * KvNote payload (or a failure status). Only then may the blocks be freed. */
static void
drank_on_note(td_xfer_t *x, const td_xfer_note_t *note, void *arg)
{
    td_drank_t *r = arg;
    td_dreq_t *req = drank_find_xfer(r, note->xfer_id);
    (void)x;
    if (req == NULL)
        return;   /* xfer asked drank_note_auth just before: not reached */
    if (!drank_note_sender_ok(r, req, note))
        return;
    if (note->status == TD_OK && note->payload_len == 0)
        return;   /* one (chunk, layer) landed; more follow */
    if (req->kv_done) {
        td_log_peer(&r->peer_log, TD_LOG_WARN, "decode rank %u: request "
                       "%016llx: note after the terminal one dropped (status %s)",
                       r->cfg.rank_id, (unsigned long long)req->id,
                       td_status_str(note->status));
        return;
    }
    if (note->status != TD_OK) {
        /* A transfer failed (its puts may not all have landed). P follows
         * with its terminal note when its endpoint still works; if not, the
         * endpoint was closed by force and nothing more can land: either way
         * the grace period bounds the wait. */
        if (!td_dreq_ended(req))
            drank_fail(r, req, TD_LOG_WARN, true, "kv transfer from prefill %s failed: %s",
                       req->prefill, td_status_str(note->status));
        else
            td_log_peer(&r->peer_log, TD_LOG_INFO, "decode rank %u: request "
                           "%016llx: kv transfer from prefill %s failed after its end: %s",
                           r->cfg.rank_id, (unsigned long long)req->id, req->prefill,
                           td_status_str(note->status));
        drank_grace_start(r, req);   /* not released: kv_done is false */
        return;
    }
    req->kv_done = true;   /* from here on no peer writes into its blocks */
    if (req->grace != NULL)
        event_del(req->grace);

    /* The note's meaning depends on the request's state: an ended request
     * only waited for it; otherwise the request is ADMITTED (RUNNING comes
     * only after this note, and a second one was dropped above). */
    Tandem__KvNote *kn = tandem__kv_note__unpack(NULL, note->payload_len, note->payload);
    if (td_dreq_ended(req)) {
        td_info("decode rank %u: request %016llx: prefill's terminal note in, freeing blocks",
                r->cfg.rank_id, (unsigned long long)req->id);
        drank_release(r, req);
    } else if (kn == NULL) {
        drank_fail(r, req, TD_LOG_WARN, true, "malformed kv note from prefill %s",
                   req->prefill);
    } else if (kn->req_id != req->id) {
        drank_fail(r, req, TD_LOG_WARN, true, "kv note from prefill %s names request %016llx",
                   req->prefill, (unsigned long long)kn->req_id);
    } else if (kn->canceled) {
        drank_end(r, req, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED,
                  "prefill canceled", true);
    } else if (kn->reason != NULL && kn->reason[0] != '\0') {
        drank_fail(r, req, TD_LOG_WARN, true, "prefill %s failed: %.160s", req->prefill,
                   kn->reason);
    } else {
        drank_kv_arrived(r, req, kn);
    }
    if (kn != NULL)
        tandem__kv_note__free_unpacked(kn, NULL);
}

/* ---- KV integrity: the notes' token and sender, the checksum ------------------- */

/* xfer asks first, with nothing else of a note read: does token belong to
 * a request of this rank whose transfers carry xfer_id? */
static bool
drank_note_auth(td_xfer_t *x, uint64_t xfer_id, const td_xfer_token_t *token, void *arg)
{
    const td_dreq_t *req = drank_find_xfer(arg, xfer_id);

    (void)x;
    return req != NULL && td_xfer_token_eq(&req->token, token);
}

/* Whether a note is still expected: a request admitted whose prefill has not
 * sent its terminal note (td_xfer_set_note_expect: the receiver's polling
 * after a note stops once none is). Ended ones wait for theirs without
 * hurry. */
static bool
drank_note_expect(td_xfer_t *x, void *arg)
{
    const td_drank_t *r = arg;

    (void)x;
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i] != NULL && r->slots[i]->state == TD_DREQ_ADMITTED &&
            !r->slots[i]->kv_done)
            return true;
    return false;
}

/* A note for req counts only from the prefill incarnation its Admit named;
 * one from another incarnation (an earlier life of that rank, or another
 * process writing with a known id) is dropped and counted. */
static bool
drank_note_sender_ok(td_drank_t *r, const td_dreq_t *req, const td_xfer_note_t *note)
{
    if (note->src_incarnation == req->prefill_inc)
        return true;
    r->stats.notes_stale++;
    td_log_peer(&r->peer_log, TD_LOG_WARN, "decode rank %u: request %016llx: "
                   "note from incarnation %016llx dropped: its prefill is %s (status %s)",
                   r->cfg.rank_id, (unsigned long long)req->id,
                   (unsigned long long)note->src_incarnation, req->prefill,
                   td_status_str(note->status));
    return false;
}

/* ---- Cancel and the grace period --------------------------------------------- */

/* P missed its deadlines: its writes may still come (a frozen process, a
 * transport that cannot revoke them), so the blocks are quarantined, not
 * freed: they wait for P's terminal note or a Fenced (below). */
static void
drank_on_grace(evutil_socket_t fd, short what, void *arg)
{
    td_dreq_t *req = arg;
    td_drank_t *r = req->rank;
    uint64_t blocks = 0;
    (void)fd;
    (void)what;
    assert(!req->kv_done && td_dreq_ended(req) && !req->quarantined);
    for (uint32_t s = 0; s < r->layout->nsegs; s++)   /* paged, and the fixed slot's */
        blocks += req->res->nblocks[s];
    req->quarantined = true;
    r->nquar++;
    r->quar_tokens += req->res->ntokens;
    r->quar_blocks += blocks;
    r->stats.quarantined++;
    drank_trace_blocks(r, "quarantine", req);
    td_log_peer(&r->peer_log, TD_LOG_WARN, "decode rank %u: request %016llx: no terminal note "
                "from prefill %s within the %u ms grace period: its %llu blocks quarantined "
                "until that prefill is fenced", r->cfg.rank_id, (unsigned long long)req->id,
                req->prefill, req->grace_ms, (unsigned long long)blocks);
    drank_fence_schedule(r, true);
    drank_publish_load(r);
}

/* P may still write: free only after the grace period (req->grace_ms),
 * unless its terminal note comes first. */
static void
drank_grace_start(td_drank_t *r, td_dreq_t *req)
{
    if (req->kv_done || (req->grace != NULL && evtimer_pending(req->grace, NULL)))
        return;
    if (req->grace == NULL) {
        req->grace = evtimer_new(r->base, drank_on_grace, req);
        if (req->grace == NULL) {
            td_error("decode rank %u: request %016llx: no grace timer: blocks stay reserved",
                     r->cfg.rank_id, (unsigned long long)req->id);
            return;
        }
    }
    struct timeval tv = { .tv_sec = (time_t)(req->grace_ms / 1000),
                          .tv_usec = (suseconds_t)(req->grace_ms % 1000 * 1000) };
    evtimer_add(req->grace, &tv);
}

/* The router has what it needs of some choices of req (a stop string):
 * those rows end, the request's others go on. A choice named twice, out of
 * range or ended already is skipped. */
static void
drank_cancel_choices(td_drank_t *r, void *router, uint64_t id, const Tandem__Cancel *c)
{
    for (size_t i = 0; i < c->n_choices; i++) {
        td_dreq_t *row = drank_choice(r, router, id, c->choices[i]);

        if (row == NULL || td_dreq_ended(row) || row->state != TD_DREQ_RUNNING)
            continue;
        td_debug("decode rank %u: request %016llx: choice %u ended by the router",
                 r->cfg.rank_id, (unsigned long long)id, row->choice);
        drank_end(r, row, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED, "choice ended",
                  false);
    }
}

/* ---- Quarantine and fences (docs/decoded.md, "Fencing") ------------------------ */

/* req leaves quarantine (its blocks are about to be freed). */
static void
drank_quarantine_lift(td_drank_t *r, td_dreq_t *req)
{
    uint64_t blocks = 0;

    for (uint32_t s = 0; s < r->layout->nsegs; s++)   /* paged, and the fixed slot's */
        blocks += req->res->nblocks[s];
    req->quarantined = false;
    r->nquar--;
    r->quar_tokens -= req->res->ntokens;
    r->quar_blocks -= blocks;
}

/* Whether a and b wait on the same prefill rank: its node, rank and
 * incarnation. Every rank of a prefilld shares the process's incarnation,
 * and only the rank a Fence names answers it, for the transfers it knows. */
static bool
drank_same_prefill(const td_dreq_t *a, const td_dreq_t *b)
{
    return a->prefill_inc == b->prefill_inc && a->prefill_rank == b->prefill_rank &&
           strcmp(a->prefill_node, b->prefill_node) == 0;
}

/* One Fence for the quarantined requests of one prefill rank's incarnation
 * (ids[n]), to every router. */
static void
drank_fence_send(td_drank_t *r, const td_dreq_t *first, uint64_t *ids, size_t n)
{
    Tandem__Fence f = TANDEM__FENCE__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    f.prefill_node = (char *)first->prefill_node;
    f.prefill_rank = first->prefill_rank;
    f.prefill_incarnation = first->prefill_inc;
    f.decode_node = r->node_id;
    f.decode_rank = r->cfg.rank_id;
    f.decode_incarnation = td_xfer_incarnation(r->xfer);
    f.n_xfer_ids = n;
    f.xfer_ids = ids;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCE;
    env.fence = &f;
    if (r->io.broadcast != NULL)
        r->io.broadcast(&env, r->io.arg);
    r->stats.fences_sent++;
}

/* A Fence for every prefill rank (node, rank, incarnation) that quarantined
 * requests wait on (at most FENCE_IDS_MAX transfers each: the rest go next
 * time). */
#define FENCE_IDS_MAX 4096u
static void
drank_fence_all(td_drank_t *r)
{
    static uint64_t ids[FENCE_IDS_MAX];
    bool *done = calloc(r->nslots, sizeof(*done));

    for (uint32_t i = 0; done != NULL && i < r->nslots; i++) {
        const td_dreq_t *q = r->slots[i];
        size_t n = 0;
        if (q == NULL || !q->quarantined || done[i])
            continue;
        for (uint32_t j = i; j < r->nslots && n < FENCE_IDS_MAX; j++) {
            const td_dreq_t *o = r->slots[j];
            if (o != NULL && o->quarantined && !done[j] && drank_same_prefill(o, q)) {
                ids[n++] = o->xfer_id;
                done[j] = true;
            }
        }
        drank_fence_send(r, q, ids, n);
    }
    free(done);
}

static void
drank_on_fence_timer(evutil_socket_t fd, short what, void *arg)
{
    td_drank_t *r = arg;

    (void)fd, (void)what;
    drank_fence_schedule(r, true);
}

/* Fences now (now) and again every fence_retry_ms while requests are
 * quarantined. */
static void
drank_fence_schedule(td_drank_t *r, bool now)
{
    uint32_t ms = r->cfg.fence_retry_ms ? r->cfg.fence_retry_ms : 1000;
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };

    if (r->nquar == 0 || r->closing)
        return;
    if (now)
        drank_fence_all(r);
    evtimer_add(r->fence_ev, &tv);
}

/* A Fenced (through a router): none of these transfers of that prefill
 * rank's incarnation writes here any more, so their quarantined (or still
 * waiting) blocks are freed. Anything that does not match (another rank's
 * transfer, of the same process or not) is ignored. */
static void
drank_on_fenced(td_drank_t *r, const Tandem__Fenced *f)
{
    if (f->decode_incarnation != td_xfer_incarnation(r->xfer) || f->decode_rank != r->cfg.rank_id)
        return;
    for (size_t i = 0; i < f->n_xfer_ids; i++) {
        td_dreq_t *req = drank_find_xfer(r, f->xfer_ids[i]);
        if (req == NULL || !td_dreq_ended(req) || req->kv_done ||
            req->prefill_inc != f->prefill_incarnation || req->prefill_rank != f->prefill_rank ||
            strcmp(req->prefill_node, f->prefill_node ? f->prefill_node : "") != 0)
            continue;
        td_info("decode rank %u: request %016llx: prefill %s %s: freeing its blocks",
                r->cfg.rank_id, (unsigned long long)req->id, req->prefill,
                f->gone ? "is gone (a new incarnation registered)" : "fenced its transfers");
        r->stats.fenced += !f->gone;
        r->stats.gone_fenced += f->gone;
        req->kv_done = true;
        if (req->grace != NULL)
            event_del(req->grace);
        drank_release(r, req);
    }
}

static void
drank_cancel(td_drank_t *r, void *router, const Tandem__Cancel *c)
{
    td_dreq_t *req = drank_find(r, router, c->req_id);
    bool rows = req != NULL;

    for (uint32_t i = 0; !rows && i < r->nslots; i++)   /* the lead may be gone already */
        rows = r->slots[i] != NULL && r->slots[i]->id == c->req_id &&
               r->slots[i]->router == router;
    if (!rows) {
        td_debug("decode rank %u: cancel for unknown request %016llx ignored", r->cfg.rank_id,
                 (unsigned long long)c->req_id);
        return;
    }
    if (c->n_choices > 0) {   /* only these choices end; the others go on */
        drank_cancel_choices(r, router, c->req_id, c);
        return;
    }
    drank_end_siblings(r, router, c->req_id, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED,
                       "canceled");
    if (req == NULL)
        return;
    td_info("decode rank %u: request %016llx canceled (%s): %.120s", r->cfg.rank_id,
            (unsigned long long)req->id, td_dreq_state_str(req->state),
            c->reason ? c->reason : "");
    /* The router never sent the Prefill: no prefill rank knows the blocks. */
    if (c->prefill_not_sent && req->state == TD_DREQ_ADMITTED)
        req->kv_done = true;
    if (!td_dreq_ended(req))
        drank_end(r, req, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED, "canceled",
                  true);
    /* drank_end freed it if P's note had come; else P, told at the same
     * time, stops at its next layer boundary and sends its note, or is gone
     * (or its endpoint to us failed): the grace period bounds the wait. */
    if ((req = drank_find(r, router, c->req_id)) != NULL)
        drank_grace_start(r, req);
}

void
td_drank_on_router_down(td_drank_t *r, void *router)
{
    drank_kept_drop_all(r, router, true, "its router is gone");
    for (uint32_t i = 0; i < r->nslots; i++) {
        td_dreq_t *req = r->slots[i];
        if (req == NULL || req->router != router)
            continue;
        uint64_t id = req->id;
        req->router = NULL;
        td_info("decode rank %u: request %016llx: its router is gone", r->cfg.rank_id,
                (unsigned long long)id);
        if (!td_dreq_ended(req))
            drank_end(r, req, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED,
                     "router gone", false);
        /* Nobody will report P's fate now; P lost this router too and stops
         * at its next layer boundary: the grace period bounds the wait. */
        if (r->slots[i] != NULL && r->slots[i]->id == id)
            drank_grace_start(r, r->slots[i]);
    }
}

/* ---- The continuous batch ------------------------------------------------------- */

/* Compute thread: one decode step of the batch the loop put in rows; every
 * row's new entries land in its own blocks. */
static void
drank_step_run(void *arg)
{
    td_drank_t *r = arg;

    r->step_st = td_engine_decode_step(r->engine, r->rows, r->nrows, NULL, NULL);
}

/* Loop thread: the step came back; rows whose request ended meanwhile (a
 * cancel, a router gone) are dropped and released now if they may be. */
static void
drank_step_done(void *arg)
{
    td_drank_t *r = arg;
    size_t n = r->nrows;
    td_status_t st = r->step_st;
    char why[96];

    r->stepping = false;
    r->nrows = 0;
    for (size_t i = 0; i < n; i++)
        r->row_req[i]->busy = false;
    if (r->closing)
        return;
    if (st != TD_OK) {
        /* One failure of the step, logged once; every row fails with it. */
        snprintf(why, sizeof(why), "decode step failed: %s", td_status_str(st));
        td_error("decode rank %u: %s (%zu requests)", r->cfg.rank_id, why, n);
    }
    for (size_t i = 0; i < n; i++) {
        td_dreq_t *req = r->row_req[i];

        if (td_dreq_ended(req)) {
            if (req->kv_done)
                drank_release(r, req);
        } else if (st != TD_OK) {
            drank_end(r, req, TD_DREQ_FAILED, TANDEM__FINISH__FINISH_ERROR, why, true);
        } else {
            drank_emit(r, req, r->rows[i].next, r->rows[i].finish, &r->rows[i].pick);
        }
    }
    drank_resume_waiting(r);
    drank_publish_load(r);
    drank_step_schedule(r);
}

/* Hand the running requests' next step to the compute thread. */
static void
drank_step(td_drank_t *r)
{
    size_t n = 0;

    if (r->stepping || r->closing)
        return;
    for (uint32_t i = 0; i < r->nslots; i++) {
        td_dreq_t *req = r->slots[i];
        if (req == NULL || req->state != TD_DREQ_RUNNING || req->busy || req->paused)
            continue;
        r->rows[n] = (td_engine_row_t){ .req = req->ereq, .token = req->last };
        r->row_req[n++] = req;
    }
    if (n == 0)
        return;
    r->nrows = n;
    if (td_jobq_post_pass(r->jq, drank_step_run, drank_step_done, r) != TD_OK) {
        r->nrows = 0;
        return;   /* logged; the next schedule tries again */
    }
    for (size_t i = 0; i < n; i++)
        r->row_req[i]->busy = true;
    r->stepping = true;
    r->stats.steps++;
}

static void
drank_on_step(evutil_socket_t fd, short what, void *arg)
{
    td_drank_t *r = arg;
    (void)fd;
    (void)what;
    r->step_scheduled = false;
    drank_step(r);
    drank_step_schedule(r);
}

/* Steps run back to back while requests run, each through a timer of
 * step_gap_us (default 0). A timer, not event_active(): libevent runs an event
 * re-activated from its own callback again in the same pass, before it polls
 * I/O, so new messages and notes would wait until the batch is empty. An
 * expired timer is run only after the next (non-blocking) poll, so requests
 * join and leave between steps; a zero timeout makes epoll_wait not sleep at
 * all (a non-zero one is rounded up to whole milliseconds). */
static void
drank_step_schedule(td_drank_t *r)
{
    if (r->step_scheduled || r->stepping || r->closing)
        return;
    for (uint32_t i = 0; i < r->nslots; i++) {
        if (r->slots[i] != NULL && r->slots[i]->state == TD_DREQ_RUNNING &&
            !r->slots[i]->paused) {
            struct timeval tv = { 0, (suseconds_t)r->cfg.step_gap_us };
            r->step_scheduled = true;
            evtimer_add(r->step_ev, &tv);
            return;
        }
    }
}

/* ---- Paused rows (docs/decoded.md, "Paused rows") ------------------------------ */

static uint64_t
drank_pause_budget(const td_drank_t *r)
{
    uint64_t total = 0;

    if (r->cfg.pause_max_bytes)
        return r->cfg.pause_max_bytes;
    for (uint32_t s = 0; s < r->layout->nsegs; s++)
        total += td_kvpool_seg_nblocks(r->kp, s) * td_kvpool_seg_block_bytes(r->kp, s);
    return total / 4;
}

/* The oldest paused request other than keep, or NULL. */
static td_dreq_t *
drank_pause_oldest(const td_drank_t *r, const td_dreq_t *keep, uint32_t *npaused,
                   uint64_t *bytes)
{
    td_dreq_t *old = NULL;

    *npaused = 0;
    *bytes = 0;
    for (uint32_t i = 0; i < r->nslots; i++) {
        td_dreq_t *q = r->slots[i];
        if (q == NULL || !q->paused)
            continue;
        (*npaused)++;
        *bytes += drank_req_bytes(r, q);
        if (q != keep && (old == NULL || q->paused_ns < old->paused_ns))
            old = q;
    }
    return old;
}

/* Resume the paused requests the router resumed, while rows are free: one
 * pass over the slots, the rows in use counted once and then by hand. */
static void
drank_resume_waiting(td_drank_t *r)
{
    uint32_t rows = drank_rows(r);

    for (uint32_t i = 0; i < r->nslots && rows < r->cfg.max_batch; i++) {
        td_dreq_t *q = r->slots[i];
        if (q != NULL && q->paused && q->resume_wanted) {
            q->paused = q->resume_wanted = false;
            r->stats.resumed++;
            rows++;
        }
    }
}

/* Room in the paused budget for req (req_bytes more): the oldest paused
 * requests end (CANCELED) until there is; false when req itself does not
 * fit (it ends too). */
static bool
drank_pause_room(td_drank_t *r, td_dreq_t *req)
{
    uint64_t need = drank_req_bytes(r, req), bytes;
    uint32_t n;
    td_dreq_t *old;

    while ((old = drank_pause_oldest(r, req, &n, &bytes)) != NULL &&
           (bytes + need > drank_pause_budget(r) || n >= r->cfg.pause_slots)) {
        r->stats.pause_evicted++;
        td_log_peer(&r->peer_log, TD_LOG_WARN, "decode rank %u: request %016llx: paused kv "
                    "over its budget: the oldest paused request ends", r->cfg.rank_id,
                    (unsigned long long)old->id);
        drank_end(r, old, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED,
                  "paused kv over its budget: its client reads too slowly", true);
    }
    return bytes + need <= drank_pause_budget(r) && n < r->cfg.pause_slots;
}

/* The router's Pause: a RUNNING request leaves the batch (a step it is in
 * still brings its token), keeping its blocks; or it comes back. */
static void
drank_pause(td_drank_t *r, void *router, const Tandem__Pause *p)
{
    td_dreq_t *req = drank_find(r, router, p->req_id);

    if (req == NULL || req->state != TD_DREQ_RUNNING)
        return;   /* ended meanwhile: nothing to pause */
    if (!p->paused) {
        if (req->paused) {
            req->resume_wanted = true;
            drank_resume_waiting(r);
            drank_step_schedule(r);
            drank_publish_load(r);
        }
        return;
    }
    if (req->paused) {
        req->resume_wanted = false;
        return;
    }
    if (!drank_pause_room(r, req)) {
        r->stats.pause_evicted++;
        drank_end(r, req, TD_DREQ_CANCELED, TANDEM__FINISH__FINISH_CANCELED,
                  "paused kv over its budget: its client reads too slowly", true);
        return;
    }
    req->paused = true;
    req->paused_ns = td_clock_ns();
    r->stats.paused++;
    td_debug("decode rank %u: request %016llx paused", r->cfg.rank_id,
             (unsigned long long)req->id);
    drank_resume_waiting(r);   /* its row is free: a resumed one may take it */
    drank_publish_load(r);
}

/* ---- Messages, life cycle ---------------------------------------------------------- */

void
td_drank_on_message(td_drank_t *r, void *router, const Tandem__Envelope *env)
{
    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_ADMIT:
        drank_admit(r, router, env->admit);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_CANCEL:
        drank_cancel(r, router, env->cancel);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_FENCED:
        drank_on_fenced(r, env->fenced);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_PAUSE:
        drank_pause(r, router, env->pause);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_DRAIN:
        if (!r->stopping && r->draining != env->drain->draining) {
            r->draining = env->drain->draining;
            td_info("decode rank %u: %s", r->cfg.rank_id,
                    r->draining ? "draining: no new requests" : "drain ended");
            if (r->draining)
                drank_kept_drop_all(r, NULL, false, "draining");
            drank_publish_load(r);
        }
        break;
    default:
        td_debug("decode rank %u: message %d ignored", r->cfg.rank_id, (int)env->payload_case);
        break;
    }
}

/* Stopping and no request live (ended ones may still wait for P's note or
 * the grace period: the pools go away with the rank): tell the worker once. */
static void
drank_check_idle(td_drank_t *r)
{
    if (!r->stopping || r->idle_told)
        return;
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i] != NULL && !td_dreq_ended(r->slots[i]))
            return;
    r->idle_told = true;
    td_info("decode rank %u: no request left", r->cfg.rank_id);
    if (r->io.idle != NULL)
        r->io.idle(r->io.arg);
}

void
td_drank_stop(td_drank_t *r)
{
    uint32_t live = 0;

    r->stopping = true;
    r->draining = true;
    drank_kept_drop_all(r, NULL, false, "stopping");
    for (uint32_t i = 0; i < r->nslots; i++)
        live += r->slots[i] != NULL && !td_dreq_ended(r->slots[i]);
    td_info("decode rank %u: stopping: no new requests, %u to finish", r->cfg.rank_id, live);
    drank_publish_load(r);
    drank_check_idle(r);
}

void
td_drank_abort(td_drank_t *r)
{
    r->stopping = true;
    r->draining = true;
    drank_kept_drop_all(r, NULL, false, "shutting down");
    for (uint32_t i = 0; i < r->nslots; i++) {
        td_dreq_t *req = r->slots[i];
        if (req != NULL && !td_dreq_ended(req))
            drank_end(r, req, TD_DREQ_FAILED, TANDEM__FINISH__FINISH_ERROR,
                     "decode rank shutting down", true);
    }
    drank_publish_load(r);
    drank_check_idle(r);
}

/* The compute thread's first act: its own compute pool, if the rank has one. */
static void
drank_compute_start(void *arg)
{
    td_drank_t *r = arg;

    if (r->cfg.compute_start != NULL)
        r->cfg.compute_start(r->cfg.compute_arg);
}

td_status_t
td_drank_create(struct event_base *base, td_xfer_t *xfer, td_engine_t *engine,
                const td_drank_config_t *cfg, const td_drank_io_t *io, td_drank_t **out)
{
    td_status_t st = TD_ERR_NOMEM;
    td_drank_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return TD_ERR_NOMEM;
    r->base = base;
    r->xfer = xfer;
    r->engine = engine;
    r->layout = engine->layout;
    r->cfg = *cfg;
    r->io = *io;
    uint32_t nsegs = r->layout->nsegs;
    r->node_id = strdup(cfg->node_id);
    r->pools = calloc(nsegs, sizeof(*r->pools));
    r->pool_base = calloc(nsegs, sizeof(*r->pool_base));
    r->exports = calloc(nsegs, sizeof(*r->exports));
    r->nslots = cfg->max_batch + cfg->retain + cfg->quarantine_slots + cfg->pause_slots;
    r->slots = calloc(r->nslots, sizeof(*r->slots));
    r->rows = calloc(cfg->max_batch, sizeof(*r->rows));
    r->row_req = calloc(cfg->max_batch, sizeof(*r->row_req));
    r->step_ev = evtimer_new(base, drank_on_step, r);
    r->fence_ev = evtimer_new(base, drank_on_fence_timer, r);
    if (r->node_id == NULL || !r->pools || !r->pool_base || !r->exports || !r->slots ||
        !r->rows || !r->row_req || !r->step_ev || !r->fence_ev)
        goto err_destroy;
    if (cfg->trace_path != NULL && cfg->trace_path[0] != '\0') {
        char path[4096];
        snprintf(path, sizeof(path), "%s.%u", cfg->trace_path, cfg->rank_id);
        if ((r->trace = fopen(path, "a")) == NULL) {
            td_error("decode rank %u: trace file %s: cannot open", cfg->rank_id, path);
            st = TD_ERR_IO;
            goto err_destroy;
        }
        setvbuf(r->trace, NULL, _IOLBF, 0);
    }
    char name[16];
    snprintf(name, sizeof(name), "decode-c%u", cfg->rank_id);
    st = cfg->step != NULL
             ? td_jobq_create_stepped(base, name, drank_compute_start, r, cfg->step, &r->jq)
             : td_jobq_create(base, name, drank_compute_start, r, &r->jq);
    if (st != TD_OK)
        goto err_destroy;
    r->cfg.node_id = r->node_id;
    uint64_t seed;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        st = TD_ERR_IO;
        goto err_destroy;
    }
    r->xfer_ids = td_rng_seed(seed);
    st = td_kvpool_create(r->layout, cfg->kv_tokens, r->nslots, &r->kp);
    if (st != TD_OK)
        goto err_destroy;
    td_xfer_set_note_handler(r->xfer, drank_on_note, r);
    td_xfer_set_note_auth(r->xfer, drank_note_auth, r);
    td_xfer_set_note_expect(r->xfer, drank_note_expect, r);
    uint64_t bytes = 0;
    for (uint32_t s = 0; s < nsegs; s++) {
        uint64_t bb = td_kvpool_seg_block_bytes(r->kp, s), nb = td_kvpool_seg_nblocks(r->kp, s);
        st = td_xfer_pool_create(r->xfer, s, TD_XFER_MEM_HOST, NULL, bb, nb, &r->pools[s]);
        if (st != TD_OK)
            goto err_destroy;
        r->pool_base[s] = td_xfer_pool_base(r->pools[s]);
        if (cfg->prefault)
            td_xfer_pool_prefault(r->pools[s]);
        st = td_xfer_pool_export(r->pools[s], (void **)&r->exports[s].data,
                                 &r->exports[s].len);
        if (st != TD_OK)
            goto err_destroy;
        bytes += bb * nb;
    }
    td_kvpool_set_memory(r->kp, r->pool_base);
    st = td_xfer_address(r->xfer, (void **)&r->address.data, &r->address.len);
    if (st != TD_OK)
        goto err_destroy;
    td_kvpool_counts_t c;
    td_kvpool_counts(r->kp, &c);
    td_info("decode rank %u: %u pools, %.1f MiB, %llu blocks, %llu kv tokens, %u batch rows, "
            "keeps %u finished states", cfg->rank_id, nsegs, (double)bytes / (1 << 20),
            (unsigned long long)c.blocks_total, (unsigned long long)cfg->kv_tokens,
            cfg->max_batch, cfg->retain);
    *out = r;
    return TD_OK;

err_destroy:
    td_drank_destroy(r);
    return st;
}

void
td_drank_destroy(td_drank_t *r)
{
    if (r == NULL)
        return;
    /* The compute thread first: the job it runs ends, its end only cleans up. */
    r->closing = true;
    td_jobq_destroy(r->jq);
    r->jq = NULL;
    td_xfer_set_note_handler(r->xfer, NULL, NULL);   /* no note may find a freed request */
    td_xfer_set_note_auth(r->xfer, NULL, NULL);
    td_xfer_set_note_expect(r->xfer, NULL, NULL);
    for (uint32_t i = 0; r->slots != NULL && i < r->nslots; i++) {
        td_dreq_t *req = r->slots[i];
        if (req == NULL)
            continue;
        r->slots[i] = NULL;
        /* Exiting: the pools go away below, so a late write from a peer
         * fails on its side instead of landing in reused memory. */
        td_kvpool_release(r->kp, req->res);
        req->res = NULL;
        td_dreq_destroy(req);
    }
    while (r->kept_head != NULL)
        drank_kept_free(r, r->kept_head);
    for (uint32_t s = 0; s < r->layout->nsegs; s++) {
        if (r->exports != NULL)
            free(r->exports[s].data);
        if (r->pools != NULL)
            td_xfer_pool_destroy(r->pools[s]);
    }
    free(r->address.data);
    td_kvpool_destroy(r->kp);
    if (r->step_ev != NULL)
        event_free(r->step_ev);
    if (r->fence_ev != NULL)
        event_free(r->fence_ev);
    free(r->slots);
    free(r->rows);
    free(r->row_req);
    free(r->exports);
    free(r->pool_base);
    free(r->pools);
    free(r->node_id);
    if (r->trace != NULL)
        fclose(r->trace);
    free(r);
}

void
td_drank_register_fill(const td_drank_t *r, Tandem__Register *reg)
{
    reg->xfer_address = r->address;
    reg->n_pools = r->layout->nsegs;
    reg->pools = r->exports;
    reg->kv_tokens_total = r->cfg.kv_tokens;
    reg->max_batch = r->cfg.max_batch;
}

void
td_drank_load(td_drank_t *r)
{
    r->load_sent = false;
    drank_publish_load(r);
}

void
td_drank_stats(const td_drank_t *r, td_drank_stats_t *out)
{
    *out = r->stats;
    out->kept_now = r->nkept;
    out->quarantined_now = r->nquar;
    out->paused_now = 0;
    out->paused_bytes = 0;
    for (uint32_t i = 0; i < r->nslots; i++)
        if (r->slots[i] != NULL && r->slots[i]->paused) {
            out->paused_now++;
            out->paused_bytes += drank_req_bytes(r, r->slots[i]);
        }
    out->quarantined_tokens = r->quar_tokens;
    out->quarantined_blocks = r->quar_blocks;
    out->live = out->running = out->waiting = 0;
    for (uint32_t i = 0; i < r->nslots; i++) {
        if (r->slots[i] == NULL)
            continue;
        out->live++;
        out->running += r->slots[i]->state == TD_DREQ_RUNNING;
        out->waiting += r->slots[i]->state == TD_DREQ_ADMITTED;
    }
}

void
td_drank_kv_counts(const td_drank_t *r, td_kvpool_counts_t *out)
{
    td_kvpool_counts(r->kp, out);
}
