/* kernels/cuda/emu/simt.cc — the SIMT emulation's engine: a launch's grid
 * runs block by block on a pool of host threads; a block's threads are
 * fibers (fiber.c) that switch at __syncthreads and at warp collectives;
 * shared memory is one allocation per buffer per block, with the race
 * checker's shadow; the bug catchers report here. The runtime API around it
 * (streams, memory, graphs) is runtime.cc; docs/kernels.md has the model. */
#include "simt_emu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "fiber.h"
#include "td_simt_device.h"

namespace td_simt {

thread_local tls_s tls;

/* ---- settings ----------------------------------------------------------------- */

static std::atomic<unsigned> opt_threads{ 0 };   /* 0: not chosen yet */
static std::atomic<int> opt_racecheck{ -1 };     /* -1: $TD_SIMT_RACECHECK, default on */

static unsigned
env_unsigned(const char *name, unsigned dflt, unsigned lo, unsigned hi)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return dflt;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    return *end == '\0' && v >= lo && v <= hi ? (unsigned)v : dflt;
}

static unsigned
threads_wanted()
{
    unsigned n = opt_threads.load();
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = env_unsigned("TD_SIMT_THREADS", cpus > 0 ? (unsigned)cpus : 1, 1, 256);
        opt_threads.store(n);
    }
    return n;
}

static bool
racecheck_on()
{
    int v = opt_racecheck.load();
    if (v < 0) {
        v = (int)env_unsigned("TD_SIMT_RACECHECK", 1, 0, 1);
        opt_racecheck.store(v);
    }
    return v != 0;
}

/* Fiber stacks: kernels keep their registers and local arrays there. ASan's
 * redzones make frames several times larger. */
static size_t
stack_bytes()
{
#if defined(__SANITIZE_ADDRESS__)
    unsigned dflt = 512;
#else
    unsigned dflt = 128;
#endif
    static size_t b = (size_t)env_unsigned("TD_SIMT_STACK_KB", dflt, 16, 65536) * 1024;
    return b;
}

/* ---- the state of a block ---------------------------------------------------- */

enum class tstate : uint8_t { run, bar, coll, done };

struct coll_s {
    bool used;
    coll_fn fn;
    const char *what, *file;
    int line;
    unsigned mask, arrived;
    void *args[32];
};

struct thread_s {
    td_simt_fiber_t fiber;
    uint3 idx;
    unsigned tid, lane, warp;
    tstate state;
    const char *file;          /* where it waits */
    int line;
    const char *what;
};

struct warp_s {
    coll_s pend[32];
    uint16_t syncgen;          /* completed __syncwarp calls */
    unsigned exists;           /* lanes that are threads of the block */
};

/* The race checker's record of one byte of shared memory in the current
 * barrier interval (gen: the block's barrier count + 1 when it was made). */
struct shadow_s {
    uint32_t wgen;
    uint16_t wtid, wsync;      /* last writer and its warp's __syncwarp count */
    uint32_t rgen;
    uint16_t rtid, rsync;      /* reader: a thread, RD_WARP | warp, or RD_MANY */
};
static const uint16_t RD_WARP = 0x8000, RD_MANY = 0xffff;

struct shared_entry {
    unsigned id;
    shared_buf buf;
};

struct launch_state {
    const launch_desc *L;
    std::atomic<uint64_t> next{ 0 };
    uint64_t nblocks;
    std::atomic<unsigned> reports{ 0 };
};

struct block_s {
    const launch_desc *L = nullptr;
    launch_state *LS = nullptr;
    unsigned n = 0, nwarps = 0;
    std::vector<thread_s> th;
    std::vector<warp_s> warps;
    unsigned bar_arrived = 0, exited = 0;
    uint32_t gen = 1;
    std::vector<std::unique_ptr<shared_entry>> shared;
    std::unique_ptr<shared_entry> dyn;
    size_t shared_bytes = 0;
    std::vector<unsigned> runq;
    size_t rq_head = 0;
    td_simt_fiber_t host;
    bool aborted = false;
    bool racecheck = true;

