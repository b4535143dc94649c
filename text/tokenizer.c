/* text/tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json, with
 * the semantics of HF tokenizers: added tokens split out first, Split regexes
 * (PCRE2, JIT) and the ByteLevel step, merges by rank, ByteLevel decoding. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include "buf.h"
#include "hmap.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOK_MAX_ID        (1u << 24)  /* ids above this are refused at load */
#define TOK_MAX_STAGES    16          /* pre-tokenizer steps */
#define TOK_SMALL_WORD    96          /* BPE by rescanning up to this many symbols */
#define TOK_CACHE_SLOTS   (1u << 15)  /* pre-token cache, per scratch: slots, half used */
#define TOK_CACHE_KEY_MAX 48          /* longest pre-token cached, bytes */
#define TOK_CACHE_KEYS    (TOK_CACHE_SLOTS / 2 * 16)   /* key arena, bytes */
#define TOK_CACHE_IDS     (TOK_CACHE_SLOTS / 2 * 4)    /* id arena, ids */
#define TOK_NONE          UINT32_MAX

/* HF ByteLevel's regex (GPT-2), used when ByteLevel has use_regex = true. */
static const char tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- Types ------------------------------------------------------------- */

typedef struct {
    uint32_t off, len;      /* into tok->arena */
} tok_span_t;

enum { TOK_ID_PRESENT = 1, TOK_ID_ADDED = 2, TOK_ID_SPECIAL = 4 };

typedef struct {
    tok_span_t token;       /* raw string (HF id_to_token) */
    tok_span_t piece;       /* bytes it decodes to */
    uint8_t flags;          /* TOK_ID_* */
} tok_id_t;

/* String -> id: a hash table (base/hmap.h) from each string's tok_hash to
 * where the string is in tok->arena, off << 32 | len; its id is the 4 bytes
 * before it there (tok_map_add). */
typedef struct {
    td_hmap_t *idx;         /* several strings per hash */
} tok_map_t;

/* A merge, (left id, right id) -> (rank, merged id): in tok->merges, the key
 * left << 32 | right, the value rank << 32 | merged id. */
typedef struct {
    uint32_t rank, id;      /* both TOK_NONE: the pair does not merge */
} tok_merge_t;

typedef struct {
    uint32_t id;
    tok_span_t content;
    bool special, lstrip, rstrip, normalized;
} tok_added_t;

/* Byte trie of added-token contents; node 0 is unused (0 = no node). */
typedef struct {
    uint32_t child, sibling;
    uint32_t added;         /* index into tok->added + 1; 0: none ends here */
    uint8_t byte;
} tok_node_t;

typedef struct {
    tok_node_t *nodes;
    size_t n, cap;
    uint32_t root[256];     /* first-byte nodes */
    size_t count;           /* tokens inserted */
} tok_trie_t;

typedef enum {
    TOK_STAGE_SPLIT,        /* Split(Isolated) by a regex */
    TOK_STAGE_PREFIX_SPACE, /* ByteLevel add_prefix_space */
} tok_stage_kind_t;

typedef struct {
    tok_stage_kind_t kind;
    pcre2_code *re;
    bool jit;
} tok_stage_t;

/* Pre-token -> ids cache entry: in sc->cache, the key the pre-token's
 * tok_hash, the value the four fields packed (tok_cache_pack). */
typedef struct {
    uint32_t key_off, ids_off;
    uint32_t key_len, nids;
} tok_cent_t;

/* Per-encode working memory, taken from tok->pool and given back. */
typedef struct tok_scratch {
    struct tok_scratch *next;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    char *pbuf[TOK_MAX_STAGES];     /* prefix-space copies, per stage */
    size_t pcap[TOK_MAX_STAGES];
    uint32_t *sym, *rank, *mid;     /* BPE: symbols, pair ranks, merged ids */
    int32_t *prev, *succ;           /* BPE heap path: links */
    uint64_t *heap;
    size_t sym_cap, heap_cap;
    td_hmap_t *cache;               /* tok_hash -> tok_cent_t packed, TOK_CACHE_SLOTS slots */
    char *ckeys;
    uint32_t *cids;
    size_t ckeys_len, cids_len;
} tok_scratch_t;

struct td_tokenizer {
    char *path;
    char *arena;                    /* every string: tokens, pieces, contents */
    size_t arena_len, arena_cap;
    tok_id_t *ids;                  /* [nids] */
    uint32_t nids;                  /* vocab size: highest id + 1 */
    tok_map_t vocab;                /* model vocabulary */
    tok_map_t added_map;            /* added-token contents */
    td_hmap_t *merges;              /* tok_merge_t's key -> its value */
    uint32_t byte_id[256];          /* id of each byte's byte-level symbol */
    uint16_t byte_char[256];        /* each byte's byte-level character */
    tok_added_t *added;
    size_t nadded;
    tok_trie_t trie[2];             /* [0]: not normalized, [1]: normalized */
    tok_stage_t stages[TOK_MAX_STAGES];
    int nstages;
    bool ignore_merges;
    size_t max_piece;
    pthread_mutex_t pool_lock;
    tok_scratch_t *pool;
};

/* ---- Hashing ------------------------------------------------------------- */

static inline uint64_t
tok_mix(uint64_t h)
{
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static uint64_t
tok_hash(const char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    return tok_mix(h);
}

/* ---- UTF-8 --------------------------------------------------------------- */

static const char tok_fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

/* Length of a valid sequence starting at s (n bytes left), 0 when invalid;
 * *bad gets the length of the maximal invalid subpart (Unicode 3.9, the
 * rule Python's "replace" error handler follows). */
static size_t
tok_utf8_valid_len(const uint8_t *s, size_t n, size_t *bad)
{
    uint8_t b = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need;
}

/* Offset of the first invalid sequence in s, or n when s is valid UTF-8. */
static size_t
tok_utf8_check(const char *text, size_t n)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, l = tok_utf8_valid_len(s + i, n - i, &bad);
        if (l == 0)
            return i;
        i += l;
    }
    return n;
}

/* Copy of text with each maximal invalid subpart replaced by U+FFFD. */
static td_status_t
tok_utf8_sanitize(const char *text, size_t n, char **out, size_t *outlen)
{
    const uint8_t *s = (const uint8_t *)text;
    if (n > (SIZE_MAX - 1) / 3)
        return TD_ERR_TOO_BIG;
    char *buf = malloc(3 * n + 1);
    if (!buf)
        return TD_ERR_NOMEM;
    size_t o = 0, i = 0;
    while (i < n) {
        size_t bad = 0, l = tok_utf8_valid_len(s + i, n - i, &bad);
        if (l) {
            memcpy(buf + o, s + i, l);
            o += l;
            i += l;
        } else {
            memcpy(buf + o, tok_fffd, 3);
            o += 3;
            i += bad;
        }
    }
    *out = buf;
    *outlen = o;
    return TD_OK;
}

