/* grammar/gvocab.h — inside the grammar engine: the vocabulary trie's layout
 * (preorder arrays), read by the matcher's mask walk. */
#ifndef TD_GVOCAB_H
#define TD_GVOCAB_H

#include <stdint.h>

#include "grammar.h"

#define TD_GVOCAB_MAX_EOS 16

struct td_gvocab {
    uint32_t size;         /* the tokenizer's ids */
    size_t nnodes;         /* trie nodes, preorder */
    uint8_t *byte;         /* [nnodes] the byte into the node */
    uint16_t *depth;       /* [nnodes] 1 for a child of the root */
    uint32_t *end;         /* [nnodes] the first node past the subtree */
    uint32_t *tok_off;     /* [nnodes + 1] the node's tokens: toks[tok_off[n] .. [n + 1]) */
    uint32_t *toks;        /* [ntoks] */
    size_t ntoks;
    size_t max_len;        /* the deepest node */
    const td_tokenizer_t *tok;   /* each id's bytes (td_tokenizer_piece) */
    int32_t eos[TD_GVOCAB_MAX_EOS];
    size_t neos;
};

/* A control token, never matched as text: a special token, or an added one
 * spelled <...> (<think>, </think>, the FIM markers); other added tokens
 * (the DSML pieces) are text like any other. */
bool td_gvocab_is_control(const td_tokenizer_t *tok, uint32_t id);

#endif
