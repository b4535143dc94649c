/* kvcache/kvtier.c — the host and SSD tiers of the prefix cache (kvtier.h):
 * one index of entries by chain hash (each in the host LRU, the SSD LRU or
 * both), an IO thread that writes records back and deletes files, and the
 * checked reads. One mutex guards the index, the queue, the events and the
 * counters; no IO happens under it. File format: docs/kvtier.md. */
#include "kvtier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "xxh64.h"

/* ---- File format -----------------------------------------------------------
 * <hash:016x>.kvb: an 80-byte header, tokens [G] (int32 LE), payload, snapshot.
 * Header (little-endian): magic "TDKVBLK1", checksum u64, version u32, G u32,
 * layout_hash, seed, hash, parent, end, payload_bytes, snapshot_bytes (u64).
 * checksum: XXH64 chained through its seed over header[16, 80), tokens,
 * payload, snapshot. Temp files: <hash:016x>.tmp, renamed into place. */
#define HDR_BYTES     80
#define KV_MAGIC      "TDKVBLK1"
#define KV_VERSION    1u
#define MAX_G         (1u << 20)
#define MAX_PART      (1ull << 40)
#define NAME_LEN      32
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
    uint64_t c = td_xxh64(hdr + OFF_VERSION, HDR_BYTES - OFF_VERSION, 0);

    c = td_xxh64(tokens, (size_t)g * 4, c);
    c = td_xxh64(payload, payload_bytes, c);
    return td_xxh64(snapshot, snapshot_bytes, c);
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
typedef struct rbatch rbatch_t;
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
    bool ssd;                   /* its file is in the SSD index */
    uint32_t ssd_g;
    uint64_t ssd_bytes, ssd_payload, ssd_snapshot, ssd_gen;
    uint64_t ssd_mtime_ns;      /* td_clock_ns when its mtime was last set by us */
    link_t sl;                  /* in the SSD LRU while ssd */
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
    uint64_t hash;
    blob_t *blob;               /* JOB_WRITE: the record (one count) */
    uint64_t bytes;             /* JOB_DELETE: counted in disk_bytes until unlinked */
    uint64_t parent, end;       /* JOB_WRITE: header fields */
    uint64_t epoch;             /* JOB_WRITE: flushes before it was queued */
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
    lru_t host_lru, ssd_lru;
    map_t evmap;                /* evnode_t by hash */
    evnode_t *ev_head, *ev_tail;

    job_t *q_head, *q_tail;
    uint64_t q_writes;          /* JOB_WRITE in the queue */
    uint64_t epoch;             /* flushes so far */
    uint64_t gen;               /* SSD entries made so far */
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
};

static void
lru_append(lru_t *l, ent_t *e, link_t *(*lk)(ent_t *))
{
    lk(e)->prev = l->tail;
    lk(e)->next = NULL;
    if (l->tail != NULL)
        lk(l->tail)->next = e;
    else
        l->head = e;
    l->tail = e;
}

static void
lru_unlink(lru_t *l, ent_t *e, link_t *(*lk)(ent_t *))
{
    if (lk(e)->prev != NULL)
        lk(lk(e)->prev)->next = lk(e)->next;
    else
        l->head = lk(e)->next;
    if (lk(e)->next != NULL)
        lk(lk(e)->next)->prev = lk(e)->prev;
    else
        l->tail = lk(e)->prev;
    lk(e)->prev = lk(e)->next = NULL;
}

static link_t *hlink(ent_t *e) { return &e->hl; }
static link_t *slink(ent_t *e) { return &e->sl; }

static void
lru_touch(lru_t *l, ent_t *e, link_t *(*lk)(ent_t *))
{
    if (l->tail != e) {
        lru_unlink(l, e, lk);
        lru_append(l, e, lk);
    }
}

