/*
** kernels_cpu.c: the kernels of kernels.h on the CPU: host pointers, each kernel split into
** tasks on the runtime's thread pool (rt_parallel_for) over rows, column blocks or element
** blocks, each task running the shared row arithmetic of kernel_rows.h. Results do not depend
** on the number of threads. Part of the training library (build/libgpt_cpu.a).
*/
#include "kernel_rows.h"
#include "kernels.h"
#include "rt.h"       // defines: rt_parallel_for, rt_gemm, rt_threads

#define COLS  64       /* columns per task in column reductions (deterministic order) */

/* -- Embedding: vocabulary-parallel tokens, learned positions ---------------------------------- */
/*
** Activations are sequence-major: row t*B + b holds token b of position t. A rank owns the
** vocabulary rows [vstart, vstart + vrows); other token ids give zero rows (the TP all-reduce
** that follows adds the owner's row). Backward sums in token order: deterministic.
*/

typedef struct {
    float *out;
    const float *table, *dout;
    const int *tok;
    int N, T, B, C, vstart, vrows, t0;
} encoder_args;

static void embed_fwd_rows(void *p, int lo, int hi)
{
    const encoder_args *a = p;
    for (int n = lo; n < hi; n++)
        embed_row_fwd(a->out + (size_t)n * a->C, a->table, a->tok[n], a->C, a->vstart, a->vrows);
}

static void embed_bwd_cols(void *p, int lo, int hi)      /* lo, hi: blocks of COLS */
{
    const encoder_args *a = p;
    embed_cols_bwd(a->out, a->dout, a->tok, a->N, a->C, a->vstart, a->vrows, lo * COLS,
                   MIN(hi * COLS, a->C));
}

static void pos_fwd_rows(void *p, int lo, int hi)
{
    const encoder_args *a = p;
    for (int t = lo; t < hi; t++) pos_row_fwd(a->out, a->table, t, a->B, a->C, a->t0);
}

static void pos_bwd_rows(void *p, int lo, int hi)
{
    const encoder_args *a = p;
    for (int t = lo; t < hi; t++) pos_row_bwd(a->out, a->dout, t, a->B, a->C, a->t0);
}

void embed_fwd(float *out, const int *tok, const float *wte, int N, int C, int vstart,
               int vrows)
{
    encoder_args a = { .out = out, .table = wte, .tok = tok, .N = N, .C = C, .vstart = vstart,
                       .vrows = vrows };
    rt_parallel_for(N, embed_fwd_rows, &a);
}

void embed_bwd(float *dwte, const float *dout, const int *tok, int N, int C, int vstart,
               int vrows)
{
    encoder_args a = { .out = dwte, .dout = dout, .tok = tok, .N = N, .C = C, .vstart = vstart,
                       .vrows = vrows };
    rt_parallel_for(CEIL_DIV(C, COLS), embed_bwd_cols, &a);
}

void pos_fwd(float *out, const float *wpe, int T, int B, int C, int t0)
{
    encoder_args a = { .out = out, .table = wpe, .T = T, .B = B, .C = C, .t0 = t0 };
    rt_parallel_for(T, pos_fwd_rows, &a);
}

void pos_bwd(float *dwpe, const float *dout, int T, int B, int C, int t0)
{
    encoder_args a = { .out = dwpe, .dout = dout, .T = T, .B = B, .C = C, .t0 = t0 };
    rt_parallel_for(T, pos_bwd_rows, &a);
}

/* -- LayerNorm over rows of a (N, C) matrix ---------------------------------------------------- */
/*
** Statistics in f32 with a two-pass mean/variance; backward accumulates into dinp, dw, db
** (the residual stream and micro-batch accumulation both add). Every output element is summed
** in a fixed order.
*/

typedef struct {
    float *out, *mean, *rstd, *dinp, *dw, *db;
    const float *inp, *w, *b, *dout, *cmean, *crstd;
    int N, C;
    float eps;
} layernorm_args;

