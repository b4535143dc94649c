/* bench/engine/gemmbench.c — the cpu linears (td_kernels_ops_t.linear_mat)
 * on the shapes of the `mid` preset: GFLOP/s per shape and row count, and,
 * built with OpenBLAS, a bitwise check against cblas_sgemm on 32-row blocks
 * (the order gemm.c reproduces, docs/forward.md). One JSON line per case. */
#include "kernels.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "rng.h"

#ifdef TD_HAVE_OPENBLAS
#include <cblas.h>
#endif

typedef struct {
    const char *what;
    size_t groups, n, k;
} gb_shape_t;

/* mid: hidden 1024, q_lora 256, 8 heads x 128, o_groups 4 x 256, experts 256,
 * hc 4, engram 2 x 4 x 64, vocab 671 */
static const gb_shape_t gb_shapes[] = {
    { "hc_fn", 1, 24, 4096 },     { "wq_a", 1, 256, 1024 },  { "wq_b", 1, 1024, 256 },
    { "wkv", 1, 128, 1024 },      { "wo_a", 4, 256, 256 },   { "wo_b", 1, 1024, 1024 },
    { "gate", 1, 8, 1024 },       { "expert_w1", 1, 256, 1024 },
    { "expert_w2", 1, 1024, 256 }, { "engram_wkv", 1, 5120, 512 }, { "head", 1, 671, 1024 },
    { "idx_wproj", 1, 4, 1024 },  { "idx_wk", 1, 64, 128 },
};

static td_rng_t gb_rng = { .state = TD_RNG_GAMMA };

#ifdef TD_HAVE_OPENBLAS
/* y [m, g, n] by OpenBLAS as the linears were computed before: every group
 * and every 32 rows one sgemm on exactly 32 rows (zero-padded). */
static void
gb_reference(const float *x, const float *w, float *y, size_t m, size_t g, size_t n, size_t k)
{
    float *px = calloc(32 * k, sizeof(float)), *py = malloc(32 * n * sizeof(float));
    for (size_t j = 0; j < g; j++)
        for (size_t r = 0; r < m; r += 32) {
            size_t rows = m - r < 32 ? m - r : 32;
            memset(px, 0, 32 * k * sizeof(float));
            for (size_t i = 0; i < rows; i++)
                memcpy(px + i * k, x + ((r + i) * g + j) * k, k * sizeof(float));
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 32, (int)n, (int)k, 1.0f, px,
                        (int)k, w + j * n * k, (int)k, 0.0f, py, (int)n);
            for (size_t i = 0; i < rows; i++)
                memcpy(y + ((r + i) * g + j) * n, py + i * n, n * sizeof(float));
        }
    free(px);
    free(py);
}
#endif

int
main(int argc, char **argv)
{
    static const size_t rows[] = { 1, 16, 512 };
    int check = 0, bf16 = 1;
    double seconds = 0.2;
    static const struct option opts[] = {
        { "check", no_argument, NULL, 'c' },
        { "f32", no_argument, NULL, 'f' },
        { "seconds", required_argument, NULL, 's' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    char err[TD_CONFIG_ERRLEN];
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': check = 1; break;
        case 'f': bf16 = 0; break;
        case 's':
            if (td_config_parse_double("--seconds", optarg, 0, 3600, &seconds, err,
                                       sizeof(err)) != TD_OK) {
                fprintf(stderr, "gemmbench: %s\n", err);
                return 2;
            }
            break;
        case 'h':
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: gemmbench [--check] [--f32] [--seconds S]\n"
                    "  linear_mat on the mid preset's shapes at 1, 16 and 512 rows; weights\n"
                    "  bf16 values (kept as bf16) unless --f32; threads: $TD_CPU_THREADS.\n"
                    "  --check: every result against cblas_sgemm on 32-row blocks, bit for bit\n"
                    "  (needs a build with OpenBLAS); exit status 1 on a difference.\n");
            return c == 'h' ? 0 : 2;
        }
    }
#ifndef TD_HAVE_OPENBLAS
    if (check) {
        fprintf(stderr, "gemmbench: --check needs a build with OpenBLAS\n");
        return 2;
    }
#endif
    const td_kernels_ops_t *k = td_kernels_cpu_ops();
    long differ = 0;
    for (size_t s = 0; s < sizeof(gb_shapes) / sizeof(gb_shapes[0]); s++) {
        const gb_shape_t *sh = &gb_shapes[s];
        size_t g = sh->groups, n = sh->n, kk = sh->k, wn = g * n * kk;
        float *w = malloc(wn * sizeof(float));
        float *x = malloc(512 * g * kk * sizeof(float));
        float *y = malloc(512 * g * n * sizeof(float));
        float *ref = malloc(512 * g * n * sizeof(float));
        td_kernels_mat_t *mat = NULL;
        if (w == NULL || x == NULL || y == NULL || ref == NULL) {
            fprintf(stderr, "gemmbench: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < wn; i++) {
            float v = td_rng_range(&gb_rng, -0.5f, 0.5f);
            uint32_t u;
            memcpy(&u, &v, sizeof(u));
            u = bf16 ? u & 0xFFFF0000u : u | 1u;   /* bf16 values, or surely not */
            memcpy(&w[i], &u, sizeof(u));
        }
        for (size_t i = 0; i < 512 * g * kk; i++)
            x[i] = td_rng_range(&gb_rng, -0.5f, 0.5f);
        if (k->mat_create(w, g, n, kk, &mat) != TD_OK) {
            fprintf(stderr, "gemmbench: %s: no weights (the reason is logged above)\n",
                    sh->what);
            return 1;
        }
        for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
            size_t m = rows[ri], reps = 0;
            double t0 = td_clock_s(), dt;
            do {
                k->linear_mat(x, mat, y, m);
                reps++;
                dt = td_clock_s() - t0;
            } while (dt < seconds);
            dt /= (double)reps;
            long bad = -1;
#ifdef TD_HAVE_OPENBLAS
            if (check) {
                gb_reference(x, w, ref, m, g, n, kk);
                bad = 0;
                for (size_t i = 0; i < m * g * n; i++)
                    bad += memcmp(&y[i], &ref[i], sizeof(float)) != 0;
                differ += bad;
            }
#endif
            printf("{\"what\": \"%s\", \"groups\": %zu, \"n\": %zu, \"k\": %zu, \"rows\": %zu, "
                   "\"bf16\": %d, \"us\": %.2f, \"gflops\": %.1f, \"weight_gb_s\": %.1f",
                   sh->what, g, n, kk, m, bf16, dt * 1e6,
                   2.0 * (double)(m * g * n * kk) / dt / 1e9,
                   (double)k->mat_bytes(mat) / dt / 1e9);
            if (bad >= 0)
                printf(", \"differ\": %ld", bad);
            printf("}\n");
            fflush(stdout);
        }
        k->mat_destroy(mat);
        free(w);
        free(x);
        free(y);
        free(ref);
    }
    return differ != 0;
}
