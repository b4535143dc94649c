/* kvcache/kvrec.c — the SSD tier's record and file format (docs/kvtier.md,
 * "File format"): records in memory as their file images (blobs), a file's
 * header and table written and parsed, a record read back checked. No IO
 * and no lock here.
 *
 * <name:016x>.kvb holds the records of one put batch (name: the first one's
 * hash): a 40-byte file header, a table of 40-byte entries, the records.
 * File header (little-endian): magic "TDKVPAK1", table checksum u64 (XXH3-64 of
 * bytes [16, 40 + 40n)), version u32, n u32, layout_hash, seed (u64).
 * Table entry: hash, offset, payload_bytes, snapshot_bytes (u64), G u32, 0 u32.
 * Record at its offset: an 80-byte header, tokens [G] (int32 LE), payload,
 * snapshot. Header: magic "TDKVBLK1", checksum u64, version u32, G u32,
 * layout_hash, seed, hash, parent, end, payload_bytes, snapshot_bytes (u64).
 * checksum: XXH3-64 chained through its seed over header[16, 80), tokens,
 * payload, snapshot. Temp files: <name:016x>.tmp, renamed into place. */
#include "kvtier_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define KV_MAGIC      "TDKVBLK1"
#define KV_VERSION    1u
#define MAX_G         (1u << 20)
#define MAX_PART      (1ull << 40)
#define PACK_MAGIC    "TDKVPAK1"

enum { OFF_CSUM = 8, OFF_VERSION = 16, OFF_G = 20, OFF_LAYOUT = 24, OFF_SEED = 32,
       OFF_HASH = 40, OFF_PARENT = 48, OFF_END = 56, OFF_PAYLOAD = 64, OFF_SNAP = 72 };

