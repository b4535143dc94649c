/* tests/unit/testkv.h — KV memory of its own for one request in a test: a
 * kv pool (engine/kvpool.h) sized for ntokens with one slot, its memory from
 * the heap, and the one reservation whose view the engine computes in. */
#ifndef TD_TESTKV_H
#define TD_TESTKV_H

#include <stdint.h>
#include <stdlib.h>

#include "kvpool.h"

typedef struct {
    td_kvpool_t *kp;
    uint8_t **mem;            /* [nsegs] */
    uint32_t nsegs;
    td_kvpool_res_t *res;     /* res->kv: the view */
} td_testkv_t;

static inline void
td_testkv_destroy(td_testkv_t *k)
{
    if (k->res != NULL)
        td_kvpool_release(k->kp, k->res);
    td_kvpool_destroy(k->kp);
    for (uint32_t s = 0; k->mem != NULL && s < k->nsegs; s++)
        free(k->mem[s]);
    free(k->mem);
    k->kp = NULL;
    k->mem = NULL;
    k->res = NULL;
}

/* 0 on success. */
static inline int
td_testkv_create(const td_layout_t *l, uint64_t ntokens, td_testkv_t *k)
{
    const char *why;

    k->res = NULL;
    k->nsegs = l->nsegs;
    k->mem = calloc(l->nsegs, sizeof(*k->mem));
    if (k->mem == NULL || td_kvpool_create(l, ntokens, 1, &k->kp) != TD_OK)
        return -1;
    for (uint32_t s = 0; s < l->nsegs; s++) {
        size_t n = td_kvpool_seg_nblocks(k->kp, s) * td_kvpool_seg_block_bytes(k->kp, s);
        if ((k->mem[s] = calloc(n ? n : 1, 1)) == NULL)
            return -1;
    }
    td_kvpool_set_memory(k->kp, k->mem);
    return td_kvpool_reserve(k->kp, 1, ntokens, &k->res, &why) == TD_OK ? 0 : -1;
}

#endif
