/* tests/integration/rtr_fake_worker.c — a stand-in prefill rank and decode
 * rank (one process, two links via net/link.c) for routerd's black-box
 * tests: it speaks the control protocol of docs/cluster.md but moves no KV.
 * Decode tokens are the bytes of TEXT, cycling, one per message every
 * --tok-ms; Load reports one KV block per admitted request, and no free KV
 * once --max-batch requests are held (more are rejected, NO_CAPACITY, as a
 * full decoded does). Misbehaviours on
 * request: --admit-delay-ms answers Admit late; --prefill-done-early sends a
 * PrefillDone (failed) from the prefill rank as soon as the decode rank gets
 * the Admit, before any Prefill could have been sent. --dep ID:RANK:SIZE
 * registers its ranks as rank RANK of the DEP domain ID of SIZE ranks;
 * --kv-blocks N sizes its KV (64 tokens a block). A decode rank without
 * the prefill rank (--role decode) decodes from its AdmitOk on.
 * A prefix cache (docs/kvrouting.md): --cache-block G registers the prefill
 * rank with cache blocks of G tokens; --cache-prompt TEXT makes it hold the
 * whole blocks of TEXT's bytes (routerd's byte tokens), announced in a
 * CacheEvent once up; its PrefillDone reports the prompt's prefix it holds
 * as cached_tokens and its Load the CacheStats; a CacheFlush (printed)
 * empties it and is answered with a cleared event. --cache-junk follows the
 * announcement with malformed events (a skipped seq, a 0 hash).
 * --queued-tokens N: the prefill rank's Load says N tokens wait there.
 * --load-once: the decode rank sends its Load once, when up, never again
 * (the router must count the rows its Released messages free).
 * A decode domain's join instead (docs/dep.md, "A domain across processes"):
 * --join ID:RANK:SIZE sends DomainJoin with the address --join-addr TEXT
 * (or --join-addr-len N bytes), waits up to --join-wait-ms (5000) and prints
 * "peers: A0 A1 ..." (exit 0) or "join failed: STATUS" (exit 1);
 * --join-as decode joins on a decode rank's connection, not a tool's.
 * usage: rtr_fake_worker --router H:P --secret-file F [--node N]
 *        [--role both|decode|prefill] [--reject] [--prefill-hang] [--tok-ms N]
 *        [--max-context N] [--admit-delay-ms N] [--prefill-done-early]
 *        [--max-batch N] [--dep ID:RANK:SIZE] [--kv-blocks N]
 *        [--cache-block G] [--cache-prompt TEXT] [--cache-junk] [--queued-tokens N]
 *        [--load-once] */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "chainhash.h"
#include "daemon.h"
#include "domjoin.h"
#include "engine.h"
#include "registry.h"
#include "link.h"
#include "log.h"

static const td_engine_kind_t *const test_engines[] = { &td_synth_kind, NULL };

#define TEXT "the quick brown fox jumps over the lazy dog "
#define MAXREQ 256

typedef struct {
    uint64_t id;            /* 0: free slot */
    uint32_t max_tokens, sent;
    uint64_t ntokens;       /* prompt + max_tokens: Released.tokens */
    bool admitting;         /* AdmitOk not sent yet (--admit-delay-ms) */
    bool prefilled;
    struct event *tick;     /* AdmitOk when admitting, else the next token */
} fake_req_t;

typedef struct {
    struct event_base *base;
    td_link_t *dlink, *plink;
    td_link_router_t *drouter, *prouter;
    fake_req_t reqs[MAXREQ];
    uint32_t tok_ms;
    uint32_t admit_delay_ms;
    uint32_t max_batch;     /* requests held at once (<= MAXREQ) */
    uint32_t blocks;        /* KV blocks of 64 tokens (--kv-blocks, default 1000) */
    bool reject;
    bool prefill_hang;      /* never answer Prefill (a rank stuck mid-prefill) */
    bool prefill_done_early;
    int32_t bad_token;      /* >= 0: the third token sent is this id (--bad-token) */
    char node[65];
    /* the prefill rank's prefix cache (--cache-block) */
    uint32_t cache_block;   /* G; 0: none */
    uint64_t seed;          /* td_chain_seed of its model and layout */
    uint64_t held[256];     /* [nheld] the blocks it holds */
    size_t nheld;
    uint64_t cache_seq;     /* the last CacheEvent's seq on this connection */
    bool cache_junk;
    uint64_t queued_tokens; /* its Load's queued_tokens */
    bool load_once;         /* the decode rank's Load only when up */
    bool load_sent;
    Tandem__CacheStats cstats;
} fake_t;

