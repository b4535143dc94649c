/* kvcache/kvrun.c — runs: consecutive records of one SSD file, up to a span
 * limit, read with one O_DIRECT read of their 4 KiB-aligned span (a plain
 * read where the file system refuses O_DIRECT) into a buffer kept for reuse.
 * get_many's reads (kvread.c) and the read-ahead (kvprefetch.c) both build
 * and read their runs here. Buffers: under rmu. */
#include "kvtier_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

kvrun_t
kvrun_start(const kvwhere_t *w, size_t i)
{
    uint64_t lo = w->off & ~(uint64_t)(RUN_ALIGN - 1);
    uint64_t hi = w->off + kvrec_bytes(w->g, w->payload, w->snap);

    hi = (hi + RUN_ALIGN - 1) & ~(uint64_t)(RUN_ALIGN - 1);
    return (kvrun_t){ w->name, w->gen, lo, hi, i, i, NULL, 0, 0, -1, false };
}

bool
kvrun_extend(kvrun_t *r, const kvwhere_t *w, size_t i, uint64_t max)
{
    kvrun_t b = kvrun_start(w, i);
    uint64_t lo = b.lo < r->lo ? b.lo : r->lo, hi = b.hi > r->hi ? b.hi : r->hi;

    if (r->name != w->name || r->gen != w->gen || r->last + 1 != i || hi - lo > max)
        return false;
    r->lo = lo;
    r->hi = hi;
    r->last = i;
    return true;
}

bool
kvrun_holds(const kvrun_t *r, const kvwhere_t *w)
{
    return r->buf != NULL && w->off + kvrec_bytes(w->g, w->payload, w->snap) <= r->lo + r->got;
}

bool
kvrun_open(td_kvtier_t *kt, kvrun_t *r)
{
    char name[NAME_LEN];

    kvrec_name(name, r->name, ".kvb");
    r->fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC | O_DIRECT);
    r->direct = r->fd >= 0;
    if (r->fd < 0 && errno == EINVAL)
        r->fd = openat(kt->dirfd, name, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        return false;
    kvlock_lock(&kt->rmu);   /* a kept buffer, else a new one */
    for (uint32_t i = 0; i < kt->nbufs; i++)
        if (kt->bufs[i].cap >= r->hi - r->lo) {
            r->buf = kt->bufs[i].p;
            r->cap = kt->bufs[i].cap;
            kt->bufs[i] = kt->bufs[--kt->nbufs];
            break;
        }
    kvlock_unlock(&kt->rmu);
    if (r->buf == NULL) {
        r->cap = r->hi - r->lo > RUN_MAX ? r->hi - r->lo : RUN_MAX;
        if (posix_memalign((void **)&r->buf, RUN_ALIGN, r->cap) != 0) {
            r->buf = NULL;
            return false;
        }
    }
    return true;
}

void
kvrun_pread(td_kvtier_t *kt, kvrun_t *r)
{
    char name[NAME_LEN];
    ssize_t got;

    kvrec_name(name, r->name, ".kvb");
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

void
kvrun_close(kvrun_t *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

void
kvrun_done(td_kvtier_t *kt, kvrun_t *r)
{
    kvrun_close(r);
    if (r->buf == NULL)
        return;
    kvlock_lock(&kt->rmu);
    if (kt->nbufs < RUN_BUFS) {
        kt->bufs[kt->nbufs++] = (kvrbuf_t){ r->buf, r->cap };
        r->buf = NULL;
    }
    kvlock_unlock(&kt->rmu);
    free(r->buf);
    r->buf = NULL;
}

void
kvrun_bufs_free(td_kvtier_t *kt)
{
    for (uint32_t i = 0; i < kt->nbufs; i++)
        free(kt->bufs[i].p);
    kt->nbufs = 0;
}
