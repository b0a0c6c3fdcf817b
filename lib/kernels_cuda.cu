/*
** kernels_cuda.cu: the kernels of kernels.h on CUDA: device pointers, every kernel launched on
** the legacy default stream (the runtime's), one thread per row, column or element running the
** shared row arithmetic of kernel_rows.h, so the results match the CPU backend's formulas.
** Part of the training library (build/libgpt_cuda.a).
*/
#include <cuda_runtime.h>
#include "kernel_rows.h"
#include "kernels.h"
#include "rt.h"       // defines: rt_gemm, RT_CUDA

#define BLOCK 256      /* threads per block */

/* -- Embedding: vocabulary-parallel tokens, learned positions ---------------------------------- */
/*
** Activations are sequence-major: row t*B + b holds token b of position t. A rank owns the
** vocabulary rows [vstart, vstart + vrows); other token ids give zero rows (the TP all-reduce
** that follows adds the owner's row). Backward sums in token order: deterministic.
*/

static __global__
void embed_fwd_kernel(float *out, const int *tok, const float *wte, int N, int C,
                      int vstart, int vrows)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) embed_row_fwd(out + (size_t)n * C, wte, tok[n], C, vstart, vrows);
}

static __global__
void embed_bwd_kernel(float *dwte, const float *dout, const int *tok, int N, int C,
                      int vstart, int vrows)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) embed_cols_bwd(dwte, dout, tok, N, C, vstart, vrows, i, i + 1);
}

static __global__
void pos_fwd_kernel(float *out, const float *wpe, int T, int B, int C, int t0)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) pos_row_fwd(out, wpe, t, B, C, t0);
}

static __global__
void pos_bwd_kernel(float *dwpe, const float *dout, int T, int B, int C, int t0)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) pos_row_bwd(dwpe, dout, t, B, C, t0);
}

void embed_fwd(float *out, const int *tok, const float *wte, int N, int C, int vstart,
               int vrows)
{
    embed_fwd_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(out, tok, wte, N, C, vstart, vrows);
    RT_CUDA(cudaGetLastError());
}

void embed_bwd(float *dwte, const float *dout, const int *tok, int N, int C, int vstart,
               int vrows)
{
    embed_bwd_kernel<<<CEIL_DIV(C, BLOCK), BLOCK>>>(dwte, dout, tok, N, C, vstart, vrows);
    RT_CUDA(cudaGetLastError());
}

void pos_fwd(float *out, const float *wpe, int T, int B, int C, int t0)
{
    pos_fwd_kernel<<<CEIL_DIV(T, BLOCK), BLOCK>>>(out, wpe, T, B, C, t0);
    RT_CUDA(cudaGetLastError());
}

void pos_bwd(float *dwpe, const float *dout, int T, int B, int C, int t0)
{
    pos_bwd_kernel<<<CEIL_DIV(T, BLOCK), BLOCK>>>(dwpe, dout, T, B, C, t0);
    RT_CUDA(cudaGetLastError());
}

/* -- LayerNorm over rows of a (N, C) matrix ---------------------------------------------------- */
/*
** Statistics in f32 with a two-pass mean/variance; backward accumulates into dinp, dw, db
** (the residual stream and micro-batch accumulation both add). Every output element is summed
** in a fixed order.
*/

static __global__
void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C, float eps)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        layernorm_row_fwd(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, w, b,
                          C, eps);
}

static __global__
void layernorm_bwd_rows_kernel(float *dinp, const float *dout, const float *inp,
                               const float *w, const float *mean,
                               const float *rstd, int N, int C)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        layernorm_row_bwd(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, w,
                          mean[n], rstd[n], C);
}

static __global__
void layernorm_bwd_cols_kernel(float *dw, float *db, const float *dout,
                               const float *inp, const float *mean,
                               const float *rstd, int N, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) layernorm_cols_bwd(dw, db, dout, inp, mean, rstd, N, C, i, i + 1);
}

void layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int N, int C, float eps)
{
    layernorm_fwd_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(out, mean, rstd, inp, w, b, N, C, eps);
    RT_CUDA(cudaGetLastError());
}

void layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int N, int C)
{
    layernorm_bwd_rows_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(dinp, dout, inp, w, mean, rstd,
                                                             N, C);
    layernorm_bwd_cols_kernel<<<CEIL_DIV(C, BLOCK), BLOCK>>>(dw, db, dout, inp, mean, rstd,
                                                             N, C);
    RT_CUDA(cudaGetLastError());
}

/* -- GELU (tanh approximation), bias, residual adds -------------------------------------------- */
/*
** GELU as GPT-2 and Hugging Face's "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
*/

static __global__
void gelu_fwd_kernel(float *out, const float *inp, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu1(inp[i]);
}

static __global__
void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] = dout[i] * gelu1_grad(inp[i]);
}

static __global__
void bias_fwd_kernel(float *out, const float *bias, size_t n, int OC)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += bias[i % OC];
}

static __global__
void bias_bwd_kernel(float *dbias, const float *dout, int N, int OC)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < OC) bias_cols_bwd(dbias, dout, N, OC, i, i + 1);
}

static __global__
void add_fwd_kernel(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

static __global__
void add_inplace_kernel(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

void gelu_fwd(float *out, const float *inp, size_t n)
{
    gelu_fwd_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(out, inp, n);
    RT_CUDA(cudaGetLastError());
}

void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    gelu_bwd_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(dinp, inp, dout, n);
    RT_CUDA(cudaGetLastError());
}

void bias_fwd(float *out, const float *bias, int N, int OC)
{
    size_t n = (size_t)N * OC;
    bias_fwd_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(out, bias, n, OC);
    RT_CUDA(cudaGetLastError());
}

void bias_bwd(float *dbias, const float *dout, int N, int OC)
{
    bias_bwd_kernel<<<CEIL_DIV(OC, BLOCK), BLOCK>>>(dbias, dout, N, OC);
    RT_CUDA(cudaGetLastError());
}

void add_fwd(float *out, const float *a, const float *b, size_t n)
{
    add_fwd_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(out, a, b, n);
    RT_CUDA(cudaGetLastError());
}

void add_inplace(float *y, const float *x, size_t n)
{
    add_inplace_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(y, x, n);
    RT_CUDA(cudaGetLastError());
}

/* -- Causal multi-head self-attention over the local heads ------------------------------------- */
/*
** qkv rows are tokens in sequence-major order (row t*B + b), each [q | k | v] with Hl heads of
** hd channels. Scores are scaled by 1/sqrt(hd) in the GEMM (Megatron's baddbmm alpha), then a
** causal softmax; att (B, Hl, T, T) keeps the probabilities (zeros above the diagonal).
*/

static __global__
void softmax_fwd_kernel(float *att, int rows, int T)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) softmax_row_fwd(att + (size_t)r * T, r % T, T);
}

static __global__
void softmax_bwd_kernel(float *datt, const float *att, int rows, int T)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) softmax_row_bwd(datt + (size_t)r * T, att + (size_t)r * T, r % T, T);
}

static void softmax_fwd(float *att, int rows, int T)
{
    softmax_fwd_kernel<<<CEIL_DIV(rows, BLOCK), BLOCK>>>(att, rows, T);
    RT_CUDA(cudaGetLastError());
}

static void softmax_bwd(float *datt, const float *att, int rows, int T)
{
    softmax_bwd_kernel<<<CEIL_DIV(rows, BLOCK), BLOCK>>>(datt, att, rows, T);
    RT_CUDA(cudaGetLastError());
}

