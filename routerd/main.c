/* routerd/main.c — the router daemon: options, the engine identity (model
 * fingerprint, KV layout hash, names for /v1/models), the HTTP, admin and
 * control listeners on one event loop, and the ready line. */
#include "grammar.h"
#include "router.h"
#include "chat.h"
#include "routes.h"
#include "rsched.h"
#include "tok_bpe.h"
#include "tok_bytes.h"
#include "v41id.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/http.h>

#include "chainhash.h"
#include "log.h"
#include "net.h"
#include "netif.h"

/* File descriptors kept out of the HTTP caps: the control listener and the
 * worker ranks' connections, the key and tokenizer files, the log. */
#define ROUTER_FD_RESERVE 128

#define ST td_router_cfg_t
static const td_config_opt_t router_opts[] = {
    TD_DAEMON_CONFIG_OPTS(ST, m),
    TD_ENGINE_CONFIG_OPTS(ST, eng),
    TD_CONFIG_OPT_STRING("http-listen", ST, http_listen, "127.0.0.1:8000",
                         "host:port of the openai api (port 0: any free port)"),
    TD_CONFIG_OPT_STRING("ctl-listen", ST, ctl_listen, "127.0.0.1:7100",
                         "host:port worker ranks connect to (port 0: any free port)"),
    TD_CONFIG_OPT_STRING("admin-listen", ST, admin_listen, "127.0.0.1:8001",
                         "host:port of the admin api (port 0: any free port; empty: no admin api)"),
    TD_CONFIG_OPT_STRING("api-keys-file", ST, api_keys_file, "",
                         "client api keys, one per line (empty: the api needs no key, "
                         "refused on a non-loopback http-listen without api-insecure)"),
    TD_CONFIG_OPT_BOOL("api-insecure", ST, api_insecure, "false",
                       "serve the openai api without api keys on an address other hosts "
                       "can reach (without it routerd refuses to start so)"),
    TD_CONFIG_OPT_STRING("admin-key-file", ST, admin_key_file, "",
                         "admin api keys, one per line (required with an admin listener)"),
    TD_CONFIG_OPT_STRING("model-name", ST, model_name, "",
                         "model id served in /v1/models (empty: tandem-<engine>)"),
    TD_CONFIG_OPT_STRING("tokenizer", ST, tokenizer, "",
                         "tokenizer.json, or a checkpoint directory holding one; with it chat "
                         "requests use the DeepSeek-V4.1 chat format (empty: the model "
                         "directory's, else a byte-level stand-in)"),
    TD_CONFIG_OPT_SIZE("max-body", ST, max_body, "1MiB", 1024, 1ull << 30,
                       "largest request body accepted"),
    /* the HTTP listeners' limits (http.h) */
    TD_CONFIG_OPT_UINT64("admin-max-connections", ST, admin_max_conns, "64", 0, 1u << 20,
                         "open connections on the admin listener (0: no cap)"),
    TD_CONFIG_OPT_DURATION("http-idle-timeout", ST, http_idle_timeout_ms, "60s", 100, 3600000,
                           "a kept-alive connection idle this long is closed"),
    TD_CONFIG_OPT_SIZE("http-max-buffered", ST, http_max_buffered, "256MiB", 1u << 20,
                       1ull << 40, "request bytes (heads and bodies) held at once across the "
                       "listeners; a request that would pass it gets 503"),
    TD_CONFIG_OPT_UINT64("http-max-connections", ST, http_max_conns, "8192", 0, 1u << 24,
                         "open connections on the api listener (0: no cap); both caps are "
                         "lowered to fit the file-descriptor limit"),
    TD_CONFIG_OPT_DURATION("http-read-timeout", ST, http_read_timeout_ms, "30s", 100, 3600000,
                           "a request's head and body must arrive within this of its first "
                           "byte (else 408 and the connection is closed)"),
    TD_CONFIG_OPT_DURATION("http-write-timeout", ST, http_write_timeout_ms, "60s", 0, 3600000,
                           "an answer whose bytes make no progress to the client this long "
                           "ends its connection (0: never)"),
    /* backpressure for slow readers (docs/routerd.md, "Backpressure") */
    TD_CONFIG_OPT_SIZE("stream-buffer-max", ST, stream_buffer_max, "1MiB", 4096, 1ull << 30,
                       "a stream's answer bytes buffered for its client before its decode row "
                       "is paused (it resumes once the client has read three quarters)"),
    TD_CONFIG_OPT_SIZE("response-buffer-max", ST, response_buffer_max, "64MiB", 65536,
                       1ull << 40, "answer bytes buffered for every client together; past it "
                       "every stream that sends is paused"),
    TD_CONFIG_OPT_SIZE("stream-sndbuf", ST, stream_sndbuf, "64KiB", 0, 64u << 20,
                       "kernel send buffer of a streaming connection (SO_SNDBUF; 0: the "
                       "kernel's), so that what waits for a slow client is counted above"),
    TD_CONFIG_OPT_DURATION("slow-reader-timeout", ST, slow_reader_timeout_ms, "60s", 100,
                           86400000, "a stream paused this long (its client reads too "
                           "slowly) is canceled"),
    TD_CONFIG_OPT_UINT64("max-tokens-limit", ST, max_tokens_limit, "32768", 1, 1u << 24,
                         "largest max_tokens a request may ask for"),
    TD_CONFIG_OPT_UINT64("max-tokens-default", ST, max_tokens_default, "256", 1, 1u << 24,
                         "max_tokens of a request that gives none"),
    TD_CONFIG_OPT_SIZE("max-stop-bytes", ST, max_stop_bytes, "512", 1, 1u << 20,
                       "longest stop string accepted, in bytes (a longer one gets 400)"),
    TD_CONFIG_OPT_SIZE("max-constraint-bytes", ST, max_constraint_bytes, "256KiB", 1024,
                       1u << 20, "largest structured-output spec (JSON schema, regex, grammar) "
                       "a request may carry (a larger one gets 400)"),
    TD_CONFIG_OPT_DURATION("constraint-budget", ST, constraint_budget_ms, "2s", 1, 60000,
                           "compile time a structured-output spec may take on a text thread "
                           "(a slower one gets 400)"),
    TD_CONFIG_OPT_UINT64("max-n", ST, max_n, "16", 1, TD_IREQ_MAX_N,
                         "most choices (n) one request may ask for; they share the prompt's "
                         "prefill and kv blocks"),
    TD_CONFIG_OPT_DURATION("request-timeout", ST, request_timeout_ms, "10m", 0, 86400000,
                           "a request still running after this fails (0: no limit)"),
    TD_CONFIG_OPT_DURATION("heartbeat", ST, heartbeat_ms, "1s", 10, 60000,
                           "control heartbeat interval; three missed mark a rank dead"),
    TD_CONFIG_OPT_SIZE("max-frame", ST, max_frame, "4MiB", 4096, 256ull << 20,
                       "largest control frame accepted from a worker rank"),
    TD_CONFIG_OPT_UINT64("retry-after", ST, retry_after_s, "1", 1, 3600,
                         "seconds in the retry-after header of a 503"),
    TD_CONFIG_OPT_UINT64("max-attempts", ST, max_attempts, "4", 1, TD_RSCHED_MAX_TRIED,
                         "admissions tried per request (decode rejects, lost ranks)"),
    /* KV-aware prefill placement (docs/kvrouting.md) */
    TD_CONFIG_OPT_DOUBLE("cache-weight", ST, cache_weight, "1.0", 0.0, 1000.0,
                         "prefill placement: a rank's cost is its queued tokens plus the "
                         "prompt's tokens less this times the prompt tokens its prefix cache "
                         "holds (0: by load only)"),
    TD_CONFIG_OPT_UINT64("cache-max-blocks", ST, cache_max_blocks, "4194304", 0, 1ull << 30,
                         "cache block hashes tracked per prefill rank; beyond it the rest of "
                         "a rank's announced blocks are not tracked (logged once)"),
    /* multi-turn: conditional disaggregation (docs/kvcache.md, "Multi-turn") */
    TD_CONFIG_OPT_UINT64("continue-max-suffix", ST, continue_max_suffix, "2048", 0, 1u << 24,
                         "a prompt that continues a state a decode rank kept (decoded's "
                         "retain) by at most this many tokens is prefilled on that rank, when "
                         "no prefill rank's cache holds more of it (0: never)"),
    TD_CONFIG_OPT_UINT64("continue-max-states", ST, continue_max_states, "65536", 1, 1u << 24,
                         "kept states of the decode ranks tracked; the oldest is forgotten "
                         "beyond it"),
    TD_CONFIG_OPT_BOOL("default-thinking", ST, default_thinking, "true",
                       "Messages and Responses requests that ask for neither thinking nor a "
                       "reasoning effort think (false: they do not)"),
    /* the Responses API's store (docs/api.md) */
    TD_CONFIG_OPT_STRING("responses-dir", ST, responses_dir, "",
                         "directory of stored responses (/v1/responses with store), shared "
                         "by the routers that name it (empty: nothing is stored; responses "
                         "say store false)"),
    TD_CONFIG_OPT_SIZE("responses-max-bytes", ST, responses_max_bytes, "1GiB", 4096,
                       1ull << 50, "the stored responses' bytes together; the oldest go first"),
    TD_CONFIG_OPT_DURATION("responses-max-age", ST, responses_max_age_ms, "720h", 1000,
                           1ull << 40, "a stored response older than this is gone"),
    /* admission: the queue, and the control port's unauthenticated connections */
    TD_CONFIG_OPT_UINT64("max-queued", ST, max_queued, "1024", 0, 1u << 20,
                         "requests that may wait for a decode rank with room; more get 503 "
                         "(0: none wait)"),
    TD_CONFIG_OPT_DURATION("queue-timeout", ST, queue_timeout_ms, "30s", 1, 3600000,
                           "a request that waited this long for a decode rank gets 503"),
    TD_CONFIG_OPT_UINT64("ctl-max-unauth", ST, ctl_max_unauth, "256", 1, 65536,
                         "control connections in the handshake; a new one closes the oldest"),
    TD_CONFIG_OPT_UINT64("ctl-max-unauth-per-source", ST, ctl_max_unauth_per_source, "64", 1,
                         65536, "control connections in the handshake from one address; a new "
                         "one closes that address's oldest"),
    /* text threads (rreq.h): parsing, chat encoding, tokenizing, detokenizing */
    TD_CONFIG_OPT_UINT64("text-threads", ST, text_threads, "0", 0, 256,
                         "threads that parse, encode and tokenize prompts and detokenize "
                         "replies, off the event loop (0: one per online cpu)"),
    TD_CONFIG_OPT_UINT64("text-inline-max", ST, text_inline_max, "16", 0, 1u << 20,
                         "largest batch of generated tokens (each counted 1 + its log-probability "
                         "alternatives) that the event loop detokenizes itself, a few being "
                         "cheaper there than on a text thread (0: always a text thread)"),
    TD_CONFIG_OPT_UINT64("text-inline-body", ST, text_inline_body, "512", 0, 65536,
                         "largest request body in bytes that the event loop parses, encodes "
                         "and tokenizes itself, a small one being cheaper there than on a text "
                         "thread (0: always a text thread)"),
    /* shutdown */
    TD_CONFIG_OPT_DURATION("drain-timeout", ST, drain_timeout_ms, "30s", 0, 3600000,
                           "on SIGTERM the api takes no new requests and those in flight "
                           "get this long to finish; the rest then end with an error"),
    TD_CONFIG_OPT_END
};
#undef ST

