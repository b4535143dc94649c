/* kernels/cuda/gemm.cu — the dense linears y [m, n] = x [m, k] . w [n, k]^T
 * over bf16 weights and over V4.1's fp8 weights (e4m3, one ue8m0 scale per
 * 32 x 32 block), x and y f32 (ops.h). One CTA of 4 warps computes a 64 x 64
 * tile of y, stepping through k 32 at a time: the x and w tiles are staged
 * in shared memory (zeros past the edges, so any m, n, k), then
 *   f32:  each thread sums an 8 x 4 block of y with fmaf (w dequantized
 *         exactly into the tile);
 *   fast: each warp a 32 x 32 block with mma.sync: bf16 x rounded to bf16,
 *         m16n8k16; fp8 x quantized per row and 32 columns to e4m3 (as
 *         td_numfmt_quant_fp8), m16n8k32 per step, scaled by both scales.
 * Portable (sm_80+; e4m3 sm_89+): no cp.async, ldmatrix or wgmma yet. */
#include "backend.h"
#include "device.h"
#include "mma.h"
#include "ops.h"

#include <limits.h>

namespace td_cuda {

static constexpr int BM = 64, BN = 64, BK = 32, GEMM_THREADS = 128;
static constexpr int LDF = BM + 4;   /* f32 tiles [BK][64 + 4] */
static constexpr int LDH = 20;       /* bf16 tiles [64][32 + 8] as words */
static constexpr int LDQ = 12;       /* e4m3 tiles [64][32 + 16] as words */

struct gemm_args {
    const float *x;          /* [m, k] */
    const void *w;           /* [n, k] bf16 or e4m3 codes */
    const uint8_t *scales;   /* fp8: [ceil(n / 32), kb] ue8m0 */
    float *y;                /* [m, n] */
    int m, n, k, kb;         /* kb = ceil(k / 32) */
    bool xvec, wvec;         /* rows loadable 16 bytes at a time */
    bool y2, y4;             /* y storable as float2, float4 */
};

/* ---- loading tiles -------------------------------------------------------------- */

/* x[row][col .. col + 3], zeros outside [m, k]; col % 4 == 0. */
__device__ __forceinline__ float4
gemm_x4(const gemm_args &a, int row, int col)
{
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row >= a.m || col >= a.k)
        return v;
    const float *p = a.x + (size_t)row * a.k + col;
    if (a.xvec)
        return td_ld<float4>(p);
    v.x = p[0];
    if (col + 1 < a.k)
        v.y = p[1];
    if (col + 2 < a.k)
        v.z = p[2];
    if (col + 3 < a.k)
        v.w = p[3];
    return v;
}

/* 16 bytes of w's row: 8 bf16 or 16 e4m3 codes from element col on
 * (E elements per uint4), zeros outside [n, k]. */
template <int E>
__device__ __forceinline__ uint4
gemm_w16(const gemm_args &a, int row, int col)
{
    constexpr int ES = 16 / E;   /* bytes per element */
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row >= a.n || col >= a.k)
        return v;
    const unsigned char *p = (const unsigned char *)a.w + ((size_t)row * a.k + col) * ES;
    if (a.wvec)
        return td_ld<uint4>(p);
    uint32_t wd[4] = { 0, 0, 0, 0 };
#pragma unroll
    for (int e = 0; e < E; e++)
        if (col + e < a.k)
#pragma unroll
            for (int b = 0; b < ES; b++)
                wd[e * ES / 4] |= (uint32_t)p[e * ES + b] << (8 * ((e * ES + b) % 4));
    return make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* The ue8m0 scale of w's block (row / 32, col / 32) as a float; 0 past n. */
__device__ __forceinline__ float
gemm_wscale(const gemm_args &a, int row, int col)
{
    if (row >= a.n)
        return 0.0f;
    return td_ue8m0_to_f32(a.scales[(size_t)(row / 32) * a.kb + col / 32]);
}

/* ---- the f32 instantiation ---------------------------------------------------------- */

