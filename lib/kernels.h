/*
** kernels.h: the kernels of the training library, one contract for both backends:
** kernels_cpu.c (loops on the runtime's thread pool, host pointers) and kernels_cuda.cu (CUDA
** kernels on the legacy default stream, device pointers). Shapes are arguments: the library is
** compiled once per backend and serves every model and layout. Every kernel is deterministic:
** each output element is computed, and each sum taken, in a fixed order independent of threads.
** Called by the library's model code (model.c, moe.c, stage.c) and the kernel tests.
**
** Storage dtype. Activations and parameters are stored in one dtype t, the last argument:
** RT_F32, or RT_BF16 (uint16_t bits, the upper half of an IEEE f32). They are passed as void *.
** Every kernel loads them widened exactly to f32, computes in f32 and rounds each output
** element once to t (round to nearest even; NaN stays NaN); an accumulation into a t buffer
** (+=) loads, adds in f32 and rounds once. With t = RT_F32 the arithmetic is plain f32.
** Parameter gradients (float *: the f32 main gradients) and statistics (LayerNorm mean and
** rstd, the attention log-sum-exp, cross-entropy sums and losses, MoE probabilities, scores,
** logits) are always f32.
*/
#ifndef GPT_KERNELS_H
#define GPT_KERNELS_H

#include <stddef.h>

#include "rt.h"       // defines: rt_dtype (RT_F32, RT_BF16)

