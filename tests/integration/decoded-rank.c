/* tests/integration/decoded-rank.c — a decode rank (decoded/drank.c) driven by
 * a fake router (its io callbacks) and a fake prefill rank that pushes real
 * KV over UCX: in this process for the request paths, in a forked process
 * that is SIGKILLed mid-transfer for the grace-period path. Checks tokens
 * against the synthetic engine's own expectation, admission rejects, KV
 * verification, cancel mid-prefill and mid-decode, a stale incarnation, and
 * that blocks are freed only as the invariant allows (docs/decoded.md); KV
 * integrity: the checksum (a byte flipped in flight, a wrong sum), notes
 * matched on (transfer id, sender incarnation), random transfer ids; a Fence
 * per prefill rank, each rank's Fenced freeing its own transfers only. */
#include "drank.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "check.h"
#include "decoded-fakes.h"
#include "log.h"

#define D_INC       0xd0d0d0d0ull
#define MAX_BATCH   4
#define KV_TOKENS   2048
#define LONG_TOKENS 2000            /* a stream that outlasts a few loop passes */

/* ---- Helpers on the rank ------------------------------------------------------ */

typedef struct {
    struct event_base *base;
    td_engine_t *e;
    td_xfer_t *x;            /* the rank's UCX worker */
    td_drank_t *rk;
    fk_router_t *rt;
    Tandem__Register reg;
} env_t;

static const Tandem__KvDest *
admit(env_t *t, uint64_t id, const int32_t *prompt, size_t n, uint32_t max_tokens,
      int want_code)
{
    fk_admit_t adm;
    fk_admit_init(&adm, id, prompt, n, max_tokens);
    td_drank_on_message(t->rk, t->rt, &adm.env);
    if (want_code != 0) {
        const Tandem__Envelope *rej =
            fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, id);
        CHECK(rej != NULL);
        if (rej != NULL)
            CHECK_EQ_INT(rej->admit_reject->code, want_code);
        return NULL;
    }
    const Tandem__Envelope *ok = fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, id);
    CHECK(ok != NULL);
    if (ok == NULL)
        return NULL;
    CHECK_EQ_INT(ok->admit_ok->dest->incarnation, D_INC);
    CHECK_EQ_INT(ok->admit_ok->dest->n_segs, t->e->layout->nsegs);
    return ok->admit_ok->dest;
}

/* Cancel from router rt; prefill_not_sent as the router says. */
static void
cancel_from(env_t *t, fk_router_t *rt, uint64_t id, int prefill_not_sent)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    c.req_id = id;
    c.reason = "test";
    c.prefill_not_sent = prefill_not_sent;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CANCEL;
    env.cancel = &c;
    td_drank_on_message(t->rk, rt, &env);
}

static void
cancel(env_t *t, uint64_t id)
{
    cancel_from(t, t->rt, id, 0);
}

/* Drain{draining} from the router. */
static void
drain(env_t *t, int draining)
{
    Tandem__Drain dr = TANDEM__DRAIN__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    dr.draining = draining;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DRAIN;
    env.drain = &dr;
    td_drank_on_message(t->rk, t->rt, &env);
}

static uint64_t
blocks_used(env_t *t)
{
    td_kvpool_counts_t c;
    td_drank_kv_counts(t->rk, &c);
    CHECK_EQ_INT(c.blocks_used + c.blocks_free, c.blocks_total);
    return c.blocks_used;
}


static int
quarantined(void *arg)
{
    env_t *t = arg;
    td_drank_stats_t st;

    td_drank_stats(t->rk, &st);
    return st.quarantined_now > 0;
}

/* The rank's Fences (broadcast to the fake router), as a router answers
 * them: a Fenced from the prefill rank, or {gone} for one that was replaced.
 * Waits up to timeout_ms for the first quarantine; returns the requests
 * fenced. Before it, the blocks are held: no Released. */
static int
answer_fences(env_t *t, bool gone, uint64_t timeout_ms)
{
    int n = 0;

    if (!fk_run_until(t->base, quarantined, t, timeout_ms))
        return 0;
    fk_run_until(t->base, fk_never, NULL, 20);   /* the Fence is sent at once */
    CHECK(blocks_used(t) > 0);
    for (size_t i = 0; i < t->rt->n; i++) {
        const Tandem__Envelope *e = t->rt->msgs[i];
        if (e->payload_case != TANDEM__ENVELOPE__PAYLOAD_FENCE)
            continue;
        const Tandem__Fence *f = e->fence;
        CHECK_EQ_INT(f->decode_incarnation, D_INC);
        CHECK(f->prefill_incarnation != 0 && f->n_xfer_ids > 0);
        Tandem__Fenced fd = TANDEM__FENCED__INIT;
        fd.prefill_node = f->prefill_node;
        fd.prefill_rank = f->prefill_rank;
        fd.prefill_incarnation = f->prefill_incarnation;
        fd.decode_node = f->decode_node;
        fd.decode_rank = f->decode_rank;
        fd.decode_incarnation = f->decode_incarnation;
        fd.n_xfer_ids = f->n_xfer_ids;
        fd.xfer_ids = f->xfer_ids;
        fd.gone = gone;
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCED;
        env.fenced = &fd;
        td_drank_on_message(t->rk, t->rt, &env);
        n += (int)f->n_xfer_ids;
    }
    return n;
}

/* ---- Cases --------------------------------------------------------------------- */

/* Two requests, the second joining while the first decodes: every token as
 * the engine predicts, finish LENGTH, Released, blocks back to zero. */
static void
test_stream(env_t *t)
{
    int32_t pa[37], pb[9], got[256], want[256];
    fk_prompt(pa, 37, 1);
    fk_prompt(pb, 9, 2);
    fk_p_t fp;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    const Tandem__KvDest *da = admit(t, 101, pa, 37, 60, 0);
    const Tandem__KvDest *db = admit(t, 102, pb, 9, 20, 0);
    CHECK(blocks_used(t) > 0);
    CHECK_EQ_INT(t->rt->load.queued, 2);
    if (da == NULL || db == NULL)
        goto out;
    fk_p_push(&fp, t->e, da, 101, pa, 37, 60, 1, 0);
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 101, 5000));
    fk_p_push(&fp, t->e, db, 102, pb, 9, 20, 1, 0);
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 101, 5000));
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 102, 5000));
    int fin;
    const char *err;
    size_t n = fk_router_tokens(t->rt, 101, got, 256, &fin, &err);
    size_t nw = fk_expect(t->e, pa, 37, 60, want);
    CHECK_EQ_INT(n, 60);
    CHECK_EQ_INT(nw, 60);
    CHECK(n == nw && memcmp(got, want, n * sizeof(*got)) == 0);
    CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);
    n = fk_router_tokens(t->rt, 102, got, 256, &fin, &err);
    nw = fk_expect(t->e, pb, 9, 20, want);
    CHECK(n == 20 && n == nw && memcmp(got, want, n * sizeof(*got)) == 0);
    CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);
    td_drank_stats_t st;
    td_drank_stats(t->rk, &st);
    CHECK(st.verified_bytes > 0);
    CHECK_EQ_INT(st.finished, 2);
    td_xfer_stats_t xs;
    td_xfer_stats(t->x, &xs);
    CHECK_EQ_INT(xs.notes_forged, 0);   /* no note came after its request's end */
    CHECK_EQ_INT(blocks_used(t), 0);
    CHECK_EQ_INT(t->rt->load.kv_blocks_used, 0);