static void layernorm_fwd_rows(void *p, int lo, int hi)
{
    const layernorm_args *a = p;
    for (int n = lo; n < hi; n++)
        layernorm_row_fwd(a->out + (size_t)n * a->C, a->mean + n, a->rstd + n,
                          a->inp + (size_t)n * a->C, a->w, a->b, a->C, a->eps);
}

static void layernorm_bwd_rows(void *p, int lo, int hi)
{
    const layernorm_args *a = p;
    for (int n = lo; n < hi; n++)
        layernorm_row_bwd(a->dinp + (size_t)n * a->C, a->dout + (size_t)n * a->C,
                          a->inp + (size_t)n * a->C, a->w, a->cmean[n], a->crstd[n], a->C);
}

static void layernorm_bwd_cols(void *p, int lo, int hi)   /* lo, hi: blocks of COLS */
{
    const layernorm_args *a = p;
    layernorm_cols_bwd(a->dw, a->db, a->dout, a->inp, a->cmean, a->crstd, a->N, a->C,
                       lo * COLS, MIN(hi * COLS, a->C));
}

void layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int N, int C, float eps)
{
    layernorm_args a = { .out = out, .mean = mean, .rstd = rstd, .inp = inp, .w = w, .b = b,
                         .N = N, .C = C, .eps = eps };
    rt_parallel_for(N, layernorm_fwd_rows, &a);
}

void layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int N, int C)
{
    layernorm_args a = { .dinp = dinp, .dw = dw, .db = db, .dout = dout, .inp = inp, .w = w,
                         .cmean = mean, .crstd = rstd, .N = N, .C = C };
    rt_parallel_for(N, layernorm_bwd_rows, &a);
    rt_parallel_for(CEIL_DIV(C, COLS), layernorm_bwd_cols, &a);
}

/* -- GELU (tanh approximation), bias, residual adds -------------------------------------------- */
/*
** GELU as GPT-2 and Hugging Face's "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
*/

typedef struct {
    float *out;
    const float *a, *b;
    size_t n;
    int N, OC;
} pointwise_args;

/* Element ranges: the pool gets blocks of ELEMS elements. */
#define ELEMS 4096
#define BLOCK_RANGE(a, lo, hi, i0, i1)                                            \
    size_t i0 = (size_t)(lo) * ELEMS, i1 = MIN((size_t)(hi) * ELEMS, (a)->n)

static void gelu_fwd_part(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    for (size_t i = i0; i < i1; i++) a->out[i] = gelu1(a->a[i]);
}

static void gelu_bwd_part(void *p, int lo, int hi)      /* a: input, b: dout */
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    for (size_t i = i0; i < i1; i++) a->out[i] = a->b[i] * gelu1_grad(a->a[i]);
}

static void add_fwd_part(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    for (size_t i = i0; i < i1; i++) a->out[i] = a->a[i] + a->b[i];
}

static void bias_fwd_rows(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    for (int n = lo; n < hi; n++) {
        float *o = a->out + (size_t)n * a->OC;
        for (int i = 0; i < a->OC; i++) o[i] += a->a[i];
    }
}

static void bias_bwd_cols(void *p, int lo, int hi)      /* lo, hi: blocks of COLS */
{
    const pointwise_args *a = p;
    bias_cols_bwd(a->out, a->a, a->N, a->OC, lo * COLS, MIN(hi * COLS, a->OC));
}

static int blocks(size_t n) { return (int)CEIL_DIV(n, (size_t)ELEMS); }

void gelu_fwd(float *out, const float *inp, size_t n)
{
    pointwise_args a = { .out = out, .a = inp, .n = n };
    rt_parallel_for(blocks(n), gelu_fwd_part, &a);
}

void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    pointwise_args a = { .out = dinp, .a = inp, .b = dout, .n = n };
    rt_parallel_for(blocks(n), gelu_bwd_part, &a);
}

