/*
** kernels_cuda.cu: the kernels of kernels.h on CUDA: device pointers, every kernel launched on
** the legacy default stream (the runtime's). Pointwise kernels give one element to a thread and
** run the shared arithmetic of kernel_rows.h, so they compute the CPU backend's formulas. The
** reductions are written for the GPU: a warp per row (LayerNorm, RMSNorm), a block per row
** (cross-entropy), blocks of 32 warps per 32 columns (bias, norm-weight and MoE gradients), a
** grid of blocks for the gradient norm; their sums have fixed shapes (deterministic) that
** differ from the CPU's orders, within the kernel tests' f32 tolerance. Each kernel is a
** template over the storage type S (float or uint16_t for bf16), which picks the matching
** overload of kernel_rows.h; the launchers choose S from the call's rt_dtype. Attention has its
** own tiled kernels (shared memory, f32). Part of the training library (build/libgpt_cuda.a).
** The kernel tests also run this file on a CPU emulation of CUDA (tests/kernels/emu).
*/
#include <cuda_runtime.h>   /* or, with GPT_CUDA_EMU, the kernel tests' CPU emulation of it */
#include <cuda_bf16.h>       /* (and these two) */
#include <mma.h>
#include "kernel_rows.h"
#include "attn_cudnn.h" // defines: cudnn_attention_fwd, cudnn_attention_bwd
#include "kernels.h"
#include "rt.h"       // defines: rt_memcpy, rt_dtype_size, RT_CUDA, RT_CHECK
#include "rt_launch.h" // defines: KERNEL_LAUNCH, DYN_SHARED

#define BLOCK 256      /* threads per block */


/* The storage type of a call: f32 or bf16, anything else is a caller's bug. */
static rt_dtype storage(rt_dtype t)
{
    RT_CHECK(t == RT_F32 || t == RT_BF16, "kernels: storage dtype %d is neither f32 nor bf16",
             (int)t);
    return t;
}

/* kernel<uint16_t> (bf16) or kernel<float> for storage type t, on 'grid' blocks of 'block'
** threads (LAUNCH: of BLOCK). */
#define LAUNCH_WITH(t, kernel, grid, block, ...)                                             \
    do {                                                                                     \
        if (storage(t) == RT_BF16)                                                           \
            KERNEL_LAUNCH((grid), (block), 0, kernel<uint16_t>)(__VA_ARGS__);                \
        else KERNEL_LAUNCH((grid), (block), 0, kernel<float>)(__VA_ARGS__);                  \
        RT_CUDA(cudaGetLastError());                                                         \
    } while (0)
#define LAUNCH(t, kernel, grid, ...) LAUNCH_WITH(t, kernel, grid, BLOCK, __VA_ARGS__)

/* Blocks of BLOCK threads for n items (at least one: a grid of 0 is a launch error). */
static unsigned grid_for(size_t n) { return n ? (unsigned)CEIL_DIV(n, (size_t)BLOCK) : 1; }

template <class S> static __device__ S *as(void *p) { return static_cast<S *>(p); }
template <class S> static __device__ const S *as(const void *p)
{
    return static_cast<const S *>(p);
}

/* Element i of a storage array of dtype t. */
static void *elem(void *p, size_t i, rt_dtype t)
{
    return static_cast<char *>(p) + i * rt_dtype_size(t);
}

static const void *elem(const void *p, size_t i, rt_dtype t)
{
    return static_cast<const char *>(p) + i * rt_dtype_size(t);
}

/* -- Reductions: warps, blocks, columns -------------------------------------------------------- */
/*
** Every sum has a fixed shape, so results are the same run to run: a warp adds its lanes in a
** butterfly (each step adds two values that every lane of a pair holds alike, and addition
** commutes exactly); a block adds its warps' results in warp order; a column reduction gives
** each of COL_WARPS warps every COL_WARPS-th row of its block's chunk of rows, in COL_UNROLL
** partial sums (loads in flight) added in order, then adds the warps in order, then the chunks
** in order. No atomics.
*/

#define WARP 32
#define ROWS_PER_BLOCK (BLOCK / WARP)   /* rows of a block of the one-warp-per-row kernels */
#define COL_WARPS 32                    /* warps of a column-reduction block (1024 threads) */
#define COL_UNROLL 4                    /* partial sums per thread of a column reduction */
#define ROW_BLOCK 512                   /* threads of a block-per-row kernel (cross-entropy) */

/* Blocks for N rows of one warp each (at least one). */
static unsigned grid_rows(int N) { return N > 0 ? (unsigned)CEIL_DIV(N, ROWS_PER_BLOCK) : 1; }

/* The sum of v over the lanes of a warp, the same in every lane. */
template <class T> static __device__ T warp_sum(T v)
{
    for (int off = WARP / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The largest v over the lanes of a warp (NaN ignored, as fmaxf does), the same in every lane. */
static __device__ float warp_max(float v)
{
    for (int off = WARP / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* The warps' results v (each warp's alike in its lanes) combined in warp order, in every
** thread. blockDim.x is a multiple of WARP; sh is WARP elements of shared memory. */
template <class T, class Op> static __device__ T block_combine(T v, T *sh, Op op)
{
    int nw = blockDim.x / WARP;
    __syncthreads();                              /* sh is free: earlier readers are done */
    if (threadIdx.x % WARP == 0) sh[threadIdx.x / WARP] = v;
    __syncthreads();
    T r = sh[0];
    for (int w = 1; w < nw; w++) r = op(r, sh[w]);
    return r;
}

template <class T> static __device__ T block_sum(T v, T *sh)
{
    return block_combine(warp_sum(v), sh, [](T a, T b) { return a + b; });
}

static __device__ float block_max(float v, float *sh)
{
    return block_combine(warp_max(v), sh, [](float a, float b) { return fmaxf(a, b); });
}

/*
** Column c = blockIdx.x * WARP + lane of K (1 or 2) column sums over rows [0, N): f(n, c, acc)
** adds row n's terms to acc[0..K); the totals are added to out0[c] (and out1[c]). Blocks of
** COL_WARPS warps, the lanes of a warp reading 32 neighbouring columns of one row. The rows are
** split into gridDim.y chunks (col_grid: enough blocks to fill the GPU, a function of N and C);
** with more than one, each block stores its chunk's sums in col_part, and col_finish adds the
** chunks in order. Launch through COL_LAUNCH.
*/
#define COL_GRID_BLOCKS 264             /* blocks a column reduction aims at: H100, 132 SMs x 2 */
#define COL_PART_MAX (2 * COL_GRID_BLOCKS * WARP)   /* K chunks x columns, at most */
static __device__ float col_part[COL_PART_MAX];

template <int K, class F> static __device__ void col_reduce(float *out0, float *out1, int N,
                                                             int C, F f)
{
    __shared__ float part[K][COL_WARPS][WARP];
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, c = blockIdx.x * WARP + lane;
    int lo = (int)((long)N * blockIdx.y / gridDim.y), hi = (int)((long)N * (blockIdx.y + 1) /
                                                                 gridDim.y);
    float acc[COL_UNROLL][K];
    for (int u = 0; u < COL_UNROLL; u++)
        for (int k = 0; k < K; k++) acc[u][k] = 0.0f;
    if (c < C) {
        int n = lo + w;
        for (; n + (COL_UNROLL - 1) * COL_WARPS < hi; n += COL_UNROLL * COL_WARPS)
            for (int u = 0; u < COL_UNROLL; u++) f(n + u * COL_WARPS, c, acc[u]);
        for (int u = 0; n < hi; n += COL_WARPS, u++) f(n, c, acc[u]);
    }
    for (int k = 0; k < K; k++) {
        float s = acc[0][k];
        for (int u = 1; u < COL_UNROLL; u++) s += acc[u][k];
        part[k][w][lane] = s;
    }
    __syncthreads();
    if (w == 0 && c < C)
        for (int k = 0; k < K; k++) {
            float s = part[k][0][lane];
            for (int i = 1; i < COL_WARPS; i++) s += part[k][i][lane];
            if (gridDim.y == 1) (k == 0 ? out0 : out1)[c] += s;
            else col_part[((size_t)blockIdx.y * K + k) * C + c] = s;
        }
}

/* out0[c] (and out1[c]) += the chunks' sums of column c, in chunk order */
static __global__ void col_total_kernel(float *out0, float *out1, int C, int K, int chunks)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int k = 0; k < K; k++) {
        float s = col_part[(size_t)k * C + c];
        for (int y = 1; y < chunks; y++) s += col_part[((size_t)y * K + k) * C + c];
        (k == 0 ? out0 : out1)[c] += s;
    }
}

/* The grid of a column reduction over N rows and C columns: 32 columns per block, the rows in
** chunks to fill the GPU, each of at least a block's unrolled step (COL_WARPS x COL_UNROLL
** rows) */
static dim3 col_grid(int N, int C, int K)
{
    unsigned x = (unsigned)CEIL_DIV(C, WARP), y = COL_GRID_BLOCKS / x;
    unsigned most = (unsigned)(N / (COL_WARPS * COL_UNROLL));
    y = y > 16 ? 16 : y;
    y = y > most ? most : y;
    y = y < 1 ? 1 : y;
    while (y > 1 && (size_t)K * y * C > COL_PART_MAX) y--;
    return dim3(x, y);
}

static void col_finish(float *out0, float *out1, int C, int K, unsigned chunks)
{
    if (chunks > 1) {
        KERNEL_LAUNCH(grid_for((size_t)C), BLOCK, 0, col_total_kernel)(out0, out1, C, K,
                                                                      (int)chunks);
        RT_CUDA(cudaGetLastError());
    }
}

/* kernel<S> (a col_reduce of K sums over N rows into out0, out1 over C columns), then the
** chunks' total */
#define COL_LAUNCH(t, K, kernel, N, C, out0, out1, ...)                                      \
    do {                                                                                     \
        dim3 g_ = col_grid((N), (C), (K));                                                   \
        LAUNCH_WITH(t, kernel, g_, COL_WARPS * WARP, __VA_ARGS__);                           \
        col_finish((out0), (out1), (C), (K), g_.y);                                         \
    } while (0)

/* -- 16-byte groups ------------------------------------------------------------------------ */

/*
** The elementwise kernels give each thread 16 bytes of every operand (VEC(S) elements: 8 bf16,
** 4 f32), loaded and stored as one vector where the call's pointers are 16-byte aligned
** (vec_ok; the bias add also needs rows of a multiple of VEC(S)), and run kernel_rows.h's
** arithmetic on them in registers; the last partial group, and unaligned calls, element by
** element (the same arithmetic, so the results are the same bits either way).
*/
#define VEC(S) (16 / sizeof(S))

template <class S> static __device__ void v16(S *dst, const S *src)
{
#ifdef GPT_CUDA_EMU
    memcpy(dst, src, 16);                /* C++'s aliasing rules, on the CPU */
#else
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
#endif
}

static bool vec_ok(const void *a, const void *b, const void *c)
{
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

/* Blocks for n elements, 16 bytes of them per thread */
static unsigned grid_vec(size_t n, rt_dtype t)
{
    return grid_for(CEIL_DIV(n, 16 / rt_dtype_size(t)));
}

/* The first element of the thread's group */
#define VEC_FIRST(S) (((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC(S))

/*
** The one-warp-per-row kernels (the norms) walk a row of C columns in groups of VEC(S): group g
** is columns [g VEC, g VEC + VEC) (the last may be short), and lane l takes groups l, l + WARP,
** l + 2 WARP, ..., each column in increasing order. That is the one order of a lane's partial
** sums, whether a group is loaded as one vector (vec: the call's pointers 16-byte aligned and C
** a multiple of VEC(S), so every row is: row_vec) or element by element: the same bits either
** way. A group lives in registers (grp_in, grp_out). GROUPS is the same walk for any first
** group and stride (the block-per-row cross-entropy: its threads).
*/
#define GROUPS(S, i, k, C, first, stride)                                                    \
    for (int i = (first) * (int)VEC(S), k = MIN((int)VEC(S), (C) - i); i < (C);              \
         i += (stride) * (int)VEC(S), k = MIN((int)VEC(S), (C) - i))
#define LANE_GROUPS(S, i, k, C, lane) GROUPS(S, i, k, C, lane, WARP)

template <class S> static __device__ void grp_in(S *r, const S *p, int k, int vec)
{
    if (vec && k == (int)VEC(S)) v16(r, p);
    else for (int e = 0; e < k; e++) r[e] = p[e];
}

template <class S> static __device__ void grp_out(S *p, const S *r, int k, int vec)
{
    if (vec && k == (int)VEC(S)) v16(p, r);
    else for (int e = 0; e < k; e++) p[e] = r[e];
}

static int row_vec(int C, rt_dtype t, const void *a, const void *b, const void *c,
                   const void *d)
{
    return C % (16 / (int)rt_dtype_size(t)) == 0 && vec_ok(a, b, c) && vec_ok(d, NULL, NULL);
}

/* -- Embedding: vocabulary-parallel tokens, learned positions ---------------------------------- */
/*
** The embedding's gradient sums, per vocabulary row, the gradients of the tokens with that id
** in token order (the CPU's order exactly, so f32 results are bit-identical to the CPU's).
** The tokens are first bucketed by id on the device: a histogram of the owned ids, its
** exclusive scan (one block, fixed order) giving each id's slice of an index array, a scatter
** of the token positions into their slices, one block per vocabulary row sorting its slice (a
** bitonic network: the scatter's atomics leave it in any order), then blocks of EMB_COLS
** columns of a row adding its tokens' rows, a thread per column. Integer atomics only: counts
** are exact, and the sort makes the order of every sum independent of the scatter's. The
** scatter fills a slice from its end, so on the emulation (atomics in thread order) every
** slice arrives reversed and the sort is tested.
*/
#define EMB_SCAN_BLOCK 1024             /* threads of the scan of the id counts */

/* Device scratch of the bucketing, grown on demand: emb_count (the ids' counts, zero between
** calls: the scatter counts each back down), emb_start (vrows + 1 slice starts), emb_pos (N). */
static int *emb_count, *emb_start, *emb_pos;
static size_t emb_rows_cap, emb_tok_cap;

static void emb_scratch(int vrows, int N)
{
    if ((size_t)vrows + 1 > emb_rows_cap) {
        if (emb_count) { RT_CUDA(cudaFree(emb_count)); RT_CUDA(cudaFree(emb_start)); }
        emb_rows_cap = (size_t)vrows + 1;
        RT_CUDA(cudaMalloc((void **)&emb_count, emb_rows_cap * sizeof(int)));
        RT_CUDA(cudaMalloc((void **)&emb_start, emb_rows_cap * sizeof(int)));
        RT_CUDA(cudaMemset(emb_count, 0, emb_rows_cap * sizeof(int)));
    }
    if ((size_t)N > emb_tok_cap) {
        if (emb_pos) RT_CUDA(cudaFree(emb_pos));
        emb_tok_cap = (size_t)N;
        RT_CUDA(cudaMalloc((void **)&emb_pos, emb_tok_cap * sizeof(int)));
    }
}

/* Elements [k, k + VEC(S)) of the token embeddings (k = n C + i), a thread each (embed_fwd_rows'
** values); vec: C a multiple of VEC(S) and out, wte aligned, so the group is one row's. */
template <class S> static __global__
void embed_fwd_kernel(void *out, const int *tok, const void *wte, int N, int C, int vstart,
                      int vrows, int vec)
{
    size_t k = VEC_FIRST(S), n = (size_t)N * C;
    if (k >= n) return;
    if (vec) {
        int v = tok[k / C] - vstart;
        alignas(16) S x[VEC(S)];
        if (v >= 0 && v < vrows) v16(x, as<S>(wte) + (size_t)v * C + k % C);
        else for (int j = 0; j < (int)VEC(S); j++) kr_store(x + j, 0.0f);
        v16(as<S>(out) + k, x);
        return;
    }
    for (size_t e = k; e < MIN(k + VEC(S), n); e++) {
        int v = tok[e / C] - vstart;
        S *o = as<S>(out) + e;
        if (v >= 0 && v < vrows) *o = as<S>(wte)[(size_t)v * C + e % C];
        else kr_store(o, 0.0f);
    }
}

/* Token n (one thread each): count its id if this rank owns it. */
static __global__ void emb_count_kernel(int *count, const int *tok, int N, int vstart, int vrows)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int v = tok[n] - vstart;
    if (v >= 0 && v < vrows) atomicAdd(count + v, 1);
}

/* start[v] = the counts of ids below v, start[vrows] = the total: one block, each thread a
** contiguous run of ids, the runs' totals scanned in order by thread 0. */
static __global__ void emb_scan_kernel(int *start, const int *count, int vrows)
{
    __shared__ int run[EMB_SCAN_BLOCK];
    int per = CEIL_DIV(vrows, EMB_SCAN_BLOCK), lo = MIN((int)threadIdx.x * per, vrows),
        hi = MIN(lo + per, vrows), s = 0;
    for (int v = lo; v < hi; v++) s += count[v];
    run[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int i = 0; i < EMB_SCAN_BLOCK; i++) { int c = run[i]; run[i] = acc; acc += c; }
        start[vrows] = acc;
    }
    __syncthreads();
    s = run[threadIdx.x];
    for (int v = lo; v < hi; v++) { start[v] = s; s += count[v]; }
}