out:
    fk_run_until(t->base, fk_never, NULL, 50);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

static void
test_rejects(env_t *t)
{
    int32_t p[8];
    fk_prompt(p, 8, 3);
    const Tandem__KvDest *d = admit(t, 201, p, 8, 10, 0);
    CHECK(d != NULL);
    admit(t, 201, p, 8, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID);  /* known id */
    admit(t, 202, p, 0, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID);  /* empty */
    admit(t, 203, p, 8, 0, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID);   /* max_tokens */
    int32_t bad[2] = { 5, 1000 };
    admit(t, 204, bad, 2, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID);
    {   /* no prefill incarnation: its notes could not be matched */
        fk_admit_t adm;
        fk_admit_init(&adm, 240, p, 8, 10);
        adm.a.prefill_incarnation = 0;
        td_drank_on_message(t->rk, t->rt, &adm.env);
        const Tandem__Envelope *rej =
            fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, 240);
        CHECK(rej != NULL && rej->admit_reject->code ==
                                 TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID);
    }
    admit(t, 205, p, 8, 4090, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_TOO_LONG);
    admit(t, 206, p, 8, KV_TOKENS, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY);
    for (uint64_t id = 207; id < 207 + MAX_BATCH - 1; id++)
        CHECK(admit(t, id, p, 8, 10, 0) != NULL);
    admit(t, 220, p, 8, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY);  /* slots */
    /* Cancel them all before any KV: the (absent) prefill's grace period. */
    for (uint64_t id = 201; id < 207 + MAX_BATCH - 1; id++)
        if (id <= 201 || id >= 207)
            cancel(t, id);
    CHECK(blocks_used(t) > 0);
    drain(t, 1);
    CHECK(t->rt->load.draining);
    fk_run_until(t->base, fk_never, NULL, GRACE_MS + 200);
    CHECK(answer_fences(t, false, 1000) > 0);   /* quarantined, then fenced */
    CHECK_EQ_INT(blocks_used(t), 0);
    admit(t, 230, p, 8, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_DRAINING);
    drain(t, 0);
    CHECK(!t->rt->load.draining);
    fk_router_clear(t->rt);
}

/* Bad KV: a byte flipped in flight (after P's checksum took it) and a wrong
 * checksum over the right bytes fail the request on the checksum, before
 * adopt (counted); KV wrong at P with a checksum that agrees passes it and is
 * caught by the engine's check. Each: Tokens ERROR with the reason, no token,
 * the blocks freed at once (the note was terminal). */
static void
test_corrupt(env_t *t)
{
    static const struct {
        int corrupt, corrupt_src, bad_sum;
        const char *error;
        int mismatch;
    } cases[] = {
        { 0, 1, 0, "does not verify", 0 },
        { 1, 0, 0, "checksum mismatch", 1 },
        { 0, 0, 1, "checksum mismatch", 1 },
    };
    int32_t p[20];
    fk_prompt(p, 20, 4);
    fk_p_t fp;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t id = 301 + i;
        td_drank_stats_t st0, st;
        td_drank_stats(t->rk, &st0);
        const Tandem__KvDest *d = admit(t, id, p, 20, 10, 0);
        if (d == NULL)
            continue;
        fp.corrupt = cases[i].corrupt;
        fp.corrupt_src = cases[i].corrupt_src;
        fp.bad_sum = cases[i].bad_sum;
        fk_p_push(&fp, t->e, d, id, p, 20, 10, 1, 0);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, id, 5000));
        int32_t got[16];
        int fin;
        const char *err;
        size_t n = fk_router_tokens(t->rt, id, got, 16, &fin, &err);
        CHECK_EQ_INT(n, 0);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_ERROR);
        CHECK(err != NULL && strstr(err, cases[i].error) != NULL);
        td_drank_stats(t->rk, &st);
        CHECK_EQ_INT(st.kv_sum_mismatch - st0.kv_sum_mismatch, cases[i].mismatch);
        CHECK_EQ_INT(st.failed - st0.failed, 1);
        CHECK_EQ_INT(blocks_used(t), 0);
    }
    fk_run_until(t->base, fk_never, NULL, 20);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* Cancel while P still writes: blocks stay until P's canceled note. Cancel
 * mid-decode: freed at once (the note came). Stale incarnation: dropped. */
static void
test_cancel(env_t *t)
{
    int32_t p[30];
    fk_prompt(p, 30, 5);
    fk_p_t fp, stale;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC + 1, t->e->layout, &stale), TD_OK);

    const Tandem__KvDest *d = admit(t, 401, p, 30, 10, 0);
    if (d != NULL) {
        fk_p_push(&fp, t->e, d, 401, p, 30, 10, 0, 0);   /* data, no terminal note yet */
        fk_run_until(t->base, fk_never, NULL, 50);
        cancel(t, 401);
        int32_t got[4];
        int fin;
        const char *err;
        fk_router_tokens(t->rt, 401, got, 4, &fin, &err);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_CANCELED);
        CHECK(blocks_used(t) > 0);
        CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 401) == NULL);
        fk_p_push(&fp, t->e, d, 401, p, 30, 10, 1, 1);   /* P's canceled note */
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 401, 5000));
        CHECK_EQ_INT(blocks_used(t), 0);
    }

    d = admit(t, 402, p, 30, 1500, 0);
    if (d != NULL) {
        /* A note for another incarnation fk_never reaches the rank. */
        td_xfer_stats_t xs;
        fk_p_push(&stale, t->e, d, 402, p, 30, 1500, 1, 0);
        fk_run_until(t->base, fk_never, NULL, 100);
        td_xfer_stats(t->x, &xs);
        CHECK(xs.notes_stale > 0);
        CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 402) == NULL);

        fk_p_push(&fp, t->e, d, 402, p, 30, 1500, 1, 0);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 402, 5000));
        cancel(t, 402);
        CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 402) != NULL);
        int32_t got[1500];
        int fin;
        const char *err;
        size_t n = fk_router_tokens(t->rt, 402, got, 1500, &fin, &err);
        CHECK(n >= 1 && n < 1500);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_CANCELED);
        CHECK_EQ_INT(blocks_used(t), 0);
    }
    fk_run_until(t->base, fk_never, NULL, 20);
    fk_p_destroy(&stale);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* A router's Admit naming a prefill deadline of 49 days: clamped to
 * prefill-deadline-max (DEADLINE_MS here), so a request canceled before its
 * prefill's note gets its blocks back within the usual grace period, not
 * in weeks. */
