/*
** bench/runtime_bench.c: what the CPU runtime costs, side by side with what it wraps. Not a
** test (nothing is asserted); run by bench/runtime_bench.sh.
**   runtime_bench comm [N...]   (under mpirun) rt_allreduce / rt_allgather / rt_reduce_scatter
**                           / rt_p2p vs the blocking MPI calls and MPI's nonblocking ones (+
**                           MPI_Wait) on the same sizes (N: f32 elements of the full buffer):
**                           time and bus bandwidth
**   runtime_bench transport [N]   (under mpirun) rt_allreduce alone on N f32 (default 30 M):
**                           its bus bandwidth in GB/s, the median of 7 calls (what
**                           bench/plan_bench.sh gives the planner as the CPU's link rate)
**   runtime_bench overlap [N...] [--factor F]   (under mpirun) can communication overlap
**                           compute here? An allreduce of N f32 (default 30 M) blocking, a
**                           compute loop (rt_gemm parts of ~1 ms; F times the allreduce's time,
**                           default 1) alone, then the allreduce started, the loop with
**                           rt_progress after each part, and rt_wait: the time exposed in
**                           rt_wait, against the blocking call's and the compute's
**   runtime_bench rounding  (under mpirun) MPI_Allreduce vs MPI_Iallreduce f32 sums: elements
**                           whose bits differ; rt_allreduce vs its start + rt_wait
**   runtime_bench gemm [ROUNDS [THREADS]]
**                           rt_gemm GFLOP/s at GPT-2 124M training shapes (B*T = 256) and
**                           2048^3, f32 and bf16 inputs, vs cblas_sgemm with OpenBLAS's own
**                           threads and oneDNN's matmul with its own OpenMP threads, 1 and 2
**                           (or THREADS only); best of ROUNDS (5) rounds
**   runtime_bench small     per-head attention GEMMs inside rt_parallel_for: us per call of
**                           rt_gemm, OpenBLAS and oneDNN (the small-GEMM threshold)
**   runtime_bench threads   the threading trap: GEMM + elementwise sequences with one pool
**                           vs OpenBLAS threads beside a pool; rt_parallel_for dispatch cost
*/
#define _POSIX_C_SOURCE 200809L
#include "rt.h"             // defines: rt_init, rt_gemm, rt_allreduce, rt_parallel_for, ...
#include "rt_internal.h"    // defines: rt__pool_init / rt__pool_shutdown (to vary the pool)

#include <cblas.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <omp.h>
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

/* One timed call (seconds, the slowest rank's): rt (impl 0: blocking, which is its start and
** rt_wait), MPI's blocking call (1) or MPI's nonblocking one and MPI_Wait (2). */
static double time_comm(int op, int impl, float *a, float *b, size_t n, MPI_Comm raw, int iters)
{
    int p = rt_world(), partner = rt_rank() ^ 1, c = (int)(n / (size_t)p);
    if (partner >= p)
        partner = rt_rank();
    MPI_Request q = MPI_REQUEST_NULL;
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
        } else if (impl == 1) {
            if (op == OP_ALLREDUCE)
                MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, raw);
            else if (op == OP_ALLGATHER)
                MPI_Allgather(a, c, MPI_FLOAT, b, c, MPI_FLOAT, raw);
            else if (op == OP_REDUCE_SCATTER)
                MPI_Reduce_scatter_block(a, b, c, MPI_FLOAT, MPI_SUM, raw);
            else
                MPI_Sendrecv(a, (int)n, MPI_FLOAT, partner, 1, b, (int)n, MPI_FLOAT, partner, 1,
                             raw, MPI_STATUS_IGNORE);
        } else {
            if (op == OP_ALLREDUCE)
                MPI_Iallreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, raw, &q);
            else if (op == OP_ALLGATHER)
                MPI_Iallgather(a, c, MPI_FLOAT, b, c, MPI_FLOAT, raw, &q);
            else if (op == OP_REDUCE_SCATTER)
                MPI_Ireduce_scatter_block(a, b, c, MPI_FLOAT, MPI_SUM, raw, &q);
            else {
                MPI_Request qq[2];
                MPI_Irecv(b, (int)n, MPI_FLOAT, partner, 1, raw, &qq[0]);
                MPI_Isend(a, (int)n, MPI_FLOAT, partner, 1, raw, &qq[1]);
                MPI_Waitall(2, qq, MPI_STATUSES_IGNORE);
            }
            MPI_Wait(&q, MPI_STATUS_IGNORE);
        }
    }
    double t = (rt_now() - t0) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, raw);
    return t;
}

