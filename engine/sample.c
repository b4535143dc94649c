/* engine/sample.c — choosing next tokens from dense logit rows: a linear
 * argmax for greedy requests, the engine's generic sampler for the rest. */
#include "sample.h"

#include <math.h>

#include "log.h"

int32_t
td_sample_argmax(const float *logits, size_t n)
{
    size_t best = 0;

    if (n == 0 || n > INT32_MAX)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (isnan(logits[i]))
            return -1;
        if (logits[i] > logits[best])
            best = i;
    }
    return (int32_t)best;
}

td_status_t
td_sample_rows(const float *logits, size_t rows, size_t vocab,
               const td_engine_sampling_t *const *sp, const uint64_t *positions, int32_t *tokens)
{
    for (size_t r = 0; r < rows; r++) {
        const float *row = logits + r * vocab;
        const td_engine_sampling_t *s = sp[r];
        int32_t t = td_sample_argmax(row, vocab);

        if (t < 0) {
            td_error("sample: row %zu: %zu logits, or a NaN among them", r, vocab);
            return TD_ERR_INVALID;
        }
        if (!(s->temperature == 0 || s->top_k == 1)) {
            td_engine_logits_t lg = { (uint32_t)vocab, NULL, row };
            td_status_t st = td_engine_sample_logits(&lg, s, positions[r], &t);
            if (st != TD_OK) {
                td_error("sample: row %zu: temperature %g, top_p %g, top_k %u: %s", r,
                         s->temperature, s->top_p, s->top_k, td_status_str(st));
                return st;
            }
        }
        tokens[r] = t;
    }
    return TD_OK;
}