/*
** out (T*B, Hl*hd) = softmax(scale * q k^T) v per batch element and head; att (B, Hl, T, T)
** receives the probabilities. Row strides: qkv B*3*Hl*hd, out B*Hl*hd.
*/
void attention_fwd(float *out, float *att, const float *qkv, int B, int T, int Hl, int hd,
                   float scale)
{
    int C = Hl * hd, ldqkv = B * 3 * C, ldout = B * C;
    long tt = (long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * 3 * C, *k = q + C;
        float *a = att + (size_t)b * Hl * tt;
        rt_gemm(0, 1, T, T, hd, scale, q, ldqkv, hd, k, ldqkv, hd, 0.0f, a, T, tt, Hl, RT_F32, RT_F32);
    }
    softmax_fwd(att, B * Hl * T, T);
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * 3 * C + 2 * C;
        const float *a = att + (size_t)b * Hl * tt;
        rt_gemm(0, 0, T, hd, T, 1.0f, a, T, tt, v, ldqkv, hd, 0.0f, out + (size_t)b * C, ldout,
                hd, Hl, RT_F32, RT_F32);
    }
}

/*
** dqkv (overwritten) from dout (T*B, Hl*hd), the saved probabilities and qkv. datt is
** (B, Hl, T, T) scratch.
*/
void attention_bwd(float *dqkv, float *datt, const float *dout, const float *att,
                   const float *qkv, int B, int T, int Hl, int hd, float scale)
{
    int C = Hl * hd, ldqkv = B * 3 * C, ldout = B * C;
    long tt = (long)T * T;
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * 3 * C + 2 * C, *dob = dout + (size_t)b * C;
        float *da = datt + (size_t)b * Hl * tt;
        /* dp = dout v^T */
        rt_gemm(0, 1, T, T, hd, 1.0f, dob, ldout, hd, v, ldqkv, hd, 0.0f, da, T, tt, Hl, RT_F32, RT_F32);
    }
    softmax_bwd(datt, att, B * Hl * T, T);
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * 3 * C, *k = q + C, *dob = dout + (size_t)b * C;
        const float *da = datt + (size_t)b * Hl * tt, *a = att + (size_t)b * Hl * tt;
        float *dq = dqkv + (size_t)b * 3 * C, *dk = dq + C, *dv = dq + 2 * C;
        /* dq = scale ds k, dk = scale ds^T q, dv = p^T dout */
        rt_gemm(0, 0, T, hd, T, scale, da, T, tt, k, ldqkv, hd, 0.0f, dq, ldqkv, hd, Hl, RT_F32, RT_F32);
        rt_gemm(1, 0, T, hd, T, scale, da, T, tt, q, ldqkv, hd, 0.0f, dk, ldqkv, hd, Hl, RT_F32, RT_F32);
        rt_gemm(1, 0, T, hd, T, 1.0f, a, T, tt, dob, ldout, hd, 0.0f, dv, ldqkv, hd, Hl, RT_F32, RT_F32);
    }
}

/* -- Vocabulary-parallel cross-entropy (docs/megatron.md §4.5) --------------------------------- */
/*
** logits (N, Vl) hold this rank's vocabulary columns [vstart, vstart + valid); columns past
** 'valid' are padding and never count. The caller reduces between the pieces: all-reduce MAX
** of the row maxima, then all-reduce SUM of [sum exp | target logit].
*/

static __global__
void ce_rowmax_kernel(float *mx, const float *logits, int N, int Vl, int valid)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) ce_row_max(mx + n, logits + (size_t)n * Vl, valid);
}

static __global__
void ce_sums_kernel(float *sums, const float *logits, const float *mx,
                    const int *targets, int N, int Vl, int valid, int vstart)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        ce_row_sums(sums + n, sums + N + n, logits + (size_t)n * Vl, mx[n], targets[n], valid,
                    vstart);
}

static __global__
void ce_loss_kernel(float *loss, const float *sums, const float *mx, int N)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) loss[n] = logf(sums[n]) + mx[n] - sums[N + n];
}

static __global__
void ce_bwd_kernel(float *logits, const float *mx, const float *sums,
                   const int *targets, int N, int Vl, int valid, int vstart,
                   float dloss)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        ce_row_bwd(logits + (size_t)n * Vl, mx[n], sums[n], targets[n], Vl, valid, vstart,
                   dloss);
}

/* One thread sums in order: the loss sum is deterministic (N is tokens per micro-batch). */
static __global__
void sum_rows_kernel(float *out, const float *x, int N)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) s += x[n];
        out[0] = s;
    }
}

