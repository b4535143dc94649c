/* tests/unit/test_kvtier.c — the prefix cache's host and SSD tiers
 * (kvcache/kvtier.h): round trips, LRU order, budgets measured on disk,
 * restart, damaged and foreign files, put_many's packed files, put with a
 * stalled IO thread, chains read ahead (prefetch), and the index events.
 * Threads at once: test_kvtier_conc.c; injected faults: test_kvtier_hooks.c. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "kvtier.h"
#include "logcap.h"
#include "testkvtier.h"
#include "testutil.h"

/* Reads t's block back and compares; the status of get. */
static td_status_t
get_check(td_kvtier_t *kt, const trec_t *t, unsigned *tier)
{
    uint8_t payload[4096], snap[256];
    td_kvtier_out_t out = { payload, sizeof(payload), snap, sizeof(snap), 0, 0, 0 };
    td_status_t st = td_kvtier_get(kt, t->rec.hash, t->tokens, G, &out);

    if (st != TD_OK)
        return st;
    CHECK_EQ_INT(out.payload_bytes, t->rec.payload_bytes);
    CHECK_EQ_INT(out.snapshot_bytes, t->rec.snapshot_bytes);
    CHECK(memcmp(payload, t->payload, t->rec.payload_bytes) == 0);
    if (t->rec.snapshot_bytes > 0)
        CHECK(memcmp(snap, t->snapshot, t->rec.snapshot_bytes) == 0);
    if (tier != NULL)
        *tier = out.tier;
    return st;
}

static bool
has_hash(const uint64_t *v, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == h)
            return true;
    return false;
}

/* ---- Tests ------------------------------------------------------------------ */
static void
test_host_only(void)
{
    trec_t *t = chain_make(6, 1000);
    td_kvtier_t *kt = tier_make(4 * rec_bytes(&t[0]) + 150, NULL, 0);
    unsigned tier = 0;
    td_kvtier_stats_t s;

    for (int i = 0; i < 4; i++)
        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(td_kvtier_has(kt, t[i].rec.hash), TD_KVTIER_HOST);
        CHECK_STATUS(get_check(kt, &t[i], &tier), TD_OK);
        CHECK_EQ_INT(tier, TD_KVTIER_HOST);
    }
    /* LRU: 0 was read last of... read 0 again, then a put evicts 1 */
    CHECK_STATUS(get_check(kt, &t[0], NULL), TD_OK);
    CHECK_STATUS(td_kvtier_put(kt, &t[4].rec), TD_OK);
    CHECK_EQ_INT(td_kvtier_has(kt, t[1].rec.hash), 0);
    CHECK_EQ_INT(td_kvtier_has(kt, t[0].rec.hash), TD_KVTIER_HOST);
    CHECK_STATUS(get_check(kt, &t[1], NULL), TD_ERR_NOT_FOUND);
    /* other tokens under the same hash: a miss, logged, the record dropped */
    td_logcap_reset();
    int32_t other[G];
    memcpy(other, t[0].tokens, sizeof(other));
    other[3]++;
    uint8_t pl[4096];
    td_kvtier_out_t out = { pl, sizeof(pl), NULL, 0, 0, 0, 0 };
    CHECK_STATUS(td_kvtier_get(kt, t[0].rec.hash, other, G, &out), TD_ERR_NOT_FOUND);
    CHECK(strstr(td_logcap.last, "hash collision") != NULL);
    CHECK_EQ_INT(td_kvtier_has(kt, t[0].rec.hash), 0);
    /* too-small buffers: an error, the record kept */
    td_kvtier_out_t small = { pl, 10, NULL, 0, 0, 0, 0 };
    CHECK_STATUS(td_kvtier_get(kt, t[2].rec.hash, t[2].tokens, G, &small), TD_ERR_TOO_BIG);
    CHECK_EQ_INT(td_kvtier_has(kt, t[2].rec.hash), TD_KVTIER_HOST);
    /* a record bigger than the budget is not kept */
    trec_t big;
    trec_make(&big, 99, 99, 5000, 0);
    CHECK_STATUS(td_kvtier_put(kt, &big.rec), TD_OK);
    CHECK_EQ_INT(td_kvtier_has(kt, big.rec.hash), 0);
    td_kvtier_stats(kt, &s);
    CHECK(s.host_bytes <= s.host_budget);
    CHECK(s.hits_host >= 5);
    CHECK(s.misses >= 2);
    /* malformed */
    td_kvrec_t bad = t[2].rec;
    bad.payload_bytes = 0;
    CHECK_STATUS(td_kvtier_put(kt, &bad), TD_ERR_INVALID);
    trec_free(&big);
    td_kvtier_destroy(kt);
    chain_free(t, 6);
}