static void
test_deadline_clamp(env_t *t)
{
    int32_t p[20];
    fk_admit_t adm;
    td_drank_stats_t st0, st;

    fk_prompt(p, 20, 9);
    td_drank_stats(t->rk, &st0);
    fk_admit_init(&adm, 451, p, 20, 4);
    adm.a.prefill_deadline_ms = UINT32_MAX;
    td_drank_on_message(t->rk, t->rt, &adm.env);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, 451) != NULL);
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.deadlines_clamped - st0.deadlines_clamped, 1);
    cancel(t, 451);
    CHECK(blocks_used(t) > 0);
    CHECK(answer_fences(t, false, GRACE_MS + 2000) == 1);
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 451, 1000));
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_router_clear(t->rt);
}

/* Whether dest names a paged block of held[seg][0 .. nheld[seg]). */
static bool
dest_overlaps(const env_t *t, const Tandem__KvDest *dest, uint64_t *const *held,
              const size_t *nheld)
{
    for (size_t s = 0; s < dest->n_segs; s++) {
        if (t->e->layout->segs[s].kind != TD_LAYOUT_PAGED)
            continue;
        for (size_t i = 0; i < dest->segs[s]->n_blocks; i++)
            for (size_t j = 0; j < nheld[s]; j++)
                if (dest->segs[s]->blocks[i] == held[s][j])
                    return true;
    }
    return false;
}

/* Admit and free (no Prefill sent) `rounds` requests of n + max tokens:
 * how many were handed one of the held blocks. The pool hands out its
 * free blocks oldest first, so these rounds go through all of them. */
static int
cycle_blocks(env_t *t, uint64_t id0, int rounds, const int32_t *p, size_t n, uint32_t max,
             uint64_t *const *held, const size_t *nheld)
{
    int hits = 0;

    for (int i = 0; i < rounds; i++) {
        const Tandem__KvDest *d = admit(t, id0 + (uint64_t)i, p, n, max, 0);
        if (d == NULL)
            return -1;
        hits += dest_overlaps(t, d, held, nheld);
        cancel_from(t, t->rt, id0 + (uint64_t)i, 1);
    }
    return hits;
}

/* Fencing (docs/decoded.md): a request whose prefill stays silent past its
 * deadline keeps its blocks in quarantine: no Released, counted in the Load
 * and the stats, a Fence to the routers; while it is there no admission is
 * handed one of its blocks, though the pool goes round all the others many
 * times; a late write of the prefill lands in its own blocks; past the
 * quarantine budget admission waits (NO_CAPACITY, no free KV in the Load);
 * the Fenced frees them, and then they are handed out again. */
static void
test_quarantine(env_t *t)
{
    int32_t p[30];
    uint64_t *held[16] = { NULL };
    size_t nheld[16] = { 0 };
    td_drank_stats_t st0, st;
    fk_p_t fp;

    fk_prompt(p, 30, 15);
    td_drank_stats(t->rk, &st0);
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    const Tandem__KvDest *qa = admit(t, 1001, p, 30, 300, 0);   /* 330 tokens */
    if (qa == NULL || qa->n_segs > 16)
        return;
    for (size_t s = 0; s < qa->n_segs; s++) {
        held[s] = qa->segs[s]->blocks;
        nheld[s] = qa->segs[s]->n_blocks;
    }
    fk_p_push(&fp, t->e, qa, 1001, p, 30, 300, 0, 0);   /* its data; no terminal note */
    cancel(t, 1001);
    CHECK(fk_run_until(t->base, quarantined, t, GRACE_MS + 2000));
    td_drank_stats(t->rk, &st);
    CHECK(st.quarantined_now == 1 && st.quarantined_blocks > 0 && st.quarantined_tokens == 330);
    CHECK(t->rt->load.quarantined == 1 && t->rt->load.kv_blocks_quarantined > 0);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_FENCE, qa->xfer_id) != NULL);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 1001) == NULL);
    /* many admissions meanwhile: never one of its blocks */
    CHECK_EQ_INT(cycle_blocks(t, 1100, 40, p, 30, 300, held, nheld), 0);
    fk_p_push(&fp, t->e, qa, 1001, p, 30, 300, 0, 0);   /* a late write: its own blocks */
    fk_run_until(t->base, fk_never, NULL, 50);
    /* a second one goes over the budget (600 tokens here): admission waits */
    CHECK(admit(t, 1002, p, 30, 300, 0) != NULL);
    cancel(t, 1002);
    CHECK(fk_run_until(t->base, fk_never, NULL, GRACE_MS + 300) == 0);
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.quarantined_now, 2);
    CHECK_EQ_INT(t->rt->load.kv_tokens_free, 0);
    admit(t, 1003, p, 8, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY);
    const Tandem__Envelope *rej =
        fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, 1003);
    CHECK(rej != NULL && strstr(rej->admit_reject->reason, "quarantined") != NULL);
    /* fenced: freed, Released, and its blocks come round again */
    CHECK_EQ_INT(answer_fences(t, false, 100), 3);   /* one Fence per time sent, same ids */
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 1001, 1000));
    td_drank_stats(t->rk, &st);
    CHECK(st.quarantined_now == 0 && st.quarantined_blocks == 0 && st.fenced - st0.fenced == 2);
    CHECK(cycle_blocks(t, 1200, 40, p, 30, 300, held, nheld) > 0);
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

static void
pause_msg(env_t *t, uint64_t id, int paused)
{
    Tandem__Pause pm = TANDEM__PAUSE__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    pm.req_id = id;
    pm.paused = paused;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PAUSE;
    env.pause = &pm;
    td_drank_on_message(t->rk, t->rt, &env);
}

/* Paused rows (a slow client, docs/decoded.md): a paused request leaves the
 * batch (the Load runs it no more; its row admits another) and keeps its
 * blocks; resumed, it goes on to its last token, the stream exactly the
 * engine's; past the paused budget (pause_slots 2 here) the oldest paused
 * request ends CANCELED. */
