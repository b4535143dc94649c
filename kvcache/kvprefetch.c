/* kvcache/kvprefetch.c — read-ahead: td_kvtier_prefetch queues a chain; the
 * prefetch thread turns the queued chains' SSD blocks into runs (kvrun.c) as
 * get_many does, each into one of PF_DEPTH run slots, and keeps them in
 * flight with its own AIO context across chains, so the device does not idle
 * between two requests' chains as it does between two get_many calls.
 * Nothing is checked or copied here: a read run is held (READY) until
 * get_many claims its blocks (kvprefetch_claim), checks and copies them out
 * of the run's buffer as it does its own runs', and lets the run go when its
 * last block is claimed. A get_many waits for a run still being read. A
 * READY run nobody claimed for PF_STALE_NS goes; a flush drops them all and
 * the queue. A run's file is closed when its read ends: held runs pin no
 * deleted file, and no file is closed under mu. docs/kvtier.md, "Read-ahead". */
#include "kvtier_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

#define PF_DEPTH  32          /* runs read ahead and held at most */
#define PF_RUN_MAX (1u << 18) /* bytes per run at most */
#define PF_QUEUE_BLOCKS 65536u /* blocks of the queued chains at most */
#define PF_STALE_NS 1000000000ull /* a run read ahead and not got for this long goes */
#define PF_START_WAIT_NS 5000000ull /* a get waits this long for a queued block's run */

enum { PF_FREE, PF_READING, PF_READY };

typedef struct {                /* a block of a queued chain: in pfqmap until taken */
    uint64_t hash;              /* its key there */
    bool queued;                /* false: a run has it, or a get_many took it */
} pfq_t;

struct kvpfjob {
    kvpfjob_t *next;
    size_t n, next_blk;         /* blocks; the first not yet in a run */
    pfq_t q[];                  /* [n] */
};

typedef struct {                /* a block of a run: in pfmap until claimed */
    uint64_t hash;              /* its key there */
    kvpfrun_t *run;
    kvwhere_t w;
    bool mapped;
    bool read;                  /* its record was read whole */
} pfblk_t;

struct kvpfrun {
    kvrun_t r;
    int state;
    bool flushed;               /* a flush came while it was being read: drop it when read */
    uint32_t left;              /* its blocks still in pfmap */
    uint32_t claims;            /* get_many calls using its buffer */
    uint64_t ready_ns;
    pfblk_t *blk;               /* [r.last - r.first + 1] */
    size_t bcap;
};

/* ---- Run slots (mu held) ----------------------------------------------------- */
/* Takes the run's remaining blocks out of pfmap. */
static void
pf_unmap(td_kvtier_t *kt, kvpfrun_t *pr)
{
    for (size_t k = 0; k <= pr->r.last - pr->r.first; k++)
        if (pr->blk[k].mapped) {
            td_hmap_del_pair(kt->pfmap, pr->blk[k].hash, (uintptr_t)&pr->blk[k]);
            pr->blk[k].mapped = false;
            kt->st.prefetch_unused += pr->blk[k].read;
        }
    pr->left = 0;
}

/* Lets a run no block of which is wanted any more go: its buffer back to
 * the pool (its file was closed when the read ended). */
static void
pf_release(td_kvtier_t *kt, kvpfrun_t *pr)
{
    kvrun_done(kt, &pr->r);
    pr->state = PF_FREE;
    pr->flushed = false;
    pthread_cond_signal(&kt->pf_work);
}

/* Lets go every READY run nobody has claimed for PF_STALE_NS, or (all) every
 * READY run nobody claims, and marks the runs being read to go when read. */
static void
pf_drop(td_kvtier_t *kt, bool all)
{
    uint64_t now = td_clock_ns();

    for (size_t s = 0; s < PF_DEPTH; s++) {
        kvpfrun_t *pr = &kt->pfruns[s];

        if (all && pr->state == PF_READING)
            pr->flushed = true;
        if (pr->state != PF_READY || (!all && now - pr->ready_ns <= PF_STALE_NS))
            continue;
        pf_unmap(kt, pr);
        if (pr->claims == 0)
            pf_release(kt, pr);   /* else the last claim lets it go */
    }
}

