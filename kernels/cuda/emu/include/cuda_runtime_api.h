/* kernels/cuda/emu/include/cuda_runtime_api.h — the part of the CUDA runtime
 * API the backend and its tests call, emulated on the host (runtime.cc):
 * devices, memory, async copies, streams, events, graphs (record and replay),
 * errors. Every function is renamed to td_simt_<name> by a macro, so the
 * emulation links next to the real cudart without a clash; the calls in the
 * code stay cudaMalloc, cudaMemcpyAsync, ... C and C++.
 *
 * Execution model (docs/kernels.md, "The SIMT emulation"): work enqueued on a
 * stream runs when the host waits for it (a synchronize, a blocking copy, a
 * query) in stream order, so a host that touches a buffer before waiting sees
 * what a GPU would let it see: nothing done yet. */
#ifndef TD_SIMT_CUDA_RUNTIME_API_H
#define TD_SIMT_CUDA_RUNTIME_API_H

#include <stddef.h>

#include "vector_types.h"

#define TD_SIMT_EMU 1
#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#endif

/* The values of CUDA's driver_types.h. */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorCallRequiresNewerDriver = 36,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorUnsupportedPtxVersion = 222,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;

typedef enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
} cudaStreamCaptureStatus;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
} cudaFuncAttribute;

typedef enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
} cudaDeviceAttr;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostRegisterDefault 0x00

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

#define cudaStreamLegacy ((cudaStream_t)0x1)

/* The fields the tree reads; code that reads another one does not compile
 * under the emulation, which is how it gets added here. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major;
    int minor;
    int multiProcessorCount;
    int memoryBusWidth;
    int l2CacheSize;
    size_t sharedMemPerMultiprocessor;
    size_t sharedMemPerBlockOptin;
};

struct cudaFuncAttributes {
    size_t sharedSizeBytes;
    size_t constSizeBytes;
    size_t localSizeBytes;
    int maxThreadsPerBlock;
    int numRegs;
    int ptxVersion;
    int binaryVersion;
    int maxDynamicSharedSizeBytes;
};

#define cudaGetErrorString td_simt_cudaGetErrorString
#define cudaGetErrorName td_simt_cudaGetErrorName
#define cudaGetLastError td_simt_cudaGetLastError
#define cudaPeekAtLastError td_simt_cudaPeekAtLastError
#define cudaGetDeviceCount td_simt_cudaGetDeviceCount
#define cudaGetDevice td_simt_cudaGetDevice
#define cudaSetDevice td_simt_cudaSetDevice
#define cudaGetDeviceProperties td_simt_cudaGetDeviceProperties
#define cudaDeviceGetAttribute td_simt_cudaDeviceGetAttribute
#define cudaDeviceSynchronize td_simt_cudaDeviceSynchronize
#define cudaMalloc td_simt_cudaMalloc
#define cudaFree td_simt_cudaFree
#define cudaMallocHost td_simt_cudaMallocHost
#define cudaHostAlloc td_simt_cudaHostAlloc
#define cudaFreeHost td_simt_cudaFreeHost
#define cudaHostRegister td_simt_cudaHostRegister
#define cudaHostUnregister td_simt_cudaHostUnregister
#define cudaMallocAsync td_simt_cudaMallocAsync
#define cudaFreeAsync td_simt_cudaFreeAsync
#define cudaMemcpy td_simt_cudaMemcpy
#define cudaMemcpyAsync td_simt_cudaMemcpyAsync
#define cudaMemset td_simt_cudaMemset
#define cudaMemsetAsync td_simt_cudaMemsetAsync
#define cudaStreamCreate td_simt_cudaStreamCreate
#define cudaStreamCreateWithFlags td_simt_cudaStreamCreateWithFlags
#define cudaStreamDestroy td_simt_cudaStreamDestroy
#define cudaStreamSynchronize td_simt_cudaStreamSynchronize
#define cudaStreamQuery td_simt_cudaStreamQuery
#define cudaStreamWaitEvent td_simt_cudaStreamWaitEvent
#define cudaStreamBeginCapture td_simt_cudaStreamBeginCapture
#define cudaStreamEndCapture td_simt_cudaStreamEndCapture
#define cudaStreamIsCapturing td_simt_cudaStreamIsCapturing
#define cudaEventCreate td_simt_cudaEventCreate
#define cudaEventCreateWithFlags td_simt_cudaEventCreateWithFlags
#define cudaEventDestroy td_simt_cudaEventDestroy
#define cudaEventRecord td_simt_cudaEventRecord
#define cudaEventSynchronize td_simt_cudaEventSynchronize
#define cudaEventQuery td_simt_cudaEventQuery
#define cudaEventElapsedTime td_simt_cudaEventElapsedTime
#define cudaGraphInstantiate td_simt_cudaGraphInstantiate
#define cudaGraphLaunch td_simt_cudaGraphLaunch
#define cudaGraphDestroy td_simt_cudaGraphDestroy
#define cudaGraphExecDestroy td_simt_cudaGraphExecDestroy
#define cudaFuncGetAttributes td_simt_cudaFuncGetAttributes
#define cudaFuncSetAttribute td_simt_cudaFuncSetAttribute

const char *cudaGetErrorString(cudaError_t err);
const char *cudaGetErrorName(cudaError_t err);
/* The last error of a launch (its configuration) or of a kernel that ran
 * (a report of the bug catchers), then cleared; Peek does not clear. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

/* One device, 0, unless $TD_SIMT_DEVICES=0 (then cudaErrorNoDevice). */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);

/* Device memory is host memory, one allocation each (so ASan sees the
 * bounds of every buffer); copies check that the device side of a copy lies
 * in a device allocation. */
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
/* cudaErrorNotReady when work was pending, which it then runs (so a loop
 * polling it ends); cudaSuccess when none was. */
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
/* Capture records one stream's work into a graph (no fork/join across
 * streams); instantiating copies it, launching enqueues the copy. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
/* Host time between the two records' execution, in ms. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

/* func: a kernel (a __global__ function's address). */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func);
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}

/* CUDA's C++ conveniences: typed pointers, kernels by their own type. */
template <class T>
static inline cudaError_t
cudaMalloc(T **ptr, size_t size)
{
    return cudaMalloc((void **)ptr, size);
}
template <class T>
static inline cudaError_t
cudaMallocHost(T **ptr, size_t size)
{
    return cudaMallocHost((void **)ptr, size);
}
template <class T>
static inline cudaError_t
cudaHostAlloc(T **ptr, size_t size, unsigned int flags)
{
    return cudaHostAlloc((void **)ptr, size, flags);
}
template <class T>
static inline cudaError_t
cudaMallocAsync(T **ptr, size_t size, cudaStream_t stream)
{
    return cudaMallocAsync((void **)ptr, size, stream);
}
template <class T>
static inline cudaError_t
cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *func)
{
    return cudaFuncGetAttributes(attr, reinterpret_cast<const void *>(func));
}
template <class T>
static inline cudaError_t
cudaFuncSetAttribute(T *func, cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}
static inline cudaError_t
cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph)
{
    return cudaGraphInstantiate(exec, graph, 0);
}
#endif

#endif