static void
test_pause(env_t *t)
{
    enum { PAUSE_TOKENS = 500 };   /* three fit the KV with room to spare */
    int32_t p[10], got[PAUSE_TOKENS], want[PAUSE_TOKENS];
    fk_p_t fp;
    int fin;
    const char *err;
    td_drank_stats_t st;

    fk_prompt(p, 10, 21);
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    for (uint64_t id = 1301; id <= 1303; id++) {
        const Tandem__KvDest *d = admit(t, id, p, 10, PAUSE_TOKENS, 0);
        if (d == NULL)
            return;
        fk_p_push(&fp, t->e, d, id, p, 10, PAUSE_TOKENS, 1, 0);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, id, 5000));
    }
    pause_msg(t, 1301, 1);
    pause_msg(t, 1302, 1);
    fk_run_until(t->base, fk_never, NULL, 50);
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.paused_now, 2);
    CHECK(st.paused_bytes > 0);
    CHECK(t->rt->load.paused == 2 && t->rt->load.running == 1);
    size_t n1 = fk_router_tokens(t->rt, 1301, got, PAUSE_TOKENS, &fin, &err);
    fk_run_until(t->base, fk_never, NULL, 100);
    CHECK_EQ_INT(fk_router_tokens(t->rt, 1301, got, PAUSE_TOKENS, &fin, &err), n1);   /* paused */
    pause_msg(t, 1303, 1);   /* a third: the oldest paused (1301) ends */
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 1301, 2000));
    fk_router_tokens(t->rt, 1301, got, PAUSE_TOKENS, &fin, &err);
    CHECK(fin == TANDEM__FINISH__FINISH_CANCELED && err != NULL && strstr(err, "paused") != NULL);
    pause_msg(t, 1302, 0);   /* resumed: on to its end, exactly */
    pause_msg(t, 1303, 0);
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 1302, 20000));
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 1303, 20000));
    for (uint64_t id = 1302; id <= 1303; id++) {
        size_t n = fk_router_tokens(t->rt, id, got, PAUSE_TOKENS, &fin, &err);
        CHECK(n == PAUSE_TOKENS && fk_expect(t->e, p, 10, PAUSE_TOKENS, want) == PAUSE_TOKENS &&
              memcmp(got, want, n * sizeof(*got)) == 0);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);
    }
    td_drank_stats(t->rk, &st);
    CHECK(st.paused_now == 0 && st.pause_evicted >= 1 && st.resumed >= 2);
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* ---- Peer input that does not fit the request's state --------------------------- */

static void
raw_done(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg)
{
    (*(int *)arg)--;
}

/* A transfer the xfer engine refuses (a block outside the pool): the rank
 * gets a failure note for xfer_id. */
static void
post_refused(fk_p_t *fp, const Tandem__KvDest *dest)
{
    uint8_t byte = 0;
    td_xfer_desc_t d = { .src = &byte, .pool_id = 0, .block = UINT32_MAX, .len = 1 };
    CHECK(td_xfer_post(fp->peer, dest->xfer_id, fk_dest_token(dest), &d, 1, NULL, 0,
                       DEADLINE_MS, raw_done, NULL) != TD_OK);
}

/* A terminal note whose payload is not a KvNote. */
static void
post_garbage(env_t *t, fk_p_t *fp, const Tandem__KvDest *dest)
{
    static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f };
    int inflight = 1;
    CHECK_STATUS(td_xfer_post(fp->peer, dest->xfer_id, fk_dest_token(dest), NULL, 0, junk,
                              sizeof(junk), DEADLINE_MS, raw_done, &inflight), TD_OK);
    uint64_t end = td_testutil_now_ms() + 2000;
    while (inflight > 0 && td_testutil_now_ms() < end)
        event_base_loop(t->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static const char *
end_error(env_t *t, uint64_t id, int *fin)
{
    static int32_t got[KV_TOKENS];
    const char *err = NULL;
    fk_router_tokens(t->rt, id, got, KV_TOKENS, fin, &err);
    return err != NULL ? err : "";
}

/* Notes the rank's UCX worker received and the transfers fp posted (each
 * ends in one note, a refused one too). */
static uint64_t
notes_in(env_t *t)
{
    td_xfer_stats_t xs;
    td_xfer_stats(t->x, &xs);
    return xs.notes_received;
}

static uint64_t
notes_out(fk_p_t *fp)
{
    td_xfer_stats_t xs;
    td_xfer_stats(fp->x, &xs);
    return xs.posted + xs.rejected;
}

/* Run the loop until the rank has received every note fp sent since
 * (in0, out0). */
static void
wait_notes(env_t *t, fk_p_t *fp, uint64_t in0, uint64_t out0)
{
    uint64_t end = td_testutil_now_ms() + 5000;
    while (notes_in(t) - in0 < notes_out(fp) - out0 && td_testutil_now_ms() < end)
        event_base_loop(t->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    CHECK_EQ_INT(notes_in(t) - in0, notes_out(fp) - out0);
}

/* Every note and message a peer can send, in a state where it does not fit:
 * each is dropped or ends the request through a legal transition (an illegal
 * one aborts the process, so reaching the end is the check), and the blocks
 * come back. */
static void
test_unfit_input(env_t *t)
{
    int32_t p[16];
    fk_prompt(p, 16, 11);
    fk_p_t fp;
    int fin = 0;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    td_drank_stats_t st0, st;
    td_drank_stats(t->rk, &st0);

    /* RUNNING: a second terminal note and a failure note are dropped (its KV
     * is in), the stream goes on; Cancel ends it; a second Cancel and a
     * note after the release find nothing. */
    const Tandem__KvDest *d = admit(t, 801, p, 16, LONG_TOKENS, 0);
    if (d != NULL) {
        Tandem__KvDest *dest = (Tandem__KvDest *)d;
        fk_p_push(&fp, t->e, dest, 801, p, 16, LONG_TOKENS, 1, 0);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 801, 5000));
        uint64_t in0 = notes_in(t), out0 = notes_out(&fp);
        fk_p_push(&fp, t->e, dest, 801, p, 16, LONG_TOKENS, 1, 0);
        post_refused(&fp, dest);
        wait_notes(t, &fp, in0, out0);
        td_drank_stats(t->rk, &st);
        CHECK_EQ_INT(st.running, 1);
        CHECK_EQ_INT(st.failed, st0.failed);
        admit(t, 801, p, 16, 10, TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_INVALID);
        cancel(t, 801);
        /* released as soon as the step it may be in comes back */
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 801, 5000));
        end_error(t, 801, &fin);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_CANCELED);
        cancel(t, 801);
        fk_p_push(&fp, t->e, dest, 801, p, 16, LONG_TOKENS, 1, 1);
        fk_run_until(t->base, fk_never, NULL, 50);
        CHECK_EQ_INT(blocks_used(t), 0);
    }

    /* ADMITTED: a note naming another request, a malformed note: FAILED. */
    d = admit(t, 802, p, 16, 10, 0);
    if (d != NULL) {
        fk_p_push(&fp, t->e, d, 999, p, 16, 10, 1, 0);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 802, 5000));
        CHECK(strstr(end_error(t, 802, &fin), "names request") != NULL);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_ERROR);
    }
    d = admit(t, 803, p, 16, 10, 0);
    if (d != NULL) {
        post_garbage(t, &fp, d);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 803, 5000));
        CHECK(strstr(end_error(t, 803, &fin), "malformed") != NULL);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_ERROR);
    }

    /* ADMITTED, then FAILED by a failed transfer: a second failure note and
     * a Cancel change nothing; P's canceled note frees the blocks; one more
     * terminal note is for no live request. */
    d = admit(t, 804, p, 16, 10, 0);
    if (d != NULL) {
        Tandem__KvDest *dest = (Tandem__KvDest *)d;
        post_refused(&fp, dest);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 804, 5000));
        CHECK(strstr(end_error(t, 804, &fin), "transfer") != NULL);
        post_refused(&fp, dest);
        cancel(t, 804);
        fk_run_until(t->base, fk_never, NULL, 50);
        CHECK(blocks_used(t) > 0);
        CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 804) == NULL);
        fk_p_push(&fp, t->e, dest, 804, p, 16, 10, 1, 1);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 804, 5000));
        td_xfer_stats_t xs0, xs;
        td_xfer_stats(t->x, &xs0);
        fk_p_push(&fp, t->e, dest, 804, p, 16, 10, 1, 0);
        fk_run_until(t->base, fk_never, NULL, 100);
        td_xfer_stats(t->x, &xs);   /* its transfer id and token died with it */
        CHECK(xs.notes_forged > xs0.notes_forged);
    }
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_run_until(t->base, fk_never, NULL, 20);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* ---- KV notes: matched on (transfer id, sender incarnation) --------------------- */

