/*
** kernels_cpu.c: the kernels of kernels.h on the CPU: host pointers, each kernel split into
** tasks on the runtime's thread pool (rt_parallel_for) over rows, column blocks or element
** blocks, each task running the shared arithmetic of kernel_rows.h for the storage type of the
** call (BY_TYPE picks the _f32 or _bf16 instance once per task, outside the loops). Results do
** not depend on the number of threads. Part of the training library (build/libgpt_cpu.a).
*/
#include <stdlib.h>

#include "kernel_rows.h"
#include "kernels.h"
#include "rt.h"       // defines: rt_parallel_for, rt_threads, rt_dtype_size, RT_CHECK

#define COLS  64       /* columns per task in column reductions (deterministic order) */

/* fn##_bf16(...) or fn##_f32(...) for storage type t: one branch per task, not per element. */
#define BY_TYPE(t, fn, ...)                                                                  \
    do {                                                                                     \
        if ((t) == RT_BF16) fn##_bf16(__VA_ARGS__);                                          \
        else fn##_f32(__VA_ARGS__);                                                          \
    } while (0)

/* The storage type of a call: f32 or bf16, anything else is a caller's bug. */
static rt_dtype storage(rt_dtype t)
{
    RT_CHECK(t == RT_F32 || t == RT_BF16, "kernels: storage dtype %d is neither f32 nor bf16",
             (int)t);
    return t;
}

/* Element i of an array of dtype t (byte arithmetic on an untyped pointer). */
static void *elem(void *p, size_t i, rt_dtype t) { return (char *)p + i * rt_dtype_size(t); }
static const void *celem(const void *p, size_t i, rt_dtype t)
{
    return (const char *)p + i * rt_dtype_size(t);
}

/* -- Embedding: vocabulary-parallel tokens, learned positions ---------------------------------- */

typedef struct {
    void *out;
    float *grad;
    const void *table, *dout;
    const int *tok;
    int N, T, B, C, vstart, vrows, t0;
    rt_dtype t;
} encoder_args;

static void embed_fwd_task(void *p, int lo, int hi)
{
    const encoder_args *a = p;
    BY_TYPE(a->t, embed_fwd_rows, a->out, a->tok, a->table, a->C, a->vstart, a->vrows, lo, hi);
}

static void embed_bwd_task(void *p, int lo, int hi)      /* lo, hi: blocks of COLS */
{
    const encoder_args *a = p;
    BY_TYPE(a->t, embed_bwd_cols, a->grad, a->dout, a->tok, a->N, a->C, a->vstart, a->vrows,
            lo * COLS, MIN(hi * COLS, a->C));
}

static void pos_fwd_task(void *p, int lo, int hi)
{
    const encoder_args *a = p;
    BY_TYPE(a->t, pos_fwd_rows, a->out, a->table, a->B, a->C, a->t0, lo, hi);
}

static void pos_bwd_task(void *p, int lo, int hi)
{
    const encoder_args *a = p;
    BY_TYPE(a->t, pos_bwd_rows, a->grad, a->dout, a->B, a->C, a->t0, lo, hi);
}

void embed_fwd(void *out, const int *tok, const void *wte, int N, int C, int vstart, int vrows,
               rt_dtype t)
{
    encoder_args a = { .out = out, .table = wte, .tok = tok, .N = N, .C = C, .vstart = vstart,
                       .vrows = vrows, .t = storage(t) };
    rt_parallel_for(N, embed_fwd_task, &a);
}

void embed_bwd(float *dwte, const void *dout, const int *tok, int N, int C, int vstart,
               int vrows, rt_dtype t)
{
    encoder_args a = { .grad = dwte, .dout = dout, .tok = tok, .N = N, .C = C, .vstart = vstart,
                       .vrows = vrows, .t = storage(t) };
    rt_parallel_for(CEIL_DIV(C, COLS), embed_bwd_task, &a);
}

void pos_fwd(void *out, const void *wpe, int T, int B, int C, int t0, rt_dtype t)
{
    encoder_args a = { .out = out, .table = wpe, .T = T, .B = B, .C = C, .t0 = t0,
                       .t = storage(t) };
    rt_parallel_for(T, pos_fwd_task, &a);
}

void pos_bwd(float *dwpe, const void *dout, int T, int B, int C, int t0, rt_dtype t)
{
    encoder_args a = { .grad = dwpe, .dout = dout, .T = T, .B = B, .C = C, .t0 = t0,
                       .t = storage(t) };
    rt_parallel_for(T, pos_bwd_task, &a);
}

/* -- LayerNorm over rows of a (N, C) matrix ---------------------------------------------------- */

typedef struct {
    void *out, *dinp;
    float *mean, *rstd, *dw, *db;
    const void *inp, *w, *b, *dout;
    const float *cmean, *crstd;
    int N, C;
    float eps;
    rt_dtype t;
} layernorm_args;

static void layernorm_fwd_task(void *p, int lo, int hi)
{
    const layernorm_args *a = p;
    BY_TYPE(a->t, layernorm_fwd_rows, a->out, a->mean, a->rstd, a->inp, a->w, a->b, a->C,
            a->eps, lo, hi);
}

static void layernorm_bwd_task(void *p, int lo, int hi)
{
    const layernorm_args *a = p;
    BY_TYPE(a->t, layernorm_bwd_rows, a->dinp, a->dout, a->inp, a->w, a->cmean, a->crstd, a->C,
            lo, hi);
}

static void layernorm_bwd_cols_task(void *p, int lo, int hi)   /* lo, hi: blocks of COLS */
{
    const layernorm_args *a = p;
    BY_TYPE(a->t, layernorm_bwd_cols, a->dw, a->db, a->dout, a->inp, a->cmean, a->crstd, a->N,
            a->C, lo * COLS, MIN(hi * COLS, a->C));
}

void layernorm_fwd(void *out, float *mean, float *rstd, const void *inp, const void *w,
                   const void *b, int N, int C, float eps, rt_dtype t)
{
    layernorm_args a = { .out = out, .mean = mean, .rstd = rstd, .inp = inp, .w = w, .b = b,
                         .N = N, .C = C, .eps = eps, .t = storage(t) };
    rt_parallel_for(N, layernorm_fwd_task, &a);
}

/* add_layernorm_fwd / add_rmsnorm_fwd: a task's rows added, then normed while in cache */
typedef struct {
    void *res, *out;
    float *mean, *rstd;
    const void *a, *b, *w, *bias;
    int C, rms;
    float eps;
    rt_dtype t;
} add_norm_args;

static void add_norm_fwd_task(void *p, int lo, int hi)
{
    const add_norm_args *a = p;
    BY_TYPE(a->t, add_span, a->res, a->a, a->b, (size_t)lo * a->C, (size_t)hi * a->C);
    if (a->rms)
        BY_TYPE(a->t, rmsnorm_fwd_rows, a->out, a->rstd, a->res, a->w, a->C, a->eps, lo, hi);
    else
        BY_TYPE(a->t, layernorm_fwd_rows, a->out, a->mean, a->rstd, a->res, a->w, a->bias, a->C,
                a->eps, lo, hi);
}

void add_layernorm_fwd(void *res, void *out, float *mean, float *rstd, const void *a,
                       const void *b, const void *w, const void *bias, int N, int C, float eps,
                       rt_dtype t)
{
    add_norm_args x = { .res = res, .out = out, .mean = mean, .rstd = rstd, .a = a, .b = b,
                        .w = w, .bias = bias, .C = C, .eps = eps, .t = storage(t) };
    rt_parallel_for(N, add_norm_fwd_task, &x);
}