    ~block_s()
    {
        for (thread_s &t : th)
            td_simt_fiber_free(&t.fiber);
    }
};

static thread_local std::unique_ptr<block_s> worker_block;

/* ---- reports ------------------------------------------------------------------- */

static std::atomic<unsigned long> reports_total{ 0 };
static const unsigned REPORTS_SHOWN = 8;   /* per launch; the rest are counted */

void
report(const char *fmt, ...)
{
    block_s *B = tls.blk;
    char msg[768], line[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    reports_total++;
    unsigned k = B != nullptr ? B->LS->reports++ : 0;
    if (k >= REPORTS_SHOWN)
        return;
    if (B == nullptr)
        snprintf(line, sizeof(line), "simt: %s", msg);
    else if (tls.self != nullptr)
        snprintf(line, sizeof(line), "simt: %s block (%u,%u,%u) thread (%u,%u,%u): %s%s",
                 B->L->name, tls.bid.x, tls.bid.y, tls.bid.z, tls.self->idx.x,
                 tls.self->idx.y, tls.self->idx.z, msg,
                 k + 1 == REPORTS_SHOWN ? " (further reports of this launch are counted only)"
                                        : "");
    else
        snprintf(line, sizeof(line), "simt: %s block (%u,%u,%u): %s", B->L->name, tls.bid.x,
                 tls.bid.y, tls.bid.z, msg);
    td_simt_emit(line);
}

/* ---- fibers and scheduling ------------------------------------------------------ */

static void
yield(thread_s *t)
{
    td_simt_fiber_switch(&t->fiber, &tls.blk->host);
}

/* Stop the block: the scheduler resumes no thread of it again. */
[[noreturn]] static void
abort_block(thread_s *t)
{
    tls.blk->aborted = true;
    td_simt_fiber_exit(&t->fiber, &tls.blk->host);
    abort();   /* never resumed */
}

static void
wake(block_s *B, thread_s *t)
{
    t->state = tstate::run;
    B->runq.push_back(t->tid);
}

static void
thread_main(void *arg)
{
    thread_s *t = static_cast<thread_s *>(arg);
    block_s *B = tls.blk;

    B->L->invoke(B->L->args.get());
    t->state = tstate::done;
    B->exited++;
    td_simt_fiber_exit(&t->fiber, &B->host);
    abort();
}

unsigned
active_lanes()
{
    block_s *B = tls.blk;
    unsigned w = tls.self->warp, m = 0;
    for (unsigned l = 0; l < 32; l++) {
        unsigned t = w * 32 + l;
        if (t < B->n && B->th[t].state != tstate::done)
            m |= 1u << l;
    }
    return m;
}

/* ---- __syncthreads ------------------------------------------------------------------ */

void
syncthreads(const char *file, int line)
{
    thread_s *t = tls.self;
    block_s *B = tls.blk;

    t->state = tstate::bar;
    t->file = file;
    t->line = line;
    if (++B->bar_arrived < B->n) {
        yield(t);
        return;
    }
    for (unsigned i = 0; i < B->n; i++) {
        thread_s &o = B->th[i];
        if (o.line != line || strcmp(o.file, file) != 0) {
            report("divergent barrier: thread %u waits at %s:%d, thread %u at %s:%d", o.tid,
                   o.file, o.line, t->tid, file, line);
            break;
        }
    }
    B->bar_arrived = 0;
    B->gen++;
    for (unsigned i = 0; i < B->n; i++)
        if (i != t->tid)
            wake(B, &B->th[i]);
    t->state = tstate::run;
}

/* ---- warp collectives -------------------------------------------------------------- */

/* The pending collective of t's warp with this mask, or a new one. Groups of
 * lanes with other masks may have collectives of their own pending at the
 * same time (divergent halves of a warp); a lane whose mask disagrees with
 * its partners' waits in a collective of its own, which never completes,
 * and block_stuck reports it. */
static coll_s *
collective_find(warp_s &w, coll_fn fn, const char *what, unsigned mask, const char *file,
                int line)
{
    coll_s *freec = nullptr;
    for (coll_s &c : w.pend) {
        if (c.used && c.mask == mask)
            return &c;
        if (!c.used && freec == nullptr)
            freec = &c;
    }
    freec->used = true;
    freec->fn = fn;
    freec->what = what;
    freec->file = file;
    freec->line = line;
    freec->mask = mask;
    freec->arrived = 0;
    return freec;
}

void
collective(coll_fn fn, const char *what, unsigned mask, void *arg, const char *file, int line)
{
    thread_s *t = tls.self;
    block_s *B = tls.blk;
    warp_s &w = B->warps[t->warp];
    unsigned me = 1u << t->lane;

    if (!(mask & me)) {
        report("%s at %s:%d: the calling lane %u is not in its mask 0x%08x", what, file, line,
               t->lane, mask);
        mask |= me;
    }
    coll_s *c = collective_find(w, fn, what, mask, file, line);
    if (c->fn != fn) {
        report("lanes of warp %u meet at different collectives: %s at %s:%d and %s at %s:%d",
               t->warp, c->what, c->file, c->line, what, file, line);
        abort_block(t);
    }
    c->args[t->lane] = arg;
    c->arrived |= me;
    if (c->arrived != c->mask) {
        t->state = tstate::coll;
        t->file = file;
        t->line = line;
        t->what = what;
        yield(t);
        return;
    }
    fn(c->args, c->mask);
    if (fn == syncwarp_fn)
        w.syncgen++;
    for (unsigned l = 0; l < 32; l++)
        if ((c->mask >> l & 1) && l != t->lane)
            wake(B, &B->th[t->warp * 32 + l]);
    c->used = false;
}

/* PTX ISA, shfl.sync: lane j = f(lane, b) within the lane's segment, or the
 * lane itself when j falls outside it; reading a lane outside the mask is
 * undefined on a GPU and reported here. */
template <int MODE>
void
shfl_fn(void *const args[32], unsigned mask)
{
    for (unsigned lane = 0; lane < 32; lane++) {
        if (!(mask >> lane & 1))
            continue;
        shfl_arg *a = static_cast<shfl_arg *>(args[lane]);
        unsigned b = a->b, cval = a->c & 31, seg = (a->c >> 8) & 31;
        unsigned maxl = (lane & seg) | (cval & ~seg), minl = lane & seg, j;
        bool in;
        switch (MODE) {
        case SHFL_UP:   j = lane - b; in = (int)j >= (int)maxl; break;
        case SHFL_DOWN: j = lane + b; in = j <= maxl; break;
        case SHFL_BFLY: j = lane ^ b; in = j <= maxl; break;
        default:        j = minl | (b & ~seg); in = j <= maxl; break;
        }
        if (!in)
            j = lane;
        if (!(mask >> j & 1)) {
            report("shuffle: lane %u reads lane %u, which is not in the mask 0x%08x", lane, j,
                   mask);
            j = lane;
        }
        a->out = static_cast<shfl_arg *>(args[j])->v;
    }
}
template void shfl_fn<SHFL_UP>(void *const *, unsigned);
template void shfl_fn<SHFL_DOWN>(void *const *, unsigned);
template void shfl_fn<SHFL_BFLY>(void *const *, unsigned);
template void shfl_fn<SHFL_IDX>(void *const *, unsigned);

void
ballot_fn(void *const args[32], unsigned mask)
{
    unsigned bits = 0;
    for (unsigned l = 0; l < 32; l++)
        if ((mask >> l & 1) && static_cast<vote_arg *>(args[l])->pred)
            bits |= 1u << l;
    for (unsigned l = 0; l < 32; l++)
        if (mask >> l & 1)
            static_cast<vote_arg *>(args[l])->out = bits;
}

void
syncwarp_fn(void *const *, unsigned)
{
}

template <int OP>
void
reduce_fn(void *const args[32], unsigned mask)
{
    uint32_t r = 0;
    bool first = true;
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask >> l & 1))
            continue;
        uint32_t v = static_cast<reduce_arg *>(args[l])->v;
        if (first) {
            r = v;
            first = false;
            continue;
        }
        switch (OP) {
        case RED_ADD:  r += v; break;
        case RED_MIN:  r = (int32_t)v < (int32_t)r ? v : r; break;
        case RED_MAX:  r = (int32_t)v > (int32_t)r ? v : r; break;
        case RED_UMIN: r = v < r ? v : r; break;
        case RED_UMAX: r = v > r ? v : r; break;
        case RED_AND:  r &= v; break;
        case RED_OR:   r |= v; break;
        default:       r ^= v; break;
        }
    }
    for (unsigned l = 0; l < 32; l++)
        if (mask >> l & 1)
            static_cast<reduce_arg *>(args[l])->out = r;
}
template void reduce_fn<RED_ADD>(void *const *, unsigned);
template void reduce_fn<RED_MIN>(void *const *, unsigned);
template void reduce_fn<RED_MAX>(void *const *, unsigned);
template void reduce_fn<RED_UMIN>(void *const *, unsigned);
template void reduce_fn<RED_UMAX>(void *const *, unsigned);
template void reduce_fn<RED_AND>(void *const *, unsigned);
template void reduce_fn<RED_OR>(void *const *, unsigned);
template void reduce_fn<RED_XOR>(void *const *, unsigned);