/* Another incarnation of the prefill (here: a process that knows the
 * transfer id) pushes the request's KV, a failure note and a canceled
 * terminal note: every note is dropped and counted, the request waits as
 * if nothing came; then the prefill its Admit named serves it. */
static void
test_sender_incarnation(env_t *t)
{
    int32_t p[18], got[16], want[16];
    fk_prompt(p, 18, 13);
    fk_p_t fp, other;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    CHECK_STATUS(fk_p_create_inc(t->base, &t->reg, D_INC, P_INC + 2, t->e->layout, &other),
                 TD_OK);
    const Tandem__KvDest *d = admit(t, 901, p, 18, 10, 0);
    if (d != NULL) {
        td_drank_stats_t st0, st;
        td_drank_stats(t->rk, &st0);
        uint64_t in0 = notes_in(t), out0 = notes_out(&other);
        fk_p_push(&other, t->e, d, 901, p, 18, 10, 0, 0);
        post_refused(&other, d);
        fk_p_push(&other, t->e, d, 901, p, 18, 10, 1, 1);
        wait_notes(t, &other, in0, out0);
        td_drank_stats(t->rk, &st);
        CHECK(notes_out(&other) - out0 > 2);
        CHECK_EQ_INT(st.notes_stale - st0.notes_stale, notes_out(&other) - out0);
        CHECK_EQ_INT(st.waiting, 1);
        CHECK_EQ_INT(st.failed + st.canceled, st0.failed + st0.canceled);
        CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 901) == NULL);
        CHECK(blocks_used(t) > 0);

        fk_p_push(&fp, t->e, d, 901, p, 18, 10, 1, 0);
        CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 901, 5000));
        int fin;
        const char *err;
        size_t n = fk_router_tokens(t->rt, 901, got, 16, &fin, &err);
        CHECK(n == 10 && fk_expect(t->e, p, 18, 10, want) == 10 &&
              memcmp(got, want, sizeof(int32_t) * 10) == 0);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);
        td_drank_stats(t->rk, &st0);
        CHECK_EQ_INT(st0.notes_stale, st.notes_stale);   /* P's own notes all counted */
    }
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_run_until(t->base, fk_never, NULL, 20);
    fk_p_destroy(&other);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* Transfer ids are random: never 0, distinct, and nowhere near each other
 * (a counter's would differ by 1). */
static void
test_xfer_ids(env_t *t)
{
    int32_t p[8];
    uint64_t ids[3 * MAX_BATCH];
    size_t n = 0;
    fk_prompt(p, 8, 14);
    for (int round = 0; round < 3; round++) {
        for (uint64_t k = 0; k < MAX_BATCH; k++) {
            uint64_t id = 1000 + (uint64_t)round * MAX_BATCH + k;
            const Tandem__KvDest *d = admit(t, id, p, 8, 4, 0);
            if (d != NULL)
                ids[n++] = d->xfer_id;
        }
        for (uint64_t k = 0; k < MAX_BATCH; k++)
            cancel_from(t, t->rt, 1000 + (uint64_t)round * MAX_BATCH + k, 1);
        fk_router_clear(t->rt);
    }
    CHECK_EQ_INT(n, 3 * MAX_BATCH);
    for (size_t i = 0; i < n; i++) {
        CHECK(ids[i] != 0);
        for (size_t j = 0; j < i; j++) {
            uint64_t gap = ids[i] > ids[j] ? ids[i] - ids[j] : ids[j] - ids[i];
            CHECK(gap > (1ull << 32));
        }
    }
    CHECK_EQ_INT(blocks_used(t), 0);
}

/* ---- The forked prefill: SIGKILLed mid-transfer --------------------------------- */


/* Child: receive Register (the rank's address and pools) and Prefill (prompt
 * + dest), push the data without the terminal note, say so, then wait to die. */
static int
child_main(int fd)
{
    Tandem__Envelope *reg = fk_env_recv(fd), *pre = fk_env_recv(fd);
    struct event_base *base = event_base_new();
    td_engine_t *e = fk_engine();
    fk_p_t fp;
    if (!reg || !pre || !base || !e ||
        fk_p_create(base, reg->register_, D_INC, e->layout, &fp) != TD_OK)
        _exit(3);
    fk_p_push(&fp, e, pre->prefill->dest, pre->prefill->req_id, pre->prefill->tokens,
            pre->prefill->n_tokens, 10, 0, 0);
    while (fp.inflight > 0)
        event_base_loop(base, EVLOOP_ONCE);
    uint8_t ok = 1;
    (void)td_testutil_io_full(fd, &ok, 1, 1);
    for (;;)
        event_base_loop(base, EVLOOP_ONCE);
}

static void
test_prefill_killed(env_t *t, pid_t child, int fd)
{
    int32_t p[25];
    fk_prompt(p, 25, 6);
    const Tandem__KvDest *d = admit(t, 501, p, 25, 10, 0);
    if (d == NULL)
        return;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_REGISTER;
    env.register_ = &t->reg;
    CHECK(fk_env_send(fd, &env) == 0);
    Tandem__Prefill pre = TANDEM__PREFILL__INIT;
    pre.req_id = 501;
    pre.n_tokens = 25;
    pre.tokens = p;
    pre.dest = (Tandem__KvDest *)d;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL;
    env.prefill = &pre;
    CHECK(fk_env_send(fd, &env) == 0);
    uint8_t ok = 0;
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    uint64_t end = td_testutil_now_ms() + 10000;
    while (poll(&pfd, 1, 0) == 0 && td_testutil_now_ms() < end)
        event_base_loop(t->base, EVLOOP_ONCE);   /* the notes of its transfers land */
    CHECK(td_testutil_io_full(fd, &ok, 1, 0) == 0 && ok == 1);

    /* The router learns P is gone and cancels; D waits for the grace period. */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    uint64_t t0 = td_testutil_now_ms();
    cancel(t, 501);
    CHECK(blocks_used(t) > 0);
    fk_run_until(t->base, fk_never, NULL, DEADLINE_MS);
    CHECK(blocks_used(t) > 0);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 501) == NULL);
    /* after the grace period: quarantined (a Fence, no Released), held until
     * the router says that prefill is gone */
    CHECK(fk_run_until(t->base, quarantined, t, 5000));
    uint64_t waited = td_testutil_now_ms() - t0;
    if (waited + 10 < GRACE_MS)   /* libevent's clock is coarse (~4 ms) */
        fprintf(stderr, "blocks quarantined after %llu ms\n", (unsigned long long)waited);
    CHECK(waited + 10 >= GRACE_MS);
    fk_run_until(t->base, fk_never, NULL, 300);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 501) == NULL);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_FENCE, d->xfer_id) != NULL);
    CHECK(answer_fences(t, true, 100) == 1);
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 501, 1000));
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_router_clear(t->rt);
}

