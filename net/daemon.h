/* net/daemon.h — what the main() of every Tandem daemon shares: options
 * through the config table, logging, signals, the process incarnation, the
 * cluster secret, and systemd readiness/watchdog (sd_notify protocol).
 * Ownership: td_daemon_t owns the secret bytes and its signal/watchdog events;
 * the caller owns the event_base and the config struct. */
#ifndef TD_DAEMON_H
#define TD_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "log.h"
#include "status.h"

struct event_base;

/* Options every daemon has; embed as member `m` of the daemon's config struct
 * and list TD_DAEMON_CONFIG_OPTS(st, m) in its table. */
typedef struct {
    td_log_level_t log_level;
    char *node_id;        /* this process's node name in Hello; "" = hostname */
    char *secret_file;    /* cluster secret (all processes of a cluster share it) */
} td_daemon_opts_t;

#define TD_DAEMON_CONFIG_OPTS(st, m)                                              \
    TD_CONFIG_OPT_LOG_LEVEL("log-level", st, m.log_level, "info",                \
                            "error, warn, info, debug or trace"),                \
    TD_CONFIG_OPT_STRING("node-id", st, m.node_id, "",                           \
                         "node name announced to peers (default: host name)"), \
    TD_CONFIG_OPT_STRING("secret-file", st, m.secret_file, "",                   \
                         "file holding the cluster secret (required)")

typedef struct td_daemon_s td_daemon_t;

/* Called once on SIGTERM/SIGINT, on the loop; the daemon starts its shutdown
 * (a second signal exits the loop at once). */
typedef void (*td_daemon_stop_fn)(td_daemon_t *d, void *arg);

/* Parse argv through `table` into `cfg` (defaults < --config file < flags);
 * --help / --dump-config print and return TD_ERR_CANCELED (exit 0); a bad
 * option is logged and returns TD_ERR_INVALID (exit 2). Then: log ident and
 * level, SIGPIPE ignored, SIGTERM/SIGINT on the loop, the secret read
 * (missing or empty file: TD_ERR_INVALID with the path), a fresh random
 * non-zero incarnation, the node id resolved. */
td_status_t td_daemon_create(const char *ident, const td_config_opt_t *table, void *cfg,
                             td_daemon_opts_t *opts, int argc, char **argv,
                             struct event_base *base, td_daemon_stop_fn stop, void *arg,
                             td_daemon_t **out);
void td_daemon_destroy(td_daemon_t *d);

uint64_t td_daemon_incarnation(const td_daemon_t *d);
const char *td_daemon_node_id(const td_daemon_t *d);
const uint8_t *td_daemon_secret(const td_daemon_t *d, size_t *len);

/* systemd: READY=1 with a STATUS= line, and from then on WATCHDOG=1 at half
 * of WATCHDOG_USEC from the loop (no-ops outside systemd). */
void td_daemon_ready(td_daemon_t *d, const char *status);
/* STATUS= alone: what a daemon that is not ready yet is doing ("model /m:
 * loading: 120 of 1532 tensors, ..."); one line. */
void td_daemon_status(td_daemon_t *d, const char *status);
/* STOPPING=1 (shutdown began); with within_ms > 0 also
 * EXTEND_TIMEOUT_USEC: the daemon will be gone within that long, so a stop
 * timeout shorter than its drain deadline does not kill it first. */
void td_daemon_stopping(td_daemon_t *d, uint64_t within_ms);

/* Exit code for a td_daemon_create failure: 0 for TD_ERR_CANCELED, 2 for bad
 * options, 1 otherwise. */
int td_daemon_exit_code(td_status_t st);

/* 64 random bits from the kernel, never 0 (incarnations, request ids). */
uint64_t td_daemon_random64(void);

#endif