/* The V4.1 tokenizer from --tokenizer (or the model directory), else the
 * byte-level stand-in. */
static td_status_t
router_tokenizer(td_router_t *r)
{
    const td_router_cfg_t *cfg = r->cfg;
    const char *path = cfg->tokenizer[0] ? cfg->tokenizer : cfg->eng.model[0] ? cfg->eng.model
                                                                              : NULL;
    td_status_t st;

    if (!path)
        return td_tok_bytes_create(&r->tok);
    st = td_tok_bpe_create(path, &r->tok);   /* logs why it could not */
    if (st != TD_OK)
        return st;
    r->v41 = td_tok_bpe_tokenizer(r->tok);
    /* a tokenizer without the format's tokens (the V4 one lacks <｜System｜>)
     * could not encode a single chat prompt: refuse it now */
    size_t n;
    const char *const *names = td_chat_special_tokens(&n);
    for (size_t i = 0; i < n; i++) {
        uint32_t id;
        if (td_tokenizer_find(r->v41, names[i], strlen(names[i]), &id) != TD_OK) {
            td_error("tokenizer %s has no token \"%s\", which the DeepSeek-V4.1 chat format "
                     "needs: give the V4.1 checkpoint's tokenizer.json", path, names[i]);
            td_tok_destroy(r->tok);
            r->tok = NULL;
            r->v41 = NULL;
            return TD_ERR_MISMATCH;
        }
    }
    td_info("tokenizer %s: %s; chat requests use the DeepSeek-V4.1 chat format", path,
            r->tok->name);
    return TD_OK;
}