/* Element counts from the command line (from argv[first] on; "30M", "100K" allowed), or the
** defaults; returns how many. */
static int parse_sizes(int argc, char **argv, int first, size_t *out, int max, const size_t *def,
                       int ndef)
{
    int n = 0;
    for (int i = first; i < argc && n < max; i++) {
        if (argv[i][0] == '-') {
            i++;                        /* an option and its value */
            continue;
        }
        char *end;
        double v = strtod(argv[i], &end);
        if (*end == 'K' || *end == 'k')
            v *= 1e3;
        else if (*end == 'M' || *end == 'm')
            v *= 1e6;
        out[n++] = (size_t)v;
    }
    if (n == 0)
        for (; n < ndef && n < max; n++)
            out[n] = def[n];
    return n;
}

static void bench_comm(int argc, char **argv)
{
    int p = rt_world(), me = rt_rank();
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    static const size_t def[] = { 1 << 8, 1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24 };
    size_t sizes[16], maxn = 0;
    int ns = parse_sizes(argc, argv, 2, sizes, 16, def, (int)(sizeof def / sizeof def[0]));
    for (int s = 0; s < ns; s++)
        maxn = sizes[s] > maxn ? sizes[s] : maxn;
    float *a = rt_malloc(maxn * sizeof(float)), *b = rt_malloc(maxn * sizeof(float));
    if (me == 0) {
        printf("comm: %d ranks, f32; time per call (median of 7 rounds, slowest rank), bus "
               "bandwidth GB/s (allreduce 2(p-1)/p, gather/scatter (p-1)/p of the full buffer, "
               "p2p: bytes each way; rt_p2p vs MPI_Sendrecv with rank^1); rt's blocking call is "
               "its start + rt_wait; MPI nb: MPI_I<call> + MPI_Wait\n", p);
        printf("%-15s %10s %11s %11s %11s %8s %8s %8s %7s %7s\n", "op", "bytes", "rt us",
               "MPI us", "MPI nb us", "rt GB/s", "MPI GB/s", "nb GB/s", "rt/MPI", "nb/MPI");
    }
    for (int op = 0; op < NOPS; op++) {
        for (int s = 0; s < ns; s++) {
            size_t n = sizes[s] / (size_t)p * (size_t)p;
            size_t bytes = n * sizeof(float);
            int iters = bytes <= (1 << 16) ? 200 : bytes <= (1 << 22) ? 20 : bytes <= (1 << 26)
                        ? 4 : 1;
            int reps = bytes <= (1 << 26) ? 7 : 3;
            double tr[7], tm[7], tn[7];
            time_comm(op, 0, a, b, n, raw, 1);
            time_comm(op, 1, a, b, n, raw, 1);
            time_comm(op, 2, a, b, n, raw, 1);
            for (int rep = 0; rep < reps; rep++) {     /* alternate to share any drift */
                tr[rep] = time_comm(op, 0, a, b, n, raw, iters);
                tm[rep] = time_comm(op, 1, a, b, n, raw, iters);
                tn[rep] = time_comm(op, 2, a, b, n, raw, iters);
            }
            double r = median(tr, reps), m = median(tm, reps), nb = median(tn, reps);
            double f = op == OP_ALLREDUCE ? 2.0 * (p - 1) / p
                       : op == OP_P2P ? 1.0 : (double)(p - 1) / p;
            if (me == 0)
                printf("%-15s %10zu %11.1f %11.1f %11.1f %8.2f %8.2f %8.2f %7.3f %7.3f\n",
                       op_name[op], bytes, r * 1e6, m * 1e6, nb * 1e6,
                       f * (double)bytes / r * 1e-9, f * (double)bytes / m * 1e-9,
                       f * (double)bytes / nb * 1e-9, r / m, nb / m);
        }
    }
    rt_free(a);
    rt_free(b);
    MPI_Comm_free(&raw);
}