void ce_rowmax(float *mx, const float *logits, int N, int Vl, int valid)
{
    ce_rowmax_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(mx, logits, N, Vl, valid);
    RT_CUDA(cudaGetLastError());
}

void ce_sums(float *sums, const float *logits, const float *mx, const int *targets, int N,
             int Vl, int valid, int vstart)
{
    ce_sums_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(sums, logits, mx, targets, N, Vl, valid,
                                                  vstart);
    RT_CUDA(cudaGetLastError());
}

void ce_loss(float *loss, const float *sums, const float *mx, int N)
{
    ce_loss_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(loss, sums, mx, N);
    RT_CUDA(cudaGetLastError());
}

void ce_bwd(float *logits, const float *mx, const float *sums, const int *targets, int N,
            int Vl, int valid, int vstart, float dloss)
{
    ce_bwd_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(logits, mx, sums, targets, N, Vl, valid,
                                                 vstart, dloss);
    RT_CUDA(cudaGetLastError());
}

void sum_rows(float *out, const float *x, int N)
{
    sum_rows_kernel<<<1, 1>>>(out, x, N);
    RT_CUDA(cudaGetLastError());
}

/* -- AdamW (torch.optim.AdamW), gradient-norm pieces, scaling ---------------------------------- */
/*
** torch's order: p *= 1 - lr*wd; m, v updated; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),
** with g = grad * gscale (the clipping coefficient, 1 when not clipping).
*/

static __global__
void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float step_size,
                  float bc2_sqrt, float gscale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        adamw1(p + i, g[i] * gscale, m + i, v + i, lr, beta1, beta2, eps, wd, step_size,
               bc2_sqrt);
}

/* One block per call, a fixed tree: deterministic. */
static __global__
void sumsq_kernel(float *out, const float *x, size_t n)
{
    __shared__ double part[BLOCK];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += BLOCK) s += (double)x[i] * (double)x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = (float)part[0];
}

static __global__
void scale_kernel(float *x, size_t n, float s)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2, float gscale)
{
    adamw_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(p, g, m, v, n, lr, beta1, beta2, eps, wd,
                                                lr / bc1, sqrtf(bc2), gscale);
    RT_CUDA(cudaGetLastError());
}

void sumsq(float *out, const float *x, size_t n)
{
    sumsq_kernel<<<1, BLOCK>>>(out, x, n);
    RT_CUDA(cudaGetLastError());
}

void scale_inplace(float *x, size_t n, float s)
{
    scale_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(x, n, s);
    RT_CUDA(cudaGetLastError());
}

/* -- Mixture of experts: routing and row movements --------------------------------------------- */
/*
** Top-k with ties to the lower expert, its probabilities, the softmax over all experts for the
** aux loss, and its backward; the row movements between token and expert order are gathers
** (no scatter, no atomics): deterministic.
*/

/*
** One token: score = softmax(logit) over all E experts; sel = the k largest logits in
** descending order (a tie goes to the lower expert); prob = softmax over the k selected logits,
** or, with pre_softmax, the scores of the selected experts (not renormalised).
*/

/*
** Backward of route_row for one token: dlogit (E) from d(prob) (k) and the aux loss's
** gradient with respect to the scores, auxg (E, the same for every token of the micro-batch).
*/

static __global__ void moe_route_kernel(int *sel, float *prob, float *score, const float *logits,
                                   int N, int E, int k, int pre)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        route_row(sel + (size_t)n * k, prob + (size_t)n * k, score + (size_t)n * E,
                  logits + (size_t)n * E, E, k, pre);
}

static __global__ void moe_route_bwd_kernel(float *dlogits, const float *dprob, const float *prob,
                                       const float *scores, const int *sel, const float *auxg,
                                       int N, int E, int k, int pre)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        route_row_bwd(dlogits + (size_t)n * E, dprob + (size_t)n * k, prob + (size_t)n * k,
                      scores + (size_t)n * E, sel + (size_t)n * k, auxg, E, k, pre);
}

