/*
** elem_rate.c: the element-wise kernels' rate of one core, for bench/plan_bench.sh (the
** planner's CPU "memory" rate, docs/PLAN.md): the library's own LayerNorm, GELU and residual
** kernels (lib/kernels_cpu.c, f32) on ROWS x C activations, each REPS times after a warm-up,
** timed together. Prints "elem GBS MIN MAX": the bytes they must move (each operand read once,
** each result written once: LayerNorm 2 and 3 rows, GELU 2 and 3 of 4C, the add 3) per second,
** median, min, max over the repetitions.
**
**   elem_rate [ROWS [C [REPS]]]       defaults: 2048 768 9
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

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

static float *fill(size_t n, float v)
{
    float *p = malloc(n * sizeof *p);
    if (p == NULL) {
        fprintf(stderr, "elem_rate: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = v * (float)((i * 7919) % 1000) / 1000.0f - 0.5f * v;
    return p;
}

int main(int argc, char **argv)
{
    int rows = argc > 1 ? atoi(argv[1]) : 2048;
    int C = argc > 2 ? atoi(argv[2]) : 768;
    int reps = argc > 3 ? atoi(argv[3]) : 9;
    if (rows < 1 || C < 1 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: elem_rate [ROWS [C [REPS]]]\n");
        return 2;
    }
    size_t n = (size_t)rows * (size_t)C, n4 = 4 * n;
    float *x = fill(n, 2.0f), *y = fill(n, 1.0f), *dy = fill(n, 0.1f), *dx = fill(n, 0.0f);
    float *w = fill((size_t)C, 1.0f), *b = fill((size_t)C, 0.1f);
    float *dw = fill((size_t)C, 0.0f), *db = fill((size_t)C, 0.0f);
    float *mean = fill((size_t)rows, 0.0f), *rstd = fill((size_t)rows, 0.0f);
    float *h = fill(n4, 1.0f), *g = fill(n4, 0.0f), *dh = fill(n4, 0.1f);
    double bytes = 4.0 * (2.0 * (double)n + 3.0 * (double)n + 2.0 * (double)n4 +
                          3.0 * (double)n4 + 3.0 * (double)n);
    double *gbs = malloc((size_t)reps * sizeof *gbs);
    for (int i = -1; i < reps; i++) {
        double t = now();
        layernorm_fwd(y, mean, rstd, x, w, b, rows, C, 1e-5f, RT_F32);
        layernorm_bwd(dx, dw, db, dy, x, w, mean, rstd, rows, C, RT_F32);
        gelu_fwd(g, h, n4, RT_F32);
        gelu_bwd(dh, h, dh, n4, RT_F32);
        add_fwd(y, x, dx, n, RT_F32);
        t = now() - t;
        if (i >= 0) gbs[i] = bytes / t / 1e9;
    }
    qsort(gbs, (size_t)reps, sizeof *gbs, cmp);
    printf("elem %.2f %.2f %.2f\n", gbs[reps / 2], gbs[0], gbs[reps - 1]);
    return 0;
}