/* A free run slot: a FREE one, else the stalest READY one nobody claimed for
 * PF_STALE_NS, or NULL. */
static kvpfrun_t *
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

/* Whether a run slot is free: the prefetch thread is about to start the
 * queue's next run. */
static bool
pf_slot_free(const td_kvtier_t *kt)
{
    for (size_t s = 0; s < PF_DEPTH; s++)
        if (kt->pfruns[s].state == PF_FREE)
            return true;
    return false;
}

/* A queued block leaves pfqmap. */
static void
pf_dequeue(td_kvtier_t *kt, pfq_t *q)
{
    if (q->queued) {
        td_hmap_del_pair(kt->pfqmap, q->hash, (uintptr_t)q);
        q->queued = false;
    }
}

/* ---- Runs of the queued chains (mu held) ------------------------------------- */
/* The next run of chain j: its first block in *first, how many blocks in the
 * return value (0: none left in j), and its span in *r. Blocks that the SSD
 * tier does not hold alone, or that a run has, are passed over; the chain
 * ends at a block neither tier holds. */
static size_t
pf_scan(td_kvtier_t *kt, kvpfjob_t *j, kvrun_t *r, size_t *first)
{
    size_t nb = 0;

    *first = j->next_blk;
    for (; j->next_blk < j->n; j->next_blk++) {
        pfq_t *q = &j->q[j->next_blk];
        kvent_t *e = q->queued ? kvindex_find(kt, q->hash) : NULL;

        if (q->queued && e == NULL) {   /* no tier holds it: the chain ends here */
            for (size_t k = j->next_blk; k < j->n; k++)
                pf_dequeue(kt, &j->q[k]);
            j->next_blk = j->n;
            break;
        }
        if (!q->queued || e->host != NULL || e->file == NULL ||
            td_hmap_get(kt->pfmap, q->hash) != TD_HMAP_NONE) {
            if (nb > 0)
                break;   /* the run ends before it */
            pf_dequeue(kt, q);
            *first = j->next_blk + 1;
            continue;
        }
        kvwhere_t w = kvindex_where(e);

        if (nb == 0)
            *r = kvrun_start(&w, j->next_blk);
        else if (!kvrun_extend(r, &w, j->next_blk, PF_RUN_MAX))
            break;   /* another file, or the run is full */
        nb++;
    }
    return nb;
}

/* Room for nb blocks in pr and in pfmap; false when memory ran out. */
static bool
pf_room(td_kvtier_t *kt, kvpfrun_t *pr, size_t nb)
{
    if (nb > pr->bcap) {
        pfblk_t *blk = realloc(pr->blk, nb * sizeof(*blk));

        if (blk == NULL)
            return false;
        pr->blk = blk;
        pr->bcap = nb;
    }
    return td_hmap_reserve(kt->pfmap, td_hmap_count(kt->pfmap) + nb) == TD_OK;
}

/* The next run of the queued chains into pr: consecutive blocks of one file
 * that the SSD tier holds, the host tier does not, and no run has; now in
 * pfmap. false when the queue has none left (or memory ran out: the run is
 * tried again later). Chains used up leave the queue. */
