/* kvcache/kvtier_int.h — the insides of the prefix cache's host and SSD tiers
 * (kvtier.h), shared by the files of kvcache/ that implement them and by no
 * one else: the lock order, the object, and the records, entries, files and
 * runs its parts pass to each other. docs/kvtier.md says what each does.
 *
 * The files, lowest first; each calls only the ones above it:
 *   kvlock.c     locks that check the lock order below in debug builds
 *   kvrec.c      the SSD record and file format; records in memory (blobs)
 *   kvindex.c    the index (hash -> entry, a base/hmap.h table), the host and
 *                file LRU lists, the events; has, drain_events, snapshot
 *   kvhost.c     the host tier: insert within its budget, drop, copy out
 *   kvssd.c      the SSD files: the write-back queue and its IO thread,
 *                deletions, the directory's scan at create
 *   kvrun.c      runs: consecutive records of one file read with one read;
 *                their buffers
 *   kvprefetch.c read-ahead: the prefetch thread and its runs; prefetch
 *   kvread.c     the reads: get (one record, checked), get_many (a chain:
 *                Linux AIO or the reader threads)
 *   kvobject.c   the object: create, destroy, put, flush, stats
 *
 * ---- Lock order ---------------------------------------------------------------
 * A thread takes these only in this order, and never two of one level
 * (kvlock.c checks it on every lock where NDEBUG is not defined):
 *   1. KVLOCK_CHAIN — aio_mu (get_many's AIO context, one chain at a time) or
 *      rbusy (the reader threads, one chain at a time): a get_many holds one
 *      of them while it reads its chain (never both: tried in turn);
 *   2. KVLOCK_MU — mu: the index, both LRUs, the events, the write-back queue,
 *      the counters (st, disk_bytes), the prefetch queue and run states;
 *   3. KVLOCK_RMU — rmu: the reader threads' batch and the run buffers.
 * No IO under mu or rmu: no read, write, open, close or unlink (the IO
 * thread lets mu go around each; create's scan runs before any thread).
 * Condition variables: work, idle, pf_work, pf_done wait on mu; rwork, rdone
 * on rmu. */
#ifndef TD_KVTIER_INT_H
#define TD_KVTIER_INT_H

#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "hmap.h"
#include "kvtier.h"

/* ---- Locks (kvlock.c) -------------------------------------------------------- */
enum { KVLOCK_CHAIN = 1, KVLOCK_MU = 2, KVLOCK_RMU = 3 };

typedef struct {
    pthread_mutex_t m;
    unsigned level;             /* KVLOCK_*: taken only while every lock held is lower */
    const char *name;
} kvlock_t;

void kvlock_init(kvlock_t *l, unsigned level, const char *name);
void kvlock_destroy(kvlock_t *l);
void kvlock_lock(kvlock_t *l);
bool kvlock_trylock(kvlock_t *l);   /* true when taken */
void kvlock_unlock(kvlock_t *l);
/* pthread_cond_wait on l (held), and the same for at most ns nanoseconds
 * (cv made with td_clock_cond_init). */
void kvlock_wait(pthread_cond_t *cv, kvlock_t *l);
void kvlock_wait_ns(pthread_cond_t *cv, kvlock_t *l, uint64_t ns);

/* ---- The SSD record format (kvrec.c; docs/kvtier.md, "File format") ---------- */
#define HDR_BYTES     80        /* a record's header */
#define NAME_LEN      32        /* "<16 hex>.kvb" and its NUL, with room */
#define PACK_HDR      40        /* a file's header */
#define PACK_ENT      40        /* an entry of its table */
#define PACK_MAX      256u      /* records per file at most */

/* The bytes of a record in a file: header, tokens, payload, snapshot. */
static inline uint64_t
kvrec_bytes(uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes)
{
    return HDR_BYTES + (uint64_t)g * 4 + payload_bytes + snapshot_bytes;
}

/* A blob is a record's file image (checksum field zero), immutable once built
 * and shared by the host tier and the write queue through its count. */
