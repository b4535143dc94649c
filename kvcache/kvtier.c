/* kvcache/kvtier.c — the host and SSD tiers of the prefix cache (kvtier.h):
 * one index of entries by chain hash (each in the host LRU, in an SSD file of
 * the file LRU, or both), an IO thread that writes put batches as files and
 * deletes files, reader threads for chains, a prefetch thread that reads
 * queued chains ahead, and the checked reads. One mutex
 * (mu) guards the index, the queue, the events and the counters; no IO
 * happens under it. File format: docs/kvtier.md. */
#include "kvtier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/aio_abi.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include <xxhash.h>

/* ---- File format -----------------------------------------------------------
 * <name:016x>.kvb holds the records of one put batch (name: the first one's
 * hash): a 40-byte file header, a table of 40-byte entries, the records.
 * File header (little-endian): magic "TDKVPAK1", table checksum u64 (XXH3-64 of
 * bytes [16, 40 + 40n)), version u32, n u32, layout_hash, seed (u64).
 * Table entry: hash, offset, payload_bytes, snapshot_bytes (u64), G u32, 0 u32.
 * Record at its offset: an 80-byte header, tokens [G] (int32 LE), payload,
 * snapshot. Header: magic "TDKVBLK1", checksum u64, version u32, G u32,
 * layout_hash, seed, hash, parent, end, payload_bytes, snapshot_bytes (u64).
 * checksum: XXH3-64 chained through its seed over header[16, 80), tokens,
 * payload, snapshot. Temp files: <name:016x>.tmp, renamed into place. */
#define HDR_BYTES     80
#define KV_MAGIC      "TDKVBLK1"
#define KV_VERSION    1u
#define MAX_G         (1u << 20)
#define MAX_PART      (1ull << 40)
#define NAME_LEN      32
#define PACK_MAGIC    "TDKVPAK1"
#define PACK_HDR      40
#define PACK_ENT      40
#define PACK_MAX      256u   /* records per file at most */
/* get_many's reads: runs of a chain's blocks in one file */
#define RUN_ALIGN 4096u
#define RUN_MAX   (1u << 18)
#define RUN_BUFS  32          /* buffers kept for reuse */
#define AIO_DEPTH 64          /* runs in flight at most */
#define PF_DEPTH  32          /* prefetch: runs read ahead and held at most */
#define PF_RUN_MAX (1u << 18) /* prefetch: bytes per run at most */
#define PF_QUEUE_BLOCKS 65536u /* prefetch: blocks of the queued chains at most */
#define PF_STALE_NS 1000000000ull /* a run read ahead and not got for this long goes */
#define PF_START_WAIT_NS 5000000ull /* a get waits this long for a queued block's run */
#define MTIME_EVERY_NS (60ull * 1000000000ull)   /* a read sets a file's mtime at most this often */

enum { OFF_CSUM = 8, OFF_VERSION = 16, OFF_G = 20, OFF_LAYOUT = 24, OFF_SEED = 32,
       OFF_HASH = 40, OFF_PARENT = 48, OFF_END = 56, OFF_PAYLOAD = 64, OFF_SNAP = 72 };