static void
test_ssd_and_both(void)
{
    char dir[256];
    trec_t *t = chain_make(8, 1000);
    unsigned tier = 0;
    uint8_t pl[8][4096], sn[8][256];
    td_kvtier_out_t outs[8];
    uint64_t hashes[8];
    int32_t toks[8 * G];
    size_t nhit = 0;

    dir_path(dir, sizeof(dir), "ssd");
    td_kvtier_t *kt = tier_make(0, dir, 1 << 20);
    struct stat sb;
    CHECK(stat(dir, &sb) == 0 && (sb.st_mode & 0777) == 0700);
    for (int i = 0; i < 8; i++)
        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
    td_kvtier_wait_idle(kt);
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_INT(td_kvtier_has(kt, t[i].rec.hash), TD_KVTIER_SSD);
        CHECK_STATUS(get_check(kt, &t[i], &tier), TD_OK);
        CHECK_EQ_INT(tier, TD_KVTIER_SSD);
        CHECK_EQ_INT(td_kvtier_has(kt, t[i].rec.hash), TD_KVTIER_SSD);   /* no host tier */
        hashes[i] = t[i].rec.hash;
        memcpy(toks + i * G, t[i].tokens, sizeof(t[i].tokens));
        outs[i] = (td_kvtier_out_t){ pl[i], sizeof(pl[i]), sn[i], sizeof(sn[i]), 0, 0, 0 };
    }
    size_t files = 0;
    CHECK_EQ_INT(dir_bytes(dir, &files), 8 * (80 + 80) + 8 * G * 4 + 8 * 1000 + 2 * 100);
    CHECK_EQ_INT(files, 8);
    /* a chain in one call; stops at the first miss */
    CHECK_STATUS(td_kvtier_get_many(kt, hashes, 8, toks, G, outs, &nhit), TD_OK);
    CHECK_EQ_INT(nhit, 8);
    for (int i = 0; i < 8; i++)
        CHECK(memcmp(pl[i], t[i].payload, 1000) == 0);
    hashes[5] = 12345;
    CHECK_STATUS(td_kvtier_get_many(kt, hashes, 8, toks, G, outs, &nhit), TD_OK);
    CHECK_EQ_INT(nhit, 5);
    td_kvtier_destroy(kt);

    /* both tiers: put lands in both; host eviction leaves SSD; a read promotes */
    kt = tier_make(2 * rec_bytes(&t[0]) + 150, dir, 1 << 20);
    td_kvtier_flush(kt);
    td_kvtier_wait_idle(kt);
    CHECK_EQ_INT(dir_bytes(dir, NULL), 0);
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_EQ_INT(td_kvtier_has(kt, t[0].rec.hash), TD_KVTIER_SSD);
    CHECK_EQ_INT(td_kvtier_has(kt, t[2].rec.hash), TD_KVTIER_HOST | TD_KVTIER_SSD);
    CHECK_STATUS(get_check(kt, &t[0], &tier), TD_OK);
    CHECK_EQ_INT(tier, TD_KVTIER_SSD);
    CHECK_EQ_INT(td_kvtier_has(kt, t[0].rec.hash), TD_KVTIER_HOST | TD_KVTIER_SSD);
    CHECK_STATUS(get_check(kt, &t[0], &tier), TD_OK);
    CHECK_EQ_INT(tier, TD_KVTIER_HOST);
    td_kvtier_stats_t s;
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.hits_host, 1);
    CHECK_EQ_INT(s.hits_ssd, 1);
    CHECK_EQ_INT(s.ssd_records, 3);
    CHECK(s.bytes_written == s.ssd_bytes);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 8);
}

/* Budgets hold after every put (on disk: stat), LRU order of the SSD tier. */
static void
test_budgets_lru(void)
{
    char dir[256];
    trec_t *t = chain_make(30, 700);
    uint64_t ssd_budget = 5 * file_bytes(&t[0]) + 500, host_budget = 3 * rec_bytes(&t[0]);

    dir_path(dir, sizeof(dir), "budget");
    td_kvtier_t *kt = tier_make(host_budget, dir, ssd_budget);
    for (int i = 0; i < 30; i++) {
        td_kvtier_stats_t s;

        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
        td_kvtier_stats(kt, &s);
        CHECK(s.host_bytes <= host_budget);
        CHECK(s.ssd_disk_bytes <= ssd_budget);   /* temp files counted */
        td_kvtier_wait_idle(kt);
        td_kvtier_stats(kt, &s);
        CHECK(dir_bytes(dir, NULL) <= ssd_budget);
        CHECK_EQ_INT(dir_bytes(dir, NULL), s.ssd_bytes);
        CHECK_EQ_INT(s.ssd_disk_bytes, s.ssd_bytes);
        if (i == 10) {
            /* read the oldest on SSD (6): the next put evicts 7 instead */
            CHECK_EQ_INT(td_kvtier_has(kt, t[6].rec.hash), TD_KVTIER_SSD);
            CHECK_STATUS(get_check(kt, &t[6], NULL), TD_OK);
        }
        if (i == 11) {
            CHECK(td_kvtier_has(kt, t[6].rec.hash) & TD_KVTIER_SSD);
            CHECK_EQ_INT(td_kvtier_has(kt, t[7].rec.hash), 0);
            CHECK(!file_exists(dir, t[7].rec.hash));
        }
    }
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 30);
}