/* ---- Events (under mu) ------------------------------------------------------ */
static void
ev_push(td_kvtier_t *kt, uint64_t hash, int d)
{
    evnode_t *ev = (evnode_t *)map_find(&kt->evmap, hash);

    if (ev != NULL) {
        ev->net += d;
        if (ev->net != 0)
            return;
        map_remove(&kt->evmap, &ev->node);
        if (ev->prev != NULL) ev->prev->next = ev->next; else kt->ev_head = ev->next;
        if (ev->next != NULL) ev->next->prev = ev->prev; else kt->ev_tail = ev->prev;
        free(ev);
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
    for (evnode_t *ev = kt->ev_head, *next; ev != NULL; ev = next) {
        next = ev->next;
        map_remove(&kt->evmap, &ev->node);
        free(ev);
    }
    kt->ev_head = kt->ev_tail = NULL;
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
    if (e->host != NULL || e->ssd)
        return;
    map_remove(&kt->index, &e->node);
    ev_push(kt, e->node.key, -1);
    free(e);
}

static void
host_drop(td_kvtier_t *kt, ent_t *e)
{
    lru_unlink(&kt->host_lru, e, hlink);
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
        if (v != e)
            ent_release_if_empty(kt, v);
    }
    if (e == NULL && (e = ent_get(kt, hash)) == NULL)
        return;
    e->host = blob_ref(b);
    lru_append(&kt->host_lru, e, hlink);
    kt->st.host_bytes += b->bytes;
    kt->st.host_records++;
}

/* Takes e's file out of the SSD index; its bytes stay in disk_bytes. */
static void
ssd_unindex(td_kvtier_t *kt, ent_t *e)
{
    lru_unlink(&kt->ssd_lru, e, slink);
    e->ssd = false;
    kt->st.ssd_bytes -= e->ssd_bytes;
    kt->st.ssd_records--;
}

static void
ssd_index(td_kvtier_t *kt, ent_t *e, uint32_t g, uint64_t bytes, uint64_t payload,
          uint64_t snapshot)
{
    e->ssd = true;
    e->ssd_g = g;
    e->ssd_bytes = bytes;
    e->ssd_payload = payload;
    e->ssd_snapshot = snapshot;
    e->ssd_gen = ++kt->gen;
    e->ssd_mtime_ns = td_clock_ns();
    lru_append(&kt->ssd_lru, e, slink);
    kt->st.ssd_bytes += bytes;
    kt->st.ssd_records++;
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
        kt->q_writes++;
    if (was_empty)
        pthread_cond_signal(&kt->work);
}

/* Queues the deletion of e's file (j: a job the caller allocated, or NULL:
 * the file stays and its bytes stay counted; logged). */
static void
ssd_doom(td_kvtier_t *kt, ent_t *e, job_t *j)
{
    uint64_t hash = e->node.key, bytes = e->ssd_bytes;

    ssd_unindex(kt, e);
    if (j == NULL) {
        td_error("kvtier %s: block %016" PRIx64 ": cannot queue its deletion: out of memory",
                 kt->dir, hash);
        return;
    }
    memset(j, 0, sizeof(*j));
    j->kind = JOB_DELETE;
    j->hash = hash;
    j->bytes = bytes;
    queue_push(kt, j);
}

/* ---- The IO thread ---------------------------------------------------------- */
static void
io_unlink(td_kvtier_t *kt, uint64_t hash)
{
    char name[NAME_LEN];

    rec_name(name, hash, ".kvb");
    if (unlinkat(kt->dirfd, name, 0) != 0 && errno != ENOENT)
        td_log_every(TD_LOG_WARN, 10000, "kvtier %s: %s: unlink failed: %s", kt->dir, name,
                     strerror(errno));
}

