/* tests/integration/decoded-daemon.c — the decoded executable against a fake
 * router (a td_ctl listener) and a fake prefill rank (this process, real KV
 * over UCX shm): registration, a streamed request checked against the
 * engine, drain, SIGKILL mid-stream (the router sees the connection end
 * within 5 s; the restarted daemon registers with a new incarnation and
 * serves), SIGTERM mid-stream: a drain (the request finishes, Admit is
 * refused, exit 0), and with a short --drain-timeout (Tokens ERROR at the
 * deadline, exit 0); forged notes from another UCX endpoint (xfer_forge)
 * while a request streams: dropped unparsed, at most one log line a second.
 * Usage: decoded-daemon PATH-TO-decoded PATH-TO-xfer_forge */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "check.h"
#include "ctl.h"
#include "decoded-fakes.h"
#include "log.h"

typedef struct {
    struct event_base *base;
    td_engine_t *e;
    fk_router_t rt;
    td_ctl_listener_t *lst;
    td_ctl_conn_t *conn;          /* the decode rank's connection, once established */
    uint64_t incarnation;         /* from its Hello */
    int registers;                /* Register messages seen */
    Tandem__Register *reg;        /* the latest (owned) */
    Tandem__Load load;            /* the latest */
    int closed;                   /* connections ended */
    const char *exe;
    const char *forge;            /* tests/integration/xfer_forge */
    char secret[64];
    char log[64];                 /* the daemon's stderr, when daemon_start is told */
    pid_t pid;
} rtr_t;

static rtr_t R;

static void
rtr_on_established(td_ctl_conn_t *conn, const Tandem__Hello *peer, void *arg)
{
    rtr_t *r = arg;
    CHECK_EQ_INT(peer->role, TANDEM__ROLE__ROLE_DECODE);
    r->conn = conn;
    r->incarnation = peer->incarnation;
}

static void
rtr_on_message(td_ctl_conn_t *conn, const Tandem__Envelope *env, void *arg)
{
    rtr_t *r = arg;
    if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_REGISTER) {
        if (r->reg)
            tandem__register__free_unpacked(r->reg, NULL);
        size_t len = tandem__register__get_packed_size(env->register_);
        uint8_t *buf = malloc(len ? len : 1);
        tandem__register__pack(env->register_, buf);
        r->reg = tandem__register__unpack(NULL, len, buf);
        free(buf);
        r->registers++;
        Tandem__Registered ok = TANDEM__REGISTERED__INIT;
        ok.router_id = "fake-router";
        Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
        out.payload_case = TANDEM__ENVELOPE__PAYLOAD_REGISTERED;
        out.registered = &ok;
        CHECK_STATUS(td_ctl_conn_send(conn, &out), TD_OK);
    } else if (env->payload_case == TANDEM__ENVELOPE__PAYLOAD_LOAD) {
        r->load = *env->load;
    } else {
        fk_router_record(&r->rt, env);
    }
}

static void
rtr_on_closed(td_ctl_conn_t *conn, td_status_t why, const char *reason, void *arg)
{
    rtr_t *r = arg;
    if (conn == r->conn)
        r->conn = NULL;
    r->closed++;
}

static void
rtr_send(rtr_t *r, Tandem__Envelope *env)
{
    CHECK(r->conn != NULL);
    if (r->conn != NULL)
        CHECK_STATUS(td_ctl_conn_send(r->conn, env), TD_OK);
}

static pid_t
daemon_start_log(rtr_t *r, const char *step_us, const char *drain_timeout, const char *log)
{
    char routers[64], step[64], drain[64];
    snprintf(routers, sizeof(routers), "--routers=127.0.0.1:%u", td_ctl_listener_port(r->lst));
    snprintf(step, sizeof(step), "--synth-step-us=%s", step_us);
    snprintf(drain, sizeof(drain), "--drain-timeout=%s", drain_timeout);
    char *argv[] = { (char *)r->exe, routers, "--secret-file", r->secret, "--node-id=dec-a",
                     "--ranks=1", "--kv-tokens=4096", "--max-batch=4", "--transports=shm,self",
                     "--xfer-deadline-ms=300", "--log-level=warn", step, drain, FK_ENGINE_ARGS,
                     NULL };
    pid_t pid = fork();
    if (pid == 0) {
        if (log != NULL) {
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0 || dup2(fd, 2) < 0)
                _exit(127);
        }
        execv(r->exe, argv);
        _exit(127);
    }
    return pid;
}

