/* net/daemon.c — the start-up and lifetime pieces every daemon's main()
 * shares: options, logging, signals on the loop, the cluster secret, the
 * incarnation, and the sd_notify protocol (READY/STATUS/WATCHDOG/STOPPING). */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "hello.h"

#define DAEMON_SECRET_MAX 4096u

struct td_daemon_s {
    struct event_base *base;
    td_daemon_stop_fn stop;
    void *arg;
    struct event *sig_term;
    struct event *sig_int;
    struct event *watchdog;     /* armed by td_daemon_ready when WATCHDOG_USEC is set */
    uint64_t watchdog_usec;     /* 0 = no watchdog */
    unsigned signals;           /* SIGTERM/SIGINT received so far */
    uint64_t incarnation;
    char node_id[TD_HELLO_NODE_ID_MAX + 1];
    uint8_t *secret;
    size_t secret_len;
};

/* ------------------------------------------------------------------------ */
/* sd_notify                                                                */
/* ------------------------------------------------------------------------ */

/* Send one datagram to $NOTIFY_SOCKET ("@name" = abstract namespace); no-op
 * when it is unset. A failure is logged (debug: systemd may be gone). */
static void
daemon_notify(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    size_t plen;
    socklen_t slen;
    int fd;

    if (path == NULL || path[0] == '\0')
        return;
    plen = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || plen >= sizeof(sun.sun_path)) {
        td_warn("sd_notify: NOTIFY_SOCKET \"%s\" is not a usable socket path", path);
        return;
    }
    memcpy(sun.sun_path, path, plen);
    if (path[0] == '@')
        sun.sun_path[0] = '\0';
    slen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen + (path[0] == '/'));

    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        td_warn("sd_notify: socket: %s", strerror(errno));
        return;
    }
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sun, slen) < 0)
        td_debug("sd_notify %s: send \"%s\": %s", path, msg, strerror(errno));
    close(fd);
}

static void
daemon_watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    daemon_notify("WATCHDOG=1");
}

/* WATCHDOG_USEC (and WATCHDOG_PID, when set, naming us) -> period, 0 if none. */
static uint64_t
daemon_watchdog_usec(void)
{
    const char *s = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    unsigned long long v;
    char *end;

    if (s == NULL || s[0] == '\0')
        return 0;
    if (pid != NULL && pid[0] != '\0' && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || s[0] == '-' || v < 2) {
        td_warn("sd_notify: ignoring WATCHDOG_USEC \"%s\"", s);
        return 0;
    }
    return v;
}

/* "<head>STATUS=<status>" with the status on one line (a newline in the
 * caller's text folded to a space). */
static void
daemon_notify_status(const char *head, const char *status)
{
    char msg[512];
    size_t at = strlen(head) + strlen("STATUS=");
    size_t n = (size_t)snprintf(msg, sizeof(msg), "%sSTATUS=%s", head, status ? status : "");

    for (char *p = msg + at; p < msg + n && *p; p++)
        if (*p == '\n')
            *p = ' ';
    daemon_notify(msg);
}

void
td_daemon_status(td_daemon_t *d, const char *status)
{
    (void)d;
    daemon_notify_status("", status);
}

void
td_daemon_ready(td_daemon_t *d, const char *status)
{
    daemon_notify_status("READY=1\n", status);
    if (d->watchdog_usec > 0 && !evtimer_pending(d->watchdog, NULL)) {
        uint64_t half = d->watchdog_usec / 2;
        struct timeval tv = { .tv_sec = (time_t)(half / 1000000u),
                              .tv_usec = (suseconds_t)(half % 1000000u) };

        evtimer_add(d->watchdog, &tv);
        td_debug("sd_notify: watchdog every %llu us", (unsigned long long)half);
    }
}

void
td_daemon_stopping(td_daemon_t *d, uint64_t within_ms)
{
    char msg[64];

    (void)d;
    if (within_ms == 0) {
        daemon_notify("STOPPING=1");
        return;
    }
    snprintf(msg, sizeof(msg), "STOPPING=1\nEXTEND_TIMEOUT_USEC=%llu",
             (unsigned long long)within_ms * 1000u);
    daemon_notify(msg);
}