/* Writes j's record to <hash>.tmp and renames it into place. */
static td_status_t
io_write_file(td_kvtier_t *kt, const job_t *j)
{
    const blob_t *b = j->blob;
    char tmp[NAME_LEN], name[NAME_LEN];
    uint8_t hdr[HDR_BYTES];
    td_status_t st = TD_ERR_IO;
    uint64_t done = 0;
    int fd;

    hdr_fill(hdr, &kt->cfg, j->hash, j->parent, j->end, b->g, b->payload_bytes,
             b->snapshot_bytes);
    put_le64(hdr + OFF_CSUM, rec_checksum(hdr, blob_tokens(b), b->g, blob_payload(b),
                                          b->payload_bytes, blob_snapshot(b),
                                          b->snapshot_bytes));
    rec_name(tmp, j->hash, ".tmp");
    rec_name(name, j->hash, ".kvb");
    fd = openat(kt->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        goto fail;
    while (done < b->bytes) {
        struct iovec iov[2];
        int n = 0;
        ssize_t w;

        if (done < HDR_BYTES)
            iov[n++] = (struct iovec){ hdr + done, HDR_BYTES - done };
        uint64_t off = done < HDR_BYTES ? HDR_BYTES : done;
        iov[n++] = (struct iovec){ (void *)(b->data + off), b->bytes - off };
        w = pwritev(fd, iov, n, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            goto err_close;
        done += (uint64_t)w;
    }
    if (kt->cfg.ssd_fsync && fsync(fd) != 0)
        goto err_close;
    if (close(fd) != 0) {
        fd = -1;
        goto err_unlink;
    }
    fd = -1;
    if (renameat(kt->dirfd, tmp, kt->dirfd, name) != 0)
        goto err_unlink;
    return TD_OK;

err_close:
    st = td_status_from_errno(errno);
    close(fd);
err_unlink:
    if (st == TD_ERR_IO)
        st = td_status_from_errno(errno);
    unlinkat(kt->dirfd, tmp, 0);
fail:
    td_log_every(TD_LOG_WARN, 10000, "kvtier %s: %s: write failed: %s", kt->dir, name,
                 strerror(errno));
    return st != TD_OK ? st : TD_ERR_IO;
}

/* Deletes files until b->bytes more fit within the budget, then writes j.
 * Called and returns with mu held. */
static void
io_write(td_kvtier_t *kt, job_t *j)
{
    uint64_t need = j->blob->bytes, freeing = 0;
    size_t nv = 0, cap = 0;
    uint64_t *victims = NULL;
    job_t *dels = NULL;
    ent_t *e = ent_find(kt, j->hash);

    if ((e != NULL && e->ssd) || j->epoch != kt->epoch)
        return;
    if (need > kt->cfg.ssd_budget) {
        kt->st.writes_dropped++;
        return;
    }
    while (kt->disk_bytes - freeing + need > kt->cfg.ssd_budget && kt->ssd_lru.head != NULL) {
        ent_t *v = kt->ssd_lru.head;

        if (nv == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            uint64_t *nvict = realloc(victims, ncap * sizeof(*victims));

            if (nvict == NULL)
                break;
            victims = nvict;
            cap = ncap;
        }
        victims[nv++] = v->node.key;
        freeing += v->ssd_bytes;
        ssd_unindex(kt, v);
        ent_release_if_empty(kt, v);
    }
    if (kt->disk_bytes - freeing + need > kt->cfg.ssd_budget) {
        /* the rest is queued deletions: do them now */
        for (job_t **p = &kt->q_head; *p != NULL;) {
            job_t *d = *p;

            if (d->kind != JOB_DELETE) {
                p = &d->next;
                continue;
            }
            *p = d->next;
            if (kt->q_tail == d)
                kt->q_tail = NULL;
            d->next = dels;
            dels = d;
            freeing += d->bytes;
        }
        if (kt->q_tail == NULL)   /* recompute the tail */
            for (job_t *q = kt->q_head; q != NULL; q = q->next)
                kt->q_tail = q;
    }
    pthread_mutex_unlock(&kt->mu);
    for (size_t i = 0; i < nv; i++)
        io_unlink(kt, victims[i]);
    for (job_t *d = dels; d != NULL; d = d->next)
        io_unlink(kt, d->hash);
    pthread_mutex_lock(&kt->mu);
    kt->disk_bytes -= freeing;
    free(victims);
    while (dels != NULL) {
        job_t *d = dels;

        dels = d->next;
        free(d);
    }
    if (kt->disk_bytes + need > kt->cfg.ssd_budget) {
        kt->st.writes_dropped++;   /* not reached: only this thread adds to disk_bytes */
        return;
    }
    kt->disk_bytes += need;
    pthread_mutex_unlock(&kt->mu);
    td_status_t st = io_write_file(kt, j);
    pthread_mutex_lock(&kt->mu);
    if (st != TD_OK) {
        kt->disk_bytes -= need;
        kt->st.writes_dropped++;
        return;
    }
    kt->st.bytes_written += need;
    e = ent_find(kt, j->hash);
    if (j->epoch != kt->epoch || (e != NULL && e->ssd)) {
        /* flushed while it was written */
        pthread_mutex_unlock(&kt->mu);
        io_unlink(kt, j->hash);
        pthread_mutex_lock(&kt->mu);
        kt->disk_bytes -= need;
        return;
    }
    if ((e = ent_get(kt, j->hash)) == NULL) {
        pthread_mutex_unlock(&kt->mu);
        io_unlink(kt, j->hash);
        pthread_mutex_lock(&kt->mu);
        kt->disk_bytes -= need;
        return;
    }
    ssd_index(kt, e, j->blob->g, need, j->blob->payload_bytes, j->blob->snapshot_bytes);
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
            io_unlink(kt, j->hash);
            pthread_mutex_lock(&kt->mu);
            kt->disk_bytes -= j->bytes;
        } else {
            kt->q_writes--;
            io_write(kt, j);
            blob_unref(j->blob);
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
    uint64_t hash, bytes, payload, snapshot;
    uint32_t g;
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

/* What is wrong with a header for file `hash` of file_bytes, or NULL; sets
 * *foreign for a well-formed header of another layout or seed. */
static const char *
hdr_check(const td_kvtier_t *kt, const uint8_t *h, uint64_t hash, uint64_t file_bytes,
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
    if (rec_file_bytes(g, payload, snap) != file_bytes)
        return "sizes differ from the file's size (truncated?)";
    if (get_le64(h + OFF_HASH) != hash)
        return "holds another block (hash differs from its name)";
    if (get_le64(h + OFF_LAYOUT) != kt->cfg.layout_hash || get_le64(h + OFF_SEED) != kt->cfg.seed) {
        *foreign = true;
        return "foreign (another layout hash or seed)";
    }
    return NULL;
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
        uint8_t h[HDR_BYTES];
        uint64_t hash;
        struct stat sb;
        const char *why = NULL;
        bool foreign;
        int fd;

        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0 || strcmp(nm, "LOCK") == 0)
            continue;
        if (name_parse(nm, ".tmp", &hash)) {
            td_info("kvtier %s: %s: unfinished write; deleted", kt->dir, nm);
            unlinkat(kt->dirfd, nm, 0);
            continue;
        }
        if (!name_parse(nm, ".kvb", &hash)) {
            td_warn("kvtier %s: %s: not a cache file; left alone", kt->dir, nm);
            continue;
        }
        fd = openat(kt->dirfd, nm, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 || fstat(fd, &sb) != 0) {
            why = "cannot open";
        } else if (!S_ISREG(sb.st_mode)) {
            why = "not a regular file";
        } else if ((uint64_t)sb.st_size < HDR_BYTES) {
            why = "shorter than a header";
        } else if (pread(fd, h, HDR_BYTES, 0) != HDR_BYTES) {
            why = "header read failed";
        } else {
            why = hdr_check(kt, h, hash, (uint64_t)sb.st_size, &foreign);
        }
        if (fd >= 0)
            close(fd);
        if (why != NULL) {
            td_warn("kvtier %s: %s: %s; deleted", kt->dir, nm, why);
            kt->st.corrupt++;
            unlinkat(kt->dirfd, nm, 0);
            deleted++;
            continue;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            found_t *nf = realloc(found, ncap * sizeof(*found));

            if (nf == NULL) {
                td_error("kvtier %s: scan: out of memory", kt->dir);
                st = TD_ERR_NOMEM;
                goto cleanup;
            }
            found = nf;
            cap = ncap;
        }
        found[n++] = (found_t){ hash, (uint64_t)sb.st_size, get_le64(h + OFF_PAYLOAD),
                                get_le64(h + OFF_SNAP), get_le32(h + OFF_G), sb.st_mtim };
    }
    if (n > 1)
        qsort(found, n, sizeof(*found), found_cmp);
    for (size_t i = 0; i < n; i++) {
        ent_t *e = ent_get(kt, found[i].hash);

        if (e == NULL) {
            st = TD_ERR_NOMEM;
            goto cleanup;
        }
        ssd_index(kt, e, found[i].g, found[i].bytes, found[i].payload, found[i].snapshot);
        kt->disk_bytes += found[i].bytes;
    }
    while (kt->disk_bytes > kt->cfg.ssd_budget) {
        ent_t *v = kt->ssd_lru.head;
        uint64_t hash = v->node.key, bytes = v->ssd_bytes;

        ssd_unindex(kt, v);
        ent_release_if_empty(kt, v);
        io_unlink(kt, hash);
        kt->disk_bytes -= bytes;
        deleted++;
    }
    td_info("kvtier %s: %" PRIu64 " records of %" PRIu64 " bytes found, %zu files deleted",
            kt->dir, kt->st.ssd_records, kt->st.ssd_bytes, deleted);
cleanup:
    free(found);
    closedir(d);
    return st;
}

/* ---- Create and destroy ----------------------------------------------------- */
static void *reader_main(void *arg);   /* below, with get_many */

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
        blob_unref(j->blob);
        free(j);
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
    if (kt->lockfd >= 0)
        close(kt->lockfd);
    if (kt->dirfd >= 0)
        close(kt->dirfd);
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
    kt->dirfd = kt->lockfd = -1;
    pthread_mutex_init(&kt->mu, NULL);
    pthread_cond_init(&kt->work, NULL);
    pthread_cond_init(&kt->idle, NULL);
    pthread_mutex_init(&kt->rmu, NULL);
    pthread_mutex_init(&kt->rbusy, NULL);
    pthread_cond_init(&kt->rwork, NULL);
    pthread_cond_init(&kt->rdone, NULL);
    if ((st = map_init(&kt->index)) != TD_OK || (st = map_init(&kt->evmap)) != TD_OK)
        goto err_free;
    if (cfg->ssd_dir != NULL && cfg->ssd_dir[0] != '\0') {
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
    }
    kt->st.host_budget = cfg->host_budget;
    kt->st.ssd_budget = kt->dir != NULL ? cfg->ssd_budget : 0;
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
    return r != NULL && r->hash != 0 && r->block_tokens > 0 && r->block_tokens <= MAX_G &&
           r->tokens != NULL && r->payload != NULL && r->payload_bytes > 0 &&
           r->payload_bytes <= MAX_PART && r->snapshot_bytes <= MAX_PART &&
           (r->snapshot == NULL) == (r->snapshot_bytes == 0);
}