static void
put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t
get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The checksum of a record in parts (the file's layout, any buffers). */
static uint64_t
rec_checksum(const uint8_t *hdr, const void *tokens, uint32_t g, const void *payload,
             uint64_t payload_bytes, const void *snapshot, uint64_t snapshot_bytes)
{
    uint64_t c = XXH3_64bits_withSeed(hdr + OFF_VERSION, HDR_BYTES - OFF_VERSION, 0);

    c = XXH3_64bits_withSeed(tokens, (size_t)g * 4, c);
    c = XXH3_64bits_withSeed(payload, payload_bytes, c);
    return XXH3_64bits_withSeed(snapshot, snapshot_bytes, c);
}

static void
rec_name(char *buf, uint64_t hash, const char *ext)
{
    snprintf(buf, NAME_LEN, "%016" PRIx64 "%s", hash, ext);
}

/* ---- Records in memory -----------------------------------------------------
 * A blob is a record's file image (checksum field zero), immutable once built
 * and shared by the host tier and the write queue through its count. */
typedef struct {
    _Atomic uint32_t refs;
    uint32_t g;
    uint64_t bytes;             /* the image: HDR_BYTES + 4G + payload + snapshot */
    uint64_t payload_bytes, snapshot_bytes;
    uint8_t data[];             /* [bytes] */
} blob_t;

static const int32_t *blob_tokens(const blob_t *b) { return (const int32_t *)(b->data + HDR_BYTES); }
static const uint8_t *blob_payload(const blob_t *b) { return b->data + HDR_BYTES + (uint64_t)b->g * 4; }
static const uint8_t *blob_snapshot(const blob_t *b) { return blob_payload(b) + b->payload_bytes; }

static uint64_t
rec_file_bytes(uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes)
{
    return HDR_BYTES + (uint64_t)g * 4 + payload_bytes + snapshot_bytes;
}

static void
hdr_fill(uint8_t *h, const td_kvtier_config_t *cfg, uint64_t hash, uint64_t parent,
         uint64_t end, uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes)
{
    memcpy(h, KV_MAGIC, 8);
    put_le64(h + OFF_CSUM, 0);
    put_le32(h + OFF_VERSION, KV_VERSION);
    put_le32(h + OFF_G, g);
    put_le64(h + OFF_LAYOUT, cfg->layout_hash);
    put_le64(h + OFF_SEED, cfg->seed);
    put_le64(h + OFF_HASH, hash);
    put_le64(h + OFF_PARENT, parent);
    put_le64(h + OFF_END, end);
    put_le64(h + OFF_PAYLOAD, payload_bytes);
    put_le64(h + OFF_SNAP, snapshot_bytes);
}

static blob_t *
blob_alloc(uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes)
{
    uint64_t bytes = rec_file_bytes(g, payload_bytes, snapshot_bytes);
    blob_t *b = malloc(sizeof(*b) + bytes);

    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->g = g;
    b->bytes = bytes;
    b->payload_bytes = payload_bytes;
    b->snapshot_bytes = snapshot_bytes;
    return b;
}

static blob_t *
blob_ref(blob_t *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

static void
blob_unref(blob_t *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

/* ---- Index: an intrusive map by hash ---------------------------------------- */
typedef struct mnode {
    uint64_t key;
    struct mnode *next;
} mnode_t;

typedef struct {
    mnode_t **b;
    size_t nb, n;               /* nb: a power of two */
} map_t;

static size_t
map_slot(const map_t *m, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (m->nb - 1);
}

static mnode_t *
map_find(const map_t *m, uint64_t key)
{
    for (mnode_t *n = m->b[map_slot(m, key)]; n != NULL; n = n->next)
        if (n->key == key)
            return n;
    return NULL;
}

/* Grows when full; a failed growth only lengthens the chains. */
static void
map_insert(map_t *m, mnode_t *node)
{
    if (m->n >= m->nb) {
        size_t nb = m->nb * 2;
        mnode_t **b = calloc(nb, sizeof(*b));

        if (b != NULL) {
            map_t grown = { b, nb, 0 };

            for (size_t i = 0; i < m->nb; i++)
                for (mnode_t *n = m->b[i], *next; n != NULL; n = next) {
                    size_t s = map_slot(&grown, n->key);

                    next = n->next;
                    n->next = b[s];
                    b[s] = n;
                }
            free(m->b);
            m->b = b;
            m->nb = nb;
        }
    }
    size_t s = map_slot(m, node->key);

    node->next = m->b[s];
    m->b[s] = node;
    m->n++;
}

static void
map_remove(map_t *m, mnode_t *node)
{
    for (mnode_t **p = &m->b[map_slot(m, node->key)]; *p != NULL; p = &(*p)->next)
        if (*p == node) {
            *p = node->next;
            m->n--;
            return;
        }
}

static td_status_t
map_init(map_t *m)
{
    m->nb = 1024;
    m->n = 0;
    m->b = calloc(m->nb, sizeof(*m->b));
    return m->b != NULL ? TD_OK : TD_ERR_NOMEM;
}

/* ---- The object ------------------------------------------------------------- */
typedef struct ent ent_t;
typedef struct kfile kfile_t;
typedef struct rbatch rbatch_t;
typedef struct pfrun pfrun_t;
typedef struct pfjob pfjob_t;

typedef struct {
    uint8_t *p;                 /* aligned for O_DIRECT */
    uint64_t cap;
} rbuf_t;

struct kfile {                  /* one file of the SSD tier: the records of one put batch */
    uint64_t name;              /* its first record's hash: <name:016x>.kvb */
    uint64_t bytes;             /* its size */
    uint64_t gen;               /* files indexed before it, + 1: a reader's check */
    uint64_t mtime_ns;          /* td_clock_ns when its mtime was last set by us */
    kfile_t *prev, *next;       /* SSD LRU */
    uint32_t nrec;
    uint64_t hashes[];          /* [nrec] its records */
};

typedef struct {
    kfile_t *head, *tail;       /* head: least recently used */
} flru_t;

typedef struct {
    ent_t *prev, *next;
} link_t;

typedef struct {
    ent_t *head, *tail;         /* head: least recently used */
} lru_t;

struct ent {                    /* one hash held by the host tier, the SSD tier or both */
    mnode_t node;               /* key: the hash */
    blob_t *host;               /* the host copy, or NULL */
    link_t hl;                  /* in the host LRU while host != NULL */
    kfile_t *file;              /* the SSD file holding it, or NULL */
    uint64_t off;               /* its record's offset in file */
    uint32_t g;                 /* the record's sizes (while file != NULL) */
    uint64_t payload, snapshot;
};

typedef struct evnode {         /* a hash's net change since the last drain */
    mnode_t node;
    int net;                    /* +1 added, -1 removed */
    struct evnode *prev, *next;
} evnode_t;

enum { JOB_WRITE, JOB_DELETE };

typedef struct job {
    struct job *next;
    int kind;
    uint64_t name;              /* JOB_DELETE: the file */
    uint64_t bytes;             /* JOB_DELETE: counted in disk_bytes until unlinked */
    uint64_t epoch;             /* JOB_WRITE: flushes before it was queued */
    uint32_t n;                 /* JOB_WRITE: records, one count each */
    blob_t *blobs[];            /* [n] */
} job_t;

struct td_kvtier {
    td_kvtier_config_t cfg;     /* ssd_dir: our copy in dir */
    char *dir;                  /* NULL: no SSD tier */
    int dirfd, lockfd;

    pthread_mutex_t mu;
    pthread_cond_t work;        /* the IO thread waits for jobs */
    pthread_cond_t idle;        /* wait_idle waits for an empty queue */
    pthread_t io;
    bool io_started, stop, stalled, busy;

    map_t index;                /* ent_t by hash */
    lru_t host_lru;
    flru_t ssd_lru;
    map_t evmap;                /* evnode_t by hash */
    evnode_t *ev_head, *ev_tail;

    job_t *q_head, *q_tail;
    uint64_t q_writes;          /* records in the queue's JOB_WRITEs */
    uint64_t epoch;             /* flushes so far */
    uint64_t gen;               /* files indexed so far */
    uint64_t disk_bytes;        /* index + temp file + files not yet deleted */
    td_kvtier_stats_t st;

    /* the reader threads of get_many (rmu: rb, rb_seq, rstop, helpers) */
    pthread_t *readers;
    uint32_t nreaders;
    pthread_mutex_t rmu, rbusy;
    pthread_cond_t rwork, rdone;
    rbatch_t *rb;
    uint64_t rb_seq;
    bool rstop;
    rbuf_t bufs[32];            /* run buffers kept for reuse (rmu): RUN_BUFS */
    uint32_t nbufs;
    aio_context_t aio;          /* Linux AIO for get_many's reads, or 0 */
    pthread_mutex_t aio_mu;     /* one chain at a time uses it */

    /* the prefetch thread and its runs (mu: all of it but pf, pf_aio) */
    pthread_t pf;
    bool pf_started, pf_stop;
    pthread_cond_t pf_work;     /* the thread waits for chains and free runs */
    pthread_cond_t pf_done;     /* a get_many waits for a run being read */
    pfjob_t *pf_head, *pf_tail;
    uint64_t pf_queued;         /* blocks of the queued chains */
    map_t pfmap;                /* pfblk_t by hash: blocks read or being read ahead */
    map_t pfqmap;               /* pfq_t by hash: blocks of queued chains, no run yet */
    pfrun_t *pfruns;            /* [PF_DEPTH] */
    aio_context_t pf_aio;       /* the prefetch thread's own, or 0 */
};

/* What is wrong with a record's header (expected: block `hash` of `bytes`),
 * or NULL; sets *foreign for a well-formed header of another layout or seed. */
static const char *
hdr_check(const td_kvtier_t *kt, const uint8_t *h, uint64_t hash, uint64_t bytes,
          bool *foreign)
{
    uint32_t g = get_le32(h + OFF_G);
    uint64_t payload = get_le64(h + OFF_PAYLOAD), snap = get_le64(h + OFF_SNAP);

    *foreign = false;
    if (memcmp(h, KV_MAGIC, 8) != 0)
        return "bad magic";
    if (get_le32(h + OFF_VERSION) != KV_VERSION)
        return "unknown version";
    if (g == 0 || g > MAX_G || payload == 0 || payload > MAX_PART || snap > MAX_PART)
        return "sizes out of range";
    if (rec_file_bytes(g, payload, snap) != bytes)
        return "sizes differ from the file's table";
    if (get_le64(h + OFF_HASH) != hash)
        return "holds another block";
    if (get_le64(h + OFF_LAYOUT) != kt->cfg.layout_hash || get_le64(h + OFF_SEED) != kt->cfg.seed) {
        *foreign = true;
        return "foreign (another layout hash or seed)";
    }
    return NULL;
}


static void
pack_hdr_fill(const td_kvtier_t *kt, uint8_t *tab, uint32_t n)
{
    memcpy(tab, PACK_MAGIC, 8);
    put_le32(tab + 16, KV_VERSION);
    put_le32(tab + 20, n);
    put_le64(tab + 24, kt->cfg.layout_hash);
    put_le64(tab + 32, kt->cfg.seed);
    put_le64(tab + 8, XXH3_64bits_withSeed(tab + 16, PACK_HDR - 16 + (size_t)n * PACK_ENT, 0));
}

/* What is wrong with a file header, or NULL (*foreign: another layout/seed). */
static const char *
pack_hdr_check(const td_kvtier_t *kt, const uint8_t *h, bool *foreign)
{
    uint32_t n = get_le32(h + 20);

    *foreign = false;
    if (memcmp(h, PACK_MAGIC, 8) != 0)
        return "bad magic";
    if (get_le32(h + 16) != KV_VERSION)
        return "unknown version";
    if (n == 0 || n > PACK_MAX)
        return "record count out of range";
    if (get_le64(h + 24) != kt->cfg.layout_hash || get_le64(h + 32) != kt->cfg.seed) {
        *foreign = true;
        return "foreign (another layout hash or seed)";
    }
    return NULL;
}

static void
lru_append(lru_t *l, ent_t *e)
{
    e->hl.prev = l->tail;
    e->hl.next = NULL;
    if (l->tail != NULL)
        l->tail->hl.next = e;
    else
        l->head = e;
    l->tail = e;
}

static void
lru_unlink(lru_t *l, ent_t *e)
{
    if (e->hl.prev != NULL)
        e->hl.prev->hl.next = e->hl.next;
    else
        l->head = e->hl.next;
    if (e->hl.next != NULL)
        e->hl.next->hl.prev = e->hl.prev;
    else
        l->tail = e->hl.prev;
    e->hl.prev = e->hl.next = NULL;
}

static void
lru_touch(lru_t *l, ent_t *e)
{
    if (l->tail != e) {
        lru_unlink(l, e);
        lru_append(l, e);
    }
}

static void
flru_append(flru_t *l, kfile_t *f)
{
    f->prev = l->tail;
    f->next = NULL;
    if (l->tail != NULL)
        l->tail->next = f;
    else
        l->head = f;
    l->tail = f;
}

static void
flru_unlink(flru_t *l, kfile_t *f)
{
    if (f->prev != NULL)
        f->prev->next = f->next;
    else
        l->head = f->next;
    if (f->next != NULL)
        f->next->prev = f->prev;
    else
        l->tail = f->prev;
    f->prev = f->next = NULL;
}

static void
flru_touch(flru_t *l, kfile_t *f)
{
    if (l->tail != f) {
        flru_unlink(l, f);
        flru_append(l, f);
    }
}

/* ---- Events (under mu) ------------------------------------------------------ */
static void
ev_unlink(td_kvtier_t *kt, evnode_t *ev)
{
    map_remove(&kt->evmap, &ev->node);
    if (ev->prev != NULL) ev->prev->next = ev->next; else kt->ev_head = ev->next;
    if (ev->next != NULL) ev->next->prev = ev->prev; else kt->ev_tail = ev->prev;
    free(ev);
}

static void
ev_push(td_kvtier_t *kt, uint64_t hash, int d)
{
    evnode_t *ev = (evnode_t *)map_find(&kt->evmap, hash);

    if (ev != NULL) {
        ev->net += d;
        if (ev->net == 0)
            ev_unlink(kt, ev);
        return;
    }
    ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        td_log_every(TD_LOG_ERROR, 10000, "kvtier: block %016" PRIx64 ": event lost: out of memory", hash);
        return;
    }
    ev->node.key = hash;
    ev->net = d;
    map_insert(&kt->evmap, &ev->node);
    ev->prev = kt->ev_tail;
    if (kt->ev_tail != NULL) kt->ev_tail->next = ev; else kt->ev_head = ev;
    kt->ev_tail = ev;
}

static void
ev_clear(td_kvtier_t *kt)
{
    while (kt->ev_head != NULL)
        ev_unlink(kt, kt->ev_head);
}

/* ---- Entries (under mu) ----------------------------------------------------- */
static ent_t *
ent_find(td_kvtier_t *kt, uint64_t hash)
{
    return (ent_t *)map_find(&kt->index, hash);
}

/* The entry of hash, made (and announced) if new; NULL when out of memory. */
static ent_t *
ent_get(td_kvtier_t *kt, uint64_t hash)
{
    ent_t *e = ent_find(kt, hash);

    if (e != NULL)
        return e;
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->node.key = hash;
    map_insert(&kt->index, &e->node);
    ev_push(kt, hash, +1);
    return e;
}

/* Frees an entry that neither tier holds any more (and announces it). */
static void
ent_release_if_empty(td_kvtier_t *kt, ent_t *e)
{
    if (e->host != NULL || e->file != NULL)
        return;
    map_remove(&kt->index, &e->node);
    ev_push(kt, e->node.key, -1);
    free(e);
}

static void
host_drop(td_kvtier_t *kt, ent_t *e)
{
    lru_unlink(&kt->host_lru, e);
    kt->st.host_bytes -= e->host->bytes;
    kt->st.host_records--;
    blob_unref(e->host);
    e->host = NULL;
}

/* Keeps b in the host tier under hash, evicting the least recently used. */
static void
host_insert(td_kvtier_t *kt, uint64_t hash, blob_t *b)
{
    ent_t *e = ent_find(kt, hash);

    if (b->bytes > kt->cfg.host_budget || (e != NULL && e->host != NULL))
        return;
    while (kt->st.host_bytes + b->bytes > kt->cfg.host_budget) {
        ent_t *v = kt->host_lru.head;

        host_drop(kt, v);
        ent_release_if_empty(kt, v);
    }
    if (e == NULL && (e = ent_get(kt, hash)) == NULL)
        return;
    e->host = blob_ref(b);
    lru_append(&kt->host_lru, e);
    kt->st.host_bytes += b->bytes;
    kt->st.host_records++;
}

/* A new file in the SSD index (and its records' entries). */
static void
file_index(td_kvtier_t *kt, kfile_t *f, const uint64_t *offs, const uint32_t *gs,
           const uint64_t *payloads, const uint64_t *snaps)
{
    f->gen = ++kt->gen;
    f->mtime_ns = td_clock_ns();
    flru_append(&kt->ssd_lru, f);
    kt->st.ssd_bytes += f->bytes;
    kt->st.ssd_files++;
    for (uint32_t i = 0; i < f->nrec; i++) {
        ent_t *e = ent_get(kt, f->hashes[i]);

        if (e == NULL || e->file != NULL)
            continue;   /* out of memory, or held by another file: that one serves it */
        e->file = f;
        e->off = offs[i];
        e->g = gs[i];
        e->payload = payloads[i];
        e->snapshot = snaps[i];
        kt->st.ssd_records++;
    }
}

/* Takes f out of the SSD index with its records; its bytes stay in
 * disk_bytes; the caller frees f. */
static void
file_unindex(td_kvtier_t *kt, kfile_t *f)
{
    flru_unlink(&kt->ssd_lru, f);
    kt->st.ssd_bytes -= f->bytes;
    kt->st.ssd_files--;
    for (uint32_t i = 0; i < f->nrec; i++) {
        ent_t *e = ent_find(kt, f->hashes[i]);

        if (e == NULL || e->file != f)
            continue;
        e->file = NULL;
        kt->st.ssd_records--;
        ent_release_if_empty(kt, e);
    }
}

static void
queue_push(td_kvtier_t *kt, job_t *j)
{
    bool was_empty = kt->q_head == NULL;

    j->next = NULL;
    if (kt->q_tail != NULL)
        kt->q_tail->next = j;
    else
        kt->q_head = j;
    kt->q_tail = j;
    if (j->kind == JOB_WRITE)
        kt->q_writes += j->n;
    if (was_empty)
        pthread_cond_signal(&kt->work);
}

/* Takes f out of the index and queues its deletion (j: a job the caller
 * allocated, or NULL: the file stays and its bytes stay counted; logged). */
static void
file_doom(td_kvtier_t *kt, kfile_t *f, job_t *j)
{
    file_unindex(kt, f);
    if (j == NULL) {
        td_error("kvtier %s: file %016" PRIx64 ": cannot queue its deletion: out of memory",
                 kt->dir, f->name);
    } else {
        memset(j, 0, sizeof(*j));
        j->kind = JOB_DELETE;
        j->name = f->name;
        j->bytes = f->bytes;
        queue_push(kt, j);
    }
    free(f);
}

/* ---- The IO thread ---------------------------------------------------------- */
static void
io_unlink(td_kvtier_t *kt, uint64_t name)
{
    char nm[NAME_LEN];

    rec_name(nm, name, ".kvb");
    if (unlinkat(kt->dirfd, nm, 0) != 0 && errno != ENOENT)
        td_log_every(TD_LOG_WARN, 10000, "kvtier %s: %s: unlink failed: %s", kt->dir, nm,
                     strerror(errno));
}

/* Writes the records blobs[n] as file `name` (a temp file renamed into
 * place): the file header and table, then per record its header with the
 * checksum and the blob's bytes. tab: the header and table, filled here. */
static td_status_t
io_write_file(td_kvtier_t *kt, uint64_t name, blob_t *const *blobs, uint32_t n, uint8_t *tab,
              uint64_t bytes)
{
    char tmp[NAME_LEN], nm[NAME_LEN];
    uint8_t (*hdrs)[HDR_BYTES] = malloc((size_t)n * HDR_BYTES);
    struct iovec *iov = malloc((1 + 2 * (size_t)n) * sizeof(*iov));
    uint64_t tab_bytes = PACK_HDR + (uint64_t)n * PACK_ENT, off = tab_bytes, done = 0;
    int fd = -1, niov = 0, err = 0;

    rec_name(tmp, name, ".tmp");
    rec_name(nm, name, ".kvb");
    if (hdrs == NULL || iov == NULL) {
        err = ENOMEM;
        goto cleanup;
    }
    iov[niov++] = (struct iovec){ tab, tab_bytes };
    for (uint32_t i = 0; i < n; i++) {
        const blob_t *b = blobs[i];
        uint8_t *e = tab + PACK_HDR + (size_t)i * PACK_ENT;

        memcpy(hdrs[i], b->data, HDR_BYTES);
        put_le64(hdrs[i] + OFF_CSUM, rec_checksum(hdrs[i], blob_tokens(b), b->g, blob_payload(b),
                                                  b->payload_bytes, blob_snapshot(b),
                                                  b->snapshot_bytes));
        put_le64(e, get_le64(b->data + OFF_HASH));
        put_le64(e + 8, off);
        put_le64(e + 16, b->payload_bytes);
        put_le64(e + 24, b->snapshot_bytes);
        put_le32(e + 32, b->g);
        put_le32(e + 36, 0);
        iov[niov++] = (struct iovec){ hdrs[i], HDR_BYTES };
        iov[niov++] = (struct iovec){ (void *)(b->data + HDR_BYTES), b->bytes - HDR_BYTES };
        off += b->bytes;
    }
    pack_hdr_fill(kt, tab, n);
    fd = openat(kt->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        goto cleanup;
    }
    for (int first = 0; done < bytes;) {
        int cnt = niov - first < IOV_MAX ? niov - first : IOV_MAX;
        ssize_t w = pwritev(fd, iov + first, cnt, (off_t)done);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            err = w < 0 ? errno : EIO;
            goto cleanup;
        }
        done += (uint64_t)w;
        while (first < niov && (uint64_t)w >= iov[first].iov_len) {   /* skip what was written */
            w -= (ssize_t)iov[first].iov_len;
            first++;
        }
        if (first < niov && w > 0) {
            iov[first].iov_base = (uint8_t *)iov[first].iov_base + w;
            iov[first].iov_len -= (size_t)w;
        }
    }
    if (kt->cfg.ssd_fsync && fsync(fd) != 0) {
        err = errno;
        goto cleanup;
    }
    if (close(fd) != 0) {
        fd = -1;
        err = errno;
        goto cleanup;
    }
    fd = -1;
    if (renameat(kt->dirfd, tmp, kt->dirfd, nm) != 0)
        err = errno;
cleanup:
    if (fd >= 0)
        close(fd);
    if (err != 0) {
        unlinkat(kt->dirfd, tmp, 0);
        td_log_every(TD_LOG_WARN, 10000, "kvtier %s: %s: write failed: %s", kt->dir, nm,
                     strerror(err));
    }
    free(iov);
    free(hdrs);
    return err == 0 ? TD_OK : td_status_from_errno(err);
}

/* Deletes files until `need` more bytes fit within the budget: the least
 * recently used, then (if still short) the queued deletions. Called and
 * returns with mu held; false when they do not fit. */
static bool
io_make_room(td_kvtier_t *kt, uint64_t need)
{
    uint64_t freeing = 0;
    size_t nv = 0, cap = 0;
    uint64_t *victims = NULL;
    job_t *dels = NULL;

    while (kt->disk_bytes - freeing + need > kt->cfg.ssd_budget && kt->ssd_lru.head != NULL) {
        kfile_t *v = kt->ssd_lru.head;

        if (nv == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            uint64_t *nvict = realloc(victims, ncap * sizeof(*victims));

            if (nvict == NULL)
                break;
            victims = nvict;
            cap = ncap;
        }
        victims[nv++] = v->name;
        freeing += v->bytes;
        file_unindex(kt, v);
        free(v);
    }
    if (kt->disk_bytes - freeing + need > kt->cfg.ssd_budget) {
        job_t **p = &kt->q_head;

        kt->q_tail = NULL;
        while (*p != NULL) {
            job_t *d = *p;

            if (d->kind != JOB_DELETE) {
                kt->q_tail = d;
                p = &d->next;
                continue;
            }
            *p = d->next;
            d->next = dels;
            dels = d;
            freeing += d->bytes;
        }
    }
    if (nv > 0 || dels != NULL) {
        pthread_mutex_unlock(&kt->mu);
        for (size_t i = 0; i < nv; i++)
            io_unlink(kt, victims[i]);
        for (job_t *d = dels; d != NULL; d = d->next)
            io_unlink(kt, d->name);
        pthread_mutex_lock(&kt->mu);
        kt->disk_bytes -= freeing;
    }
    free(victims);
    while (dels != NULL) {
        job_t *d = dels;

        dels = d->next;
        free(d);
    }
    return kt->disk_bytes + need <= kt->cfg.ssd_budget;
}

/* Writes a job's records not on SSD yet as one file. mu held. */
static void
io_write(td_kvtier_t *kt, job_t *j)
{
    blob_t **keep = malloc(j->n * sizeof(*keep));
    uint64_t *offs = malloc(j->n * sizeof(*offs)), *pays = malloc(j->n * sizeof(*pays));
    uint64_t *snaps = malloc(j->n * sizeof(*snaps));
    uint32_t *gs = malloc(j->n * sizeof(*gs));
    uint8_t *tab = NULL;
    kfile_t *f = NULL;
    uint32_t k = 0;
    uint64_t need, name;

    if (keep == NULL || offs == NULL || pays == NULL || snaps == NULL || gs == NULL)
        goto dropped;
    if (j->epoch != kt->epoch)
        goto cleanup;
    for (uint32_t i = 0; i < j->n; i++) {
        uint64_t h = get_le64(j->blobs[i]->data + OFF_HASH);
        ent_t *e = ent_find(kt, h);
        bool dup = e != NULL && e->file != NULL;

        for (uint32_t m = 0; m < k && !dup; m++)
            dup = get_le64(keep[m]->data + OFF_HASH) == h;
        if (!dup)
            keep[k++] = j->blobs[i];
    }
    if (k == 0)
        goto cleanup;
    need = PACK_HDR + (uint64_t)k * PACK_ENT;
    for (uint32_t i = 0; i < k; i++) {
        offs[i] = need;
        pays[i] = keep[i]->payload_bytes;
        snaps[i] = keep[i]->snapshot_bytes;
        gs[i] = keep[i]->g;
        need += keep[i]->bytes;
    }
    name = get_le64(keep[0]->data + OFF_HASH);
    if (need > kt->cfg.ssd_budget || !io_make_room(kt, need))
        goto dropped;
    if ((tab = malloc(PACK_HDR + (size_t)k * PACK_ENT)) == NULL ||
        (f = malloc(sizeof(*f) + k * sizeof(uint64_t))) == NULL)
        goto dropped;
    kt->disk_bytes += need;   /* the temp file counts from its first byte */
    pthread_mutex_unlock(&kt->mu);
    td_status_t st = io_write_file(kt, name, keep, k, tab, need);
    pthread_mutex_lock(&kt->mu);
    if (st != TD_OK) {
        kt->disk_bytes -= need;
        goto dropped;
    }
    kt->st.bytes_written += need;
    if (j->epoch != kt->epoch) {   /* flushed while it was written */
        pthread_mutex_unlock(&kt->mu);
        io_unlink(kt, name);
        pthread_mutex_lock(&kt->mu);
        kt->disk_bytes -= need;
        goto cleanup;
    }
    f->name = name;
    f->bytes = need;
    f->nrec = k;
    for (uint32_t i = 0; i < k; i++)
        f->hashes[i] = get_le64(keep[i]->data + OFF_HASH);
    file_index(kt, f, offs, gs, pays, snaps);
    f = NULL;
    goto cleanup;
dropped:
    kt->st.writes_dropped += k > 0 ? k : j->n;
cleanup:
    free(f);
    free(tab);
    free(gs);
    free(snaps);
    free(pays);
    free(offs);
    free(keep);
}

static void *
io_main(void *arg)
{
    td_kvtier_t *kt = arg;

    pthread_mutex_lock(&kt->mu);
    for (;;) {
        while (!kt->stop && (kt->stalled || kt->q_head == NULL)) {
            kt->busy = false;
            pthread_cond_broadcast(&kt->idle);
            pthread_cond_wait(&kt->work, &kt->mu);
        }
        if (kt->q_head == NULL)
            break;   /* stopping, nothing left */
        job_t *j = kt->q_head;

        kt->q_head = j->next;
        if (kt->q_head == NULL)
            kt->q_tail = NULL;
        kt->busy = true;
        if (j->kind == JOB_DELETE) {
            pthread_mutex_unlock(&kt->mu);
            io_unlink(kt, j->name);
            pthread_mutex_lock(&kt->mu);
            kt->disk_bytes -= j->bytes;
        } else {
            kt->q_writes -= j->n;
            io_write(kt, j);
            for (uint32_t i = 0; i < j->n; i++)
                blob_unref(j->blobs[i]);
        }
        free(j);
    }
    kt->busy = false;
    pthread_cond_broadcast(&kt->idle);
    pthread_mutex_unlock(&kt->mu);
    return NULL;
}

/* ---- Startup scan ----------------------------------------------------------- */
typedef struct {
    kfile_t *f;
    uint64_t *offs, *pays, *snaps;
    uint32_t *gs;
    struct timespec mtime;
} found_t;

static int
found_cmp(const void *a, const void *b)
{
    const found_t *x = a, *y = b;

    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return 0;
}

static void
found_free(found_t *fd)
{
    free(fd->f);
    free(fd->offs);
    free(fd->pays);
    free(fd->snaps);
    free(fd->gs);
}

/* Parses "<16 hex>" + ext; true with *hash. */
static bool
name_parse(const char *name, const char *ext, uint64_t *hash)
{
    uint64_t h = 0;

    for (int i = 0; i < 16; i++) {
        char c = name[i];
        unsigned d;

        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else return false;
        h = (h << 4) | d;
    }
    if (strcmp(name + 16, ext) != 0)
        return false;
    *hash = h;
    return true;
}

/* Reads and checks the header and table of an open file `name` of `size`
 * bytes into *out; what is wrong, or NULL. *foreign: another layout/seed. */
static const char *
scan_file(td_kvtier_t *kt, int fd, uint64_t name, uint64_t size, found_t *out, bool *foreign)
{
    uint8_t hdr[PACK_HDR];
    uint8_t *tab = NULL;
    uint32_t n;
    uint64_t tab_bytes, off;
    const char *why = NULL;

    *foreign = false;
    if (size < PACK_HDR)
        return "shorter than a header";
    if (pread(fd, hdr, PACK_HDR, 0) != PACK_HDR)
        return "header read failed";
    if ((why = pack_hdr_check(kt, hdr, foreign)) != NULL)
        return why;
    n = get_le32(hdr + 20);
    tab_bytes = PACK_HDR + (uint64_t)n * PACK_ENT;
    if (tab_bytes > size)
        return "table longer than the file (truncated?)";
    if ((tab = malloc(tab_bytes)) == NULL)
        return "out of memory";
    out->f = malloc(sizeof(*out->f) + n * sizeof(uint64_t));
    out->offs = malloc(n * sizeof(uint64_t));
    out->pays = malloc(n * sizeof(uint64_t));
    out->snaps = malloc(n * sizeof(uint64_t));
    out->gs = malloc(n * sizeof(uint32_t));
    if (!out->f || !out->offs || !out->pays || !out->snaps || !out->gs) {
        why = "out of memory";
        goto cleanup;
    }
    if (pread(fd, tab, tab_bytes, 0) != (ssize_t)tab_bytes) {
        why = "table read failed";
        goto cleanup;
    }
    if (XXH3_64bits_withSeed(tab + 16, tab_bytes - 16, 0) != get_le64(tab + 8)) {
        why = "table checksum mismatch";
        goto cleanup;
    }
    off = tab_bytes;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = tab + PACK_HDR + (size_t)i * PACK_ENT;
        uint64_t h = get_le64(e), pay = get_le64(e + 16), snap = get_le64(e + 24);
        uint32_t g = get_le32(e + 32);

        if (h == 0 || g == 0 || g > MAX_G || pay == 0 || pay > MAX_PART || snap > MAX_PART ||
            get_le64(e + 8) != off || (i == 0 && h != name)) {
            why = i == 0 && h != name ? "holds another block (hash differs from its name)"
                                      : "table entry out of range";
            goto cleanup;
        }
        out->f->hashes[i] = h;
        out->offs[i] = off;
        out->pays[i] = pay;
        out->snaps[i] = snap;
        out->gs[i] = g;
        off += rec_file_bytes(g, pay, snap);
    }
    if (off != size) {
        why = "sizes differ from the file's size (truncated?)";
        goto cleanup;
    }
    out->f->name = name;
    out->f->bytes = size;
    out->f->nrec = n;
cleanup:
    free(tab);
    return why;
}