/* Token n: its position into its id's slice, filled from the end (count goes back to 0). */
static __global__ void emb_scatter_kernel(int *pos, int *count, const int *start, const int *tok,
                                          int N, int vstart, int vrows)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int v = tok[n] - vstart;
    if (v >= 0 && v < vrows) pos[start[v] + atomicAdd(count + v, -1) - 1] = n;
}

/* Vocabulary row v = blockIdx.x: sort its slice of positions ascending (a bitonic network in
** which every comparison puts the smaller first; the slice is padded to a power of two with
** virtual +inf, so comparisons past its end are skipped). */
static __global__ void emb_sort_kernel(int *pos, const int *start)
{
    int s = start[blockIdx.x], k = start[blockIdx.x + 1] - s;
    int *p = pos + s;
    for (int size = 2; size / 2 < k; size *= 2)
        for (int half = size / 2; half > 0; half /= 2) {
            for (int i = threadIdx.x; i < k; i += blockDim.x) {
                /* the first step of a merge compares mirror images, the later ones neighbours */
                int j = half == size / 2 ? (i | (size - 1)) - (i & (size - 1)) : i ^ half;
                if (j > i && j < k && p[j] < p[i]) { int x = p[i]; p[i] = p[j]; p[j] = x; }
            }
            __syncthreads();
        }
}

/* Row v = blockIdx.x, column i (blockIdx.y's EMB_COLS): dwte[v][i] += the rows of v's tokens
** in token order, EMB_UNROLL loads in flight (added in order). */
#define EMB_COLS 128
#define EMB_UNROLL 4
template <class S> static __global__
void embed_bwd_kernel(float *dwte, const void *dout, const int *pos, const int *start, int C)
{
    int v = blockIdx.x, i = blockIdx.y * EMB_COLS + threadIdx.x, j = start[v],
        end = start[v + 1];
    if (j == end || i >= C) return;
    const S *d = as<S>(dout) + i;
    float g = dwte[(size_t)v * C + i], x[EMB_UNROLL];
    for (; j + EMB_UNROLL <= end; j += EMB_UNROLL) {
        for (int u = 0; u < EMB_UNROLL; u++) x[u] = kr_load(d + (size_t)pos[j + u] * C);
        for (int u = 0; u < EMB_UNROLL; u++) g += x[u];
    }
    for (; j < end; j++) g += kr_load(d + (size_t)pos[j] * C);
    dwte[(size_t)v * C + i] = g;
}

/* Elements [k, k + VEC(S)) (k = (t B + b) C + i), a thread each: += the position's row
** (pos_fwd_rows' arithmetic); vec: C a multiple of VEC(S) and out, wpe aligned. */
template <class S> static __global__
void pos_fwd_kernel(void *out, const void *wpe, int T, int B, int C, int t0, int vec)
{
    size_t k = VEC_FIRST(S), n = (size_t)T * B * C;
    if (k >= n) return;
    if (vec) {
        alignas(16) S o[VEC(S)], x[VEC(S)];
        v16(o, as<S>(out) + k);
        v16(x, as<S>(wpe) + (t0 + k / ((size_t)B * C)) * C + k % C);
        for (int j = 0; j < (int)VEC(S); j++) kr_store(o + j, kr_load(o + j) + kr_load(x + j));
        v16(as<S>(out) + k, o);
        return;
    }
    for (size_t e = k; e < MIN(k + VEC(S), n); e++) {
        S *o = as<S>(out) + e;
        kr_store(o, kr_load(o) + kr_load(as<S>(wpe) + (t0 + e / ((size_t)B * C)) * C + e % C));
    }
}

/* Element (t, i) of the position gradient: += the B rows of position t, in order. */
template <class S> static __global__
void pos_bwd_kernel(float *dwpe, const void *dout, int T, int B, int C, int t0)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (size_t)T * C) return;
    int t = (int)(k / C), i = (int)(k % C);
    const S *d = as<S>(dout) + (size_t)t * B * C + i;
    float g = dwpe[(size_t)(t0 + t) * C + i];
    for (int b = 0; b < B; b++) g += kr_load(d + (size_t)b * C);
    dwpe[(size_t)(t0 + t) * C + i] = g;
}

void embed_fwd(void *out, const int *tok, const void *wte, int N, int C, int vstart, int vrows,
               rt_dtype t)
{
    LAUNCH(t, embed_fwd_kernel, grid_vec((size_t)N * C, t), out, tok, wte, N, C, vstart, vrows,
           row_vec(C, t, out, wte, NULL, NULL));
}

void embed_bwd(float *dwte, const void *dout, const int *tok, int N, int C, int vstart,
               int vrows, rt_dtype t)
{
    if (N <= 0 || vrows <= 0 || C <= 0) return;
    emb_scratch(vrows, N);
    KERNEL_LAUNCH(grid_for(N), BLOCK, 0, emb_count_kernel)(emb_count, tok, N, vstart, vrows);
    RT_CUDA(cudaGetLastError());
    KERNEL_LAUNCH(1, EMB_SCAN_BLOCK, 0, emb_scan_kernel)(emb_start, emb_count, vrows);
    RT_CUDA(cudaGetLastError());
    KERNEL_LAUNCH(grid_for(N), BLOCK, 0, emb_scatter_kernel)(emb_pos, emb_count, emb_start, tok,
                                                             N, vstart, vrows);
    RT_CUDA(cudaGetLastError());
    KERNEL_LAUNCH((unsigned)vrows, BLOCK, 0, emb_sort_kernel)(emb_pos, emb_start);
    RT_CUDA(cudaGetLastError());
    dim3 grid((unsigned)vrows, (unsigned)CEIL_DIV(C, EMB_COLS));
    LAUNCH_WITH(t, embed_bwd_kernel, grid, EMB_COLS, dwte, dout, emb_pos, emb_start, C);
}

void pos_fwd(void *out, const void *wpe, int T, int B, int C, int t0, rt_dtype t)
{
    LAUNCH(t, pos_fwd_kernel, grid_vec((size_t)T * B * C, t), out, wpe, T, B, C, t0,
           row_vec(C, t, out, wpe, NULL, NULL));
}

void pos_bwd(float *dwpe, const void *dout, int T, int B, int C, int t0, rt_dtype t)
{
    LAUNCH(t, pos_bwd_kernel, grid_for((size_t)T * C), dwpe, dout, T, B, C, t0);
}

/* -- LayerNorm over rows of a (N, C) matrix ---------------------------------------------------- */

/* Row n of a LayerNorm, a warp's: two-pass mean and variance over the lane's groups, then
** out = (x - mean) * rstd * w + b (kernel_rows.h's formulas). One function for layernorm_fwd
** and add_layernorm_fwd, so that the compiler's contractions (nvcc's fmad, the emulation's
** -ffp-contract) are the same in both: the same bits. */
template <class S> static __device__
void layernorm_row(S *o, float *mean, float *rstd, const S *x, const S *ws, const S *bs, int n,
                   int C, float eps, int lane, int vec)
{
    alignas(16) S xv[VEC(S)], wv[VEC(S)], bv[VEC(S)];
    float sum = 0.0f, var = 0.0f;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        for (int e = 0; e < k; e++) sum += kr_load(xv + e);
    }
    float m = warp_sum(sum) / (float)C;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        for (int e = 0; e < k; e++) {
            float d = kr_load(xv + e) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(warp_sum(var) / (float)C + eps);
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        grp_in(wv, ws + i, k, vec);
        grp_in(bv, bs + i, k, vec);
        for (int e = 0; e < k; e++)
            kr_store(xv + e, (kr_load(xv + e) - m) * s * kr_load(wv + e) + kr_load(bv + e));
        grp_out(o + i, xv, k, vec);
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

/* Row n = this warp's */
template <class S> static __global__
void layernorm_fwd_kernel(void *out, float *mean, float *rstd, const void *inp, const void *w,
                          const void *b, int N, int C, float eps, int vec)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;                                  /* the whole warp: n is the warp's */
    layernorm_row(as<S>(out) + (size_t)n * C, mean, rstd, as<S>(inp) + (size_t)n * C, as<S>(w),
                  as<S>(b), n, C, eps, lane, vec);
}

/* res = a + b over the lane's groups of the row (kernel_rows.h's add, stored as S) */
template <class S> static __device__
void add_row(S *res, const S *a, const S *b, int C, int lane, int vec)
{
    alignas(16) S av[VEC(S)], bv[VEC(S)];
    LANE_GROUPS(S, i, k, C, lane) {
        if (vec && k == (int)VEC(S)) {
            v16(av, a + i);
            v16(bv, b + i);
            add_span(av, av, bv, 0, VEC(S));
            v16(res + i, av);
        } else add_span(res, a, b, (size_t)i, (size_t)(i + k));
    }
}

/* res = a + b, then layernorm_row on the row just stored: each lane reads back only the groups
** it wrote (from its cache), so the row crosses memory once */
template <class S> static __global__
void add_layernorm_fwd_kernel(void *res, void *out, float *mean, float *rstd, const void *a,
                              const void *b, const void *w, const void *bias, int N, int C,
                              float eps, int vec)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    size_t r0 = (size_t)n * C;
    add_row(as<S>(res) + r0, as<S>(a) + r0, as<S>(b) + r0, C, lane, vec);
    layernorm_row(as<S>(out) + r0, mean, rstd, as<S>(res) + r0, as<S>(w), as<S>(bias), n, C, eps,
                  lane, vec);
}

/* Row n = this warp's: dinp += rstd * (dn - mean(dn) - xhat * mean(dn * xhat)), dn = dout * w. */
template <class S> static __global__
void layernorm_bwd_rows_kernel(void *dinp, const void *dout, const void *inp, const void *w,
                               const float *mean, const float *rstd, int N, int C, int vec)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const S *x = as<S>(inp) + (size_t)n * C, *d = as<S>(dout) + (size_t)n * C, *ws = as<S>(w);
    S *dx = as<S>(dinp) + (size_t)n * C;
    alignas(16) S xv[VEC(S)], dv[VEC(S)], wv[VEC(S)], ov[VEC(S)];
    float mu = mean[n], rs = rstd[n], dn_sum = 0.0f, dnx_sum = 0.0f;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        grp_in(dv, d + i, k, vec);
        grp_in(wv, ws + i, k, vec);
        for (int e = 0; e < k; e++) {
            float dn = kr_load(dv + e) * kr_load(wv + e);
            dn_sum += dn;
            dnx_sum += dn * ((kr_load(xv + e) - mu) * rs);
        }
    }
    float dn_mean = warp_sum(dn_sum) / (float)C, dnx_mean = warp_sum(dnx_sum) / (float)C;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        grp_in(dv, d + i, k, vec);
        grp_in(wv, ws + i, k, vec);
        grp_in(ov, dx + i, k, vec);
        for (int e = 0; e < k; e++) {
            float xhat = (kr_load(xv + e) - mu) * rs, dn = kr_load(dv + e) * kr_load(wv + e);
            kr_store(ov + e, kr_load(ov + e) + rs * (dn - dn_mean - xhat * dnx_mean));
        }
        grp_out(dx + i, ov, k, vec);
    }
}

/* dw += dout * xhat, db += dout: column sums over the rows. */
template <class S> static __global__
void layernorm_bwd_cols_kernel(float *dw, float *db, const void *dout, const void *inp,
                               const float *mean, const float *rstd, int N, int C)
{
    const S *d = as<S>(dout), *x = as<S>(inp);
    col_reduce<2>(dw, db, N, C, [=](int n, int c, float *a) {
        size_t e = (size_t)n * C + c;
        float g = kr_load(d + e);
        a[0] += g * ((kr_load(x + e) - mean[n]) * rstd[n]);
        a[1] += g;
    });
}

void layernorm_fwd(void *out, float *mean, float *rstd, const void *inp, const void *w,
                   const void *b, int N, int C, float eps, rt_dtype t)
{
    LAUNCH(t, layernorm_fwd_kernel, grid_rows(N), out, mean, rstd, inp, w, b, N, C, eps,
           row_vec(C, t, out, inp, w, b));
}

void add_layernorm_fwd(void *res, void *out, float *mean, float *rstd, const void *a,
                       const void *b, const void *w, const void *bias, int N, int C, float eps,
                       rt_dtype t)
{
    LAUNCH(t, add_layernorm_fwd_kernel, grid_rows(N), res, out, mean, rstd, a, b, w, bias, N, C,
           eps, row_vec(C, t, res, out, a, b) && vec_ok(w, bias, NULL));
}

void layernorm_bwd(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                   const void *w, const float *mean, const float *rstd, int N, int C,
                   rt_dtype t)
{
    LAUNCH(t, layernorm_bwd_rows_kernel, grid_rows(N), dinp, dout, inp, w, mean, rstd, N, C,
           row_vec(C, t, dinp, dout, inp, w));
    if (C > 0)
        COL_LAUNCH(t, 2, layernorm_bwd_cols_kernel, N, C, dw, db, dw, db, dout, inp, mean, rstd,
                   N, C);
}

/* -- GELU, bias, residual adds, conversions ---------------------------------------------------- */