td_status_t
td_kvtier_put(td_kvtier_t *kt, const td_kvrec_t *rec)
{
    blob_t *b = NULL;
    job_t *j = NULL;
    bool want_host, want_ssd;
    uint64_t bytes;

    if (!rec_valid(rec)) {
        td_warn("kvtier: put of a malformed record (block %016" PRIx64 ")",
                rec != NULL ? rec->hash : 0);
        return TD_ERR_INVALID;
    }
    bytes = rec_file_bytes(rec->block_tokens, rec->payload_bytes, rec->snapshot_bytes);
    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, rec->hash);

    if (e != NULL && e->host != NULL)
        lru_touch(&kt->host_lru, e, hlink);
    if (e != NULL && e->ssd)
        lru_touch(&kt->ssd_lru, e, slink);
    want_host = !(e != NULL && e->host != NULL) && bytes <= kt->cfg.host_budget;
    want_ssd = kt->dir != NULL && !(e != NULL && e->ssd);
    if (want_ssd && (kt->q_writes >= kt->cfg.queue_cap || bytes > kt->cfg.ssd_budget)) {
        kt->st.writes_dropped++;
        want_ssd = false;
    }
    if (want_ssd && e != NULL && e->host != NULL)
        b = blob_ref(e->host);
    pthread_mutex_unlock(&kt->mu);
    if (!want_host && !want_ssd)
        return TD_OK;

    if (b == NULL) {
        if ((b = blob_alloc(rec->block_tokens, rec->payload_bytes, rec->snapshot_bytes)) == NULL)
            goto err_nomem;
        hdr_fill(b->data, &kt->cfg, rec->hash, rec->parent, rec->end, rec->block_tokens,
                 rec->payload_bytes, rec->snapshot_bytes);
        memcpy(b->data + HDR_BYTES, rec->tokens, (size_t)rec->block_tokens * 4);
        memcpy((uint8_t *)blob_payload(b), rec->payload, rec->payload_bytes);
        if (rec->snapshot_bytes > 0)
            memcpy((uint8_t *)blob_snapshot(b), rec->snapshot, rec->snapshot_bytes);
    }
    if (want_ssd && (j = calloc(1, sizeof(*j))) == NULL)
        goto err_nomem;

    pthread_mutex_lock(&kt->mu);
    if (want_host)
        host_insert(kt, rec->hash, b);
    if (want_ssd) {
        if (kt->q_writes >= kt->cfg.queue_cap) {
            kt->st.writes_dropped++;
            free(j);
        } else {
            j->kind = JOB_WRITE;
            j->hash = rec->hash;
            j->blob = blob_ref(b);
            j->parent = rec->parent;
            j->end = rec->end;
            j->epoch = kt->epoch;
            queue_push(kt, j);
        }
    }
    pthread_mutex_unlock(&kt->mu);
    blob_unref(b);
    return TD_OK;

