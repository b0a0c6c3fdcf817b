/*
** sgemm_peak.c: the machine's GEMM peaks, the yardsticks of bench/train_bench.sh (our step's
** GFLOP/s is reported against them): square GEMMs (default 2048^3, row-major, f32 C) after one
** warm-up call, per thread count, with each library's own threads: OpenBLAS's sgemm, oneDNN's
** matmul with f32 inputs and with bf16 inputs (OpenMP threads: run it with
** OMP_WAIT_POLICY=PASSIVE so that they sleep while the other library measures). One line each,
** median, min and max GFLOP/s over the repetitions:
**   peak THREADS GFLOPS MIN MAX              (OpenBLAS sgemm)
**   peak_dnnl_f32 THREADS GFLOPS MIN MAX     (oneDNN matmul, f32 inputs)
**   peak_dnnl_bf16 THREADS GFLOPS MIN MAX    (oneDNN matmul, bf16 inputs)
**
**   sgemm_peak [SIZE [REPS [THREADS...]]]       defaults: 2048 7 1 2
*/
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(dnnl_status_t st, const char *what)
{
    if (st != dnnl_success) {
        fprintf(stderr, "sgemm_peak: oneDNN error: %s (%s)\n", dnnl_status2str(st), what);
        exit(1);
    }
}

/* An n x n x n oneDNN matmul on A, B (f32 or bf16 values), f32 C, for the current OpenMP
** thread count. */
static dnnl_primitive_t dnnl_make(int n, int bf16, dnnl_engine_t eng, dnnl_memory_t mem[3],
                                  void *A, void *B, float *C)
{
    dnnl_dims_t dims = { n, n }, strides = { n, 1 };
    dnnl_memory_desc_t md[3];
    dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    check(dnnl_memory_desc_init_by_strides(&md[0], 2, dims, in, strides), "memory desc");
    check(dnnl_memory_desc_init_by_strides(&md[1], 2, dims, in, strides), "memory desc");
    check(dnnl_memory_desc_init_by_strides(&md[2], 2, dims, dnnl_f32, strides), "memory desc");
    dnnl_matmul_desc_t desc;
    check(dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]), "matmul desc");
    dnnl_primitive_desc_t pd;
    check(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL), "matmul primitive desc");
    dnnl_primitive_t p;
    check(dnnl_primitive_create(&p, pd), "matmul primitive");
    dnnl_primitive_desc_destroy(pd);
    void *ptr[3] = { A, B, C };
    for (int i = 0; i < 3; i++)
        check(dnnl_memory_create(&mem[i], &md[i], eng, ptr[i]), "memory");
    return p;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2048, reps = argc > 2 ? atoi(argv[2]) : 7;
    int def[2] = { 1, 2 }, *threads = def, nt = 2;
    if (argc > 3) {
        nt = argc - 3;
        threads = malloc(sizeof(int) * (size_t)nt);
        for (int i = 0; i < nt; i++) threads[i] = atoi(argv[3 + i]);
    }
    if (n <= 0 || reps <= 0 || reps > 100) {
        fprintf(stderr, "usage: sgemm_peak [SIZE [REPS [THREADS...]]]\n");
        return 2;
    }
    size_t nn = (size_t)n * (size_t)n;
    float *A = malloc(nn * sizeof(float)), *B = malloc(nn * sizeof(float));
    float *C = malloc(nn * sizeof(float));
    uint16_t *A16 = malloc(nn * 2), *B16 = malloc(nn * 2);
    if (!A || !B || !C || !A16 || !B16) {
        fprintf(stderr, "sgemm_peak: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nn; i++) {
        A[i] = (float)(i % 13) * 0.01f;
        B[i] = (float)(i % 11) * 0.01f;
        uint32_t a, b;                  /* bf16 by truncation: any values will do here */
        memcpy(&a, &A[i], 4);
        memcpy(&b, &B[i], 4);
        A16[i] = (uint16_t)(a >> 16);
        B16[i] = (uint16_t)(b >> 16);
    }
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    check(dnnl_engine_create(&eng, dnnl_cpu, 0), "engine");
    check(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags), "stream");
    static const char *const name[3] = { "peak", "peak_dnnl_f32", "peak_dnnl_bf16" };
    for (int t = 0; t < nt; t++)
        for (int lib = 0; lib < 3; lib++) {
            double g[100];
            dnnl_primitive_t p = NULL;
            dnnl_memory_t mem[3];
            openblas_set_num_threads(lib == 0 ? threads[t] : 1);
            omp_set_num_threads(lib == 0 ? 1 : threads[t]);
            if (lib > 0)
                p = dnnl_make(n, lib == 2, eng, mem, lib == 2 ? (void *)A16 : A,
                              lib == 2 ? (void *)B16 : B, C);
            for (int r = -1; r < reps; r++) {       /* r = -1: warm-up */
                double t0 = now();
                if (lib == 0) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n,
                                B, n, 0.0f, C, n);
                } else {
                    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, mem[0] },
                                                { DNNL_ARG_WEIGHTS, mem[1] },
                                                { DNNL_ARG_DST, mem[2] } };
                    check(dnnl_primitive_execute(p, stream, 3, args), "execute");
                }
                if (r >= 0)
                    g[r] = 2.0 * n * (double)n * n / (now() - t0) * 1e-9;
            }
            if (p) {
                dnnl_primitive_destroy(p);
                for (int i = 0; i < 3; i++)
                    dnnl_memory_destroy(mem[i]);
            }
            qsort(g, (size_t)reps, sizeof g[0], cmp);
            printf("%s %d %.1f %.1f %.1f\n", name[lib], threads[t], g[reps / 2], g[0],
                   g[reps - 1]);
            fflush(stdout);
            if (lib == 0 && threads[t] > 1) {   /* let OpenBLAS's spinning workers sleep */
                struct timespec ts = { 0, 300 * 1000 * 1000 };
                nanosleep(&ts, NULL);
            }
        }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