void add_rmsnorm_fwd(void *res, void *out, float *rstd, const void *a, const void *b,
                     const void *w, int N, int C, float eps, rt_dtype t)
{
    add_norm_args x = { .res = res, .out = out, .rstd = rstd, .a = a, .b = b, .w = w, .C = C,
                        .rms = 1, .eps = eps, .t = storage(t) };
    rt_parallel_for(N, add_norm_fwd_task, &x);
}

void layernorm_bwd(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                   const void *w, const float *mean, const float *rstd, int N, int C,
                   rt_dtype t)
{
    layernorm_args a = { .dinp = dinp, .dw = dw, .db = db, .dout = dout, .inp = inp, .w = w,
                         .cmean = mean, .crstd = rstd, .N = N, .C = C, .t = storage(t) };
    rt_parallel_for(N, layernorm_bwd_task, &a);
    rt_parallel_for(CEIL_DIV(C, COLS), layernorm_bwd_cols_task, &a);
}

/* -- GELU, bias, residual adds, conversions ---------------------------------------------------- */

typedef struct {
    void *out;
    float *grad;
    const void *a, *b;
    const float *fsrc;
    size_t n;
    int N, OC;
    float scale;          /* fill_f32's value */
    rt_dtype t, st;
} pointwise_args;

/* Element ranges: the pool gets blocks of ELEMS elements. */
#define ELEMS 4096
#define BLOCK_RANGE(a, lo, hi, i0, i1)                                            \
    size_t i0 = (size_t)(lo) * ELEMS, i1 = MIN((size_t)(hi) * ELEMS, (a)->n)

static void gelu_fwd_task(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    BY_TYPE(a->t, gelu_fwd_span, a->out, a->a, i0, i1);
}

static void gelu_bwd_task(void *p, int lo, int hi)      /* a: input, b: dout */
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    BY_TYPE(a->t, gelu_bwd_span, a->out, a->a, a->b, i0, i1);
}

static void add_task(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    BY_TYPE(a->t, add_span, a->out, a->a, a->b, i0, i1);
}

static void bias_fwd_task(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    BY_TYPE(a->t, bias_fwd_block, a->out, a->a, a->OC, lo, hi, 0, a->OC);
}

static void bias_bwd_task(void *p, int lo, int hi)      /* lo, hi: blocks of COLS */
{
    const pointwise_args *a = p;
    BY_TYPE(a->t, bias_bwd_cols, a->grad, a->a, a->N, a->OC, lo * COLS, MIN(hi * COLS, a->OC));
}

static void narrow_task(void *p, int lo, int hi)       /* f32 fsrc -> out in t */
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    BY_TYPE(a->t, narrow_span, a->out, a->fsrc, i0, i1);
}

static void widen_task(void *p, int lo, int hi)        /* a in st -> f32 out */
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    BY_TYPE(a->st, widen_span, a->out, a->a, i0, i1);
}

static int blocks(size_t n) { return (int)CEIL_DIV(n, (size_t)ELEMS); }

void gelu_fwd(void *out, const void *inp, size_t n, rt_dtype t)
{
    pointwise_args a = { .out = out, .a = inp, .n = n, .t = storage(t) };
    rt_parallel_for(blocks(n), gelu_fwd_task, &a);
}

void gelu_bwd(void *dinp, const void *inp, const void *dout, size_t n, rt_dtype t)
{
    pointwise_args a = { .out = dinp, .a = inp, .b = dout, .n = n, .t = storage(t) };
    rt_parallel_for(blocks(n), gelu_bwd_task, &a);
}

void bias_fwd(void *out, const void *bias, int N, int OC, rt_dtype t)
{
    pointwise_args a = { .out = out, .a = bias, .N = N, .OC = OC, .t = storage(t) };
    rt_parallel_for(N, bias_fwd_task, &a);
}

void bias_bwd(float *dbias, const void *dout, int N, int OC, rt_dtype t)
{
    pointwise_args a = { .grad = dbias, .a = dout, .N = N, .OC = OC, .t = storage(t) };
    rt_parallel_for(CEIL_DIV(OC, COLS), bias_bwd_task, &a);
}

void add_fwd(void *out, const void *a_, const void *b_, size_t n, rt_dtype t)
{
    pointwise_args a = { .out = out, .a = a_, .b = b_, .n = n, .t = storage(t) };
    rt_parallel_for(blocks(n), add_task, &a);
}

void add_inplace(void *y, const void *x, size_t n, rt_dtype t)
{
    pointwise_args a = { .out = y, .a = y, .b = x, .n = n, .t = storage(t) };
    rt_parallel_for(blocks(n), add_task, &a);
}

void convert(void *dst, rt_dtype dt, const void *src, rt_dtype st, size_t n)
{
    if (dt == st) {
        if (n && dst != src) memcpy(dst, src, n * rt_dtype_size(dt));
        return;
    }
    RT_CHECK((dt == RT_F32 && st == RT_BF16) || (dt == RT_BF16 && st == RT_F32),
             "convert: no conversion from dtype %d to %d", (int)st, (int)dt);
    pointwise_args a = { .out = dst, .a = src, .fsrc = src, .n = n, .t = dt, .st = st };
    rt_parallel_for(blocks(n), dt == RT_BF16 ? narrow_task : widen_task, &a);
}

/* -- Causal attention without the (T, T) matrix ------------------------------------------------ */
/*
** Per batch element b and head h the queries and keys are cut into nt = T/AT tiles of AT rows.
** Query tile qi and key tile kj give a tile of scores S = scale q k^T: computed when kj < qi,
** computed and masked (key > query) when kj = qi, never touched when kj > qi (entirely above
** the causal diagonal): nt (nt + 1) / 2 of the nt^2 tiles are computed (136 of 256 at T 1024),
** so the FLOPs below are those the causal product needs plus the masked half of the diagonal
** tiles.
**
** Forward, one task per (b, h, query tile): the query tile's q (times scale) and an output
** accumulator stay in f32 while the key tiles pass in order; for each, S, its row maxima,
** p = exp(S - running max), the running sum l and the output are rescaled (online softmax,
** kernel_rows.h), then out += p v. At the end out /= l and lse = max + log(l) per query row.
** Saved: out and lse (B, Hl, T); the caller keeps qkv. 4 T^2/2 hd FLOPs per (b, h). A task
** range widens each (b, h)'s k and v once (for the tiles it needs) and keeps them while its
** query tiles pass.
**
** Backward, one task per (b, h), so that each dk and dv row is summed by one task: dsum =
** rowsum(dout * out) first; then per query tile, per key tile up to the diagonal, p = exp(S -
** lse) is recomputed from q, k and the saved lse, dp = dout v^T, ds = p (dp - dsum), and
** dv += p^T dout, dk += ds^T q scale, dq += ds k scale. dq of a query tile is complete after its
** key tiles; dk and dv of a key tile after every query tile below it (summed in query-tile
** order). 10 T^2/2 hd FLOPs per (b, h). Recomputing S costs 2 T^2/2 hd of them and saves storing
** B Hl T^2 probabilities.
**
** The tiles are f32 (bf16 q, k, v, dout, out are widened as they are loaded; out, dq, dk, dv
** rounded once when stored). Every product is c += a b in register blocks of MR x NR (mm):
** each element summed over its reduction index in order with one fmaf per step, so the results
** do not depend on threads. AT = 64: the tiles of one step (q, the output or dq, scores, at
** hd 64 16 KB each) stay in L1/L2 with the head's widened k and v (8 T hd bytes, 512 KB at
** T 1024); 32- and 128-row tiles measured no faster at GPT-2 shapes. NR = 32 columns (two
** AVX-512 registers) by MR = 8 rows keeps 16 accumulators in registers: about 100 GFLOP/s on
** one Zen 4 core, as fast as OpenBLAS on these 64 x 64 x 64 products without a call per tile
** (bench/attention_bench.sh).
*/