err_nomem:
    blob_unref(b);
    td_log_every(TD_LOG_ERROR, 10000, "kvtier: block %016" PRIx64 ": put: out of memory",
                 rec->hash);
    return TD_ERR_NOMEM;
}

unsigned
td_kvtier_has(td_kvtier_t *kt, uint64_t hash)
{
    unsigned tiers = 0;

    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (e != NULL)
        tiers = (e->host != NULL ? TD_KVTIER_HOST : 0) | (e->ssd ? TD_KVTIER_SSD : 0);
    pthread_mutex_unlock(&kt->mu);
    return tiers;
}

/* ---- Get -------------------------------------------------------------------- */
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
    return TD_OK;
}

/* Drops the SSD entry of hash made at gen (if it is still that one): the file
 * is queued for deletion, or (gone) its bytes leave the count. mu not held. */
static void
ssd_reject(td_kvtier_t *kt, uint64_t hash, uint64_t gen, bool gone)
{
    job_t *j = gone ? NULL : malloc(sizeof(*j));

    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (!gone)
        kt->st.corrupt++;
    kt->st.misses++;
    if (e != NULL && e->ssd && e->ssd_gen == gen) {
        if (gone) {
            ssd_unindex(kt, e);
            kt->disk_bytes -= e->ssd_bytes;
        } else {
            ssd_doom(kt, e, j);
            j = NULL;
        }
        ent_release_if_empty(kt, e);
    }
    pthread_mutex_unlock(&kt->mu);
    free(j);
}

