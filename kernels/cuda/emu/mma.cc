/* kernels/cuda/emu/mma.cc — the host versions of the warp-level mma.sync
 * shapes the kernels use, following the fragment layouts of the PTX ISA
 * ("Matrix Fragments for mma.m16n8k16 with floating point type" and
 * "... mma.m16n8k32"): lane l is in group g = l / 4 at t = l % 4 of it;
 * elements are packed into 32-bit registers lowest index in the lowest bits.
 * Products are exact (bf16 x bf16 and e4m3 x e4m3 fit an f32); the k products
 * are summed in f32 in k order, then C is added. */
#include <stdint.h>
#include <string.h>

#include "cuda_fp8.h"
#include "td_simt_device.h"

namespace td_simt {

namespace {

struct mma_arg {
    float *d;
    const uint32_t *a, *b;
    const float *c;
};

/* C and D, 16 x 8 f32: c[i] is row g + 8 (i / 2), column 2t + i % 2. */
void
mma_finish(void *const args[32], float A[16][32], float B[32][8], int K)
{
    float D[32][4];
    for (unsigned l = 0; l < 32; l++) {
        const mma_arg *m = static_cast<const mma_arg *>(args[l]);
        unsigned g = l / 4, t = l % 4;
        for (unsigned i = 0; i < 4; i++) {
            unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += A[row][k] * B[k][col];
            D[l][i] = s + m->c[i];
        }
    }
    for (unsigned l = 0; l < 32; l++)   /* d may be c: write after every read */
        memcpy(static_cast<const mma_arg *>(args[l])->d, D[l], sizeof(D[l]));
}

/* m16n8k16, bf16: a[r] holds A[g + 8 (r % 2)][2t + 8 (r / 2) + h] in half h;
 * b[r] holds B[2t + 8r + h][g] (B is k x n, stored by columns). */
void
mma_bf16_fn(void *const args[32], unsigned)
{
    float A[16][32], B[32][8];
    for (unsigned l = 0; l < 32; l++) {
        const mma_arg *m = static_cast<const mma_arg *>(args[l]);
        unsigned g = l / 4, t = l % 4;
        for (unsigned r = 0; r < 4; r++)
            for (unsigned h = 0; h < 2; h++)
                A[g + 8 * (r % 2)][2 * t + 8 * (r / 2) + h] =
                    bf16_to_f32((uint16_t)(m->a[r] >> (16 * h)));
        for (unsigned r = 0; r < 2; r++)
            for (unsigned h = 0; h < 2; h++)
                B[2 * t + 8 * r + h][g] = bf16_to_f32((uint16_t)(m->b[r] >> (16 * h)));
    }
    mma_finish(args, A, B, 16);
}

/* m16n8k32, e4m3: a[r] holds A[g + 8 (r % 2)][4t + 16 (r / 2) + q] in byte q;
 * b[r] holds B[4t + 16r + q][g]. */
void
mma_e4m3_fn(void *const args[32], unsigned)
{
    float A[16][32], B[32][8];
    for (unsigned l = 0; l < 32; l++) {
        const mma_arg *m = static_cast<const mma_arg *>(args[l]);
        unsigned g = l / 4, t = l % 4;
        for (unsigned r = 0; r < 4; r++)
            for (unsigned q = 0; q < 4; q++)
                A[g + 8 * (r % 2)][4 * t + 16 * (r / 2) + q] =
                    fp8_to_f32((uint8_t)(m->a[r] >> (8 * q)), __NV_E4M3);
        for (unsigned r = 0; r < 2; r++)
            for (unsigned q = 0; q < 4; q++)
                B[4 * t + 16 * r + q][g] = fp8_to_f32((uint8_t)(m->b[r] >> (8 * q)), __NV_E4M3);
    }
    mma_finish(args, A, B, 32);
}

}  // namespace

void
mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                  const char *file, int line)
{
    mma_arg m{ d, a, b, c };
    collective(mma_bf16_fn, "mma.sync.m16n8k16.bf16", 0xffffffffu, &m, file, line);
}

void
mma_m16n8k32_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                  const char *file, int line)
{
    mma_arg m{ d, a, b, c };
    collective(mma_e4m3_fn, "mma.sync.m16n8k32.e4m3", 0xffffffffu, &m, file, line);
}

}  // namespace td_simt
