/* worker/worker.h — what the worker daemons (prefilld, decoded) share: the
 * options every worker has, main() (loop, daemon, engine, rank threads, ready
 * line, SIGTERM as a drain up to a deadline, teardown in reverse) and each rank thread's
 * plumbing (its UCX worker, its router links, Register and Load, the stop).
 * A daemon says what differs in a td_worker_spec_t: its own options and the
 * operations of its rank (prefilld/prank.h, decoded/drank.h). */
#ifndef TD_WORKER_H
#define TD_WORKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "comm.h"
#include "config.h"
#include "domain.h"
#include "kernels.h"
#include "daemon.h"
#include "engine.h"
#include "jobq.h"
#include "link.h"
#include "netif.h"
#include "ranks.h"
#include "registry.h"
#include "xfer.h"

/* The engines a worker daemon runs: synthetic and deepseek-v41. */
extern const td_engine_kind_t *const td_worker_engines[];

#define TD_WORKER_RANKS_MAX 64

/* The options of every worker daemon; a member of the daemon's config struct,
 * listed in its table with TD_WORKER_CONFIG_OPTS. */
typedef struct {
    td_daemon_opts_t d;
    td_engine_config_t engine;
    char *routers;               /* required */
    uint64_t ranks;
    char *transports;            /* "": UCX's choice */
    char *data_address;          /* UCX's tcp interface: an interface or one of its
                                    addresses; "": the one reaching the routers; "*": all */
    uint64_t xfer_deadline_ms;
    uint64_t heartbeat_ms;       /* control heartbeats to the routers */
    uint64_t compute_threads;    /* per rank; 0: the CPUs shared among the ranks */
    uint64_t drain_timeout_ms;   /* SIGTERM: work in hand gets this long to finish */
    bool dep;                    /* the ranks are one DEP group (docs/dep.md, "In the daemons") */
    bool prefault_pools;         /* fault the kv pools in at start */
    char *placement;             /*   its placement file; "": contiguous ranges */
    uint64_t dep_idle_ms;        /*   an idle group agrees again after this long */
    uint64_t dep_deadline_ms;    /*   deadline of each collective of the group */
    uint64_t domain_size;        /* --dep across processes (decoded): ranks in the domain;
                                    0: the group is this process's ranks */
    uint64_t domain_rank0;       /*   this process's first rank in it */
    char *domain_dir;            /*   where the processes exchange their ranks' addresses;
                                      "": through the first router (DomainJoin) */
    char *domain_id;             /*   names the domain (at the router, in domain_dir) */
} td_worker_opts_t;

/* The options of a domain across processes (decoded only). */
#define TD_WORKER_DOMAIN_OPTS(st, m)                                                      \
    TD_CONFIG_OPT_UINT64("domain-size", st, m.domain_size, "0", 0, 256,                 \
                         "with --dep: ranks in the decode domain, over every process "   \
                         "(0: this process's ranks are the whole group)"),               \
    TD_CONFIG_OPT_UINT64("domain-rank0", st, m.domain_rank0, "0", 0, 255,               \
                         "with --domain-size: this process's first rank in the domain"), \
    TD_CONFIG_OPT_STRING("domain-dir", st, m.domain_dir, "",                            \
                         "with --domain-size: exchange the ranks' addresses through this " \
                         "directory, which every process of the domain sees (default: "  \
                         "through the first router of --routers that answers)"),         \
    TD_CONFIG_OPT_STRING("domain-id", st, m.domain_id, "domain",                        \
                         "with --domain-size: names the domain (at the router, and its " \
                         "files in --domain-dir); the same in every process of it")