static fake_t F;

static fake_req_t *
req_find(uint64_t id)
{
    for (int i = 0; i < MAXREQ; i++)
        if (F.reqs[i].id == id && id)
            return &F.reqs[i];
    return NULL;
}

static uint32_t
held(void)
{
    uint32_t n = 0;

    for (int i = 0; i < MAXREQ; i++)
        n += F.reqs[i].id != 0;
    return n;
}

static void
send_load(void)
{
    Tandem__Load ld = TANDEM__LOAD__INIT;

    ld.kv_blocks_used = held();
    ld.kv_blocks_free = F.blocks > ld.kv_blocks_used ? F.blocks - ld.kv_blocks_used : 0;
    ld.kv_tokens_used = ld.kv_blocks_used * 64;
    /* as decoded: the longest request that fits now, 0 with no row free */
    ld.kv_tokens_free = ld.kv_blocks_used < F.max_batch ? ld.kv_blocks_free * 64 : 0;
    ld.running = (uint32_t)ld.kv_blocks_used;
    if (F.dlink && !(F.load_once && F.load_sent))
        td_link_load(F.dlink, &ld);
    F.load_sent = F.drouter != NULL;
}

/* The prefill rank's Load: --queued-tokens and its CacheStats. */
static void
send_prefill_load(void)
{
    static Tandem__Load ld;   /* td_link_load keeps a shallow copy: cache points here */

    tandem__load__init(&ld);
    ld.queued_tokens = F.queued_tokens;
    F.cstats.pool_blocks = F.nheld;
    F.cstats.pool_bytes = F.nheld * 4096;
    F.cstats.host_bytes = 1u << 20;
    F.cstats.host_budget = 64u << 20;
    F.cstats.ssd_budget = 1u << 30;
    ld.cache = F.cache_block ? &F.cstats : NULL;
    if (F.plink)
        td_link_load(F.plink, &ld);
}

static void
cache_event(bool cleared, const uint64_t *added, size_t nadded, uint64_t seq)
{
    Tandem__CacheEvent ev = TANDEM__CACHE_EVENT__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    ev.seq = seq;
    ev.cleared = cleared;
    ev.added = (uint64_t *)added;
    ev.n_added = nadded;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_CACHE_EVENT;
    env.cache_event = &ev;
    if (F.prouter)
        (void)td_link_send(F.plink, F.prouter, &env);
}

/* Of the prompt, the tokens in whole blocks it holds from the first. */
static uint64_t
cache_prefix(const int32_t *tokens, size_t n)
{
    uint64_t h[256];
    size_t nh = td_chain_hashes(F.seed, tokens, n, F.cache_block, h, 256), k = 0;

    while (k < nh && k < F.nheld && h[k] == F.held[k])
        k++;
    return (uint64_t)k * F.cache_block;
}

static void
dsend(Tandem__Envelope *env)
{
    if (F.drouter)
        (void)td_link_send(F.dlink, F.drouter, env);
}

static void
req_release(fake_req_t *q)
{
    Tandem__Released rel = TANDEM__RELEASED__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    rel.req_id = q->id;
    rel.tokens = q->ntokens;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_RELEASED;
    env.released = &rel;
    dsend(&env);
    event_free(q->tick);
    memset(q, 0, sizeof *q);
    send_load();
}

static void
admit_ok(fake_req_t *q)
{
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
    Tandem__AdmitOk ok = TANDEM__ADMIT_OK__INIT;
    Tandem__KvDest dest = TANDEM__KV_DEST__INIT;

    q->admitting = false;
    dest.node_id = F.node;
    ok.req_id = q->id;
    ok.dest = &dest;
    out.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK;
    out.admit_ok = &ok;
    dsend(&out);
    if (!F.plink) {   /* --role decode: no prefill rank of ours to hear from */
        struct timeval now = { 0, 0 };
        q->prefilled = true;
        evtimer_add(q->tick, &now);
    }
}