/* Restart: the files are found and read back; LRU from mtime; over budget
 * at start evicts the oldest. */
static void
test_restart(void)
{
    char dir[256], p[512];
    trec_t *t = chain_make(6, 900);
    td_kvtier_t *kt;

    dir_path(dir, sizeof(dir), "restart");
    kt = tier_make(1 << 20, dir, 1 << 20);
    for (int i = 0; i < 6; i++)
        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
    td_kvtier_destroy(kt);   /* finishes the queued writes */
    /* mtimes: block 3 oldest, then 0, 1, ... */
    for (int i = 0; i < 6; i++) {
        struct timespec ts[2] = { { 1000000 + (i == 3 ? 0 : 10 + i), 0 },
                                  { 1000000 + (i == 3 ? 0 : 10 + i), 0 } };
        file_of(p, sizeof(p), dir, t[i].rec.hash);
        CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
    }
    kt = tier_make(1 << 20, dir, 1 << 20);
    for (int i = 0; i < 6; i++) {
        unsigned tier = 0;
        CHECK_EQ_INT(td_kvtier_has(kt, t[i].rec.hash), TD_KVTIER_SSD);
        CHECK_STATUS(get_check(kt, &t[i], &tier), TD_OK);
        CHECK_EQ_INT(tier, TD_KVTIER_SSD);
    }
    uint64_t all[16];
    size_t n = 0;
    CHECK_STATUS(td_kvtier_snapshot(kt, all, 2, &n), TD_ERR_TOO_BIG);
    CHECK_EQ_INT(n, 6);
    CHECK_STATUS(td_kvtier_snapshot(kt, all, 16, &n), TD_OK);
    CHECK_EQ_INT(n, 6);
    td_kvtier_destroy(kt);
    /* the reads updated the mtimes; set them again, restart within 4 files */
    for (int i = 0; i < 6; i++) {
        struct timespec ts[2] = { { 1000000 + (i == 3 ? 0 : 10 + i), 0 },
                                  { 1000000 + (i == 3 ? 0 : 10 + i), 0 } };
        file_of(p, sizeof(p), dir, t[i].rec.hash);
        CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
    }
    kt = tier_make(0, dir, 4 * file_bytes(&t[0]) + 250);
    CHECK_EQ_INT(td_kvtier_has(kt, t[3].rec.hash), 0);
    CHECK_EQ_INT(td_kvtier_has(kt, t[0].rec.hash), 0);
    CHECK(!file_exists(dir, t[3].rec.hash));
    for (int i = 1; i < 6; i++)
        if (i != 3)
            CHECK_EQ_INT(td_kvtier_has(kt, t[i].rec.hash), TD_KVTIER_SSD);
    CHECK(dir_bytes(dir, NULL) <= 4 * file_bytes(&t[0]) + 250);
    /* a second object on the same directory is refused */
    td_kvtier_config_t cfg = { .ssd_dir = dir, .ssd_budget = 1 << 20 };
    td_kvtier_t *other = NULL;
    td_logcap_reset();
    CHECK_STATUS(td_kvtier_create(&cfg, &other), TD_ERR_BUSY);
    CHECK(strstr(td_logcap.last, "in use") != NULL);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 6);
}

static void
file_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    CHECK(f != NULL);
    if (f == NULL)
        return;
    if (len > 0)
        CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
}

