/* tests/integration/prefilld-driver.c — black-box test of the prefilld binary
 * (argv[1]): this process is its router (a td_ctl listener) and its decode
 * rank (a td_xfer receiver with one pool per KV segment). Both rank threads
 * register; requests run interleaved and every received KV byte, the KV
 * checksum of the terminal note and the first token are checked; a cancel and a
 * router connection lost mid-prefill each end with exactly one terminal note;
 * SIGTERM mid-prefill drains (the task finishes, a new Prefill is refused);
 * exit 0. */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../unit/check.h"
#include "kvmem.h"
#include "../unit/testtoken.h"
#include "../unit/testutil.h"
#include "ctl.h"
#include "engine.h"
#include "kvsum.h"
#include "registry.h"
#include "synthetic.h"
#include "xfer.h"

static const td_engine_kind_t *const test_engines[] = { &td_synth_kind, NULL };

#define NRANKS 2
#define MAX_REQS 16
#define POOL_BLOCKS 4096

/* The layout and engine options both sides use (small, so a test is quick). */
static const char *const engine_args[] = {
    "--kv-layers=4", "--kv-sources=1:2,3:1", "--kv-entry-bytes=24",
    "--kv-index-entry-bytes=8", "--kv-window=8", "--kv-window-entry-bytes=16",
    "--kv-partial-entry-bytes=32", "--kv-block-entries=4", "--synth-vocab=1000",
    "--synth-prefill-us=20",
};
#define NENGINE_ARGS (sizeof(engine_args) / sizeof(engine_args[0]))

typedef struct {
    int terminal, canceled, failed, verified, sum_ok;
    int32_t first_token;
    int done;
    td_status_t done_status;
    int32_t done_token;
    int rank;
    int32_t *prompt;
    size_t len;
    uint64_t blocks[16][800];   /* 3000 tokens: 750 blocks of L3.kv */
} req_t;

static struct {
    struct event_base *base;
    td_engine_t *engine;
    td_xfer_t *rcv;
    td_xfer_pool_t *pools[16];
    uint64_t next_block[16];
    td_ctl_conn_t *rank_conn[NRANKS];
    int registrations;
    int draining_regs;      /* of them, Registers that say draining */
    req_t reqs[MAX_REQS];
    pid_t child;
} g;

static void
on_alarm(int sig)
{
    if (g.child > 0)
        kill(g.child, SIGKILL);
    static const char msg[] = "prefilld-driver: timed out\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(1);
}

static td_status_t
ignore_layer(td_engine_req_t *req, uint32_t layer, const td_engine_piece_t *p, size_t n,
             void *arg)
{
    return TD_OK;
}

static int
verify_req(int i)
{
    req_t *r = &g.reqs[i];
    const td_layout_t *l = g.engine->layout;
    td_sample_params_t sp = td_sample_params_greedy();
    td_engine_req_t *req;
    td_kvmem_t *kv = NULL;
    if (td_kvmem_create(l, r->len, 0, &kv) != TD_OK ||
        td_engine_req_create(g.engine, &sp, &kv->kv, &req) != TD_OK) {
        td_kvmem_destroy(kv);
        return 0;
    }
    int ok = td_engine_prefill(req, r->prompt, r->len, 1, ignore_layer, NULL) == TD_OK;
    for (uint32_t s = 0; ok && s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        const uint8_t *base = td_xfer_pool_base(g.pools[s]);
        size_t bs = td_xfer_pool_block_size(g.pools[s]);
        uint64_t bad;
        uint64_t n = seg->kind == TD_LAYOUT_FIXED ? seg->entries : td_layout_entries(seg, r->len);
        uint64_t per = seg->kind == TD_LAYOUT_FIXED ? seg->entries : l->block_entries;
        for (uint64_t first = 0; ok && first < n; first += per) {
            uint64_t cnt = n - first < per ? n - first : per;
            ok = td_synth_kv_verify(req, s, first, cnt, base + r->blocks[s][first / per] * bs,
                                    &bad) == TD_OK;
        }
    }
    int32_t tok;
    td_sample_finish_t fin;
    ok = ok && td_engine_sample(req, &tok, &fin) == TD_OK && tok == r->first_token;
    td_engine_req_destroy(req);
    td_kvmem_destroy(kv);
    return ok;
}

