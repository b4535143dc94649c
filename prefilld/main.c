/* prefilld/main.c — the prefill daemon: options, one engine shared by N rank
 * threads, each with its own event loop, UCX worker, router links and task
 * queue (prefilld/prank.h); systemd readiness; SIGTERM ends every task with its
 * terminal notification before the process exits. docs/prefilld.md. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>

#include "daemon.h"
#include "engine.h"
#include "link.h"
#include "prank.h"
#include "ranks.h"
#include "worker.h"
#include "xfer.h"

#define PREFILLD_RANKS_MAX 64

typedef struct {
    td_daemon_opts_t d;
    td_engine_config_t engine;
    char *routers;
    uint64_t ranks;
    uint64_t chunk_tokens;
    uint64_t max_queued_tokens;
    uint64_t max_running;
    char *transports;
    uint64_t xfer_deadline_ms;
} prefilld_config_t;

static const td_config_opt_t prefilld_opts[] = {
    TD_DAEMON_CONFIG_OPTS(prefilld_config_t, d),
    TD_ENGINE_CONFIG_OPTS(prefilld_config_t, engine),
    TD_CONFIG_OPT_STRING("routers", prefilld_config_t, routers, "",
                         "routers to register with, host:port[,host:port...] (required)"),
    TD_CONFIG_OPT_UINT64("ranks", prefilld_config_t, ranks, "1", 1, PREFILLD_RANKS_MAX,
                         "rank threads (a prefill group: one per gpu)"),
    TD_CONFIG_OPT_UINT64("chunk-tokens", prefilld_config_t, chunk_tokens, "512", 1, 1 << 20,
                         "prompt tokens per prefill chunk"),
    TD_CONFIG_OPT_UINT64("max-queued-tokens", prefilld_config_t, max_queued_tokens, "1048576",
                         0, 0, "prompt tokens not yet prefilled per rank before refusing (0: no cap)"),
    TD_CONFIG_OPT_UINT64("max-running", prefilld_config_t, max_running, "8", 1, 4096,
                         "requests per rank prefilled round-robin, chunk by chunk"),
    TD_CONFIG_OPT_STRING("transports", prefilld_config_t, transports, "",
                         "ucx transport list like UCX_TLS (default: ucx's choice)"),
    TD_CONFIG_OPT_UINT64("xfer-deadline-ms", prefilld_config_t, xfer_deadline_ms, "10000", 1,
                         3600000, "deadline of one kv transfer in ms (decode ranks hold "
                         "the blocks of a request whose prefill failed for twice this)"),
    TD_CONFIG_OPT_END
};

typedef struct prefilld prefilld_t;

/* One rank's state; it belongs to that rank's thread (common/ranks.h). */
typedef struct {
    prefilld_t *m;
    uint32_t id;
    struct event_base *base;     /* the rank's loop, owned by m->w.rs */
    td_xfer_t *x;
    td_prank_t *rk;
    td_link_t *link;
} prefilld_rank_t;

struct prefilld {
    prefilld_config_t cfg;
    td_worker_t w;               /* w.ranks: prefilld_rank_t[w.nranks] */
};

static prefilld_rank_t *
prefilld_rank(void *arg, uint32_t id)
{
    prefilld_rank_t *ranks = ((prefilld_t *)arg)->w.ranks;
    return &ranks[id];
}

/* ---- Rank thread ------------------------------------------------------------------ */

static void
prefilld_register(prefilld_rank_t *r, int draining, Tandem__Register *reg)
{
    tandem__register__init(reg);
    reg->engine_name = (char *)r->m->w.engine->name;
    reg->engine_kind = (char *)r->m->w.engine->kind;
    reg->vocab_size = r->m->w.engine->vocab;
    reg->max_context = r->m->w.engine->max_context;
    reg->draining = draining;
    reg->xfer_deadline_ms = (uint32_t)r->m->cfg.xfer_deadline_ms;
}

static void
prefilld_on_done(td_prank_t *rk, void *router, const Tandem__PrefillDone *msg, void *arg)
{
    prefilld_rank_t *r = arg;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_PREFILL_DONE;
    env.prefill_done = (Tandem__PrefillDone *)msg;
    td_status_t st = td_link_send(r->link, router, &env);
    if (st != TD_OK)
        td_warn("prefill rank %u: req %016" PRIx64 ": prefill done to router %s not sent: %s",
                r->id, msg->req_id, td_link_router_name(router), td_status_str(st));
}

static void
prefilld_on_load(td_prank_t *rk, const Tandem__Load *load, void *arg)
{
    prefilld_rank_t *r = arg;
    td_link_load(r->link, load);
}

static void
prefilld_on_idle(td_prank_t *rk, void *arg)
{
    prefilld_rank_t *r = arg;
    struct timeval flush = { 0, 100000 };   /* let the last PrefillDone frames go out */
    td_info("prefill rank %u: every task ended", r->id);
    event_base_loopexit(r->base, &flush);
}