static size_t
file_read(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n;

    if (f == NULL)
        return 0;
    n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* A damaged file: get is a miss with a log line naming what, the file is
 * deleted, the tier works on. */
static void
fault_expect(td_kvtier_t *kt, const char *dir, const trec_t *t, const char *what)
{
    td_kvtier_stats_t before, after;

    td_kvtier_stats(kt, &before);
    td_logcap_reset();
    CHECK_STATUS(get_check(kt, t, NULL), TD_ERR_NOT_FOUND);
    if (strstr(td_logcap.last, what) == NULL)
        fprintf(stderr, "want \"%s\" in \"%s\"\n", what, td_logcap.last);
    CHECK(strstr(td_logcap.last, what) != NULL);
    CHECK(strstr(td_logcap.last, dir) != NULL);
    td_kvtier_wait_idle(kt);
    CHECK(!file_exists(dir, t->rec.hash));
    CHECK_EQ_INT(td_kvtier_has(kt, t->rec.hash), 0);
    td_kvtier_stats(kt, &after);
    CHECK_EQ_INT(after.misses, before.misses + 1);
}

static void
test_faults(void)
{
    char dir[256], dir2[256], p[512], q[512];
    trec_t *t = chain_make(12, 500);
    static uint8_t buf[8192];
    size_t n;

    dir_path(dir, sizeof(dir), "faults");
    dir_path(dir2, sizeof(dir2), "foreign");
    td_kvtier_t *kt = tier_make(0, dir, 1 << 20);
    for (int i = 0; i < 12; i++)
        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
    td_kvtier_wait_idle(kt);

    /* a flipped payload byte */
    file_of(p, sizeof(p), dir, t[0].rec.hash);
    n = file_read(p, buf, sizeof(buf));
    buf[FILE_OVERHEAD(1) + 80 + G * 4 + 17] ^= 0x40;
    file_write(p, buf, n);
    fault_expect(kt, dir, &t[0], "checksum mismatch");
    /* truncated */
    file_of(p, sizeof(p), dir, t[1].rec.hash);
    CHECK(truncate(p, 300) == 0);
    fault_expect(kt, dir, &t[1], "truncated");
    /* another record's file under this one's name */
    file_of(p, sizeof(p), dir, t[3].rec.hash);
    file_of(q, sizeof(q), dir, t[4].rec.hash);
    CHECK(rename(q, p) == 0);
    fault_expect(kt, dir, &t[3], "holds another block");
    td_logcap_reset();
    CHECK_STATUS(get_check(kt, &t[4], NULL), TD_ERR_NOT_FOUND);   /* its own name is gone */
    CHECK(strstr(td_logcap.last, "cannot open") != NULL);
    CHECK_EQ_INT(td_kvtier_has(kt, t[4].rec.hash), 0);
    td_kvtier_stats_t s;
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(dir_bytes(dir, NULL), s.ssd_bytes);
    CHECK_EQ_INT(s.ssd_disk_bytes, s.ssd_bytes);
    /* garbage of the same size */
    file_of(p, sizeof(p), dir, t[5].rec.hash);
    n = file_read(p, buf, sizeof(buf));
    for (size_t k = 0; k < n; k++)
        buf[k] = (uint8_t)(k * 31 + 5);
    file_write(p, buf, n);
    fault_expect(kt, dir, &t[5], "bad magic");
    /* zero length */
    file_of(p, sizeof(p), dir, t[6].rec.hash);
    file_write(p, buf, 0);
    fault_expect(kt, dir, &t[6], "truncated");
    /* a foreign file: the same block written with another layout hash */
    td_kvtier_config_t fcfg = { .ssd_dir = dir2, .ssd_budget = 1 << 20, .layout_hash = 7,
                                .seed = SEED };
    td_kvtier_t *fk = NULL;
    CHECK_STATUS(td_kvtier_create(&fcfg, &fk), TD_OK);
    CHECK_STATUS(td_kvtier_put(fk, &t[7].rec), TD_OK);
    CHECK_STATUS(td_kvtier_put(fk, &t[8].rec), TD_OK);
    td_kvtier_destroy(fk);
    file_of(q, sizeof(q), dir2, t[7].rec.hash);
    file_of(p, sizeof(p), dir, t[7].rec.hash);
    n = file_read(q, buf, sizeof(buf));
    file_write(p, buf, n);
    fault_expect(kt, dir, &t[7], "foreign");

    /* the tier works on */
    td_kvrec_t again = t[0].rec;
    CHECK_STATUS(td_kvtier_put(kt, &again), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_STATUS(get_check(kt, &t[0], NULL), TD_OK);
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.corrupt, 6);
    CHECK_EQ_INT(dir_bytes(dir, NULL), s.ssd_bytes);
    CHECK_EQ_INT(s.ssd_disk_bytes, s.ssd_bytes);
    td_kvtier_destroy(kt);

    /* at start: garbage, zero-length, foreign and leftover temp files are
     * deleted with a line each; other names are left alone */
    file_of(q, sizeof(q), dir2, t[8].rec.hash);
    file_of(p, sizeof(p), dir, t[8].rec.hash);
    n = file_read(q, buf, sizeof(buf));
    file_write(p, buf, n);                                     /* foreign */
    file_of(p, sizeof(p), dir, t[9].rec.hash);
    file_write(p, "garbage", 7);                               /* garbage */
    file_of(p, sizeof(p), dir, t[10].rec.hash);
    file_write(p, buf, 0);                                     /* zero length */
    snprintf(p, sizeof(p), "%s/%016" PRIx64 ".tmp", dir, t[11].rec.hash);
    file_write(p, "x", 1);                                     /* unfinished write */
    snprintf(p, sizeof(p), "%s/notes.txt", dir);
    file_write(p, "keep me", 7);
    file_of(p, sizeof(p), dir, t[2].rec.hash);                 /* a good one, modified */
    n = file_read(p, buf, sizeof(buf));
    buf[n - 1] ^= 1;
    file_write(p, buf, n);
    td_logcap_reset();
    kt = tier_make(0, dir, 1 << 20);
    CHECK(td_logcap.last[0] != '\0');
    CHECK_EQ_INT(td_kvtier_has(kt, t[8].rec.hash), 0);
    CHECK_EQ_INT(td_kvtier_has(kt, t[9].rec.hash), 0);
    CHECK_EQ_INT(td_kvtier_has(kt, t[10].rec.hash), 0);
    CHECK(!file_exists(dir, t[8].rec.hash));
    CHECK(!file_exists(dir, t[9].rec.hash));
    CHECK(!file_exists(dir, t[10].rec.hash));
    CHECK(access(p, F_OK) == 0);   /* header reads only: found at start */
    snprintf(q, sizeof(q), "%s/notes.txt", dir);
    CHECK(access(q, F_OK) == 0);
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.corrupt, 3);       /* foreign, garbage, zero length */
    CHECK_EQ_INT(s.ssd_records, 3);   /* 0, 2 and 11 */
    fault_expect(kt, dir, &t[2], "checksum mismatch");
    CHECK_STATUS(get_check(kt, &t[0], NULL), TD_OK);
    td_kvtier_destroy(kt);
    unlink(q);
    dir_rm(dir);
    dir_rm(dir2);
    chain_free(t, 12);
}

