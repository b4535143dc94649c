/* worker/worker.c — the main() that prefilld and decoded share: loop, daemon,
 * engine, rank threads with their UCX workers and router links, ready line,
 * drain on SIGTERM (up to --drain-timeout), teardown in reverse. */
#include "worker.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "domjoin.h"
#include "log.h"
#include "progress.h"
#include "v41engine.h"
#include "wcons.h"

const td_engine_kind_t *const td_worker_engines[] = {
    &td_synth_kind,
    &td_v41_kind,
    NULL,
};

/* ---- Rank thread: a DEP group (--dep) ------------------------------------------------- */

/* The compute thread's agreement for one step: an all-gather of each rank's
 * word (bit 0: a pass to run, bit 1: leaving). */
static td_status_t
worker_dep_agree(void *arg, int work, int leaving, td_jobq_agreed_t *out)
{
    td_worker_rank_t *wr = arg;
    uint32_t n = td_comm_size(wr->comm), words[256];
    uint32_t mine = (work ? 1u : 0u) | (leaving ? 2u : 0u);
    td_status_t st;

    /* The tests' fault: this rank fails at its fault_at-th step with work,
     * as a rank whose thread failed would (the group must not hang). */
    if (work && wr->fault_at != 0 && ++wr->fault_seen == wr->fault_at) {
        td_warn("%s %u: TD_DEP_FAULT: failing the dep group at this rank's step %u",
                wr->w->spec->rank_name, wr->id, wr->fault_at);
        td_comm_abort(wr->comm, TD_ERR_INTERNAL);
        return TD_ERR_INTERNAL;
    }
    st = td_comm_allgather(wr->comm, &mine, sizeof(mine), words);

    if (st != TD_OK)
        return st;
    *out = (td_jobq_agreed_t){ .ranks = n };
    for (uint32_t r = 0; r < n; r++) {
        out->work += words[r] & 1u;
        out->leaving += (words[r] >> 1) & 1u;
    }
    return TD_OK;
}

static void
worker_dep_pass_empty(void *arg)
{
    td_worker_rank_t *wr = arg;

    (void)wr->engine->ops->pass_empty(wr->engine);   /* a failure breaks the group */
}

static uint64_t
worker_dep_passes(void *arg)
{
    td_worker_rank_t *wr = arg;

    return wr->engine->ops->passes(wr->engine);
}

/* Compute thread: the group broke; the rank's loop hears of it. */
static void
worker_dep_broken(void *arg, td_status_t st)
{
    td_worker_rank_t *wr = arg;

    (void)st;
    atomic_store(&wr->w->broken, 1);
    event_active(wr->broken_ev, 0, 0);
}

static void worker_rank_stop(void *arg, uint32_t id, td_ranks_stop_t how);
static void worker_link_config(const td_worker_rank_t *wr, td_link_config_t *out);

/* Loop thread: with the group gone every pass fails at once, so the rank
 * takes no more work (it reports itself draining), what it holds ends with
 * the failure, and the process exits (1) once every rank has: the group
 * must be made anew (comm.h). */
static void
worker_dep_on_broken(evutil_socket_t fd, short what, void *arg)
{
    td_worker_rank_t *wr = arg;

    (void)fd;
    (void)what;
    td_error("%s %u: its dep group broke (%s): taking no more work; the process exits once "
             "every rank has ended what it holds", wr->w->spec->rank_name, wr->id,
             td_status_str(td_comm_status(wr->comm)));
    td_worker_domain_withdraw(&wr->dom);   /* a restarted domain must not find this address */
    worker_rank_stop(wr->w, wr->id, TD_RANKS_STOP_DRAIN);
}