void bias_fwd(float *out, const float *bias, int N, int OC)
{
    pointwise_args a = { .out = out, .a = bias, .N = N, .OC = OC };
    rt_parallel_for(N, bias_fwd_rows, &a);
}

void bias_bwd(float *dbias, const float *dout, int N, int OC)
{
    pointwise_args a = { .out = dbias, .a = dout, .N = N, .OC = OC };
    rt_parallel_for(CEIL_DIV(OC, COLS), bias_bwd_cols, &a);
}

void add_fwd(float *out, const float *a_, const float *b_, size_t n)
{
    pointwise_args a = { .out = out, .a = a_, .b = b_, .n = n };
    rt_parallel_for(blocks(n), add_fwd_part, &a);
}

void add_inplace(float *y, const float *x, size_t n)
{
    pointwise_args a = { .out = y, .a = y, .b = x, .n = n };
    rt_parallel_for(blocks(n), add_fwd_part, &a);
}

/* -- Causal multi-head self-attention over the local heads ------------------------------------- */
/*
** qkv rows are tokens in sequence-major order (row t*B + b), each [q | k | v] with Hl heads of
** hd channels. Scores are scaled by 1/sqrt(hd) in the GEMM (Megatron's baddbmm alpha), then a
** causal softmax; att (B, Hl, T, T) keeps the probabilities (zeros above the diagonal).
*/

typedef struct { float *d; const float *p; int T; } softmax_args;

/* Rows [lo, hi) of a (T, T) block; row r is query r % T. */
static void softmax_fwd_rows(void *ctx, int lo, int hi)
{
    const softmax_args *a = ctx;
    for (int r = lo; r < hi; r++) softmax_row_fwd(a->d + (size_t)r * a->T, r % a->T, a->T);
}

static void softmax_bwd_rows(void *ctx, int lo, int hi)
{
    const softmax_args *a = ctx;
    for (int r = lo; r < hi; r++)
        softmax_row_bwd(a->d + (size_t)r * a->T, a->p + (size_t)r * a->T, r % a->T, a->T);
}

/* The CPU runs one pool task per (batch element, head): its GEMMs (single-threaded inside
** the pool) and softmax rows back to back while its (T, T) block is in cache, one dispatch
** per call. With fewer heads than threads the heads run in turn on the calling thread, and
** each head's GEMMs and softmax rows use the whole pool (rt_gemm splits, rt_parallel_for
** runs inline when nested). Each element comes out the same either way. */
typedef struct {
    float *out, *att, *dqkv, *datt;
    const float *qkv, *dout, *catt;
    int Hl, T, hd, C, ldqkv, ldout;
    float scale;
} attention_args;

static void attention_fwd_heads(void *ctx, int lo, int hi)
{
    const attention_args *a = ctx;
    int T = a->T, hd = a->hd;
    for (int bh = lo; bh < hi; bh++) {
        int b = bh / a->Hl, h = bh % a->Hl;
        const float *q = a->qkv + (size_t)b * 3 * a->C + (size_t)h * hd;
        const float *k = q + a->C, *v = q + 2 * a->C;
        float *p = a->att + (size_t)bh * T * T;
        softmax_args rows = { p, NULL, T };
        rt_gemm(0, 1, T, T, hd, a->scale, q, a->ldqkv, 0, k, a->ldqkv, 0, 0.0f, p, T, 0, 1,
                RT_F32, RT_F32);
        rt_parallel_for(T, softmax_fwd_rows, &rows);
        rt_gemm(0, 0, T, hd, T, 1.0f, p, T, 0, v, a->ldqkv, 0, 0.0f,
                a->out + (size_t)b * a->C + (size_t)h * hd, a->ldout, 0, 1, RT_F32, RT_F32);
    }
}

