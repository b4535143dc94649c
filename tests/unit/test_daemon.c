/* tests/unit/test_daemon.c — net/daemon.c: option parsing through the
 * table (help, dump, bad options, exit codes), the secret file, the node id,
 * signals on the loop, random64, and sd_notify datagrams on a test socket. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "check.h"
#include "daemon.h"

typedef struct {
    td_daemon_opts_t m;
    uint64_t port;
} tcfg_t;

static const td_config_opt_t table[] = {
    TD_DAEMON_CONFIG_OPTS(tcfg_t, m),
    TD_CONFIG_OPT_UINT64("port", tcfg_t, port, "7", 0, 65535, "a port"),
    TD_CONFIG_OPT_END
};

static char dir[64];
static char logbuf[16384];

static void
log_sink(td_log_level_t level, const char *line, void *arg)
{
    size_t n = strlen(logbuf);

    (void)level;
    (void)arg;
    snprintf(logbuf + n, sizeof(logbuf) - n, "%s\n", line);
}

static void
write_file(const char *name, const char *data, size_t len, mode_t mode)
{
    char path[128];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
    chmod(path, mode);
}

/* "@name" in s becomes "<dir>/name". */
static void
expand(const char *s, char *out, size_t len)
{
    const char *at = strchr(s, '@');

    if (at == NULL)
        snprintf(out, len, "%s", s);
    else
        snprintf(out, len, "%.*s%s/%s", (int)(at - s), s, dir, at + 1);
}