/* The rank's own engine (its experts) and its stepping. Logged. */
static td_status_t
worker_dep_setup(td_worker_rank_t *wr)
{
    td_worker_t *w = wr->w;
    const td_worker_opts_t *o = w->spec->wcfg;
    td_status_t st;

    if (o->domain_size > 0) {   /* a domain across processes: its rank's UCX communicator */
        char name[64];
        td_link_config_t lc;   /* a domain joined through a router: this process's Hello */
        worker_link_config(wr, &lc);
        td_worker_domain_t d = { .id = o->domain_id, .dir = o->domain_dir,
                                 .size = (uint32_t)o->domain_size,
                                 .wait_ms = o->dep_deadline_ms, .routers = o->routers,
                                 .ctl = &lc.ctl };
        td_comm_opts_t co = { .deadline_ms = o->dep_deadline_ms, .name = name };
        td_xfer_config_t xc = {
            .incarnation = td_daemon_incarnation(w->d),
            .transports = o->transports[0] ? o->transports : NULL,
            .tcp_device = w->data_dev[0] ? w->data_dev : NULL,
        };
        snprintf(name, sizeof(name), "dep domain %s", o->domain_id);
        st = td_worker_domain_create(&d, (uint32_t)o->domain_rank0 + wr->id, &xc, &co, &wr->dom);
        if (st != TD_OK)
            return st;
        wr->comm = wr->dom.comm;
    } else {
        wr->comm = w->comms[wr->id];
    }
    td_engine_group_t g = { wr->comm, o->placement };
    /* TD_DEP_FAULT=RANK:STEP (tests): rank RANK fails the group at its
     * STEP-th step with work (docs/dep.md, "In the daemons"). */
    const char *fault = getenv("TD_DEP_FAULT");
    unsigned fr, fs;
    if (fault != NULL && sscanf(fault, "%u:%u", &fr, &fs) == 2 && fr == td_comm_rank(wr->comm))
        wr->fault_at = fs;
    wr->broken_ev = event_new(wr->base, -1, 0, worker_dep_on_broken, wr);
    if (wr->broken_ev == NULL)
        return TD_ERR_NOMEM;
    st = td_engine_create_group(td_worker_engines, &w->spec->wcfg->engine, &g, &wr->own_engine);
    if (st != TD_OK)
        return st;
    if (!td_engine_is_group(wr->own_engine)) {
        td_error("%s %u: engine %s is not a dep group's rank", w->spec->rank_name, wr->id,
                 wr->own_engine->name);
        return TD_ERR_UNSUPPORTED;
    }
    wr->engine = wr->own_engine;
    wr->nexperts = wr->engine->ops->expert_tokens(wr->engine, NULL, 0);
    wr->experts = calloc(wr->nexperts ? wr->nexperts : 1, sizeof(*wr->experts));
    if (wr->experts == NULL) {
        td_error("%s %u: out of memory", w->spec->rank_name, wr->id);
        return TD_ERR_NOMEM;
    }
    wr->step = (td_jobq_step_t){
        .agree = worker_dep_agree,
        .pass_empty = worker_dep_pass_empty,
        .passes = worker_dep_passes,
        .broken = worker_dep_broken,
        .arg = wr,
        .idle_ms = (uint32_t)w->spec->wcfg->dep_idle_ms,
    };
    return TD_OK;
}

/* The frames a rank queued just before leaving its loop get this long to go
 * out (PrefillDone, the last Tokens). */
#define TD_WORKER_FLUSH_US 100000

/* ---- Rank thread: the routers ------------------------------------------------------ */

/* Register: the engine, draining, the DEP group the rank belongs to (its
 * domain's id across processes, else the node id; its index there), and what
 * the daemon adds. */
static void
worker_register(td_worker_rank_t *wr, Tandem__Register *reg)
{
    const td_engine_t *e = wr->w->engine;
    const td_worker_opts_t *o = wr->w->spec->wcfg;
    tandem__register__init(reg);
    reg->engine_name = (char *)e->name;
    reg->engine_kind = (char *)e->kind;
    reg->vocab_size = e->vocab;
    reg->max_context = e->max_context;
    reg->draining = wr->draining;
    if (o->dep) {
        bool domain = o->domain_size > 0;
        reg->dep_domain = domain ? o->domain_id : (char *)td_daemon_node_id(wr->w->d);
        reg->dep_size = domain ? (uint32_t)o->domain_size : wr->w->nranks;
        reg->dep_rank = (domain ? (uint32_t)o->domain_rank0 : 0) + wr->id;
    }
    wr->w->spec->rank_register(wr->rank, reg);
}

td_status_t
td_worker_rank_send(void *router, const Tandem__Envelope *env, void *arg)
{
    td_worker_rank_t *wr = arg;
    return td_link_send(wr->link, router, env);
}

