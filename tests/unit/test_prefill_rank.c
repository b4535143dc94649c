/* tests/unit/test_prefill_rank.c — one prefill rank (prefilld/prank.c) against a
 * fake decode rank in the same process: a td_xfer receiver with one pool per
 * KV segment whose every received byte is checked with td_synth_kv_verify;
 * interleaved requests, cancel (queued, running), a bad KvDest, a decode rank
 * gone mid-transfer, router loss, a full queue and stop; the prefix cache
 * (prefilld/pcache.c): hits that share pool blocks, rebuild the fixed state
 * and put exactly the KV a cold prefill gives. Also prefilld/kvmap.c. */
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include "check.h"
#include "testtoken.h"
#include "kvmem.h"
#include "logcap.h"
#include "testutil.h"
#include "engine.h"
#include "registry.h"
#include "kvmap.h"
#include "kvsum.h"
#include "prank.h"
#include "synthetic.h"
#include "xfer.h"

static const td_engine_kind_t *const test_engines[] = { &td_synth_kind, NULL };

#define MAX_REQS 8
#define MAX_SEGS 16
#define MAX_BLOCKS 128
#define POOL_BLOCKS 256
#define ROUTER_A ((void *)0xa)
#define ROUTER_B ((void *)0xb)

typedef struct {
    int terminal;           /* notes with a KvNote payload */
    int sum_ok;             /* its kv_sum equals the checksum over the received blocks */
    int fail_notes;         /* notes without payload and status != OK */
    int canceled;
    int has_reason;
    int verified;           /* KV checked byte for byte, first token right */
    int32_t first_token;
    int done;               /* PrefillDone received */
    td_status_t done_status;
    int32_t done_token;
    uint64_t done_cached, done_computed;
    int done_order;
    void *router;
} req_t;

typedef struct {
    struct event_base *base;
    td_engine_t *engine;      /* the rank's */
    td_engine_t *check;       /* the fake decode rank's, same config */
    td_xfer_t *snd, *rcv;
    td_xfer_pool_t **pools;   /* [nsegs] */
    uint64_t *next_block;     /* [nsegs] */
    td_prank_t *rk;
    req_t reqs[MAX_REQS];
    int32_t *prompts[MAX_REQS];
    size_t lens[MAX_REQS];
    Tandem__SegDest segs[MAX_REQS][MAX_SEGS];
    uint64_t blocks[MAX_REQS][MAX_SEGS][MAX_BLOCKS];
    int ndone;
    int idle;
    int fenced;               /* Fenced broadcasts */
    size_t fenced_ids;        /*   the transfers the last one named */
    int fenced_after_note;    /*   request 0's terminal note had come before it */
    struct event_base *rcv_base;  /* the receiver's loop: e->base, or one never run */
} env_t;

/* The engines' shape (both sides); test_fail_between_chunks changes it. */
static struct {
    uint32_t layers;
    const char *sources;
    double prefill_us;
} engine_shape = { 4, "1:2,3:1", 0 };

/* The rank's prefix cache (max_blocks 0: none); test_cache sets it. */
static td_pcache_config_t env_cache;