typedef struct {
    _Atomic uint32_t refs;
    uint32_t g;
    uint64_t bytes;             /* the image: kvrec_bytes(g, payload, snapshot) */
    uint64_t payload_bytes, snapshot_bytes;
    uint8_t data[];             /* [bytes] */
} kvblob_t;

static inline const int32_t *kvblob_tokens(const kvblob_t *b) { return (const int32_t *)(b->data + HDR_BYTES); }
static inline const uint8_t *kvblob_payload(const kvblob_t *b) { return b->data + HDR_BYTES + (uint64_t)b->g * 4; }
static inline const uint8_t *kvblob_snapshot(const kvblob_t *b) { return kvblob_payload(b) + b->payload_bytes; }

void kvrec_name(char *buf, uint64_t hash, const char *ext);          /* buf[NAME_LEN] */
bool kvrec_name_parse(const char *name, const char *ext, uint64_t *hash);
bool kvrec_valid(const td_kvrec_t *r);
kvblob_t *kvrec_blob_alloc(uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes);
kvblob_t *kvrec_blob_of(const td_kvtier_config_t *cfg, const td_kvrec_t *rec);
/* A blob of a record read from a file (hdr: its header as read). */
kvblob_t *kvrec_blob_read(const uint8_t *hdr, const void *tokens, uint32_t g,
                          const void *payload, uint64_t payload_bytes, const void *snapshot,
                          uint64_t snapshot_bytes);
kvblob_t *kvrec_blob_ref(kvblob_t *b);
void kvrec_blob_unref(kvblob_t *b);   /* NULL: nothing */
uint64_t kvrec_blob_hash(const kvblob_t *b);

/* What is wrong with a record read from a file (hdr and tokens: as read;
 * payload and snapshot: where they were read to) that should be block hash
 * of sizes g, payload_bytes, snapshot_bytes (the file's table), or NULL. */
const char *kvrec_check(const td_kvtier_config_t *cfg, const uint8_t *hdr, uint64_t hash,
                        uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes,
                        const void *tokens, const void *payload, const void *snapshot);
/* The iovecs of a file of blobs[n]: tab (PACK_HDR + n * PACK_ENT bytes), then
 * per record hdrs[i] (its header with its checksum) and the blob's body; all
 * filled here. iov: 1 + 2n entries. */
void kvrec_pack(const td_kvtier_config_t *cfg, kvblob_t *const *blobs, uint32_t n, uint8_t *tab,
                uint8_t (*hdrs)[HDR_BYTES], struct iovec *iov);
/* What is wrong with a file's header (PACK_HDR bytes), or NULL with *n, its
 * record count; *foreign: well-formed, of another layout or seed. */
const char *kvrec_pack_check(const td_kvtier_config_t *cfg, const uint8_t *hdr, uint32_t *n,
                             bool *foreign);

/* A file's table, parsed (kvrec_table_parse). */
typedef struct {
    uint64_t *hashes, *offs, *pays, *snaps;   /* [n] */
    uint32_t *gs;                              /* [n] */
} kvtable_t;

/* What is wrong with the table of file `name` of `size` bytes (tab: header
 * and table, n records), or NULL with t filled. */
const char *kvrec_table_parse(const uint8_t *tab, uint32_t n, uint64_t name, uint64_t size,
                              kvtable_t *t);

/* ---- The index (kvindex.c) --------------------------------------------------- */
/* The tier's four maps (index, evmap, pfmap, pfqmap) are base/hmap.h tables
 * from a block's hash to a pointer, one entry per hash; mu locks them. */
#define KVMAP_HINT 512          /* entries each holds before it first grows */

/* What key maps to in m, or NULL. */
static inline void *
kvmap_get(const td_hmap_t *m, uint64_t key)
{
    uint64_t v = td_hmap_get(m, key);

    return v != TD_HMAP_NONE ? (void *)(uintptr_t)v : NULL;
}

typedef struct kvent kvent_t;
typedef struct kvfile kvfile_t;