#define AT 64          /* queries and keys per tile */
#define MR 8           /* rows of a register block (AT is a multiple) */
#define NR 32          /* columns of a register block; head channels are padded to a multiple */

/*
** c (M x N, rows of stride ldc) = a (M x K) b (K x N), plus c's old contents when add: a's
** element (m, k) is a[m*sam + k*sak] (either orientation), b's rows have stride ldb. M is a
** multiple of MR, N of NR.
*/
static void mm(int add, float *restrict c, int ldc, const float *restrict a, int sam, int sak,
               const float *restrict b, int ldb, int M, int N, int K)
{
    for (int m0 = 0; m0 < M; m0 += MR)
        for (int n0 = 0; n0 < N; n0 += NR) {
            float acc[MR][NR];
            float *cb = c + (size_t)m0 * ldc + n0;
            const float *ab = a + (size_t)m0 * sam;
            for (int r = 0; r < MR; r++)
                for (int n = 0; n < NR; n++) acc[r][n] = add ? cb[(size_t)r * ldc + n] : 0.0f;
            for (int k = 0; k < K; k++) {
                const float *bk = b + (size_t)k * ldb + n0;
                for (int r = 0; r < MR; r++) {
                    float ar = ab[(size_t)r * sam + (size_t)k * sak];
                    for (int n = 0; n < NR; n++) acc[r][n] = fmaf(ar, bk[n], acc[r][n]);
                }
            }
            for (int r = 0; r < MR; r++)
                for (int n = 0; n < NR; n++) cb[(size_t)r * ldc + n] = acc[r][n];
        }
}

typedef struct {
    void *out, *dqkv;               /* storage outputs (attention_fwd, attention_bwd) or NULL */
    float *acc, *dqf, *dkf, *dvf;   /* f32 outputs merged / added into (the block calls) */
    float *lse, *dsum;
    const void *q, *k, *v, *dout, *cout;
    const float *clse;
    size_t dk_at, dv_at;            /* attention_bwd: the columns of dk and dv in dqkv */
    float *hkv;                     /* backward, groups of grp > 1 query heads: each query
                                    ** head's own f32 dk then dv, Tk rows of hd, at bh*2*Tk*hd */
    int ldq, ldkv, lddkv, lse_ld;   /* row widths (elements) of q, of k and v, of dk and dv */
    int B, Tq, Tk, Hl, KVl, grp, hd, hdp, nt, nkt, causal, dsum_given;  /* grp = Hl / KVl */
    float scale;
    rt_dtype t;
} attention_args;

/* f32 scratch of n floats, 64-byte aligned (freed with free). */
static float *scratch(size_t n)
{
    size_t bytes = CEIL_DIV(n * sizeof(float), (size_t)64) * 64;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    RT_CHECK(p, "attention: out of memory (%zu bytes of scratch)", bytes);
    return p;
}

/* Query head h of batch element b (grouped-query: kv head h / grp): element offsets of its q,
** of its kv head's k and v, of its out / dout and of its kv head's dk and dv; the row strides
** ldq (q), ldk (k, v), ldo (out, dout), ldg (dk, dv). */
#define HEAD_ROWS(a, bh)                                                                    \
    int b_ = (bh) / (a)->Hl, h_ = (bh) % (a)->Hl, C_ = (a)->Hl * (a)->hd;                    \
    int kh_ = att_kv_head(h_, (a)->Hl, (a)->KVl);                                            \
    size_t ldq = (size_t)(a)->B * (a)->ldq, ldk = (size_t)(a)->B * (a)->ldkv;                \
    size_t ldo = (size_t)(a)->B * C_, ldg = (size_t)(a)->B * (a)->lddkv;                     \
    size_t q = (size_t)b_ * (a)->ldq + (size_t)h_ * (a)->hd;                                 \
    size_t kv = (size_t)b_ * (a)->ldkv + (size_t)kh_ * (a)->hd;                              \
    size_t o = (size_t)b_ * C_ + (size_t)h_ * (a)->hd;                                       \
    size_t g = (size_t)b_ * (a)->lddkv + (size_t)kh_ * (a)->hd

/* nr rows of hd channels of an f32 tile (rows of sld) times mul, added to f32 rows of ld. */
static void add_tile(float *dst, size_t ld, const float *src, int sld, int nr, int hd, float mul)
{
    for (int r = 0; r < nr; r++)
        for (int d = 0; d < hd; d++) dst[r * ld + d] += src[(size_t)r * sld + d] * mul;
}

/*
** The online softmax over one tile of scores st[c][i] (key c, query i; rows of AT): the new
** running maxima tm = max(tm, st) over the nk keys, masked on the diagonal tile (query i sees
** key c only when i >= c: both count from the same tile start there).
*/
static void tile_max(float *restrict tm, const float *restrict st, int nk, int diag)
{
    for (int c = 0; c < nk; c++) {
        const int cmask_fwd = diag ? c : 0;
        for (int i = 0; i < AT; i++) {
            float s = st[c * AT + i], t = tm[i];
            s = i < cmask_fwd ? -INFINITY : s;
            tm[i] = s > t ? s : t;
        }
    }
}

/* The output and sums so far rescaled to the new maxima tm, which become the maxima mx. */
static void tile_rescale(float *restrict on, int hdp, float *restrict mx, float *restrict l,
                         const float *restrict tm)
{
    for (int i = 0; i < AT; i++) {
        float alpha = att_rescale(mx[i], tm[i]);
        mx[i] = tm[i];
        l[i] *= alpha;
        for (int d = 0; d < hdp; d++) on[i * hdp + d] *= alpha;
    }
}

/* st := p = exp(st - mx) (0 where masked), and l += the keys' p in key order. */
static void tile_exp(float *restrict st, float *restrict l, const float *restrict mx, int nk,
                     int diag)
{
    for (int c = 0; c < nk; c++) {
        const int cmask_fwd = diag ? c : 0;
        for (int i = 0; i < AT; i++) {
            float p = vexpf(st[c * AT + i] - mx[i]);
            p = i < cmask_fwd ? 0.0f : p;
            st[c * AT + i] = p;
            l[i] += p;
        }
    }
}

/* The backward's tile: pt := p = exp(s - lse) (0 where masked), dst := ds = p (dp - dsum). */
static void tile_prob_ds(float *restrict pt, float *restrict dst, const float *restrict lse,
                         const float *restrict dsum, int diag)
{
    for (int c = 0; c < AT; c++) {
        const int cmask = diag ? c : 0;
        for (int i = 0; i < AT; i++) {
            float p = att_prob(pt[c * AT + i], lse[i]);
            p = i < cmask ? 0.0f : p;
            pt[c * AT + i] = p;
            dst[c * AT + i] = att_dscore(p, dst[c * AT + i], dsum[i]);
        }
    }
}