static void
run_until(env_t *e, const int *flag, int want, int timeout_ms)
{
    uint64_t until = td_testutil_now_ms() + (uint64_t)timeout_ms;
    while (*flag < want && td_testutil_now_ms() < until)
        event_base_loop(e->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static void
run_for(env_t *e, int ms)
{
    int never = 0;
    run_until(e, &never, 1, ms);
}

static td_status_t
ignore_layer(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *p, size_t n,
             void *arg)
{
    return TD_OK;
}

/* The fake decode rank's check of a request's KV: every segment, every byte. */
static int
verify_req(env_t *e, int i)
{
    const td_layout_t *l = e->check->layout;
    td_sample_params_t sp = td_sample_params_greedy();
    td_engine_req_t *req;
    td_kvmem_t *kv = NULL;
    if (td_kvmem_create(l, e->lens[i], 0, &kv) != TD_OK ||
        td_engine_req_create(e->check, &sp, &kv->kv, &req) != TD_OK) {
        td_kvmem_destroy(kv);
        return 0;
    }
    int ok = td_engine_prefill(req, e->prompts[i], e->lens[i], 1, ignore_layer, NULL) == TD_OK;
    for (uint32_t s = 0; ok && s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        const uint8_t *base = td_xfer_pool_base(e->pools[s]);
        size_t bs = td_xfer_pool_block_size(e->pools[s]);
        uint64_t bad;
        if (seg->kind == TD_LAYOUT_FIXED) {
            ok = td_synth_kv_verify(req, s, 0, seg->entries, base + e->blocks[i][s][0] * bs,
                                    &bad) == TD_OK;
            continue;
        }
        uint64_t n = td_layout_entries(seg, e->lens[i]);
        for (uint64_t first = 0; ok && first < n; first += l->block_entries) {
            uint64_t cnt = n - first < l->block_entries ? n - first : l->block_entries;
            const uint8_t *blk = base + e->blocks[i][s][first / l->block_entries] * bs;
            ok = td_synth_kv_verify(req, s, first, cnt, blk, &bad) == TD_OK;
        }
    }
    int32_t tok;
    td_sample_finish_t fin;
    ok = ok && td_engine_sample(req, &tok, &fin) == TD_OK && tok == e->reqs[i].first_token;
    td_engine_req_destroy(req);
    td_kvmem_destroy(kv);
    return ok;
}

/* The fake decode rank's checksum of request i's KV, over its pool blocks
 * (engine/kvsum.h), as a decode rank computes it. */
static uint64_t
pool_sum(env_t *e, int i)
{
    const td_layout_t *l = e->check->layout;
    uint64_t nblocks[MAX_SEGS] = { 0 }, sum = 0;
    uint8_t *ptrs[MAX_SEGS][MAX_BLOCKS], *fixed[MAX_SEGS] = { 0 };
    uint8_t *const *segb[MAX_SEGS] = { 0 };
    for (uint32_t s = 0; s < l->nsegs; s++) {
        uint8_t *base = td_xfer_pool_base(e->pools[s]);
        size_t bs = td_xfer_pool_block_size(e->pools[s]);
        if (l->segs[s].kind == TD_LAYOUT_FIXED) {
            fixed[s] = base + e->blocks[i][s][0] * bs;
            continue;
        }
        nblocks[s] = e->segs[i][s].n_blocks;
        for (uint64_t b = 0; b < nblocks[s]; b++)
            ptrs[s][b] = base + e->blocks[i][s][b] * bs;
        segb[s] = ptrs[s];
    }
    td_layout_kv_t kv = { l, nblocks, segb, fixed };
    CHECK_STATUS(td_kvsum_of(&kv, e->lens[i], &sum), TD_OK);
    return sum;
}

static void
on_note(td_xfer_t *x, const td_xfer_note_t *n, void *arg)
{
    env_t *e = arg;
    if (n->payload_len == 0) {
        if (n->status != TD_OK && n->xfer_id < MAX_REQS)
            e->reqs[n->xfer_id].fail_notes++;
        return;
    }
    Tandem__KvNote *kn = tandem__kv_note__unpack(NULL, n->payload_len, n->payload);
    CHECK(kn != NULL);
    if (!kn)
        return;
    CHECK(kn->req_id < MAX_REQS && kn->req_id == n->xfer_id);
    if (kn->req_id < MAX_REQS) {
        req_t *r = &e->reqs[kn->req_id];
        r->terminal++;
        r->canceled = kn->canceled;
        r->has_reason = kn->reason && kn->reason[0];
        r->first_token = kn->first_token;
        if (!r->canceled && !r->has_reason) {
            r->verified = verify_req(e, (int)kn->req_id);
            r->sum_ok = kn->kv_sum == pool_sum(e, (int)kn->req_id);
        } else {
            CHECK(kn->kv_sum == 0);   /* only a success carries a checksum */
        }
    }
    tandem__kv_note__free_unpacked(kn, NULL);
}

/* The rank's only message to a router: PrefillDone. */
static td_status_t
on_send(void *router, const Tandem__Envelope *env, void *arg)
{
    env_t *e = arg;
    CHECK_EQ_INT(env->payload_case, TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE);
    if (env->payload_case != TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE)
        return TD_OK;
    const Tandem__PrefillDone *msg = env->prefill_done;
    CHECK(msg->req_id < MAX_REQS);
    if (msg->req_id >= MAX_REQS)
        return TD_OK;
    req_t *r = &e->reqs[msg->req_id];
    r->done++;
    r->done_status = msg->status;
    r->done_token = msg->first_token;
    r->done_cached = msg->cached_tokens;
    r->done_computed = msg->computed_tokens;
    r->done_order = ++e->ndone;
    CHECK(router == r->router);
    return TD_OK;
}

static void
on_idle(void *arg)
{
    ((env_t *)arg)->idle++;
}

static void
on_broadcast(const Tandem__Envelope *env, void *arg)
{
    env_t *e = arg;

    if (env->payload_case != TANDEM__ENVELOPE__PAYLOAD_FENCED)
        return;
    CHECK(env->fenced->decode_incarnation == 0x2222 && env->fenced->prefill_incarnation == 0x1111);
    e->fenced++;
    e->fenced_ids = env->fenced->n_xfer_ids;
    e->fenced_after_note = e->reqs[0].terminal > 0;
}

static td_status_t
engine_create(td_engine_t **out)
{
    td_engine_config_t c;
    td_status_t st = td_engine_config_defaults(&c);
    if (st != TD_OK)
        return st;
    td_layout_config_t *l = &c.synth.layout;
    free(l->kv_sources);
    l->kv_sources = strdup(engine_shape.sources);
    l->layers = engine_shape.layers;
    c.synth.prefill_us = engine_shape.prefill_us;
    l->kv_entry_bytes = 24;
    l->index_entry_bytes = 8;
    l->window = 8;
    l->window_entry_bytes = 16;
    l->partial_entry_bytes = 32;
    l->block_entries = 4;
    c.synth.vocab = 1000;
    st = td_engine_create(test_engines, &c, out);
    td_engine_config_free(&c);
    return st;
}

static void
decode_peer(env_t *e, int gone)
{
    Tandem__DecodePeer m = TANDEM__DECODE_PEER__INIT;
    void *addr;
    size_t alen;
    uint32_t n = e->check->layout->nsegs;
    ProtobufCBinaryData pools[MAX_SEGS];
    CHECK_STATUS(td_xfer_address(e->rcv, &addr, &alen), TD_OK);
    for (uint32_t s = 0; s < n; s++)
        CHECK_STATUS(td_xfer_pool_export(e->pools[s], (void **)&pools[s].data, &pools[s].len),
                     TD_OK);
    m.node_id = "dec";
    m.rank_id = 0;
    m.incarnation = td_xfer_incarnation(e->rcv);
    m.xfer_address = (ProtobufCBinaryData){ alen, addr };
    m.n_pools = n;
    m.pools = pools;
    m.gone = gone;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER;
    env.decode_peer = &m;
    td_prank_on_message(e->rk, NULL, &env);
    free(addr);
    for (uint32_t s = 0; s < n; s++)
        free(pools[s].data);
}

/* stalled_rcv: the receiver runs on a loop of its own that the test drives
 * (or not), so its notification FIFO can be kept full. */
static int
env_create_ex(env_t *e, uint64_t chunk, uint32_t max_running, uint64_t max_queued,
              uint32_t deadline_ms, int stalled_rcv)
{
    memset(e, 0, sizeof(*e));
    e->base = event_base_new();
    e->rcv_base = stalled_rcv ? event_base_new() : e->base;
    td_xfer_config_t cs = { .incarnation = 0x1111, .transports = "shm,self" };
    td_xfer_config_t cr = { .incarnation = 0x2222, .transports = "shm,self" };
    if (!e->base || !e->rcv_base || engine_create(&e->engine) != TD_OK ||
        engine_create(&e->check) != TD_OK || td_xfer_create(e->base, &cs, &e->snd) != TD_OK ||
        td_xfer_create(e->rcv_base, &cr, &e->rcv) != TD_OK)
        return -1;
    td_xfer_set_note_handler(e->rcv, on_note, e);
    td_xfer_set_note_auth(e->rcv, td_test_token_auth, NULL);
    const td_layout_t *l = e->check->layout;
    e->pools = calloc(l->nsegs, sizeof(*e->pools));
    e->next_block = calloc(l->nsegs, sizeof(*e->next_block));
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        size_t bs = (seg->kind == TD_LAYOUT_FIXED ? seg->entries : l->block_entries) *
                    (size_t)seg->entry_bytes;
        if (td_xfer_pool_create(e->rcv, s, TD_XFER_MEM_HOST, NULL, bs, POOL_BLOCKS,
                                &e->pools[s]) != TD_OK)
            return -1;
    }
    td_prank_config_t rc = { .rank_id = 0, .chunk_tokens = chunk, .max_running = max_running,
                            .max_queued_tokens = max_queued, .deadline_ms = deadline_ms,
                            .kv_tokens = 8192, .cache = env_cache };
    td_prank_io_t io = { on_send, NULL, on_idle, e, on_broadcast };
    if (td_prank_create(e->base, e->snd, e->engine, &rc, &io, &e->rk) != TD_OK)
        return -1;
    decode_peer(e, 0);
    return 0;
}

static int
env_create(env_t *e, uint64_t chunk, uint32_t max_running, uint64_t max_queued)
{
    return env_create_ex(e, chunk, max_running, max_queued, 5000, 0);
}

static void
env_destroy(env_t *e)
{
    td_prank_destroy(e->rk);
    for (int i = 0; i < MAX_REQS; i++)
        free(e->prompts[i]);
    if (e->pools)
        for (uint32_t s = 0; s < e->check->layout->nsegs; s++)
            td_xfer_pool_destroy(e->pools[s]);
    free(e->pools);
    free(e->next_block);
    td_xfer_destroy(e->snd);
    td_xfer_destroy(e->rcv);
    td_engine_destroy(e->engine);
    td_engine_destroy(e->check);
    if (e->rcv_base && e->rcv_base != e->base)
        event_base_free(e->rcv_base);
    event_base_free(e->base);
}

static void
send_prefill(env_t *e, void *router, const Tandem__Prefill *m)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL;
    env.prefill = (Tandem__Prefill *)m;
    td_prank_on_message(e->rk, router, &env);
}