/* put_many packs a batch into one file; chains read back; eviction and a
 * bad record cost the whole file; restart finds packed files. */
static void
test_pack(void)
{
    char dir[256];
    trec_t *t = chain_make(30, 600);
    uint64_t hashes[30], add[64], rem[64];
    int32_t toks[30 * G];
    td_kvrec_t recs[30];
    static uint8_t pl[30][4096], sn[30][256];
    td_kvtier_out_t outs[30];
    size_t files = 0, nhit = 0, na, nr;
    uint64_t f1 = FILE_OVERHEAD(10), f2 = FILE_OVERHEAD(8);

    for (int i = 0; i < 30; i++) {
        hashes[i] = t[i].rec.hash;
        recs[i] = t[i].rec;
        memcpy(toks + i * G, t[i].tokens, sizeof(t[i].tokens));
        outs[i] = (td_kvtier_out_t){ pl[i], sizeof(pl[i]), sn[i], sizeof(sn[i]), 0, 0, 0 };
        if (i < 10)
            f1 += rec_bytes(&t[i]);
        else if (i < 18)
            f2 += rec_bytes(&t[i]);
    }
    dir_path(dir, sizeof(dir), "pack");
    td_kvtier_config_t cfg = { .ssd_dir = dir, .ssd_budget = f1 + f2, .layout_hash = LAYOUT,
                               .seed = SEED, .read_threads = 2 };
    td_kvtier_t *kt = NULL;

    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    CHECK_STATUS(td_kvtier_put_many(kt, recs, 10), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_EQ_INT(dir_bytes(dir, &files), f1);
    CHECK_EQ_INT(files, 1);
    CHECK(file_exists(dir, hashes[0]));
    CHECK_STATUS(td_kvtier_get_many(kt, hashes, 10, toks, G, outs, &nhit), TD_OK);
    CHECK_EQ_INT(nhit, 10);
    for (int i = 0; i < 10; i++) {
        CHECK_EQ_INT(outs[i].tier, TD_KVTIER_SSD);
        CHECK(memcmp(pl[i], t[i].payload, 600) == 0);
        CHECK_EQ_INT(outs[i].snapshot_bytes, t[i].rec.snapshot_bytes);
        if (t[i].rec.snapshot_bytes > 0)
            CHECK(memcmp(sn[i], t[i].snapshot, 100) == 0);
    }
    /* records on SSD already stay out of the next file */
    CHECK_STATUS(td_kvtier_put_many(kt, recs + 8, 10), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_EQ_INT(dir_bytes(dir, &files), f1 + f2);
    CHECK_EQ_INT(files, 2);
    CHECK(file_exists(dir, hashes[10]));
    td_kvtier_stats_t s;
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.ssd_records, 18);
    CHECK_EQ_INT(s.ssd_files, 2);
    /* restart: both files, every record */
    td_kvtier_destroy(kt);
    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    CHECK_STATUS(td_kvtier_get_many(kt, hashes, 20, toks, G, outs, &nhit), TD_OK);
    CHECK_EQ_INT(nhit, 18);
    for (int i = 0; i < 18; i++)
        CHECK(memcmp(pl[i], t[i].payload, 600) == 0);
    /* eviction is per file: the first file's ten leave together (the second
     * read last: the threads read the runs in any order) */
    CHECK_STATUS(get_check(kt, &t[12], NULL), TD_OK);
    td_kvtier_drain_events(kt, add, 64, &na, rem, 64, &nr);
    CHECK_STATUS(td_kvtier_put_many(kt, recs + 20, 4), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK(dir_bytes(dir, NULL) <= f1 + f2);
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 64, &na, rem, 64, &nr), TD_OK);
    CHECK_EQ_INT(na, 4);
    CHECK_EQ_INT(nr, 10);
    for (int i = 0; i < 10; i++)
        CHECK(has_hash(rem, nr, hashes[i]));
    CHECK_EQ_INT(td_kvtier_has(kt, hashes[12]), TD_KVTIER_SSD);
    /* a bad record in the middle: a miss, and its file goes */
    char p[512];
    static uint8_t buf[16384];
    file_of(p, sizeof(p), dir, hashes[10]);
    size_t n = 0;
    FILE *fp = fopen(p, "r+b");
    CHECK(fp != NULL);
    if (fp != NULL) {
        n = fread(buf, 1, sizeof(buf), fp);
        buf[n - 700] ^= 1;   /* in record 16 or 17 */
        fseek(fp, 0, SEEK_SET);
        CHECK(fwrite(buf, 1, n, fp) == n);
        fclose(fp);
    }
    td_logcap_reset();
    CHECK_STATUS(td_kvtier_get_many(kt, hashes + 10, 8, toks + 10 * G, G, outs, &nhit), TD_OK);
    CHECK(nhit >= 6 && nhit < 8);
    CHECK(strstr(td_logcap.last, "checksum mismatch") != NULL);
    td_kvtier_wait_idle(kt);
    CHECK(!file_exists(dir, hashes[10]));
    CHECK_EQ_INT(td_kvtier_has(kt, hashes[12]), 0);
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.ssd_files, 1);
    CHECK_EQ_INT(dir_bytes(dir, NULL), s.ssd_bytes);
    td_kvtier_destroy(kt);

    /* pack_records splits a batch */
    cfg.pack_records = 4;
    cfg.ssd_budget = 1 << 20;
    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    td_kvtier_flush(kt);
    CHECK_STATUS(td_kvtier_put_many(kt, recs, 10), TD_OK);
    td_kvtier_wait_idle(kt);
    dir_bytes(dir, &files);
    CHECK_EQ_INT(files, 3);
    CHECK_STATUS(td_kvtier_get_many(kt, hashes, 10, toks, G, outs, &nhit), TD_OK);
    CHECK_EQ_INT(nhit, 10);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 30);
}