/* ---- shared memory ------------------------------------------------------------------ */

/* Per-block limit of shared memory (static and dynamic) on sm_90 and sm_100. */
static const size_t SHARED_LIMIT = 227 * 1024;

static std::atomic<unsigned> shared_decls{ 0 };

shared_decl::shared_decl(const char *n, size_t b, size_t a)
    : name(n), bytes(b), align(a), id(shared_decls++)
{
}

/* A fresh buffer: its own allocation (ASan sees its bounds), 0xff bytes. */
static std::unique_ptr<shared_entry>
shared_make(block_s *B, unsigned id, const char *name, size_t bytes, size_t align)
{
    auto e = std::make_unique<shared_entry>();
    size_t n = bytes ? bytes : 1;
    e->id = id;
    e->buf.name = name;
    e->buf.bytes = bytes;
    e->buf.base = static_cast<unsigned char *>(
        align <= 16 ? malloc(n) : aligned_alloc(align, (n + align - 1) / align * align));
    e->buf.shadow = B->racecheck ? calloc(n, sizeof(shadow_s)) : nullptr;
    if (e->buf.base == nullptr || (B->racecheck && e->buf.shadow == nullptr)) {
        td_simt_log_error("simt: out of host memory for shared memory");
        abort();
    }
    memset(e->buf.base, 0xff, n);
    B->shared_bytes += bytes;
    if (B->shared_bytes > SHARED_LIMIT)
        report("shared memory of the block (%zu bytes with %s) exceeds the %zu bytes a "
               "block may have", B->shared_bytes, name, SHARED_LIMIT);
    return e;
}