/* Without api keys the OpenAI API is open to whoever reaches it: refused on
 * an address other hosts can reach unless api-insecure says it is meant,
 * warned on loopback. Decided before anything listens. */
static td_status_t
router_check_auth(const td_router_t *r)
{
    const td_router_cfg_t *cfg = r->cfg;
    char host[TD_NET_HOST_MAX];
    uint16_t port;
    bool loopback;
    td_status_t st;

    if (r->keys)
        return TD_OK;
    st = td_net_addr_parse(cfg->http_listen, host, sizeof host, &port);   /* logs */
    if (st == TD_OK)
        st = td_netif_host_is_loopback(host, &loopback);                   /* logs */
    if (st != TD_OK)
        return st;
    if (loopback) {
        td_warn("no api-keys-file: the openai api on %s accepts requests without a key "
                "(loopback only)", cfg->http_listen);
    } else if (cfg->api_insecure) {
        td_warn("api-insecure: the openai api on %s accepts requests without a key from "
                "any host that reaches it", cfg->http_listen);
    } else {
        td_error("http-listen %s can be reached from other hosts and there is no "
                 "api-keys-file: give api-keys-file, listen on loopback, or set "
                 "api-insecure to serve the api without keys on purpose", cfg->http_listen);
        return TD_ERR_INVALID;
    }
    return TD_OK;
}

