/* kernels/cuda/emu/include/vector_types.h — the CUDA vector types (int2,
 * float4, uint4, ...) and dim3/uint3 for the SIMT emulation, with CUDA's
 * sizes and alignments, so that a vector load needs the alignment it needs
 * on a GPU. C and C++. */
#ifndef TD_SIMT_VECTOR_TYPES_H
#define TD_SIMT_VECTOR_TYPES_H

#define TD_SIMT_VEC1(T, N) \
    typedef struct N { T x; } N;
#define TD_SIMT_VEC2(T, N, A) \
    typedef struct __attribute__((aligned(A))) N { T x, y; } N;
#define TD_SIMT_VEC3(T, N) \
    typedef struct N { T x, y, z; } N;
#define TD_SIMT_VEC4(T, N, A) \
    typedef struct __attribute__((aligned(A))) N { T x, y, z, w; } N;

TD_SIMT_VEC1(signed char, char1)
TD_SIMT_VEC2(signed char, char2, 2)
TD_SIMT_VEC3(signed char, char3)
TD_SIMT_VEC4(signed char, char4, 4)
TD_SIMT_VEC1(unsigned char, uchar1)
TD_SIMT_VEC2(unsigned char, uchar2, 2)
TD_SIMT_VEC3(unsigned char, uchar3)
TD_SIMT_VEC4(unsigned char, uchar4, 4)
TD_SIMT_VEC1(short, short1)
TD_SIMT_VEC2(short, short2, 4)
TD_SIMT_VEC3(short, short3)
TD_SIMT_VEC4(short, short4, 8)
TD_SIMT_VEC1(unsigned short, ushort1)
TD_SIMT_VEC2(unsigned short, ushort2, 4)
TD_SIMT_VEC3(unsigned short, ushort3)
TD_SIMT_VEC4(unsigned short, ushort4, 8)
TD_SIMT_VEC1(int, int1)
TD_SIMT_VEC2(int, int2, 8)
TD_SIMT_VEC3(int, int3)
TD_SIMT_VEC4(int, int4, 16)
TD_SIMT_VEC1(unsigned int, uint1)
TD_SIMT_VEC2(unsigned int, uint2, 8)
TD_SIMT_VEC3(unsigned int, uint3)
TD_SIMT_VEC4(unsigned int, uint4, 16)
TD_SIMT_VEC1(long long, longlong1)
TD_SIMT_VEC2(long long, longlong2, 16)
TD_SIMT_VEC1(unsigned long long, ulonglong1)
TD_SIMT_VEC2(unsigned long long, ulonglong2, 16)
TD_SIMT_VEC1(float, float1)
TD_SIMT_VEC2(float, float2, 8)
TD_SIMT_VEC3(float, float3)
TD_SIMT_VEC4(float, float4, 16)
TD_SIMT_VEC1(double, double1)
TD_SIMT_VEC2(double, double2, 16)

#undef TD_SIMT_VEC1
#undef TD_SIMT_VEC2
#undef TD_SIMT_VEC3
#undef TD_SIMT_VEC4

/* Grid and block shapes; C++ gives them CUDA's constructors (unset
 * dimensions are 1). */
struct dim3 {
    unsigned int x, y, z;
#ifdef __cplusplus
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{ x, y, z }; }
#endif
};
typedef struct dim3 dim3;

#define TD_SIMT_MAKE2(T, N) \
    static inline N make_##N(T x, T y) { N v; v.x = x; v.y = y; return v; }
#define TD_SIMT_MAKE4(T, N) \
    static inline N make_##N(T x, T y, T z, T w) \
    { N v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
TD_SIMT_MAKE2(int, int2)
TD_SIMT_MAKE4(int, int4)
TD_SIMT_MAKE2(unsigned int, uint2)
TD_SIMT_MAKE4(unsigned int, uint4)
TD_SIMT_MAKE2(float, float2)
TD_SIMT_MAKE4(float, float4)
TD_SIMT_MAKE2(unsigned short, ushort2)
TD_SIMT_MAKE4(unsigned short, ushort4)
TD_SIMT_MAKE4(unsigned char, uchar4)
#undef TD_SIMT_MAKE2
#undef TD_SIMT_MAKE4

static inline uint3
make_uint3(unsigned int x, unsigned int y, unsigned int z)
{
    uint3 v;
    v.x = x;
    v.y = y;
    v.z = z;
    return v;
}

#endif
