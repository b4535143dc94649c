/* kernels/cuda/mma.h — the warp-level tensor-core instructions the kernels
 * use, one wrapper per shape: mma.sync on the GPU (sm_80+; e4m3 sm_89+), the
 * emulation's host version (emu/mma.cc) otherwise. Fragments follow the PTX
 * ISA's layouts; with g = lane / 4 and t = lane % 4, and elements packed
 * lowest index in the lowest bits of each 32-bit register:
 *
 * m16n8k16 bf16 (A 16x16 row-major, B 16x8 column-major, C/D 16x8 f32):
 *   a[r] = A[g + 8 (r % 2)][2t + 8 (r / 2) + {0, 1}]
 *   b[r] = B[2t + 8r + {0, 1}][g]
 *   c[i] = C[g + 8 (i / 2)][2t + i % 2]
 * m16n8k32 e4m3 (A 16x32, B 32x8, C/D as above):
 *   a[r] = A[g + 8 (r % 2)][4t + 16 (r / 2) + {0, 1, 2, 3}]
 *   b[r] = B[4t + 16r + {0, 1, 2, 3}][g]
 *
 * Every lane of the warp calls a wrapper together; d may be c. */
#ifndef TD_KERNELS_CUDA_MMA_H
#define TD_KERNELS_CUDA_MMA_H

#include "simt.h"

#ifdef TD_SIMT_EMU

inline void
td_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                     const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    ::td_simt::mma_m16n8k16_bf16(d, a, b, c, file, line);
}

inline void
td_mma_m16n8k32_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                     const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    ::td_simt::mma_m16n8k32_e4m3(d, a, b, c, file, line);
}

#else

__device__ __forceinline__ void
td_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void
td_mma_m16n8k32_e4m3(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

#endif

#endif
