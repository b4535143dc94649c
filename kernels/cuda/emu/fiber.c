/* kernels/cuda/emu/fiber.c — fibers for the SIMT emulation: stacks with a
 * guard page, and the switch (x86-64: callee-saved registers, MXCSR and the
 * x87 control word pushed on the old stack, the stack pointer swapped; else
 * swapcontext). */
#include "fiber.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define TD_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TD_SIMT_ASAN 1
#endif
#endif
#ifdef TD_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

int
td_simt_fiber_alloc(td_simt_fiber_t *f, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = (bytes + page - 1) / page * page;

    memset(f, 0, sizeof(*f));
    void *m = mmap(NULL, size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return -1;
    if (mprotect(m, page, PROT_NONE) != 0) {  /* the guard: an overflow faults */
        munmap(m, size + page);
        return -1;
    }
    f->map = m;
    f->map_bytes = size + page;
    f->lo = (char *)m + page;
    f->size = size;
    return 0;
}

void
td_simt_fiber_forget(td_simt_fiber_t *f)
{
#ifdef TD_SIMT_ASAN
    __asan_unpoison_memory_region(f->lo, f->size);
#else
    (void)f;
#endif
}

void
td_simt_fiber_free(td_simt_fiber_t *f)
{
    if (f->map != NULL)
        munmap(f->map, f->map_bytes);
    memset(f, 0, sizeof(*f));
}

/* ---- the switch -------------------------------------------------------------- */

#ifndef TD_SIMT_UCONTEXT
/* td_simt_fiber_swap(void **save_sp, void *load_sp): push the callee-saved
 * registers and the floating-point control state, save rsp, load the other
 * rsp, pop its state, return into it. td_simt_fiber_boot is where a prepared
 * stack returns to first: fn (r12) is called with arg (r13). */
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".type td_simt_fiber_swap, @function\n"
    "td_simt_fiber_swap:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    "    stmxcsr (%rsp)\n"
    "    fnstcw 4(%rsp)\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    ldmxcsr (%rsp)\n"
    "    fldcw 4(%rsp)\n"
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size td_simt_fiber_swap, .-td_simt_fiber_swap\n"
    ".p2align 4\n"
    ".type td_simt_fiber_boot, @function\n"
    "td_simt_fiber_boot:\n"
    "    movq %r13, %rdi\n"
    "    callq *%r12\n"
    "    ud2\n"
    ".size td_simt_fiber_boot, .-td_simt_fiber_boot\n");

void td_simt_fiber_swap(void **save_sp, void *load_sp);
void td_simt_fiber_boot(void);
#else
static __thread td_simt_fiber_t *fiber_booting;
#endif

#ifdef TD_SIMT_ASAN
/* The first code a fiber runs: tell ASan the switch into it is done. */
static void
fiber_first(void *arg)
{
    td_simt_fiber_t *f = arg;
    const void *lo;
    size_t size;
    __sanitizer_finish_switch_fiber(NULL, &lo, &size);
    f->owner->lo = (void *)lo;
    f->owner->size = size;
    f->fn(f->arg);
}
#endif

#ifdef TD_SIMT_UCONTEXT
static void
fiber_uc_entry(void)
{
    td_simt_fiber_t *f = fiber_booting;
#ifdef TD_SIMT_ASAN
    fiber_first(f);
#else
    f->fn(f->arg);
#endif
}
#endif

void
td_simt_fiber_prepare(td_simt_fiber_t *f, td_simt_fiber_t *owner, void (*fn)(void *),
                      void *arg)
{
    void (*entry)(void *) = fn;
    void *entry_arg = arg;

    f->fn = fn;
    f->arg = arg;
    f->owner = owner;
    f->fake_stack = NULL;
#ifdef TD_SIMT_ASAN
    /* The frames of the last run's way out (thread end -> switch) never
     * returned: their redzones are still poisoned where the next run's
     * frames go, which set only their own redzones. Fibers that never
     * ended are cleared whole (td_simt_fiber_forget). */
    size_t clear = f->size < 65536 ? f->size : 65536;
    __asan_unpoison_memory_region((char *)f->lo + f->size - clear, clear);
    entry = fiber_first;
    entry_arg = f;
#endif
#ifndef TD_SIMT_UCONTEXT
    uintptr_t top = ((uintptr_t)f->lo + f->size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 80);
    uint32_t mxcsr;
    uint16_t fcw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fcw));
    sp[0] = (uint64_t)mxcsr | ((uint64_t)fcw << 32);
    sp[1] = 0;                                /* r15 */
    sp[2] = 0;                                /* r14 */
    sp[3] = (uint64_t)(uintptr_t)entry_arg;   /* r13 */
    sp[4] = (uint64_t)(uintptr_t)entry;       /* r12 */
    sp[5] = 0;                                /* rbx */
    sp[6] = 0;                                /* rbp: the end of backtraces */
    sp[7] = (uint64_t)(uintptr_t)td_simt_fiber_boot;
    f->sp = sp;    /* after the pops and ret, rsp = top - 16: aligned for the call */
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->lo;
    f->uc.uc_stack.ss_size = f->size;
    f->uc.uc_link = NULL;
    (void)entry;
    (void)entry_arg;
    makecontext(&f->uc, fiber_uc_entry, 0);
    f->sp = NULL;      /* not started: the first switch in sets fiber_booting */
#endif
}

static void
fiber_switch(td_simt_fiber_t *from, td_simt_fiber_t *to, int exiting)
{
#ifdef TD_SIMT_ASAN
    __sanitizer_start_switch_fiber(exiting ? NULL : &from->fake_stack, to->lo, to->size);
#else
    (void)exiting;
#endif
#ifndef TD_SIMT_UCONTEXT
    td_simt_fiber_swap(&from->sp, to->sp);
#else
    if (to->map != NULL && to->sp == NULL) {
        to->sp = to;
        fiber_booting = to;
    }
    swapcontext(&from->uc, &to->uc);
#endif
#ifdef TD_SIMT_ASAN
    const void *lo;
    size_t size;
    __sanitizer_finish_switch_fiber(from->fake_stack, &lo, &size);
    if (from->owner != NULL) {     /* back in a fiber: learn the host stack */
        from->owner->lo = (void *)lo;
        from->owner->size = size;
    }
#endif
}

void
td_simt_fiber_switch(td_simt_fiber_t *from, td_simt_fiber_t *to)
{
    fiber_switch(from, to, 0);
}

void
td_simt_fiber_exit(td_simt_fiber_t *from, td_simt_fiber_t *to)
{
    fiber_switch(from, to, 1);
}