/* Run f(arg) with stdout going into out[len]. */
static void
capture_stdout(void (*f)(void *), void *arg, char *out, size_t len)
{
    FILE *tmp = tmpfile();
    int saved = dup(STDOUT_FILENO);
    size_t n;

    fflush(stdout);
    dup2(fileno(tmp), STDOUT_FILENO);
    f(arg);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    rewind(tmp);
    n = fread(out, 1, len - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
}

/* ---- option parsing, secret, node id -------------------------------------- */

typedef struct {
    const char *args[4];
    td_status_t want;
    int exit_code;
    const char *log_has;      /* in the log ("@" = the test dir), or NULL */
    const char *stdout_has;   /* printed on stdout, or NULL */
    const char *node;         /* expected node id on success; NULL = host name */
    const char *secret;       /* expected secret on success */
} parse_case_t;

static const parse_case_t parse_cases[] = {
    { { "--secret-file=@good", "--port=5" }, TD_OK, 0, NULL, NULL, NULL, "s3cret" },
    { { "--secret-file=@good", "--node-id=n1", "--log-level=debug" }, TD_OK, 0,
      "log level debug", NULL, "n1", "s3cret" },
    { { "--secret-file=@crlf" }, TD_OK, 0, NULL, NULL, NULL, "two words" },
    { { "--secret-file=@loose" }, TD_OK, 0, "readable by group or others", NULL, NULL, "abc" },
    { { "--secret-file=@good", "--port=5", "--dump-config" }, TD_ERR_CANCELED, 0, NULL,
      "port = 5", NULL, NULL },
    { { "--help" }, TD_ERR_CANCELED, 0, NULL, "--secret-file", NULL, NULL },
    { { "--bogus" }, TD_ERR_INVALID, 2, "bogus", NULL, NULL, NULL },
    { { "--secret-file=@good", "--port=abc" }, TD_ERR_INVALID, 2, "port", NULL, NULL, NULL },
    { { "--secret-file=@good", "--port=70000" }, TD_ERR_INVALID, 2, "70000", NULL, NULL, NULL },
    { { "--secret-file=@good", "extra" }, TD_ERR_INVALID, 2, "extra", NULL, NULL, NULL },
    { { NULL }, TD_ERR_INVALID, 2, "secret-file", NULL, NULL, NULL },
    { { "--secret-file=@missing" }, TD_ERR_INVALID, 2, "@missing", NULL, NULL, NULL },
    { { "--secret-file=@empty" }, TD_ERR_INVALID, 2, "@empty: empty", NULL, NULL, NULL },
    { { "--secret-file=@nl" }, TD_ERR_INVALID, 2, "@nl: empty", NULL, NULL, NULL },
    { { "--secret-file=@big" }, TD_ERR_INVALID, 2, "@big: larger", NULL, NULL, NULL },
    { { "--secret-file=@good", "--node-id=bad id" }, TD_ERR_INVALID, 2, "bad id", NULL, NULL,
      NULL },
};

typedef struct {
    const parse_case_t *c;
    struct event_base *base;
    tcfg_t cfg;
    td_daemon_t *d;
    td_status_t st;
} parse_run_t;

static void
parse_run(void *arg)
{
    parse_run_t *run = arg;
    char bufs[4][256];
    char *argv[6] = { "test_daemon" };
    int argc = 1;

    for (int i = 0; i < 4 && run->c->args[i]; i++) {
        expand(run->c->args[i], bufs[i], sizeof(bufs[i]));
        argv[argc++] = bufs[i];
    }
    run->st = td_daemon_create("test_daemon", table, &run->cfg, &run->cfg.m, argc, argv,
                               run->base, NULL, NULL, &run->d);
}

static void
test_parse(struct event_base *base)
{
    char host[256], out[8192], want[256];

    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    for (size_t i = 0; i < sizeof(parse_cases) / sizeof(parse_cases[0]); i++) {
        const parse_case_t *c = &parse_cases[i];
        parse_run_t run = { .c = c, .base = base };

        logbuf[0] = '\0';
        capture_stdout(parse_run, &run, out, sizeof(out));
        td_log_set_level(TD_LOG_INFO);
        if (run.st != c->want)
            fprintf(stderr, "parse case %zu (%s)\n", i, c->args[0] ? c->args[0] : "");
        CHECK_STATUS(run.st, c->want);
        CHECK_EQ_INT(td_daemon_exit_code(run.st), c->exit_code);
        if (c->log_has) {
            expand(c->log_has, want, sizeof(want));
            if (strstr(logbuf, want) == NULL)
                fprintf(stderr, "case %zu: log lacks \"%s\":\n%s", i, want, logbuf);
            CHECK(strstr(logbuf, want) != NULL);
        }
        if (c->stdout_has)
            CHECK(strstr(out, c->stdout_has) != NULL);
        if (run.st != TD_OK)
            continue;
        size_t len;
        const uint8_t *secret = td_daemon_secret(run.d, &len);
        CHECK_EQ_INT(len, strlen(c->secret));
        CHECK(memcmp(secret, c->secret, len) == 0);
        CHECK_STR(td_daemon_node_id(run.d), c->node ? c->node : host);
        CHECK(td_daemon_incarnation(run.d) != 0);
        td_daemon_destroy(run.d);
        td_config_free(table, &run.cfg);
    }
    /* The port of the first case made it into the struct. */
    {
        parse_run_t run = { .c = &parse_cases[0], .base = base };

        parse_run(&run);
        CHECK_STATUS(run.st, TD_OK);
        if (run.st == TD_OK) {
            CHECK_EQ_INT(run.cfg.port, 5);
            td_daemon_destroy(run.d);
            td_config_free(table, &run.cfg);
        }
    }
}

static void
test_exit_codes(void)
{
    static const struct { td_status_t st; int code; } cases[] = {
        { TD_OK, 0 }, { TD_ERR_CANCELED, 0 }, { TD_ERR_INVALID, 2 },
        { TD_ERR_IO, 1 }, { TD_ERR_NOMEM, 1 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CHECK_EQ_INT(td_daemon_exit_code(cases[i].st), cases[i].code);
}

static void
test_random(void)
{
    enum { N = 1000 };
    static uint64_t v[N];

    for (int i = 0; i < N; i++) {
        v[i] = td_daemon_random64();
        CHECK(v[i] != 0);
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            if (v[i] == v[j]) {
                CHECK(v[i] != v[j]);
                return;
            }
}

/* ---- signals ---------------------------------------------------------------- */

typedef struct {
    int stops;
    int guard_fired;
    struct event_base *base;
} sig_state_t;

static void
stop_cb(td_daemon_t *d, void *arg)
{
    sig_state_t *s = arg;

    (void)d;
    s->stops++;
    raise(SIGINT);   /* the second signal exits the loop */
}

static void
guard_cb(evutil_socket_t fd, short what, void *arg)
{
    sig_state_t *s = arg;

    (void)fd;
    (void)what;
    s->guard_fired = 1;
    event_base_loopbreak(s->base);
}

static char *
secret_arg(char *buf, size_t len)
{
    expand("--secret-file=@good", buf, len);
    return buf;
}

static td_status_t
daemon_make(struct event_base *base, tcfg_t *cfg, td_daemon_stop_fn stop, void *arg,
            td_daemon_t **d)
{
    char sarg[256];
    char *argv[] = { "test_daemon", secret_arg(sarg, sizeof(sarg)), "--log-level=warn" };

    return td_daemon_create("test_daemon", table, cfg, &cfg->m, 3, argv, base, stop, arg, d);
}

static void
test_signals(struct event_base *base)
{
    sig_state_t s = { .base = base };
    struct event *guard = evtimer_new(base, guard_cb, &s);
    struct timeval tv = { 2, 0 };
    tcfg_t cfg;
    td_daemon_t *d;

    CHECK_STATUS(daemon_make(base, &cfg, stop_cb, &s, &d), TD_OK);
    evtimer_add(guard, &tv);
    raise(SIGTERM);
    event_base_loop(base, 0);
    CHECK_EQ_INT(s.stops, 1);
    CHECK_EQ_INT(s.guard_fired, 0);
    event_free(guard);
    td_daemon_destroy(d);
    td_config_free(table, &cfg);
}

/* ---- sd_notify ------------------------------------------------------------ */

/* Next datagram within ms into buf; 0 when none came. */
static int
notify_recv(int fd, char *buf, size_t len, int ms)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    ssize_t n;

    if (poll(&p, 1, ms) != 1)
        return 0;
    n = recv(fd, buf, len - 1, MSG_DONTWAIT);
    if (n < 0)
        return 0;
    buf[n] = '\0';
    return 1;
}

static void
loop_for_ms(struct event_base *base, int ms)
{
    struct timeval tv = { 0, ms * 1000 };

    event_base_loopexit(base, &tv);
    event_base_loop(base, 0);
}

/* Bind a datagram socket at name ("@x": abstract) and point NOTIFY_SOCKET at it. */
static int
notify_socket(const char *name)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    size_t len = strlen(name);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    CHECK(fd >= 0);
    memcpy(sun.sun_path, name, len);
    if (name[0] == '@')
        sun.sun_path[0] = '\0';
    CHECK(bind(fd, (struct sockaddr *)&sun,
               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) == 0);
    setenv("NOTIFY_SOCKET", name, 1);
    return fd;
}

static void
test_notify(struct event_base *base, const char *name)
{
    char buf[512];
    int fd = notify_socket(name), watchdogs = 0;
    tcfg_t cfg;
    td_daemon_t *d;

    setenv("WATCHDOG_USEC", "100000", 1);
    CHECK_STATUS(daemon_make(base, &cfg, NULL, NULL, &d), TD_OK);
    loop_for_ms(base, 120);
    CHECK(!notify_recv(fd, buf, sizeof(buf), 0));   /* no watchdog before READY */

    td_daemon_status(d, "loading\n12 of 40");       /* STATUS alone, while starting */
    CHECK(notify_recv(fd, buf, sizeof(buf), 1000));
    CHECK_STR(buf, "STATUS=loading 12 of 40");
    loop_for_ms(base, 120);
    CHECK(!notify_recv(fd, buf, sizeof(buf), 0));   /* still no watchdog */

    td_daemon_ready(d, "serving\non port 5");
    CHECK(notify_recv(fd, buf, sizeof(buf), 1000));
    CHECK_STR(buf, "READY=1\nSTATUS=serving on port 5");

    loop_for_ms(base, 280);   /* every 50 ms: 5 (every 100 ms would be 2) */
    while (notify_recv(fd, buf, sizeof(buf), 0)) {
        CHECK_STR(buf, "WATCHDOG=1");
        watchdogs++;
    }
    CHECK(watchdogs >= 3 && watchdogs <= 6);

    td_daemon_stopping(d, 0);
    CHECK(notify_recv(fd, buf, sizeof(buf), 1000));
    CHECK_STR(buf, "STOPPING=1");
    td_daemon_stopping(d, 45000);   /* the drain deadline extends the stop timeout */
    CHECK(notify_recv(fd, buf, sizeof(buf), 1000));
    CHECK_STR(buf, "STOPPING=1\nEXTEND_TIMEOUT_USEC=45000000");
    td_daemon_destroy(d);
    td_config_free(table, &cfg);

    /* WATCHDOG_PID naming another process: READY, but no watchdog. */
    setenv("WATCHDOG_PID", "1", 1);
    CHECK_STATUS(daemon_make(base, &cfg, NULL, NULL, &d), TD_OK);
    td_daemon_ready(d, "x");
    CHECK(notify_recv(fd, buf, sizeof(buf), 1000));
    loop_for_ms(base, 120);
    CHECK(!notify_recv(fd, buf, sizeof(buf), 0));
    td_daemon_destroy(d);
    td_config_free(table, &cfg);
    unsetenv("WATCHDOG_PID");

    /* Outside systemd: nothing is sent. */
    unsetenv("NOTIFY_SOCKET");
    CHECK_STATUS(daemon_make(base, &cfg, NULL, NULL, &d), TD_OK);
    td_daemon_ready(d, "x");
    td_daemon_stopping(d, 1000);
    CHECK(!notify_recv(fd, buf, sizeof(buf), 50));
    td_daemon_destroy(d);
    td_config_free(table, &cfg);
    unsetenv("WATCHDOG_USEC");
    close(fd);
}

int
main(void)
{
    struct event_base *base = event_base_new();
    char big[5000], name[128];

    snprintf(dir, sizeof(dir), "/tmp/td-test-daemon-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    td_log_set_sink(log_sink, NULL);
    memset(big, 'x', sizeof(big));
    write_file("good", "s3cret\n", 7, 0600);
    write_file("crlf", "two words\r\n", 11, 0600);
    write_file("loose", "abc", 3, 0644);
    write_file("empty", "", 0, 0600);
    write_file("nl", "\n", 1, 0600);
    write_file("big", big, sizeof(big), 0600);

    test_parse(base);
    test_exit_codes();
    test_random();
    test_signals(base);
    snprintf(name, sizeof(name), "@td-test-daemon-%d", (int)getpid());
    test_notify(base, name);
    snprintf(name, sizeof(name), "%s/notify", dir);
    test_notify(base, name);

    td_log_set_sink(NULL, NULL);
    for (const char *const *f = (const char *const[]){ "good", "crlf", "loose", "empty", "nl",
                                                       "big", "notify", NULL };
         *f; f++) {
        snprintf(name, sizeof(name), "%s/%s", dir, *f);
        unlink(name);
    }
    rmdir(dir);
    event_base_free(base);
    return td_check_exit("test_daemon");
}