/* Reads hash's file (fd: opened already, or -1) into out and checks it. */
static td_status_t
get_ssd(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
        td_kvtier_out_t *out, int fd, uint32_t eg, uint64_t bytes, uint64_t payload,
        uint64_t snap, uint64_t gen)
{
    char name[NAME_LEN];
    uint8_t hdr[HDR_BYTES];
    int32_t stack_tokens[512];
    int32_t *tokens = stack_tokens;
    const char *why = NULL;
    bool foreign;
    td_status_t st = TD_ERR_NOT_FOUND;

    rec_name(name, hash, ".kvb");
    if (payload > out->payload_cap || snap > out->snapshot_cap || (snap > 0 && out->snapshot == NULL)) {
        td_warn("kvtier %s: %s: record of %" PRIu64 "+%" PRIu64 " bytes: the caller's buffers hold %"
                PRIu64 "+%" PRIu64, kt->dir, name, payload, snap, out->payload_cap, out->snapshot_cap);
        if (fd >= 0)
            close(fd);
        return TD_ERR_TOO_BIG;
    }
    if (fd < 0 && (fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC)) < 0) {
        int err = errno;

        td_warn("kvtier %s: %s: cannot open: %s", kt->dir, name, strerror(err));
        if (err == ENOENT) {
            ssd_reject(kt, hash, gen, true);
        } else {
            pthread_mutex_lock(&kt->mu);
            kt->st.misses++;
            pthread_mutex_unlock(&kt->mu);
        }
        return TD_ERR_NOT_FOUND;
    }
    if (eg > 512 && (tokens = malloc((size_t)eg * 4)) == NULL) {
        close(fd);
        return TD_ERR_NOMEM;
    }
    uint8_t extra;   /* a byte past the end: a longer file reads into it */
    struct iovec iov[5] = {
        { hdr, HDR_BYTES }, { tokens, (size_t)eg * 4 }, { out->payload, payload },
        { out->snapshot, snap }, { &extra, 1 },
    };
    ssize_t r;

    if (snap == 0)
        iov[3] = iov[4];
    do
        r = preadv(fd, iov, snap > 0 ? 5 : 4, 0);
    while (r < 0 && errno == EINTR);
    {
        if (r < 0)
            why = "read failed";
        else if ((uint64_t)r != bytes)
            why = "size differs from the index (truncated or replaced)";
        else if ((why = hdr_check(kt, hdr, hash, bytes, &foreign)) != NULL)
            ;
        else if (get_le32(hdr + OFF_G) != eg || get_le64(hdr + OFF_PAYLOAD) != payload ||
                 get_le64(hdr + OFF_SNAP) != snap)
            why = "sizes differ from the index";
        else if (rec_checksum(hdr, tokens, eg, out->payload, payload, out->snapshot, snap) !=
                 get_le64(hdr + OFF_CSUM))
            why = "checksum mismatch";
        else if (eg != g || memcmp(tokens, expect, (size_t)g * 4) != 0)
            why = "holds other tokens (hash collision)";
    }
    if (why != NULL) {
        td_warn("kvtier %s: %s: %s; deleted", kt->dir, name, why);
        close(fd);
        ssd_reject(kt, hash, gen, false);
        goto cleanup;
    }
    pthread_mutex_lock(&kt->mu);
    ent_t *te = ent_find(kt, hash);
    uint64_t now = td_clock_ns();
    bool touch = te != NULL && te->ssd_gen == gen && now - te->ssd_mtime_ns > MTIME_EVERY_NS;

    if (touch)
        te->ssd_mtime_ns = now;
    pthread_mutex_unlock(&kt->mu);
    if (touch)
        futimens(fd, NULL);   /* the LRU order a restart sees; best effort */
    close(fd);
    out->payload_bytes = payload;
    out->snapshot_bytes = snap;
    out->tier = TD_KVTIER_SSD;

    blob_t *b = NULL;

    if (bytes <= kt->cfg.host_budget && (b = blob_alloc(eg, payload, snap)) != NULL) {
        memcpy(b->data, hdr, HDR_BYTES);
        memcpy(b->data + HDR_BYTES, tokens, (size_t)eg * 4);
        memcpy((uint8_t *)blob_payload(b), out->payload, payload);
        if (snap > 0)
            memcpy((uint8_t *)blob_snapshot(b), out->snapshot, snap);
    }
    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (e != NULL && e->ssd && e->ssd_gen == gen)
        lru_touch(&kt->ssd_lru, e, slink);
    kt->st.hits_ssd++;
    kt->st.bytes_read += bytes;
    if (b != NULL)
        host_insert(kt, hash, b);
    pthread_mutex_unlock(&kt->mu);
    blob_unref(b);
    st = TD_OK;
