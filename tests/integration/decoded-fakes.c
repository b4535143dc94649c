/* tests/integration/decoded-fakes.c — the decoded tests' fakes: a router
 * that records, a prefill rank that pushes real KV, expectations. */
#include "decoded-fakes.h"

#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const td_engine_kind_t *const test_engines[] = { &td_synth_kind, NULL };

int fk_failures;

#define FK_CHECK(cond)                                                        \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            fk_failures++;                                                    \
        }                                                                     \
    } while (0)

/* ---- The engine both sides use: a small layout, every segment kind ---- */

td_engine_t *
fk_engine(void)
{
    td_engine_config_t cfg;
    td_engine_t *e = NULL;
    if (td_engine_config_defaults(&cfg) != TD_OK)
        return NULL;
    free(cfg.synth.layout.kv_sources);
    cfg.synth.layout.kv_sources = strdup("1:2,2:1");
    cfg.synth.layout.layers = 4;
    cfg.synth.layout.kv_entry_bytes = 40;
    cfg.synth.layout.index_entry_bytes = 12;
    cfg.synth.layout.window = 8;
    cfg.synth.layout.window_entry_bytes = 24;
    cfg.synth.layout.partial_entry_bytes = 16;
    cfg.synth.layout.block_entries = 4;
    cfg.synth.vocab = 1000;
    cfg.synth.max_context = 4096;
    if (td_engine_create(test_engines, &cfg, &e) != TD_OK)
        e = NULL;
    td_engine_config_free(&cfg);
    return e;
}

/* ---- Fake router: every message the rank sends, deep-copied ---------------- */


void
fk_router_record(fk_router_t *rt, const Tandem__Envelope *env)
{
    size_t len = tandem__envelope__get_packed_size(env);
    uint8_t *buf = malloc(len ? len : 1);
    FK_CHECK(buf != NULL);
    if (buf == NULL)
        return;
    tandem__envelope__pack(env, buf);
    Tandem__Envelope *copy = tandem__envelope__unpack(NULL, len, buf);
    free(buf);
    if (copy == NULL || rt->n == MAX_MSGS) {
        FK_CHECK(!"router: message lost");
        if (copy)
            tandem__envelope__free_unpacked(copy, NULL);
        return;
    }
    rt->msgs[rt->n++] = copy;
}

td_status_t
fk_router_send(void *router, const Tandem__Envelope *env, void *arg)
{
    fk_router_t *rt = router;   /* recorded where it was sent: tests check the router */
    (void)arg;
    if (rt->fail_sends)
        return TD_ERR_BUSY;
    fk_router_record(rt, env);
    return TD_OK;
}

void
fk_router_load(const Tandem__Load *load, void *arg)
{
    fk_router_t *rt = arg;
    rt->load = *load;
    rt->loads++;
}

void
fk_router_clear(fk_router_t *rt)
{
    for (size_t i = 0; i < rt->n; i++)
        tandem__envelope__free_unpacked(rt->msgs[i], NULL);
    rt->n = 0;
}

const Tandem__Envelope *
fk_router_find(const fk_router_t *rt, Tandem__Envelope__PayloadCase pc, uint64_t id)
{
    for (size_t i = 0; i < rt->n; i++) {
        const Tandem__Envelope *e = rt->msgs[i];
        if (e->payload_case != pc)
            continue;
        if (pc == TANDEM__ENVELOPE__PAYLOAD_FENCE) {   /* id: one of its transfers */
            for (size_t k = 0; k < e->fence->n_xfer_ids; k++)
                if (e->fence->xfer_ids[k] == id)
                    return e;
            continue;
        }
        uint64_t rid = pc == TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK       ? e->admit_ok->req_id
                       : pc == TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT ? e->admit_reject->req_id
                       : pc == TANDEM__ENVELOPE__PAYLOAD_TOKENS       ? e->tokens->req_id
                                                                      : e->released->req_id;
        if (rid == id)
            return e;
    }
    return NULL;
}

void
fk_router_broadcast(const Tandem__Envelope *env, void *arg)
{
    fk_router_record(arg, env);
}

