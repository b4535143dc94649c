/* engine/kvsum.h — the checksum of a request's KV as its prefill rank sends
 * it and its decode rank receives it (docs/xfer.md, "KV checksum"): XXH3-64
 * per segment over its entries in order, the segment digests combined in
 * layout order. It does not depend on how the bytes were cut into puts, so
 * the sender computes it as it posts the pieces (td_kvsum_t) and the
 * receiver over its blocks once everything is in (td_kvsum_of).
 * Ownership: a td_kvsum_t borrows its layout (which must outlive it). */
#ifndef TD_KVSUM_H
#define TD_KVSUM_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "status.h"

/* The sum of kv after ntokens tokens. Segment s covers entries [0, E) with
 * E = floor(ntokens / ratio) for a paged segment, its slots for a fixed one;
 * its digest d[s] = XXH3_64bits over those entries' bytes in increasing
 * order; the sum = XXH3_64bits over d[0], ..., d[nsegs - 1], each as 8
 * little-endian bytes. TD_ERR_RANGE when a paged segment has fewer blocks
 * than E entries need; TD_ERR_NOMEM. Logs nothing. */
td_status_t td_kvsum_of(const td_layout_kv_t *kv, uint64_t ntokens, uint64_t *out);

/* The same sum built piece by piece, as a sender produces the entries. */
typedef struct td_kvsum_s td_kvsum_t;

td_status_t td_kvsum_create(const td_layout_t *layout, td_kvsum_t **out);
void td_kvsum_destroy(td_kvsum_t *s);

/* Add entries [first, first + count) of segment seg: count × entry_bytes
 * bytes at data. A paged segment's entries must come in order (first = the
 * entries added so far); a fixed segment comes whole (first 0, count = its
 * slots) and replaces the one given before, as it does in the decode rank's
 * slot. Anything else (or an unknown segment, count 0): TD_ERR_RANGE, and
 * the sum stays refused (td_kvsum_final says where). */
td_status_t td_kvsum_update(td_kvsum_t *s, uint32_t seg, uint64_t first, uint64_t count,
                            const void *data);

/* The sum once the entries of ntokens tokens are in: equal to td_kvsum_of
 * over memory holding the same bytes. TD_ERR_RANGE, with the reason in why
 * (not logged), when an update was refused, a paged segment holds other than
 * floor(ntokens / ratio) entries, or a fixed segment was never given. */
td_status_t td_kvsum_final(const td_kvsum_t *s, uint64_t ntokens, uint64_t *out, char *why,
                           size_t why_len);

#endif