static td_status_t
scan_dir(td_kvtier_t *kt)
{
    int fd2 = dup(kt->dirfd);
    DIR *d;
    struct dirent *de;
    found_t *found = NULL;
    size_t n = 0, cap = 0, deleted = 0;
    td_status_t st = TD_OK;

    if (fd2 < 0 || (d = fdopendir(fd2)) == NULL) {
        td_error("kvtier %s: cannot read the directory: %s", kt->dir, strerror(errno));
        if (fd2 >= 0)
            close(fd2);
        return td_status_from_errno(errno);
    }
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        uint64_t name;
        struct stat sb;
        const char *why = NULL;
        bool foreign = false;
        found_t one = { 0 };
        int fd;

        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0 || strcmp(nm, "LOCK") == 0)
            continue;
        if (name_parse(nm, ".tmp", &name)) {
            td_info("kvtier %s: %s: unfinished write; deleted", kt->dir, nm);
            unlinkat(kt->dirfd, nm, 0);
            continue;
        }
        if (!name_parse(nm, ".kvb", &name)) {
            td_warn("kvtier %s: %s: not a cache file; left alone", kt->dir, nm);
            continue;
        }
        fd = openat(kt->dirfd, nm, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 || fstat(fd, &sb) != 0)
            why = "cannot open";
        else if (!S_ISREG(sb.st_mode))
            why = "not a regular file";
        else
            why = scan_file(kt, fd, name, (uint64_t)sb.st_size, &one, &foreign);
        if (fd >= 0)
            close(fd);
        if (why == NULL && n == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            found_t *nf = realloc(found, ncap * sizeof(*found));

            if (nf == NULL) {   /* the file is fine: left for a later start */
                td_error("kvtier %s: %s: out of memory; left out of the index", kt->dir, nm);
                found_free(&one);
                continue;
            }
            found = nf;
            cap = ncap;
        }
        if (why != NULL && strcmp(why, "out of memory") == 0) {
            td_error("kvtier %s: %s: out of memory; left out of the index", kt->dir, nm);
            found_free(&one);
            continue;
        }
        if (why != NULL) {
            found_free(&one);
            td_warn("kvtier %s: %s: %s; deleted", kt->dir, nm, why);
            kt->st.corrupt++;
            unlinkat(kt->dirfd, nm, 0);
            deleted++;
            continue;
        }
        one.mtime = sb.st_mtim;
        found[n++] = one;
    }
    if (n > 1)
        qsort(found, n, sizeof(*found), found_cmp);
    for (size_t i = 0; i < n; i++) {
        file_index(kt, found[i].f, found[i].offs, found[i].gs, found[i].pays, found[i].snaps);
        kt->disk_bytes += found[i].f->bytes;
        found[i].f = NULL;
        found_free(&found[i]);
    }
    while (kt->disk_bytes > kt->cfg.ssd_budget) {
        kfile_t *v = kt->ssd_lru.head;

        file_unindex(kt, v);
        io_unlink(kt, v->name);
        kt->disk_bytes -= v->bytes;
        free(v);
        deleted++;
    }
    td_info("kvtier %s: %" PRIu64 " records in %" PRIu64 " files of %" PRIu64
            " bytes found, %zu files deleted", kt->dir, kt->st.ssd_records, kt->st.ssd_files,
            kt->st.ssd_bytes, deleted);
    free(found);
    closedir(d);
    return st;
}

