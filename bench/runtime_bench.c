/*
** bench/runtime_bench.c: what the CPU runtime costs, side by side with what it wraps. Not a
** test (nothing is asserted); run by bench/runtime_bench.sh.
**   runtime_bench comm      (under mpirun) rt_allreduce / rt_allgather / rt_reduce_scatter vs
**                           the blocking MPI calls on the same sizes: time and bus bandwidth
**   runtime_bench gemm      rt_gemm GFLOP/s at GPT-2 124M training shapes (B*T = 256) vs
**                           cblas_sgemm with OpenBLAS's own threads, at 1 and 2 threads
**   runtime_bench threads   the threading trap: GEMM + elementwise sequences with one pool
**                           vs OpenBLAS threads beside a pool; rt_parallel_for dispatch cost
*/
#define _POSIX_C_SOURCE 200809L
#include "rt.h"             // defines: rt_init, rt_gemm, rt_allreduce, rt_parallel_for, ...
#include "rt_internal.h"    // defines: rt__pool_init / rt__pool_shutdown (to vary the pool)

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* -- Communication --------------------------------------------------------------------------- */

enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_P2P, NOPS };
static const char *const op_name[NOPS] = { "allreduce", "allgather", "reduce-scatter",
                                           "p2p exchange" };

/* One timed call (seconds, the slowest rank's): rt (impl 0) or raw MPI (impl 1). */
static double time_comm(int op, int impl, float *a, float *b, size_t n, MPI_Comm raw, int iters)
{
    int p = rt_world(), partner = rt_rank() ^ 1;
    if (partner >= p)
        partner = rt_rank();
    MPI_Barrier(raw);
    double t0 = rt_now();
    for (int it = 0; it < iters; it++) {
        if (impl == 0) {
            if (op == OP_ALLREDUCE)
                rt_allreduce(a, n, RT_F32, RT_SUM, rt_group_world());
            else if (op == OP_ALLGATHER)
                rt_allgather(a, b, n / (size_t)p, RT_F32, rt_group_world());
            else if (op == OP_REDUCE_SCATTER)
                rt_reduce_scatter(a, b, n / (size_t)p, RT_F32, rt_group_world());
            else {
                rt_p2p_op ops[2] = { { 0, b, n, RT_F32, partner, 0 },
                                     { 1, a, n, RT_F32, partner, 0 } };
                rt_p2p(ops, 2);
            }
        } else {
            if (op == OP_ALLREDUCE)
                MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, raw);
            else if (op == OP_ALLGATHER)
                MPI_Allgather(a, (int)(n / (size_t)p), MPI_FLOAT, b, (int)(n / (size_t)p),
                              MPI_FLOAT, raw);
            else if (op == OP_REDUCE_SCATTER)
                MPI_Reduce_scatter_block(a, b, (int)(n / (size_t)p), MPI_FLOAT, MPI_SUM, raw);
            else
                MPI_Sendrecv(a, (int)n, MPI_FLOAT, partner, 1, b, (int)n, MPI_FLOAT, partner, 1,
                             raw, MPI_STATUS_IGNORE);
        }
    }
    double t = (rt_now() - t0) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, raw);
    return t;
}

