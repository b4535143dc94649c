/* kvcache/kvread.c — the reads: get (a record from the host tier, else from
 * its SSD file with one preadv, every byte checked) and get_many (a chain:
 * its SSD blocks in runs of consecutive blocks of one file, up to RUN_MAX
 * bytes each, read with one O_DIRECT read each; all in flight at once on
 * the tier's Linux AIO context, each checked as it completes, or claimed and
 * read by the caller and the reader threads; blocks read ahead are taken
 * from the prefetch runs). No page cache: the host tier is the cache, and a
 * cold read goes at the device's large-read speed. A block whose run could
 * not be read is read on its own (which finds and reports what is wrong).
 * One chain at a time uses the AIO context, one the threads; a third caller
 * meanwhile reads its chain alone. docs/kvtier.md, "Reads". */
#include "kvtier_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

#define AIO_DEPTH 64          /* runs in flight at most */
#define MTIME_EVERY_NS (60ull * 1000000000ull)   /* a read sets a file's mtime at most this often */

/* ---- One record -------------------------------------------------------------- */
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

/* Drops the SSD file made at gen (if it is still indexed): queued for
 * deletion, or (gone) its bytes leave the count. A miss. mu not held. */
static void
ssd_reject(td_kvtier_t *kt, uint64_t hash, uint64_t gen, bool gone)
{
    kvjob_t *j = gone ? NULL : kvssd_delete_new();

    kvlock_lock(&kt->mu);
    kvent_t *e = kvindex_find(kt, hash);

    if (!gone)
        kt->st.corrupt++;
    kt->st.misses++;
    if (e != NULL && e->file != NULL && e->file->gen == gen) {
        if (gone) {
            kvssd_forget(kt, e->file);
        } else {
            kvssd_doom(kt, e->file, j);
            j = NULL;
        }
    }
    kvlock_unlock(&kt->mu);
    free(j);
}

/* An SSD hit's bookkeeping: its file to the back of the LRU (true when its
 * mtime is due to be set), the counters, a host copy b (or NULL). */
static bool
ssd_hit(td_kvtier_t *kt, uint64_t hash, const kvwhere_t *w, kvblob_t *b)
{
    bool touch = false;

    kvlock_lock(&kt->mu);
    kvent_t *e = kvindex_find(kt, hash);

    if (e != NULL && e->file != NULL && e->file->gen == w->gen) {
        uint64_t now = td_clock_ns();

        kvindex_flru_touch(&kt->ssd_lru, e->file);
        if (now - e->file->mtime_ns > MTIME_EVERY_NS) {
            e->file->mtime_ns = now;
            touch = true;
        }
    }
    kt->st.hits_ssd++;
    kt->st.bytes_read += kvrec_bytes(w->g, w->payload, w->snap);
    if (b != NULL)
        kvhost_insert(kt, hash, b);
    kvlock_unlock(&kt->mu);
    return touch;
}

/* Checks a record read from SSD (hdr, tokens: copies or the read buffer;
 * out: payload and snapshot filled; why: a read failure or NULL) against
 * w and the expected tokens; on success promotes it to the host tier (and
 * sets the file's mtime through fd at most once a minute). */
static td_status_t
ssd_finish(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
           td_kvtier_out_t *out, const kvwhere_t *w, const uint8_t *hdr, const void *tokens,
           const char *why, int fd)
{
    char name[NAME_LEN];
    kvblob_t *b = NULL;

    kvrec_name(name, w->name, ".kvb");
    if (why == NULL)
        why = kvrec_check(&kt->cfg, hdr, hash, w->g, w->payload, w->snap, tokens, out->payload,
                          out->snapshot);
    if (why == NULL && (w->g != g || memcmp(tokens, expect, (size_t)g * 4) != 0))
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
    if (kvrec_bytes(w->g, w->payload, w->snap) <= kt->cfg.host_budget)
        b = kvrec_blob_read(hdr, tokens, w->g, out->payload, w->payload, out->snapshot, w->snap);
    bool touch = ssd_hit(kt, hash, w, b);

    kvrec_blob_unref(b);
    if (touch && fd >= 0)   /* the LRU order a restart sees; best effort */
        futimens(fd, NULL);
    else if (touch)
        utimensat(kt->dirfd, name, NULL, 0);
    return TD_OK;
}