/* The finished query tile (output on, maxima mx, sums l; nq rows) of head bh: stored with its
** lse (attention_fwd), or merged into the running acc and lse (attention_fwd_block). */
static void fwd_tile_out(const attention_args *a, int bh, size_t o, size_t ldo, int q0, int nq,
                         float *on, const float *mx, const float *l)
{
    int hd = a->hd, hdp = a->hdp;
    float *lse = a->lse + (size_t)bh * a->lse_ld + q0;
    for (int i = 0; i < nq; i++) {
        float inv = 1.0f / l[i], li = att_lse(mx[i], l[i]);
        if (!a->acc) {
            lse[i] = li;
            for (int d = 0; d < hd; d++) on[i * hdp + d] *= inv;
            continue;
        }
        float L = att_merge_lse(lse[i], li), w0 = att_weight(lse[i], L);
        float w1 = att_weight(li, L) * inv, *acc = a->acc + o + (size_t)(q0 + i) * ldo;
        for (int d = 0; d < hd; d++) acc[d] = acc[d] * w0 + on[i * hdp + d] * w1;
        lse[i] = L;
    }
    if (!a->acc)
        BY_TYPE(a->t, att_store_tile, elem(a->out, o + (size_t)q0 * ldo, a->t), ldo, on, hdp,
                nq, hd, 1.0f);
}

/* Key tile kj into a query tile's online softmax: scores st, new maxima (tm, then mx), sums l,
** output on; diag: the tile on the causal diagonal (masked). */
static inline void fwd_key_tile(float *st, float *tm, float *mx, float *l, float *on,
                                const float *qt, const float *kall, const float *vall, int kj,
                                int Tk, int hd, int hdp, int diag)
{
    int k0 = kj * AT, nk = MIN(AT, Tk - k0);
    const float *kn = kall + (size_t)k0 * hdp, *vn = vall + (size_t)k0 * hdp;
    /* st[c][i] = score of key c, query i (q already scaled) */
    mm(0, st, AT, kn, hdp, 1, qt, AT, AT, AT, hd);
    memcpy(tm, mx, AT * sizeof(float));
    tile_max(tm, st, nk, diag);
    tile_rescale(on, hdp, mx, l, tm);
    tile_exp(st, l, mx, nk, diag);
    /* on[i][d] += sum_c p[c][i] v[c][d] */
    mm(1, on, hdp, st, 1, AT, vn, hdp, AT, hdp, nk);
}