static void bench_comm(void)
{
    int p = rt_world(), me = rt_rank();
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    static const size_t sizes[] = { 1 << 8, 1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24 };
    size_t maxn = sizes[sizeof sizes / sizeof sizes[0] - 1];
    float *a = rt_malloc(maxn * sizeof(float)), *b = rt_malloc(maxn * sizeof(float));
    if (me == 0) {
        printf("comm: %d ranks, f32; time per call (median of 7 rounds, slowest rank), bus "
               "bandwidth GB/s (allreduce 2(p-1)/p, gather/scatter (p-1)/p of the full buffer, "
               "p2p: bytes each way; rt_p2p vs MPI_Sendrecv with rank^1)\n", p);
        printf("%-15s %10s %11s %11s %9s %9s %8s\n", "op", "bytes", "rt us", "MPI us",
               "rt GB/s", "MPI GB/s", "rt/MPI");
    }
    for (int op = 0; op < NOPS; op++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t n = sizes[s] / (size_t)p * (size_t)p;
            size_t bytes = n * sizeof(float);
            int iters = bytes <= (1 << 16) ? 200 : bytes <= (1 << 22) ? 20 : 4;
            double tr[7], tm[7];
            time_comm(op, 0, a, b, n, raw, 2);
            time_comm(op, 1, a, b, n, raw, 2);
            for (int rep = 0; rep < 7; rep++) {     /* alternate to share any drift */
                tr[rep] = time_comm(op, 0, a, b, n, raw, iters);
                tm[rep] = time_comm(op, 1, a, b, n, raw, iters);
            }
            double r = median(tr, 7), m = median(tm, 7);
            double f = op == OP_ALLREDUCE ? 2.0 * (p - 1) / p
                       : op == OP_P2P ? 1.0 : (double)(p - 1) / p;
            if (me == 0)
                printf("%-15s %10zu %11.1f %11.1f %9.2f %9.2f %8.3f\n", op_name[op], bytes,
                       r * 1e6, m * 1e6, f * (double)bytes / r * 1e-9,
                       f * (double)bytes / m * 1e-9, r / m);
        }
    }
    rt_free(a);
    rt_free(b);
    MPI_Comm_free(&raw);
}

/* -- GEMM ------------------------------------------------------------------------------------ */

typedef struct { const char *name; int ta, tb, m, n, k; float beta; int batch; } shape;

/* GPT-2 124M, B*T = 256 tokens, C = 768, vocab padded to 50304; weights W[out, in]:
** forward Y = X W^T, input grad dX = dY W, weight grad dW += dY^T X. */
#define GPT2_SHAPES(name, out, in) \
    { name " fwd", 0, 1, 256, out, in, 0.0f, 1 }, \
    { name " dX",  0, 0, 256, in, out, 0.0f, 1 }, \
    { name " dW",  1, 0, out, in, 256, 1.0f, 1 }
static const shape shapes[] = {
    GPT2_SHAPES("qkv", 2304, 768),
    GPT2_SHAPES("attn proj", 768, 768),
    GPT2_SHAPES("fc", 3072, 768),
    GPT2_SHAPES("fc proj", 768, 3072),
    GPT2_SHAPES("lm head", 50304, 768),
    /* attention with B = 1, T = 256, 12 heads of 64: S = Q K^T and O = P V, batched by head */
    { "attn QK^T x12", 0, 1, 256, 256, 64, 0.0f, 12 },
    { "attn PV x12", 0, 0, 256, 64, 256, 0.0f, 12 },
};

static void set_pool(int threads)
{
    rt__pool_shutdown();
    rt__pool_init(threads);
}