/* ------------------------------------------------------------------------ */
/* Signals, secret, identity                                                */
/* ------------------------------------------------------------------------ */

static void
daemon_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    td_daemon_t *d = arg;

    (void)what;
    if (d->signals++ == 0 && d->stop != NULL) {
        td_info("received %s: shutting down", strsignal((int)sig));
        d->stop(d, d->arg);
        return;
    }
    td_info("received %s: exiting now", strsignal((int)sig));
    event_base_loopexit(d->base, NULL);
}

/* Read the whole secret file (<= 4 KiB, trailing newlines stripped) into
 * d->secret; warn when others may read it. */
static td_status_t
daemon_secret_read(td_daemon_t *d, const char *path)
{
    uint8_t buf[DAEMON_SECRET_MAX + 1];
    size_t len = 0;
    struct stat sb;
    td_status_t st = TD_ERR_INVALID;
    int fd;

    if (path == NULL || path[0] == '\0') {
        td_error("no --secret-file given (every process of a cluster needs the same secret)");
        return TD_ERR_INVALID;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        td_error("secret file %s: %s", path, strerror(errno));
        return TD_ERR_INVALID;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        td_error("secret file %s: not a regular file", path);
        goto err_close;
    }
    if (sb.st_mode & (S_IRGRP | S_IROTH))
        td_warn("secret file %s: readable by group or others (mode %03o)", path,
                (unsigned)(sb.st_mode & 0777));
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof(buf) - len);

        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            td_error("secret file %s: %s", path, strerror(errno));
            goto err_wipe;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len > DAEMON_SECRET_MAX) {
            td_error("secret file %s: larger than %u bytes", path, DAEMON_SECRET_MAX);
            goto err_wipe;
        }
    }
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        len--;
    if (len == 0) {
        td_error("secret file %s: empty", path);
        goto err_wipe;
    }
    d->secret = malloc(len);
    if (d->secret == NULL) {
        st = TD_ERR_NOMEM;
        goto err_wipe;
    }
    memcpy(d->secret, buf, len);
    d->secret_len = len;
    st = TD_OK;
err_wipe:
    explicit_bzero(buf, sizeof(buf));
err_close:
    close(fd);
    return st;
}

/* The node id: the option, or the host name; printable, 1..64 bytes. */
static td_status_t
daemon_node_id(td_daemon_t *d, const char *opt)
{
    char host[256];
    const char *id = opt;
    size_t len;

    if (id == NULL || id[0] == '\0') {
        if (gethostname(host, sizeof(host)) != 0) {
            td_error("node id: gethostname: %s (set --node-id)", strerror(errno));
            return TD_ERR_IO;
        }
        host[sizeof(host) - 1] = '\0';
        id = host;
    }
    len = strlen(id);
    if (len == 0 || len > TD_HELLO_NODE_ID_MAX) {
        td_error("node id \"%s\": must be 1 to %u bytes (set --node-id)", id,
                 TD_HELLO_NODE_ID_MAX);
        return TD_ERR_INVALID;
    }
    for (size_t i = 0; i < len; i++) {
        if (id[i] <= ' ' || id[i] > '~') {
            td_error("node id \"%s\": only printable characters without spaces", id);
            return TD_ERR_INVALID;
        }
    }
    memcpy(d->node_id, id, len + 1);
    return TD_OK;
}

uint64_t
td_daemon_random64(void)
{
    uint64_t v = 0;

    while (v == 0) {
        ssize_t r = getrandom(&v, sizeof(v), 0);

        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof(v)) {
            /* Without kernel randomness no incarnation or nonce is safe. */
            td_error("getrandom: %s", r < 0 ? strerror(errno) : "short read");
            abort();
        }
    }
    return v;
}

/* ------------------------------------------------------------------------ */
/* Create / destroy                                                         */
/* ------------------------------------------------------------------------ */