/* x and w tiles by columns: xs[c][r] = x[bm + r][kt + c], ws[c][r] = w[bn + r][kt + c]. */
template <bool FP8>
__device__ __forceinline__ void
gemm_f32_load(const gemm_args &a, td_sptr<float> xs, td_sptr<float> ws, int bm, int bn, int kt,
              int tid)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int c = tid + i * GEMM_THREADS, row = c / 8, col = c % 8 * 4;
        float4 v = gemm_x4(a, bm + row, kt + col);
        xs[(col + 0) * LDF + row] = v.x;
        xs[(col + 1) * LDF + row] = v.y;
        xs[(col + 2) * LDF + row] = v.z;
        xs[(col + 3) * LDF + row] = v.w;
    }
    if constexpr (FP8) {
        int row = tid / 2, col = tid % 2 * 16;
        uint4 q = gemm_w16<16>(a, bn + row, kt + col);
        float sc = gemm_wscale(a, bn + row, kt);
        uint32_t wd[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
        for (int e = 0; e < 16; e++)
            ws[(col + e) * LDF + row] = td_e4m3_to_f32((uint8_t)(wd[e / 4] >> (8 * (e % 4)))) * sc;
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int c = tid + i * GEMM_THREADS, row = c / 4, col = c % 4 * 8;
            uint4 q = gemm_w16<8>(a, bn + row, kt + col);
            uint32_t wd[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
            for (int e = 0; e < 8; e++)
                ws[(col + e) * LDF + row] = e % 2 ? td_bf16_hi(wd[e / 2]) : td_bf16_lo(wd[e / 2]);
        }
    }
}

template <bool FP8>
__global__ static void __launch_bounds__(GEMM_THREADS, 1)
gemm_f32_kernel(const __grid_constant__ gemm_args a)
{
    TD_SHARED(float, xs, BK * LDF);
    TD_SHARED(float, ws, BK * LDF);
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[8][4] = {};

    for (int kt = 0; kt < a.k; kt += BK) {
        gemm_f32_load<FP8>(a, xs, ws, bm, bn, kt, tid);
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < BK; kk++) {
            float4 x0 = td_ld<float4>(xs + kk * LDF + ty * 8);
            float4 x1 = td_ld<float4>(xs + kk * LDF + ty * 8 + 4);
            float4 w0 = td_ld<float4>(ws + kk * LDF + tx * 4);
            float xv[8] = { x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w };
            float wv[4] = { w0.x, w0.y, w0.z, w0.w };
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int row = bm + ty * 8 + i, col = bn + tx * 4;
        if (row >= a.m)
            break;
        float *yr = a.y + (size_t)row * a.n;
        if (a.y4 && col + 3 < a.n) {
            td_st<float4>(yr + col, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (col + j < a.n)
                yr[col + j] = acc[i][j];
    }
}

/* ---- the fast instantiations ---------------------------------------------------------- */

/* A warp's 32 x 32 block of y from the mma accumulators: acc[i][j] is the
 * 16 x 8 tile (16 i, 8 j), c[2h + e] at row g + 8h, column 2t + e. */
__device__ __forceinline__ void
gemm_mma_store(const gemm_args &a, const float (&acc)[2][4][4], int rb, int cb, int g, int t)
{
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = rb + i * 16 + g + 8 * h;
            if (row >= a.m)
                continue;
            float *yr = a.y + (size_t)row * a.n;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int col = cb + j * 8 + 2 * t;
                if (a.y2 && col + 1 < a.n) {
                    td_st<float2>(yr + col, make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]));
                    continue;
                }
                if (col < a.n)
                    yr[col] = acc[i][j][2 * h];
                if (col + 1 < a.n)
                    yr[col + 1] = acc[i][j][2 * h + 1];
            }
        }
}