/* Decode the character at s (valid UTF-8), setting *len. */
static uint32_t
tok_utf8_decode(const uint8_t *s, size_t *len)
{
    if (s[0] < 0x80) {
        *len = 1;
        return s[0];
    }
    if (s[0] < 0xE0) {
        *len = 2;
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (s[0] < 0xF0) {
        *len = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

static size_t
tok_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unicode White_Space (Rust regex \s, which HF's lstrip/rstrip use). */
static bool
tok_is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- Byte-level alphabet ------------------------------------------------- */

/* GPT-2's bytes <-> characters: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100.. in byte order. */
static void
tok_byte_chars(uint16_t map[256])
{
    uint16_t n = 0;
    for (unsigned b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        map[b] = printable ? (uint16_t)b : (uint16_t)(0x100 + n++);
    }
}

/* ---- Oniguruma patterns as PCRE2 patterns ------------------------------- */

typedef struct {
    const char *path;
    td_tokenizer_t *tok;
} tok_load_t;

typedef struct {
    uint32_t lo, hi;
    char cat[3];
} tok_ucd_range_t;

/* BEGIN tests/tokenizer/mkucd: code points Unicode 15.0-16.0 assigned, with
 * their general category as Oniguruma (HF tokenizers 0.23.3) reads it; PCRE2
 * 10.42 (Unicode 14.0) reads them as Cn. Not covered (a changed category):
 * U+1171E Mn->Mc. */
static const tok_ucd_range_t tok_ucd_new[] = {
    { 0x00897, 0x00897, "Mn" }, { 0x00CF3, 0x00CF3, "Mc" }, { 0x00ECE, 0x00ECE, "Mn" },
    { 0x01B4E, 0x01B4F, "Po" }, { 0x01B7F, 0x01B7F, "Po" }, { 0x01C89, 0x01C89, "Lu" },
    { 0x01C8A, 0x01C8A, "Ll" }, { 0x02427, 0x02429, "So" }, { 0x02FFC, 0x02FFF, "So" },
    { 0x031E4, 0x031E5, "So" }, { 0x031EF, 0x031EF, "So" }, { 0x0A7CB, 0x0A7CC, "Lu" },
    { 0x0A7CD, 0x0A7CD, "Ll" }, { 0x0A7DA, 0x0A7DA, "Lu" }, { 0x0A7DB, 0x0A7DB, "Ll" },
    { 0x0A7DC, 0x0A7DC, "Lu" }, { 0x105C0, 0x105F3, "Lo" }, { 0x10D40, 0x10D49, "Nd" },
    { 0x10D4A, 0x10D4D, "Lo" }, { 0x10D4E, 0x10D4E, "Lm" }, { 0x10D4F, 0x10D4F, "Lo" },
    { 0x10D50, 0x10D65, "Lu" }, { 0x10D69, 0x10D6D, "Mn" }, { 0x10D6E, 0x10D6E, "Pd" },
    { 0x10D6F, 0x10D6F, "Lm" }, { 0x10D70, 0x10D85, "Ll" }, { 0x10D8E, 0x10D8F, "Sm" },
    { 0x10EC2, 0x10EC4, "Lo" }, { 0x10EFC, 0x10EFF, "Mn" }, { 0x1123F, 0x11240, "Lo" },
    { 0x11241, 0x11241, "Mn" }, { 0x11380, 0x11389, "Lo" }, { 0x1138B, 0x1138B, "Lo" },
    { 0x1138E, 0x1138E, "Lo" }, { 0x11390, 0x113B5, "Lo" }, { 0x113B7, 0x113B7, "Lo" },
    { 0x113B8, 0x113BA, "Mc" }, { 0x113BB, 0x113C0, "Mn" }, { 0x113C2, 0x113C2, "Mc" },
    { 0x113C5, 0x113C5, "Mc" }, { 0x113C7, 0x113CA, "Mc" }, { 0x113CC, 0x113CD, "Mc" },
    { 0x113CE, 0x113CE, "Mn" }, { 0x113CF, 0x113CF, "Mc" }, { 0x113D0, 0x113D0, "Mn" },
    { 0x113D1, 0x113D1, "Lo" }, { 0x113D2, 0x113D2, "Mn" }, { 0x113D3, 0x113D3, "Lo" },
    { 0x113D4, 0x113D5, "Po" }, { 0x113D7, 0x113D8, "Po" }, { 0x113E1, 0x113E2, "Mn" },
    { 0x116D0, 0x116E3, "Nd" }, { 0x11B00, 0x11B09, "Po" }, { 0x11BC0, 0x11BE0, "Lo" },
    { 0x11BE1, 0x11BE1, "Po" }, { 0x11BF0, 0x11BF9, "Nd" }, { 0x11F00, 0x11F01, "Mn" },
    { 0x11F02, 0x11F02, "Lo" }, { 0x11F03, 0x11F03, "Mc" }, { 0x11F04, 0x11F10, "Lo" },
    { 0x11F12, 0x11F33, "Lo" }, { 0x11F34, 0x11F35, "Mc" }, { 0x11F36, 0x11F3A, "Mn" },
    { 0x11F3E, 0x11F3F, "Mc" }, { 0x11F40, 0x11F40, "Mn" }, { 0x11F41, 0x11F41, "Mc" },
    { 0x11F42, 0x11F42, "Mn" }, { 0x11F43, 0x11F4F, "Po" }, { 0x11F50, 0x11F59, "Nd" },
    { 0x11F5A, 0x11F5A, "Mn" }, { 0x1342F, 0x1342F, "Lo" }, { 0x13439, 0x1343F, "Cf" },
    { 0x13440, 0x13440, "Mn" }, { 0x13441, 0x13446, "Lo" }, { 0x13447, 0x13455, "Mn" },
    { 0x13460, 0x143FA, "Lo" }, { 0x16100, 0x1611D, "Lo" }, { 0x1611E, 0x16129, "Mn" },
    { 0x1612A, 0x1612C, "Mc" }, { 0x1612D, 0x1612F, "Mn" }, { 0x16130, 0x16139, "Nd" },
    { 0x16D40, 0x16D42, "Lm" }, { 0x16D43, 0x16D6A, "Lo" }, { 0x16D6B, 0x16D6C, "Lm" },
    { 0x16D6D, 0x16D6F, "Po" }, { 0x16D70, 0x16D79, "Nd" }, { 0x18CFF, 0x18CFF, "Lo" },
    { 0x1B132, 0x1B132, "Lo" }, { 0x1B155, 0x1B155, "Lo" }, { 0x1CC00, 0x1CCEF, "So" },
    { 0x1CCF0, 0x1CCF9, "Nd" }, { 0x1CD00, 0x1CEB3, "So" }, { 0x1D2C0, 0x1D2D3, "No" },
    { 0x1DF25, 0x1DF2A, "Ll" }, { 0x1E030, 0x1E06D, "Lm" }, { 0x1E08F, 0x1E08F, "Mn" },
    { 0x1E4D0, 0x1E4EA, "Lo" }, { 0x1E4EB, 0x1E4EB, "Lm" }, { 0x1E4EC, 0x1E4EF, "Mn" },
    { 0x1E4F0, 0x1E4F9, "Nd" }, { 0x1E5D0, 0x1E5ED, "Lo" }, { 0x1E5EE, 0x1E5EF, "Mn" },
    { 0x1E5F0, 0x1E5F0, "Lo" }, { 0x1E5F1, 0x1E5FA, "Nd" }, { 0x1E5FF, 0x1E5FF, "Po" },
    { 0x1F6DC, 0x1F6DC, "So" }, { 0x1F774, 0x1F776, "So" }, { 0x1F77B, 0x1F77F, "So" },
    { 0x1F7D9, 0x1F7D9, "So" }, { 0x1F8B2, 0x1F8BB, "So" }, { 0x1F8C0, 0x1F8C1, "So" },
    { 0x1FA75, 0x1FA77, "So" }, { 0x1FA87, 0x1FA89, "So" }, { 0x1FA8F, 0x1FA8F, "So" },
    { 0x1FAAD, 0x1FAAF, "So" }, { 0x1FABB, 0x1FABF, "So" }, { 0x1FAC6, 0x1FAC6, "So" },
    { 0x1FACE, 0x1FACF, "So" }, { 0x1FADA, 0x1FADC, "So" }, { 0x1FADF, 0x1FADF, "So" },
    { 0x1FAE8, 0x1FAE9, "So" }, { 0x1FAF7, 0x1FAF8, "So" }, { 0x1FBCB, 0x1FBEF, "So" },
    { 0x2B739, 0x2B739, "Lo" }, { 0x2EBF0, 0x2EE5D, "Lo" }, { 0x31350, 0x323AF, "Lo" },
};
/* END tests/tokenizer/mkucd */

/* The ranges tok_ucd_new adds to general category `name` (L, Lu, LC, L&). */
static void
tok_ucd_ranges(td_buf_t *b, const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof tok_ucd_new / sizeof tok_ucd_new[0]; i++) {
        const tok_ucd_range_t *r = &tok_ucd_new[i];
        bool in;
        if (len == 1)
            in = r->cat[0] == name[0];
        else if (len == 2 && (memcmp(name, "LC", 2) == 0 || memcmp(name, "L&", 2) == 0))
            in = r->cat[0] == 'L' && (r->cat[1] == 'u' || r->cat[1] == 'l' || r->cat[1] == 't');
        else
            in = len == 2 && memcmp(name, r->cat, 2) == 0;
        if (!in)
            continue;
        char x[40];
        if (r->lo == r->hi)
            snprintf(x, sizeof x, "\\x{%X}", r->lo);
        else
            snprintf(x, sizeof x, "\\x{%X}-\\x{%X}", r->lo, r->hi);
        td_buf_puts(b, x);
    }
}

/* Whether \p{name} is a general category (the ones tok_ucd_new extends). */
static bool
tok_is_gc(const char *name, size_t len)
{
    static const char *const gc[] = {
        "L", "M", "N", "P", "S", "Z", "C", "LC", "L&", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn",
        "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
        "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn",
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++)
        if (strlen(gc[i]) == len && memcmp(gc[i], name, len) == 0)
            return true;
    return false;
}

/* A property, positive or negated, in or out of a class, as PCRE2 text:
 * general categories gain tok_ucd_new's code points. */
static bool
tok_regex_prop(td_buf_t *b, const char *name, size_t len, bool neg, bool in_class)
{
    char head[64];
    if (len + 8 > sizeof head)
        return false;
    snprintf(head, sizeof head, "\\p{%.*s}", (int)len, name);
    if (!tok_is_gc(name, len)) {
        if (neg)
            head[1] = 'P';
        td_buf_puts(b, head);
        return true;
    }
    td_buf_t extra = { 0 };
    tok_ucd_ranges(&extra, name, len);
    bool more = extra.len > 0;
    if (!more) {
        if (neg)
            head[1] = 'P';
        td_buf_puts(b, head);
    } else if (in_class && neg) {
        td_buf_free(&extra);
        return false;   /* a complement of a union cannot sit inside a class */
    } else {
        if (!in_class)
            td_buf_puts(b, neg ? "[^" : "[");
        td_buf_puts(b, head);
        td_buf_append(b, extra.data, extra.len);
        if (!in_class)
            td_buf_puts(b, "]");
    }
    if (td_buf_status(&extra) != TD_OK)
        b->failed = 1;
    td_buf_free(&extra);
    return true;
}

/* \p or \P at pat[*i]: \p{Name}, \p{^Name} or the one-letter \pL, as PCRE2
 * text; *i left on the escape's last character. False when malformed or not
 * expressible. */
static bool
tok_regex_escape_prop(td_buf_t *b, const char *pat, size_t n, size_t *i, bool in_class)
{
    bool neg = pat[*i] == 'P';
    const char *name = NULL;
    size_t len = 0;

    if (*i + 1 < n && pat[*i + 1] == '{') {
        const char *close = strchr(pat + *i + 2, '}');
        if (!close)
            return false;
        name = pat + *i + 2;
        len = (size_t)(close - name);
        *i = (size_t)(close - pat);
        if (len && name[0] == '^') {
            neg = !neg;
            name++;
            len--;
        }
    } else if (*i + 1 < n) {
        name = pat + ++*i;
        len = 1;
    }
    return name && len && tok_regex_prop(b, name, len, neg, in_class);
}

/* \uHHHH at pat[*i] as \x{HHHH}; *i left on the last digit. False without
 * four hex digits. */
static bool
tok_regex_escape_u(td_buf_t *b, const char *pat, size_t n, size_t *i)
{
    size_t k = 0;
    char x[16];

    while (k < 4 && *i + 1 + k < n && strchr("0123456789abcdefABCDEF", pat[*i + 1 + k]))
        k++;
    if (k != 4)
        return false;
    snprintf(x, sizeof x, "\\x{%.4s}", pat + *i + 1);
    td_buf_puts(b, x);
    *i += 4;
    return true;
}

/* The escape whose letter is pat[*i] (after a backslash), as PCRE2 text; *i
 * left on its last character. False for one the two dialects read
 * differently, or a malformed one. */
static bool
tok_regex_escape(td_buf_t *b, const char *pat, size_t n, size_t *i, bool in_class)
{
    char e = pat[*i];

    switch (e) {
    case 's': td_buf_puts(b, "\\p{White_Space}"); return true;
    case 'S': td_buf_puts(b, "\\P{White_Space}"); return true;
    case 'd':
    case 'D':
        return tok_regex_prop(b, "Nd", 2, e == 'D', in_class);
    case 'p':
    case 'P':
        return tok_regex_escape_prop(b, pat, n, i, in_class);
    case 'v': td_buf_puts(b, "\\x{0B}"); return true;
    case 'u':
        return tok_regex_escape_u(b, pat, n, i);
    case 't': case 'n': case 'r': case 'f': case 'a': case 'e': case 'x': case 'A':
    case 'z': case 'Z': case 'G': case 'k': case '0': case '1': case '2': case '3':
    case '4': case '5': case '6': case '7': case '8': case '9':
        td_buf_append(b, pat + *i - 1, 2);
        return true;
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return false;
        td_buf_append(b, pat + *i - 1, 2);   /* an escaped literal */
        return true;
    }
}

/* Rewrite an Oniguruma pattern (HF tokenizers' dialect) into PCRE2 with the
 * same meaning: \s \S -> White_Space (PCRE2's \s adds U+180E); \d \D -> Nd;
 * general categories gain what Unicode 15.0-16.0 assigned (PCRE2 10.42 has
 * 14.0); \v (a vertical tab to Oniguruma) and \uHHHH -> \x{..}. Escapes that
 * mean different things to the two (\w \b \h \R ...) are refused. */
static td_status_t tok_fail(tok_load_t *ld, td_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static td_status_t
tok_regex_translate(tok_load_t *ld, const char *where, const char *pat, char **out)
{
    td_buf_t b = { 0 };
    bool in_class = false;
    size_t n = strlen(pat);
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '[') {
            if (in_class && i + 1 < n && pat[i + 1] == ':') {
                const char *end = strstr(pat + i, ":]");
                size_t l = end ? (size_t)(end - (pat + i)) + 2 : n - i;
                td_buf_append(&b, pat + i, l);
                i += l - 1;
                continue;
            }
            if (in_class) {
                td_buf_free(&b);
                return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.pattern: a class inside a class "
                                "(at offset %zu) is not supported", where, i);
            }
            in_class = true;
            td_buf_append(&b, "[", 1);
            /* a ] first in the class is a literal */
            if (i + 1 < n && pat[i + 1] == '^')
                td_buf_append(&b, &pat[++i], 1);
            if (i + 1 < n && pat[i + 1] == ']')
                td_buf_append(&b, &pat[++i], 1);
            continue;
        }
        if (c == ']' && in_class) {
            in_class = false;
            td_buf_append(&b, "]", 1);
            continue;
        }
        if (c == '&' && in_class && i + 1 < n && pat[i + 1] == '&') {
            td_buf_free(&b);
            return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.pattern: class intersection && (at "
                            "offset %zu) is not supported", where, i);
        }
        if (c != '\\' || i + 1 >= n) {
            td_buf_append(&b, &c, 1);
            continue;
        }
        char e = pat[++i];
        if (!tok_regex_escape(&b, pat, n, &i, in_class)) {
            td_buf_free(&b);
            return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.pattern: the escape \\%c (at offset %zu) "
                            "is not supported (Oniguruma and PCRE2 read it differently, or it "
                            "is malformed)", where, e, i);
        }
    }
    char *re = td_buf_take(&b, NULL);
    if (re == NULL)
        return TD_ERR_NOMEM;
    *out = re;
    return TD_OK;
}