static void
prefilld_on_message(td_link_t *l, td_link_router_t *router, const Tandem__Envelope *env,
                    void *arg)
{
    prefilld_rank_t *r = arg;
    switch (env->payload_case) {
    case TANDEM__ENVELOPE__PAYLOAD_PREFILL:
        td_prank_prefill(r->rk, router, env->prefill);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_CANCEL:
        td_prank_cancel(r->rk, router, env->cancel);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_DECODE_PEER:
        td_prank_decode_peer(r->rk, env->decode_peer);
        break;
    case TANDEM__ENVELOPE__PAYLOAD_DRAIN: {
        Tandem__Register reg;
        prefilld_register(r, env->drain->draining, &reg);
        td_prank_drain(r->rk, env->drain->draining);
        (void)td_link_set_register(l, &reg);
        td_info("prefill rank %u: %s by router %s", r->id,
                env->drain->draining ? "draining" : "undrained", td_link_router_name(router));
        break;
    }
    default:
        td_debug("prefill rank %u: router %s: message %d ignored", r->id,
                 td_link_router_name(router), (int)env->payload_case);
        break;
    }
}

static void
prefilld_on_down(td_link_t *l, td_link_router_t *router, td_status_t why, void *arg)
{
    prefilld_rank_t *r = arg;
    td_prank_router_down(r->rk, router);
}

/* DRAIN: finish the tasks; NOW: exit now. */
static void
prefilld_on_stop(void *arg, uint32_t id, td_ranks_stop_t how)
{
    prefilld_rank_t *r = prefilld_rank(arg, id);
    if (how == TD_RANKS_STOP_NOW) {
        event_base_loopexit(r->base, NULL);
        return;
    }
    /* Bounded: tasks wait for their transfers, which have a deadline. */
    uint64_t ms = 2 * r->m->cfg.xfer_deadline_ms + 2000;
    struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000) };
    event_base_loopexit(r->base, &tv);
    td_prank_stop(r->rk);
}

static void
prefilld_rank_teardown(void *arg, uint32_t id)
{
    prefilld_rank_t *r = prefilld_rank(arg, id);
    td_link_destroy(r->link);
    td_prank_destroy(r->rk);
    td_xfer_destroy(r->x);
    r->link = NULL;
    r->rk = NULL;
    r->x = NULL;
}

static td_status_t
prefilld_rank_setup(void *arg, uint32_t id, struct event_base *base)
{
    prefilld_t *m = arg;
    prefilld_rank_t *r = prefilld_rank(m, id);
    const prefilld_config_t *c = &m->cfg;
    td_status_t st;
    r->m = m;
    r->id = id;
    r->base = base;
    td_xfer_config_t xc = {
        .incarnation = td_daemon_incarnation(m->w.d),
        .transports = c->transports[0] ? c->transports : NULL,
    };
    if ((st = td_xfer_create(r->base, &xc, &r->x)) != TD_OK)
        goto err;
    td_prank_config_t rc = {
        .rank_id = r->id,
        .chunk_tokens = c->chunk_tokens,
        .max_queued_tokens = c->max_queued_tokens,
        .max_running = (uint32_t)c->max_running,
        .deadline_ms = (uint32_t)c->xfer_deadline_ms,
    };
    td_prank_handlers_t rh = { prefilld_on_done, prefilld_on_load, prefilld_on_idle, r };
    if ((st = td_prank_create(r->base, r->x, m->w.engine, &rc, &rh, &r->rk)) != TD_OK)
        goto err;
    td_link_config_t lc;
    td_worker_link_config(&m->w, TANDEM__ROLE__ROLE_PREFILL, r->id, c->routers, &lc);
    Tandem__Register reg;
    prefilld_register(r, 0, &reg);
    td_link_handlers_t lh = { NULL, prefilld_on_message, prefilld_on_down, r };
    if ((st = td_link_create(r->base, &lc, &reg, &lh, &r->link)) != TD_OK)
        goto err;
    return TD_OK;

err:
    td_error("prefill rank %u: cannot start: %s", r->id, td_status_str(st));
    prefilld_rank_teardown(m, id);
    return st;
}

/* ---- Main thread -------------------------------------------------------------------- */

static void
prefilld_status(void *arg, char *buf, size_t len)
{
    const prefilld_t *m = arg;
    snprintf(buf, len, "node %s, %u ranks, incarnation %016" PRIx64 ", routers %s",
             td_daemon_node_id(m->w.d), m->w.nranks, td_daemon_incarnation(m->w.d),
             m->cfg.routers);
}

int
main(int argc, char **argv)
{
    static prefilld_t m;
    const td_worker_spec_t spec = {
        .ident = "prefilld",
        .rank_name = "prefill rank",
        .opts = prefilld_opts,
        .cfg = &m.cfg,
        .daemon_cfg = &m.cfg.d,
        .engine_cfg = &m.cfg.engine,
        .routers = &m.cfg.routers,
        .ranks = &m.cfg.ranks,
        .rank_size = sizeof(prefilld_rank_t),
        .rank = { prefilld_rank_setup, prefilld_on_stop, prefilld_rank_teardown, &m },
        .status = prefilld_status,
    };
    return td_worker_main(&m.w, &spec, argc, argv);
}