/* Options: defaults < files < flags; HELP/DUMP print and cancel. */
static td_status_t
daemon_parse(const td_config_opt_t *table, void *cfg, int argc, char **argv)
{
    char err[TD_CONFIG_ERRLEN];
    td_config_action_t action;
    td_status_t st;

    st = td_config_defaults(table, cfg, err, sizeof(err));
    if (st != TD_OK) {
        td_error("option table: %s", err);
        return st;
    }
    st = td_config_parse_args(table, cfg, argc, argv, &action, NULL, err, sizeof(err));
    if (st != TD_OK) {
        td_error("%s (see --help)", err);
        return TD_ERR_INVALID;
    }
    if (action == TD_CONFIG_HELP) {
        td_config_usage(table, argc > 0 ? argv[0] : "tandem", stdout);
        return TD_ERR_CANCELED;
    }
    if (action == TD_CONFIG_DUMP) {
        st = td_config_dump(table, cfg, stdout);
        return st == TD_OK ? TD_ERR_CANCELED : st;
    }
    return TD_OK;
}

td_status_t
td_daemon_create(const char *ident, const td_config_opt_t *table, void *cfg,
                 td_daemon_opts_t *opts, int argc, char **argv, struct event_base *base,
                 td_daemon_stop_fn stop, void *arg, td_daemon_t **out)
{
    td_daemon_t *d;
    td_status_t st;

    td_log_set_ident(ident);
    st = daemon_parse(table, cfg, argc, argv);
    if (st != TD_OK)
        goto err_free_cfg;
    td_log_set_level(opts->log_level);

    d = calloc(1, sizeof(*d));
    if (d == NULL) {
        st = TD_ERR_NOMEM;
        goto err_free_cfg;
    }
    d->base = base;
    d->stop = stop;
    d->arg = arg;
    st = daemon_node_id(d, opts->node_id);
    if (st != TD_OK)
        goto err_free_d;
    st = daemon_secret_read(d, opts->secret_file);
    if (st != TD_OK)
        goto err_free_d;

    signal(SIGPIPE, SIG_IGN);
    d->sig_term = evsignal_new(base, SIGTERM, daemon_signal_cb, d);
    d->sig_int = evsignal_new(base, SIGINT, daemon_signal_cb, d);
    d->watchdog = event_new(base, -1, EV_PERSIST, daemon_watchdog_cb, d);
    if (d->sig_term == NULL || d->sig_int == NULL || d->watchdog == NULL ||
        evsignal_add(d->sig_term, NULL) != 0 || evsignal_add(d->sig_int, NULL) != 0) {
        td_error("%s: cannot install signal or watchdog events", ident);
        st = TD_ERR_IO;
        goto err_free_events;
    }
    d->watchdog_usec = daemon_watchdog_usec();
    d->incarnation = td_daemon_random64();
    td_info("%s: node %s, incarnation %016llx, log level %s", ident, d->node_id,
            (unsigned long long)d->incarnation, td_log_level_str(opts->log_level));
    *out = d;
    return TD_OK;

err_free_events:
    if (d->watchdog)
        event_free(d->watchdog);
    if (d->sig_int)
        event_free(d->sig_int);
    if (d->sig_term)
        event_free(d->sig_term);
    explicit_bzero(d->secret, d->secret_len);
    free(d->secret);
err_free_d:
    free(d);
err_free_cfg:
    td_config_free(table, cfg);
    return st;
}

void
td_daemon_destroy(td_daemon_t *d)
{
    if (d == NULL)
        return;
    event_free(d->watchdog);
    event_free(d->sig_int);
    event_free(d->sig_term);
    explicit_bzero(d->secret, d->secret_len);
    free(d->secret);
    free(d);
}

uint64_t
td_daemon_incarnation(const td_daemon_t *d)
{
    return d->incarnation;
}

const char *
td_daemon_node_id(const td_daemon_t *d)
{
    return d->node_id;
}

const uint8_t *
td_daemon_secret(const td_daemon_t *d, size_t *len)
{
    *len = d->secret_len;
    return d->secret;
}

int
td_daemon_exit_code(td_status_t st)
{
    if (st == TD_OK || st == TD_ERR_CANCELED)
        return 0;
    if (st == TD_ERR_INVALID || st == TD_ERR_RANGE)
        return 2;
    return 1;
}