static bool
pf_build(td_kvtier_t *kt, kvpfrun_t *pr)
{
    while (kt->pf_head != NULL) {
        kvpfjob_t *j = kt->pf_head;
        size_t first, nb = pf_scan(kt, j, &pr->r, &first);

        if (nb > 0) {
            if (!pf_room(kt, pr, nb)) {
                j->next_blk = first;   /* tried again later */
                return false;
            }
            for (size_t k = 0; k < nb; k++) {
                pfblk_t *pb = &pr->blk[k];
                kvent_t *e = kvindex_find(kt, j->q[first + k].hash);

                pf_dequeue(kt, &j->q[first + k]);
                pb->hash = j->q[first + k].hash;
                pb->run = pr;
                pb->w = kvindex_where(e);
                pb->mapped = true;
                (void)td_hmap_add(kt->pfmap, pb->hash, (uintptr_t)pb);   /* reserved */
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

/* pr's read done (its bytes in pr->r.got): get_many may claim its blocks. */
static void
pf_ready(td_kvtier_t *kt, kvpfrun_t *pr)
{
    const kvrun_t *r = &pr->r;

    pr->state = PF_READY;
    pr->ready_ns = td_clock_ns();
    for (size_t k = 0; k <= r->last - r->first; k++) {
        pr->blk[k].read = kvrun_holds(r, &pr->blk[k].w);
        kt->st.prefetched += pr->blk[k].read;
    }
    if (pr->flushed) {   /* its blocks were flushed while it was read */
        pf_unmap(kt, pr);
        if (pr->claims == 0)
            pf_release(kt, pr);
    }
    pthread_cond_broadcast(&kt->pf_done);
}

/* A flush (mu held): the queued chains and the runs read ahead go; a run
 * being read goes when read. */
static void
pf_flush(td_kvtier_t *kt)
{
    while (kt->pf_head != NULL) {
        kvpfjob_t *j = kt->pf_head;

        kt->pf_head = j->next;
        for (size_t k = 0; k < j->n; k++)
            pf_dequeue(kt, &j->q[k]);
        free(j);
    }
    kt->pf_tail = NULL;
    kt->pf_queued = 0;
    pf_drop(kt, true);
}

/* ---- The prefetch thread ----------------------------------------------------- */
/* Starts pr's read (mu not held): true when it is in flight on the AIO
 * context; else it was read in place (or could not be opened) and its file
 * is closed: a held run pins no deleted file. */
static bool
pf_start(td_kvtier_t *kt, kvpfrun_t *pr, size_t slot)
{
    kvrun_t *r = &pr->r;

    if (!kvrun_open(kt, r)) {
        kvrun_close(r);
        return false;   /* a get finds what is wrong */
    }
    if (kt->pf_aio != 0 && r->direct) {
        struct iocb cb = { .aio_data = slot, .aio_lio_opcode = IOCB_CMD_PREAD,
                           .aio_fildes = (uint32_t)r->fd,
                           .aio_buf = (uint64_t)(uintptr_t)r->buf,
                           .aio_nbytes = r->hi - r->lo, .aio_offset = (int64_t)r->lo };
        struct iocb *p = &cb;

        if (syscall(SYS_io_submit, kt->pf_aio, 1L, &p) == 1)
            return true;
    }
    kvrun_pread(kt, r);
    kvrun_close(r);
    return false;
}

/* Starts runs of the queued chains while slots are free; how many went in
 * flight on the AIO context (mu held, let go around each start). */
static size_t
pf_fill(td_kvtier_t *kt)
{
    kvpfrun_t *pr;
    size_t started = 0;

    while (!kt->pf_stop && kt->pf_head != NULL && (pr = pf_slot(kt)) != NULL &&
           pf_build(kt, pr)) {
        size_t slot = (size_t)(pr - kt->pfruns);

        kvlock_unlock(&kt->mu);
        bool inflight = pf_start(kt, pr, slot);

        kvlock_lock(&kt->mu);
        if (inflight) {
            started++;
            pthread_cond_broadcast(&kt->pf_done);   /* its blocks are in a run now */
        } else {
            pf_ready(kt, pr);
        }
    }
    return started;
}

/* Waits for the next thing to do with nothing in flight (mu held). */
static void
pf_idle(td_kvtier_t *kt)
{
    bool held = false;

    for (size_t s = 0; s < PF_DEPTH; s++)
        held = held || kt->pfruns[s].state == PF_READY;
    if (kt->pf_stop)
        return;
    if (kt->pf_head == NULL && !held)
        kvlock_wait(&kt->pf_work, &kt->mu);
    else   /* wait for a get, or for a held run to go stale */
        kvlock_wait_ns(&kt->pf_work, &kt->mu, 50000000ull);
}

/* Reaps completed reads (mu held, let go while waiting); the reads still in
 * flight. A failed io_getevents ends the context: the runs in flight are
 * marked unread (the gets read their blocks) and the thread reads in place
 * from then on. */
static size_t
pf_reap(td_kvtier_t *kt, size_t reading)
{
    struct io_event ev[PF_DEPTH];

    kvlock_unlock(&kt->mu);
    long n = syscall(SYS_io_getevents, kt->pf_aio, 1L, (long)PF_DEPTH, ev, NULL);
    bool broken = n < 0 && errno != EINTR;

    if (broken) {   /* cannot happen with a good context */
        td_error("kvtier %s: io_getevents: %s; prefetch reads in place from now on",
                 kt->dir, strerror(errno));
        syscall(SYS_io_destroy, kt->pf_aio);   /* waits for the reads in flight */
        kt->pf_aio = 0;
    }
    for (long e = 0; e < n; e++) {
        kvpfrun_t *p = &kt->pfruns[ev[e].data];

        if (ev[e].res == -EINVAL)
            kvrun_pread(kt, &p->r);   /* O_DIRECT refused at read time */
        else
            p->r.got = ev[e].res > 0 ? (uint64_t)ev[e].res : 0;
        kvrun_close(&p->r);
    }
    kvlock_lock(&kt->mu);
    for (long e = 0; e < n; e++) {
        reading--;
        pf_ready(kt, &kt->pfruns[ev[e].data]);
    }
    for (size_t s = 0; broken && s < PF_DEPTH; s++)
        if (kt->pfruns[s].state == PF_READING) {
            kt->pfruns[s].r.got = 0;   /* unread: the gets read them */
            kvrun_close(&kt->pfruns[s].r);
            pf_ready(kt, &kt->pfruns[s]);
        }
    return broken ? 0 : reading;
}

static void *
pf_main(void *arg)
{
    td_kvtier_t *kt = arg;
    size_t reading = 0;

    kvlock_lock(&kt->mu);
    for (;;) {
        if (kt->pf_stop) {   /* the queue and the runs go; the reads in flight end */
            pf_flush(kt);
            if (reading == 0)
                break;
        }
        reading += pf_fill(kt);
        pf_drop(kt, false);   /* read runs nobody took for PF_STALE_NS */
        if (reading == 0)
            pf_idle(kt);
        else
            reading = pf_reap(kt, reading);
    }
    kvlock_unlock(&kt->mu);
    return NULL;
}

/* ---- Claims by get_many ------------------------------------------------------ */
/* If hash is in a prefetch run: waits while the run is being read, then
 * claims the block into *pre (its record in the run's buffer when read whole)
 * and returns true. A block of a queued chain that no run has yet is given
 * PF_START_WAIT_NS to get one while a slot is free (the prefetch thread
 * starts it at once), then taken from the queue: the caller reads it. */
bool
kvprefetch_claim(td_kvtier_t *kt, uint64_t hash, kvpre_t *pre)
{
    pfblk_t *pb;
    uint64_t t0 = 0;

    if (!kt->pf_started)
        return false;
    kvlock_lock(&kt->mu);
    for (;;) {
        pb = kvmap_get(kt->pfmap, hash);
        if (pb != NULL && pb->run->state == PF_READING) {
            kvlock_wait(&kt->pf_done, &kt->mu);
            continue;
        }
        if (pb != NULL || td_hmap_get(kt->pfqmap, hash) == TD_HMAP_NONE || !pf_slot_free(kt) ||
            kt->pf_stop)
            break;
        uint64_t now = td_clock_ns();

        if (t0 == 0)
            t0 = now;
        if (now - t0 >= PF_START_WAIT_NS)
            break;
        kvlock_wait_ns(&kt->pf_done, &kt->mu, 200000);   /* broadcast when a run starts */
    }
    if (pb == NULL) {
        pfq_t *q = kvmap_get(kt->pfqmap, hash);

        if (q != NULL)
            pf_dequeue(kt, q);
        kvlock_unlock(&kt->mu);
        return false;
    }
    kvpfrun_t *pr = pb->run;

    td_hmap_del_pair(kt->pfmap, hash, (uintptr_t)pb);
    pb->mapped = false;
    pr->left--;
    pr->claims++;
    *pre = (kvpre_t){ pb->read ? pr->r.buf + (pb->w.off - pr->r.lo) : NULL, pb->w.gen, -1, pr };
    kvlock_unlock(&kt->mu);
    return true;
}

void
kvprefetch_unclaim(td_kvtier_t *kt, kvpfrun_t *pr)
{
    kvlock_lock(&kt->mu);
    if (--pr->claims == 0 && pr->left == 0)
        pf_release(kt, pr);
    kvlock_unlock(&kt->mu);
}

/* ---- Queue, flush, lifetime -------------------------------------------------- */
td_status_t
td_kvtier_prefetch(td_kvtier_t *kt, const uint64_t *hashes, size_t n)
{
    kvpfjob_t *j;

    if (!kt->pf_started)
        return TD_ERR_UNSUPPORTED;
    if (n == 0)
        return TD_OK;
    if (n > PF_QUEUE_BLOCKS) {
        kvlock_lock(&kt->mu);
        kt->st.prefetch_dropped += n;
        kvlock_unlock(&kt->mu);
        return TD_ERR_BUSY;
    }
    if ((j = malloc(sizeof(*j) + n * sizeof(pfq_t))) == NULL)
        return TD_ERR_NOMEM;
    j->next = NULL;
    j->n = n;
    j->next_blk = 0;
    kvlock_lock(&kt->mu);
    if (kt->pf_queued + n > PF_QUEUE_BLOCKS) {
        kt->st.prefetch_dropped += n;
        kvlock_unlock(&kt->mu);
        free(j);
        return TD_ERR_BUSY;
    }
    if (td_hmap_reserve(kt->pfqmap, td_hmap_count(kt->pfqmap) + n) != TD_OK) {
        kvlock_unlock(&kt->mu);
        free(j);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {   /* a block queued or read ahead already is not ours */
        j->q[i].hash = hashes[i];
        j->q[i].queued = td_hmap_get(kt->pfqmap, hashes[i]) == TD_HMAP_NONE &&
                         td_hmap_get(kt->pfmap, hashes[i]) == TD_HMAP_NONE;
        if (j->q[i].queued)
            (void)td_hmap_add(kt->pfqmap, hashes[i], (uintptr_t)&j->q[i]);   /* reserved */
    }
    if (kt->pf_tail != NULL)
        kt->pf_tail->next = j;
    else
        kt->pf_head = j;
    kt->pf_tail = j;
    kt->pf_queued += n;
    pthread_cond_signal(&kt->pf_work);
    kvlock_unlock(&kt->mu);
    return TD_OK;
}

void
kvprefetch_flush(td_kvtier_t *kt)
{
    if (kt->pf_started)
        pf_flush(kt);
}

td_status_t
kvprefetch_init(td_kvtier_t *kt)
{
    td_status_t st = td_hmap_create(KVMAP_HINT, &kt->pfmap);

    return st == TD_OK ? td_hmap_create(KVMAP_HINT, &kt->pfqmap) : st;
}

td_status_t
kvprefetch_start(td_kvtier_t *kt)
{
    int rc;

    if ((kt->pfruns = calloc(PF_DEPTH, sizeof(*kt->pfruns))) == NULL)
        return TD_ERR_NOMEM;
    for (size_t s = 0; s < PF_DEPTH; s++)
        kt->pfruns[s].r.fd = -1;
    if (syscall(SYS_io_setup, (long)PF_DEPTH, &kt->pf_aio) != 0)
        kt->pf_aio = 0;   /* then the prefetch thread reads run by run */
    if ((rc = pthread_create(&kt->pf, NULL, pf_main, kt)) != 0) {
        td_error("kvtier %s: cannot start the prefetch thread: %s", kt->dir, strerror(rc));
        return td_status_from_errno(rc);
    }
    kt->pf_started = true;
    return TD_OK;
}

void
kvprefetch_stop(td_kvtier_t *kt)
{
    if (!kt->pf_started)
        return;
    kvlock_lock(&kt->mu);
    kt->pf_stop = true;
    pthread_cond_signal(&kt->pf_work);
    kvlock_unlock(&kt->mu);
    pthread_join(kt->pf, NULL);
}

/* Every run's buffer and file given back (the thread is gone). */
void
kvprefetch_free(td_kvtier_t *kt)
{
    for (size_t s = 0; kt->pfruns != NULL && s < PF_DEPTH; s++) {
        kvrun_done(kt, &kt->pfruns[s].r);
        free(kt->pfruns[s].blk);
    }
    free(kt->pfruns);
    kt->pfruns = NULL;
    if (kt->pf_aio != 0)
        syscall(SYS_io_destroy, kt->pf_aio);
    kt->pf_aio = 0;
    td_hmap_destroy(kt->pfmap);
    td_hmap_destroy(kt->pfqmap);
    kt->pfmap = kt->pfqmap = NULL;
}