/* ---- Arena and maps ------------------------------------------------------ */

static td_status_t
tok_arena_add(td_tokenizer_t *tok, const char *s, size_t n, tok_span_t *span)
{
    if (n > UINT32_MAX - tok->arena_len)
        return TD_ERR_TOO_BIG;
    if (tok->arena_len + n > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 1 << 20;
        while (cap < tok->arena_len + n)
            cap *= 2;
        char *a = realloc(tok->arena, cap);
        if (!a)
            return TD_ERR_NOMEM;
        tok->arena = a;
        tok->arena_cap = cap;
    }
    memcpy(tok->arena + tok->arena_len, s, n);
    span->off = (uint32_t)tok->arena_len;
    span->len = (uint32_t)n;
    tok->arena_len += n;
    return TD_OK;
}

static td_status_t
tok_map_init(tok_map_t *m, size_t entries)
{
    return td_hmap_create(entries, &m->idx);
}

/* The id of the string an entry's value places. */
static inline uint32_t
tok_map_id(const char *arena, uint64_t v)
{
    uint32_t id;
    memcpy(&id, arena + (v >> 32) - sizeof id, sizeof id);
    return id;
}

/* The entry holding s (off << 32 | len), or TD_HMAP_NONE. */
static uint64_t
tok_map_find(const tok_map_t *m, const char *arena, const char *s, size_t n)
{
    uint64_t h = tok_hash(s, n), v;
    size_t pos = 0;
    if (!m->idx)
        return TD_HMAP_NONE;
    while ((v = td_hmap_each(m->idx, h, &pos)) != TD_HMAP_NONE)
        if ((uint32_t)v == n && memcmp(arena + (v >> 32), s, n) == 0)
            return v;
    return TD_HMAP_NONE;
}

/* Add s (n bytes, not in m yet) with its id: the id, then s, into the arena;
 * *span where s is. */
static td_status_t
tok_map_add(td_tokenizer_t *tok, tok_map_t *m, const char *s, size_t n, uint32_t id,
            tok_span_t *span)
{
    tok_span_t at;
    td_status_t rc;
    if ((rc = tok_arena_add(tok, (const char *)&id, sizeof id, &at)) != TD_OK ||
        (rc = tok_arena_add(tok, s, n, span)) != TD_OK)
        return rc;
    return td_hmap_add(m->idx, tok_hash(s, n), (uint64_t)span->off << 32 | span->len);
}

static uint32_t
tok_map_get(const tok_map_t *m, const char *arena, const char *s, size_t n)
{
    uint64_t v = tok_map_find(m, arena, s, n);
    return v != TD_HMAP_NONE ? tok_map_id(arena, v) : TOK_NONE;
}

static inline tok_merge_t
tok_merge_get(const td_tokenizer_t *tok, uint32_t a, uint32_t b)
{
    uint64_t v = td_hmap_get(tok->merges, ((uint64_t)a << 32) | b);
    return (tok_merge_t){ (uint32_t)(v >> 32), (uint32_t)v };
}

/* ---- Added-token tries --------------------------------------------------- */

static td_status_t
tok_trie_node(tok_trie_t *t, uint8_t byte, uint32_t *out)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        tok_node_t *nodes = realloc(t->nodes, cap * sizeof *nodes);
        if (!nodes)
            return TD_ERR_NOMEM;
        t->nodes = nodes;
        t->cap = cap;
        if (t->n == 0)
            t->n = 1;   /* node 0: none */
    }
    t->nodes[t->n] = (tok_node_t){ .byte = byte };
    *out = (uint32_t)t->n++;
    return TD_OK;
}

