/* kvcache/kvssd.c — the SSD tier's files: the directory (held with flock,
 * scanned at create), the write-back queue and its IO thread, which writes
 * each put batch as one file (a temp file renamed into place) within the
 * budget and carries out every deletion, in queue order. docs/kvtier.md,
 * "SSD tier". Reads are kvread.c's. */
#include "kvtier_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

enum { JOB_WRITE, JOB_DELETE };

struct kvjob {
    kvjob_t *next;
    int kind;
    uint64_t name;              /* JOB_DELETE: the file */
    uint64_t bytes;             /* JOB_DELETE: counted in disk_bytes until unlinked */
    uint64_t epoch;             /* JOB_WRITE: flushes before it was queued */
    uint32_t n;                 /* JOB_WRITE: records, one count each */
    kvblob_t *blobs[];          /* [n] */
};

/* ---- The queue (mu held) ----------------------------------------------------- */
static void
queue_push(td_kvtier_t *kt, kvjob_t *j)
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

static void
job_free(kvjob_t *j)
{
    for (uint32_t i = 0; j->kind == JOB_WRITE && i < j->n; i++)
        kvrec_blob_unref(j->blobs[i]);
    free(j);
}

kvjob_t *
kvssd_write_new(uint32_t n)
{
    kvjob_t *j = calloc(1, sizeof(*j) + n * sizeof(kvblob_t *));

    if (j != NULL)
        j->kind = JOB_WRITE;
    return j;
}

void
kvssd_write_queue(td_kvtier_t *kt, kvjob_t *j, kvblob_t *const *blobs, const bool *want,
                  uint32_t n)
{
    uint32_t k = 0;

    for (uint32_t i = 0; i < n; i++)
        k += want[i];
    if (kt->q_writes + k > kt->cfg.queue_cap) {
        kt->st.writes_dropped += k;
        free(j);
        return;
    }
    j->epoch = kt->epoch;
    for (uint32_t i = 0; i < n; i++)
        if (want[i])
            j->blobs[j->n++] = kvrec_blob_ref(blobs[i]);
    queue_push(kt, j);
}

kvjob_t *
kvssd_delete_new(void)
{
    return malloc(sizeof(kvjob_t));
}

