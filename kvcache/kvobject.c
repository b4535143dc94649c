/* kvcache/kvobject.c — the host and SSD tiers of the prefix cache (kvtier.h)
 * as one object: create (the directory's scan, then the IO, reader and
 * prefetch threads), destroy, put (a batch into the host tier and the
 * write-back queue), flush and the counters. The parts are the other files
 * of kvcache/ (their map and the lock order: kvtier_int.h); file format and
 * behaviour: docs/kvtier.md. */
#include "kvtier_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

/* ---- Create and destroy ------------------------------------------------------ */
static void
kt_sync_init(td_kvtier_t *kt)
{
    kvlock_init(&kt->mu, KVLOCK_MU, "mu");
    kvlock_init(&kt->rmu, KVLOCK_RMU, "rmu");
    kvlock_init(&kt->rbusy, KVLOCK_CHAIN, "rbusy");
    kvlock_init(&kt->aio_mu, KVLOCK_CHAIN, "aio_mu");
    pthread_cond_init(&kt->work, NULL);
    pthread_cond_init(&kt->idle, NULL);
    pthread_cond_init(&kt->rwork, NULL);
    pthread_cond_init(&kt->rdone, NULL);
    td_clock_cond_init(&kt->pf_work);
    td_clock_cond_init(&kt->pf_done);
}

/* Frees what a create made (the threads are gone). */
static void
kt_free(td_kvtier_t *kt)
{
    kvssd_free(kt);
    kvindex_free(kt);
    kvprefetch_free(kt);   /* gives its runs' buffers back: before they are freed */
    kvrun_bufs_free(kt);
    kvread_free(kt);
    if (kt->lockfd >= 0)
        close(kt->lockfd);
    if (kt->dirfd >= 0)
        close(kt->dirfd);
    pthread_cond_destroy(&kt->pf_done);
    pthread_cond_destroy(&kt->pf_work);
    pthread_cond_destroy(&kt->rdone);
    pthread_cond_destroy(&kt->rwork);
    pthread_cond_destroy(&kt->idle);
    pthread_cond_destroy(&kt->work);
    kvlock_destroy(&kt->aio_mu);
    kvlock_destroy(&kt->rbusy);
    kvlock_destroy(&kt->rmu);
    kvlock_destroy(&kt->mu);
    free(kt->dir);
    free(kt);
}

/* The SSD tier: the directory, then the threads that use it. */
static td_status_t
kt_ssd_start(td_kvtier_t *kt, const char *dir, bool *started)
{
    td_status_t st;

    *started = false;
    kt->st.ssd_budget = kt->cfg.ssd_budget;
    if ((kt->dir = strdup(dir)) == NULL)
        return TD_ERR_NOMEM;
    if ((st = kvssd_open(kt)) != TD_OK || (st = kvssd_start(kt)) != TD_OK)
        return st;
    *started = true;   /* from here on destroy stops what started */
    if ((st = kvread_start(kt)) != TD_OK)
        return st;
    return kvprefetch_start(kt);
}

td_status_t
td_kvtier_create(const td_kvtier_config_t *cfg, td_kvtier_t **out)
{
    td_kvtier_t *kt = calloc(1, sizeof(*kt));
    td_status_t st;
    bool started = false;

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
    kt_sync_init(kt);
    if ((st = kvindex_init(kt)) != TD_OK || (st = kvprefetch_init(kt)) != TD_OK)
        goto err;
    kt->st.host_budget = cfg->host_budget;
    if (cfg->ssd_dir != NULL && cfg->ssd_dir[0] != '\0' &&
        (st = kt_ssd_start(kt, cfg->ssd_dir, &started)) != TD_OK)
        goto err;
    *out = kt;
    return TD_OK;

err:
    if (started)
        td_kvtier_destroy(kt);
    else
        kt_free(kt);
    return st;
}

void
td_kvtier_destroy(td_kvtier_t *kt)
{
    if (kt == NULL)
        return;
    kvprefetch_stop(kt);
    kvread_stop(kt);
    kvssd_stop(kt);
    kt_free(kt);
}

/* ---- Put --------------------------------------------------------------------- */
/* Which of recs[n] go to which tier (mu held): want_host, want_ssd; the SSD
 * ones that the host tier has already get a count of its copy in blobs.
 * Every record held is touched. How many go to SSD; none when the queue
 * has no room for all of them (writes_dropped). */