static pid_t
daemon_start(rtr_t *r, const char *step_us, const char *drain_timeout)
{
    return daemon_start_log(r, step_us, drain_timeout, NULL);
}

/* A child and, once it is gone, how it ended. */
typedef struct {
    pid_t pid;
    int gone;
    int status;
} child_t;

static int
child_gone(void *arg)
{
    child_t *c = arg;

    if (!c->gone && waitpid(c->pid, &c->status, WNOHANG) == c->pid)
        c->gone = 1;
    return c->gone;
}

/* Lines of file that hold needle. */
static int
log_count(const char *file, const char *needle, int *lines)
{
    char line[1024];
    int n = 0;
    FILE *f = fopen(file, "r");

    *lines = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        (*lines)++;
        n += strstr(line, needle) != NULL;
    }
    if (f != NULL)
        fclose(f);
    return n;
}


static int
registered(void *arg)
{
    rtr_t *r = arg;
    return r->registers > 0 && r->conn != NULL;
}

static int
conn_gone(void *arg)
{
    rtr_t *r = arg;
    return r->conn == NULL;
}

static const Tandem__KvDest *
admit(rtr_t *r, uint64_t id, const int32_t *prompt, size_t n, uint32_t max_tokens)
{
    fk_admit_t adm;
    fk_admit_init(&adm, id, prompt, n, max_tokens);
    rtr_send(r, &adm.env);
    fk_wait_msg(r->base, &r->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, id, 3000);
    const Tandem__Envelope *ok = fk_router_find(&r->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_OK, id);
    return ok ? ok->admit_ok->dest : NULL;
}

static void
drain(rtr_t *r, int on)
{
    Tandem__Drain d = TANDEM__DRAIN__INIT;
    d.draining = on;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    env.payload_case = TANDEM__ENVELOPE__PAYLOAD_DRAIN;
    env.drain = &d;
    rtr_send(r, &env);
}

static int
load_draining(void *arg)
{
    return ((rtr_t *)arg)->load.draining;
}

/* Admit + push; returns after the first Tokens came (or a timeout). */
static void
start_request(rtr_t *r, fk_p_t *fp, uint64_t id, const int32_t *p, size_t n, uint32_t max)
{
    const Tandem__KvDest *d = admit(r, id, p, n, max);
    CHECK(d != NULL);
    if (d == NULL)
        return;
    CHECK_STATUS(fk_p_create(r->base, r->reg, r->incarnation, r->e->layout, fp), TD_OK);
    fk_p_push(fp, r->e, d, id, p, n, max, 1, 0);
    CHECK(fk_wait_msg(r->base, &r->rt, TANDEM__ENVELOPE__PAYLOAD_TOKENS, id, 5000));
}

/* 6. Forged notes while a request streams (xfer_forge: 2000 in 2 s from an
 * endpoint of its own, half naming the live request's transfer id, none
 * with its token, each a KvNote that would cancel it): none is parsed (the
 * request streams on to its last token), all are counted, and the daemon
 * logs at most one line about them a second. */
