/* worker/domain.c — a DEP domain across worker processes (decoded
 * --domain-size): one rank's communicator over UCX (comm/ucx.h), its
 * address exchanged through a router (net/domjoin.h) or through a
 * directory every process of the domain sees, each file naming the process
 * that wrote it so that a dead one's is ignored. docs/dep.md, "A domain across processes". */
#include "domain.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "clock.h"
#include "domjoin.h"
#include "log.h"

/* ---- Who wrote a file ------------------------------------------------------ */

/* An address file is a header line, then the rank's address blob:
 *   "tandem-domain-addr 1 pid=PID start=TICKS boot=BOOT_ID host=HOST\n"
 * TICKS is the writer's start time (/proc/PID/stat field 22), so a pid used
 * again by another process does not pass for the writer. */
#define DOMAIN_MAGIC "tandem-domain-addr 1 "
#define DOMAIN_HEADER_MAX 512

typedef struct {
    long pid;
    unsigned long long start;
    char boot[64];
    char host[256];
} domain_owner_t;

/* The start time of pid, 0 when it is gone (or a zombie). */
static unsigned long long
domain_start_time(long pid)
{
    char path[64], buf[1024];
    unsigned long long start = 0;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if ((f = fopen(path, "r")) == NULL)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* the command name may hold anything */
    char state;
    if (p == NULL || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
                                   "%*d %*d %*d %*d %llu", &state, &start) != 2 || state == 'Z')
        return 0;
    return start;
}

/* This process, as a header names it. */
static void
domain_owner_self(domain_owner_t *o)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    memset(o, 0, sizeof(*o));
    o->pid = (long)getpid();
    o->start = domain_start_time(o->pid);
    if (f == NULL || fscanf(f, "%63s", o->boot) != 1)
        snprintf(o->boot, sizeof(o->boot), "-");
    if (f != NULL)
        fclose(f);
    if (gethostname(o->host, sizeof(o->host) - 1) != 0 || o->host[0] == '\0')
        snprintf(o->host, sizeof(o->host), "-");
    for (char *c = o->host; *c; c++)   /* one word on the header line */
        if (*c == ' ' || *c == '\n')
            *c = '_';
}

/* The header of a file's bytes: its owner and where the blob starts.
 * TD_ERR_PROTO when it is not an address file. */
static td_status_t
domain_header_parse(const unsigned char *buf, size_t len, domain_owner_t *o, size_t *blob_at)
{
    char line[DOMAIN_HEADER_MAX + 1];
    const unsigned char *nl = memchr(buf, '\n', len < DOMAIN_HEADER_MAX ? len : DOMAIN_HEADER_MAX);
    int end = 0;

    if (nl == NULL)
        return TD_ERR_PROTO;
    memcpy(line, buf, (size_t)(nl - buf));
    line[nl - buf] = '\0';
    memset(o, 0, sizeof(*o));
    if (strncmp(line, DOMAIN_MAGIC, strlen(DOMAIN_MAGIC)) != 0 ||
        sscanf(line + strlen(DOMAIN_MAGIC), "pid=%ld start=%llu boot=%63s host=%255s%n", &o->pid,
               &o->start, o->boot, o->host, &end) != 4 ||
        line[strlen(DOMAIN_MAGIC) + (size_t)end] != '\0' || o->pid <= 0)
        return TD_ERR_PROTO;
    *blob_at = (size_t)(nl - buf) + 1;
    return TD_OK;
}

/* Whether the file's writer is known to be gone: it ran on this host (same
 * host name and boot) and no process with its pid and start time runs. A
 * writer on another host is taken as alive (nothing here can tell). */
static bool
domain_owner_gone(const domain_owner_t *o, const domain_owner_t *self)
{
    return strcmp(o->host, self->host) == 0 && strcmp(o->boot, self->boot) == 0 &&
           strcmp(o->boot, "-") != 0 && domain_start_time(o->pid) != o->start;
}

/* ---- Files ------------------------------------------------------------------ */

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

/* Write the header naming self, then the bytes, to path through a
 * temporary name, so that a reader sees the whole file or none. */
