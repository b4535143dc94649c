/* tests/weights/tensor2d.h — a 2-D td_st_tensor_t over memory of the test's
 * own, for handing quantizer output to td_quant_dequant without a file. */
#ifndef TD_TEST_TENSOR2D_H
#define TD_TEST_TENSOR2D_H

#include <stdint.h>
#include <string.h>

#include "safetensors.h"

static inline td_st_tensor_t
tensor2d(const char *name, td_dtype_t dt, int64_t r, int64_t c, const void *data)
{
    td_st_tensor_t t;

    memset(&t, 0, sizeof(t));
    t.name = name;
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = r;
    t.shape[1] = c;
    t.data = data;
    t.nbytes = (size_t)(r * c * (int64_t)td_dtype_bits(dt) / 8);
    return t;
}

#endif
