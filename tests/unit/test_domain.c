/* tests/unit/test_domain.c — worker/domain.c's address exchange: which files
 * a rank takes as a peer's address (a dead writer's, a recycled pid's, another
 * host's, not an address file), and a domain of 2 rank threads coming up in
 * a directory that a killed run left its files in (the restart rule,
 * docs/dep.md "A domain across processes"); withdraw removes only its own. */
#include "check.h"
#include "domain.h"
#include "log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

static td_xfer_config_t
xcfg(uint32_t rank)
{
    td_xfer_config_t xc = { .incarnation = ((uint64_t)getpid() << 20) | (rank + 1u),
                            .tcp_device = "lo" };
    return xc;
}

/* This machine as domain.c's header names it. */
static void
self_names(char *boot, size_t blen, char *host, size_t hlen)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    if (f == NULL || fgets(boot, (int)blen, f) == NULL)
        snprintf(boot, blen, "-");
    boot[strcspn(boot, "\n")] = '\0';
    if (f != NULL)
        fclose(f);
    if (gethostname(host, hlen - 1) != 0)
        snprintf(host, hlen, "-");
}

/* Write DIR/ID.addr.RANK as a process would have: header text, then bytes. */
static void
put_file(const char *id, uint32_t rank, const char *header, const char *blob)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s.addr.%u", dir, id, rank);
    f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    fputs(header, f);
    fputs(blob, f);
    fclose(f);
}

static bool
file_exists(const char *id, uint32_t rank)
{
    char path[512];

    snprintf(path, sizeof(path), "%s/%s.addr.%u", dir, id, rank);
    return access(path, F_OK) == 0;
}

/* A pid that ran and is gone (a reaped child). */
static long
dead_pid(void)
{
    pid_t p = fork();

    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

/* ---- Which file is a peer's address ------------------------------------------ */

/* Rank 0 of a 2-rank domain alone, rank 1's file as given: a file whose
 * writer is known gone is ignored (TD_ERR_TIMEOUT, nothing else there), any
 * other is taken (and garbage behind a good header fails the connect). */
static void
test_which_file(void)
{
    char boot[128], host[256], h[1024];
    long gone = dead_pid();
    struct {
        const char *what;
        const char *magic;  /* NULL: no file */
        int self_pid;       /* the pid: this process's (else a dead one) */
        const char *start;
        const char *boot_tail, *host_tail, *end;   /* appended to this boot id, host, line */
        int taken;          /* 1: the address is used (connect fails on it), 0: ignored, -1: refused */
    } cases[] = {
        { "no file", NULL, 0, "", "", "", "", 0 },
        { "a dead writer", "tandem-domain-addr 1 ", 0, "12345", "", "", "\n", 0 },
        { "a recycled pid (this one, another start time)", "tandem-domain-addr 1 ", 1, "1", "", "",
          "\n", 0 },
        { "a dead pid on another boot", "tandem-domain-addr 1 ", 0, "1", "X", "", "\n", 1 },
        { "a dead pid on another host", "tandem-domain-addr 1 ", 0, "1", "", "X", "\n", 1 },
        { "not an address file", "hello ", 0, "1", "", "", "\n", -1 },
        { "a header of another version", "tandem-domain-addr 2 ", 0, "1", "", "", "\n", -1 },
        { "no header line", "tandem-domain-addr 1 ", 0, "1", "", "", "", -1 },
    };

    self_names(boot, sizeof(boot), host, sizeof(host));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char id[32];
        td_worker_domain_t d = { .id = id, .dir = dir, .size = 2, .wait_ms = 300 };
        td_xfer_config_t xc = xcfg(0);
        td_comm_opts_t co = { .deadline_ms = 300, .name = "test domain" };
        td_worker_domain_comm_t dc = { 0 };

        snprintf(id, sizeof(id), "which%zu", i);
        if (cases[i].magic != NULL) {
            snprintf(h, sizeof(h), "%spid=%ld start=%s boot=%s%s host=%s%s%s", cases[i].magic,
                     cases[i].self_pid ? (long)getpid() : gone, cases[i].start, boot,
                     cases[i].boot_tail, host, cases[i].host_tail, cases[i].end);
            put_file(id, 1, h, "not a ucx address");
        }
        td_status_t st = td_worker_domain_create(&d, 0, &xc, &co, &dc);
        if (cases[i].taken == 0 && st != TD_ERR_TIMEOUT)
            fprintf(stderr, "case %s: %s\n", cases[i].what, td_status_str(st));
        if (cases[i].taken == 0)
            CHECK_STATUS(st, TD_ERR_TIMEOUT);
        else if (cases[i].taken == -1)
            CHECK_STATUS(st, TD_ERR_PROTO);
        else
            CHECK(st != TD_OK && st != TD_ERR_TIMEOUT);   /* the garbage address was used */
        CHECK(dc.comm == NULL);
        CHECK(!file_exists(id, 0));   /* a failed create removes its own file */
        CHECK(cases[i].magic == NULL || file_exists(id, 1));   /* and no other */
    }
}

