/* kvcache/kvtier.h — the two lower tiers of a prefill rank's prefix cache:
 * a host-memory LRU and an SSD directory of files, one per put batch of
 * cache blocks, written back by the tier's own IO thread. Records are keyed
 * by the block's chain hash (kvcache/chainhash.h) and checked on every read
 * (docs/kvtier.md).
 *
 * One td_kvtier_t per prefill rank. Thread-safety: every call may come from
 * any thread. put, has, drain_events, snapshot and stats never do IO (they
 * take one mutex briefly); get and get_many may block on disk reads; create
 * scans the directory; destroy waits for the IO thread.
 * Implemented by the files of kvcache/ that kvtier_int.h lists, lowest
 * first, with the lock order they keep (docs/kvtier.md, "Files"). */
#ifndef TD_KVTIER_H
#define TD_KVTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* What a tier stores for one cache block of block_tokens tokens. put copies
 * everything it points to; the caller keeps its buffers. */
typedef struct {
    uint64_t hash;            /* td_chain_hash over tokens[0, end) */
    uint64_t parent;          /* the previous block's hash (the seed for the first) */
    uint64_t end;             /* position after the block: (i + 1) * block_tokens */
    uint32_t block_tokens;    /* G */
    const int32_t *tokens;    /* [G] the block's own tokens: compared on every read */
    const uint8_t *payload;   /* [payload_bytes] the block's paged KV bytes, opaque */
    uint64_t payload_bytes;   /* > 0 */
    const uint8_t *snapshot;  /* [snapshot_bytes] the fixed state at `end`, or NULL */
    uint64_t snapshot_bytes;  /* 0 when snapshot is NULL */
} td_kvrec_t;

/* Which tiers hold a record (td_kvtier_has, td_kvtier_out_t.tier). */
enum {
    TD_KVTIER_HOST = 1u << 0,
    TD_KVTIER_SSD  = 1u << 1,
};

typedef struct {
    uint64_t host_budget;     /* bytes of host memory for records; 0: no host tier */
    const char *ssd_dir;      /* NULL or "": no SSD tier; created (0700) if missing;
                               * one directory per rank (held with flock) */
    uint64_t ssd_budget;      /* bytes of cache files (st_size), temp files included */
    uint64_t layout_hash;     /* a file whose header has another layout or seed */
    uint64_t seed;            /*   is foreign: deleted at create, a miss at get */
    uint32_t queue_cap;       /* records queued for write-back; when full, a put is
                               * not written to SSD (writes_dropped); 0: 256 */
    bool ssd_fsync;           /* fsync each file before its rename (default off:
                               * a crash may leave a bad file, which a read rejects) */
    uint32_t pack_records;    /* records of one put_many per SSD file at most (0: 64;
                               * at most 256); eviction is per file */
    uint32_t read_threads;    /* threads that read a get_many chain along with its
                               * caller where Linux AIO is missing or busy with
                               * another chain (0: the caller alone); docs/kvtier.md */
} td_kvtier_config_t;

/* Where get/get_many put one record. The caller gives buffers of the sizes
 * its layout expects; on a miss their contents are undefined. */
typedef struct {
    uint8_t *payload;         /* [payload_cap] */
    uint64_t payload_cap;
    uint8_t *snapshot;        /* [snapshot_cap], or NULL when snapshot_cap is 0 */
    uint64_t snapshot_cap;
    uint64_t payload_bytes;   /* out */
    uint64_t snapshot_bytes;  /* out: 0 when the record has no snapshot */
    unsigned tier;            /* out: TD_KVTIER_HOST or TD_KVTIER_SSD */
} td_kvtier_out_t;

typedef struct {
    uint64_t host_bytes, host_records, host_budget;
    uint64_t ssd_bytes, ssd_records, ssd_files, ssd_budget;  /* ssd_bytes: files in the index */
    uint64_t ssd_disk_bytes;      /* bytes on disk: index + temp + not yet deleted */
    uint64_t queued;              /* records waiting for write-back */
    uint64_t hits_host, hits_ssd, misses;
    uint64_t corrupt;             /* record files rejected, foreign ones included
                                   * (create's scan and reads) */
    uint64_t writes_dropped;      /* puts not written: queue full or bigger than the budget */
    uint64_t bytes_written, bytes_read;  /* SSD file bytes */
    uint64_t prefetched;          /* blocks read ahead (td_kvtier_prefetch): reads done */
    uint64_t prefetch_unused;     /* of them, dropped before a get_many took them */
    uint64_t prefetch_dropped;    /* blocks of prefetches refused: queue full */
} td_kvtier_stats_t;

typedef struct td_kvtier td_kvtier_t;

/* Scans cfg->ssd_dir (each file's header and table only): well-formed files
 * of this layout and seed enter the SSD index, oldest mtime first evicted;
 * malformed and foreign cache files and leftover temp files are logged and
 * deleted; other names are left alone (and not counted). Evicts to the
 * budget, starts the IO thread and the reader threads. */
td_status_t td_kvtier_create(const td_kvtier_config_t *cfg, td_kvtier_t **out);

/* Finishes the queued writes (at most queue_cap records) and deletions,
 * stops the threads, frees everything. Files stay: a create on the same
 * directory finds them. */