/* Send Prefill for request i with n tokens; blocks allocated as the decode
 * rank would. drop_blocks: give every paged segment one block too few;
 * bad_block: point a paged block outside the pool. */
static void
prefill_tokens(env_t *e, int i, const int32_t *tokens, size_t n, void *router, int drop_blocks,
               int bad_block)
{
    const td_layout_t *l = e->check->layout;
    e->prompts[i] = malloc(n * sizeof(int32_t));
    for (size_t k = 0; k < n; k++)
        e->prompts[i][k] = tokens != NULL ? tokens[k] : (int32_t)((k * 7 + (size_t)i * 13) % 1000);
    e->lens[i] = n;
    e->reqs[i].router = router;
    Tandem__SegDest *sdp[MAX_SEGS];
    CHECK(l->nsegs <= MAX_SEGS && n / l->block_entries < MAX_BLOCKS);
    for (uint32_t s = 0; s < l->nsegs; s++) {
        Tandem__SegDest *sd = &e->segs[i][s];
        tandem__seg_dest__init(sd);
        sd->seg = s;
        sd->pool_id = s;
        uint64_t nb = l->segs[s].kind == TD_LAYOUT_FIXED ? 1 : td_layout_blocks(l, &l->segs[s], n);
        if (drop_blocks && l->segs[s].kind == TD_LAYOUT_PAGED && nb)
            nb--;
        for (uint64_t b = 0; b < nb; b++)
            e->blocks[i][s][b] = e->next_block[s]++ % POOL_BLOCKS;
        if (bad_block && l->segs[s].kind == TD_LAYOUT_PAGED && nb)
            e->blocks[i][s][0] = POOL_BLOCKS + 5;
        sd->n_blocks = nb;
        sd->blocks = e->blocks[i][s];
        sdp[s] = sd;
    }
    Tandem__KvDest d = TANDEM__KV_DEST__INIT;
    d.node_id = "dec";
    d.rank_id = 0;
    d.incarnation = td_xfer_incarnation(e->rcv);
    d.xfer_id = (uint64_t)i;
    td_xfer_token_t tok = td_test_token(d.xfer_id);
    d.xfer_token.data = tok.b;
    d.xfer_token.len = TD_XFER_TOKEN_LEN;
    d.n_segs = l->nsegs;
    d.segs = sdp;
    Tandem__Prefill m = TANDEM__PREFILL__INIT;
    m.req_id = (uint64_t)i;
    m.n_tokens = n;
    m.tokens = e->prompts[i];
    m.dest = &d;
    send_prefill(e, router, &m);
}

static void
prefill(env_t *e, int i, size_t n, void *router, int drop_blocks, int bad_block)
{
    prefill_tokens(e, i, NULL, n, router, drop_blocks, bad_block);
}

static void
cancel(env_t *e, int i, void *router)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    c.req_id = (uint64_t)i;
    c.reason = "test";
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CANCEL;
    env.cancel = &c;
    td_prank_on_message(e->rk, router, &env);
}

static int
all_done(env_t *e, int n)
{
    for (int i = 0; i < n; i++)
        if (!e->reqs[i].done)
            return 0;
    return 1;
}