/* The router goes: its requests end, blocks wait for P (here: its note). */
static void
test_router_down(env_t *t)
{
    int32_t p[12];
    fk_prompt(p, 12, 7);
    fk_p_t fp;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    const Tandem__KvDest *d = admit(t, 601, p, 12, 5, 0);
    if (d != NULL) {
        Tandem__KvDest *dest = (Tandem__KvDest *)d;
        td_drank_on_router_down(t->rk, t->rt);
        size_t before = t->rt->n;
        CHECK(blocks_used(t) > 0);
        fk_p_push(&fp, t->e, dest, 601, p, 12, 5, 1, 1);
        fk_run_until(t->base, fk_never, NULL, 100);
        CHECK_EQ_INT(blocks_used(t), 0);
        CHECK_EQ_INT(t->rt->n, before);   /* nothing more sent to a gone router */
    }
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* Requests are known by (router, id): another router's Cancel or Admit with
 * the same id is its own. A Cancel saying no Prefill was sent frees at once;
 * a note that comes after that is counted as for an unknown transfer. */
static void
test_router_match(env_t *t)
{
    static fk_router_t rt2;
    int32_t p[12];
    fk_prompt(p, 12, 9);
    fk_p_t fp;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    const Tandem__KvDest *d = admit(t, 701, p, 12, 5, 0);
    uint64_t used = blocks_used(t);
    cancel_from(t, &rt2, 701, 1);   /* not rt2's request: ignored */
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, 701) == NULL);
    CHECK_EQ_INT(blocks_used(t), used);
    fk_admit_t adm;                 /* the same id from rt2: a request of its own */
    fk_admit_init(&adm, 701, p, 12, 5);
    td_drank_on_message(t->rk, &rt2, &adm.env);
    CHECK(fk_router_find(&rt2, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, 701) != NULL);
    CHECK(blocks_used(t) > used);
    cancel_from(t, t->rt, 701, 1);  /* no Prefill was sent: freed at once */
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 701) != NULL);
    CHECK(fk_router_find(&rt2, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 701) == NULL);
    cancel_from(t, &rt2, 701, 0);   /* Prefill may have been sent: grace period */
    CHECK(blocks_used(t) > 0);
    CHECK(fk_router_find(&rt2, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 701) == NULL);
    if (d != NULL) {                /* a (misbehaving) late writer of the freed request */
        Tandem__KvDest *dest = (Tandem__KvDest *)d;
        td_xfer_stats_t xs0, xs;
        td_xfer_stats(t->x, &xs0);
        fk_p_push(&fp, t->e, dest, 701, p, 12, 5, 1, 1);
        fk_run_until(t->base, fk_never, NULL, 100);
        td_xfer_stats(t->x, &xs);   /* dropped unparsed: no live transfer has its token */
        CHECK(xs.notes_forged > xs0.notes_forged);
    }
    CHECK(answer_fences(t, false, GRACE_MS + 2000) == 1);
    CHECK(fk_wait_msg(t->base, &rt2, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 701, 1000));
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_p_destroy(&fp);
    fk_router_clear(&rt2);
    fk_router_clear(t->rt);
}

/* The last Tokens message of request id (NULL: none). */
static const Tandem__Tokens *
last_tokens(const fk_router_t *rt, uint64_t id)
{
    const Tandem__Tokens *last = NULL;

    for (size_t i = 0; i < rt->n; i++)
        if (rt->msgs[i]->payload_case == TANDEM__ENVELOPE__PAYLOAD_TOKENS &&
            rt->msgs[i]->tokens->req_id == id)
            last = rt->msgs[i]->tokens;
    return last;
}

/* Whether request *id's last Tokens carries its finish. */
typedef struct {
    env_t *t;
    uint64_t id;
} finished_t;

static int
finished(void *arg)
{
    const finished_t *f = arg;
    const Tandem__Tokens *lt = last_tokens(f->t->rt, f->id);

    return lt != NULL && lt->finish != TANDEM__FINISH__FINISH_NONE;
}

/* Run until request id's finish has come (at most 5 s: a loaded machine),
 * then 50 ms more, for anything that would follow it. */