struct kvfile {                 /* one file of the SSD tier: the records of one put batch */
    uint64_t name;              /* its first record's hash: <name:016x>.kvb */
    uint64_t bytes;             /* its size */
    uint64_t gen;               /* files indexed before it, + 1: a reader's check */
    uint64_t mtime_ns;          /* td_clock_ns when its mtime was last set by us */
    kvfile_t *prev, *next;      /* SSD LRU */
    uint32_t nrec;
    uint64_t hashes[];          /* [nrec] its records */
};

typedef struct {
    kvfile_t *head, *tail;      /* head: least recently used */
} kvflru_t;

typedef struct {
    kvent_t *head, *tail;       /* head: least recently used */
} kvlru_t;

struct kvent {                  /* one hash held by the host tier, the SSD tier or both */
    uint64_t hash;              /* its key in the index */
    kvblob_t *host;             /* the host copy, or NULL */
    kvent_t *hprev, *hnext;     /* in the host LRU while host != NULL */
    kvfile_t *file;             /* the SSD file holding it, or NULL */
    uint64_t off;               /* its record's offset in file */
    uint32_t g;                 /* the record's sizes (while file != NULL) */
    uint64_t payload, snapshot;
};

/* A block's place on SSD, copied under mu. */
typedef struct {
    uint64_t name, gen, off, payload, snap;
    uint32_t g;
} kvwhere_t;

/* ---- Runs (kvrun.c) ---------------------------------------------------------- */
#define RUN_ALIGN 4096u         /* O_DIRECT's alignment */
#define RUN_MAX   (1u << 18)    /* a run's span at most */
#define RUN_BUFS  32            /* buffers kept for reuse */

typedef struct {
    uint64_t name, gen;         /* the file */
    uint64_t lo, hi;            /* the span of the run's records, aligned */
    size_t first, last;         /* its blocks: [first, last] of the chain */
    uint8_t *buf;               /* [cap >= hi - lo] read, or NULL */
    uint64_t cap;
    uint64_t got;               /* bytes read */
    int fd;
    bool direct;                /* fd is O_DIRECT */
} kvrun_t;

typedef struct {
    uint8_t *p;                 /* aligned for O_DIRECT */
    uint64_t cap;
} kvrbuf_t;

/* A block of a chain read ahead: its record's bytes in a run's buffer. */
typedef struct kvpfrun kvpfrun_t;
typedef struct {
    const uint8_t *rec;         /* NULL: not read ahead (or past the end of the file) */
    uint64_t gen;               /* its file's gen when read */
    int fd;                     /* the run's file */
    kvpfrun_t *pf;              /* the prefetch run it is in (claimed), or NULL */
} kvpre_t;

/* ---- The object -------------------------------------------------------------- */
typedef struct kvjob kvjob_t;       /* kvssd.c */
typedef struct kvrbatch kvrbatch_t; /* kvread.c */
typedef struct kvpfjob kvpfjob_t;   /* kvprefetch.c */
typedef struct kvevnode kvevnode_t; /* kvindex.c */

struct td_kvtier {
    td_kvtier_config_t cfg;     /* ssd_dir: our copy in dir */
    char *dir;                  /* NULL: no SSD tier */
    int dirfd, lockfd;

    kvlock_t mu;                /* KVLOCK_MU: what follows, to the reader threads */
    pthread_cond_t work;        /* the IO thread waits for jobs */
    pthread_cond_t idle;        /* wait_idle waits for an empty queue */
    pthread_t io;
    bool io_started, stop, stalled, busy;

    td_hmap_t *index;           /* hash -> kvent_t * */
    kvlru_t host_lru;
    kvflru_t ssd_lru;
    td_hmap_t *evmap;           /* hash -> kvevnode_t * */
    kvevnode_t *ev_head, *ev_tail;

    kvjob_t *q_head, *q_tail;
    uint64_t q_writes;          /* records in the queue's writes */
    uint64_t epoch;             /* flushes so far */
    uint64_t gen;               /* files indexed so far */
    uint64_t disk_bytes;        /* index + temp file + files not yet deleted */
    td_kvtier_stats_t st;