/* out = span(a, b) over [0, n), a thread per group: span(o, x, y, i0, i1) is a kernel_rows.h
** span over elements [i0, i1) of o, x and y (b may be NULL: then y is not read). */
template <class S, class F> static __device__
void vec_map(S *out, const S *a, const S *b, size_t n, int vec, F span)
{
    size_t i = VEC_FIRST(S);
    if (vec && i + VEC(S) <= n) {
        alignas(16) S x[VEC(S)], y[VEC(S)], o[VEC(S)];
        v16(x, a + i);
        if (b) v16(y, b + i);
        span(o, x, y, 0, VEC(S));
        v16(out + i, o);
    } else if (i < n) span(out, a, b, i, MIN(i + VEC(S), n));
}

template <class S> static __global__
void gelu_fwd_kernel(void *out, const void *inp, size_t n, int vec)
{
    vec_map(as<S>(out), as<S>(inp), (const S *)NULL, n, vec,
            [](S *o, const S *x, const S *, size_t i0, size_t i1) { gelu_fwd_span(o, x, i0, i1); });
}

/* dinp may be dout (in place) */
template <class S> static __global__
void gelu_bwd_kernel(void *dinp, const void *inp, const void *dout, size_t n, int vec)
{
    vec_map(as<S>(dinp), as<S>(inp), as<S>(dout), n, vec,
            [](S *o, const S *x, const S *d, size_t i0, size_t i1) {
                gelu_bwd_span(o, x, d, i0, i1);
            });
}

/* vec: also OC a multiple of VEC(S), so a group is one row's and its bias is aligned */
template <class S> static __global__
void bias_fwd_kernel(void *out, const void *bias, size_t n, int OC, int vec)
{
    size_t i = VEC_FIRST(S);
    if (vec && i + VEC(S) <= n) {
        alignas(16) S x[VEC(S)], b[VEC(S)];
        v16(x, as<S>(out) + i);
        v16(b, as<S>(bias) + i % OC);
        bias_fwd_block(x, b, (int)VEC(S), 0, 1, 0, (int)VEC(S));
        v16(as<S>(out) + i, x);
    } else
        for (size_t j = i; j < MIN(i + VEC(S), n); j++) {
            int row = (int)(j / OC), col = (int)(j % OC);
            bias_fwd_block(as<S>(out), as<S>(bias), OC, row, row + 1, col, col + 1);
        }
}

template <class S> static __global__
void bias_bwd_kernel(float *dbias, const void *dout, int N, int OC)
{
    const S *d = as<S>(dout);
    col_reduce<1>(dbias, NULL, N, OC, [=](int n, int c, float *a) {
        a[0] += kr_load(d + (size_t)n * OC + c);
    });
}

/* out may be a (in place) */
template <class S> static __global__
void add_kernel(void *out, const void *a, const void *b, size_t n, int vec)
{
    vec_map(as<S>(out), as<S>(a), as<S>(b), n, vec,
            [](S *o, const S *x, const S *y, size_t i0, size_t i1) { add_span(o, x, y, i0, i1); });
}

/*
** The conversions move groups of CVT elements (16 bytes of bf16, 32 of f32), a thread each,
** as vectors where the pointers (and row strides) are 16-byte aligned; the same conversion of
** each element either way.
*/
#define CVT 8

/* bf16 <- f32 */
template <class S> static __global__
void narrow_kernel(void *dst, const float *src, size_t n, int vec)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * CVT;
    if (vec && i + CVT <= n) {
        alignas(16) float x[CVT];
        alignas(16) S o[CVT];
        for (int j = 0; j < CVT; j += (int)VEC(float)) v16(x + j, src + i + j);
        narrow_span(o, x, 0, CVT);
        for (int j = 0; j < CVT; j += (int)VEC(S)) v16(as<S>(dst) + i + j, o + j);
    } else if (i < n) narrow_span(as<S>(dst), src, i, MIN(i + CVT, n));
}

/* f32 <- bf16 */
template <class S> static __global__
void widen_kernel(float *dst, const void *src, size_t n, int vec)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * CVT;
    if (vec && i + CVT <= n) {
        alignas(16) S x[CVT];
        alignas(16) float o[CVT];
        for (int j = 0; j < CVT; j += (int)VEC(S)) v16(x + j, as<S>(src) + i + j);
        widen_span(o, x, 0, CVT);
        for (int j = 0; j < CVT; j += (int)VEC(float)) v16(dst + i + j, o + j);
    } else if (i < n) widen_span(dst, as<S>(src), i, MIN(i + CVT, n));
}

/* Columns [c0, c0 + CVT) of row r of a rows x cols block (group g = r per + c0 / CVT), from
** src (rows of lds, type S) to dst (rows of ldd, type D), converted through f32 by the
** storage types' load and store (bf16: round to nearest even). */
template <class D, class S> static __global__
void copy_cols_kernel(void *dst, size_t ldd, const void *src, size_t lds, int rows, int cols,
                      int vec)
{
    size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per = CEIL_DIV((size_t)cols, CVT);
    if (g >= (size_t)rows * per) return;
    size_t r = g / per, c0 = g % per * CVT, c1 = MIN(c0 + CVT, (size_t)cols);
    const S *s = as<S>(src) + r * lds + c0;
    D *d = as<D>(dst) + r * ldd + c0;
    if (vec && c1 - c0 == CVT) {
        alignas(16) S x[CVT];
        alignas(16) D y[CVT];
        for (int j = 0; j < CVT; j += (int)VEC(S)) v16(x + j, s + j);
        for (int j = 0; j < CVT; j++) kr_store(y + j, kr_load(x + j));
        for (int j = 0; j < CVT; j += (int)VEC(D)) v16(d + j, y + j);
    } else
        for (size_t c = 0; c < c1 - c0; c++) kr_store(d + c, kr_load(s + c));
}

void gelu_fwd(void *out, const void *inp, size_t n, rt_dtype t)
{
    LAUNCH(t, gelu_fwd_kernel, grid_vec(n, t), out, inp, n, vec_ok(out, inp, NULL));
}

void gelu_bwd(void *dinp, const void *inp, const void *dout, size_t n, rt_dtype t)
{
    LAUNCH(t, gelu_bwd_kernel, grid_vec(n, t), dinp, inp, dout, n, vec_ok(dinp, inp, dout));
}

void bias_fwd(void *out, const void *bias, int N, int OC, rt_dtype t)
{
    size_t n = (size_t)N * OC;
    int vec = vec_ok(out, bias, NULL) && OC % (int)(16 / rt_dtype_size(t)) == 0;
    LAUNCH(t, bias_fwd_kernel, grid_vec(n, t), out, bias, n, OC, vec);
}

void bias_bwd(float *dbias, const void *dout, int N, int OC, rt_dtype t)
{
    if (OC > 0)
        COL_LAUNCH(t, 1, bias_bwd_kernel, N, OC, dbias, NULL, dbias, dout, N, OC);
}

void add_fwd(void *out, const void *a, const void *b, size_t n, rt_dtype t)
{
    LAUNCH(t, add_kernel, grid_vec(n, t), out, a, b, n, vec_ok(out, a, b));
}

void add_inplace(void *y, const void *x, size_t n, rt_dtype t)
{
    LAUNCH(t, add_kernel, grid_vec(n, t), y, y, x, n, vec_ok(y, x, NULL));
}

void convert(void *dst, rt_dtype dt, const void *src, rt_dtype st, size_t n)
{
    if (dt == st) {
        if (n && dst != src) rt_memcpy(dst, src, n * rt_dtype_size(dt), RT_D2D);
        return;
    }
    RT_CHECK((dt == RT_F32 && st == RT_BF16) || (dt == RT_BF16 && st == RT_F32),
             "convert: no conversion from dtype %d to %d", (int)st, (int)dt);
    unsigned grid = grid_for(CEIL_DIV(n, CVT));
    if (dt == RT_BF16) {
        KERNEL_LAUNCH(grid, BLOCK, 0, narrow_kernel<uint16_t>)(
            dst, static_cast<const float *>(src), n, vec_ok(dst, src, NULL));
    } else {
        KERNEL_LAUNCH(grid, BLOCK, 0, widen_kernel<uint16_t>)(
            static_cast<float *>(dst), src, n, vec_ok(dst, src, NULL));
    }
    RT_CUDA(cudaGetLastError());
}

void copy_cols(void *dst, rt_dtype dt, size_t ldd, const void *src, rt_dtype st, size_t lds,
               int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    if (storage(dt) == storage(st)) {       /* same dtype: a strided copy on the same stream */
        size_t es = rt_dtype_size(dt);
        if (n) RT_CUDA(cudaMemcpy2D(dst, ldd * es, src, lds * es, cols * es, rows,
                                    cudaMemcpyDeviceToDevice));
        return;
    }
    if (n == 0) return;
    unsigned grid = grid_for((size_t)rows * CEIL_DIV((size_t)cols, CVT));
    int vec = vec_ok(dst, src, NULL) && ldd * rt_dtype_size(dt) % 16 == 0 &&
              lds * rt_dtype_size(st) % 16 == 0;
    if (dt == RT_BF16)
        KERNEL_LAUNCH(grid, BLOCK, 0, copy_cols_kernel<uint16_t, float>)(
            dst, ldd, src, lds, rows, cols, vec);
    else
        KERNEL_LAUNCH(grid, BLOCK, 0, copy_cols_kernel<float, uint16_t>)(
            dst, ldd, src, lds, rows, cols, vec);
    RT_CUDA(cudaGetLastError());
}

/* -- Attention without the (T, T) matrix: causal, and context-parallel blocks ------------------ */
/*
** Tiles of ATT_BQ queries and ATT_BK keys (equal, so a key tile starting at or before a query
** tile's start holds, for every query row, at least one key it may see), f32 in shared memory,
** one block of ATT_THREADS threads per tile, each output element computed by one thread in a
** fixed order: deterministic, no atomics. Causal (Tq = Tk): key tiles entirely above the
** diagonal are never loaded and the diagonal tile masks key > query. A context-parallel block
** that is not causal (its keys all earlier in the sequence) visits every key tile unmasked.
**
** Forward, one block per (query tile, b, head): q (times scale) and the output accumulator stay
** in shared memory while the key tiles pass; per tile, scores, then one thread per query row
** runs the online softmax (kernel_rows.h) and rescales, then out += p v. Then either out and
** lse are stored (attention_fwd), or the normalised output and lse are merged into the f32
** running acc and lse (attention_fwd_block, att_merge_lse).
** Backward: dsum = rowsum(dout * out) (one thread per row); then one block per (key tile, b,
** head) sums dk and dv over the query tiles that see it, and one block per (query tile, b,
** head) sums dq over the key tiles it sees; both recompute p = exp(s - lse) and ds = p (dp -
** dsum) with the same device function. The sums are stored in the storage type (attention_bwd)
** or added to f32 gradients (attention_bwd_block); either way one thread owns each element.
** Not tuned (no tensor cores, one product per element).
*/

#define ATT_BQ 32
#define ATT_BK 32
#define ATT_SLD (ATT_BK + 1)    /* row stride of the score tiles: no bank conflicts */
#define ATT_THREADS 128

/*
** One attention call, passed to the kernels by value. Every operand has rows t*B + b of some
** width ld (elements) with head h at column h*hd; out, acc, dout and dq (when added) have rows
** of Hl*hd. The forward writes out (NULL: merges into acc instead) and lse; the backward reads
** clse and dsum and stores dq, dk, dv in the storage type, or adds them to f32 (add).
*/
struct att_call {
    const void *q, *k, *v;      /* storage type */
    int ldq, ldkv;              /* row widths of q, of k and v */
    int B, Tq, Tk, Hl, KVl, hd; /* query head h reads kv head att_kv_head(h, Hl, KVl) */
    int causal;                 /* 1: query i sees keys j <= i (Tq = Tk); 0: every key */
    float scale;
    int lse_ld;                 /* row stride of lse, clse, dsum: (b, h, i) at (b*Hl + h)*ld + i */
    float *lse;                 /* forward: written, or merged into */
    void *out;                  /* forward: normalised output (storage type), or NULL */
    float *acc;                 /* forward with out NULL: the running f32 output */
    const float *clse, *dsum;   /* backward */
    const void *dout;           /* backward (storage type) */
    void *dq, *dk, *dv;         /* backward: storage type, or f32 when add */
    int lddq, lddkv;            /* row widths of dq, of dk and dv */
    int add;
};

/* The element offset of head h of batch element b in rows t*B + b of ld elements. */
static __device__ size_t att_head(int ld, int b, int h, int hd)
{
    return (size_t)b * ld + (size_t)h * hd;
}

/* rows [0, rows) of hd channels from storage rows of stride ld (nr valid, the rest 0), times
** mul, into a shared f32 tile of rows of hd */
template <class S> static __device__
void att_tile_in(float *dst, const S *src, size_t ld, int nr, int rows, int hd, float mul)
{
    for (int x = threadIdx.x; x < rows * hd; x += blockDim.x) {
        int r = x / hd, d = x % hd;
        dst[x] = r < nr ? kr_load(src + r * ld + d) * mul : 0.0f;
    }
}

/* nr rows of hd channels of a shared f32 tile, times mul, to the rows of stride ld starting at
** element 'at' of dst: rounded and stored in S, or (add) added to f32. */
template <class S> static __device__
void att_tile_out(void *dst, int add, size_t at, size_t ld, const float *src, int nr, int hd,
                  float mul)
{
    for (int x = threadIdx.x; x < nr * hd; x += blockDim.x) {
        size_t e = at + (size_t)(x / hd) * ld + x % hd;
        if (add) static_cast<float *>(dst)[e] += src[x] * mul;
        else kr_store(as<S>(dst) + e, src[x] * mul);
    }
}

/* dot product of two shared rows of hd channels, in order */
static __device__ float att_dot(const float *a, const float *b, int hd)
{
    float s = 0.0f;
    for (int d = 0; d < hd; d++) s += a[d] * b[d];
    return s;
}

/* May query q0 + r see key k0 + c (both inside their blocks; causal: key <= query)? */
static __device__ bool att_visible(int causal, int q0, int r, int nq, int k0, int c, int nk)
{
    return r < nq && c < nk && (!causal || k0 + c <= q0 + r);
}

/* The end of the keys query tile [q0, q0 + nq) sees: its diagonal (causal), or all of them. */
static __device__ int att_key_end(const att_call &a, int q0, int nq)
{
    return a.causal ? q0 + nq : a.Tk;
}

/* The shared memory of each kernel, in floats. */
static size_t att_fwd_smem(int hd)      /* q, k, v, out; scores; max, sum, rescale rows */
{
    return (size_t)(2 * ATT_BQ + 2 * ATT_BK) * hd + ATT_BQ * ATT_SLD + 3 * ATT_BQ;
}

static size_t att_bwd_smem(int hd)      /* q, dout, k, v, dk, dv (dq); p, ds; lse, dsum rows */
{
    return (size_t)(2 * ATT_BQ + 4 * ATT_BK) * hd + 2 * ATT_BQ * ATT_SLD + 2 * ATT_BQ;
}