cleanup:
    if (tokens != stack_tokens)
        free(tokens);
    return st;
}

/* One block: host, else SSD (fd: its file opened already, or -1). */
static td_status_t
get_one(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
        td_kvtier_out_t *out, int fd)
{
    blob_t *b = NULL;
    uint32_t eg = 0;
    uint64_t bytes = 0, payload = 0, snap = 0, gen = 0;

    pthread_mutex_lock(&kt->mu);
    ent_t *e = ent_find(kt, hash);

    if (e != NULL && e->host != NULL) {
        b = blob_ref(e->host);
        lru_touch(&kt->host_lru, e, hlink);
    } else if (e != NULL && e->ssd) {
        eg = e->ssd_g;
        bytes = e->ssd_bytes;
        payload = e->ssd_payload;
        snap = e->ssd_snapshot;
        gen = e->ssd_gen;
    } else {
        kt->st.misses++;
    }
    pthread_mutex_unlock(&kt->mu);

    if (b != NULL) {
        td_status_t st;

        if (fd >= 0)
            close(fd);
        if (b->payload_bytes > out->payload_cap || b->snapshot_bytes > out->snapshot_cap ||
            (b->snapshot_bytes > 0 && out->snapshot == NULL)) {
            td_warn("kvtier: block %016" PRIx64 ": record of %" PRIu64 "+%" PRIu64
                    " bytes: the caller's buffers hold %" PRIu64 "+%" PRIu64, hash,
                    b->payload_bytes, b->snapshot_bytes, out->payload_cap, out->snapshot_cap);
            st = TD_ERR_TOO_BIG;
        } else {
            st = get_host(kt, b, hash, expect, g, out);
            if (st == TD_OK) {
                pthread_mutex_lock(&kt->mu);
                kt->st.hits_host++;
                pthread_mutex_unlock(&kt->mu);
            }
        }
        blob_unref(b);
        return st;
    }
    if (gen == 0) {
        if (fd >= 0)
            close(fd);
        return TD_ERR_NOT_FOUND;
    }
    return get_ssd(kt, hash, expect, g, out, fd, eg, bytes, payload, snap, gen);
}

td_status_t
td_kvtier_get(td_kvtier_t *kt, uint64_t hash, const int32_t *expect_tokens, uint32_t block_tokens,
              td_kvtier_out_t *out)
{
    return get_one(kt, hash, expect_tokens, block_tokens, out, -1);
}

/* ---- Chains: get_many, with the reader threads ------------------------------
 * A batch's blocks are claimed one at a time, first to open each SSD file and
 * start its readahead (POSIX_FADV_WILLNEED: the device sees the whole chain at
 * once), then to read and check it; the caller and the reader threads claim
 * alike. fds[i]: -1 not opened yet, -2 taken by the block's reader, else the
 * opened file the reader takes. One batch at a time uses the threads; a
 * second caller meanwhile reads its chain alone. */
struct rbatch {
    const uint64_t *hashes;
    const int32_t *tokens;
    uint32_t g;
    td_kvtier_out_t *outs;
    td_status_t *sts;
    _Atomic int *fds;
    size_t n;
    _Atomic size_t next_open, next_read;
    int helpers;                /* reader threads inside, under rmu */
};