static void
wait_done(env_t *e, int n)
{
    uint64_t until = td_testutil_now_ms() + 10000;
    while (!all_done(e, n) && td_testutil_now_ms() < until)
        event_base_loop(e->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    run_for(e, 30);   /* a duplicate note would show up now */
}

/* Request i's terminal notes, after waiting (up to 2 s) for the first: the
 * note travels over UCX and may come after PrefillDone was handled. */
static int
notes_of(env_t *e, int i)
{
    run_until(e, &e->reqs[i].terminal, 1, 2000);
    return e->reqs[i].terminal;
}

/* ---- kvmap ------------------------------------------------------------------- */

typedef struct {
    td_kvmap_t *m;
    uint8_t (*mem)[3][4 * 32];   /* [segment][block - 10 * (segment + 1)] */
} stage_t;

/* A layer's pieces staged by the map, then "put": copied where the
 * descriptors say (pool 100 + s, block 10 * (s + 1) + b of test_kvmap). */
static td_status_t
kvmap_stage(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *p, size_t n,
            void *arg)
{
    stage_t *c = arg;
    td_kvmap_batch_t *b;
    char why[256];
    if (n == 0)
        return TD_OK;
    td_kvmap_sum_add(c->m, &req->kv, p, n);   /* as the rank's compute thread does */
    td_status_t st = td_kvmap_batch_create(c->m, &req->kv, p, n, &b, why, sizeof(why));
    CHECK_STATUS(st, TD_OK);
    if (st != TD_OK)
        return st;
    for (size_t i = 0; i < b->ndescs; i++) {
        const td_xfer_desc_t *d = &b->descs[i];
        uint32_t s = d->pool_id - 100;
        memcpy(c->mem[s][d->block - 10 * (s + 1)] + d->offset, d->src, d->len);
    }
    td_kvmap_batch_free(b);
    return TD_OK;
}

/* The map's checksum over what it staged, batch after batch as the engine
 * hands out a 10-token prompt in chunks of 3, equals the checksum of the
 * staged bytes put in place (here: a decode rank's blocks, in memory). */
static void
test_kvmap_sum(td_engine_t *eng, const Tandem__KvDest *d)
{
    const td_layout_t *l = eng->layout;
    td_kvmap_t *m;
    char why[256];
    CHECK_STATUS(td_kvmap_create(l, d, 10, &m, why, sizeof(why)), TD_OK);
    if (m == NULL)
        return;
    static uint8_t mem[MAX_SEGS][3][4 * 32];   /* 3 blocks (fixed: 1 slot) per segment */
    td_sample_params_t sp = td_sample_params_greedy();
    td_engine_req_t *req;
    td_kvmem_t *src = NULL;
    CHECK(td_kvmem_create(l, 10, 0, &src) == TD_OK);
    CHECK_STATUS(td_engine_req_create(eng, &sp, &src->kv, &req), TD_OK);
    static const int32_t prompt[10] = { 5, 9, 2, 7, 7, 1, 0, 3, 8, 4 };
    stage_t ctx = { m, mem };
    for (size_t at = 0; at < 10; at += 3) {
        size_t n = 10 - at < 3 ? 10 - at : 3;
        CHECK_STATUS(td_engine_prefill(req, prompt + at, n, at + n == 10, kvmap_stage, &ctx),
                     TD_OK);
    }
    td_engine_req_destroy(req);
    td_kvmem_destroy(src);
    uint64_t nblocks[MAX_SEGS] = { 0 }, want = 0, got = 1;
    uint8_t *ptrs[MAX_SEGS][3], *fixed[MAX_SEGS] = { 0 };
    uint8_t *const *segb[MAX_SEGS] = { 0 };
    for (uint32_t s = 0; s < l->nsegs; s++) {
        if (l->segs[s].kind == TD_LAYOUT_FIXED) {
            fixed[s] = mem[s][0];
            continue;
        }
        nblocks[s] = 3;
        for (int b = 0; b < 3; b++)
            ptrs[s][b] = mem[s][b];
        segb[s] = ptrs[s];
    }
    td_layout_kv_t kv = { l, nblocks, segb, fixed };
    CHECK_STATUS(td_kvsum_of(&kv, 10, &want), TD_OK);
    CHECK_STATUS(td_kvmap_sum(m, &got, why, sizeof(why)), TD_OK);
    CHECK(got == want);
    td_kvmap_destroy(m);
}

static void
test_kvmap(void)
{
    td_engine_t *eng;
    CHECK_STATUS(engine_create(&eng), TD_OK);
    const td_layout_t *l = eng->layout;
    const td_layout_seg_t *kv = td_layout_find(l, "L1.kv");
    uint32_t kvi = (uint32_t)(kv - l->segs);
    /* every segment: 3 blocks, block ids 10*(s+1)+b: enough for 12 tokens */
    Tandem__SegDest sd[64], *sdp[64];
    uint64_t blocks[64][3];
    for (uint32_t s = 0; s < l->nsegs; s++) {
        tandem__seg_dest__init(&sd[s]);
        sd[s].seg = s;
        sd[s].pool_id = 100 + s;
        sd[s].n_blocks = l->segs[s].kind == TD_LAYOUT_FIXED ? 1 : 3;
        for (int b = 0; b < 3; b++)
            blocks[s][b] = 10 * (s + 1) + (uint64_t)b;
        sd[s].blocks = blocks[s];
        sdp[s] = &sd[s];
    }
    Tandem__KvDest d = TANDEM__KV_DEST__INIT;
    d.n_segs = l->nsegs;
    d.segs = sdp;
    td_kvmap_t *m;
    char why[256];
    CHECK_STATUS(td_kvmap_create(l, &d, 10, &m, why, sizeof(why)), TD_OK);
    /* entries [3, 9) of L1.kv (block_entries 4): blocks 0 (3), 1 (4..7), 2 (8),
     * read where they are in the request's KV memory (no copy) */
    td_kvmem_t *mem = NULL;
    CHECK(td_kvmem_create(l, 32, 0, &mem) == TD_OK);
    td_engine_piece_t p = { .seg = kvi, .first = 3, .count = 6 };
    td_kvmap_batch_t *b;
    CHECK_STATUS(td_kvmap_batch_create(m, &mem->kv, &p, 1, &b, why, sizeof(why)), TD_OK);
    CHECK_EQ_INT(b->ndescs, 3);
    CHECK_EQ_INT(b->bytes, 6 * 24);
    uint64_t want_block[3] = { blocks[kvi][0], blocks[kvi][1], blocks[kvi][2] };
    uint64_t want_off[3] = { 3 * 24, 0, 0 }, want_len[3] = { 24, 4 * 24, 24 };
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(b->descs[k].pool_id, 100 + kvi);
        CHECK_EQ_INT(b->descs[k].block, want_block[k]);
        CHECK_EQ_INT(b->descs[k].offset, want_off[k]);
        CHECK_EQ_INT(b->descs[k].len, want_len[k]);
    }
    uint64_t want_src[3] = { 3, 4, 8 };
    for (int k = 0; k < 3; k++)
        CHECK(b->descs[k].src == td_layout_kv_entry(&mem->kv, kvi, want_src[k]));
    td_kvmap_batch_free(b);
    /* past the blocks of the dest: refused with a reason */
    p.first = 10;
    p.count = 3;
    CHECK_STATUS(td_kvmap_batch_create(m, &mem->kv, &p, 1, &b, why, sizeof(why)),
                 TD_ERR_RANGE);
    CHECK(strstr(why, "L1.kv") != NULL);
    p.first = UINT64_MAX - 1;
    CHECK_STATUS(td_kvmap_batch_create(m, &mem->kv, &p, 1, &b, why, sizeof(why)),
                 TD_ERR_RANGE);
    /* entries [3, 9) of L1.kv summed first: no checksum for that */
    p.first = 3;
    p.count = 6;
    td_kvmap_sum_add(m, &mem->kv, &p, 1);
    td_kvmem_destroy(mem);
    uint64_t sum = 0;
    CHECK_STATUS(td_kvmap_sum(m, &sum, why, sizeof(why)), TD_ERR_RANGE);
    CHECK(strstr(why, "L1.kv") != NULL);
    td_kvmap_destroy(m);
    test_kvmap_sum(eng, &d);
    /* a dest too small for the prompt, a missing and a duplicate segment */
    CHECK_STATUS(td_kvmap_create(l, &d, 100, &m, why, sizeof(why)), TD_ERR_INVALID);
    d.n_segs = l->nsegs - 1;
    CHECK_STATUS(td_kvmap_create(l, &d, 10, &m, why, sizeof(why)), TD_ERR_INVALID);
    CHECK(strstr(why, "missing") != NULL);
    sd[1].seg = 0;
    d.n_segs = l->nsegs;
    CHECK_STATUS(td_kvmap_create(l, &d, 10, &m, why, sizeof(why)), TD_ERR_INVALID);
    sd[1].seg = 9999;
    CHECK_STATUS(td_kvmap_create(l, &d, 10, &m, why, sizeof(why)), TD_ERR_INVALID);
    td_engine_destroy(eng);
}

/* ---- rank ----------------------------------------------------------------------- */

/* Several requests interleaved chunk by chunk: all done, every byte right,
 * one terminal note each, and the short one done before the long one. */