/* The rank's last Load with its loop thread's passes (net/loopstat.h) and,
 * --dep, its group counters (per-expert rows, passes). */
static void
worker_load_send(td_worker_rank_t *wr)
{
    Tandem__Load l = wr->load;

    if (wr->loop != NULL) {
        memcpy(wr->loop_counts, wr->loop->counts, sizeof wr->loop_counts);
        l.n_loop_pass_counts = TD_LOOPSTAT_NBUCKETS + 1;
        l.loop_pass_counts = wr->loop_counts;   /* read by the link until the next Load */
        l.loop_pass_sum_us = wr->loop->sum_us;
        l.loop_pass_max_us = wr->loop->max_us;
    }
    if (wr->own_engine != NULL) {
        uint64_t passes = wr->engine->ops->passes(wr->engine);
        l.n_expert_tokens = wr->engine->ops->expert_tokens(wr->engine, wr->experts,
                                                           wr->nexperts);
        if (l.n_expert_tokens > wr->nexperts)
            l.n_expert_tokens = 0;   /* not sized for them: none sent */
        l.expert_tokens = wr->experts;   /* read by the link until the next Load */
        l.dep_passes = passes;
        wr->passes_sent = passes;
    }
    td_link_load(wr->link, &l);
}

/* Every second: the Load again with its loop's passes and (--dep) the
 * group's counters, which move also when its own load does not (a rank
 * serving only the others' tokens). */
static void
worker_on_load_timer(evutil_socket_t fd, short what, void *arg)
{
    td_worker_rank_t *wr = arg;

    (void)fd;
    (void)what;
    if (wr->link != NULL && wr->have_load)
        worker_load_send(wr);
}

void
td_worker_rank_load(const Tandem__Load *load, void *arg)
{
    td_worker_rank_t *wr = arg;
    if (wr->link == NULL)   /* before the link exists, or after it is gone */
        return;
    if (load->draining != wr->draining) {
        Tandem__Register reg;
        wr->draining = load->draining;
        worker_register(wr, &reg);
        (void)td_link_set_register(wr->link, &reg);
    }
    wr->load = *load;
    wr->load.base.n_unknown_fields = 0;
    wr->load.base.unknown_fields = NULL;
    wr->have_load = true;
    worker_load_send(wr);
}

void
td_worker_rank_broadcast(const Tandem__Envelope *env, void *arg)
{
    td_worker_rank_t *wr = arg;

    if (wr->link != NULL)
        (void)td_link_broadcast(wr->link, env);
}

void
td_worker_rank_idle(void *arg)
{
    td_worker_rank_t *wr = arg;
    struct timeval flush = { 0, TD_WORKER_FLUSH_US };
    event_base_loopexit(wr->base, &flush);
}

static void
worker_on_message(td_link_t *l, td_link_router_t *router, const Tandem__Envelope *env,
                  void *arg)
{
    td_worker_rank_t *wr = arg;
    (void)l;
    wr->w->spec->rank_message(wr->rank, router, env);
}

static void
worker_on_up(td_link_t *l, td_link_router_t *router, void *arg)
{
    td_worker_rank_t *wr = arg;
    (void)l;
    if (wr->w->spec->rank_router_up != NULL)
        wr->w->spec->rank_router_up(wr->rank, router);
}

static void
worker_on_down(td_link_t *l, td_link_router_t *router, td_status_t why, void *arg)
{
    td_worker_rank_t *wr = arg;
    (void)l;
    (void)why;
    wr->w->spec->rank_router_down(wr->rank, router);
}

/* ---- Rank thread: life cycle -------------------------------------------------------- */

/* The drain deadline passed: the rank ends what is left (errors to its
 * routers), and the loop leaves once it is idle or stop_ms later at most. */
static void
worker_rank_abort(evutil_socket_t fd, short what, void *arg)
{
    td_worker_rank_t *wr = arg;
    const td_worker_spec_t *spec = wr->w->spec;
    uint64_t ms = spec->stop_ms(spec->cfg);
    struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000) };
    (void)fd;
    (void)what;
    td_info("%s %u: drain deadline (%llu ms) passed: ending what is left", spec->rank_name,
            wr->id, (unsigned long long)spec->wcfg->drain_timeout_ms);
    event_base_loopexit(wr->base, &tv);
    spec->rank_abort(wr->rank);
}

