/* decoded/main.c — the decode daemon: options, one engine shared by M rank
 * threads, each with its own event loop, UCX worker, KV pools and router
 * links (decoded/rank.h); systemd readiness; SIGTERM stops taking work, ends
 * the live requests with an error event and exits. docs/decoded.md. */
#include <event2/event.h>
#include <event2/thread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "engine.h"
#include "link.h"
#include "rank.h"
#include "ranks.h"

#define DECODED_RANKS_MAX 64

typedef struct {
    td_daemon_opts_t d;
    td_engine_config_t engine;
    char *routers;
    uint64_t ranks;
    uint64_t kv_tokens;
    uint64_t max_batch;
    char *transports;
    uint64_t xfer_deadline_ms;
} decoded_config_t;

static const td_config_opt_t decoded_opts[] = {
    TD_DAEMON_CONFIG_OPTS(decoded_config_t, d),
    TD_ENGINE_CONFIG_OPTS(decoded_config_t, engine),
    TD_CONFIG_OPT_STRING("routers", decoded_config_t, routers, "",
                         "routers to register with, host:port[,host:port...] (required)"),
    TD_CONFIG_OPT_UINT64("ranks", decoded_config_t, ranks, "1", 1, DECODED_RANKS_MAX,
                         "rank threads (one per gpu of the node)"),
    TD_CONFIG_OPT_UINT64("kv-tokens", decoded_config_t, kv_tokens, "65536", 1, 1ull << 32,
                         "kv capacity per rank in tokens (sizes every paged pool)"),
    TD_CONFIG_OPT_UINT64("max-batch", decoded_config_t, max_batch, "16", 1, 4096,
                         "requests per rank holding kv at once (batch rows, fixed slots)"),
    TD_CONFIG_OPT_STRING("transports", decoded_config_t, transports, "",
                         "ucx transport list like UCX_TLS (default: ucx's choice, shm included)"),
    TD_CONFIG_OPT_UINT64("xfer-deadline-ms", decoded_config_t, xfer_deadline_ms, "10000", 1,
                         3600000, "the prefill ranks' kv transfer deadline in ms; blocks of a "
                         "request whose prefill went silent are freed after twice this"),
    TD_CONFIG_OPT_END
};

typedef struct decoded decoded_t;

/* One rank's state; it belongs to that rank's thread (common/ranks.h). */
typedef struct {
    decoded_t *m;
    uint32_t id;
    struct event_base *base;     /* the rank's loop, owned by m->rs */
    td_rank_t *rk;
    td_link_t *link;
    bool draining;               /* what Register last said */
} decoded_rank_t;

struct decoded {
    decoded_config_t cfg;
    td_daemon_t *d;
    struct event_base *base;
    td_engine_t *engine;
    char fingerprint[17];
    decoded_rank_t *ranks;
    uint32_t nranks;
    td_ranks_t *rs;              /* the rank threads */
};

/* ---- Rank thread ------------------------------------------------------------------ */

static td_status_t
decoded_on_send(void *router, const Tandem__Envelope *env, void *arg)
{
    decoded_rank_t *r = arg;
    return td_link_send(r->link, router, env);
}

static void
decoded_register(decoded_rank_t *r, Tandem__Register *reg)
{
    tandem__register__init(reg);
    td_rank_register_fill(r->rk, reg);
}

static void
decoded_on_load(const Tandem__Load *load, void *arg)
{
    decoded_rank_t *r = arg;
    if (r->link == NULL)
        return;
    if (load->draining != r->draining) {
        Tandem__Register reg;
        r->draining = load->draining;
        decoded_register(r, &reg);
        (void)td_link_set_register(r->link, &reg);
    }
    td_link_load(r->link, load);
}

static void
decoded_on_up(td_link_t *l, td_link_router_t *router, void *arg)
{
    decoded_rank_t *r = arg;
    td_info("decode rank %u: registered with router %s", r->id, td_link_router_name(router));
}

static void
decoded_on_message(td_link_t *l, td_link_router_t *router, const Tandem__Envelope *env,
                   void *arg)
{
    decoded_rank_t *r = arg;
    td_rank_on_message(r->rk, router, env);
}

static void
decoded_on_down(td_link_t *l, td_link_router_t *router, td_status_t why, void *arg)
{
    decoded_rank_t *r = arg;
    td_warn("decode rank %u: router %s down (%s): canceling its requests", r->id,
            td_link_router_name(router), td_status_str(why));
    td_rank_on_router_down(r->rk, router);
}

static void
decoded_on_stop(void *arg, uint32_t id, td_ranks_stop_t how)
{
    decoded_rank_t *r = &((decoded_t *)arg)->ranks[id];
    struct timeval flush = { 0, 100000 };   /* let the last Tokens frames go out */
    td_rank_stop(r->rk);
    event_base_loopexit(r->base, &flush);
}

static void
decoded_rank_teardown(void *arg, uint32_t id)
{
    decoded_rank_t *r = &((decoded_t *)arg)->ranks[id];
    td_link_destroy(r->link);
    r->link = NULL;
    td_rank_destroy(r->rk);
    r->rk = NULL;
}