    /* the reader threads of get_many (rmu: rb, rb_seq, rstop, helpers, bufs) */
    pthread_t *readers;
    uint32_t nreaders;
    kvlock_t rmu;               /* KVLOCK_RMU */
    kvlock_t rbusy;             /* KVLOCK_CHAIN: one chain at a time uses the threads */
    pthread_cond_t rwork, rdone;
    kvrbatch_t *rb;
    uint64_t rb_seq;
    bool rstop;
    kvrbuf_t bufs[RUN_BUFS];    /* run buffers kept for reuse */
    uint32_t nbufs;
    kvlock_t aio_mu;            /* KVLOCK_CHAIN: one chain at a time uses aio */
    aio_context_t aio;          /* Linux AIO for get_many's reads, or 0 (aio_mu) */
#ifdef TD_KVTIER_TEST_HOOKS
    _Atomic unsigned test_fail_getevents;   /* td_kvtier_test_fail_getevents */
#endif

    /* the prefetch thread and its runs (mu: all of it but pf, pf_aio) */
    pthread_t pf;
    bool pf_started, pf_stop;
    pthread_cond_t pf_work;     /* the thread waits for chains and free runs */
    pthread_cond_t pf_done;     /* a get_many waits for a run being read */
    kvpfjob_t *pf_head, *pf_tail;
    uint64_t pf_queued;         /* blocks of the queued chains */
    td_hmap_t *pfmap;           /* hash -> the block of a run read or being read ahead */
    td_hmap_t *pfqmap;          /* hash -> the block of a queued chain, no run yet */
    kvpfrun_t *pfruns;          /* [PF_DEPTH] */
    aio_context_t pf_aio;       /* the prefetch thread's own, or 0 */
};

/* ---- kvindex.c (mu held, or before any thread, but for init and free) -------- */
td_status_t kvindex_init(td_kvtier_t *kt);
void kvindex_free(td_kvtier_t *kt);   /* the entries, their host copies, the events */
kvent_t *kvindex_find(td_kvtier_t *kt, uint64_t hash);
/* The entry of hash, made (and announced) if new; NULL when out of memory. */
kvent_t *kvindex_get(td_kvtier_t *kt, uint64_t hash);
/* Frees an entry that neither tier holds any more (and announces it). */
void kvindex_release(td_kvtier_t *kt, kvent_t *e);
kvwhere_t kvindex_where(const kvent_t *e);   /* e->file set */
void kvindex_lru_append(kvlru_t *l, kvent_t *e);
void kvindex_lru_unlink(kvlru_t *l, kvent_t *e);
void kvindex_lru_touch(kvlru_t *l, kvent_t *e);
void kvindex_flru_touch(kvflru_t *l, kvfile_t *f);
/* A new file in the SSD index (t: its table), and its records' entries. */
void kvindex_file_add(td_kvtier_t *kt, kvfile_t *f, const kvtable_t *t);
/* Takes f out of the SSD index with its records; its bytes stay in
 * disk_bytes; the caller frees f. */
void kvindex_file_remove(td_kvtier_t *kt, kvfile_t *f);

/* ---- kvhost.c (mu held but for get) ------------------------------------------ */
/* Keeps b in the host tier under hash (a count of its own), evicting the
 * least recently used; not when b is bigger than the budget or hash has one. */
void kvhost_insert(td_kvtier_t *kt, uint64_t hash, kvblob_t *b);
void kvhost_drop(td_kvtier_t *kt, kvent_t *e);   /* e->host set; e stays */
void kvhost_clear(td_kvtier_t *kt);
/* Copies the host record b of hash (a count held) out when its tokens are
 * expect[g], else drops it: a miss. mu not held. */
td_status_t kvhost_get(td_kvtier_t *kt, kvblob_t *b, uint64_t hash, const int32_t *expect,
                       uint32_t g, td_kvtier_out_t *out);