#define TD_WORKER_CONFIG_OPTS(st, m, ranks_help, deadline_help)                        \
    TD_DAEMON_CONFIG_OPTS(st, m.d),                                                     \
    TD_ENGINE_CONFIG_OPTS(st, m.engine),                                                \
    TD_CONFIG_OPT_STRING("routers", st, m.routers, "",                                  \
                         "routers to register with, host:port[,host:port...] (required)"), \
    TD_CONFIG_OPT_UINT64("ranks", st, m.ranks, "1", 1, TD_WORKER_RANKS_MAX, ranks_help),  \
    TD_CONFIG_OPT_STRING("transports", st, m.transports, "",                            \
                         "ucx transport list like UCX_TLS (default: ucx's choice)"),    \
    TD_CONFIG_OPT_STRING("data-address", st, m.data_address, "",                        \
                         "the interface, or an address of it, that ucx's tcp transport " \
                         "listens on (default: loopback when every router is on "        \
                         "loopback, else the interface that reaches the first router; "  \
                         "*: every interface)"),                                         \
    TD_CONFIG_OPT_UINT64("xfer-deadline-ms", st, m.xfer_deadline_ms, "10000", 1, 3600000, \
                         deadline_help),                                                \
    TD_CONFIG_OPT_DURATION("heartbeat", st, m.heartbeat_ms, "1s", 10, 60000,            \
                           "control heartbeat interval to the routers; three missed "   \
                           "mark the router gone (use the routers' value)"),            \
    TD_CONFIG_OPT_UINT64("compute-threads", st, m.compute_threads, "0", 0, 256,        \
                         "cpu threads of each rank's compute pool (0: the online cpus "  \
                         "divided among the ranks, or $TD_CPU_THREADS)"),                \
    TD_CONFIG_OPT_DURATION("drain-timeout", st, m.drain_timeout_ms, "30s", 0, 3600000,  \
                           "on SIGTERM the ranks take no new work and what they hold "   \
                           "gets this long to finish; then it ends with an error"),      \
    TD_CONFIG_OPT_BOOL("prefault-pools", st, m.prefault_pools, "true",                  \
                       "fault every page of the ranks' kv pools in at start (and map "  \
                       "in the peers' pools that shared memory attaches here), so that " \
                       "resident memory stays flat under load"),                         \
    TD_CONFIG_OPT_BOOL("dep", st, m.dep, "false",                                       \
                       "the ranks form one dep group: each loads only its experts and "  \
                       "every forward pass is the group's (deepseek-v41 only)"),         \
    TD_CONFIG_OPT_STRING("placement", st, m.placement, "",                              \
                         "with --dep: which rank holds which expert, a json file "      \
                         "(default: contiguous ranges)"),                               \
    TD_CONFIG_OPT_DURATION("dep-idle", st, m.dep_idle_ms, "2ms", 1, 1000,               \
                           "with --dep: an idle group checks for work this often "      \
                           "(the most a new request waits for the group to step)"),     \
    TD_CONFIG_OPT_DURATION("dep-deadline", st, m.dep_deadline_ms, "60s", 100, 3600000,  \
                           "with --dep: deadline of each collective of the group (it "  \
                           "must cover the spread of the ranks' model load times)")

typedef struct td_worker_s td_worker_t;

/* One rank thread's share of the worker: created and destroyed on that
 * thread, used only there. The worker owns xfer and link; `rank` is the
 * daemon's (spec->rank_create / rank_destroy). */
typedef struct {
    td_worker_t *w;
    uint32_t id;
    struct event_base *base;     /* the rank's loop, owned by w->rs */
    td_xfer_t *xfer;             /* the rank's UCX worker */
    td_link_t *link;             /* its routers */
    td_kernels_cpu_pool_t *pool; /* its compute threads (cpu backend) */
    td_engine_t *engine;         /* the engine its rank runs: w->engine, or with --dep
                                    own_engine (its experts, its side of the group) */
    td_engine_t *own_engine;     /* --dep: owned */
    td_comm_t *comm;             /* --dep: its communicator (w->comms[id]) */
    const td_jobq_step_t *stepping; /* --dep: &step, the compute thread's stepping; else NULL */
    td_jobq_step_t step;
    struct event *broken_ev;     /* --dep: the group broke (from the compute thread) */
    uint32_t fault_at, fault_seen; /* --dep: TD_DEP_FAULT (tests; compute thread) */
    td_worker_domain_comm_t dom; /* --domain-size: the rank's communicator over UCX (owned) */
    Tandem__Load load;           /* the rank's last Load (scalars), sent again every second
                                    with its loop's passes and --dep the group's counters */
    bool have_load;
    struct event *load_timer;
    td_loopstat_t *loop;         /* its loop thread's passes (net/ranks.h) */
    uint64_t loop_counts[TD_LOOPSTAT_NBUCKETS + 1];   /* as last sent */
    uint64_t *experts;           /* --dep: [nexperts] the counters last sent (owned) */
    uint32_t nexperts;
    uint64_t passes_sent;
    void *rank;                  /* td_prank_t, td_drank_t */
    bool draining;               /* what Register last said */
    struct event *drain_ev;      /* SIGTERM's drain deadline, or NULL */
} td_worker_rank_t;

/* What differs between the worker daemons. Every rank operation runs on the
 * rank's thread and gets the rank that rank_create made. */