/* DRAIN: the rank takes no more work and calls td_worker_rank_idle once
 * what it holds has ended; at the drain deadline what is left is ended
 * (worker_rank_abort). NOW: leave the loop now. */
static void
worker_rank_stop(void *arg, uint32_t id, td_ranks_stop_t how)
{
    td_worker_t *w = arg;
    td_worker_rank_t *wr = &w->ranks[id];
    uint64_t ms = w->spec->wcfg->drain_timeout_ms;
    struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000) };

    if (how == TD_RANKS_STOP_NOW) {
        event_base_loopexit(wr->base, NULL);
        return;
    }
    if (wr->drain_ev != NULL)   /* a second DRAIN changes nothing */
        return;
    wr->drain_ev = evtimer_new(wr->base, worker_rank_abort, wr);
    if (wr->drain_ev == NULL || evtimer_add(wr->drain_ev, &tv) != 0) {
        td_error("%s %u: no drain timer: ending its work now", w->spec->rank_name, id);
        w->spec->rank_stop(wr->rank);
        worker_rank_abort(-1, 0, wr);
        return;
    }
    w->spec->rank_stop(wr->rank);
}

uint64_t
td_worker_stop_bound_ms(const td_worker_spec_t *spec)
{
    return spec->wcfg->drain_timeout_ms + spec->stop_ms(spec->cfg) + TD_WORKER_FLUSH_US / 1000;
}

static void
worker_rank_teardown(void *arg, uint32_t id)
{
    td_worker_t *w = arg;
    td_worker_rank_t *wr = &w->ranks[id];
    if (wr->drain_ev != NULL)
        event_free(wr->drain_ev);
    wr->drain_ev = NULL;
    td_link_destroy(wr->link);
    wr->link = NULL;
    if (wr->rank != NULL)
        w->spec->rank_destroy(wr->rank);   /* with --dep its compute thread left the group */
    wr->rank = NULL;
    if (wr->load_timer != NULL)
        event_free(wr->load_timer);
    wr->load_timer = NULL;
    free(wr->experts);
    wr->experts = NULL;
    td_engine_destroy(wr->own_engine);
    wr->own_engine = NULL;
    td_worker_domain_destroy(&wr->dom);   /* after the engine that borrowed it */
    if (wr->broken_ev != NULL)
        event_free(wr->broken_ev);
    wr->broken_ev = NULL;
    td_xfer_destroy(wr->xfer);
    wr->xfer = NULL;
    td_kernels_cpu_pool_destroy(wr->pool);   /* its compute thread has stopped */
    wr->pool = NULL;
}

void
td_worker_rank_compute_start(void *arg)
{
    td_worker_rank_t *wr = arg;

    td_kernels_cpu_pool_bind(wr->pool);
}

/* Threads of a rank's compute pool: --compute-threads, else $TD_CPU_THREADS
 * or the online CPUs, divided among the process's ranks (at least 1). */
static unsigned
worker_compute_threads(const td_worker_t *w)
{
    uint64_t n = w->spec->wcfg->compute_threads;
    const char *env = getenv("TD_CPU_THREADS");
    long cpus;

    if (n != 0)
        return (unsigned)n;
    cpus = env != NULL && atol(env) > 0 ? atol(env) : sysconf(_SC_NPROCESSORS_ONLN);
    n = cpus > 0 ? (uint64_t)cpus / w->nranks : 1;
    return n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
}

/* The link configuration of rank wr: this process's Hello identity (node,
 * incarnation, model fingerprint, KV layout hash), the cluster secret and the
 * routers. Points into w: valid while it is (td_link_create copies). */
static void
worker_link_config(const td_worker_rank_t *wr, td_link_config_t *out)
{
    const td_worker_t *w = wr->w;
    *out = (td_link_config_t){ .routers = w->spec->wcfg->routers };
    out->ctl.ident = (td_hello_ident_t){
        .protocol_version = TD_HELLO_PROTOCOL_VERSION,
        .role = w->spec->role,
        .node_id = td_daemon_node_id(w->d),
        .rank_id = wr->id,
        .incarnation = td_daemon_incarnation(w->d),
        .model_fingerprint = w->fingerprint,
        .kv_layout_hash = w->engine->layout->hash,
    };
    out->ctl.secret = td_daemon_secret(w->d, &out->ctl.secret_len);
    out->ctl.heartbeat_ms = (uint32_t)w->spec->wcfg->heartbeat_ms;
}