/* ---- kvssd.c ----------------------------------------------------------------- */
td_status_t kvssd_open(td_kvtier_t *kt);   /* the directory, its lock and scan */
td_status_t kvssd_start(td_kvtier_t *kt);  /* the IO thread */
void kvssd_stop(td_kvtier_t *kt);          /* finishes the queue; mu not held */
void kvssd_free(td_kvtier_t *kt);          /* the queue and the files (threads gone) */
/* A write job for up to n records, or NULL; made outside mu. */
kvjob_t *kvssd_write_new(uint32_t n);
/* Queues j with one count of each blobs[i] for which want[i] (mu held);
 * dropped (writes_dropped, j freed) when it does not fit the queue. */
void kvssd_write_queue(td_kvtier_t *kt, kvjob_t *j, kvblob_t *const *blobs, const bool *want,
                       uint32_t n);
/* Takes f out of the index and queues its deletion (j: made with
 * kvssd_delete_new, or NULL: the file stays and its bytes stay counted,
 * logged); frees f. mu held. */
kvjob_t *kvssd_delete_new(void);
void kvssd_doom(td_kvtier_t *kt, kvfile_t *f, kvjob_t *j);
/* A file found gone: out of the index and the byte count; frees f. mu held. */
void kvssd_forget(td_kvtier_t *kt, kvfile_t *f);
/* Queued writes dropped, every file doomed (mu held). */
void kvssd_flush(td_kvtier_t *kt);

/* ---- kvrun.c ----------------------------------------------------------------- */
/* A run of block i alone (its record at w), its span aligned for O_DIRECT. */
kvrun_t kvrun_start(const kvwhere_t *w, size_t i);
/* Adds block i (at w) to r when it continues r: the next block, of the same
 * file, the span within max bytes. */
bool kvrun_extend(kvrun_t *r, const kvwhere_t *w, size_t i, uint64_t max);
/* Whether r's read holds the whole record at w. */
bool kvrun_holds(const kvrun_t *r, const kvwhere_t *w);
/* Opens r's file (O_DIRECT where the file system takes it: r->direct) and
 * takes a buffer for it; false when either failed. mu not held. */
bool kvrun_open(td_kvtier_t *kt, kvrun_t *r);
void kvrun_pread(td_kvtier_t *kt, kvrun_t *r);   /* plain where O_DIRECT is refused */
void kvrun_close(kvrun_t *r);                     /* its file; mu not held */
/* Gives r's buffer back (kept while fewer than RUN_BUFS are) and closes its
 * file (then mu not held). */
void kvrun_done(td_kvtier_t *kt, kvrun_t *r);
void kvrun_bufs_free(td_kvtier_t *kt);

/* ---- kvprefetch.c ------------------------------------------------------------ */
td_status_t kvprefetch_init(td_kvtier_t *kt);
td_status_t kvprefetch_start(td_kvtier_t *kt);  /* its AIO context and thread */
void kvprefetch_stop(td_kvtier_t *kt);
void kvprefetch_free(td_kvtier_t *kt);
void kvprefetch_flush(td_kvtier_t *kt);         /* mu held */
/* If hash was read ahead, claims it into *pre (mu not held; waits for a read
 * in progress); kvprefetch_unclaim when done with pre's bytes. */
bool kvprefetch_claim(td_kvtier_t *kt, uint64_t hash, kvpre_t *pre);
void kvprefetch_unclaim(td_kvtier_t *kt, kvpfrun_t *pr);

/* ---- kvread.c ---------------------------------------------------------------- */
td_status_t kvread_start(td_kvtier_t *kt);   /* its AIO context and the reader threads */
void kvread_stop(td_kvtier_t *kt);
void kvread_free(td_kvtier_t *kt);
#ifdef TD_KVTIER_TEST_HOOKS
/* Tests only: a build of these sources with TD_KVTIER_TEST_HOOKS (the
 * library the daemons link has no hook). get_many's next n io_getevents
 * calls fail (EINVAL) with its reads in flight; how many are left. */
void kvread_test_fail_getevents(td_kvtier_t *kt, unsigned n);
unsigned kvread_test_fail_getevents_left(td_kvtier_t *kt);
#endif

#endif
