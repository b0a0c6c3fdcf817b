/*
** kernels.h: the kernels of the training library, one contract for both backends:
** kernels_cpu.c (loops on the runtime's thread pool, host pointers) and kernels_cuda.cu (CUDA
** kernels on the legacy default stream, device pointers). Shapes are arguments: the library is
** compiled once per backend and serves every model and layout. Every kernel is deterministic:
** each output element is computed, and each sum taken, in a fixed order independent of threads.
** Called by the library's model code (model.c, moe.c, stage.c) and the kernel tests.
*/
#ifndef GPT_KERNELS_H
#define GPT_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus   /* kernels_cuda.cu is C++: these are C symbols */
extern "C" {
#endif

/* -- Embedding (rows are tokens, sequence-major: row t*B + b) ------------------------------- */

/* out (N, C) = wte[tok - vstart] for tokens this rank owns ([vstart, vstart + vrows)), else 0. */
void embed_fwd(float *out, const int *tok, const float *wte, int N, int C, int vstart, int vrows);
/* dwte (vrows, C) += every owned token's gradient row, in token order. */
void embed_bwd(float *dwte, const float *dout, const int *tok, int N, int C, int vstart,
               int vrows);
/* out (T*B, C) += wpe[t0 + t] on every row of position t. */
void pos_fwd(float *out, const float *wpe, int T, int B, int C, int t0);
void pos_bwd(float *dwpe, const float *dout, int T, int B, int C, int t0);

/* -- LayerNorm ---------------------------------------------------------------------------- */

void layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int N, int C, float eps);
/* dinp, dw, db accumulate (+=). */
void layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int N, int C);

/* -- Pointwise ---------------------------------------------------------------------------- */

void gelu_fwd(float *out, const float *inp, size_t n);
void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);  /* may be in place */
void bias_fwd(float *out, const float *bias, int N, int OC);                /* out += bias */
void bias_bwd(float *dbias, const float *dout, int N, int OC);     /* dbias += column sums */
void add_fwd(float *out, const float *a, const float *b, size_t n);
void add_inplace(float *y, const float *x, size_t n);

/* -- Attention (qkv rows: [q | k | v] of Hl local heads of hd channels) --------------------- */

/* out (N, Hl*hd); att (B, Hl, T, T) keeps the probabilities for the backward. */
void attention_fwd(float *out, float *att, const float *qkv, int B, int T, int Hl, int hd,
                   float scale);
/* dqkv (N, 3*Hl*hd) = the gradient; datt (B, Hl, T, T) is scratch. */
void attention_bwd(float *dqkv, float *datt, const float *dout, const float *att,
                   const float *qkv, int B, int T, int Hl, int hd, float scale);

/* -- Vocabulary-parallel cross-entropy ---------------------------------------------------- */

/* mx (N): the row maxima over this rank's 'valid' columns. */
void ce_rowmax(float *mx, const float *logits, int N, int Vl, int valid);
/* sums (2N): [sum of exp(logit - mx) | the target's logit where this rank owns the target]. */
void ce_sums(float *sums, const float *logits, const float *mx, const int *targets, int N,
             int Vl, int valid, int vstart);
/* loss (N) = log(sum exp) + mx - target logit, from the reduced sums. */
void ce_loss(float *loss, const float *sums, const float *mx, int N);
/* logits := (softmax - onehot(target)) * dloss, in place; padding columns 0. */
void ce_bwd(float *logits, const float *mx, const float *sums, const int *targets, int N,
            int Vl, int valid, int vstart, float dloss);
/* out[0] = sum of x[0..N), in order (device memory). */
void sum_rows(float *out, const float *x, int N);

/* -- Optimizer ---------------------------------------------------------------------------- */

/* AdamW on n elements with g = grad * gscale; bc1, bc2: bias corrections 1 - beta^t. */
void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2, float gscale);
/* out[0] = sum of squares of x[0..n) (device memory; fixed summation order). */
void sumsq(float *out, const float *x, size_t n);
void scale_inplace(float *x, size_t n, float s);

/* -- Mixture of experts ------------------------------------------------------------------- */

/* Top-k per row (ties to the lower expert), the chosen probabilities (softmax over the k, or
** with 'pre' the softmax over all E, not renormalised) and every row's softmax over all E. */
void moe_route(int *sel, float *prob, float *scores, const float *logits, int N, int E, int k,
               int pre);
void moe_route_bwd(float *dlogits, const float *dprob, const float *prob, const float *scores,
                   const int *sel, const float *auxg, int N, int E, int k, int pre);
/* out[i] = src[idx[i]] (rows of C); idx[i] < 0 gives a zero row. */
void gather_rows(float *out, const float *src, const int *idx, int n, int C);
/* out[t] = sum over the k choices of token t of src[pos[t*k + j]] (pos < 0: dropped). */
void combine_rows(float *out, const float *src, const int *pos, int N, int k, int C);
void row_scale(float *y, const float *s, int n, int C);              /* y[i] *= s[i] */
void row_dot(float *out, const float *a, const float *b, int n, int C);   /* out[i] = a[i].b[i] */
void add_scaled_bias(float *y, const float *s, const float *b, int n, int C); /* y[i] += s[i] b */
void scaled_bias_bwd(float *db, const float *s, const float *dy, int n, int C);
/* out (n) = sum of the nblocks blocks of n elements of 'in', in block order. */
void sum_blocks(float *out, const float *in, int nblocks, size_t n);

#ifdef __cplusplus
}
#endif
#endif
