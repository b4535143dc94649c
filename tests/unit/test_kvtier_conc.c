/* tests/unit/test_kvtier_conc.c — the KV cache's tiers (kvcache/kvtier.h)
 * used by several threads at once: a putter, two chain readers (get,
 * get_many, read-ahead, flushes: one chain on the AIO context while the
 * other is on the reader threads or alone) and an observer (has, stats,
 * events, snapshot, wait_idle), over the tier's own IO, reader and prefetch
 * threads; every hit compared with what was put, the budgets checked after.
 * Built twice: as a plain unit test and under ThreadSanitizer
 * (test_kvtier_tsan, tests/unit/meson.build), where any data race or lock
 * order inversion fails it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvtier.h"
#include "testkvtier.h"

#define CONC_N 120

typedef struct {
    td_kvtier_t *kt;
    trec_t *t;
    int bad;                    /* wrong results seen by this thread */
    pthread_barrier_t *start;   /* the readers start after the first round of puts */
    _Atomic int *readers_done;  /* readers done so far */
    _Atomic bool *done;         /* the putter and the readers are done */
} conc_t;

/* Puts the chain again and again (single puts, put_many, write-back only),
 * until the readers are done: once the first round is written back, the
 * others start. */
static void *
conc_putter(void *arg)
{
    conc_t *c = arg;
    td_kvrec_t recs[6];

    for (int round = 0; round < 200 && (round == 0 || atomic_load(c->readers_done) < 2); round++) {
        for (int i = 0; i < CONC_N; i += 6) {
            for (int k = 0; k < 6; k++)
                recs[k] = c->t[i + k].rec;
            td_status_t st = round % 3 == 0 ? td_kvtier_put_many(c->kt, recs, 6)
                           : round % 3 == 1 ? td_kvtier_put_many_to(c->kt, recs, 6, TD_KVTIER_SSD)
                                            : td_kvtier_put(c->kt, &c->t[i].rec);

            c->bad += st != TD_OK;
        }
        if (round == 0) {   /* written back: the readers find it */
            td_kvtier_wait_idle(c->kt);
            pthread_barrier_wait(c->start);
        }
    }
    return NULL;
}

/* A chain of 5 from `first`: read ahead (sometimes), read, compared. */
static void
conc_chain(conc_t *c, int k, size_t first)
{
    uint8_t cpl[5][4096], csn[5][256];
    td_kvtier_out_t outs[5];
    uint64_t hs[5];
    int32_t toks[5 * G];
    size_t hit = 0;

    for (int m = 0; m < 5; m++) {
        hs[m] = c->t[first + m].rec.hash;
        memcpy(toks + m * G, c->t[first + m].tokens, sizeof(c->t[0].tokens));
        outs[m] = (td_kvtier_out_t){ cpl[m], sizeof(cpl[m]), csn[m], sizeof(csn[m]), 0, 0, 0 };
    }
    if (k % 2 == 0 && td_kvtier_prefetch(c->kt, hs, 5) != TD_OK)
        c->bad++;
    if (k % 9 == 0)   /* one read ahead and never got */
        (void)td_kvtier_prefetch(c->kt, hs, 3);
    if (td_kvtier_get_many(c->kt, hs, 5, toks, G, outs, &hit) != TD_OK)
        c->bad++;
    for (size_t m = 0; m < hit; m++)
        if (outs[m].payload_bytes != c->t[first + m].rec.payload_bytes ||
            memcmp(cpl[m], c->t[first + m].payload, c->t[first + m].rec.payload_bytes) != 0)
            c->bad++;
}

static void *
conc_getter(void *arg)
{
    conc_t *c = arg;
    uint8_t pl[4096], sn[256];

    pthread_barrier_wait(c->start);
    for (int k = 0; k < 3 * CONC_N; k++) {
        const trec_t *t = &c->t[(k * 7) % CONC_N];
        td_kvtier_out_t out = { pl, sizeof(pl), sn, sizeof(sn), 0, 0, 0 };
        td_status_t st = td_kvtier_get(c->kt, t->rec.hash, t->tokens, G, &out);

        if (st == TD_OK && (out.payload_bytes != t->rec.payload_bytes ||
                            memcmp(pl, t->payload, out.payload_bytes) != 0))
            c->bad++;
        else if (st != TD_OK && st != TD_ERR_NOT_FOUND)
            c->bad++;
        if (k % 150 == 149)
            td_kvtier_flush(c->kt);
        if (k % 3 == 0)
            conc_chain(c, k, (size_t)(k * 11) % (CONC_N - 5));
    }
    atomic_fetch_add(c->readers_done, 1);
    return NULL;
}