static td_status_t
tok_trie_add(tok_trie_t *t, const char *s, size_t n, uint32_t added)
{
    td_status_t rc;
    uint32_t node = t->root[(uint8_t)s[0]];
    if (!node) {
        if ((rc = tok_trie_node(t, (uint8_t)s[0], &node)) != TD_OK)
            return rc;
        t->root[(uint8_t)s[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        uint32_t c = t->nodes[node].child;
        while (c && t->nodes[c].byte != (uint8_t)s[i])
            c = t->nodes[c].sibling;
        if (!c) {
            if ((rc = tok_trie_node(t, (uint8_t)s[i], &c)) != TD_OK)
                return rc;
            t->nodes[c].sibling = t->nodes[node].child;
            t->nodes[node].child = c;
        }
        node = c;
    }
    t->nodes[node].added = added;
    t->count++;
    return TD_OK;
}

/* Longest content starting at s[0]: its end (bytes), 0 when none. */
static size_t
tok_trie_longest(const tok_trie_t *t, const char *s, size_t n, uint32_t *added)
{
    uint32_t node = t->root[(uint8_t)s[0]];
    size_t best = 0, pos = 1;
    while (node) {
        if (t->nodes[node].added) {
            best = pos;
            *added = t->nodes[node].added - 1;
        }
        if (pos >= n)
            break;
        uint32_t c = t->nodes[node].child;
        while (c && t->nodes[c].byte != (uint8_t)s[pos])
            c = t->nodes[c].sibling;
        node = c;
        pos++;
    }
    return best;
}

/* ---- Loading ----------------------------------------------------------- */

/* Log why the file is refused (once, here) and return status. */
static td_status_t
tok_fail(tok_load_t *ld, td_status_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td_error("tokenizer %s: %s", ld->path, msg);
    return status;
}

static const char *
tok_json_type(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a number";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    case JSON_NULL:    return "null";
    }
    return "?";
}

/* obj[key] in *out, NULL when absent or null; a value that is not a string
 * (want JSON_STRING) or not a boolean (want JSON_TRUE) is refused. */
static td_status_t
tok_get(tok_load_t *ld, const json_t *obj, const char *where, const char *key, json_type want,
        const json_t **out)
{
    const json_t *v = json_object_get(obj, key);
    json_type t = v ? json_typeof(v) : JSON_NULL;

    *out = NULL;
    if (t == JSON_NULL)
        return TD_OK;
    if ((t == JSON_FALSE ? JSON_TRUE : t) != want)
        return tok_fail(ld, TD_ERR_INVALID, "%s.%s: want a %s, found %s", where, key,
                        want == JSON_STRING ? "string" : "boolean", tok_json_type(v));
    *out = v;
    return TD_OK;
}

/* obj[key] as a boolean; absent or null: dflt. */
static td_status_t
tok_get_bool(tok_load_t *ld, const json_t *obj, const char *where, const char *key, bool dflt,
             bool *out)
{
    const json_t *v;
    td_status_t rc = tok_get(ld, obj, where, key, JSON_TRUE, &v);

    if (rc == TD_OK)
        *out = v ? json_is_true(v) : dflt;
    return rc;
}

/* obj[key] as a string (NULL when absent or null). */
static td_status_t
tok_get_str(tok_load_t *ld, const json_t *obj, const char *where, const char *key,
            const char **out)
{
    const json_t *v;
    td_status_t rc = tok_get(ld, obj, where, key, JSON_STRING, &v);

    if (rc == TD_OK)
        *out = v ? json_string_value(v) : NULL;
    return rc;
}

/* A field that must be absent, null, or one of the listed harmless values. */
static td_status_t
tok_want_null(tok_load_t *ld, const json_t *obj, const char *where, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return TD_OK;
    if (json_is_string(v) && json_string_length(v) == 0)
        return TD_OK;
    if (json_is_false(v))
        return TD_OK;
    return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.%s: only null is supported", where, key);
}

static td_status_t
tok_load_vocab(tok_load_t *ld, json_t *model, uint32_t *max_id)
{
    td_tokenizer_t *tok = ld->tok;
    json_t *vocab = json_object_get(model, "vocab");
    if (!vocab)
        return tok_fail(ld, TD_ERR_INVALID, "model.vocab: missing");
    if (!json_is_object(vocab))
        return tok_fail(ld, TD_ERR_INVALID, "model.vocab: want an object, found %s",
                        tok_json_type(vocab));
    if (json_object_size(vocab) == 0)
        return tok_fail(ld, TD_ERR_INVALID, "model.vocab: empty");
    td_status_t rc = tok_map_init(&tok->vocab, json_object_size(vocab));
    if (rc != TD_OK)
        return rc;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOK_MAX_ID)
            return tok_fail(ld, TD_ERR_INVALID,
                            "model.vocab[\"%s\"]: want an id in [0, %u), found %s", key,
                            TOK_MAX_ID, json_is_integer(v) ? "one outside" : tok_json_type(v));
        uint32_t id = (uint32_t)json_integer_value(v);
        size_t n = strlen(key);
        if (tok_map_find(&tok->vocab, tok->arena, key, n) != TD_HMAP_NONE)
            return tok_fail(ld, TD_ERR_INVALID, "model.vocab: \"%s\" given twice", key);
        tok_span_t span;
        if ((rc = tok_map_add(tok, &tok->vocab, key, n, id, &span)) != TD_OK)
            return rc;
        if (id + 1 > *max_id)
            *max_id = id + 1;
    }
    return TD_OK;
}

static td_status_t
tok_load_added(tok_load_t *ld, json_t *root, uint32_t *max_id)
{
    td_tokenizer_t *tok = ld->tok;
    json_t *list = json_object_get(root, "added_tokens");
    if (!list || json_is_null(list))
        return tok_map_init(&tok->added_map, 1);
    if (!json_is_array(list))
        return tok_fail(ld, TD_ERR_INVALID, "added_tokens: want an array, found %s",
                        tok_json_type(list));
    size_t n = json_array_size(list);
    td_status_t rc = tok_map_init(&tok->added_map, n + 1);
    if (rc != TD_OK)
        return rc;
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(list, i);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(t))
            return tok_fail(ld, TD_ERR_INVALID, "%s: want an object, found %s", where,
                            tok_json_type(t));
        json_t *idv = json_object_get(t, "id");
        if (!json_is_integer(idv) || json_integer_value(idv) < 0 ||
            json_integer_value(idv) >= TOK_MAX_ID)
            return tok_fail(ld, TD_ERR_INVALID, "%s.id: want an id in [0, %u)", where,
                            TOK_MAX_ID);
        const char *content;
        if ((rc = tok_get_str(ld, t, where, "content", &content)) != TD_OK)
            return rc;
        if (!content || !content[0])
            return tok_fail(ld, TD_ERR_INVALID, "%s.content: missing or empty", where);
        tok_added_t *a = &tok->added[tok->nadded];
        bool single_word;
        if ((rc = tok_get_bool(ld, t, where, "special", false, &a->special)) != TD_OK ||
            (rc = tok_get_bool(ld, t, where, "lstrip", false, &a->lstrip)) != TD_OK ||
            (rc = tok_get_bool(ld, t, where, "rstrip", false, &a->rstrip)) != TD_OK ||
            (rc = tok_get_bool(ld, t, where, "normalized", true, &a->normalized)) != TD_OK ||
            (rc = tok_get_bool(ld, t, where, "single_word", false, &single_word)) != TD_OK)
            return rc;
        if (single_word)
            return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.single_word: true is not supported",
                            where);
        a->id = (uint32_t)json_integer_value(idv);
        size_t len = strlen(content);
        uint64_t old = tok_map_find(&tok->added_map, tok->arena, content, len);
        if ((rc = tok_map_add(tok, &tok->added_map, content, len, a->id, &a->content)) != TD_OK)
            return rc;
        /* a later entry with the same content replaces the earlier one */
        if (old != TD_HMAP_NONE)
            td_hmap_del_pair(tok->added_map.idx, tok_hash(content, len), old);
        if (a->id + 1 > *max_id)
            *max_id = a->id + 1;
        tok->nadded++;
    }
    return TD_OK;
}

/* Fill tok->ids: raw strings and decoded pieces, added tokens over the vocab. */
static td_status_t
tok_load_ids(tok_load_t *ld)
{
    td_tokenizer_t *tok = ld->tok;
    td_status_t rc;
    size_t pos = 0;
    uint64_t h, v;
    while (td_hmap_next(tok->vocab.idx, &pos, &h, &v)) {
        uint32_t id = tok_map_id(tok->arena, v);
        tok_id_t *e = &tok->ids[id];
        if (e->flags & TOK_ID_PRESENT)
            return tok_fail(ld, TD_ERR_INVALID, "model.vocab: id %u given to two tokens", id);
        e->token = (tok_span_t){ (uint32_t)(v >> 32), (uint32_t)v };
        e->flags = TOK_ID_PRESENT;
    }
    for (size_t i = 0; i < tok->nadded; i++) {
        const tok_added_t *a = &tok->added[i];
        tok_id_t *e = &tok->ids[a->id];
        e->token = a->content;
        e->flags = TOK_ID_PRESENT | TOK_ID_ADDED | (a->special ? TOK_ID_SPECIAL : 0);
    }
    /* pieces: ByteLevel decoding, token by token: every character maps back
     * to its byte, or (any character outside the alphabet) the raw string */
    int16_t char_byte[0x144];
    for (size_t c = 0; c < 0x144; c++)
        char_byte[c] = -1;
    for (unsigned b = 0; b < 256; b++)
        char_byte[tok->byte_char[b]] = (int16_t)b;
    char buf[1024];
    for (uint32_t id = 0; id < tok->nids; id++) {
        tok_id_t *e = &tok->ids[id];
        if (!(e->flags & TOK_ID_PRESENT))
            continue;
        const uint8_t *s = (const uint8_t *)tok->arena + e->token.off;
        size_t n = e->token.len, o = 0, i = 0;
        bool mapped = n <= sizeof buf;
        while (mapped && i < n) {
            size_t bad, l = tok_utf8_valid_len(s + i, n - i, &bad);
            if (!l) {
                mapped = false;
                break;
            }
            size_t cl;
            uint32_t cp = tok_utf8_decode(s + i, &cl);
            if (cp >= 0x144 || char_byte[cp] < 0) {
                mapped = false;
                break;
            }
            buf[o++] = (char)char_byte[cp];
            i += l;
        }
        if (mapped) {
            if (o != n || memcmp(buf, s, n) != 0) {
                if ((rc = tok_arena_add(tok, buf, o, &e->piece)) != TD_OK)
                    return rc;
            } else {
                e->piece = e->token;
            }
        } else {
            e->piece = e->token;
        }
        if (e->piece.len > tok->max_piece)
            tok->max_piece = e->piece.len;
    }
    return TD_OK;
}

static td_status_t
tok_load_merges(tok_load_t *ld, json_t *model)
{
    td_tokenizer_t *tok = ld->tok;
    json_t *merges = json_object_get(model, "merges");
    if (!merges)
        return tok_fail(ld, TD_ERR_INVALID, "model.merges: missing");
    if (!json_is_array(merges))
        return tok_fail(ld, TD_ERR_INVALID, "model.merges: want an array, found %s",
                        tok_json_type(merges));
    size_t n = json_array_size(merges);
    if (td_hmap_create(n, &tok->merges) != TD_OK)
        return TD_ERR_NOMEM;
    char *buf = NULL;
    size_t bufcap = 0;
    td_status_t rc = TD_OK;
    for (size_t r = 0; r < n; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t alen, blen;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || sp == a || !sp[1] || strchr(sp + 1, ' ')) {
                rc = tok_fail(ld, TD_ERR_INVALID,
                              "model.merges[%zu]: \"%s\" is not two tokens separated by one "
                              "space", r, a);
                goto out;
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            alen = strlen(a);
            blen = strlen(b);
        } else {
            rc = tok_fail(ld, TD_ERR_INVALID,
                          "model.merges[%zu]: want \"a b\" or [\"a\", \"b\"], found %s", r,
                          tok_json_type(m));
            goto out;
        }
        if (alen + blen > bufcap) {
            bufcap = 2 * (alen + blen);
            char *nb = realloc(buf, bufcap);
            if (!nb) {
                rc = TD_ERR_NOMEM;
                goto out;
            }
            buf = nb;
        }
        memcpy(buf, a, alen);
        memcpy(buf + alen, b, blen);
        uint32_t ia = tok_map_get(&tok->vocab, tok->arena, a, alen);
        uint32_t ib = tok_map_get(&tok->vocab, tok->arena, b, blen);
        uint32_t iab = tok_map_get(&tok->vocab, tok->arena, buf, alen + blen);
        if (ia == TOK_NONE || ib == TOK_NONE || iab == TOK_NONE) {
            const char *which = ia == TOK_NONE ? "left" : ib == TOK_NONE ? "right" : "merged";
            rc = tok_fail(ld, TD_ERR_INVALID,
                          "model.merges[%zu]: %s token \"%.*s\" is not in model.vocab", r,
                          which,
                          ia == TOK_NONE ? (int)alen : ib == TOK_NONE ? (int)blen
                                                                        : (int)(alen + blen),
                          ia == TOK_NONE ? a : ib == TOK_NONE ? b : buf);
            goto out;
        }
        /* a pair listed twice keeps its last rank, as HF's map does; the
         * room for n was made above */
        (void)td_hmap_put(tok->merges, ((uint64_t)ia << 32) | ib, ((uint64_t)r << 32) | iab);
    }