/* The checksum of request i's KV over the blocks it landed in, as a decode
 * rank computes it (engine/kvsum.h). */
static uint64_t
pool_sum(int i)
{
    req_t *r = &g.reqs[i];
    const td_layout_t *l = g.engine->layout;
    static uint8_t *ptrs[16][800];
    uint64_t nblocks[16] = { 0 }, sum = 0;
    uint8_t *fixed[16] = { 0 };
    uint8_t *const *segb[16] = { 0 };
    for (uint32_t s = 0; s < l->nsegs; s++) {
        uint8_t *base = td_xfer_pool_base(g.pools[s]);
        size_t bs = td_xfer_pool_block_size(g.pools[s]);
        if (l->segs[s].kind == TD_LAYOUT_FIXED) {
            fixed[s] = base + r->blocks[s][0] * bs;
            continue;
        }
        nblocks[s] = td_layout_blocks(l, &l->segs[s], r->len);
        for (uint64_t b = 0; b < nblocks[s]; b++)
            ptrs[s][b] = base + r->blocks[s][b] * bs;
        segb[s] = ptrs[s];
    }
    td_layout_kv_t kv = { l, nblocks, segb, fixed };
    CHECK_STATUS(td_kvsum_of(&kv, r->len, &sum), TD_OK);
    return sum;
}

static void
on_note(td_xfer_t *x, const td_xfer_note_t *n, void *arg)
{
    if (n->payload_len == 0)
        return;   /* a (chunk, layer) transfer; only the KvNote is terminal */
    Tandem__KvNote *kn = tandem__kv_note__unpack(NULL, n->payload_len, n->payload);
    CHECK(kn && kn->req_id < MAX_REQS && kn->req_id == n->xfer_id);
    if (kn && kn->req_id < MAX_REQS) {
        req_t *r = &g.reqs[kn->req_id];
        r->terminal++;
        r->canceled = kn->canceled;
        r->failed = !kn->canceled && kn->reason && kn->reason[0];
        r->first_token = kn->first_token;
        if (!r->canceled && !r->failed) {
            r->verified = verify_req((int)kn->req_id);
            r->sum_ok = kn->kv_sum == pool_sum((int)kn->req_id);
        }
    }
    if (kn)
        tandem__kv_note__free_unpacked(kn, NULL);
}

static void
send_env(td_ctl_conn_t *c, Tandem__Envelope *env)
{
    CHECK_STATUS(td_ctl_conn_send(c, env), TD_OK);
}

static void
send_decode_peer(td_ctl_conn_t *c)
{
    uint32_t n = g.engine->layout->nsegs;
    ProtobufCBinaryData pools[16], addr;
    CHECK_STATUS(td_xfer_address(g.rcv, (void **)&addr.data, &addr.len), TD_OK);
    for (uint32_t s = 0; s < n; s++)
        CHECK_STATUS(td_xfer_pool_export(g.pools[s], (void **)&pools[s].data, &pools[s].len),
                     TD_OK);
    Tandem__DecodePeer dp = TANDEM__DECODE_PEER__INIT;
    dp.node_id = "dec";
    dp.incarnation = td_xfer_incarnation(g.rcv);
    dp.xfer_address = addr;
    dp.n_pools = n;
    dp.pools = pools;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER;
    env.decode_peer = &dp;
    send_env(c, &env);
    free(addr.data);
    for (uint32_t s = 0; s < n; s++)
        free(pools[s].data);
}

static void
on_established(td_ctl_conn_t *c, const Tandem__Hello *peer, void *arg)
{
    CHECK(peer->role == TANDEM__ROLE__ROLE_PREFILL && peer->rank_id < NRANKS);
    if (peer->rank_id < NRANKS)
        g.rank_conn[peer->rank_id] = c;
}

static void
on_message(td_ctl_conn_t *c, const Tandem__Envelope *env, void *arg)
{
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_REGISTER) {
        CHECK_STR(env->register_->engine_name, "synthetic");
        Tandem__Registered reg = TANDEM__REGISTERED__INIT;
        reg.router_id = "router";
        Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
        out.payload_case = TANDEM__ENVELOPE__PAYLOAD_REGISTERED;
        out.registered = &reg;
        send_env(c, &out);
        send_decode_peer(c);
        g.registrations++;
        g.draining_regs += env->register_->draining;
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE) {
        const Tandem__PrefillDone *d = env->prefill_done;
        CHECK(d->req_id < MAX_REQS);
        if (d->req_id < MAX_REQS) {
            req_t *r = &g.reqs[d->req_id];
            r->done++;
            r->done_status = d->status;
            r->done_token = d->first_token;
        }
    }
}