static td_status_t
domain_write(const char *path, const domain_owner_t *self, const void *buf, size_t len)
{
    char tmp[4300];
    FILE *f;
    int bad;

    if (snprintf(tmp, sizeof(tmp), "%.4200s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return TD_ERR_RANGE;
    if ((f = fopen(tmp, "wb")) == NULL)
        goto err;
    bad = fprintf(f, DOMAIN_MAGIC "pid=%ld start=%llu boot=%s host=%s\n", self->pid, self->start,
                  self->boot, self->host) < 0 || fwrite(buf, 1, len, f) != len;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        (void)unlink(tmp);
        goto err;
    }
    return TD_OK;
err:
    td_error("dep domain: cannot write %s: %s", path, strerror(errno));
    return TD_ERR_IO;
}

/* Remove path if this process wrote it (a newer writer's file stays). */
static void
domain_unlink_own(const char *path)
{
    size_t len, at;
    void *buf = domain_read(path, &len);
    domain_owner_t o;

    if (buf != NULL && domain_header_parse(buf, len, &o, &at) == TD_OK && o.pid == (long)getpid())
        (void)unlink(path);
    free(buf);
}

/* Rank r's address (its file's blob, moved to the front of *buf) into peer,
 * once a file whose writer is not known to be gone is there: TD_OK, or
 * TD_INPROGRESS while there is none; TD_ERR_PROTO (logged) for a file that
 * is not an address file. *stale is set when a dead writer's file was seen. */
static td_status_t
domain_peer_read(const td_worker_domain_t *d, uint32_t me, uint32_t r, const domain_owner_t *self,
                 void **buf, td_comm_ucx_peer_t *peer, bool *stale)
{
    char path[4200];
    size_t len, at;
    domain_owner_t o;

    td_worker_domain_path(d, r, path, sizeof(path));
    if ((*buf = domain_read(path, &len)) == NULL)
        return TD_INPROGRESS;
    if (domain_header_parse(*buf, len, &o, &at) != TD_OK) {
        td_error("dep domain %s: rank %u: %s is not an address file (remove it)", d->id, me, path);
        free(*buf);
        *buf = NULL;
        return TD_ERR_PROTO;
    }
    if (domain_owner_gone(&o, self)) {
        if (!*stale)
            td_info("dep domain %s: rank %u: %s was left by pid %ld, which is gone: waiting for "
                    "rank %u's new one", d->id, me, path, o.pid, r);
        *stale = true;
        free(*buf);
        *buf = NULL;
        return TD_INPROGRESS;
    }
    memmove(*buf, (unsigned char *)*buf + at, len - at);
    peer->addr = *buf;
    peer->len = len - at;
    return TD_OK;
}

/* The directory's exchange: rank's address written to its file (the path
 * kept in dc for withdraw), every rank's read into blobs / peers. Logged. */
static td_status_t
domain_dir_exchange(const td_worker_domain_t *d, uint32_t rank, const void *mine, size_t len,
                    td_worker_domain_comm_t *dc, void **blobs, td_comm_ucx_peer_t *peers)
{
    domain_owner_t self;
    td_status_t st;

    domain_owner_self(&self);
    td_worker_domain_path(d, rank, dc->path, sizeof(dc->path));
    if ((st = domain_write(dc->path, &self, mine, len)) != TD_OK) {
        dc->path[0] = '\0';
        return st;
    }
    /* every rank's address, each within the deadline; a file that a dead
     * process left (a killed run of the domain) is not one */
    uint64_t until = td_clock_ns() / 1000000u + d->wait_ms;
    for (uint32_t r = 0; r < d->size; r++) {
        bool stale = false;
        while ((st = domain_peer_read(d, rank, r, &self, &blobs[r], &peers[r], &stale)) != TD_OK) {
            if (st != TD_INPROGRESS)
                return st;
            if (td_clock_ns() / 1000000u > until) {
                td_error("dep domain %s: rank %u: no address of rank %u in %s after %llu ms%s",
                         d->id, rank, r, d->dir, (unsigned long long)d->wait_ms,
                         stale ? " (only a dead process's file)" : "");
                return TD_ERR_TIMEOUT;
            }
            usleep(10000);
        }
    }
    return TD_OK;
}

/* ---- The domain ------------------------------------------------------------- */

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
    if (d->dir == NULL || d->dir[0] == '\0') {
        td_domjoin_config_t jc = { .routers = d->routers, .ctl = *d->ctl, .id = d->id,
                                   .size = d->size, .rank = rank, .wait_ms = d->wait_ms };
        size_t *lens = calloc(d->size, sizeof(*lens));

        jc.ctl.ident.role = TANDEM__ROLE__ROLE_TOOL;   /* not a serving rank */
        jc.ctl.ident.rank_id = rank;
        st = lens == NULL ? TD_ERR_NOMEM : td_domjoin_run(&jc, mine, len, blobs, lens);   /* logs */
        for (uint32_t r = 0; st == TD_OK && r < d->size; r++)
            peers[r] = (td_comm_ucx_peer_t){ .addr = blobs[r], .len = lens[r] };
        free(lens);
        if (st == TD_ERR_NOMEM)
            td_error("dep domain %s: out of memory", d->id);
        if (st != TD_OK)
            goto out;
    } else if ((st = domain_dir_exchange(d, rank, mine, len, &dc, blobs, peers)) != TD_OK) {
        goto out;
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
    td_worker_domain_withdraw(dc);
}

void
td_worker_domain_withdraw(td_worker_domain_comm_t *dc)
{
    if (dc->path[0] != '\0')
        domain_unlink_own(dc->path);
    dc->path[0] = '\0';
}