static __global__ void gather_rows_kernel(float *out, const float *src, const int *idx, int n,
                                          int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * C) {
        int r = idx[i / C];
        out[i] = r < 0 ? 0.0f : src[(size_t)r * C + i % C];
    }
}

static __global__ void combine_rows_kernel(float *out, const float *src, const int *pos, int N,
                                           int k, int C)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) combine_row(out + (size_t)n * C, src, pos + (size_t)n * k, k, C);
}

static __global__ void row_scale_kernel(float *y, const float *s, int n, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * C) y[i] *= s[i / C];
}

static __global__ void row_dot_kernel(float *out, const float *a, const float *b, int n, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float s = 0.0f;
        for (int c = 0; c < C; c++) s += a[(size_t)i * C + c] * b[(size_t)i * C + c];
        out[i] = s;
    }
}

static __global__ void add_scaled_bias_kernel(float *y, const float *s, const float *b, int n,
                                              int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n * C) y[i] += s[i / C] * b[i % C];
}

static __global__ void scaled_bias_bwd_kernel(float *db, const float *s, const float *dy, int n,
                                              int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) {
        float acc = 0.0f;
        for (int i = 0; i < n; i++) acc += s[i] * dy[(size_t)i * C + c];
        db[c] += acc;
    }
}

static __global__ void sum_blocks_kernel(float *out, const float *in, int nblocks, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float s = 0.0f;
        for (int m = 0; m < nblocks; m++) s += in[(size_t)m * n + i];
        out[i] = s;
    }
}

void moe_route(int *sel, float *prob, float *scores, const float *logits, int N, int E, int k,
               int pre)
{
    moe_route_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(sel, prob, scores, logits, N, E, k, pre);
    RT_CUDA(cudaGetLastError());
}

void moe_route_bwd(float *dlogits, const float *dprob, const float *prob, const float *scores,
                   const int *sel, const float *auxg, int N, int E, int k, int pre)
{
    moe_route_bwd_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(dlogits, dprob, prob, scores, sel, auxg,
                                                        N, E, k, pre);
    RT_CUDA(cudaGetLastError());
}

void gather_rows(float *out, const float *src, const int *idx, int n, int C)
{
    size_t total = (size_t)n * C;
    if (total == 0) return;
    gather_rows_kernel<<<CEIL_DIV(total, BLOCK), BLOCK>>>(out, src, idx, n, C);
    RT_CUDA(cudaGetLastError());
}

void combine_rows(float *out, const float *src, const int *pos, int N, int k, int C)
{
    combine_rows_kernel<<<CEIL_DIV(N, BLOCK), BLOCK>>>(out, src, pos, N, k, C);
    RT_CUDA(cudaGetLastError());
}

void row_scale(float *y, const float *s, int n, int C)
{
    size_t total = (size_t)n * C;
    if (total == 0) return;
    row_scale_kernel<<<CEIL_DIV(total, BLOCK), BLOCK>>>(y, s, n, C);
    RT_CUDA(cudaGetLastError());
}

void row_dot(float *out, const float *a, const float *b, int n, int C)
{
    if (n == 0) return;
    row_dot_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(out, a, b, n, C);
    RT_CUDA(cudaGetLastError());
}

void add_scaled_bias(float *y, const float *s, const float *b, int n, int C)
{
    size_t total = (size_t)n * C;
    if (total == 0) return;
    add_scaled_bias_kernel<<<CEIL_DIV(total, BLOCK), BLOCK>>>(y, s, b, n, C);
    RT_CUDA(cudaGetLastError());
}

void scaled_bias_bwd(float *db, const float *s, const float *dy, int n, int C)
{
    scaled_bias_bwd_kernel<<<CEIL_DIV(C, BLOCK), BLOCK>>>(db, s, dy, n, C);
    RT_CUDA(cudaGetLastError());
}

void sum_blocks(float *out, const float *in, int nblocks, size_t n)
{
    if (n == 0) return;
    sum_blocks_kernel<<<CEIL_DIV(n, BLOCK), BLOCK>>>(out, in, nblocks, n);
    RT_CUDA(cudaGetLastError());
}