/* One query tile: blockIdx.x = query tile, blockIdx.y = b * Hl + h. */
template <class S> static __global__
void attention_fwd_kernel(att_call a)
{
    DYN_SHARED(float, sm);
    int hd = a.hd;
    float *qs = sm, *ks = qs + ATT_BQ * hd, *vs = ks + ATT_BK * hd, *os = vs + ATT_BK * hd;
    float *ss = os + ATT_BQ * hd, *mrow = ss + ATT_BQ * ATT_SLD, *lrow = mrow + ATT_BQ;
    float *alpha = lrow + ATT_BQ;
    int bh = blockIdx.y, b = bh / a.Hl, h = bh % a.Hl, C = a.Hl * hd;
    int kh = att_kv_head(h, a.Hl, a.KVl);
    size_t ldq = (size_t)a.B * a.ldq, ldk = (size_t)a.B * a.ldkv, ldo = (size_t)a.B * C;
    const S *q = as<S>(a.q) + att_head(a.ldq, b, h, hd);
    const S *k = as<S>(a.k) + att_head(a.ldkv, b, kh, hd);
    const S *v = as<S>(a.v) + att_head(a.ldkv, b, kh, hd);
    float *lse = a.lse + (size_t)bh * a.lse_ld;
    int q0 = blockIdx.x * ATT_BQ, nq = MIN(ATT_BQ, a.Tq - q0), kend = att_key_end(a, q0, nq);

    att_tile_in(qs, q + q0 * ldq, ldq, nq, ATT_BQ, hd, a.scale);
    for (int x = threadIdx.x; x < ATT_BQ * hd; x += blockDim.x) os[x] = 0.0f;
    if (threadIdx.x < ATT_BQ) {
        mrow[threadIdx.x] = -INFINITY;
        lrow[threadIdx.x] = 0.0f;
    }
    for (int k0 = 0; k0 < kend; k0 += ATT_BK) {
        int nk = MIN(ATT_BK, a.Tk - k0);
        __syncthreads();                                 /* the previous tile is consumed */
        att_tile_in(ks, k + k0 * ldk, ldk, nk, ATT_BK, hd, 1.0f);
        att_tile_in(vs, v + k0 * ldk, ldk, nk, ATT_BK, hd, 1.0f);
        __syncthreads();
        for (int x = threadIdx.x; x < ATT_BQ * ATT_BK; x += blockDim.x) {
            int r = x / ATT_BK, c = x % ATT_BK;
            bool see = att_visible(a.causal, q0, r, ATT_BQ, k0, c, nk);
            ss[r * ATT_SLD + c] = see ? att_dot(qs + r * hd, ks + c * hd, hd) : -INFINITY;
        }
        __syncthreads();
        if (threadIdx.x < ATT_BQ) {                      /* online softmax, one row a thread */
            int r = threadIdx.x;
            float *s = ss + r * ATT_SLD, mt = mrow[r];
            for (int c = 0; c < ATT_BK; c++) mt = s[c] > mt ? s[c] : mt;
            float al = att_rescale(mrow[r], mt), l = lrow[r] * al;
            for (int c = 0; c < ATT_BK; c++) {
                bool see = att_visible(a.causal, q0, r, ATT_BQ, k0, c, nk);
                float p = see ? vexpf(s[c] - mt) : 0.0f;
                s[c] = p;
                l += p;
            }
            mrow[r] = mt;
            lrow[r] = l;
            alpha[r] = al;
        }
        __syncthreads();
        for (int x = threadIdx.x; x < ATT_BQ * hd; x += blockDim.x) {
            int r = x / hd, d = x % hd;
            float acc = os[x] * alpha[r];
            for (int c = 0; c < nk; c++) acc += ss[r * ATT_SLD + c] * vs[c * hd + d];
            os[x] = acc;
        }
    }
    __syncthreads();
    if (!a.acc)
        for (int x = threadIdx.x; x < nq * hd; x += blockDim.x) os[x] /= lrow[x / hd];
    if ((int)threadIdx.x < nq) {
        int r = threadIdx.x;
        float l = att_lse(mrow[r], lrow[r]);
        if (a.acc) {        /* the weights of the running output and of this (unnormalised) one */
            float L = att_merge_lse(lse[q0 + r], l);
            mrow[r] = att_weight(lse[q0 + r], L);
            alpha[r] = att_weight(l, L) * (1.0f / lrow[r]);
            l = L;
        }
        lse[q0 + r] = l;
    }
    __syncthreads();
    size_t at = att_head(C, b, h, hd) + q0 * ldo;
    if (!a.acc) {
        att_tile_out<S>(a.out, 0, at, ldo, os, nq, hd, 1.0f);
        return;
    }
    for (int x = threadIdx.x; x < nq * hd; x += blockDim.x) {
        int r = x / hd;
        float *acc = a.acc + at + r * ldo + x % hd;
        *acc = *acc * mrow[r] + os[x] * alpha[r];
    }
}

/* dsum[bh, i] = rowsum(dout * out) of row i of head h of batch element b, one thread a row. */
template <class S> static __global__
void attention_dsum_kernel(float *dsum, const void *dout, const void *out, int B, int T, int Hl,
                           int hd)
{
    size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (size_t)B * Hl * T) return;
    int bh = (int)(x / T), i = (int)(x % T), b = bh / Hl, h = bh % Hl, C = Hl * hd;
    size_t o = (size_t)b * C + (size_t)h * hd;
    att_dsum_rows(dsum + (size_t)bh * T, as<S>(dout) + o, as<S>(out) + o, (size_t)B * C, hd, i,
                  i + 1);
}

/* Probabilities p and score gradients ds (ATT_BQ x ATT_BK, rows of ATT_SLD) of query tile q0
** and key tile k0, recomputed from the shared tiles qs (scaled), ks, vs, dos and the rows'
** lse and dsum; zero where the key is not visible. */
static __device__
void att_tile_pds(float *ps, float *dss, const float *qs, const float *ks, const float *vs,
                  const float *dos, const float *lse, const float *dsum, int causal, int q0,
                  int nq, int k0, int nk, int hd)
{
    for (int x = threadIdx.x; x < ATT_BQ * ATT_BK; x += blockDim.x) {
        int r = x / ATT_BK, c = x % ATT_BK;
        float p = 0.0f, ds = 0.0f;
        if (att_visible(causal, q0, r, nq, k0, c, nk)) {
            p = att_prob(att_dot(qs + r * hd, ks + c * hd, hd), lse[r]);
            ds = att_dscore(p, att_dot(dos + r * hd, vs + c * hd, hd), dsum[r]);
        }
        ps[r * ATT_SLD + c] = p;
        dss[r * ATT_SLD + c] = ds;
    }
}

/* Rows [0, ATT_BQ) of lse and dsum of query tile q0 (0 past the block) into shared rows. */
static __device__ void att_rows_in(float *ls, float *ds, const float *lse, const float *dsum,
                                   int nq)
{
    if ((int)threadIdx.x < ATT_BQ) {
        ls[threadIdx.x] = (int)threadIdx.x < nq ? lse[threadIdx.x] : 0.0f;
        ds[threadIdx.x] = (int)threadIdx.x < nq ? dsum[threadIdx.x] : 0.0f;
    }
}

/* dk and dv of one key tile: blockIdx.x = key tile, blockIdx.y = b * KVl + kv head; summed
** over the kv head's query heads in increasing h. */
template <class S> static __global__
void attention_dkdv_kernel(att_call a)
{
    DYN_SHARED(float, sm);
    int hd = a.hd;
    float *qs = sm, *dos = qs + ATT_BQ * hd, *ks = dos + ATT_BQ * hd, *vs = ks + ATT_BK * hd;
    float *dks = vs + ATT_BK * hd, *dvs = dks + ATT_BK * hd, *ps = dvs + ATT_BK * hd;
    float *dss = ps + ATT_BQ * ATT_SLD, *ls = dss + ATT_BQ * ATT_SLD, *dsr = ls + ATT_BQ;
    int b = blockIdx.y / a.KVl, kh = blockIdx.y % a.KVl, C = a.Hl * hd, grp = a.Hl / a.KVl;
    size_t ldq = (size_t)a.B * a.ldq, ldk = (size_t)a.B * a.ldkv, ldo = (size_t)a.B * C;
    size_t ldg = (size_t)a.B * a.lddkv;
    const S *k = as<S>(a.k) + att_head(a.ldkv, b, kh, hd);
    const S *v = as<S>(a.v) + att_head(a.ldkv, b, kh, hd);
    int k0 = blockIdx.x * ATT_BK, nk = MIN(ATT_BK, a.Tk - k0);

    att_tile_in(ks, k + k0 * ldk, ldk, nk, ATT_BK, hd, 1.0f);
    att_tile_in(vs, v + k0 * ldk, ldk, nk, ATT_BK, hd, 1.0f);
    for (int x = threadIdx.x; x < ATT_BK * hd; x += blockDim.x) dks[x] = dvs[x] = 0.0f;
    for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        int bh = b * a.Hl + h;
        const S *q = as<S>(a.q) + att_head(a.ldq, b, h, hd);
        const S *dout = as<S>(a.dout) + att_head(C, b, h, hd);
        const float *lse = a.clse + (size_t)bh * a.lse_ld, *dsum = a.dsum + (size_t)bh * a.lse_ld;
        /* the query tiles that see this key tile: at or below the diagonal (causal), or all */
        for (int q0 = a.causal ? k0 : 0; q0 < a.Tq; q0 += ATT_BQ) {
            int nq = MIN(ATT_BQ, a.Tq - q0);
            __syncthreads();
            att_tile_in(qs, q + q0 * ldq, ldq, nq, ATT_BQ, hd, a.scale);
            att_tile_in(dos, dout + q0 * ldo, ldo, nq, ATT_BQ, hd, 1.0f);
            att_rows_in(ls, dsr, lse + q0, dsum + q0, nq);
            __syncthreads();
            att_tile_pds(ps, dss, qs, ks, vs, dos, ls, dsr, a.causal, q0, nq, k0, nk, hd);
            __syncthreads();
            for (int x = threadIdx.x; x < ATT_BK * hd; x += blockDim.x) {
                int c = x / hd, d = x % hd;
                float gv = dvs[x], gk = dks[x];
                for (int r = 0; r < nq; r++) {
                    gv += ps[r * ATT_SLD + c] * dos[r * hd + d];
                    gk += dss[r * ATT_SLD + c] * qs[r * hd + d]; /* q scaled: dk = scale ds^T q */
                }
                dvs[x] = gv;
                dks[x] = gk;
            }
        }
    }
    __syncthreads();
    size_t at = att_head(a.lddkv, b, kh, hd) + k0 * ldg;
    att_tile_out<S>(a.dk, a.add, at, ldg, dks, nk, hd, 1.0f);
    att_tile_out<S>(a.dv, a.add, at, ldg, dvs, nk, hd, 1.0f);
}

/* dq of one query tile: blockIdx.x = query tile, blockIdx.y = b * Hl + h. */
template <class S> static __global__
void attention_dq_kernel(att_call a)
{
    DYN_SHARED(float, sm);
    int hd = a.hd;
    float *qs = sm, *dos = qs + ATT_BQ * hd, *ks = dos + ATT_BQ * hd, *vs = ks + ATT_BK * hd;
    float *dqs = vs + ATT_BK * hd, *ps = dqs + ATT_BQ * hd;
    float *dss = ps + ATT_BQ * ATT_SLD, *ls = dss + ATT_BQ * ATT_SLD, *dsr = ls + ATT_BQ;
    int bh = blockIdx.y, b = bh / a.Hl, h = bh % a.Hl, C = a.Hl * hd;
    int kh = att_kv_head(h, a.Hl, a.KVl);
    size_t ldq = (size_t)a.B * a.ldq, ldk = (size_t)a.B * a.ldkv, ldo = (size_t)a.B * C;
    size_t lddq = (size_t)a.B * a.lddq;
    const S *q = as<S>(a.q) + att_head(a.ldq, b, h, hd);
    const S *k = as<S>(a.k) + att_head(a.ldkv, b, kh, hd);
    const S *v = as<S>(a.v) + att_head(a.ldkv, b, kh, hd);
    const S *dout = as<S>(a.dout) + att_head(C, b, h, hd);
    const float *lse = a.clse + (size_t)bh * a.lse_ld, *dsum = a.dsum + (size_t)bh * a.lse_ld;
    int q0 = blockIdx.x * ATT_BQ, nq = MIN(ATT_BQ, a.Tq - q0), kend = att_key_end(a, q0, nq);

    att_tile_in(qs, q + q0 * ldq, ldq, nq, ATT_BQ, hd, a.scale);
    att_tile_in(dos, dout + q0 * ldo, ldo, nq, ATT_BQ, hd, 1.0f);
    att_rows_in(ls, dsr, lse + q0, dsum + q0, nq);
    for (int x = threadIdx.x; x < ATT_BQ * hd; x += blockDim.x) dqs[x] = 0.0f;
    for (int k0 = 0; k0 < kend; k0 += ATT_BK) {
        int nk = MIN(ATT_BK, a.Tk - k0);
        __syncthreads();
        att_tile_in(ks, k + k0 * ldk, ldk, nk, ATT_BK, hd, 1.0f);
        att_tile_in(vs, v + k0 * ldk, ldk, nk, ATT_BK, hd, 1.0f);
        __syncthreads();
        att_tile_pds(ps, dss, qs, ks, vs, dos, ls, dsr, a.causal, q0, nq, k0, nk, hd);
        __syncthreads();
        for (int x = threadIdx.x; x < ATT_BQ * hd; x += blockDim.x) {
            int r = x / hd, d = x % hd;
            float g = dqs[x];
            for (int c = 0; c < nk; c++) g += dss[r * ATT_SLD + c] * ks[c * hd + d];
            dqs[x] = g;
        }
    }
    __syncthreads();
    att_tile_out<S>(a.dq, a.add, att_head(a.lddq, b, h, hd) + q0 * lddq, lddq, dqs, nq, hd,
                    a.scale);
}

/* Shared memory above the default 48 KB must be asked for, per kernel. */
template <class K> static void att_smem(K kernel, size_t bytes)
{
    if (bytes > 48 * 1024)
        RT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)bytes));
}

template <class S> static void attention_fwd_t(const att_call &a)
{
    size_t bytes = att_fwd_smem(a.hd) * sizeof(float);
    att_smem(attention_fwd_kernel<S>, bytes);
    dim3 grid(CEIL_DIV(a.Tq, ATT_BQ), a.B * a.Hl);
    KERNEL_LAUNCH(grid, ATT_THREADS, bytes, attention_fwd_kernel<S>)(a);
    RT_CUDA(cudaGetLastError());
}

/* dk, dv and dq of a call whose dsum is ready. */
template <class S> static void attention_bwd_t(const att_call &a)
{
    size_t bytes = att_bwd_smem(a.hd) * sizeof(float);
    att_smem(attention_dkdv_kernel<S>, bytes);
    att_smem(attention_dq_kernel<S>, bytes);
    dim3 gk(CEIL_DIV(a.Tk, ATT_BK), a.B * a.KVl), gq(CEIL_DIV(a.Tq, ATT_BQ), a.B * a.Hl);
    KERNEL_LAUNCH(gk, ATT_THREADS, bytes, attention_dkdv_kernel<S>)(a);
    RT_CUDA(cudaGetLastError());
    KERNEL_LAUNCH(gq, ATT_THREADS, bytes, attention_dq_kernel<S>)(a);
    RT_CUDA(cudaGetLastError());
}