/* ---- Create and destroy ----------------------------------------------------- */
static void *reader_main(void *arg);   /* below, with get_many */
static void *pf_main(void *arg);       /* below, with prefetch */
static pfrun_t *pf_runs_new(void);
static void pf_runs_free(td_kvtier_t *kt);
static void pf_flush(td_kvtier_t *kt);

static td_status_t
ssd_open(td_kvtier_t *kt)
{
    if (mkdir(kt->dir, 0700) != 0 && errno != EEXIST) {
        td_error("kvtier %s: cannot create the directory: %s", kt->dir, strerror(errno));
        return td_status_from_errno(errno);
    }
    kt->dirfd = open(kt->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (kt->dirfd < 0) {
        td_error("kvtier %s: cannot open the directory: %s", kt->dir, strerror(errno));
        return td_status_from_errno(errno);
    }
    kt->lockfd = openat(kt->dirfd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (kt->lockfd < 0) {
        td_error("kvtier %s: cannot open LOCK: %s", kt->dir, strerror(errno));
        return td_status_from_errno(errno);
    }
    if (flock(kt->lockfd, LOCK_EX | LOCK_NB) != 0) {
        td_error("kvtier %s: in use by another process", kt->dir);
        return TD_ERR_BUSY;
    }
    return scan_dir(kt);
}

static void
kt_free(td_kvtier_t *kt)
{
    for (job_t *j = kt->q_head, *next; j != NULL; j = next) {
        next = j->next;
        for (uint32_t i = 0; j->kind == JOB_WRITE && i < j->n; i++)
            blob_unref(j->blobs[i]);
        free(j);
    }
    for (kfile_t *f = kt->ssd_lru.head, *next; f != NULL; f = next) {
        next = f->next;
        free(f);
    }
    if (kt->index.b != NULL)
        for (size_t i = 0; i < kt->index.nb; i++)
            for (mnode_t *n = kt->index.b[i], *next; n != NULL; n = next) {
                ent_t *e = (ent_t *)n;

                next = n->next;
                blob_unref(e->host);
                free(e);
            }
    if (kt->evmap.b != NULL)
        ev_clear(kt);
    free(kt->index.b);
    free(kt->evmap.b);
    free(kt->pfmap.b);
    free(kt->pfqmap.b);
    pf_runs_free(kt);
    if (kt->lockfd >= 0)
        close(kt->lockfd);
    if (kt->dirfd >= 0)
        close(kt->dirfd);
    for (uint32_t i = 0; i < kt->nbufs; i++)
        free(kt->bufs[i].p);
    if (kt->aio != 0)
        syscall(SYS_io_destroy, kt->aio);
    if (kt->pf_aio != 0)
        syscall(SYS_io_destroy, kt->pf_aio);
    pthread_cond_destroy(&kt->pf_done);
    pthread_cond_destroy(&kt->pf_work);
    pthread_mutex_destroy(&kt->aio_mu);
    free(kt->readers);
    pthread_cond_destroy(&kt->rdone);
    pthread_cond_destroy(&kt->rwork);
    pthread_mutex_destroy(&kt->rbusy);
    pthread_mutex_destroy(&kt->rmu);
    pthread_cond_destroy(&kt->idle);
    pthread_cond_destroy(&kt->work);
    pthread_mutex_destroy(&kt->mu);
    free(kt->dir);
    free(kt);
}

td_status_t
td_kvtier_create(const td_kvtier_config_t *cfg, td_kvtier_t **out)
{
    td_kvtier_t *kt = calloc(1, sizeof(*kt));
    td_status_t st;
    int rc;

    if (kt == NULL)
        return TD_ERR_NOMEM;
    kt->cfg = *cfg;
    kt->cfg.ssd_dir = NULL;
    if (kt->cfg.queue_cap == 0)
        kt->cfg.queue_cap = 256;
    if (kt->cfg.pack_records == 0)
        kt->cfg.pack_records = 64;
    if (kt->cfg.pack_records > PACK_MAX)
        kt->cfg.pack_records = PACK_MAX;
    kt->dirfd = kt->lockfd = -1;
    pthread_mutex_init(&kt->mu, NULL);
    pthread_cond_init(&kt->work, NULL);
    pthread_cond_init(&kt->idle, NULL);
    pthread_mutex_init(&kt->rmu, NULL);
    pthread_mutex_init(&kt->rbusy, NULL);
    pthread_cond_init(&kt->rwork, NULL);
    pthread_cond_init(&kt->rdone, NULL);
    pthread_mutex_init(&kt->aio_mu, NULL);
    td_clock_cond_init(&kt->pf_work);
    td_clock_cond_init(&kt->pf_done);
    if ((st = map_init(&kt->index)) != TD_OK || (st = map_init(&kt->evmap)) != TD_OK ||
        (st = map_init(&kt->pfmap)) != TD_OK || (st = map_init(&kt->pfqmap)) != TD_OK)
        goto err_free;
    kt->st.host_budget = cfg->host_budget;
    if (cfg->ssd_dir != NULL && cfg->ssd_dir[0] != '\0') {
        kt->st.ssd_budget = cfg->ssd_budget;
        if ((kt->dir = strdup(cfg->ssd_dir)) == NULL) {
            st = TD_ERR_NOMEM;
            goto err_free;
        }
        if ((st = ssd_open(kt)) != TD_OK)
            goto err_free;
        rc = pthread_create(&kt->io, NULL, io_main, kt);
        if (rc != 0) {
            td_error("kvtier %s: cannot start the IO thread: %s", kt->dir, strerror(rc));
            st = td_status_from_errno(rc);
            goto err_free;
        }
        kt->io_started = true;
        if (syscall(SYS_io_setup, (long)AIO_DEPTH, &kt->aio) != 0) {
            td_info("kvtier %s: no Linux AIO (%s): chains are read by threads", kt->dir,
                    strerror(errno));
            kt->aio = 0;
        }
        if (cfg->read_threads > 0 &&
            (kt->readers = calloc(cfg->read_threads, sizeof(*kt->readers))) == NULL) {
            st = TD_ERR_NOMEM;
            goto err_stop;
        }
        for (uint32_t i = 0; i < cfg->read_threads; i++) {
            if ((rc = pthread_create(&kt->readers[i], NULL, reader_main, kt)) != 0) {
                td_error("kvtier %s: cannot start a reader thread: %s", kt->dir, strerror(rc));
                st = td_status_from_errno(rc);
                goto err_stop;
            }
            kt->nreaders++;
        }
        if ((kt->pfruns = pf_runs_new()) == NULL) {
            st = TD_ERR_NOMEM;
            goto err_stop;
        }
        if (syscall(SYS_io_setup, (long)PF_DEPTH, &kt->pf_aio) != 0)
            kt->pf_aio = 0;   /* then the prefetch thread reads run by run */
        if ((rc = pthread_create(&kt->pf, NULL, pf_main, kt)) != 0) {
            td_error("kvtier %s: cannot start the prefetch thread: %s", kt->dir, strerror(rc));
            st = td_status_from_errno(rc);
            goto err_stop;
        }
        kt->pf_started = true;
    }
    *out = kt;
    return TD_OK;

err_stop:
    td_kvtier_destroy(kt);
    return st;
err_free:
    kt_free(kt);
    return st;
}

void
td_kvtier_destroy(td_kvtier_t *kt)
{
    if (kt == NULL)
        return;
    if (kt->pf_started) {
        pthread_mutex_lock(&kt->mu);
        kt->pf_stop = true;
        pthread_cond_signal(&kt->pf_work);
        pthread_mutex_unlock(&kt->mu);
        pthread_join(kt->pf, NULL);
    }
    pthread_mutex_lock(&kt->rmu);
    kt->rstop = true;
    pthread_cond_broadcast(&kt->rwork);
    pthread_mutex_unlock(&kt->rmu);
    for (uint32_t i = 0; i < kt->nreaders; i++)
        pthread_join(kt->readers[i], NULL);
    if (kt->io_started) {
        pthread_mutex_lock(&kt->mu);
        kt->stop = true;
        kt->stalled = false;
        pthread_cond_signal(&kt->work);
        pthread_mutex_unlock(&kt->mu);
        pthread_join(kt->io, NULL);
    }
    kt_free(kt);
}

/* ---- Put -------------------------------------------------------------------- */
static bool
rec_valid(const td_kvrec_t *r)
{
    return r->hash != 0 && r->block_tokens > 0 && r->block_tokens <= MAX_G &&
           r->tokens != NULL && r->payload != NULL && r->payload_bytes > 0 &&
           r->payload_bytes <= MAX_PART && r->snapshot_bytes <= MAX_PART &&
           (r->snapshot == NULL) == (r->snapshot_bytes == 0);
}

static blob_t *
blob_of(td_kvtier_t *kt, const td_kvrec_t *rec)
{
    blob_t *b = blob_alloc(rec->block_tokens, rec->payload_bytes, rec->snapshot_bytes);

    if (b == NULL)
        return NULL;
    hdr_fill(b->data, &kt->cfg, rec->hash, rec->parent, rec->end, rec->block_tokens,
             rec->payload_bytes, rec->snapshot_bytes);
    memcpy(b->data + HDR_BYTES, rec->tokens, (size_t)rec->block_tokens * 4);
    memcpy((uint8_t *)blob_payload(b), rec->payload, rec->payload_bytes);
    if (rec->snapshot_bytes > 0)
        memcpy((uint8_t *)blob_snapshot(b), rec->snapshot, rec->snapshot_bytes);
    return b;
}

/* put_many for at most pack_records records, into the tiers of the mask:
 * one file. */
static td_status_t
put_pack(td_kvtier_t *kt, const td_kvrec_t *recs, uint32_t n, unsigned tiers)
{
    blob_t *blobs[PACK_MAX] = { NULL };
    bool want_host[PACK_MAX], want_ssd[PACK_MAX];
    uint32_t nssd = 0;
    job_t *j = NULL;
    td_status_t st = TD_OK;

    pthread_mutex_lock(&kt->mu);
    for (uint32_t i = 0; i < n; i++) {
        const td_kvrec_t *r = &recs[i];
        uint64_t bytes = rec_file_bytes(r->block_tokens, r->payload_bytes, r->snapshot_bytes);
        ent_t *e = ent_find(kt, r->hash);

        if (e != NULL && e->host != NULL)
            lru_touch(&kt->host_lru, e);
        if (e != NULL && e->file != NULL)
            flru_touch(&kt->ssd_lru, e->file);
        want_host[i] = (tiers & TD_KVTIER_HOST) && !(e != NULL && e->host != NULL) &&
                       bytes <= kt->cfg.host_budget;
        want_ssd[i] = (tiers & TD_KVTIER_SSD) && kt->dir != NULL &&
                      !(e != NULL && e->file != NULL);
        if (want_ssd[i] && e != NULL && e->host != NULL)
            blobs[i] = blob_ref(e->host);
        nssd += want_ssd[i];
    }
    if (nssd > 0 && kt->q_writes + nssd > kt->cfg.queue_cap) {
        kt->st.writes_dropped += nssd;
        for (uint32_t i = 0; i < n; i++)
            want_ssd[i] = false;
        nssd = 0;
    }
    pthread_mutex_unlock(&kt->mu);

    for (uint32_t i = 0; i < n; i++)
        if (blobs[i] == NULL && (want_host[i] || want_ssd[i]) &&
            (blobs[i] = blob_of(kt, &recs[i])) == NULL)
            goto err_nomem;
    if (nssd > 0 && (j = calloc(1, sizeof(*j) + nssd * sizeof(blob_t *))) == NULL)
        goto err_nomem;

    pthread_mutex_lock(&kt->mu);
    for (uint32_t i = 0; i < n; i++)
        if (want_host[i])
            host_insert(kt, recs[i].hash, blobs[i]);
    if (j != NULL) {
        if (kt->q_writes + nssd > kt->cfg.queue_cap) {
            kt->st.writes_dropped += nssd;
            free(j);
        } else {
            j->kind = JOB_WRITE;
            j->epoch = kt->epoch;
            for (uint32_t i = 0; i < n; i++)
                if (want_ssd[i])
                    j->blobs[j->n++] = blob_ref(blobs[i]);
            queue_push(kt, j);
        }
    }
    pthread_mutex_unlock(&kt->mu);
    goto cleanup;

err_nomem:
    td_log_every(TD_LOG_ERROR, 10000, "kvtier: block %016" PRIx64 ": put: out of memory",
                 recs[0].hash);
    st = TD_ERR_NOMEM;
cleanup:
    for (uint32_t i = 0; i < n; i++)
        blob_unref(blobs[i]);
    return st;
}

td_status_t
td_kvtier_put_many(td_kvtier_t *kt, const td_kvrec_t *recs, size_t n)
{
    return td_kvtier_put_many_to(kt, recs, n, TD_KVTIER_HOST | TD_KVTIER_SSD);
}

td_status_t
td_kvtier_put_many_to(td_kvtier_t *kt, const td_kvrec_t *recs, size_t n, unsigned tiers)
{
    for (size_t i = 0; i < n; i++)
        if (!rec_valid(&recs[i])) {
            td_warn("kvtier: put of a malformed record (block %016" PRIx64 ")", recs[i].hash);
            return TD_ERR_INVALID;
        }
    for (size_t i = 0; i < n; i += kt->cfg.pack_records) {
        size_t k = n - i < kt->cfg.pack_records ? n - i : kt->cfg.pack_records;
        td_status_t st = put_pack(kt, recs + i, (uint32_t)k, tiers);

        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

td_status_t
td_kvtier_put(td_kvtier_t *kt, const td_kvrec_t *rec)
{
    if (rec == NULL) {
        td_warn("kvtier: put of no record");
        return TD_ERR_INVALID;
    }
    return td_kvtier_put_many(kt, rec, 1);
}

unsigned
td_kvtier_has(td_kvtier_t *kt, uint64_t hash)
{
    unsigned tiers = 0;

    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (e != NULL)
        tiers = (e->host != NULL ? TD_KVTIER_HOST : 0) | (e->file != NULL ? TD_KVTIER_SSD : 0);
    pthread_mutex_unlock(&kt->mu);
    return tiers;
}

/* ---- Get -------------------------------------------------------------------- */
static bool
out_fits(const td_kvtier_out_t *out, uint64_t payload, uint64_t snap, uint64_t hash)
{
    if (payload <= out->payload_cap && snap <= out->snapshot_cap &&
        (snap == 0 || out->snapshot != NULL))
        return true;
    td_warn("kvtier: block %016" PRIx64 ": record of %" PRIu64 "+%" PRIu64
            " bytes: the caller's buffers hold %" PRIu64 "+%" PRIu64, hash, payload, snap,
            out->payload_cap, out->snapshot_cap);
    return false;
}

static td_status_t
get_host(td_kvtier_t *kt, blob_t *b, uint64_t hash, const int32_t *expect, uint32_t g,
         td_kvtier_out_t *out)
{
    if (b->g != g || memcmp(blob_tokens(b), expect, (size_t)g * 4) != 0) {
        td_warn("kvtier: block %016" PRIx64 ": host record holds other tokens (hash collision); dropped",
                hash);
        pthread_mutex_lock(&kt->mu);
        ent_t *e = ent_find(kt, hash);

        if (e != NULL && e->host == b) {
            host_drop(kt, e);
            ent_release_if_empty(kt, e);
        }
        kt->st.misses++;
        pthread_mutex_unlock(&kt->mu);
        return TD_ERR_NOT_FOUND;
    }
    memcpy(out->payload, blob_payload(b), b->payload_bytes);
    if (b->snapshot_bytes > 0)
        memcpy(out->snapshot, blob_snapshot(b), b->snapshot_bytes);
    out->payload_bytes = b->payload_bytes;
    out->snapshot_bytes = b->snapshot_bytes;
    out->tier = TD_KVTIER_HOST;
    pthread_mutex_lock(&kt->mu);
    kt->st.hits_host++;
    pthread_mutex_unlock(&kt->mu);
    return TD_OK;
}

/* Drops the SSD file made at gen (if it is still indexed): queued for
 * deletion, or (gone) its bytes leave the count. mu not held. */
static void
ssd_reject(td_kvtier_t *kt, uint64_t hash, uint64_t gen, bool gone)
{
    job_t *j = gone ? NULL : malloc(sizeof(*j));

    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (!gone)
        kt->st.corrupt++;
    kt->st.misses++;
    if (e != NULL && e->file != NULL && e->file->gen == gen) {
        kfile_t *f = e->file;

        if (gone) {
            file_unindex(kt, f);
            kt->disk_bytes -= f->bytes;
            free(f);
        } else {
            file_doom(kt, f, j);
            j = NULL;
        }
    }
    pthread_mutex_unlock(&kt->mu);
    free(j);
}

/* A block's place on SSD, copied under mu. */
typedef struct {
    uint64_t name, gen, off, payload, snap;
    uint32_t g;
} where_t;

/* Where e's record is (e->file set; mu held). */
static where_t
ent_where(const ent_t *e)
{
    return (where_t){ e->file->name, e->file->gen, e->off, e->payload, e->snapshot, e->g };
}

/* Checks a record read from SSD (hdr, tokens: copies or the read buffer;
 * out: payload and snapshot filled; why: a read failure or NULL) against
 * w and the expected tokens; on success promotes it to the host tier (and
 * sets the file's mtime through fd at most once a minute). */
static td_status_t
ssd_finish(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
           td_kvtier_out_t *out, const where_t *w, const uint8_t *hdr, const void *tokens,
           const char *why, int fd)
{
    uint64_t bytes = rec_file_bytes(w->g, w->payload, w->snap);
    char name[NAME_LEN];
    bool foreign, touch = false;
    blob_t *b = NULL;

    rec_name(name, w->name, ".kvb");
    if (why != NULL)
        ;
    else if ((why = hdr_check(kt, hdr, hash, bytes, &foreign)) != NULL)
        ;
    else if (get_le32(hdr + OFF_G) != w->g || get_le64(hdr + OFF_PAYLOAD) != w->payload ||
             get_le64(hdr + OFF_SNAP) != w->snap)
        why = "sizes differ from the file's table";
    else if (rec_checksum(hdr, tokens, w->g, out->payload, w->payload, out->snapshot, w->snap) !=
             get_le64(hdr + OFF_CSUM))
        why = "checksum mismatch";
    else if (w->g != g || memcmp(tokens, expect, (size_t)g * 4) != 0)
        why = "holds other tokens (hash collision)";
    if (why != NULL) {
        td_warn("kvtier %s: %s: block %016" PRIx64 " at %" PRIu64 ": %s; file deleted", kt->dir,
                name, hash, w->off, why);
        ssd_reject(kt, hash, w->gen, false);
        return TD_ERR_NOT_FOUND;
    }
    out->payload_bytes = w->payload;
    out->snapshot_bytes = w->snap;
    out->tier = TD_KVTIER_SSD;
    if (bytes <= kt->cfg.host_budget && (b = blob_alloc(w->g, w->payload, w->snap)) != NULL) {
        memcpy(b->data, hdr, HDR_BYTES);
        memcpy(b->data + HDR_BYTES, tokens, (size_t)w->g * 4);
        memcpy((uint8_t *)blob_payload(b), out->payload, w->payload);
        if (w->snap > 0)
            memcpy((uint8_t *)blob_snapshot(b), out->snapshot, w->snap);
    }
    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (e != NULL && e->file != NULL && e->file->gen == w->gen) {
        uint64_t now = td_clock_ns();

        flru_touch(&kt->ssd_lru, e->file);
        if (now - e->file->mtime_ns > MTIME_EVERY_NS) {
            e->file->mtime_ns = now;
            touch = true;
        }
    }
    kt->st.hits_ssd++;
    kt->st.bytes_read += bytes;
    if (b != NULL)
        host_insert(kt, hash, b);
    pthread_mutex_unlock(&kt->mu);
    blob_unref(b);
    if (touch && fd >= 0)   /* the LRU order a restart sees; best effort */
        futimens(fd, NULL);
    else if (touch)
        utimensat(kt->dirfd, name, NULL, 0);
    return TD_OK;
}

/* Reads hash's record from its file into out and checks it. */
static td_status_t
get_ssd(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
        td_kvtier_out_t *out, const where_t *w)
{
    char name[NAME_LEN];
    uint8_t hdr[HDR_BYTES];
    int32_t stack_tokens[512];
    int32_t *tokens = stack_tokens;
    uint64_t bytes = rec_file_bytes(w->g, w->payload, w->snap);
    const char *why = NULL;
    td_status_t st;
    ssize_t r;
    int fd;

    rec_name(name, w->name, ".kvb");
    if ((fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC)) < 0) {
        int err = errno;

        td_warn("kvtier %s: %s: cannot open: %s", kt->dir, name, strerror(err));
        if (err == ENOENT) {
            ssd_reject(kt, hash, w->gen, true);
        } else {
            pthread_mutex_lock(&kt->mu);
            kt->st.misses++;
            pthread_mutex_unlock(&kt->mu);
        }
        return TD_ERR_NOT_FOUND;
    }
    if (w->g > 512 && (tokens = malloc((size_t)w->g * 4)) == NULL) {
        close(fd);
        return TD_ERR_NOMEM;
    }
    struct iovec iov[4] = {
        { hdr, HDR_BYTES }, { tokens, (size_t)w->g * 4 }, { out->payload, w->payload },
        { out->snapshot, w->snap },
    };

    do
        r = preadv(fd, iov, w->snap > 0 ? 4 : 3, (off_t)w->off);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        why = "read failed";
    else if ((uint64_t)r != bytes)
        why = "short read (truncated)";
    st = ssd_finish(kt, hash, expect, g, out, w, hdr, tokens, why, fd);
    close(fd);
    if (tokens != stack_tokens)
        free(tokens);
    return st;
}

/* Where hash is: its host copy (*host, one count) or its SSD record (*w);
 * false when neither (counted as a miss unless quiet). */
static bool
get_where(td_kvtier_t *kt, uint64_t hash, blob_t **host, where_t *w, bool quiet)
{
    bool found = true;

    *host = NULL;
    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (e != NULL && e->host != NULL) {
        *host = blob_ref(e->host);
        lru_touch(&kt->host_lru, e);
    } else if (e != NULL && e->file != NULL) {
        *w = ent_where(e);
    } else {
        kt->st.misses += !quiet;
        found = false;
    }
    pthread_mutex_unlock(&kt->mu);
    return found;
}

/* A block of a chain read ahead: its record's bytes in a run's buffer. */
typedef struct {
    const uint8_t *rec;         /* NULL: not read ahead (or past the end of the file) */
    uint64_t gen;               /* its file's gen when read */
    int fd;                     /* the run's file */
    pfrun_t *pf;                /* the prefetch run it is in (claimed), or NULL */
} pre_t;

/* One block: host, else SSD (pre: read ahead by get_many, or NULL). */
static td_status_t
get_one(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
        td_kvtier_out_t *out, const pre_t *pre)
{
    blob_t *b;
    where_t w;
    td_status_t st;

    if (!get_where(kt, hash, &b, &w, false))
        return TD_ERR_NOT_FOUND;
    if (b != NULL) {
        st = out_fits(out, b->payload_bytes, b->snapshot_bytes, hash)
                 ? get_host(kt, b, hash, expect, g, out)
                 : TD_ERR_TOO_BIG;
        blob_unref(b);
        return st;
    }
    if (!out_fits(out, w.payload, w.snap, hash))
        return TD_ERR_TOO_BIG;
    if (pre == NULL || pre->rec == NULL || pre->gen != w.gen)
        return get_ssd(kt, hash, expect, g, out, &w);
    /* from the run's buffer */
    memcpy(out->payload, pre->rec + HDR_BYTES + (size_t)w.g * 4, w.payload);
    if (w.snap > 0)
        memcpy(out->snapshot, pre->rec + HDR_BYTES + (size_t)w.g * 4 + w.payload, w.snap);
    return ssd_finish(kt, hash, expect, g, out, &w, pre->rec, pre->rec + HDR_BYTES, NULL,
                      pre->fd);
}

td_status_t
td_kvtier_get(td_kvtier_t *kt, uint64_t hash, const int32_t *expect_tokens, uint32_t block_tokens,
              td_kvtier_out_t *out)
{
    return get_one(kt, hash, expect_tokens, block_tokens, out, NULL);
}

/* ---- Chains: get_many, with the reader threads ------------------------------
 * The chain's SSD blocks come in runs of consecutive blocks of one file (a
 * put batch), up to RUN_MAX bytes each; the caller and the reader threads
 * claim runs, read each with one O_DIRECT read of its span (aligned; a plain
 * read where the file system refuses O_DIRECT) into a buffer kept for reuse,
 * then check its blocks and copy them out. No page cache: the host tier is the cache, and a cold read goes
 * at the device's large-read speed. A block whose run could not be read is
 * read on its own (which finds and reports what is wrong). One batch at a
 * time uses the threads; a second caller meanwhile reads its chain alone. */

typedef struct {
    uint64_t name, gen;         /* the file */
    uint64_t lo, hi;            /* the span of the run's records, aligned */
    size_t first, last;         /* its blocks: [first, last] of the chain */
    uint8_t *buf;               /* [cap >= hi - lo] read, or NULL */
    uint64_t cap;
    uint64_t got;               /* bytes read */
    int fd;
    bool direct;                /* fd is O_DIRECT */
} run_t;

/* A run of block i alone (its record at w), its span aligned for O_DIRECT. */
static run_t
run_start(const where_t *w, size_t i)
{
    uint64_t lo = w->off & ~(uint64_t)(RUN_ALIGN - 1);
    uint64_t hi = w->off + rec_file_bytes(w->g, w->payload, w->snap);

    hi = (hi + RUN_ALIGN - 1) & ~(uint64_t)(RUN_ALIGN - 1);
    return (run_t){ w->name, w->gen, lo, hi, i, i, NULL, 0, 0, -1, false };
}

/* Adds block i (at w) to r when it continues r: the next block, of the same
 * file, the span within max bytes. */
static bool
run_extend(run_t *r, const where_t *w, size_t i, uint64_t max)
{
    run_t b = run_start(w, i);
    uint64_t lo = b.lo < r->lo ? b.lo : r->lo, hi = b.hi > r->hi ? b.hi : r->hi;

    if (r->name != w->name || r->gen != w->gen || r->last + 1 != i || hi - lo > max)
        return false;
    r->lo = lo;
    r->hi = hi;
    r->last = i;
    return true;
}

struct rbatch {
    const uint64_t *hashes;
    const int32_t *tokens;
    uint32_t g;
    td_kvtier_out_t *outs;
    td_status_t *sts;
    pre_t *pre;                 /* [n] */
    where_t *w;                 /* [n] */
    run_t *runs;
    size_t n, nruns;
    _Atomic size_t next_run, next;
    int helpers;                /* reader threads inside, under rmu */
};

/* Opens r's file (O_DIRECT where the file system takes it: r->direct) and
 * takes a buffer for it; false when either failed. */
static bool
run_open(td_kvtier_t *kt, run_t *r)
{
    char name[NAME_LEN];

    rec_name(name, r->name, ".kvb");
    r->fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC | O_DIRECT);
    r->direct = r->fd >= 0;
    if (r->fd < 0 && errno == EINVAL)
        r->fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        return false;
    pthread_mutex_lock(&kt->rmu);   /* a kept buffer, else a new one */
    for (uint32_t i = 0; i < kt->nbufs; i++)
        if (kt->bufs[i].cap >= r->hi - r->lo) {
            r->buf = kt->bufs[i].p;
            r->cap = kt->bufs[i].cap;
            kt->bufs[i] = kt->bufs[--kt->nbufs];
            break;
        }
    pthread_mutex_unlock(&kt->rmu);
    if (r->buf == NULL) {
        r->cap = r->hi - r->lo > RUN_MAX ? r->hi - r->lo : RUN_MAX;
        if (posix_memalign((void **)&r->buf, RUN_ALIGN, r->cap) != 0) {
            r->buf = NULL;
            return false;
        }
    }
    return true;
}

/* Reads r's span into its buffer (plain where O_DIRECT is refused). */
static void
run_pread(td_kvtier_t *kt, run_t *r)
{
    char name[NAME_LEN];
    ssize_t got;

    rec_name(name, r->name, ".kvb");
    do
        got = pread(r->fd, r->buf, r->hi - r->lo, (off_t)r->lo);
    while (got < 0 && errno == EINTR);
    if (got < 0 && errno == EINVAL) {   /* O_DIRECT refused after all: plain */
        close(r->fd);
        r->fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC);
        got = r->fd < 0 ? -1 : pread(r->fd, r->buf, r->hi - r->lo, (off_t)r->lo);
    }
    r->got = got > 0 ? (uint64_t)got : 0;
}

/* Gives r's buffer back (kept while fewer than RUN_BUFS are) and closes it. */
static void
run_done(td_kvtier_t *kt, run_t *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    if (r->buf == NULL)
        return;
    pthread_mutex_lock(&kt->rmu);
    if (kt->nbufs < RUN_BUFS) {
        kt->bufs[kt->nbufs++] = (rbuf_t){ r->buf, r->cap };
        r->buf = NULL;
    }
    pthread_mutex_unlock(&kt->rmu);
    free(r->buf);
    r->buf = NULL;
}

/* Checks and copies out a read run's blocks, then gives the run back. */
static void
run_finish(td_kvtier_t *kt, rbatch_t *b, run_t *r)
{
    for (size_t k = r->first; k <= r->last; k++) {
        const where_t *w = &b->w[k];
        uint64_t end = w->off + rec_file_bytes(w->g, w->payload, w->snap);

        if (r->buf != NULL && end <= r->lo + r->got) {
            b->pre[k].rec = r->buf + (w->off - r->lo);
            b->pre[k].fd = r->fd;
        }
        b->sts[k] = get_one(kt, b->hashes[k], b->tokens + k * b->g, b->g, &b->outs[k],
                            &b->pre[k]);
    }
    run_done(kt, r);
}

/* Submits up to n reads, one io_submit each: one call of several holds them
 * all in the block layer's plug until the last is set up, these reach the
 * device one by one. The count submitted; -1 when the first was refused. */
static long
aio_submit_each(aio_context_t ctx, struct iocb **cbs, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (syscall(SYS_io_submit, ctx, 1L, cbs + i) != 1)
            break;
    return i > 0 ? (long)i : -1;
}

/* All of a chain's runs in flight at once with Linux AIO (io_submit of
 * O_DIRECT reads), each checked as it completes, on the caller; false when
 * the AIO context is missing or busy with another chain (nothing done). */
static bool
chain_aio(td_kvtier_t *kt, rbatch_t *b)
{
    struct iocb *cbs, **ptrs;
    struct io_event ev[32];
    size_t nsub = 0, next = 0, pending = 0;

    if (kt->aio == 0 || b->nruns == 0 || pthread_mutex_trylock(&kt->aio_mu) != 0)
        return false;
    cbs = calloc(b->nruns, sizeof(*cbs));
    ptrs = calloc(b->nruns, sizeof(*ptrs));
    if (cbs == NULL || ptrs == NULL) {
        free(cbs);
        free(ptrs);
        pthread_mutex_unlock(&kt->aio_mu);
        return false;
    }
    for (size_t i = 0; i < b->nruns; i++) {
        run_t *r = &b->runs[i];

        if (!run_open(kt, r) || !r->direct) {   /* read in place, now */
            if (r->buf != NULL)
                run_pread(kt, r);
            run_finish(kt, b, r);
            continue;
        }
        cbs[nsub] = (struct iocb){ .aio_data = i, .aio_lio_opcode = IOCB_CMD_PREAD,
                                   .aio_fildes = (uint32_t)r->fd,
                                   .aio_buf = (uint64_t)(uintptr_t)r->buf,
                                   .aio_nbytes = r->hi - r->lo, .aio_offset = (int64_t)r->lo };
        ptrs[nsub] = &cbs[nsub];
        nsub++;
    }
    while (next < nsub || pending > 0) {
        if (next < nsub && pending < AIO_DEPTH) {
            size_t want = nsub - next < AIO_DEPTH - pending ? nsub - next : AIO_DEPTH - pending;
            long got = aio_submit_each(kt->aio, ptrs + next, want);

            if (got > 0) {
                next += (size_t)got;
                pending += (size_t)got;
            } else if (pending == 0) {   /* refused: read the rest in place */
                for (; next < nsub; next++) {
                    run_t *r = &b->runs[cbs[next].aio_data];

                    run_pread(kt, r);
                    run_finish(kt, b, r);
                }
                break;
            }
        }
        if (pending == 0)
            continue;
        long n = syscall(SYS_io_getevents, kt->aio, 1L, (long)(sizeof(ev) / sizeof(ev[0])), ev,
                         NULL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {   /* cannot happen with a good context; the runs stay unread */
            td_log_every(TD_LOG_ERROR, 10000, "kvtier %s: io_getevents: %s", kt->dir,
                         strerror(errno));
            break;
        }
        for (long e = 0; e < n; e++) {
            run_t *r = &b->runs[ev[e].data];

            pending--;
            if (ev[e].res == -EINVAL)
                run_pread(kt, r);   /* O_DIRECT refused at read time */
            else
                r->got = ev[e].res > 0 ? (uint64_t)ev[e].res : 0;
            run_finish(kt, b, r);
        }
    }
    free(ptrs);
    free(cbs);
    pthread_mutex_unlock(&kt->aio_mu);
    return true;
}

/* Claims runs (read, then check and copy out their blocks), then the blocks
 * in no run (host tier, misses). */
static void
rbatch_work(td_kvtier_t *kt, rbatch_t *b)
{
    size_t i;

    while ((i = atomic_fetch_add(&b->next_run, 1)) < b->nruns) {
        run_t *r = &b->runs[i];

        if (run_open(kt, r))
            run_pread(kt, r);
        run_finish(kt, b, r);
    }
    while ((i = atomic_fetch_add(&b->next, 1)) < b->n)
        if (b->pre[i].gen == 0)
            b->sts[i] = get_one(kt, b->hashes[i], b->tokens + i * b->g, b->g, &b->outs[i],
                                NULL);
}

static void *
reader_main(void *arg)
{
    td_kvtier_t *kt = arg;
    uint64_t seen = 0;

    pthread_mutex_lock(&kt->rmu);
    for (;;) {
        while (!kt->rstop && (kt->rb == NULL || kt->rb_seq == seen))
            pthread_cond_wait(&kt->rwork, &kt->rmu);
        if (kt->rstop)
            break;
        rbatch_t *b = kt->rb;

        seen = kt->rb_seq;
        b->helpers++;
        pthread_mutex_unlock(&kt->rmu);
        rbatch_work(kt, b);
        pthread_mutex_lock(&kt->rmu);
        if (--b->helpers == 0)
            pthread_cond_broadcast(&kt->rdone);
    }
    pthread_mutex_unlock(&kt->rmu);
    return NULL;
}

/* ---- Prefetch: chains read ahead ---------------------------------------------
 * td_kvtier_prefetch queues a chain. The prefetch thread turns the queued
 * chains' SSD blocks into runs as get_many does, each into one of PF_DEPTH
 * run slots, and keeps them in flight with its own AIO context across
 * chains, so the device does not idle between two requests' chains as it does
 * between two get_many calls. Nothing is checked or copied there: a read run
 * is held (READY) until get_many claims its blocks (chain_runs), checks and
 * copies them out of the run's buffer as it does its own runs' (get_one),
 * and lets the run go when its last block is claimed. A get_many waits for a
 * run still being read. A READY run nobody claimed for PF_STALE_NS goes; a
 * flush drops them all and the queue. A run's file is closed when its read
 * ends: held runs pin no deleted file, and no file is closed under mu. */

enum { PF_FREE, PF_READING, PF_READY };

typedef struct {                /* a block of a queued chain: in pfqmap until taken */
    mnode_t node;               /* key: its hash */
    bool queued;                /* false: a run has it, or a get_many took it */
} pfq_t;

struct pfjob {
    pfjob_t *next;
    size_t n, next_blk;         /* blocks; the first not yet in a run */
    pfq_t q[];                  /* [n] */
};

typedef struct {                /* a block of a run: in pfmap until claimed */
    mnode_t node;               /* key: its hash */
    pfrun_t *run;
    where_t w;
    bool mapped;
    bool read;                  /* its record was read whole */
} pfblk_t;

struct pfrun {
    run_t r;
    int state;
    bool flushed;               /* a flush came while it was being read: drop it when read */
    uint32_t left;              /* its blocks still in pfmap */
    uint32_t claims;            /* get_many calls using its buffer */
    uint64_t ready_ns;
    pfblk_t *blk;               /* [r.last - r.first + 1] */
    size_t bcap;
};

static pfrun_t *
pf_runs_new(void)
{
    pfrun_t *runs = calloc(PF_DEPTH, sizeof(*runs));

    for (size_t s = 0; runs != NULL && s < PF_DEPTH; s++)
        runs[s].r.fd = -1;
    return runs;
}

/* Every run's buffer and file given back (the thread is gone). */
static void
pf_runs_free(td_kvtier_t *kt)
{
    for (size_t s = 0; kt->pfruns != NULL && s < PF_DEPTH; s++) {
        run_done(kt, &kt->pfruns[s].r);
        free(kt->pfruns[s].blk);
    }
    free(kt->pfruns);
    kt->pfruns = NULL;
}

/* Takes the run's remaining blocks out of pfmap (mu held). */
static void
pf_unmap(td_kvtier_t *kt, pfrun_t *pr)
{
    for (size_t k = 0; k <= pr->r.last - pr->r.first; k++)
        if (pr->blk[k].mapped) {
            map_remove(&kt->pfmap, &pr->blk[k].node);
            pr->blk[k].mapped = false;
            kt->st.prefetch_unused += pr->blk[k].read;
        }
    pr->left = 0;
}

/* Lets a run no block of which is wanted any more go (mu held): its buffer
 * back to the pool (its file was closed when the read ended). */
static void
pf_release(td_kvtier_t *kt, pfrun_t *pr)
{
    run_done(kt, &pr->r);
    pr->state = PF_FREE;
    pr->flushed = false;
    pthread_cond_signal(&kt->pf_work);
}

/* Lets go every READY run nobody has claimed for PF_STALE_NS, or (all) every
 * READY run nobody claims, and marks the runs being read to go when read
 * (mu held). */
static void
pf_drop(td_kvtier_t *kt, bool all)
{
    uint64_t now = td_clock_ns();

    for (size_t s = 0; s < PF_DEPTH; s++) {
        pfrun_t *pr = &kt->pfruns[s];

        if (all && pr->state == PF_READING)
            pr->flushed = true;
        if (pr->state != PF_READY || (!all && now - pr->ready_ns <= PF_STALE_NS))
            continue;
        pf_unmap(kt, pr);
        if (pr->claims == 0)
            pf_release(kt, pr);   /* else the last claim lets it go */
    }
}

/* A free run slot (mu held): a FREE one, else the stalest READY one nobody
 * claimed for PF_STALE_NS, or NULL. */
static pfrun_t *
pf_slot(td_kvtier_t *kt)
{
    for (int pass = 0; pass < 2; pass++) {
        for (size_t s = 0; s < PF_DEPTH; s++)
            if (kt->pfruns[s].state == PF_FREE)
                return &kt->pfruns[s];
        if (pass == 0)
            pf_drop(kt, false);
    }
    return NULL;
}

/* A queued block leaves pfqmap (mu held). */
static void
pf_dequeue(td_kvtier_t *kt, pfq_t *q)
{
    if (q->queued) {
        map_remove(&kt->pfqmap, &q->node);
        q->queued = false;
    }
}

/* The next run of the queued chains into pr (mu held): consecutive blocks of
 * one file that the SSD tier holds, the host tier does not, and no run has;
 * now in pfmap. false when the queue has none left (or memory ran out).
 * Chains used up leave the queue. */
static bool
pf_build(td_kvtier_t *kt, pfrun_t *pr)
{
    while (kt->pf_head != NULL) {
        pfjob_t *j = kt->pf_head;
        run_t *r = &pr->r;
        size_t first = j->next_blk, nb = 0;

        for (; j->next_blk < j->n; j->next_blk++) {
            pfq_t *q = &j->q[j->next_blk];
            ent_t *e = q->queued ? ent_find(kt, q->node.key) : NULL;

            if (q->queued && e == NULL) {   /* no tier holds it: the chain ends here */
                for (size_t k = j->next_blk; k < j->n; k++)
                    pf_dequeue(kt, &j->q[k]);
                j->next_blk = j->n;
                break;
            }
            if (!q->queued || e->host != NULL || e->file == NULL ||
                map_find(&kt->pfmap, q->node.key) != NULL) {
                if (nb > 0)
                    break;   /* the run ends before it */
                pf_dequeue(kt, q);
                first = j->next_blk + 1;
                continue;
            }
            where_t w = ent_where(e);

            if (nb == 0)
                *r = run_start(&w, j->next_blk);
            else if (!run_extend(r, &w, j->next_blk, PF_RUN_MAX))
                break;   /* another file, or the run is full */
            nb++;
        }
        if (nb > pr->bcap) {
            pfblk_t *blk = realloc(pr->blk, nb * sizeof(*blk));

            if (blk == NULL) {
                j->next_blk = first;   /* tried again later */
                return false;
            }
            pr->blk = blk;
            pr->bcap = nb;
        }
        if (nb > 0) {
            for (size_t k = 0; k < nb; k++) {
                pfblk_t *pb = &pr->blk[k];
                ent_t *e = ent_find(kt, j->q[first + k].node.key);

                pf_dequeue(kt, &j->q[first + k]);
                pb->node.key = j->q[first + k].node.key;
                pb->run = pr;
                pb->w = ent_where(e);
                pb->mapped = true;
                map_insert(&kt->pfmap, &pb->node);
            }
            pr->state = PF_READING;
            pr->left = (uint32_t)nb;
            pr->claims = 0;
            return true;
        }
        kt->pf_head = j->next;   /* used up */
        if (kt->pf_head == NULL)
            kt->pf_tail = NULL;
        kt->pf_queued -= j->n;
        free(j);
    }
    return false;
}

/* pr's read done (got bytes; mu held): get_many may claim its blocks. */
static void
pf_ready(td_kvtier_t *kt, pfrun_t *pr)
{
    const run_t *r = &pr->r;

    pr->state = PF_READY;
    pr->ready_ns = td_clock_ns();
    for (size_t k = 0; k <= r->last - r->first; k++) {
        const where_t *w = &pr->blk[k].w;

        pr->blk[k].read = r->buf != NULL &&
                          w->off + rec_file_bytes(w->g, w->payload, w->snap) <= r->lo + r->got;
        kt->st.prefetched += pr->blk[k].read;
    }
    if (pr->flushed) {   /* its blocks were flushed while it was read */
        pf_unmap(kt, pr);
        if (pr->claims == 0)
            pf_release(kt, pr);
    }
    pthread_cond_broadcast(&kt->pf_done);
}

/* Starts pr's read (mu not held): true when it is in flight on the AIO
 * context; else it was read in place (or could not be opened). The file is
 * closed when the read ends (pf_closed): a held run pins no deleted file. */
static bool
pf_start(td_kvtier_t *kt, pfrun_t *pr, size_t slot)
{
    run_t *r = &pr->r;

    if (!run_open(kt, r))
        return false;   /* a get finds what is wrong */
    if (kt->pf_aio != 0 && r->direct) {
        struct iocb cb = { .aio_data = slot, .aio_lio_opcode = IOCB_CMD_PREAD,
                           .aio_fildes = (uint32_t)r->fd,
                           .aio_buf = (uint64_t)(uintptr_t)r->buf,
                           .aio_nbytes = r->hi - r->lo, .aio_offset = (int64_t)r->lo };
        struct iocb *p = &cb;

        if (syscall(SYS_io_submit, kt->pf_aio, 1L, &p) == 1)
            return true;
    }
    run_pread(kt, r);
    return false;
}

static void
pf_closed(pfrun_t *pr)
{
    if (pr->r.fd >= 0)
        close(pr->r.fd);
    pr->r.fd = -1;
}

static void *
pf_main(void *arg)
{
    td_kvtier_t *kt = arg;
    struct io_event ev[PF_DEPTH];
    size_t reading = 0;

    pthread_mutex_lock(&kt->mu);
    for (;;) {
        pfrun_t *pr;

        if (kt->pf_stop) {   /* the queue and the runs go; the reads in flight end */
            pf_flush(kt);
            if (reading == 0)
                break;
        }
        while (!kt->pf_stop && kt->pf_head != NULL && (pr = pf_slot(kt)) != NULL &&
               pf_build(kt, pr)) {
            size_t slot = (size_t)(pr - kt->pfruns);

            pthread_mutex_unlock(&kt->mu);
            bool inflight = pf_start(kt, pr, slot);

            if (!inflight)
                pf_closed(pr);
            pthread_mutex_lock(&kt->mu);
            if (inflight) {
                reading++;
                pthread_cond_broadcast(&kt->pf_done);   /* its blocks are in a run now */
            } else {
                pf_ready(kt, pr);
            }
        }
        pf_drop(kt, false);   /* read runs nobody took for PF_STALE_NS */
        if (reading == 0) {
            bool held = false;

            for (size_t s = 0; s < PF_DEPTH; s++)
                held = held || kt->pfruns[s].state == PF_READY;
            if (kt->pf_stop)
                continue;
            if (kt->pf_head == NULL && !held) {
                pthread_cond_wait(&kt->pf_work, &kt->mu);
            } else {   /* wait for a get, or for a held run to go stale */
                td_clock_cond_wait(&kt->pf_work, &kt->mu, 50000000ull);
            }
            continue;
        }
        pthread_mutex_unlock(&kt->mu);
        long n = syscall(SYS_io_getevents, kt->pf_aio, 1L, (long)PF_DEPTH, ev, NULL);
        bool broken = n < 0 && errno != EINTR;

        if (broken) {   /* cannot happen with a good context */
            td_error("kvtier %s: io_getevents: %s; prefetch reads in place from now on",
                     kt->dir, strerror(errno));
            syscall(SYS_io_destroy, kt->pf_aio);   /* waits for the reads in flight */
            kt->pf_aio = 0;
        }
        for (long e = 0; e < n; e++) {
            pfrun_t *p = &kt->pfruns[ev[e].data];

            if (ev[e].res == -EINVAL)
                run_pread(kt, &p->r);   /* O_DIRECT refused at read time */
            else
                p->r.got = ev[e].res > 0 ? (uint64_t)ev[e].res : 0;
            pf_closed(p);
        }
        pthread_mutex_lock(&kt->mu);
        for (long e = 0; e < n; e++) {
            reading--;
            pf_ready(kt, &kt->pfruns[ev[e].data]);
        }
        for (size_t s = 0; broken && s < PF_DEPTH; s++)
            if (kt->pfruns[s].state == PF_READING) {
                kt->pfruns[s].r.got = 0;   /* unread: the gets read them */
                pf_closed(&kt->pfruns[s]);
                pf_ready(kt, &kt->pfruns[s]);
            }
        if (broken)
            reading = 0;
    }
    pthread_mutex_unlock(&kt->mu);
    return NULL;
}

/* Whether a run slot is free (mu held): the prefetch thread is about to
 * start the queue's next run. */
static bool
pf_slot_free(const td_kvtier_t *kt)
{
    for (size_t s = 0; s < PF_DEPTH; s++)
        if (kt->pfruns[s].state == PF_FREE)
            return true;
    return false;
}

/* If hash is in a prefetch run: waits while the run is being read, then
 * claims the block into *pre (its record in the run's buffer when read whole)
 * and returns true. A block of a queued chain that no run has yet is given
 * PF_START_WAIT_NS to get one while a slot is free (the prefetch thread
 * starts it at once), then taken from the queue: the caller reads it. */
static bool
pf_claim(td_kvtier_t *kt, uint64_t hash, pre_t *pre)
{
    pfblk_t *pb;
    uint64_t t0 = 0;

    if (!kt->pf_started)
        return false;
    pthread_mutex_lock(&kt->mu);
    for (;;) {
        pb = (pfblk_t *)map_find(&kt->pfmap, hash);
        if (pb != NULL && pb->run->state == PF_READING) {
            pthread_cond_wait(&kt->pf_done, &kt->mu);
            continue;
        }
        if (pb != NULL || map_find(&kt->pfqmap, hash) == NULL || !pf_slot_free(kt) ||
            kt->pf_stop)
            break;
        uint64_t now = td_clock_ns();

        if (t0 == 0)
            t0 = now;
        if (now - t0 >= PF_START_WAIT_NS)
            break;
        td_clock_cond_wait(&kt->pf_done, &kt->mu, 200000);   /* broadcast when a run starts */
    }
    if (pb == NULL) {
        pfq_t *q = (pfq_t *)map_find(&kt->pfqmap, hash);

        if (q != NULL)
            pf_dequeue(kt, q);
        pthread_mutex_unlock(&kt->mu);
        return false;
    }
    pfrun_t *pr = pb->run;

    map_remove(&kt->pfmap, &pb->node);
    pb->mapped = false;
    pr->left--;
    pr->claims++;
    *pre = (pre_t){ pb->read ? pr->r.buf + (pb->w.off - pr->r.lo) : NULL, pb->w.gen, -1, pr };
    pthread_mutex_unlock(&kt->mu);
    return true;
}

/* A get_many is done with a run's buffer. */
static void
pf_unclaim(td_kvtier_t *kt, pfrun_t *pr)
{
    pthread_mutex_lock(&kt->mu);
    if (--pr->claims == 0 && pr->left == 0)
        pf_release(kt, pr);
    pthread_mutex_unlock(&kt->mu);
}

/* A flush (mu held): the queued chains and the runs read ahead go; a run
 * being read goes when read. */
static void
pf_flush(td_kvtier_t *kt)
{
    while (kt->pf_head != NULL) {
        pfjob_t *j = kt->pf_head;

        kt->pf_head = j->next;
        for (size_t k = 0; k < j->n; k++)
            pf_dequeue(kt, &j->q[k]);
        free(j);
    }
    kt->pf_tail = NULL;
    kt->pf_queued = 0;
    pf_drop(kt, true);
}

td_status_t
td_kvtier_prefetch(td_kvtier_t *kt, const uint64_t *hashes, size_t n)
{
    pfjob_t *j;

    if (!kt->pf_started)
        return TD_ERR_UNSUPPORTED;
    if (n == 0)
        return TD_OK;
    if (n > PF_QUEUE_BLOCKS) {
        pthread_mutex_lock(&kt->mu);
        kt->st.prefetch_dropped += n;
        pthread_mutex_unlock(&kt->mu);
        return TD_ERR_BUSY;
    }
    if ((j = malloc(sizeof(*j) + n * sizeof(pfq_t))) == NULL)
        return TD_ERR_NOMEM;
    j->next = NULL;
    j->n = n;
    j->next_blk = 0;
    pthread_mutex_lock(&kt->mu);
    if (kt->pf_queued + n > PF_QUEUE_BLOCKS) {
        kt->st.prefetch_dropped += n;
        pthread_mutex_unlock(&kt->mu);
        free(j);
        return TD_ERR_BUSY;
    }
    for (size_t i = 0; i < n; i++) {   /* a block queued or read ahead already is not ours */
        j->q[i].node.key = hashes[i];
        j->q[i].queued = map_find(&kt->pfqmap, hashes[i]) == NULL &&
                         map_find(&kt->pfmap, hashes[i]) == NULL;
        if (j->q[i].queued)
            map_insert(&kt->pfqmap, &j->q[i].node);
    }
    if (kt->pf_tail != NULL)
        kt->pf_tail->next = j;
    else
        kt->pf_head = j;
    kt->pf_tail = j;
    kt->pf_queued += n;
    pthread_cond_signal(&kt->pf_work);
    pthread_mutex_unlock(&kt->mu);
    return TD_OK;
}

/* The runs of the chain's SSD blocks (consecutive blocks of one file). */
static size_t
chain_runs(td_kvtier_t *kt, rbatch_t *b)
{
    size_t nruns = 0;

    for (size_t i = 0; i < b->n; i++) {
        blob_t *host;
        where_t *w = &b->w[i];

        b->pre[i] = (pre_t){ NULL, 0, -1, NULL };
        if (pf_claim(kt, b->hashes[i], &b->pre[i])) {   /* read ahead: checked and copied now */
            b->sts[i] = get_one(kt, b->hashes[i], b->tokens + i * b->g, b->g, &b->outs[i],
                                &b->pre[i]);
            pf_unclaim(kt, b->pre[i].pf);
            continue;
        }
        if (!get_where(kt, b->hashes[i], &host, w, true) || host != NULL) {
            blob_unref(host);
            continue;
        }
        b->pre[i].gen = w->gen;
        if (nruns == 0 || !run_extend(&b->runs[nruns - 1], w, i, RUN_MAX))
            b->runs[nruns++] = run_start(w, i);
    }
    return nruns;
}

td_status_t
td_kvtier_get_many(td_kvtier_t *kt, const uint64_t *hashes, size_t n, const int32_t *expect_tokens,
                   uint32_t block_tokens, td_kvtier_out_t *outs, size_t *n_hit)
{
    rbatch_t b = { hashes, expect_tokens, block_tokens, outs, NULL, NULL, NULL, NULL, n, 0,
                   0, 0, 0 };
    td_status_t st = TD_OK;
    bool shared = false, aio_done;
    size_t i;

    *n_hit = 0;
    b.sts = malloc(n * sizeof(*b.sts));
    b.pre = malloc(n * sizeof(*b.pre));
    b.w = malloc(n * sizeof(*b.w));
    b.runs = malloc(n * sizeof(*b.runs));
    if (n > 0 && (!b.sts || !b.pre || !b.w || !b.runs)) {
        st = TD_ERR_NOMEM;
        goto cleanup;
    }
    if (kt->dir != NULL)
        b.nruns = chain_runs(kt, &b);
    else
        for (i = 0; i < n; i++)
            b.pre[i] = (pre_t){ NULL, 0, -1, NULL };
    aio_done = chain_aio(kt, &b);
    if (aio_done) {
        for (i = 0; i < n; i++)   /* the blocks in no run */
            if (b.pre[i].gen == 0)
                b.sts[i] = get_one(kt, hashes[i], expect_tokens + i * block_tokens, block_tokens,
                                   &outs[i], NULL);
    } else if (kt->nreaders > 0 && n > 1 && pthread_mutex_trylock(&kt->rbusy) == 0) {
        shared = true;
        pthread_mutex_lock(&kt->rmu);
        kt->rb = &b;
        kt->rb_seq++;
        pthread_cond_broadcast(&kt->rwork);
        pthread_mutex_unlock(&kt->rmu);
    }
    if (!aio_done)
        rbatch_work(kt, &b);
    if (shared) {
        pthread_mutex_lock(&kt->rmu);
        kt->rb = NULL;
        while (b.helpers > 0)
            pthread_cond_wait(&kt->rdone, &kt->rmu);
        pthread_mutex_unlock(&kt->rmu);
        pthread_mutex_unlock(&kt->rbusy);
    }
    for (i = 0; i < n && b.sts[i] == TD_OK; i++)
        ;
    *n_hit = i;
    if (i < n && b.sts[i] != TD_ERR_NOT_FOUND)
        st = b.sts[i];
cleanup:
    free(b.runs);
    free(b.w);
    free(b.pre);
    free(b.sts);
    return st;
}

/* ---- Flush, events, stats --------------------------------------------------- */
void
td_kvtier_flush(td_kvtier_t *kt)
{
    pthread_mutex_lock(&kt->mu);
    kt->epoch++;
    kt->q_tail = NULL;
    for (job_t **p = &kt->q_head; *p != NULL;) {
        job_t *j = *p;

        if (j->kind == JOB_WRITE) {
            *p = j->next;
            kt->q_writes -= j->n;
            for (uint32_t i = 0; i < j->n; i++)
                blob_unref(j->blobs[i]);
            free(j);
        } else {
            kt->q_tail = j;
            p = &j->next;
        }
    }
    while (kt->host_lru.head != NULL) {
        ent_t *e = kt->host_lru.head;

        host_drop(kt, e);
        ent_release_if_empty(kt, e);
    }
    while (kt->ssd_lru.head != NULL)
        file_doom(kt, kt->ssd_lru.head, malloc(sizeof(job_t)));
    if (kt->pf_started)
        pf_flush(kt);
    pthread_mutex_unlock(&kt->mu);
    td_info("kvtier %s: flushed", kt->dir != NULL ? kt->dir : "(host only)");
}

td_status_t
td_kvtier_drain_events(td_kvtier_t *kt, uint64_t *added, size_t added_cap, size_t *n_added,
                       uint64_t *removed, size_t removed_cap, size_t *n_removed)
{
    size_t na = 0, nr = 0;
    td_status_t st = TD_OK;

    pthread_mutex_lock(&kt->mu);
    for (evnode_t *ev = kt->ev_head, *next; ev != NULL; ev = next) {
        next = ev->next;
        if (ev->net > 0 && na < added_cap) {
            added[na++] = ev->node.key;
        } else if (ev->net < 0 && nr < removed_cap) {
            removed[nr++] = ev->node.key;
        } else {
            st = TD_INPROGRESS;
            continue;
        }
        ev_unlink(kt, ev);
    }
    pthread_mutex_unlock(&kt->mu);
    *n_added = na;
    *n_removed = nr;
    return st;
}

td_status_t
td_kvtier_snapshot(td_kvtier_t *kt, uint64_t *out, size_t cap, size_t *n)
{
    size_t k = 0;

    pthread_mutex_lock(&kt->mu);
    if (kt->index.n > cap) {
        *n = kt->index.n;
        pthread_mutex_unlock(&kt->mu);
        return TD_ERR_TOO_BIG;
    }
    for (size_t i = 0; i < kt->index.nb; i++)
        for (mnode_t *m = kt->index.b[i]; m != NULL; m = m->next)
            out[k++] = m->key;
    ev_clear(kt);
    pthread_mutex_unlock(&kt->mu);
    *n = k;
    return TD_OK;
}

void
td_kvtier_stats(td_kvtier_t *kt, td_kvtier_stats_t *out)
{
    pthread_mutex_lock(&kt->mu);
    *out = kt->st;
    out->ssd_disk_bytes = kt->disk_bytes;
    out->queued = kt->q_writes;
    pthread_mutex_unlock(&kt->mu);
}

void
td_kvtier_wait_idle(td_kvtier_t *kt)
{
    if (!kt->io_started)
        return;
    pthread_mutex_lock(&kt->mu);
    while (kt->q_head != NULL || kt->busy)
        pthread_cond_wait(&kt->idle, &kt->mu);
    pthread_mutex_unlock(&kt->mu);
}

void
td_kvtier_test_stall(td_kvtier_t *kt, bool stalled)
{
    pthread_mutex_lock(&kt->mu);
    kt->stalled = stalled;
    if (!stalled)
        pthread_cond_signal(&kt->work);
    pthread_mutex_unlock(&kt->mu);
}
