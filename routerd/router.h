/* routerd/router.h — the router daemon's shared state (configuration, the
 * cluster table, the requests, the metrics) and the functions its files call
 * on each other. routerd is single-threaded: one libevent loop serves HTTP,
 * the admin API and every worker connection, so nothing here locks. */
#ifndef TD_ROUTER_H
#define TD_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apikeys.h"
#include "config.h"
#include "ctl.h"
#include "daemon.h"
#include "engine.h"
#include "registry.h"
#include "metrics.h"
#include "openai.h"
#include "buf.h"
#include "status.h"
#include "tok.h"

struct event_base;
struct evhttp;
struct evhttp_request;

/* ---- Configuration (the option table is in main.c) ------------------------ */

typedef struct {
    td_daemon_opts_t m;
    td_engine_config_t eng;
    char *http_listen;          /* host:port of the OpenAI API */
    char *ctl_listen;           /* host:port worker ranks connect to */
    char *admin_listen;         /* host:port of the admin API */
    char *api_keys_file;
    char *admin_key_file;
    char *model_name;           /* id in /v1/models; "" = "tandem-<engine>" */
    char *tokenizer;            /* tokenizer.json or a checkpoint directory; "" = model's */
    uint64_t max_body;          /* bytes */
    uint64_t max_tokens_limit;
    uint64_t max_tokens_default;
    uint64_t request_timeout_ms;  /* 0 = none */
    uint64_t heartbeat_ms;
    uint64_t max_frame;         /* control frame body cap, bytes */
    uint64_t retry_after_s;     /* Retry-After of a 503 */
    uint64_t max_attempts;      /* admissions per request (AdmitReject, lost ranks) */
} td_router_cfg_t;

/* ---- Cluster membership (cluster.c) ------------------------------------------ */

typedef enum {
    TD_RANK_UP = 0,     /* connected and registered, takes requests */
    TD_RANK_JOINING,    /* connected, Register not yet received */
    TD_RANK_DRAINING,   /* connected; the operator or the rank itself drains it */
    TD_RANK_DEAD,       /* connection ended; kept for the admin view */
} td_rank_state_t;

typedef struct td_node_s {
    struct td_node_s *next;
    char name[TD_HELLO_NODE_ID_MAX + 1];
    bool draining;      /* admin drain */
    bool removing;      /* admin remove: forgotten once nothing is in flight */
} td_node_t;

typedef struct td_rank_s {
    struct td_rank_s *next;
    td_node_t *node;
    uint32_t rank_id;
    Tandem__Role role;
    uint64_t incarnation;
    td_ctl_conn_t *conn;        /* NULL once the connection ended */
    Tandem__Register *reg;      /* own unpacked copy; NULL until registered */
    Tandem__Load load;          /* latest Load (scalars only) */
    uint64_t pend_tokens;       /* KV tokens / prompt tokens we sent since that Load */
    uint32_t pend_reqs;         /* requests we sent since that Load */
    uint32_t inflight;          /* our requests bound to this rank */
} td_rank_t;

typedef struct td_router_s td_router_t;

typedef struct {
    td_router_t *router;
    td_ctl_listener_t *lst;
    td_rank_t *ranks;
    td_node_t *nodes;
    unsigned hold;      /* > 0: no node is forgotten (a rank is being torn down) */
} td_cluster_t;

td_status_t td_cluster_init(td_cluster_t *c, td_router_t *r, const td_ctl_config_t *ctl,
                            const char *host, uint16_t port);
void td_cluster_fini(td_cluster_t *c);
uint16_t td_cluster_port(const td_cluster_t *c);
td_rank_state_t td_cluster_rank_state(const td_rank_t *rk);
const char *td_cluster_rank_state_str(td_rank_state_t st);
/* Send one message to a rank; logs and returns why when it cannot. */
td_status_t td_cluster_send(td_rank_t *rk, const Tandem__Envelope *env);
td_node_t *td_cluster_node_find(td_cluster_t *c, const char *name);
/* Admin: drain / undrain / remove a node (TD_ERR_NOT_FOUND when unknown). */
td_status_t td_cluster_node_drain(td_cluster_t *c, const char *name, bool draining);
td_status_t td_cluster_node_remove(td_cluster_t *c, const char *name);
/* A request left rk: forget a removed node once it has nothing in flight. */
void td_cluster_rank_release(td_cluster_t *c, td_rank_t *rk);

/* ---- Scheduling (sched.c) -------------------------------------------------------- */

#define TD_SCHED_MAX_TRIED 16

/* Prefill rank with the fewest queued tokens, or NULL. */
td_rank_t *td_sched_pick_prefill(td_cluster_t *c);
/* Decode rank with room for need tokens (prompt + max_tokens), least loaded,
 * skipping the incarnations tried[ntried]; NULL with *too_long set when some
 * rank is up but none has a context that long. */
td_rank_t *td_sched_pick_decode(td_cluster_t *c, uint64_t need, const uint64_t *tried,
                                size_t ntried, bool *too_long);

/* ---- Requests (request.c) ----------------------------------------------------------- */

typedef enum {
    TD_REQ_NEW = 0,     /* parsed and tokenized */
    TD_REQ_ADMITTING,   /* Admit sent to a decode rank */
    TD_REQ_PREFILLING,  /* AdmitOk; Prefill sent to a prefill rank */
    TD_REQ_DECODING,    /* first tokens arrived */
    TD_REQ_DONE,        /* finished (stop / length) and answered */
    TD_REQ_FAILED,      /* answered with an error */
    TD_REQ_CANCELED,    /* client gone or canceled by the operator */
    TD_REQ_NSTATES
} td_req_state_t;