static void
shared_free(std::unique_ptr<shared_entry> &e)
{
    if (e == nullptr)
        return;
    free(e->buf.base);
    free(e->buf.shadow);
    e.reset();
}

shared_buf *
shared_decl::buf() const
{
    block_s *B = tls.blk;
    for (auto &e : B->shared)
        if (e->id == id)
            return &e->buf;
    B->shared.push_back(shared_make(B, id, name, bytes, align));
    return &B->shared.back()->buf;
}

shared_buf *
dynamic_buf(const char *name)
{
    block_s *B = tls.blk;
    if (B->dyn == nullptr)
        B->dyn = shared_make(B, ~0u, name, B->L->smem, 128);
    return &B->dyn->buf;
}

/* Whether two accesses, by thread a (its warp's __syncwarp count then: sync)
 * and by t now, are ordered: same thread, or same warp with a __syncwarp
 * between. (A barrier between them changes gen, checked by the caller.) */
static bool
ordered(block_s *B, unsigned a, uint16_t sync, const thread_s *t)
{
    if (a == t->tid)
        return true;
    return a / 32 == t->warp && sync != B->warps[t->warp].syncgen;
}

static const char *
access_name(int kind)
{
    return kind == ACC_WRITE ? "write" : kind == ACC_READ ? "read" : "atomic";
}