static void attention_fwd_task(void *ctx, int lo, int hi)
{
    const attention_args *a = ctx;
    int Tk = a->Tk, hd = a->hd, hdp = a->hdp, nt = a->nt;
    size_t Tp = (size_t)a->nkt * AT, tile = (size_t)AT * hdp;
    float *buf = scratch(2 * Tp * hdp + 2 * tile + (size_t)AT * AT + 3 * AT);
    float *kall = buf, *vall = kall + Tp * hdp, *qt = vall + Tp * hdp, *on = qt + tile;
    float *st = on + tile, *mx = st + AT * AT, *l = mx + AT, *tm = l + AT;
    int cached = -1, loaded = 0;    /* the (b, kv head) whose k, v rows [0, loaded) are in kall,
                                    ** vall (the query heads of a group share them) */
    for (int task = lo; task < hi; task++) {
        /* causal: query tiles in the order 0, nt-1, 1, nt-2, ...: contiguous ranges of tasks get
        ** equal work although tile qi costs qi + 1 key tiles */
        int bh = task / nt, j = task % nt;
        int qi = !a->causal ? j : j % 2 ? nt - 1 - j / 2 : j / 2;
        HEAD_ROWS(a, bh);
        (void)g, (void)ldg;
        int q0 = qi * AT, nq = MIN(AT, a->Tq - q0), need = a->causal ? q0 + AT : (int)Tp;
        if (b_ * a->KVl + kh_ != cached) {
            cached = b_ * a->KVl + kh_;
            loaded = 0;
        }
        if (need > loaded) {        /* the keys and values up to this tile, widened once */
            size_t at = (size_t)loaded * ldk;
            BY_TYPE(a->t, att_load_tile, kall + (size_t)loaded * hdp, hdp, 0,
                    celem(a->k, kv + at, a->t), ldk, MIN(Tk, need) - loaded, need - loaded, hd,
                    hdp, 1.0f);
            BY_TYPE(a->t, att_load_tile, vall + (size_t)loaded * hdp, hdp, 0,
                    celem(a->v, kv + at, a->t), ldk, MIN(Tk, need) - loaded, need - loaded, hd,
                    hdp, 1.0f);
            loaded = need;
        }
        const void *qsrc = celem(a->q, q + (size_t)q0 * ldq, a->t);
        BY_TYPE(a->t, att_load_tile, qt, AT, 1, qsrc, ldq, nq, AT, hd, hd, a->scale);
        for (int i = 0; i < AT; i++) {
            mx[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(on, 0, tile * sizeof(float));
        /* the key tiles seen whole (below the diagonal, or all of a full block), then the
        ** diagonal tile of a causal block: two call sites, so that each is compiled for its
        ** mask (a mask decided per tile costs 7 % of the forward at T 1024) */
        int whole = a->causal ? qi : a->nkt;
        for (int kj = 0; kj < whole; kj++)
            fwd_key_tile(st, tm, mx, l, on, qt, kall, vall, kj, Tk, hd, hdp, 0);
        if (a->causal) fwd_key_tile(st, tm, mx, l, on, qt, kall, vall, qi, Tk, hd, hdp, 1);
        fwd_tile_out(a, bh, o, ldo, q0, nq, on, mx, l);
    }
    free(buf);
}

static void attention_dsum_task(void *ctx, int lo, int hi)
{
    const attention_args *a = ctx;
    for (int bh = lo; bh < hi; bh++) {
        HEAD_ROWS(a, bh);
        (void)q, (void)kv, (void)g, (void)ldq, (void)ldk, (void)ldg, (void)kh_;
        BY_TYPE(a->t, att_dsum_rows, a->dsum + (size_t)bh * a->lse_ld,
                celem(a->dout, o, a->t), celem(a->cout, o, a->t), ldo, a->hd, 0, a->Tq);
    }
}

/* A backward task's f32 scratch: its kv head's k, v (rows of hdp, Tp of them) and the dk, dv
** summed there; one query tile's q (transposed, then rows), dout (the same), dq; a tile of
** probabilities and one of score gradients; the tile's lse and dsum rows. */
typedef struct {
    float *kall, *vall, *dkall, *dvall, *qt, *qn, *dot, *don, *dq, *pt, *dst, *lse, *dsum;
} bwd_scratch;

/* Query head bh's share of its kv head's dk and dv (added to w->dkall, w->dvall; its k and v
** in w->kall, w->vall), and its dq, stored or added. */
static void bwd_head(const attention_args *a, int bh, const bwd_scratch *w)
{
    int Tq = a->Tq, hd = a->hd, hdp = a->hdp, nt = a->nt;
    size_t tile = (size_t)AT * hdp;
    float *qt = w->qt, *qn = w->qn, *dot = w->dot, *don = w->don, *dq = w->dq, *pt = w->pt;
    float *dst = w->dst, *lse = w->lse, *dsum = w->dsum;
    HEAD_ROWS(a, bh);
    (void)kv, (void)g, (void)ldk, (void)ldg, (void)kh_, (void)h_;
    if (!a->dsum_given) attention_dsum_task((void *)a, bh, bh + 1);
    const float *lse_bh = a->clse + (size_t)bh * a->lse_ld;
    const float *dsum_bh = a->dsum + (size_t)bh * a->lse_ld;
    for (int qi = 0; qi < nt; qi++) {
        int q0 = qi * AT, nq = MIN(AT, Tq - q0);
        const void *qsrc = celem(a->q, q + (size_t)q0 * ldq, a->t);
        const void *dsrc = celem(a->dout, o + (size_t)q0 * ldo, a->t);
        BY_TYPE(a->t, att_load_tile, qt, AT, 1, qsrc, ldq, nq, AT, hd, hd, a->scale);
        BY_TYPE(a->t, att_load_tile, qn, hdp, 0, qsrc, ldq, nq, AT, hd, hdp, a->scale);
        BY_TYPE(a->t, att_load_tile, dot, AT, 1, dsrc, ldo, nq, AT, hd, hd, 1.0f);
        BY_TYPE(a->t, att_load_tile, don, hdp, 0, dsrc, ldo, nq, AT, hd, hdp, 1.0f);
        for (int i = 0; i < AT; i++) {     /* padding rows: finite, and never summed */
            lse[i] = i < nq ? lse_bh[q0 + i] : 0.0f;
            dsum[i] = i < nq ? dsum_bh[q0 + i] : 0.0f;
        }
        memset(dq, 0, tile * sizeof(float));
        int last = a->causal ? qi : a->nkt - 1;
        for (int kj = 0; kj <= last; kj++) {    /* key tiles up to the diagonal (causal) */
            int k0 = kj * AT, nk = MIN(AT, a->Tk - k0);
            const float *kn = w->kall + (size_t)k0 * hdp, *vn = w->vall + (size_t)k0 * hdp;
            /* pt[c][i] = p of key c, query i, recomputed; dst = ds */
            mm(0, pt, AT, kn, hdp, 1, qt, AT, AT, AT, hd);
            mm(0, dst, AT, vn, hdp, 1, dot, AT, AT, AT, hd);
            tile_prob_ds(pt, dst, lse, dsum, a->causal && kj == qi);
            /* this query tile's share of key tile kj: dv += p^T dout, dk += ds^T q */
            mm(1, w->dvall + (size_t)k0 * hdp, hdp, pt, AT, 1, don, hdp, AT, hdp, nq);
            mm(1, w->dkall + (size_t)k0 * hdp, hdp, dst, AT, 1, qn, hdp, AT, hdp, nq);
            /* dq += ds k */
            mm(1, dq, hdp, dst, 1, AT, kn, hdp, AT, hdp, nk);
        }
        if (a->dqf)
            add_tile(a->dqf + o + (size_t)q0 * ldo, ldo, dq, hdp, nq, hd, a->scale);
        else
            BY_TYPE(a->t, att_store_tile, elem(a->dqkv, q + (size_t)q0 * ldq, a->t), ldq, dq,
                    hdp, nq, hd, a->scale);
    }
}

/* Tasks: (b, query head) (grouped-query: into a->hkv, its own rows) or, a group of one, (b, head)
** straight to the outputs. Each task loads its kv head's k and v (once for consecutive heads of
** a group), sums its dk and dv over its query tiles in a fixed order and stores them: the
** results do not depend on the threads. */
static void attention_bwd_task(void *ctx, int lo, int hi)
{
    const attention_args *a = ctx;
    int Tk = a->Tk, hd = a->hd, hdp = a->hdp, loaded = -1;
    size_t Tp = (size_t)a->nkt * AT, tile = (size_t)AT * hdp;
    float *buf = scratch(4 * Tp * hdp + 5 * tile + 2 * (size_t)AT * AT + 2 * AT);
    float *kall = buf, *vall = kall + Tp * hdp, *dkall = vall + Tp * hdp;
    float *dvall = dkall + Tp * hdp, *qt = dvall + Tp * hdp, *dot = qt + tile;
    float *qn = dot + tile, *don = qn + tile, *dq = don + tile, *pt = dq + tile;
    float *dst = pt + AT * AT, *lse = dst + AT * AT, *dsum = lse + AT;
    bwd_scratch w = { kall, vall, dkall, dvall, qt, qn, dot, don, dq, pt, dst, lse, dsum };
    for (int bh = lo; bh < hi; bh++) {
        HEAD_ROWS(a, bh);
        (void)q, (void)o, (void)ldq, (void)ldo, (void)h_;
        if (b_ * a->KVl + kh_ != loaded) {      /* this kv head's k and v, widened once */
            loaded = b_ * a->KVl + kh_;
            BY_TYPE(a->t, att_load_tile, kall, hdp, 0, celem(a->k, kv, a->t), ldk, Tk, (int)Tp,
                    hd, hdp, 1.0f);
            BY_TYPE(a->t, att_load_tile, vall, hdp, 0, celem(a->v, kv, a->t), ldk, Tk, (int)Tp,
                    hd, hdp, 1.0f);
        }
        memset(dkall, 0, 2 * Tp * hdp * sizeof(float));      /* dkall and dvall */
        bwd_head(a, bh, &w);
        if (a->hkv) {
            float *own = a->hkv + (size_t)bh * 2 * Tk * hd;
            for (int r = 0; r < Tk; r++) {
                memcpy(own + (size_t)r * hd, dkall + (size_t)r * hdp, hd * sizeof(float));
                memcpy(own + ((size_t)Tk + r) * hd, dvall + (size_t)r * hdp, hd * sizeof(float));
            }
        } else if (a->dkf) {
            add_tile(a->dkf + g, ldg, dkall, hdp, Tk, hd, 1.0f);
            add_tile(a->dvf + g, ldg, dvall, hdp, Tk, hd, 1.0f);
        } else {
            BY_TYPE(a->t, att_store_tile, elem(a->dqkv, a->dk_at + kv, a->t), ldk, dkall, hdp,
                    Tk, hd, 1.0f);
            BY_TYPE(a->t, att_store_tile, elem(a->dqkv, a->dv_at + kv, a->t), ldk, dvall, hdp,
                    Tk, hd, 1.0f);
        }
    }
    free(buf);
}

/* Tasks: (b, kv head) of a grouped-query backward: its dk and dv = the sums of its query heads'
** (a->hkv) in increasing h, in f32, then stored or added once. */
static void attention_kv_sum_task(void *ctx, int lo, int hi)
{
    const attention_args *a = ctx;
    int Tk = a->Tk, hd = a->hd;
    size_t n = 2 * (size_t)Tk * hd;                     /* dk then dv, rows of hd */
    float *sum = scratch(n);
    for (int task = lo; task < hi; task++) {
        int bh0 = task / a->KVl * a->Hl + task % a->KVl * a->grp;  /* the group's first head */
        HEAD_ROWS(a, bh0);
        (void)q, (void)o, (void)ldq, (void)ldo, (void)h_, (void)kh_;
        memcpy(sum, a->hkv + (size_t)bh0 * n, n * sizeof(float));
        for (int j = 1; j < a->grp; j++) {
            const float *own = a->hkv + (size_t)(bh0 + j) * n;
            for (size_t i = 0; i < n; i++) sum[i] += own[i];
        }
        const float *dk = sum, *dv = sum + (size_t)Tk * hd;
        if (a->dkf) {
            add_tile(a->dkf + g, ldg, dk, hd, Tk, hd, 1.0f);
            add_tile(a->dvf + g, ldg, dv, hd, Tk, hd, 1.0f);
        } else {
            BY_TYPE(a->t, att_store_tile, elem(a->dqkv, a->dk_at + kv, a->t), ldk, dk, hd, Tk,
                    hd, 1.0f);
            BY_TYPE(a->t, att_store_tile, elem(a->dqkv, a->dv_at + kv, a->t), ldk, dv, hd, Tk,
                    hd, 1.0f);
        }
    }
    free(sum);
}

/* The backward of a call: one task per query head; grouped-query heads through a->hkv, then
** one task per kv head sums them (multi-head attention writes its dk and dv directly). */
static void attention_bwd_run(attention_args *a)
{
    if (a->grp == 1) {
        rt_parallel_for(a->B * a->Hl, attention_bwd_task, a);
        return;
    }
    a->hkv = scratch((size_t)a->B * a->Hl * 2 * a->Tk * a->hd);
    rt_parallel_for(a->B * a->Hl, attention_bwd_task, a);
    rt_parallel_for(a->B * a->KVl, attention_kv_sum_task, a);
    free(a->hkv);
    a->hkv = NULL;
}

/* The arguments every attention call shares: the shapes and the q, k, v operands. */
static attention_args att_args(const void *q, int ldq, const void *k, const void *v, int ldkv,
                               int B, int Tq, int Tk, int Hl, int KVl, int hd, int causal,
                               float scale, rt_dtype t)
{
    RT_CHECK(KVl > 0 && Hl % KVl == 0, "attention: %d query heads in groups of %d kv heads",
             Hl, KVl);
    return (attention_args){ .q = q, .k = k, .v = v, .ldq = ldq, .ldkv = ldkv, .B = B,
                             .Tq = Tq, .Tk = Tk, .Hl = Hl, .KVl = KVl, .grp = Hl / KVl,
                             .hd = hd, .hdp = CEIL_DIV(hd, NR) * NR, .nt = CEIL_DIV(Tq, AT),
                             .nkt = CEIL_DIV(Tk, AT), .causal = causal, .scale = scale,
                             .t = storage(t) };
}

/* The causal attention of whole sequences: q, k, v are the parts of the qkv rows. */
static attention_args att_qkv(const void *qkv, int B, int T, int Hl, int KVl, int hd,
                              float scale, rt_dtype t)
{
    size_t Q = (size_t)Hl * hd, K = (size_t)KVl * hd;
    int w = (int)(Q + 2 * K);
    attention_args a = att_args(qkv, w, celem(qkv, Q, t), celem(qkv, Q + K, t), w, B, T, T, Hl,
                                KVl, hd, 1, scale, t);
    a.dk_at = Q;
    a.dv_at = Q + K;
    a.lse_ld = T;
    return a;
}

/* kernels.h: the probabilities and score gradients stay f32 here */
const int attention_bf16_products = 0;

void attention_fwd(void *out, float *lse, const void *qkv, int B, int T, int Hl, int KVl,
                   int hd, float scale, rt_dtype t)
{
    attention_args a = att_qkv(qkv, B, T, Hl, KVl, hd, scale, t);
    a.out = out;
    a.lse = lse;
    rt_parallel_for(B * Hl * a.nt, attention_fwd_task, &a);
}

void attention_bwd(void *dqkv, float *dsum, const void *dout, const void *out, const float *lse,
                   const void *qkv, int B, int T, int Hl, int KVl, int hd, float scale,
                   rt_dtype t)
{
    attention_args a = att_qkv(qkv, B, T, Hl, KVl, hd, scale, t);
    a.dqkv = dqkv;
    a.dsum = dsum;
    a.dout = dout;
    a.cout = out;
    a.clse = lse;
    attention_bwd_run(&a);
}

void attention_fwd_block(float *acc, float *lse, int lse_ld, const void *q, int ldq,
                         const void *k, const void *v, int ldkv, int B, int Tq, int Tk, int Hl,
                         int KVl, int hd, int causal, float scale, rt_dtype t)
{
    RT_CHECK(!causal || Tq == Tk, "attention_fwd_block: a causal block needs Tq (%d) == Tk (%d)",
             Tq, Tk);
    attention_args a = att_args(q, ldq, k, v, ldkv, B, Tq, Tk, Hl, KVl, hd, causal, scale, t);
    a.acc = acc;
    a.lse = lse;
    a.lse_ld = lse_ld;
    rt_parallel_for(B * Hl * a.nt, attention_fwd_task, &a);
}

void attention_dsum(float *dsum, const void *dout, const void *out, int B, int T, int Hl, int hd,
                    rt_dtype t)
{
    attention_args a = att_args(NULL, 0, NULL, NULL, 0, B, T, T, Hl, Hl, hd, 1, 1.0f, t);
    a.dsum = dsum;
    a.dout = dout;
    a.cout = out;
    a.lse_ld = T;
    rt_parallel_for(B * Hl, attention_dsum_task, &a);
}

void attention_bwd_block(float *dq, float *dk, float *dv, int lddkv, const void *dout,
                         const float *lse, const float *dsum, int lse_ld, const void *q,
                         int ldq, const void *k, const void *v, int ldkv, int B, int Tq, int Tk,
                         int Hl, int KVl, int hd, int causal, float scale, rt_dtype t)
{
    RT_CHECK(!causal || Tq == Tk, "attention_bwd_block: a causal block needs Tq (%d) == Tk (%d)",
             Tq, Tk);
    attention_args a = att_args(q, ldq, k, v, ldkv, B, Tq, Tk, Hl, KVl, hd, causal, scale, t);
    a.dqf = dq;
    a.dkf = dk;
    a.dvf = dv;
    a.lddkv = lddkv;
    a.dout = dout;
    a.clse = lse;
    a.dsum = (float *)dsum;
    a.dsum_given = 1;
    a.lse_ld = lse_ld;
    attention_bwd_run(&a);
}

static void fill_task(void *p, int lo, int hi)
{
    const pointwise_args *a = p;
    BLOCK_RANGE(a, lo, hi, i0, i1);
    for (size_t i = i0; i < i1; i++) a->grad[i] = a->scale;
}

void fill_f32(float *x, size_t n, float v)
{
    pointwise_args a = { .grad = x, .n = n, .scale = v };
    rt_parallel_for(blocks(n), fill_task, &a);
}

typedef struct {
    void *dst;
    const void *src;
    rt_dtype dt, st;
    size_t ldd, lds;
    int cols;
} cols_args;

static void copy_cols_task(void *p, int lo, int hi)
{
    const cols_args *a = p;
    for (int r = lo; r < hi; r++) {
        void *d = elem(a->dst, (size_t)r * a->ldd, a->dt);
        const void *s = celem(a->src, (size_t)r * a->lds, a->st);
        if (a->dt == a->st) memcpy(d, s, (size_t)a->cols * rt_dtype_size(a->dt));
        else if (a->dt == RT_BF16) narrow_span_bf16(d, s, 0, (size_t)a->cols);
        else widen_span_bf16(d, s, 0, (size_t)a->cols);
    }
}

void copy_cols(void *dst, rt_dtype dt, size_t ldd, const void *src, rt_dtype st, size_t lds,
               int rows, int cols)
{
    cols_args a = { .dst = dst, .src = src, .dt = storage(dt), .st = storage(st), .ldd = ldd,
                    .lds = lds, .cols = cols };
    rt_parallel_for(rows, copy_cols_task, &a);
}

/* -- Llama layer: RMSNorm, rotary embedding, SwiGLU ------------------------------------------- */
/*
** Row tasks (RMSNorm's statistics and input gradient, SwiGLU),
** column blocks for RMSNorm's weight gradient (rows summed in order), position tasks for the
** rotary embedding (each computes its positions' angles): no element is computed by two tasks.
*/

typedef struct {
    void *out;
    float *rstd, *dw;
    const void *inp, *w, *dout;
    const float *crstd;
    size_t ld;
    int N, C, B, H, hd, pos0, inverse;
    float eps, theta;
    rt_dtype t;
} llama_args;

static void rmsnorm_fwd_task(void *p, int lo, int hi)
{
    const llama_args *a = p;
    BY_TYPE(a->t, rmsnorm_fwd_rows, a->out, a->rstd, a->inp, a->w, a->C, a->eps, lo, hi);
}

static void rmsnorm_bwd_task(void *p, int lo, int hi)
{
    const llama_args *a = p;
    BY_TYPE(a->t, rmsnorm_bwd_rows, a->out, a->dout, a->inp, a->w, a->crstd, a->C, lo, hi);
}

static void rmsnorm_bwd_cols_task(void *p, int lo, int hi)     /* lo, hi: blocks of COLS */
{
    const llama_args *a = p;
    BY_TYPE(a->t, rmsnorm_bwd_cols, a->dw, a->dout, a->inp, a->crstd, a->N, a->C, lo * COLS,
            MIN(hi * COLS, a->C));
}

static void rope_task(void *p, int lo, int hi)                 /* lo, hi: positions */
{
    const llama_args *a = p;
    BY_TYPE(a->t, rope_rows, a->out, a->ld, a->B, a->H, a->hd, a->pos0, a->theta, a->inverse,
            lo, hi);
}

static void swiglu_fwd_task(void *p, int lo, int hi)           /* inp: gu */
{
    const llama_args *a = p;
    BY_TYPE(a->t, swiglu_fwd_block, a->out, a->inp, a->C, lo, hi, 0, a->C);
}

static void swiglu_bwd_task(void *p, int lo, int hi)
{
    const llama_args *a = p;
    BY_TYPE(a->t, swiglu_bwd_block, a->out, a->dout, a->inp, a->C, lo, hi, 0, a->C);
}

void rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                 float eps, rt_dtype t)
{
    llama_args a = { .out = out, .rstd = rstd, .inp = inp, .w = w, .N = N, .C = C, .eps = eps,
                     .t = storage(t) };
    rt_parallel_for(N, rmsnorm_fwd_task, &a);
}

void rmsnorm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                 const float *rstd, int N, int C, rt_dtype t)
{
    llama_args a = { .out = dinp, .dw = dw, .dout = dout, .inp = inp, .w = w, .crstd = rstd,
                     .N = N, .C = C, .t = storage(t) };
    rt_parallel_for(N, rmsnorm_bwd_task, &a);
    rt_parallel_for(CEIL_DIV(C, COLS), rmsnorm_bwd_cols_task, &a);
}