/* text-threads, 0 meaning one per online cpu. */
static unsigned
router_text_threads(const td_router_cfg_t *cfg)
{
    long n = cfg->text_threads ? (long)cfg->text_threads : sysconf(_SC_NPROCESSORS_ONLN);

    return n < 1 ? 1u : n > 256 ? 256u : (unsigned)n;
}

/* The engines routerd knows: their identities only (no model is linked). */
static const td_engine_kind_t *const router_engines[] = {
    &td_synth_kind,
    &td_v41_identity_kind,
    NULL,
};

/* The engine's identity and names (no weights loaded), then destroyed. */
static td_status_t
router_identity(td_router_t *r)
{
    td_engine_t *e;
    td_status_t st = td_engine_create_identity(router_engines, &r->cfg->eng, &e);

    if (st != TD_OK)
        return st;
    snprintf(r->fingerprint, sizeof r->fingerprint, "%016" PRIx64, e->fingerprint);
    r->kv_layout_hash = e->layout->hash;
    r->kv_bytes_per_token = td_layout_paged_bytes_per_token(e->layout);
    r->kv_fixed_bytes = td_layout_fixed_bytes(e->layout);
    r->max_context = e->max_context;
    snprintf(r->engine_kind, sizeof r->engine_kind, "%s", e->kind);
    if (r->cfg->model_name[0])
        snprintf(r->model, sizeof r->model, "%s", r->cfg->model_name);
    else
        snprintf(r->model, sizeof r->model, "tandem-%s", e->name);
    r->nstop_ids = e->nstop;
    memcpy(r->stop_ids, e->stop, e->nstop * sizeof(e->stop[0]));
    /* every generated id must have a text: a Tokens message with one outside
     * the tokenizer fails its request, so the two must agree */
    if (e->vocab != r->tok->vocab_size) {
        td_error("engine vocabulary %u differs from the tokenizer's %u (%s): %s; give the "
                 "engine the tokenizer's vocabulary (synthetic: --synth-vocab %u) or the "
                 "model's tokenizer", e->vocab, r->tok->vocab_size, r->tok->name,
                 e->vocab < r->tok->vocab_size ? "prompts would hold ids the engine does not "
                                                 "know"
                                               : "the engine would generate ids the "
                                                 "tokenizer cannot show",
                 r->tok->vocab_size);
        st = TD_ERR_INVALID;
    }
    if (st == TD_OK && e->nstop > 0)
        td_info("engine %s: end-of-sequence ids %d%s%s", e->name, e->stop[0],
                e->nstop > 1 ? " and " : "", e->nstop > 1 ? "more" : "");
    td_engine_destroy(e);
    return st;
}

