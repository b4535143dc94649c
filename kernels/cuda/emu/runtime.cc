/* kernels/cuda/emu/runtime.cc — the CUDA runtime API of the SIMT emulation
 * (include/cuda_runtime_api.h): one device; device memory as host
 * allocations; streams as queues of work that runs, in stream order, when
 * the host waits for it; events; graphs recorded from one stream and
 * replayed; launches checked for their shape and run by simt.cc. One lock
 * covers the whole state and the running of work, so the emulated device
 * runs one piece of work at a time (a grid's blocks in parallel). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "simt_emu.h"
#include "td_simt_device.h"

namespace {

struct dep_s {
    CUstream_st *s;
    uint64_t seq;          /* the work of s up to this count must be done first */
};

struct op_s {
    std::function<void()> run;
    std::vector<dep_s> deps;
};

}  // namespace

struct CUgraph_st {
    std::vector<op_s> ops;
};

struct CUgraphExec_st {
    std::vector<op_s> ops;
};

struct CUstream_st {
    std::deque<op_s> q;
    uint64_t enq = 0, done = 0;        /* work enqueued and run, counted */
    bool nonblocking = false;
    CUgraph_st *cap = nullptr;         /* capturing into */
    bool cap_invalid = false;
};

namespace {

struct ev_state {
    double t = 0.0;                    /* seconds, when the record ran */
    bool ran = false;
};

}  // namespace

struct CUevent_st {
    unsigned flags = 0;
    CUstream_st *s = nullptr;          /* the last record's stream and position */
    uint64_t seq = 0;
    std::shared_ptr<ev_state> st = std::make_shared<ev_state>();
};

namespace {

enum alloc_kind { AL_DEVICE, AL_PINNED, AL_REGISTERED };

struct alloc_s {
    size_t size;
    alloc_kind kind;
};

std::recursive_mutex mu;
CUstream_st legacy;                    /* the NULL stream */
std::set<CUstream_st *> streams;
std::set<CUevent_st *> events;
std::map<uintptr_t, alloc_s> allocs;
cudaError_t last_err = cudaSuccess;    /* launch errors, for cudaGetLastError */
cudaError_t pending_err = cudaSuccess; /* a kernel's reports, for the next wait */
unsigned long launches = 0;
std::map<const void *, int> func_smem; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024;

using lock_t = std::lock_guard<std::recursive_mutex>;

cudaError_t
fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log why (the emulation says what a GPU would only return) and remember it. */
cudaError_t
fail(cudaError_t e, const char *fmt, ...)
{
    char msg[512], line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "simt: %s: %s", msg, cudaGetErrorName(e));
    td_simt_emit(line);
    last_err = e;
    return e;
}

double
now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The kernel error a wait returns once. */
cudaError_t
take_pending()
{
    cudaError_t e = pending_err;
    pending_err = cudaSuccess;
    return e;
}

/* ---- streams --------------------------------------------------------------------- */

CUstream_st *
stream_of(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy)
        return &legacy;
    return streams.count(s) ? s : nullptr;
}

CUstream_st *
capturing_blocking()
{
    for (CUstream_st *s : streams)
        if (s->cap != nullptr && !s->nonblocking)
            return s;
    return nullptr;
}

/* Run s's work up to count upto, each piece after what it waits for. */
void
drain(CUstream_st *s, uint64_t upto)
{
    while (s->done < upto && !s->q.empty()) {
        op_s op = std::move(s->q.front());
        s->q.pop_front();
        for (const dep_s &d : op.deps)
            drain(d.s, d.seq);
        op.run();
        s->done++;
    }
}

void
drain_all()
{
    drain(&legacy, legacy.enq);
    for (CUstream_st *s : streams)
        drain(s, s->enq);
}

/* Enqueue on s (or into its capture): the legacy stream waits for the
 * blocking streams, a blocking stream for the legacy one (CUDA's implicit
 * synchronization). */