/* What a buggy prefill rank might send: a PrefillDone for a request it was
 * never asked to prefill. */
static void
prefill_done_early(uint64_t id)
{
    Tandem__PrefillDone pd = TANDEM__PREFILL_DONE__INIT;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;

    pd.req_id = id;
    pd.status = TD_ERR_IO;
    pd.reason = "fake worker: done before any Prefill";
    out.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE;
    out.prefill_done = &pd;
    if (F.prouter)
        (void)td_link_send(F.plink, F.prouter, &out);
    printf("prefill_done_early %016" PRIx64 "\n", id);
    fflush(stdout);
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    fake_req_t *q = arg;
    Tandem__Tokens tk = TANDEM__TOKENS__INIT;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    int32_t tok = F.bad_token >= 0 && q->sent == 2 ? F.bad_token
                                                   : (unsigned char)TEXT[q->sent % (sizeof TEXT - 1)];
    struct timeval tv = td_ctl_timeval_ms(F.tok_ms);

    if (q->admitting) {
        admit_ok(q);
        return;
    }
    tk.req_id = q->id;
    tk.n_tokens = 1;
    tk.tokens = &tok;
    q->sent++;
    tk.finish = q->sent >= q->max_tokens ? TANDEM__FINISH__FINISH_LENGTH : TANDEM__FINISH__FINISH_NONE;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_TOKENS;
    env.tokens = &tk;
    dsend(&env);
    if (tk.finish != TANDEM__FINISH__FINISH_NONE)
        req_release(q);
    else
        evtimer_add(q->tick, &tv);
}

static void
on_decode_msg(td_link_t *l, td_link_router_t *r, const Tandem__Envelope *env, void *arg)
{
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;

    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_ADMIT) {
        const Tandem__Admit *a = env->admit;
        fake_req_t *q = NULL;
        for (int i = 0; i < MAXREQ && !q; i++)
            if (!F.reqs[i].id)
                q = &F.reqs[i];
        if (F.reject || !q || held() >= F.max_batch || !a->sampling) {
            Tandem__AdmitReject rej = TANDEM__ADMIT_REJECT__INIT;
            rej.req_id = a->req_id;
            rej.code = TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_NO_CAPACITY;
            rej.reason = "fake worker: rejecting";
            out.payload_case = TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT;
            out.admit_reject = &rej;
            dsend(&out);
            return;
        }
        q->id = a->req_id;
        q->max_tokens = a->sampling->max_tokens;
        q->ntokens = a->n_tokens + q->max_tokens;
        q->tick = evtimer_new(F.base, on_tick, q);
        printf("admit %016" PRIx64 " tokens=%zu max_tokens=%u\n", q->id, a->n_tokens,
               q->max_tokens);
        fflush(stdout);
        if (F.prefill_done_early)
            prefill_done_early(q->id);
        if (F.admit_delay_ms) {
            struct timeval tv = td_ctl_timeval_ms(F.admit_delay_ms);
            q->admitting = true;
            evtimer_add(q->tick, &tv);
        } else {
            admit_ok(q);
        }
        send_load();
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_CANCEL) {
        fake_req_t *q = req_find(env->cancel->req_id);
        printf("cancel %016" PRIx64 " %s prefill_not_sent=%d\n", env->cancel->req_id,
               q ? "held" : "unknown", env->cancel->prefill_not_sent);
        fflush(stdout);
        if (q)
            req_release(q);
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_DRAIN) {
        printf("drain %d\n", env->drain->draining);
        fflush(stdout);
    }
}

