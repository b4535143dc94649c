/* routerd/tok_bpe.c — td_tok_t over the engine's byte-level BPE tokenizer.
 * Plain encode recognises special tokens spelled in the text (a completions
 * prompt may carry them, as with Hugging Face's encode); generated special
 * tokens (BOS, EOS, pad, image markup) decode to nothing, as with
 * skip_special_tokens. The chat format's markers (<think>, </think>, ｜DSML｜)
 * are not special tokens and reach the reply reader. */
#include "tok_bpe.h"

#include "log.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    td_tok_t base;          /* first: a td_tok_t * is a td_tok_bpe_t * */
    td_tokenizer_t *tok;    /* owned */
    char name[96];
} td_tok_bpe_t;

static td_status_t
td_tok_bpe_encode(const td_tok_t *tok, const char *text, size_t len, uint32_t **ids,
                  size_t *nids)
{
    const td_tok_bpe_t *t = (const td_tok_bpe_t *)tok;
    return td_tokenizer_encode(t->tok, text, len, TD_TOKENIZER_SPECIAL, ids, nids);
}

static td_status_t
td_tok_bpe_piece(const td_tok_t *tok, uint32_t id, const char **bytes, size_t *len)
{
    const td_tok_bpe_t *t = (const td_tok_bpe_t *)tok;
    td_status_t st = td_tokenizer_piece(t->tok, id, bytes, len);
    if (st == TD_OK && td_tokenizer_is_special(t->tok, id))
        *len = 0;
    return st;
}

static td_status_t
td_tok_bpe_spell(const td_tok_t *tok, uint32_t id, const char **bytes, size_t *len)
{
    return td_tokenizer_piece(((const td_tok_bpe_t *)tok)->tok, id, bytes, len);
}

static void
td_tok_bpe_destroy(td_tok_t *tok)
{
    td_tok_bpe_t *t = (td_tok_bpe_t *)tok;
    td_tokenizer_destroy(t->tok);
    free(t);
}

static const td_tok_ops_t td_tok_bpe_ops = {
    .encode = td_tok_bpe_encode,
    .piece = td_tok_bpe_piece,
    .spell = td_tok_bpe_spell,
    .destroy = td_tok_bpe_destroy,
};

td_status_t
td_tok_bpe_create(const char *path, td_tok_t **out)
{
    td_tok_bpe_t *t = calloc(1, sizeof *t);
    if (!t) {
        td_error("tokenizer %s: out of memory", path);
        return TD_ERR_NOMEM;
    }
    td_status_t st = td_tokenizer_load(path, &t->tok);
    if (st != TD_OK) {
        free(t);
        return st;
    }
    t->base.ops = &td_tok_bpe_ops;
    t->base.vocab_size = td_tokenizer_vocab_size(t->tok);
    snprintf(t->name, sizeof t->name, "deepseek-v4.1 byte-level BPE (%u ids)",
             t->base.vocab_size);
    t->base.name = t->name;
    *out = &t->base;
    return TD_OK;
}

const td_tokenizer_t *
td_tok_bpe_tokenizer(const td_tok_t *tok)
{
    return tok && tok->ops == &td_tok_bpe_ops ? ((const td_tok_bpe_t *)tok)->tok : NULL;
}