static void
run_to_finish(env_t *t, uint64_t id)
{
    finished_t f = { t, id };

    CHECK(fk_run_until(t->base, finished, &f, 5000));
    CHECK(fk_run_until(t->base, (fk_pred_fn)fk_never, NULL, 50) == 0);
}

/* Whether a Forget named id. */
static int
forgot(const fk_router_t *rt, uint64_t id)
{
    for (size_t i = 0; i < rt->n; i++)
        if (rt->msgs[i]->payload_case == TANDEM__ENVELOPE__PAYLOAD_FORGET)
            for (size_t j = 0; j < rt->msgs[i]->forget->n_req_ids; j++)
                if (rt->msgs[i]->forget->req_ids[j] == id)
                    return 1;
    return 0;
}

/* An Admit that continues kept state `from` of `kept` tokens. */
static void
admit_continue(env_t *t, uint64_t id, const int32_t *prompt, size_t n, uint32_t max_tokens,
               uint64_t from, uint64_t kept)
{
    fk_admit_t adm;
    fk_admit_init(&adm, id, prompt, n, max_tokens);
    adm.a.continue_from = from;
    adm.a.continue_tokens = kept;
    adm.a.prefill_incarnation = 0;
    td_drank_on_message(t->rk, t->rt, &adm.env);
}

static int
reject_code(env_t *t, uint64_t id)
{
    const Tandem__Envelope *rej = fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, id);
    return rej != NULL ? (int)rej->admit_reject->code : -1;
}

/* --retain 2: a finished request's state is kept (retained_tokens, no
 * Released), a next turn continues it here (AdmitOk without KvDest, the
 * tokens the engine gives the whole prompt), prompts that do not continue it
 * and unknown ids are NOT_KEPT, the oldest of three kept states goes
 * (Forget), a drain drops the rest and frees every block. */
static void
test_keep(env_t *t)
{
    int32_t p[64], got[64], want[64], q[64];
    int fin;
    const char *err;
    fk_prompt(p, 20, 11);
    fk_p_t fp;
    CHECK_STATUS(fk_p_create(t->base, &t->reg, D_INC, t->e->layout, &fp), TD_OK);
    const Tandem__KvDest *d = admit(t, 801, p, 20, 5, 0);
    if (d == NULL)
        goto out;
    fk_p_push(&fp, t->e, d, 801, p, 20, 5, 1, 0);
    run_to_finish(t, 801);
    size_t n = fk_router_tokens(t->rt, 801, got, 64, &fin, &err);
    CHECK(n == 5 && fk_expect(t->e, p, 20, 5, want) == 5 && memcmp(got, want, 5 * 4) == 0);
    const Tandem__Tokens *lt = last_tokens(t->rt, 801);
    CHECK(lt != NULL && lt->finish == TANDEM__FINISH__FINISH_LENGTH && lt->retained_tokens == 24);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 801) == NULL);
    CHECK(blocks_used(t) > 0);
    td_drank_stats_t st;
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.kept_now, 1);

    /* the next prompt: the kept 24 tokens, the last reply token, 3 new */
    memcpy(q, p, 20 * 4);
    memcpy(q + 20, got, 5 * 4);
    q[25] = 7, q[26] = 8, q[27] = 9;
    admit_continue(t, 802, q, 28, 4, 999, 24);            /* unknown id */
    CHECK_EQ_INT(reject_code(t, 802), TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NOT_KEPT);
    admit_continue(t, 803, q, 28, 4, 801, 23);            /* the wrong length */
    CHECK_EQ_INT(reject_code(t, 803), TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NOT_KEPT);
    q[10] ^= 1;                                           /* another conversation */
    admit_continue(t, 804, q, 28, 4, 801, 24);
    CHECK_EQ_INT(reject_code(t, 804), TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NOT_KEPT);
    q[10] ^= 1;
    admit_continue(t, 805, q, 24, 4, 801, 24);            /* nothing new */
    CHECK_EQ_INT(reject_code(t, 805), TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NOT_KEPT);
    admit_continue(t, 806, q, 28, 4, 801, 24);            /* the real one */
    const Tandem__Envelope *ok = fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, 806);
    CHECK(ok != NULL && ok->admit_ok->dest == NULL);
    run_to_finish(t, 806);
    n = fk_router_tokens(t->rt, 806, got, 64, &fin, &err);
    CHECK(n == 4 && fk_expect(t->e, q, 28, 4, want) == 4 && memcmp(got, want, 4 * 4) == 0);
    lt = last_tokens(t->rt, 806);
    CHECK(lt != NULL && lt->retained_tokens == 31);
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.continued, 1);
    CHECK_EQ_INT(st.continue_tokens, 4);
    CHECK_EQ_INT(st.kept_now, 1);   /* 801's state became 806's */

    /* two more finish: the oldest (806) goes, Forget says so */
    for (uint64_t id = 807; id <= 808; id++) {
        fk_prompt(p, 9, (int32_t)id);
        d = admit(t, id, p, 9, 3, 0);
        if (d != NULL)
            fk_p_push(&fp, t->e, d, id, p, 9, 3, 1, 0);
        run_to_finish(t, id);
    }
    CHECK(forgot(t->rt, 806) && !forgot(t->rt, 807) && !forgot(t->rt, 808));
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.kept_now, 2);
    /* a drain drops them all */
    drain(t, 1);
    CHECK(forgot(t->rt, 807) && forgot(t->rt, 808));
    CHECK_EQ_INT(blocks_used(t), 0);
    drain(t, 0);
out:
    fk_run_until(t->base, fk_never, NULL, 50);
    fk_p_destroy(&fp);
    fk_router_clear(t->rt);
}

/* Two quarantined requests of the same prefill incarnation on two prefill
 * ranks (node, rank): one Fence each, naming its own rank and transfers.
 * A rank's Fenced frees its own transfers only, even when it names the
 * other's (every rank of a prefilld shares the process's incarnation, and
 * a rank knows nothing of its sibling's transfers). */
static uint64_t
admit_prefill(env_t *t, uint64_t id, const int32_t *p, size_t n, const char *node, uint32_t rank)
{
    fk_admit_t adm;

    fk_admit_init(&adm, id, p, n, 10);
    adm.a.prefill_node = (char *)node;
    adm.a.prefill_rank = rank;
    td_drank_on_message(t->rk, t->rt, &adm.env);
    const Tandem__Envelope *ok = fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, id);
    CHECK(ok != NULL);
    return ok != NULL ? ok->admit_ok->dest->xfer_id : 0;
}

static int
quarantined_two(void *arg)
{
    td_drank_stats_t st;

    td_drank_stats(((env_t *)arg)->rk, &st);
    return st.quarantined_now == 2;
}