static void attention_bwd_heads(void *ctx, int lo, int hi)
{
    const attention_args *a = ctx;
    int T = a->T, hd = a->hd;
    for (int bh = lo; bh < hi; bh++) {
        int b = bh / a->Hl, h = bh % a->Hl;
        size_t col = (size_t)b * 3 * a->C + (size_t)h * hd;
        const float *q = a->qkv + col, *k = q + a->C, *v = q + 2 * a->C;
        const float *dob = a->dout + (size_t)b * a->C + (size_t)h * hd;
        const float *p = a->catt + (size_t)bh * T * T;
        float *ds = a->datt + (size_t)bh * T * T;
        float *dq = a->dqkv + col, *dk = dq + a->C, *dv = dq + 2 * a->C;
        softmax_args rows = { ds, p, T };
        /* dp = dout v^T, then ds = softmax backward; dq = scale ds k, dk = scale ds^T q,
        ** dv = p^T dout */
        rt_gemm(0, 1, T, T, hd, 1.0f, dob, a->ldout, 0, v, a->ldqkv, 0, 0.0f, ds, T, 0, 1,
                RT_F32, RT_F32);
        rt_parallel_for(T, softmax_bwd_rows, &rows);
        rt_gemm(0, 0, T, hd, T, a->scale, ds, T, 0, k, a->ldqkv, 0, 0.0f, dq, a->ldqkv, 0, 1,
                RT_F32, RT_F32);
        rt_gemm(1, 0, T, hd, T, a->scale, ds, T, 0, q, a->ldqkv, 0, 0.0f, dk, a->ldqkv, 0, 1,
                RT_F32, RT_F32);
        rt_gemm(1, 0, T, hd, T, 1.0f, p, T, 0, dob, a->ldout, 0, 0.0f, dv, a->ldqkv, 0, 1,
                RT_F32, RT_F32);
    }
}

/*
** out (T*B, Hl*hd) = softmax(scale * q k^T) v per batch element and head; att (B, Hl, T, T)
** receives the probabilities. Row strides: qkv B*3*Hl*hd, out B*Hl*hd.
*/
void attention_fwd(float *out, float *att, const float *qkv, int B, int T, int Hl, int hd,
                   float scale)
{
    attention_args a = { .out = out, .att = att, .qkv = qkv, .Hl = Hl, .T = T, .hd = hd,
                         .C = Hl * hd, .ldqkv = B * 3 * Hl * hd, .ldout = B * Hl * hd,
                         .scale = scale };
    if (B * Hl >= rt_threads())
        rt_parallel_for(B * Hl, attention_fwd_heads, &a);
    else
        attention_fwd_heads(&a, 0, B * Hl);
}

/*
** dqkv (overwritten) from dout (T*B, Hl*hd), the saved probabilities and qkv. datt is
** (B, Hl, T, T) scratch.
*/
void attention_bwd(float *dqkv, float *datt, const float *dout, const float *att,
                   const float *qkv, int B, int T, int Hl, int hd, float scale)
{
    attention_args a = { .dqkv = dqkv, .datt = datt, .qkv = qkv, .dout = dout, .catt = att,
                         .Hl = Hl, .T = T, .hd = hd, .C = Hl * hd, .ldqkv = B * 3 * Hl * hd,
                         .ldout = B * Hl * hd, .scale = scale };
    if (B * Hl >= rt_threads())
        rt_parallel_for(B * Hl, attention_bwd_heads, &a);
    else
        attention_bwd_heads(&a, 0, B * Hl);
}

/* -- Vocabulary-parallel cross-entropy (docs/megatron.md §4.5) --------------------------------- */
/*
** logits (N, Vl) hold this rank's vocabulary columns [vstart, vstart + valid); columns past
** 'valid' are padding and never count. The caller reduces between the pieces: all-reduce MAX
** of the row maxima, then all-reduce SUM of [sum exp | target logit].
*/