static void
router_fini(td_router_t *r)
{
    if (r->drain_timer)
        event_free(r->drain_timer);
    td_rreq_tab_destroy(r->reqs);   /* the text threads stop: rtok's jobs come back */
    td_rtok_destroy(r->rtok);
    td_rstore_destroy(r->store);
    td_http_listener_destroy(r->http);
    td_http_listener_destroy(r->admin);
    td_cluster_fini(&r->cluster);
    td_apikeys_destroy(r->keys);
    td_apikeys_destroy(r->admin_keys);
    td_gvocab_destroy(r->gvocab);
    td_tok_destroy(r->tok);
}

/* Print the ready line (host as configured, the ports actually bound). */
static void
router_ready(td_router_t *r, uint16_t http_port, uint16_t admin_port)
{
    char line[3 * TD_NET_HOST_MAX + 64], h[3][TD_NET_HOST_MAX];
    const char *addr[3] = { r->cfg->http_listen, r->cfg->ctl_listen, r->cfg->admin_listen };
    uint16_t port[3] = { http_port, td_cluster_port(&r->cluster), admin_port }, ignored;

    for (int i = 0; i < 3; i++)
        if (!addr[i][0] || td_net_addr_parse(addr[i], h[i], sizeof h[i], &ignored) != TD_OK ||
            !h[i][0])
            snprintf(h[i], sizeof h[i], "0.0.0.0");
    if (r->admin)
        snprintf(line, sizeof line, "http=%s:%u ctl=%s:%u admin=%s:%u", h[0], port[0], h[1],
                 port[1], h[2], port[2]);
    else
        snprintf(line, sizeof line, "http=%s:%u ctl=%s:%u admin=off", h[0], port[0], h[1],
                 port[1]);
    fprintf(stderr, "routerd ready: %s\n", line);
    fflush(stderr);
    td_daemon_ready(r->daemon, line);
}

/* The cluster's messages about requests go to the request table. */
static void
router_on_message(td_cluster_t *c, td_rrank_t *rk, const Tandem__Envelope *env, void *arg)
{
    td_router_t *r = arg;

    td_rreq_on_message(r->reqs, rk, env);
}

static void
router_on_rank_lost(td_cluster_t *c, td_rrank_t *rk, void *arg)
{
    td_router_t *r = arg;

    td_rreq_on_rank_lost(r->reqs, rk);
}

static void
router_on_capacity(td_cluster_t *c, void *arg)
{
    td_router_t *r = arg;

    td_rreq_on_capacity(r->reqs);
}

/* The configuration's cross-checks, then what routerd needs before it
 * listens: the tokenizer, the model's identity and the key files. */