static void
rbatch_work(td_kvtier_t *kt, rbatch_t *b)
{
    size_t i;

    while ((i = atomic_fetch_add(&b->next_open, 1)) < b->n) {
        char name[NAME_LEN];
        bool on_ssd;
        int fd, none = -1;

        pthread_mutex_lock(&kt->mu);
        ent_t *e = ent_find(kt, b->hashes[i]);

        on_ssd = e != NULL && e->host == NULL && e->ssd;
        pthread_mutex_unlock(&kt->mu);
        if (!on_ssd)
            continue;
        rec_name(name, b->hashes[i], ".kvb");
        if ((fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        if (!atomic_compare_exchange_strong(&b->fds[i], &none, fd))
            close(fd);   /* its reader came first */
    }
    while ((i = atomic_fetch_add(&b->next_read, 1)) < b->n) {
        int fd = atomic_exchange(&b->fds[i], -2);

        b->sts[i] = get_one(kt, b->hashes[i], b->tokens + i * b->g, b->g, &b->outs[i],
                            fd >= 0 ? fd : -1);
    }
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

td_status_t
td_kvtier_get_many(td_kvtier_t *kt, const uint64_t *hashes, size_t n, const int32_t *expect_tokens,
                   uint32_t block_tokens, td_kvtier_out_t *outs, size_t *n_hit)
{
    _Atomic int stack_fds[64];
    td_status_t stack_sts[64];
    _Atomic int *fds = n <= 64 ? stack_fds : malloc(n * sizeof(*fds));
    td_status_t *sts = n <= 64 ? stack_sts : malloc(n * sizeof(*sts));
    rbatch_t b = { hashes, expect_tokens, block_tokens, outs, sts, fds, n, 0, 0, 0 };
    td_status_t st = TD_OK;
    bool shared = false;
    size_t i;

    *n_hit = 0;
    if (fds == NULL || sts == NULL) {
        st = TD_ERR_NOMEM;
        goto cleanup;
    }
    for (i = 0; i < n; i++)
        atomic_init(&fds[i], -1);
    if (kt->nreaders > 0 && n > 1 && pthread_mutex_trylock(&kt->rbusy) == 0) {
        shared = true;
        pthread_mutex_lock(&kt->rmu);
        kt->rb = &b;
        kt->rb_seq++;
        pthread_cond_broadcast(&kt->rwork);
        pthread_mutex_unlock(&kt->rmu);
    }
    rbatch_work(kt, &b);
    if (shared) {
        pthread_mutex_lock(&kt->rmu);
        kt->rb = NULL;
        while (b.helpers > 0)
            pthread_cond_wait(&kt->rdone, &kt->rmu);
        pthread_mutex_unlock(&kt->rmu);
        pthread_mutex_unlock(&kt->rbusy);
    }
    for (i = 0; i < n && sts[i] == TD_OK; i++)
        ;
    *n_hit = i;
    if (i < n && sts[i] != TD_ERR_NOT_FOUND)
        st = sts[i];
cleanup:
    if (fds != stack_fds)
        free(fds);
    if (sts != stack_sts)
        free(sts);
    return st;
}

/* ---- Flush, events, stats --------------------------------------------------- */
void
td_kvtier_flush(td_kvtier_t *kt)
{
    pthread_mutex_lock(&kt->mu);
    kt->epoch++;
    for (job_t **p = &kt->q_head; *p != NULL;) {
        job_t *j = *p;

        if (j->kind == JOB_WRITE) {
            *p = j->next;
            blob_unref(j->blob);
            free(j);
            kt->q_writes--;
        } else {
            p = &j->next;
        }
    }
    kt->q_tail = NULL;
    for (job_t *q = kt->q_head; q != NULL; q = q->next)
        kt->q_tail = q;
    while (kt->host_lru.head != NULL) {
        ent_t *e = kt->host_lru.head;

        host_drop(kt, e);
        ent_release_if_empty(kt, e);
    }
    while (kt->ssd_lru.head != NULL) {
        ent_t *e = kt->ssd_lru.head;

        ssd_doom(kt, e, malloc(sizeof(job_t)));
        ent_release_if_empty(kt, e);
    }
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
        map_remove(&kt->evmap, &ev->node);
        if (ev->prev != NULL) ev->prev->next = ev->next; else kt->ev_head = ev->next;
        if (ev->next != NULL) ev->next->prev = ev->prev; else kt->ev_tail = ev->prev;
        free(ev);
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
