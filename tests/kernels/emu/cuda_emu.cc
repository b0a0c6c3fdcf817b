/*
** tests/kernels/emu/cuda_emu.cc: the CPU emulation of CUDA's execution model for the kernel
** tests (the model and what it reports: cuda_runtime.h here). Fibers switch with a few lines
** of x86-64 assembly (no system call per switch: a block of 256 threads that never waits costs
** 512 switches), on stacks of EMU_STACK bytes with a guard page below each.
*/
#include "cuda_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <map>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA emulation's fiber switch is written for x86-64"
#endif

#define EMU_STACK     (256 * 1024)      /* bytes of stack per thread (kernels keep arrays) */
#define EMU_PAGE      4096
#define EMU_SLOT      (EMU_STACK + 32 * 1024 + EMU_PAGE)  /* a stack, its colour, its guard */
#define MAX_THREADS   1024              /* per block */
#define MAX_GRID_YZ   65535
#define SMEM_DEFAULT  (48 * 1024)       /* dynamic shared memory without the attribute */
#define SMEM_OPTIN    (227 * 1024)      /* H100's largest, with cudaFuncSetAttribute */
#define WARP          32

/* emu_switch(&save, to): save the callee-saved registers and the stack pointer in *save, and
** continue on the stack 'to' (a previous save, or a new stack set up by fiber_start). */
extern "C" void emu_switch(void **save, void *to);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n"
    "    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n"
    "    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch, .-emu_switch\n");

