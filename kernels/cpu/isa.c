/* kernels/cpu/isa.c — which vector instructions the cpu ops may use, decided
 * once per process ($TD_CPU_ISA=portable turns them all off: the plain C
 * paths, which give the same bits). */
#include "cpu_ops.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static unsigned isa_flags;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void
isa_init(void)
{
    const char *e = getenv("TD_CPU_ISA");

    if (e != NULL && strcmp(e, "portable") == 0)
        return;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx"))
        isa_flags |= TD_KERNELS_CPU_AVX;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma"))
        isa_flags |= TD_KERNELS_CPU_AVX512;
#endif
}

unsigned
td_kernels_cpu_isa(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_flags;
}
