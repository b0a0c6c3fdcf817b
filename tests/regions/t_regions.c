/*
** t_regions.c: each tensor-parallel region as the generated program runs it, forward and
** backward, against the unsplit computation of the double-precision reference
** (build/ref/libref.a), as one checks a ColumnParallelLinear by hand. Not a training test: the
** model is never trained; every rank builds the same global tensors, takes its shards, runs
** the code under test and compares its shard of each result with the unsplit one.
**
** The code under test is the layout's generated stage0.c, #included here so that its static
** model code can be called: layer_fwd and layer_bwd (a whole layer: column-parallel c_attn and
** c_fc, row-parallel c_proj, the sequence regions between them), embedding_fwd/bwd (the
** vocabulary-parallel embedding) and head_fwd_bwd (the vocabulary-parallel cross-entropy).
** The test sets the stage up as the program does (groups, the memory plan's buffers), writes
** its weights into the stage's parameter buffers and its inputs into the activation buffers
** where the program would have them, calls the generated function and reads what it wrote.
** The column- and row-parallel linear and the sequence regions are also checked on their own,
** with synthetic inputs: the library's ops (matmul_fwd/bwd, bias) between the collectives the
** generated code emits for them, issued here (gather_seq, reduce_seq below).
**
** Compiled by tests/regions/regions.mk against one output directory (a TP > 1, DP 1, PP 1, f32
** layout), with its program.c and the library. Run: mpirun -np TP t_regions TAG; rank 0 prints
** "PASS regions/TAG/<test>" or "FAIL ...".
*/
#include "stage0.c"   // defines: layer_fwd, layer_bwd, embedding_fwd, embedding_bwd, head_fwd_bwd

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_ref.h"   // defines: ref_linear_fwd, ref_embed_fwd, ref_xent_fwd, ...
#include "stage.h"      // defines: gpt, lib, lib_groups_create, lib_stage_setup

/* -- Sizes of this layout ------------------------------------------------------------------- */

enum {
    N = CFG_N, NSP = CFG_N_SP, C = CFG_C, B = CFG_B, T = CFG_T, TP = CFG_TP,
    FF = CFG_FF, FFL = CFG_FF_LOCAL, CL = CFG_C_LOCAL, V = CFG_V, VL = CFG_V_LOCAL,
    H = CFG_HEADS,
};
#define SP (NSP < N)        /* sequence parallel: each rank holds rows [r0, r0 + NSP) */
static int r0;              /* first sequence-major row of this rank's slab (0 without SP) */
static const char *tag;

/* Where the generated code is run: a PP 1 layout's one model chunk, and its one activation
** slot (one micro-batch in flight), micro-batch 0 of the step. */
enum { CHUNK = 0, SLOT = 0, MB = 0 };

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

/* N token ids in [0, V) from 'seed', both ends of the vocabulary among them. */
static int *token_ids(uint64_t seed)
{
    int *tok = malloc(sizeof(int) * N);
    RT_CHECK(tok, "out of memory");
    rng_state = seed;
    for (int i = 0; i < N; i++) {
        uniform();
        tok[i] = (int)(rng_state % (uint64_t)V);
    }
    tok[0] = 0;
    tok[N - 1] = V - 1;
    return tok;
}

/* The (nr, nc) block at (rr, cc) of a row-major matrix with 'ld' columns, as a new array. */
static double *block(const double *src, int ld, int rr, int cc, int nr, int nc)
{
    double *out = ref_xcalloc((size_t)nr * nc, sizeof(double));
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) out[(size_t)i * nc + j] = src[(size_t)(rr + i) * ld + cc + j];
    return out;
}

/* Tensor-parallel rank t's vocabulary rows of a (V, C) matrix: (VL, C), the padding rows 0. */
static double *vocab_rows(const double *m, int t)
{
    double *out = zeros((size_t)VL * C);
    int start = t * VL, valid = V - start < VL ? V - start : VL;
    if (valid > 0) memcpy(out, m + (size_t)start * C, sizeof(double) * C * (size_t)valid);
    return out;
}

/* n doubles as f32 into device memory 'dst' (the layouts are f32: CFG_ACT is RT_F32). */
static void put(void *dst, const double *src, size_t n)
{
    float *h = malloc(n * sizeof(float));
    RT_CHECK(h, "out of memory");
    for (size_t i = 0; i < n; i++) h[i] = (float)src[i];
    rt_memcpy(dst, h, n * sizeof(float), RT_H2D);
    free(h);
}