namespace emu {

thread_state *cur;
uint3 block_idx;
dim3 block_dim, grid_dim;
float *dyn_smem;

enum wait_kind { READY, AT_BLOCK, AT_WARP, DONE };

struct fiber {
    thread_state ts;
    wait_kind state;
    void *sp;                 /* saved stack pointer while switched out */
    unsigned mask;            /* AT_WARP: the collective's mask */
    uint64_t value;           /* AT_WARP: the published bytes */
    uint64_t snap;            /* 'value' when the collective was released, read by the lanes */
    int kind_tag;             /* AT_WARP: which collective (exchange 1, sync 2) */
};

static char *stacks;                      /* MAX_THREADS stacks, each with a guard page below */
static std::vector<fiber> fibers;
static fiber *running;
static void *sched_sp;
static void (*body)(const void *);   /* the launch's thread body, and its argument */
static const void *body_ctx;
static const char *launch_what;
static std::map<const void *, int> max_smem;

[[noreturn]] static void die(const char *fmt, const char *detail)
{
    fprintf(stderr, "cuda_emu: %s (block %u,%u,%u): ", launch_what ? launch_what : "?",
            block_idx.x, block_idx.y, block_idx.z);
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

/* The running fiber stops (its state set): switch straight to the next READY fiber of the
** scheduler's round, or back to the scheduler at the round's end (one switch, not two). */
static void yield_next()
{
    fiber *me = running, *end = fibers.data() + fibers.size();
    for (fiber *f = me + 1; f < end; f++)
        if (f->state == READY) {
            running = f;
            cur = &f->ts;
            emu_switch(&me->sp, f->sp);
            return;
        }
    emu_switch(&me->sp, sched_sp);
}

static void fiber_main()
{
    body(body_ctx);
    running->state = DONE;
    yield_next();
    abort();                              /* never resumed */
}

/* Fiber i's stack starts STACK_COLOR(i) bytes (whole cache lines) below the top of its slot:
** the slots are a multiple of the page size apart, so the tops would all fall in one set of
** the L1 cache, and in 32 of the L2's: every switch to a fiber missed them (three quarters of
** a switch's time, and a fifth of a training step's on the emulation). */
#define STACK_COLOR(i) ((size_t)(i) * 67 % 512 * 64)

static void fiber_start(fiber &f, int i)
{
    char *top = stacks + (size_t)(i + 1) * EMU_SLOT - STACK_COLOR(i);
    void **sp = (void **)((uintptr_t)top & ~(uintptr_t)15);
    *--sp = nullptr;                      /* alignment: the entry's return slot at 16n + 8 */
    *--sp = (void *)fiber_main;           /* emu_switch's ret goes here */
    for (int r = 0; r < 6; r++) *--sp = nullptr;   /* rbp rbx r12 r13 r14 r15 */
    f.sp = sp;
    f.state = READY;
}

static void wait(wait_kind k)
{
    running->state = k;
    yield_next();
}

void sync_block() { wait(AT_BLOCK); }

static int lane_of(const fiber &f)
{
    return (int)((f.ts.tid.x + f.ts.tid.y * block_dim.x +
                  f.ts.tid.z * block_dim.x * block_dim.y) % WARP);
}

/*
** One wait per exchange: the release copies every waiting lane's published value to its snap,
** which the lanes read. A released lane runs (and reads) in the scheduler's next round, before
** any later release can overwrite a snap, so a lane that publishes again first is harmless.
*/
uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_of(int, int, int), int arg,
                       int width)
{
    fiber *me = running;
    size_t base = (size_t)(me - fibers.data()) / WARP * WARP;
    int lane = lane_of(*me);
    if (!(mask >> lane & 1u)) die("%s", "a warp shuffle whose mask leaves out its own lane");
    me->mask = mask;
    me->value = mine;
    me->kind_tag = 1;
    wait(AT_WARP);
    int src = src_of(lane, arg, width);
    uint64_t r = mine;
    if (src >= 0 && src != lane) {
        if (!(mask >> src & 1u)) die("%s", "a warp shuffle reads a lane its mask leaves out");
        r = fibers[base + src].snap;
    }
    return r;
}

void sync_warp(unsigned mask)
{
    int lane = lane_of(*running);
    if (!(mask >> lane & 1u)) die("%s", "__syncwarp whose mask leaves out its own lane");
    running->mask = mask;
    running->kind_tag = 2;
    wait(AT_WARP);
}

int lane_xor(int lane, int m, int width)
{
    int src = lane ^ m;
    return src / width == lane / width ? src : lane;
}
int lane_down(int lane, int d, int width)
{
    int src = lane + d;
    return src / width == lane / width ? src : lane;
}
int lane_up(int lane, int d, int width)
{
    int src = lane - d;
    return src >= 0 && src / width == lane / width ? src : lane;
}
int lane_idx(int lane, int s, int width) { return lane / width * width + s % width; }

void set_max_smem(const void *fn, int bytes)
{
    if (bytes < 0 || bytes > SMEM_OPTIN) {
        launch_what = "cudaFuncSetAttribute";
        die("%s", "MaxDynamicSharedMemorySize over the H100's 227 KiB");
    }
    max_smem[fn] = bytes;
}

/* Release what can be released in the block; false when nothing could (a deadlock). */
static bool release(size_t n)
{
    bool any = false, all_block = true, live = false;
    for (size_t w = 0; w < n; w += WARP) {
        size_t end = w + WARP < n ? w + WARP : n;
        unsigned waiting = 0, mask = 0;
        int tag = 0;
        for (size_t i = w; i < end; i++) {
            if (fibers[i].state != AT_WARP) continue;
            if (waiting && (fibers[i].mask != mask || fibers[i].kind_tag != tag))
                die("%s", "lanes of one warp wait at different warp collectives (or masks)");
            waiting |= 1u << (i - w);
            mask = fibers[i].mask;
            tag = fibers[i].kind_tag;
        }
        if (!waiting) continue;
        if (mask & ~waiting) {
            bool blocked = false;
            for (size_t i = w; i < end; i++)
                if ((mask >> (i - w) & 1u) && fibers[i].state == DONE)
                    die("%s", "a warp collective's mask names a lane that has exited");
                else if ((mask >> (i - w) & 1u) && fibers[i].state != AT_WARP)
                    blocked = true;
            if (blocked) continue;
            if ((size_t)(w + 32) > end && (mask >> (end - w)))
                die("%s", "a warp collective's mask names lanes past the block's last thread");
        }
        for (size_t i = w; i < end; i++)
            if (fibers[i].state == AT_WARP) {
                fibers[i].snap = fibers[i].value;
                fibers[i].state = READY;
            }
        any = true;
    }
    if (any) return true;
    for (size_t i = 0; i < n; i++) {
        if (fibers[i].state == DONE) continue;
        live = true;
        if (fibers[i].state != AT_BLOCK) all_block = false;
    }
    if (live && all_block) {
        for (size_t i = 0; i < n; i++)
            if (fibers[i].state == AT_BLOCK) fibers[i].state = READY;
        return true;
    }
    return !live;
}

void run(const char *what, const void *fn, dim3 grid, dim3 block, size_t smem,
         void (*b)(const void *), const void *ctx)
{
    launch_what = what;
    size_t n = (size_t)block.x * block.y * block.z;
    if (n == 0 || n > MAX_THREADS || block.z > 64)
        die("%s", "a block of 0 or more than 1024 threads (or z > 64)");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ)
        die("%s", "a grid with a zero dimension, or y or z over 65535");
    auto lim = max_smem.find(fn);
    if (smem > (size_t)(lim == max_smem.end() ? SMEM_DEFAULT : lim->second))
        die("%s", "dynamic shared memory over the kernel's limit (48 KiB unless raised with "
                  "cudaFuncSetAttribute)");
    if (!stacks) {
        size_t bytes = (size_t)MAX_THREADS * EMU_SLOT;
        stacks = (char *)mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (stacks == MAP_FAILED) die("%s", "no memory for the fiber stacks");
        for (int i = 0; i < MAX_THREADS; i++)
            mprotect(stacks + (size_t)i * EMU_SLOT, EMU_PAGE, PROT_NONE);
    }
    std::vector<float> shared(smem / sizeof(float) + 1);
    fibers.assign(n, fiber());
    body = b;
    body_ctx = ctx;
    grid_dim = grid;
    block_dim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
        block_idx = uint3{bx, by, bz};
        for (float &x : shared) x = NAN;
        dyn_smem = shared.data();
        for (size_t i = 0; i < n; i++) {
            fibers[i].ts.tid = uint3{(unsigned)(i % block.x), (unsigned)(i / block.x % block.y),
                                     (unsigned)(i / block.x / block.y)};
            fiber_start(fibers[i], (int)i);
        }
        for (;;) {
            /* a round: the first READY fiber runs, and each one that stops hands on to the
            ** next READY one (yield_next); the last returns here */
            bool ran = false;
            for (size_t i = 0; i < n && !ran; i++) {
                if (fibers[i].state != READY) continue;
                running = &fibers[i];
                cur = &fibers[i].ts;
                emu_switch(&sched_sp, fibers[i].sp);
                ran = true;
            }
            if (ran) continue;
            bool done = true;
            for (size_t i = 0; i < n; i++) done = done && fibers[i].state == DONE;
            if (done) break;
            if (!release(n))
                die("%s", "deadlock: threads wait at different barriers (a __syncthreads "
                          "some threads of the block never reach?)");
        }
    }
    running = nullptr;
    cur = nullptr;
    launch_what = nullptr;
}

} // namespace emu
