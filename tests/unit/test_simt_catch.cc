/* tests/unit/test_simt_catch.cc — the SIMT emulation's bug catchers, each
 * shown on a kernel with the bug planted: a missing __syncthreads (a shared
 * memory race), a divergent barrier and one some threads exit before, a
 * shared out-of-bounds write, a misaligned vector load, a warp collective
 * that lanes do not all reach or reach with another intrinsic, a shuffle
 * from outside its mask; each must be reported (naming the kernel, the
 * block and the thread) and fail the launch. Correct variants of the same
 * kernels report nothing. Under AddressSanitizer, a global out-of-bounds
 * write in a kernel is caught in a child process. */
#include "check.h"
#include "simt.h"
#include "simt_emu.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

static std::vector<std::string> lines;

static void
capture(const char *line, void *)
{
    lines.push_back(line);
}

/* Run `launch`, wait, and check the outcome: with `want` NULL no report and
 * success; else a report containing want (and the kernel's name) and
 * cudaErrorLaunchFailure from the wait. */
template <class F>
static void
expect_report(const char *name, F launch, const char *want, const char *kernel)
{
    lines.clear();
    td_simt_capture(capture, nullptr);
    cudaError_t le = launch();
    cudaError_t se = cudaDeviceSynchronize();
    td_simt_capture(nullptr, nullptr);
    bool found = false;
    for (const std::string &l : lines)
        found |= want != nullptr && l.find(want) != std::string::npos &&
                 l.find(kernel) != std::string::npos;
    bool ok = le == cudaSuccess &&
              (want == nullptr ? se == cudaSuccess && lines.empty()
                               : se == cudaErrorLaunchFailure && found);
    if (!ok) {
        fprintf(stderr, "%s: launch %d, wait %d, %zu line(s), wanted %s\n", name, (int)le,
                (int)se, lines.size(), want ? want : "none");
        for (const std::string &l : lines)
            fprintf(stderr, "  %s\n", l.c_str());
    } else if (want != nullptr) {
        printf("%s: %s\n", name, lines[0].c_str());   /* the report, shown */
    }
    CHECK(ok);
    (void)cudaGetLastError();
}

/* ---- shared memory races ---------------------------------------------------------- */

/* Each thread reads its neighbour's element: with the barrier, a rotation;
 * without, the read races the neighbour's write. */
template <bool BARRIER>
__global__ void
k_rotate(float *out)
{
    TD_SHARED(float, s, 64);
    unsigned t = threadIdx.x;
    s[t] = (float)t;
    if (BARRIER)
        __syncthreads();
    out[t] = s[(t + 1) % 64];
}

/* Lanes of one warp exchange through shared memory with __syncwarp (no
 * race); lanes of another warp read it without a barrier (a race). */
template <bool CROSS_WARP>
__global__ void
k_warp_exchange(float *out)
{
    TD_SHARED(float, s, 64);
    unsigned t = threadIdx.x;
    s[t] = (float)t;
    __syncwarp();
    out[t] = CROSS_WARP ? s[(t + 32) % 64] : s[t ^ 1];
}

/* ---- barriers ---------------------------------------------------------------------- */