static void
on_prefill_msg(td_link_t *l, td_link_router_t *r, const Tandem__Envelope *env, void *arg)
{
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_PREFILL && F.prefill_hang) {
        printf("prefill %016" PRIx64 " held\n", env->prefill->req_id);
        fflush(stdout);
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_PREFILL) {
        Tandem__PrefillDone pd = TANDEM__PREFILL_DONE__INIT;
        Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
        fake_req_t *q = req_find(env->prefill->req_id);
        struct timeval now = { 0, 0 };

        pd.req_id = env->prefill->req_id;
        pd.first_token = (unsigned char)TEXT[0];
        if (F.cache_block) {
            pd.cached_tokens = cache_prefix(env->prefill->tokens, env->prefill->n_tokens);
            pd.computed_tokens = env->prefill->n_tokens - pd.cached_tokens;
            F.cstats.lookup_tokens += env->prefill->n_tokens;
            F.cstats.hit_pool_tokens += pd.cached_tokens;
            F.cstats.computed_tokens += pd.computed_tokens;
        }
        printf("prefill %016" PRIx64 " tokens=%zu cached=%" PRIu64 "\n", pd.req_id,
               env->prefill->n_tokens, pd.cached_tokens);
        fflush(stdout);
        out.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE;
        out.prefill_done = &pd;
        (void)td_link_send(l, r, &out);
        if (q && !q->prefilled) {   /* the KV "arrived": decode starts */
            q->prefilled = true;
            evtimer_add(q->tick, &now);
        }
        send_prefill_load();
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_CACHE_FLUSH) {
        printf("cache_flush %s\n", env->cache_flush->reason);
        fflush(stdout);
        F.nheld = 0;
        cache_event(true, NULL, 0, ++F.cache_seq);
        send_prefill_load();
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER) {
        printf("decode_peer %s/%u gone=%d\n", env->decode_peer->node_id,
               env->decode_peer->rank_id, env->decode_peer->gone);
        fflush(stdout);
    }
}

static void
on_up(td_link_t *l, td_link_router_t *r, void *arg)
{
    if (l == F.dlink)
        F.drouter = r;
    else
        F.prouter = r;
    printf("up %s\n", l == F.dlink ? "decode" : "prefill");
    fflush(stdout);
    if (l == F.dlink)
        send_load();
    if (l == F.plink && F.cache_block) {   /* a new connection: everything it holds */
        F.cache_seq = 0;
        cache_event(true, F.held, F.nheld, ++F.cache_seq);
        if (F.cache_junk) {
            uint64_t zero = 0;
            cache_event(false, F.held, F.nheld, F.cache_seq + 5);   /* seq skipped */
            cache_event(false, &zero, 1, F.cache_seq + 6);          /* a 0 hash */
            cache_event(false, F.held, F.nheld, 1);                 /* seq backwards */
            F.cache_seq = 1;
        }
    }
    if (l == F.plink)
        send_prefill_load();
}

static void
on_down(td_link_t *l, td_link_router_t *r, td_status_t why, void *arg)
{
    if (l == F.dlink)
        F.drouter = NULL;
    else
        F.prouter = NULL;
    printf("down %s: %s\n", l == F.dlink ? "decode" : "prefill", td_status_str(why));
    fflush(stdout);
}

static void
on_signal(evutil_socket_t sig, short what, void *arg)
{
    event_base_loopbreak(F.base);
}

/* --join: one DomainJoin through net/domjoin.c, the peers printed as
 * text; 0 when they came, 1 otherwise. */
static int
fake_join(const td_ctl_config_t *ctl, const char *router, const char *id, uint32_t rank,
          uint32_t size, const char *addr, size_t len, uint64_t wait_ms, bool as_rank)
{
    td_domjoin_config_t jc = { .routers = router, .ctl = *ctl, .id = id, .size = size,
                               .rank = rank, .wait_ms = wait_ms };
    void **addrs = calloc(size ? size : 1, sizeof(*addrs));
    size_t *lens = calloc(size ? size : 1, sizeof(*lens));
    char *buf = NULL;
    td_status_t st;

    jc.ctl.ident.role = as_rank ? TANDEM__ROLE__ROLE_DECODE : TANDEM__ROLE__ROLE_TOOL;
    jc.ctl.ident.rank_id = rank;
    if (len > 0) {   /* --join-addr-len: that many bytes */
        if ((buf = malloc(len)) == NULL)
            return 1;
        memset(buf, 'x', len);
        addr = buf;
    } else {
        len = strlen(addr);
    }
    if (addrs == NULL || lens == NULL)
        return 1;
    st = td_domjoin_run(&jc, addr, len, addrs, lens);
    if (st == TD_OK) {
        printf("peers:");
        for (uint32_t r = 0; r < size; r++) {
            printf(" %.*s", lens[r] > 32 ? 32 : (int)lens[r], (const char *)addrs[r]);
            free(addrs[r]);
        }
        printf("\n");
    } else {
        printf("join failed: %s\n", td_status_str(st));
    }
    fflush(stdout);
    free(addrs);
    free(lens);
    free(buf);
    return st == TD_OK ? 0 : 1;
}