out:
    free(buf);
    return rc;
}

static td_status_t
tok_add_stage(tok_load_t *ld, const char *where, tok_stage_kind_t kind, const char *pattern,
              bool literal)
{
    td_tokenizer_t *tok = ld->tok;
    if (tok->nstages == TOK_MAX_STAGES)
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps", where,
                        TOK_MAX_STAGES);
    tok_stage_t *st = &tok->stages[tok->nstages];
    *st = (tok_stage_t){ .kind = kind };
    if (kind == TOK_STAGE_SPLIT) {
        int err;
        PCRE2_SIZE erroff;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
        char *pcre = NULL;
        td_status_t rc;
        if (!literal && (rc = tok_regex_translate(ld, where, pattern, &pcre)) != TD_OK)
            return rc;
        st->re = pcre2_compile((PCRE2_SPTR)(pcre ? pcre : pattern), PCRE2_ZERO_TERMINATED, opts,
                               &err, &erroff, NULL);
        free(pcre);
        if (!st->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return tok_fail(ld, TD_ERR_UNSUPPORTED,
                            "%s.pattern: PCRE2 cannot compile \"%s\" (at offset %zu of its PCRE2 "
                            "form: %s)", where, pattern, (size_t)erroff, (const char *)msg);
        }
        st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE) == 0;
        if (!st->jit)
            td_warn("tokenizer %s: %s: no PCRE2 JIT here; matching interpreted (slower)",
                    ld->path, where);
    }
    tok->nstages++;
    return TD_OK;
}

static td_status_t tok_load_pretok(tok_load_t *ld, json_t *p, const char *where, bool *byte_level);

static td_status_t
tok_load_pretok_one(tok_load_t *ld, json_t *p, const char *where, bool *byte_level)
{
    td_status_t rc;
    if (!json_is_object(p))
        return tok_fail(ld, TD_ERR_INVALID, "%s: want an object, found %s", where,
                        tok_json_type(p));
    const char *type;
    if ((rc = tok_get_str(ld, p, where, "type", &type)) != TD_OK)
        return rc;
    if (!type)
        return tok_fail(ld, TD_ERR_INVALID, "%s.type: missing", where);
    if (*byte_level)
        return tok_fail(ld, TD_ERR_UNSUPPORTED,
                        "%s: a %s step after ByteLevel is not supported (ByteLevel must be last)",
                        where, type);
    if (strcmp(type, "Sequence") == 0)
        return tok_load_pretok(ld, p, where, byte_level);
    if (strcmp(type, "Split") == 0) {
        const char *behavior;
        bool invert;
        if ((rc = tok_get_str(ld, p, where, "behavior", &behavior)) != TD_OK ||
            (rc = tok_get_bool(ld, p, where, "invert", false, &invert)) != TD_OK)
            return rc;
        if (!behavior || strcmp(behavior, "Isolated") != 0)
            return tok_fail(ld, TD_ERR_UNSUPPORTED,
                            "%s.behavior: \"%s\" is not supported (supported: Isolated)", where,
                            behavior ? behavior : "(missing)");
        if (invert)
            return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.invert: true is not supported", where);
        json_t *pat = json_object_get(p, "pattern");
        const char *re = NULL, *lit = NULL;
        if (!json_is_object(pat) || json_object_size(pat) != 1)
            return tok_fail(ld, TD_ERR_INVALID,
                            "%s.pattern: want {\"Regex\": ...} or {\"String\": ...}", where);
        char pwhere[96];
        snprintf(pwhere, sizeof pwhere, "%s.pattern", where);
        if ((rc = tok_get_str(ld, pat, pwhere, "Regex", &re)) != TD_OK ||
            (rc = tok_get_str(ld, pat, pwhere, "String", &lit)) != TD_OK)
            return rc;
        if (!re && !lit)
            return tok_fail(ld, TD_ERR_UNSUPPORTED,
                            "%s.pattern: only Regex and String patterns are supported", where);
        return tok_add_stage(ld, where, TOK_STAGE_SPLIT, re ? re : lit, !re);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool prefix, use_regex;
        if ((rc = tok_get_bool(ld, p, where, "add_prefix_space", true, &prefix)) != TD_OK ||
            (rc = tok_get_bool(ld, p, where, "use_regex", true, &use_regex)) != TD_OK)
            return rc;
        *byte_level = true;
        if (prefix && (rc = tok_add_stage(ld, where, TOK_STAGE_PREFIX_SPACE, NULL, false)) != TD_OK)
            return rc;
        if (use_regex && (rc = tok_add_stage(ld, where, TOK_STAGE_SPLIT, tok_gpt2_regex,
                                             false)) != TD_OK)
            return rc;
        return TD_OK;
    }
    return tok_fail(ld, TD_ERR_UNSUPPORTED,
                    "%s.type: \"%s\" is not supported (supported: Sequence, Split, ByteLevel)",
                    where, type);
}

static td_status_t
tok_load_pretok(tok_load_t *ld, json_t *seq, const char *where, bool *byte_level)
{
    json_t *list = json_object_get(seq, "pretokenizers");
    if (!json_is_array(list))
        return tok_fail(ld, TD_ERR_INVALID, "%s.pretokenizers: want an array", where);
    for (size_t i = 0; i < json_array_size(list); i++) {
        char w[96];
        snprintf(w, sizeof w, "%s.pretokenizers[%zu]", where, i);
        td_status_t rc = tok_load_pretok_one(ld, json_array_get(list, i), w, byte_level);
        if (rc != TD_OK)
            return rc;
    }
    return TD_OK;
}

/* The normalizer must do nothing: null, or Sequences of nothing. */
static td_status_t
tok_check_normalizer(tok_load_t *ld, json_t *n, const char *where)
{
    if (!n || json_is_null(n))
        return TD_OK;
    if (!json_is_object(n))
        return tok_fail(ld, TD_ERR_INVALID, "%s: want an object or null, found %s", where,
                        tok_json_type(n));
    const char *type;
    td_status_t rc = tok_get_str(ld, n, where, "type", &type);
    if (rc != TD_OK)
        return rc;
    if (!type || strcmp(type, "Sequence") != 0)
        return tok_fail(ld, TD_ERR_UNSUPPORTED,
                        "%s.type: \"%s\" is not supported (only an empty normalizer is)", where,
                        type ? type : "(missing)");
    json_t *list = json_object_get(n, "normalizers");
    if (!json_is_array(list))
        return tok_fail(ld, TD_ERR_INVALID, "%s.normalizers: want an array", where);
    for (size_t i = 0; i < json_array_size(list); i++) {
        char w[96];
        snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
        if ((rc = tok_check_normalizer(ld, json_array_get(list, i), w)) != TD_OK)
            return rc;
    }
    return TD_OK;
}

/* decoder / post_processor: ByteLevel (the decoder must be there; the post
 * processor may be null: neither adds ids to an encoding). */
static td_status_t
tok_check_byte_level(tok_load_t *ld, json_t *root, const char *key, bool required)
{
    json_t *d = json_object_get(root, key);
    if (!d || json_is_null(d)) {
        if (!required)
            return TD_OK;
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s: missing (want the ByteLevel %s)", key, key);
    }
    if (!json_is_object(d))
        return tok_fail(ld, TD_ERR_INVALID, "%s: want an object, found %s", key,
                        tok_json_type(d));
    const char *type;
    td_status_t rc = tok_get_str(ld, d, key, "type", &type);
    if (rc != TD_OK)
        return rc;
    if (!type || strcmp(type, "ByteLevel") != 0)
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "%s.type: \"%s\" is not supported (supported: "
                        "ByteLevel)", key, type ? type : "(missing)");
    return TD_OK;
}