/* Reads hash's record from its file into out and checks it. */
static td_status_t
get_ssd(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
        td_kvtier_out_t *out, const kvwhere_t *w)
{
    char name[NAME_LEN];
    uint8_t hdr[HDR_BYTES];
    int32_t stack_tokens[512];
    int32_t *tokens = stack_tokens;
    uint64_t bytes = kvrec_bytes(w->g, w->payload, w->snap);
    const char *why = NULL;
    td_status_t st;
    ssize_t r;
    int fd;

    kvrec_name(name, w->name, ".kvb");
    if ((fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC)) < 0) {
        int err = errno;

        td_warn("kvtier %s: %s: cannot open: %s", kt->dir, name, strerror(err));
        if (err == ENOENT) {
            ssd_reject(kt, hash, w->gen, true);
        } else {
            kvlock_lock(&kt->mu);
            kt->st.misses++;
            kvlock_unlock(&kt->mu);
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
get_where(td_kvtier_t *kt, uint64_t hash, kvblob_t **host, kvwhere_t *w, bool quiet)
{
    bool found = true;

    *host = NULL;
    kvlock_lock(&kt->mu);
    kvent_t *e = kvindex_find(kt, hash);

    if (e != NULL && e->host != NULL) {
        *host = kvrec_blob_ref(e->host);
        kvindex_lru_touch(&kt->host_lru, e);
    } else if (e != NULL && e->file != NULL) {
        *w = kvindex_where(e);
    } else {
        kt->st.misses += !quiet;
        found = false;
    }
    kvlock_unlock(&kt->mu);
    return found;
}

/* One block: host, else SSD (pre: read ahead by get_many, or NULL). */
static td_status_t
get_one(td_kvtier_t *kt, uint64_t hash, const int32_t *expect, uint32_t g,
        td_kvtier_out_t *out, const kvpre_t *pre)
{
    kvblob_t *b;
    kvwhere_t w;
    td_status_t st;

    if (!get_where(kt, hash, &b, &w, false))
        return TD_ERR_NOT_FOUND;
    if (b != NULL) {
        st = out_fits(out, b->payload_bytes, b->snapshot_bytes, hash)
                 ? kvhost_get(kt, b, hash, expect, g, out)
                 : TD_ERR_TOO_BIG;
        kvrec_blob_unref(b);
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

/* ---- Chains ------------------------------------------------------------------ */
struct kvrbatch {
    const uint64_t *hashes;
    const int32_t *tokens;
    uint32_t g;
    td_kvtier_out_t *outs;
    td_status_t *sts;
    kvpre_t *pre;               /* [n] */
    kvwhere_t *w;               /* [n] */
    kvrun_t *runs;
    size_t n, nruns;
    _Atomic size_t next_run, next;
    int helpers;                /* reader threads inside, under rmu */
};

/* Checks and copies out a read run's blocks, then gives the run back. */
static void
run_finish(td_kvtier_t *kt, kvrbatch_t *b, kvrun_t *r)
{
    for (size_t k = r->first; k <= r->last; k++) {
        if (kvrun_holds(r, &b->w[k])) {
            b->pre[k].rec = r->buf + (b->w[k].off - r->lo);
            b->pre[k].fd = r->fd;
        }
        b->sts[k] = get_one(kt, b->hashes[k], b->tokens + k * b->g, b->g, &b->outs[k],
                            &b->pre[k]);
    }
    kvrun_done(kt, r);
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

/* Opens the chain's runs: those read with O_DIRECT get an iocb in cbs and
 * ptrs (how many: the return value), the others are read and finished now. */
static size_t
chain_aio_prepare(td_kvtier_t *kt, kvrbatch_t *b, struct iocb *cbs, struct iocb **ptrs)
{
    size_t nsub = 0;

    for (size_t i = 0; i < b->nruns; i++) {
        kvrun_t *r = &b->runs[i];

        if (!kvrun_open(kt, r) || !r->direct) {   /* read in place, now */
            if (r->buf != NULL)
                kvrun_pread(kt, r);
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
    return nsub;
}

/* io_getevents on the chain context: at least one event, at most nr. */
static long
chain_getevents(td_kvtier_t *kt, struct io_event *ev, long nr)
{
#ifdef TD_KVTIER_TEST_HOOKS
    unsigned left = atomic_load(&kt->test_fail_getevents);

    if (left > 0 && atomic_compare_exchange_strong(&kt->test_fail_getevents, &left, left - 1)) {
        errno = EINVAL;
        return -1;
    }
#endif
    return syscall(SYS_io_getevents, kt->aio, 1L, nr, ev, NULL);
}

/* Ends a run unread: its blocks are misses (its file is not at fault). */
static void
run_fail(td_kvtier_t *kt, kvrbatch_t *b, kvrun_t *r)
{
    for (size_t k = r->first; k <= r->last; k++)
        b->sts[k] = TD_ERR_NOT_FOUND;
    kvlock_lock(&kt->mu);
    kt->st.misses += r->last - r->first + 1;
    kvlock_unlock(&kt->mu);
    kvrun_done(kt, r);
}

/* io_getevents failed (aio_mu held): the context is destroyed, which waits
 * for the reads in flight, and every run of the chain not yet finished
 * (submitted or not: those still holding a buffer) ends with its blocks
 * missed. Later chains are read by the threads. */
static void
chain_aio_fail(td_kvtier_t *kt, kvrbatch_t *b, const struct iocb *cbs, size_t nsub, int err)
{
    size_t failed = 0;

    syscall(SYS_io_destroy, kt->aio);
    kt->aio = 0;
    for (size_t i = 0; i < nsub; i++) {
        kvrun_t *r = &b->runs[cbs[i].aio_data];

        if (r->buf != NULL) {
            run_fail(kt, b, r);
            failed++;
        }
    }
    td_error("kvtier %s: io_getevents: %s; %zu runs of a chain missed, chains are read by "
             "threads from now on", kt->dir, strerror(err), failed);
}

/* All of a chain's runs in flight at once with Linux AIO (io_submit of
 * O_DIRECT reads), each checked as it completes, on the caller; false when
 * the AIO context is missing or busy with another chain (nothing done). */
static bool
chain_aio(td_kvtier_t *kt, kvrbatch_t *b)
{
    struct iocb *cbs, **ptrs;
    struct io_event ev[32];
    size_t nsub, next = 0, pending = 0;

    if (b->nruns == 0 || !kvlock_trylock(&kt->aio_mu))
        return false;
    cbs = kt->aio != 0 ? calloc(b->nruns, sizeof(*cbs)) : NULL;
    ptrs = kt->aio != 0 ? calloc(b->nruns, sizeof(*ptrs)) : NULL;
    if (cbs == NULL || ptrs == NULL) {   /* no context (any more), or no memory */
        free(cbs);
        free(ptrs);
        kvlock_unlock(&kt->aio_mu);
        return false;
    }
    nsub = chain_aio_prepare(kt, b, cbs, ptrs);
    while (next < nsub || pending > 0) {
        if (next < nsub && pending < AIO_DEPTH) {
            size_t want = nsub - next < AIO_DEPTH - pending ? nsub - next : AIO_DEPTH - pending;
            long got = aio_submit_each(kt->aio, ptrs + next, want);

            if (got > 0) {
                next += (size_t)got;
                pending += (size_t)got;
            } else if (pending == 0) {   /* refused: read the rest in place */
                for (; next < nsub; next++) {
                    kvrun_t *r = &b->runs[cbs[next].aio_data];

                    kvrun_pread(kt, r);
                    run_finish(kt, b, r);
                }
                break;
            }
        }
        if (pending == 0)
            continue;
        long n = chain_getevents(kt, ev, (long)(sizeof(ev) / sizeof(ev[0])));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {   /* cannot happen with a good context */
            chain_aio_fail(kt, b, cbs, nsub, errno);
            break;
        }
        for (long e = 0; e < n; e++) {
            kvrun_t *r = &b->runs[ev[e].data];

            pending--;
            if (ev[e].res == -EINVAL)
                kvrun_pread(kt, r);   /* O_DIRECT refused at read time */
            else
                r->got = ev[e].res > 0 ? (uint64_t)ev[e].res : 0;
            run_finish(kt, b, r);
        }
    }
    free(ptrs);
    free(cbs);
    kvlock_unlock(&kt->aio_mu);
    return true;
}

/* Claims runs (read, then check and copy out their blocks), then the blocks
 * in no run (host tier, misses). */
static void
rbatch_work(td_kvtier_t *kt, kvrbatch_t *b)
{
    size_t i;

    while ((i = atomic_fetch_add(&b->next_run, 1)) < b->nruns) {
        kvrun_t *r = &b->runs[i];

        if (kvrun_open(kt, r))
            kvrun_pread(kt, r);
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

    kvlock_lock(&kt->rmu);
    for (;;) {
        while (!kt->rstop && (kt->rb == NULL || kt->rb_seq == seen))
            kvlock_wait(&kt->rwork, &kt->rmu);
        if (kt->rstop)
            break;
        kvrbatch_t *b = kt->rb;

        seen = kt->rb_seq;
        b->helpers++;
        kvlock_unlock(&kt->rmu);
        rbatch_work(kt, b);
        kvlock_lock(&kt->rmu);
        if (--b->helpers == 0)
            pthread_cond_broadcast(&kt->rdone);
    }
    kvlock_unlock(&kt->rmu);
    return NULL;
}

/* The runs of the chain's SSD blocks (consecutive blocks of one file); the
 * blocks read ahead are checked and copied out now. */
static size_t
chain_runs(td_kvtier_t *kt, kvrbatch_t *b)
{
    size_t nruns = 0;

    for (size_t i = 0; i < b->n; i++) {
        kvblob_t *host;
        kvwhere_t *w = &b->w[i];

        b->pre[i] = (kvpre_t){ NULL, 0, -1, NULL };
        if (kvprefetch_claim(kt, b->hashes[i], &b->pre[i])) {   /* read ahead */
            b->sts[i] = get_one(kt, b->hashes[i], b->tokens + i * b->g, b->g, &b->outs[i],
                                &b->pre[i]);
            kvprefetch_unclaim(kt, b->pre[i].pf);
            continue;
        }
        if (!get_where(kt, b->hashes[i], &host, w, true) || host != NULL) {
            kvrec_blob_unref(host);
            continue;
        }
        b->pre[i].gen = w->gen;
        if (nruns == 0 || !kvrun_extend(&b->runs[nruns - 1], w, i, RUN_MAX))
            b->runs[nruns++] = kvrun_start(w, i);
    }
    return nruns;
}

/* The reader threads join the caller on b (when free: one chain at a
 * time); true when they did (rbusy held until reads_leave). */
static bool
readers_join(td_kvtier_t *kt, kvrbatch_t *b)
{
    if (kt->nreaders == 0 || b->n <= 1 || !kvlock_trylock(&kt->rbusy))
        return false;
    kvlock_lock(&kt->rmu);
    kt->rb = b;
    kt->rb_seq++;
    pthread_cond_broadcast(&kt->rwork);
    kvlock_unlock(&kt->rmu);
    return true;
}

/* Waits until no reader thread works on b, and lets the threads go. */
static void
readers_leave(td_kvtier_t *kt, kvrbatch_t *b)
{
    kvlock_lock(&kt->rmu);
    kt->rb = NULL;
    while (b->helpers > 0)
        kvlock_wait(&kt->rdone, &kt->rmu);
    kvlock_unlock(&kt->rmu);
    kvlock_unlock(&kt->rbusy);
}

td_status_t
td_kvtier_get_many(td_kvtier_t *kt, const uint64_t *hashes, size_t n, const int32_t *expect_tokens,
                   uint32_t block_tokens, td_kvtier_out_t *outs, size_t *n_hit)
{
    kvrbatch_t b = { hashes, expect_tokens, block_tokens, outs, NULL, NULL, NULL, NULL, n, 0,
                     0, 0, 0 };
    td_status_t st = TD_OK;
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
    for (i = 0; i < n; i++)   /* a block no read reaches is a miss, never a hit */
        b.sts[i] = TD_ERR_NOT_FOUND;
    if (kt->dir != NULL)
        b.nruns = chain_runs(kt, &b);
    else
        for (i = 0; i < n; i++)
            b.pre[i] = (kvpre_t){ NULL, 0, -1, NULL };
    if (chain_aio(kt, &b)) {
        for (i = 0; i < n; i++)   /* the blocks in no run */
            if (b.pre[i].gen == 0)
                b.sts[i] = get_one(kt, hashes[i], expect_tokens + i * block_tokens, block_tokens,
                                   &outs[i], NULL);
    } else {
        bool shared = readers_join(kt, &b);

        rbatch_work(kt, &b);
        if (shared)
            readers_leave(kt, &b);
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

/* ---- Lifetime ---------------------------------------------------------------- */
td_status_t
kvread_start(td_kvtier_t *kt)
{
    uint32_t nthreads = kt->cfg.read_threads;
    int rc;

    if (syscall(SYS_io_setup, (long)AIO_DEPTH, &kt->aio) != 0) {
        td_info("kvtier %s: no Linux AIO (%s): chains are read by threads", kt->dir,
                strerror(errno));
        kt->aio = 0;
    }
    if (nthreads > 0 && (kt->readers = calloc(nthreads, sizeof(*kt->readers))) == NULL)
        return TD_ERR_NOMEM;
    for (uint32_t i = 0; i < nthreads; i++) {
        if ((rc = pthread_create(&kt->readers[i], NULL, reader_main, kt)) != 0) {
            td_error("kvtier %s: cannot start a reader thread: %s", kt->dir, strerror(rc));
            return td_status_from_errno(rc);
        }
        kt->nreaders++;
    }
    return TD_OK;
}

void
kvread_stop(td_kvtier_t *kt)
{
    kvlock_lock(&kt->rmu);
    kt->rstop = true;
    pthread_cond_broadcast(&kt->rwork);
    kvlock_unlock(&kt->rmu);
    for (uint32_t i = 0; i < kt->nreaders; i++)
        pthread_join(kt->readers[i], NULL);
    kt->nreaders = 0;
}

void
kvread_free(td_kvtier_t *kt)
{
    if (kt->aio != 0)
        syscall(SYS_io_destroy, kt->aio);
    kt->aio = 0;
    free(kt->readers);
    kt->readers = NULL;
}

#ifdef TD_KVTIER_TEST_HOOKS
void
kvread_test_fail_getevents(td_kvtier_t *kt, unsigned n)
{
    atomic_store(&kt->test_fail_getevents, n);
}

unsigned
kvread_test_fail_getevents_left(td_kvtier_t *kt)
{
    return atomic_load(&kt->test_fail_getevents);
}
#endif