/* -- Attention on tensor cores: bf16, whole causal sequences ------------------------------ */
/*
** attention_fwd and attention_bwd in bf16 with head sizes a multiple of 16 (up to FA_HD_MAX)
** run here; f32, other head sizes and the context-parallel blocks run the tiles above. The
** products are the tensor cores' m16n8k16 (bf16 in, f32 sums: fa_mma), arranged as
** FlashAttention-2 does: a block of FA_WARPS warps per tile of FA_TILE queries (forward, dq)
** or keys (dk, dv), each warp owning 16 of its rows, while the other operand's tiles pass
** through shared memory (bf16, rows padded by 16 bytes: the fragment loads of a warp hit 32
** different banks; the operands a product reads along its columns kept transposed as well).
** Scores, probabilities and their gradients never leave registers: the accumulator fragment of
** a 16 x 16 block of scores is, lane by lane, the operand fragment of the next product (hence
** the softmax's row statistics need only the 4 lanes that share a row). The probabilities and
** score gradients enter the second product rounded to bf16, as FlashAttention feeds them (the
** sums stay f32): kernels.h's attention_bf16_products, and the kernel tests' bound for it. dq
** is summed over key tiles by its own blocks (the scores and their gradients are recomputed
** there: 3 products per tile pair, beside dk and dv's 4; the forward's 2), so every sum has a
** fixed shape: deterministic, no atomics.
*/
#ifndef FA_TILE
#define FA_TILE 64                        /* queries and keys of a tile (-DFA_TILE: 32, 128) */
#endif
#define FA_WARPS (FA_TILE / 16)
#define FA_THREADS (FA_WARPS * WARP)
#define FA_HD_MAX 128
#define FA_PAD 8                          /* bf16 elements of padding per shared row */
#define FA_TP (FA_TILE + FA_PAD)          /* row length of a transposed tile (hd rows) */

typedef __nv_bfloat16 bf16_t;

/* May this path run the call? (bf16, causal whole sequences, written not added) */
static bool fa_ok(const att_call &a, rt_dtype t)
{
    return t == RT_BF16 && a.causal && a.Tq == a.Tk && a.hd % 16 == 0 && a.hd <= FA_HD_MAX &&
           !a.add;
}

/* Shared bf16 elements: row tiles (FA_TILE rows of hd + FA_PAD) and transposed tiles (hd rows
** of FA_TP), per kernel: forward q, k and v^T; dk/dv k, v, q, dout, q^T, dout^T; dq q, dout, k,
** v, k^T. The backward's lse and dsum rows (f32) follow. */
static size_t fa_smem(int hd, int rows, int transposed, int stats)
{
    return ((size_t)rows * FA_TILE * (hd + FA_PAD) + (size_t)transposed * hd * FA_TP) * 2 +
           (size_t)stats * FA_TILE * 4;
}

/* Two bf16 (lo at the lower index) as one 32-bit operand register */
static __device__ uint32_t fa_pack(bf16_t lo, bf16_t hi)
{
    uint16_t l, h;
    memcpy(&l, &lo, 2);
    memcpy(&h, &hi, 2);
    return (uint32_t)l | (uint32_t)h << 16;
}

/* x and y rounded to bf16 (round to nearest even), packed as one operand register */
static __device__ uint32_t fa_round2(float x, float y)
{
    return fa_pack(__float2bfloat16_rn(x), __float2bfloat16_rn(y));
}

/* the 32 bits at bf16 element e of shared memory (e even) */
static __device__ uint32_t fa_ld(const bf16_t *p, int e)
{
    return *reinterpret_cast<const uint32_t *>(p + e);
}

/* The lane's m16n8k16 operand fragments (PTX ISA, "mma.m16n8k16"): with g = lane / 4 and
** c = 2 (lane % 4), A (16 x 16, rows at stride ld from p) holds (g, c..c+1), (g+8, c..c+1),
** (g, c+8..c+9), (g+8, c+8..c+9); B (16 x 8) given as its transpose (8 rows of 16 at stride ld)
** holds column g's (c..c+1) and (c+8..c+9); the f32 sums D (16 x 8): (g, c..c+1), (g+8,
** c..c+1). */
static __device__ void fa_frag_a(uint32_t a[4], const bf16_t *p, int ld, int lane)
{
    int g = lane / 4, c = 2 * (lane % 4);
    a[0] = fa_ld(p, g * ld + c);
    a[1] = fa_ld(p, (g + 8) * ld + c);
    a[2] = fa_ld(p, g * ld + c + 8);
    a[3] = fa_ld(p, (g + 8) * ld + c + 8);
}

static __device__ void fa_frag_b(uint32_t b[2], const bf16_t *p, int ld, int lane)
{
    int g = lane / 4, c = 2 * (lane % 4);
    b[0] = fa_ld(p, g * ld + c);
    b[1] = fa_ld(p, g * ld + c + 8);
}

