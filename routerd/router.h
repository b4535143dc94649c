/* routerd/router.h — the router daemon as main.c builds it: its
 * configuration, identity and the modules it wires together (cluster,
 * requests, HTTP listeners, metrics); the routes (routes.h) read it. It
 * declares no functions: each module's are in its own header. One libevent
 * loop serves HTTP, the admin API and every worker connection, so nothing
 * here locks; the requests' text work runs on text threads (rreq.h), which
 * share only what is immutable here (the tokenizer, the API configuration). */
#ifndef TD_ROUTERD_ROUTER_H
#define TD_ROUTERD_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apikeys.h"
#include "cluster.h"
#include "config.h"
#include "daemon.h"
#include "http.h"
#include "metrics.h"
#include "openai.h"
#include "rstore.h"
#include "rtok.h"
#include "registry.h"
#include "rreq.h"
#include "tok.h"
#include "tokenizer.h"

struct event;
struct event_base;

/* ---- Configuration (the option table is in main.c) ------------------------ */

typedef struct {
    td_daemon_opts_t m;
    td_engine_config_t eng;
    char *http_listen;          /* host:port of the OpenAI API */
    char *ctl_listen;           /* host:port worker ranks connect to */
    char *admin_listen;         /* host:port of the admin API */
    char *api_keys_file;
    bool api_insecure;          /* no api keys on a non-loopback http-listen, on purpose */
    char *admin_key_file;
    char *model_name;           /* id in /v1/models; "" = "tandem-<engine>" */
    char *tokenizer;            /* tokenizer.json or a checkpoint directory; "" = model's */
    uint64_t max_body;          /* bytes */
    uint64_t admin_max_conns;   /* the HTTP listeners' limits (http.h); 0 = no cap */
    uint64_t http_idle_timeout_ms;
    uint64_t http_max_buffered;   /* bytes */
    uint64_t stream_buffer_max;   /* backpressure (docs/routerd.md): one stream's bytes, */
    uint64_t response_buffer_max; /*   every answer's, */
    uint64_t stream_sndbuf;       /*   a stream socket's kernel send buffer, */
    uint64_t slow_reader_timeout_ms;  /*   how long a stream may stay paused */
    uint64_t http_max_conns;
    uint64_t http_read_timeout_ms;
    uint64_t http_write_timeout_ms;   /* 0 = none */
    uint64_t max_tokens_limit;
    uint64_t max_tokens_default;
    uint64_t max_stop_bytes;    /* longest stop string, bytes */
    uint64_t max_n;             /* most choices per request */
    uint64_t max_constraint_bytes;  /* largest structured-output spec, bytes */
    uint64_t constraint_budget_ms;  /* its compile time budget */
    uint64_t request_timeout_ms;  /* 0 = none */
    uint64_t heartbeat_ms;
    uint64_t max_frame;         /* control frame body cap, bytes */
    uint64_t retry_after_s;     /* Retry-After of a 503 */
    uint64_t max_attempts;      /* admissions per request (AdmitReject, lost ranks) */
    /* admission (docs/routerd.md, "Admission") */
    uint64_t max_queued;        /* requests waiting for decode capacity; 0 = none wait */
    uint64_t queue_timeout_ms;  /* the longest wait in the queue */
    uint64_t ctl_max_unauth;    /* control connections in the handshake */
    uint64_t ctl_max_unauth_per_source;   /* ... from one address */
    uint64_t text_threads;      /* threads for the requests' text work; 0 = one per cpu */
    uint64_t text_inline_max;   /* token batches up to this weight detokenized on the loop */
    uint64_t text_inline_body;  /* request bodies up to this many bytes tokenized on the loop */
    uint64_t drain_timeout_ms;  /* SIGTERM: requests in flight get this long to finish */
    /* KV-aware prefill placement (docs/kvrouting.md) */
    double cache_weight;        /* weight of a rank's cached prompt tokens; 0 = load only */
    uint64_t cache_max_blocks;  /* cache block hashes tracked per prefill rank */
    uint64_t continue_max_suffix;   /* multi-turn on the decode ranks: longest suffix */
    uint64_t continue_max_states;   /*   kept states tracked */
    /* the Responses API's store (rstore.h; docs/api.md) */
    bool default_thinking;      /* Messages / Responses asking for no thinking mode */
    char *responses_dir;        /* "" = no store */
    uint64_t responses_max_bytes;
    uint64_t responses_max_age_ms;
} td_router_cfg_t;

/* ---- The router ---------------------------------------------------------------- */

typedef struct {
    struct event_base *base;
    const td_router_cfg_t *cfg;
    const td_config_opt_t *table;   /* for the admin config view */
    td_daemon_t *daemon;
    td_tok_t *tok;
    const td_tokenizer_t *v41;      /* the V4.1 tokenizer behind tok (chat encoding and
                                       reply parsing on), or NULL (byte-level stand-in) */
    struct td_gvocab *gvocab;       /* v41's tokens for constraints (structured output),
                                       or NULL (refused) */
    td_apikeys_t *keys;
    td_apikeys_t *admin_keys;
    char model[96];                 /* id in /v1/models */
    char engine_kind[160];
    char fingerprint[17];           /* 16 hex digits */
    uint64_t kv_layout_hash;
    double kv_bytes_per_token;      /* paged bytes per token, from the layout */
    uint64_t kv_fixed_bytes;        /* fixed bytes per request */
    uint64_t max_context;           /* the model's context in tokens */
    int32_t stop_ids[TD_SAMPLE_MAX_STOP];  /* the model's end-of-sequence ids */
    uint32_t nstop_ids;
    char router_id[96];             /* sent in Registered */
    uint64_t id_prefix;             /* top 16 bits of every request id */
    const char *models[2];          /* NULL-terminated, for the parser */
    td_ireq_cfg_t api;
    td_http_listener_t *http, *admin;
    td_http_site_t http_site, admin_site;
    td_http_budget_t http_budget;   /* request bytes held, both listeners */
    td_http_budget_t out_budget;    /* answer bytes buffered, the api listener's streams */
    td_loopstat_t loop;             /* the event loop's passes (net/loopstat.h) */
    td_cluster_t cluster;
    td_metrics_t metrics;
    td_rreq_tab_t *reqs;
    td_rtok_t *rtok;                /* /tokenize, /detokenize, count_tokens, stored responses */
    td_rstore_t *store;             /* stored responses, or NULL (no responses-dir) */
    bool stopping;                  /* SIGTERM: draining, the api takes no new request */
    struct event *drain_timer;      /* the drain deadline, once stopping */
} td_router_t;

#endif