__global__ static void __launch_bounds__(GEMM_THREADS, 1)
gemm_bf16_mma_kernel(const __grid_constant__ gemm_args a)
{
    TD_SHARED(uint32_t, xs, BM * LDH);   /* [64][32 + 8] bf16 */
    TD_SHARED(uint32_t, ws, BN * LDH);
    const int tid = threadIdx.x, lane = tid % 32, wid = tid / 32;
    const int wm = wid / 2, wn = wid % 2, g = lane / 4, t = lane % 4;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[2][4][4] = {};

    for (int kt = 0; kt < a.k; kt += BK) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int c = tid + i * GEMM_THREADS, row = c / 8, col = c % 8 * 4;
            float4 v = gemm_x4(a, bm + row, kt + col);
            td_st<uint2>(xs + row * LDH + col / 2,
                         make_uint2(td_bf16_pack(v.x, v.y), td_bf16_pack(v.z, v.w)));
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int c = tid + i * GEMM_THREADS, row = c / 4, col = c % 4 * 8;
            td_st<uint4>(ws + row * LDH + col / 2, gemm_w16<8>(a, bn + row, kt + col));
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[2][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    af[i][r] = xs[(wm * 32 + i * 16 + g + 8 * (r % 2)) * LDH +
                                  (kk + 2 * t + 8 * (r / 2)) / 2];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    bf[j][r] = ws[(wn * 32 + j * 8 + g) * LDH + (kk + 2 * t + 8 * r) / 2];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    td_mma_m16n8k16_bf16(acc[i][j], af[i], bf[j], acc[i][j]);
        }
        __syncthreads();
    }
    gemm_mma_store(a, acc, bm + wm * 32, bn + wn * 32, g, t);
}

/* x's tile quantized: two threads per row, 16 columns each, one scale per
 * row (both halves' amax); the row's scale goes to xsc. */
__device__ __forceinline__ void
gemm_fp8_quant_x(const gemm_args &a, td_sptr<uint32_t> xs, td_sptr<float> xsc, int bm, int kt,
                 int tid)
{
    int row = tid / 2, col = tid % 2 * 16;
    float4 v[4];
    float amax = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        v[q] = gemm_x4(a, bm + row, kt + col + 4 * q);
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)),
                                 fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    int e = td_pow2_ceil_exp(fmaxf(amax, 1e-4f) / 448.0f);
    float inv = td_pow2(-e);
    uint32_t c[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        c[q] = td_e4m3_pack4(make_float4(v[q].x * inv, v[q].y * inv, v[q].z * inv, v[q].w * inv));
    td_st<uint4>(xs + row * LDQ + col / 4, make_uint4(c[0], c[1], c[2], c[3]));
    if (col == 0)
        xsc[row] = td_pow2(e);
}