/* rt_allreduce's bus bandwidth on N f32 (argv[2], default 30 M): "transport GBS BYTES". */
static void bench_transport(int argc, char **argv)
{
    int p = rt_world();
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    static const size_t def[] = { 30000000 };
    size_t n;
    parse_sizes(argc, argv, 2, &n, 1, def, 1);
    n = n / (size_t)p * (size_t)p;
    float *a = rt_malloc(n * sizeof(float)), *b = rt_malloc(n * sizeof(float));
    double t[7];
    time_comm(OP_ALLREDUCE, 0, a, b, n, raw, 1);
    for (int rep = 0; rep < 7; rep++)
        t[rep] = time_comm(OP_ALLREDUCE, 0, a, b, n, raw, 1);
    double bus = 2.0 * (p - 1) / p * (double)(n * sizeof(float)) / median(t, 7) * 1e-9;
    if (rt_rank() == 0)
        printf("transport %.2f %zu\n", bus, n * sizeof(float));
    rt_free(a);
    rt_free(b);
    MPI_Comm_free(&raw);
}

/* -- Overlap --------------------------------------------------------------------------------- */

/* One part of the compute loop: a GEMM of GPT-2's attention projection on 64 tokens, about
** 75 MFLOP (~1 ms on one core of the dev VM). */
typedef struct { float *x, *w, *y; } compute_bufs;

static void compute_part(const compute_bufs *c)
{
    rt_gemm(0, 1, 64, 768, 768, 1.0f, c->x, 768, 0, c->w, 768, 0, 0.0f, c->y, 768, 0, 1,
            RT_F32, RT_F32);
}

/* The slowest rank's value. */
static double max_over_ranks(double v)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

static void bench_overlap(int argc, char **argv)
{
    static const size_t def[] = { 30000000 };
    size_t sizes[16];
    int ns = parse_sizes(argc, argv, 2, sizes, 16, def, 1);
    double factor = 1.0;
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--factor"))
            factor = atof(argv[i + 1]);
    int me = rt_rank(), p = rt_world();
    rt_group *g = rt_group_world();
    compute_bufs c = { rt_malloc(64 * 768 * 4), rt_malloc(768 * 768 * 4),
                       rt_malloc(64 * 768 * 4) };
    rt_rng_normal(c.x, 64, 768, 768, 1, 1, 0, 768, 0.0f, 1.0f);
    rt_rng_normal(c.w, 768, 768, 768, 1, 2, 0, 768, 0.0f, 0.02f);
    for (int i = 0; i < 20; i++)
        compute_part(&c);
    double t0 = rt_now();
    for (int i = 0; i < 50; i++)
        compute_part(&c);
    double part = max_over_ranks((rt_now() - t0) / 50);
    if (me == 0)
        printf("overlap: %d ranks, %d thread%s each, f32 sum on world; compute parts of %.2f ms "
               "(rt_gemm 64x768x768), rt_progress after each; times: median of 5 rounds, "
               "slowest rank, ms\n", p, rt_threads(), rt_threads() == 1 ? "" : "s", part * 1e3);
    if (me == 0)
        printf("%11s %9s %9s %9s %9s %9s %9s %9s %7s\n", "elements", "blocking", "compute",
               "sum", "overlap", "in wait", "progress", "hidden", "parts");
    for (int s = 0; s < ns; s++) {
        size_t n = sizes[s];
        float *buf = rt_malloc(n * sizeof(float));
        enum { REPS = 5 };
        double tb[REPS], tc[REPS], to[REPS], tw[REPS], tp[REPS];
        rt_allreduce(buf, n, RT_F32, RT_SUM, g);            /* first touch, scratch pool */
        for (int rep = 0; rep < REPS; rep++) {
            rt_barrier(NULL);
            t0 = rt_now();
            rt_allreduce(buf, n, RT_F32, RT_SUM, g);
            tb[rep] = max_over_ranks(rt_now() - t0);
        }
        double block = median(tb, REPS);
        int parts = (int)(factor * block / part + 0.5);
        parts = parts < 1 ? 1 : parts;
        for (int rep = 0; rep < REPS; rep++) {
            rt_barrier(NULL);
            t0 = rt_now();
            for (int i = 0; i < parts; i++)
                compute_part(&c);
            tc[rep] = max_over_ranks(rt_now() - t0);

            rt_barrier(NULL);
            double b0, i0, b1, i1;
            rt_comm_stats(&b0, &i0);
            t0 = rt_now();
            rt_req *q = rt_allreduce_start(buf, n, RT_F32, RT_SUM, g);
            for (int i = 0; i < parts; i++) {
                compute_part(&c);
                rt_progress();
            }
            double tw0 = rt_now();
            rt_wait(q);
            double t1 = rt_now();
            rt_comm_stats(&b1, &i1);
            to[rep] = max_over_ranks(t1 - t0);
            tw[rep] = max_over_ranks(t1 - tw0);
            tp[rep] = max_over_ranks((i1 - i0) - (b1 - b0));   /* starts and rt_progress */
        }
        double comp = median(tc, REPS), ov = median(to, REPS);
        if (me == 0)
            printf("%11zu %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7d\n", n, block * 1e3,
                   comp * 1e3, (block + comp) * 1e3, ov * 1e3, median(tw, REPS) * 1e3,
                   median(tp, REPS) * 1e3, (block + comp - ov) * 1e3, parts);
        rt_free(buf);
    }
    if (me == 0)
        printf("(sum: blocking + compute, the time without overlap; overlap: start, the parts "
               "with rt_progress, rt_wait; in wait: the time exposed in rt_wait; progress: the "
               "time inside the start and rt_progress; hidden: sum - overlap)\n");
    rt_free(c.x);
    rt_free(c.w);
    rt_free(c.y);
}

