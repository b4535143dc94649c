/* kernels/cpu/topk.c — the k largest of a row, equal values lowest index
 * first (NaN largest): a choice independent of the row's width, so one-shot
 * prefill, chunks and decode steps pick alike (docs/forward.md). */
#include "cpu_ops.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float v;
    int64_t i;
} topk_elem_t;

/* Descending by value (NaN first), then ascending by index. */
static int
topk_cmp(const void *pa, const void *pb)
{
    const topk_elem_t *a = pa, *b = pb;
    int na = isnan(a->v), nb = isnan(b->v);

    if (na != nb)
        return na ? -1 : 1;
    if (!na && a->v != b->v)
        return a->v > b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

td_status_t
td_kernels_cpu_topk(const float *x, size_t n, size_t m, size_t k, int64_t *idx)
{
    if (x == NULL || idx == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "topk: NULL argument");
    if (n == 0 || k == 0 || k > m)
        return td_kernels_fail(TD_ERR_INVALID, "topk: k %zu of %zu, %zu rows", k, m, n);
    topk_elem_t *q = malloc(m * sizeof(*q));
    if (q == NULL)
        return td_kernels_fail(TD_ERR_NOMEM, "topk: %zu elements", m);
    for (size_t r = 0; r < n; r++) {
        for (size_t j = 0; j < m; j++) {
            q[j].v = x[r * m + j];
            q[j].i = (int64_t)j;
        }
        qsort(q, m, sizeof(*q), topk_cmp);
        for (size_t j = 0; j < k; j++)
            idx[r * k + j] = q[j].i;
    }
    free(q);
    return TD_OK;
}