__global__ void
k_divergent(float *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void
k_early_exit(float *out)
{
    if (threadIdx.x == 3)
        return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

/* ---- out of bounds and misaligned ---------------------------------------------------- */

__global__ void
k_shared_oob(float *out)
{
    TD_SHARED(float, s, 64);
    s[threadIdx.x + 1] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

__global__ void
k_misaligned(const float *in, float *out)
{
    float4 v = td_ld<float4>(in + 1 + 4 * threadIdx.x);
    out[threadIdx.x] = v.x;
}

/* ---- warp collectives ------------------------------------------------------------------ */

/* Run with 48 threads: lanes 16 .. 31 of warp 1 do not exist. */
__global__ void
k_partial_warp(float *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

__global__ void
k_mixed(float *out)
{
    if (threadIdx.x < 16)
        out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
    else
        out[threadIdx.x] = (float)__ballot_sync(0xffffffffu, 1);
}

__global__ void
k_outside_mask(float *out)
{
    if (threadIdx.x < 16)
        out[threadIdx.x] = __shfl_sync(0x0000ffffu, (float)threadIdx.x, 20);
}

#if defined(__SANITIZE_ADDRESS__)
__global__ void
k_global_oob(float *out)
{
    out[threadIdx.x] = 1.0f;   /* launched with one thread more than out has floats */
}

/* The child writes past a 64-float device buffer; ASan must stop it with a
 * heap-buffer-overflow report, which the parent reads. */
static void
test_global_oob(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        td_simt_set_threads(1);
        float *p = nullptr;
        cudaMalloc(&p, 64 * sizeof(float));
        TD_LAUNCH(k_global_oob, 1, 65, 0, nullptr, p);
        cudaDeviceSynchronize();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0)
        err.append(buf, (size_t)n);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool caught = WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                  err.find("heap-buffer-overflow") != std::string::npos &&
                  err.find("WRITE of size 4") != std::string::npos;
    if (caught)
        printf("global out of bounds: %s\n", err.substr(err.find("ERROR"), 120).c_str());
    else
        fprintf(stderr, "global out of bounds not caught: status %d, stderr:\n%s\n", status,
                err.c_str());
    CHECK(caught);
}
#endif

int
main(void)
{
    float *in = nullptr, *out = nullptr;
    CHECK_EQ_INT(cudaMalloc(&in, 1024), cudaSuccess);
    CHECK_EQ_INT(cudaMalloc(&out, 1024), cudaSuccess);

    expect_report("rotate with its barrier", [&] { return TD_LAUNCH(k_rotate<true>, 1, 64, 0, nullptr, out); },
                  nullptr, "");
    expect_report("missing barrier", [&] { return TD_LAUNCH(k_rotate<false>, 1, 64, 0, nullptr, out); },
                  "shared memory race on s", "k_rotate<false>");
    expect_report("exchange within a warp after __syncwarp",
                  [&] { return TD_LAUNCH(k_warp_exchange<false>, 1, 64, 0, nullptr, out); }, nullptr, "");
    expect_report("exchange across warps after __syncwarp",
                  [&] { return TD_LAUNCH(k_warp_exchange<true>, 1, 64, 0, nullptr, out); },
                  "shared memory race on s", "k_warp_exchange<true>");
    expect_report("divergent barrier", [&] { return TD_LAUNCH(k_divergent, 1, 64, 0, nullptr, out); },
                  "divergent barrier", "k_divergent");
    expect_report("barrier after an early exit",
                  [&] { return TD_LAUNCH(k_early_exit, 1, 64, 0, nullptr, out); },
                  "reached by 63 of 64 threads; 1 exited", "k_early_exit");
    expect_report("shared out of bounds", [&] { return TD_LAUNCH(k_shared_oob, 1, 64, 0, nullptr, out); },
                  "shared s: write of 4 bytes at byte 256, outside its 256 bytes", "k_shared_oob");
    expect_report("misaligned vector load",
                  [&] { return TD_LAUNCH(k_misaligned, 1, 8, 0, nullptr, in, out); },
                  "vector load at", "k_misaligned");
    expect_report("full mask in a partial warp",
                  [&] { return TD_LAUNCH(k_partial_warp, 1, 48, 0, nullptr, out); },
                  "never completes: lane 16 is not a thread of the block", "k_partial_warp");
    expect_report("lanes at different collectives", [&] { return TD_LAUNCH(k_mixed, 1, 32, 0, nullptr, out); },
                  "meet at different collectives", "k_mixed");
    expect_report("shuffle from outside the mask",
                  [&] { return TD_LAUNCH(k_outside_mask, 1, 32, 0, nullptr, out); },
                  "reads lane 20, which is not in the mask", "k_outside_mask");
#if defined(__SANITIZE_ADDRESS__)
    test_global_oob();
#else
    printf("global out of bounds: caught by AddressSanitizer, checked in the ASan build\n");
#endif
    CHECK_EQ_INT(cudaFree(in), cudaSuccess);
    CHECK_EQ_INT(cudaFree(out), cudaSuccess);
    return td_check_exit("test_simt_catch");
}