/* What a prefill rank's loop thread asks meanwhile: membership, counters,
 * the events, a full list now and then, until the others are done. */
static void *
conc_observer(void *arg)
{
    conc_t *c = arg;
    uint64_t add[64], rem[64], all[2 * CONC_N];
    size_t na, nr, n;
    td_kvtier_stats_t s;

    pthread_barrier_wait(c->start);
    for (int k = 0; !atomic_load(c->done); k++) {
        unsigned tiers = td_kvtier_has(c->kt, c->t[k % CONC_N].rec.hash);

        if ((tiers & ~(unsigned)(TD_KVTIER_HOST | TD_KVTIER_SSD)) != 0)
            c->bad++;
        td_kvtier_stats(c->kt, &s);
        if (s.host_bytes > s.host_budget)
            c->bad++;
        td_status_t st = td_kvtier_drain_events(c->kt, add, 64, &na, rem, 64, &nr);

        if (st != TD_OK && st != TD_INPROGRESS)
            c->bad++;
        if (k % 16 == 0 && td_kvtier_snapshot(c->kt, all, 2 * CONC_N, &n) != TD_OK)
            c->bad++;
        if (k % 32 == 0)
            td_kvtier_wait_idle(c->kt);
    }
    return NULL;
}

typedef struct {
    const char *what;
    uint64_t host_recs, ssd_files;   /* budgets, in records and one-record files */
    uint32_t read_threads, pack_records;
} conc_case_t;

static const conc_case_t conc_cases[] = {
    { "host and SSD, two reader threads", 10, 60, 2, 0 },
    { "SSD only, a file per record, no reader threads", 0, 60, 0, 1 },
    { "SSD only, a small budget, three reader threads", 0, 30, 3, 6 },
};

static void
conc_run(const conc_case_t *cc)
{
    char dir[256];
    trec_t *t = chain_make(CONC_N, 1500);
    _Atomic bool done = false;
    _Atomic int readers_done = 0;
    pthread_barrier_t start;
    conc_t c = { NULL, t, 0, &start, &readers_done, &done };
    pthread_t put, get[2], obs;

    dir_path(dir, sizeof(dir), "conc");
    td_kvtier_config_t cfg = { .host_budget = cc->host_recs * rec_bytes(&t[0]), .ssd_dir = dir,
                               .ssd_budget = cc->ssd_files * file_bytes(&t[0]),
                               .layout_hash = LAYOUT, .seed = SEED,
                               .read_threads = cc->read_threads,
                               .pack_records = cc->pack_records };
    CHECK_STATUS(td_kvtier_create(&cfg, &c.kt), TD_OK);
    conc_t cs[4] = { c, c, c, c };

    pthread_barrier_init(&start, NULL, 4);

    pthread_create(&put, NULL, conc_putter, &cs[0]);
    pthread_create(&get[0], NULL, conc_getter, &cs[1]);
    pthread_create(&get[1], NULL, conc_getter, &cs[2]);
    pthread_create(&obs, NULL, conc_observer, &cs[3]);
    pthread_join(get[0], NULL);
    pthread_join(get[1], NULL);
    pthread_join(put, NULL);
    atomic_store(&done, true);
    pthread_join(obs, NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < 4; i++)
        if (cs[i].bad != 0)
            fprintf(stderr, "test_kvtier_conc: %s: thread %d saw %d wrong results\n", cc->what,
                    i, cs[i].bad);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(cs[i].bad, 0);
    td_kvtier_wait_idle(c.kt);
    td_kvtier_stats_t s;
    td_kvtier_stats(c.kt, &s);
    CHECK(dir_bytes(dir, NULL) <= cfg.ssd_budget);
    CHECK_EQ_INT(dir_bytes(dir, NULL), s.ssd_bytes);
    CHECK(s.host_bytes <= cfg.host_budget);
    if (s.hits_host + s.hits_ssd == 0)   /* nothing read while the others ran: no check */
        fprintf(stderr, "test_kvtier_conc: %s: no hit at all\n", cc->what);
    CHECK(s.hits_host + s.hits_ssd > 0);
    td_kvtier_destroy(c.kt);
    dir_rm(dir);
    chain_free(t, CONC_N);
}

int
main(void)
{
    if (mkdtemp(kvt_root) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t i = 0; i < sizeof(conc_cases) / sizeof(conc_cases[0]); i++)
        conc_run(&conc_cases[i]);
    CHECK(rmdir(kvt_root) == 0);
    return td_check_exit("test_kvtier_conc");
}