/* -- Rounding -------------------------------------------------------------------------------- */

/* Elements of n whose bits differ between a and b, summed over the ranks. */
static long count_diff(const float *a, const float *b, size_t n)
{
    long d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return d;
}

static void bench_rounding(void)
{
    static const size_t sizes[] = { 7, 1000, 10000, 100000, 1000003 };
    int me = rt_rank(), p = rt_world();
    if (me == 0)
        printf("rounding: %d ranks, f32 sums of values of mixed sign and magnitude; elements "
               "whose bits differ (summed over ranks)\n%10s %26s %26s\n", p, "elements",
               "MPI_Allreduce/Iallreduce", "rt_allreduce/start+wait");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            x[i] = ldexpf(sinf((float)i * 0.731f + (float)me * 1.37f),
                          (int)((i * 7 + (size_t)me) % 21) - 10);
        memcpy(a, x, n * 4);
        memcpy(b, x, n * 4);
        MPI_Request q;
        MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Iallreduce(MPI_IN_PLACE, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
        long dm = count_diff(a, b, n);
        float *da = rt_malloc(n * 4), *db = rt_malloc(n * 4);
        memcpy(da, x, n * 4);
        memcpy(db, x, n * 4);
        rt_allreduce(da, n, RT_F32, RT_SUM, rt_group_world());
        rt_wait(rt_allreduce_start(db, n, RT_F32, RT_SUM, rt_group_world()));
        long dr = count_diff(da, db, n);
        if (me == 0)
            printf("%10zu %26ld %26ld\n", n, dm, dr);
        rt_free(da);
        rt_free(db);
        free(x);
        free(a);
        free(b);
    }
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
static const shape peak_shape = { "2048^3", 0, 0, 2048, 2048, 2048, 0.0f, 1 };

static void set_pool(int threads)
{
    rt__pool_shutdown();
    rt__pool_init(threads);
}

/* oneDNN called directly, with its own OpenMP threads (the alternative to rt_gemm's parts on
** the pool): one primitive over the whole batch, dense operands, library scratchpad. */
typedef struct { dnnl_primitive_t prim; dnnl_memory_t mem[3]; } dnnl_call;
static dnnl_engine_t bench_engine;
static dnnl_stream_t bench_stream;

#define BENCH_DNNL(x) \
    do { dnnl_status_t st_ = (x); \
         RT_CHECK(st_ == dnnl_success, "oneDNN: %s: %s", dnnl_status2str(st_), #x); } while (0)

static void dnnl_call_make(dnnl_call *d, const shape *s, rt_dtype ab, int threads, void *A,
                           void *B, void *C)
{
    if (!bench_engine) {
        BENCH_DNNL(dnnl_engine_create(&bench_engine, dnnl_cpu, 0));
        BENCH_DNNL(dnnl_stream_create(&bench_stream, bench_engine, dnnl_stream_default_flags));
    }
    omp_set_num_threads(threads);
    dnnl_data_type_t t = ab == RT_BF16 ? dnnl_bf16 : dnnl_f32;
    long m = s->m, n = s->n, k = s->k;
    dnnl_dims_t da = { s->batch, m, k }, sa = { m * k, s->ta ? 1 : k, s->ta ? m : 1 };
    dnnl_dims_t db = { s->batch, k, n }, sb = { k * n, s->tb ? 1 : n, s->tb ? k : 1 };
    dnnl_dims_t dc = { s->batch, m, n }, sc = { m * n, n, 1 };
    dnnl_memory_desc_t md[3];
    BENCH_DNNL(dnnl_memory_desc_init_by_strides(&md[0], 3, da, t, sa));
    BENCH_DNNL(dnnl_memory_desc_init_by_strides(&md[1], 3, db, t, sb));
    BENCH_DNNL(dnnl_memory_desc_init_by_strides(&md[2], 3, dc, dnnl_f32, sc));
    dnnl_matmul_desc_t desc;
    BENCH_DNNL(dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]));
    dnnl_primitive_attr_t attr;
    BENCH_DNNL(dnnl_primitive_attr_create(&attr));
    if (s->beta != 0.0f) {
        dnnl_post_ops_t po;
        BENCH_DNNL(dnnl_post_ops_create(&po));
        BENCH_DNNL(dnnl_post_ops_append_sum(po, s->beta));
        BENCH_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    BENCH_DNNL(dnnl_primitive_desc_create(&pd, &desc, attr, bench_engine, NULL));
    BENCH_DNNL(dnnl_primitive_create(&d->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    void *ptr[3] = { A, B, C };
    for (int i = 0; i < 3; i++)
        BENCH_DNNL(dnnl_memory_create(&d->mem[i], &md[i], bench_engine, ptr[i]));
}

static void dnnl_call_run(const dnnl_call *d, int threads)
{
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, d->mem[0] }, { DNNL_ARG_WEIGHTS, d->mem[1] },
                                { DNNL_ARG_DST, d->mem[2] } };
    omp_set_num_threads(threads);
    BENCH_DNNL(dnnl_primitive_execute(d->prim, bench_stream, 3, args));
}

static void dnnl_call_free(dnnl_call *d)
{
    dnnl_primitive_destroy(d->prim);
    for (int i = 0; i < 3; i++)
        dnnl_memory_destroy(d->mem[i]);
}

enum { IMPL_RT, IMPL_OPENBLAS, IMPL_DNNL };

/* GFLOP/s of one timed round (>= 0.1 s) of one shape: rt_gemm on a pool of 'threads', or
** OpenBLAS / oneDNN (f32 or bf16 inputs) running 'threads' threads of their own. */
static double gflops(const shape *s, int impl, rt_dtype ab, int threads, void *A, void *B,
                     float *C)
{
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    long sa = (long)s->m * s->k, sb = (long)s->k * s->n, sc = (long)s->m * s->n;
    dnnl_call d;
    openblas_set_num_threads(impl == IMPL_OPENBLAS ? threads : 1);
    set_pool(impl == IMPL_RT ? threads : 1);
    if (impl == IMPL_DNNL)
        dnnl_call_make(&d, s, ab, threads, A, B, C);
    int iters = 0;
    double t0 = rt_now(), el;
    do {
        if (impl == IMPL_RT)
            rt_gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, A, lda, sa, B, ldb, sb, s->beta, C,
                    s->n, sc, s->batch, ab, RT_F32);
        else if (impl == IMPL_DNNL)
            dnnl_call_run(&d, threads);
        else
            for (int b = 0; b < s->batch; b++)
                cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                            s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k, 1.0f,
                            (float *)A + b * sa, lda, (float *)B + b * sb, ldb, s->beta,
                            C + b * sc, s->n);
        iters++;
        el = rt_now() - t0;
    } while (el < 0.1);
    if (impl == IMPL_DNNL)
        dnnl_call_free(&d);
    if (impl != IMPL_RT && threads > 1) {
        /* OpenBLAS's idle workers keep spinning for a while after a threaded call (the trap
        ** bench_threads shows; OpenMP's sleep at once under OMP_WAIT_POLICY=PASSIVE, which
        ** runtime_bench.sh sets); let them go to sleep before the next measurement */
        struct timespec ts = { 0, 300 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return 2.0 * s->m * s->n * (double)s->k * s->batch * iters / el * 1e-9;
}

/* A table: one row per shape, the columns measured in turn in each of 'rounds' rounds; the
** best round of each. On the shared 2-core VM the second core is now and then taken by other
** guests (no steal time shows), which halves a 2-thread round; the median then mixes the
** two states, the best round is the rate of an uncontended machine. */
typedef struct { const char *head; int impl, threads; rt_dtype ab; } column;

enum { MAX_ROUNDS = 50 };

static void gemm_table(const char *title, const column *cols, int ncols, int rounds, void *A32,
                       void *B32, void *A16, void *B16, float *C, double *peak)
{
    printf("%s\n%-16s %5s %5s %5s ", title, "shape", "m", "n", "k");
    for (int j = 0; j < ncols; j++)
        printf(" %9s", cols[j].head);
    printf("\n");
    double sum[8] = { 0 }, r[8][MAX_ROUNDS], g[8];
    int cnt = 0;
    for (size_t i = 0; i <= sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = i < sizeof shapes / sizeof shapes[0] ? &shapes[i] : &peak_shape;
        for (int j = 0; j < ncols; j++) {           /* warm-up */
            int bf = cols[j].ab == RT_BF16;
            gflops(s, cols[j].impl, cols[j].ab, cols[j].threads, bf ? A16 : A32,
                   bf ? B16 : B32, C);
        }
        for (int rep = 0; rep < rounds; rep++)
            for (int j = 0; j < ncols; j++) {
                int bf = cols[j].ab == RT_BF16;
                r[j][rep] = gflops(s, cols[j].impl, cols[j].ab, cols[j].threads,
                                   bf ? A16 : A32, bf ? B16 : B32, C);
            }
        printf("%-16s %5d %5d %5d ", s->name, s->m, s->n, s->k);
        for (int j = 0; j < ncols; j++) {
            g[j] = r[j][0];
            for (int rep = 1; rep < rounds; rep++)
                g[j] = r[j][rep] > g[j] ? r[j][rep] : g[j];
            printf(" %9.1f", g[j]);
            if (s != &peak_shape)
                sum[j] += log(g[j]);
            else
                peak[j] = g[j];
        }
        printf("\n");
        cnt += s != &peak_shape;
    }
    printf("%-16s %17s ", "geometric mean", "");
    for (int j = 0; j < ncols; j++)
        printf(" %9.1f", exp(sum[j] / cnt));
    printf("\n%-16s %17s ", "  % of 2048^3", "");
    for (int j = 0; j < ncols; j++)
        printf(" %8.0f%%", 100 * exp(sum[j] / cnt) / peak[j]);
    printf("\n\n");
}

/* rounds: per column and shape (best kept); threads: only the columns of that many threads
** (0: all). */
static void bench_gemm(int rounds, int threads)
{
    rounds = rounds < 1 ? 1 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    size_t maxa = (size_t)2048 * 2048, maxb = maxa, maxc = maxa;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t a = (size_t)s->m * s->k * s->batch, b = (size_t)s->k * s->n * s->batch;
        size_t c = (size_t)s->m * s->n * s->batch;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    float *A = rt_malloc(maxa * 4), *B = rt_malloc(maxb * 4), *C = rt_malloc(maxc * 4);
    uint16_t *A16 = rt_malloc(maxa * 2), *B16 = rt_malloc(maxb * 2);
    for (size_t i = 0; i < maxa; i++)
        A[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < maxb; i++)
        B[i] = (float)((i * 5) % 11) * 0.01f;
    rt__f32_to_bf16_n(A16, A, maxa);
    rt__f32_to_bf16_n(B16, B, maxb);
    printf("gemm: GFLOP/s at GPT-2 124M shapes (B*T = 256) and 2048^3, f32 C; best of %d "
           "rounds, the columns measured in turn in each round. OpenBLAS: cblas_sgemm with its "
           "own threads (batches as a loop of calls); dnnl omp: one oneDNN matmul with its own "
           "OpenMP threads (OMP_WAIT_POLICY=PASSIVE); rt: rt_gemm on a pool of 1 or 2.\n",
           rounds);
    static const column f32[] = {
        { "OpenBLAS1", IMPL_OPENBLAS, 1, RT_F32 }, { "dnnl 1", IMPL_DNNL, 1, RT_F32 },
        { "rt 1thr", IMPL_RT, 1, RT_F32 }, { "OpenBLAS2", IMPL_OPENBLAS, 2, RT_F32 },
        { "dnnl omp2", IMPL_DNNL, 2, RT_F32 }, { "rt 2thr", IMPL_RT, 2, RT_F32 },
    };
    static const column bf16[] = {
        { "dnnl 1", IMPL_DNNL, 1, RT_BF16 }, { "rt 1thr", IMPL_RT, 1, RT_BF16 },
        { "dnnl omp2", IMPL_DNNL, 2, RT_BF16 }, { "rt 2thr", IMPL_RT, 2, RT_BF16 },
    };
    column sel[8];
    int n = 0;
    double peak[8];
    for (int j = 0; j < 6; j++)
        if (!threads || f32[j].threads == threads)
            sel[n++] = f32[j];
    gemm_table("f32 inputs:", sel, n, rounds, A, B, A16, B16, C, peak);
    n = 0;
    for (int j = 0; j < 4; j++)
        if (!threads || bf16[j].threads == threads)
            sel[n++] = bf16[j];
    gemm_table("bf16 inputs:", sel, n, rounds, A, B, A16, B16, C, peak);
    rt_free(A);
    rt_free(B);
    rt_free(C);
    rt_free(A16);
    rt_free(B16);
}

/* -- Small GEMMs: per-head attention, the per-call cost ------------------------------------- */

typedef struct { int impl, ta, tb, m, n, k, lda, ldb, ldc; const float *A, *B; float *C;
                 dnnl_primitive_t prim; const dnnl_memory_desc_t *md; } small_ctx;

static void small_body(void *ctx, int lo, int hi)
{
    const small_ctx *c = ctx;
    for (int h = lo; h < hi; h++) {
        const float *A = c->A + (size_t)h * 64, *B = c->B + (size_t)h * 64;
        float *C = c->C + (size_t)h * c->m * c->ldc;
        if (c->impl == IMPL_RT)
            rt_gemm(c->ta, c->tb, c->m, c->n, c->k, 1.0f, A, c->lda, 0, B, c->ldb, 0, 0.0f, C,
                    c->ldc, 0, 1, RT_F32, RT_F32);
        else if (c->impl == IMPL_OPENBLAS)
            cblas_sgemm(CblasRowMajor, c->ta ? CblasTrans : CblasNoTrans,
                        c->tb ? CblasTrans : CblasNoTrans, c->m, c->n, c->k, 1.0f, A, c->lda,
                        B, c->ldb, 0.0f, C, c->ldc);
        else {      /* memory objects made per call, as rt_gemm does */
            dnnl_memory_t mem[3];
            void *ptr[3] = { (void *)A, (void *)B, C };
            for (int i = 0; i < 3; i++)
                BENCH_DNNL(dnnl_memory_create(&mem[i], &c->md[i], bench_engine, ptr[i]));
            dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, mem[0] }, { DNNL_ARG_WEIGHTS, mem[1] },
                                        { DNNL_ARG_DST, mem[2] } };
            omp_set_num_threads(1);
            BENCH_DNNL(dnnl_primitive_execute(c->prim, bench_stream, 3, args));
            for (int i = 0; i < 3; i++)
                dnnl_memory_destroy(mem[i]);
        }
    }
}