cudaError_t
enqueue(CUstream_st *s, op_s op)
{
    if (s->cap != nullptr) {
        s->cap->ops.push_back(std::move(op));
        return cudaSuccess;
    }
    if (s == &legacy) {
        if (CUstream_st *c = capturing_blocking()) {
            c->cap_invalid = true;
            return fail(cudaErrorStreamCaptureImplicit,
                        "work on the legacy stream while a blocking stream captures");
        }
        for (CUstream_st *o : streams)
            if (!o->nonblocking && o->done < o->enq)
                op.deps.push_back(dep_s{ o, o->enq });
    } else if (!s->nonblocking && legacy.done < legacy.enq) {
        op.deps.push_back(dep_s{ &legacy, legacy.enq });
    }
    s->q.push_back(std::move(op));
    s->enq++;
    return cudaSuccess;
}

/* Before the host waits on s: not while it (or, for the legacy stream, a
 * blocking stream) captures. */
cudaError_t
wait_ok(CUstream_st *s)
{
    CUstream_st *c = s->cap != nullptr ? s : s == &legacy ? capturing_blocking() : nullptr;
    if (c == nullptr)
        return cudaSuccess;
    c->cap_invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported, "waiting on a stream under capture");
}

/* ---- memory ---------------------------------------------------------------------- */

/* The allocation holding [p, p + n), or null. */
const alloc_s *
alloc_of(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin())
        return nullptr;
    --it;
    if (a - it->first > it->second.size || n > it->second.size - (a - it->first))
        return nullptr;
    return &it->second;
}

bool
is_device(const void *p, size_t n)
{
    const alloc_s *a = alloc_of(p, n);
    return a != nullptr && a->kind == AL_DEVICE;
}

/* Whether host memory stays readable by a queued copy (pinned or registered). */
bool
is_pinned(const void *p, size_t n)
{
    const alloc_s *a = alloc_of(p, n);
    return a != nullptr && a->kind != AL_DEVICE;
}

cudaError_t
alloc_new(void **ptr, size_t size, alloc_kind kind, size_t align)
{
    if (ptr == nullptr)
        return fail(cudaErrorInvalidValue, "allocation: NULL pointer");
    *ptr = nullptr;
    if (size == 0)
        return cudaSuccess;
    void *p;
    if (posix_memalign(&p, align, size) != 0)
        return fail(cudaErrorMemoryAllocation, "allocation of %zu bytes", size);
    allocs[(uintptr_t)p] = alloc_s{ size, kind };
    *ptr = p;
    return cudaSuccess;
}

cudaError_t
alloc_free(void *p, alloc_kind kind, const char *what)
{
    if (p == nullptr)
        return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || it->second.kind != kind)
        return fail(cudaErrorInvalidValue, "%s(%p): not an allocation of that kind", what, p);
    allocs.erase(it);
    free(p);
    return cudaSuccess;
}

/* The copy's direction checked against where its pointers lie. */
cudaError_t
copy_check(void *dst, const void *src, size_t n, cudaMemcpyKind *kind)
{
    bool dd = is_device(dst, n), sd = is_device(src, n);
    if (*kind == cudaMemcpyDefault)
        *kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                   : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    bool want_dd = *kind == cudaMemcpyHostToDevice || *kind == cudaMemcpyDeviceToDevice;
    bool want_sd = *kind == cudaMemcpyDeviceToHost || *kind == cudaMemcpyDeviceToDevice;
    if (*kind > cudaMemcpyDefault)
        return fail(cudaErrorInvalidMemcpyDirection, "copy direction %d", (int)*kind);
    if (n == 0)
        return cudaSuccess;
    if (want_dd && !dd)
        return fail(cudaErrorInvalidValue, "copy of %zu bytes to %p: not in one device "
                    "allocation", n, dst);
    if (want_sd && !sd)
        return fail(cudaErrorInvalidValue, "copy of %zu bytes from %p: not in one device "
                    "allocation", n, src);
    if ((*kind == cudaMemcpyHostToDevice && sd) || (*kind == cudaMemcpyDeviceToHost && dd))
        return fail(cudaErrorInvalidValue, "copy of %zu bytes: the host side %p is device "
                    "memory", n, *kind == cudaMemcpyHostToDevice ? src : dst);
    return cudaSuccess;
}

}  // namespace