/* The race check of one byte; false (and one report) on a conflict. */
static bool
race_byte(block_s *B, shared_buf *b, size_t i, int kind, const thread_s *t)
{
    shadow_s &s = static_cast<shadow_s *>(b->shadow)[i];
    uint16_t sync = B->warps[t->warp].syncgen;
    unsigned other = ~0u;
    const char *what = "wrote";

    if (s.wgen == B->gen && !ordered(B, s.wtid, s.wsync, t))
        other = s.wtid;
    if (kind == ACC_WRITE && other == ~0u && s.rgen == B->gen) {
        what = "read";
        if (s.rtid == RD_MANY)
            other = s.rtid;
        else if (s.rtid & RD_WARP)
            other = (s.rtid & 0x7fff) == t->warp && s.rsync != sync ? ~0u : s.rtid;
        else if (!ordered(B, s.rtid, s.rsync, t))
            other = s.rtid;
    }
    if (other != ~0u) {
        char who[64];
        if (other == RD_MANY)
            snprintf(who, sizeof(who), "threads of several warps");
        else if (other & RD_WARP)
            snprintf(who, sizeof(who), "threads of warp %u", other & 0x7fff);
        else
            snprintf(who, sizeof(who), "thread %u", other);
        report("shared memory race on %s byte %zu: this %s follows %s that %s it since the "
               "last barrier (a missing __syncthreads?)", b->name, i, access_name(kind), who,
               what);
        return false;
    }
    if (kind == ACC_WRITE) {
        s.wgen = B->gen;
        s.wtid = (uint16_t)t->tid;
        s.wsync = sync;
        s.rgen = 0;
    } else if (s.rgen != B->gen || s.rtid == t->tid) {
        s.rgen = B->gen;
        s.rtid = (uint16_t)t->tid;
        s.rsync = sync;
    } else if (s.rtid != RD_MANY) {
        unsigned w = s.rtid & RD_WARP ? s.rtid & 0x7fff : s.rtid / 32u;
        s.rtid = w == t->warp ? (uint16_t)(RD_WARP | w) : RD_MANY;
        s.rsync = sync;
    }
    return true;
}

bool
shared_access(shared_buf *b, size_t off, size_t len, size_t align, int kind)
{
    if (off > b->bytes || len > b->bytes - off) {
        report("shared %s: %s of %zu bytes at byte %lld, outside its %zu bytes", b->name,
               access_name(kind), len, (long long)off, b->bytes);
        return false;
    }
    if ((uintptr_t)(b->base + off) % align != 0) {
        report("shared %s: %s of %zu bytes at byte %zu is not aligned to %zu", b->name,
               access_name(kind), len, off, align);
        return false;
    }
    block_s *B = tls.blk;
    if (kind == ACC_ATOMIC || b->shadow == nullptr)
        return true;
    for (size_t i = off; i < off + len; i++)
        if (!race_byte(B, b, i, kind, tls.self))
            break;
    return true;
}

void
check_aligned(const void *p, size_t align, const char *what)
{
    if ((uintptr_t)p % align != 0)
        report("%s at %p is not aligned to %zu bytes (a misaligned address fault on a GPU)",
               what, p, align);
}

/* ---- running a block --------------------------------------------------------------- */

