/*
** sgemm_peak.c: OpenBLAS's own sgemm rate on this machine, the yardstick of
** bench/train_bench.sh (our step's GFLOP/s is reported against it). Square f32 GEMMs
** (default 2048^3) with OpenBLAS's threads, after one warm-up call; prints one line per thread
** count: "peak THREADS GFLOPS MIN MAX" (median, min and max over the repetitions).
**
**   sgemm_peak [SIZE [REPS [THREADS...]]]       defaults: 2048 7 1 2
*/
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
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
    if (!A || !B || !C) {
        fprintf(stderr, "sgemm_peak: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nn; i++) {
        A[i] = (float)(i % 13) * 0.01f;
        B[i] = (float)(i % 11) * 0.01f;
    }
    for (int t = 0; t < nt; t++) {
        double g[100];
        openblas_set_num_threads(threads[t]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f,
                    C, n);
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n,
                        0.0f, C, n);
            g[r] = 2.0 * n * (double)n * n / (now() - t0) * 1e-9;
        }
        qsort(g, (size_t)reps, sizeof g[0], cmp);
        printf("peak %d %.1f %.1f %.1f\n", threads[t], g[reps / 2], g[0], g[reps - 1]);
        fflush(stdout);
    }
    return 0;
}