static void
test_forged(rtr_t *r)
{
    int32_t p[16], got[800], want[800];
    fk_p_t fp = { 0 };
    char addr[2 * 4096 + 1], inc[17], id[24];
    int fin, lines;
    const char *err;

    snprintf(r->log, sizeof r->log, "/tmp/decoded-daemon-%d.log", (int)getpid());
    r->registers = 0;
    r->pid = daemon_start_log(r, "3000", "30s", r->log);
    CHECK(fk_run_until(r->base, registered, r, 10000));
    if (r->reg == NULL || r->reg->xfer_address.len * 2 >= sizeof addr)
        return;
    for (size_t i = 0; i < r->reg->xfer_address.len; i++)
        snprintf(addr + 2 * i, 3, "%02x", r->reg->xfer_address.data[i]);
    snprintf(inc, sizeof inc, "%016" PRIx64, r->incarnation);
    fk_prompt(p, 16, 13);
    const Tandem__KvDest *d = admit(r, 8, p, 16, 800);
    CHECK(d != NULL);
    if (d == NULL)
        return;
    snprintf(id, sizeof id, "%" PRIu64, d->xfer_id);
    CHECK_STATUS(fk_p_create(r->base, r->reg, r->incarnation, r->e->layout, &fp), TD_OK);
    fk_p_push(&fp, r->e, d, 8, p, 16, 800, 1, 0);
    uint64_t t0 = td_testutil_now_ms();
    child_t forger = { .pid = fork() };
    if (forger.pid == 0) {
        execl(r->forge, r->forge, addr, inc, id, "2000", "2", (char *)NULL);
        _exit(127);
    }
    CHECK(fk_run_until(r->base, child_gone, &forger, 15000));
    uint64_t secs = (td_testutil_now_ms() - t0 + 999) / 1000;
    /* every forged note went out and was taken */
    CHECK(WIFEXITED(forger.status) && WEXITSTATUS(forger.status) == 0);
    CHECK(fk_wait_msg(r->base, &r->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 8, 10000));
    size_t n = fk_router_tokens(&r->rt, 8, got, 800, &fin, &err);
    CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);
    CHECK(n == 800 && fk_expect(r->e, p, 16, 800, want) == 800 &&
          memcmp(got, want, sizeof(int32_t) * 800) == 0);
    kill(r->pid, SIGTERM);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
    int dropped = log_count(r->log, "without its token dropped unparsed", &lines);
    fprintf(stderr, "forged notes: %d log lines about them in %" PRIu64 " s, %d lines in all\n",
            dropped, secs, lines);
    CHECK(dropped >= 1 && (uint64_t)dropped <= secs + 1);
    CHECK(lines < 30);
    fk_p_destroy(&fp);
    unlink(r->log);
}

