/* tests/unit/testkv.h — what the model tests share about KV memory: a cache
 * over memory of the test's own whose blocks and slots lie at shuffled places
 * (engine/kvmem.h), and the check that nothing wrote past them. */
#ifndef TD_TESTKV_H
#define TD_TESTKV_H

#include <stdint.h>

#include "cache.h"
#include "check.h"
#include "kvmem.h"
#include "model.h"

/* KV memory for cap tokens of m's plan, shuffled by *seed (incremented, so
 * every call gets other places), and an empty cache over it in *c. */
static inline td_kvmem_t *
td_testkv_cache(const td_model_t *m, uint64_t cap, uint64_t *seed, td_cache_t *c)
{
    td_kvmem_t *mem = NULL;

    CHECK_STATUS(td_kvmem_create(m->plan->layout, cap, (*seed)++, &mem), TD_OK);
    if (mem == NULL)
        return NULL;
    CHECK_STATUS(td_cache_init(c, m->plan, &mem->kv), TD_OK);
    td_cache_reset(c);
    return mem;
}

/* Nothing wrote past a block or slot; then free the memory. */
static inline void
td_testkv_done(td_kvmem_t *mem)
{
    if (mem != NULL)
        CHECK_STATUS(td_kvmem_check(mem), TD_OK);
    td_kvmem_destroy(mem);
}

#endif
