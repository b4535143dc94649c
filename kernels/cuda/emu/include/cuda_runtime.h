/* kernels/cuda/emu/include/cuda_runtime.h — what a .cu file gets from
 * <cuda_runtime.h> under the SIMT emulation: the runtime API
 * (cuda_runtime_api.h) and, in C++, the device side (td_simt_device.h:
 * thread indices, barriers, warp collectives, atomics, shared memory,
 * launches). */
#ifndef TD_SIMT_CUDA_RUNTIME_H
#define TD_SIMT_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "td_simt_device.h"
#endif

#endif