static td_status_t
router_load(td_router_t *r)
{
    const td_router_cfg_t *cfg = r->cfg;
    td_status_t st;

    if (cfg->max_tokens_default > cfg->max_tokens_limit) {
        td_error("max-tokens-default %" PRIu64 " is above max-tokens-limit %" PRIu64,
                 cfg->max_tokens_default, cfg->max_tokens_limit);
        return TD_ERR_INVALID;
    }
    if (cfg->http_max_buffered < cfg->max_body + TD_HTTP_MAX_HEAD) {
        td_error("http-max-buffered %" PRIu64 " cannot hold one request of max-body %" PRIu64
                 " and its head (%u)", cfg->http_max_buffered, cfg->max_body,
                 TD_HTTP_MAX_HEAD);
        return TD_ERR_INVALID;
    }
    st = router_tokenizer(r);
    if (st == TD_OK)
        st = router_identity(r);
    if (st == TD_OK && r->v41 != NULL &&
        (st = td_gvocab_create(r->v41, r->stop_ids, r->nstop_ids, &r->gvocab)) != TD_OK)
        td_error("constraints: the tokenizer's vocabulary: %s", td_status_str(st));
    if (st == TD_OK && cfg->api_keys_file[0])
        st = td_apikeys_load(cfg->api_keys_file, &r->keys);
    if (st == TD_OK && cfg->admin_listen[0]) {
        if (!cfg->admin_key_file[0]) {
            td_error("admin-listen %s needs admin-key-file (or admin-listen \"\" to turn the "
                     "admin api off)", cfg->admin_listen);
            st = TD_ERR_INVALID;
        } else {
            st = td_apikeys_load(cfg->admin_key_file, &r->admin_keys);
        }
    }
    if (st == TD_OK)
        st = router_check_auth(r);
    return st;
}

/* The request table (with the api's bounds) and the text threads' pool. */
static td_status_t
router_reqs_create(td_router_t *r)
{
    const td_router_cfg_t *cfg = r->cfg;
    td_rreq_config_t rq;
    td_status_t st;

    r->models[0] = r->model;
    r->api = (td_ireq_cfg_t){ .models = r->models, .max_body = cfg->max_body,
                                .max_tokens_limit = (uint32_t)cfg->max_tokens_limit,
                                .max_tokens_default = (uint32_t)cfg->max_tokens_default,
                                .max_stop_bytes = (size_t)cfg->max_stop_bytes,
                                .max_n = (uint32_t)cfg->max_n,
                                .nmodel_stop = r->nstop_ids, .model_stop = r->stop_ids,
                                .gvocab = r->gvocab,
                                .max_constraint_bytes = (size_t)cfg->max_constraint_bytes,
                                .constraint_budget_ms = (uint32_t)cfg->constraint_budget_ms,
                                .vocab = r->tok->vocab_size,
                                .no_default_thinking = !cfg->default_thinking };
    if (cfg->responses_dir[0]) {
        td_rstore_cfg_t sc = { .dir = cfg->responses_dir, .max_bytes = cfg->responses_max_bytes,
                               .max_age_s = cfg->responses_max_age_ms / 1000 };
        if ((st = td_rstore_create(&sc, &r->store)) != TD_OK)
            return st;   /* logged */
    }
    rq = (td_rreq_config_t){ .base = r->base, .cluster = &r->cluster, .metrics = &r->metrics,
                             .store = r->store,
                             .api = &r->api, .tok = r->tok, .v41 = r->v41, .model = r->model,
                             .fingerprint = r->fingerprint, .id_prefix = r->id_prefix,
                             .request_timeout_ms = cfg->request_timeout_ms,
                             .retry_after_s = (unsigned)cfg->retry_after_s,
                             .max_attempts = (unsigned)cfg->max_attempts,
                             .max_queued = (size_t)cfg->max_queued,
                             .queue_timeout_ms = cfg->queue_timeout_ms,
                             .max_context = r->max_context,
                             .kv_bytes_per_token = r->kv_bytes_per_token,
                             .kv_fixed_bytes = r->kv_fixed_bytes,
                             .text_threads = router_text_threads(cfg),
                             .text_inline_max = cfg->text_inline_max,
                             .text_inline_body = cfg->text_inline_body,
                             .cache_weight = cfg->cache_weight,
                             .continue_max_suffix = cfg->continue_max_suffix,
                             .continue_max_states = (size_t)cfg->continue_max_states,
                             .slow_reader_timeout_ms = cfg->slow_reader_timeout_ms,
                             .cache_seed = td_chain_seed(r->fingerprint, r->kv_layout_hash) };
    st = td_rreq_tab_create(&rq, &r->reqs);
    if (st != TD_OK)
        return st;
    st = td_rtok_create(&(td_rtok_cfg_t){ .pool = td_rreq_text_pool(r->reqs),
                                          .store = r->store,
                                          .text = td_rreq_text_cfg(r->reqs),
                                          .metrics = &r->metrics,
                                          .max_context = r->max_context }, &r->rtok);
    if (st != TD_OK)
        td_error("routerd: out of memory");
    return st;
}

