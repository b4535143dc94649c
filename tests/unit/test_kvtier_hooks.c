/* tests/unit/test_kvtier_hooks.c — the KV cache's tiers where only a build
 * of their sources with test hooks can reach (TD_KVTIER_TEST_HOOKS, lock
 * order checks on whatever NDEBUG says; tests/unit/meson.build):
 * - the lock order of kvcache/kvtier_int.h: a lock taken out of order, or
 *   one released that is not held, aborts (each case in a child process);
 * - a failed io_getevents in get_many: every block of the chain's runs in
 *   flight is a miss, never a hit, the files stay, and the next chains are
 *   read (and hit) without the AIO context. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "kvtier.h"
#include "kvtier_int.h"
#include "testkvtier.h"

/* ---- Lock order ---------------------------------------------------------------- */
typedef struct {
    const char *what;
    unsigned levels[3];         /* taken in this order (0: no more) */
    bool trylock;               /* the last one with kvlock_trylock */
    bool unlock_first;          /* unlock a lock never taken, before anything */
    bool aborts;
} order_case_t;

static const order_case_t order_cases[] = {
    { "chain lock, mu, rmu", { KVLOCK_CHAIN, KVLOCK_MU, KVLOCK_RMU }, false, false, false },
    { "mu, rmu", { KVLOCK_MU, KVLOCK_RMU }, false, false, false },
    { "a chain lock, then rmu", { KVLOCK_CHAIN, KVLOCK_RMU }, false, false, false },
    { "rmu, then mu", { KVLOCK_RMU, KVLOCK_MU }, false, false, true },
    { "mu, then a chain lock", { KVLOCK_MU, KVLOCK_CHAIN }, false, false, true },
    { "mu, then a chain lock tried", { KVLOCK_MU, KVLOCK_CHAIN }, true, false, true },
    { "both chain locks (aio_mu and rbusy)", { KVLOCK_CHAIN, KVLOCK_CHAIN }, false, false, true },
    { "mu, rmu, then another mu", { KVLOCK_MU, KVLOCK_RMU, KVLOCK_MU }, false, false, true },
    { "an unlock of a lock not held", { KVLOCK_MU }, false, true, true },
};

/* Runs one case in a child: its locks taken in order, released in reverse;
 * true when the child aborted. */
static bool
order_run(const order_case_t *oc)
{
    pid_t pid = fork();
    int status = 0;

    if (pid == 0) {
        kvlock_t l[3];
        int n = 0;

        for (; n < 3 && oc->levels[n] != 0; n++)
            kvlock_init(&l[n], oc->levels[n], "test");
        if (oc->unlock_first)
            kvlock_unlock(&l[0]);
        for (int i = 0; i < n; i++)
            if (oc->trylock && i == n - 1)
                (void)kvlock_trylock(&l[i]);
            else
                kvlock_lock(&l[i]);
        for (int i = n - 1; i >= 0; i--)
            kvlock_unlock(&l[i]);
        _exit(0);
    }
    CHECK(pid > 0);
    if (pid <= 0 || waitpid(pid, &status, 0) != pid)
        return false;
    if (!oc->aborts && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fprintf(stderr, "lock order: %s: child status 0x%x\n", oc->what, status);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void
test_lock_order(void)
{
    for (size_t i = 0; i < sizeof(order_cases) / sizeof(order_cases[0]); i++) {
        bool aborted = order_run(&order_cases[i]);

        if (aborted != order_cases[i].aborts)
            fprintf(stderr, "lock order: %s: %s\n", order_cases[i].what,
                    aborted ? "aborted" : "did not abort");
        CHECK_EQ_INT(aborted, order_cases[i].aborts);
    }
}

/* ---- A failed io_getevents -------------------------------------------------------- */
static void
test_getevents_failure(void)
{
    char dir[256];
    trec_t *t = chain_make(40, 700);
    td_kvrec_t recs[40];
    uint64_t hashes[40];
    int32_t toks[40 * G];
    static uint8_t pl[40][4096], sn[40][256];
    td_kvtier_out_t outs[40];
    td_kvtier_stats_t before, after;
    size_t hit = 99, ssd = 0;

    for (int i = 0; i < 40; i++) {
        recs[i] = t[i].rec;
        hashes[i] = t[i].rec.hash;
        memcpy(toks + i * G, t[i].tokens, sizeof(t[i].tokens));
        outs[i] = (td_kvtier_out_t){ pl[i], sizeof(pl[i]), sn[i], sizeof(sn[i]), 0, 0, 0 };
    }
    dir_path(dir, sizeof(dir), "getevents");
    td_kvtier_config_t cfg = { .ssd_dir = dir, .ssd_budget = 1 << 22, .layout_hash = LAYOUT,
                               .seed = SEED, .pack_records = 10 };
    td_kvtier_t *kt = NULL;

    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    CHECK_STATUS(td_kvtier_put_many(kt, recs, 40), TD_OK);   /* 4 files of 10: 4 runs */
    td_kvtier_wait_idle(kt);
    td_kvtier_stats(kt, &before);
    kvread_test_fail_getevents(kt, 1);
    CHECK_STATUS(td_kvtier_get_many(kt, hashes, 40, toks, G, outs, &hit), TD_OK);
    if (kvread_test_fail_getevents_left(kt) != 0)   /* cannot check: say why */
        fprintf(stderr, "test_kvtier_hooks: get_many read nothing with Linux AIO (no AIO, or "
                        "no O_DIRECT in %s)\n", dir);
    CHECK_EQ_INT(kvread_test_fail_getevents_left(kt), 0);
    CHECK_EQ_INT(hit, 0);
    td_kvtier_stats(kt, &after);
    CHECK_EQ_INT(after.misses - before.misses, 40);
    CHECK_EQ_INT(after.hits_ssd, before.hits_ssd);
    CHECK_EQ_INT(after.corrupt, 0);
    for (int i = 0; i < 40; i++)   /* the files were not at fault: they stay */
        CHECK_EQ_INT(td_kvtier_has(kt, hashes[i]), TD_KVTIER_SSD);
    CHECK_EQ_INT(chain_get(kt, t, 40, &ssd), 40);
    CHECK_EQ_INT(ssd, 40);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 40);
}

int
main(void)
{
    if (mkdtemp(kvt_root) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_lock_order();
    test_getevents_failure();
    CHECK(rmdir(kvt_root) == 0);
    return td_check_exit("test_kvtier_hooks");
}
