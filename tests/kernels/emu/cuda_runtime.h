/*
** tests/kernels/emu/cuda_runtime.h: the part of CUDA that lib/kernels_cuda.cu uses, emulated on
** the CPU so that the CUDA kernels' own code (their indexing, shared memory, barriers, warp
** shuffles, launch shapes) runs in `make test` on machines without a GPU. kernels_cuda.cu is
** compiled as C++ with -DGPT_CUDA_EMU and this directory first on the include path; the device
** pointers are then host pointers (the test links the CPU runtime's allocator).
**
** The model (tests/kernels/emu/cuda_emu.cc): the blocks of a launch run one after another; the
** threads of a block are fibers on one OS thread, each running until it exits or waits at a
** barrier (__syncthreads, or a warp collective: __shfl_*_sync, __syncwarp). A block barrier
** releases when every thread of the block that has not exited waits at it; a warp collective
** when every lane its mask names waits at one with the same mask. Anything else is reported
** and aborts, as a bug a GPU would turn into a hang or garbage: a deadlock (threads waiting at
** different barriers), a warp collective whose mask names a lane that has exited, masks that
** disagree, launch shapes or dynamic shared memory over the H100's limits. Dynamic shared
** memory starts as NaN in every block, so a read before a write shows in the results.
** Not modelled: timing, races between threads (a fiber runs alone until it waits), atomics.
*/
#ifndef GPT_CUDA_EMU_RUNTIME_H
#define GPT_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static       /* blocks run one after another: one copy serves them all */

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

namespace emu {

struct thread_state { uint3 tid; };
extern thread_state *cur;           /* the running fiber's */
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;
extern float *dyn_smem;             /* the block's dynamic shared memory */

void run(const char *what, const void *fn, dim3 grid, dim3 block, size_t smem,
         const std::function<void()> &body);
void set_max_smem(const void *fn, int bytes);
void sync_block();
/* Lane 'lane's value from every lane of the caller's warp that 'mask' names: the caller's
** 8 bytes are published, the collective waits for the named lanes, and the bytes of lane
** src (src < 0: none, the result is the caller's own) are returned. */
uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_of(int lane, int arg, int width),
                       int arg, int width);
void sync_warp(unsigned mask);

template <class... P> struct launch_t {
    void (*fn)(P...);
    const char *what;
    dim3 grid, block;
    size_t smem;
    template <class... A> void operator()(A &&...a) const
    {
        std::tuple<P...> args(std::forward<A>(a)...);
        void (*f)(P...) = fn;
        run(what, (const void *)fn, grid, block, smem, [&]() { std::apply(f, args); });
    }
};

template <class... P>
launch_t<P...> launch(void (*fn)(P...), const char *what, dim3 grid, dim3 block,
                      size_t smem = 0)
{
    return launch_t<P...>{fn, what, grid, block, smem};
}

int lane_xor(int lane, int arg, int width);
int lane_down(int lane, int arg, int width);
int lane_up(int lane, int arg, int width);
int lane_idx(int lane, int arg, int width);

template <class T> T exchange(unsigned mask, T v, int src_of(int, int, int), int arg, int width)
{
    static_assert(sizeof(T) <= 8, "a warp shuffle moves at most 8 bytes");
    uint64_t in = 0, out;
    memcpy(&in, &v, sizeof v);
    out = warp_exchange(mask, in, src_of, arg, width);
    T r;
    memcpy(&r, &out, sizeof r);
    return r;
}

} // namespace emu

#define threadIdx (emu::cur->tid)
#define blockIdx  (emu::block_idx)
#define blockDim  (emu::block_dim)
#define gridDim   (emu::grid_dim)

/* kernel<<<grid, block, smem>>>(args) is written KERNEL_LAUNCH(grid, block, smem, kernel)(args) */
#define KERNEL_LAUNCH(grid, block, smem, ...) \
    emu::launch(__VA_ARGS__, #__VA_ARGS__, (grid), (block), (smem))
#define DYN_SHARED(type, name) type *name = reinterpret_cast<type *>(emu::dyn_smem)

static inline void __syncthreads() { emu::sync_block(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::sync_warp(mask); }
template <class T> T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32)
{
    return emu::exchange(mask, v, emu::lane_xor, m, width);
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    return emu::exchange(mask, v, emu::lane_down, (int)d, width);
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    return emu::exchange(mask, v, emu::lane_up, (int)d, width);
}
template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return emu::exchange(mask, v, emu::lane_idx, src, width);
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* __expf and __logf: glibc declares them (plain expf, logf) */
static inline float __fdividef(float a, float b) { return a / b; }

static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t) { return "no error"; }
static inline cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                       size_t width, size_t height, cudaMemcpyKind)
{
    for (size_t r = 0; r < height; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
template <class F> cudaError_t cudaFuncSetAttribute(F fn, cudaFuncAttribute, int bytes)
{
    emu::set_max_smem((const void *)fn, bytes);
    return cudaSuccess;
}

#endif