void rope_fwd(void *x, size_t ld, int T, int B, int H, int hd, int pos0, float theta,
              int inverse, rt_dtype t)
{
    RT_CHECK(hd % 2 == 0, "rope_fwd: the head size (%d) must be even", hd);
    llama_args a = { .out = x, .ld = ld, .B = B, .H = H, .hd = hd, .pos0 = pos0,
                     .inverse = inverse, .theta = theta, .t = storage(t) };
    rt_parallel_for(T, rope_task, &a);
}

void swiglu_fwd(void *out, const void *gu, int N, int F, rt_dtype t)
{
    llama_args a = { .out = out, .inp = gu, .N = N, .C = F, .t = storage(t) };
    rt_parallel_for(N, swiglu_fwd_task, &a);
}

void swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F, rt_dtype t)
{
    llama_args a = { .out = dgu, .dout = dout, .inp = gu, .N = N, .C = F, .t = storage(t) };
    rt_parallel_for(N, swiglu_bwd_task, &a);
}

/* -- Vocabulary-parallel cross-entropy (docs/megatron.md §4.5) --------------------------------- */

typedef struct {
    void *dlogits;                           /* written in place */
    float *mx_out, *sums_out;                /* written */
    const void *logits;
    const float *mx, *sums;                  /* read */
    const int *targets;
    int N, Vl, valid, vstart;
    float dloss;
    rt_dtype t;
} ce_args;