static void
on_closed(td_ctl_conn_t *c, td_status_t why, const char *reason, void *arg)
{
    for (int i = 0; i < NRANKS; i++)
        if (g.rank_conn[i] == c)
            g.rank_conn[i] = NULL;
}

static void
prefill(int i, int rank, size_t n)
{
    const td_layout_t *l = g.engine->layout;
    req_t *r = &g.reqs[i];
    r->rank = rank;
    r->len = n;
    r->prompt = malloc(n * sizeof(int32_t));
    for (size_t k = 0; k < n; k++)
        r->prompt[k] = (int32_t)((k * 31 + (size_t)i * 7) % 1000);
    Tandem__SegDest sd[16], *sdp[16];
    for (uint32_t s = 0; s < l->nsegs; s++) {
        tandem__seg_dest__init(&sd[s]);
        sd[s].seg = s;
        sd[s].pool_id = s;
        sd[s].n_blocks = l->segs[s].kind == TD_LAYOUT_FIXED ? 1 : td_layout_blocks(l, &l->segs[s], n);
        CHECK(sd[s].n_blocks <= 800);
        for (size_t b = 0; b < sd[s].n_blocks; b++)
            r->blocks[s][b] = g.next_block[s]++ % POOL_BLOCKS;
        sd[s].blocks = r->blocks[s];
        sdp[s] = &sd[s];
    }
    Tandem__KvDest d = TANDEM__KV_DEST__INIT;
    d.node_id = "dec";
    d.incarnation = td_xfer_incarnation(g.rcv);
    d.xfer_id = (uint64_t)i;
    td_xfer_token_t tok = td_test_token(d.xfer_id);
    d.xfer_token.data = tok.b;
    d.xfer_token.len = TD_XFER_TOKEN_LEN;
    d.n_segs = l->nsegs;
    d.segs = sdp;
    Tandem__Prefill p = TANDEM__PREFILL__INIT;
    p.req_id = (uint64_t)i;
    p.n_tokens = n;
    p.tokens = r->prompt;
    p.dest = &d;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL;
    env.prefill = &p;
    send_env(g.rank_conn[rank], &env);
}

static void
cancel(int i)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    c.req_id = (uint64_t)i;
    c.reason = "driver";
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CANCEL;
    env.cancel = &c;
    send_env(g.rank_conn[g.reqs[i].rank], &env);
}

/* Run the loop until *v >= want (or the time is up); 1 when reached. */
static int
wait_for(const int *v, int want, int ms)
{
    uint64_t until = td_testutil_now_ms() + (uint64_t)ms;
    while (*v < want && td_testutil_now_ms() < until)
        event_base_loop(g.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    return *v >= want;
}

static void
spawn(const char *exe, uint16_t port, const char *secret, const char *log)
{
    char routers[64];
    snprintf(routers, sizeof(routers), "--routers=127.0.0.1:%u", port);
    char secret_opt[256];
    snprintf(secret_opt, sizeof(secret_opt), "--secret-file=%s", secret);
    const char *argv[32] = { exe, routers, secret_opt, "--node-id=pf", "--ranks=2",
                             "--chunk-tokens=8", "--transports=shm,self",
                             "--xfer-deadline-ms=3000" };
    size_t n = 8;
    for (size_t i = 0; i < NENGINE_ARGS; i++)
        argv[n++] = engine_args[i];
    argv[n] = NULL;
    g.child = fork();
    if (g.child == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0)
            dup2(fd, 2);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
}

/* A datagram socket standing in for systemd's NOTIFY_SOCKET. */
static int
notify_open(const char *path)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof(sun.sun_path))
        return -1;
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0)
        return -1;
    setenv("NOTIFY_SOCKET", path, 1);
    return fd;
}