/* With the IO thread stalled, puts return at once and a full queue drops. */
static void
test_stall(void)
{
    char dir[256];
    trec_t *t = chain_make(10, 2000);
    td_kvtier_config_t cfg = { .host_budget = 0, .ssd_budget = 1 << 20,
                               .layout_hash = LAYOUT, .seed = SEED, .queue_cap = 4 };
    td_kvtier_t *kt = NULL;
    uint64_t worst = 0;

    dir_path(dir, sizeof(dir), "stall");
    cfg.ssd_dir = dir;
    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    td_kvtier_test_stall(kt, true);
    for (int i = 0; i < 10; i++) {
        uint64_t t0 = td_testutil_now_us();
        CHECK_STATUS(td_kvtier_put(kt, &t[i].rec), TD_OK);
        uint64_t dt = td_testutil_now_us() - t0;
        worst = dt > worst ? dt : worst;
    }
    CHECK(worst < 20000);
    td_kvtier_stats_t s;
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.queued, 4);
    CHECK_EQ_INT(s.writes_dropped, 6);
    CHECK_EQ_INT(dir_bytes(dir, NULL), 0);
    td_kvtier_test_stall(kt, false);
    td_kvtier_wait_idle(kt);
    size_t files = 0;
    dir_bytes(dir, &files);
    CHECK_EQ_INT(files, 4);
    /* flush drops queued writes too */
    td_kvtier_test_stall(kt, true);
    CHECK_STATUS(td_kvtier_put(kt, &t[8].rec), TD_OK);
    td_kvtier_flush(kt);
    td_kvtier_test_stall(kt, false);
    td_kvtier_wait_idle(kt);
    dir_bytes(dir, &files);
    CHECK_EQ_INT(files, 0);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 10);
}

/* ---- Prefetch ----------------------------------------------------------------- */

/* Polls the tier's stats until prefetched reaches want (5 s at most). */
static bool
prefetch_wait(td_kvtier_t *kt, uint64_t want)
{
    td_kvtier_stats_t s;

    for (int i = 0; i < 5000; i++) {
        td_kvtier_stats(kt, &s);
        if (s.prefetched >= want)
            return true;
        usleep(1000);
    }
    return false;
}

/* Puts recs[0, n) (written back), reads their chain ahead, and waits until
 * the tier's prefetched count reaches want. */
static void
put_read_ahead(td_kvtier_t *kt, const td_kvrec_t *recs, const uint64_t *hashes, size_t n,
               uint64_t want)
{
    CHECK_STATUS(td_kvtier_put_many(kt, recs, n), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, n), TD_OK);
    CHECK(prefetch_wait(kt, want));
}

/* Deletes the files of hashes[0, 40) (10 a file) behind the tier's back. */
static void
unlink_files(const char *dir, const uint64_t *hashes)
{
    char p[512];

    for (int i = 0; i < 40; i += 10) {
        file_of(p, sizeof(p), dir, hashes[i]);
        CHECK(unlink(p) == 0);
    }
}

/* td_kvtier_prefetch: a chain read ahead is what get_many returns (shown by
 * deleting the files after the reads: the gets still hit, from the reads),
 * a run nobody takes goes after a second when its slot is wanted, a bad
 * record read ahead is still caught by the get, host records and missing
 * blocks are not read, and destroy lets held runs and queued chains go. */