static void
block_setup(block_s *B, const launch_desc &L, launch_state *LS, uint64_t lin)
{
    dim3 g = L.grid, bd = L.block;
    B->L = &L;
    B->LS = LS;
    B->n = bd.x * bd.y * bd.z;
    B->nwarps = (B->n + 31) / 32;
    B->bar_arrived = B->exited = 0;
    B->gen = 1;
    B->aborted = false;
    B->racecheck = racecheck_on();
    B->shared_bytes = 0;
    B->runq.clear();
    B->rq_head = 0;
    if (B->th.size() < B->n) {
        size_t old = B->th.size();
        B->th.resize(B->n);
        for (size_t i = old; i < B->n; i++)
            if (td_simt_fiber_alloc(&B->th[i].fiber, stack_bytes()) != 0) {
                td_simt_log_error("simt: cannot map a fiber stack");
                abort();
            }
    }
    B->warps.assign(B->nwarps, warp_s{});
    tls.bid = make_uint3((unsigned)(lin % g.x), (unsigned)(lin / g.x % g.y),
                         (unsigned)(lin / ((uint64_t)g.x * g.y)));
    tls.bdim = bd;
    tls.gdim = g;
    tls.blk = B;
    for (unsigned i = 0; i < B->n; i++) {
        thread_s &t = B->th[i];
        t.idx = make_uint3(i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y));
        t.tid = i;
        t.lane = i % 32;
        t.warp = i / 32;
        t.state = tstate::run;
        t.file = "";
        t.line = 0;
        t.what = "";
        B->warps[t.warp].exists |= 1u << t.lane;
        td_simt_fiber_prepare(&t.fiber, &B->host, thread_main, &t);
        B->runq.push_back(i);
    }
}

/* Why the block cannot go on: its barrier or a warp collective waits for
 * threads that exited or wait elsewhere. */
static void
block_stuck(block_s *B)
{
    unsigned atbar = 0;
    const thread_s *bar = nullptr;
    for (unsigned i = 0; i < B->n; i++)
        if (B->th[i].state == tstate::bar) {
            atbar++;
            bar = bar ? bar : &B->th[i];
        }
    for (unsigned wi = 0; wi < B->nwarps; wi++) {
        for (const coll_s &c : B->warps[wi].pend) {
            if (!c.used)
                continue;
            unsigned missing = c.mask & ~c.arrived, l = (unsigned)__builtin_ctz(missing);
            char why[160];
            if (!(B->warps[wi].exists >> l & 1)) {
                snprintf(why, sizeof(why), "is not a thread of the block (%u threads)", B->n);
            } else {
                const thread_s &o = B->th[wi * 32 + l];
                if (o.state == tstate::done)
                    snprintf(why, sizeof(why), "has exited");
                else if (o.state == tstate::bar)
                    snprintf(why, sizeof(why), "waits at __syncthreads at %s:%d", o.file, o.line);
                else
                    snprintf(why, sizeof(why), "waits in %s at %s:%d", o.what, o.file, o.line);
            }
            report("%s at %s:%d (warp %u, mask 0x%08x) never completes: lane %u %s", c.what,
                   c.file, c.line, wi, c.mask, l, why);
            return;
        }
    }
    if (bar != nullptr)
        report("barrier at %s:%d reached by %u of %u threads; %u exited without reaching it",
               bar->file, bar->line, atbar, B->n, B->exited);
}

static void
run_block(block_s *B, const launch_desc &L, launch_state *LS, uint64_t lin)
{
    block_setup(B, L, LS, lin);
    while (B->rq_head < B->runq.size() && !B->aborted) {
        thread_s *t = &B->th[B->runq[B->rq_head++]];
        if (B->rq_head == B->runq.size()) {   /* drained: start over (t may push) */
            B->runq.clear();
            B->rq_head = 0;
        }
        tls.self = t;
        tls.tid = &t->idx;
        td_simt_fiber_switch(&B->host, &t->fiber);
    }
    tls.self = nullptr;
    if (!B->aborted && B->exited != B->n)
        block_stuck(B);
    for (unsigned i = 0; i < B->n; i++)
        if (B->th[i].state != tstate::done)
            td_simt_fiber_forget(&B->th[i].fiber);
    for (auto &e : B->shared)
        shared_free(e);
    B->shared.clear();
    shared_free(B->dyn);
    tls.blk = nullptr;
}