/* Tokens of request id in order; *finish = the last finish, *error its error. */
size_t
fk_router_tokens(const fk_router_t *rt, uint64_t id, int32_t *out, size_t max, int *finish,
              const char **error)
{
    size_t n = 0;
    *finish = -1;
    *error = NULL;
    for (size_t i = 0; i < rt->n; i++) {
        const Tandem__Envelope *e = rt->msgs[i];
        if (e->payload_case != TANDEM__ENVELOPE__PAYLOAD_TOKENS || e->tokens->req_id != id)
            continue;
        FK_CHECK(*finish <= 0);   /* nothing after the finish */
        for (size_t k = 0; k < e->tokens->n_tokens && n < max; k++)
            out[n++] = e->tokens->tokens[k];
        *finish = (int)e->tokens->finish;
        *error = e->tokens->error;
    }
    return n;
}

/* ---- The loop ---------------------------------------------------------------- */

void
fk_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}


/* Run the loop until pred or timeout; returns pred's last value. */
int
fk_run_until(struct event_base *base, fk_pred_fn pred, void *arg, uint64_t timeout_ms)
{
    uint64_t end = td_testutil_now_ms() + timeout_ms;
    while (!pred(arg) && td_testutil_now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    return pred(arg);
}

int
fk_never(void *arg)
{
    (void)arg;
    return 0;
}


static int
fk_have_msg(void *arg)
{
    fk_wait_msg_t *w = arg;
    return fk_router_find(w->rt, w->pc, w->id) != NULL;
}

int
fk_wait_msg(struct event_base *base, fk_router_t *rt, Tandem__Envelope__PayloadCase pc, uint64_t id,
         uint64_t timeout_ms)
{
    fk_wait_msg_t w = { rt, pc, id };
    return fk_run_until(base, fk_have_msg, &w, timeout_ms);
}

/* ---- Fake prefill rank: runs the prompt, pushes each layer's pieces --------- */


static void
fk_p_done(td_xfer_t *x, uint64_t xfer_id, td_status_t status, void *arg)
{
    fk_p_t *fp = arg;
    (void)x;
    (void)xfer_id;
    fp->inflight--;
    if (status != TD_OK)
        fp->failed++;
}

static td_status_t
fk_p_layer(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *pieces, size_t npieces,
         void *arg)
{
    fk_p_t *fp = arg;
    const td_layout_t *l = fp->layout;
    (void)layer;
    if (npieces == 0)
        return TD_OK;
    size_t ndescs = 0, bytes = 0;
    for (size_t i = 0; i < npieces; i++) {
        const td_layout_seg_t *seg = &l->segs[pieces[i].seg];
        ndescs += seg->kind == TD_LAYOUT_PAGED ? pieces[i].count : 1;
        bytes += pieces[i].count * seg->entry_bytes;
    }
    td_xfer_desc_t *d = calloc(ndescs, sizeof(*d));
    uint8_t *buf = malloc(bytes);
    FK_CHECK(d != NULL && buf != NULL && fp->nbufs < 256);
    fp->bufs[fp->nbufs++] = buf;
    size_t nd = 0;
    uint8_t *p = buf;
    for (size_t i = 0; i < npieces; i++) {
        const td_engine_piece_t *pc = &pieces[i];
        const td_layout_seg_t *seg = &l->segs[pc->seg];
        const Tandem__SegDest *sd = fp->dest->segs[pc->seg];
        for (uint64_t k = 0; k < pc->count; k++)   /* entries from the request's KV */
            memcpy(p + k * seg->entry_bytes, td_layout_kv_entry(&req->kv, pc->seg, pc->first + k),
                   seg->entry_bytes);
        if (fp->corrupt_src && seg->kind == TD_LAYOUT_PAGED) {
            p[pc->count * seg->entry_bytes - 1] ^= 0x40;
            fp->corrupt_src = 0;
        }
        if (fp->sum)
            FK_CHECK(td_kvsum_update(fp->sum, pc->seg, pc->first, pc->count, p) == TD_OK);
        if (fp->corrupt && seg->kind == TD_LAYOUT_PAGED) {
            p[pc->count * seg->entry_bytes - 1] ^= 0x40;
            fp->corrupt = 0;
        }
        if (seg->kind == TD_LAYOUT_FIXED) {
            d[nd++] = (td_xfer_desc_t){ p, sd->pool_id, sd->blocks[0], 0,
                                        pc->count * seg->entry_bytes };
        } else {
            for (uint64_t k = 0; k < pc->count; k++) {
                uint64_t e = pc->first + k;
                d[nd++] = (td_xfer_desc_t){ p + k * seg->entry_bytes, sd->pool_id,
                                            sd->blocks[e / l->block_entries],
                                            (e % l->block_entries) * seg->entry_bytes,
                                            seg->entry_bytes };
            }
        }
        p += pc->count * seg->entry_bytes;
    }
    td_status_t st = td_xfer_post(fp->peer, fp->dest->xfer_id, fk_dest_token(fp->dest), d, nd,
                                  NULL, 0, DEADLINE_MS, fk_p_done, fp);
    FK_CHECK((st) == TD_OK);
    if (st == TD_OK)
        fp->inflight++;
    free(d);
    return TD_OK;
}

td_status_t
fk_p_create(struct event_base *base, const Tandem__Register *reg, uint64_t d_inc,
          const td_layout_t *layout, fk_p_t *fp)
{
    return fk_p_create_inc(base, reg, d_inc, P_INC, layout, fp);
}

td_status_t
fk_p_create_inc(struct event_base *base, const Tandem__Register *reg, uint64_t d_inc,
                uint64_t p_inc, const td_layout_t *layout, fk_p_t *fp)
{
    memset(fp, 0, sizeof(*fp));
    fp->layout = layout;
    td_xfer_config_t xc = { .incarnation = p_inc, .transports = TLS };
    td_status_t st = td_xfer_create(base, &xc, &fp->x);
    if (st != TD_OK)
        return st;
    st = td_xfer_peer_create(fp->x, reg->xfer_address.data, reg->xfer_address.len, d_inc,
                             &fp->peer);
    for (size_t i = 0; st == TD_OK && i < reg->n_pools; i++)
        st = td_xfer_peer_import_pool(fp->peer, reg->pools[i].data, reg->pools[i].len);
    return st;
}

void
fk_p_destroy(fk_p_t *fp)
{
    td_xfer_destroy(fp->x);
    for (size_t i = 0; i < fp->nbufs; i++)
        free(fp->bufs[i]);
}

/* Prefill prompt into dest; with `terminal` post the KvNote (canceled or the
 * first token). */
int32_t
fk_p_push(fk_p_t *fp, td_engine_t *e, const Tandem__KvDest *dest, uint64_t id,
        const int32_t *prompt, size_t n, uint32_t max_tokens, int terminal, int canceled)
{
    td_sample_params_t sp = td_sample_params_greedy();
    sp.max_tokens = max_tokens;
    td_engine_req_t *req = NULL;
    int32_t first = -1;
    td_sample_finish_t fin;
    td_kvmem_t *kv = NULL;
    fp->dest = dest;
    FK_CHECK(td_kvmem_create(e->layout, n, 0, &kv) == TD_OK);
    FK_CHECK((td_engine_req_create(e, &sp, &kv->kv, &req)) == TD_OK);
    if (req == NULL) {
        td_kvmem_destroy(kv);
        return -1;
    }
    FK_CHECK(td_kvsum_create(fp->layout, &fp->sum) == TD_OK);
    FK_CHECK((td_engine_prefill(req, prompt, n, 1, fk_p_layer, fp)) == TD_OK);
    FK_CHECK((td_engine_sample(req, &first, &fin)) == TD_OK);
    td_engine_req_destroy(req);
    td_kvmem_destroy(kv);   /* the staged copies (fp->bufs) are what UCX reads */
    uint64_t sum = 0;
    char why[160];
    FK_CHECK(fp->sum && td_kvsum_final(fp->sum, n, &sum, why, sizeof(why)) == TD_OK);
    td_kvsum_destroy(fp->sum);
    fp->sum = NULL;
    if (terminal) {
        Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
        uint8_t buf[128];
        note.req_id = id;
        note.first_token = canceled ? 0 : first;
        note.canceled = canceled;
        note.kv_sum = canceled ? 0 : sum ^ (fp->bad_sum ? 1 : 0);
        fp->bad_sum = 0;
        size_t len = tandem__kv_note__pack(&note, buf);
        td_status_t st = td_xfer_post(fp->peer, dest->xfer_id, fk_dest_token(dest), NULL, 0,
                                      buf, len, DEADLINE_MS, fk_p_done, fp);
        FK_CHECK((st) == TD_OK);
        fp->inflight += st == TD_OK;
    }
    return first;
}

static td_status_t
fk_no_layer(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *pieces, size_t npieces,
         void *arg)
{
    (void)req, (void)layer, (void)pieces, (void)npieces, (void)arg;
    return TD_OK;
}

/* What the engine says the stream is: the first token, then decode steps. */
size_t
fk_expect(td_engine_t *e, const int32_t *prompt, size_t n, uint32_t max_tokens,
              int32_t *out)
{
    td_sample_params_t sp = td_sample_params_greedy();
    sp.max_tokens = max_tokens;
    td_engine_req_t *req = NULL;
    td_sample_finish_t fin;
    size_t k = 0;
    td_kvmem_t *kv = NULL;
    if (td_kvmem_create(e->layout, n + max_tokens, 0, &kv) != TD_OK ||
        td_engine_req_create(e, &sp, &kv->kv, &req) != TD_OK) {
        td_kvmem_destroy(kv);
        return 0;
    }
    td_engine_prefill(req, prompt, n, 1, fk_no_layer, NULL);
    td_engine_sample(req, &out[k++], &fin);
    while (fin == TD_SAMPLE_FINISH_NONE) {
        td_engine_row_t row = { .req = req, .token = out[k - 1] };
        if (td_engine_decode_step(e, &row, 1, NULL, NULL) != TD_OK)
            break;
        out[k++] = row.next;
        fin = row.finish;
    }
    td_engine_req_destroy(req);
    td_kvmem_destroy(kv);
    return k;
}


void
fk_prompt(int32_t *p, size_t n, int32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (int32_t)((seed * 31 + (int32_t)i * 7) % 1000);
}

void
fk_admit_init(fk_admit_t *adm, uint64_t id, const int32_t *prompt, size_t n,
              uint32_t max_tokens)
{
    tandem__sampling__init(&adm->s);
    adm->s.max_tokens = max_tokens;
    tandem__admit__init(&adm->a);
    adm->a.req_id = id;
    adm->a.n_tokens = n;
    adm->a.tokens = (int32_t *)prompt;
    adm->a.sampling = &adm->s;
    adm->a.prefill_node = "fake-p";
    adm->a.prefill_incarnation = P_INC;
    tandem__envelope__init(&adm->env);
    adm->env.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT;
    adm->env.admit = &adm->a;
}

const td_xfer_token_t *
fk_dest_token(const Tandem__KvDest *dest)
{
    static td_xfer_token_t tok;

    memset(&tok, 0, sizeof tok);
    if (dest->xfer_token.len == TD_XFER_TOKEN_LEN)
        memcpy(tok.b, dest->xfer_token.data, TD_XFER_TOKEN_LEN);
    return &tok;
}

/* ---- Framed messages over a socket (to a forked helper) -------------------- */

int
fk_env_send(int fd, const Tandem__Envelope *env)
{
    uint32_t len = (uint32_t)tandem__envelope__get_packed_size(env);
    uint8_t *buf = malloc(len + 4);
    memcpy(buf, &len, 4);
    tandem__envelope__pack(env, buf + 4);
    int rc = td_testutil_io_full(fd, buf, len + 4, 1);
    free(buf);
    return rc;
}

Tandem__Envelope *
fk_env_recv(int fd)
{
    uint32_t len;
    if (td_testutil_io_full(fd, &len, 4, 0) != 0 || len > (64u << 20))
        return NULL;
    uint8_t *buf = malloc(len ? len : 1);
    Tandem__Envelope *e = NULL;
    if (td_testutil_io_full(fd, buf, len, 0) == 0)
        e = tandem__envelope__unpack(NULL, len, buf);
    free(buf);
    return e;
}