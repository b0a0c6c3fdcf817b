/*
** rt_cpu.c: the CPU backend (build/librt_cpu.a): host memory (counted for rt_mem_stats), GEMM
** on single-threaded
** OpenBLAS calls split over the runtime's one thread pool, Philox normals, and the rt_
** communication entry points mapped onto the MPI layer (rt_mpi.c). CPU programs link it; they
** never call OpenBLAS or MPI themselves.
*/
#define _GNU_SOURCE
#include "rt_internal.h"   // defines: rt__h_*, rt__pool_*, rt__scratch, rt__bf16_to_f32_n, ...
#include "rt_philox.h"     // defines: rt__normal_at

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

const char *rt_backend(void)
{
    return "cpu";
}

/* -- Launch -------------------------------------------------------------------------------- */

/*
** Start MPI, check the world size, hold OpenBLAS to one thread and start the
** pool (rt_threads()). See rt.h for the environment variables.
*/
void rt_init(int *argc, char ***argv, int expected_world, const char *layout)
{
    rt__mpi_init(argc, argv, expected_world, layout);
    openblas_set_num_threads(1);
    rt__pool_init(rt__default_threads());
}

/*
** Guarded barrier over the world, end MPI, stop the pool.
*/
void rt_finalize(void)
{
    rt__mpi_finalize();
    rt__pool_shutdown();
}

/* -- Groups and communication: host buffers, straight to the MPI layer --------------------- */

rt_group *rt_group_create(const char *name, const int *members, int n)
{
    return rt__group_create(name, members, n);
}

void rt_group_free(rt_group *g)
{
    rt__group_destroy(g);
}

void rt_allreduce(void *buf, size_t n, rt_dtype t, rt_op op, rt_group *g)
{
    RT_TRACE_COLL("allreduce", g, n, t, 1, op == RT_MAX ? "max" : "sum");
    rt__h_allreduce(buf, n, t, op, g);
}

void rt_allgather(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    RT_TRACE_COLL("allgather", g, n, t, 1, NULL);
    rt__h_allgather(send, recv, n, t, g);
}

void rt_reduce_scatter(const void *send, void *recv, size_t n, rt_dtype t, rt_group *g)
{
    RT_TRACE_COLL("reduce_scatter", g, n, t, 1, NULL);
    rt__h_reduce_scatter(send, recv, n, t, g);
}

void rt_alltoallv(const void *send, const size_t *scounts, const size_t *sdispls,
                  void *recv, const size_t *rcounts, const size_t *rdispls,
                  rt_dtype t, rt_group *g)
{
    RT_TRACE_COLL("alltoallv", g, 0, t, 0, NULL);
    rt__h_alltoallv(send, scounts, sdispls, recv, rcounts, rdispls, t, g);
}

void rt_broadcast(void *buf, size_t n, rt_dtype t, int root, rt_group *g)
{
    RT_TRACE_COLL("broadcast", g, n, t, 1, NULL);
    rt__h_broadcast(buf, n, t, root, g);
}

void rt_barrier(rt_group *g)
{
    if (rt__tracing)
        rt__trace("barrier %s", g ? g->name : "world");
    rt__h_barrier(g ? g : rt__world, "barrier");
}

void rt_p2p(const rt_p2p_op *ops, int nops)
{
    if (rt__tracing)
        rt__trace_p2p(ops, nops);
    rt__h_p2p(ops, nops);
}

void rt_sync(void)
{
}

/* -- Memory -------------------------------------------------------------------------------- */

/* Zero-filled host memory aligned to 256 bytes (as cudaMalloc's). */
static void *host_alloc(size_t bytes, const char *op)
{
    size_t sz = (bytes + 255) & ~(size_t)255;
    void *p = aligned_alloc(256, sz ? sz : 256);
    if (!p)
        rt__die("out of memory: %s(%zu)", op, bytes);
    memset(p, 0, sz ? sz : 256);
    return p;
}

/*
** rt.h's device memory, which is host memory here; counted (the bytes requested) for
** rt_mem_stats. Aborts naming the size when out of memory.
*/
void *rt_malloc(size_t bytes)
{
    void *p = host_alloc(bytes, "rt_malloc");
    rt__mem_add(p, bytes);
    return p;
}

void rt_free(void *p)
{
    if (!p)
        return;
    rt__mem_remove(p, "rt_free");
    free(p);
}