/* The control plane: the ranks' listener and the cluster's state. */
static td_status_t
router_cluster_start(td_router_t *r)
{
    const td_router_cfg_t *cfg = r->cfg;
    const td_cluster_handlers_t ch = { .on_message = router_on_message,
                                       .on_rank_lost = router_on_rank_lost,
                                       .on_capacity = router_on_capacity, .arg = r };
    td_cluster_config_t cc = {0};
    size_t secret_len;
    char ctl_host[TD_NET_HOST_MAX];
    td_status_t st;

    cc.ctl.ident = (td_hello_ident_t){ .protocol_version = TD_HELLO_PROTOCOL_VERSION,
                                       .role = TANDEM__ROLE__ROLE_ROUTER,
                                       .node_id = td_daemon_node_id(r->daemon),
                                       .incarnation = td_daemon_incarnation(r->daemon),
                                       .model_fingerprint = r->fingerprint,
                                       .kv_layout_hash = r->kv_layout_hash };
    cc.ctl.secret = td_daemon_secret(r->daemon, &secret_len);
    cc.ctl.secret_len = secret_len;
    cc.ctl.heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
    cc.ctl.max_frame = (uint32_t)cfg->max_frame;
    cc.ctl.max_unauth = (uint32_t)cfg->ctl_max_unauth;
    cc.ctl.max_unauth_per_source = (uint32_t)cfg->ctl_max_unauth_per_source;
    cc.router_id = r->router_id;
    cc.cache_max_blocks = (size_t)cfg->cache_max_blocks;
    st = td_net_addr_parse(cfg->ctl_listen, ctl_host, sizeof ctl_host, &cc.port);   /* logs */
    if (st != TD_OK)
        return st;
    cc.host = ctl_host;
    return td_cluster_init(&r->cluster, r->base, &cc, &ch);
}

/* The api listener and the admin one (when configured), within the fd
 * limit; their ports in *http_port, *admin_port. */
static td_status_t
router_http_start(td_router_t *r, uint16_t *http_port, uint16_t *admin_port)
{
    const td_router_cfg_t *cfg = r->cfg;
    size_t api_conns = cfg->http_max_conns, admin_conns = cfg->admin_max_conns;
    td_status_t st;

    if (!cfg->admin_listen[0])
        admin_conns = 0;
    td_http_fit_fd_limit(&api_conns, &admin_conns, ROUTER_FD_RESERVE);
    r->http_budget = (td_http_budget_t){ .max = cfg->http_max_buffered };
    r->out_budget = (td_http_budget_t){ .max = cfg->response_buffer_max };
    r->http_site = (td_http_site_t){ .base = r->base, .routes = td_routes, .admin = false,
                                     .keys = r->keys, .metrics = &r->metrics,
                                     .max_body = cfg->max_body, .max_conns = api_conns,
                                     .read_timeout_ms = cfg->http_read_timeout_ms,
                                     .idle_timeout_ms = cfg->http_idle_timeout_ms,
                                     .write_timeout_ms = cfg->http_write_timeout_ms,
                                     .retry_after_s = (unsigned)cfg->retry_after_s,
                                     .stream_max = (size_t)cfg->stream_buffer_max,
                                     .out_budget = &r->out_budget,
                                     .stream_sndbuf = (int)cfg->stream_sndbuf,
                                     .budget = &r->http_budget, .arg = r };
    r->admin_site = r->http_site;
    r->admin_site.admin = true;
    r->admin_site.keys = r->admin_keys;
    r->admin_site.max_body = 65536;
    r->admin_site.max_conns = admin_conns;
    st = td_http_listen(&r->http_site, cfg->http_listen, &r->http, http_port);
    if (st == TD_OK && cfg->admin_listen[0])
        st = td_http_listen(&r->admin_site, cfg->admin_listen, &r->admin, admin_port);
    return st;
}