typedef struct {
    float *dlogits, *mx_out, *sums_out;      /* written */
    const float *logits, *mx, *sums;         /* read */
    const int *targets;
    int N, Vl, valid, vstart;
    float dloss;
} ce_args;

static void ce_rowmax_rows(void *p, int lo, int hi)
{
    const ce_args *a = p;
    for (int n = lo; n < hi; n++)
        ce_row_max(a->mx_out + n, a->logits + (size_t)n * a->Vl, a->valid);
}

static void ce_sums_rows(void *p, int lo, int hi)
{
    const ce_args *a = p;
    for (int n = lo; n < hi; n++)
        ce_row_sums(a->sums_out + n, a->sums_out + a->N + n, a->logits + (size_t)n * a->Vl,
                    a->mx[n], a->targets[n], a->valid, a->vstart);
}

static void ce_bwd_rows(void *p, int lo, int hi)
{
    const ce_args *a = p;
    for (int n = lo; n < hi; n++)
        ce_row_bwd(a->dlogits + (size_t)n * a->Vl, a->mx[n], a->sums[n], a->targets[n], a->Vl,
                   a->valid, a->vstart, a->dloss);
}

void ce_rowmax(float *mx, const float *logits, int N, int Vl, int valid)
{
    ce_args a = { .logits = logits, .mx_out = mx, .N = N, .Vl = Vl, .valid = valid };
    rt_parallel_for(N, ce_rowmax_rows, &a);
}

void ce_sums(float *sums, const float *logits, const float *mx, const int *targets, int N,
             int Vl, int valid, int vstart)
{
    ce_args a = { .logits = logits, .mx = mx, .sums_out = sums, .targets = targets, .N = N,
                  .Vl = Vl, .valid = valid, .vstart = vstart };
    rt_parallel_for(N, ce_sums_rows, &a);
}

void ce_loss(float *loss, const float *sums, const float *mx, int N)
{
    for (int n = 0; n < N; n++) loss[n] = logf(sums[n]) + mx[n] - sums[N + n];
}

void ce_bwd(float *logits, const float *mx, const float *sums, const int *targets, int N,
            int Vl, int valid, int vstart, float dloss)
{
    ce_args a = { .dlogits = logits, .mx = mx, .sums = sums, .targets = targets, .N = N,
                  .Vl = Vl, .valid = valid, .vstart = vstart, .dloss = dloss };
    rt_parallel_for(N, ce_bwd_rows, &a);
}

void sum_rows(float *out, const float *x, int N)
{
    float s = 0.0f;
    for (int n = 0; n < N; n++) s += x[n];
    out[0] = s;
}

/* -- AdamW (torch.optim.AdamW), gradient-norm pieces, scaling ---------------------------------- */
/*
** torch's order: p *= 1 - lr*wd; m, v updated; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),
** with g = grad * gscale (the clipping coefficient, 1 when not clipping).
*/

typedef struct {
    float *p, *m, *v;
    const float *g;
    size_t n;
    float lr, beta1, beta2, eps, wd, step_size, bc2_sqrt, gscale;
} adamw_args;

#define ADAM_ELEMS 16384   /* elements per task */

static void adamw_part(void *ctx, int lo, int hi)
{
    const adamw_args *a = ctx;
    size_t i0 = (size_t)lo * ADAM_ELEMS, i1 = MIN((size_t)hi * ADAM_ELEMS, a->n);
    for (size_t i = i0; i < i1; i++)
        adamw1(a->p + i, a->g[i] * a->gscale, a->m + i, a->v + i, a->lr, a->beta1, a->beta2,
               a->eps, a->wd, a->step_size, a->bc2_sqrt);
}

void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2, float gscale)
{
    adamw_args a = { p, m, v, g, n, lr, beta1, beta2, eps, wd, lr / bc1, sqrtf(bc2), gscale };
    rt_parallel_for((int)CEIL_DIV(n, (size_t)ADAM_ELEMS), adamw_part, &a);
}