/* A new device (f32) copy of n doubles; a new zeroed device array. */
static float *dev(const double *src, size_t n)
{
    float *d = rt_malloc(n * sizeof(float));
    put(d, src, n);
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

/* -- The program's step around the generated model code --------------------------------------- */

/* The start of a step as the program's (gpt_step_begin): the gradients zeroed, and the
** micro-batch's host token ids and targets where embedding_fwd and head_fwd_bwd read them
** (gpt_inputs, gpt_targets; NULL: not read). */
static gpt_step_in step_in;

static void begin_step(const int *inputs, const int *targets)
{
    step_in = (gpt_step_in){ .inputs = inputs, .targets = targets };
    gpt_step_begin(&step_in);
}

/* The gradients of the sequence-parallel parameters (LayerNorms, row-parallel biases) summed
** over tp, as the generated step does after its schedule: packed, all-reduced over the tp
** group, unpacked (docs/megatron.md §4.6). Without SP each rank saw every token: none. */
static void sp_grads_reduce(void)
{
    if (!SP) return;
    gpt_sp_pack();
    rt_allreduce(gpt_stage_buf(GPT_M_X_SP_PACK), lib.sp_total, RT_F32, RT_SUM,
                 gpt_grp(GPT_GRP_TP));
    gpt_sp_unpack();
}

/* -- The sequence regions, for the standalone tests ----------------------------------------- */

/*
** The collectives the generated code emits around a column- or row-parallel linear (the ">>>"
** lines of stage0.c's layer_fwd and layer_bwd); the library has no function for them, each is
** a line of the generated source. gather_seq: under SP the all-gather over tp of the (N_SP, C)
** slabs into (N, C) ("gather from the sequence-parallel region"), else the identity ("f"
** forward). reduce_seq: under SP the reduce-scatter over tp of (N, C) partial sums into this
** rank's slab, else their all-reduce in place ("g" forward). Both return the result.
*/
static const float *gather_seq(float *full, const float *slab)
{
    if (!SP) return slab;
    rt_allgather(slab, full, (size_t)NSP * C, CFG_ACT, gpt_grp(GPT_GRP_TP));
    return full;
}

static float *reduce_seq(float *partial, float *slab)
{
    if (!SP) {
        rt_allreduce(partial, (size_t)N * C, CFG_ACT, RT_SUM, gpt_grp(GPT_GRP_TP));
        return partial;
    }
    rt_reduce_scatter(partial, slab, (size_t)NSP * C, CFG_ACT, gpt_grp(GPT_GRP_TP));
    return slab;
}

/* The sum over tp of a device vector in place, as the generated step's all-reduce does for the
** gradients of sequence-parallel parameters (sp_grads_reduce, for the stage's own tensors). */
static void tp_sum(float *x, size_t n)
{
    rt_allreduce(x, n, RT_F32, RT_SUM, gpt_grp(GPT_GRP_TP));
}

/* -- Checks and verdicts ----------------------------------------------------------------------- */

static long bad;            /* mismatches of the current test on this rank */
static int quiet;           /* 1: do not print mismatches (the control expects them) */
static double worst;        /* largest |got - want| / (max|want| + |want|) seen */

/* Compare n device floats with n doubles; print the first 5 mismatches of this rank. */
static void check(const char *what, const void *got_dev, const double *want, size_t n)
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

/* This rank's slab (its NSP rows under SP, else all) of a batch-major (N, cols) reference
** tensor, against the sequence-major slab the program holds. */
static void check_slab(const char *what, const void *got_dev, const double *want_bm, int cols)
{
    check(what, got_dev, to_seq(want_bm, cols) + (size_t)r0 * cols, (size_t)NSP * cols);
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
    matmul_fwd(y, h, w, bias, N, C, FFL, CFG_ACT);
    check("column.gathered_input", h, X, (size_t)N * C);
    check("column.Y_t", y, block(Y, FF, 0, col, N, FFL), (size_t)N * FFL);
    int failed = verdict("column-parallel-fwd");

    float *dy = dev(block(dY, FF, 0, col, N, FFL), (size_t)N * FFL);
    float *dw = dev_zeros((size_t)C * FFL), *dbias = dev_zeros(FFL);
    float *partial = dev_zeros((size_t)N * C), *slab = dev_zeros((size_t)NSP * C);
    matmul_bwd(partial, dw, dbias, dy, h, w, N, C, FFL, CFG_ACT);
    check("column.dX", reduce_seq(partial, slab), dX + (size_t)r0 * C, (size_t)NSP * C);
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
    float *partial = dev_zeros((size_t)N * C), *slab = dev_zeros((size_t)NSP * C);
    matmul_fwd(partial, x, w, NULL, N, FFL, C, CFG_ACT);
    float *y = reduce_seq(partial, slab);
    bias_fwd(y, bias, NSP, C, CFG_ACT);
    check("row.Y", y, Y + (size_t)r0 * C, (size_t)NSP * C);
    int failed = verdict("row-parallel-fwd");

    float *dy = dev(dY + (size_t)r0 * C, (size_t)NSP * C), *full = dev_zeros((size_t)N * C);
    float *dbias = dev_zeros(C), *dw = dev_zeros((size_t)FFL * C), *dx = dev_zeros((size_t)N * FFL);
    bias_bwd(dbias, dy, NSP, C, CFG_ACT);
    if (SP) tp_sum(dbias, C);
    matmul_bwd(dx, dw, NULL, gather_seq(full, dy), x, w, N, FFL, C, CFG_ACT);
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
    float *mine = NULL, *slab = dev_zeros((size_t)NSP * C);
    for (int k = 0; k < TP; k++) {
        double *P = rnd((size_t)N * C, seed + (uint64_t)k, 0, 1);
        for (size_t i = 0; i < (size_t)N * C; i++) sum[i] += P[i];
        if (k == gpt.tp_rank) mine = dev(P, (size_t)N * C);
        free(P);
    }
    check("reduce_seq", reduce_seq(mine, slab), sum + (size_t)r0 * C, (size_t)NSP * C);
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

/* -- Vocabulary-parallel embedding: the generated embedding_fwd and embedding_bwd ------------- */

/*
** Forward: rank t looks up the tokens in its vocabulary rows [t*VL, t*VL + VL) (zero rows for
** the others), all-reduce, + wpe; under SP each rank keeps its slab (the chunk's input x).
** Backward from d(x): the gradient of every row (gathered under SP) lands in the owner's wte
** rows; wpe gets every position's sum.
*/
static int test_embedding(void)
{
    double *wte = rnd((size_t)V * C, 51, 0, 1), *wpe = rnd((size_t)CFG_T_MODEL * C, 52, 0, 1);
    int *tok_bm = token_ids(53), *tok = malloc(sizeof(int) * N);
    RT_CHECK(tok, "out of memory");
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) tok[t * B + b] = tok_bm[b * T + t];
    double *out = zeros((size_t)N * C);
    ref_embed_fwd(out, tok_bm, wte, wpe, B, T, C);

    begin_step(tok, NULL);
    void *const *w = gpt_params(CHUNK, -1);
    put(w[GPT_P_WTE], vocab_rows(wte, gpt.tp_rank), (size_t)VL * C);
    put(w[GPT_P_WPE], wpe, (size_t)CFG_T_MODEL * C);
    embedding_fwd(CHUNK, MB, SLOT);
    check_slab("embedding.out", gpt_x(CHUNK, SLOT), out, C);
    int failed = verdict("vocab-embedding-fwd");

    double *dout_sm = rnd((size_t)N * C, 54, 0, 1), *dout = to_batch(dout_sm, C);
    double *dwte = zeros((size_t)V * C), *dwpe = zeros((size_t)CFG_T_MODEL * C);
    ref_embed_bwd(dwte, dwpe, dout, tok_bm, B, T, C);
    put(gpt_dy(CHUNK, SLOT), dout_sm + (size_t)r0 * C, (size_t)NSP * C);
    embedding_bwd(CHUNK, SLOT);
    float *const *dw = gpt_grads(CHUNK, -1);
    check("embedding.dwte_t (padding rows 0)", dw[GPT_P_WTE], vocab_rows(dwte, gpt.tp_rank),
          (size_t)VL * C);
    check("embedding.dwpe", dw[GPT_P_WPE], dwpe, (size_t)CFG_T_MODEL * C);
    return failed + verdict("vocab-embedding-bwd");
}

/* -- Vocabulary-parallel cross-entropy: the generated head_fwd_bwd (ln_f, logits on the rank's
** vocabulary columns, max / sum-exp / target-logit all-reduces, and the backward) ------------- */

static int test_cross_entropy(void)
{
    double *X = rnd((size_t)N * C, 61, 0, 1), *lw = rnd(C, 62, 1, 0.1), *lb = rnd(C, 63, 0, 0.1);
    double *wte = rnd((size_t)V * C, 64, 0, 0.5);
    int *tgt = token_ids(65);
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

    /* the rows of X are the program's rows (the targets are per row; no order to convert) */
    begin_step(NULL, tgt);
    void *const *w = gpt_params(CHUNK, -1);
    put(w[GPT_P_LN_F_W], lw, C);
    put(w[GPT_P_LN_F_B], lb, C);
    put(w[GPT_P_HEAD_WTE], vocab_rows(wte, gpt.tp_rank), (size_t)VL * C);   /* wte, tied */
    put(gpt_out(CHUNK, SLOT), X + (size_t)r0 * C, (size_t)NSP * C);   /* the last layer's res2 */
    head_fwd_bwd(CHUNK, MB, SLOT);
    check("cross_entropy.loss_sum", (float *)gpt_stage_buf(GPT_M_X_LOSS) + MB, &loss, 1);
    int failed = verdict("vocab-cross-entropy-fwd");

    sp_grads_reduce();
    float *const *dw = gpt_grads(CHUNK, -1);
    check("cross_entropy.dx", gpt_dy(CHUNK, SLOT), dX + (size_t)r0 * C, (size_t)NSP * C);
    check("cross_entropy.dwte_t (padding rows 0)", dw[GPT_P_HEAD_WTE],
          vocab_rows(dwte, gpt.tp_rank), (size_t)VL * C);
    check("cross_entropy.dln_f.weight", dw[GPT_P_LN_F_W], dlw, C);
    check("cross_entropy.dln_f.bias", dw[GPT_P_LN_F_B], dlb, C);
    return failed + verdict("vocab-cross-entropy-bwd");
}

/* -- A whole layer: the generated layer_fwd and layer_bwd (attention heads split) ------------- */

/* The GPT-2 layer's tensors: their field in the stage's tables, name, whole shape, random
** values (mean, scale) and how tp splits them as Megatron does: c_attn column-parallel per
** q, k, v block, c_fc column-parallel, the c_proj weights row-parallel, the rest replicated. */
enum { WHOLE, SPLIT_QKV, SPLIT_COLS, SPLIT_ROWS };
enum {
    LT_LN1_W, LT_LN1_B, LT_QKV_W, LT_QKV_B, LT_PROJ_W, LT_PROJ_B, LT_LN2_W, LT_LN2_B,
    LT_FC_W, LT_FC_B, LT_P2_W, LT_P2_B, NLT
};
static const struct {
    int field;
    const char *name;
    int rows, cols, split;
    double mean, scale;
} LT[NLT] = {
    [LT_LN1_W] = { GPT_P_LN1_W, "ln_1.w", 1, C, WHOLE, 1, 0.1 },
    [LT_LN1_B] = { GPT_P_LN1_B, "ln_1.b", 1, C, WHOLE, 0, 0.1 },
    [LT_QKV_W] = { GPT_P_QKV_W, "c_attn.w", C, 3 * C, SPLIT_QKV, 0, 0.15 },
    [LT_QKV_B] = { GPT_P_QKV_B, "c_attn.b", 1, 3 * C, SPLIT_QKV, 0, 0.1 },
    [LT_PROJ_W] = { GPT_P_ATTN_PROJ_W, "attn.c_proj.w", C, C, SPLIT_ROWS, 0, 0.1 },
    [LT_PROJ_B] = { GPT_P_ATTN_PROJ_B, "attn.c_proj.b", 1, C, WHOLE, 0, 0.1 },
    [LT_LN2_W] = { GPT_P_LN2_W, "ln_2.w", 1, C, WHOLE, 1, 0.1 },
    [LT_LN2_B] = { GPT_P_LN2_B, "ln_2.b", 1, C, WHOLE, 0, 0.1 },
    [LT_FC_W] = { GPT_P_FC_W, "c_fc.w", C, FF, SPLIT_COLS, 0, 0.1 },
    [LT_FC_B] = { GPT_P_FC_B, "c_fc.b", 1, FF, SPLIT_COLS, 0, 0.1 },
    [LT_P2_W] = { GPT_P_MLP_PROJ_W, "mlp.c_proj.w", FF, C, SPLIT_ROWS, 0, 0.1 },
    [LT_P2_B] = { GPT_P_MLP_PROJ_B, "mlp.c_proj.b", 1, C, WHOLE, 0, 0.1 },
};

typedef struct { double *t[NLT]; } layer_w;   /* whole tensors (or their gradients), by LT row */

static layer_w layer_weights(void)
{
    layer_w w;
    for (int i = 0; i < NLT; i++)
        w.t[i] = rnd((size_t)LT[i].rows * LT[i].cols, 71 + (uint64_t)i, LT[i].mean, LT[i].scale);
    return w;
}

/* c_attn's columns of rank t: q_t | k_t | v_t, CL columns from each of the three C blocks. */
static double *qkv_cols(const double *m, int rows, int t)
{
    double *out = zeros((size_t)rows * 3 * CL);
    for (int i = 0; i < rows; i++)
        for (int part = 0; part < 3; part++)
            memcpy(out + (size_t)i * 3 * CL + part * CL, m + (size_t)i * 3 * C + part * C + t * CL,
                   sizeof(double) * CL);
    return out;
}

/* Rank t's shard of whole tensor m of LT row i, as the stage holds it; *n: its elements. */
static double *shard(int i, const double *m, int t, size_t *n)
{
    int r = LT[i].rows, c = LT[i].cols;
    switch (LT[i].split) {
    case SPLIT_QKV:
        *n = (size_t)r * 3 * CL;
        return qkv_cols(m, r, t);
    case SPLIT_COLS:
        *n = (size_t)r * (c / TP);
        return block(m, c, 0, t * (c / TP), r, c / TP);
    case SPLIT_ROWS:
        *n = (size_t)(r / TP) * c;
        return block(m, c, t * (r / TP), 0, r / TP, c);
    default:
        *n = (size_t)r * c;
        return block(m, c, 0, 0, r, c);
    }
}

/* The reference layer, batch-major: its activations and, from d(res2), its gradients. */
typedef struct {
    double *x, *ln1, *m1, *s1, *qkv, *att, *y, *res1, *ln2, *m2, *s2, *h, *a, *res2;
    layer_w dw;
    double *dx;
} layer_ref;

static void layer_ref_fwd(layer_ref *r, const layer_w *w, const double *x_sm)
{
    size_t nc = (size_t)N * C;
    double *const *p = w->t;
    double *proj = zeros(nc), *mlp = zeros(nc);
    *r = (layer_ref){
        .x = to_batch(x_sm, C), .ln1 = zeros(nc), .m1 = zeros(N), .s1 = zeros(N),
        .qkv = zeros(nc * 3), .att = zeros((size_t)B * H * T * T), .y = zeros(nc),
        .res1 = zeros(nc), .ln2 = zeros(nc), .m2 = zeros(N), .s2 = zeros(N),
        .h = zeros((size_t)N * FF), .a = zeros((size_t)N * FF), .res2 = zeros(nc),
    };
    ref_layernorm_fwd(r->ln1, r->m1, r->s1, r->x, p[LT_LN1_W], p[LT_LN1_B], N, C,
                      (double)CFG_LN_EPS);
    ref_linear_fwd(r->qkv, r->ln1, p[LT_QKV_W], p[LT_QKV_B], N, C, 3 * C);
    ref_attention_fwd(r->y, r->att, r->qkv, B, T, C, H);
    ref_linear_fwd(proj, r->y, p[LT_PROJ_W], p[LT_PROJ_B], N, C, C);
    for (size_t i = 0; i < nc; i++) r->res1[i] = r->x[i] + proj[i];
    ref_layernorm_fwd(r->ln2, r->m2, r->s2, r->res1, p[LT_LN2_W], p[LT_LN2_B], N, C,
                      (double)CFG_LN_EPS);
    ref_linear_fwd(r->h, r->ln2, p[LT_FC_W], p[LT_FC_B], N, C, FF);
    ref_gelu_fwd(r->a, r->h, (size_t)N * FF);
    ref_linear_fwd(mlp, r->a, p[LT_P2_W], p[LT_P2_B], N, FF, C);
    for (size_t i = 0; i < nc; i++) r->res2[i] = r->res1[i] + mlp[i];
}

static void layer_ref_bwd(layer_ref *r, const layer_w *w, const double *dres)
{
    size_t nc = (size_t)N * C;
    double *const *p = w->t, *const *g = r->dw.t;
    for (int i = 0; i < NLT; i++) r->dw.t[i] = zeros((size_t)LT[i].rows * LT[i].cols);
    double *da = zeros((size_t)N * FF), *dh = zeros((size_t)N * FF), *dln2 = zeros(nc);
    double *dy = zeros(nc), *dqkv = zeros(nc * 3), *dln1 = zeros(nc), *dres1 = zeros(nc);
    r->dx = zeros(nc);
    ref_linear_bwd(da, g[LT_P2_W], g[LT_P2_B], dres, r->a, p[LT_P2_W], N, FF, C);
    ref_gelu_bwd(dh, da, r->h, (size_t)N * FF);
    ref_linear_bwd(dln2, g[LT_FC_W], g[LT_FC_B], dh, r->ln2, p[LT_FC_W], N, C, FF);
    memcpy(dres1, dres, nc * sizeof(double));
    ref_layernorm_bwd(dres1, g[LT_LN2_W], g[LT_LN2_B], dln2, r->res1, p[LT_LN2_W], r->m2, r->s2,
                      N, C);
    ref_linear_bwd(dy, g[LT_PROJ_W], g[LT_PROJ_B], dres1, r->y, p[LT_PROJ_W], N, C, C);
    ref_attention_bwd(dqkv, dy, r->qkv, r->att, B, T, C, H);
    ref_linear_bwd(dln1, g[LT_QKV_W], g[LT_QKV_B], dqkv, r->ln1, p[LT_QKV_W], N, C, 3 * C);
    memcpy(r->dx, dres1, nc * sizeof(double));
    ref_layernorm_bwd(r->dx, g[LT_LN1_W], g[LT_LN1_B], dln1, r->x, p[LT_LN1_W], r->m1, r->s1, N,
                      C);
}

/* Layer 0 of the stage run forward by the generated code on this rank's slab of x_sm: this
** rank's shards of w written into the layer's tensors, x into the chunk's input, as the program
** holds them. 'wrong': an LT row given the next tp rank's shard instead (the control), or -1. */
static void layer_run_fwd(const layer_w *w, const double *x_sm, int wrong)
{
    void *const *p = gpt_params(CHUNK, 0);
    for (int i = 0; i < NLT; i++) {
        size_t n;
        double *s = shard(i, w->t[i], (gpt.tp_rank + (i == wrong)) % TP, &n);
        put(p[LT[i].field], s, n);
        free(s);
    }
    put(gpt_x(CHUNK, SLOT), x_sm + (size_t)r0 * C, (size_t)NSP * C);
    layer_fwd(CHUNK, SLOT, 0, 0);
}

/*
** Forward: every activation the generated layer keeps in its slot for the backward, each
** region's output among them (c_attn and c_fc column-parallel on the gathered LayerNorm
** outputs; res1 and res2 after the row-parallel c_proj's reduction), and the output res2.
** Backward from d(res2) in the chunk's dy: every tensor's gradient (sequence-parallel ones
** summed over tp as the step does) and d(x), which layer_bwd leaves in dy.
*/
static int test_layer(void)
{
    const int t = gpt.tp_rank;
    layer_w w = layer_weights();
    double *x_sm = rnd((size_t)N * C, 83, 0, 1);
    layer_ref r;
    layer_ref_fwd(&r, &w, x_sm);
    layer_run_fwd(&w, x_sm, -1);
    void *const *a = gpt_acts(CHUNK, SLOT, 0);
    check_slab("layer.ln_1", a[GPT_M_L_LN1], r.ln1, C);
    check_slab("layer.ln_1.mean", a[GPT_M_L_LN1_MEAN], r.m1, 1);
    check_slab("layer.ln_1.rstd", a[GPT_M_L_LN1_RSTD], r.s1, 1);
    check("layer.c_attn (column-parallel)", a[GPT_M_L_QKV],
          qkv_cols(to_seq(r.qkv, 3 * C), N, t), (size_t)N * 3 * CL);
    check("layer.attention (local heads)", a[GPT_M_L_ATTY],
          block(to_seq(r.y, C), C, 0, t * CL, N, CL), (size_t)N * CL);
    check_slab("layer.res1 (row-parallel c_proj + x)", a[GPT_M_L_RES1], r.res1, C);
    check_slab("layer.ln_2", a[GPT_M_L_LN2], r.ln2, C);
    check_slab("layer.ln_2.mean", a[GPT_M_L_LN2_MEAN], r.m2, 1);
    check_slab("layer.ln_2.rstd", a[GPT_M_L_LN2_RSTD], r.s2, 1);
    check("layer.c_fc (column-parallel)", a[GPT_M_L_FC],
          block(to_seq(r.h, FF), FF, 0, t * FFL, N, FFL), (size_t)N * FFL);
    check("layer.gelu", a[GPT_M_L_GELU], block(to_seq(r.a, FF), FF, 0, t * FFL, N, FFL),
          (size_t)N * FFL);
    check_slab("layer.res2 (row-parallel c_proj + res1)", a[GPT_M_L_RES2], r.res2, C);
    int failed = verdict("layer-fwd");

    double *dres_sm = rnd((size_t)N * C, 84, 0, 1);
    layer_ref_bwd(&r, &w, to_batch(dres_sm, C));
    begin_step(NULL, NULL);
    put(gpt_dy(CHUNK, SLOT), dres_sm + (size_t)r0 * C, (size_t)NSP * C);
    layer_bwd(CHUNK, SLOT, 0);
    sp_grads_reduce();
    float *const *dw = gpt_grads(CHUNK, 0);
    for (int i = 0; i < NLT; i++) {
        size_t n;
        double *want = shard(i, r.dw.t[i], t, &n);   /* the unsplit gradient, sharded */
        check(LT[i].name, dw[LT[i].field], want, n);
        free(want);
    }
    check_slab("layer.dx", gpt_dy(CHUNK, SLOT), r.dx, C);
    return failed + verdict("layer-bwd");
}

/* -- Control: the checks can fail ------------------------------------------------------------- */

/*
** The generated layer run with c_fc's shard of the next tp rank (its columns then no longer
** meet this rank's rows of c_proj) must not match the reference's res2. (Every tensor's shard
** of the next rank would not do: that only permutes the ranks' work, and the sum is right.)
*/
static int test_control(void)
{
    layer_w w = layer_weights();
    double *x_sm = rnd((size_t)N * C, 83, 0, 1);
    layer_ref r;
    layer_ref_fwd(&r, &w, x_sm);
    layer_run_fwd(&w, x_sm, LT_FC_W);
    quiet = 1;
    check_slab("control", gpt_acts(CHUNK, SLOT, 0)[GPT_M_L_RES2], r.res2, C);
    quiet = 0;
    long caught = bad;
    bad = 0;
    worst = 0.0;
    if (!caught) bad = 1;   /* a check that cannot fail is a failure */
    return verdict("control-wrong-shard-is-caught");
}

/* The stage set up as gpt_main does (lib/train.c): the groups, then every buffer of the
** layout's memory plan (parameters, gradients, activation slots, scratch). */
int main(int argc, char **argv)
{
    rt_init(&argc, &argv, CFG_WORLD, CFG_LAYOUT);
    RT_CHECK(CFG_TP > 1 && CFG_DP == 1 && CFG_PP == 1 && CFG_ACT == RT_F32, "t_regions needs "
             "a TP > 1, DP 1, PP 1, f32 layout (built for %s)", CFG_LAYOUT);
    tag = argc > 1 ? argv[1] : CFG_LAYOUT;
    gpt.prog = &gpt_program_desc;
    gpt.d = gpt_program_desc.dims;
    lib_groups_create(&gpt_program_desc);
    gpt.stage = gpt_program_desc.stages[gpt.pp_rank];
    lib_stage_setup();
    /* the slot's dy is a gradient buffer while a schedule row runs; here, all along */
    gpt_sched_bind(&(gpt_sched_step){ .kind = GPT_STEP_B, .chunk = CHUNK, .slot = SLOT,
                                      .dy = 0 });
    r0 = SP ? gpt.tp_rank * NSP : 0;
    int failed = test_column() + test_row() + test_seq_regions() + test_embedding() +
                 test_cross_entropy() + test_layer() + test_control();
    rt_finalize();
    return failed ? 1 : 0;
}