static td_status_t
tok_load_json(tok_load_t *ld, json_t *root)
{
    td_tokenizer_t *tok = ld->tok;
    td_status_t rc;
    if (!json_is_object(root))
        return tok_fail(ld, TD_ERR_INVALID, "want a JSON object, found %s", tok_json_type(root));
    if ((rc = tok_want_null(ld, root, "(top)", "truncation")) != TD_OK ||
        (rc = tok_want_null(ld, root, "(top)", "padding")) != TD_OK ||
        (rc = tok_check_normalizer(ld, json_object_get(root, "normalizer"), "normalizer")) != TD_OK ||
        (rc = tok_check_byte_level(ld, root, "decoder", true)) != TD_OK ||
        (rc = tok_check_byte_level(ld, root, "post_processor", false)) != TD_OK)
        return rc;

    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return tok_fail(ld, TD_ERR_INVALID, "model: want an object, found %s",
                        model ? tok_json_type(model) : "nothing");
    const char *type;
    if ((rc = tok_get_str(ld, model, "model", "type", &type)) != TD_OK)
        return rc;
    if (!type || strcmp(type, "BPE") != 0)
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "model.type: \"%s\" is not supported (supported: "
                        "BPE)", type ? type : "(missing)");
    bool byte_fallback;
    if ((rc = tok_want_null(ld, model, "model", "dropout")) != TD_OK ||
        (rc = tok_want_null(ld, model, "model", "unk_token")) != TD_OK ||
        (rc = tok_want_null(ld, model, "model", "continuing_subword_prefix")) != TD_OK ||
        (rc = tok_want_null(ld, model, "model", "end_of_word_suffix")) != TD_OK ||
        (rc = tok_get_bool(ld, model, "model", "byte_fallback", false, &byte_fallback)) != TD_OK ||
        (rc = tok_get_bool(ld, model, "model", "ignore_merges", false, &tok->ignore_merges)) != TD_OK)
        return rc;
    if (byte_fallback)
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "model.byte_fallback: true is not supported");

    tok_byte_chars(tok->byte_char);
    uint32_t max_id = 0;
    if ((rc = tok_load_vocab(ld, model, &max_id)) != TD_OK ||
        (rc = tok_load_added(ld, root, &max_id)) != TD_OK)
        return rc;
    tok->nids = max_id;
    tok->ids = calloc(max_id, sizeof *tok->ids);
    if (!tok->ids)
        return TD_ERR_NOMEM;
    if ((rc = tok_load_ids(ld)) != TD_OK || (rc = tok_load_merges(ld, model)) != TD_OK)
        return rc;
    for (unsigned b = 0; b < 256; b++) {
        char c[4];
        size_t n = tok_utf8_encode(tok->byte_char[b], c);
        tok->byte_id[b] = tok_map_get(&tok->vocab, tok->arena, c, n);
    }
    for (size_t i = 0; i < tok->nadded; i++) {
        const tok_added_t *a = &tok->added[i];
        tok_trie_t *t = &tok->trie[a->normalized ? 1 : 0];
        if ((rc = tok_trie_add(t, tok->arena + a->content.off, a->content.len,
                               (uint32_t)i + 1)) != TD_OK)
            return rc;
    }

    json_t *pre = json_object_get(root, "pre_tokenizer");
    bool byte_level = false;
    if (!pre || json_is_null(pre))
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "pre_tokenizer: missing (want one with a "
                        "ByteLevel step)");
    if ((rc = tok_load_pretok_one(ld, pre, "pre_tokenizer", &byte_level)) != TD_OK)
        return rc;
    if (!byte_level)
        return tok_fail(ld, TD_ERR_UNSUPPORTED, "pre_tokenizer: no ByteLevel step (only "
                        "byte-level BPE is supported)");
    return TD_OK;
}

td_status_t
td_tokenizer_load(const char *path, td_tokenizer_t **out)
{
    td_status_t rc;
    char *file = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int err = errno;
        td_error("tokenizer %s: %s", path, strerror(err));
        return td_status_from_errno(err);
    }
    if (S_ISDIR(sb.st_mode) ? asprintf(&file, "%s/tokenizer.json", path) < 0
                            : !(file = strdup(path))) {
        td_error("tokenizer %s: out of memory", path);
        return TD_ERR_NOMEM;
    }
    td_tokenizer_t *tok = calloc(1, sizeof *tok);
    if (!tok) {
        td_error("tokenizer %s: out of memory", path);
        free(file);
        return TD_ERR_NOMEM;
    }
    tok->path = file;
    pthread_mutex_init(&tok->pool_lock, NULL);
    tok_load_t ld = { .path = file, .tok = tok };

    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    if (!root) {
        bool io = json_error_code(&jerr) == json_error_cannot_open_file;
        td_error("tokenizer %s: %s%s (line %d, column %d)", file,
                 io ? "" : "not valid JSON: ", jerr.text, jerr.line, jerr.column);
        rc = io ? TD_ERR_IO : TD_ERR_INVALID;
        goto err_destroy;
    }
    rc = tok_load_json(&ld, root);
    json_decref(root);
    if (rc != TD_OK)
        goto err_destroy;
    *out = tok;
    return TD_OK;

err_destroy:
    if (rc == TD_ERR_NOMEM)   /* the one failure not logged where it was found */
        td_error("tokenizer %s: out of memory", file);
    td_tokenizer_destroy(tok);
    return rc;
}

static void tok_scratch_free(tok_scratch_t *sc);

void
td_tokenizer_destroy(td_tokenizer_t *tok)
{
    if (!tok)
        return;
    while (tok->pool) {
        tok_scratch_t *sc = tok->pool;
        tok->pool = sc->next;
        tok_scratch_free(sc);
    }
    pthread_mutex_destroy(&tok->pool_lock);
    for (int i = 0; i < tok->nstages; i++)
        pcre2_code_free(tok->stages[i].re);
    free(tok->trie[0].nodes);
    free(tok->trie[1].nodes);
    free(tok->added);
    td_hmap_destroy(tok->merges);
    td_hmap_destroy(tok->added_map.idx);
    td_hmap_destroy(tok->vocab.idx);
    free(tok->ids);
    free(tok->arena);
    free(tok->path);
    free(tok);
}

/* ---- Lookups ------------------------------------------------------------- */

uint32_t
td_tokenizer_vocab_size(const td_tokenizer_t *tok)
{
    return tok->nids;
}

size_t
td_tokenizer_max_piece(const td_tokenizer_t *tok)
{
    return tok->max_piece;
}

static const tok_id_t *
tok_id(const td_tokenizer_t *tok, uint32_t id)
{
    if (id >= tok->nids || !(tok->ids[id].flags & TOK_ID_PRESENT))
        return NULL;
    return &tok->ids[id];
}

td_status_t
td_tokenizer_piece(const td_tokenizer_t *tok, uint32_t id, const char **bytes, size_t *len)
{
    const tok_id_t *e = tok_id(tok, id);
    if (!e)
        return TD_ERR_RANGE;
    *bytes = tok->arena + e->piece.off;
    *len = e->piece.len;
    return TD_OK;
}

td_status_t
td_tokenizer_token(const td_tokenizer_t *tok, uint32_t id, const char **str, size_t *len)
{
    const tok_id_t *e = tok_id(tok, id);
    if (!e)
        return TD_ERR_RANGE;
    *str = tok->arena + e->token.off;
    *len = e->token.len;
    return TD_OK;
}

td_status_t
td_tokenizer_find(const td_tokenizer_t *tok, const char *token, size_t len, uint32_t *id)
{
    uint32_t v = tok_map_get(&tok->added_map, tok->arena, token, len);
    if (v == TOK_NONE)
        v = tok_map_get(&tok->vocab, tok->arena, token, len);
    if (v == TOK_NONE)
        return TD_ERR_NOT_FOUND;
    *id = v;
    return TD_OK;
}

int
td_tokenizer_is_special(const td_tokenizer_t *tok, uint32_t id)
{
    const tok_id_t *e = tok_id(tok, id);
    return e && (e->flags & TOK_ID_SPECIAL) ? 1 : 0;
}

int
td_tokenizer_is_added(const td_tokenizer_t *tok, uint32_t id)
{
    const tok_id_t *e = tok_id(tok, id);
    return e && (e->flags & TOK_ID_ADDED) ? 1 : 0;
}

/* ---- Scratch pool -------------------------------------------------------- */

static void
tok_scratch_free(tok_scratch_t *sc)
{
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jstack);
    for (int i = 0; i < TOK_MAX_STAGES; i++)
        free(sc->pbuf[i]);
    free(sc->sym);
    free(sc->rank);
    free(sc->mid);
    free(sc->prev);
    free(sc->succ);
    free(sc->heap);
    td_hmap_destroy(sc->cache);
    free(sc->ckeys);
    free(sc->cids);
    free(sc);
}

static tok_scratch_t *
tok_scratch_get(td_tokenizer_t *tok)
{
    pthread_mutex_lock(&tok->pool_lock);
    tok_scratch_t *sc = tok->pool;
    if (sc)
        tok->pool = sc->next;
    pthread_mutex_unlock(&tok->pool_lock);
    if (sc)
        return sc;
    sc = calloc(1, sizeof *sc);
    if (!sc)
        return NULL;
    sc->md = pcre2_match_data_create(1, NULL);
    sc->mctx = pcre2_match_context_create(NULL);
    sc->jstack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    sc->ckeys = malloc(TOK_CACHE_KEYS);
    sc->cids = malloc(TOK_CACHE_IDS * sizeof *sc->cids);
    if (td_hmap_create(TOK_CACHE_SLOTS / 2, &sc->cache) != TD_OK || !sc->md || !sc->mctx ||
        !sc->jstack || !sc->ckeys || !sc->cids) {
        tok_scratch_free(sc);
        return NULL;
    }
    pcre2_jit_stack_assign(sc->mctx, NULL, sc->jstack);
    return sc;
}

static void
tok_scratch_put(td_tokenizer_t *tok, tok_scratch_t *sc)
{
    pthread_mutex_lock(&tok->pool_lock);
    sc->next = tok->pool;
    tok->pool = sc;
    pthread_mutex_unlock(&tok->pool_lock);
}

/* ---- Encoding ------------------------------------------------------------ */

typedef struct {
    const td_tokenizer_t *tok;
    tok_scratch_t *sc;
    unsigned flags;
    uint32_t *ids;
    size_t n, cap;
} tok_enc_t;

static td_status_t
tok_reserve(tok_enc_t *e, size_t more)
{
    if (e->n + more <= e->cap)
        return TD_OK;
    size_t cap = e->cap ? e->cap : 64;
    while (cap < e->n + more)
        cap *= 2;
    uint32_t *ids = realloc(e->ids, cap * sizeof *ids);
    if (!ids)
        return TD_ERR_NOMEM;
    e->ids = ids;
    e->cap = cap;
    return TD_OK;
}