static td_status_t
decoded_rank_setup(void *arg, uint32_t id, struct event_base *base)
{
    decoded_t *m = arg;
    decoded_rank_t *r = &m->ranks[id];
    const decoded_config_t *c = &m->cfg;
    td_status_t st;
    r->m = m;
    r->id = id;
    r->base = base;
    td_rank_config_t rc = {
        .node_id = td_daemon_node_id(m->d),
        .rank_id = r->id,
        .incarnation = td_daemon_incarnation(m->d),
        .transports = c->transports[0] ? c->transports : NULL,
        .kv_tokens = c->kv_tokens,
        .max_batch = (uint32_t)c->max_batch,
        .xfer_deadline_ms = (uint32_t)c->xfer_deadline_ms,
    };
    td_rank_io_t io = { decoded_on_send, decoded_on_load, r };
    if ((st = td_rank_create(r->base, m->engine, &rc, &io, &r->rk)) != TD_OK)
        goto err;
    td_link_config_t lc = { .routers = c->routers };
    lc.ctl.ident = (td_hello_ident_t){
        .protocol_version = TD_HELLO_PROTOCOL_VERSION,
        .role = TANDEM__ROLE__ROLE_DECODE,
        .node_id = td_daemon_node_id(m->d),
        .rank_id = r->id,
        .incarnation = td_daemon_incarnation(m->d),
        .model_fingerprint = m->fingerprint,
        .kv_layout_hash = m->engine->layout->hash,
    };
    lc.ctl.secret = td_daemon_secret(m->d, &lc.ctl.secret_len);
    Tandem__Register reg;
    decoded_register(r, &reg);
    td_link_handlers_t lh = { decoded_on_up, decoded_on_message, decoded_on_down, r };
    if ((st = td_link_create(r->base, &lc, &reg, &lh, &r->link)) != TD_OK)
        goto err;
    td_rank_load(r->rk);
    return TD_OK;

err:
    td_error("decode rank %u: cannot start: %s", r->id, td_status_str(st));
    decoded_rank_teardown(m, id);
    return st;
}

/* ---- Main thread -------------------------------------------------------------------- */

static void
decoded_on_signal(td_daemon_t *d, void *arg)
{
    decoded_t *m = arg;
    td_info("decoded: stopping: no new requests, live ones end with an error");
    td_daemon_stopping(d);
    td_ranks_stop(m->rs, TD_RANKS_STOP_DRAIN);
}

int
main(int argc, char **argv)
{
    static decoded_t m;
    int rc = 1;
    evthread_use_pthreads();
    if (!(m.base = event_base_new())) {
        fprintf(stderr, "decoded: cannot create the event loop\n");
        return 1;
    }
    td_status_t st = td_daemon_create("decoded", decoded_opts, &m.cfg, &m.cfg.d, argc, argv,
                                      m.base, decoded_on_signal, &m, &m.d);
    if (st != TD_OK) {
        event_base_free(m.base);
        return td_daemon_exit_code(st);
    }
    if (!m.cfg.routers[0]) {
        td_error("decoded: --routers is required");
        rc = 2;
        goto err_free_daemon;
    }
    if ((st = td_engine_create(&m.cfg.engine, &m.engine)) != TD_OK)
        goto err_free_daemon;
    snprintf(m.fingerprint, sizeof(m.fingerprint), "%016" PRIx64, m.engine->fingerprint);
    m.nranks = (uint32_t)m.cfg.ranks;
    m.ranks = calloc(m.nranks, sizeof(*m.ranks));
    if (!m.ranks) {
        td_error("decoded: out of memory");
        goto err_free_engine;
    }
    td_ranks_handlers_t rh = { decoded_rank_setup, decoded_on_stop, decoded_rank_teardown, &m };
    st = td_ranks_create(m.base, "decode rank", m.nranks, &rh, &m.rs);
    if (st == TD_OK) {
        char status[256];
        snprintf(status, sizeof(status), "node %s ranks %u kv-tokens %" PRIu64 " max-batch %"
                 PRIu64 " incarnation %016" PRIx64 " routers %s", td_daemon_node_id(m.d),
                 m.nranks, m.cfg.kv_tokens, m.cfg.max_batch, td_daemon_incarnation(m.d),
                 m.cfg.routers);
        fprintf(stderr, "decoded ready: %s\n", status);
        fflush(stderr);
        td_daemon_ready(m.d, status);
        event_base_dispatch(m.base);
        rc = 0;
    }
    /* A second signal lands here with ranks running. */
    td_ranks_destroy(m.rs);
    td_info("decoded: exiting");

err_free_engine:
    free(m.ranks);
    td_engine_destroy(m.engine);
err_free_daemon:
    td_daemon_destroy(m.d);
    td_config_free(decoded_opts, &m.cfg);
    event_base_free(m.base);
    libevent_global_shutdown();
    return rc;
}
