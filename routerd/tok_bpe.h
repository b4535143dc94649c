/* routerd/tok_bpe.h — the DeepSeek-V4.1 tokenizer (text/tokenizer.h)
 * behind routerd's td_tok_t vtable. */
#ifndef TD_TOK_BPE_H
#define TD_TOK_BPE_H

#include "tok.h"
#include "tokenizer.h"

/* Load tokenizer.json from path (the file, or a checkpoint directory holding
 * it). *out is freed with td_tok_destroy(). A failure is logged (here or by
 * text/tokenizer.c's loader); callers pass the status on. */
td_status_t td_tok_bpe_create(const char *path, td_tok_t **out);

/* The engine tokenizer behind tok, or NULL when tok is not a td_tok_bpe. */
const td_tokenizer_t *td_tok_bpe_tokenizer(const td_tok_t *tok);

#endif