static void
run_blocks(launch_state *LS)
{
    if (worker_block == nullptr)
        worker_block = std::make_unique<block_s>();
    for (;;) {
        uint64_t b = LS->next++;
        if (b >= LS->nblocks)
            break;
        run_block(worker_block.get(), *LS->L, LS, b);
    }
}

/* ---- the pool of host threads ------------------------------------------------------
 * Plain pthreads, so that a forked child can forget them (pthread_atfork). */

struct pool_s {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
    unsigned helpers = 0;        /* started */
    uint64_t gen = 0;            /* grids handed out */
    launch_state *job = nullptr;
    unsigned running = 0;        /* helpers still on the current grid */
    bool busy = false;           /* a grid is being run */
};
static pool_s pool;

static void *
helper_main(void *)
{
    uint64_t seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.gen == seen)
            pthread_cond_wait(&pool.go, &pool.mu);
        seen = pool.gen;
        launch_state *LS = pool.job;
        pthread_mutex_unlock(&pool.mu);
        run_blocks(LS);
        pthread_mutex_lock(&pool.mu);
        if (--pool.running == 0)
            pthread_cond_broadcast(&pool.done);
    }
    return nullptr;
}

static void
pool_after_fork()
{
    new (&pool) pool_s();
}

/* Start helpers up to want - 1 (the caller is the other one). */
static unsigned
pool_grow(unsigned want)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] { pthread_atfork(nullptr, nullptr, pool_after_fork); });
    while (pool.helpers + 1 < want) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &at, helper_main, nullptr);
        pthread_attr_destroy(&at);
        if (rc != 0)
            break;
        pool.helpers++;
    }
    return pool.helpers;
}

}  // namespace td_simt

using namespace td_simt;

/* Run a launch's grid now, on the pool when it is free (else in the caller
 * alone); the number of reports its blocks made. */
unsigned
td_simt_run_grid(const launch_desc &L)
{
    launch_state LS;
    LS.L = &L;
    LS.nblocks = (uint64_t)L.grid.x * L.grid.y * L.grid.z;
    tls_s saved = tls;

    pthread_mutex_lock(&pool.mu);
    bool par = !pool.busy && LS.nblocks > 1 && threads_wanted() > 1;
    if (par) {
        pool.busy = true;
        unsigned h = pool_grow(threads_wanted());
        pool.job = &LS;
        pool.running = h;
        pool.gen++;
        pthread_cond_broadcast(&pool.go);
    }
    pthread_mutex_unlock(&pool.mu);
    run_blocks(&LS);
    if (par) {
        pthread_mutex_lock(&pool.mu);
        while (pool.running > 0)
            pthread_cond_wait(&pool.done, &pool.mu);
        pool.busy = false;
        pool.job = nullptr;
        pthread_mutex_unlock(&pool.mu);
    }
    tls = saved;
    unsigned r = LS.reports.load();
    if (r > REPORTS_SHOWN) {
        char line[256];
        snprintf(line, sizeof(line), "simt: %s: %u reports in all", L.name, r);
        td_simt_emit(line);
    }
    return r;
}

static td_simt_line_fn capture_fn;
static void *capture_arg;
static pthread_mutex_t emit_mu = PTHREAD_MUTEX_INITIALIZER;

extern "C" void
td_simt_capture(td_simt_line_fn fn, void *arg)
{
    pthread_mutex_lock(&emit_mu);
    capture_fn = fn;
    capture_arg = arg;
    pthread_mutex_unlock(&emit_mu);
}

extern "C" void
td_simt_emit(const char *line)
{
    pthread_mutex_lock(&emit_mu);
    if (capture_fn != nullptr)
        capture_fn(line, capture_arg);
    else
        td_simt_log_error(line);
    pthread_mutex_unlock(&emit_mu);
}

extern "C" void
td_simt_set_threads(unsigned n)
{
    opt_threads.store(n >= 1 && n <= 256 ? n : 1);
}

extern "C" void
td_simt_set_racecheck(int on)
{
    opt_racecheck.store(on ? 1 : 0);
}

extern "C" unsigned long
td_simt_reports(void)
{
    return reports_total.load();
}