#ifdef __cplusplus   /* kernels_cuda.cu is C++: these are C symbols */
extern "C" {
#endif

/* -- Embedding (rows are tokens, sequence-major: row t*B + b) ------------------------------- */

/* out (N, C) = wte[tok - vstart] for tokens this rank owns ([vstart, vstart + vrows)), else 0. */
void embed_fwd(void *out, const int *tok, const void *wte, int N, int C, int vstart, int vrows,
               rt_dtype t);
/* dwte (vrows, C) += every owned token's gradient row, in token order. */
void embed_bwd(float *dwte, const void *dout, const int *tok, int N, int C, int vstart,
               int vrows, rt_dtype t);
/* out (T*B, C) += wpe[t0 + t] on every row of position t. */
void pos_fwd(void *out, const void *wpe, int T, int B, int C, int t0, rt_dtype t);
void pos_bwd(float *dwpe, const void *dout, int T, int B, int C, int t0, rt_dtype t);

/* -- LayerNorm ---------------------------------------------------------------------------- */

void layernorm_fwd(void *out, float *mean, float *rstd, const void *inp, const void *w,
                   const void *b, int N, int C, float eps, rt_dtype t);
/* The residual add and the norm after it in one pass (res = a + b, then out = the norm of
** res's rows): bit for bit add_fwd then layernorm_fwd / rmsnorm_fwd, one read of res less and
** one launch less on CUDA. res may be a or b (in place). */
void add_layernorm_fwd(void *res, void *out, float *mean, float *rstd, const void *a,
                       const void *b, const void *w, const void *bias, int N, int C, float eps,
                       rt_dtype t);
void add_rmsnorm_fwd(void *res, void *out, float *rstd, const void *a, const void *b,
                     const void *w, int N, int C, float eps, rt_dtype t);
/* dinp, dw, db accumulate (+=). */
void layernorm_bwd(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                   const void *w, const float *mean, const float *rstd, int N, int C,
                   rt_dtype t);

/* -- Pointwise ---------------------------------------------------------------------------- */

void gelu_fwd(void *out, const void *inp, size_t n, rt_dtype t);
/* dinp may be dout (in place) */
void gelu_bwd(void *dinp, const void *inp, const void *dout, size_t n, rt_dtype t);
void bias_fwd(void *out, const void *bias, int N, int OC, rt_dtype t);       /* out += bias */
void bias_bwd(float *dbias, const void *dout, int N, int OC, rt_dtype t);   /* += column sums */
void add_fwd(void *out, const void *a, const void *b, size_t n, rt_dtype t);
void add_inplace(void *y, const void *x, size_t n, rt_dtype t);

/* dst (n, dtype dt) = src (n, dtype st): f32 <-> bf16 (round to nearest even), a copy when
** dt == st. Other dtypes abort. */
void convert(void *dst, rt_dtype dt, const void *src, rt_dtype st, size_t n);

/* -- Attention (qkv rows: [q | k | v], q of Hl local query heads, k and v of KVl kv heads) - */
/*
** Grouped-query attention: Hl is a multiple of KVl and query head h reads kv head
** h / (Hl/KVl) (KVl = Hl: multi-head attention). A qkv row holds (Hl + 2*KVl)*hd elements:
** q at column 0, k at Hl*hd, v at (Hl + KVl)*hd, head h of each part at h*hd further.
*/

/* Causal softmax(scale q k^T) v per batch element and query head, without the (T, T) matrix.
** out (N, Hl*hd); lse (B, Hl, T) f32 receives each query row's log-sum-exp of its scaled,
** masked scores, which is all the backward needs besides qkv and out. */
void attention_fwd(void *out, float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                   int hd, float scale, rt_dtype t);
/* dqkv (N, (Hl + 2*KVl)*hd) = the gradient (written, not accumulated), recomputing the
** probabilities from qkv and lse; the dk (dv) of a kv head is the sum over its query heads in
** increasing h, in f32, rounded once (cuDNN's attention, attn_cudnn.h: each query head's
** term rounded to bf16, then summed). dsum (B, Hl, T) f32 is scratch (it receives
** rowsum(dout * out)). */
void attention_bwd(void *dqkv, float *dsum, const void *dout, const void *out, const float *lse,
                   const void *qkv, int B, int T, int Hl, int KVl, int hd, float scale,
                   rt_dtype t);
/* The one exception to the dtype rule above: where this is 1 (CUDA: the tensor-core kernels,
** or cuDNN's fused attention where it loads, attn_cudnn.h, chosen by ATTN), bf16 attention_fwd
** and attention_bwd with a head size a multiple of 16, up to 128, round the probabilities and
** the score gradients to bf16 before their products with v, dout, q and k (the sums stay f32),
** as FlashAttention does: each such term is then off by up to 2^-8 of itself. Where it is 0
** (the CPU) they stay f32. */
extern const int attention_bf16_products;

/* -- Context-parallel attention blocks (docs/megatron.md §10) ------------------------------- */
/*
** A block pairs Tq query positions with Tk key positions of one micro-batch: rows t*B + b of q
** (rows of ldq elements; query head h at column h*hd), of k and v (rows of ldkv elements; kv
** head h / (Hl/KVl) at its column times hd, as above). causal = 1:
** both blocks hold the same positions (Tq = Tk; query i sees keys j <= i); causal = 0: every
** key is visible (a block entirely earlier in the sequence). lse and dsum are f32 (B, Hl, ...)
** with rows of lse_ld elements: element (b, h, i) at [(b*Hl + h)*lse_ld + i].
*/

/* Merge the block's attention into the running f32 output acc (rows t*B + b of Hl*hd,
** normalised) and log-sum-exp lse: L = log(e^lse + e^l), acc = acc e^(lse - L) + o e^(l - L),
** with o, l the block's normalised output and log-sum-exp. Start from acc = 0, lse = -inf. */
void attention_fwd_block(float *acc, float *lse, int lse_ld, const void *q, int ldq,
                         const void *k, const void *v, int ldkv, int B, int Tq, int Tk, int Hl,
                         int KVl, int hd, int causal, float scale, rt_dtype t);
/* dsum (B, Hl, T) f32 = rowsum(dout * out) over each head's channels (rows t*B + b of Hl*hd). */
void attention_dsum(float *dsum, const void *dout, const void *out, int B, int T, int Hl, int hd,
                    rt_dtype t);
/* The block's gradients, added (+=) to f32 dq (rows like dout: Hl*hd), dk and dv (rows of
** lddkv elements; a kv head's summed over its query heads in increasing h, then added), from
** the queries' final lse and dsum and dout (rows of Hl*hd). */
void attention_bwd_block(float *dq, float *dk, float *dv, int lddkv, const void *dout,
                         const float *lse, const float *dsum, int lse_ld, const void *q,
                         int ldq, const void *k, const void *v, int ldkv, int B, int Tq, int Tk,
                         int Hl, int KVl, int hd, int causal, float scale, rt_dtype t);
/* dst (rows x cols, rows of ldd elements, dtype dt) = src (rows of lds, dtype st): f32 <-> bf16
** rounded to nearest even, or a copy. */
void copy_cols(void *dst, rt_dtype dt, size_t ldd, const void *src, rt_dtype st, size_t lds,
               int rows, int cols);

/* x[0..n) = v (f32) */
void fill_f32(float *x, size_t n, float v);

/* -- Llama layer (rows are tokens, sequence-major: row t*B + b) ---------------------------- */

/* RMSNorm: rstd (N) f32 = 1/sqrt(mean(inp^2) + eps); out = inp * rstd * w (the mean of
** squares summed in f32 in a fixed order by column: interleaved partial sums added in order,
** kernel_rows.h; HF computes it in fp32). */
void rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                 float eps, rt_dtype t);
/* dinp += rstd*(g - xhat*mean(g*xhat)) with g = dout*w, xhat = inp*rstd;  dw += dout*xhat
** (f32, rows summed in row order). Both accumulate, like layernorm_bwd. */
void rmsnorm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                 const float *rstd, int N, int C, rt_dtype t);
/* Rotary position embedding (Hugging Face rotate_half convention), in place on rows t*B + b
** (t in [0,T), b in [0,B)) of ld elements, H heads of hd channels at columns h*hd (hd even);
** row of t is at position pos0 + t. For i < hd/2: inv = theta^(-2i/hd), a = pos*inv, both
** computed in double and cos a, sin a rounded to f32;  x'[i] = x[i] cos a - x[i+hd/2] sin a,
** x'[i+hd/2] = x[i+hd/2] cos a + x[i] sin a. inverse = 1: rotation by -a (the backward,
** applied in place to the gradient). */
void rope_fwd(void *x, size_t ld, int T, int B, int H, int hd, int pos0, float theta,
              int inverse, rt_dtype t);