/* ---- launches ---------------------------------------------------------------------- */

cudaError_t
td_simt::enqueue_launch(launch_desc &&d, cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    dim3 b = d.block, g = d.grid;
    uint64_t nt = (uint64_t)b.x * b.y * b.z;

    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "launch of %s: unknown stream", d.name);
    if (nt == 0 || nt > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
        return fail(cudaErrorInvalidConfiguration, "launch of %s: block (%u,%u,%u)", d.name,
                    b.x, b.y, b.z);
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
        return fail(cudaErrorInvalidConfiguration, "launch of %s: grid (%u,%u,%u)", d.name,
                    g.x, g.y, g.z);
    auto it = func_smem.find(d.func);
    size_t smax = it != func_smem.end() ? (size_t)it->second : SMEM_DEFAULT;
    if (d.smem > smax)
        return fail(cudaErrorInvalidValue, "launch of %s: %zu bytes of dynamic shared "
                    "memory, above its %zu (cudaFuncAttributeMaxDynamicSharedMemorySize)",
                    d.name, d.smem, smax);
    auto desc = std::make_shared<const launch_desc>(std::move(d));
    op_s op;
    op.run = [desc] {
        launches++;
        if (td_simt_run_grid(*desc) != 0 && pending_err == cudaSuccess)
            pending_err = cudaErrorLaunchFailure;
    };
    return enqueue(s, std::move(op));
}