/* GFLOP/s of one timed round (>= 0.1 s) of one shape: impl 0 = rt_gemm on a pool of
** 'threads', 1 = cblas_sgemm with OpenBLAS running 'threads' threads itself. */
static double gflops(const shape *s, int impl, int threads, float *A, float *B, float *C)
{
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    long sa = (long)s->m * s->k, sb = (long)s->k * s->n, sc = (long)s->m * s->n;
    if (impl == 0) {
        openblas_set_num_threads(1);
        set_pool(threads);
    } else {
        set_pool(1);
        openblas_set_num_threads(threads);
    }
    int iters = 0;
    double t0 = rt_now(), el;
    do {
        if (impl == 0)
            rt_gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, A, lda, sa, B, ldb, sb, s->beta, C,
                    s->n, sc, s->batch, RT_F32, RT_F32);
        else
            for (int b = 0; b < s->batch; b++)
                cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                            s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k, 1.0f,
                            A + b * sa, lda, B + b * sb, ldb, s->beta, C + b * sc, s->n);
        iters++;
        el = rt_now() - t0;
    } while (el < 0.1);
    if (impl == 1 && threads > 1) {
        /* OpenBLAS's idle workers keep spinning for a while after a threaded call (the trap
        ** bench_threads shows); let them go to sleep before the next measurement */
        struct timespec ts = { 0, 300 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return 2.0 * s->m * s->n * (double)s->k * s->batch * iters / el * 1e-9;
}

static void bench_gemm(void)
{
    size_t maxa = 0, maxb = 0, maxc = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t a = (size_t)s->m * s->k * s->batch, b = (size_t)s->k * s->n * s->batch;
        size_t c = (size_t)s->m * s->n * s->batch;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    float *A = rt_malloc(maxa * 4), *B = rt_malloc(maxb * 4), *C = rt_malloc(maxc * 4);
    for (size_t i = 0; i < maxa; i++)
        A[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < maxb; i++)
        B[i] = (float)((i * 5) % 11) * 0.01f;
    printf("gemm: GFLOP/s, f32, GPT-2 124M shapes at B*T = 256 (median of 5 rounds, the four "
           "columns measured in turn in each round; OpenBLAS columns: cblas_sgemm with its own "
           "threads, batches as a loop of calls)\n");
    printf("%-16s %5s %5s %5s   %9s %9s   %9s %9s\n", "shape", "m", "n", "k", "OpenBLAS1",
           "rt 1thr", "OpenBLAS2", "rt 2thr");
    double sum[4] = { 0, 0, 0, 0 };
    int cnt = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        double r[4][5], g[4];
        for (int j = 0; j < 4; j++)             /* warm-up */
            gflops(s, j % 2 == 0, j < 2 ? 1 : 2, A, B, C);
        for (int rep = 0; rep < 5; rep++)
            for (int j = 0; j < 4; j++)
                r[j][rep] = gflops(s, j % 2 == 0, j < 2 ? 1 : 2, A, B, C);
        for (int j = 0; j < 4; j++)
            g[j] = median(r[j], 5);
        printf("%-16s %5d %5d %5d   %9.1f %9.1f   %9.1f %9.1f\n", s->name, s->m, s->n, s->k,
               g[0], g[1], g[2], g[3]);
        for (int j = 0; j < 4; j++)
            sum[j] += log(g[j]);
        cnt++;
    }
    printf("%-16s %17s   %9.1f %9.1f   %9.1f %9.1f\n", "geometric mean", "", exp(sum[0] / cnt),
           exp(sum[1] / cnt), exp(sum[2] / cnt), exp(sum[3] / cnt));
    rt_free(A);
    rt_free(B);
    rt_free(C);
}

/* -- Threading trap -------------------------------------------------------------------------- */

typedef struct { float *x; int cols; } ew_ctx;

/* A GELU-like elementwise pass over rows (what a generated kernel would do). */
static void gelu_rows(void *ctx, int lo, int hi)
{
    const ew_ctx *c = ctx;
    for (int i = lo; i < hi; i++) {
        float *r = c->x + (size_t)i * (size_t)c->cols;
        for (int j = 0; j < c->cols; j++) {
            float v = r[j];
            r[j] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
        }
    }
}

static void noop(void *ctx, int lo, int hi)
{
    (void)ctx;
    (void)lo;
    (void)hi;
}

/* One "layer": fc forward (256 x 3072 x 768), GELU over its output, fc proj forward. */
static double layer_seq(int design, float *X, float *W1, float *H, float *W2, float *Y)
{
    ew_ctx c = { H, 3072 };
    double t0 = rt_now();
    for (int it = 0; it < 10; it++) {
        if (design == 0) {          /* rt: one pool, OpenBLAS held to 1 thread */
            rt_gemm(0, 1, 256, 3072, 768, 1.0f, X, 768, 0, W1, 768, 0, 0.0f, H, 3072, 0, 1,
                    RT_F32, RT_F32);
            rt_parallel_for(256, gelu_rows, &c);
            rt_gemm(0, 1, 256, 768, 3072, 1.0f, H, 3072, 0, W2, 3072, 0, 0.0f, Y, 768, 0, 1,
                    RT_F32, RT_F32);
        } else {                    /* OpenBLAS threads for GEMMs, elementwise on the pool */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 256, 3072, 768, 1.0f, X, 768,
                        W1, 768, 0.0f, H, 3072);
            if (design == 1)
                rt_parallel_for(256, gelu_rows, &c);
            else
                gelu_rows(&c, 0, 256);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 256, 768, 3072, 1.0f, H, 3072,
                        W2, 3072, 0.0f, Y, 768);
        }
    }
    return (rt_now() - t0) / 10;
}

