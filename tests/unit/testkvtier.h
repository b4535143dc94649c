/* tests/unit/testkvtier.h — what the tests of the KV cache's tiers
 * (kvcache/kvtier.h) share: records of a test chain, the test's directory
 * and what is in it, a tier over it, a chain read back and compared. */
#ifndef TD_TESTKVTIER_H
#define TD_TESTKVTIER_H

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chainhash.h"
#include "check.h"
#include "kvtier.h"

#define G 16
#define LAYOUT 0x1111
#define SEED 0x2222

/* A test record: block i of one chain (tokens i*G..), payload and snapshot
 * bytes derived from the chain hash. */
typedef struct {
    td_kvrec_t rec;
    int32_t tokens[G];
    uint8_t *payload, *snapshot;
} trec_t;

static inline void
trec_make(trec_t *t, uint64_t parent, uint32_t i, uint64_t payload_bytes, uint64_t snap_bytes)
{
    memset(t, 0, sizeof(*t));
    for (int k = 0; k < G; k++)
        t->tokens[k] = (int32_t)(i * G + (uint32_t)k);
    t->rec.hash = td_chain_hash(parent, t->tokens, G);
    t->rec.parent = parent;
    t->rec.end = (uint64_t)(i + 1) * G;
    t->rec.block_tokens = G;
    t->rec.tokens = t->tokens;
    t->payload = malloc(payload_bytes);
    for (uint64_t k = 0; k < payload_bytes; k++)
        t->payload[k] = (uint8_t)(t->rec.hash >> (k % 8 * 8)) ^ (uint8_t)k;
    t->rec.payload = t->payload;
    t->rec.payload_bytes = payload_bytes;
    if (snap_bytes > 0) {
        t->snapshot = malloc(snap_bytes);
        for (uint64_t k = 0; k < snap_bytes; k++)
            t->snapshot[k] = (uint8_t)(k * 7 + i);
        t->rec.snapshot = t->snapshot;
        t->rec.snapshot_bytes = snap_bytes;
    }
}

static inline void
trec_free(trec_t *t)
{
    free(t->payload);
    free(t->snapshot);
}

/* n records of a chain; every third has a snapshot. */
static inline trec_t *
chain_make(size_t n, uint64_t payload_bytes)
{
    trec_t *t = calloc(n, sizeof(*t));
    uint64_t prev = SEED;

    for (size_t i = 0; i < n; i++) {
        trec_make(&t[i], prev, (uint32_t)i, payload_bytes, i % 3 == 2 ? 100 : 0);
        prev = t[i].rec.hash;
    }
    return t;
}

static inline void
chain_free(trec_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        trec_free(&t[i]);
    free(t);
}

/* A record's bytes (the host tier's measure), and a file of it alone. */
static inline uint64_t
rec_bytes(const trec_t *t)
{
    return 80 + G * 4 + t->rec.payload_bytes + t->rec.snapshot_bytes;
}

#define FILE_OVERHEAD(n) (40 + 40 * (uint64_t)(n))

static inline uint64_t
file_bytes(const trec_t *t)
{
    return FILE_OVERHEAD(1) + rec_bytes(t);
}

/* ---- Directory helpers ---------------------------------------------------- */
/* The test's directory: made with mkdtemp by main. */
static char kvt_root[] = "/tmp/test_kvtier.XXXXXX";

static inline void
dir_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", kvt_root, name);
}

/* Sum of st_size of the record and temp files in dir; *files their count. */
static inline uint64_t
dir_bytes(const char *dir, size_t *files)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint64_t sum = 0;
    size_t n = 0;

    if (d == NULL)
        return 0;
    while ((de = readdir(d)) != NULL) {
        char p[512];
        struct stat sb;

        if (strstr(de->d_name, ".kvb") == NULL && strstr(de->d_name, ".tmp") == NULL)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (stat(p, &sb) == 0) {
            sum += (uint64_t)sb.st_size;
            n++;
        }
    }
    closedir(d);
    if (files != NULL)
        *files = n;
    return sum;
}

static inline void
dir_rm(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;

    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        char p[512];

        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline void
file_of(char *out, size_t len, const char *dir, uint64_t hash)
{
    snprintf(out, len, "%s/%016" PRIx64 ".kvb", dir, hash);
}

static inline bool
file_exists(const char *dir, uint64_t hash)
{
    char p[512];

    file_of(p, sizeof(p), dir, hash);
    return access(p, F_OK) == 0;
}

static inline td_kvtier_t *
tier_make(uint64_t host_budget, const char *dir, uint64_t ssd_budget)
{
    td_kvtier_config_t cfg = { .host_budget = host_budget, .ssd_dir = dir,
                               .ssd_budget = ssd_budget, .layout_hash = LAYOUT, .seed = SEED };
    td_kvtier_t *kt = NULL;

    CHECK_STATUS(td_kvtier_create(&cfg, &kt), TD_OK);
    return kt;
}

/* get_many of t[0, n): the leading hits, each compared with t; *ssd_hits:
 * how many of them were SSD hits. */
static inline size_t
chain_get(td_kvtier_t *kt, const trec_t *t, size_t n, size_t *ssd_hits)
{
    static uint8_t pl[64][4096], sn[64][256];
    td_kvtier_out_t outs[64];
    uint64_t hs[64];
    int32_t toks[64 * G];
    size_t hit = 0;

    for (size_t i = 0; i < n; i++) {
        hs[i] = t[i].rec.hash;
        memcpy(toks + i * G, t[i].tokens, sizeof(t[i].tokens));
        outs[i] = (td_kvtier_out_t){ pl[i], sizeof(pl[i]), sn[i], sizeof(sn[i]), 0, 0, 0 };
    }
    CHECK_STATUS(td_kvtier_get_many(kt, hs, n, toks, G, outs, &hit), TD_OK);
    *ssd_hits = 0;
    for (size_t i = 0; i < hit; i++) {
        CHECK_EQ_INT(outs[i].payload_bytes, t[i].rec.payload_bytes);
        CHECK(memcmp(pl[i], t[i].payload, t[i].rec.payload_bytes) == 0);
        CHECK_EQ_INT(outs[i].snapshot_bytes, t[i].rec.snapshot_bytes);
        if (t[i].rec.snapshot_bytes > 0)
            CHECK(memcmp(sn[i], t[i].snapshot, t[i].rec.snapshot_bytes) == 0);
        *ssd_hits += outs[i].tier == TD_KVTIER_SSD;
    }
    return hit;
}

#endif