/* A sum of squares is split into parts fixed by n alone (at least SUMSQ_ELEMS elements each,
** at most SUMSQ_PARTS parts); each part keeps LANES partial sums in double; the parts are
** added in order. Deterministic and independent of the thread count. */
#define SUMSQ_ELEMS 65536
#define SUMSQ_PARTS 256

typedef struct { const float *x; size_t n; int parts; double *part; } sumsq_args;

static void sumsq_parts(void *ctx, int lo, int hi)
{
    const sumsq_args *a = ctx;
    for (int k = lo; k < hi; k++) {
        size_t i0 = a->n * (size_t)k / (size_t)a->parts;
        size_t i1 = a->n * (size_t)(k + 1) / (size_t)a->parts;
        const float *x = a->x + i0;
        size_t n = i1 - i0, i = 0;
        double acc[LANES] = { 0.0 }, s = 0.0;
        for (; i + LANES <= n; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += (double)x[i + l] * (double)x[i + l];
        for (int l = 0; l < LANES; l++) s += acc[l];
        for (; i < n; i++) s += (double)x[i] * (double)x[i];
        a->part[k] = s;
    }
}

void sumsq(float *out, const float *x, size_t n)
{
    double part[SUMSQ_PARTS], s = 0.0;
    size_t parts = CEIL_DIV(n, (size_t)SUMSQ_ELEMS);
    sumsq_args a = { x, n, (int)MIN(parts, (size_t)SUMSQ_PARTS), part };
    rt_parallel_for(a.parts, sumsq_parts, &a);
    for (int k = 0; k < a.parts; k++) s += part[k];
    out[0] = (float)s;
}

typedef struct { float *x; size_t n; float s; } scale_args;

static void scale_part(void *ctx, int lo, int hi)
{
    const scale_args *a = ctx;
    size_t i0 = (size_t)lo * ADAM_ELEMS, i1 = MIN((size_t)hi * ADAM_ELEMS, a->n);
    for (size_t i = i0; i < i1; i++) a->x[i] *= a->s;
}

void scale_inplace(float *x, size_t n, float s)
{
    scale_args a = { x, n, s };
    rt_parallel_for((int)CEIL_DIV(n, (size_t)ADAM_ELEMS), scale_part, &a);
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

typedef struct {
    float *out, *fout;
    int *sel;
    const float *src, *a, *b, *s, *auxg;
    const int *idx, *isel;
    int N, E, k, C, pre, nblocks;
    size_t n;
} moe_args;

static void moe_route_rows(void *p, int lo, int hi)
{
    const moe_args *a = p;
    for (int n = lo; n < hi; n++)
        route_row(a->sel + (size_t)n * a->k, a->fout + (size_t)n * a->k,
                  a->out + (size_t)n * a->E, a->src + (size_t)n * a->E, a->E, a->k, a->pre);
}

static void moe_route_bwd_rows(void *p, int lo, int hi)
{
    const moe_args *a = p;   /* out: dlogits, a: dprob, b: prob, s: scores */
    for (int n = lo; n < hi; n++)
        route_row_bwd(a->out + (size_t)n * a->E, a->a + (size_t)n * a->k, a->b + (size_t)n * a->k,
                      a->s + (size_t)n * a->E, a->isel + (size_t)n * a->k, a->auxg, a->E, a->k,
                      a->pre);
}

static void gather_rows_part(void *p, int lo, int hi)
{
    const moe_args *a = p;
    for (int i = lo; i < hi; i++) {
        float *o = a->out + (size_t)i * a->C;
        if (a->idx[i] < 0) memset(o, 0, (size_t)a->C * sizeof(float));
        else memcpy(o, a->src + (size_t)a->idx[i] * a->C, (size_t)a->C * sizeof(float));
    }
}

static void combine_rows_part(void *p, int lo, int hi)
{
    const moe_args *a = p;
    for (int n = lo; n < hi; n++)
        combine_row(a->out + (size_t)n * a->C, a->src, a->idx + (size_t)n * a->k, a->k, a->C);
}

static void row_scale_part(void *p, int lo, int hi)
{
    const moe_args *a = p;
    for (int i = lo; i < hi; i++)
        for (int c = 0; c < a->C; c++) a->out[(size_t)i * a->C + c] *= a->s[i];
}

static void row_dot_part(void *p, int lo, int hi)
{
    const moe_args *a = p;
    for (int i = lo; i < hi; i++) {
        float s = 0.0f;
        for (int c = 0; c < a->C; c++) s += a->a[(size_t)i * a->C + c] * a->b[(size_t)i * a->C + c];
        a->out[i] = s;
    }
}

static void add_scaled_bias_part(void *p, int lo, int hi)
{
    const moe_args *a = p;
    for (int i = lo; i < hi; i++)
        for (int c = 0; c < a->C; c++) a->out[(size_t)i * a->C + c] += a->s[i] * a->b[c];
}

static void sum_blocks_part(void *p, int lo, int hi)   /* lo, hi: blocks of COLS elements */
{
    const moe_args *a = p;
    size_t i1 = MIN((size_t)hi * COLS, a->n);
    for (size_t i = (size_t)lo * COLS; i < i1; i++) {
        float s = 0.0f;
        for (int m = 0; m < a->nblocks; m++) s += a->src[(size_t)m * a->n + i];
        a->out[i] = s;
    }
}

void moe_route(int *sel, float *prob, float *scores, const float *logits, int N, int E, int k,
               int pre)
{
    moe_args a = { .out = scores, .fout = prob, .sel = sel, .src = logits, .N = N, .E = E,
                   .k = k, .pre = pre };
    rt_parallel_for(N, moe_route_rows, &a);
}

void moe_route_bwd(float *dlogits, const float *dprob, const float *prob, const float *scores,
                   const int *sel, const float *auxg, int N, int E, int k, int pre)
{
    moe_args a = { .out = dlogits, .a = dprob, .b = prob, .s = scores, .isel = sel,
                   .auxg = auxg, .N = N, .E = E, .k = k, .pre = pre };
    rt_parallel_for(N, moe_route_bwd_rows, &a);
}

void gather_rows(float *out, const float *src, const int *idx, int n, int C)
{
    moe_args a = { .out = out, .src = src, .idx = idx, .C = C };
    rt_parallel_for(n, gather_rows_part, &a);
}

void combine_rows(float *out, const float *src, const int *pos, int N, int k, int C)
{
    moe_args a = { .out = out, .src = src, .idx = pos, .N = N, .k = k, .C = C };
    rt_parallel_for(N, combine_rows_part, &a);
}

void row_scale(float *y, const float *s, int n, int C)
{
    moe_args a = { .out = y, .s = s, .C = C };
    rt_parallel_for(n, row_scale_part, &a);
}

void row_dot(float *out, const float *x, const float *y, int n, int C)
{
    moe_args a = { .out = out, .a = x, .b = y, .C = C };
    rt_parallel_for(n, row_dot_part, &a);
}

void add_scaled_bias(float *y, const float *s, const float *b, int n, int C)
{
    moe_args a = { .out = y, .s = s, .b = b, .C = C };
    rt_parallel_for(n, add_scaled_bias_part, &a);
}

/* db[c] += sum_i s[i] dy[i, c], rows in order: one pass, deterministic. */
void scaled_bias_bwd(float *db, const float *s, const float *dy, int n, int C)
{
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++) db[c] += s[i] * dy[(size_t)i * C + c];
}

void sum_blocks(float *out, const float *in, int nblocks, size_t n)
{
    moe_args a = { .out = out, .src = in, .nblocks = nblocks, .n = n };
    rt_parallel_for((int)CEIL_DIV(n, (size_t)COLS), sum_blocks_part, &a);
}