static void bench_threads(void)
{
    float *X = rt_malloc(256 * 768 * 4), *W1 = rt_malloc(3072 * 768 * 4);
    float *H = rt_malloc(256 * 3072 * 4), *W2 = rt_malloc(768 * 3072 * 4);
    float *Y = rt_malloc(256 * 768 * 4);
    for (int i = 0; i < 256 * 768; i++)
        X[i] = (float)(i % 17) * 0.01f;
    for (int i = 0; i < 3072 * 768; i++) {
        W1[i] = (float)(i % 13) * 0.001f;
        W2[i] = (float)(i % 11) * 0.001f;
    }
    static const char *const name[] = {
        "rt: one pool of 2 (GEMM split + elementwise), OpenBLAS 1 thread",
        "OpenBLAS 2 threads for GEMM + rt pool of 2 for elementwise",
        "OpenBLAS 2 threads for GEMM + elementwise on 1 thread",
        "everything on 1 thread",
    };
    printf("threads: one MLP block forward (fc 256x3072x768, GELU, proj 256x768x3072), "
           "ms per block (median of 9 rounds, designs in turn)\n");
    double t[4][9];
    for (int r = -1; r < 9; r++)
        for (int d = 0; d < 4; d++) {
            openblas_set_num_threads(d == 1 || d == 2 ? 2 : 1);
            set_pool(d <= 1 ? 2 : 1);
            double v = layer_seq(d == 3 ? 0 : d, X, W1, H, W2, Y);
            if (r >= 0)
                t[d][r] = v;
            if (d == 1 || d == 2) {     /* let OpenBLAS's spinning workers settle */
                struct timespec ts = { 0, 300 * 1000 * 1000 };
                nanosleep(&ts, NULL);
            }
        }
    for (int d = 0; d < 4; d++)
        printf("  %-66s %7.2f ms\n", name[d], median(t[d], 9) * 1e3);
    openblas_set_num_threads(1);
    set_pool(2);
    /* dispatch cost of an empty rt_parallel_for: back to back (workers spinning) and after
    ** 1 ms of idleness (workers asleep on the futex) */
    static const double gaps[] = { 0, 20e-6, 100e-6, 300e-6, 1e-3, 5e-3 };
    printf("  rt_parallel_for dispatch (2 threads, empty body) after an idle gap:");
    for (size_t gi = 0; gi < sizeof gaps / sizeof gaps[0]; gi++) {
        int n = gaps[gi] == 0 ? 20000 : gaps[gi] < 1e-3 ? 2000 : 200;
        double tot = 0;
        for (int i = 0; i < n; i++) {
            double until = rt_now() + gaps[gi];
            while (rt_now() < until)    /* a serial gap (the main thread busy) */
                ;
            double t0 = rt_now();
            rt_parallel_for(2, noop, NULL);
            tot += rt_now() - t0;
        }
        printf("%s %g us: %.1f us", gi ? "," : "", gaps[gi] * 1e6, tot / n * 1e6);
    }
    printf("\n");
    rt_free(X);
    rt_free(W1);
    rt_free(H);
    rt_free(W2);
    rt_free(Y);
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 0, NULL);
    const char *what = argc > 1 ? argv[1] : "comm";
    if (!strcmp(what, "comm"))
        bench_comm();
    else if (!strcmp(what, "gemm") && rt_rank() == 0)
        bench_gemm();
    else if (!strcmp(what, "threads") && rt_rank() == 0)
        bench_threads();
    rt_finalize();
    return 0;
}