static void
test_prefetch(void)
{
    char dir[256], p[512];
    trec_t *t = chain_make(40, 700);
    uint64_t hashes[40];
    td_kvrec_t recs[40];
    td_kvtier_stats_t s;
    size_t ssd = 0;

    for (int i = 0; i < 40; i++) {
        hashes[i] = t[i].rec.hash;
        recs[i] = t[i].rec;
    }
    /* no SSD tier: nothing to read ahead */
    td_kvtier_t *kt = tier_make(1 << 20, NULL, 0);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 40), TD_ERR_UNSUPPORTED);
    td_kvtier_destroy(kt);

    dir_path(dir, sizeof(dir), "prefetch");
    td_kvtier_config_t cfg = { .ssd_dir = dir, .ssd_budget = 1 << 22, .layout_hash = LAYOUT,
                               .seed = SEED, .pack_records = 10 };
    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 0), TD_OK);
    put_read_ahead(kt, recs, hashes, 40, 40);   /* 4 files of 10 */
    unlink_files(dir, hashes);                  /* only the reads have them now */
    CHECK_EQ_INT(chain_get(kt, t, 40, &ssd), 40);
    CHECK_EQ_INT(ssd, 40);
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.prefetched, 40);
    CHECK_EQ_INT(s.prefetch_unused, 0);
    CHECK_EQ_INT(s.hits_ssd, 40);
    td_logcap_reset();
    CHECK_EQ_INT(chain_get(kt, t, 40, &ssd), 0);   /* read again: the files are gone */
    CHECK(strstr(td_logcap.last, "cannot open") != NULL);

    /* a flush drops what was read ahead; the same blocks put again are read
     * ahead again (shown the same way) */
    td_kvtier_flush(kt);
    td_kvtier_wait_idle(kt);
    put_read_ahead(kt, recs, hashes, 40, 80);
    td_kvtier_flush(kt);
    td_kvtier_wait_idle(kt);
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.prefetch_unused, 40);
    CHECK_EQ_INT(chain_get(kt, t, 40, &ssd), 0);
    put_read_ahead(kt, recs, hashes, 40, 120);
    unlink_files(dir, hashes);
    CHECK_EQ_INT(chain_get(kt, t, 40, &ssd), 40);
    /* runs nobody takes go after a second, with nothing else queued */
    td_kvtier_flush(kt);
    td_kvtier_wait_idle(kt);
    put_read_ahead(kt, recs, hashes, 40, 160);
    td_kvtier_stats(kt, &s);
    uint64_t unused0 = s.prefetch_unused;
    for (int i = 0; i < 40 && s.prefetch_unused < unused0 + 40; i++) {
        usleep(100000);
        td_kvtier_stats(kt, &s);
    }
    CHECK_EQ_INT(s.prefetch_unused - unused0, 40);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 65537), TD_ERR_BUSY);
    td_kvtier_destroy(kt);

    /* one file per block: 40 runs for 32 slots; nobody gets the first ones,
     * which go after a second, and the last 8 are read then */
    cfg.pack_records = 1;
    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    td_kvtier_flush(kt);
    td_kvtier_wait_idle(kt);
    for (int i = 0; i < 40; i++)
        CHECK_STATUS(td_kvtier_put(kt, &recs[i]), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 40), TD_OK);
    CHECK(prefetch_wait(kt, 40));
    td_kvtier_stats(kt, &s);
    CHECK(s.prefetch_unused >= 8);
    CHECK_EQ_INT(chain_get(kt, t, 40, &ssd), 40);   /* from the reads held, or read now */
    CHECK_EQ_INT(ssd, 40);

    /* a record damaged before it is read ahead: the get catches it */
    file_of(p, sizeof(p), dir, hashes[5]);
    FILE *fp = fopen(p, "r+b");
    CHECK(fp != NULL);
    if (fp != NULL) {   /* a bit of its snapshot */
        fseek(fp, -10, SEEK_END);
        int b0 = fgetc(fp);
        fseek(fp, -10, SEEK_END);
        fputc(b0 ^ 1, fp);
        fclose(fp);
    }
    td_kvtier_stats(kt, &s);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 10), TD_OK);
    CHECK(prefetch_wait(kt, s.prefetched + 10));
    td_logcap_reset();
    CHECK_EQ_INT(chain_get(kt, t, 10, &ssd), 5);
    CHECK(strstr(td_logcap.last, "checksum mismatch") != NULL);
    td_kvtier_wait_idle(kt);
    CHECK(!file_exists(dir, hashes[5]));
    /* the chain ends at a block no tier holds: nothing after it is read */
    td_kvtier_stats(kt, &s);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 10), TD_OK);
    CHECK(prefetch_wait(kt, s.prefetched + 5));
    usleep(20000);
    td_kvtier_stats_t s2;
    td_kvtier_stats(kt, &s2);
    CHECK_EQ_INT(s2.prefetched - s.prefetched, 5);
    CHECK_EQ_INT(chain_get(kt, t, 10, &ssd), 5);
    /* destroy with runs held and chains queued */
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes + 10, 30), TD_OK);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes + 10, 30), TD_OK);
    td_kvtier_destroy(kt);

    /* host records are not read ahead */
    cfg.host_budget = 1 << 20;
    cfg.pack_records = 10;
    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    td_kvtier_flush(kt);
    td_kvtier_wait_idle(kt);
    CHECK_STATUS(td_kvtier_put_many(kt, recs, 10), TD_OK);
    td_kvtier_wait_idle(kt);
    CHECK_STATUS(td_kvtier_prefetch(kt, hashes, 10), TD_OK);
    usleep(50000);
    td_kvtier_stats(kt, &s);
    CHECK_EQ_INT(s.prefetched, 0);
    CHECK_EQ_INT(chain_get(kt, t, 10, &ssd), 10);
    CHECK_EQ_INT(ssd, 0);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 40);
}