/* ---- A domain restarted over a killed run's files ------------------------------ */

typedef struct {
    uint32_t rank;
    unsigned delay_ms;
    td_status_t st;
    uint64_t got[2];
} rank_arg_t;

static void *
rank_main(void *arg)
{
    rank_arg_t *a = arg;
    td_worker_domain_t d = { .id = "dom", .dir = dir, .size = 2, .wait_ms = 10000 };
    td_xfer_config_t xc = xcfg(a->rank);
    td_comm_opts_t co = { .deadline_ms = 10000, .name = "test domain" };
    td_worker_domain_comm_t dc = { 0 };
    uint64_t mine = 100 + a->rank;

    usleep(a->delay_ms * 1000u);
    a->st = td_worker_domain_create(&d, a->rank, &xc, &co, &dc);
    if (a->st == TD_OK)
        a->st = td_comm_allgather(dc.comm, &mine, sizeof(mine), a->got);
    if (a->st == TD_OK)
        a->st = td_comm_barrier(dc.comm);   /* both read the other's file before it goes */
    td_worker_domain_destroy(&dc);
    return NULL;
}

/* Both ranks' files left by a killed run (dead writers, addresses that lead
 * nowhere); rank 0 starts first and must wait for rank 1's new file rather
 * than take the old one. */
static void
test_restart_over_stale(void)
{
    char boot[128], host[256], h[1024];
    long gone = dead_pid();
    pthread_t t[2];
    rank_arg_t a[2] = { { 0, 0, TD_ERR_STATE, { 0 } }, { 1, 400, TD_ERR_STATE, { 0 } } };

    self_names(boot, sizeof(boot), host, sizeof(host));
    snprintf(h, sizeof(h), "tandem-domain-addr 1 pid=%ld start=12345 boot=%s host=%s\n", gone, boot,
             host);
    put_file("dom", 0, h, "an old address");
    put_file("dom", 1, h, "an old address");
    for (int r = 0; r < 2; r++)
        CHECK(pthread_create(&t[r], NULL, rank_main, &a[r]) == 0);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++) {
        CHECK_STATUS(a[r].st, TD_OK);
        CHECK_EQ_INT(a[r].got[0], 100);
        CHECK_EQ_INT(a[r].got[1], 101);
    }
    CHECK(!file_exists("dom", 0));
    CHECK(!file_exists("dom", 1));
}

/* ---- Withdraw ------------------------------------------------------------------- */

/* withdraw (and destroy) remove the rank's file only while it is this
 * process's: a restarted writer's file stays. */
static void
test_withdraw(void)
{
    td_worker_domain_t d = { .id = "one", .dir = dir, .size = 1, .wait_ms = 1000 };
    td_xfer_config_t xc = xcfg(0);
    td_comm_opts_t co = { .deadline_ms = 1000, .name = "test domain" };
    td_worker_domain_comm_t dc = { 0 };

    CHECK_STATUS(td_worker_domain_create(&d, 0, &xc, &co, &dc), TD_OK);
    CHECK(file_exists("one", 0));
    td_worker_domain_withdraw(&dc);
    CHECK(!file_exists("one", 0));
    CHECK(dc.comm != NULL);
    td_worker_domain_destroy(&dc);

    CHECK_STATUS(td_worker_domain_create(&d, 0, &xc, &co, &dc), TD_OK);
    put_file("one", 0, "tandem-domain-addr 1 pid=1 start=1 boot=b host=h\n", "a newer writer's");
    td_worker_domain_destroy(&dc);
    CHECK(file_exists("one", 0));
}

int
main(void)
{
    char cmd[300];

    td_log_set_level(TD_LOG_WARN);
    snprintf(dir, sizeof(dir), "%s/test_domain.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_which_file();
    test_restart_over_stale();
    test_withdraw();
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return td_check_exit("test_domain");
}
