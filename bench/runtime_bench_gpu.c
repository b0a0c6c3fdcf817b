/*
** bench/runtime_bench_gpu.c: rt_gemm TFLOP/s on the CUDA backend at GPT-2 124M training
** shapes (B*T = 256 and 8192 tokens; forward, input-grad and weight-grad forms; f32 and bf16
** inputs) against the device's measured peak (the best of large square GEMMs of the same
** dtype). Linked with librt_cuda.a; run by bench/runtime_bench.sh when a GPU is present.
*/
#include "rt.h"     // defines: rt_init, rt_gemm, rt_sync, rt_now, rt_malloc, ...

#include <stdio.h>

typedef struct { const char *name; int ta, tb, m, n, k; float beta; } shape;

/* Weights W[out, in]: forward Y = X W^T, input grad dX = dY W, weight grad dW += dY^T X. */
#define GPT2(name, out, in, T) \
    { name " fwd", 0, 1, T, out, in, 0.0f }, \
    { name " dX",  0, 0, T, in, out, 0.0f }, \
    { name " dW",  1, 0, out, in, T, 1.0f }

static const shape shapes[] = {
    GPT2("qkv", 2304, 768, 256), GPT2("attn proj", 768, 768, 256), GPT2("fc", 3072, 768, 256),
    GPT2("fc proj", 768, 3072, 256), GPT2("lm head", 50304, 768, 256),
    GPT2("qkv", 2304, 768, 8192), GPT2("attn proj", 768, 768, 8192),
    GPT2("fc", 3072, 768, 8192), GPT2("fc proj", 768, 3072, 8192),
    GPT2("lm head", 50304, 768, 8192),
};

/* TFLOP/s of one GEMM shape (rt_sync-timed, >= 0.2 s of repetitions). */
static double tflops(const shape *s, rt_dtype ab, void *A, void *B, float *C)
{
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    for (int w = 0; w < 3; w++)
        rt_gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, A, lda, 0, B, ldb, 0, s->beta, C, s->n,
                0, 1, ab, RT_F32);
    rt_sync();
    int iters = 0;
    double t0 = rt_now(), el;
    do {
        for (int i = 0; i < 10; i++)
            rt_gemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, A, lda, 0, B, ldb, 0, s->beta, C,
                    s->n, 0, 1, ab, RT_F32);
        rt_sync();
        iters += 10;
        el = rt_now() - t0;
    } while (el < 0.2);
    return 2.0 * s->m * s->n * (double)s->k * iters / el * 1e-12;
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 1, "tp1 pp1 dp1");
    size_t big = (size_t)8192 * 8192, maxa = big, maxb = big, maxc = big;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t a = (size_t)s->m * s->k, b = (size_t)s->k * s->n, c = (size_t)s->m * s->n;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    void *A = rt_malloc(maxa * 4), *B = rt_malloc(maxb * 4);
    float *C = rt_malloc(maxc * 4);
    rt_rng_normal(A, 1, (int)(maxa / 2 > 1 << 30 ? 1 << 30 : maxa / 2), (int)(maxa / 2), 1, 1,
                  0, 0, 0.0f, 0.02f);
    rt_rng_normal(B, 1, (int)(maxb / 2 > 1 << 30 ? 1 << 30 : maxb / 2), (int)(maxb / 2), 1, 2,
                  0, 0, 0.0f, 0.02f);
    rt_dtype dts[2] = { RT_F32, RT_BF16 };
    double peak[2] = { 0, 0 };
    for (int d = 0; d < 2; d++)
        for (int sz = 4096; sz <= 8192; sz *= 2) {
            shape sq = { "square", 0, 0, sz, sz, sz, 0.0f };
            double t = tflops(&sq, dts[d], A, B, C);
            peak[d] = t > peak[d] ? t : peak[d];
        }
    printf("gpu gemm (%s): measured peak f32 %.1f TFLOP/s, bf16 in/f32 out %.1f TFLOP/s\n",
           rt_backend(), peak[0], peak[1]);
    printf("%-16s %6s %6s %6s   %8s %6s   %8s %6s\n", "shape", "m", "n", "k", "f32 TF/s",
           "%peak", "bf16", "%peak");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        double f = tflops(s, RT_F32, A, B, C), b = tflops(s, RT_BF16, A, B, C);
        printf("%-16s %6d %6d %6d   %8.1f %5.0f%%   %8.1f %5.0f%%\n", s->name, s->m, s->n, s->k,
               f, 100 * f / peak[0], b, 100 * b / peak[1]);
    }
    rt_free(A);
    rt_free(B);
    rt_free(C);
    rt_finalize();
    return 0;
}