/* d += a b: one m16n8k16 on the tensor cores (the emulation: the same fragments, products in
** k order in f32) */
static __device__ void fa_mma(float d[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef GPT_CUDA_EMU
    emu::mma_m16n8k16_bf16(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* S (16 x FA_TILE f32: 8 fragments of 16 x 8) = A B^T: A 16 rows of hd at stride ld, B a row
** tile (FA_TILE rows of hd at stride ld). */
static __device__ void fa_abt(float s[FA_TILE / 8][4], const bf16_t *A, const bf16_t *B,
                              int hd, int ld, int lane)
{
    for (int n = 0; n < FA_TILE / 8; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    for (int k = 0; k < hd; k += 16) {
        uint32_t a[4];
        fa_frag_a(a, A + k, ld, lane);
        for (int n = 0; n < FA_TILE / 8; n++) {
            uint32_t b[2];
            fa_frag_b(b, B + n * 8 * ld + k, ld, lane);
            fa_mma(s[n], a, b);
        }
    }
}

/* acc (16 x hd: hd / 8 fragments) += P X: P the 16 x FA_TILE values of the f32 fragments p
** (rounded to bf16), X given transposed (hd rows of FA_TP). Fragments 2j and 2j+1 of p are,
** lane by lane, the A operand of keys 16j .. 16j+15. */
static __device__ void fa_px(float acc[][4], const float p[FA_TILE / 8][4], const bf16_t *Xt,
                             int hd, int lane)
{
    for (int j = 0; j < FA_TILE / 16; j++) {
        uint32_t a[4] = {fa_round2(p[2 * j][0], p[2 * j][1]),
                         fa_round2(p[2 * j][2], p[2 * j][3]),
                         fa_round2(p[2 * j + 1][0], p[2 * j + 1][1]),
                         fa_round2(p[2 * j + 1][2], p[2 * j + 1][3])};
        for (int n = 0; n < hd / 8; n++) {
            uint32_t b[2];
            fa_frag_b(b, Xt + n * 8 * FA_TP + 16 * j, FA_TP, lane);
            fa_mma(acc[n], a, b);
        }
    }
}

/* Rows [0, FA_TILE) of hd bf16 from global rows of stride ld (nr valid, the rest 0) into a row
** tile rows (rows of hd + FA_PAD; NULL: none) and, if t, transposed into t (hd rows of FA_TP).
** 16 bytes per load where the rows are aligned so, else 2. Consecutive threads take consecutive
** rows: the transposed stores of a warp are then consecutive too (no bank conflicts). */
static __device__ void fa_tile_in(bf16_t *rows, bf16_t *t, const uint16_t *src, size_t ld,
                                  int nr, int hd)
{
    uint16_t *d = reinterpret_cast<uint16_t *>(rows), *dt = reinterpret_cast<uint16_t *>(t);
    int ldr = hd + FA_PAD;
    if (((uintptr_t)src | ld * 2) % 16 == 0) {
        for (int x = threadIdx.x; x < FA_TILE * (hd / 8); x += blockDim.x) {
            int r = x % FA_TILE, c = x / FA_TILE * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < nr) v = *reinterpret_cast<const uint4 *>(src + r * ld + c);
            if (d) *reinterpret_cast<uint4 *>(d + r * ldr + c) = v;
            if (dt) {
                uint16_t e[8];
                memcpy(e, &v, sizeof e);
                for (int i = 0; i < 8; i++) dt[(c + i) * FA_TP + r] = e[i];
            }
        }
    } else {
        for (int x = threadIdx.x; x < FA_TILE * hd; x += blockDim.x) {
            int r = x % FA_TILE, c = x / FA_TILE;
            uint16_t e = r < nr ? src[r * ld + c] : (uint16_t)0;
            if (d) d[r * ldr + c] = e;
            if (dt) dt[c * FA_TP + r] = e;
        }
    }
}

/* The 16 x hd sum of the warp's fragments times mul, rounded to bf16, to its rows r0 + g and
** r0 + g + 8 (those below nr) of stride ld. */
static __device__ void fa_rows_out(uint16_t *dst, size_t ld, int nr, const float acc[][4],
                                   int hd, float mul, int lane)
{
    int g = lane / 4, c = 2 * (lane % 4);
    for (int n = 0; n < hd / 8; n++)
        for (int h = 0; h < 2; h++)
            if (g + 8 * h < nr)
                for (int e = 0; e < 2; e++)
                    kr_store(dst + (size_t)(g + 8 * h) * ld + n * 8 + c + e,
                             acc[n][2 * h + e] * mul);
}

/* A query head h of batch element b and its kv head kh. Its q, k, v and dout (bf16 bits) start
** at the heads' columns of row b; position t is t rows of ld{q,k,o} further. */
struct fa_head {
    int b, h, bh;
    size_t ldq, ldk, ldo;
    const uint16_t *q, *k, *v, *dout;
};

static __device__ fa_head fa_head_at(const att_call &a, int hd, int b, int h)
{
    fa_head f;
    int C = a.Hl * hd, kh = att_kv_head(h, a.Hl, a.KVl);
    f.b = b;
    f.h = h;
    f.bh = b * a.Hl + h;
    f.ldq = (size_t)a.B * a.ldq;
    f.ldk = (size_t)a.B * a.ldkv;
    f.ldo = (size_t)a.B * C;
    f.q = as<uint16_t>(a.q) + att_head(a.ldq, f.b, f.h, hd);
    f.k = as<uint16_t>(a.k) + att_head(a.ldkv, f.b, kh, hd);
    f.v = as<uint16_t>(a.v) + att_head(a.ldkv, f.b, kh, hd);
    f.dout = a.dout ? as<uint16_t>(a.dout) + att_head(C, f.b, f.h, hd) : NULL;
    return f;
}

/* The block's query head: blockIdx.y = b * Hl + h. */
static __device__ fa_head fa_head_of(const att_call &a, int hd)
{
    return fa_head_at(a, hd, blockIdx.y / a.Hl, blockIdx.y % a.Hl);
}

/* The causal mask: may query qrow see key 'key', both before their tiles' ends (nq_end,
** nk_end)? */
static __device__ bool fa_vis(int qrow, int nq_end, int key, int nk_end)
{
    return qrow < nq_end && key < nk_end && key <= qrow;
}

/* One query tile: blockIdx.x = tile, blockIdx.y = b * Hl + h; warp w owns rows 16w .. 16w+15,
** lane l rows 16w + l/4 and 16w + l/4 + 8 of them. */
template <int HD> static __global__ void fa_fwd_kernel(att_call a)
{
    DYN_SHARED(float, sm);
    const int hd = HD ? HD : a.hd, w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int ld = hd + FA_PAD, g = lane / 4, c = 2 * (lane % 4);
    const fa_head f = fa_head_of(a, hd);
    int q0 = blockIdx.x * FA_TILE, nq = MIN(FA_TILE, a.Tq - q0);
    bf16_t *qs = reinterpret_cast<bf16_t *>(sm), *ks = qs + FA_TILE * ld, *vt = ks + FA_TILE * ld;
    int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};
    float o[FA_HD_MAX / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int n = 0; n < hd / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    fa_tile_in(qs, NULL, f.q + q0 * f.ldq, f.ldq, nq, hd);
    for (int k0 = 0; k0 < q0 + nq; k0 += FA_TILE) {     /* causal: up to the last query */
        int nk = MIN(FA_TILE, a.Tk - k0);
        __syncthreads();                                 /* the previous tiles are consumed */
        fa_tile_in(ks, NULL, f.k + k0 * f.ldk, f.ldk, nk, hd);
        fa_tile_in(NULL, vt, f.v + k0 * f.ldk, f.ldk, nk, hd);
        __syncthreads();
        float s[FA_TILE / 8][4];
        fa_abt(s, qs + w * 16 * ld, ks, hd, ld, lane);
        float mx[2] = {-INFINITY, -INFINITY};
        for (int n = 0; n < FA_TILE / 8; n++)
            for (int i = 0; i < 4; i++) {
                int h = i / 2, key = k0 + n * 8 + c + i % 2;
                s[n][i] = fa_vis(row[h], q0 + nq, key, k0 + nk) ? s[n][i] * a.scale : -INFINITY;
                mx[h] = fmaxf(mx[h], s[n][i]);
            }
        float alpha[2], sum[2] = {0.0f, 0.0f};
        for (int h = 0; h < 2; h++) {                    /* the row's 4 lanes: l ^ 1, l ^ 2 */
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            float mnew = fmaxf(m[h], mx[h]);
            alpha[h] = m[h] == -INFINITY ? (mnew == -INFINITY ? 1.0f : 0.0f)
                                         : vexpf(m[h] - mnew);
            m[h] = mnew;
        }
        for (int n = 0; n < FA_TILE / 8; n++)
            for (int i = 0; i < 4; i++) {
                int h = i / 2;
                s[n][i] = s[n][i] == -INFINITY ? 0.0f : vexpf(s[n][i] - m[h]);
                sum[h] += s[n][i];
            }
        for (int h = 0; h < 2; h++) l[h] = l[h] * alpha[h] + sum[h];   /* the lane's part */
        for (int n = 0; n < hd / 8; n++)
            for (int i = 0; i < 4; i++) o[n][i] *= alpha[i / 2];
        fa_px(o, s, vt, hd, lane);
    }
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    int nr = MIN(16, nq - w * 16);
    uint16_t *out = as<uint16_t>(a.out) + att_head(a.Hl * hd, f.b, f.h, hd) +
                    (size_t)(q0 + w * 16) * f.ldo;
    for (int n = 0; n < hd / 8; n++)
        for (int i = 0; i < 4; i++) o[n][i] /= l[i / 2];
    fa_rows_out(out, f.ldo, nr, o, hd, 1.0f, lane);
    if (lane % 4 == 0)
        for (int h = 0; h < 2; h++)
            if (g + 8 * h < nr)
                a.lse[(size_t)f.bh * a.lse_ld + row[h]] = m[h] + logf(l[h]);
}

/* lse and dsum of the nr query rows from row i0 of the call's (b, h) rows. */
static __device__ void fa_stats_in(float *lse, float *dsum, const att_call &a, int bh, int i0,
                                   int nr)
{
    for (int x = threadIdx.x; x < FA_TILE; x += blockDim.x) {
        lse[x] = x < nr ? a.clse[(size_t)bh * a.lse_ld + i0 + x] : 0.0f;
        dsum[x] = x < nr ? a.dsum[(size_t)bh * a.lse_ld + i0 + x] : 0.0f;
    }
}

/* One key tile: blockIdx.x = tile, blockIdx.y = b * KVl + kv head; warp w owns keys
** 16w .. 16w+15. Over the kv head's query heads in increasing h, and over the query tiles that
** see it: s^T = k q^T, dp^T = v dout^T, p and ds, dv += p^T dout, dk += ds^T q. */
template <int HD> static __global__ void fa_dkdv_kernel(att_call a)
{
    DYN_SHARED(float, sm);
    const int hd = HD ? HD : a.hd, w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int ld = hd + FA_PAD, g = lane / 4, c = 2 * (lane % 4), grp = a.Hl / a.KVl;
    const int b = blockIdx.y / a.KVl, kh = blockIdx.y % a.KVl;
    const fa_head f0 = fa_head_at(a, hd, b, kh * grp);      /* k and v: the group's */
    int k0 = blockIdx.x * FA_TILE, nk = MIN(FA_TILE, a.Tk - k0);
    bf16_t *ks = reinterpret_cast<bf16_t *>(sm), *vs = ks + FA_TILE * ld, *qs = vs + FA_TILE * ld;
    bf16_t *dos = qs + FA_TILE * ld, *qt = dos + FA_TILE * ld, *dot = qt + hd * FA_TP;
    float *lse = reinterpret_cast<float *>(dot + hd * FA_TP), *dsum = lse + FA_TILE;
    int key[2] = {k0 + w * 16 + g, k0 + w * 16 + g + 8};
    float dk[FA_HD_MAX / 8][4], dv[FA_HD_MAX / 8][4];
    for (int n = 0; n < hd / 8; n++)
        for (int i = 0; i < 4; i++) dk[n][i] = dv[n][i] = 0.0f;
    fa_tile_in(ks, NULL, f0.k + k0 * f0.ldk, f0.ldk, nk, hd);
    fa_tile_in(vs, NULL, f0.v + k0 * f0.ldk, f0.ldk, nk, hd);
    for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        const fa_head f = fa_head_at(a, hd, b, h);
        for (int q0 = k0; q0 < a.Tq; q0 += FA_TILE) {   /* causal: the queries at or after */
            int nq = MIN(FA_TILE, a.Tq - q0);
            __syncthreads();
            fa_tile_in(qs, qt, f.q + q0 * f.ldq, f.ldq, nq, hd);
            fa_tile_in(dos, dot, f.dout + q0 * f.ldo, f.ldo, nq, hd);
            fa_stats_in(lse, dsum, a, f.bh, q0, nq);
            __syncthreads();
            float p[FA_TILE / 8][4], ds[FA_TILE / 8][4];
            fa_abt(p, ks + w * 16 * ld, qs, hd, ld, lane);      /* s^T: keys x queries */
            fa_abt(ds, vs + w * 16 * ld, dos, hd, ld, lane);    /* dp^T */
            for (int n = 0; n < FA_TILE / 8; n++)
                for (int i = 0; i < 4; i++) {
                    int col = n * 8 + c + i % 2;
                    bool vis = fa_vis(q0 + col, q0 + nq, key[i / 2], k0 + nk);
                    p[n][i] = vis ? vexpf(p[n][i] * a.scale - lse[col]) : 0.0f;
                    ds[n][i] = p[n][i] * (ds[n][i] - dsum[col]);
                }
            fa_px(dv, p, dot, hd, lane);
            fa_px(dk, ds, qt, hd, lane);
        }
    }
    int nr = MIN(16, nk - w * 16);
    size_t ldg = (size_t)a.B * a.lddkv, at = att_head(a.lddkv, b, kh, hd) + (k0 + w * 16) * ldg;
    if (nr <= 0) return;                                /* no barrier follows */
    fa_rows_out(as<uint16_t>(a.dk) + at, ldg, nr, dk, hd, a.scale, lane);
    fa_rows_out(as<uint16_t>(a.dv) + at, ldg, nr, dv, hd, 1.0f, lane);
}

/* One query tile: warp w owns queries 16w .. 16w+15. Over the key tiles it sees: s = q k^T,
** dp = dout v^T, p and ds, dq += ds k. */
template <int HD> static __global__ void fa_dq_kernel(att_call a)
{
    DYN_SHARED(float, sm);
    const int hd = HD ? HD : a.hd, w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int ld = hd + FA_PAD, g = lane / 4, c = 2 * (lane % 4);
    const fa_head f = fa_head_of(a, hd);
    int q0 = blockIdx.x * FA_TILE, nq = MIN(FA_TILE, a.Tq - q0);
    bf16_t *qs = reinterpret_cast<bf16_t *>(sm), *dos = qs + FA_TILE * ld, *ks = dos + FA_TILE * ld;
    bf16_t *vs = ks + FA_TILE * ld, *kt = vs + FA_TILE * ld;
    float *lse = reinterpret_cast<float *>(kt + hd * FA_TP), *dsum = lse + FA_TILE;
    int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};
    float dq[FA_HD_MAX / 8][4];
    for (int n = 0; n < hd / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    fa_tile_in(qs, NULL, f.q + q0 * f.ldq, f.ldq, nq, hd);
    fa_tile_in(dos, NULL, f.dout + q0 * f.ldo, f.ldo, nq, hd);
    fa_stats_in(lse, dsum, a, f.bh, q0, nq);
    for (int k0 = 0; k0 < q0 + nq; k0 += FA_TILE) {     /* causal: up to the last query */
        int nk = MIN(FA_TILE, a.Tk - k0);
        __syncthreads();
        fa_tile_in(ks, kt, f.k + k0 * f.ldk, f.ldk, nk, hd);
        fa_tile_in(vs, NULL, f.v + k0 * f.ldk, f.ldk, nk, hd);
        __syncthreads();
        float p[FA_TILE / 8][4], ds[FA_TILE / 8][4];
        fa_abt(p, qs + w * 16 * ld, ks, hd, ld, lane);      /* s: queries x keys */
        fa_abt(ds, dos + w * 16 * ld, vs, hd, ld, lane);    /* dp */
        for (int n = 0; n < FA_TILE / 8; n++)
            for (int i = 0; i < 4; i++) {
                int r = w * 16 + g + 8 * (i / 2), key = k0 + n * 8 + c + i % 2;
                bool vis = fa_vis(row[i / 2], q0 + nq, key, k0 + nk);
                float pv = vis ? vexpf(p[n][i] * a.scale - lse[r]) : 0.0f;
                ds[n][i] = pv * (ds[n][i] - dsum[r]);
            }
        fa_px(dq, ds, kt, hd, lane);
    }
    int nr = MIN(16, nq - w * 16);
    size_t ldg = (size_t)a.B * a.lddq;
    if (nr > 0)
        fa_rows_out(as<uint16_t>(a.dq) + att_head(a.lddq, f.b, f.h, hd) + (q0 + w * 16) * ldg,
                    ldg, nr, dq, hd, a.scale, lane);
}

/* HD: the head size as a constant (the fragments then live in registers), or 0 (any). */
template <int HD> static void fa_fwd_t(const att_call &a)
{
    size_t bytes = fa_smem(a.hd, 2, 1, 0);
    att_smem(fa_fwd_kernel<HD>, bytes);
    dim3 grid(CEIL_DIV(a.Tq, FA_TILE), a.B * a.Hl);
    KERNEL_LAUNCH(grid, FA_THREADS, bytes, fa_fwd_kernel<HD>)(a);
    RT_CUDA(cudaGetLastError());
}

template <int HD> static void fa_bwd_t(const att_call &a)
{
    size_t kv = fa_smem(a.hd, 4, 2, 2), q = fa_smem(a.hd, 4, 1, 2);
    att_smem(fa_dkdv_kernel<HD>, kv);
    att_smem(fa_dq_kernel<HD>, q);
    dim3 gk(CEIL_DIV(a.Tk, FA_TILE), a.B * a.KVl), gq(CEIL_DIV(a.Tq, FA_TILE), a.B * a.Hl);
    KERNEL_LAUNCH(gk, FA_THREADS, kv, fa_dkdv_kernel<HD>)(a);
    RT_CUDA(cudaGetLastError());
    KERNEL_LAUNCH(gq, FA_THREADS, q, fa_dq_kernel<HD>)(a);
    RT_CUDA(cudaGetLastError());
}

/* GPT-2's heads (64) and Llama's (128) get their own kernels. */
static void fa_fwd(const att_call &a)
{
    if (a.hd == 64) fa_fwd_t<64>(a);
    else if (a.hd == 128) fa_fwd_t<128>(a);
    else fa_fwd_t<0>(a);
}

static void fa_bwd(const att_call &a)
{
    if (a.hd == 64) fa_bwd_t<64>(a);
    else if (a.hd == 128) fa_bwd_t<128>(a);
    else fa_bwd_t<0>(a);
}

/* The kernels' grid.y is B x Hl (dk, dv: B x KVl, no more): CUDA allows 65,535 */
static void att_grid_check(const att_call &a)
{
    RT_CHECK(a.B * a.Hl <= 65535, "attention: micro-batch x heads per rank (%d x %d) is over "
             "CUDA's 65535 blocks in grid.y: lower the micro-batch size", a.B, a.Hl);
}

static void att_fwd(const att_call &a, rt_dtype t)
{
    att_grid_check(a);
    if (a.out && fa_ok(a, storage(t))) fa_fwd(a);
    else if (storage(t) == RT_BF16) attention_fwd_t<uint16_t>(a);
    else attention_fwd_t<float>(a);
}

static void att_bwd(const att_call &a, rt_dtype t)
{
    att_grid_check(a);
    if (fa_ok(a, storage(t))) fa_bwd(a);
    else if (storage(t) == RT_BF16) attention_bwd_t<uint16_t>(a);
    else attention_bwd_t<float>(a);
}

/* A call's operands, shapes and mask; the caller adds its outputs. */
static att_call att_operands(const void *q, int ldq, const void *k, const void *v, int ldkv,
                             int B, int Tq, int Tk, int Hl, int KVl, int hd, int causal,
                             float scale, int lse_ld)
{
    RT_CHECK(KVl > 0 && Hl % KVl == 0, "attention: %d query heads in groups of %d kv heads",
             Hl, KVl);
    att_call a = {};
    a.q = q;
    a.k = k;
    a.v = v;
    a.ldq = ldq;
    a.ldkv = ldkv;
    a.B = B;
    a.Tq = Tq;
    a.Tk = Tk;
    a.Hl = Hl;
    a.KVl = KVl;
    a.hd = hd;
    a.causal = causal;
    a.scale = scale;
    a.lse_ld = lse_ld;
    return a;
}

/* kernels.h: bf16 whole sequences with head sizes a multiple of 16 (fa_ok) take fa_px */
const int attention_bf16_products = 1;

/* May cuDNN's fused attention (attn_cudnn.cu) take a whole-sequence call? bf16, and the head
** sizes of the tensor-core kernels (fa_ok): the same rounding of the products either way. */
static bool cudnn_ok(int hd, rt_dtype t)
{
    return t == RT_BF16 && hd % 16 == 0 && hd <= FA_HD_MAX;
}

/* The causal attention of whole sequences: q, k, v are the parts of the qkv rows. */
static att_call att_qkv(const void *qkv, int B, int T, int Hl, int KVl, int hd, float scale,
                        rt_dtype t)
{
    size_t Q = (size_t)Hl * hd, K = (size_t)KVl * hd;
    int w = (int)(Q + 2 * K);
    return att_operands(qkv, w, elem(qkv, Q, t), elem(qkv, Q + K, t), w, B, T, T, Hl, KVl, hd, 1,
                        scale, T);
}

void attention_fwd(void *out, float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                   int hd, float scale, rt_dtype t)
{
    if (B * Hl * T == 0) return;
    att_call a = att_qkv(qkv, B, T, Hl, KVl, hd, scale, storage(t));
    if (cudnn_ok(hd, t) && cudnn_attention_fwd(out, lse, qkv, B, T, Hl, KVl, hd, scale)) return;
    a.out = out;
    a.lse = lse;
    att_fwd(a, t);
}

void attention_bwd(void *dqkv, float *dsum, const void *dout, const void *out, const float *lse,
                   const void *qkv, int B, int T, int Hl, int KVl, int hd, float scale,
                   rt_dtype t)
{
    if (B * Hl * T == 0) return;
    size_t Q = (size_t)Hl * hd, K = (size_t)KVl * hd;
    att_call a = att_qkv(qkv, B, T, Hl, KVl, hd, scale, storage(t));
    if (cudnn_ok(hd, t) &&
        cudnn_attention_bwd(dqkv, dsum, dout, out, lse, qkv, B, T, Hl, KVl, hd, scale))
        return;
    a.clse = lse;
    a.dsum = dsum;
    a.dout = dout;
    a.dq = dqkv;
    a.dk = elem(dqkv, Q, t);
    a.dv = elem(dqkv, Q + K, t);
    a.lddq = a.lddkv = (int)(Q + 2 * K);
    attention_dsum(dsum, dout, out, B, T, Hl, hd, t);
    att_bwd(a, t);
}

void attention_fwd_block(float *acc, float *lse, int lse_ld, const void *q, int ldq,
                         const void *k, const void *v, int ldkv, int B, int Tq, int Tk, int Hl,
                         int KVl, int hd, int causal, float scale, rt_dtype t)
{
    RT_CHECK(!causal || Tq == Tk, "attention_fwd_block: a causal block needs Tq (%d) == Tk (%d)",
             Tq, Tk);
    if (B * Hl * Tq == 0 || Tk == 0) return;   /* no queries or keys: nothing to merge */
    att_call a = att_operands(q, ldq, k, v, ldkv, B, Tq, Tk, Hl, KVl, hd, causal, scale,
                              lse_ld);
    a.acc = acc;
    a.lse = lse;
    att_fwd(a, t);
}

void attention_dsum(float *dsum, const void *dout, const void *out, int B, int T, int Hl, int hd,
                    rt_dtype t)
{
    size_t n = (size_t)B * Hl * T;
    if (n == 0) return;
    LAUNCH(t, attention_dsum_kernel, grid_for(n), dsum, dout, out, B, T, Hl, hd);
}

void attention_bwd_block(float *dq, float *dk, float *dv, int lddkv, const void *dout,
                         const float *lse, const float *dsum, int lse_ld, const void *q,
                         int ldq, const void *k, const void *v, int ldkv, int B, int Tq, int Tk,
                         int Hl, int KVl, int hd, int causal, float scale, rt_dtype t)
{
    RT_CHECK(!causal || Tq == Tk, "attention_bwd_block: a causal block needs Tq (%d) == Tk (%d)",
             Tq, Tk);
    if (B * Hl * Tq == 0 || Tk == 0) return;   /* no queries or keys: nothing to add */
    att_call a = att_operands(q, ldq, k, v, ldkv, B, Tq, Tk, Hl, KVl, hd, causal, scale,
                              lse_ld);
    a.clse = lse;
    a.dsum = dsum;
    a.dout = dout;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.lddq = Hl * hd;
    a.lddkv = lddkv;
    a.add = 1;
    att_bwd(a, t);
}

/* -- Llama layer: RMSNorm, rotary embedding, SwiGLU ------------------------------------------- */
/*
** RMSNorm: one warp per row for its row sums (lane l sums columns l, l + WARP, ... in order,
** then a butterfly of fixed shape adds the lanes), and a column reduction for dw. The
** pointwise kernels (rotary embedding, SwiGLU) are grid-stride loops,
** one element (rotary: one (position, pair), for every row and head of the position) per step.
** Each output element is computed by one thread in a fixed order: the results are
** deterministic, no atomics.
*/

#define GRID_STRIDE_MAX 4096u           /* blocks of a grid-stride launch (H100: 132 SMs x 8) */

/* Blocks for n items of a grid-stride loop. */
static unsigned grid_stride(size_t n) { return MIN(grid_for(n), GRID_STRIDE_MAX); }


/* The grid-stride loop over [0, n). */
#define GRID_STRIDE(k, n)                                                                    \
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < (n);                   \
         k += (size_t)gridDim.x * blockDim.x)

/* Row n of an RMSNorm, a warp's, over the lane's groups (one function for rmsnorm_fwd and
** add_rmsnorm_fwd, as layernorm_row) */
template <class S> static __device__
void rmsnorm_row(S *o, float *rstd, const S *x, const S *ws, int n, int C, float eps, int lane,
                 int vec)
{
    alignas(16) S xv[VEC(S)], wv[VEC(S)];
    float ss = 0.0f;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        for (int e = 0; e < k; e++) ss += kr_load(xv + e) * kr_load(xv + e);
    }
    float s = rms_rstd(warp_sum(ss), C, eps);
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        grp_in(wv, ws + i, k, vec);
        for (int e = 0; e < k; e++) kr_store(xv + e, kr_load(xv + e) * s * kr_load(wv + e));
        grp_out(o + i, xv, k, vec);
    }
    if (lane == 0) rstd[n] = s;
}