__global__ static void __launch_bounds__(GEMM_THREADS, 1)
gemm_fp8_mma_kernel(const __grid_constant__ gemm_args a)
{
    TD_SHARED(uint32_t, xs, BM * LDQ);   /* [64][32 + 16] e4m3 */
    TD_SHARED(uint32_t, ws, BN * LDQ);
    TD_SHARED(float, xsc, BM);           /* the rows' scales of this step */
    const int tid = threadIdx.x, lane = tid % 32, wid = tid / 32;
    const int wm = wid / 2, wn = wid % 2, g = lane / 4, t = lane % 4;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const float zero[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    float acc[2][4][4] = {};

    for (int kt = 0; kt < a.k; kt += BK) {
        gemm_fp8_quant_x(a, xs, xsc, bm, kt, tid);
        td_st<uint4>(ws + tid / 2 * LDQ + tid % 2 * 4, gemm_w16<16>(a, bn + tid / 2, kt + tid % 2 * 16));
        __syncthreads();
        float sw = gemm_wscale(a, bn + wn * 32, kt);
        uint32_t af[2][4], bf[4][2];
        float sx[2][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
            for (int r = 0; r < 4; r++)
                af[i][r] = xs[(wm * 32 + i * 16 + g + 8 * (r % 2)) * LDQ + t + 4 * (r / 2)];
#pragma unroll
            for (int h = 0; h < 2; h++)
                sx[i][h] = xsc[wm * 32 + i * 16 + g + 8 * h] * sw;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                bf[j][r] = ws[(wn * 32 + j * 8 + g) * LDQ + t + 4 * r];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p[4];
                td_mma_m16n8k32_e4m3(p, af[i], bf[j], zero);
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[i][j][c] = fmaf(p[c], sx[i][c / 2], acc[i][j][c]);
            }
        __syncthreads();
    }
    gemm_mma_store(a, acc, bm + wm * 32, bn + wn * 32, g, t);
}

/* ---- launchers ------------------------------------------------------------------------- */

static td_status_t
gemm_setup(const char *op, const float *x, const void *w, float *y, size_t m, size_t n,
           size_t k, size_t wbytes, gemm_args *a, dim3 *grid)
{
    if (x == nullptr || w == nullptr || y == nullptr || m == 0 || n == 0 || k == 0)
        return td_kernels_fail(TD_ERR_INVALID, "cuda %s: NULL pointer or empty shape", op);
    if (m > (size_t)BM * 65535 || n > (size_t)INT_MAX - BN || k > (size_t)INT_MAX - BK)
        return td_kernels_fail(TD_ERR_INVALID, "cuda %s: %zu x %zu x %zu is too large", op, m,
                               n, k);
    a->x = x;
    a->w = w;
    a->scales = nullptr;
    a->y = y;
    a->m = (int)m;
    a->n = (int)n;
    a->k = (int)k;
    a->kb = (int)((k + 31) / 32);
    a->xvec = k % 4 == 0 && (uintptr_t)x % 16 == 0;
    a->wvec = (k * wbytes) % 16 == 0 && (uintptr_t)w % 16 == 0;
    a->y2 = n % 2 == 0 && (uintptr_t)y % 8 == 0;
    a->y4 = n % 4 == 0 && (uintptr_t)y % 16 == 0;
    *grid = dim3((unsigned)((n + BN - 1) / BN), (unsigned)((m + BM - 1) / BM));
    return TD_OK;
}

template <prec P>
td_status_t
linear_bf16(const float *x, const __nv_bfloat16 *w, float *y, size_t m, size_t n, size_t k,
            cudaStream_t s)
{
    gemm_args a;
    dim3 grid;
    td_status_t st = gemm_setup("linear_bf16", x, w, y, m, n, k, 2, &a, &grid);
    if (st != TD_OK)
        return st;
    cudaError_t e;
    if constexpr (P == prec::f32)
        e = TD_LAUNCH(gemm_f32_kernel<false>, grid, GEMM_THREADS, 0, s, a);
    else
        e = TD_LAUNCH(gemm_bf16_mma_kernel, grid, GEMM_THREADS, 0, s, a);
    return td_kernels_cuda_status(e, "linear_bf16");
}

template <prec P>
td_status_t
linear_fp8(const float *x, const uint8_t *w, const uint8_t *scales, float *y, size_t m,
           size_t n, size_t k, cudaStream_t s)
{
    gemm_args a;
    dim3 grid;
    if (scales == nullptr)
        return td_kernels_fail(TD_ERR_INVALID, "cuda linear_fp8: NULL scales");
    td_status_t st = gemm_setup("linear_fp8", x, w, y, m, n, k, 1, &a, &grid);
    if (st != TD_OK)
        return st;
    a.scales = scales;
    cudaError_t e;
    if constexpr (P == prec::f32)
        e = TD_LAUNCH(gemm_f32_kernel<true>, grid, GEMM_THREADS, 0, s, a);
    else
        e = TD_LAUNCH(gemm_fp8_mma_kernel, grid, GEMM_THREADS, 0, s, a);
    return td_kernels_cuda_status(e, "linear_fp8");
}

template td_status_t linear_bf16<prec::f32>(const float *, const __nv_bfloat16 *, float *,
                                            size_t, size_t, size_t, cudaStream_t);
template td_status_t linear_bf16<prec::fast>(const float *, const __nv_bfloat16 *, float *,
                                             size_t, size_t, size_t, cudaStream_t);
template td_status_t linear_fp8<prec::f32>(const float *, const uint8_t *, const uint8_t *,
                                           float *, size_t, size_t, size_t, cudaStream_t);
template td_status_t linear_fp8<prec::fast>(const float *, const uint8_t *, const uint8_t *,
                                            float *, size_t, size_t, size_t, cudaStream_t);

}  // namespace td_cuda