/* SwiGLU: gu rows [gate (F) | up (F)] (row stride 2F); out (N, F) = silu(gate) * up,
** silu(g) = g / (1 + exp(-g)) computed without NaN for any finite g (g = -1000 must give -0
** or 0, not NaN). */
void swiglu_fwd(void *out, const void *gu, int N, int F, rt_dtype t);
/* dgu rows [dgate | dup] written (not accumulated): dgate = dout*up*s*(1 + g*(1-s)),
** dup = dout*silu(g), s = sigmoid(g). */
void swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F, rt_dtype t);

/* -- Vocabulary-parallel cross-entropy ---------------------------------------------------- */

/* mx (N): the row maxima over this rank's 'valid' columns. */
void ce_rowmax(float *mx, const void *logits, int N, int Vl, int valid, rt_dtype t);
/* sums (2N): [sum of exp(logit - mx) | the target's logit where this rank owns the target]. */
void ce_sums(float *sums, const void *logits, const float *mx, const int *targets, int N,
             int Vl, int valid, int vstart, rt_dtype t);
/* loss (N) = log(sum exp) + mx - target logit, from the reduced sums. */
void ce_loss(float *loss, const float *sums, const float *mx, int N);
/* logits := (softmax - onehot(target)) * dloss, in place (rounded to t); padding columns 0. */
void ce_bwd(void *logits, const float *mx, const float *sums, const int *targets, int N,
            int Vl, int valid, int vstart, float dloss, rt_dtype t);
/* ce_rowmax, ce_sums, ce_loss and ce_bwd in one call, for a rank that owns the whole
** vocabulary (TP 1: no all-reduce between them): mx, sums and loss as those write them (sums:
** up to rounding), logits := the gradient. CUDA: a block per row reads the row once for its
** maximum and sum of exponentials (rescaled as the maximum rises) and once more for the
** gradient, where the three kernels read it three times. */
void ce_fused(float *loss, float *mx, float *sums, void *logits, const int *targets, int N,
              int Vl, int valid, int vstart, float dloss, rt_dtype t);
/* out[0] = sum of x[0..N), in order (device memory). */
void sum_rows(float *out, const float *x, int N);

/* -- Optimizer ---------------------------------------------------------------------------- */