int
main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "router", 1, 0, 'r' }, { "secret-file", 1, 0, 's' }, { "node", 1, 0, 'n' },
        { "role", 1, 0, 'o' }, { "reject", 0, 0, 'j' }, { "tok-ms", 1, 0, 't' },
        { "max-context", 1, 0, 'c' }, { "prefill-hang", 0, 0, 'h' },
        { "admit-delay-ms", 1, 0, 'a' }, { "prefill-done-early", 0, 0, 'e' },
        { "bad-token", 1, 0, 'b' }, { "max-batch", 1, 0, 'm' }, { "dep", 1, 0, 'd' },
        { "kv-blocks", 1, 0, 'k' }, { "cache-block", 1, 0, 'G' },
        { "cache-prompt", 1, 0, 'P' }, { "cache-junk", 0, 0, 'J' },
        { "queued-tokens", 1, 0, 'Q' }, { "join", 1, 0, 'D' }, { "join-addr", 1, 0, 'A' },
        { "join-addr-len", 1, 0, 'L' }, { "join-wait-ms", 1, 0, 'W' },
        { "join-as", 1, 0, 'R' }, { "load-once", 0, 0, 'O' }, { 0, 0, 0, 0 },
    };
    char join_id[300] = "";
    unsigned join_rank = 0, join_size = 0;
    const char *join_addr = "addr", *join_as = "tool";
    size_t join_len = 0;
    uint64_t join_wait_ms = 5000;
    const char *cache_prompt = "";
    const char *router = NULL, *secret_file = NULL, *role = "both";
    char dep_domain[65] = "";
    unsigned dep_rank = 0, dep_size = 0;
    uint64_t max_context = 1u << 20;
    char secret[256];
    td_engine_config_t ecfg;
    td_engine_t *eng;
    char fp[17];
    int c, rc = 1;
    FILE *f;

    snprintf(F.node, sizeof F.node, "fake");
    F.tok_ms = 2;
    F.max_batch = MAXREQ;
    F.bad_token = -1;
    F.blocks = 1000;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'r': router = optarg; break;
        case 's': secret_file = optarg; break;
        case 'n': snprintf(F.node, sizeof F.node, "%s", optarg); break;
        case 'o': role = optarg; break;
        case 'j': F.reject = true; break;
        case 'h': F.prefill_hang = true; break;
        case 't': F.tok_ms = (uint32_t)atoi(optarg); break;
        case 'c': max_context = strtoull(optarg, NULL, 10); break;
        case 'a': F.admit_delay_ms = (uint32_t)atoi(optarg); break;
        case 'e': F.prefill_done_early = true; break;
        case 'b': F.bad_token = (int32_t)atoi(optarg); break;
        case 'm': F.max_batch = (uint32_t)atoi(optarg); break;
        case 'd':
            if (sscanf(optarg, "%64[^:]:%u:%u", dep_domain, &dep_rank, &dep_size) != 3)
                return 2;
            break;
        case 'k': F.blocks = (uint32_t)atoi(optarg); break;
        case 'G': F.cache_block = (uint32_t)atoi(optarg); break;
        case 'P': cache_prompt = optarg; break;
        case 'J': F.cache_junk = true; break;
        case 'Q': F.queued_tokens = strtoull(optarg, NULL, 10); break;
        case 'D':
            if (sscanf(optarg, "%299[^:]:%u:%u", join_id, &join_rank, &join_size) != 3)
                return 2;
            break;
        case 'A': join_addr = optarg; break;
        case 'L': join_len = strtoull(optarg, NULL, 10); break;
        case 'W': join_wait_ms = strtoull(optarg, NULL, 10); break;
        case 'R': join_as = optarg; break;
        case 'O': F.load_once = true; break;
        default: return 2;
        }
    }
    if (!router || !secret_file || F.max_batch < 1 || F.max_batch > MAXREQ ||
        !(f = fopen(secret_file, "r")))
        return 2;
    size_t slen = fread(secret, 1, sizeof secret, f);
    fclose(f);
    while (slen > 0 && (secret[slen - 1] == '\n' || secret[slen - 1] == '\r'))
        slen--;   /* as net/daemon.c reads it */
    if (td_engine_config_defaults(&ecfg) != TD_OK)
        return 1;
    ecfg.synth.vocab = 256;   /* routerd's byte-level tokenizer (routerd_test.py) */
    if (td_engine_create(test_engines, &ecfg, &eng) != TD_OK)
        return 1;
    snprintf(fp, sizeof fp, "%016" PRIx64, eng->fingerprint);
    F.seed = td_chain_seed(fp, eng->layout->hash);
    tandem__cache_stats__init(&F.cstats);
    if (F.cache_block) {   /* the blocks of --cache-prompt, as routerd tokenizes it */
        size_t n = strlen(cache_prompt);
        int32_t *tok = malloc((n ? n : 1) * sizeof *tok);
        if (!tok)
            return 1;
        for (size_t i = 0; i < n; i++)
            tok[i] = (unsigned char)cache_prompt[i];
        F.nheld = td_chain_hashes(F.seed, tok, n, F.cache_block, F.held, 256);
        free(tok);
    }
    signal(SIGPIPE, SIG_IGN);
    F.base = event_base_new();
    struct event *sig = evsignal_new(F.base, SIGTERM, on_signal, NULL);
    evsignal_add(sig, NULL);

    td_link_handlers_t h = { .on_up = on_up, .on_down = on_down };
    td_link_config_t lc = { .routers = router, .backoff_min_ms = 50, .backoff_max_ms = 200 };
    Tandem__Register reg = TANDEM__REGISTER__INIT;
    lc.ctl.ident = (td_hello_ident_t){ TD_HELLO_PROTOCOL_VERSION, TANDEM__ROLE__ROLE_DECODE,
                                       F.node, 0, td_daemon_random64(), fp, eng->layout->hash };
    lc.ctl.secret = (const uint8_t *)secret;
    lc.ctl.secret_len = slen;
    if (join_id[0]) {
        rc = fake_join(&lc.ctl, router, join_id, join_rank, join_size, join_addr, join_len,
                       join_wait_ms, strcmp(join_as, "decode") == 0);
        goto out;
    }
    reg.engine_name = "synthetic";
    reg.engine_kind = "fake worker";
    reg.vocab_size = eng->vocab;
    reg.max_context = max_context;
    reg.kv_tokens_total = (uint64_t)F.blocks * 64;
    reg.max_batch = F.max_batch;
    reg.dep_domain = dep_domain;
    reg.dep_size = dep_size;
    reg.dep_rank = dep_rank;
    reg.cache_block_tokens = F.cache_block;
    if (strcmp(role, "prefill") != 0) {
        h.on_message = on_decode_msg;
        if (td_link_create(F.base, &lc, &reg, &h, &F.dlink) != TD_OK)
            goto out;
    }
    if (strcmp(role, "decode") != 0) {
        lc.ctl.ident.role = TANDEM__ROLE__ROLE_PREFILL;
        lc.ctl.ident.incarnation = td_daemon_random64();
        h.on_message = on_prefill_msg;
        if (td_link_create(F.base, &lc, &reg, &h, &F.plink) != TD_OK)
            goto out;
    }
    event_base_dispatch(F.base);
    rc = 0;
out:
    for (int i = 0; i < MAXREQ; i++)
        if (F.reqs[i].tick)
            event_free(F.reqs[i].tick);
    if (F.dlink)
        td_link_destroy(F.dlink);
    if (F.plink)
        td_link_destroy(F.plink);
    event_free(sig);
    event_base_free(F.base);
    td_engine_destroy(eng);
    td_engine_config_free(&ecfg);
    return rc;
}
