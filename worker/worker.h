/* worker/worker.h — what a worker daemon's main (prefilld, decoded) shares:
 * the main loop, the daemon, the engine, the rank threads and their array,
 * the ready line, SIGTERM as a drain, and the teardown in reverse. */
#ifndef TD_WORKER_H
#define TD_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "daemon.h"
#include "engine.h"
#include "registry.h"
#include "link.h"
#include "ranks.h"

/* The engines a worker daemon runs: synthetic and deepseek-v41. */
extern const td_engine_kind_t *const td_worker_engines[];

/* The main thread's state, for the rank handlers and the status callback.
 * td_worker_main fills it before the ranks start (the caller zeroes it) and
 * owns everything in it; it stays valid until the last rank's fini ran. */
typedef struct {
    td_daemon_t *d;
    struct event_base *base;     /* the main thread's loop */
    td_engine_t *engine;
    char fingerprint[17];        /* engine->fingerprint in hex, for Hello */
    void *ranks;                 /* nranks zeroed elements of rank_size bytes */
    uint32_t nranks;
    td_ranks_t *rs;              /* the rank threads */
} td_worker_t;

/* What differs between the worker daemons. The config pointers point into
 * *cfg and are read after the options were parsed into it. */
typedef struct {
    const char *ident;           /* "decoded": log prefix and ready line */
    const char *rank_name;       /* "decode rank": rank threads in logs */
    const td_config_opt_t *opts; /* the daemon's option table ... */
    void *cfg;                   /* ... and the struct it fills (freed on return) */
    td_daemon_opts_t *daemon_cfg;
    td_engine_config_t *engine_cfg;
    char *const *routers;        /* --routers, required */
    const uint64_t *ranks;       /* --ranks */
    size_t rank_size;            /* bytes of one element of ranks */
    td_ranks_handlers_t rank;    /* rank threads; rank.arg goes to status too */
    const char *stopping;        /* logged on SIGTERM before the drain; NULL: none */
    /* The ready line after "<ident> ready: ", also systemd's STATUS=. */
    void (*status)(void *arg, char *buf, size_t len);
} td_worker_spec_t;

/* The whole of main(): parse argv, require --routers, create the engine and
 * nranks rank threads, print "<ident> ready: <status>" on stderr and tell
 * systemd, run the loop until every rank left its own (SIGTERM asks them to
 * drain: TD_RANKS_STOP_DRAIN), then undo it all. Returns the exit code: 0
 * after the loop ran (or for --help), 2 for bad options or no --routers, 1
 * for any other failure (logged where it was decided). */
int td_worker_main(td_worker_t *w, const td_worker_spec_t *spec, int argc, char **argv);

/* The link configuration of rank `rank_id` playing `role`: this process's
 * Hello identity (node, incarnation, model fingerprint, KV layout hash), the
 * cluster secret and the routers. Points into w and routers: valid while
 * they are (td_link_create copies what it keeps). */
void td_worker_link_config(const td_worker_t *w, Tandem__Role role, uint32_t rank_id,
                           const char *routers, td_link_config_t *out);

#endif