/* Row n = this warp's: rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * w. */
template <class S> static __global__
void rmsnorm_fwd_kernel(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                        float eps, int vec)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;                                  /* the whole warp: n is the warp's */
    rmsnorm_row(as<S>(out) + (size_t)n * C, rstd, as<S>(inp) + (size_t)n * C, as<S>(w), n, C, eps,
                lane, vec);
}

/* res = a + b, then rmsnorm_row on the row just stored (add_layernorm_fwd_kernel's scheme) */
template <class S> static __global__
void add_rmsnorm_fwd_kernel(void *res, void *out, float *rstd, const void *a, const void *b,
                            const void *w, int N, int C, float eps, int vec)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    size_t r0 = (size_t)n * C;
    add_row(as<S>(res) + r0, as<S>(a) + r0, as<S>(b) + r0, C, lane, vec);
    rmsnorm_row(as<S>(out) + r0, rstd, as<S>(res) + r0, as<S>(w), n, C, eps, lane, vec);
}

/* Row n = this warp's of the input gradient: dinp += rstd (g - xhat mean(g xhat)). */
template <class S> static __global__
void rmsnorm_bwd_rows_kernel(void *dinp, const void *dout, const void *inp, const void *w,
                             const float *rstd, int N, int C, int vec)
{
    int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const S *x = as<S>(inp) + (size_t)n * C, *d = as<S>(dout) + (size_t)n * C, *ws = as<S>(w);
    S *dx = as<S>(dinp) + (size_t)n * C;
    alignas(16) S xv[VEC(S)], dv[VEC(S)], wv[VEC(S)], ov[VEC(S)];
    float rs = rstd[n], gx = 0.0f;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        grp_in(dv, d + i, k, vec);
        grp_in(wv, ws + i, k, vec);
        for (int e = 0; e < k; e++)
            gx += kr_load(dv + e) * kr_load(wv + e) * (kr_load(xv + e) * rs);
    }
    gx = warp_sum(gx) / (float)C;
    LANE_GROUPS(S, i, k, C, lane) {
        grp_in(xv, x + i, k, vec);
        grp_in(dv, d + i, k, vec);
        grp_in(wv, ws + i, k, vec);
        grp_in(ov, dx + i, k, vec);
        for (int e = 0; e < k; e++)
            kr_store(ov + e, rms_dinp(kr_load(ov + e), kr_load(dv + e) * kr_load(wv + e),
                                      kr_load(xv + e) * rs, rs, gx));
        grp_out(dx + i, ov, k, vec);
    }
}

template <class S> static __global__
void rmsnorm_bwd_cols_kernel(float *dw, const void *dout, const void *inp, const float *rstd,
                             int N, int C)
{
    const S *d = as<S>(dout), *x = as<S>(inp);
    col_reduce<1>(dw, NULL, N, C, [=](int n, int c, float *a) {
        size_t e = (size_t)n * C + c;
        a[0] += kr_load(d + e) * (kr_load(x + e) * rstd[n]);
    });
}

/* Step k = (position t, pair i): the angle once, then pair i of every row and head of t. */
template <class S> static __global__
void rope_kernel(void *x, size_t ld, int T, int B, int H, int hd, int pos0, float theta,
                 int inverse)
{
    int npair = hd / 2;
    GRID_STRIDE(k, (size_t)T * npair) {
        int t = (int)(k / npair), i = (int)(k % npair);
        float c, s;
        rope_cos_sin(&c, &s, pos0 + t, rope_inv(i, hd, theta), inverse);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                rope_pair(as<S>(x) + ((size_t)t * B + b) * ld + (size_t)h * hd, i, npair, c, s);
    }
}

template <class S> static __global__
void swiglu_fwd_kernel(void *out, const void *gu, int N, int F)
{
    GRID_STRIDE(k, (size_t)N * F) {
        int n = (int)(k / F), i = (int)(k % F);
        swiglu_fwd_block(as<S>(out), as<S>(gu), F, n, n + 1, i, i + 1);
    }
}

template <class S> static __global__
void swiglu_bwd_kernel(void *dgu, const void *dout, const void *gu, int N, int F)
{
    GRID_STRIDE(k, (size_t)N * F) {
        int n = (int)(k / F), i = (int)(k % F);
        swiglu_bwd_block(as<S>(dgu), as<S>(dout), as<S>(gu), F, n, n + 1, i, i + 1);
    }
}

/* The same, a thread per 16-byte group of a row's F columns (F a multiple of VEC(S), the
** pointers 16-byte aligned): the group's gate, up (and dout) in registers, as a row of VEC(S)
** columns for the same kernel_rows.h functions: the same bits. */
template <class S> static __global__
void swiglu_fwd_vec_kernel(void *out, const void *gu, int N, int F)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x, G = F / VEC(S);
    if (k >= (size_t)N * G) return;
    size_t n = k / G, i = k % G * VEC(S);
    const S *g = as<S>(gu) + n * 2 * F + i;
    alignas(16) S gv[2 * VEC(S)], ov[VEC(S)];
    v16(gv, g);
    v16(gv + VEC(S), g + F);
    swiglu_fwd_block(ov, gv, (int)VEC(S), 0, 1, 0, (int)VEC(S));
    v16(as<S>(out) + n * F + i, ov);
}

template <class S> static __global__
void swiglu_bwd_vec_kernel(void *dgu, const void *dout, const void *gu, int N, int F)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x, G = F / VEC(S);
    if (k >= (size_t)N * G) return;
    size_t n = k / G, i = k % G * VEC(S);
    const S *g = as<S>(gu) + n * 2 * F + i;
    S *dg = as<S>(dgu) + n * 2 * F + i;
    alignas(16) S gv[2 * VEC(S)], dv[VEC(S)], ov[2 * VEC(S)];
    v16(gv, g);
    v16(gv + VEC(S), g + F);
    v16(dv, as<S>(dout) + n * F + i);
    swiglu_bwd_block(ov, dv, gv, (int)VEC(S), 0, 1, 0, (int)VEC(S));
    v16(dg, ov);
    v16(dg + F, ov + VEC(S));
}

void rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                 float eps, rt_dtype t)
{
    LAUNCH(t, rmsnorm_fwd_kernel, grid_rows(N), out, rstd, inp, w, N, C, eps,
           row_vec(C, t, out, inp, w, NULL));
}

void add_rmsnorm_fwd(void *res, void *out, float *rstd, const void *a, const void *b,
                     const void *w, int N, int C, float eps, rt_dtype t)
{
    LAUNCH(t, add_rmsnorm_fwd_kernel, grid_rows(N), res, out, rstd, a, b, w, N, C, eps,
           row_vec(C, t, res, out, a, b) && vec_ok(w, NULL, NULL));
}

void rmsnorm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                 const float *rstd, int N, int C, rt_dtype t)
{
    LAUNCH(t, rmsnorm_bwd_rows_kernel, grid_rows(N), dinp, dout, inp, w, rstd, N, C,
           row_vec(C, t, dinp, dout, inp, w));
    if (C > 0)
        COL_LAUNCH(t, 1, rmsnorm_bwd_cols_kernel, N, C, dw, NULL, dw, dout, inp, rstd, N, C);
}

void rope_fwd(void *x, size_t ld, int T, int B, int H, int hd, int pos0, float theta,
              int inverse, rt_dtype t)
{
    RT_CHECK(hd % 2 == 0, "rope_fwd: the head size (%d) must be even", hd);
    LAUNCH(t, rope_kernel, grid_stride((size_t)T * (hd / 2)), x, ld, T, B, H, hd, pos0, theta,
           inverse);
}

void swiglu_fwd(void *out, const void *gu, int N, int F, rt_dtype t)
{
    if (row_vec(F, t, out, gu, NULL, NULL))
        LAUNCH(t, swiglu_fwd_vec_kernel, grid_vec((size_t)N * F, t), out, gu, N, F);
    else
        LAUNCH(t, swiglu_fwd_kernel, grid_stride((size_t)N * F), out, gu, N, F);
}

void swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F, rt_dtype t)
{
    if (row_vec(F, t, dgu, dout, gu, NULL))
        LAUNCH(t, swiglu_bwd_vec_kernel, grid_vec((size_t)N * F, t), dgu, dout, gu, N, F);
    else
        LAUNCH(t, swiglu_bwd_kernel, grid_stride((size_t)N * F), dgu, dout, gu, N, F);
}

/* -- Vocabulary-parallel cross-entropy (docs/megatron.md §4.5) --------------------------------- */

/* One block (ROW_BLOCK threads) per row n = blockIdx.x: the threads stride over the columns,
** coalesced, and the block reduces (kernel_rows.h's formulas in another order). */
template <class S> static __global__
void ce_rowmax_kernel(float *mx, const void *logits, int Vl, int valid)
{
    __shared__ float sh[WARP];
    const S *row = as<S>(logits) + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, kr_load(row + j));
    m = block_max(m, sh);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

template <class S> static __global__
void ce_sums_kernel(float *sums, const void *logits, const float *mx, const int *targets, int N,
                    int Vl, int valid, int vstart)
{
    __shared__ float sh[WARP];
    int n = blockIdx.x;
    const S *row = as<S>(logits) + (size_t)n * Vl;
    float m = mx[n], e = 0.0f;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) e += vexpf(kr_load(row + j) - m);
    e = block_sum(e, sh);
    if (threadIdx.x == 0) {
        int t = targets[n] - vstart;
        sums[n] = e;
        sums[N + n] = (t >= 0 && t < valid) ? kr_load(row + t) : 0.0f;
    }
}

static __global__
void ce_loss_kernel(float *loss, const float *sums, const float *mx, int N)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) loss[n] = logf(sums[n]) + mx[n] - sums[N + n];
}

template <class S> static __global__
void ce_bwd_kernel(void *logits, const float *mx, const float *sums, const int *targets,
                   int Vl, int valid, int vstart, float dloss)
{
    int n = blockIdx.x;
    S *row = as<S>(logits) + (size_t)n * Vl;
    float inv = 1.0f / sums[n], m = mx[n];
    int t = targets[n] - vstart;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float g = 0.0f;                                  /* padding columns: 0 */
        if (j < valid) g = (vexpf(kr_load(row + j) - m) * inv - (j == t ? 1.0f : 0.0f)) * dloss;
        kr_store(row + j, g);
    }
}

/* Row n = blockIdx.x, ce_rowmax's to ce_bwd's work: each thread keeps the largest logit it
** has seen and its sum of exponentials relative to it (rescaled when the maximum rises), the
** block combines them (max, then the rescaled sums in a fixed order), thread 0 writes mx, sums
** and the loss, and the threads overwrite the row with its gradient (ce_bwd's formula). A
** thread reads and writes the row in 16-byte groups (GROUPS over the threads; vec: rows of
** Vl are 16-byte aligned), the same groups in both passes. */
template <class S> static __global__
void ce_fused_kernel(float *loss, float *mx, float *sums, void *logits, const int *targets,
                     int N, int Vl, int valid, int vstart, float dloss, int vec)
{
    __shared__ float sh[WARP];
    int n = blockIdx.x, t = targets[n] - vstart;
    S *row = as<S>(logits) + (size_t)n * Vl;
    alignas(16) S xv[VEC(S)];
    /* the target's logit, read before any thread passes the barriers below and writes */
    float tl = threadIdx.x == 0 && t >= 0 && t < valid ? kr_load(row + t) : 0.0f;
    float m = -INFINITY, e = 0.0f;
    GROUPS(S, i, k, valid, threadIdx.x, blockDim.x) {
        grp_in(xv, row + i, k, vec);
        for (int q = 0; q < k; q++) {
            float x = kr_load(xv + q);
            if (x > m) {
                e = m == -INFINITY ? 0.0f : e * vexpf(m - x);
                m = x;
            }
            e += vexpf(x - m);
        }
    }
    float M = block_max(m, sh);
    e = block_sum(m == -INFINITY ? 0.0f : e * vexpf(m - M), sh);
    if (threadIdx.x == 0) {
        mx[n] = M;
        sums[n] = e;
        sums[N + n] = tl;
        loss[n] = logf(e) + M - tl;
    }
    float inv = 1.0f / e;
    GROUPS(S, i, k, Vl, threadIdx.x, blockDim.x) {
        grp_in(xv, row + i, k, vec);
        for (int q = 0; q < k; q++) {
            int j = i + q;
            float g = 0.0f;                              /* padding columns: 0 */
            if (j < valid) g = (vexpf(kr_load(xv + q) - M) * inv - (j == t ? 1.0f : 0.0f)) * dloss;
            kr_store(xv + q, g);
        }
        grp_out(row + i, xv, k, vec);
    }
}

/* One block adds the rows (a fixed tree): the loss sum is deterministic. */
static __global__
void sum_rows_kernel(float *out, const float *x, int N)
{
    __shared__ float sh[WARP];
    float s = 0.0f;
    for (int n = threadIdx.x; n < N; n += blockDim.x) s += x[n];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = s;
}

void ce_rowmax(float *mx, const void *logits, int N, int Vl, int valid, rt_dtype t)
{
    if (N > 0) LAUNCH_WITH(t, ce_rowmax_kernel, N, ROW_BLOCK, mx, logits, Vl, valid);
}

void ce_sums(float *sums, const void *logits, const float *mx, const int *targets, int N,
             int Vl, int valid, int vstart, rt_dtype t)
{
    if (N > 0)
        LAUNCH_WITH(t, ce_sums_kernel, N, ROW_BLOCK, sums, logits, mx, targets, N, Vl, valid,
                    vstart);
}