typedef struct td_request_s td_request_t;

const char *td_request_state_str(td_req_state_t st);
/* Parse hreq's body as a request of kind and serve it (answers errors). */
void td_request_serve(td_router_t *r, struct evhttp_request *hreq, td_openai_kind_t kind);
/* A message about a request from a worker rank (AdmitOk, AdmitReject,
 * PrefillDone, Tokens, Released). */
void td_request_on_message(td_router_t *r, td_rank_t *rk, const Tandem__Envelope *env);
/* rk's connection ended: retry or fail every request bound to it. */
void td_request_on_rank_lost(td_router_t *r, td_rank_t *rk);
/* Admin cancel: TD_ERR_NOT_FOUND when no such request is in flight. */
td_status_t td_request_cancel_id(td_router_t *r, uint64_t id);
/* The request table: created before serving, freed (with every request
 * still in flight, without answering it) at shutdown. */
td_status_t td_request_init(td_router_t *r);
void td_request_fini(td_router_t *r);
/* Admin view: a JSON array of the requests in flight (jansson json_t *). */
void *td_request_list_json(td_router_t *r);
/* Requests in flight per state, for /metrics. */
void td_request_count_states(td_router_t *r, uint64_t counts[TD_REQ_NSTATES]);

/* ---- HTTP (http.c) ----------------------------------------------------------------- */

typedef struct {
    const char *path;
    int methods;          /* EVHTTP_REQ_GET | ... */
    bool admin;           /* served on the admin listener, with the admin key */
    bool auth;            /* needs a key */
    void (*fn)(td_router_t *r, struct evhttp_request *req);
} td_route_t;

/* The route table (routes.c) and the routes, one file each (route-*.c). */
extern const td_route_t td_routes[];
void td_route_chat(td_router_t *r, struct evhttp_request *req);
void td_route_completions(td_router_t *r, struct evhttp_request *req);
void td_route_models(td_router_t *r, struct evhttp_request *req);
void td_route_health(td_router_t *r, struct evhttp_request *req);
void td_route_metrics(td_router_t *r, struct evhttp_request *req);
void td_route_admin_status(td_router_t *r, struct evhttp_request *req);
void td_route_admin_drain(td_router_t *r, struct evhttp_request *req);
void td_route_admin_undrain(td_router_t *r, struct evhttp_request *req);
void td_route_admin_remove(td_router_t *r, struct evhttp_request *req);
void td_route_admin_requests(td_router_t *r, struct evhttp_request *req);
void td_route_admin_cancel(td_router_t *r, struct evhttp_request *req);
void td_route_admin_config(td_router_t *r, struct evhttp_request *req);

/* One HTTP listener: the API or the admin API. */
typedef struct {
    td_router_t *r;
    bool admin;
} td_http_site_t;

/* Serve site on hostport ("host:port", port 0 = a free one). */
td_status_t td_http_listen(td_http_site_t *site, const char *hostport, struct evhttp **out,
                           uint16_t *port_out);
/* Replies; each ends the request. */
void td_http_reply(struct evhttp_request *req, int code, const char *ctype,
                   const char *body, size_t len);
void td_http_reply_err(struct evhttp_request *req, const td_openai_err_t *e);
/* A request refused before it was scheduled: counted (errors by reason,
 * requests rejected) and answered with e. */
void td_http_refuse(td_router_t *r, struct evhttp_request *req, const td_openai_err_t *e);
/* A jansson json_t * (stolen) as the body. */
void td_http_reply_json(struct evhttp_request *req, int code, void *json);
/* The body, NUL-terminated (pulled up in place; valid while req is). */
const char *td_http_body(struct evhttp_request *req, size_t *len);
/* Admin bodies: {"<field>": "<string>"} → the string (copied into buf). */
td_status_t td_http_body_field(struct evhttp_request *req, const char *field, char *buf,
                               size_t len, td_openai_err_t *e);

/* ---- The router ---------------------------------------------------------------- */

struct td_router_s {
    struct event_base *base;
    const td_router_cfg_t *cfg;
    const td_config_opt_t *table;   /* for the admin config view */
    td_daemon_t *daemon;
    td_tok_t *tok;
    const td_tokenizer_t *v41;      /* the V4.1 tokenizer behind tok (chat encoding and
                                       reply parsing on), or NULL (byte-level stand-in) */
    td_apikeys_t *keys;
    td_apikeys_t *admin_keys;
    char model[96];                 /* id in /v1/models */
    char engine_kind[160];
    char fingerprint[17];           /* 16 hex digits */
    uint64_t kv_layout_hash;
    double kv_bytes_per_token;      /* paged bytes per token, from the layout */
    uint64_t kv_fixed_bytes;        /* fixed bytes per request */
    char router_id[96];             /* sent in Registered */
    uint64_t id_prefix;             /* top 16 bits of every request id */
    uint64_t id_seq;
    const char *models[2];          /* NULL-terminated, for the parser */
    td_openai_cfg_t api;
    struct evhttp *http, *admin;
    td_http_site_t http_site, admin_site;
    td_cluster_t cluster;
    td_metrics_t metrics;
    struct td_reqtab_s *reqs;       /* request.c */
};

#endif