static void
test_interleaved(void)
{
    env_t e;
    if (env_create(&e, 8, 8, 0) != 0) {
        CHECK(!"env");
        return;
    }
    size_t lens[4] = { 120, 5, 37, 64 };
    for (int i = 0; i < 4; i++)
        prefill(&e, i, lens[i], ROUTER_A, 0, 0);
    wait_done(&e, 4);
    for (int i = 0; i < 4; i++) {
        req_t *r = &e.reqs[i];
        CHECK_EQ_INT(r->done, 1);
        CHECK_STATUS(r->done_status, TD_OK);
        CHECK_EQ_INT(notes_of(&e, i), 1);
        CHECK_EQ_INT(r->fail_notes, 0);
        CHECK(r->verified);
        CHECK(r->sum_ok);
        CHECK_EQ_INT(r->done_token, r->first_token);
    }
    CHECK(e.reqs[1].done_order < e.reqs[0].done_order);   /* 5 tokens beat 120 */
    td_prank_stats_t st;
    td_prank_stats(e.rk, &st);
    CHECK_EQ_INT(st.chunks, 15 + 1 + 5 + 8);
    CHECK_EQ_INT(st.done, 4);
    CHECK_EQ_INT(st.live, 0);
    Tandem__Load load;
    td_prank_load(e.rk, &load);
    CHECK_EQ_INT(load.queued + load.running + load.queued_tokens, 0);
    env_destroy(&e);
}

/* Cancel a queued and a running request; exactly one terminal note each. */
static void
test_cancel(void)
{
    env_t e;
    if (env_create(&e, 4, 1, 0) != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 400, ROUTER_A, 0, 0);
    prefill(&e, 1, 20, ROUTER_A, 0, 0);
    prefill(&e, 2, 20, ROUTER_A, 0, 0);
    Tandem__Load load;
    td_prank_load(e.rk, &load);
    /* the first went to the compute thread at once (max_running 1) */
    CHECK_EQ_INT(load.queued, 2);
    CHECK_EQ_INT(load.running, 1);
    CHECK_EQ_INT(load.queued_tokens, 440);
    cancel(&e, 1, ROUTER_A);   /* queued: dropped */
    cancel(&e, 2, ROUTER_B);   /* not that router's: ignored */
    uint64_t until = td_testutil_now_ms() + 5000;
    td_prank_stats_t st = { 0 };
    while (st.chunks < 5 && td_testutil_now_ms() < until) {
        event_base_loop(e.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        td_prank_stats(e.rk, &st);
    }
    CHECK(!e.reqs[0].done);
    cancel(&e, 0, ROUTER_A);   /* running: stops at the next layer boundary */
    wait_done(&e, 3);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(e.reqs[i].done, 1);
        CHECK_STATUS(e.reqs[i].done_status, TD_ERR_CANCELED);
        CHECK_EQ_INT(notes_of(&e, i), 1);
        CHECK(e.reqs[i].canceled);
    }
    td_prank_stats(e.rk, &st);
    CHECK(st.chunks < 100);   /* request 0 never ran to its end */
    CHECK_STATUS(e.reqs[2].done_status, TD_OK);
    CHECK(notes_of(&e, 2) == 1 && e.reqs[2].verified && e.reqs[2].sum_ok);
    CHECK_EQ_INT(notes_of(&e, 2), 1);
    env_destroy(&e);
}

static void
fence(env_t *e, uint64_t prefill_inc, const uint64_t *ids, size_t n)
{
    Tandem__Fence f = TANDEM__FENCE__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    f.prefill_incarnation = prefill_inc;
    f.decode_node = "dec";
    f.decode_incarnation = 0x2222;
    f.n_xfer_ids = n;
    f.xfer_ids = (uint64_t *)ids;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_FENCE;
    env.fence = &f;
    td_prank_on_message(e->rk, ROUTER_A, &env);
}

/* A Fence (docs/decoded.md, "Fencing"): a running task for one of its
 * transfers stops (its canceled terminal note goes out), and Fenced goes
 * to the routers only after that, naming every transfer, also those the
 * rank has no task for; a Fence for another incarnation is not answered. */
static void
test_fence(void)
{
    env_t e;
    uint64_t ids[] = { 0, 777 };

    engine_shape.prefill_us = 100;   /* 400 tokens x 4 layers: 160 ms */
    int bad = env_create(&e, 4, 1, 0);
    engine_shape.prefill_us = 0;
    if (bad != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 400, ROUTER_A, 0, 0);
    run_for(&e, 20);
    fence(&e, 0x1112, ids, 2);   /* not this incarnation */
    run_for(&e, 50);
    CHECK_EQ_INT(e.fenced, 0);
    CHECK(!e.reqs[0].done);
    fence(&e, 0x1111, ids, 2);
    run_until(&e, &e.fenced, 1, 5000);
    CHECK_EQ_INT(e.fenced, 1);
    CHECK_EQ_INT(e.fenced_ids, 2);
    CHECK(e.fenced_after_note);
    wait_done(&e, 1);
    CHECK_STATUS(e.reqs[0].done_status, TD_ERR_CANCELED);
    CHECK(e.reqs[0].canceled);
    env_destroy(&e);
}

/* Bad destinations: too few blocks (refused before running), a block outside
 * the pool (the post is refused), an unknown decode rank (no note possible). */
static void
test_bad_dest(void)
{
    env_t e;
    if (env_create(&e, 16, 8, 0) != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 30, ROUTER_A, 1, 0);
    prefill(&e, 1, 30, ROUTER_A, 0, 1);
    prefill(&e, 3, 10, ROUTER_A, 0, 0);
    wait_done(&e, 2);
    CHECK_STATUS(e.reqs[0].done_status, TD_ERR_INVALID);
    CHECK_EQ_INT(notes_of(&e, 0), 1);
    CHECK(e.reqs[0].has_reason);
    CHECK_STATUS(e.reqs[1].done_status, TD_ERR_RANGE);
    CHECK_EQ_INT(notes_of(&e, 1), 1);
    CHECK(e.reqs[1].has_reason);
    CHECK(e.reqs[1].fail_notes >= 1);   /* the xfer engine's note for the refused post */
    CHECK_STATUS(e.reqs[3].done_status, TD_OK);   /* others are unaffected */
    CHECK(notes_of(&e, 3) == 1 && e.reqs[3].verified);
    /* unknown decode rank */
    Tandem__KvDest d = TANDEM__KV_DEST__INIT;
    d.node_id = "nobody";
    d.xfer_id = 2;
    td_xfer_token_t tok2 = td_test_token(d.xfer_id);
    d.xfer_token.data = tok2.b;
    d.xfer_token.len = TD_XFER_TOKEN_LEN;
    Tandem__Prefill m = TANDEM__PREFILL__INIT;
    int32_t tok = 1;
    m.req_id = 2;
    m.n_tokens = 1;
    m.tokens = &tok;
    m.dest = &d;
    e.reqs[2].router = ROUTER_A;
    send_prefill(&e, ROUTER_A, &m);
    CHECK_EQ_INT(e.reqs[2].done, 1);
    CHECK_STATUS(e.reqs[2].done_status, TD_ERR_NOT_FOUND);
    CHECK_EQ_INT(e.reqs[2].terminal, 0);
    env_destroy(&e);
}

