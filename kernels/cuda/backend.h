/* kernels/cuda/backend.h — what the CUDA backend's .cu files share: the one
 * cudaError_t -> td_status_t conversion and each op's host entry point, in
 * namespace td_cuda. The emulated build (emu/) compiles the same files with
 * -Dtd_cuda=td_cuda_emu -Dtd_kernels_cuda=td_kernels_cuda_emu, so both
 * builds can live in one program. */
#ifndef TD_KERNELS_CUDA_BACKEND_H
#define TD_KERNELS_CUDA_BACKEND_H

#include "kernels.h"

#include <cuda_runtime_api.h>

namespace td_cuda {

/* TD_OK for cudaSuccess; otherwise logs "cuda: <what>: <error>" once
 * (td_kernels_fail) and returns TD_ERR_NOMEM, TD_ERR_UNSUPPORTED (no device,
 * driver or kernel image) or TD_ERR_CUDA. */
td_status_t td_kernels_cuda_status(cudaError_t err, const char *what);

/* kv_pack.cu: the td_kernels_t ops, and a probe that fails when the current
 * device cannot run the kernels (no image for its architecture). */
td_status_t td_kernels_cuda_kv_pack(const td_kernels_pool_t *pool,
                                    const uint32_t *table, size_t ntable,
                                    const td_kernels_span_t *span, void *buf,
                                    void *stream);
td_status_t td_kernels_cuda_kv_unpack(const td_kernels_pool_t *pool,
                                      const uint32_t *table, size_t ntable,
                                      const td_kernels_span_t *span,
                                      const void *buf, void *stream);
cudaError_t td_kernels_cuda_kv_probe(void);

}  // namespace td_cuda

#endif