typedef struct {
    const char *ident;           /* "decoded": log prefix and ready line */
    const char *rank_name;       /* "decode rank": rank threads in logs */
    Tandem__Role role;           /* in Hello */
    const td_config_opt_t *opts; /* the daemon's option table ... */
    void *cfg;                   /* ... and the struct it fills (freed on return) */
    td_worker_opts_t *wcfg;      /* the TD_WORKER_CONFIG_OPTS member of *cfg */
    /* Build the daemon's rank on wr (its xfer and loop are ready; its link is
     * not yet); its handlers reach the routers through td_worker_rank_send,
     * td_worker_rank_load and td_worker_rank_idle with wr as their arg. */
    td_status_t (*rank_create)(td_worker_rank_t *wr, void **out);
    void (*rank_destroy)(void *rank);
    /* Add the daemon's fields to Register (engine and draining are filled). */
    void (*rank_register)(void *rank, Tandem__Register *reg);
    /* After the link is created (NULL: nothing to do). */
    void (*rank_started)(void *rank);
    /* A router took the rank's registration (NULL: nothing to do). */
    void (*rank_router_up)(void *rank, void *router);
    /* A router's message (Admit, Prefill, Cancel, Drain, DecodePeer, ...). */
    void (*rank_message)(void *rank, void *router, const Tandem__Envelope *env);
    /* That router's connection ended (the link logged why). */
    void (*rank_router_down)(void *rank, void *router);
    /* SIGTERM: take no more work; what is in hand may finish. The loop
     * exits once the rank calls td_worker_rank_idle (nothing left) ... */
    void (*rank_stop)(void *rank);
    /* ... or, at the drain deadline (--drain-timeout), the rank ends what is
     * left with an error to its router, and the loop exits when it is idle
     * or stop_ms later at the latest. */
    void (*rank_abort)(void *rank);
    uint64_t (*stop_ms)(const void *cfg);
    /* Appended to the ready line (NULL: nothing), e.g. ", kv-tokens 4096". */
    void (*status)(const void *cfg, td_buf_t *b);
} td_worker_spec_t;

/* The main thread's state, for the rank operations. td_worker_main owns it
 * and everything in it; it is valid until the last rank's teardown ran. */
struct td_worker_s {
    const td_worker_spec_t *spec;
    td_daemon_t *d;
    struct event_base *base;     /* the main thread's loop */
    td_engine_t *engine;
    char fingerprint[17];        /* engine->fingerprint in hex, for Hello */
    char data_dev[TD_NETIF_NAME_MAX];   /* UCX's tcp interface; "": every one */
    td_worker_rank_t *ranks;     /* [nranks] */
    uint32_t nranks;
    td_ranks_t *rs;              /* the rank threads */
    td_comm_group_t *group;      /* --dep: the ranks' group, and each rank's */
    td_comm_t **comms;           /*   communicator [nranks] */
    _Atomic int broken;          /* --dep: the group broke (exit code 1) */
};

/* The whole of main(): parse argv, require --routers, create the engine and
 * the rank threads (each: its UCX worker, the daemon's rank, its router
 * links), print "<ident> ready: node N, R ranks, incarnation I, routers X"
 * (+ spec->status) on stderr and tell systemd, run the loop until every rank
 * left its own (SIGTERM asks them to drain: td_worker_stop_bound_ms), then
 * undo it all. Returns the
 * exit code: 0 after the loop ran (or for --help), 2 for bad options or no
 * --routers, 1 for any other failure (logged where it was decided). */
int td_worker_main(const td_worker_spec_t *spec, int argc, char **argv);

/* The rank's handlers to the routers (arg: the td_worker_rank_t).
 * send: one message to the router a request came from (td_link_send's
 * status). load: publish the load; a change of load->draining re-sends
 * Register. idle: after rank_stop, the last piece of work has ended: leave
 * the loop once the last frames are out. */
/* The rank's compute thread binds itself to the rank's compute pool with
 * this, as its first act (td_prank_config_t / td_drank_config_t
 * compute_start, arg wr). */
void td_worker_rank_compute_start(void *wr);

/* How long after SIGTERM the daemon is gone at the latest: the drain
 * deadline, the daemon's stop_ms after it, and the last frames' flush. */
uint64_t td_worker_stop_bound_ms(const td_worker_spec_t *spec);

td_status_t td_worker_rank_send(void *router, const Tandem__Envelope *env, void *arg);
void td_worker_rank_load(const Tandem__Load *load, void *arg);
void td_worker_rank_idle(void *arg);
/* One message to every router that is up (prefilld's CacheEvent). */
void td_worker_rank_broadcast(const Tandem__Envelope *env, void *arg);

#endif
