/* routerd/tok.h — the tokenizer interface routerd encodes prompts and decodes
 * streamed tokens through: a vtable every tokenizer implements (the byte-level
 * stand-in, and V4.1's byte-level BPE in tok_bpe.c), plus UTF-8-safe
 * incremental decoding. */
#ifndef TD_TOK_H
#define TD_TOK_H

#include "buf.h"
#include "status.h"
#include "tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_tok td_tok_t;

typedef struct {
    /* text (len bytes, any bytes) -> *ids (malloc'd, caller frees; non-NULL
     * even when *nids is 0). Outputs set only on success. */
    td_status_t (*encode)(const td_tok_t *tok, const char *text, size_t len,
                          uint32_t **ids, size_t *nids);
    /* The bytes one id stands for (not necessarily whole UTF-8 characters);
     * *bytes stays valid as long as tok. An id outside the vocabulary:
     * TD_ERR_RANGE. */
    td_status_t (*piece)(const td_tok_t *tok, uint32_t id, const char **bytes,
                         size_t *len);
    /* The bytes of id as a token on its own, special tokens spelled out too
     * (what log-probabilities show); like piece otherwise. */
    td_status_t (*spell)(const td_tok_t *tok, uint32_t id, const char **bytes,
                         size_t *len);
    void (*destroy)(td_tok_t *tok);
} td_tok_ops_t;

/* Implementations embed this as their first member. */
struct td_tok {
    const td_tok_ops_t *ops;
    const char *name;       /* shown in /v1/models; owned by the implementation */
    uint32_t vocab_size;    /* ids are 0 .. vocab_size-1 */
};

/* Incremental decoding state of one stream (text/tokenizer.h's): the bytes
 * of a UTF-8 character whose end has not arrived yet. Zero-initialise ({0})
 * per stream. */
typedef td_detok_t td_tok_dec_t;

static inline td_status_t
td_tok_encode(const td_tok_t *tok, const char *text, size_t len, uint32_t **ids,
              size_t *nids)
{
    return tok->ops->encode(tok, text, len, ids, nids);
}

static inline td_status_t
td_tok_spell(const td_tok_t *tok, uint32_t id, const char **bytes, size_t *len)
{
    return tok->ops->spell(tok, id, bytes, len);
}

static inline void
td_tok_destroy(td_tok_t *tok)
{
    if (tok)
        tok->ops->destroy(tok);
}

/* Append the text of ids to out, holding back a character that is not yet
 * complete in st. Output is always valid UTF-8: an invalid byte sequence
 * becomes U+FFFD. skip_special: special tokens write nothing (piece); else
 * they are spelled out (spell). An id outside the vocabulary: TD_ERR_RANGE,
 * after the ids before it were decoded. */
td_status_t td_tok_decode(const td_tok_t *tok, td_tok_dec_t *st, const uint32_t *ids,
                          size_t nids, bool skip_special, td_buf_t *out);

/* End of the stream: an unfinished character held in st becomes U+FFFD. */
td_status_t td_tok_decode_flush(td_tok_dec_t *st, td_buf_t *out);

#endif