static td_status_t
tok_sym_reserve(tok_scratch_t *sc, size_t n)
{
    if (n <= sc->sym_cap)
        return TD_OK;
    size_t cap = sc->sym_cap ? sc->sym_cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *sym = realloc(sc->sym, cap * sizeof *sym);
    if (sym)
        sc->sym = sym;
    uint32_t *rank = realloc(sc->rank, cap * sizeof *rank);
    if (rank)
        sc->rank = rank;
    uint32_t *mid = realloc(sc->mid, cap * sizeof *mid);
    if (mid)
        sc->mid = mid;
    int32_t *prev = realloc(sc->prev, cap * sizeof *prev);
    if (prev)
        sc->prev = prev;
    int32_t *succ = realloc(sc->succ, cap * sizeof *succ);
    if (succ)
        sc->succ = succ;
    if (!sym || !rank || !mid || !prev || !succ)
        return TD_ERR_NOMEM;
    sc->sym_cap = cap;
    return TD_OK;
}

static inline void
tok_pair_rank(const td_tokenizer_t *tok, tok_scratch_t *sc, size_t i)
{
    tok_merge_t m = tok_merge_get(tok, sc->sym[i], sc->sym[i + 1]);
    sc->rank[i] = m.rank;
    sc->mid[i] = m.id;
}

/* Merge n symbols (sc->sym) by rescanning for the lowest rank each time:
 * quadratic, fastest for the short words most pre-tokens are. */
static size_t
tok_bpe_small(const td_tokenizer_t *tok, tok_scratch_t *sc, size_t n)
{
    uint32_t *sym = sc->sym, *rank = sc->rank, *mid = sc->mid;
    for (size_t i = 0; i + 1 < n; i++)
        tok_pair_rank(tok, sc, i);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best])
                best = i;
        if (rank[best] == TOK_NONE)
            break;
        sym[best] = mid[best];
        size_t tail = n - best - 2;   /* symbols after the removed one */
        memmove(sym + best + 1, sym + best + 2, tail * sizeof *sym);
        if (tail) {
            memmove(rank + best + 1, rank + best + 2, (tail - 1) * sizeof *rank);
            memmove(mid + best + 1, mid + best + 2, (tail - 1) * sizeof *mid);
        }
        n--;
        if (best > 0)
            tok_pair_rank(tok, sc, best - 1);
        if (best + 1 < n)
            tok_pair_rank(tok, sc, best);
    }
    return n;
}

static inline void
tok_heap_push(uint64_t *heap, size_t *hn, uint64_t v)
{
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (heap[p] <= v)
            break;
        heap[i] = heap[p];
        i = p;
    }
    heap[i] = v;
}

static inline uint64_t
tok_heap_pop(uint64_t *heap, size_t *hn)
{
    uint64_t top = heap[0], v = heap[--*hn];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap[c + 1] < heap[c])
            c++;
        if (v <= heap[c])
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (n)
        heap[i] = v;
    return top;
}

/* Merge n symbols with a heap of (rank, position): the lowest rank first,
 * the leftmost of equal ranks first, as HF's BPE does. n log n for long
 * words. */
static td_status_t
tok_bpe_heap(const td_tokenizer_t *tok, tok_scratch_t *sc, size_t *np)
{
    size_t n = *np;
    if (2 * n > sc->heap_cap) {
        uint64_t *h = realloc(sc->heap, 2 * n * sizeof *h);
        if (!h)
            return TD_ERR_NOMEM;
        sc->heap = h;
        sc->heap_cap = 2 * n;
    }
    uint32_t *sym = sc->sym;
    int32_t *prev = sc->prev, *next = sc->succ;
    uint64_t *heap = sc->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        tok_merge_t m = tok_merge_get(tok, sym[i], sym[i + 1]);
        if (m.rank != TOK_NONE)
            tok_heap_push(heap, &hn, ((uint64_t)m.rank << 32) | i);
    }
    /* every merge removes a symbol and pushes at most two pairs: the heap
     * never holds more than 2n entries */
    while (hn) {
        uint64_t top = tok_heap_pop(heap, &hn);
        uint32_t rank = (uint32_t)(top >> 32);
        size_t pos = (size_t)(top & 0xffffffffu);
        if (sym[pos] == TOK_NONE || next[pos] < 0)
            continue;
        size_t nx = (size_t)next[pos];
        tok_merge_t m = tok_merge_get(tok, sym[pos], sym[nx]);
        if (m.rank != rank)
            continue;
        sym[pos] = m.id;
        sym[nx] = TOK_NONE;
        next[pos] = next[nx];
        if (next[nx] >= 0)
            prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0) {
            tok_merge_t l = tok_merge_get(tok, sym[prev[pos]], sym[pos]);
            if (l.rank != TOK_NONE)
                tok_heap_push(heap, &hn, ((uint64_t)l.rank << 32) | (uint32_t)prev[pos]);
        }
        if (next[pos] >= 0) {
            tok_merge_t r = tok_merge_get(tok, sym[pos], sym[next[pos]]);
            if (r.rank != TOK_NONE)
                tok_heap_push(heap, &hn, ((uint64_t)r.rank << 32) | pos);
        }
    }
    size_t o = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        sym[o++] = sym[i];
    *np = o;
    return TD_OK;
}

static void
tok_cache_clear(tok_scratch_t *sc)
{
    td_hmap_clear(sc->cache);
    sc->ckeys_len = sc->cids_len = 0;
}

/* A cache entry in 64 bits: key_off and ids_off 24 each, key_len and nids 8
 * each (nids <= key_len: never all ones, never TD_HMAP_NONE). */
_Static_assert(TOK_CACHE_KEYS <= 1u << 24 && TOK_CACHE_IDS <= 1u << 24 &&
               TOK_CACHE_KEY_MAX < 255, "a cache entry packs into 64 bits");

static inline uint64_t
tok_cache_pack(tok_cent_t c)
{
    return c.key_off | (uint64_t)c.ids_off << 24 | (uint64_t)c.key_len << 48 |
           (uint64_t)c.nids << 56;
}

static inline tok_cent_t
tok_cache_unpack(uint64_t v)
{
    return (tok_cent_t){ (uint32_t)v & 0xffffff, (uint32_t)(v >> 24) & 0xffffff,
                         (uint32_t)(v >> 48) & 0xff, (uint32_t)(v >> 56) };
}

/* Whole-word lookup of ignore_merges: the vocabulary id of s byte-level
 * mapped, or TOK_NONE. */
static td_status_t
tok_whole_word(const td_tokenizer_t *tok, const char *s, size_t n, uint32_t *id)
{
    char small[4 * TOK_CACHE_KEY_MAX];
    char *buf = n <= TOK_CACHE_KEY_MAX ? small : malloc(2 * n);
    if (!buf)
        return TD_ERR_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += tok_utf8_encode(tok->byte_char[(uint8_t)s[i]], buf + o);
    *id = tok_map_get(&tok->vocab, tok->arena, buf, o);
    if (buf != small)
        free(buf);
    return TD_OK;
}

/* One pre-token (raw bytes, not yet byte-level mapped) -> ids appended. */
static td_status_t
tok_bpe(tok_enc_t *e, const char *s, size_t n)
{
    const td_tokenizer_t *tok = e->tok;
    tok_scratch_t *sc = e->sc;
    td_status_t rc;
    uint64_t h = 0, v;
    bool cacheable = n <= TOK_CACHE_KEY_MAX;
    if (cacheable) {
        size_t pos = 0;
        h = tok_hash(s, n);
        while ((v = td_hmap_each(sc->cache, h, &pos)) != TD_HMAP_NONE) {
            tok_cent_t c = tok_cache_unpack(v);
            if (c.key_len == n && memcmp(sc->ckeys + c.key_off, s, n) == 0) {
                if ((rc = tok_reserve(e, c.nids)) != TD_OK)
                    return rc;
                memcpy(e->ids + e->n, sc->cids + c.ids_off, c.nids * sizeof *e->ids);
                e->n += c.nids;
                return TD_OK;
            }
        }
    }

    if (n > INT32_MAX) {
        td_error("tokenizer %s: a pre-token of %zu bytes is too long to merge", tok->path, n);
        return TD_ERR_TOO_BIG;
    }
    size_t start = e->n;
    uint32_t whole = TOK_NONE;
    if (tok->ignore_merges && (rc = tok_whole_word(tok, s, n, &whole)) != TD_OK)
        return rc;
    if (whole != TOK_NONE) {
        if ((rc = tok_reserve(e, 1)) != TD_OK)
            return rc;
        e->ids[e->n++] = whole;
    } else {
        if ((rc = tok_sym_reserve(sc, n)) != TD_OK)
            return rc;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t id = tok->byte_id[(uint8_t)s[i]];
            if (id != TOK_NONE)   /* HF drops a symbol missing from the vocabulary */
                sc->sym[m++] = id;
        }
        if (m <= TOK_SMALL_WORD)
            m = tok_bpe_small(tok, sc, m);
        else if ((rc = tok_bpe_heap(tok, sc, &m)) != TD_OK)
            return rc;
        if ((rc = tok_reserve(e, m)) != TD_OK)
            return rc;
        memcpy(e->ids + e->n, sc->sym, m * sizeof *e->ids);
        e->n += m;
    }

    if (cacheable) {
        size_t nids = e->n - start;
        if (td_hmap_count(sc->cache) >= TOK_CACHE_SLOTS / 2 ||
            sc->ckeys_len + n > TOK_CACHE_KEYS || sc->cids_len + nids > TOK_CACHE_IDS)
            tok_cache_clear(sc);
        /* made with room for TOK_CACHE_SLOTS / 2: no allocation */
        (void)td_hmap_add(sc->cache, h, tok_cache_pack((tok_cent_t){
                              (uint32_t)sc->ckeys_len, (uint32_t)sc->cids_len, (uint32_t)n,
                              (uint32_t)nids }));
        memcpy(sc->ckeys + sc->ckeys_len, s, n);
        memcpy(sc->cids + sc->cids_len, e->ids + start, nids * sizeof *e->ids);
        sc->ckeys_len += n;
        sc->cids_len += nids;
    }
    return TD_OK;
}