/* The decode rank goes away mid-transfer: the task fails without a note;
 * when it comes back, requests succeed again. */
static void
test_peer_gone(void)
{
    env_t e;
    if (env_create(&e, 4, 8, 0) != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 400, ROUTER_A, 0, 0);
    uint64_t until = td_testutil_now_ms() + 5000;
    td_prank_stats_t st = { 0 };
    while (st.xfers < 8 && td_testutil_now_ms() < until) {
        event_base_loop(e.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        td_prank_stats(e.rk, &st);
    }
    decode_peer(&e, 1);
    wait_done(&e, 1);
    CHECK_EQ_INT(e.reqs[0].done, 1);
    CHECK_STATUS(e.reqs[0].done_status, TD_ERR_PEER);
    CHECK_EQ_INT(e.reqs[0].terminal, 0);
    decode_peer(&e, 0);
    prefill(&e, 1, 50, ROUTER_A, 0, 0);
    wait_done(&e, 2);
    CHECK_STATUS(e.reqs[1].done_status, TD_OK);
    CHECK(notes_of(&e, 1) == 1 && e.reqs[1].verified && e.reqs[1].sum_ok);
    env_destroy(&e);
}

/* A router goes away: its tasks are canceled with their notes, never
 * reported; a full queue refuses; stop lets the rest finish and reports
 * idle; abort (the drain deadline) cancels what is left. */
static void
test_router_down_and_stop(void)
{
    env_t e;
    if (env_create(&e, 4, 1, 150) != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 100, ROUTER_A, 0, 0);
    prefill(&e, 1, 40, ROUTER_B, 0, 0);
    prefill(&e, 2, 40, ROUTER_B, 0, 0);   /* 180 > 150 tokens: refused */
    CHECK_EQ_INT(e.reqs[2].done, 0);      /* its note first, then PrefillDone */
    run_until(&e, &e.reqs[2].done, 1, 2000);
    CHECK_STATUS(e.reqs[2].done_status, TD_ERR_BUSY);
    CHECK_EQ_INT(notes_of(&e, 2), 1);
    td_prank_on_router_down(e.rk, ROUTER_A);
    run_until(&e, &e.reqs[0].terminal, 1, 2000);
    run_for(&e, 20);
    CHECK_EQ_INT(e.reqs[0].done, 0);
    CHECK_EQ_INT(notes_of(&e, 0), 1);
    CHECK(e.reqs[0].canceled);
    prefill(&e, 3, 40, ROUTER_B, 0, 0);
    td_prank_stop(e.rk);
    prefill(&e, 4, 10, ROUTER_B, 0, 0);    /* refused while stopping */
    run_until(&e, &e.idle, 1, 5000);
    CHECK_EQ_INT(e.idle, 1);
    /* stopping drains: the tasks in hand finish */
    CHECK_STATUS(e.reqs[1].done_status, TD_OK);
    CHECK_STATUS(e.reqs[3].done_status, TD_OK);
    CHECK_STATUS(e.reqs[4].done_status, TD_ERR_CANCELED);
    for (int i = 1; i <= 4; i++)
        CHECK_EQ_INT(notes_of(&e, i), 1);
    env_destroy(&e);

    /* the drain deadline: abort cancels what is left, then idle */
    if (env_create(&e, 4, 1, 150) != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 100, ROUTER_A, 0, 0);
    prefill(&e, 1, 40, ROUTER_A, 0, 0);
    td_prank_stop(e.rk);
    CHECK_EQ_INT(e.idle, 0);
    td_prank_abort(e.rk);
    run_until(&e, &e.idle, 1, 5000);
    CHECK_EQ_INT(e.idle, 1);
    CHECK_STATUS(e.reqs[1].done_status, TD_ERR_CANCELED);   /* queued behind 0 */
    CHECK_EQ_INT(e.reqs[0].done, 1);   /* done or canceled, depending on timing */
    for (int i = 0; i <= 1; i++)
        CHECK_EQ_INT(notes_of(&e, i), 1);
    env_destroy(&e);
}

/* A Prefill for request i again (same router): only its id matters. */
static void
prefill_again(env_t *e, int i, void *router)
{
    int32_t tok = 1;
    Tandem__Prefill m = TANDEM__PREFILL__INIT;
    m.req_id = (uint64_t)i;
    m.n_tokens = 1;
    m.tokens = &tok;
    send_prefill(e, router, &m);
}

static void
drain(env_t *e, int on)
{
    Tandem__Drain d = TANDEM__DRAIN__INIT;
    d.draining = on;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DRAIN;
    env.drain = &d;
    td_prank_on_message(e->rk, ROUTER_A, &env);
}

/* Router messages that do not fit a task's state: a second Prefill for a
 * running task, and for one that is ending after a Cancel (a router's retry
 * on the same rank), is answered PrefillDone{invalid} and leaves the task as
 * it was; Cancels of unknown, ending and ended tasks and a DecodePeer{gone}
 * for an unknown incarnation change nothing. An illegal transition aborts,
 * so reaching the checks is part of the test. */
static void
test_unfit_input(void)
{
    env_t e;
    if (env_create(&e, 4, 8, 0) != 0) {
        CHECK(!"env");
        return;
    }
    prefill(&e, 0, 200, ROUTER_A, 0, 0);
    prefill(&e, 1, 200, ROUTER_A, 0, 0);
    run_for(&e, 5);
    prefill_again(&e, 0, ROUTER_A);
    CHECK_EQ_INT(e.reqs[0].done, 1);
    CHECK_STATUS(e.reqs[0].done_status, TD_ERR_INVALID);
    cancel(&e, 1, ROUTER_A);
    prefill_again(&e, 1, ROUTER_A);   /* its task still ends */
    cancel(&e, 1, ROUTER_A);
    cancel(&e, 5, ROUTER_A);          /* unknown */
    Tandem__Load load;
    drain(&e, 1);
    drain(&e, 1);
    td_prank_load(e.rk, &load);
    CHECK(load.draining);
    drain(&e, 0);
    {
        Tandem__DecodePeer m = TANDEM__DECODE_PEER__INIT;
        m.node_id = "dec";
        m.incarnation = 0x7777;       /* not the one the tasks push to */
        m.gone = 1;
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER;
        env.decode_peer = &m;
        td_prank_on_message(e.rk, ROUTER_A, &env);
    }
    run_until(&e, &e.reqs[0].done, 2, 10000);
    run_until(&e, &e.reqs[1].done, 2, 10000);
    CHECK_EQ_INT(e.reqs[0].done, 2);   /* the refusal, then its own end */
    CHECK_STATUS(e.reqs[0].done_status, TD_OK);
    CHECK(notes_of(&e, 0) == 1 && e.reqs[0].verified);
    CHECK_EQ_INT(e.reqs[1].done, 2);   /* the refusal, then canceled */
    CHECK_STATUS(e.reqs[1].done_status, TD_ERR_CANCELED);
    CHECK_EQ_INT(notes_of(&e, 1), 1);
    CHECK(e.reqs[1].canceled);
    cancel(&e, 0, ROUTER_A);          /* ended */
    run_for(&e, 20);
    CHECK_EQ_INT(e.reqs[0].done, 2);
    td_prank_stats_t st;
    td_prank_stats(e.rk, &st);
    CHECK_EQ_INT(st.tasks, 2);
    CHECK_EQ_INT(st.live, 0);
    env_destroy(&e);
}

static void
filler_done(td_xfer_t *x, uint64_t id, td_status_t st, void *arg)
{
    (*(int *)arg)++;
}

/* The reviewed crash: a task between chunks whose only data transfer in
 * flight fails (deadline: the receiver is stalled with a full notification
 * FIFO), while the terminal note cannot be posted (the endpoint has failed;
 * the done callbacks run before the peer-fail handler). The task ends in the
 * transfer's done callback and must not be touched after (ASan). One layer
 * with a ratio-8 source and 1-token chunks: a transfer every 8th chunk; 20 ms
 * per chunk, so the 50 ms deadline sweep runs between chunks. */
static void
test_fail_between_chunks(void)
{
    engine_shape.layers = 1;
    engine_shape.sources = "0:8";
    engine_shape.prefill_us = 20000;
    env_t e;
    int ok = env_create_ex(&e, 1, 1, 0, 1, 1) == 0;
    engine_shape.layers = 4;
    engine_shape.sources = "1:2,3:1";
    engine_shape.prefill_us = 0;
    if (!ok) {
        CHECK(!"env");
        return;
    }
    /* Fill the stalled receiver's FIFO: post empty transfers from a second
     * endpoint until one stays in flight. */
    void *addr;
    size_t alen;
    td_xfer_peer_t *filler = NULL;
    CHECK_STATUS(td_xfer_address(e.rcv, &addr, &alen), TD_OK);
    CHECK_STATUS(td_xfer_peer_create(e.snd, addr, alen, td_xfer_incarnation(e.rcv), &filler),
                 TD_OK);
    free(addr);
    int filled = 0, posted = 0;
    td_xfer_stats_t xs = { 0 };
    while (filler && posted < 4096) {
        CHECK_STATUS(td_xfer_post(filler, 1000, td_test_tokp(1000), NULL, 0, NULL, 0, 0,
                                  filler_done, &filled),
                     TD_OK);
        posted++;
        td_xfer_progress(e.snd);
        td_xfer_stats(e.snd, &xs);
        if (xs.inflight > 0)
            break;
    }
    CHECK(xs.inflight > 0);
    prefill(&e, 0, 24, ROUTER_A, 0, 0);
    wait_done(&e, 1);
    CHECK_EQ_INT(e.reqs[0].done, 1);
    CHECK(e.reqs[0].done_status == TD_ERR_TIMEOUT || e.reqs[0].done_status == TD_ERR_PEER);
    td_prank_stats_t st;
    td_prank_stats(e.rk, &st);
    CHECK_EQ_INT(st.failed, 1);
    CHECK_EQ_INT(st.live, 0);
    CHECK(st.chunks < 24);   /* it failed between chunks, not at the end */
    /* Let the receiver drain its FIFO: the filler's transfers complete. */
    uint64_t until = td_testutil_now_ms() + 5000;
    while (filled < posted && td_testutil_now_ms() < until) {
        event_base_loop(e.rcv_base, EVLOOP_NONBLOCK);
        event_base_loop(e.base, EVLOOP_NONBLOCK);
    }
    CHECK_EQ_INT(filled, posted);
    td_xfer_peer_destroy(filler);
    env_destroy(&e);
}

/* The prefix cache on the synthetic engine (blocks of 8 tokens here): a
 * repeated prompt and one sharing its first blocks reuse them (pool hits,
 * the fixed state from a snapshot or by replay), and the decode side
 * receives, byte for byte, what a cold prefill puts; a flush empties it; no
 * block stays shared or pinned at the end. */
static void
test_cache(void)
{
    env_t e;
    int32_t a[40], b[37];

    env_cache = (td_pcache_config_t){ .max_blocks = 16, .snapshots = 1 };
    if (env_create(&e, 8, 2, 0) != 0) {
        CHECK(!"env");
        env_cache.max_blocks = 0;
        return;
    }
    env_cache.max_blocks = 0;
    for (int k = 0; k < 40; k++)
        a[k] = (int32_t)((k * 31 + 7) % 1000);
    for (int k = 0; k < 37; k++)
        b[k] = k < 24 ? a[k] : (int32_t)((k * 11 + 500) % 1000);
    /* 0: cold; 1: the same prompt (4 of its 5 blocks: one token is left to
     * compute); 2: its first 3 blocks, then other tokens */
    prefill_tokens(&e, 0, a, 40, ROUTER_A, 0, 0);
    wait_done(&e, 1);
    prefill_tokens(&e, 1, a, 40, ROUTER_A, 0, 0);
    wait_done(&e, 2);
    prefill_tokens(&e, 2, b, 37, ROUTER_A, 0, 0);
    wait_done(&e, 3);
    /* 3: after a flush, cold again */
    Tandem__CacheFlush fl = TANDEM__CACHE_FLUSH__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CACHE_FLUSH;
    env.cache_flush = &fl;
    td_prank_on_message(e.rk, ROUTER_A, &env);
    prefill_tokens(&e, 3, a, 40, ROUTER_A, 0, 0);
    wait_done(&e, 4);
    static const uint64_t cached[4] = { 0, 32, 24, 0 };
    for (int i = 0; i < 4; i++) {
        req_t *r = &e.reqs[i];

        CHECK_EQ_INT(r->done, 1);
        CHECK_STATUS(r->done_status, TD_OK);
        CHECK_EQ_INT(notes_of(&e, i), 1);
        CHECK(r->verified);
        CHECK(r->sum_ok);
        CHECK_EQ_INT(r->done_token, r->first_token);
        CHECK_EQ_INT(r->done_cached, cached[i]);
        /* computed: the uncached suffix plus at most the replay bound */
        CHECK(r->done_computed >= e.lens[i] - cached[i]);
        CHECK(r->done_computed <= e.lens[i] - cached[i] + td_engine_replay_bound(e.engine));
    }
    CHECK_EQ_INT(e.reqs[1].first_token, e.reqs[0].first_token);
    CHECK_EQ_INT(e.reqs[3].first_token, e.reqs[0].first_token);
    /* request 1's prefix ended at the snapshot request 0 left: no replay */
    CHECK_EQ_INT(e.reqs[1].done_computed, 8);
    Tandem__Load load;
    run_for(&e, 120);   /* the cache's figures move with its 50 ms tick */
    td_prank_load(e.rk, &load);
    CHECK(load.cache != NULL);
    if (load.cache != NULL) {
        CHECK_EQ_INT(load.cache->pool_blocks, 5);   /* request 3's blocks */
        CHECK_EQ_INT(load.cache->lookup_tokens, 40 + 40 + 37 + 40);
        CHECK_EQ_INT(load.cache->pinned_blocks, 0);   /* nothing in use at the end */
        CHECK_EQ_INT(load.cache->shared_blocks, 0);
        CHECK_EQ_INT(load.cache->reserved_blocks, 0);
    }
    env_destroy(&e);
}

/* Prompt a (40 tokens) on a fresh rank with cache cfg: its PrefillDone's
 * cached tokens, once the decode side verified every byte; st: the rank's
 * cache figures after it. */
static uint64_t
cache_round(const td_pcache_config_t *cfg, const int32_t *a, Tandem__CacheStats *st)
{
    env_t e;
    uint64_t cached = UINT64_MAX;

    env_cache = *cfg;
    if (env_create(&e, 8, 2, 0) != 0) {
        CHECK(!"env");
        env_cache.max_blocks = 0;
        return cached;
    }
    env_cache.max_blocks = 0;
    prefill_tokens(&e, 0, a, 40, ROUTER_A, 0, 0);
    wait_done(&e, 1);
    CHECK_STATUS(e.reqs[0].done_status, TD_OK);
    CHECK_EQ_INT(notes_of(&e, 0), 1);
    CHECK(e.reqs[0].verified);
    CHECK(e.reqs[0].sum_ok);
    cached = e.reqs[0].done_cached;
    run_for(&e, 120);
    if (st != NULL) {
        Tandem__Load load;
        td_prank_load(e.rk, &load);
        if (load.cache != NULL)
            *st = *load.cache;
    }
    env_destroy(&e);   /* the tier finishes its writes */
    return cached;
}

/* The files of the SSD tier's directory (its record packs). */
static int
cache_files(const char *dir, char names[][300], int cap)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    while (d != NULL && (de = readdir(d)) != NULL)
        if (strstr(de->d_name, ".kvb") != NULL && n < cap)
            snprintf(names[n++], 300, "%s/%s", dir, de->d_name);
    if (d != NULL)
        closedir(d);
    return n;
}