static td_status_t
router_init(td_router_t *r)
{
    uint16_t http_port = 0, admin_port = 0;
    td_status_t st = router_load(r);

    if (st != TD_OK)
        return st;
    r->id_prefix = (td_daemon_incarnation(r->daemon) & 0xffffu) << 48;
    snprintf(r->router_id, sizeof r->router_id, "%s/%04" PRIx64, td_daemon_node_id(r->daemon),
             r->id_prefix >> 48);
    st = router_reqs_create(r);
    if (st == TD_OK)
        st = router_cluster_start(r);
    if (st == TD_OK)
        st = router_http_start(r, &http_port, &admin_port);
    if (st != TD_OK)
        return st;
    td_info("routerd: model %s (%s), fingerprint %s, kv layout %016" PRIx64
            ", tokenizer %s, router id %s", r->model, r->engine_kind, r->fingerprint,
            r->kv_layout_hash, r->tok->name, r->router_id);
    router_ready(r, http_port, admin_port);
    return TD_OK;
}

/* ======================================================================= */
/* Shutdown                                                                  */
/* ======================================================================= */

/* The last frames of the answers get this long to go out before exit. */
#define ROUTER_FLUSH_MS 100

/* No request left: leave the loop once the last answers are written. */
static void
router_on_idle(void *arg)
{
    td_router_t *r = arg;
    struct timeval tv = td_ctl_timeval_ms(ROUTER_FLUSH_MS);

    td_info("routerd: no request in flight; exiting");
    event_base_loopexit(r->base, &tv);
}

/* The drain deadline: what is still in flight ends with an error. */
static void
router_on_drain_deadline(evutil_socket_t fd, short what, void *arg)
{
    td_router_t *r = arg;

    td_info("routerd: drain deadline (%llu ms) passed: ending the %zu requests in flight "
            "with an error", (unsigned long long)r->cfg->drain_timeout_ms,
            td_rreq_tab_count(r->reqs));
    td_rreq_tab_fail_all(r->reqs);   /* the table then calls router_on_idle */
}

/* SIGTERM: new connections to the api are refused and requests on the open
 * ones get 503; those in flight finish, up to drain-timeout; then the loop
 * is left. A second signal leaves at once (net/daemon.c). */
static void
router_on_stop(td_daemon_t *d, void *arg)
{
    td_router_t *r = arg;
    uint64_t ms = r->cfg->drain_timeout_ms;
    struct timeval tv = td_ctl_timeval_ms((uint32_t)ms);

    r->stopping = true;
    td_info("routerd: stopping: the api takes no new requests; %zu in flight get %llu ms to "
            "finish", td_rreq_tab_count(r->reqs), (unsigned long long)ms);
    td_daemon_stopping(d, ms + ROUTER_FLUSH_MS + 1000);
    td_http_stop_accepting(r->http);
    r->drain_timer = evtimer_new(r->base, router_on_drain_deadline, r);
    if (!r->drain_timer || evtimer_add(r->drain_timer, &tv) != 0) {
        td_error("routerd: no drain timer: ending the requests in flight now");
        td_rreq_tab_fail_all(r->reqs);
    }
    td_rreq_tab_stop(r->reqs, router_on_idle, r);
}

int
main(int argc, char **argv)
{
    td_router_cfg_t cfg;
    td_router_t r;
    td_status_t st;
    int rc = 1;

    memset(&r, 0, sizeof r);
    r.base = event_base_new();
    if (!r.base) {
        fprintf(stderr, "routerd: cannot create the event loop\n");
        return 1;
    }
    st = td_daemon_create("routerd", router_opts, &cfg, &cfg.m, argc, argv, r.base,
                          router_on_stop, &r, &r.daemon);
    if (st != TD_OK) {
        rc = td_daemon_exit_code(st);
        goto out_base;
    }
    r.cfg = &cfg;
    r.table = router_opts;
    st = router_init(&r);
    if (st == TD_OK) {
        td_loopstat_dispatch(r.base, &r.loop);
        rc = 0;
    } else {
        rc = st == TD_ERR_INVALID ? 2 : 1;
    }
    router_fini(&r);
    td_daemon_destroy(r.daemon);
    td_config_free(router_opts, &cfg);
out_base:
    event_base_free(r.base);
    return rc;
}