/* A failure is logged here once, with the rank it stopped. */
static td_status_t
worker_rank_setup(void *arg, uint32_t id, struct event_base *base)
{
    td_worker_t *w = arg;
    const td_worker_spec_t *spec = w->spec;
    td_worker_rank_t *wr = &w->ranks[id];
    td_status_t st;
    *wr = (td_worker_rank_t){ .w = w, .id = id, .base = base, .engine = w->engine,
                              .loop = td_ranks_current_loopstat() };
    const char *tls = spec->wcfg->transports;
    td_xfer_config_t xc = {
        .incarnation = td_daemon_incarnation(w->d),
        .transports = tls[0] ? tls : NULL,
        .tcp_device = w->data_dev[0] ? w->data_dev : NULL,
        .map_peer_pools = spec->wcfg->prefault_pools,
    };
    if ((st = td_xfer_create(base, &xc, &wr->xfer)) != TD_OK)
        goto err;
    if ((st = td_kernels_cpu_pool_create(worker_compute_threads(w), &wr->pool)) != TD_OK)
        goto err;
    if (spec->wcfg->dep) {
        if ((st = worker_dep_setup(wr)) != TD_OK)
            goto err;
        wr->stepping = &wr->step;
    }
    if ((st = spec->rank_create(wr, &wr->rank)) != TD_OK)
        goto err;
    td_link_config_t lc;
    worker_link_config(wr, &lc);
    Tandem__Register reg;
    worker_register(wr, &reg);
    td_link_handlers_t lh = { worker_on_up, worker_on_message, worker_on_down, wr };
    if ((st = td_link_create(base, &lc, &reg, &lh, &wr->link)) != TD_OK)
        goto err;
    wr->load_timer = event_new(base, -1, EV_PERSIST, worker_on_load_timer, wr);
    if (wr->load_timer == NULL || event_add(wr->load_timer, &(struct timeval){ 1, 0 }) != 0) {
        st = TD_ERR_NOMEM;
        goto err;
    }
    if (spec->rank_started)
        spec->rank_started(wr->rank);
    return TD_OK;

err:
    td_error("%s %u: cannot start: %s", spec->rank_name, id, td_status_str(st));
    if (w->comms != NULL)   /* the group's other ranks do not wait for this one */
        td_comm_abort(w->comms[id], st);
    else if (wr->dom.comm != NULL)
        td_comm_abort(wr->dom.comm, st);
    worker_rank_teardown(w, id);
    return st;
}

/* ---- Main thread -------------------------------------------------------------------- */

/* The interface the ranks' UCX tcp transport listens on (w->data_dev):
 * data-address's interface, none for "*" (every interface), by default the
 * one the routers are reached through (loopback for a one-host cluster). A
 * failure is logged here. */
static td_status_t
worker_data_device(td_worker_t *w)
{
    const char *spec = w->spec->wcfg->data_address, *ident = w->spec->ident;
    td_status_t st;

    if (strcmp(spec, "*") == 0) {
        w->data_dev[0] = '\0';
        td_warn("%s: data-address *: ucx's tcp transport listens on every interface",
                ident);
        return TD_OK;
    }
    if (spec[0] != '\0') {
        if (td_netif_find(spec, w->data_dev, sizeof(w->data_dev)) != TD_OK) {
            td_error("%s: data-address %s is neither an interface nor an address of this "
                     "host", ident, spec);
            return TD_ERR_INVALID;
        }
        td_info("%s: data plane: ucx tcp on %s (data-address %s)", ident, w->data_dev, spec);
        return TD_OK;
    }
    st = td_link_routers_netif(w->spec->wcfg->routers, w->data_dev, sizeof(w->data_dev));
    if (st == TD_ERR_INVALID)
        return st;   /* the list is bad: logged */
    if (st != TD_OK) {
        td_error("%s: no interface of this host reaches the routers %s: give data-address",
                 ident, w->spec->wcfg->routers);
        return TD_ERR_INVALID;
    }
    td_info("%s: data plane: ucx tcp on %s (the interface that reaches the routers; "
            "data-address to choose)", ident, w->data_dev);
    return TD_OK;
}