/* The lower tiers behind a rank: blocks the pool let go are hit in the host
 * tier; blocks written back to SSD are hit by a new rank on the same
 * directory (a restart); a corrupted or truncated file is a miss with a log
 * line and the answer is still the cold prefill's, byte for byte. */
static void
test_cache_tiers(void)
{
    char dir[] = "/tmp/td-pcache-XXXXXX", names[8][300];
    int32_t a[40], b[40];
    Tandem__CacheStats st;

    for (int k = 0; k < 40; k++) {
        a[k] = (int32_t)((k * 31 + 7) % 1000);
        b[k] = (int32_t)((k * 17 + 300) % 1000);
    }
    /* host: a pool of 5 blocks; b's evict a's, which come back from memory */
    td_pcache_config_t host = { .max_blocks = 5, .snapshots = 1, .host_bytes = 64 << 20 };
    env_t e;
    env_cache = host;
    if (env_create(&e, 8, 2, 0) != 0) {
        CHECK(!"env");
        env_cache.max_blocks = 0;
        return;
    }
    env_cache.max_blocks = 0;
    prefill_tokens(&e, 0, a, 40, ROUTER_A, 0, 0);
    wait_done(&e, 1);
    prefill_tokens(&e, 1, b, 40, ROUTER_A, 0, 0);
    wait_done(&e, 2);
    prefill_tokens(&e, 2, a, 40, ROUTER_A, 0, 0);
    wait_done(&e, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(e.reqs[i].done_status, TD_OK);
        CHECK(e.reqs[i].verified);
        CHECK(e.reqs[i].sum_ok);
    }
    CHECK_EQ_INT(e.reqs[2].done_cached, 32);
    CHECK_EQ_INT(e.reqs[2].first_token, e.reqs[0].first_token);
    run_for(&e, 120);
    Tandem__Load load;
    td_prank_load(e.rk, &load);
    CHECK(load.cache != NULL && load.cache->hit_host_tokens == 32 &&
          load.cache->hit_pool_tokens == 0);
    env_destroy(&e);

    /* ssd: written back by the first rank, hit by the next on the directory */
    CHECK(mkdtemp(dir) != NULL);
    td_pcache_config_t ssd = { .max_blocks = 16, .snapshots = 1, .ssd_dir = dir,
                               .ssd_bytes = 16 << 20 };
    CHECK_EQ_INT(cache_round(&ssd, a, NULL), 0);
    CHECK(cache_files(dir, names, 8) >= 1);
    memset(&st, 0, sizeof(st));
    CHECK_EQ_INT(cache_round(&ssd, a, &st), 32);
    CHECK_EQ_INT(st.hit_ssd_tokens, 32);

    /* a flipped byte, then a cut file: misses with a log line, right answers */
    for (int fault = 0; fault < 2; fault++) {
        int n = cache_files(dir, names, 8);

        CHECK(n >= 1);
        for (int i = 0; i < n; i++) {
            int fd = open(names[i], O_RDWR);
            off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : 0;
            unsigned char c = 0;

            /* a pack of 5 records (docs/kvtier.md): a 40-byte header and a
             * table of 5 × 40, then the first record (80-byte header, 8
             * tokens, its payload from byte 392): damage that one, which
             * every hit of prompt a reads */
            CHECK(fd >= 0 && size > 420);
            if (fault == 0 && pread(fd, &c, 1, 400) == 1) {
                c ^= 0x5a;
                CHECK(pwrite(fd, &c, 1, 400) == 1);
            } else if (fault == 1) {
                CHECK(ftruncate(fd, 300) == 0);
            }
            if (fd >= 0)
                close(fd);
        }
        td_logcap_start();
        td_logcap_reset();
        CHECK_EQ_INT(cache_round(&ssd, a, NULL), 0);
        CHECK(strstr(td_logcap.last, "kvtier") != NULL);
        td_logcap_stop();
        /* the bad file is gone; this round wrote the prompt back again */
        CHECK_EQ_INT(cache_round(&ssd, a, NULL), 32);
    }
    for (int i = 0, n = cache_files(dir, names, 8); i < n; i++)
        unlink(names[i]);
    char lock[300];
    snprintf(lock, sizeof(lock), "%s/LOCK", dir);
    unlink(lock);
    CHECK(rmdir(dir) == 0);
}

int
main(void)
{
    td_log_set_level(TD_LOG_WARN);
    test_cache();
    test_cache_tiers();
    test_kvmap();
    test_interleaved();
    test_cancel();
    test_fence();
    test_bad_dest();
    test_peer_gone();
    test_router_down_and_stop();
    test_unfit_input();
    test_fail_between_chunks();
    return td_check_exit("test_prefill_rank");
}