/* AdamW on n elements of the f32 (main) parameters p with g = grad * gscale; bc1, bc2: bias
** corrections 1 - beta^t. copy: NULL, or n elements where the updated parameters are also
** written rounded to t (the model's bf16 parameters). */
void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2, float gscale, void *copy,
                rt_dtype t);
/* One tensor of adamw_multi: n elements of p, g, m, v (and of copy, or NULL), its decay wd. */
typedef struct {
    float *p, *m, *v;
    const float *g;
    void *copy;
    size_t n;
    float wd;
} adamw_tensor;
/* adamw_step on each of count tensors (host array; the hyper-parameters but wd shared): the
** same values, bit for bit; CUDA: one launch per MT_TENSORS tensors, no host synchronisation. */
void adamw_multi(const adamw_tensor *ts, int count, float lr, float beta1, float beta2, float eps,
                 float bc1, float bc2, float gscale, rt_dtype t);
/* out[0] = sum of squares of x[0..n) (device memory; fixed summation order). */
void sumsq(float *out, const float *x, size_t n);
/* out[k] = sumsq of x[k][0..n[k]) for k < count (host arrays of device pointers): the same
** values, bit for bit; CUDA: two launches per MT_TENSORS tensors. */
void sumsq_multi(float *out, const float *const *x, const size_t *n, int count);
#define MT_TENSORS 24    /* tensors per launch of the multi-tensor kernels (kernel arguments) */
void scale_inplace(float *x, size_t n, float s);

/* -- Mixture of experts ------------------------------------------------------------------- */

/* Top-k per row (ties to the lower expert), the chosen probabilities (softmax over the k, or
** with 'pre' the softmax over all E, not renormalised; times 'scale') and every row's softmax
** over all E. With ssum (N) non-NULL the score function is the sigmoid: scores are the
** sigmoids over their sum, ssum that sum (+ 1e-20), prob the chosen sigmoids over theirs (k = 1:
** the sigmoid), times 'scale'. groups > 1 (at most 64): group-limited routing, the top-k
** only from the group_topk best of 'groups' groups (kernel_rows.h route_row). ebias (E,
** device; NULL: none; sigmoid only): the expert bias, added to the sigmoids for the choice
** only. All f32. */
void moe_route(int *sel, float *prob, float *scores, float *ssum, const float *logits, int N,
               int E, int k, int pre, float scale, int groups, int group_topk,
               const float *ebias);
/* dlogits (N, E) written in t from the f32 routing state and gradients: dprob (N, k), auxg
** (aux_period, E) the aux loss's gradient per score (row n uses auxg row n % aux_period: the
** sequence-level aux loss's per sequence), zg (N; NULL: none) the z-loss's per logsumexp;
** pre and scale as moe_route's. */
void moe_route_bwd(void *dlogits, const float *dprob, const float *prob, const float *scores,
                   const float *ssum, const int *sel, const float *auxg, int aux_period,
                   const float *zg, int N, int E, int k, int pre, float scale, rt_dtype t);
/* out[i] = src[idx[i]] (rows of C); idx[i] < 0 gives a zero row. */
void gather_rows(void *out, const void *src, const int *idx, int n, int C, rt_dtype t);
/* out[t] = sum over the k choices of token t of src[pos[t*k + j]] (pos < 0: dropped), summed
** in f32 in j order and rounded once. */
void combine_rows(void *out, const void *src, const int *pos, int N, int k, int C, rt_dtype t);
void row_scale(void *y, const float *s, int n, int C, rt_dtype t);          /* y[i] *= s[i] */
void row_dot(float *out, const void *a, const void *b, int n, int C, rt_dtype t); /* a[i].b[i] */
void add_scaled_bias(void *y, const float *s, const void *b, int n, int C, rt_dtype t);
                                                                            /* y[i] += s[i] b */
void scaled_bias_bwd(float *db, const float *s, const void *dy, int n, int C, rt_dtype t);
/* out (n) = sum of the nblocks blocks of n elements of 'in', in block order. */
void sum_blocks(void *out, const void *in, int nblocks, size_t n, rt_dtype t);

#ifdef __cplusplus
}
#endif
#endif
