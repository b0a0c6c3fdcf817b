/*
** attention_bench.c: the CPU attention kernels, forward and backward, timed at given shapes.
** Built twice by bench/attention_bench.sh: against the library's kernels (lib/kernels.h: tiled,
** no (T, T) matrix; f32 or bf16 storage) and, with -DATT_TT, against the kernels of commit
** 80ea565 (the (T, T) probabilities kept: GEMMs through rt_gemm and a softmax pass; f32 only).
** Not a test: nothing is checked but that the outputs are finite.
**
**   attention_bench B Hl hd T REPS [f32|bf16]
**
** prints one line: impl dtype B Hl hd T threads fwd_ms bwd_ms fwd_GFLOPs bwd_GFLOPs total_GFLOPs,
** the best of REPS runs (after one warm-up). FLOPs count only what causal attention needs: per
** (b, head) T(T+1)/2 visible (query, key) pairs, 2 hd FLOPs per pair and product; the forward
** has two products (q k^T, p v), the backward four (dout v^T, p^T dout, ds k, ds^T q). Work a
** kernel does beyond that (the masked half of the (T, T) GEMMs, the recomputed q k^T of the
** backward) is not counted.
*/
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"    // defines: attention_fwd, attention_bwd (and convert)
#include "rt.h"         // defines: rt_init, rt_now, rt_threads

static float *filled(size_t n, unsigned seed, float amp)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x) { fputs("attention_bench: out of memory\n", stderr); exit(1); }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = amp * ((float)(seed >> 8) / 16777216.0f - 0.5f);
    }
    return x;
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 1, "attention bench");
    if (argc < 6) {
        fputs("usage: attention_bench B Hl hd T REPS [f32|bf16]\n", stderr);
        return 2;
    }
    int B = atoi(argv[1]), Hl = atoi(argv[2]), hd = atoi(argv[3]), T = atoi(argv[4]);
    int reps = atoi(argv[5]), bf16 = argc > 6 && !strcmp(argv[6], "bf16");
    size_t C = (size_t)Hl * hd, N = (size_t)T * B, nq = N * 3 * C, ny = N * C;
    float scale = 1.0f / sqrtf((float)hd);
    float *qkv = filled(nq, 1, 3.0f), *dout = filled(ny, 2, 2.0f);
    float *out = filled(ny, 3, 0), *dqkv = filled(nq, 4, 0);
#ifdef ATT_TT
    const char *impl = "TxT";
    if (bf16) { fputs("attention_bench: the (T, T) kernels are f32 only\n", stderr); return 2; }
    float *att = filled((size_t)B * Hl * T * T, 5, 0), *datt = filled((size_t)B * Hl * T * T, 6, 0);
#define FWD() attention_fwd(out, att, qkv, B, T, Hl, hd, scale)
#define BWD() attention_bwd(dqkv, datt, dout, att, qkv, B, T, Hl, hd, scale)
#else
    const char *impl = "tiled";
    rt_dtype t = bf16 ? RT_BF16 : RT_F32;
    float *lse = filled((size_t)B * Hl * T, 5, 0), *dsum = filled((size_t)B * Hl * T, 6, 0);
    if (bf16) {                      /* the same values, stored as bf16 (half of each buffer) */
        float *q16 = filled(nq, 7, 0), *d16 = filled(ny, 8, 0);
        convert(q16, RT_BF16, qkv, RT_F32, nq);
        convert(d16, RT_BF16, dout, RT_F32, ny);
        free(qkv);
        free(dout);
        qkv = q16;
        dout = d16;
    }
/* multi-head: every query head its own kv head (KVl = Hl) */
#define FWD() attention_fwd(out, lse, qkv, B, T, Hl, Hl, hd, scale, t)
#define BWD() attention_bwd(dqkv, dsum, dout, out, lse, qkv, B, T, Hl, Hl, hd, scale, t)
#endif
    double best_f = 1e30, best_b = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = rt_now();
        FWD();
        double t1 = rt_now();
        BWD();
        double t2 = rt_now();
        if (r > 0) {                 /* run 0 warms the caches and the pool */
            best_f = fmin(best_f, t1 - t0);
            best_b = fmin(best_b, t2 - t1);
        }
    }
    float probe = bf16 ? 0.0f : out[ny / 2] + dqkv[nq / 2];
    if (!isfinite(probe)) fputs("attention_bench: the outputs are not finite\n", stderr);
    double pairs = (double)B * Hl * T * (T + 1) / 2, f_fwd = 4 * hd * pairs, f_bwd = 8 * hd * pairs;
    printf("%s %s %d %d %d %d %d %.3f %.3f %.1f %.1f %.1f\n", impl, bf16 ? "bf16" : "f32", B, Hl,
           hd, T, rt_threads(), best_f * 1e3, best_b * 1e3, f_fwd / best_f * 1e-9,
           f_bwd / best_b * 1e-9, (f_fwd + f_bwd) / (best_f + best_b) * 1e-9);
    rt_finalize();
    return 0;
}
