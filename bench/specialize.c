/*
** specialize.c: what compile-time shapes would gain in the CPU kernels. The library's kernels
** take their shapes as arguments (one build serves every layout); a per-layout build could
** make them constants instead. This program times the shape-dependent row arithmetic of
** lib/kernel_rows.h (LayerNorm forward and backward over C channels, the cross-entropy row
** passes over V columns; f32 storage) with the shapes as run-time values (built plainly) or as
** compile-time constants (built with -DSPEC_C=... -DSPEC_T=... -DSPEC_V=...), on one thread,
** with the library's flags. bench/specialize.sh builds both and prints the ratios. T is no
** longer used (the attention has no row pass over T columns). Not a test.
**   specialize C T V REPS     prints "<kernel> <ns per row>" lines
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernel_rows.h"

#ifdef SPEC_C
#define SHAPE_C SPEC_C
#define SHAPE_T SPEC_T
#define SHAPE_V SPEC_V
#else
static int shape_c, shape_t, shape_v;
#define SHAPE_C shape_c
#define SHAPE_T shape_t
#define SHAPE_V shape_v
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *buffer(size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof(float));
    if (!x) { fputs("out of memory\n", stderr); exit(1); }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    return x;
}

/* The best of 5 timings of 'reps' passes over 'rows' rows, in ns per row. */
#define TIME(label, rows, body) do { \
        double best = 1e30; \
        for (int round = 0; round < 5; round++) { \
            double t0 = now(); \
            for (int rep = 0; rep < reps; rep++) \
                for (int r = 0; r < (rows); r++) { body; } \
            double t = (now() - t0) / ((double)reps * (rows)); \
            if (t < best) best = t; \
        } \
        printf("%s %.1f\n", label, best * 1e9); \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 5) {
        fputs("usage: specialize C T V REPS\n", stderr);
        return 2;
    }
#ifndef SPEC_C
    shape_c = atoi(argv[1]);
    shape_t = atoi(argv[2]);
    shape_v = atoi(argv[3]);
#endif
    int reps = atoi(argv[4]);
    const int rows = 64;
    float *x = buffer((size_t)rows * SHAPE_C, 1), *y = buffer((size_t)rows * SHAPE_C, 2);
    float *d = buffer((size_t)rows * SHAPE_C, 3), *w = buffer(SHAPE_C, 4);
    float *b = buffer(SHAPE_C, 5), *mean = buffer(rows, 6), *rstd = buffer(rows, 7);
    float *logits = buffer(SHAPE_V, 10), mx = 0.0f, s[2] = { 0.0f, 0.0f };
    int target = 7;
    volatile float sink = 0.0f;
    (void)SHAPE_T;

    TIME("layernorm_fwd", rows,
         layernorm_fwd_rows_f32(y, mean, rstd, x, w, b, SHAPE_C, 1e-5f, r, r + 1));
    TIME("layernorm_bwd", rows,
         layernorm_bwd_rows_f32(y, d, x, w, mean, rstd, SHAPE_C, r, r + 1));
    TIME("ce_rowmax+sums", 1,
         ce_max_rows_f32(&mx, logits, SHAPE_V, SHAPE_V, 0, 1);
         ce_sums_rows_f32(s, logits, &mx, &target, 1, SHAPE_V, SHAPE_V, 0, 0, 1); sink += s[0]);
    (void)sink;
    return 0;
}