static uint32_t
put_plan(td_kvtier_t *kt, const td_kvrec_t *recs, uint32_t n, unsigned tiers, bool *want_host,
         bool *want_ssd, kvblob_t **blobs)
{
    uint32_t nssd = 0;

    for (uint32_t i = 0; i < n; i++) {
        const td_kvrec_t *r = &recs[i];
        uint64_t bytes = kvrec_bytes(r->block_tokens, r->payload_bytes, r->snapshot_bytes);
        kvent_t *e = kvindex_find(kt, r->hash);

        if (e != NULL && e->host != NULL)
            kvindex_lru_touch(&kt->host_lru, e);
        if (e != NULL && e->file != NULL)
            kvindex_flru_touch(&kt->ssd_lru, e->file);
        want_host[i] = (tiers & TD_KVTIER_HOST) && !(e != NULL && e->host != NULL) &&
                       bytes <= kt->cfg.host_budget;
        want_ssd[i] = (tiers & TD_KVTIER_SSD) && kt->dir != NULL &&
                      !(e != NULL && e->file != NULL);
        if (want_ssd[i] && e != NULL && e->host != NULL)
            blobs[i] = kvrec_blob_ref(e->host);
        nssd += want_ssd[i];
    }
    if (nssd > 0 && kt->q_writes + nssd > kt->cfg.queue_cap) {
        kt->st.writes_dropped += nssd;
        for (uint32_t i = 0; i < n; i++)
            want_ssd[i] = false;
        nssd = 0;
    }
    return nssd;
}

/* put_many for at most pack_records records, into the tiers of the mask:
 * one file. The copies are made outside mu. */
static td_status_t
put_pack(td_kvtier_t *kt, const td_kvrec_t *recs, uint32_t n, unsigned tiers)
{
    kvblob_t *blobs[PACK_MAX] = { NULL };
    bool want_host[PACK_MAX], want_ssd[PACK_MAX];
    uint32_t nssd;
    kvjob_t *j = NULL;
    td_status_t st = TD_OK;

    kvlock_lock(&kt->mu);
    nssd = put_plan(kt, recs, n, tiers, want_host, want_ssd, blobs);
    kvlock_unlock(&kt->mu);

    for (uint32_t i = 0; i < n; i++)
        if (blobs[i] == NULL && (want_host[i] || want_ssd[i]) &&
            (blobs[i] = kvrec_blob_of(&kt->cfg, &recs[i])) == NULL)
            goto err_nomem;
    if (nssd > 0 && (j = kvssd_write_new(nssd)) == NULL)
        goto err_nomem;

    kvlock_lock(&kt->mu);
    for (uint32_t i = 0; i < n; i++)
        if (want_host[i])
            kvhost_insert(kt, recs[i].hash, blobs[i]);
    if (j != NULL)
        kvssd_write_queue(kt, j, blobs, want_ssd, n);
    kvlock_unlock(&kt->mu);
    goto cleanup;

err_nomem:
    td_log_every(TD_LOG_ERROR, 10000, "kvtier: block %016" PRIx64 ": put: out of memory",
                 recs[0].hash);
    st = TD_ERR_NOMEM;
cleanup:
    for (uint32_t i = 0; i < n; i++)
        kvrec_blob_unref(blobs[i]);
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
        if (!kvrec_valid(&recs[i])) {
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

/* ---- Flush and counters ------------------------------------------------------ */
void
td_kvtier_flush(td_kvtier_t *kt)
{
    kvlock_lock(&kt->mu);
    kvhost_clear(kt);
    kvssd_flush(kt);
    kvprefetch_flush(kt);
    kvlock_unlock(&kt->mu);
    td_info("kvtier %s: flushed", kt->dir != NULL ? kt->dir : "(host only)");
}

void
td_kvtier_stats(td_kvtier_t *kt, td_kvtier_stats_t *out)
{
    kvlock_lock(&kt->mu);
    *out = kt->st;
    out->ssd_disk_bytes = kt->disk_bytes;
    out->queued = kt->q_writes;
    kvlock_unlock(&kt->mu);
}