static void
put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t
get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The checksum of a record in parts (the file's layout, any buffers). */
static uint64_t
rec_checksum(const uint8_t *hdr, const void *tokens, uint32_t g, const void *payload,
             uint64_t payload_bytes, const void *snapshot, uint64_t snapshot_bytes)
{
    uint64_t c = XXH3_64bits_withSeed(hdr + OFF_VERSION, HDR_BYTES - OFF_VERSION, 0);

    c = XXH3_64bits_withSeed(tokens, (size_t)g * 4, c);
    c = XXH3_64bits_withSeed(payload, payload_bytes, c);
    return XXH3_64bits_withSeed(snapshot, snapshot_bytes, c);
}

void
kvrec_name(char *buf, uint64_t hash, const char *ext)
{
    snprintf(buf, NAME_LEN, "%016" PRIx64 "%s", hash, ext);
}

/* Parses "<16 hex>" + ext; true with *hash. */
bool
kvrec_name_parse(const char *name, const char *ext, uint64_t *hash)
{
    uint64_t h = 0;

    for (int i = 0; i < 16; i++) {
        char c = name[i];
        unsigned d;

        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else return false;
        h = (h << 4) | d;
    }
    if (strcmp(name + 16, ext) != 0)
        return false;
    *hash = h;
    return true;
}

bool
kvrec_valid(const td_kvrec_t *r)
{
    return r->hash != 0 && r->block_tokens > 0 && r->block_tokens <= MAX_G &&
           r->tokens != NULL && r->payload != NULL && r->payload_bytes > 0 &&
           r->payload_bytes <= MAX_PART && r->snapshot_bytes <= MAX_PART &&
           (r->snapshot == NULL) == (r->snapshot_bytes == 0);
}

/* ---- Blobs ------------------------------------------------------------------- */
static void
hdr_fill(uint8_t *h, const td_kvtier_config_t *cfg, const td_kvrec_t *rec)
{
    memcpy(h, KV_MAGIC, 8);
    put_le64(h + OFF_CSUM, 0);
    put_le32(h + OFF_VERSION, KV_VERSION);
    put_le32(h + OFF_G, rec->block_tokens);
    put_le64(h + OFF_LAYOUT, cfg->layout_hash);
    put_le64(h + OFF_SEED, cfg->seed);
    put_le64(h + OFF_HASH, rec->hash);
    put_le64(h + OFF_PARENT, rec->parent);
    put_le64(h + OFF_END, rec->end);
    put_le64(h + OFF_PAYLOAD, rec->payload_bytes);
    put_le64(h + OFF_SNAP, rec->snapshot_bytes);
}

kvblob_t *
kvrec_blob_alloc(uint32_t g, uint64_t payload_bytes, uint64_t snapshot_bytes)
{
    uint64_t bytes = kvrec_bytes(g, payload_bytes, snapshot_bytes);
    kvblob_t *b = malloc(sizeof(*b) + bytes);

    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->g = g;
    b->bytes = bytes;
    b->payload_bytes = payload_bytes;
    b->snapshot_bytes = snapshot_bytes;
    return b;
}

/* The body of b (after its header) from its parts. */
static void
blob_body(kvblob_t *b, const void *tokens, const void *payload, const void *snapshot)
{
    memcpy(b->data + HDR_BYTES, tokens, (size_t)b->g * 4);
    memcpy((uint8_t *)kvblob_payload(b), payload, b->payload_bytes);
    if (b->snapshot_bytes > 0)
        memcpy((uint8_t *)kvblob_snapshot(b), snapshot, b->snapshot_bytes);
}

kvblob_t *
kvrec_blob_of(const td_kvtier_config_t *cfg, const td_kvrec_t *rec)
{
    kvblob_t *b = kvrec_blob_alloc(rec->block_tokens, rec->payload_bytes, rec->snapshot_bytes);

    if (b == NULL)
        return NULL;
    hdr_fill(b->data, cfg, rec);
    blob_body(b, rec->tokens, rec->payload, rec->snapshot);
    return b;
}

kvblob_t *
kvrec_blob_read(const uint8_t *hdr, const void *tokens, uint32_t g, const void *payload,
                uint64_t payload_bytes, const void *snapshot, uint64_t snapshot_bytes)
{
    kvblob_t *b = kvrec_blob_alloc(g, payload_bytes, snapshot_bytes);

    if (b == NULL)
        return NULL;
    memcpy(b->data, hdr, HDR_BYTES);
    blob_body(b, tokens, payload, snapshot);
    return b;
}

kvblob_t *
kvrec_blob_ref(kvblob_t *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

void
kvrec_blob_unref(kvblob_t *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

uint64_t
kvrec_blob_hash(const kvblob_t *b)
{
    return get_le64(b->data + OFF_HASH);
}

/* ---- Records read back ------------------------------------------------------- */
/* What is wrong with a record's header (expected: block `hash` of `bytes`),
 * or NULL. */
static const char *
hdr_check(const td_kvtier_config_t *cfg, const uint8_t *h, uint64_t hash, uint64_t bytes)
{
    uint32_t g = get_le32(h + OFF_G);
    uint64_t payload = get_le64(h + OFF_PAYLOAD), snap = get_le64(h + OFF_SNAP);

    if (memcmp(h, KV_MAGIC, 8) != 0)
        return "bad magic";
    if (get_le32(h + OFF_VERSION) != KV_VERSION)
        return "unknown version";
    if (g == 0 || g > MAX_G || payload == 0 || payload > MAX_PART || snap > MAX_PART)
        return "sizes out of range";
    if (kvrec_bytes(g, payload, snap) != bytes)
        return "sizes differ from the file's table";
    if (get_le64(h + OFF_HASH) != hash)
        return "holds another block";
    if (get_le64(h + OFF_LAYOUT) != cfg->layout_hash || get_le64(h + OFF_SEED) != cfg->seed)
        return "foreign (another layout hash or seed)";
    return NULL;
}

const char *
kvrec_check(const td_kvtier_config_t *cfg, const uint8_t *hdr, uint64_t hash, uint32_t g,
            uint64_t payload_bytes, uint64_t snapshot_bytes, const void *tokens,
            const void *payload, const void *snapshot)
{
    const char *why = hdr_check(cfg, hdr, hash, kvrec_bytes(g, payload_bytes, snapshot_bytes));

    if (why != NULL)
        return why;
    if (get_le32(hdr + OFF_G) != g || get_le64(hdr + OFF_PAYLOAD) != payload_bytes ||
        get_le64(hdr + OFF_SNAP) != snapshot_bytes)
        return "sizes differ from the file's table";
    if (rec_checksum(hdr, tokens, g, payload, payload_bytes, snapshot, snapshot_bytes) !=
        get_le64(hdr + OFF_CSUM))
        return "checksum mismatch";
    return NULL;
}

/* ---- Files ------------------------------------------------------------------- */
static void
pack_hdr_fill(const td_kvtier_config_t *cfg, uint8_t *tab, uint32_t n)
{
    memcpy(tab, PACK_MAGIC, 8);
    put_le32(tab + 16, KV_VERSION);
    put_le32(tab + 20, n);
    put_le64(tab + 24, cfg->layout_hash);
    put_le64(tab + 32, cfg->seed);
    put_le64(tab + 8, XXH3_64bits_withSeed(tab + 16, PACK_HDR - 16 + (size_t)n * PACK_ENT, 0));
}

void
kvrec_pack(const td_kvtier_config_t *cfg, kvblob_t *const *blobs, uint32_t n, uint8_t *tab,
           uint8_t (*hdrs)[HDR_BYTES], struct iovec *iov)
{
    uint64_t off = PACK_HDR + (uint64_t)n * PACK_ENT;
    int niov = 0;

    iov[niov++] = (struct iovec){ tab, off };
    for (uint32_t i = 0; i < n; i++) {
        const kvblob_t *b = blobs[i];
        uint8_t *e = tab + PACK_HDR + (size_t)i * PACK_ENT;

        memcpy(hdrs[i], b->data, HDR_BYTES);
        put_le64(hdrs[i] + OFF_CSUM, rec_checksum(hdrs[i], kvblob_tokens(b), b->g, kvblob_payload(b),
                                                  b->payload_bytes, kvblob_snapshot(b),
                                                  b->snapshot_bytes));
        put_le64(e, kvrec_blob_hash(b));
        put_le64(e + 8, off);
        put_le64(e + 16, b->payload_bytes);
        put_le64(e + 24, b->snapshot_bytes);
        put_le32(e + 32, b->g);
        put_le32(e + 36, 0);
        iov[niov++] = (struct iovec){ hdrs[i], HDR_BYTES };
        iov[niov++] = (struct iovec){ (void *)(b->data + HDR_BYTES), b->bytes - HDR_BYTES };
        off += b->bytes;
    }
    pack_hdr_fill(cfg, tab, n);
}

const char *
kvrec_pack_check(const td_kvtier_config_t *cfg, const uint8_t *h, uint32_t *n, bool *foreign)
{
    uint32_t count = get_le32(h + 20);

    *foreign = false;
    if (memcmp(h, PACK_MAGIC, 8) != 0)
        return "bad magic";
    if (get_le32(h + 16) != KV_VERSION)
        return "unknown version";
    if (count == 0 || count > PACK_MAX)
        return "record count out of range";
    if (get_le64(h + 24) != cfg->layout_hash || get_le64(h + 32) != cfg->seed) {
        *foreign = true;
        return "foreign (another layout hash or seed)";
    }
    *n = count;
    return NULL;
}

const char *
kvrec_table_parse(const uint8_t *tab, uint32_t n, uint64_t name, uint64_t size, kvtable_t *t)
{
    uint64_t tab_bytes = PACK_HDR + (uint64_t)n * PACK_ENT, off = tab_bytes;

    if (XXH3_64bits_withSeed(tab + 16, tab_bytes - 16, 0) != get_le64(tab + 8))
        return "table checksum mismatch";
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = tab + PACK_HDR + (size_t)i * PACK_ENT;
        uint64_t h = get_le64(e), pay = get_le64(e + 16), snap = get_le64(e + 24);
        uint32_t g = get_le32(e + 32);

        if (i == 0 && h != name)
            return "holds another block (hash differs from its name)";
        if (h == 0 || g == 0 || g > MAX_G || pay == 0 || pay > MAX_PART || snap > MAX_PART ||
            get_le64(e + 8) != off)
            return "table entry out of range";
        t->hashes[i] = h;
        t->offs[i] = off;
        t->pays[i] = pay;
        t->snaps[i] = snap;
        t->gs[i] = g;
        off += kvrec_bytes(g, pay, snap);
    }
    if (off != size)
        return "sizes differ from the file's size (truncated?)";
    return NULL;
}
