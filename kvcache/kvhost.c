/* kvcache/kvhost.c — the host tier: records kept in memory as blobs (their
 * file images, shared with the write-back queue), within host_budget bytes,
 * least recently used evicted first; a get copies out under a count, with
 * mu let go. docs/kvtier.md, "Host tier". */
#include "kvtier_int.h"

#include <inttypes.h>
#include <string.h>

#include "log.h"

void
kvhost_drop(td_kvtier_t *kt, kvent_t *e)
{
    kvindex_lru_unlink(&kt->host_lru, e);
    kt->st.host_bytes -= e->host->bytes;
    kt->st.host_records--;
    kvrec_blob_unref(e->host);
    e->host = NULL;
}

void
kvhost_insert(td_kvtier_t *kt, uint64_t hash, kvblob_t *b)
{
    kvent_t *e = kvindex_find(kt, hash);

    if (b->bytes > kt->cfg.host_budget || (e != NULL && e->host != NULL))
        return;
    while (kt->st.host_bytes + b->bytes > kt->cfg.host_budget) {
        kvent_t *v = kt->host_lru.head;

        kvhost_drop(kt, v);
        kvindex_release(kt, v);
    }
    if (e == NULL && (e = kvindex_get(kt, hash)) == NULL)
        return;
    e->host = kvrec_blob_ref(b);
    kvindex_lru_append(&kt->host_lru, e);
    kt->st.host_bytes += b->bytes;
    kt->st.host_records++;
}

void
kvhost_clear(td_kvtier_t *kt)
{
    while (kt->host_lru.head != NULL) {
        kvent_t *e = kt->host_lru.head;

        kvhost_drop(kt, e);
        kvindex_release(kt, e);
    }
}

td_status_t
kvhost_get(td_kvtier_t *kt, kvblob_t *b, uint64_t hash, const int32_t *expect, uint32_t g,
           td_kvtier_out_t *out)
{
    if (b->g != g || memcmp(kvblob_tokens(b), expect, (size_t)g * 4) != 0) {
        td_warn("kvtier: block %016" PRIx64 ": host record holds other tokens (hash collision); dropped",
                hash);
        kvlock_lock(&kt->mu);
        kvent_t *e = kvindex_find(kt, hash);

        if (e != NULL && e->host == b) {
            kvhost_drop(kt, e);
            kvindex_release(kt, e);
        }
        kt->st.misses++;
        kvlock_unlock(&kt->mu);
        return TD_ERR_NOT_FOUND;
    }
    memcpy(out->payload, kvblob_payload(b), b->payload_bytes);
    if (b->snapshot_bytes > 0)
        memcpy(out->snapshot, kvblob_snapshot(b), b->snapshot_bytes);
    out->payload_bytes = b->payload_bytes;
    out->snapshot_bytes = b->snapshot_bytes;
    out->tier = TD_KVTIER_HOST;
    kvlock_lock(&kt->mu);
    kt->st.hits_host++;
    kvlock_unlock(&kt->mu);
    return TD_OK;
}
