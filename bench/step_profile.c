/*
** step_profile.c: where a generated CPU training program's step goes, per kernel family.
** Linked into a copy of out/<dir>/train by bench/train_bench.sh with -Wl,--wrap=<launcher>
** for every kernel of lib/kernels.h, rt_gemm, rt_gemm_epi and rt_memset0: each wrapper times
** its call (wall clock, the caller's view: the pool's other threads work inside it). Not part
** of the program and never built by the tests; the program and the library are unchanged.
**
** Steps are delimited at the first sumsq or sumsq_multi of each step (the gradient norm,
** after the backward); the first PROFILE_WARMUP (default 2) steps are skipped, and at exit the mean
** ms per step of each family over the remaining whole steps goes to stderr, as
**   profile: <steps> steps, <ms> ms/step
**   profile: <family> <ms> <percent>
** "attention" includes the rt_gemm calls made inside it; "gemm" is every other rt_gemm (the
** linear layers and the LM head). "other" is the step time no wrapper saw (the schedule's
** own code, data loading, logging; MoE kernels, which are not wrapped).
** PROFILE_CLOCK=cpu times with the calling thread's CPU clock instead of the wall clock:
** steadier on a shared machine, and the same thing when the program runs one thread.
** Built with -DPROFILE_CUDA (bench/gpu_batch.sh, a CUDA program): each wrapped call waits for
** the GPU before and after (cudaDeviceSynchronize), so its time is its kernels' time plus one
** launch latency; everything runs on one stream, so little overlap is lost.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"    // defines: the kernel prototypes
#include "rt.h"         // defines: rt_now, rt_gemm, rt_memset0

/* ORDER FAMILY: family_name[] */
enum { F_GEMM, F_ATTENTION, F_GELU, F_LAYERNORM, F_BIAS, F_RESIDUAL, F_EMBED,
       F_CE, F_ADAMW, F_GRADNORM, F_ZERO, NFAMILY };
static const char *const family_name[NFAMILY] = {
    "gemm", "attention", "gelu", "layernorm", "bias", "residual",
    "embedding", "cross-entropy", "adamw", "grad-norm", "zero-grads",
};

static double acc[NFAMILY], snap_first[NFAMILY], snap_last[NFAMILY];
static double t_first, t_last;
static int steps, first_step = -1, last_step = -1, warmup = -1;
static int in_attention, last_was_sumsq;

static int cpu_clock = -1;