static void ce_rowmax_task(void *p, int lo, int hi)
{
    const ce_args *a = p;
    BY_TYPE(a->t, ce_max_rows, a->mx_out, a->logits, a->Vl, a->valid, lo, hi);
}

static void ce_sums_task(void *p, int lo, int hi)
{
    const ce_args *a = p;
    BY_TYPE(a->t, ce_sums_rows, a->sums_out, a->logits, a->mx, a->targets, a->N, a->Vl,
            a->valid, a->vstart, lo, hi);
}

static void ce_bwd_task(void *p, int lo, int hi)
{
    const ce_args *a = p;
    BY_TYPE(a->t, ce_bwd_rows, a->dlogits, a->mx, a->sums, a->targets, a->Vl, a->valid,
            a->vstart, a->dloss, lo, hi);
}

void ce_rowmax(float *mx, const void *logits, int N, int Vl, int valid, rt_dtype t)
{
    ce_args a = { .logits = logits, .mx_out = mx, .N = N, .Vl = Vl, .valid = valid,
                  .t = storage(t) };
    rt_parallel_for(N, ce_rowmax_task, &a);
}

void ce_sums(float *sums, const void *logits, const float *mx, const int *targets, int N,
             int Vl, int valid, int vstart, rt_dtype t)
{
    ce_args a = { .logits = logits, .mx = mx, .sums_out = sums, .targets = targets, .N = N,
                  .Vl = Vl, .valid = valid, .vstart = vstart, .t = storage(t) };
    rt_parallel_for(N, ce_sums_task, &a);
}

void ce_loss(float *loss, const float *sums, const float *mx, int N)
{
    for (int n = 0; n < N; n++) loss[n] = logf(sums[n]) + mx[n] - sums[N + n];
}

void ce_bwd(void *logits, const float *mx, const float *sums, const int *targets, int N,
            int Vl, int valid, int vstart, float dloss, rt_dtype t)
{
    ce_args a = { .dlogits = logits, .mx = mx, .sums = sums, .targets = targets, .N = N,
                  .Vl = Vl, .valid = valid, .vstart = vstart, .dloss = dloss, .t = storage(t) };
    rt_parallel_for(N, ce_bwd_task, &a);
}

void ce_fused(float *loss, float *mx, float *sums, void *logits, const int *targets, int N,
              int Vl, int valid, int vstart, float dloss, rt_dtype t)
{
    ce_rowmax(mx, logits, N, Vl, valid, t);
    ce_sums(sums, logits, mx, targets, N, Vl, valid, vstart, t);
    ce_loss(loss, sums, mx, N);
    ce_bwd(logits, mx, sums, targets, N, Vl, valid, vstart, dloss, t);
}

void sum_rows(float *out, const float *x, int N)
{
    float s = 0.0f;
    for (int n = 0; n < N; n++) s += x[n];
    out[0] = s;
}

/* -- AdamW (torch.optim.AdamW), gradient-norm pieces, scaling ---------------------------------- */

typedef struct {
    float *p, *m, *v;
    const float *g;
    void *copy;
    size_t n;
    float lr, beta1, beta2, eps, wd, step_size, bc2_sqrt, gscale;
    rt_dtype t;
} adamw_args;

#define ADAM_ELEMS 16384   /* elements per task */

static void adamw_task(void *ctx, int lo, int hi)
{
    const adamw_args *a = ctx;
    size_t i0 = (size_t)lo * ADAM_ELEMS, i1 = MIN((size_t)hi * ADAM_ELEMS, a->n);
    BY_TYPE(a->t, adamw_span, a->p, a->g, a->m, a->v, a->copy, a->lr, a->beta1, a->beta2,
            a->eps, a->wd, a->step_size, a->bc2_sqrt, a->gscale, i0, i1);
}

void adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, float bc1, float bc2, float gscale, void *copy,
                rt_dtype t)
{
    adamw_args a = { p, m, v, g, copy, n, lr, beta1, beta2, eps, wd, lr / bc1, sqrtf(bc2),
                     gscale, copy ? storage(t) : RT_F32 };
    rt_parallel_for((int)CEIL_DIV(n, (size_t)ADAM_ELEMS), adamw_task, &a);
}

void adamw_multi(const adamw_tensor *ts, int count, float lr, float beta1, float beta2, float eps,
                 float bc1, float bc2, float gscale, rt_dtype t)
{
    for (int k = 0; k < count; k++)
        adamw_step(ts[k].p, ts[k].g, ts[k].m, ts[k].v, ts[k].n, lr, beta1, beta2, eps, ts[k].wd,
                   bc1, bc2, gscale, ts[k].copy, t);
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

void sumsq_multi(float *out, const float *const *x, const size_t *n, int count)
{
    for (int k = 0; k < count; k++) sumsq(out + k, x[k], n[k]);
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
** Routing runs in f32 (kernel_rows.h route_row); its backward writes the logits' gradient in
** the storage type. The row movements between token and expert order are gathers (no
** scatter, no atomics): deterministic.
*/

typedef struct {
    void *out;
    float *fout, *fout2;
    int *sel;
    const void *src, *a, *b;
    const float *flog, *fa, *fb, *s, *auxg, *zg;
    const float *ebias;
    const int *idx, *isel;
    int N, E, k, C, pre, nblocks, period, sigmoid, groups, group_topk;
    float *ssum;
    float scale;
    size_t n;
    rt_dtype t;
} moe_args;

static void moe_route_task(void *p, int lo, int hi)
{
    const moe_args *a = p;   /* fout: prob, fout2: scores */
    for (int n = lo; n < hi; n++)
        route_row(a->sel + (size_t)n * a->k, a->fout + (size_t)n * a->k,
                  a->fout2 + (size_t)n * a->E, a->ssum ? a->ssum + n : NULL,
                  a->flog + (size_t)n * a->E, a->E, a->k, a->pre, a->scale, a->sigmoid,
                  a->groups, a->group_topk, a->ebias);
}

static void moe_route_bwd_task(void *p, int lo, int hi)
{
    const moe_args *a = p;   /* fa: dprob, fb: prob, s: scores */
    BY_TYPE(a->t, route_bwd_rows, a->out, a->fa, a->fb, a->s, a->ssum, a->isel, a->auxg,
            a->period, a->zg, a->E, a->k, a->pre, a->scale, lo, hi);
}

static void gather_rows_task(void *p, int lo, int hi)
{
    const moe_args *a = p;
    size_t row = (size_t)a->C * rt_dtype_size(a->t);
    for (int i = lo; i < hi; i++) {
        void *o = elem(a->out, (size_t)i * a->C, a->t);
        if (a->idx[i] < 0) memset(o, 0, row);
        else memcpy(o, celem(a->src, (size_t)a->idx[i] * a->C, a->t), row);
    }
}

static void combine_rows_task(void *p, int lo, int hi)
{
    const moe_args *a = p;
    BY_TYPE(a->t, combine_out_rows, a->out, a->src, a->idx, a->k, a->C, lo, hi);
}

static void row_scale_task(void *p, int lo, int hi)
{
    const moe_args *a = p;
    BY_TYPE(a->t, row_scale_block, a->out, a->s, a->C, lo, hi, 0, a->C);
}

static void row_dot_task(void *p, int lo, int hi)
{
    const moe_args *a = p;
    BY_TYPE(a->t, row_dot_rows, a->fout, a->a, a->b, a->C, lo, hi);
}

static void add_scaled_bias_task(void *p, int lo, int hi)
{
    const moe_args *a = p;
    BY_TYPE(a->t, add_scaled_bias_block, a->out, a->s, a->b, a->C, lo, hi, 0, a->C);
}

static void sum_blocks_task(void *p, int lo, int hi)   /* lo, hi: blocks of COLS elements */
{
    const moe_args *a = p;
    BY_TYPE(a->t, sum_blocks_span, a->out, a->src, a->nblocks, a->n, (size_t)lo * COLS,
            MIN((size_t)hi * COLS, a->n));
}

void moe_route(int *sel, float *prob, float *scores, float *ssum, const float *logits, int N,
               int E, int k, int pre, float scale, int groups, int group_topk,
               const float *ebias)
{
    moe_args a = { .fout = prob, .fout2 = scores, .ssum = ssum, .sel = sel, .flog = logits,
                   .ebias = ebias,
                   .N = N, .E = E, .k = k, .pre = pre, .scale = scale, .sigmoid = ssum != NULL,
                   .groups = groups, .group_topk = group_topk };
    rt_parallel_for(N, moe_route_task, &a);
}

void moe_route_bwd(void *dlogits, const float *dprob, const float *prob, const float *scores,
                   const float *ssum, const int *sel, const float *auxg, int aux_period,
                   const float *zg, int N, int E, int k, int pre, float scale, rt_dtype t)
{
    moe_args a = { .out = dlogits, .fa = dprob, .fb = prob, .s = scores,
                   .ssum = (float *)ssum, .isel = sel,
                   .auxg = auxg, .period = aux_period, .zg = zg, .N = N, .E = E, .k = k,
                   .pre = pre, .scale = scale, .t = storage(t) };
    rt_parallel_for(N, moe_route_bwd_task, &a);
}

void gather_rows(void *out, const void *src, const int *idx, int n, int C, rt_dtype t)
{
    moe_args a = { .out = out, .src = src, .idx = idx, .C = C, .t = storage(t) };
    rt_parallel_for(n, gather_rows_task, &a);
}

void combine_rows(void *out, const void *src, const int *pos, int N, int k, int C, rt_dtype t)
{
    moe_args a = { .out = out, .src = src, .idx = pos, .N = N, .k = k, .C = C, .t = storage(t) };
    rt_parallel_for(N, combine_rows_task, &a);
}

void row_scale(void *y, const float *s, int n, int C, rt_dtype t)
{
    moe_args a = { .out = y, .s = s, .C = C, .t = storage(t) };
    rt_parallel_for(n, row_scale_task, &a);
}

void row_dot(float *out, const void *x, const void *y, int n, int C, rt_dtype t)
{
    moe_args a = { .fout = out, .a = x, .b = y, .C = C, .t = storage(t) };
    rt_parallel_for(n, row_dot_task, &a);
}

void add_scaled_bias(void *y, const float *s, const void *b, int n, int C, rt_dtype t)
{
    moe_args a = { .out = y, .s = s, .b = b, .C = C, .t = storage(t) };
    rt_parallel_for(n, add_scaled_bias_task, &a);
}

/* db[c] += sum_i s[i] dy[i, c], rows in order: one pass, deterministic. */
void scaled_bias_bwd(float *db, const float *s, const void *dy, int n, int C, rt_dtype t)
{
    BY_TYPE(storage(t), scaled_bias_bwd_cols, db, s, dy, n, C, 0, C);
}

void sum_blocks(void *out, const void *in, int nblocks, size_t n, rt_dtype t)
{
    moe_args a = { .out = out, .src = in, .nblocks = nblocks, .n = n, .t = storage(t) };
    rt_parallel_for((int)CEIL_DIV(n, (size_t)COLS), sum_blocks_task, &a);
}