extern "C" {

unsigned long
td_simt_launches(void)
{
    lock_t l(mu);
    return launches;
}

/* ---- errors ------------------------------------------------------------------------- */

static const struct {
    cudaError_t e;
    const char *name, *text;
} error_table[] = {
    { cudaSuccess, "cudaSuccess", "no error" },
    { cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument" },
    { cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory" },
    { cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error" },
    { cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument" },
    { cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer" },
    { cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy" },
    { cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version" },
    { cudaErrorCallRequiresNewerDriver, "cudaErrorCallRequiresNewerDriver", "API call is not supported in the installed CUDA driver" },
    { cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function" },
    { cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected" },
    { cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal" },
    { cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device" },
    { cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion", "the provided PTX was compiled with an unsupported toolchain" },
    { cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle" },
    { cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state" },
    { cudaErrorNotReady, "cudaErrorNotReady", "device not ready" },
    { cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered" },
    { cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address" },
    { cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure" },
    { cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported" },
    { cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing" },
    { cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture" },
    { cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream" },
    { cudaErrorUnknown, "cudaErrorUnknown", "unknown error" },
};

const char *
cudaGetErrorName(cudaError_t err)
{
    for (const auto &e : error_table)
        if (e.e == err)
            return e.name;
    return "cudaErrorUnknown";
}

const char *
cudaGetErrorString(cudaError_t err)
{
    for (const auto &e : error_table)
        if (e.e == err)
            return e.text;
    return "unknown error";
}

cudaError_t
cudaGetLastError(void)
{
    lock_t l(mu);
    cudaError_t e = last_err != cudaSuccess ? last_err : pending_err;
    last_err = cudaSuccess;
    if (e == pending_err)
        pending_err = cudaSuccess;
    return e;
}

cudaError_t
cudaPeekAtLastError(void)
{
    lock_t l(mu);
    return last_err != cudaSuccess ? last_err : pending_err;
}

/* ---- the device --------------------------------------------------------------------- */

static bool
no_device()
{
    const char *s = getenv("TD_SIMT_DEVICES");
    return s != nullptr && strcmp(s, "0") == 0;
}

cudaError_t
cudaGetDeviceCount(int *count)
{
    if (count == nullptr)
        return cudaErrorInvalidValue;
    *count = no_device() ? 0 : 1;
    return no_device() ? cudaErrorNoDevice : cudaSuccess;
}

cudaError_t
cudaGetDevice(int *device)
{
    if (device == nullptr)
        return cudaErrorInvalidValue;
    *device = 0;
    return cudaSuccess;
}

cudaError_t
cudaSetDevice(int device)
{
    return device == 0 && !no_device() ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t
cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (p == nullptr)
        return cudaErrorInvalidValue;
    if (device != 0 || no_device())
        return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "SIMT emulation on the host");
    p->totalGlobalMem = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;               /* what the kernels may assume: sm_90's features */
    p->minor = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->multiProcessorCount = cpus > 0 ? (int)cpus : 1;
    p->memoryBusWidth = 64;
    p->l2CacheSize = 0;
    return cudaSuccess;
}

cudaError_t
cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess || value == nullptr)
        return e != cudaSuccess ? e : cudaErrorInvalidValue;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t
cudaDeviceSynchronize(void)
{
    lock_t l(mu);
    if (capturing_blocking() != nullptr)
        return wait_ok(&legacy);
    drain_all();
    return take_pending();
}

/* ---- memory ---------------------------------------------------------------------------- */

cudaError_t
cudaMalloc(void **ptr, size_t size)
{
    lock_t l(mu);
    return alloc_new(ptr, size, AL_DEVICE, 256);
}

cudaError_t
cudaFree(void *ptr)
{
    lock_t l(mu);
    drain_all();               /* cudaFree waits for the device */
    return alloc_free(ptr, AL_DEVICE, "cudaFree");
}

cudaError_t
cudaMallocHost(void **ptr, size_t size)
{
    lock_t l(mu);
    return alloc_new(ptr, size, AL_PINNED, 4096);
}

cudaError_t
cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    (void)flags;     /* mapped or not, host memory is device memory here */
    return cudaMallocHost(ptr, size);
}

cudaError_t
cudaFreeHost(void *ptr)
{
    lock_t l(mu);
    drain_all();
    return alloc_free(ptr, AL_PINNED, "cudaFreeHost");
}

cudaError_t
cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    (void)flags;
    lock_t l(mu);
    if (ptr == nullptr || size == 0 || alloc_of(ptr, 1) != nullptr)
        return fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu)", ptr, size);
    allocs[(uintptr_t)ptr] = alloc_s{ size, AL_REGISTERED };
    return cudaSuccess;
}

cudaError_t
cudaHostUnregister(void *ptr)
{
    lock_t l(mu);
    auto it = allocs.find((uintptr_t)ptr);
    if (it == allocs.end() || it->second.kind != AL_REGISTERED)
        return fail(cudaErrorInvalidValue, "cudaHostUnregister(%p): not registered", ptr);
    drain_all();
    allocs.erase(it);
    return cudaSuccess;
}

cudaError_t
cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    lock_t l(mu);
    if (stream_of(stream) == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaMallocAsync: unknown stream");
    return alloc_new(ptr, size, AL_DEVICE, 256);
}

cudaError_t
cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaFreeAsync: unknown stream");
    if (ptr != nullptr && allocs.count((uintptr_t)ptr) == 0)
        return fail(cudaErrorInvalidValue, "cudaFreeAsync(%p): not an allocation", ptr);
    op_s op;
    op.run = [ptr] { alloc_free(ptr, AL_DEVICE, "cudaFreeAsync"); };
    return enqueue(s, std::move(op));
}

cudaError_t
cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind)
{
    lock_t l(mu);
    cudaError_t e = copy_check(dst, src, count, &kind);
    if (e == cudaSuccess)
        e = wait_ok(&legacy);
    if (e != cudaSuccess)
        return e;
    drain_all();
    if (count > 0)
        memmove(dst, src, count);
    return take_pending();
}

cudaError_t
cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: unknown stream");
    cudaError_t e = copy_check(dst, src, count, &kind);
    if (e != cudaSuccess || count == 0)
        return e;
    op_s op;
    if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, count) && s->cap == nullptr) {
        /* to pageable memory the call returns when the copy is done */
        if ((e = wait_ok(s)) != cudaSuccess)
            return e;
        drain(s, s->enq);
        memmove(dst, src, count);
        return cudaSuccess;
    }
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src, count) && s->cap == nullptr) {
        /* from pageable memory the source is staged before the call returns */
        auto stage = std::make_shared<std::vector<unsigned char>>(
            (const unsigned char *)src, (const unsigned char *)src + count);
        op.run = [dst, stage] { memcpy(dst, stage->data(), stage->size()); };
    } else {
        op.run = [dst, src, count] { memmove(dst, src, count); };
    }
    return enqueue(s, std::move(op));
}

cudaError_t
cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: unknown stream");
    if (count == 0)
        return cudaSuccess;
    if (!is_device(ptr, count))
        return fail(cudaErrorInvalidValue, "memset of %zu bytes at %p: not in one device "
                    "allocation", count, ptr);
    op_s op;
    op.run = [ptr, value, count] { memset(ptr, value, count); };
    return enqueue(s, std::move(op));
}

cudaError_t
cudaMemset(void *ptr, int value, size_t count)
{
    lock_t l(mu);
    cudaError_t e = cudaMemsetAsync(ptr, value, count, nullptr);
    if (e != cudaSuccess)
        return e;
    drain(&legacy, legacy.enq);
    return take_pending();
}

/* ---- streams ---------------------------------------------------------------------------- */

cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    lock_t l(mu);
    if (stream == nullptr)
        return cudaErrorInvalidValue;
    CUstream_st *s = new CUstream_st();
    s->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t
cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t
cudaStreamDestroy(cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr || s == &legacy)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: unknown stream");
    if (s->cap != nullptr)
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamDestroy: under capture");
    drain(s, s->enq);          /* its work completes, as on a GPU */
    for (CUevent_st *e : events)
        if (e->s == s)
            e->s = nullptr;
    streams.erase(s);
    delete s;
    return cudaSuccess;
}

cudaError_t
cudaStreamSynchronize(cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: unknown stream");
    cudaError_t e = wait_ok(s);
    if (e != cudaSuccess)
        return e;
    drain(s, s->enq);
    return take_pending();
}

cudaError_t
cudaStreamQuery(cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery: unknown stream");
    cudaError_t e = wait_ok(s);
    if (e != cudaSuccess)
        return e;
    if (s->done == s->enq)
        return take_pending();
    drain(s, s->enq);
    return cudaErrorNotReady;
}

cudaError_t
cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr || events.count(event) == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: unknown handle");
    if (event->s == nullptr || event->s == s)
        return cudaSuccess;    /* nothing recorded, or in order anyway */
    if (s->cap != nullptr || event->s->cap != nullptr)
        return fail(cudaErrorStreamCaptureUnsupported,
                    "cudaStreamWaitEvent across streams under capture (one stream only)");
    op_s op;
    op.run = [] {};
    op.deps.push_back(dep_s{ event->s, event->seq });
    return enqueue(s, std::move(op));
}

/* ---- events ---------------------------------------------------------------------------- */

cudaError_t
cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    lock_t l(mu);
    if (event == nullptr)
        return cudaErrorInvalidValue;
    CUevent_st *e = new CUevent_st();
    e->flags = flags;
    events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t
cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t
cudaEventDestroy(cudaEvent_t event)
{
    lock_t l(mu);
    if (events.erase(event) == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: unknown event");
    delete event;              /* a queued record keeps its state alive */
    return cudaSuccess;
}

cudaError_t
cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr || events.count(event) == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown handle");
    if (s->cap != nullptr)
        return fail(cudaErrorStreamCaptureUnsupported,
                    "cudaEventRecord under capture (one stream only: nothing to order)");
    auto st = std::make_shared<ev_state>();
    op_s op;
    op.run = [st] {
        st->t = now_s();
        st->ran = true;
    };
    cudaError_t e = enqueue(s, std::move(op));
    if (e == cudaSuccess) {
        event->st = st;
        event->s = s;
        event->seq = s->enq;
    }
    return e;
}

cudaError_t
cudaEventSynchronize(cudaEvent_t event)
{
    lock_t l(mu);
    if (events.count(event) == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: unknown event");
    if (event->s != nullptr) {
        cudaError_t e = wait_ok(event->s);
        if (e != cudaSuccess)
            return e;
        drain(event->s, event->seq);
    }
    return take_pending();
}

cudaError_t
cudaEventQuery(cudaEvent_t event)
{
    lock_t l(mu);
    if (events.count(event) == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: unknown event");
    if (event->s == nullptr || event->s->done >= event->seq)
        return cudaSuccess;
    drain(event->s, event->seq);
    return cudaErrorNotReady;
}

cudaError_t
cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    lock_t l(mu);
    if (ms == nullptr || events.count(start) == 0 || events.count(end) == 0)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: unknown handle");
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: timing disabled");
    if (!start->st->ran || !end->st->ran)
        return cudaErrorNotReady;
    *ms = (float)((end->st->t - start->st->t) * 1e3);
    return cudaSuccess;
}

/* ---- graphs ------------------------------------------------------------------------------ */

cudaError_t
cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode)
{
    (void)mode;
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: unknown stream");
    if (s == &legacy)
        return fail(cudaErrorStreamCaptureUnsupported, "capture of the legacy stream");
    if (s->cap != nullptr)
        return fail(cudaErrorIllegalState, "cudaStreamBeginCapture: already capturing");
    s->cap = new CUgraph_st();
    s->cap_invalid = false;
    return cudaSuccess;
}

cudaError_t
cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr || graph == nullptr)
        return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: bad argument");
    if (s->cap == nullptr)
        return fail(cudaErrorIllegalState, "cudaStreamEndCapture: not capturing");
    CUgraph_st *g = s->cap;
    s->cap = nullptr;
    if (s->cap_invalid) {
        delete g;
        *graph = nullptr;
        return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture");
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t
cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (s == nullptr || status == nullptr)
        return cudaErrorInvalidValue;
    *status = s->cap == nullptr ? cudaStreamCaptureStatusNone
              : s->cap_invalid  ? cudaStreamCaptureStatusInvalidated
                                : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t
cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags;
    lock_t l(mu);
    if (exec == nullptr || graph == nullptr)
        return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: bad argument");
    CUgraphExec_st *x = new CUgraphExec_st();
    x->ops = graph->ops;
    *exec = x;
    return cudaSuccess;
}

cudaError_t
cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    lock_t l(mu);
    CUstream_st *s = stream_of(stream);
    if (exec == nullptr || s == nullptr)
        return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: bad handle");
    for (const op_s &op : exec->ops) {
        op_s o;
        o.run = op.run;
        cudaError_t e = enqueue(s, std::move(o));
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

cudaError_t
cudaGraphDestroy(cudaGraph_t graph)
{
    lock_t l(mu);
    delete graph;
    return cudaSuccess;
}

cudaError_t
cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    lock_t l(mu);
    delete exec;
    return cudaSuccess;
}

/* ---- kernels ------------------------------------------------------------------------------ */

cudaError_t
cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    lock_t l(mu);
    if (attr == nullptr || func == nullptr)
        return cudaErrorInvalidValue;
    memset(attr, 0, sizeof(*attr));
    attr->maxThreadsPerBlock = 1024;
    auto it = func_smem.find(func);
    attr->maxDynamicSharedSizeBytes = it != func_smem.end() ? it->second : (int)SMEM_DEFAULT;
    attr->ptxVersion = attr->binaryVersion = 90;
    return cudaSuccess;
}

cudaError_t
cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    lock_t l(mu);
    if (func == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > SMEM_OPTIN)
        return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute(%d, %d)", (int)attr, value);
    func_smem[func] = value;
    return cudaSuccess;
}

}  // extern "C"
