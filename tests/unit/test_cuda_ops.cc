/* tests/unit/test_cuda_ops.cc — the compute kernels of kernels/cuda (ops.h)
 * against the cpu backend's ops on random inputs, ragged shapes included,
 * in both instantiations: f32 within 1e-5 relative L2 error, fast within
 * 2e-2 (bf16) and 6e-2 (fp8), data movement exact (docs/kernels.md,
 * "Error bounds"). Built against the SIMT emulation (suite unit) and, where
 * nvcc builds kernels/cuda, against the GPU (suite gpu, skipped without a
 * device: --skip-without-device). Prints the largest error seen per op. */
#include "check.h"
#include "ops.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

extern "C" {
#include "numfmt.h"
#include "rng.h"
}

static const double F32_BOUND = 1e-5, BF16_BOUND = 2e-2, FP8_BOUND = 6e-2;

static td_rng_t rng = td_rng_seed(0x5eed);
static const td_kernels_ops_t *cpu;

#define CUDA_CHECK(call) CHECK_EQ_INT((call), cudaSuccess)

/* uniform in [-1, 1) */
static float
urand(void)
{
    return (float)((double)(td_rng_next(&rng) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

template <class T>
struct dbuf {               /* a device copy of a host vector */
    T *p = nullptr;
    size_t n = 0;
    explicit dbuf(const std::vector<T> &h) : n(h.size())
    {
        CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
        CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    explicit dbuf(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
    ~dbuf() { CUDA_CHECK(cudaFree(p)); }
    std::vector<T> get() const
    {
        std::vector<T> h(n);
        CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

static std::vector<float>
to_f32(const std::vector<__nv_bfloat16> &v)
{
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); i++)
        f[i] = __bfloat162float(v[i]);
    return f;
}

static std::vector<__nv_bfloat16>
to_bf16(const std::vector<float> &v)
{
    std::vector<__nv_bfloat16> b(v.size());
    for (size_t i = 0; i < v.size(); i++)
        b[i] = __float2bfloat16(v[i]);
    return b;
}

/* ||got - want|| / ||want|| */
static double
rel_l2(const std::vector<float> &got, const std::vector<float> &want)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* The largest error per op and instantiation, printed at the end. */
static struct {
    const char *name;
    double bound, worst;
} results[16];
static int nresults;

static void
record(const char *name, double bound, double err, const char *shape)
{
    int i = 0;
    while (i < nresults && strcmp(results[i].name, name) != 0)
        i++;
    if (i == nresults) {
        results[nresults++] = { name, bound, 0.0 };
    }
    if (err > results[i].worst)
        results[i].worst = err;
    if (!(err <= bound)) {
        fprintf(stderr, "%s %s: relative error %.3g above %.3g\n", name, shape, err, bound);
        td_check_failures++;
    }
}

/* ---- embedding ----------------------------------------------------------------- */

static void
test_embed(size_t rows, size_t d, size_t n)
{
    std::vector<float> table(rows * d);
    for (float &v : table)
        v = urand();
    std::vector<__nv_bfloat16> tb = to_bf16(table);
    std::vector<float> tbf = to_f32(tb);
    std::vector<int64_t> ids(n);
    for (int64_t &id : ids)
        id = (int64_t)(td_rng_next(&rng) % rows);
    std::vector<float> want(n * d), want_b(n * d);
    CHECK_EQ_INT(cpu->embed(table.data(), rows, d, ids.data(), n, want.data()), TD_OK);
    CHECK_EQ_INT(cpu->embed(tbf.data(), rows, d, ids.data(), n, want_b.data()), TD_OK);

    dbuf<float> dt(table), y(n * d), yb(n * d);
    dbuf<__nv_bfloat16> dtb(tb);
    dbuf<int64_t> di(ids);
    CHECK_EQ_INT(td_cuda::embed(dt.p, rows, d, di.p, n, y.p, nullptr, nullptr), TD_OK);
    CHECK_EQ_INT(td_cuda::embed(dtb.p, rows, d, di.p, n, yb.p, nullptr, nullptr), TD_OK);
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaSuccess);
    CHECK(y.get() == want);
    CHECK(yb.get() == want_b);
}

/* Ids out of range poison their rows and are counted; the others are copied. */
static void
test_embed_bad_ids(void)
{
    const size_t rows = 4, d = 8;
    std::vector<float> table(rows * d, 1.5f);
    std::vector<int64_t> ids = { 2, -1, 4, 0 };
    dbuf<float> dt(table), y(ids.size() * d);
    dbuf<int64_t> di(ids);
    dbuf<unsigned> bad(std::vector<unsigned>{ 0 });
    CHECK_EQ_INT(td_cuda::embed(dt.p, rows, d, di.p, ids.size(), y.p, bad.p, nullptr), TD_OK);
    std::vector<float> h = y.get();
    CHECK_EQ_INT(bad.get()[0], 2);
    CHECK(h[0] == 1.5f && isnan(h[d]) && isnan(h[2 * d]) && h[3 * d + 7] == 1.5f);
}

/* ---- RMSNorm --------------------------------------------------------------------- */

static void
test_rmsnorm(size_t n, size_t d, bool weight)
{
    std::vector<float> x(n * d), w(d), want(n * d);
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < d; i++)
            x[r * d + i] = urand() * (float)(r + 1);
    for (float &v : w)
        v = 1.0f + 0.5f * urand();
    const float *wp = weight ? w.data() : nullptr;
    CHECK_EQ_INT(cpu->rmsnorm(x.data(), wp, 1e-6f, n, d, want.data()), TD_OK);

    dbuf<float> dx(x), dw(w), y(n * d), inplace(x);
    dbuf<__nv_bfloat16> yb(n * d);
    const float *dwp = weight ? dw.p : nullptr;
    CHECK_EQ_INT(td_cuda::rmsnorm(dx.p, dwp, 1e-6f, n, d, y.p, nullptr), TD_OK);
    CHECK_EQ_INT(td_cuda::rmsnorm(inplace.p, dwp, 1e-6f, n, d, inplace.p, nullptr), TD_OK);
    CHECK_EQ_INT(td_cuda::rmsnorm(dx.p, dwp, 1e-6f, n, d, yb.p, nullptr), TD_OK);
    char shape[64];
    snprintf(shape, sizeof(shape), "[%zu, %zu]%s", n, d, weight ? " with w" : "");
    record("rmsnorm f32", F32_BOUND, rel_l2(y.get(), want), shape);
    record("rmsnorm f32", F32_BOUND, rel_l2(inplace.get(), want), shape);
    record("rmsnorm fast (bf16 out)", BF16_BOUND, rel_l2(to_f32(yb.get()), want), shape);
}

/* ---- RoPE ------------------------------------------------------------------------- */

/* YaRN's frequencies as transformers computes them (factor 16 over 4096
 * original positions, betas 32 and 1): the fast dimensions keep their
 * frequency, the slow ones are divided by the factor, a ramp between. */
static std::vector<float>
yarn_inv_freq(size_t rd)
{
    const double base = 10000.0, factor = 16.0, orig = 4096.0;
    auto corr = [&](double rot) {
        return (double)rd * log(orig / (rot * 2.0 * M_PI)) / (2.0 * log(base));
    };
    double lo = fmax(floor(corr(32.0)), 0.0), hi = fmin(ceil(corr(1.0)), (double)rd - 1);
    if (lo == hi)
        hi += 0.001;
    std::vector<float> f(rd / 2);
    for (size_t i = 0; i < rd / 2; i++) {
        float pf = powf((float)base, (float)(2 * i) / (float)rd);
        float ramp = fminf(fmaxf(((float)i - (float)lo) / (float)(hi - lo), 0.0f), 1.0f);
        f[i] = 1.0f / ((float)factor * pf) * ramp + 1.0f / pf * (1.0f - ramp);
    }
    return f;
}

static void
test_rope(size_t n, size_t h, size_t d, size_t rd, int inverse)
{
    std::vector<float> x(n * h * d);
    for (float &v : x)
        v = urand();
    std::vector<float> xb = to_f32(to_bf16(x)), want = x, want_b = xb;
    std::vector<int64_t> pos(n);
    for (int64_t &p : pos)
        p = (int64_t)(td_rng_next(&rng) % 100000);
    std::vector<float> inv = yarn_inv_freq(rd);
    const float scale = 1.2772f;   /* YaRN's attention factor for factor 16 */
    CHECK_EQ_INT(cpu->rope(want.data(), n, h, d, rd, pos.data(), inv.data(), scale, inverse), TD_OK);
    CHECK_EQ_INT(cpu->rope(want_b.data(), n, h, d, rd, pos.data(), inv.data(), scale, inverse),
                 TD_OK);

    dbuf<float> dx(x), dinv(inv);
    dbuf<__nv_bfloat16> dxb(to_bf16(x));
    dbuf<int64_t> dpos(pos);
    CHECK_EQ_INT(td_cuda::rope(dx.p, n, h, d, rd, dpos.p, dinv.p, scale, inverse, nullptr), TD_OK);
    CHECK_EQ_INT(td_cuda::rope(dxb.p, n, h, d, rd, dpos.p, dinv.p, scale, inverse, nullptr),
                 TD_OK);
    char shape[64];
    snprintf(shape, sizeof(shape), "[%zu, %zu, %zu] rd %zu%s", n, h, d, rd,
             inverse ? " inverse" : "");
    record("rope f32", F32_BOUND, rel_l2(dx.get(), want), shape);
    record("rope fast (bf16)", BF16_BOUND, rel_l2(to_f32(dxb.get()), want_b), shape);
}

/* ---- dense GEMMs --------------------------------------------------------------------- */

static void
test_linear_bf16(size_t m, size_t n, size_t k, size_t xshift)
{
    std::vector<float> x(m * k + xshift), wf(n * k), want(m * n);
    for (float &v : x)
        v = urand();
    for (float &v : wf)
        v = urand() * 0.25f;
    std::vector<__nv_bfloat16> w = to_bf16(wf);
    wf = to_f32(w);
    CHECK_EQ_INT(cpu->linear(x.data() + xshift, wf.data(), want.data(), m, n, k, 0), TD_OK);

    dbuf<float> dx(x), y(m * n), yf(m * n);
    dbuf<__nv_bfloat16> dw(w);
    CHECK_EQ_INT(td_cuda::linear_bf16<td_cuda::prec::f32>(dx.p + xshift, dw.p, y.p, m, n, k, nullptr),
                 TD_OK);
    CHECK_EQ_INT(td_cuda::linear_bf16<td_cuda::prec::fast>(dx.p + xshift, dw.p, yf.p, m, n, k,
                                                           nullptr), TD_OK);
    char shape[64];
    snprintf(shape, sizeof(shape), "m %zu n %zu k %zu", m, n, k);
    record("linear_bf16 f32", F32_BOUND, rel_l2(y.get(), want), shape);
    record("linear_bf16 fast (mma bf16)", BF16_BOUND, rel_l2(yf.get(), want), shape);
}

/* fp8 weights as V4.1 stores them: e4m3 codes [n, k] (no NaN codes) and a
 * ue8m0 scale per 32 x 32 block; the cpu multiplies their exact values. */
static void
test_linear_fp8(size_t m, size_t n, size_t k)
{
    size_t nb = (n + 31) / 32, kb = (k + 31) / 32;
    std::vector<float> x(m * k), wf(n * k), want(m * n);
    std::vector<uint8_t> w(n * k), sc(nb * kb);
    for (size_t r = 0; r < m; r++)
        for (size_t i = 0; i < k; i++)
            x[r * k + i] = urand() * (r % 3 == 0 ? 100.0f : 1.0f);
    for (uint8_t &s : sc)
        s = (uint8_t)(118 + td_rng_next(&rng) % 8);
    for (size_t i = 0; i < n * k; i++) {
        uint8_t c = td_numfmt_f32_to_e4m3(urand() * 300.0f);
        w[i] = c;
        wf[i] = td_numfmt_e4m3_to_f32(c) * td_numfmt_e8m0_to_f32(sc[i / k / 32 * kb + i % k / 32]);
    }
    CHECK_EQ_INT(cpu->linear(x.data(), wf.data(), want.data(), m, n, k, 0), TD_OK);

    dbuf<float> dx(x), y(m * n), yf(m * n);
    dbuf<uint8_t> dw(w), dsc(sc);
    CHECK_EQ_INT(td_cuda::linear_fp8<td_cuda::prec::f32>(dx.p, dw.p, dsc.p, y.p, m, n, k, nullptr),
                 TD_OK);
    CHECK_EQ_INT(td_cuda::linear_fp8<td_cuda::prec::fast>(dx.p, dw.p, dsc.p, yf.p, m, n, k,
                                                          nullptr), TD_OK);
    char shape[64];
    snprintf(shape, sizeof(shape), "m %zu n %zu k %zu", m, n, k);
    record("linear_fp8 f32", F32_BOUND, rel_l2(y.get(), want), shape);
    record("linear_fp8 fast (mma e4m3)", FP8_BOUND, rel_l2(yf.get(), want), shape);
}

/* Exit status of a test that cannot run here (meson's SKIP). */
#define SKIP_STATUS 77

int
main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        /* the GPU build's meson test (suite gpu) skips; anything else fails */
        bool skip = argc > 1 && strcmp(argv[1], "--skip-without-device") == 0;
        fprintf(stderr, "test_cuda_ops: no CUDA device%s\n", skip ? ": SKIP" : "");
        return skip ? SKIP_STATUS : 1;
    }
    cpu = td_kernels_cpu_ops();
    static const size_t embed_shapes[][3] = {
        { 50, 64, 7 }, { 33, 37, 5 }, { 100, 128, 16 }, { 10, 6, 3 }, { 7, 200, 9 },
    };
    for (const auto &s : embed_shapes)
        test_embed(s[0], s[1], s[2]);
    test_embed_bad_ids();

    static const size_t norm_shapes[][2] = { { 1, 7 }, { 5, 64 }, { 3, 300 }, { 4, 1000 } };
    for (const auto &s : norm_shapes)
        for (bool w : { true, false })
            test_rmsnorm(s[0], s[1], w);

    static const size_t rope_shapes[][4] = {
        { 3, 2, 64, 64 }, { 4, 3, 96, 64 }, { 2, 5, 18, 6 }, { 1, 1, 2, 2 },
    };
    for (const auto &s : rope_shapes)
        for (int inverse = 0; inverse < 2; inverse++)
            test_rope(s[0], s[1], s[2], s[3], inverse);

    static const size_t gemm_shapes[][4] = {   /* m, n, k, x misaligned by floats */
        { 1, 8, 16, 0 }, { 3, 70, 45, 0 }, { 33, 130, 96, 0 }, { 65, 64, 64, 0 },
        { 5, 17, 300, 0 }, { 7, 40, 64, 1 }, { 70, 140, 100, 0 },
    };
    for (const auto &s : gemm_shapes) {
        test_linear_bf16(s[0], s[1], s[2], s[3]);
        if (s[3] == 0)
            test_linear_fp8(s[0], s[1], s[2]);
    }

    for (int i = 0; i < nresults; i++)
        printf("%-30s max relative L2 error %.3g (bound %.0e)\n", results[i].name,
               results[i].worst, results[i].bound);
    return td_check_exit("test_cuda_ops");
}