int
main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: decoded-daemon PATH-TO-decoded PATH-TO-xfer_forge\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    rtr_t *r = &R;
    r->exe = argv[1];
    r->forge = argv[2];
    snprintf(r->secret, sizeof(r->secret), "/tmp/decoded-daemon-%d.secret", (int)getpid());
    int fd = open(r->secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "decoded test secret\n", 20) == 20);
    close(fd);
    r->base = event_base_new();
    r->e = fk_engine();
    struct event *tk = event_new(r->base, -1, EV_PERSIST, fk_tick, NULL);
    struct timeval tv = { 0, 10000 };
    event_add(tk, &tv);
    char fpr[17];
    snprintf(fpr, sizeof(fpr), "%016" PRIx64, r->e->fingerprint);
    td_ctl_config_t cc = {
        .ident = { .protocol_version = TD_HELLO_PROTOCOL_VERSION, .role = TANDEM__ROLE__ROLE_ROUTER,
                   .node_id = "fake-router", .incarnation = 77, .model_fingerprint = fpr,
                   .kv_layout_hash = r->e->layout->hash },
        .secret = (const uint8_t *)"decoded test secret", .secret_len = 19,
    };
    td_ctl_handlers_t h = { rtr_on_established, rtr_on_message, rtr_on_closed, r };
    CHECK_STATUS(td_ctl_listener_create(r->base, &cc, &h, "127.0.0.1", 0, &r->lst), TD_OK);
    if (r->lst == NULL)
        return 1;

    /* 1. Registration and one streamed request. */
    r->pid = daemon_start(r, "0", "30s");
    CHECK(fk_run_until(r->base, registered, r, 10000));
    fk_p_t fp1 = { 0 }, fp2 = { 0 }, fp3 = { 0 }, fp4 = { 0 };
    if (r->reg != NULL) {
        CHECK_EQ_INT(r->reg->n_pools, r->e->layout->nsegs);
        CHECK_EQ_INT(r->reg->kv_tokens_total, 4096);
        CHECK_EQ_INT(r->reg->max_batch, 4);
        CHECK(r->reg->xfer_address.len > 0);
        int32_t p[33], got[64], want[64];
        fk_prompt(p, 33, 11);
        start_request(r, &fp1, 1, p, 33, 40);
        CHECK(fk_wait_msg(r->base, &r->rt, TANDEM__ENVELOPE__PAYLOAD_RELEASED, 1, 5000));
        int fin;
        const char *err;
        size_t n = fk_router_tokens(&r->rt, 1, got, 64, &fin, &err);
        CHECK(n == 40 && fk_expect(r->e, p, 33, 40, want) == 40 &&
              memcmp(got, want, sizeof(int32_t) * 40) == 0);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);

        /* 2. Drain: Load says so, Admit is refused with DRAINING. */
        drain(r, 1);
        CHECK(fk_run_until(r->base, load_draining, r, 3000));
        admit(r, 2, p, 33, 10);
        const Tandem__Envelope *rej =
            fk_router_find(&r->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, 2);
        CHECK(rej != NULL && rej->admit_reject->code ==
                                 TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_DRAINING);
        CHECK_EQ_INT(r->load.kv_blocks_used, 0);
        drain(r, 0);
    }

    /* 3. SIGKILL mid-stream: the connection ends within 5 s. */
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    fk_p_destroy(&fp1);
    r->pid = daemon_start(r, "3000", "30s");
    r->registers = 0;
    uint64_t inc1 = r->incarnation;
    CHECK(fk_run_until(r->base, registered, r, 10000));
    if (r->reg != NULL) {
        int32_t p[16];
        fk_prompt(p, 16, 12);
        start_request(r, &fp2, 3, p, 16, 1000);
        kill(r->pid, SIGKILL);
        uint64_t t0 = td_testutil_now_ms();
        CHECK(fk_run_until(r->base, conn_gone, r, 5000));
        CHECK(td_testutil_now_ms() - t0 < 5000);
        waitpid(r->pid, NULL, 0);
        fk_p_destroy(&fp2);

        /* 4. Restarted: a new incarnation, and it serves; SIGTERM mid-stream
         * drains: Load says draining, an Admit is refused, the request
         * finishes whole, the daemon exits 0. */
        r->registers = 0;
        r->pid = daemon_start(r, "3000", "30s");
        CHECK(fk_run_until(r->base, registered, r, 10000));
        CHECK(r->incarnation != inc1 && r->incarnation != 0);
        start_request(r, &fp3, 4, p, 16, 100);
        kill(r->pid, SIGTERM);
        CHECK(fk_run_until(r->base, load_draining, r, 3000));
        admit(r, 5, p, 16, 10);
        const Tandem__Envelope *rej =
            fk_router_find(&r->rt, TANDEM__ENVELOPE__PAYLOAD_ADMIT_REJECT, 5);
        CHECK(rej != NULL && rej->admit_reject->code ==
                                 TANDEM__ADMIT_REJECT_CODE__ADMIT_REJECT_DRAINING);
        CHECK(fk_run_until(r->base, conn_gone, r, 5000));
        int fin;
        const char *err;
        int32_t got[1000], want[1000];
        size_t n = fk_router_tokens(&r->rt, 4, got, 1000, &fin, &err);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_LENGTH);
        CHECK(n == 100 && fk_expect(r->e, p, 16, 100, want) == 100 &&
              memcmp(got, want, sizeof(int32_t) * 100) == 0);
        int status = 0;
        waitpid(r->pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        r->pid = 0;
        fk_p_destroy(&fp3);

        /* 5. A request longer than --drain-timeout: Tokens ERROR at the
         * deadline, not before; exit 0. */
        r->registers = 0;
        r->pid = daemon_start(r, "3000", "300ms");
        CHECK(fk_run_until(r->base, registered, r, 10000));
        start_request(r, &fp4, 6, p, 16, 1000);
        kill(r->pid, SIGTERM);
        uint64_t t1 = td_testutil_now_ms();
        CHECK(fk_run_until(r->base, conn_gone, r, 5000));
        CHECK(td_testutil_now_ms() - t1 >= 250);
        fk_router_tokens(&r->rt, 6, got, 1000, &fin, &err);
        CHECK_EQ_INT(fin, TANDEM__FINISH__FINISH_ERROR);
        CHECK(err != NULL && strstr(err, "shutting down") != NULL);
        status = 0;
        waitpid(r->pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        r->pid = 0;
        fk_p_destroy(&fp4);
        test_forged(r);
    }
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
    }
    td_ctl_listener_destroy(r->lst);
    if (r->reg)
        tandem__register__free_unpacked(r->reg, NULL);
    fk_router_clear(&r->rt);
    event_free(tk);
    td_engine_destroy(r->e);
    event_base_free(r->base);
    unlink(r->secret);
    libevent_global_shutdown();
    td_check_failures += fk_failures;
    return td_check_exit("decoded-daemon");
}
