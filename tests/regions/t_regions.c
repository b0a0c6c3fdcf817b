/*
** t_regions.c: each tensor-parallel region of the library's model code (lib/model.c), forward
** and backward, against the unsplit computation of the double-precision reference
** (build/ref/libref.a), as one checks a ColumnParallelLinear by hand. Not a training test: the
** model is never trained; every rank builds the same global tensors, takes its shards, runs
** the library's code and compares its shard of each result with the unsplit one.
** Compiled by tests/regions/regions.mk against one output directory (a TP > 1, DP 1, PP 1
** layout): this file #includes lib/model.c, so its static regions (gather_seq, reduce_seq,
** matmul_fwd/bwd) are the code under test, and links that layout's tables (program.c and its
** stage) and the library for the rest (groups, the stage's buffers as the plan sizes them).
** Run: mpirun -np TP t_regions TAG; rank 0 prints "PASS regions/TAG/<test>" or "FAIL ...".
*/
#include "model.h"   // defines: the layout's CFG_ constants, gpt_program_desc
#include "model.c"   // defines: gather_seq, reduce_seq, matmul_fwd, matmul_bwd, layer_fwd, ...

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_ref.h"   // defines: ref_linear_fwd, ref_embed_fwd, ref_xent_fwd, ...

/* -- Sizes of this layout ------------------------------------------------------------------- */

enum {
    N = CFG_N, NSP = CFG_N_SP, C = CFG_C, B = CFG_B, T = CFG_T, TP = CFG_TP,
    FF = CFG_FF, FFL = CFG_FF_LOCAL, CL = CFG_C_LOCAL, V = CFG_V, VL = CFG_V_LOCAL,
    H = CFG_HEADS,
};
#define SP (NSP < N)        /* sequence parallel: each rank holds rows [r0, r0 + NSP) */
static int r0;              /* first sequence-major row of this rank's slab (0 without SP) */
static const char *tag;

/* Relative tolerance: |got - want| <= TOL * (max |want| of the tensor + |want|). f32 results
** of sums over at most a few hundred terms carry ~1e-6 of the tensor's scale. */
#define TOL 1e-5

/* -- Data: the same global tensors on every rank ---------------------------------------------- */

static uint64_t rng_state;

static double uniform(void)   /* xorshift64*, in [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 4503599627370496.0 - 1.0;
}

/* n values uniform in [mean - scale, mean + scale), from 'seed' alone. */
static double *rnd(size_t n, uint64_t seed, double mean, double scale)
{
    double *x = ref_xcalloc(n, sizeof(double));
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) x[i] = mean + scale * uniform();
    return x;
}

static double *zeros(size_t n) { return ref_xcalloc(n, sizeof(double)); }

/* The (nr, nc) block at (rr, cc) of a row-major matrix with 'ld' columns, as a new array. */
static double *block(const double *src, int ld, int rr, int cc, int nr, int nc)
{
    double *out = ref_xcalloc((size_t)nr * nc, sizeof(double));
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) out[(size_t)i * nc + j] = src[(size_t)(rr + i) * ld + cc + j];
    return out;
}

