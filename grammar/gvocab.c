/* grammar/gvocab.c — a tokenizer's vocabulary as a trie of token bytes, laid
 * out in preorder (a node's subtree is the nodes up to its end index), so
 * that a mask is one forward pass that skips the subtree of every byte the
 * grammar refuses. Special tokens are not in the trie: only EOS is ever
 * allowed, by the matcher, where the grammar accepts. */
#include <stdlib.h>
#include <string.h>

#include "gvocab.h"

typedef struct {
    const uint8_t *b;
    uint32_t len, id;
} vpiece_t;

static int
piece_cmp(const void *a, const void *b)
{
    const vpiece_t *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->b, y->b, n);
    if (r != 0)
        return r;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static td_status_t
vocab_alloc(td_gvocab_t *v, size_t nodes, size_t toks)
{
    v->byte = malloc(nodes + 1);
    v->depth = malloc((nodes + 1) * sizeof(uint16_t));
    v->end = malloc((nodes + 1) * sizeof(uint32_t));
    v->tok_off = malloc((nodes + 2) * sizeof(uint32_t));
    v->toks = malloc((toks + 1) * sizeof(uint32_t));
    return v->byte && v->depth && v->end && v->tok_off && v->toks ? TD_OK : TD_ERR_NOMEM;
}

/* The trie of the sorted pieces: each piece shares its longest common
 * prefix with the previous one; the nodes past it close (their end is set)
 * and new ones open for the rest of the piece. Then each node's tokens,
 * toks[tok_off[n] .. tok_off[n + 1]), by a counting sort of the pieces'
 * end nodes. */
static td_status_t
vocab_trie(td_gvocab_t *v, const vpiece_t *p, size_t np)
{
    size_t nodes = 0, prev_len = 0;
    uint32_t *open = NULL, *endnode = NULL, *fill = NULL;   /* open: the path's nodes */
    td_status_t st = TD_ERR_NOMEM;

    for (size_t i = 0; i < np; i++) {   /* count the nodes */
        size_t l = 0;
        if (i > 0)
            while (l < p[i].len && l < p[i - 1].len && p[i].b[l] == p[i - 1].b[l])
                l++;
        nodes += p[i].len - l;
        if (p[i].len > v->max_len)
            v->max_len = p[i].len;
    }
    open = calloc(v->max_len + 1, sizeof(uint32_t));
    endnode = malloc((np + 1) * sizeof(uint32_t));
    fill = calloc(nodes + 1, sizeof(uint32_t));
    if (vocab_alloc(v, nodes, np) != TD_OK || open == NULL || endnode == NULL || fill == NULL)
        goto out;
    v->nnodes = 0;
    for (size_t i = 0; i < np; i++) {
        size_t l = 0;
        if (i > 0)
            while (l < p[i].len && l < prev_len && p[i].b[l] == p[i - 1].b[l])
                l++;
        for (size_t d = l; d < prev_len; d++)   /* close the deeper nodes */
            v->end[open[d]] = (uint32_t)v->nnodes;
        for (size_t d = l; d < p[i].len; d++) {
            uint32_t n = (uint32_t)v->nnodes++;
            v->byte[n] = p[i].b[d];
            v->depth[n] = (uint16_t)(d + 1);
            open[d] = n;
        }
        endnode[i] = open[p[i].len - 1];
        prev_len = p[i].len;
    }
    for (size_t d = 0; d < prev_len; d++)
        v->end[open[d]] = (uint32_t)v->nnodes;
    memset(v->tok_off, 0, (v->nnodes + 2) * sizeof(uint32_t));
    for (size_t i = 0; i < np; i++)
        v->tok_off[endnode[i] + 1]++;
    for (size_t n = 0; n < v->nnodes; n++)
        v->tok_off[n + 1] += v->tok_off[n];
    for (size_t i = 0; i < np; i++)
        v->toks[v->tok_off[endnode[i]] + fill[endnode[i]]++] = p[i].id;
    v->ntoks = np;
    st = TD_OK;
out:
    free(open);
    free(endnode);
    free(fill);
    return st;
}

bool
td_gvocab_is_control(const td_tokenizer_t *tok, uint32_t id)
{
    const char *b;
    size_t len;

    if (td_tokenizer_is_special(tok, id))
        return true;
    if (!td_tokenizer_is_added(tok, id) || td_tokenizer_piece(tok, id, &b, &len) != TD_OK)
        return false;
    return len >= 2 && b[0] == '<' && b[len - 1] == '>';
}

td_status_t
td_gvocab_create(const td_tokenizer_t *tok, const int32_t *eos, size_t neos, td_gvocab_t **out)
{
    td_gvocab_t *v = calloc(1, sizeof(*v));
    uint32_t size = td_tokenizer_vocab_size(tok);
    vpiece_t *p = malloc((size + 1) * sizeof(vpiece_t));
    size_t np = 0;
    td_status_t st = TD_ERR_NOMEM;

    if (v == NULL || p == NULL)
        goto err;
    st = TD_ERR_INVALID;
    if (neos > TD_GVOCAB_MAX_EOS)
        goto err;
    for (size_t i = 0; i < neos; i++) {
        if (eos[i] < 0 || (uint32_t)eos[i] >= size)
            goto err;
        v->eos[i] = eos[i];
    }
    v->neos = neos;
    v->size = size;
    v->tok = tok;
    for (uint32_t id = 0; id < size; id++) {
        const char *b;
        size_t len;
        if (td_gvocab_is_control(tok, id) || td_tokenizer_piece(tok, id, &b, &len) != TD_OK ||
            len == 0 || len > UINT16_MAX)
            continue;
        p[np++] = (vpiece_t){ (const uint8_t *)b, (uint32_t)len, id };
    }
    qsort(p, np, sizeof(*p), piece_cmp);
    st = vocab_trie(v, p, np);
    if (st != TD_OK)
        goto err;
    free(p);
    *out = v;
    return TD_OK;
err:
    free(p);
    td_gvocab_destroy(v);
    return st;
}

void
td_gvocab_destroy(td_gvocab_t *v)
{
    if (v == NULL)
        return;
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->tok_off);
    free(v->toks);
    free(v);
}

uint32_t
td_gvocab_size(const td_gvocab_t *v)
{
    return v->size;
}

size_t
td_gvocab_mask_words(const td_gvocab_t *v)
{
    return ((size_t)v->size + 63) / 64;
}
