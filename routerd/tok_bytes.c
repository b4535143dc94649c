/* routerd/tok_bytes.c — the byte-level stand-in tokenizer: every byte of the
 * text is one token whose id is the byte's value. */
#include "tok_bytes.h"

#include <stdlib.h>

typedef struct {
    td_tok_t base;      /* first: a td_tok_t * is a td_tok_bytes_t * */
    char bytes[256];    /* bytes[i] == i: what piece() points into */
} td_tok_bytes_t;

static td_status_t
td_tok_bytes_encode(const td_tok_t *tok, const char *text, size_t len, uint32_t **ids,
                    size_t *nids)
{
    uint32_t *v = malloc((len ? len : 1) * sizeof *v);
    if (v == NULL)
        return TD_ERR_NOMEM;
    for (size_t i = 0; i < len; i++)
        v[i] = (uint8_t)text[i];
    *ids = v;
    *nids = len;
    return TD_OK;
}

static td_status_t
td_tok_bytes_piece(const td_tok_t *tok, uint32_t id, const char **bytes, size_t *len)
{
    const td_tok_bytes_t *t = (const td_tok_bytes_t *)tok;
    if (id >= 256)
        return TD_ERR_RANGE;
    *bytes = &t->bytes[id];
    *len = 1;
    return TD_OK;
}

static void
td_tok_bytes_destroy(td_tok_t *tok)
{
    free(tok);
}

static const td_tok_ops_t td_tok_bytes_ops = {
    .encode = td_tok_bytes_encode,
    .piece = td_tok_bytes_piece,
    .spell = td_tok_bytes_piece,
    .destroy = td_tok_bytes_destroy,
};

td_status_t
td_tok_bytes_create(td_tok_t **out)
{
    td_tok_bytes_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return TD_ERR_NOMEM;
    t->base.ops = &td_tok_bytes_ops;
    t->base.name = TD_TOK_BYTES_NAME;
    t->base.vocab_size = 256;
    for (int i = 0; i < 256; i++)
        t->bytes[i] = (char)i;
    *out = &t->base;
    return TD_OK;
}
