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
** Not modelled: timing, races between threads (a fiber runs alone until it waits: an atomic
** is a plain read-modify-write, done in thread order, where a GPU's order is arbitrary).
** The runtime API, cuBLAS and NCCL that runtime/rt_cuda.cu calls are emulated too (cuda_libs.cc,
** cublas_v2.h, nccl.h here): host memory, one device, GEMMs by their documented column-major
** semantics, and NCCL refusing any communicator of more than one rank.
*/
#ifndef GPT_CUDA_EMU_RUNTIME_H
#define GPT_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
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
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidResourceHandle = 400,
       cudaErrorNotReady = 600 };
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1,
                      cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
enum { cudaStreamNonBlocking = 1 };
enum { cudaEventDisableTiming = 2 };

/* -- The runtime API the CUDA runtime (runtime/rt_cuda.cu) calls: host memory, one device,
** streams that are always idle: work runs at the call, so an event is complete once recorded
** (cuda_libs.cc; handles are checked: an event or stream not created, or destroyed, is an
** error) ------------------------------------------------------------------------------------ */
struct cudaDeviceProp {
    char name[256];
    struct { char bytes[16]; } uuid;
    size_t totalGlobalMem;
    int multiProcessorCount, major, minor;
};
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventQuery(cudaEvent_t e);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);

namespace emu {

struct thread_state { uint3 tid; };
extern thread_state *cur;           /* the running fiber's */
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;
extern float *dyn_smem;             /* the block's dynamic shared memory */

/* every thread of the grid runs body(ctx) */
void run(const char *what, const void *fn, dim3 grid, dim3 block, size_t smem,
         void (*body)(const void *ctx), const void *ctx);
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
        struct call {
            std::tuple<P...> args;
            void (*f)(P...);
            static void body(const void *c)
            {
                const call *k = (const call *)c;
                std::apply(k->f, k->args);
            }
        } k{std::tuple<P...>(std::forward<A>(a)...), fn};
        run(what, (const void *)fn, grid, block, smem, &call::body, &k);
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
static inline int atomicAdd(int *p, int v)
{
    int old = *p;
    *p = old + v;
    return old;
}
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

/* -- bf16 and the warp matrix operations (cuda_bf16.h, mma.h) ---------------------------------- */
/*
** A fragment holds its whole tile in every lane (element (r, c) at x[r * cols + c]); a GPU
** spreads it over the lanes in an unspecified way, so kernels may only touch x[] elementwise
** alike in every lane, which both arrangements then agree on. Every operation is a warp
** collective here too: each waits for all 32 lanes (a lane that skips one deadlocks, reported).
** mma_sync adds the products in k order in f32 (tensor cores' order and rounding differ within
** the kernel tests' tolerances).
*/
struct __nv_bfloat16 { uint16_t bits; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) b.bits = (uint16_t)((u >> 16) | 0x40u);   /* NaN */
    else b.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}
static inline float __bfloat162float(__nv_bfloat16 b)
{
    uint32_t u = (uint32_t)b.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct shape_of;
template <int M, int N, int K> struct shape_of<matrix_a, M, N, K> { enum { R = M, C = K }; };
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> { enum { R = K, C = N }; };
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> { enum { R = M, C = N }; };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    enum { rows = shape_of<Use, M, N, K>::R, cols = shape_of<Use, M, N, K>::C,
           num_elements = rows * cols };
    T x[num_elements];
};

static inline float as_f32(float v) { return v; }
static inline float as_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class U, int M, int N, int K, class T, class L, class P>
void load_matrix_sync(fragment<U, M, N, K, T, L> &f, const P *p, unsigned ldm)
{
    __syncwarp();
    typedef fragment<U, M, N, K, T, L> F;
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = std::is_same<L, col_major>::value ? p[(size_t)c * ldm + r]
                                                                     : p[(size_t)r * ldm + c];
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm,
                      layout_t l)
{
    __syncwarp();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            f.x[r * N + c] = l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}

template <int M, int N, int K>
void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm,
                       layout_t l)
{
    __syncwarp();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            (l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[r * N + c];
    __syncwarp();
}

template <class U, int M, int N, int K, class T, class L, class V>
void fill_fragment(fragment<U, M, N, K, T, L> &f, V v)
{
    for (int i = 0; i < fragment<U, M, N, K, T, L>::num_elements; i++) f.x[i] = (T)v;
}

template <int M, int N, int K, class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, M, N, K, float> &d,
              const fragment<matrix_a, M, N, K, TA, LA> &a,
              const fragment<matrix_b, M, N, K, TB, LB> &b,
              const fragment<accumulator, M, N, K, float> &c)
{
    __syncwarp();
    float out[M * N];
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float s = c.x[m * N + n];
            for (int k = 0; k < K; k++) s += as_f32(a.x[m * K + k]) * as_f32(b.x[k * N + n]);
            out[m * N + n] = s;
        }
    memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda

/* -- The tensor cores' m16n8k16 (PTX mma.sync), 16-byte vectors --------------------------------- */
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return uint4{x, y, z, w};
}

namespace emu {
/*
** d += a b, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on the lanes' registers in the
** PTX ISA's fragment layout (g = lane / 4, c = 2 (lane % 4)): a[0..3] hold A's (g, c..c+1),
** (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9), the lower index in the lower 16 bits; b[0..1]
** B's (c..c+1, g) and (c+8..c+9, g); d[0..3] D's (g, c), (g, c+1), (g+8, c), (g+8, c+1). A
** warp collective: the lanes write their elements into the warp's A and B (transposed), wait
** for each other, then each forms its 4 sums in k order in f32. The warp's matrices alternate
** between two copies (each lane keeps its turn), so a lane that runs on to its next mma while
** the others still read this one's does not overwrite them; it cannot get two ahead, as the
** next mma waits for every lane. (Blocks and their threads run one at a time.)
*/
static inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    static float sa[2][32][16][16], sbt[2][32][8][16];
    static unsigned char turn[32][32];
    int t = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    int w = t / 32, lane = t % 32, g = lane / 4, c = 2 * (lane % 4);
    auto bf = [](uint32_t reg, int half) {
        __nv_bfloat16 v;
        v.bits = (uint16_t)(reg >> (16 * half));
        return __bfloat162float(v);
    };
    int p = turn[w][lane];
    turn[w][lane] = (unsigned char)(p ^ 1);
    float (*A)[16] = sa[p][w], (*Bt)[16] = sbt[p][w];
    for (int h = 0; h < 2; h++) {
        A[g][c + h] = bf(a[0], h);
        A[g + 8][c + h] = bf(a[1], h);
        A[g][c + 8 + h] = bf(a[2], h);
        A[g + 8][c + 8 + h] = bf(a[3], h);
        Bt[g][c + h] = bf(b[0], h);
        Bt[g][c + 8 + h] = bf(b[1], h);
    }
    __syncwarp();
    for (int i = 0; i < 4; i++) {
        const float *ar = A[g + 8 * (i / 2)], *bc = Bt[c + i % 2];
        float s = d[i];
        for (int k = 0; k < 16; k++)
            s += ar[k] * bc[k];
        d[i] = s;
    }
}
} // namespace emu

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* __expf and __logf: glibc declares them (plain expf, logf) */
static inline float __fdividef(float a, float b) { return a / b; }

static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
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