/* Per-head GEMMs as the library's attention calls them (q, k, v interleaved at row stride
** 3 * 768, one head per call inside rt_parallel_for over 12 heads): us per call on 1 and 2
** threads for rt_gemm, OpenBLAS and oneDNN (the primitive made once, memory objects per call;
** the shared stream is fine on the CPU). */
static void bench_small(void)
{
    static const int sh[][6] = {    /* ta tb m n k (T, head 64) */
        { 0, 1, 64, 64, 64, 0 }, { 0, 0, 64, 64, 64, 0 }, { 1, 0, 64, 64, 64, 0 },
        { 0, 1, 96, 96, 64, 0 }, { 0, 1, 112, 112, 64, 0 }, { 0, 1, 128, 128, 64, 0 },
        { 0, 0, 128, 64, 128, 0 },
        { 0, 1, 256, 256, 64, 0 }, { 0, 0, 256, 64, 256, 0 },
    };
    size_t big = (size_t)256 * 2304 * 12;
    float *A = rt_malloc(big * 4), *B = rt_malloc(big * 4), *C = rt_malloc(big * 4);
    for (size_t i = 0; i < big; i++) {
        A[i] = (float)((i * 7) % 13) * 0.01f;
        B[i] = (float)((i * 5) % 11) * 0.01f;
    }
    openblas_set_num_threads(1);
    printf("small: per-head attention GEMMs (row stride 2304 for q/k/v, 12 heads inside "
           "rt_parallel_for), us per call (median of 5 rounds); rt_gemm sends f32 GEMMs under "
           "%.1f MFLOP to OpenBLAS\n", 1.5);
    printf("%-18s %7s   %8s %8s %8s   %8s %8s %8s\n", "shape (ta tb m n k)", "MFLOP", "rt 1thr",
           "OpenBLAS", "dnnl", "rt 2thr", "OpenBLAS", "dnnl");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        int ta = sh[i][0], tb = sh[i][1], m = sh[i][2], n = sh[i][3], k = sh[i][4];
        int lda = ta ? 2304 : 2304, ldb = 2304, ldc = n;
        small_ctx c = { 0, ta, tb, m, n, k, lda, ldb, ldc, A, B, C, NULL, NULL };
        /* oneDNN on one head, 2-D with the same strides */
        dnnl_call d;
        static dnnl_memory_desc_t md[3];
        dnnl_dims_t da = { m, k }, sa = { ta ? 1 : lda, ta ? lda : 1 };
        dnnl_dims_t db = { k, n }, sb = { tb ? 1 : ldb, tb ? ldb : 1 };
        dnnl_dims_t dc = { m, n }, sc = { ldc, 1 };
        omp_set_num_threads(1);
        if (!bench_engine) {
            BENCH_DNNL(dnnl_engine_create(&bench_engine, dnnl_cpu, 0));
            BENCH_DNNL(dnnl_stream_create(&bench_stream, bench_engine,
                                          dnnl_stream_default_flags));
        }
        BENCH_DNNL(dnnl_memory_desc_init_by_strides(&md[0], 2, da, dnnl_f32, sa));
        BENCH_DNNL(dnnl_memory_desc_init_by_strides(&md[1], 2, db, dnnl_f32, sb));
        BENCH_DNNL(dnnl_memory_desc_init_by_strides(&md[2], 2, dc, dnnl_f32, sc));
        dnnl_matmul_desc_t desc;
        BENCH_DNNL(dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]));
        dnnl_primitive_desc_t pd;
        BENCH_DNNL(dnnl_primitive_desc_create(&pd, &desc, NULL, bench_engine, NULL));
        BENCH_DNNL(dnnl_primitive_create(&d.prim, pd));
        dnnl_primitive_desc_destroy(pd);
        c.prim = d.prim;
        c.md = md;
        double r[6][5];
        for (int rep = -1; rep < 5; rep++)
            for (int col = 0; col < 6; col++) {
                c.impl = col % 3 == 0 ? IMPL_RT : col % 3 == 1 ? IMPL_OPENBLAS : IMPL_DNNL;
                set_pool(col < 3 ? 1 : 2);
                long calls = 0;
                double t0 = rt_now(), el;
                do {
                    rt_parallel_for(12, small_body, &c);
                    calls += 12;
                    el = rt_now() - t0;
                } while (el < 0.05);
                if (rep >= 0)
                    r[col][rep] = el / (double)calls * 1e6 * (col < 3 ? 1 : 2);
            }
        printf("%d %d %4d %4d %4d   %7.2f  ", ta, tb, m, n, k, 2e-6 * m * n * k);
        for (int col = 0; col < 6; col++)
            printf(" %8.2f%s", median(r[col], 5), col == 2 ? "  " : "");
        printf("\n");
        dnnl_primitive_destroy(d.prim);
    }
    printf("(2-thread columns: us per call per thread, i.e. wall time x 2 / calls)\n");
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
        bench_comm(argc, argv);
    else if (!strcmp(what, "transport"))
        bench_transport(argc, argv);
    else if (!strcmp(what, "overlap"))
        bench_overlap(argc, argv);
    else if (!strcmp(what, "rounding"))
        bench_rounding();
    else if (!strcmp(what, "gemm") && rt_rank() == 0)
        bench_gemm(argc > 2 ? atoi(argv[2]) : 5, argc > 3 ? atoi(argv[3]) : 0);
    else if (!strcmp(what, "small") && rt_rank() == 0)
        bench_small();
    else if (!strcmp(what, "threads") && rt_rank() == 0)
        bench_threads();
    rt_finalize();
    return 0;
}