static double now_s(void)
{
    if (cpu_clock < 0) {
        const char *c = getenv("PROFILE_CLOCK");
        cpu_clock = c && strcmp(c, "cpu") == 0;
    }
    if (!cpu_clock)
        return rt_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void step_boundary(void)
{
    double now = now_s();
    if (warmup < 0) {
        const char *w = getenv("PROFILE_WARMUP");
        warmup = w ? atoi(w) : 2;
    }
    if (steps == warmup) {
        first_step = steps;
        t_first = now;
        memcpy(snap_first, acc, sizeof acc);
    }
    if (steps > warmup) {
        last_step = steps;
        t_last = now;
        memcpy(snap_last, acc, sizeof acc);
    }
    steps++;
}

__attribute__((destructor)) static void report(void)
{
    if (first_step < 0 || last_step <= first_step) {
        fprintf(stderr, "profile: too few steps (%d; warm-up %d)\n", steps, warmup);
        return;
    }
    int n = last_step - first_step;
    double total = (t_last - t_first) / n * 1e3, seen = 0;
    fprintf(stderr, "profile: %d steps, %.3f ms/step\n", n, total);
    for (int f = 0; f < NFAMILY; f++) {
        double ms = (snap_last[f] - snap_first[f]) / n * 1e3;
        seen += ms;
        fprintf(stderr, "profile: %s %.3f %.1f\n", family_name[f], ms, 100 * ms / total);
    }
    fprintf(stderr, "profile: other %.3f %.1f\n", total - seen, 100 * (total - seen) / total);
}

#ifdef PROFILE_CUDA
int cudaDeviceSynchronize(void);    /* cuda_runtime.h's, whose cudaError_t is an int enum */
#define GPU_WAIT() ((void)cudaDeviceSynchronize())
#else
#define GPU_WAIT() ((void)0)
#endif

#define TIMED(fam, call)                                                        \
    do {                                                                        \
        last_was_sumsq = 0;                                                     \
        GPU_WAIT();                                                             \
        double t0_ = now_s();                                                  \
        call;                                                                   \
        GPU_WAIT();                                                             \
        acc[fam] += now_s() - t0_;                                             \
    } while (0)

/* -- Wrappers (the linker sends the program's calls here; __real_ is the original) -------- */

#define WRAP(ret, name, params, args, fam)                                      \
    ret __real_##name params;                                                   \
    ret __wrap_##name params;                                                   \
    ret __wrap_##name params                                                    \
    {                                                                           \
        in_attention = (fam) == F_ATTENTION;                                    \
        TIMED(fam, __real_##name args);                                         \
        in_attention = 0;                                                       \
    }

WRAP(void, embed_fwd, (void *out, const int *tok, const void *wte, int N, int C, int vstart,
                       int vrows, rt_dtype t), (out, tok, wte, N, C, vstart, vrows, t), F_EMBED)
WRAP(void, embed_bwd, (float *dwte, const void *dout, const int *tok, int N, int C,
                       int vstart, int vrows, rt_dtype t),
     (dwte, dout, tok, N, C, vstart, vrows, t), F_EMBED)
WRAP(void, pos_fwd, (void *out, const void *wpe, int T, int B, int C, int t0, rt_dtype t),
     (out, wpe, T, B, C, t0, t), F_EMBED)
WRAP(void, pos_bwd, (float *dwpe, const void *dout, int T, int B, int C, int t0, rt_dtype t),
     (dwpe, dout, T, B, C, t0, t), F_EMBED)
WRAP(void, layernorm_fwd, (void *out, float *mean, float *rstd, const void *inp,
                           const void *w, const void *b, int N, int C, float eps, rt_dtype t),
     (out, mean, rstd, inp, w, b, N, C, eps, t), F_LAYERNORM)
WRAP(void, add_layernorm_fwd, (void *res, void *out, float *mean, float *rstd, const void *a,
                               const void *b, const void *w, const void *bias, int N, int C,
                               float eps, rt_dtype t),
     (res, out, mean, rstd, a, b, w, bias, N, C, eps, t), F_LAYERNORM)
WRAP(void, layernorm_bwd, (void *dinp, float *dw, float *db, const void *dout,
                           const void *inp, const void *w, const float *mean,
                           const float *rstd, int N, int C, rt_dtype t),
     (dinp, dw, db, dout, inp, w, mean, rstd, N, C, t), F_LAYERNORM)
WRAP(void, gelu_fwd, (void *out, const void *inp, size_t n, rt_dtype t), (out, inp, n, t),
     F_GELU)
WRAP(void, gelu_bwd, (void *dinp, const void *inp, const void *dout, size_t n, rt_dtype t),
     (dinp, inp, dout, n, t), F_GELU)
WRAP(void, bias_fwd, (void *out, const void *bias, int N, int OC, rt_dtype t),
     (out, bias, N, OC, t), F_BIAS)
WRAP(void, bias_bwd, (float *dbias, const void *dout, int N, int OC, rt_dtype t),
     (dbias, dout, N, OC, t), F_BIAS)
WRAP(void, add_fwd, (void *out, const void *a, const void *b, size_t n, rt_dtype t),
     (out, a, b, n, t), F_RESIDUAL)
WRAP(void, add_inplace, (void *y, const void *x, size_t n, rt_dtype t), (y, x, n, t),
     F_RESIDUAL)
WRAP(void, ce_rowmax, (float *mx, const void *logits, int N, int Vl, int valid, rt_dtype t),
     (mx, logits, N, Vl, valid, t), F_CE)
WRAP(void, ce_sums, (float *sums, const void *logits, const float *mx, const int *targets,
                     int N, int Vl, int valid, int vstart, rt_dtype t),
     (sums, logits, mx, targets, N, Vl, valid, vstart, t), F_CE)
WRAP(void, ce_loss, (float *loss, const float *sums, const float *mx, int N),
     (loss, sums, mx, N), F_CE)
WRAP(void, ce_bwd, (void *logits, const float *mx, const float *sums, const int *targets,
                    int N, int Vl, int valid, int vstart, float dloss, rt_dtype t),
     (logits, mx, sums, targets, N, Vl, valid, vstart, dloss, t), F_CE)
WRAP(void, ce_fused, (float *loss, float *mx, float *sums, void *logits, const int *targets,
                      int N, int Vl, int valid, int vstart, float dloss, rt_dtype t),
     (loss, mx, sums, logits, targets, N, Vl, valid, vstart, dloss, t), F_CE)
WRAP(void, sum_rows, (float *out, const float *x, int N), (out, x, N), F_CE)
WRAP(void, adamw_step, (float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                        float gscale, void *copy, rt_dtype t),
     (p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, gscale, copy, t), F_ADAMW)
WRAP(void, adamw_multi, (const adamw_tensor *ts, int count, float lr, float beta1, float beta2,
                         float eps, float bc1, float bc2, float gscale, rt_dtype t),
     (ts, count, lr, beta1, beta2, eps, bc1, bc2, gscale, t), F_ADAMW)
WRAP(void, scale_inplace, (float *x, size_t n, float s), (x, n, s), F_GRADNORM)
WRAP(void, rt_memset0, (void *p, size_t bytes), (p, bytes), F_ZERO)

void __real_sumsq(float *out, const float *x, size_t n);
void __wrap_sumsq(float *out, const float *x, size_t n);
void __wrap_sumsq(float *out, const float *x, size_t n)
{
    if (!last_was_sumsq)
        step_boundary();
    double t0 = now_s();
    __real_sumsq(out, x, n);
    acc[F_GRADNORM] += now_s() - t0;
    last_was_sumsq = 1;
}

void __real_sumsq_multi(float *out, const float *const *x, const size_t *n, int count);
void __wrap_sumsq_multi(float *out, const float *const *x, const size_t *n, int count);
void __wrap_sumsq_multi(float *out, const float *const *x, const size_t *n, int count)
{
    if (!last_was_sumsq)
        step_boundary();
    double t0 = now_s();
    __real_sumsq_multi(out, x, n, count);
    acc[F_GRADNORM] += now_s() - t0;
    last_was_sumsq = 1;
}

/* The fused GEMMs (CUDA: cuBLASLt with the bias or the GELU in its epilogue) count as gemm. */
int __real_rt_gemm_epi(int ta, int tb, int m, int n, int k, const void *A, int lda,
                       const void *B, int ldb, void *C, int ldc, rt_epilogue epi,
                       const void *bias, void *aux, rt_dtype t);
int __wrap_rt_gemm_epi(int ta, int tb, int m, int n, int k, const void *A, int lda,
                       const void *B, int ldb, void *C, int ldc, rt_epilogue epi,
                       const void *bias, void *aux, rt_dtype t);
int __wrap_rt_gemm_epi(int ta, int tb, int m, int n, int k, const void *A, int lda,
                       const void *B, int ldb, void *C, int ldc, rt_epilogue epi,
                       const void *bias, void *aux, rt_dtype t)
{
    int done;
    TIMED(F_GEMM, done = __real_rt_gemm_epi(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, epi, bias,
                                            aux, t));
    return done;
}

/* Attention: its own GEMMs (rt_gemm from inside, if any) count as attention, untimed on their
** own. */
WRAP(void, attention_fwd, (void *out, float *lse, const void *qkv, int B, int T, int Hl,
                           int KVl, int hd, float scale, rt_dtype t),
     (out, lse, qkv, B, T, Hl, KVl, hd, scale, t), F_ATTENTION)
WRAP(void, attention_bwd, (void *dqkv, float *dsum, const void *dout, const void *out,
                           const float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                           int hd, float scale, rt_dtype t),
     (dqkv, dsum, dout, out, lse, qkv, B, T, Hl, KVl, hd, scale, t), F_ATTENTION)

void __real_rt_gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda,
                    long sA, const void *B, int ldb, long sB, float beta, void *C, int ldc,
                    long sC, int batch, rt_dtype ab, rt_dtype c);
void __wrap_rt_gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda,
                    long sA, const void *B, int ldb, long sB, float beta, void *C, int ldc,
                    long sC, int batch, rt_dtype ab, rt_dtype c);
void __wrap_rt_gemm(int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda,
                    long sA, const void *B, int ldb, long sB, float beta, void *C, int ldc,
                    long sC, int batch, rt_dtype ab, rt_dtype c)
{
    if (in_attention) {
        __real_rt_gemm(ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch,
                       ab, c);
        return;
    }
    TIMED(F_GEMM, __real_rt_gemm(ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc,
                                 sC, batch, ab, c));
}
