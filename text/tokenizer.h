/* text/tokenizer.h — the DeepSeek-V4.1 tokenizer: byte-level BPE read from a
 * Hugging Face tokenizer.json (added tokens, Split/ByteLevel pre-tokenizers,
 * ByteLevel decoder), encode, decode, and UTF-8-safe incremental decoding. */
#ifndef TD_TOKENIZER_H
#define TD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* A loaded tokenizer. Immutable after td_tokenizer_load: every function below
 * may be called from several threads at once on the same tokenizer (encode
 * takes its scratch space from a pool under a mutex). */
typedef struct td_tokenizer td_tokenizer_t;

/* Flags of td_tokenizer_encode / td_tokenizer_decode / td_detok_feed. */
enum {
    /* encode: recognise the spelling of a special added token in the text as
     * that token (Hugging Face's default; without it special tokens are
     * encoded as plain text, HF's encode_special_tokens = true). Non-special
     * added tokens (e.g. <think>) are recognised either way. */
    TD_TOKENIZER_SPECIAL      = 1u << 0,
    /* encode: recognise no added token at all, special or not: the text goes
     * through the pre-tokenizers and BPE only (plain prompt text). */
    TD_TOKENIZER_NO_ADDED     = 1u << 1,
    /* decode: leave special added tokens out of the text. */
    TD_TOKENIZER_SKIP_SPECIAL = 1u << 2,
};

/* path: a tokenizer.json file, or a directory holding one. A file this code
 * does not support (another model type, normalizer, pre-tokenizer or decoder)
 * is refused with TD_ERR_UNSUPPORTED and a message naming the field; a
 * malformed one with TD_ERR_INVALID; an unreadable one with TD_ERR_IO. */
td_status_t td_tokenizer_load(const char *path, td_tokenizer_t **out);
void        td_tokenizer_destroy(td_tokenizer_t *tok);

/* Highest id + 1, added tokens included. */
uint32_t    td_tokenizer_vocab_size(const td_tokenizer_t *tok);

/* text (len bytes) -> *ids (malloc'd, caller frees; non-NULL even when *nids
 * is 0). Invalid UTF-8 in text is read as Python's
 * bytes.decode("utf-8", "replace") reads it: each maximal invalid subsequence
 * becomes U+FFFD before tokenization. flags: TD_TOKENIZER_SPECIAL,
 * TD_TOKENIZER_NO_ADDED. */
td_status_t td_tokenizer_encode(const td_tokenizer_t *tok, const char *text, size_t len,
                                unsigned flags, uint32_t **ids, size_t *nids);

/* ids -> *text (malloc'd and NUL-terminated, caller frees; *len excludes the
 * NUL). The pieces' bytes are joined, then invalid UTF-8 becomes U+FFFD as
 * Python's bytes.decode("utf-8", "replace") does. flags:
 * TD_TOKENIZER_SKIP_SPECIAL. An id with no token: TD_ERR_RANGE. */
td_status_t td_tokenizer_decode(const td_tokenizer_t *tok, const uint32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len);

/* The bytes one id decodes to on its own (added tokens: their content; not
 * necessarily whole UTF-8 characters). Valid while tok lives. An id with no
 * token: TD_ERR_RANGE. */
td_status_t td_tokenizer_piece(const td_tokenizer_t *tok, uint32_t id, const char **bytes,
                               size_t *len);

/* The raw vocabulary string of an id (HF id_to_token, e.g. "Ġthe"; added
 * tokens: their content). Valid while tok lives. No token: TD_ERR_RANGE. */
td_status_t td_tokenizer_token(const td_tokenizer_t *tok, uint32_t id, const char **str,
                               size_t *len);

/* Raw token string -> id (HF token_to_id: added tokens first, then the
 * vocabulary). Not a token: TD_ERR_NOT_FOUND. */
td_status_t td_tokenizer_find(const td_tokenizer_t *tok, const char *token, size_t len,
                              uint32_t *id);

/* 1 when id is a special added token, else 0 (ids with no token too). */
int         td_tokenizer_is_special(const td_tokenizer_t *tok, uint32_t id);

/* 1 when id is an added token (special or not: <think>, </think>, the FIM
 * and tool-call markers), else 0. */
int         td_tokenizer_is_added(const td_tokenizer_t *tok, uint32_t id);

/* The longest piece, in bytes (to size td_detok_feed's buffer once). */
size_t      td_tokenizer_max_piece(const td_tokenizer_t *tok);

/* ---- Incremental decoding ------------------------------------------------ */

/* The decoding state of one stream: the bytes of a UTF-8 character whose end
 * has not arrived yet. Zero-initialise ({0}) per stream. Fed the ids of a
 * stream one by one, td_detok_feed writes exactly what td_tokenizer_decode
 * writes for all of them, once td_detok_flush has ended the stream. */
typedef struct {
    uint8_t buf[4];
    uint8_t n;      /* bytes held */
    uint8_t need;   /* length of the character being completed */
} td_detok_t;

/* Room td_detok_feed needs for a piece of piece_len bytes: every byte held or
 * fed may become a 3-byte U+FFFD. */
#define TD_DETOK_OUT_MAX(piece_len) (3 * ((size_t)(piece_len) + 3))

/* Decode one id: write the whole characters it completes to out (cap bytes)
 * and their length to *len; a character not yet complete is held in st. With
 * TD_TOKENIZER_SKIP_SPECIAL a special token writes nothing. An id with no
 * token: TD_ERR_RANGE; cap < TD_DETOK_OUT_MAX(piece length): TD_ERR_TOO_BIG
 * (st unchanged either way). */
td_status_t td_detok_feed(td_detok_t *st, const td_tokenizer_t *tok, uint32_t id,
                          unsigned flags, char *out, size_t cap, size_t *len);

/* Feed raw bytes (a piece) instead of an id; out needs TD_DETOK_OUT_MAX(len)
 * bytes. Returns the number of bytes written. */
size_t      td_detok_bytes(td_detok_t *st, const char *bytes, size_t len, char *out);

/* End of the stream: a character left unfinished becomes U+FFFD. out needs 3
 * bytes; returns the number written (0 or 3) and resets st. */
size_t      td_detok_flush(td_detok_t *st, char *out);

#endif
