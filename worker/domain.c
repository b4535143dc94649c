/* worker/domain.c — a DEP domain across worker processes (decoded
 * --domain-size): one rank's communicator over UCX (comm/ucx.h), its
 * address exchanged through a directory every process of the domain sees.
 * docs/dep.md, "A domain across processes". */
#include "domain.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "clock.h"
#include "log.h"

/* path's bytes (caller frees), or NULL when it cannot be read yet. */
static void *
domain_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0, got;

    if (f == NULL)
        return NULL;
    do {
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap = cap ? 2 * cap : 4096);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0 && n < (1u << 20));
    fclose(f);
    *len = n;
    return buf;
}

/* Write the bytes to path through a temporary name, so that a reader sees
 * the whole file or none. */
static td_status_t
domain_write(const char *path, const void *buf, size_t len)
{
    char tmp[4300];
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%.4200s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return TD_ERR_RANGE;
    f = fopen(tmp, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0 ||
        rename(tmp, path) != 0) {
        td_error("dep domain: cannot write %s: %s", path, strerror(errno));
        return TD_ERR_IO;
    }
    return TD_OK;
}

void
td_worker_domain_path(const td_worker_domain_t *d, uint32_t rank, char *out, size_t len)
{
    snprintf(out, len, "%s/%s.addr.%u", d->dir, d->id, rank);
}

td_status_t
td_worker_domain_create(const td_worker_domain_t *d, uint32_t rank, const td_xfer_config_t *xc,
                        const td_comm_opts_t *opts, td_worker_domain_comm_t *out)
{
    td_worker_domain_comm_t dc = { 0 };
    td_comm_ucx_peer_t *peers = calloc(d->size, sizeof(*peers));
    void **blobs = calloc(d->size, sizeof(*blobs));
    void *mine = NULL;
    size_t len;
    char path[4200];
    td_status_t st = TD_ERR_NOMEM;

    if (peers == NULL || blobs == NULL) {
        td_error("dep domain %s: out of memory", d->id);
        goto out;
    }
    if ((dc.base = event_base_new()) == NULL) {
        td_error("dep domain %s: rank %u: no event base", d->id, rank);
        goto out;
    }
    if ((st = td_xfer_create(dc.base, xc, &dc.x)) != TD_OK)
        goto out;
    if ((st = td_comm_ucx_address(dc.x, &mine, &len)) != TD_OK)
        goto out;
    td_worker_domain_path(d, rank, dc.path, sizeof(dc.path));
    if ((st = domain_write(dc.path, mine, len)) != TD_OK) {
        dc.path[0] = '\0';
        goto out;
    }
    /* every rank's address, each within the deadline */
    uint64_t until = td_clock_ns() / 1000000u + d->wait_ms;
    for (uint32_t r = 0; r < d->size; r++) {
        td_worker_domain_path(d, r, path, sizeof(path));
        while ((blobs[r] = domain_read(path, &peers[r].len)) == NULL) {
            if (td_clock_ns() / 1000000u > until) {
                td_error("dep domain %s: rank %u: no address of rank %u in %s after %llu ms",
                         d->id, rank, r, d->dir, (unsigned long long)d->wait_ms);
                st = TD_ERR_TIMEOUT;
                goto out;
            }
            usleep(10000);
        }
        peers[r].addr = blobs[r];
    }
    td_comm_ucx_config_t uc = { .connect_ms = d->wait_ms };
    st = td_comm_ucx_create(dc.x, rank, d->size, peers, opts, &uc, &dc.comm);   /* logs */
    if (st != TD_OK)
        goto out;
    *out = dc;
    memset(&dc, 0, sizeof(dc));
out:
    td_worker_domain_destroy(&dc);
    for (uint32_t r = 0; blobs != NULL && r < d->size; r++)
        free(blobs[r]);
    free(blobs);
    free(peers);
    free(mine);
    return st;
}

void
td_worker_domain_destroy(td_worker_domain_comm_t *dc)
{
    td_comm_destroy(dc->comm);
    dc->comm = NULL;
    td_xfer_destroy(dc->x);
    dc->x = NULL;
    if (dc->base != NULL)
        event_base_free(dc->base);
    dc->base = NULL;
    if (dc->path[0] != '\0')
        (void)unlink(dc->path);
    dc->path[0] = '\0';
}