void ce_loss(float *loss, const float *sums, const float *mx, int N)
{
    KERNEL_LAUNCH(grid_for(N), BLOCK, 0, ce_loss_kernel)(loss, sums, mx, N);
    RT_CUDA(cudaGetLastError());
}

void ce_bwd(void *logits, const float *mx, const float *sums, const int *targets, int N,
            int Vl, int valid, int vstart, float dloss, rt_dtype t)
{
    if (N > 0)
        LAUNCH_WITH(t, ce_bwd_kernel, N, ROW_BLOCK, logits, mx, sums, targets, Vl, valid,
                    vstart, dloss);
}

void ce_fused(float *loss, float *mx, float *sums, void *logits, const int *targets, int N,
              int Vl, int valid, int vstart, float dloss, rt_dtype t)
{
    if (N > 0)
        LAUNCH_WITH(t, ce_fused_kernel, N, ROW_BLOCK, loss, mx, sums, logits, targets, N, Vl,
                    valid, vstart, dloss, row_vec(Vl, t, logits, NULL, NULL, NULL));
}

void sum_rows(float *out, const float *x, int N)
{
    KERNEL_LAUNCH(1, 1024, 0, sum_rows_kernel)(out, x, N);
    RT_CUDA(cudaGetLastError());
}

/* -- AdamW (torch.optim.AdamW), gradient-norm pieces, scaling ---------------------------------- */

/* AdamW's elements, ADAMW_VEC (4) a thread: p, g, m and v as one 16-byte vector each where
** vec (the four pointers 16-byte aligned), else (and for the last partial group) element by
** element; kernel_rows.h's adamw_span either way, so the same bits. */
#define ADAMW_VEC 4

template <class S> static __device__
void adamw_group(float *p, const float *g, float *m, float *v, S *copy, size_t n, size_t i,
                 int vec, float lr, float beta1, float beta2, float eps, float wd,
                 float step_size, float bc2_sqrt, float gscale)
{
    if (vec && i + ADAMW_VEC <= n) {
        alignas(16) float pr[ADAMW_VEC], gr[ADAMW_VEC], mr[ADAMW_VEC], vr[ADAMW_VEC];
        S cr[ADAMW_VEC];
        v16(pr, p + i);
        v16(gr, g + i);
        v16(mr, m + i);
        v16(vr, v + i);
        adamw_span(pr, gr, mr, vr, copy ? cr : (S *)NULL, lr, beta1, beta2, eps, wd, step_size,
                   bc2_sqrt, gscale, 0, ADAMW_VEC);
        v16(p + i, pr);
        v16(m + i, mr);
        v16(v + i, vr);
        if (copy)
            for (int e = 0; e < ADAMW_VEC; e++) copy[i + e] = cr[e];
    } else if (i < n)
        adamw_span(p, g, m, v, copy, lr, beta1, beta2, eps, wd, step_size, bc2_sqrt, gscale, i,
                   MIN(i + ADAMW_VEC, n));
}

static int adamw_vec(const float *p, const float *g, const float *m, const float *v)
{
    return vec_ok(p, g, m) && vec_ok(v, NULL, NULL);
}

/* Blocks for n elements, ADAMW_VEC a thread */
static unsigned adamw_blocks(size_t n) { return grid_for(CEIL_DIV(n, (size_t)ADAMW_VEC)); }

template <class S> static __global__
void adamw_kernel(float *p, const float *g, float *m, float *v, void *copy, size_t n, int vec,
                  float lr, float beta1, float beta2, float eps, float wd, float step_size,
                  float bc2_sqrt, float gscale)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * ADAMW_VEC;
    adamw_group(p, g, m, v, as<S>(copy), n, i, vec, lr, beta1, beta2, eps, wd, step_size,
                bc2_sqrt, gscale);
}

/*
** Multi-tensor AdamW: a launch takes up to MT_TENSORS tensors in its arguments (no table in
** device memory, so nothing to copy); block b belongs to tensor k where first[k] <= b <
** first[k + 1], each tensor getting the blocks of its own adamw_step launch, so every element
** gets adamw_step's arithmetic.
*/
struct adamw_chunk {
    adamw_tensor t[MT_TENSORS];
    unsigned first[MT_TENSORS + 1];
    unsigned char vec[MT_TENSORS];
};

template <class S> static __global__
void adamw_multi_kernel(adamw_chunk c, float lr, float beta1, float beta2, float eps,
                        float step_size, float bc2_sqrt, float gscale)
{
    unsigned b = blockIdx.x;
    int k = 0;
    while (b >= c.first[k + 1]) k++;
    const adamw_tensor *a = &c.t[k];
    size_t i = ((size_t)(b - c.first[k]) * blockDim.x + threadIdx.x) * ADAMW_VEC;
    adamw_group(a->p, a->g, a->m, a->v, as<S>(a->copy), a->n, i, c.vec[k], lr, beta1, beta2,
                eps, a->wd, step_size, bc2_sqrt, gscale);
}

/*
** The sum of squares in double: up to SUMSQ_BLOCKS blocks (their number a function of n only)
** each reduce a grid-strided share into sumsq_part, then one warp adds the parts in a fixed
** shape. Calls on the one stream run in order, so they share sumsq_part. sumsq_multi does it
** for up to MT_TENSORS tensors a launch: blockIdx.y the tensor, the blocks past its own part
** count idle, so each tensor's sum is sumsq's alone.
*/
#define SUMSQ_BLOCKS 264                /* H100: 132 SMs x 2 */
static __device__ double sumsq_part[MT_TENSORS * SUMSQ_BLOCKS];

struct sumsq_chunk {
    const float *x[MT_TENSORS];
    size_t n[MT_TENSORS];
};

/* The parts of a sum of n squares: a function of n alone. */
static __host__ __device__ unsigned sumsq_parts(size_t n)
{
    size_t blocks = n ? CEIL_DIV(n, (size_t)BLOCK) : 1;
    return (unsigned)MIN(blocks, (size_t)SUMSQ_BLOCKS);
}

static __global__
void sumsq_kernel(sumsq_chunk c)
{
    __shared__ double sh[WARP];
    const float *x = c.x[blockIdx.y];
    size_t n = c.n[blockIdx.y];
    unsigned parts = sumsq_parts(n);
    if (blockIdx.x >= parts) return;                    /* the whole block */
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)parts * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) sumsq_part[blockIdx.y * SUMSQ_BLOCKS + blockIdx.x] = s;
}

/* Tensor k = blockIdx.x (a warp): out[k] = its parts added in a fixed shape. */
static __global__
void sumsq_total_kernel(float *out, sumsq_chunk c)
{
    int parts = (int)sumsq_parts(c.n[blockIdx.x]);
    const double *part = sumsq_part + blockIdx.x * SUMSQ_BLOCKS;
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += WARP) s += part[i];
    s = warp_sum(s);
    if (threadIdx.x == 0) out[blockIdx.x] = (float)s;
}

static __global__
void scale_kernel(float *x, size_t n, float s)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2, float gscale, void *copy,
                rt_dtype t)
{
    LAUNCH(copy ? t : RT_F32, adamw_kernel, adamw_blocks(n), p, g, m, v, copy, n,
           adamw_vec(p, g, m, v), lr, beta1, beta2, eps, wd, lr / bc1, sqrtf(bc2), gscale);
}

void adamw_multi(const adamw_tensor *ts, int count, float lr, float beta1, float beta2, float eps,
                 float bc1, float bc2, float gscale, rt_dtype t)
{
    for (int k0 = 0; k0 < count;) {
        /* a chunk: up to MT_TENSORS tensors that all have a copy or all have none */
        adamw_chunk c;
        memset(&c, 0, sizeof c);
        int k = 0;
        int with_copy = ts[k0].copy != NULL;
        for (; k < MT_TENSORS && k0 + k < count && (ts[k0 + k].copy != NULL) == with_copy; k++) {
            c.t[k] = ts[k0 + k];
            c.vec[k] = (unsigned char)adamw_vec(c.t[k].p, c.t[k].g, c.t[k].m, c.t[k].v);
            c.first[k + 1] = c.first[k] + adamw_blocks(c.t[k].n);
        }
        for (int j = k + 1; j <= MT_TENSORS; j++) c.first[j] = c.first[k];
        LAUNCH(ts[k0].copy ? t : RT_F32, adamw_multi_kernel, c.first[k], c, lr, beta1, beta2,
               eps, lr / bc1, sqrtf(bc2), gscale);
        k0 += k;
    }
}

void sumsq_multi(float *out, const float *const *x, const size_t *n, int count)
{
    for (int k0 = 0; k0 < count; k0 += MT_TENSORS) {
        int k = MIN(count - k0, MT_TENSORS);
        sumsq_chunk c;
        memset(&c, 0, sizeof c);
        for (int j = 0; j < k; j++) { c.x[j] = x[k0 + j]; c.n[j] = n[k0 + j]; }
        unsigned parts = 0;
        for (int j = 0; j < k; j++) {
            unsigned pj = sumsq_parts(c.n[j]);
            if (pj > parts) parts = pj;
        }
        KERNEL_LAUNCH(dim3(parts, k), BLOCK, 0, sumsq_kernel)(c);
        RT_CUDA(cudaGetLastError());
        KERNEL_LAUNCH(k, WARP, 0, sumsq_total_kernel)(out + k0, c);
        RT_CUDA(cudaGetLastError());
    }
}

void sumsq(float *out, const float *x, size_t n)
{
    sumsq_multi(out, &x, &n, 1);
}

void scale_inplace(float *x, size_t n, float s)
{
    KERNEL_LAUNCH(grid_for(n), BLOCK, 0, scale_kernel)(x, n, s);
    RT_CUDA(cudaGetLastError());
}

static __global__ void fill_kernel(float *x, size_t n, float v)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

void fill_f32(float *x, size_t n, float v)
{
    if (n == 0) return;
    KERNEL_LAUNCH(grid_for(n), BLOCK, 0, fill_kernel)(x, n, v);
    RT_CUDA(cudaGetLastError());
}

/* -- Mixture of experts: routing and row movements --------------------------------------------- */

static __global__ void moe_route_kernel(int *sel, float *prob, float *score, float *ssum,
                                        const float *logits, int N, int E, int k, int pre,
                                        float scale, int groups, int group_topk,
                                        const float *ebias)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        route_row(sel + (size_t)n * k, prob + (size_t)n * k, score + (size_t)n * E,
                  ssum ? ssum + n : NULL, logits + (size_t)n * E, E, k, pre, scale,
                  ssum != NULL, groups, group_topk, ebias);
}

template <class S> static __global__
void moe_route_bwd_kernel(void *dlogits, const float *dprob, const float *prob,
                          const float *scores, const float *ssum, const int *sel,
                          const float *auxg, int aux_period, const float *zg, int N, int E,
                          int k, int pre, float scale)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        route_bwd_rows(as<S>(dlogits), dprob, prob, scores, ssum, sel, auxg, aux_period, zg,
                       E, k, pre, scale, n, n + 1);
}

/* A copy: element i of out is element i % C of src row idx[i / C], or 0. */
template <class S> static __global__
void gather_rows_kernel(void *out, const void *src, const int *idx, int n, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * C) {
        int r = idx[i / C];
        as<S>(out)[i] = r < 0 ? S() : as<S>(src)[(size_t)r * C + i % C];
    }
}

template <class S> static __global__
void combine_rows_kernel(void *out, const void *src, const int *pos, int N, int k, int C)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) combine_out_rows(as<S>(out), as<S>(src), pos, k, C, n, n + 1);
}

template <class S> static __global__
void row_scale_kernel(void *y, const float *s, int n, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * C) {
        int row = (int)(i / C), col = (int)(i % C);
        row_scale_block(as<S>(y), s, C, row, row + 1, col, col + 1);
    }
}

template <class S> static __global__
void row_dot_kernel(float *out, const void *a, const void *b, int n, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) row_dot_rows(out, as<S>(a), as<S>(b), C, i, i + 1);
}

template <class S> static __global__
void add_scaled_bias_kernel(void *y, const float *s, const void *b, int n, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * C) {
        int row = (int)(i / C), col = (int)(i % C);
        add_scaled_bias_block(as<S>(y), s, as<S>(b), C, row, row + 1, col, col + 1);
    }
}

template <class S> static __global__
void scaled_bias_bwd_kernel(float *db, const float *s, const void *dy, int n, int C)
{
    const S *d = as<S>(dy);
    col_reduce<1>(db, NULL, n, C, [=](int i, int c, float *a) {
        a[0] += s[i] * kr_load(d + (size_t)i * C + c);
    });
}

template <class S> static __global__
void sum_blocks_kernel(void *out, const void *in, int nblocks, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) sum_blocks_span(as<S>(out), as<S>(in), nblocks, n, i, i + 1);
}

void moe_route(int *sel, float *prob, float *scores, float *ssum, const float *logits, int N,
               int E, int k, int pre, float scale, int groups, int group_topk,
               const float *ebias)
{
    KERNEL_LAUNCH(grid_for(N), BLOCK, 0, moe_route_kernel)(sel, prob, scores, ssum, logits, N,
                                                          E, k, pre, scale, groups, group_topk,
                                                          ebias);
    RT_CUDA(cudaGetLastError());
}

void moe_route_bwd(void *dlogits, const float *dprob, const float *prob, const float *scores,
                   const float *ssum, const int *sel, const float *auxg, int aux_period,
                   const float *zg, int N, int E, int k, int pre, float scale, rt_dtype t)
{
    LAUNCH(t, moe_route_bwd_kernel, grid_for(N), dlogits, dprob, prob, scores, ssum, sel, auxg,
           aux_period, zg, N, E, k, pre, scale);
}

void gather_rows(void *out, const void *src, const int *idx, int n, int C, rt_dtype t)
{
    size_t total = (size_t)n * C;
    if (total == 0) return;
    LAUNCH(t, gather_rows_kernel, grid_for(total), out, src, idx, n, C);
}

void combine_rows(void *out, const void *src, const int *pos, int N, int k, int C, rt_dtype t)
{
    LAUNCH(t, combine_rows_kernel, grid_for(N), out, src, pos, N, k, C);
}

void row_scale(void *y, const float *s, int n, int C, rt_dtype t)
{
    size_t total = (size_t)n * C;
    if (total == 0) return;
    LAUNCH(t, row_scale_kernel, grid_for(total), y, s, n, C);
}

void row_dot(float *out, const void *a, const void *b, int n, int C, rt_dtype t)
{
    if (n == 0) return;
    LAUNCH(t, row_dot_kernel, grid_for(n), out, a, b, n, C);
}

void add_scaled_bias(void *y, const float *s, const void *b, int n, int C, rt_dtype t)
{
    size_t total = (size_t)n * C;
    if (total == 0) return;
    LAUNCH(t, add_scaled_bias_kernel, grid_for(total), y, s, b, n, C);
}

void scaled_bias_bwd(float *db, const float *s, const void *dy, int n, int C, rt_dtype t)
{
    if (C > 0)
        COL_LAUNCH(t, 1, scaled_bias_bwd_kernel, n, C, db, NULL, db, s, dy, n, C);
}

void sum_blocks(void *out, const void *in, int nblocks, size_t n, rt_dtype t)
{
    if (n == 0) return;
    LAUNCH(t, sum_blocks_kernel, grid_for(n), out, in, nblocks, n);
}