void rt_memcpy(void *dst, const void *src, size_t bytes, rt_copy kind)
{
    RT_CHECK((unsigned)kind <= RT_H2H, "rt_memcpy: invalid copy kind %d", (int)kind);
    if (bytes)
        memmove(dst, src, bytes);
}

void rt_memset0(void *p, size_t bytes)
{
    if (bytes)
        memset(p, 0, bytes);
}

void *rt_host_malloc(size_t bytes)
{
    return host_alloc(bytes, "rt_host_malloc");
}

void rt_host_free(void *p)
{
    free(p);
}

/* -- GEMM ---------------------------------------------------------------------------------- */

/* Threading (measured with bench/runtime_bench on the 2-core dev VM, OpenBLAS 0.3.21
** pthread): OpenBLAS is held to one thread and rt_gemm splits C into column (or row) blocks,
** one single-threaded cblas_sgemm per pool thread. At the GPT-2 124M shapes (B*T = 256) this
** gives 198 GFLOP/s on 2 threads against OpenBLAS's own 201 (1 thread: 102 vs 102), and
** 181-192 against 72-136 for per-head batched attention GEMMs, where OpenBLAS's threading
** cannot help. The same pool runs the generated elementwise loops, so no second set of
** threads ever spins beside it: one MLP block (fc, GELU, proj) took 17.5 ms this way, 18.3 ms
** with OpenBLAS threads beside the pool and 22.1 ms with OpenBLAS threads and a serial GELU. */

/* Below this many flops a GEMM runs on the calling thread (pool dispatch costs a few us). */
#define GEMM_PAR_MIN_FLOPS 4e6
/* Split points are multiples of this (OpenBLAS's sgemm micro-kernel width on AVX-512). */
#define GEMM_ALIGN 16

typedef struct {
    int ta, tb, m, n, k;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    long sA, sB, sC;
    int batch;
    int by_batch;       /* pool ranges are batch items; else column/row parts */
    int split_n;        /* parts split n (else m) */
    int parts;
} gemm_job;

/* C[i0:i1, j0:j1] of batch item b, one single-threaded OpenBLAS call. */
static void sgemm_block(const gemm_job *j, int b, int i0, int i1, int j0, int j1)
{
    const float *A = j->A + (long)b * j->sA, *B = j->B + (long)b * j->sB;
    float *C = j->C + (long)b * j->sC;
    const float *Ap = j->ta ? A + i0 : A + (size_t)i0 * (size_t)j->lda;
    const float *Bp = j->tb ? B + (size_t)j0 * (size_t)j->ldb : B + j0;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, i1 - i0, j1 - j0, j->k, j->alpha, Ap,
                j->lda, Bp, j->ldb, j->beta, C + (size_t)i0 * (size_t)j->ldc + j0, j->ldc);
}

static int split_at(int dim, int part, int parts)
{
    if (part >= parts)
        return dim;
    long at = (long)dim * part / parts;
    at = (at + GEMM_ALIGN / 2) / GEMM_ALIGN * GEMM_ALIGN;
    return at > dim ? dim : (int)at;
}

static void gemm_body(void *ctx, int lo, int hi)
{
    const gemm_job *j = ctx;
    if (j->by_batch) {
        for (int b = lo; b < hi; b++)
            sgemm_block(j, b, 0, j->m, 0, j->n);
        return;
    }
    for (int p = lo; p < hi; p++) {
        int dim = j->split_n ? j->n : j->m;
        int a = split_at(dim, p, j->parts), z = split_at(dim, p + 1, j->parts);
        if (z <= a)
            continue;
        for (int b = 0; b < j->batch; b++) {
            if (j->split_n)
                sgemm_block(j, b, 0, j->m, a, z);
            else
                sgemm_block(j, b, a, z, 0, j->n);
        }
    }
}

typedef struct {
    const uint16_t *src;
    float *dst;
    int rows, cols, ld;
    long stride;        /* source elements between batch items */
    int batch;
} widen_job;

static void widen_body(void *ctx, int lo, int hi)
{
    const widen_job *w = ctx;
    for (int r = lo; r < hi; r++) {
        int b = r / w->rows, i = r % w->rows;
        rt__bf16_to_f32_n(w->dst + (size_t)r * (size_t)w->cols,
                          w->src + b * w->stride + (long)i * w->ld, (size_t)w->cols);
    }
}