/* SIGTERM: every rank drains up to --drain-timeout (a second signal leaves
 * the loops at once). */
static void
worker_on_signal(td_daemon_t *d, void *arg)
{
    td_worker_t *w = arg;
    td_info("%s: stopping: every rank takes no new work; what it holds gets %llu ms to "
            "finish", w->spec->ident, (unsigned long long)w->spec->wcfg->drain_timeout_ms);
    td_daemon_stopping(d, td_worker_stop_bound_ms(w->spec));
    td_ranks_stop(w->rs, TD_RANKS_STOP_DRAIN);
}

/* Loading the engine's weights can take minutes: each progress line
 * (logged by base/progress) is also systemd's STATUS= until READY. */
static void
worker_on_progress(td_progress_phase_t phase, const char *line, void *arg)
{
    td_worker_t *w = arg;

    (void)phase;
    td_daemon_status(w->d, line);
}

/* The ready line after "<ident> ready: ", also systemd's STATUS=. */
static char *
worker_status(const td_worker_t *w)
{
    td_buf_t b = { 0 };
    td_buf_printf(&b, "node %s, %u ranks, incarnation %016" PRIx64 ", routers %s",
                  td_daemon_node_id(w->d), w->nranks, td_daemon_incarnation(w->d),
                  w->spec->wcfg->routers);
    const td_worker_opts_t *o = w->spec->wcfg;
    if (o->dep && o->domain_size > 0)
        td_buf_printf(&b, ", dep domain %s: ranks %llu..%llu of %llu (%s)", o->domain_id,
                      (unsigned long long)o->domain_rank0,
                      (unsigned long long)(o->domain_rank0 + w->nranks - 1),
                      (unsigned long long)o->domain_size,
                      o->placement[0] ? o->placement : "contiguous experts");
    else if (o->dep)
        td_buf_printf(&b, ", dep group of %u ranks (%s)", w->nranks,
                      o->placement[0] ? o->placement : "contiguous experts");
    if (w->spec->status)
        w->spec->status(w->spec->cfg, &b);
    return td_buf_take(&b, NULL);
}

/* The --dep options agree with each other and --ranks (logged). */
static td_status_t
worker_dep_check(const td_worker_spec_t *spec)
{
    const td_worker_opts_t *o = spec->wcfg;

    if (o->placement[0] && !o->dep) {
        td_error("%s: --placement goes with --dep", spec->ident);
        return TD_ERR_INVALID;
    }
    if (o->domain_size == 0)
        return TD_OK;
    size_t idlen = strlen(o->domain_id);
    bool id_ok = idlen >= 1 && idlen <= TD_DOMJOIN_ID_MAX;   /* DomainJoin's bound */
    for (size_t i = 0; i < idlen; i++)
        id_ok &= o->domain_id[i] > ' ' && o->domain_id[i] <= '~' && o->domain_id[i] != '/';
    if (!o->dep || !id_ok) {
        td_error("%s: --domain-size goes with --dep and a --domain-id of 1..64 printable "
                 "characters without '/' or ' '", spec->ident);
        return TD_ERR_INVALID;
    }
    if (o->domain_rank0 + o->ranks > o->domain_size) {
        td_error("%s: ranks %llu..%llu (--domain-rank0, --ranks) lie outside a domain of %llu",
                 spec->ident, (unsigned long long)o->domain_rank0,
                 (unsigned long long)(o->domain_rank0 + o->ranks - 1),
                 (unsigned long long)o->domain_size);
        return TD_ERR_INVALID;
    }
    return TD_OK;
}

/* --dep: the ranks' CPU communicator group and every rank's communicator,
 * made before the rank threads so that a rank failing to start can take
 * itself out of the group (td_comm_abort) and nobody waits for it. */