static void
fenced_from(env_t *t, const char *node, uint32_t rank, const uint64_t *ids, size_t n)
{
    Tandem__Fenced fd = TANDEM__FENCED__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    fd.prefill_node = (char *)node;
    fd.prefill_rank = rank;
    fd.prefill_incarnation = P_INC;
    fd.decode_node = "dec-test";
    fd.decode_rank = 0;
    fd.decode_incarnation = D_INC;
    fd.n_xfer_ids = n;
    fd.xfer_ids = (uint64_t *)ids;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCED;
    env.fenced = &fd;
    td_drank_on_message(t->rk, t->rt, &env);
}

static void
fence_per_rank(env_t *t, uint64_t id0, const char *na, uint32_t ra, const char *nb, uint32_t rb)
{
    int32_t p[8];
    uint64_t x[2];
    td_drank_stats_t st;

    fk_prompt(p, 8, 17);
    x[0] = admit_prefill(t, id0, p, 8, na, ra);
    x[1] = admit_prefill(t, id0 + 1, p, 8, nb, rb);
    cancel(t, id0);   /* no terminal note from either: both quarantined */
    cancel(t, id0 + 1);
    CHECK(fk_run_until(t->base, quarantined_two, t, GRACE_MS + 2000));
    fk_run_until(t->base, fk_never, NULL, 20);
    for (int k = 0; k < 2; k++) {   /* a Fence of its own rank, its transfer alone */
        const Tandem__Envelope *e = fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_FENCE, x[k]);
        CHECK(e != NULL);
        if (e == NULL)
            continue;
        CHECK_EQ_INT(e->fence->n_xfer_ids, 1);
        CHECK_EQ_INT(e->fence->prefill_rank, (k == 0 ? ra : rb));
        CHECK(strcmp(e->fence->prefill_node, k == 0 ? na : nb) == 0);
        CHECK_EQ_INT(e->fence->prefill_incarnation, P_INC);
    }
    fenced_from(t, na, ra, x, 2);   /* the first rank's answer, naming both */
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, id0, 1000));
    fk_run_until(t->base, fk_never, NULL, 20);
    CHECK(fk_router_find(t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, id0 + 1) == NULL);
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.quarantined_now, 1);
    fenced_from(t, nb, rb, &x[1], 1);   /* the second rank's own */
    CHECK(fk_wait_msg(t->base, t->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, id0 + 1, 1000));
    td_drank_stats(t->rk, &st);
    CHECK_EQ_INT(st.quarantined_now, 0);
    CHECK_EQ_INT(blocks_used(t), 0);
    fk_router_clear(t->rt);
}

static void
test_fence_per_rank(env_t *t)
{
    fence_per_rank(t, 1401, "fake-p", 0, "fake-p", 1);   /* two ranks of one process */
    fence_per_rank(t, 1411, "fake-p", 0, "fake-q", 0);   /* rank 0 of two nodes */
}

int
main(void)
{
    int sv[2];
    signal(SIGPIPE, SIG_IGN);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 1;
    pid_t child = fork();   /* before any UCX state exists in this process */
    if (child == 0) {
        close(sv[0]);
        return child_main(sv[1]);
    }
    close(sv[1]);

    static fk_router_t rt;
    env_t t = { .rt = &rt };
    t.base = event_base_new();
    t.e = fk_engine();
    struct event *tk = event_new(t.base, -1, EV_PERSIST, fk_tick, NULL);
    struct timeval tv = { 0, 10000 };
    event_add(tk, &tv);
    td_xfer_config_t xc = { .incarnation = D_INC, .transports = TLS };
    td_drank_config_t rc = { .node_id = "dec-test", .rank_id = 0, .kv_tokens = KV_TOKENS,
                             .max_batch = MAX_BATCH, .xfer_deadline_ms = DEADLINE_MS,
                             .prefill_deadline_max_ms = DEADLINE_MS,
                             .quarantine_slots = 2, .quarantine_max_tokens = 600,
                             .grace_margin_ms = GRACE_MARGIN_MS };
    td_drank_io_t io = { fk_router_send, fk_router_load, &rt, NULL, fk_router_broadcast };
    CHECK(t.e != NULL);
    if (t.e != NULL)
        CHECK_STATUS(td_xfer_create(t.base, &xc, &t.x), TD_OK);
    if (t.x != NULL)
        CHECK_STATUS(td_drank_create(t.base, t.x, t.e, &rc, &io, &t.rk), TD_OK);
    if (t.rk != NULL) {
        tandem__register__init(&t.reg);
        td_drank_register_fill(t.rk, &t.reg);
        CHECK_EQ_INT(t.reg.n_pools, t.e->layout->nsegs);
        CHECK_EQ_INT(t.reg.kv_tokens_total, KV_TOKENS);
        td_drank_load(t.rk);
        CHECK(rt.loads == 1 && rt.load.kv_blocks_used == 0 && rt.load.kv_tokens_free > 0);
        test_stream(&t);
        test_rejects(&t);
        test_corrupt(&t);
        test_cancel(&t);
        test_deadline_clamp(&t);
        test_quarantine(&t);
        test_fence_per_rank(&t);
        test_unfit_input(&t);
        test_sender_incarnation(&t);
        test_xfer_ids(&t);
        test_prefill_killed(&t, child, sv[0]);
        test_router_down(&t);
        test_router_match(&t);
        td_drank_destroy(t.rk);
        /* the same rank keeping finished states */
        rc.retain = 2;
        t.rk = NULL;
        CHECK_STATUS(td_drank_create(t.base, t.x, t.e, &rc, &io, &t.rk), TD_OK);
        if (t.rk != NULL) {
            tandem__register__init(&t.reg);
            td_drank_register_fill(t.rk, &t.reg);
            test_keep(&t);
            td_drank_destroy(t.rk);
        }
        /* the same rank stepping every 2 ms, with 2 paused slots */
        rc.retain = 0;
        rc.step_gap_us = 2000;
        rc.pause_slots = 2;
        rc.pause_max_bytes = 1u << 30;
        t.rk = NULL;
        CHECK_STATUS(td_drank_create(t.base, t.x, t.e, &rc, &io, &t.rk), TD_OK);
        if (t.rk != NULL) {
            tandem__register__init(&t.reg);
            td_drank_register_fill(t.rk, &t.reg);
            test_pause(&t);
            td_drank_destroy(t.rk);
        }
    } else {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    td_xfer_destroy(t.x);
    close(sv[0]);
    event_free(tk);
    td_engine_destroy(t.e);
    event_base_free(t.base);
    fk_router_clear(&rt);
    libevent_global_shutdown();
    td_check_failures += fk_failures;
    return td_check_exit("decoded-rank");
}