/* Widen a bf16 operand (batch items of rows x cols at row stride ld) into packed f32. */
static const float *widen(int slot, const void *src, int rows, int cols, int ld, long stride,
                          int batch, long *new_stride)
{
    int nb = stride == 0 ? 1 : batch;
    float *dst = rt__scratch(slot, (size_t)nb * (size_t)rows * (size_t)cols * sizeof(float));
    widen_job w = { src, dst, rows, cols, ld, stride, nb };
    rt_parallel_for(nb * rows, widen_body, &w);
    *new_stride = stride == 0 ? 0 : (long)rows * cols;
    return dst;
}

/* C = beta * C (k == 0 or alpha == 0); beta == 0 writes zeros without reading C. */
static void scale_c(float *C, int m, int n, int ldc, long sC, int batch, float beta)
{
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < m; i++) {
            float *row = C + b * sC + (long)i * ldc;
            for (int j = 0; j < n; j++)
                row[j] = beta == 0.0f ? 0.0f : beta * row[j];
        }
}

/*
** The GEMM of rt.h on the CPU: validates, widens bf16 operands to f32, then runs
** single-threaded OpenBLAS calls on the pool (by batch item when there are at least as many
** items as threads, else by column or row blocks of C), or inline when small or nested.
*/
void rt_gemm(int ta, int tb, int m, int n, int k, float alpha,
             const void *A, int lda, long sA, const void *B, int ldb, long sB,
             float beta, void *C, int ldc, long sC, int batch, rt_dtype ab, rt_dtype c)
{
    int what = rt__gemm_check(ta, tb, m, n, k, alpha, A, lda, B, ldb, C, ldc, batch, ab, c);
    if (what == RT__GEMM_NONE)
        return;
    if (what == RT__GEMM_SCALE) {
        scale_c(C, m, n, ldc, sC, batch, beta);
        return;
    }
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;

    gemm_job j = { ta != 0, tb != 0, m, n, k, alpha, beta, A, B, C, lda, ldb, ldc,
                   sA, sB, sC, batch, 0, 0, 1 };
    if (ab == RT_BF16) {
        j.A = widen(0, A, arows, acols, lda, sA, batch, &j.sA);
        j.lda = acols;
        j.B = widen(1, B, brows, bcols, ldb, sB, batch, &j.sB);
        j.ldb = bcols;
    }
    int t = rt_threads();
    double flops = 2.0 * m * n * (double)k * batch;
    if (t <= 1 || rt__in_parallel() || flops < GEMM_PAR_MIN_FLOPS) {
        j.by_batch = 1;
        gemm_body(&j, 0, batch);
        return;
    }
    if (batch >= t) {
        j.by_batch = 1;
        rt_parallel_for(batch, gemm_body, &j);
        return;
    }
    j.split_n = n >= m;
    int dim = j.split_n ? n : m;
    j.parts = (dim + GEMM_ALIGN - 1) / GEMM_ALIGN;
    if (j.parts > t)
        j.parts = t;
    rt_parallel_for(j.parts, gemm_body, &j);
}

/* -- Randomness ---------------------------------------------------------------------------- */

typedef struct {
    float *dst;
    int cols, ld;
    uint64_t seed, stream, first, gld;
    double mean, std;
} rng_job;

static void rng_body(void *ctx, int lo, int hi)
{
    const rng_job *r = ctx;
    for (int i = lo; i < hi; i++) {
        float *row = r->dst + (size_t)i * (size_t)r->ld;
        uint64_t base = r->first + (uint64_t)i * r->gld;
        for (int j = 0; j < r->cols; j++)
            row[j] = (float)(r->mean + r->std * rt__normal_at(r->seed, r->stream,
                                                                base + (uint64_t)j));
    }
}

/*
** The normals of rt.h (Philox-4x32-10 + Box-Muller), rows split over the pool.
*/
void rt_rng_normal(float *dst, int rows, int cols, int ld, uint64_t seed, uint64_t stream,
                   uint64_t first, uint64_t gld, float mean, float std)
{
    RT_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "rt_rng_normal: rows %d, cols %d, ld %d",
             rows, cols, ld);
    if (rows == 0 || cols == 0)
        return;
    RT_CHECK(dst, "rt_rng_normal: NULL dst");
    rng_job r = { dst, cols, ld, seed, stream, first, gld, mean, std };
    rt_parallel_for(rows, rng_body, &r);
}