void
kvssd_doom(td_kvtier_t *kt, kvfile_t *f, kvjob_t *j)
{
    kvindex_file_remove(kt, f);
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

void
kvssd_forget(td_kvtier_t *kt, kvfile_t *f)
{
    kvindex_file_remove(kt, f);
    kt->disk_bytes -= f->bytes;
    free(f);
}

void
kvssd_flush(td_kvtier_t *kt)
{
    kt->epoch++;
    kt->q_tail = NULL;
    for (kvjob_t **p = &kt->q_head; *p != NULL;) {
        kvjob_t *j = *p;

        if (j->kind == JOB_WRITE) {
            *p = j->next;
            kt->q_writes -= j->n;
            job_free(j);
        } else {
            kt->q_tail = j;
            p = &j->next;
        }
    }
    while (kt->ssd_lru.head != NULL)
        kvssd_doom(kt, kt->ssd_lru.head, kvssd_delete_new());
}

/* ---- The IO thread ----------------------------------------------------------- */
static void
io_unlink(td_kvtier_t *kt, uint64_t name)
{
    char nm[NAME_LEN];

    kvrec_name(nm, name, ".kvb");
    if (unlinkat(kt->dirfd, nm, 0) != 0 && errno != ENOENT)
        td_log_every(TD_LOG_WARN, 10000, "kvtier %s: %s: unlink failed: %s", kt->dir, nm,
                     strerror(errno));
}

/* Writes iov[niov] (bytes in all) to fd from offset 0; 0 or an errno. */
static int
io_pwritev_all(int fd, struct iovec *iov, int niov, uint64_t bytes)
{
    uint64_t done = 0;

    for (int first = 0; done < bytes;) {
        int cnt = niov - first < IOV_MAX ? niov - first : IOV_MAX;
        ssize_t w = pwritev(fd, iov + first, cnt, (off_t)done);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : EIO;
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
    return 0;
}

/* Writes the records blobs[n] (bytes in all) as file `name`: a temp file,
 * fsynced if asked, renamed into place. mu not held. */
static td_status_t
io_write_file(td_kvtier_t *kt, uint64_t name, kvblob_t *const *blobs, uint32_t n, uint64_t bytes)
{
    char tmp[NAME_LEN], nm[NAME_LEN];
    uint8_t *tab = malloc(PACK_HDR + (size_t)n * PACK_ENT);
    uint8_t (*hdrs)[HDR_BYTES] = malloc((size_t)n * HDR_BYTES);
    struct iovec *iov = malloc((1 + 2 * (size_t)n) * sizeof(*iov));
    int fd = -1, err = 0;

    kvrec_name(tmp, name, ".tmp");
    kvrec_name(nm, name, ".kvb");
    if (tab == NULL || hdrs == NULL || iov == NULL) {
        err = ENOMEM;
        goto cleanup;
    }
    kvrec_pack(&kt->cfg, blobs, n, tab, hdrs, iov);
    fd = openat(kt->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        goto cleanup;
    }
    if ((err = io_pwritev_all(fd, iov, 1 + 2 * (int)n, bytes)) != 0)
        goto cleanup;
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
    free(tab);
    return err == 0 ? TD_OK : td_status_from_errno(err);
}

/* Takes the queued deletions out of the queue, into a list; their bytes
 * into *freeing (mu held). */
static kvjob_t *
io_take_deletions(td_kvtier_t *kt, uint64_t *freeing)
{
    kvjob_t **p = &kt->q_head, *dels = NULL;

    kt->q_tail = NULL;
    while (*p != NULL) {
        kvjob_t *d = *p;

        if (d->kind != JOB_DELETE) {
            kt->q_tail = d;
            p = &d->next;
            continue;
        }
        *p = d->next;
        d->next = dels;
        dels = d;
        *freeing += d->bytes;
    }
    return dels;
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
    kvjob_t *dels = NULL;

    while (kt->disk_bytes - freeing + need > kt->cfg.ssd_budget && kt->ssd_lru.head != NULL) {
        kvfile_t *v = kt->ssd_lru.head;

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
        kvindex_file_remove(kt, v);
        free(v);
    }
    if (kt->disk_bytes - freeing + need > kt->cfg.ssd_budget)
        dels = io_take_deletions(kt, &freeing);
    if (nv > 0 || dels != NULL) {
        kvlock_unlock(&kt->mu);
        for (size_t i = 0; i < nv; i++)
            io_unlink(kt, victims[i]);
        for (kvjob_t *d = dels; d != NULL; d = d->next)
            io_unlink(kt, d->name);
        kvlock_lock(&kt->mu);
        kt->disk_bytes -= freeing;
    }
    free(victims);
    while (dels != NULL) {
        kvjob_t *d = dels;

        dels = d->next;
        free(d);
    }
    return kt->disk_bytes + need <= kt->cfg.ssd_budget;
}

/* The job's records that the SSD index does not hold yet, each once, into
 * keep; how many (mu held). */
static uint32_t
io_keep(td_kvtier_t *kt, const kvjob_t *j, kvblob_t **keep)
{
    uint32_t k = 0;

    for (uint32_t i = 0; i < j->n; i++) {
        uint64_t h = kvrec_blob_hash(j->blobs[i]);
        kvent_t *e = kvindex_find(kt, h);
        bool dup = e != NULL && e->file != NULL;

        for (uint32_t m = 0; m < k && !dup; m++)
            dup = kvrec_blob_hash(keep[m]) == h;
        if (!dup)
            keep[k++] = j->blobs[i];
    }
    return k;
}

/* A file of keep[k] and its table; its size, 0 when out of memory. */
static uint64_t
io_file_new(kvblob_t *const *keep, uint32_t k, kvfile_t **f, kvtable_t *t)
{
    uint64_t need = PACK_HDR + (uint64_t)k * PACK_ENT;

    *f = malloc(sizeof(**f) + k * sizeof(uint64_t));
    t->offs = malloc(k * sizeof(uint64_t));
    t->pays = malloc(k * sizeof(uint64_t));
    t->snaps = malloc(k * sizeof(uint64_t));
    t->gs = malloc(k * sizeof(uint32_t));
    if (*f == NULL || !t->offs || !t->pays || !t->snaps || !t->gs)
        return 0;
    t->hashes = (*f)->hashes;
    for (uint32_t i = 0; i < k; i++) {
        t->hashes[i] = kvrec_blob_hash(keep[i]);
        t->offs[i] = need;
        t->pays[i] = keep[i]->payload_bytes;
        t->snaps[i] = keep[i]->snapshot_bytes;
        t->gs[i] = keep[i]->g;
        need += keep[i]->bytes;
    }
    (*f)->name = t->hashes[0];
    (*f)->bytes = need;
    (*f)->nrec = k;
    return need;
}

static void
table_free(kvtable_t *t)
{
    free(t->offs);
    free(t->pays);
    free(t->snaps);
    free(t->gs);
}

/* Writes a job's records not on SSD yet as one file. mu held. */
static void
io_write(td_kvtier_t *kt, kvjob_t *j)
{
    kvblob_t **keep = malloc(j->n * sizeof(*keep));
    kvfile_t *f = NULL;
    kvtable_t t = { 0 };
    uint32_t k = 0;
    uint64_t need;

    if (keep == NULL)
        goto dropped;
    if (j->epoch != kt->epoch || (k = io_keep(kt, j, keep)) == 0)
        goto cleanup;
    if ((need = io_file_new(keep, k, &f, &t)) == 0 || need > kt->cfg.ssd_budget ||
        !io_make_room(kt, need))
        goto dropped;
    kt->disk_bytes += need;   /* the temp file counts from its first byte */
    kvlock_unlock(&kt->mu);
    td_status_t st = io_write_file(kt, f->name, keep, k, need);
    kvlock_lock(&kt->mu);
    if (st != TD_OK) {
        kt->disk_bytes -= need;
        goto dropped;
    }
    kt->st.bytes_written += need;
    if (j->epoch != kt->epoch) {   /* flushed while it was written */
        kvlock_unlock(&kt->mu);
        io_unlink(kt, f->name);
        kvlock_lock(&kt->mu);
        kt->disk_bytes -= need;
        goto cleanup;
    }
    kvindex_file_add(kt, f, &t);
    f = NULL;
    goto cleanup;
dropped:
    kt->st.writes_dropped += k > 0 ? k : j->n;
cleanup:
    free(f);
    table_free(&t);
    free(keep);
}

static void *
io_main(void *arg)
{
    td_kvtier_t *kt = arg;

    kvlock_lock(&kt->mu);
    for (;;) {
        while (!kt->stop && (kt->stalled || kt->q_head == NULL)) {
            kt->busy = false;
            pthread_cond_broadcast(&kt->idle);
            kvlock_wait(&kt->work, &kt->mu);
        }
        if (kt->q_head == NULL)
            break;   /* stopping, nothing left */
        kvjob_t *j = kt->q_head;

        kt->q_head = j->next;
        if (kt->q_head == NULL)
            kt->q_tail = NULL;
        kt->busy = true;
        if (j->kind == JOB_DELETE) {
            kvlock_unlock(&kt->mu);
            io_unlink(kt, j->name);
            kvlock_lock(&kt->mu);
            kt->disk_bytes -= j->bytes;
        } else {
            kt->q_writes -= j->n;
            io_write(kt, j);
        }
        job_free(j);
    }
    kt->busy = false;
    pthread_cond_broadcast(&kt->idle);
    kvlock_unlock(&kt->mu);
    return NULL;
}

td_status_t
kvssd_start(td_kvtier_t *kt)
{
    int rc = pthread_create(&kt->io, NULL, io_main, kt);

    if (rc != 0) {
        td_error("kvtier %s: cannot start the IO thread: %s", kt->dir, strerror(rc));
        return td_status_from_errno(rc);
    }
    kt->io_started = true;
    return TD_OK;
}

void
kvssd_stop(td_kvtier_t *kt)
{
    if (!kt->io_started)
        return;
    kvlock_lock(&kt->mu);
    kt->stop = true;
    kt->stalled = false;
    pthread_cond_signal(&kt->work);
    kvlock_unlock(&kt->mu);
    pthread_join(kt->io, NULL);
    kt->io_started = false;
}

void
kvssd_free(td_kvtier_t *kt)
{
    for (kvjob_t *j = kt->q_head, *next; j != NULL; j = next) {
        next = j->next;
        job_free(j);
    }
    kt->q_head = kt->q_tail = NULL;
    for (kvfile_t *f = kt->ssd_lru.head, *next; f != NULL; f = next) {
        next = f->next;
        free(f);
    }
    kt->ssd_lru.head = kt->ssd_lru.tail = NULL;
}

void
td_kvtier_wait_idle(td_kvtier_t *kt)
{
    if (!kt->io_started)
        return;
    kvlock_lock(&kt->mu);
    while (kt->q_head != NULL || kt->busy)
        kvlock_wait(&kt->idle, &kt->mu);
    kvlock_unlock(&kt->mu);
}

void
td_kvtier_test_stall(td_kvtier_t *kt, bool stalled)
{
    kvlock_lock(&kt->mu);
    kt->stalled = stalled;
    if (!stalled)
        pthread_cond_signal(&kt->work);
    kvlock_unlock(&kt->mu);
}

/* ---- The scan at create ------------------------------------------------------ */
typedef struct {
    kvfile_t *f;
    kvtable_t t;
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
    table_free(&fd->t);
}

/* Reads and checks the header and table of an open file `name` of `size`
 * bytes into *out; what is wrong, or NULL. *foreign: another layout/seed. */
static const char *
scan_file(td_kvtier_t *kt, int fd, uint64_t name, uint64_t size, found_t *out, bool *foreign)
{
    uint8_t hdr[PACK_HDR];
    uint8_t *tab = NULL;
    uint32_t n = 0;
    uint64_t tab_bytes;
    const char *why = NULL;

    *foreign = false;
    if (size < PACK_HDR)
        return "shorter than a header";
    if (pread(fd, hdr, PACK_HDR, 0) != PACK_HDR)
        return "header read failed";
    if ((why = kvrec_pack_check(&kt->cfg, hdr, &n, foreign)) != NULL)
        return why;
    tab_bytes = PACK_HDR + (uint64_t)n * PACK_ENT;
    if (tab_bytes > size)
        return "table longer than the file (truncated?)";
    if ((tab = malloc(tab_bytes)) == NULL)
        return "out of memory";
    out->f = malloc(sizeof(*out->f) + n * sizeof(uint64_t));
    out->t.offs = malloc(n * sizeof(uint64_t));
    out->t.pays = malloc(n * sizeof(uint64_t));
    out->t.snaps = malloc(n * sizeof(uint64_t));
    out->t.gs = malloc(n * sizeof(uint32_t));
    if (!out->f || !out->t.offs || !out->t.pays || !out->t.snaps || !out->t.gs) {
        why = "out of memory";
        goto cleanup;
    }
    out->t.hashes = out->f->hashes;
    if (pread(fd, tab, tab_bytes, 0) != (ssize_t)tab_bytes) {
        why = "table read failed";
        goto cleanup;
    }
    if ((why = kvrec_table_parse(tab, n, name, size, &out->t)) != NULL)
        goto cleanup;
    out->f->name = name;
    out->f->bytes = size;
    out->f->nrec = n;
cleanup:
    free(tab);
    return why;
}

/* One directory entry: a good cache file into *one (true), else deleted or
 * left alone as its name says, logged. */
static bool
scan_entry(td_kvtier_t *kt, const char *nm, found_t *one, size_t *deleted)
{
    uint64_t name;
    struct stat sb;
    const char *why = NULL;
    bool foreign = false;
    int fd;

    if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0 || strcmp(nm, "LOCK") == 0)
        return false;
    if (kvrec_name_parse(nm, ".tmp", &name)) {
        td_info("kvtier %s: %s: unfinished write; deleted", kt->dir, nm);
        unlinkat(kt->dirfd, nm, 0);
        return false;
    }
    if (!kvrec_name_parse(nm, ".kvb", &name)) {
        td_warn("kvtier %s: %s: not a cache file; left alone", kt->dir, nm);
        return false;
    }
    fd = openat(kt->dirfd, nm, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 || fstat(fd, &sb) != 0)
        why = "cannot open";
    else if (!S_ISREG(sb.st_mode))
        why = "not a regular file";
    else
        why = scan_file(kt, fd, name, (uint64_t)sb.st_size, one, &foreign);
    if (fd >= 0)
        close(fd);
    if (why != NULL && strcmp(why, "out of memory") == 0) {
        td_error("kvtier %s: %s: out of memory; left out of the index", kt->dir, nm);
    } else if (why != NULL) {
        td_warn("kvtier %s: %s: %s; deleted", kt->dir, nm, why);
        kt->st.corrupt++;
        unlinkat(kt->dirfd, nm, 0);
        (*deleted)++;
    }
    if (why != NULL) {
        found_free(one);
        return false;
    }
    one->mtime = sb.st_mtim;
    return true;
}

/* The good files found, oldest first, into the index; then the oldest
 * deleted while over the budget. */
static void
scan_index(td_kvtier_t *kt, found_t *found, size_t n, size_t *deleted)
{
    if (n > 1)
        qsort(found, n, sizeof(*found), found_cmp);
    for (size_t i = 0; i < n; i++) {
        kvindex_file_add(kt, found[i].f, &found[i].t);
        kt->disk_bytes += found[i].f->bytes;
        found[i].f = NULL;
        found_free(&found[i]);
    }
    while (kt->disk_bytes > kt->cfg.ssd_budget) {
        kvfile_t *v = kt->ssd_lru.head;

        io_unlink(kt, v->name);
        kvssd_forget(kt, v);
        (*deleted)++;
    }
}

static td_status_t
scan_dir(td_kvtier_t *kt)
{
    int fd2 = dup(kt->dirfd);
    DIR *d;
    struct dirent *de;
    found_t *found = NULL;
    size_t n = 0, cap = 0, deleted = 0;

    if (fd2 < 0 || (d = fdopendir(fd2)) == NULL) {
        td_error("kvtier %s: cannot read the directory: %s", kt->dir, strerror(errno));
        if (fd2 >= 0)
            close(fd2);
        return td_status_from_errno(errno);
    }
    while ((de = readdir(d)) != NULL) {
        found_t one = { 0 };

        if (!scan_entry(kt, de->d_name, &one, &deleted))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            found_t *nf = realloc(found, ncap * sizeof(*found));

            if (nf == NULL) {   /* the file is fine: left for a later start */
                td_error("kvtier %s: %s: out of memory; left out of the index", kt->dir,
                         de->d_name);
                found_free(&one);
                continue;
            }
            found = nf;
            cap = ncap;
        }
        found[n++] = one;
    }
    scan_index(kt, found, n, &deleted);
    td_info("kvtier %s: %" PRIu64 " records in %" PRIu64 " files of %" PRIu64
            " bytes found, %zu files deleted", kt->dir, kt->st.ssd_records, kt->st.ssd_files,
            kt->st.ssd_bytes, deleted);
    free(found);
    closedir(d);
    return TD_OK;
}

td_status_t
kvssd_open(td_kvtier_t *kt)
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
