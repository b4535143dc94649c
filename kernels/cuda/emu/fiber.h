/* kernels/cuda/emu/fiber.h — the fibers the SIMT emulation runs a block's
 * threads on: a stack each and a switch between them. On x86-64 the switch
 * is a few instructions of our own (fiber.c); elsewhere, and with
 * -DTD_SIMT_UCONTEXT, it is POSIX ucontext. Under AddressSanitizer every
 * switch is announced to it. Why not ucontext everywhere: docs/kernels.md,
 * "Threads as fibers". */
#ifndef TD_SIMT_FIBER_H
#define TD_SIMT_FIBER_H

#include <stddef.h>

#if !defined(__x86_64__) && !defined(TD_SIMT_UCONTEXT)
#define TD_SIMT_UCONTEXT 1
#endif
#ifdef TD_SIMT_UCONTEXT
#include <ucontext.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A fiber, or (stack == NULL) the host thread that runs fibers. The owner
 * is the host thread's fiber every fiber switches back to. */
typedef struct td_simt_fiber {
    void *sp;                      /* saved stack pointer (x86-64 switch) */
#ifdef TD_SIMT_UCONTEXT
    ucontext_t uc;
#endif
    void *map;                     /* the mapping: a guard page, then the stack */
    size_t map_bytes;
    void *lo;                      /* usable stack [lo, lo + size) */
    size_t size;
    void (*fn)(void *);            /* what the fiber runs, once, never returning */
    void *arg;
    struct td_simt_fiber *owner;
    void *fake_stack;              /* AddressSanitizer's, while switched out */
} td_simt_fiber_t;

/* Map a stack of `bytes` (rounded up to pages) below a guard page; 0 on
 * success, -1 when mmap fails. */
int td_simt_fiber_alloc(td_simt_fiber_t *f, size_t bytes);
void td_simt_fiber_free(td_simt_fiber_t *f);
/* Forget what a fiber that was never finished left on its stack (the
 * shadow ASan keeps of its frames). */
void td_simt_fiber_forget(td_simt_fiber_t *f);

/* Make f start fn(arg) at its next switch-in; fn must never return (it
 * ends by switching away with td_simt_fiber_exit). The stack's old content
 * is forgotten. */
void td_simt_fiber_prepare(td_simt_fiber_t *f, td_simt_fiber_t *owner,
                           void (*fn)(void *), void *arg);

/* Save the running context in from, resume to. */
void td_simt_fiber_switch(td_simt_fiber_t *from, td_simt_fiber_t *to);
/* Like switch, for a fiber that will not be resumed before it is prepared again. */
void td_simt_fiber_exit(td_simt_fiber_t *from, td_simt_fiber_t *to);

#ifdef __cplusplus
}
#endif

#endif
