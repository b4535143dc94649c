/* kernels/cuda/backend.cu — the CUDA backend's table: device discovery,
 * stream sync, and the single place where cudaError_t becomes td_status_t. */
#include "backend.h"

#ifndef TD_CUDA_ARCHS
#define TD_CUDA_ARCHS "?"
#endif

#ifdef TD_SIMT_EMU
#define TD_CUDA_BACKEND "cuda-emu"   /* the kernels under the SIMT emulation */
#else
#define TD_CUDA_BACKEND "cuda"
#endif

namespace td_cuda {

td_status_t
td_kernels_cuda_status(cudaError_t err, const char *what)
{
    td_status_t st;

    switch (err) {
    case cudaSuccess:
        return TD_OK;
    case cudaErrorMemoryAllocation:
        st = TD_ERR_NOMEM;
        break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorUnsupportedPtxVersion:
        st = TD_ERR_UNSUPPORTED;
        break;
    default:
        st = TD_ERR_CUDA;
        break;
    }
    return td_kernels_fail(st, "cuda: %s: %s", what, cudaGetErrorString(err));
}

namespace {

td_status_t
cuda_sync(void *stream)
{
    return td_kernels_cuda_status(cudaStreamSynchronize((cudaStream_t)stream),
                                  "stream synchronize");
}

const td_kernels_t td_kernels_cuda_table = {
    TD_CUDA_BACKEND,
    td_kernels_cuda_kv_pack,
    td_kernels_cuda_kv_unpack,
    cuda_sync,
};

}  // namespace
}  // namespace td_cuda

using namespace td_cuda;

td_status_t
td_kernels_cuda(const td_kernels_t **out)
{
    int ndev = 0, dev = 0;
    cudaDeviceProp prop;
    td_status_t st;

    st = td_kernels_cuda_status(cudaGetDeviceCount(&ndev), "no usable device");
    if (st != TD_OK)
        return st;
    if (ndev == 0)
        return td_kernels_fail(TD_ERR_UNSUPPORTED, "cuda: no device");
    st = td_kernels_cuda_status(cudaGetDevice(&dev), "get device");
    if (st == TD_OK)
        st = td_kernels_cuda_status(cudaGetDeviceProperties(&prop, dev),
                                    "get device properties");
    if (st != TD_OK)
        return st;
    if (td_kernels_cuda_kv_probe() != cudaSuccess)
        return td_kernels_fail(TD_ERR_UNSUPPORTED, "cuda: device %d (%s, sm_%d%d) "
                               "has no kernel image: built for %s "
                               "(-Dgpu_archs)", dev, prop.name, prop.major,
                               prop.minor, TD_CUDA_ARCHS);
    *out = &td_kernels_cuda_table;
    return TD_OK;
}
