/* routerd/tok_bytes.h — the byte-level tokenizer: id = byte value (vocabulary
 * of 256). A stand-in behind td_tok_t until the V4.1 BPE tokenizer lands. */
#ifndef TD_TOK_BYTES_H
#define TD_TOK_BYTES_H

#include "tok.h"

#define TD_TOK_BYTES_NAME "byte-level (stand-in until the V4.1 tokenizer lands)"

/* *out is freed with td_tok_destroy(). */
td_status_t td_tok_bytes_create(td_tok_t **out);

#endif