/* Run pre-tokenizer step `stage` on s (valid UTF-8), then the later steps on
 * each piece, then BPE. */
static td_status_t
tok_pretok(tok_enc_t *e, int stage, const char *s, size_t n)
{
    const td_tokenizer_t *tok = e->tok;
    tok_scratch_t *sc = e->sc;
    td_status_t rc;
    if (n == 0)
        return TD_OK;
    if (stage == tok->nstages)
        return tok_bpe(e, s, n);
    const tok_stage_t *st = &tok->stages[stage];
    if (st->kind == TOK_STAGE_PREFIX_SPACE) {
        if (s[0] == ' ')
            return tok_pretok(e, stage + 1, s, n);
        if (n + 1 > sc->pcap[stage]) {
            char *b = realloc(sc->pbuf[stage], 2 * (n + 1));
            if (!b)
                return TD_ERR_NOMEM;
            sc->pbuf[stage] = b;
            sc->pcap[stage] = 2 * (n + 1);
        }
        sc->pbuf[stage][0] = ' ';
        memcpy(sc->pbuf[stage] + 1, s, n);
        return tok_pretok(e, stage + 1, sc->pbuf[stage], n + 1);
    }

    size_t off = 0, last = 0;
    while (off < n) {
        int m = st->jit ? pcre2_jit_match(st->re, (PCRE2_SPTR)s, n, off, 0, sc->md, sc->mctx)
                        : pcre2_match(st->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, sc->md,
                                      sc->mctx);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(m, msg, sizeof msg);
            td_error("tokenizer %s: pre-tokenizer step %d: matching %zu bytes failed at byte "
                     "%zu: %s", tok->path, stage, n, off, (const char *)msg);
            return m == PCRE2_ERROR_JIT_STACKLIMIT || m == PCRE2_ERROR_MATCHLIMIT ||
                   m == PCRE2_ERROR_DEPTHLIMIT || m == PCRE2_ERROR_HEAPLIMIT
                       ? TD_ERR_TOO_BIG : TD_ERR_INTERNAL;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t a = ov[0], b = ov[1];
        if (a > last && (rc = tok_pretok(e, stage + 1, s + last, a - last)) != TD_OK)
            return rc;
        if (b > a) {
            if ((rc = tok_pretok(e, stage + 1, s + a, b - a)) != TD_OK)
                return rc;
            off = last = b;
        } else {
            /* an empty match splits here; step over one character */
            last = a;
            if (a >= n)
                break;
            size_t cl;
            tok_utf8_decode((const uint8_t *)s + a, &cl);
            off = a + cl;
        }
    }
    return last < n ? tok_pretok(e, stage + 1, s + last, n - last) : TD_OK;
}

/* Start of the white space that ends s[0..end) (HF lstrip). */
static size_t
tok_ws_back(const char *s, size_t end)
{
    const uint8_t *u = (const uint8_t *)s;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && (u[b] & 0xC0) == 0x80)
            b--;
        size_t l;
        if (!tok_is_white_space(tok_utf8_decode(u + b, &l)))
            break;
        end = b;
    }
    return end;
}

/* Length of the white space that starts s (HF rstrip). */
static size_t
tok_ws_fwd(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        size_t l;
        if (!tok_is_white_space(tok_utf8_decode(u + i, &l)))
            break;
        i += l;
    }
    return i;
}

/* Split s by the added tokens of trie `level` (0: those matched on the raw
 * text, 1: the normalized ones, on what 0 left), leftmost-longest as HF's
 * Aho-Corasick does; what is left goes to the pre-tokenizer. */
static td_status_t
tok_split_added(tok_enc_t *e, int level, const char *s, size_t n)
{
    const td_tokenizer_t *tok = e->tok;
    td_status_t rc;
    if (n == 0)
        return TD_OK;
    if (level == 2)
        return tok_pretok(e, 0, s, n);
    const tok_trie_t *t = &tok->trie[level];
    if (t->count == 0)
        return tok_split_added(e, level + 1, s, n);
    size_t i = 0, last = 0;
    while (i < n) {
        while (i < n && !t->root[(uint8_t)s[i]])
            i++;
        if (i >= n)
            break;
        uint32_t ai;
        size_t len = tok_trie_longest(t, s + i, n - i, &ai);
        if (!len) {
            i++;
            continue;
        }
        const tok_added_t *a = &tok->added[ai];
        size_t start = i, stop = i + len;
        if (a->special && !(e->flags & TD_TOKENIZER_SPECIAL)) {
            i = stop;   /* left as text; the search goes on after it */
            continue;
        }
        if (a->lstrip) {
            size_t ws = tok_ws_back(s, start);
            start = ws > last ? ws : last;
        }
        if (a->rstrip)
            stop += tok_ws_fwd(s + stop, n - stop);
        if (start > last && (rc = tok_split_added(e, level + 1, s + last, start - last)) != TD_OK)
            return rc;
        if ((rc = tok_reserve(e, 1)) != TD_OK)
            return rc;
        e->ids[e->n++] = a->id;
        last = i = stop;
    }
    return last < n ? tok_split_added(e, level + 1, s + last, n - last) : TD_OK;
}

td_status_t
td_tokenizer_encode(const td_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                    uint32_t **ids, size_t *nids)
{
    td_status_t rc;
    char *clean = NULL;
    tok_enc_t e = { .tok = tok, .flags = flags };
    if (tok_utf8_check(text, len) != len) {
        size_t clen;
        if ((rc = tok_utf8_sanitize(text, len, &clean, &clen)) != TD_OK)
            goto err;
        text = clean;
        len = clen;
    }
    /* the tokenizer is const to callers; its scratch pool is the one part
     * that changes, under pool_lock */
    e.sc = tok_scratch_get((td_tokenizer_t *)tok);
    if (!e.sc) {
        rc = TD_ERR_NOMEM;
        goto err;
    }
    rc = tok_reserve(&e, len / 3 + 16);
    if (rc == TD_OK)
        rc = (flags & TD_TOKENIZER_NO_ADDED) ? tok_pretok(&e, 0, text, len)
                                             : tok_split_added(&e, 0, text, len);
    tok_scratch_put((td_tokenizer_t *)tok, e.sc);
    if (rc != TD_OK)
        goto err;
    free(clean);
    *ids = e.ids;
    *nids = e.n;
    return TD_OK;
err:
    if (rc == TD_ERR_NOMEM)   /* the one failure not logged where it was found */
        td_error("tokenizer %s: out of memory encoding %zu bytes", tok->path, len);
    free(e.ids);
    free(clean);
    return rc;
}

/* ---- Decoding ------------------------------------------------------------ */

static uint8_t
tok_lead_len(uint8_t b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

size_t
td_detok_bytes(td_detok_t *st, const char *bytes, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)bytes[i];
        if (st->n > 0) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (st->n == 1) {
                switch (st->buf[0]) {
                case 0xE0: lo = 0xA0; break;
                case 0xED: hi = 0x9F; break;
                case 0xF0: lo = 0x90; break;
                case 0xF4: hi = 0x8F; break;
                default: break;
                }
            }
            if (b >= lo && b <= hi) {
                st->buf[st->n++] = b;
                if (st->n == st->need) {
                    memcpy(out + o, st->buf, st->need);
                    o += st->need;
                    st->n = 0;
                }
                continue;
            }
            /* the held bytes are a maximal invalid subpart: one U+FFFD, and b
             * starts afresh */
            memcpy(out + o, tok_fffd, 3);
            o += 3;
            st->n = 0;
        }
        uint8_t l = tok_lead_len(b);
        if (l == 1) {
            out[o++] = (char)b;
        } else if (l == 0) {
            memcpy(out + o, tok_fffd, 3);
            o += 3;
        } else {
            st->buf[0] = b;
            st->n = 1;
            st->need = l;
        }
    }
    return o;
}

size_t
td_detok_flush(td_detok_t *st, char *out)
{
    if (st->n == 0)
        return 0;
    st->n = 0;
    memcpy(out, tok_fffd, 3);
    return 3;
}

td_status_t
td_detok_feed(td_detok_t *st, const td_tokenizer_t *tok, uint32_t id, unsigned flags,
              char *out, size_t cap, size_t *len)
{
    const tok_id_t *e = tok_id(tok, id);
    if (!e)
        return TD_ERR_RANGE;
    if ((flags & TD_TOKENIZER_SKIP_SPECIAL) && (e->flags & TOK_ID_SPECIAL)) {
        *len = 0;
        return TD_OK;
    }
    if (cap < TD_DETOK_OUT_MAX(e->piece.len))
        return TD_ERR_TOO_BIG;
    *len = td_detok_bytes(st, tok->arena + e->piece.off, e->piece.len, out);
    return TD_OK;
}

td_status_t
td_tokenizer_decode(const td_tokenizer_t *tok, const uint32_t *ids, size_t n, unsigned flags,
                    char **text, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_id_t *e = tok_id(tok, ids[i]);
        if (!e) {
            td_debug("tokenizer %s: decode: id %u (at %zu) has no token", tok->path, ids[i], i);
            return TD_ERR_RANGE;
        }
        total += e->piece.len;
    }
    if (total > (SIZE_MAX - 4) / 3)
        return TD_ERR_TOO_BIG;
    char *out = malloc(3 * total + 4);
    if (!out)
        return TD_ERR_NOMEM;
    td_detok_t st = { 0 };
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const tok_id_t *e = &tok->ids[ids[i]];
        if ((flags & TD_TOKENIZER_SKIP_SPECIAL) && (e->flags & TOK_ID_SPECIAL))
            continue;
        o += td_detok_bytes(&st, tok->arena + e->piece.off, e->piece.len, out + o);
    }
    o += td_detok_flush(&st, out + o);
    out[o] = '\0';
    char *shrunk = realloc(out, o + 1);
    *text = shrunk ? shrunk : out;
    *len = o;
    return TD_OK;
}