void td_kvtier_destroy(td_kvtier_t *kt);

/* Copies rec into the host tier (LRU-evicting to its budget; a record bigger
 * than the budget is not kept) and queues it for write-back to SSD (a file of
 * its own) unless the SSD tier has it. Never waits for IO; takes the mutex
 * briefly. TD_ERR_INVALID for a malformed record. A record is held (has,
 * events) once in the host tier or written, not while queued. */
td_status_t td_kvtier_put(td_kvtier_t *kt, const td_kvrec_t *rec);

/* put for a batch of n records, consecutive blocks of one prompt as a
 * prefill makes them: on SSD they share a file (pack_records at most each),
 * so a later chain read is one large read. The records already on SSD are
 * left out of the file. A full queue drops the whole batch's write-back. */
td_status_t td_kvtier_put_many(td_kvtier_t *kt, const td_kvrec_t *recs, size_t n);
/* put_many into the tiers of the mask only (TD_KVTIER_HOST, TD_KVTIER_SSD):
 * a prefix cache writes its new blocks back to SSD while its pool holds them,
 * and moves them to the host tier only when the pool lets them go. */
td_status_t td_kvtier_put_many_to(td_kvtier_t *kt, const td_kvrec_t *recs, size_t n,
                                  unsigned tiers);

/* TD_KVTIER_HOST | TD_KVTIER_SSD for the tiers that hold hash; no IO. */
unsigned td_kvtier_has(td_kvtier_t *kt, uint64_t hash);

/* Reads the record of hash (host first, else SSD, which promotes it to the
 * host tier), checks it (checksum, header, tokens == expect_tokens[block_tokens])
 * and copies it into *out. TD_ERR_NOT_FOUND on a miss; a bad record is
 * logged and a miss, and its file is deleted with the file's other records.
 * TD_ERR_TOO_BIG when out's buffers are too small (the record is kept). */
td_status_t td_kvtier_get(td_kvtier_t *kt, uint64_t hash, const int32_t *expect_tokens,
                          uint32_t block_tokens, td_kvtier_out_t *out);

/* get for a chain of n blocks: hashes[n], expect_tokens[n * block_tokens],
 * outs[n]. The SSD blocks are read in runs (consecutive blocks of one file,
 * up to 256 KiB), one O_DIRECT read each, all in flight at once with Linux
 * AIO (else on the caller and the reader threads), then checked as get
 * does. *n_hit: how many leading blocks were read (blocks after a miss may
 * have been read too). TD_OK, or the error of the first block that failed
 * other than a miss. */
td_status_t td_kvtier_get_many(td_kvtier_t *kt, const uint64_t *hashes, size_t n,
                               const int32_t *expect_tokens, uint32_t block_tokens,
                               td_kvtier_out_t *outs, size_t *n_hit);

/* Starts reading the SSD blocks of a chain ahead of its get_many: a prefill
 * rank calls it when a request with a cached prefix arrives, and get_many
 * when the request's turn comes. hashes[n] as for get_many; copied. Never
 * waits for IO: the tier's prefetch thread reads the queued chains' runs,
 * up to 32 held at once (8 MiB), with its own Linux AIO context (else one by
 * one), and keeps each read run until a get_many takes its blocks, which it
 * then checks and copies out as it does its own reads; a get_many of a block
 * being read waits for that read. Blocks in the host tier are left out; the
 * chain ends at the first block neither tier holds. A run no get_many takes
 * goes a second after its read (prefetch_unused); a flush drops them all.
 * TD_ERR_UNSUPPORTED without an SSD tier, TD_ERR_BUSY when 65536 blocks are
 * queued already (prefetch_dropped), TD_ERR_NOMEM (nothing queued). */
td_status_t td_kvtier_prefetch(td_kvtier_t *kt, const uint64_t *hashes, size_t n);

/* Empties both tiers: drops the host records and the queued writes; the IO
 * thread deletes the files (td_kvtier_wait_idle waits for it). */
void td_kvtier_flush(td_kvtier_t *kt);

/* Changes of the set of hashes held (host or SSD) since the last drain or
 * snapshot, netted per hash: added[*n_added], removed[*n_removed]. TD_OK when
 * all were drained, TD_INPROGRESS when more remain (call again). */
td_status_t td_kvtier_drain_events(td_kvtier_t *kt, uint64_t *added, size_t added_cap,
                                   size_t *n_added, uint64_t *removed, size_t removed_cap,
                                   size_t *n_removed);

/* Every hash held, into out[*n], and forgets the pending events (later drains
 * are changes from this set). TD_ERR_TOO_BIG with *n = the count needed when
 * cap is short (nothing forgotten). */
td_status_t td_kvtier_snapshot(td_kvtier_t *kt, uint64_t *out, size_t cap, size_t *n);

void td_kvtier_stats(td_kvtier_t *kt, td_kvtier_stats_t *out);

/* Waits until the IO thread has no queued work (writes and deletions). */
void td_kvtier_wait_idle(td_kvtier_t *kt);

/* Tests only: while stalled the IO thread takes no work. */
void td_kvtier_test_stall(td_kvtier_t *kt, bool stalled);

#endif