/* 1 when one of the datagrams received so far contains what. */
static int
notify_has(int fd, const char *what)
{
    char buf[1024];
    ssize_t n;
    int found = 0;
    while ((n = recv(fd, buf, sizeof(buf) - 1, 0)) > 0) {
        buf[n] = 0;
        found |= strstr(buf, what) != NULL;
    }
    return found;
}

static int
log_has(const char *log, const char *what)
{
    char buf[1 << 16];
    FILE *f = fopen(log, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, what) != NULL;
}

/* The ready line is written by the daemon's main thread, which may come
 * after its ranks registered: poll for it. */
static int
wait_log(const char *log, const char *what, int ms)
{
    uint64_t until = td_testutil_now_ms() + (uint64_t)ms;
    while (!log_has(log, what)) {
        if (td_testutil_now_ms() >= until)
            return 0;
        usleep(10000);
    }
    return 1;
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: prefilld-driver PREFILLD\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    alarm(40);
    td_log_set_level(TD_LOG_WARN);
    char dir[] = "/tmp/prefilld-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char secret[128], log[128], notify[128];
    snprintf(secret, sizeof(secret), "%s/secret", dir);
    snprintf(notify, sizeof(notify), "%s/notify", dir);
    int nfd = notify_open(notify);
    CHECK(nfd >= 0);
    snprintf(log, sizeof(log), "%s/prefilld.log", dir);
    FILE *f = fopen(secret, "w");
    fputs("prefilld-test-secret\n", f);
    fclose(f);

    /* the engine both sides agree on, from the same options */
    td_engine_config_t ec;
    CHECK_STATUS(td_engine_config_defaults(&ec), TD_OK);
    td_layout_config_t *lc = &ec.synth.layout;
    free(lc->kv_sources);
    lc->kv_sources = strdup("1:2,3:1");
    lc->layers = 4, lc->kv_entry_bytes = 24, lc->index_entry_bytes = 8, lc->window = 8;
    lc->window_entry_bytes = 16, lc->partial_entry_bytes = 32, lc->block_entries = 4;
    ec.synth.vocab = 1000;
    ec.synth.prefill_us = 20;
    CHECK_STATUS(td_engine_create(test_engines, &ec, &g.engine), TD_OK);
    td_engine_config_free(&ec);
    char fp[17];
    snprintf(fp, sizeof(fp), "%016" PRIx64, g.engine->fingerprint);

    g.base = event_base_new();
    td_xfer_config_t xc = { .incarnation = 0x2222, .transports = "shm,self" };
    CHECK_STATUS(td_xfer_create(g.base, &xc, &g.rcv), TD_OK);
    td_xfer_set_note_handler(g.rcv, on_note, NULL);
    td_xfer_set_note_auth(g.rcv, td_test_token_auth, NULL);
    const td_layout_t *l = g.engine->layout;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        const td_layout_seg_t *seg = &l->segs[s];
        size_t bs = (seg->kind == TD_LAYOUT_FIXED ? seg->entries : l->block_entries) *
                    (size_t)seg->entry_bytes;
        CHECK_STATUS(td_xfer_pool_create(g.rcv, s, TD_XFER_MEM_HOST, NULL, bs, POOL_BLOCKS,
                                         &g.pools[s]), TD_OK);
    }
    const char *sec = "prefilld-test-secret";
    td_ctl_config_t cc = {
        .ident = { .protocol_version = TD_HELLO_PROTOCOL_VERSION,
                   .role = TANDEM__ROLE__ROLE_ROUTER, .node_id = "router",
                   .incarnation = 0x3333, .model_fingerprint = fp,
                   .kv_layout_hash = l->hash },
        .secret = (const uint8_t *)sec, .secret_len = strlen(sec),
    };
    td_ctl_handlers_t h = { on_established, on_message, on_closed, NULL };
    td_ctl_listener_t *lst;
    CHECK_STATUS(td_ctl_listener_create(g.base, &cc, &h, "127.0.0.1", 0, &lst), TD_OK);
    spawn(argv[1], td_ctl_listener_port(lst), secret, log);

    /* 1. both ranks register and get the decode peer */
    CHECK(wait_for(&g.registrations, NRANKS, 10000));
    CHECK(wait_log(log, "prefilld ready: ", 10000));
    int ready = 0;   /* sent right after the ready line: poll for it too */
    for (uint64_t until = td_testutil_now_ms() + 5000;
         !(ready |= notify_has(nfd, "READY=1")) && td_testutil_now_ms() < until;)
        usleep(10000);
    CHECK(ready);
    if (g.registrations == NRANKS) {
        /* 2. interleaved requests on both ranks, one canceled */
        prefill(0, 0, 300);
        prefill(1, 0, 9);
        prefill(2, 0, 64);
        prefill(3, 1, 50);
        prefill(4, 1, 3000);
        cancel(4);
        /* PrefillDone (TCP) may overtake the note (UCX): wait for both */
        for (int i = 0; i < 5; i++)
            CHECK(wait_for(&g.reqs[i].done, 1, 10000) && wait_for(&g.reqs[i].terminal, 1, 5000));
        for (int i = 0; i < 4; i++) {
            CHECK_STATUS(g.reqs[i].done_status, TD_OK);
            CHECK(g.reqs[i].verified);
            CHECK(g.reqs[i].sum_ok);
            CHECK_EQ_INT(g.reqs[i].done_token, g.reqs[i].first_token);
        }
        CHECK_STATUS(g.reqs[4].done_status, TD_ERR_CANCELED);
        CHECK(g.reqs[4].canceled);
        /* 3. the router's connection to rank 0 drops mid-prefill: canceled
         * with its note, never reported; the rank registers again */
        prefill(5, 0, 3000);
        int never = 0;
        wait_for(&never, 1, 100);
        td_ctl_conn_close(g.rank_conn[0], TANDEM__REJECT_CODE__REJECT_PROTO, "driver drops");
        CHECK(wait_for(&g.reqs[5].terminal, 1, 5000));
        CHECK(g.reqs[5].canceled);
        CHECK(wait_for(&g.registrations, NRANKS + 1, 10000));
        /* 4. SIGTERM mid-prefill: a drain. Both ranks register again as
         * draining; the task in hand finishes and is reported; a new
         * Prefill is refused (PrefillDone canceled, a failed note); exit 0 */
        prefill(6, 1, 3000);
        wait_for(&never, 1, 100);
        kill(g.child, SIGTERM);
        CHECK(wait_for(&g.draining_regs, NRANKS, 5000));
        prefill(7, 0, 20);
        for (int i = 6; i < 8; i++)
            CHECK(wait_for(&g.reqs[i].done, 1, 10000) && wait_for(&g.reqs[i].terminal, 1, 5000));
        CHECK(notify_has(nfd, "STOPPING=1"));
        CHECK_STATUS(g.reqs[6].done_status, TD_OK);
        CHECK(g.reqs[6].verified && g.reqs[6].sum_ok);
        CHECK_STATUS(g.reqs[7].done_status, TD_ERR_CANCELED);
        CHECK(g.reqs[7].failed);   /* refused: its note says why */
        wait_for(&never, 1, 100);   /* duplicates would arrive now */
        for (int i = 0; i < 8; i++)
            CHECK_EQ_INT(g.reqs[i].terminal, 1);
    }
    int status = 0;
    uint64_t until = td_testutil_now_ms() + 10000;
    pid_t w = 0;
    while ((w = waitpid(g.child, &status, WNOHANG)) == 0 && td_testutil_now_ms() < until)
        event_base_loop(g.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    if (w == 0) {
        kill(g.child, SIGKILL);
        waitpid(g.child, &status, 0);
        CHECK(!"prefilld did not exit after SIGTERM");
    } else {
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    g.child = 0;
    if (td_check_failures) {
        fprintf(stderr, "---- prefilld log ----\n");
        FILE *lf = fopen(log, "r");
        char line[512];
        while (lf && fgets(line, sizeof(line), lf))
            fputs(line, stderr);
        if (lf)
            fclose(lf);
    }
    td_ctl_listener_destroy(lst);
    for (uint32_t s = 0; s < l->nsegs; s++)
        td_xfer_pool_destroy(g.pools[s]);
    td_xfer_destroy(g.rcv);
    td_engine_destroy(g.engine);
    event_base_free(g.base);
    for (int i = 0; i < MAX_REQS; i++)
        free(g.reqs[i].prompt);
    close(nfd);
    unlink(notify);
    unlink(secret);
    unlink(log);
    rmdir(dir);
    return td_check_exit("prefilld-driver");
}
