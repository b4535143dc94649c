/* kernels/cpu/topk.c — the k largest of a row, equal values lowest index
 * first (NaN largest): a choice independent of the row's width, so one-shot
 * prefill, chunks and decode steps pick alike (docs/forward.md). A heap of
 * the k best so far, then those k in order: the first k of the full sort. */
#include "cpu_ops.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float v;
    int64_t i;
} topk_elem_t;

/* Whether a comes before b: larger first (NaN largest), then lower index. */
static int
topk_before(const topk_elem_t *a, const topk_elem_t *b)
{
    int na = isnan(a->v), nb = isnan(b->v);

    if (na != nb)
        return na;
    if (!na && a->v != b->v)
        return a->v > b->v;
    return a->i < b->i;
}

/* Restore the heap below slot p: every parent comes after its children (the
 * root is the last of the k). */
static void
topk_sift(topk_elem_t *h, size_t n, size_t p)
{
    for (;;) {
        size_t w = p, l = 2 * p + 1, r = l + 1;
        if (l < n && topk_before(&h[w], &h[l]))
            w = l;
        if (r < n && topk_before(&h[w], &h[r]))
            w = r;
        if (w == p)
            return;
        topk_elem_t t = h[p];
        h[p] = h[w];
        h[w] = t;
        p = w;
    }
}

td_status_t
td_kernels_cpu_topk(const float *x, size_t n, size_t m, size_t k, int64_t *idx)
{
    if (x == NULL || idx == NULL)
        return td_kernels_fail(TD_ERR_INVALID, "topk: NULL argument");
    if (n == 0 || k == 0 || k > m)
        return td_kernels_fail(TD_ERR_INVALID, "topk: k %zu of %zu, %zu rows", k, m, n);
    topk_elem_t *h = malloc(k * sizeof(*h));
    if (h == NULL)
        return td_kernels_fail(TD_ERR_NOMEM, "topk: %zu elements", k);
    for (size_t r = 0; r < n; r++) {
        const float *row = x + r * m;
        for (size_t j = 0; j < k; j++) {
            h[j].v = row[j];
            h[j].i = (int64_t)j;
        }
        for (size_t p = k / 2; p-- > 0;)
            topk_sift(h, k, p);
        for (size_t j = k; j < m; j++) {
            topk_elem_t e = { row[j], (int64_t)j };
            if (topk_before(&e, &h[0])) {
                h[0] = e;
                topk_sift(h, k, 0);
            }
        }
        for (size_t left = k; left > 0; left--) {   /* the last of those left goes last */
            idx[r * k + left - 1] = h[0].i;
            h[0] = h[left - 1];
            topk_sift(h, left - 1, 0);
        }
    }
    free(h);
    return TD_OK;
}