/* ---- Events ------------------------------------------------------------------ */

static void
test_events(void)
{
    char dir[256];
    trec_t *t = chain_make(6, 800);
    uint64_t add[16], rem[16];
    size_t na = 0, nr = 0;

    /* host eviction */
    td_kvtier_t *kt = tier_make(2 * rec_bytes(&t[0]) + 100, NULL, 0);
    CHECK_STATUS(td_kvtier_put(kt, &t[0].rec), TD_OK);
    CHECK_STATUS(td_kvtier_put(kt, &t[1].rec), TD_OK);
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 16, &na, rem, 16, &nr), TD_OK);
    CHECK_EQ_INT(na, 2);
    CHECK_EQ_INT(nr, 0);
    CHECK_STATUS(td_kvtier_put(kt, &t[2].rec), TD_OK);
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 16, &na, rem, 16, &nr), TD_OK);
    CHECK(na == 1 && add[0] == t[2].rec.hash);
    CHECK(nr == 1 && rem[0] == t[0].rec.hash);
    /* added then removed before a drain: nothing to say */
    CHECK_STATUS(td_kvtier_put(kt, &t[3].rec), TD_OK);
    CHECK_STATUS(td_kvtier_put(kt, &t[4].rec), TD_OK);
    CHECK_STATUS(td_kvtier_put(kt, &t[5].rec), TD_OK);
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 1, &na, rem, 16, &nr), TD_INPROGRESS);
    CHECK_EQ_INT(na, 1);
    CHECK_EQ_INT(nr, 2);   /* 1 and 2 */
    CHECK(!has_hash(rem, nr, t[3].rec.hash));
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 16, &na, rem, 16, &nr), TD_OK);
    CHECK_EQ_INT(na, 1);
    CHECK_EQ_INT(nr, 0);
    td_kvtier_destroy(kt);

    /* SSD eviction; a hash in both tiers leaves when it leaves both; flush */
    dir_path(dir, sizeof(dir), "events");
    kt = tier_make(rec_bytes(&t[0]), dir, 2 * file_bytes(&t[0]) + 100);
    CHECK_STATUS(td_kvtier_put(kt, &t[0].rec), TD_OK);
    CHECK_STATUS(td_kvtier_put(kt, &t[1].rec), TD_OK);   /* host: 0 out, on SSD still */
    td_kvtier_wait_idle(kt);
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 16, &na, rem, 16, &nr), TD_OK);
    CHECK_EQ_INT(na, 2);
    CHECK_EQ_INT(nr, 0);
    CHECK_STATUS(td_kvtier_put(kt, &t[2].rec), TD_OK);    /* too big for the host tier */
    td_kvtier_wait_idle(kt);                              /* SSD: 0 out */
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 16, &na, rem, 16, &nr), TD_OK);
    CHECK(na == 1 && add[0] == t[2].rec.hash);
    CHECK(nr == 1 && rem[0] == t[0].rec.hash);
    CHECK_EQ_INT(td_kvtier_has(kt, t[1].rec.hash), TD_KVTIER_HOST | TD_KVTIER_SSD);
    uint64_t all[8];
    size_t n = 0;
    CHECK_STATUS(td_kvtier_snapshot(kt, all, 8, &n), TD_OK);
    CHECK(n == 2 && has_hash(all, n, t[1].rec.hash) && has_hash(all, n, t[2].rec.hash));
    td_kvtier_flush(kt);
    CHECK_STATUS(td_kvtier_drain_events(kt, add, 16, &na, rem, 16, &nr), TD_OK);
    CHECK_EQ_INT(na, 0);
    CHECK(nr == 2 && has_hash(rem, nr, t[1].rec.hash) && has_hash(rem, nr, t[2].rec.hash));
    td_kvtier_wait_idle(kt);
    CHECK_EQ_INT(dir_bytes(dir, NULL), 0);
    td_kvtier_destroy(kt);
    dir_rm(dir);
    chain_free(t, 6);
}

int
main(void)
{
    if (mkdtemp(kvt_root) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    td_logcap_start();
    test_host_only();
    test_ssd_and_both();
    test_budgets_lru();
    test_restart();
    test_faults();
    test_pack();
    test_stall();
    test_prefetch();
    test_events();
    td_logcap_stop();
    CHECK(rmdir(kvt_root) == 0);
    return td_check_exit("test_kvtier");
}