static td_status_t
worker_dep_group_create(td_worker_t *w)
{
    char name[64];
    td_comm_opts_t co = { .deadline_ms = w->spec->wcfg->dep_deadline_ms, .name = name };
    td_status_t st;

    snprintf(name, sizeof(name), "%s dep group", w->spec->ident);
    st = td_comm_group_create(w->nranks, &co, &w->group);   /* logs */
    if (st != TD_OK)
        return st;
    w->comms = calloc(w->nranks, sizeof(*w->comms));
    if (w->comms == NULL) {
        td_error("%s: out of memory", w->spec->ident);
        return TD_ERR_NOMEM;
    }
    for (uint32_t r = 0; r < w->nranks; r++)
        if ((st = td_comm_cpu_create(w->group, r, &w->comms[r])) != TD_OK)
            return st;
    return TD_OK;
}

static void
worker_dep_group_destroy(td_worker_t *w)
{
    for (uint32_t r = 0; w->comms != NULL && r < w->nranks; r++)
        td_comm_destroy(w->comms[r]);
    free(w->comms);
    w->comms = NULL;
    td_comm_group_destroy(w->group);
    w->group = NULL;
}

int
td_worker_main(const td_worker_spec_t *spec, int argc, char **argv)
{
    static td_worker_t worker;   /* the rank threads use it until they are joined */
    td_worker_t *w = &worker;
    int rc = 1;
    w->spec = spec;
    evthread_use_pthreads();
    if (!(w->base = event_base_new())) {
        fprintf(stderr, "%s: cannot create the event loop\n", spec->ident);
        return 1;
    }
    td_status_t st = td_daemon_create(spec->ident, spec->opts, spec->cfg, &spec->wcfg->d,
                                      argc, argv, w->base, worker_on_signal, w, &w->d);
    if (st != TD_OK) {
        event_base_free(w->base);
        return td_daemon_exit_code(st);
    }
    if (!spec->wcfg->routers[0]) {
        td_error("%s: --routers is required", spec->ident);
        rc = 2;
        goto err_free_daemon;
    }
    if ((st = worker_data_device(w)) != TD_OK) {
        rc = 2;
        goto err_free_daemon;
    }
    if ((st = worker_dep_check(spec)) != TD_OK) {
        rc = 2;
        goto err_free_daemon;
    }
    td_progress_set_handler(worker_on_progress, w);
    /* With --dep each rank loads its own model (its experts: worker_dep_setup);
     * the process needs the identity only (Hello, Register). */
    st = spec->wcfg->dep
             ? td_engine_create_identity(td_worker_engines, &spec->wcfg->engine, &w->engine)
             : td_engine_create(td_worker_engines, &spec->wcfg->engine, &w->engine);
    td_progress_set_handler(NULL, NULL);
    if (st != TD_OK)
        goto err_free_daemon;
    snprintf(w->fingerprint, sizeof(w->fingerprint), "%016" PRIx64, w->engine->fingerprint);
    if (td_wcons_setup(spec->wcfg->engine.model, w->engine->stop, w->engine->nstop) != TD_OK)
        goto err_free_engine;   /* logged */
    w->nranks = (uint32_t)spec->wcfg->ranks;
    if (spec->wcfg->dep && spec->wcfg->domain_size == 0 && worker_dep_group_create(w) != TD_OK)
        goto err_free_engine;
    w->ranks = calloc(w->nranks, sizeof(*w->ranks));
    if (!w->ranks) {
        td_error("%s: out of memory", spec->ident);
        goto err_free_engine;
    }
    td_ranks_handlers_t rh = { worker_rank_setup, worker_rank_stop, worker_rank_teardown, w };
    if (td_ranks_create(w->base, spec->rank_name, w->nranks, &rh, &w->rs) == TD_OK) {
        char *status = worker_status(w);
        fprintf(stderr, "%s ready: %s\n", spec->ident, status ? status : "");
        fflush(stderr);
        td_daemon_ready(w->d, status ? status : "");
        free(status);
        event_base_dispatch(w->base);
        rc = 0;
    }
    /* A second signal lands here with ranks running. */
    td_ranks_destroy(w->rs);
    td_info("%s: exiting", spec->ident);

    if (atomic_load(&w->broken))
        rc = 1;

err_free_engine:
    worker_dep_group_destroy(w);
    free(w->ranks);
    td_wcons_teardown();
    td_engine_destroy(w->engine);
err_free_daemon:
    td_daemon_destroy(w->d);
    td_config_free(spec->opts, spec->cfg);
    event_base_free(w->base);
    libevent_global_shutdown();
    return rc;
}
