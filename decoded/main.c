/* decoded/main.c — the decode daemon: options, one engine shared by M rank
 * threads, each with its own event loop, UCX worker, KV pools and router
 * links (decoded/drank.h); systemd readiness; SIGTERM stops taking work, ends
 * the live requests with an error event and exits. docs/decoded.md. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>

#include "daemon.h"
#include "engine.h"
#include "link.h"
#include "drank.h"
#include "ranks.h"
#include "worker.h"

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
    struct event_base *base;     /* the rank's loop, owned by m->w.rs */
    td_drank_t *rk;
    td_link_t *link;
    bool draining;               /* what Register last said */
} decoded_rank_t;

struct decoded {
    decoded_config_t cfg;
    td_worker_t w;               /* w.ranks: decoded_rank_t[w.nranks] */
};

static decoded_rank_t *
decoded_rank(void *arg, uint32_t id)
{
    decoded_rank_t *ranks = ((decoded_t *)arg)->w.ranks;
    return &ranks[id];
}

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
    td_drank_register_fill(r->rk, reg);
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
    td_drank_on_message(r->rk, router, env);
}

static void
decoded_on_down(td_link_t *l, td_link_router_t *router, td_status_t why, void *arg)
{
    decoded_rank_t *r = arg;
    td_warn("decode rank %u: router %s down (%s): canceling its requests", r->id,
            td_link_router_name(router), td_status_str(why));
    td_drank_on_router_down(r->rk, router);
}

static void
decoded_on_stop(void *arg, uint32_t id, td_ranks_stop_t how)
{
    decoded_rank_t *r = decoded_rank(arg, id);
    struct timeval flush = { 0, 100000 };   /* let the last Tokens frames go out */
    td_drank_stop(r->rk);
    event_base_loopexit(r->base, &flush);
}

static void
decoded_rank_teardown(void *arg, uint32_t id)
{
    decoded_rank_t *r = decoded_rank(arg, id);
    td_link_destroy(r->link);
    r->link = NULL;
    td_drank_destroy(r->rk);
    r->rk = NULL;
}

static td_status_t
decoded_rank_setup(void *arg, uint32_t id, struct event_base *base)
{
    decoded_t *m = arg;
    decoded_rank_t *r = decoded_rank(m, id);
    const decoded_config_t *c = &m->cfg;
    td_status_t st;
    r->m = m;
    r->id = id;
    r->base = base;
    td_drank_config_t rc = {
        .node_id = td_daemon_node_id(m->w.d),
        .rank_id = r->id,
        .incarnation = td_daemon_incarnation(m->w.d),
        .transports = c->transports[0] ? c->transports : NULL,
        .kv_tokens = c->kv_tokens,
        .max_batch = (uint32_t)c->max_batch,
        .xfer_deadline_ms = (uint32_t)c->xfer_deadline_ms,
    };
    td_drank_io_t io = { decoded_on_send, decoded_on_load, r };
    if ((st = td_drank_create(r->base, m->w.engine, &rc, &io, &r->rk)) != TD_OK)
        goto err;
    td_link_config_t lc;
    td_worker_link_config(&m->w, TANDEM__ROLE__ROLE_DECODE, r->id, c->routers, &lc);
    Tandem__Register reg;
    decoded_register(r, &reg);
    td_link_handlers_t lh = { decoded_on_up, decoded_on_message, decoded_on_down, r };
    if ((st = td_link_create(r->base, &lc, &reg, &lh, &r->link)) != TD_OK)
        goto err;
    td_drank_load(r->rk);
    return TD_OK;

err:
    td_error("decode rank %u: cannot start: %s", r->id, td_status_str(st));
    decoded_rank_teardown(m, id);
    return st;
}

/* ---- Main thread -------------------------------------------------------------------- */

static void
decoded_status(void *arg, char *buf, size_t len)
{
    const decoded_t *m = arg;
    snprintf(buf, len, "node %s ranks %u kv-tokens %" PRIu64 " max-batch %" PRIu64
             " incarnation %016" PRIx64 " routers %s", td_daemon_node_id(m->w.d),
             m->w.nranks, m->cfg.kv_tokens, m->cfg.max_batch, td_daemon_incarnation(m->w.d),
             m->cfg.routers);
}

int
main(int argc, char **argv)
{
    static decoded_t m;
    const td_worker_spec_t spec = {
        .ident = "decoded",
        .rank_name = "decode rank",
        .opts = decoded_opts,
        .cfg = &m.cfg,
        .daemon_cfg = &m.cfg.d,
        .engine_cfg = &m.cfg.engine,
        .routers = &m.cfg.routers,
        .ranks = &m.cfg.ranks,
        .rank_size = sizeof(decoded_rank_t),
        .rank = { decoded_rank_setup, decoded_on_stop, decoded_rank_teardown, &m },
        .stopping = "decoded: stopping: no new requests, live ones end with an error",
        .status = decoded_status,
    };
    return td_worker_main(&m.w, &spec, argc, argv);
}