/* Device (f32) copy of n doubles. */
static float *dev(const double *src, size_t n)
{
    float *h = malloc(n * sizeof(float)), *d = rt_malloc(n * sizeof(float));
    RT_CHECK(h, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = (float)src[i];
    rt_memcpy(d, h, n * sizeof(float), RT_H2D);
    free(h);
    return d;
}

static float *dev_zeros(size_t n) { return rt_malloc(n * sizeof(float)); }

/* Batch-major (row b*T + t, the reference's) to sequence-major (row t*B + b, the program's). */
static double *to_seq(const double *bm, int cols)
{
    double *sm = ref_xcalloc((size_t)N * cols, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            memcpy(sm + ((size_t)t * B + b) * cols, bm + ((size_t)b * T + t) * cols,
                   sizeof(double) * cols);
    return sm;
}

static double *to_batch(const double *sm, int cols)
{
    double *bm = ref_xcalloc((size_t)N * cols, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            memcpy(bm + ((size_t)b * T + t) * cols, sm + ((size_t)t * B + b) * cols,
                   sizeof(double) * cols);
    return bm;
}

/* Sum a device vector over the tp group in place (what finalize_grads does for the gradients
** of sequence-parallel parameters; docs/megatron.md §4.6). */
static void tp_sum(float *x, size_t n)
{
    rt_allreduce(x, n, RT_F32, RT_SUM, gpt.grp[GPT_GRP_TP]);
}

/* -- Checks and verdicts ----------------------------------------------------------------------- */

static long bad;            /* mismatches of the current test on this rank */
static int quiet;           /* 1: do not print mismatches (the control expects them) */
static double worst;        /* largest |got - want| / (max|want| + |want|) seen */

/* Compare n device floats with n doubles; print the first 5 mismatches of this rank. */
static void check(const char *what, const float *got_dev, const double *want, size_t n)
{
    float *got = malloc(n * sizeof(float));
    RT_CHECK(got, "out of memory");
    rt_memcpy(got, got_dev, n * sizeof(float), RT_D2H);
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    long shown = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = scale + fabs(want[i]);
        double r = lim > 0 ? d / lim : d;
        worst = fmax(worst, r);
        if (!(d <= TOL * lim)) {
            if (!quiet && shown++ < 5)
                fprintf(stderr, "[rank %d] %s[%zu]: got %.9g want %.9g (diff %.3g, scale %.3g)\n",
                        rt_rank(), what, i, (double)got[i], want[i], d, scale);
            bad++;
        }
    }
    free(got);
}

static int verdict(const char *name)
{
    float *v = rt_malloc(2 * sizeof(float)), h[2] = { (float)bad, (float)worst };
    rt_memcpy(v, h, sizeof h, RT_H2D);
    rt_allreduce(v, 2, RT_F32, RT_MAX, rt_group_world());
    rt_memcpy(h, v, sizeof h, RT_D2H);
    rt_free(v);
    if (rt_rank() == 0) {
        if (h[0] == 0) printf("PASS regions/%s/%s\n", tag, name);
        else printf("FAIL regions/%s/%s: %.0f mismatches on some rank (worst relative diff "
                    "%.3g, tolerance %.0e)\n", tag, name, (double)h[0], (double)h[1], TOL);
        fflush(stdout);
    }
    int failed = h[0] != 0;
    bad = 0;
    worst = 0.0;
    return failed;
}

/* -- Column-parallel linear (c_fc: C -> FF, split by output columns) -------------------------- */

/*
** Forward: X (all gathered from the sequence-parallel slabs under SP, else "f" = identity),
** Y_t = X W_t + b_t. Backward: dX = sum_t dY_t W_t^T (all-reduce, or reduce-scatter under SP),
** dW_t = X^T dY_t, db_t = column sums of dY_t; no communication for dW, db.
*/
static int test_column(void)
{
    const int t = gpt.tp_rank, col = t * FFL;
    double *X = rnd((size_t)N * C, 11, 0, 1), *W = rnd((size_t)C * FF, 12, 0, 0.1);
    double *b = rnd(FF, 13, 0, 0.1), *dY = rnd((size_t)N * FF, 14, 0, 1);
    double *Y = zeros((size_t)N * FF), *dX = zeros((size_t)N * C);
    double *dW = zeros((size_t)C * FF), *db = zeros(FF);
    ref_linear_fwd(Y, X, W, b, N, C, FF);
    ref_linear_bwd(dX, dW, db, dY, X, W, N, C, FF);

    float *x = dev(X + (size_t)r0 * C, (size_t)NSP * C);
    float *w = dev(block(W, FF, 0, col, C, FFL), (size_t)C * FFL);
    float *bias = dev(b + col, FFL), *full = dev_zeros((size_t)N * C);
    float *y = dev_zeros((size_t)N * FFL);
    const float *h = gather_seq(full, x);
    matmul_fwd(y, h, w, bias, N, C, FFL);
    check("column.gathered_input", h, X, (size_t)N * C);
    check("column.Y_t", y, block(Y, FF, 0, col, N, FFL), (size_t)N * FFL);
    int failed = verdict("column-parallel-fwd");

    float *dy = dev(block(dY, FF, 0, col, N, FFL), (size_t)N * FFL);
    float *dw = dev_zeros((size_t)C * FFL), *dbias = dev_zeros(FFL);
    matmul_bwd(lib.s.full, dw, dbias, dy, h, w, N, C, FFL);
    const float *dx = reduce_seq(lib.s.full);
    check("column.dX", dx, dX + (size_t)r0 * C, (size_t)NSP * C);
    check("column.dW_t", dw, block(dW, FF, 0, col, C, FFL), (size_t)C * FFL);
    check("column.db_t", dbias, db + col, FFL);
    return failed + verdict("column-parallel-bwd");
}

/* -- Row-parallel linear (mlp c_proj: FF -> C, split by input rows) ---------------------------- */

/*
** Forward: partial X_t W_t, reduced ("g": all-reduce, or reduce-scatter under SP), then the
** unsplit bias. Backward: dY (all-gathered under SP, else identity), dX_t = dY W_t^T,
** dW_t = X_t^T dY, db = column sums of dY (per slab under SP, then summed over tp).
*/
static int test_row(void)
{
    const int t = gpt.tp_rank, row = t * FFL;
    double *X = rnd((size_t)N * FF, 21, 0, 1), *W = rnd((size_t)FF * C, 22, 0, 0.1);
    double *b = rnd(C, 23, 0, 0.1), *dY = rnd((size_t)N * C, 24, 0, 1);
    double *Y = zeros((size_t)N * C), *dX = zeros((size_t)N * FF);
    double *dW = zeros((size_t)FF * C), *db = zeros(C);
    ref_linear_fwd(Y, X, W, b, N, FF, C);
    ref_linear_bwd(dX, dW, db, dY, X, W, N, FF, C);

    float *x = dev(block(X, FF, 0, row, N, FFL), (size_t)N * FFL);
    float *w = dev(W + (size_t)row * C, (size_t)FFL * C), *bias = dev(b, C);
    matmul_fwd(lib.s.full, x, w, NULL, N, FFL, C);
    float *y = reduce_seq(lib.s.full);
    bias_fwd(y, bias, NSP, C, RT_F32);
    check("row.Y", y, Y + (size_t)r0 * C, (size_t)NSP * C);
    int failed = verdict("row-parallel-fwd");

    float *dy = dev(dY + (size_t)r0 * C, (size_t)NSP * C), *full = dev_zeros((size_t)N * C);
    float *dbias = dev_zeros(C), *dw = dev_zeros((size_t)FFL * C), *dx = dev_zeros((size_t)N * FFL);
    bias_bwd(dbias, dy, NSP, C, RT_F32);
    if (SP) tp_sum(dbias, C);
    const float *d = gather_seq(full, dy);
    matmul_bwd(dx, dw, NULL, d, x, w, N, FFL, C);
    check("row.dX_t", dx, block(dX, FF, 0, row, N, FFL), (size_t)N * FFL);
    check("row.dW_t", dw, dW + (size_t)row * C, (size_t)FFL * C);
    check("row.db", dbias, db, C);
    return failed + verdict("row-parallel-bwd");
}

/* -- The two sequence regions on their own ----------------------------------------------------- */

/*
** gather_seq: under SP the all-gather of the slabs (forward of
** gather_from_sequence_parallel_region), else the identity ("f" forward). reduce_seq: under SP
** the reduce-scatter (its backward, and reduce_scatter_to_sequence_parallel_region's forward),
** else the all-reduce ("g" forward, "f" backward). Each is checked against the unsplit sum.
*/
static void check_gather(uint64_t seed)
{
    double *X = rnd((size_t)N * C, seed, 0, 1);
    float *x = dev(X + (size_t)r0 * C, (size_t)NSP * C), *full = dev_zeros((size_t)N * C);
    check("gather_seq", gather_seq(full, x), X, (size_t)N * C);
}

/* Every rank holds partial sums P_k (its share of a row-parallel output or of a gradient). */
static void check_reduce(uint64_t seed)
{
    double *sum = zeros((size_t)N * C);
    float *mine = NULL;
    for (int k = 0; k < TP; k++) {
        double *P = rnd((size_t)N * C, seed + (uint64_t)k, 0, 1);
        for (size_t i = 0; i < (size_t)N * C; i++) sum[i] += P[i];
        if (k == gpt.tp_rank) mine = dev(P, (size_t)N * C);
        free(P);
    }
    check("reduce_seq", reduce_seq(mine), sum + (size_t)r0 * C, (size_t)NSP * C);
}

static int test_seq_regions(void)
{
    const char *g = SP ? "sp-allgather" : "tp-copy", *r = SP ? "sp-reducescatter" : "tp-reduce";
    char name[64];
    int failed = 0;
    check_gather(31);
    snprintf(name, sizeof name, "%s-fwd", g);
    failed += verdict(name);
    check_reduce(40);      /* the backward of the gather (SP: reduce-scatter; else all-reduce) */
    snprintf(name, sizeof name, "%s-bwd", g);
    failed += verdict(name);
    check_reduce(50);
    snprintf(name, sizeof name, "%s-fwd", r);
    failed += verdict(name);
    check_gather(32);      /* the backward of the reduction (SP: all-gather; else identity) */
    snprintf(name, sizeof name, "%s-bwd", r);
    return failed + verdict(name);
}

/* -- Vocabulary-parallel embedding ------------------------------------------------------------- */

/*
** Forward: rank t looks up the tokens in its vocabulary rows [t*VL, t*VL + VL) (zero rows for
** the others), all-reduce, + wpe; under SP each rank keeps its slab. Backward: the gradient of
** every row (gathered under SP) lands in the owner's wte rows; wpe gets every position's sum.
*/
static int test_embedding(void)
{
    double *wte = rnd((size_t)V * C, 51, 0, 1), *wpe = rnd((size_t)CFG_T_MODEL * C, 52, 0, 1);
    int *tok_bm = malloc(sizeof(int) * N), *tok = malloc(sizeof(int) * N);
    RT_CHECK(tok_bm && tok, "out of memory");
    rng_state = 53;
    for (int i = 0; i < N; i++) {
        uniform();
        tok_bm[i] = (int)(rng_state % (uint64_t)V);
    }
    tok_bm[0] = 0;
    tok_bm[N - 1] = V - 1;                       /* both ends of the vocabulary */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) tok[t * B + b] = tok_bm[b * T + t];
    double *out = zeros((size_t)N * C);
    ref_embed_fwd(out, tok_bm, wte, wpe, B, T, C);
    double *out_sm = to_seq(out, C);

    double *wte_local = zeros((size_t)VL * C);   /* this rank's rows, zero padding */
    for (int i = 0; i < gpt.vocab_valid; i++)
        memcpy(wte_local + (size_t)i * C, wte + (size_t)(gpt.vocab_start + i) * C, sizeof(double) * C);
    lib_embed p = { dev(wte_local, (size_t)VL * C), dev(wpe, (size_t)CFG_T_MODEL * C) };
    int *tok_dev = rt_malloc(sizeof(int) * N);
    rt_memcpy(tok_dev, tok, sizeof(int) * N, RT_H2D);
    float *x = dev_zeros((size_t)NSP * C);
    embedding_fwd(&p, x, tok_dev);
    check("embedding.out", x, out_sm + (size_t)r0 * C, (size_t)NSP * C);
    int failed = verdict("vocab-embedding-fwd");

    double *dout_sm = rnd((size_t)N * C, 54, 0, 1), *dout = to_batch(dout_sm, C);
    double *dwte = zeros((size_t)V * C), *dwpe = zeros((size_t)CFG_T_MODEL * C);
    ref_embed_bwd(dwte, dwpe, dout, tok_bm, B, T, C);
    double *dwte_local = zeros((size_t)VL * C);
    for (int i = 0; i < gpt.vocab_valid; i++)
        memcpy(dwte_local + (size_t)i * C, dwte + (size_t)(gpt.vocab_start + i) * C,
               sizeof(double) * C);
    lib_embed g = { dev_zeros((size_t)VL * C), dev_zeros((size_t)CFG_T_MODEL * C) };
    embedding_bwd(&g, dev(dout_sm + (size_t)r0 * C, (size_t)NSP * C), tok_dev);
    check("embedding.dwte_t (padding rows 0)", g.wte, dwte_local, (size_t)VL * C);
    check("embedding.dwpe", g.wpe, dwpe, (size_t)CFG_T_MODEL * C);
    return failed + verdict("vocab-embedding-bwd");
}

/* -- Vocabulary-parallel cross-entropy (head_fwd_bwd: ln_f, logits on the rank's vocabulary
** columns, max / sum-exp / target-logit all-reduces, and the backward) ------------------------- */

static int test_cross_entropy(void)
{
    double *X = rnd((size_t)N * C, 61, 0, 1), *lw = rnd(C, 62, 1, 0.1), *lb = rnd(C, 63, 0, 0.1);
    double *wte = rnd((size_t)V * C, 64, 0, 0.5);
    int *tgt = malloc(sizeof(int) * N);
    RT_CHECK(tgt, "out of memory");
    rng_state = 65;
    for (int i = 0; i < N; i++) {
        uniform();
        tgt[i] = (int)(rng_state % (uint64_t)V);
    }
    tgt[0] = 0;
    tgt[N - 1] = V - 1;
    double *ln = zeros((size_t)N * C), *mean = zeros(N), *rstd = zeros(N);
    double *logits = zeros((size_t)N * V), *losses = zeros(N);
    ref_layernorm_fwd(ln, mean, rstd, X, lw, lb, N, C, (double)CFG_LN_EPS);
    ref_head_fwd(logits, ln, wte, N, V, C);
    ref_xent_fwd(logits, losses, logits, tgt, N, V);      /* logits become the probabilities */
    double loss = 0.0;
    for (int i = 0; i < N; i++) loss += losses[i];
    double *dlogits = zeros((size_t)N * V), *dln = zeros((size_t)N * C);
    double *dwte = zeros((size_t)V * C), *dX = zeros((size_t)N * C);
    double *dlw = zeros(C), *dlb = zeros(C);
    ref_xent_bwd(dlogits, logits, tgt, N, V, 1.0 / ((double)N * CFG_NMB));
    ref_head_bwd(dln, dwte, dlogits, ln, wte, N, V, C);
    ref_layernorm_bwd(dX, dlw, dlb, dln, X, lw, mean, rstd, N, C);

    double *wte_local = zeros((size_t)VL * C), *dwte_local = zeros((size_t)VL * C);
    for (int i = 0; i < gpt.vocab_valid; i++) {
        memcpy(wte_local + (size_t)i * C, wte + (size_t)(gpt.vocab_start + i) * C, sizeof(double) * C);
        memcpy(dwte_local + (size_t)i * C, dwte + (size_t)(gpt.vocab_start + i) * C,
               sizeof(double) * C);
    }
    lib_head p = { dev(lw, C), dev(lb, C), dev(wte_local, (size_t)VL * C) };
    lib_head g = { dev_zeros(C), dev_zeros(C), dev_zeros((size_t)VL * C) };
    lib_head_acts a = { dev_zeros((size_t)NSP * C), dev_zeros(NSP), dev_zeros(NSP) };
    int *tgt_dev = rt_malloc(sizeof(int) * N);
    rt_memcpy(tgt_dev, tgt, sizeof(int) * N, RT_H2D);
    float *loss_dev = dev_zeros(1), *dx = dev_zeros((size_t)NSP * C);
    head_fwd_bwd(&p, &g, &a, dev(X + (size_t)r0 * C, (size_t)NSP * C), tgt_dev, loss_dev, dx);
    check("cross_entropy.loss_sum", loss_dev, &loss, 1);
    int failed = verdict("vocab-cross-entropy-fwd");

    if (SP) {
        tp_sum(g.ln_f_w, C);
        tp_sum(g.ln_f_b, C);
    }
    check("cross_entropy.dx", dx, dX + (size_t)r0 * C, (size_t)NSP * C);
    check("cross_entropy.dwte_t (padding rows 0)", g.wte, dwte_local, (size_t)VL * C);
    check("cross_entropy.dln_f.weight", g.ln_f_w, dlw, C);
    check("cross_entropy.dln_f.bias", g.ln_f_b, dlb, C);
    return failed + verdict("vocab-cross-entropy-bwd");
}

/* -- A whole layer: the regions composed as Megatron's block (attention heads split) ----------- */

typedef struct {
    double *ln1w, *ln1b, *qkvw, *qkvb, *pw, *pb, *ln2w, *ln2b, *fcw, *fcb, *p2w, *p2b;
} layer_full;

/* c_attn's columns of rank t: q_t | k_t | v_t, CL columns from each of the three C blocks. */
static double *qkv_cols(const double *m, int rows)
{
    double *out = zeros((size_t)rows * 3 * CL);
    for (int i = 0; i < rows; i++)
        for (int part = 0; part < 3; part++)
            memcpy(out + (size_t)i * 3 * CL + part * CL,
                   m + (size_t)i * 3 * C + part * C + gpt.tp_rank * CL, sizeof(double) * CL);
    return out;
}

static gpt_layer_params layer_shard(const layer_full *f)
{
    gpt_layer_params p = {       /* the GPT-2 layer's tensors; the rest NULL */
        .ln_1_w = dev(f->ln1w, C), .ln_1_b = dev(f->ln1b, C),
        .c_attn_w = dev(qkv_cols(f->qkvw, C), (size_t)C * 3 * CL),
        .c_attn_b = dev(qkv_cols(f->qkvb, 1), 3 * CL),
        .attn_proj_w = dev(f->pw + (size_t)gpt.tp_rank * CL * C, (size_t)CL * C),
        .attn_proj_b = dev(f->pb, C), .ln_2_w = dev(f->ln2w, C), .ln_2_b = dev(f->ln2b, C),
        .c_fc_w = dev(block(f->fcw, FF, 0, gpt.tp_rank * FFL, C, FFL), (size_t)C * FFL),
        .c_fc_b = dev(f->fcb + gpt.tp_rank * FFL, FFL),
        .mlp_proj_w = dev(f->p2w + (size_t)gpt.tp_rank * FFL * C, (size_t)FFL * C),
        .mlp_proj_b = dev(f->p2b, C),
    };
    return p;
}

static int test_layer(void)
{
    layer_full w = {
        rnd(C, 71, 1, 0.1), rnd(C, 72, 0, 0.1), rnd((size_t)C * 3 * C, 73, 0, 0.15),
        rnd(3 * C, 74, 0, 0.1), rnd((size_t)C * C, 75, 0, 0.1), rnd(C, 76, 0, 0.1),
        rnd(C, 77, 1, 0.1), rnd(C, 78, 0, 0.1), rnd((size_t)C * FF, 79, 0, 0.1),
        rnd(FF, 80, 0, 0.1), rnd((size_t)FF * C, 81, 0, 0.1), rnd(C, 82, 0, 0.1),
    };
    layer_full dw = {
        zeros(C), zeros(C), zeros((size_t)C * 3 * C), zeros(3 * C), zeros((size_t)C * C),
        zeros(C), zeros(C), zeros(C), zeros((size_t)C * FF), zeros(FF), zeros((size_t)FF * C),
        zeros(C),
    };
    /* reference, batch-major */
    size_t nc = (size_t)N * C;
    double *x_sm = rnd(nc, 83, 0, 1), *x = to_batch(x_sm, C);
    double *ln1 = zeros(nc), *m1 = zeros(N), *s1 = zeros(N), *qkv = zeros(nc * 3);
    double *att = zeros((size_t)B * H * T * T), *y = zeros(nc), *proj = zeros(nc);
    double *res1 = zeros(nc), *ln2 = zeros(nc), *m2 = zeros(N), *s2 = zeros(N);
    double *h = zeros((size_t)N * FF), *a = zeros((size_t)N * FF), *mlp = zeros(nc);
    double *res2 = zeros(nc);
    ref_layernorm_fwd(ln1, m1, s1, x, w.ln1w, w.ln1b, N, C, (double)CFG_LN_EPS);
    ref_linear_fwd(qkv, ln1, w.qkvw, w.qkvb, N, C, 3 * C);
    ref_attention_fwd(y, att, qkv, B, T, C, H);
    ref_linear_fwd(proj, y, w.pw, w.pb, N, C, C);
    for (size_t i = 0; i < nc; i++) res1[i] = x[i] + proj[i];
    ref_layernorm_fwd(ln2, m2, s2, res1, w.ln2w, w.ln2b, N, C, (double)CFG_LN_EPS);
    ref_linear_fwd(h, ln2, w.fcw, w.fcb, N, C, FF);
    ref_gelu_fwd(a, h, (size_t)N * FF);
    ref_linear_fwd(mlp, a, w.p2w, w.p2b, N, FF, C);
    for (size_t i = 0; i < nc; i++) res2[i] = res1[i] + mlp[i];

    gpt_layer_params p = layer_shard(&w);
    gpt_layer_acts acts;
    lib_layer_acts_alloc(&acts, NULL);
    float *xin = dev(x_sm + (size_t)r0 * C, (size_t)NSP * C);
    layer_fwd(&p, &acts, xin);
    check("layer.res2", acts.res2, to_seq(res2, C) + (size_t)r0 * C, (size_t)NSP * C);
    int failed = verdict("layer-fwd");

    /* backward from d(res2) */
    double *dres_sm = rnd(nc, 84, 0, 1), *dres = to_batch(dres_sm, C);
    double *da = zeros((size_t)N * FF), *dh = zeros((size_t)N * FF), *dln2 = zeros(nc);
    double *dy = zeros(nc), *dqkv = zeros(nc * 3), *dln1 = zeros(nc);
    double *dres1 = zeros(nc), *dx = zeros(nc);
    ref_linear_bwd(da, dw.p2w, dw.p2b, dres, a, w.p2w, N, FF, C);
    ref_gelu_bwd(dh, da, h, (size_t)N * FF);
    ref_linear_bwd(dln2, dw.fcw, dw.fcb, dh, ln2, w.fcw, N, C, FF);
    memcpy(dres1, dres, nc * sizeof(double));
    ref_layernorm_bwd(dres1, dw.ln2w, dw.ln2b, dln2, res1, w.ln2w, m2, s2, N, C);
    ref_linear_bwd(dy, dw.pw, dw.pb, dres1, y, w.pw, N, C, C);
    ref_attention_bwd(dqkv, dy, qkv, att, B, T, C, H);
    ref_linear_bwd(dln1, dw.qkvw, dw.qkvb, dqkv, ln1, w.qkvw, N, C, 3 * C);
    memcpy(dx, dres1, nc * sizeof(double));
    ref_layernorm_bwd(dx, dw.ln1w, dw.ln1b, dln1, x, w.ln1w, m1, s1, N, C);

    gpt_layer_params g = {
        .ln_1_w = dev_zeros(C), .ln_1_b = dev_zeros(C), .c_attn_w = dev_zeros((size_t)C * 3 * CL),
        .c_attn_b = dev_zeros(3 * CL), .attn_proj_w = dev_zeros((size_t)CL * C),
        .attn_proj_b = dev_zeros(C), .ln_2_w = dev_zeros(C), .ln_2_b = dev_zeros(C),
        .c_fc_w = dev_zeros((size_t)C * FFL), .c_fc_b = dev_zeros(FFL),
        .mlp_proj_w = dev_zeros((size_t)FFL * C), .mlp_proj_b = dev_zeros(C),
    };
    float *d = dev(dres_sm + (size_t)r0 * C, (size_t)NSP * C);
    layer_bwd(&p, &g, &acts, xin, d);
    if (SP) {   /* the sequence-parallel parameters: LayerNorms, row-parallel biases */
        float *sp[] = { g.ln_1_w, g.ln_1_b, g.attn_proj_b, g.ln_2_w, g.ln_2_b, g.mlp_proj_b };
        for (int i = 0; i < 6; i++) tp_sum(sp[i], C);
    }
    gpt_layer_params want = layer_shard(&dw);   /* the unsplit gradients, sharded as the weights */
    float *got[] = { g.ln_1_w, g.ln_1_b, g.c_attn_w, g.c_attn_b, g.attn_proj_w, g.attn_proj_b,
                     g.ln_2_w, g.ln_2_b, g.c_fc_w, g.c_fc_b, g.mlp_proj_w, g.mlp_proj_b };
    float *exp_[] = { want.ln_1_w, want.ln_1_b, want.c_attn_w, want.c_attn_b, want.attn_proj_w,
                      want.attn_proj_b, want.ln_2_w, want.ln_2_b, want.c_fc_w, want.c_fc_b,
                      want.mlp_proj_w, want.mlp_proj_b };
    size_t len[] = { C, C, (size_t)C * 3 * CL, 3 * CL, (size_t)CL * C, C, C, C,
                     (size_t)C * FFL, FFL, (size_t)FFL * C, C };
    const char *names[] = { "ln_1.w", "ln_1.b", "c_attn.w", "c_attn.b", "attn.c_proj.w",
                            "attn.c_proj.b", "ln_2.w", "ln_2.b", "c_fc.w", "c_fc.b",
                            "mlp.c_proj.w", "mlp.c_proj.b" };
    for (int i = 0; i < 12; i++) {
        double *ref = zeros(len[i]);
        float *tmp = malloc(len[i] * sizeof(float));
        RT_CHECK(tmp, "out of memory");
        rt_memcpy(tmp, exp_[i], len[i] * sizeof(float), RT_D2H);   /* f32 of the double ref */
        for (size_t k = 0; k < len[i]; k++) ref[k] = tmp[k];
        check(names[i], got[i], ref, len[i]);
        free(tmp);
        free(ref);
    }
    check("layer.dx", d, to_seq(dx, C) + (size_t)r0 * C, (size_t)NSP * C);
    return failed + verdict("layer-bwd");
}

/* -- Control: the checks can fail ------------------------------------------------------------- */

/* The column-parallel output compared with the next rank's columns must mismatch. */
static int test_control(void)
{
    const int other = ((gpt.tp_rank + 1) % TP) * FFL;
    double *X = rnd((size_t)N * C, 11, 0, 1), *W = rnd((size_t)C * FF, 12, 0, 0.1);
    double *b = rnd(FF, 13, 0, 0.1), *Y = zeros((size_t)N * FF);
    ref_linear_fwd(Y, X, W, b, N, C, FF);
    float *w = dev(block(W, FF, 0, gpt.tp_rank * FFL, C, FFL), (size_t)C * FFL);
    float *y = dev_zeros((size_t)N * FFL), *full = dev_zeros((size_t)N * C);
    matmul_fwd(y, gather_seq(full, dev(X + (size_t)r0 * C, (size_t)NSP * C)), w,
               dev(b + gpt.tp_rank * FFL, FFL), N, C, FFL);
    quiet = 1;
    check("control", y, block(Y, FF, 0, other, N, FFL), (size_t)N * FFL);
    quiet = 0;
    long caught = bad;
    bad = 0;
    worst = 0.0;
    if (!caught) bad = 1;   /* a check that cannot fail is a failure */
    return verdict("control-wrong-shard-is-caught");
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, CFG_WORLD, CFG_LAYOUT);
    RT_CHECK(CFG_TP > 1 && CFG_DP == 1 && CFG_PP == 1, "t_regions needs a TP > 1, DP 1, PP 1 "
             "layout (built for %s)", CFG_LAYOUT);
    tag = argc > 1 ? argv[1] : CFG_LAYOUT;
    gpt.prog = &gpt_program_desc;   /* the layout's groups and scratch, as a program sets them up */
    gpt.d = gpt_program_desc.dims;
    lib_groups_create(&gpt_program_desc);
    gpt.stage = gpt_program_desc.stages[gpt.pp_rank];
    lib_tensors_build(&gpt_program_desc);
    lib_stage_setup();
    r0 = SP ? gpt.tp_rank * NSP : 0;
    int failed = test_column() + test_row() + test_seq_regions() + test_embedding() +
                 test_cross_entropy() + test_layer() + test_control();
    rt_finalize();
    return failed ? 1 : 0;
}
