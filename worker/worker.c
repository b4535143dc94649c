/* worker/worker.c — the main() that prefilld and decoded share: loop, daemon,
 * engine, rank threads, ready line, drain on SIGTERM, teardown in reverse. */
#include "worker.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "v41engine.h"

const td_engine_kind_t *const td_worker_engines[] = {
    &td_synth_kind,
    &td_v41_kind,
    NULL,
};

/* What the SIGTERM handler needs; lives on td_worker_main's stack. */
typedef struct {
    td_worker_t *w;
    const td_worker_spec_t *spec;
} td_worker_ctx_t;

static void
td_worker_on_signal(td_daemon_t *d, void *arg)
{
    td_worker_ctx_t *ctx = arg;
    if (ctx->spec->stopping)
        td_info("%s", ctx->spec->stopping);
    td_daemon_stopping(d);
    td_ranks_stop(ctx->w->rs, TD_RANKS_STOP_DRAIN);
}

int
td_worker_main(td_worker_t *w, const td_worker_spec_t *spec, int argc, char **argv)
{
    td_worker_ctx_t ctx = { w, spec };
    int rc = 1;
    evthread_use_pthreads();
    if (!(w->base = event_base_new())) {
        fprintf(stderr, "%s: cannot create the event loop\n", spec->ident);
        return 1;
    }
    td_status_t st = td_daemon_create(spec->ident, spec->opts, spec->cfg, spec->daemon_cfg,
                                      argc, argv, w->base, td_worker_on_signal, &ctx, &w->d);
    if (st != TD_OK) {
        event_base_free(w->base);
        return td_daemon_exit_code(st);
    }
    if (!(*spec->routers)[0]) {
        td_error("%s: --routers is required", spec->ident);
        rc = 2;
        goto err_free_daemon;
    }
    if ((st = td_engine_create(td_worker_engines, spec->engine_cfg, &w->engine)) != TD_OK)
        goto err_free_daemon;
    snprintf(w->fingerprint, sizeof(w->fingerprint), "%016" PRIx64, w->engine->fingerprint);
    w->nranks = (uint32_t)*spec->ranks;
    w->ranks = calloc(w->nranks, spec->rank_size);
    if (!w->ranks) {
        td_error("%s: out of memory", spec->ident);
        goto err_free_engine;
    }
    st = td_ranks_create(w->base, spec->rank_name, w->nranks, &spec->rank, &w->rs);
    if (st == TD_OK) {
        char status[256];
        spec->status(spec->rank.arg, status, sizeof(status));
        fprintf(stderr, "%s ready: %s\n", spec->ident, status);
        fflush(stderr);
        td_daemon_ready(w->d, status);
        event_base_dispatch(w->base);
        rc = 0;
    }
    /* A second signal lands here with ranks running. */
    td_ranks_destroy(w->rs);
    td_info("%s: exiting", spec->ident);

err_free_engine:
    free(w->ranks);
    td_engine_destroy(w->engine);
err_free_daemon:
    td_daemon_destroy(w->d);
    td_config_free(spec->opts, spec->cfg);
    event_base_free(w->base);
    libevent_global_shutdown();
    return rc;
}

void
td_worker_link_config(const td_worker_t *w, Tandem__Role role, uint32_t rank_id,
                      const char *routers, td_link_config_t *out)
{
    *out = (td_link_config_t){ .routers = routers };
    out->ctl.ident = (td_hello_ident_t){
        .protocol_version = TD_HELLO_PROTOCOL_VERSION,
        .role = role,
        .node_id = td_daemon_node_id(w->d),
        .rank_id = rank_id,
        .incarnation = td_daemon_incarnation(w->d),
        .model_fingerprint = w->fingerprint,
        .kv_layout_hash = w->engine->layout->hash,
    };
    out->ctl.secret = td_daemon_secret(w->d, &out->ctl.secret_len);
}
