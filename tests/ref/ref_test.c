/*
** ref_test.c: build/ref/ref_test, the reference's own checks, one per subcommand, driven by
** tests/refcheck/suite.sh. "ref_test NAME [DIR]" exits 0 when the check holds; otherwise it
** prints details and then, as its last line, why it failed, and exits 1. "ref_test mkbad KIND
** FILE" writes a deliberately broken input file for the error-message tests. Not a harness for
** other suites: kernel tests link build/ref/libref.a directly.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_ref.h"   // defines: ref_model, ref_forward, ref_compute_grads, ref_adamw_update
#include "ref_io.h"     // defines: ref_st_open, ref_st_read, ref_model_save, ref_data_load

/* -- Helpers ---------------------------------------------------------------------------------- */

static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    return 1;
}

/* |got - want| <= tol * |want|, or <= tol when want is 0. */
static int close_rel(double got, double want, double tol)
{
    double scale = fabs(want) > 0 ? fabs(want) : 1.0;
    return fabs(got - want) <= tol * scale;
}

static char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ref_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (fp == NULL)
        return fail("cannot write %s", path);
    int bad = fwrite(p, 1, n, fp) != n;
    bad |= fclose(fp) != 0;
    return bad ? fail("write to %s failed", path) : 0;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = ref_xmalloc((size_t)size + 1);
    *n = fread(b, 1, (size_t)size, fp);
    fclose(fp);
    return b;
}

/* A safetensors file written byte by byte by the test itself, independent of ref_st_write:
** each tensor's raw little-endian bytes are given as they should appear in the file. */
typedef struct raw_tensor {
    const char *name, *dtype, *shape;   /* shape as JSON text, e.g. "[2,3]" */
    const unsigned char *bytes;
    size_t nbytes;
} raw_tensor;

static int write_raw_st(const char *path, const raw_tensor *t, int n)
{
    char header[8192];
    size_t h = 0, off = 0;
    h += (size_t)snprintf(header + h, sizeof header - h, "{");
    for (int i = 0; i < n; i++) {
        h += (size_t)snprintf(header + h, sizeof header - h,
                              "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, "
                              "\"data_offsets\": [%zu, %zu]}", i ? ", " : "", t[i].name,
                              t[i].dtype, t[i].shape, off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    h += (size_t)snprintf(header + h, sizeof header - h, "}");
    while (h % 8)
        header[h++] = ' ';
    size_t total = 8 + h + off;
    unsigned char *buf = ref_xmalloc(total);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    off = 8 + h;
    for (int i = 0; i < n; i++) {
        memcpy(buf + off, t[i].bytes, t[i].nbytes);
        off += t[i].nbytes;
    }
    int rc = write_bytes(path, buf, total);
    free(buf);
    return rc;
}

/* Fill every parameter with a random value of useful size for checks that need all paths
** active: 2-D weights N(0, 0.4), biases N(0, 0.1), LayerNorm weights 1 + N(0, 0.2). */
static void fill_lively(ref_model *m, uint64_t seed)
{
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *t = &m->tensors[i];
        double std = t->ndim == 2 ? 0.4 : 0.1;
        double base = t->init == REF_INIT_ONE ? 1.0 : 0.0;
        if (t->init == REF_INIT_ONE)
            std = 0.2;
        for (size_t e = 0; e < t->numel; e++)
            m->params[t->offset + e] = base + std * ref_rng_normal(seed, t->name, e);
    }
}

/* Four sequences of five tokens (vocab 11) and their targets: the batch of the checks that
** train or differentiate a small model in micro-batches of two. */
static const int seq_inputs[20] = {3, 1, 4, 1, 5, 2, 6, 5, 7, 0, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9};
static const int seq_targets[20] = {1, 4, 1, 5, 9, 6, 5, 8, 0, 10, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};

/* -- gradcheck: every parameter's gradient against central differences ------------------------ */

/* FNV-1a over every routing decision (expert choice and drop) of every layer of the last
** forward, continuing from h; 0 changes for a dense model. */
static uint64_t routing_hash(const ref_model *m, const ref_acts *a, uint64_t h)
{
    if (m->cfg.moe.experts == 0)
        return h;
    size_t nk = (size_t)a->B * m->cfg.seq * m->cfg.moe.top_k;
    for (int l = 0; l < m->cfg.layers; l++) {
        const ref_moe_acts *ma = &a->layer[l].moe;
        for (size_t i = 0; i < nk; i++)
            h = (h ^ (uint64_t)(2 * ma->sel[i] + ma->keep[i])) * 1099511628211ULL;
    }
    return h;
}

/* The objective ref_compute_grads differentiates over n sequences in micro-batches of a->B:
** mean cross-entropy + (1/micro-batches) * sum of the micro-batches' aux losses. *route (may
** be NULL) gets the routing hash of all the forwards. */
static double objective(const ref_model *m, ref_acts *a, const int *in, const int *tg, int n,
                        uint64_t *route)
{
    double ce = 0.0, aux = 0.0;
    uint64_t h = 14695981039346656037ULL;
    for (int s = 0; s < n; s += a->B) {
        ce += ref_forward(m, a, in + (size_t)s * m->cfg.seq, tg + (size_t)s * m->cfg.seq);
        aux += a->aux;
        h = routing_hash(m, a, h);
    }
    if (route != NULL)
        *route = h;
    return ce / ((double)n * m->cfg.seq) + aux / (double)(n / a->B);
}

/* Bound of every finite-difference comparison: |analytic - fd| <= FD_RTOL |fd| + FD_ATOL with
** central differences of step FD_H. Truncation is O(h^2) ~ 1e-10 relative and rounding
** ~ 1e-16/h ~ 1e-11 absolute, far inside the bound; a real error in a backward formula is
** O(1) relative. */
#define FD_H 1e-5
#define FD_RTOL 1e-6
#define FD_ATOL 1e-9

typedef struct fd_tally {
    int bad, checked, skipped;
} fd_tally;

/* Compare one element; prints the first 10 failures. Returns err / bound. */
static double fd_compare(fd_tally *t, const char *name, size_t e, double g, double fd)
{
    double err = fabs(g - fd), lim = FD_RTOL * fabs(fd) + FD_ATOL;
    if (err > lim && t->bad++ < 10)
        printf("  %s[%zu]: analytic %.12g, finite difference %.12g\n", name, e, g, fd);
    t->checked++;
    return err / lim;
}

/*
** Every element of every tensor of m against central differences of 'objective' over the n
** sequences (inputs, targets). An element whose +-h perturbation changes any routing decision
** is skipped (the objective is only piecewise smooth there) and counted in t->skipped. A tensor
** whose gradients are all below 1e-6 is a failure (a dead path). Leaves m->grads set.
*/
static void gradcheck_model(fd_tally *t, ref_model *m, ref_acts *a, const int *in,
                            const int *tg, int n)
{
    ref_compute_grads(m, a, in, tg, n, NULL);
    double *an = ref_xmalloc(m->nparams * sizeof(double));
    memcpy(an, m->grads, m->nparams * sizeof(double));
    uint64_t route0, route_p, route_m;
    objective(m, a, in, tg, n, &route0);
    for (int ti = 0; ti < m->ntensors; ti++) {
        const ref_tensor *te = &m->tensors[ti];
        double worst = 0.0, gmax = 0.0;
        for (size_t e = 0; e < te->numel; e++) {
            double *p = &m->params[te->offset + e], p0 = *p;
            *p = p0 + FD_H;
            double lp = objective(m, a, in, tg, n, &route_p);
            *p = p0 - FD_H;
            double lm = objective(m, a, in, tg, n, &route_m);
            *p = p0;
            double g = an[te->offset + e];
            gmax = fmax(gmax, fabs(g));
            if (route_p != route0 || route_m != route0) {
                t->skipped++;
                continue;
            }
            worst = fmax(worst, fd_compare(t, te->name, e, g, (lp - lm) / (2 * FD_H)));
        }
        if (gmax < 1e-6) {
            printf("  %s: every gradient is below 1e-6 (max %.3g): a path is dead\n", te->name,
                   gmax);
            t->bad++;
        }
        if (worst > 1.0)
            printf("  %s: worst error %.3g x the bound\n", te->name, worst);
    }
    free(an);
}

/*
** Tiny model (2 layers, C=8, 2 heads, T=5, V=11, F=32), 2 sequences as 2 micro-batches of 1
** (so accumulation and the 1/(tokens) scale are covered). Every element of every tensor within
** the FD bound above. Tokens 8..10 never appear as inputs, so their wte rows are reached only
** through the tied head; rows 0..7 through both uses.
*/
static int test_gradcheck(void)
{
    ref_config cfg = {.layers = 2, .hidden = 8, .heads = 2, .seq = 5, .vocab = 11, .ffn = 32,
                      .ln_eps = 1e-5};
    const int inputs[10] = {3, 1, 4, 1, 5, 2, 6, 5, 7, 0};
    const int targets[10] = {1, 4, 1, 5, 9, 6, 5, 8, 0, 10};
    ref_model *m = ref_model_new(&cfg);
    ref_acts *a = ref_acts_new(&cfg, 1);
    fill_lively(m, 42);
    fd_tally t = {0};
    gradcheck_model(&t, m, a, inputs, targets, 2);
    ref_acts_free(a, &cfg);
    ref_model_free(m);
    if (t.bad)
        return fail("%d of %d gradient elements off (bound 1e-6 rel + 1e-9 abs)", t.bad,
                    t.checked);
    return 0;
}

/* -- Optimizer: AdamW, learning rate, clipping ------------------------------------------------ */

/* Scalars worked by hand (decimal arithmetic, 40 digits) from torch.optim.AdamW's update. */
static int test_adamw(void)
{
    int bad = 0;
    /* A: p=1, lr=0.1, wd=0.1, betas (0.9, 0.95), eps 1e-8, grads 0.5 then -0.25.
    ** t=1: p=0.99; m=0.05, v=0.0125; m_hat=0.5, v_hat=0.25; p = 0.99 - 0.1*0.5/(0.5+1e-8). */
    double p = 1.0, g = 0.5, mm = 0.0, vv = 0.0;
    ref_adamw_update(&p, &g, &mm, &vv, 1, 0.1, 0.9, 0.95, 1e-8, 0.1, 1);
    if (!close_rel(p, 0.89000000199999996000000080, 1e-15))
        bad += fail("  A t=1: p = %.17g, want 0.890000001999999960", p);
    /* t=2: p*=0.99; m=0.02, v=0.015; m_hat=0.02/0.19, v_hat=0.015/0.0975. */
    g = -0.25;
    ref_adamw_update(&p, &g, &mm, &vv, 1, 0.1, 0.9, 0.95, 1e-8, 0.1, 2);
    if (!close_rel(p, 0.85426305785582739121899646, 1e-15))
        bad += fail("  A t=2: p = %.17g, want 0.854263057855827391", p);
    if (!close_rel(mm, 0.02, 1e-15) || !close_rel(vv, 0.015, 1e-15))
        bad += fail("  A t=2: m = %.17g (want 0.02), v = %.17g (want 0.015)", mm, vv);
    /* B: eps goes after the square root: g=1e-8 at t=1 gives m_hat=1e-8, sqrt(v_hat)=1e-8, so
    ** the step is lr * 1e-8/(1e-8 + 1e-8) = lr/2 (inside the root it would be ~1e-4 lr). */
    p = 0.0, g = 1e-8, mm = 0.0, vv = 0.0;
    ref_adamw_update(&p, &g, &mm, &vv, 1, 1.0, 0.9, 0.95, 1e-8, 0.0, 1);
    if (!close_rel(p, -0.5, 1e-12))
        bad += fail("  B (eps placement): p = %.17g, want -0.5", p);
    /* C: decay before the Adam step, on the old p: p = 2*(1-0.25) - 0.5*1/(1+1e-8)
    ** = 1.000000005 (decaying after the step would give 1.125). */
    p = 2.0, g = 1.0, mm = 0.0, vv = 0.0;
    ref_adamw_update(&p, &g, &mm, &vv, 1, 0.5, 0.9, 0.95, 1e-8, 0.5, 1);
    if (!close_rel(p, 1.00000000499999995000000050, 1e-15))
        bad += fail("  C (decay order): p = %.17g, want 1.000000005", p);

    /* D: which tensors decay. With zero gradients the Adam step is 0, so only the decay moves
    ** a parameter: 2-D weights and embeddings scale by 1 - lr*wd, biases and LN stay. */
    ref_config cfg = {.layers = 2, .hidden = 4, .heads = 2, .seq = 3, .vocab = 5, .ffn = 16,
                      .ln_eps = 1e-5};
    ref_model *m = ref_model_new(&cfg);
    fill_lively(m, 3);
    double *before = ref_xmalloc(m->nparams * sizeof(double));
    memcpy(before, m->params, m->nparams * sizeof(double));
    ref_optim o = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .wd = 0.1};
    ref_optimizer_step(m, &o, 0.1);
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *t = &m->tensors[i];
        const char *n = t->name;
        size_t len = strlen(n);
        int want_decay = strcmp(n, "wte.weight") == 0 || strcmp(n, "wpe.weight") == 0 ||
                         (len > 7 && strcmp(n + len - 7, ".weight") == 0 &&
                          (strstr(n, ".c_attn.") || strstr(n, ".c_proj.") || strstr(n, ".c_fc.")));
        for (size_t e = 0; e < t->numel; e++) {
            double want = before[t->offset + e] * (want_decay ? 0.99 : 1.0);
            if (!close_rel(m->params[t->offset + e], want, 1e-15)) {
                bad += fail("  D: %s[%zu] = %.17g, want %.17g (%s)", n, e,
                            m->params[t->offset + e], want, want_decay ? "decay" : "no decay");
                break;
            }
        }
    }
    free(before);
    ref_model_free(m);
    return bad ? fail("%d AdamW value(s) differ from the hand-computed ones", bad) : 0;
}

static int test_lr(void)
{
    /* Megatron's schedule: step t runs at the rate for n = t - 1 completed steps */
    const ref_optim cos10 = {.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110};
    const ref_optim cos0 = {.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 4};
    const ref_optim isq = {.lr = 1.0, .min_lr = 0.1, .warmup = 4, .decay_steps = 1000,
                           .style = REF_LR_INVERSE_SQRT};
    const ref_optim wsd = {.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 10,
                           .style = REF_LR_WSD, .wsd_steps = 4, .gbs = 3};
    ref_optim wsd_lin = wsd, wsd_cos = wsd, wsd_sqrt = wsd;
    wsd_lin.wsd_style = REF_WSD_LINEAR;
    wsd_cos.wsd_style = REF_WSD_COSINE;
    wsd_sqrt.wsd_style = REF_WSD_MINUS_SQRT;
    struct {
        ref_optim o;
        int t;
        double want;
    } cases[] = {
        /* warm-up 10 from 0, cosine to 0.1 after 110 steps: the first step runs at 0 */
        {cos10, 1, 0.0},
        {cos10, 6, 0.5},
        {cos10, 11, 1.0},
        {cos10, 36, 0.86819805153394638598037996},      /* 0.1 + 0.45 (1 + cos(pi/4)) */
        {cos10, 61, 0.55},
        {cos10, 86, 0.23180194846605361401962004},      /* 0.1 + 0.45 (1 - cos(pi/4)) */
        {cos10, 111, 0.1},
        {cos10, 112, 0.1},
        {cos10, 5000, 0.1},
        /* warm-up from --lr-warmup-init 0.2 */
        {{.lr = 1.0, .lr_init = 0.2, .warmup = 4, .decay_steps = 8}, 1, 0.2},
        {{.lr = 1.0, .lr_init = 0.2, .warmup = 4, .decay_steps = 8}, 3, 0.6},
        /* no warm-up: the first step runs at lr, the 5th (n = 4) at min_lr */
        {cos0, 1, 1.0},
        {cos0, 2, 0.85355339059327376220042218},        /* 0.5 (1 + cos(pi/4)) */
        {cos0, 3, 0.5},
        {cos0, 4, 0.14644660940672623779957782},
        {cos0, 5, 0.0},
        {cos0, 6, 0.0},
        /* decay_steps == warmup: warm-up, then min_lr at once */
        {{.lr = 6e-4, .min_lr = 6e-5, .warmup = 3, .decay_steps = 3}, 4, 6e-4},
        {{.lr = 6e-4, .min_lr = 6e-5, .warmup = 3, .decay_steps = 3}, 5, 6e-5},
        /* constant after the warm-up, past decay_steps too; linear */
        {{.lr = 1.0, .warmup = 2, .decay_steps = 4, .style = REF_LR_CONSTANT}, 2, 0.5},
        {{.lr = 1.0, .warmup = 2, .decay_steps = 4, .style = REF_LR_CONSTANT}, 100, 1.0},
        {{.lr = 1.0, .decay_steps = 4, .style = REF_LR_LINEAR}, 2, 0.75},
        {{.lr = 1.0, .decay_steps = 4, .style = REF_LR_LINEAR}, 6, 0.0},
        /* inverse square root: lr sqrt(W / n), floored at min_lr, min_lr after decay_steps */
        {isq, 5, 1.0},
        {isq, 17, 0.5},
        {isq, 101, 0.2},
        {isq, 901, 0.1},                                /* 2/30 < min_lr */
        {isq, 1002, 0.1},
        /* ... without warm-up, in samples: lr / sqrt(n G) (Megatron's max(W, 1) = 1 sample) */
        {{.lr = 1.0, .decay_steps = 100, .style = REF_LR_INVERSE_SQRT, .gbs = 4}, 1, 1.0},
        {{.lr = 1.0, .decay_steps = 100, .style = REF_LR_INVERSE_SQRT, .gbs = 4}, 2, 0.5},
        {{.lr = 1.0, .decay_steps = 100, .style = REF_LR_INVERSE_SQRT, .gbs = 4}, 5, 0.25},
        /* WSD over 10 steps, the last 4 decaying: stable to n = 6, then q = (n - 6) / 4 */
        {wsd, 7, 1.0},
        {wsd, 8, 0.68179283050742908606225095},         /* 2 * 0.5^0.25 - 1 */
        {wsd, 11, 0.0},
        {wsd_lin, 9, 0.5},
        {wsd_cos, 9, 0.5},
        {wsd_cos, 8, 0.85355339059327376220042218},
        {wsd_sqrt, 8, 0.5},
        {wsd_sqrt, 12, 0.0},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = ref_lr(&cases[i].o, cases[i].t);
        double tol = cases[i].want == 0.0 ? 0.0 : 1e-15;
        if (!(fabs(got - cases[i].want) <= tol * fabs(cases[i].want) + 1e-17))
            bad += fail("  case %zu (style %d, warmup %d, decay %d) t=%d: got %.17g, want %.17g",
                        i, (int)cases[i].o.style, cases[i].o.warmup, cases[i].o.decay_steps,
                        cases[i].t, got, cases[i].want);
    }
    return bad ? fail("%d learning rate(s) wrong", bad) : 0;
}

static int test_clip(void)
{
    ref_config cfg = {.layers = 1, .hidden = 4, .heads = 1, .seq = 2, .vocab = 3, .ffn = 4,
                      .ln_eps = 1e-5};
    ref_model *m = ref_model_new(&cfg);
    size_t i3 = 1, i4 = m->nparams - 1;     /* one element in wte, one in ln_f.bias */
    struct {
        double clip;
        int clipped;
        double g3, g4;
    } cases[] = {
        {1.0, 1, 0.59999988000002399999520000, 0.79999984000003199999360000},  /* 1/(5+1e-6) */
        {5.0, 1, 2.99999940000011999997600000, 3.99999920000015999996800000},  /* norm==clip */
        {10.0, 0, 3.0, 4.0},
        {0.0, 0, 3.0, 4.0},                                                      /* disabled */
    };
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(m->grads, 0, m->nparams * sizeof(double));
        m->grads[i3] = 3.0;
        m->grads[i4] = 4.0;
        double norm = ref_grad_norm(m);
        if (norm != 5.0)
            bad += fail("  grad norm of (3, 4) is %.17g, want 5", norm);
        int clipped = ref_clip_grads(m, cases[c].clip, norm);
        double rest = 0.0;
        for (size_t i = 0; i < m->nparams; i++)
            if (i != i3 && i != i4)
                rest += fabs(m->grads[i]);
        if (clipped != cases[c].clipped || !close_rel(m->grads[i3], cases[c].g3, 1e-15) ||
            !close_rel(m->grads[i4], cases[c].g4, 1e-15) || rest != 0.0)
            bad += fail("  clip %g: clipped=%d grads (%.17g, %.17g), want %d (%.17g, %.17g)",
                        cases[c].clip, clipped, m->grads[i3], m->grads[i4], cases[c].clipped,
                        cases[c].g3, cases[c].g4);
    }
    ref_model_free(m);
    return bad ? fail("%d clipping case(s) wrong", bad) : 0;
}

/* -- Initialisation --------------------------------------------------------------------------- */

/* Distribution and constants of every tensor of a randomly initialised 4-layer model:
** float32 values; LN and biases exact; mean, std (0.02, or 0.02/sqrt(8) for out-projections)
** and the mass within one sigma within 5 standard errors. Returns the number of failures. */
static int check_init_values(const ref_model *m)
{
    int bad = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *t = &m->tensors[i];
        const double *p = m->params + t->offset;
        double sum = 0, sq = 0, want_std = 0;
        size_t within = 0;
        for (size_t e = 0; e < t->numel; e++) {
            sum += p[e];
            sq += p[e] * p[e];
            if ((double)(float)p[e] != p[e]) {
                bad += fail("  %s[%zu] = %.17g is not a float32 value", t->name, e, p[e]);
                break;
            }
        }
        double mean = sum / t->numel, std = sqrt(sq / t->numel - mean * mean);
        if (t->init == REF_INIT_ONE || t->init == REF_INIT_ZERO) {
            double want = t->init == REF_INIT_ONE ? 1.0 : 0.0;
            for (size_t e = 0; e < t->numel; e++)
                if (p[e] != want) {
                    bad += fail("  %s[%zu] = %g, want %g", t->name, e, p[e], want);
                    break;
                }
            continue;
        }
        want_std = t->init == REF_INIT_OUT_PROJ ? 0.02 / sqrt(8.0) : 0.02;
        for (size_t e = 0; e < t->numel; e++)
            within += fabs(p[e]) < want_std;
        double frac = (double)within / t->numel, se = 1.0 / sqrt((double)t->numel);
        /* 5 standard errors: mean, std (relative se ~ 1/sqrt(2n)), mass within one sigma */
        if (fabs(mean) > 5 * want_std * se || fabs(std / want_std - 1) > 5 * se / sqrt(2.0) ||
            fabs(frac - 0.682689492) > 5 * 0.466 * se)
            bad += fail("  %s: mean %.3g std %.5g (want %.5g), %.4f within 1 sigma", t->name,
                        mean, std, want_std, frac);
        if (t->numel > 1 && p[0] == p[1])
            bad += fail("  %s: first two elements equal", t->name);
    }
    return bad;
}

static int test_init(void)
{
    ref_config cfg = {.layers = 4, .hidden = 64, .heads = 4, .seq = 64, .vocab = 256,
                      .ffn = 256, .ln_eps = 1e-5};
    ref_config cfg2 = cfg;
    cfg2.layers = 2;
    ref_model *m = ref_model_new(&cfg), *m2 = ref_model_new(&cfg2), *m3 = ref_model_new(&cfg);
    ref_model_init_random(m, 7);
    ref_model_init_random(m2, 7);
    ref_model_init_random(m3, 8);
    int bad = check_init_values(m);
    /* element values depend on (seed, name, index) only: wte is the same at 2 and 4 layers */
    const ref_tensor *w = ref_model_find(m, "wte.weight"), *w2 = ref_model_find(m2, "wte.weight");
    if (memcmp(m->params + w->offset, m2->params + w2->offset, w->numel * sizeof(double)) != 0)
        bad += fail("  wte differs between a 2-layer and a 4-layer model of the same seed");
    if (m->params[w->offset + 5] != (double)(float)(0.02 * ref_rng_normal(7, "wte.weight", 5)))
        bad += fail("  wte[5] is not 0.02 * ref_rng_normal(7, \"wte.weight\", 5)");
    if (memcmp(m->params, m3->params, w->numel * sizeof(double)) == 0)
        bad += fail("  seeds 7 and 8 give the same wte");
    /* a mixture of experts shaped like models/tiny_moe.lua (biases on): the router and c_fc
    ** N(0,0.02), expert c_proj N(0,0.02/sqrt(2L)), biases 0; shared tensors as the dense
    ** model's */
    ref_config mcfg = cfg;
    mcfg.moe = (ref_moe_config){.experts = 8, .top_k = 2, .ffn = 128, .bias = 1};
    ref_model *mm = ref_model_new(&mcfg);
    ref_model_init_random(mm, 7);
    bad += check_init_values(mm);
    const ref_tensor *wm = ref_model_find(mm, "wte.weight");
    if (memcmp(m->params + w->offset, mm->params + wm->offset, w->numel * sizeof(double)) != 0)
        bad += fail("  wte differs between the dense and the MoE model of the same seed");
    const ref_tensor *pj = ref_model_find(mm, "h.3.mlp.experts.5.c_proj.weight");
    const ref_tensor *rt = ref_model_find(mm, "h.2.mlp.router.weight");
    if (pj == NULL || pj->init != REF_INIT_OUT_PROJ || rt == NULL || rt->init != REF_INIT_NORMAL ||
        mm->params[pj->offset + 3] != (double)(float)(0.02 / sqrt(8.0) *
                                       ref_rng_normal(7, "h.3.mlp.experts.5.c_proj.weight", 3)))
        bad += fail("  expert c_proj / router init kinds or values are wrong");
    ref_model_free(mm);
    ref_model_free(m);
    ref_model_free(m2);
    ref_model_free(m3);
    return bad ? fail("%d initialisation check(s) failed", bad) : 0;
}

/* -- Gradient accumulation -------------------------------------------------------------------- */

/* Train 5 steps with global batch 4 as mbs x nmb = 4x1, 1x4 and 2x2 from the same weights:
** the same mean loss, so the same steps up to rounding; we ask for 1e-12. */
static int test_accum(void)
{
    ref_config cfg = {.layers = 2, .hidden = 16, .heads = 2, .seq = 8, .vocab = 32, .ffn = 64,
                      .ln_eps = 1e-5};
    ref_optim o = {.lr = 1e-2, .min_lr = 1e-3, .warmup = 2, .decay_steps = 5, .beta1 = 0.9,
                   .beta2 = 0.95, .eps = 1e-8, .wd = 0.1, .clip = 1.0};
    ref_data d = {0};
    d.seq = cfg.seq;
    d.ntokens = 200;
    d.nsamples = (d.ntokens - 1) / d.seq;
    d.tokens = ref_xmalloc(d.ntokens * sizeof(uint16_t));
    for (size_t i = 0; i < d.ntokens; i++)
        d.tokens[i] = (uint16_t)((i * 7 + (i / 5) * 3) % cfg.vocab);
    const int mbs[3] = {4, 1, 2};
    ref_model *m[3];
    double loss[3][5];
    int in[4 * 8], tg[4 * 8];
    for (int r = 0; r < 3; r++) {
        m[r] = ref_model_new(&cfg);
        ref_model_init_random(m[r], 11);
        ref_acts *a = ref_acts_new(&cfg, mbs[r]);
        for (int s = 0; s < 5; s++) {
            ref_data_batch(&d, s, 4, in, tg);
            loss[r][s] = ref_train_step(m[r], a, &o, in, tg, 4).loss;
        }
        ref_acts_free(a, &cfg);
    }
    int bad = 0;
    for (int r = 1; r < 3; r++) {
        for (int s = 0; s < 5; s++)
            if (!close_rel(loss[r][s], loss[0][s], 1e-12))
                bad += fail("  step %d: loss %.17g (mbs %d) vs %.17g (mbs 4)", s + 1, loss[r][s],
                            mbs[r], loss[0][s]);
        double maxdiff = 0.0;
        for (size_t i = 0; i < m[0]->nparams; i++)
            maxdiff = fmax(maxdiff, fabs(m[r]->params[i] - m[0]->params[i]));
        if (maxdiff > 1e-12)
            bad += fail("  mbs %d x nmb %d: weights differ by up to %.3g after 5 steps", mbs[r],
                        4 / mbs[r], maxdiff);
    }
    if (!(loss[0][4] < loss[0][0]))
        bad += fail("  the loss did not fall (%.6g -> %.6g)", loss[0][0], loss[0][4]);
    for (int r = 0; r < 3; r++)
        ref_model_free(m[r]);
    free(d.tokens);
    return bad ? fail("gradient accumulation is not exact to 1e-12") : 0;
}

/* -- safetensors ------------------------------------------------------------------------------ */

static int test_st_roundtrip(const char *dir)
{
    ref_config cfg = {.layers = 2, .hidden = 8, .heads = 2, .seq = 4, .vocab = 10, .ffn = 24,
                      .ln_eps = 1e-5};
    char *pa = path_in(dir, "rt_a.safetensors"), *pb = path_in(dir, "rt_b.safetensors");
    char *ptmp = path_in(dir, "rt_a.safetensors.tmp");
    ref_model *m = ref_model_new(&cfg), *m2 = ref_model_new(&cfg);
    ref_model_init_random(m, 5);
    for (size_t i = 0; i < m->nparams; i++)   /* non-trivial LN and bias values too */
        m->params[i] += (float)(0.25 * ref_rng_normal(9, "offset", i));
    int bad = 0;
    if (ref_model_save(m, pa) < 0 || ref_model_load(m2, pa) < 0)
        return fail("could not write or read %s", pa);
    for (size_t i = 0; i < m->nparams && !bad; i++)
        if (m2->params[i] != (double)(float)m->params[i])
            bad += fail("  element %zu: read %.17g, wrote %.17g", i, m2->params[i],
                        m->params[i]);
    if (ref_model_save(m2, pb) < 0)
        return fail("could not write %s", pb);
    size_t na, nb;
    unsigned char *a = slurp(pa, &na), *b = slurp(pb, &nb);
    if (a == NULL || b == NULL || na != nb || memcmp(a, b, na) != 0)
        bad += fail("  saving the loaded model does not give the same bytes");
    FILE *tmp = fopen(ptmp, "rb");
    if (tmp != NULL) {
        fclose(tmp);
        bad += fail("  %s left behind", ptmp);
    }
    /* header: 8-byte length, a multiple of 8, metadata first, tensors in canonical order */
    size_t hlen = 0;
    for (int i = 7; a && i >= 0; i--)
        hlen = (hlen << 8) | a[i];
    if (a == NULL || hlen % 8 != 0 || 8 + hlen > na)
        bad += fail("  header length %zu is not a multiple of 8 within the file", hlen);
    else {
        const char *meta = "{\"__metadata__\":{\"format\":\"pt\"},\"wte.weight\":{\"dtype\":"
                           "\"F32\",\"shape\":[10,8],\"data_offsets\":[0,320]}";
        if (strncmp((const char *)a + 8, meta, strlen(meta)) != 0)
            bad += fail("  header does not start with %s", meta);
        a[8 + hlen - 1] = '\0';
        const char *prev = (const char *)a + 8;
        for (int i = 0; i < m->ntensors; i++) {
            char key[REF_NAME_MAX + 4];
            snprintf(key, sizeof key, "\"%s\"", m->tensors[i].name);
            const char *at = strstr((const char *)a + 8, key);
            if (at == NULL || at < prev)
                bad += fail("  tensor %s out of canonical order in the header", key);
            else
                prev = at;
        }
    }
    free(a);
    free(b);
    ref_model_free(m);
    ref_model_free(m2);
    free(pa);
    free(pb);
    free(ptmp);
    return bad ? fail("safetensors round trip failed") : 0;
}

/* Little-endian bytes of 16-bit patterns. */
static void le16(unsigned char *out, const uint16_t *v, int n)
{
    for (int i = 0; i < n; i++) {
        out[2 * i] = (unsigned char)(v[i] & 0xff);
        out[2 * i + 1] = (unsigned char)(v[i] >> 8);
    }
}

static int test_st_dtypes(const char *dir)
{
    char *p = path_in(dir, "dtypes.safetensors");
    /* F16: 1, -2, 0x3555 = 1365/4096, 2^-24 (smallest subnormal), 65504 (largest), -0 */
    const uint16_t f16[6] = {0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0x8000};
    const double f16_want[6] = {1.0, -2.0, 0.333251953125, 5.9604644775390625e-08, 65504.0, -0.0};
    /* BF16: 1, -5, 0.25, 0x4049 = 3.140625 */
    const uint16_t bf16[4] = {0x3f80, 0xc0a0, 0x3e80, 0x4049};
    const double bf16_want[4] = {1.0, -5.0, 0.25, 3.140625};
    /* F32 0x3dcccccd and F64 0x3fb999999999999a, little-endian */
    const unsigned char f32[4] = {0xcd, 0xcc, 0xcc, 0x3d};
    const unsigned char f64[8] = {0x9a, 0x99, 0x99, 0x99, 0x99, 0x99, 0xb9, 0x3f};
    unsigned char b16[12], bb[8];
    le16(b16, f16, 6);
    le16(bb, bf16, 4);
    raw_tensor t[4] = {
        {"half", "F16", "[2,3]", b16, 12},
        {"brain", "BF16", "[2,2]", bb, 8},
        {"single", "F32", "[1]", f32, 4},
        {"double", "F64", "[]", f64, 8},
    };
    if (write_raw_st(p, t, 4) != 0)
        return 1;
    ref_st_file f;
    if (ref_st_open(&f, p) < 0)
        return fail("could not open the hand-made file %s", p);
    int bad = 0;
    double got[6];
    const ref_st_tensor *h = ref_st_find(&f, "half"), *b = ref_st_find(&f, "brain");
    const ref_st_tensor *s = ref_st_find(&f, "single"), *d = ref_st_find(&f, "double");
    if (!h || !b || !s || !d || h->ndim != 2 || h->shape[1] != 3 || d->ndim != 0)
        bad += fail("  header entries or shapes not parsed");
    if (!bad && ref_st_read(&f, h, got) == 0) {
        for (int i = 0; i < 6; i++)
            if (got[i] != f16_want[i] || signbit(got[i]) != signbit(f16_want[i]))
                bad += fail("  F16 0x%04x read as %.17g, want %.17g", f16[i], got[i],
                            f16_want[i]);
    }
    if (!bad && ref_st_read(&f, b, got) == 0) {
        for (int i = 0; i < 4; i++)
            if (got[i] != bf16_want[i])
                bad += fail("  BF16 0x%04x read as %.17g, want %.17g", bf16[i], got[i],
                            bf16_want[i]);
    }
    if (!bad && ref_st_read(&f, s, got) == 0 && got[0] != 0.100000001490116119384765625)
        bad += fail("  F32 0x3dcccccd read as %.17g", got[0]);
    if (!bad && ref_st_read(&f, d, got) == 0 && got[0] != 0.1)
        bad += fail("  F64 0x3fb999999999999a read as %.17g", got[0]);
    ref_st_close(&f);

    /* a whole model stored as BF16 (wte), F16 (wpe) and F32 (the rest) loads exactly */
    ref_config cfg = {.layers = 1, .hidden = 4, .heads = 2, .seq = 3, .vocab = 5, .ffn = 8,
                      .ln_eps = 1e-5};
    ref_model *m = ref_model_new(&cfg), *m2 = ref_model_new(&cfg);
    fill_lively(m, 4);
    raw_tensor *rt = ref_xcalloc((size_t)m->ntensors, sizeof *rt);
    unsigned char *bytes = ref_xcalloc(m->nparams, 4);
    char (*shapes)[32] = ref_xcalloc((size_t)m->ntensors, 32);
    size_t off = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const ref_tensor *te = &m->tensors[i];
        double *v = m->params + te->offset;
        rt[i].name = te->name;
        rt[i].shape = shapes[i];
        if (te->ndim == 2)
            snprintf(shapes[i], 32, "[%ld,%ld]", te->shape[0], te->shape[1]);
        else
            snprintf(shapes[i], 32, "[%ld]", te->shape[0]);
        rt[i].bytes = bytes + off;
        for (size_t e = 0; e < te->numel; e++) {
            float x = (float)v[e];
            uint32_t bits;
            memcpy(&bits, &x, 4);
            if (i == 0) {               /* BF16: the top 16 bits of the float32 */
                uint16_t top = (uint16_t)(bits >> 16);
                uint32_t back = (uint32_t)top << 16;
                le16(bytes + off, &top, 1);
                off += 2;
                memcpy(&x, &back, 4);
                v[e] = x;
            } else if (i == 1) {        /* F16: round to k/256, |k| <= 512: exact in half */
                double q = fmax(-2.0, fmin(2.0, round(v[e] * 256) / 256));
                uint16_t hbits = q < 0 ? 0x8000 : 0;
                if (q != 0) {
                    int ex;
                    double frac = frexp(fabs(q), &ex);      /* |q| = frac 2^ex, frac in [.5,1) */
                    int mant = (int)((2 * frac - 1) * 1024);  /* |q| = (1 + mant/1024) 2^(ex-1) */
                    hbits |= (uint16_t)(((ex - 1 + 15) << 10) | mant);
                }
                le16(bytes + off, &hbits, 1);
                off += 2;
                v[e] = q;
            } else {                    /* F32 */
                for (int k = 0; k < 4; k++)
                    bytes[off + k] = (unsigned char)(bits >> (8 * k));
                off += 4;
                v[e] = x;
            }
        }
        rt[i].dtype = i == 0 ? "BF16" : i == 1 ? "F16" : "F32";
        rt[i].nbytes = (size_t)(bytes + off - rt[i].bytes);
    }
    char *pm = path_in(dir, "mixed.safetensors");
    if (write_raw_st(pm, rt, m->ntensors) != 0 || ref_model_load(m2, pm) < 0)
        bad += fail("  could not load the mixed-dtype model %s", pm);
    else
        for (size_t i = 0; i < m->nparams; i++)
            if (m2->params[i] != m->params[i]) {
                bad += fail("  mixed-dtype model: element %zu read %.17g, want %.17g", i,
                            m2->params[i], m->params[i]);
                break;
            }
    free(rt);
    free(bytes);
    free(shapes);
    free(pm);
    free(p);
    ref_model_free(m);
    ref_model_free(m2);
    return bad ? fail("F16/BF16/F32/F64 reading is wrong") : 0;
}

/* -- Data batching ---------------------------------------------------------------------------- */

/* 23 tokens 0..22 with T=5 make (23-1)/5 = 4 samples; gbs 3: step 0 = samples 0,1,2,
** step 1 = 3,0,1 (wrapping mod 4). Sample i: inputs i*5..i*5+4, targets one further. The same
** tokens as an llm.c shard must give the same batches. */
static int test_batch(const char *dir)
{
    char *praw = path_in(dir, "count.bin"), *pshard = path_in(dir, "count_shard.bin");
    unsigned char raw[46], shard[1024 + 46];
    for (int i = 0; i < 23; i++) {
        raw[2 * i] = (unsigned char)i;
        raw[2 * i + 1] = 0;
    }
    memset(shard, 0, sizeof shard);
    const int32_t head[3] = {20240520, 1, 23};
    for (int k = 0; k < 3; k++)
        for (int q = 0; q < 4; q++)
            shard[4 * k + q] = (unsigned char)((uint32_t)head[k] >> (8 * q));
    memcpy(shard + 1024, raw, sizeof raw);
    if (write_bytes(praw, raw, sizeof raw) || write_bytes(pshard, shard, sizeof shard))
        return 1;
    int bad = 0;
    const int want_samples[2][3] = {{0, 1, 2}, {3, 0, 1}};
    for (int which = 0; which < 2; which++) {
        ref_data d;
        if (ref_data_load(&d, which ? pshard : praw, 23, 5) < 0)
            return fail("could not load %s", which ? pshard : praw);
        if (d.ntokens != 23 || d.nsamples != 4 || d.is_shard != which)
            bad += fail("  %s: ntokens %zu nsamples %zu shard %d", which ? "shard" : "raw",
                        d.ntokens, d.nsamples, d.is_shard);
        int in[15], tg[15];
        for (int s = 0; s < 2; s++) {
            ref_data_batch(&d, s, 3, in, tg);
            for (int j = 0; j < 3; j++)
                for (int t = 0; t < 5; t++) {
                    int i = want_samples[s][j];
                    if (in[j * 5 + t] != i * 5 + t || tg[j * 5 + t] != i * 5 + t + 1) {
                        bad += fail("  %s step %d row %d pos %d: input %d target %d, want %d %d",
                                    which ? "shard" : "raw", s, j, t, in[j * 5 + t],
                                    tg[j * 5 + t], i * 5 + t, i * 5 + t + 1);
                        t = 5, j = 3;
                    }
                }
        }
        ref_data_free(&d);
    }
    free(praw);
    free(pshard);
    return bad ? fail("batching differs from the rule of tests/ref/README.md") : 0;
}

/* -- Mixture of experts --------------------------------------------------------------------- */

/* The MoE model of the gradient checks: 2 layers, C=8, 2 heads, T=5, V=11, E experts of width 6. */
static ref_config moe_config(int E, int k, int bias, int pre_softmax, double aux, double cap)
{
    ref_config c = {.layers = 2, .hidden = 8, .heads = 2, .seq = 5, .vocab = 11, .ffn = 32,
                    .ln_eps = 1e-5};
    c.moe = (ref_moe_config){.experts = E, .top_k = k, .ffn = 6, .bias = bias,
                             .router_bias = bias, .pre_softmax = pre_softmax, .aux_coeff = aux,
                             .capacity = cap};
    return c;
}

static void describe_moe(char *buf, size_t n, const ref_moe_config *c)
{
    int len = snprintf(buf, n, "E=%d top-%d%s%s%s aux %g%s z %g scale %g capacity %g",
                       c->experts, c->top_k, c->pre_softmax ? " pre-softmax" : "",
                       c->sigmoid ? " sigmoid" : "", c->bias ? " bias" : "", c->aux_coeff,
                       c->seq_aux ? " per sequence" : "", c->z_coeff, c->topk_scale,
                       c->capacity);
    if (c->shared_ffn > 0 && len > 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, " shared %d", c->shared_ffn);
}

/* Number of dropped choices in the last forward of every layer. */
static int count_dropped(const ref_model *m, const ref_acts *a)
{
    size_t nk = (size_t)a->B * m->cfg.seq * m->cfg.moe.top_k;
    int dropped = 0;
    for (int l = 0; l < m->cfg.layers; l++)
        for (size_t i = 0; i < nk; i++)
            dropped += !a->layer[l].moe.keep[i];
    return dropped;
}

/* The MoE op alone, with its weights held by a one-layer model (layer 0's moe views). */
typedef struct moe_op {
    ref_config cfg;
    ref_model *m;
    ref_moe_acts ma;
    int B, T, C, N;
    double *x, *out, *din;  /* (N, C) */
} moe_op;

/* The op of architecture 'arch' (GPT-2's GELU experts or Llama's SwiGLU ones; C even). */
static void moe_op_new_arch(moe_op *op, const ref_moe_config *moe, ref_arch arch, int B, int T,
                            int C)
{
    memset(op, 0, sizeof *op);
    op->cfg = (ref_config){.layers = 1, .hidden = C, .heads = 1, .seq = T, .vocab = 2, .ffn = 4,
                           .ln_eps = 1e-5, .moe = *moe, .arch = arch};
    op->m = ref_model_new(&op->cfg);
    op->B = B, op->T = T, op->C = C, op->N = B * T;
    ref_moe_acts_init(&op->ma, moe, op->N, C);
    op->x = ref_xcalloc((size_t)op->N * C, sizeof(double));
    op->out = ref_xcalloc((size_t)op->N * C, sizeof(double));
    op->din = ref_xcalloc((size_t)op->N * C, sizeof(double));
}

static void moe_op_new(moe_op *op, const ref_moe_config *moe, int B, int T, int C)
{
    moe_op_new_arch(op, moe, REF_ARCH_GPT2, B, T, C);
}

static void moe_op_free(moe_op *op)
{
    ref_model_free(op->m);
    ref_moe_acts_release(&op->ma);
    free(op->x);
    free(op->out);
    free(op->din);
}

static void moe_op_fwd(moe_op *op)
{
    ref_moe_fwd(op->out, &op->ma, &op->m->w.h[0].moe, &op->cfg.moe, op->x, op->B, op->T, op->C);
}

/* Gradients of 'r . out + aux_scale * aux' into op->m->grads (set) and op->din (set). */
static void moe_op_bwd(moe_op *op, const double *r, double aux_scale)
{
    memset(op->m->grads, 0, op->m->nparams * sizeof(double));
    memset(op->din, 0, (size_t)op->N * op->C * sizeof(double));
    ref_moe_bwd(op->din, &op->m->g.h[0].moe, r, aux_scale, &op->ma, &op->m->w.h[0].moe,
                &op->cfg.moe, op->x, op->B, op->T, op->C);
}

/* r . out + aux_scale * aux of a fresh forward; *same_route: the routing equals 'sel0/keep0'. */
static double moe_op_objective(moe_op *op, const double *r, double aux_scale, const int *sel0,
                               const int *keep0, int *same_route)
{
    moe_op_fwd(op);
    size_t nk = (size_t)op->N * op->cfg.moe.top_k;
    *same_route = memcmp(sel0, op->ma.sel, nk * sizeof(int)) == 0 &&
                  memcmp(keep0, op->ma.keep, nk * sizeof(int)) == 0;
    double sum = aux_scale * op->ma.aux;
    for (size_t i = 0; i < (size_t)op->N * op->C; i++)
        sum += r[i] * op->out[i];
    return sum;
}

/*
** The op's gradients -- d/d input (the path into ln_2 and the residual stream) and every router
** and expert element -- against central differences of 'r . out + 0.7 aux' for a fixed random
** r, skipping perturbations that change the routing. op->x and the weights are the caller's.
*/
static void gradcheck_moe_op(fd_tally *t, moe_op *op)
{
    size_t NC = (size_t)op->N * op->C, nk = (size_t)op->N * op->cfg.moe.top_k;
    const double aux_scale = 0.7;
    double *r = ref_xmalloc(NC * sizeof(double));
    for (size_t i = 0; i < NC; i++)
        r[i] = ref_rng_normal(77, "r", i);
    moe_op_fwd(op);
    int *sel0 = ref_xmalloc(nk * sizeof(int)), *keep0 = ref_xmalloc(nk * sizeof(int));
    memcpy(sel0, op->ma.sel, nk * sizeof(int));
    memcpy(keep0, op->ma.keep, nk * sizeof(int));
    moe_op_bwd(op, r, aux_scale);
    double *an_x = ref_xmalloc(NC * sizeof(double));
    double *an_p = ref_xmalloc(op->m->nparams * sizeof(double));
    memcpy(an_x, op->din, NC * sizeof(double));
    memcpy(an_p, op->m->grads, op->m->nparams * sizeof(double));

    /* the input, then every tensor of the mixture */
    int ntargets = 1 + op->m->ntensors;
    for (int ti = 0; ti < ntargets; ti++) {
        const ref_tensor *te = ti > 0 ? &op->m->tensors[ti - 1] : NULL;
        if (te != NULL && strstr(te->name, ".mlp.") == NULL &&
            strstr(te->name, ".block_sparse_moe.") == NULL)
            continue;
        double *base = te ? op->m->params + te->offset : op->x;
        const double *an = te ? an_p + te->offset : an_x;
        size_t numel = te ? te->numel : NC;
        const char *name = te ? te->name : "moe input";
        for (size_t e = 0; e < numel; e++) {
            double p0 = base[e];
            int same_p, same_m;
            base[e] = p0 + FD_H;
            double lp = moe_op_objective(op, r, aux_scale, sel0, keep0, &same_p);
            base[e] = p0 - FD_H;
            double lm = moe_op_objective(op, r, aux_scale, sel0, keep0, &same_m);
            base[e] = p0;
            if (!same_p || !same_m)
                t->skipped++;
            else
                fd_compare(t, name, e, an[e], (lp - lm) / (2 * FD_H));
        }
    }
    moe_op_fwd(op);     /* leave the unperturbed forward in op */
    free(r);
    free(sel0);
    free(keep0);
    free(an_x);
    free(an_p);
}

/*
** Fill m with fill_lively from the first seed >= 'first' under which every expert of every
** layer receives at least one kept token in the forwards over the n sequences (otherwise the
** gradient check could not see its tensors); tries 64 seeds. Returns the seed (-1: none) and
** the number of dropped choices under it in *dropped.
*/
static int pick_moe_seed(ref_model *m, ref_acts *a, const int *in, const int *tg, int n,
                         int first, int *dropped)
{
    int E = m->cfg.moe.experts, k = m->cfg.moe.top_k, L = m->cfg.layers;
    size_t nk = (size_t)a->B * m->cfg.seq * k;
    int *used = ref_xcalloc((size_t)L * E, sizeof(int));
    for (int seed = first; seed < first + 64; seed++) {
        fill_lively(m, (uint64_t)seed);
        memset(used, 0, (size_t)L * E * sizeof(int));
        *dropped = 0;
        for (int s = 0; s < n; s += a->B) {
            ref_forward(m, a, in + (size_t)s * m->cfg.seq, tg + (size_t)s * m->cfg.seq);
            *dropped += count_dropped(m, a);
            for (int l = 0; l < L; l++)
                for (size_t i = 0; i < nk; i++)
                    used[l * E + a->layer[l].moe.sel[i]] += a->layer[l].moe.keep[i];
        }
        int all = 1;
        for (int i = 0; i < L * E; i++)
            all &= used[i] > 0;
        if (all) {
            free(used);
            return seed;
        }
    }
    free(used);
    return -1;
}

/*
** The whole-model half of moe-gradcheck and llama-gradcheck: a model of 'cfg' takes its weights
** from pick_moe_seed (from 'seed' on) when it has experts, else from fill_lively(seed); then
** every element of every tensor over seq_inputs (4 sequences, micro-batches of 2) against
** central differences. Returns 1, reported under 'what', when no seed gives every expert
** tokens, an element is off, more than 1% are skipped as routing flips, or choices are dropped
** without a capacity (or none with one); else 0.
*/
static int gradcheck_whole(const ref_config *cfg, uint64_t seed, const char *what)
{
    ref_model *m = ref_model_new(cfg);
    ref_acts *a = ref_acts_new(cfg, 2);
    int dropped = 0, picked = (int)seed;
    if (cfg->moe.experts > 0)
        picked = pick_moe_seed(m, a, seq_inputs, seq_targets, 4, (int)seed, &dropped);
    else
        fill_lively(m, seed);
    fd_tally t = {0};
    gradcheck_model(&t, m, a, seq_inputs, seq_targets, 4);
    printf("  model %s (seed %d): %d tensors, %d elements, %d skipped (routing flips), "
           "%d dropped choices\n", what, picked, m->ntensors, t.checked, t.skipped, dropped);
    int bad = picked < 0 || t.bad || t.skipped * 100 > t.checked ||
              (cfg->moe.capacity > 0) != (dropped > 0);
    if (bad)
        fail("  model %s: seed %d, %d off, %d skipped of %d, %d dropped", what, picked, t.bad,
             t.skipped, t.checked, dropped);
    ref_acts_free(a, cfg);
    ref_model_free(m);
    return bad;
}

/*
** moe-gradcheck. For each configuration -- top-1/top-2, pre-softmax off/on, aux loss 0/0.1,
** expert biases off/on, and one with capacity dropping -- (1) the whole model: 2 layers,
** C=8, 4 experts of width 6, 4 sequences of 5 tokens as 2 micro-batches of 2 (so the aux loss
** is per micro-batch and the 1/micro-batches scale is covered), every element of every tensor;
** (2) the MoE op alone on random inputs: the input gradient and every router/expert element.
** Bound: FD_RTOL, FD_ATOL. Perturbations that flip a routing decision are skipped; more than
** 1% skipped, or a configuration meant to drop tokens that drops none, is a failure.
** Top-1 without pre-softmax has prob 1, so its router learns only through the aux loss: it
** is checked with the aux loss on. The model's weights come from pick_moe_seed, so that every
** expert has tokens.
*/
static int test_moe_gradcheck(void)
{
    static const struct {
        int k, pre, bias;
        double aux, cap;
        int seq;                /* 1: the aux loss per sequence (seq_aux_loss) and the top-k
                                ** scaling factor 1.5 */
        int sig;                /* 1: sigmoid scores */
    } cases[] = {
        {2, 0, 1, 0.1, 0.0, 0, 0}, {2, 0, 0, 0.0, 0.0, 0, 0}, {1, 0, 1, 0.1, 0.0, 0, 0},
        {1, 1, 1, 0.0, 0.0, 0, 0}, {2, 1, 0, 0.1, 0.0, 0, 0}, {2, 0, 1, 0.1, 0.75, 0, 0},
        {1, 1, 0, 0.1, 1.0, 0, 0},
        {2, 0, 1, -0.05, 0.0, 0, 0}, {2, 1, 0, -0.1, 0.75, 0, 0},   /* aux < 0: z-loss -aux */
        {2, 0, 1, 0.1, 0.0, 1, 0}, {1, 1, 0, 0.1, 1.0, 1, 0},
        {2, 0, 1, 0.1, 0.0, 0, 1}, {1, 0, 0, 0.1, 0.75, 1, 1},    /* sigmoid scores */
    };
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double aux = cases[c].aux;
        ref_config cfg = moe_config(4, cases[c].k, cases[c].bias, cases[c].pre,
                                    aux < 0 ? 0.0 : aux, cases[c].cap);
        cfg.moe.z_coeff = aux < 0 ? -aux : 0.0;
        cfg.moe.seq_aux = cases[c].seq;
        cfg.moe.topk_scale = cases[c].seq ? 1.5 : 0.0;
        cfg.moe.sigmoid = cases[c].sig;
        char what[128];
        describe_moe(what, sizeof what, &cfg.moe);

        bad += gradcheck_whole(&cfg, 100 + 16 * (uint64_t)c, what);

        moe_op op;
        moe_op_new(&op, &cfg.moe, 2, 5, 8);
        fill_lively(op.m, 200 + (uint64_t)c);
        for (int i = 0; i < op.N * op.C; i++)
            op.x[i] = ref_rng_normal(300 + (uint64_t)c, "x", (uint64_t)i);
        fd_tally u = {0};
        gradcheck_moe_op(&u, &op);
        int dropped = 0;
        for (int i = 0; i < op.N * cfg.moe.top_k; i++)
            dropped += !op.ma.keep[i];
        printf("  op    %s: %d elements, %d skipped, %d dropped choices\n", what, u.checked,
               u.skipped, dropped);
        if (u.bad || u.skipped * 100 > u.checked || (cases[c].cap > 0) != (dropped > 0))
            bad += fail("  op %s: %d off, %d skipped of %d, %d dropped", what, u.bad, u.skipped,
                        u.checked, dropped);
        moe_op_free(&op);
    }
    /* a shared expert of width 5 beside the routed ones (Megatron's
    ** moe_shared_expert_intermediate_size), with the linear biases and without */
    for (int b = 0; b < 2; b++) {
        ref_config cfg = moe_config(4, 2, b, 0, 0.1, 0.0);
        cfg.no_linear_bias = !b;
        cfg.moe.shared_ffn = 5;
        char what[160];
        describe_moe(what, sizeof what, &cfg.moe);
        bad += gradcheck_whole(&cfg, 500 + (uint64_t)b, what);
    }
    return bad ? fail("%d MoE gradient check(s) failed", bad) : 0;
}

/* The expert MLP written out once more for the hand checks: y = c_proj(gelu(c_fc(x))). */
static void expert_apply(double *y, const ref_expert *x, const double *in, int C, int Fe)
{
    double h[64], a[64];
    ref_linear_fwd(h, in, x->c_fc_w, x->c_fc_b, 1, C, Fe);
    ref_gelu_fwd(a, h, (size_t)Fe);
    ref_linear_fwd(y, a, x->c_proj_w, x->c_proj_b, 1, Fe, C);
}

/* |got - want| <= 1e-14 |want| + 1e-15 for every row element; reports the first mismatch. */
static int rows_close(const double *got, const double *want, int C, const char *what, int n)
{
    for (int c = 0; c < C; c++)
        if (fabs(got[c] - want[c]) > 1e-14 * fabs(want[c]) + 1e-15)
            return fail("  %s: token %d channel %d: %.17g, want %.17g", what, n, c, got[c],
                        want[c]);
    return 0;
}

/* Every gradient of expert e of op's model is exactly 0. */
static int expert_grads_zero(const moe_op *op, int e)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "h.0.mlp.experts.%d.", e);
    for (int i = 0; i < op->m->ntensors; i++) {
        const ref_tensor *t = &op->m->tensors[i];
        if (strncmp(t->name, prefix, strlen(prefix)) != 0)
            continue;
        for (size_t j = 0; j < t->numel; j++)
            if (op->m->grads[t->offset + j] != 0.0)
                return fail("  %s[%zu] has gradient %g, but expert %d got no tokens", t->name,
                            j, op->m->grads[t->offset + j], e);
    }
    return 0;
}

/* Router row e of op's model := scale * (1, 1, ..., 1). */
static void set_router_row(moe_op *op, int e, double scale)
{
    for (int c = 0; c < op->C; c++)
        op->m->w.h[0].moe.router_w[(size_t)e * op->C + c] = scale;
}

/*
** moe-routing, expert bias with an aux loss (sigmoid scores, bias_rate > 0; B=2, T=3, C=4, E=4):
** router rows (1, 0.5, 0, -1) give every token the plain top-2 {0, 1} (top-1 {0}); an expert
** bias of (0, 0, 0, 5) routes it to {3, 0} (top-1 {3}). The tokens go where the bias says, but
** the aux loss counts the plain top-k (Megatron's compute_routing_scores_for_aux_loss), so
** aux = coeff E / (k Ns^2) sum_e (sum_n s[n,e]) count_e with count = Ns on the plain choices,
** s = sigmoid / (sum of the sigmoids + 1e-20), per token set (the micro-batch, or with
** seq_aux each sequence, averaged). Also the gradients against central differences.
*/
static int moe_ebias_aux_case(int k, int seq_aux)
{
    const int B = 2, T = 3, C = 4, N = 6, E = 4;
    const double rows[4] = {1, 0.5, 0, -1}, coeff = 0.1;
    const int plain[2] = {0, 1}, biased[2] = {3, 0};
    ref_moe_config moe = {.experts = E, .top_k = k, .ffn = 3, .sigmoid = 1, .aux_coeff = coeff,
                          .seq_aux = seq_aux, .bias_rate = 0.01};
    char what[96];
    snprintf(what, sizeof what, "expert bias (0,0,0,5), aux 0.1, top-%d%s", k,
             seq_aux ? ", per sequence" : "");
    moe_op op;
    moe_op_new(&op, &moe, B, T, C);
    fill_lively(op.m, 700 + (uint64_t)(2 * k + seq_aux));
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            op.x[n * C + c] = 0.2 + 0.1 * ((3 * n + c) % 5);
    for (int e = 0; e < E; e++)
        set_router_row(&op, e, rows[e]);
    double *eb = op.m->w.h[0].moe.expert_bias;
    for (int e = 0; e < E; e++)
        eb[e] = e == 3 ? 5.0 : 0.0;
    moe_op_fwd(&op);

    int bad = 0, S = seq_aux ? B : 1, Ns = N / S;
    double psum[2][4] = {{0}};      /* per token set, the sum over its tokens of s[n, e] */
    for (int n = 0; n < N; n++) {
        double sx = 0.0, sig[4], D = 1e-20;
        for (int c = 0; c < C; c++)
            sx += op.x[n * C + c];
        for (int e = 0; e < E; e++)
            D += sig[e] = 1.0 / (1.0 + exp(-rows[e] * sx));
        for (int e = 0; e < E; e++)
            psum[n / Ns][e] += sig[e] / D;
        for (int j = 0; j < k; j++)
            if (op.ma.sel[n * k + j] != biased[j])
                bad += fail("  %s, token %d: choice %d is expert %d, want %d (the bias's)", what,
                            n, j, op.ma.sel[n * k + j], biased[j]);
    }
    double want = 0.0;
    for (int set = 0; set < S; set++)
        for (int e = 0; e < E; e++) {
            int counted = 0;
            for (int j = 0; j < k; j++)
                counted |= plain[j] == e;
            if (op.ma.count[set * E + e] != (counted ? Ns : 0))
                bad += fail("  %s: set %d, expert %d counts %d tokens for the aux loss, want %d "
                            "(the plain top-k, without the bias)", what, set, e,
                            op.ma.count[set * E + e], counted ? Ns : 0);
            want += counted ? coeff * E * psum[set][e] * Ns / ((double)k * Ns * Ns) / S : 0.0;
        }
    if (!close_rel(op.ma.aux, want, 1e-14))
        bad += fail("  %s: aux %.17g, want %.17g", what, op.ma.aux, want);

    fd_tally t = {0};
    gradcheck_moe_op(&t, &op);
    printf("  %s: aux %.10g, %d gradient elements, %d skipped\n", what, op.ma.aux, t.checked,
           t.skipped);
    if (t.bad || t.skipped)
        bad += fail("  %s: %d of %d gradient elements off, %d skipped", what, t.bad, t.checked,
                    t.skipped);
    moe_op_free(&op);
    return bad;
}

/*
** moe-routing: hand-made routings through the op (B=2, T=3, C=4, E=4, width 3, biases on).
** Every token's input is positive and router row e is rows[e] * (1, ..., 1), so the logits of
** token n are rows[e] * sum(x_n): equal rows give exactly equal logits, and every token has the
** same choices. Cases:
**   ties -- all rows 0 (every logit equal): experts 0..k-1, probs 1/k (1/E with pre-softmax);
**     rows 1 and 2 equal and largest: 1 before 2 (top-1: 1; top-2: 1, 2; top-3: 1, 2, 0);
**   experts that receive no tokens -- every expert outside the choices: count 0, gradients
**     exactly 0, and the output is that of the chosen experts alone;
**   all tokens to one expert -- row 0 = 2, top-1, aux 0.1: counts (6,0,0,0), output = expert
**     0's, aux = 0.1 * E * sum_n s[n,0] * 6 / (1 * 6^2) worked out by hand;
** each checked against finite differences too (with tied logits, perturbing a tied router row
** flips the routing: those elements are skipped; the untied case must skip none). Then the
** expert bias with the aux loss (moe_ebias_aux_case), top-1 and top-2, per micro-batch and per
** sequence.
*/
static int test_moe_routing(void)
{
    static const struct {
        const char *what;
        int k, pre, tied;
        double rows[4], aux;
        int sel[3];
    } cases[] = {
        {"all logits equal, top-2", 2, 0, 1, {0, 0, 0, 0}, 0.0, {0, 1}},
        {"all logits equal, top-2, pre-softmax", 2, 1, 1, {0, 0, 0, 0}, 0.0, {0, 1}},
        {"experts 1 = 2 largest, top-1", 1, 0, 1, {0.5, 1, 1, -1}, 0.0, {1}},
        {"experts 1 = 2 largest, top-2", 2, 0, 1, {0.5, 1, 1, -1}, 0.0, {1, 2}},
        {"experts 1 = 2 largest, top-3", 3, 0, 1, {0.5, 1, 1, -1}, 0.0, {1, 2, 0}},
        {"all tokens to expert 0, top-1, aux 0.1", 1, 0, 0, {2, 0, 0, 0}, 0.1, {0}},
    };
    const int B = 2, T = 3, C = 4, N = 6, E = 4;
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *what = cases[i].what;
        int k = cases[i].k;
        ref_moe_config moe = {.experts = E, .top_k = k, .ffn = 3, .bias = 1,
                              .pre_softmax = cases[i].pre, .aux_coeff = cases[i].aux};
        moe_op op;
        moe_op_new(&op, &moe, B, T, C);
        fill_lively(op.m, 500 + (uint64_t)i);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                op.x[n * C + c] = 0.2 + 0.1 * ((3 * n + c) % 5);
        for (int e = 0; e < E; e++)
            set_router_row(&op, e, cases[i].rows[e]);
        moe_op_fwd(&op);

        double p_first = 0.0;   /* sum over tokens of softmax_all(z)[0], for the aux loss */
        for (int n = 0; n < N && !bad; n++) {
            double sx = 0.0, z[4], all = 0.0, chosen = 0.0, want_out[4] = {0}, y[4];
            for (int c = 0; c < C; c++)
                sx += op.x[n * C + c];
            for (int e = 0; e < E; e++) {
                z[e] = cases[i].rows[e] * sx;
                all += exp(z[e]);
            }
            for (int j = 0; j < k; j++)
                chosen += exp(z[cases[i].sel[j]]);
            p_first += exp(z[0]) / all;
            for (int j = 0; j < k; j++) {
                int e = cases[i].sel[j];
                double want_p = exp(z[e]) / (cases[i].pre ? all : chosen);
                if (op.ma.sel[n * k + j] != e) {
                    bad += fail("  %s, token %d: choice %d is expert %d, want %d", what, n, j,
                                op.ma.sel[n * k + j], e);
                    break;
                }
                if (!close_rel(op.ma.prob[n * k + j], want_p, 1e-15))
                    bad += fail("  %s, token %d, choice %d: prob %.17g, want %.17g", what, n, j,
                                op.ma.prob[n * k + j], want_p);
                expert_apply(y, &op.m->w.h[0].moe.experts[e], op.x + n * C, C, 3);
                for (int c = 0; c < C; c++)
                    want_out[c] += want_p * y[c];
            }
            bad += rows_close(op.out + n * C, want_out, C, what, n);
        }

        double *r = ref_xmalloc((size_t)N * C * sizeof(double));
        for (int j = 0; j < N * C; j++)
            r[j] = ref_rng_normal(9, "r", (uint64_t)j);
        moe_op_bwd(&op, r, 1.0);
        free(r);
        for (int e = 0; e < E; e++) {
            int chosen = 0;
            for (int j = 0; j < k; j++)
                chosen |= cases[i].sel[j] == e;
            if (op.ma.count[e] != (chosen ? N : 0))
                bad += fail("  %s: expert %d has %d tokens, want %d", what, e, op.ma.count[e],
                            chosen ? N : 0);
            if (!chosen)
                bad += expert_grads_zero(&op, e);
        }
        if (cases[i].aux > 0) {
            double want = cases[i].aux * E * p_first * N / ((double)k * N * N);
            if (!close_rel(op.ma.aux, want, 1e-14))
                bad += fail("  %s: aux %.17g, want %.17g", what, op.ma.aux, want);
        }

        fd_tally t = {0};
        gradcheck_moe_op(&t, &op);
        printf("  %s: %d gradient elements, %d skipped\n", what, t.checked, t.skipped);
        if (t.bad || (!cases[i].tied && t.skipped))
            bad += fail("  %s: %d of %d gradient elements off, %d skipped", what, t.bad,
                        t.checked, t.skipped);
        moe_op_free(&op);
    }
    for (int k = 1; k <= 2; k++)
        for (int seq_aux = 0; seq_aux < 2; seq_aux++)
            bad += moe_ebias_aux_case(k, seq_aux);
    return bad ? fail("%d MoE routing check(s) failed", bad) : 0;
}

/*
** moe-capacity: (1) the capacity formula, including a product that rounds above an integer
** in double (100/2 * 1.1 = 55.000000000000007 -> 56, as Megatron's get_capacity computes it);
** (2) top-1 with every token on expert 0, B=2, T=3, factor 1 -> capacity 3, kept in token
** order (t, b): (b0,t0), (b1,t0), (b0,t1), i.e. rows 0, 3, 1; the other rows output exactly 0;
** (3) top-2, expert 0 first for every token and second choice 1 or 2 by token: expert 0 keeps
** rows 0, 3, 1; rows 4, 2, 5 keep only their second expert, with its probability unchanged
** (not renormalised); the aux loss and counts are those without dropping.
*/
static int test_moe_capacity(void)
{
    int bad = 0;
    static const struct {
        int ntok, k, E;
        double f;
        int want;
    } caps[] = {
        {6, 1, 2, 1.0, 3}, {10, 2, 4, 1.0, 5}, {10, 2, 4, 0.5, 3}, {10, 1, 3, 1.0, 4},
        {50, 2, 2, 1.1, 56}, {6, 2, 4, 0.25, 1}, {1000, 2, 8, 1.0, 250}, {64, 2, 8, 0.0, 0},
    };
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        ref_moe_config moe = {.experts = caps[i].E, .top_k = caps[i].k, .ffn = 1,
                              .capacity = caps[i].f};
        int got = ref_moe_capacity(caps[i].ntok, &moe);
        if (got != caps[i].want)
            bad += fail("  capacity(N=%d, k=%d, E=%d, factor %g) = %d, want %d", caps[i].ntok,
                        caps[i].k, caps[i].E, caps[i].f, got, caps[i].want);
    }

    const int B = 2, T = 3, C = 4, N = 6;
    for (int kind = 0; kind < 2; kind++) {
        ref_moe_config moe = {.experts = kind ? 4 : 2, .top_k = kind ? 2 : 1, .ffn = 3,
                              .bias = 1, .aux_coeff = 0.1, .capacity = 1.0};
        moe_op op, free_op;
        ref_moe_config nocap = moe;
        nocap.capacity = 0.0;
        moe_op_new(&op, &moe, B, T, C);
        moe_op_new(&free_op, &nocap, B, T, C);
        fill_lively(op.m, 600 + (uint64_t)kind);
        static const int sign[6] = {1, 1, -1, -1, 1, -1};
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)     /* 0.5 + 0.1 s_n v, v = (1, -1, 1, -1) */
                op.x[n * C + c] = 0.5 + 0.1 * sign[n] * (c % 2 ? -1 : 1);
        double *rw = op.m->w.h[0].moe.router_w;
        for (int e = 0; e < moe.experts; e++)
            for (int c = 0; c < C; c++) {
                double v = c % 2 ? -1.0 : 1.0;
                double row[4] = {kind ? 3.0 : 2.0, kind ? v : 0.0, -v, -3.0};
                rw[e * C + c] = row[e];
            }
        memcpy(free_op.m->params, op.m->params, op.m->nparams * sizeof(double));
        memcpy(free_op.x, op.x, (size_t)N * C * sizeof(double));
        moe_op_fwd(&op);
        moe_op_fwd(&free_op);

        int k = moe.top_k;
        static const int kept0[6] = {1, 1, 0, 1, 0, 0};   /* expert 0's choice of row n kept */
        if (op.ma.capacity != 3)
            bad += fail("  case %d: capacity %d, want 3", kind, op.ma.capacity);
        for (int n = 0; n < N; n++) {
            double want[4] = {0}, y[4];
            for (int j = 0; j < k; j++) {
                int e = op.ma.sel[n * k + j];
                int want_e = j == 0 ? 0 : sign[n] > 0 ? 1 : 2;
                int want_keep = j == 0 ? kept0[n] : 1;
                if (e != want_e || op.ma.keep[n * k + j] != want_keep) {
                    bad += fail("  case %d row %d choice %d: expert %d keep %d, want %d %d",
                                kind, n, j, e, op.ma.keep[n * k + j], want_e, want_keep);
                    continue;
                }
                double p = free_op.ma.prob[n * k + j];
                if (op.ma.prob[n * k + j] != p)
                    bad += fail("  case %d row %d: prob %.17g changed by dropping (%.17g)", kind,
                                n, op.ma.prob[n * k + j], p);
                if (!want_keep)
                    continue;
                expert_apply(y, &op.m->w.h[0].moe.experts[e], op.x + n * C, C, 3);
                for (int c = 0; c < C; c++)
                    want[c] += p * y[c];
            }
            bad += rows_close(op.out + n * C, want, C, kind ? "top-2 output" : "top-1 output",
                              n);
        }
        if (op.ma.aux != free_op.ma.aux ||
            memcmp(op.ma.count, free_op.ma.count, (size_t)moe.experts * sizeof(int)) != 0)
            bad += fail("  case %d: dropping changed the aux loss (%.17g vs %.17g) or counts",
                        kind, op.ma.aux, free_op.ma.aux);
        fd_tally t = {0};
        gradcheck_moe_op(&t, &op);
        if (t.bad || t.skipped)
            bad += fail("  case %d: %d of %d gradient elements off, %d skipped", kind, t.bad,
                        t.checked, t.skipped);
        moe_op_free(&op);
        moe_op_free(&free_op);
    }
    return bad ? fail("%d capacity check(s) failed", bad) : 0;
}

/* The MoE name of dense tensor 'name' in a one-expert model ("h.0.mlp.c_fc.weight" ->
** "h.0.mlp.experts.0.c_fc.weight"); other names are unchanged. */
static void expert_name(char *out, size_t n, const char *name)
{
    const char *p = strstr(name, ".mlp.");
    if (p == NULL)
        snprintf(out, n, "%s", name);
    else
        snprintf(out, n, "%.*s.mlp.experts.0.%s", (int)(p - name), name, p + 5);
}

/* Maps a tensor name of the dense model to its name in the one-expert twin. */
typedef void (*twin_name_fn)(char *out, size_t n, const char *name);

/*
** The check behind moe-dense and llama-moe-dense: m is the dense model d with each MLP made
** one expert under top-1 routing, 'twin_name' maps d's tensor names to m's. Copies every tensor
** of d onto its twin in m (m's router keeps its values). From the same weights the loss and
** every gradient agree exactly; after each of 3 AdamW steps the losses and weights still do
** (seq_inputs: 4 sequences in micro-batches of 2). At every step m's aux loss is
** 'want_aux' and its router gradient exactly 0. Returns the number of failures, each reported
** with 'tag'.
*/
static int check_expert_twin(ref_model *d, ref_model *m, twin_name_fn twin_name, double want_aux,
                             const char *tag)
{
    ref_optim o = {.lr = 1e-2, .min_lr = 1e-3, .warmup = 1, .decay_steps = 3, .beta1 = 0.9,
                   .beta2 = 0.95, .eps = 1e-8, .wd = 0.1, .clip = 1.0};
    ref_acts *da = ref_acts_new(&d->cfg, 2), *ma = ref_acts_new(&m->cfg, 2);
    const ref_tensor **twin = ref_xcalloc((size_t)d->ntensors, sizeof *twin);
    int bad = 0;
    for (int i = 0; i < d->ntensors; i++) {
        char name[REF_NAME_MAX];
        twin_name(name, sizeof name, d->tensors[i].name);
        twin[i] = ref_model_find(m, name);
        if (twin[i] == NULL || twin[i]->numel != d->tensors[i].numel) {
            bad += fail("  %s: no one-expert twin %s of %s", tag, name, d->tensors[i].name);
            goto done;
        }
        memcpy(m->params + twin[i]->offset, d->params + d->tensors[i].offset,
               d->tensors[i].numel * sizeof(double));
    }
    for (int step = 0; step <= 3; step++) {
        double aux = -1.0, dl, ml;
        if (step == 0) {
            dl = ref_compute_grads(d, da, seq_inputs, seq_targets, 4, NULL);
            ml = ref_compute_grads(m, ma, seq_inputs, seq_targets, 4, &aux);
        } else {
            dl = ref_train_step(d, da, &o, seq_inputs, seq_targets, 4).loss;
            ref_step_info si = ref_train_step(m, ma, &o, seq_inputs, seq_targets, 4);
            ml = si.loss, aux = si.aux_loss;
        }
        if (ml != dl)
            bad += fail("  %s step %d: one-expert loss %.17g, dense %.17g", tag, step, ml, dl);
        if (!close_rel(aux, want_aux, 1e-15))
            bad += fail("  %s step %d: aux loss %.17g, want %g", tag, step, aux, want_aux);
        double maxdiff = 0.0, router = 0.0;
        const double *dv = step == 0 ? d->grads : d->params;
        const double *mv = step == 0 ? m->grads : m->params;
        for (int i = 0; i < d->ntensors; i++)
            for (size_t e = 0; e < d->tensors[i].numel; e++)
                maxdiff = fmax(maxdiff, fabs(dv[d->tensors[i].offset + e] -
                                             mv[twin[i]->offset + e]));
        for (int l = 0; l < m->cfg.layers; l++)
            for (int c = 0; c < m->cfg.hidden; c++)
                router = fmax(router, fabs(m->g.h[l].moe.router_w[c]));
        if (maxdiff != 0.0 || router != 0.0)
            bad += fail("  %s step %d: %s differ by up to %.3g, router gradient %.3g", tag, step,
                        step ? "weights" : "gradients", maxdiff, router);
    }
done:
    free(twin);
    ref_acts_free(da, &d->cfg);
    ref_acts_free(ma, &m->cfg);
    return bad;
}

/*
** moe-dense: a mixture of one expert with top-1 (prob 1) is the dense model with the same
** weights (check_expert_twin), with the aux loss off, and on with capacity 1 (E=1: the aux
** loss is the constant coeff per layer, zero gradient; capacity N drops nothing). 2 layers,
** C=8, F=12.
*/
static int test_moe_dense(void)
{
    ref_config dcfg = {.layers = 2, .hidden = 8, .heads = 2, .seq = 5, .vocab = 11, .ffn = 12,
                       .ln_eps = 1e-5};
    int bad = 0;
    for (int variant = 0; variant < 2; variant++) {
        ref_config mcfg = dcfg;
        mcfg.moe = (ref_moe_config){.experts = 1, .top_k = 1, .ffn = 12, .bias = 1,
                                    .aux_coeff = variant ? 0.1 : 0.0,
                                    .capacity = variant ? 1.0 : 0.0};
        ref_model *d = ref_model_new(&dcfg), *m = ref_model_new(&mcfg);
        fill_lively(d, 8);
        fill_lively(m, 9);      /* the router keeps these values; the rest is copied */
        char tag[32];
        snprintf(tag, sizeof tag, "variant %d", variant);
        bad += check_expert_twin(d, m, expert_name, variant ? 0.1 * mcfg.layers : 0.0, tag);
        ref_model_free(d);
        ref_model_free(m);
    }
    return bad ? fail("the one-expert MoE differs from the dense model") : 0;
}

/*
** moe-layout: the tensor table of a mixture of experts (the checkpoint layout): after
** ln_2 each layer holds mlp.router.weight [E,C] and, per expert, c_fc.weight [C,Fe],
** c_fc.bias [Fe], c_proj.weight [Fe,C], c_proj.bias [C] (biases only with moe.bias); weight
** decay on the router and expert weights only; init N(0,0.02) for the router and c_fc,
** N(0,0.02/sqrt(2L)) for c_proj, zero biases. Saving and loading the model is exact.
*/
static int test_moe_layout(const char *dir)
{
    int bad = 0;
    for (int bias = 0; bias < 2; bias++) {
        ref_config cfg = {.layers = 2, .hidden = 4, .heads = 2, .seq = 3, .vocab = 5, .ffn = 16,
                          .ln_eps = 1e-5};
        cfg.moe = (ref_moe_config){.experts = 3, .top_k = 2, .ffn = 6, .bias = bias};
        ref_model *m = ref_model_new(&cfg);
        int i = 0;
        for (int l = 0; l < 2 && !bad; l++) {
            char want[REF_NAME_MAX];
            while (i < m->ntensors && strstr(m->tensors[i].name, "ln_2.bias") == NULL)
                i++;
            i++;
            snprintf(want, sizeof want, "h.%d.mlp.router.weight", l);
            const ref_tensor *t = &m->tensors[i++];
            if (strcmp(t->name, want) != 0 || t->shape[0] != 3 || t->shape[1] != 4 ||
                !t->decay || t->init != REF_INIT_NORMAL)
                bad += fail("  after ln_2: %s [%ld,%ld], want %s [3,4] (decay, normal init)",
                            t->name, t->shape[0], t->shape[1], want);
            for (int e = 0; e < 3; e++) {
                static const struct {
                    const char *suffix;
                    int ndim, d0, d1, decay, bias_only;
                    ref_init_kind init;
                } want_t[4] = {
                    {"c_fc.weight", 2, 4, 6, 1, 0, REF_INIT_NORMAL},
                    {"c_fc.bias", 1, 6, 1, 0, 1, REF_INIT_ZERO},
                    {"c_proj.weight", 2, 6, 4, 1, 0, REF_INIT_OUT_PROJ},
                    {"c_proj.bias", 1, 4, 1, 0, 1, REF_INIT_ZERO},
                };
                for (int w = 0; w < 4; w++) {
                    if (want_t[w].bias_only && !bias)
                        continue;
                    snprintf(want, sizeof want, "h.%d.mlp.experts.%d.%s", l, e,
                             want_t[w].suffix);
                    t = &m->tensors[i++];
                    if (strcmp(t->name, want) != 0 || t->ndim != want_t[w].ndim ||
                        t->shape[0] != want_t[w].d0 || t->shape[1] != want_t[w].d1 ||
                        t->decay != want_t[w].decay || t->init != want_t[w].init)
                        bad += fail("  tensor %d is %s [%ld,%ld] decay %d init %d; want %s "
                                    "[%d,%d] decay %d init %d", i - 1, t->name, t->shape[0],
                                    t->shape[1], t->decay, (int)t->init, want, want_t[w].d0,
                                    want_t[w].d1, want_t[w].decay, (int)want_t[w].init);
                }
            }
            if (strstr(m->tensors[i].name, "ln_1.weight") == NULL &&
                strstr(m->tensors[i].name, "ln_f.weight") == NULL)
                bad += fail("  %s follows the last expert", m->tensors[i].name);
        }
        /* ln_1, c_attn, attn.c_proj, ln_2, router, 3 experts; wte, wpe, ln_f */
        size_t per_layer = 2 * 4 + (4 * 12 + 12) + (4 * 4 + 4) + 2 * 4 + 3 * 4 +
                           3 * (2 * 4 * 6 + (bias ? 6 + 4 : 0));
        size_t want_n = 5 * 4 + 3 * 4 + 2 * per_layer + 8;
        if (m->nparams != want_n)
            bad += fail("  bias %d: %zu parameters, want %zu", bias, m->nparams, want_n);
        char *p = path_in(dir, "moe_rt.safetensors");
        ref_model *m2 = ref_model_new(&cfg);
        ref_model_init_random(m, 3);
        for (size_t j = 0; j < m->nparams; j++)
            m->params[j] += (float)(0.25 * ref_rng_normal(4, "offset", j));
        for (size_t j = 0; j < m->nparams; j++)
            m->params[j] = (float)m->params[j];     /* what F32 can hold */
        if (ref_model_save(m, p) < 0 || ref_model_load(m2, p) < 0)
            bad += fail("  could not save and load %s", p);
        else if (memcmp(m->params, m2->params, m->nparams * sizeof(double)) != 0)
            bad += fail("  bias %d: the loaded MoE model differs from the saved one", bias);
        free(p);
        ref_model_free(m);
        ref_model_free(m2);
    }
    return bad ? fail("%d MoE layout check(s) failed", bad) : 0;
}

/* -- Llama ------------------------------------------------------------------------------------ */

/* sum_i a[i] * b[i] */
static double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* n standard normal numbers of stream (seed, name) into x. */
static void fill_normal(double *x, size_t n, uint64_t seed, const char *name)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ref_rng_normal(seed, name, i);
}

/*
** The rotary embedding on N = 4 rows at positions 0, 1, 7, 300 of H = 3 heads of D = 6 (row
** length ld = 20: two extra columns), theta 10000 and 50: position 0 is the identity and the
** extra columns are untouched (both exactly); every value equals x[j] cos a - x[j+D/2] sin a,
** x[j+D/2] cos a + x[j] sin a with a = pos exp(-2j/D ln theta) (1e-13); each pair keeps its
** norm (1e-14); rope_bwd is the transpose, <rope(x), y> = <x, rope_bwd(y)> (1e-14), and undoes
** rope (1e-15); and <rope_m(q), rope_n(k)> depends only on m - n (positions 5, 2 and 103, 100).
*/
static int check_rope(void)
{
    enum { N = 4, H = 3, D = 6, LD = H * D + 2 };
    const int pos[N] = {0, 1, 7, 300};
    const double thetas[2] = {10000.0, 50.0};
    int bad = 0;
    for (int ti = 0; ti < 2; ti++) {
        double theta = thetas[ti];
        double x[N * LD], y[N * LD], z[N * LD], w[N * LD];
        fill_normal(x, N * LD, 20 + (uint64_t)ti, "rope x");
        fill_normal(z, N * LD, 30 + (uint64_t)ti, "rope y");
        memcpy(y, x, sizeof x);
        ref_rope_fwd(y, LD, N, pos, H, D, theta);
        for (int i = 0; i < N; i++)
            for (int c = 0; c < LD; c++) {
                double xv = x[i * LD + c], yv = y[i * LD + c];
                if ((pos[i] == 0 || c >= H * D) && yv != xv)
                    bad += fail("  theta %g row %d col %d: %.17g, want it unchanged %.17g",
                                theta, i, c, yv, xv);
            }
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int j = 0; j < D / 2; j++) {
                    int c0 = i * LD + h * D + j, c1 = c0 + D / 2;
                    double a = pos[i] * exp(-2.0 * j / D * log(theta));
                    double w0 = x[c0] * cos(a) - x[c1] * sin(a);
                    double w1 = x[c1] * cos(a) + x[c0] * sin(a);
                    if (fabs(y[c0] - w0) > 1e-13 || fabs(y[c1] - w1) > 1e-13)
                        bad += fail("  theta %g pos %d head %d pair %d: (%.17g, %.17g), want "
                                    "(%.17g, %.17g)", theta, pos[i], h, j, y[c0], y[c1], w0, w1);
                    if (!close_rel(hypot(y[c0], y[c1]), hypot(x[c0], x[c1]), 1e-14))
                        bad += fail("  theta %g pos %d pair %d: the rotation changed the norm",
                                    theta, pos[i], j);
                }
        memcpy(w, z, sizeof z);
        ref_rope_bwd(w, LD, N, pos, H, D, theta);
        double lhs = dot(y, z, N * LD), rhs = dot(x, w, N * LD);
        if (!close_rel(lhs, rhs, 1e-14))
            bad += fail("  theta %g: <rope(x), y> = %.17g but <x, rope_bwd(y)> = %.17g", theta,
                        lhs, rhs);
        ref_rope_bwd(y, LD, N, pos, H, D, theta);
        for (int c = 0; c < N * LD; c++)
            if (fabs(y[c] - x[c]) > 1e-15 * (1 + fabs(x[c]))) {
                bad += fail("  theta %g: rope_bwd(rope(x))[%d] = %.17g, want %.17g", theta, c,
                            y[c], x[c]);
                break;
            }
        /* relative positions: one head, q at m, k at n */
        double q[2][D], k[2][D];
        const int qp[2] = {5, 103}, kp[2] = {2, 100};
        for (int r = 0; r < 2; r++) {
            fill_normal(q[r], D, 40, "rope q");
            fill_normal(k[r], D, 41, "rope k");
            ref_rope_fwd(q[r], D, 1, &qp[r], 1, D, theta);
            ref_rope_fwd(k[r], D, 1, &kp[r], 1, D, theta);
        }
        if (!close_rel(dot(q[0], k[0], D), dot(q[1], k[1], D), 1e-12))
            bad += fail("  theta %g: <q_5, k_2> = %.17g but <q_103, k_100> = %.17g", theta,
                        dot(q[0], k[0], D), dot(q[1], k[1], D));
    }
    return bad;
}

/*
** RMSNorm: a row worked by hand (x = 1, 2, 3, 4; w = 1, 0.5, 2, -1; eps 1e-5: mean square 7.5,
** no centring) to 1e-15; invariance to scaling the row when eps = 0; the backward against
** central differences of r . out in every input and weight element (3 rows of 5), and that
** it adds (a second call doubles the gradients, to rounding).
*/
static int check_rmsnorm(void)
{
    int bad = 0;
    const double x[4] = {1, 2, 3, 4}, w[4] = {1, 0.5, 2, -1};
    double out[4], rstd, want_rstd = 1.0 / sqrt(7.5 + 1e-5);
    ref_rmsnorm_fwd(out, &rstd, x, w, 1, 4, 1e-5);
    if (!close_rel(rstd, want_rstd, 1e-15))
        bad += fail("  rstd of (1,2,3,4) = %.17g, want %.17g", rstd, want_rstd);
    for (int c = 0; c < 4; c++)
        if (!close_rel(out[c], x[c] * want_rstd * w[c], 1e-15))
            bad += fail("  rmsnorm (1,2,3,4)[%d] = %.17g, want %.17g", c, out[c],
                        x[c] * want_rstd * w[c]);
    double xs[4], outs[4], rs;
    for (int c = 0; c < 4; c++)
        xs[c] = 37.0 * x[c];
    ref_rmsnorm_fwd(out, &rstd, x, w, 1, 4, 0.0);
    ref_rmsnorm_fwd(outs, &rs, xs, w, 1, 4, 0.0);
    for (int c = 0; c < 4; c++)
        if (!close_rel(outs[c], out[c], 1e-15))
            bad += fail("  rmsnorm(37 x)[%d] = %.17g, rmsnorm(x) = %.17g", c, outs[c], out[c]);

    enum { N = 3, C = 5 };
    double in[N * C], wt[C], r[N * C], o[N * C], rstd3[N], din[N * C] = {0}, dw[C] = {0};
    fill_normal(in, N * C, 50, "rms in");
    fill_normal(r, N * C, 51, "rms r");
    for (int c = 0; c < C; c++)
        wt[c] = 1.0 + 0.3 * ref_rng_normal(52, "rms w", (uint64_t)c);
    ref_rmsnorm_fwd(o, rstd3, in, wt, N, C, 1e-5);
    ref_rmsnorm_bwd(din, dw, r, in, wt, rstd3, N, C);
    fd_tally t = {0};
    for (int which = 0; which < 2; which++) {
        double *p = which ? wt : in;
        const double *an = which ? dw : din;
        for (int e = 0; e < (which ? C : N * C); e++) {
            double p0 = p[e];
            p[e] = p0 + FD_H;
            ref_rmsnorm_fwd(o, rstd3, in, wt, N, C, 1e-5);
            double lp = dot(r, o, N * C);
            p[e] = p0 - FD_H;
            ref_rmsnorm_fwd(o, rstd3, in, wt, N, C, 1e-5);
            double lm = dot(r, o, N * C);
            p[e] = p0;
            fd_compare(&t, which ? "rmsnorm dw" : "rmsnorm din", (size_t)e, an[e],
                       (lp - lm) / (2 * FD_H));
        }
    }
    if (t.bad)
        bad += fail("  rmsnorm backward: %d of %d elements off", t.bad, t.checked);
    double din2[N * C], dw2[C];
    memcpy(din2, din, sizeof din);
    memcpy(dw2, dw, sizeof dw);
    ref_rmsnorm_fwd(o, rstd3, in, wt, N, C, 1e-5);
    ref_rmsnorm_bwd(din2, dw2, r, in, wt, rstd3, N, C);
    for (int e = 0; e < N * C; e++)
        if (!close_rel(din2[e], 2 * din[e], 1e-15) ||
            (e < C && !close_rel(dw2[e], 2 * dw[e], 1e-15))) {
            bad += fail("  ref_rmsnorm_bwd does not add into din and dw");
            break;
        }
    return bad;
}

/*
** SwiGLU: silu(0) = 0, silu(g) ~ g for large g and ~ 0 for very negative g, silu(1) * 2 =
** 2 / (1 + e^-1); the backward against central differences of r . out for gate and up, and
** that it writes (stale values in dgate and dup are overwritten).
*/
static int check_swiglu(void)
{
    int bad = 0;
    const double g[4] = {0.0, 40.0, -40.0, 1.0}, u[4] = {3.0, 0.5, 2.0, 2.0};
    const double want[4] = {0.0, 20.0, -80.0 * exp(-40.0), 2.0 / (1.0 + exp(-1.0))};
    double out[4];
    ref_swiglu_fwd(out, g, u, 4);
    for (int i = 0; i < 4; i++)
        if (!(fabs(out[i] - want[i]) <= 1e-15 * fabs(want[i])))
            bad += fail("  swiglu(%g, %g) = %.17g, want %.17g", g[i], u[i], out[i], want[i]);

    enum { n = 9 };
    double gate[n], up[n], r[n], o[n], dg[n], du[n];
    fill_normal(gate, n, 60, "swiglu gate");
    fill_normal(up, n, 61, "swiglu up");
    fill_normal(r, n, 62, "swiglu r");
    for (int i = 0; i < n; i++)
        dg[i] = du[i] = 99.0;
    ref_swiglu_bwd(dg, du, r, gate, up, n);
    fd_tally t = {0};
    for (int which = 0; which < 2; which++) {
        double *p = which ? up : gate;
        for (int e = 0; e < n; e++) {
            double p0 = p[e];
            p[e] = p0 + FD_H;
            ref_swiglu_fwd(o, gate, up, n);
            double lp = dot(r, o, n);
            p[e] = p0 - FD_H;
            ref_swiglu_fwd(o, gate, up, n);
            double lm = dot(r, o, n);
            p[e] = p0;
            fd_compare(&t, which ? "swiglu dup" : "swiglu dgate", (size_t)e,
                       which ? du[e] : dg[e], (lp - lm) / (2 * FD_H));
        }
    }
    if (t.bad)
        bad += fail("  swiglu backward: %d of %d elements off (or it added to stale values)",
                    t.bad, t.checked);
    return bad;
}

/*
** Grouped-query attention (B = 2, T = 5, H = 4, D = 3) against the reference's multi-head
** attention on packed q | k | v with each key/value head repeated for its H/K query heads
** (Hugging Face's repeat_kv): K = 4 (plain MHA) and K = 2, 1. Forward and att exactly equal;
** dq exactly, dk and dv (the sum over each group) to 1e-14.
*/
static int check_gqa(void)
{
    enum { B = 2, T = 5, H = 4, D = 3, C = H * D, N = B * T };
    int bad = 0;
    for (int K = H; K >= 1; K /= 2) {
        int KD = K * D, group = H / K;
        double q[N * C], k[N * C], v[N * C], qkv[N * 3 * C], dout[N * C];
        double out[N * C], att[B * H * T * T], mout[N * C], matt[B * H * T * T];
        double dq[N * C] = {0}, dk[N * C] = {0}, dv[N * C] = {0}, dqkv[N * 3 * C] = {0};
        fill_normal(q, N * C, 70, "gqa q");
        fill_normal(k, (size_t)N * KD, 71, "gqa k");
        fill_normal(v, (size_t)N * KD, 72, "gqa v");
        fill_normal(dout, N * C, 73, "gqa dout");
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    int kv = (h / group) * D + d;
                    qkv[n * 3 * C + h * D + d] = q[n * C + h * D + d];
                    qkv[n * 3 * C + C + h * D + d] = k[n * KD + kv];
                    qkv[n * 3 * C + 2 * C + h * D + d] = v[n * KD + kv];
                }
        ref_attention_gqa_fwd(out, att, q, k, v, B, T, H, K, D);
        ref_attention_fwd(mout, matt, qkv, B, T, C, H);
        if (memcmp(out, mout, sizeof out) != 0 || memcmp(att, matt, sizeof att) != 0)
            bad += fail("  K=%d: the GQA forward differs from MHA with repeated kv heads", K);
        ref_attention_gqa_bwd(dq, dk, dv, dout, q, k, v, att, B, T, H, K, D);
        ref_attention_bwd(dqkv, dout, qkv, matt, B, T, C, H);
        for (int n = 0; n < N; n++) {
            for (int c = 0; c < C; c++)
                if (dq[n * C + c] != dqkv[n * 3 * C + c])
                    bad += fail("  K=%d: dq[%d,%d] = %.17g, MHA %.17g", K, n, c, dq[n * C + c],
                                dqkv[n * 3 * C + c]);
            for (int c = 0; c < KD; c++) {
                double wk = 0.0, wv = 0.0;
                for (int h = (c / D) * group; h < (c / D + 1) * group; h++) {
                    wk += dqkv[n * 3 * C + C + h * D + c % D];
                    wv += dqkv[n * 3 * C + 2 * C + h * D + c % D];
                }
                if (fabs(dk[n * KD + c] - wk) > 1e-14 * (1 + fabs(wk)) ||
                    fabs(dv[n * KD + c] - wv) > 1e-14 * (1 + fabs(wv)))
                    bad += fail("  K=%d: dk, dv[%d,%d] = %.17g, %.17g; group sums %.17g, %.17g",
                                K, n, c, dk[n * KD + c], dv[n * KD + c], wk, wv);
            }
        }
    }
    return bad;
}

/* llama-ops: the single Llama ops (check_rope, check_rmsnorm, check_swiglu, check_gqa). */
static int test_llama_ops(void)
{
    int bad = check_rope();
    bad += check_rmsnorm();
    bad += check_swiglu();
    bad += check_gqa();
    return bad ? fail("%d Llama op check(s) failed", bad) : 0;
}

/* The Llama model of the gradient checks: 2 layers, C = 16, H = 4 (D = 4), T = 5, V = 11,
** F = 12; with E > 0 experts of width 6. */
static ref_config llama_config(int K, int tied, double theta, int E, int k, int pre, double aux,
                               double cap)
{
    ref_config c = {.layers = 2, .hidden = 16, .heads = 4, .seq = 5, .vocab = 11, .ffn = 12,
                    .ln_eps = 1e-5, .arch = REF_ARCH_LLAMA, .kv_heads = K,
                    .rope_theta = theta, .tie_embeddings = tied};
    if (E > 0)
        c.moe = (ref_moe_config){.experts = E, .top_k = k, .ffn = 6, .pre_softmax = pre,
                                 .aux_coeff = aux, .capacity = cap};
    return c;
}

/*
** llama-gradcheck: every element of every tensor of the whole Llama model (llama_config) over
** 4 sequences of 5 tokens in 2 micro-batches of 2, against central differences (FD_RTOL,
** FD_ATOL), in five configurations: GQA K=2 < H=4 untied (theta 10000); K=1 tied, theta 3 (so
** the angles are large at every frequency); K=4 (MHA) untied; Mixtral experts E=4 top-2 with
** aux 0.1, K=2; and top-1 pre-softmax with aux 0.1 and capacity 1.0 (tokens dropped), tied.
** For the MoE configurations also the MoE op alone with Llama's experts (input gradient and
** every router/expert element). Routing flips are skipped as in moe-gradcheck (at most 1%).
*/
static int test_llama_gradcheck(void)
{
    static const struct {
        int K, tied;
        double theta;
        int E, k, pre;
        double aux, cap;
    } cases[] = {
        {2, 0, 10000.0, 0, 0, 0, 0.0, 0.0}, {1, 1, 3.0, 0, 0, 0, 0.0, 0.0},
        {4, 0, 10000.0, 0, 0, 0, 0.0, 0.0}, {2, 0, 10000.0, 4, 2, 0, 0.1, 0.0},
        {2, 1, 10000.0, 4, 1, 1, 0.1, 1.0},
    };
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ref_config cfg = llama_config(cases[c].K, cases[c].tied, cases[c].theta, cases[c].E,
                                      cases[c].k, cases[c].pre, cases[c].aux, cases[c].cap);
        char what[160], moe[96] = "";
        if (cfg.moe.experts > 0)
            describe_moe(moe, sizeof moe, &cfg.moe);
        snprintf(what, sizeof what, "K=%d%s theta %g%s%s", cfg.kv_heads,
                 cfg.tie_embeddings ? " tied" : "", cfg.rope_theta, moe[0] ? " " : "", moe);
        bad += gradcheck_whole(&cfg, cfg.moe.experts > 0 ? 700 + 16 * (uint64_t)c
                                                        : 700 + (uint64_t)c, what);
        if (cfg.moe.experts == 0)
            continue;

        moe_op op;
        moe_op_new_arch(&op, &cfg.moe, REF_ARCH_LLAMA, 2, 5, 8);
        fill_lively(op.m, 800 + (uint64_t)c);
        for (int i = 0; i < op.N * op.C; i++)
            op.x[i] = ref_rng_normal(900 + (uint64_t)c, "x", (uint64_t)i);
        fd_tally u = {0};
        gradcheck_moe_op(&u, &op);
        printf("  op    %s: %d elements, %d skipped\n", what, u.checked, u.skipped);
        if (u.bad || u.skipped * 100 > u.checked || u.checked < 4 * 3 * 6 * 8)
            bad += fail("  op %s: %d off, %d skipped of %d", what, u.bad, u.skipped, u.checked);
        moe_op_free(&op);
    }
    /* Mixtral experts with a shared SwiGLU expert of width 6 (Qwen2-MoE's, without its gate) */
    ref_config sh = llama_config(2, 0, 10000.0, 4, 2, 0, 0.1, 0.0);
    sh.moe.shared_ffn = 6;
    char what[160];
    describe_moe(what, sizeof what, &sh.moe);
    bad += gradcheck_whole(&sh, 790, what);
    return bad ? fail("%d Llama gradient check(s) failed", bad) : 0;
}

/* One expected tensor of the Llama layout. */
typedef struct want_tensor {
    const char *name;
    long d0, d1;                /* d1 = 0: 1-D */
    ref_init_kind init;
} want_tensor;

/* Compare m's tensor i with w (name, shape, decay = 2-D, init kind); 0 or 1 failure. */
static int check_tensor(const ref_model *m, int i, const want_tensor *w)
{
    const ref_tensor *t = &m->tensors[i];
    int ndim = w->d1 ? 2 : 1;
    if (strcmp(t->name, w->name) == 0 && t->ndim == ndim && t->shape[0] == w->d0 &&
        (ndim == 1 || t->shape[1] == w->d1) && t->decay == (ndim == 2) && t->init == w->init)
        return 0;
    return fail("  tensor %d is %s [%ld,%ld] decay %d init %d; want %s [%ld,%ld] decay %d "
                "init %d", i, t->name, t->shape[0], t->shape[1], t->decay, (int)t->init,
                w->name, w->d0, w->d1, ndim == 2, (int)w->init);
}

/*
** llama-layout: the tensor table (= checkpoint layout) of Llama models, 2 layers, C = 8,
** H = 4, K = 2 (D = 2), F = 12, V = 5: names, shapes, order, decay (2-D only) and init kinds,
** untied and tied (no lm_head.weight; the head is embed_tokens) and with 3 Mixtral experts of
** width 6; parameter counts; save + load exact. Then init values: a 4-layer C = 64, H = 4,
** K = 2 model and its MoE twin through check_init_values (o_proj, down_proj, w2 at
** 0.02/sqrt(8)), o_proj[3] = float(0.02/sqrt(8) * ref_rng_normal(7, name, 3)), norms 1.
*/
static int test_llama_layout(const char *dir)
{
    int bad = 0;
    for (int variant = 0; variant < 3; variant++) {
        int tied = variant == 1, E = variant == 2 ? 3 : 0;
        ref_config cfg = {.layers = 2, .hidden = 8, .heads = 4, .seq = 3, .vocab = 5, .ffn = 12,
                          .ln_eps = 1e-5, .arch = REF_ARCH_LLAMA, .kv_heads = 2,
                          .tie_embeddings = tied};
        if (E)
            cfg.moe = (ref_moe_config){.experts = E, .top_k = 2, .ffn = 6};
        ref_model *m = ref_model_new(&cfg);
        want_tensor want[64];
        char names[64][REF_NAME_MAX];
        int nw = 0;
#define WANT(d0_, d1_, init_, ...)                                                  \
        do {                                                                        \
            snprintf(names[nw], REF_NAME_MAX, __VA_ARGS__);                         \
            want[nw] = (want_tensor){names[nw], d0_, d1_, init_};                   \
            nw++;                                                                   \
        } while (0)
        WANT(5, 8, REF_INIT_NORMAL, "model.embed_tokens.weight");
        for (int l = 0; l < 2; l++) {
            WANT(8, 0, REF_INIT_ONE, "model.layers.%d.input_layernorm.weight", l);
            WANT(8, 8, REF_INIT_NORMAL, "model.layers.%d.self_attn.q_proj.weight", l);
            WANT(4, 8, REF_INIT_NORMAL, "model.layers.%d.self_attn.k_proj.weight", l);
            WANT(4, 8, REF_INIT_NORMAL, "model.layers.%d.self_attn.v_proj.weight", l);
            WANT(8, 8, REF_INIT_OUT_PROJ, "model.layers.%d.self_attn.o_proj.weight", l);
            WANT(8, 0, REF_INIT_ONE, "model.layers.%d.post_attention_layernorm.weight", l);
            if (!E) {
                WANT(12, 8, REF_INIT_NORMAL, "model.layers.%d.mlp.gate_proj.weight", l);
                WANT(12, 8, REF_INIT_NORMAL, "model.layers.%d.mlp.up_proj.weight", l);
                WANT(8, 12, REF_INIT_OUT_PROJ, "model.layers.%d.mlp.down_proj.weight", l);
                continue;
            }
            WANT(3, 8, REF_INIT_NORMAL, "model.layers.%d.block_sparse_moe.gate.weight", l);
            for (int e = 0; e < E; e++) {
                WANT(6, 8, REF_INIT_NORMAL,
                     "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
                WANT(8, 6, REF_INIT_OUT_PROJ,
                     "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
                WANT(6, 8, REF_INIT_NORMAL,
                     "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
            }
        }
        WANT(8, 0, REF_INIT_ONE, "model.norm.weight");
        if (!tied)
            WANT(5, 8, REF_INIT_NORMAL, "lm_head.weight");
#undef WANT
        if (m->ntensors != nw)
            bad += fail("  variant %d: %d tensors, want %d", variant, m->ntensors, nw);
        for (int i = 0; i < nw && i < m->ntensors; i++)
            bad += check_tensor(m, i, &want[i]);
        size_t per_layer = 8 + 64 + 2 * 32 + 64 + 8 + (E ? 3 * 8 + E * 3 * 48 : 3 * 96);
        size_t want_n = 40 + 2 * per_layer + 8 + (tied ? 0 : 40);
        if (m->nparams != want_n)
            bad += fail("  variant %d: %zu parameters, want %zu", variant, m->nparams, want_n);
        if ((m->w.lm_head == m->w.wte) != tied || (m->g.lm_head == m->g.wte) != tied ||
            m->w.wpe != NULL || m->w.ln_f_b != NULL)
            bad += fail("  variant %d: lm_head/wte aliasing wrong, or wpe/ln_f_b present",
                        variant);

        char *p = path_in(dir, "llama_rt.safetensors");
        ref_model *m2 = ref_model_new(&cfg);
        ref_model_init_random(m, 3);
        for (size_t j = 0; j < m->nparams; j++)
            m->params[j] = (float)(m->params[j] + 0.25 * ref_rng_normal(4, "offset", j));
        if (ref_model_save(m, p) < 0 || ref_model_load(m2, p) < 0)
            bad += fail("  could not save and load %s", p);
        else if (memcmp(m->params, m2->params, m->nparams * sizeof(double)) != 0)
            bad += fail("  variant %d: the loaded Llama model differs from the saved one",
                        variant);
        free(p);
        ref_model_free(m);
        ref_model_free(m2);
    }

    ref_config cfg = {.layers = 4, .hidden = 64, .heads = 4, .seq = 64, .vocab = 256,
                      .ffn = 128, .ln_eps = 1e-5, .arch = REF_ARCH_LLAMA, .kv_heads = 2};
    for (int moe = 0; moe < 2; moe++) {
        if (moe)
            cfg.moe = (ref_moe_config){.experts = 4, .top_k = 2, .ffn = 64};
        ref_model *m = ref_model_new(&cfg);
        ref_model_init_random(m, 7);
        bad += check_init_values(m);
        const char *name = "model.layers.1.self_attn.o_proj.weight";
        const ref_tensor *o = ref_model_find(m, name);
        if (o == NULL || m->params[o->offset + 3] !=
                         (double)(float)(0.02 / sqrt(8.0) * ref_rng_normal(7, name, 3)))
            bad += fail("  %s[3] is not float(0.02/sqrt(8) * ref_rng_normal(7, name, 3))", name);
        ref_model_free(m);
    }
    return bad ? fail("%d Llama layout check(s) failed", bad) : 0;
}

/* The Mixtral name of dense Llama tensor 'name' in a one-expert model (mlp.gate_proj ->
** block_sparse_moe.experts.0.w1, up_proj -> w3, down_proj -> w2); other names unchanged. */
static void mixtral_name(char *out, size_t n, const char *name)
{
    static const char *const from[3] = {"mlp.gate_proj.", "mlp.up_proj.", "mlp.down_proj."};
    static const char *const to[3] = {"w1.", "w3.", "w2."};
    for (int i = 0; i < 3; i++) {
        const char *p = strstr(name, from[i]);
        if (p != NULL) {
            snprintf(out, n, "%.*sblock_sparse_moe.experts.0.%s%s", (int)(p - name), name, to[i],
                     p + strlen(from[i]));
            return;
        }
    }
    snprintf(out, n, "%s", name);
}

/*
** llama-moe-dense: one Mixtral expert with top-1 (prob 1) is the dense Llama with the same
** weights (gate = w1, up = w3, down = w2), aux loss off (check_expert_twin). 2 layers, C = 16,
** H = 4, K = 2.
*/
static int test_llama_moe_dense(void)
{
    ref_config dcfg = llama_config(2, 0, 10000.0, 0, 0, 0, 0.0, 0.0);
    ref_config mcfg = llama_config(2, 0, 10000.0, 1, 1, 0, 0.0, 0.0);
    mcfg.moe.ffn = dcfg.ffn;
    ref_model *d = ref_model_new(&dcfg), *m = ref_model_new(&mcfg);
    fill_lively(d, 18);
    fill_lively(m, 19);
    int bad = check_expert_twin(d, m, mixtral_name, 0.0, "Mixtral");
    ref_model_free(d);
    ref_model_free(m);
    return bad ? fail("the one-expert Mixtral differs from the dense Llama") : 0;
}

/* -- Broken files for the error tests --------------------------------------------------------- */

/* Model used for the broken safetensors: --layers 1 --hidden 4 --heads 2 --seq 3 --vocab 5. */
static int mkbad(const char *kind, const char *path)
{
    ref_config cfg = {.layers = 1, .hidden = 4, .heads = 2, .seq = 3, .vocab = 5, .ffn = 16,
                      .ln_eps = 1e-5};
    ref_model *m = ref_model_new(&cfg);
    ref_model_init_random(m, 1);
    int rc = 0;
    if (strcmp(kind, "st-dtype") == 0) {            /* ln_f.bias stored as I32 */
        raw_tensor *rt = ref_xcalloc((size_t)m->ntensors, sizeof *rt);
        unsigned char *bytes = ref_xcalloc(m->nparams, 4);
        char (*shapes)[32] = ref_xcalloc((size_t)m->ntensors, 32);
        for (int i = 0; i < m->ntensors; i++) {
            const ref_tensor *t = &m->tensors[i];
            rt[i].name = t->name;
            rt[i].dtype = i == m->ntensors - 1 ? "I32" : "F32";
            rt[i].shape = shapes[i];
            if (t->ndim == 2)
                snprintf(shapes[i], 32, "[%ld,%ld]", t->shape[0], t->shape[1]);
            else
                snprintf(shapes[i], 32, "[%ld]", t->shape[0]);
            rt[i].bytes = bytes + 4 * t->offset;
            rt[i].nbytes = 4 * t->numel;
        }
        rc = write_raw_st(path, rt, m->ntensors);
        free(rt);
        free(bytes);
        free(shapes);
    } else if (strcmp(kind, "st-json") == 0) {      /* a comma missing in the header */
        static const char text[] = "{\"wte.weight\":{\"dtype\":\"F32\" \"shape\":[5,4],"
                                   "\"data_offsets\":[0,80]}}   ";
        unsigned char buf[8 + sizeof text - 1 + 80] = {0};
        buf[0] = (unsigned char)(sizeof text - 1);
        memcpy(buf + 8, text, sizeof text - 1);
        rc = write_bytes(path, buf, sizeof buf);
    } else if (strcmp(kind, "st-offsets") == 0) {   /* data_offsets run past the end */
        static const char text[] = "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[5,4],"
                                   "\"data_offsets\":[0,80]}}";
        unsigned char buf[8 + sizeof text - 1 + 40] = {0};
        buf[0] = (unsigned char)(sizeof text - 1);
        memcpy(buf + 8, text, sizeof text - 1);
        rc = write_bytes(path, buf, sizeof buf);
    } else {
        rc = fail("mkbad: unknown kind '%s'", kind);
    }
    ref_model_free(m);
    return rc;
}

/* -- main ------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "";
    const char *dir = argc > 2 ? argv[2] : ".";
    if (strcmp(name, "gradcheck") == 0) return test_gradcheck();
    if (strcmp(name, "adamw") == 0) return test_adamw();
    if (strcmp(name, "lr") == 0) return test_lr();
    if (strcmp(name, "clip") == 0) return test_clip();
    if (strcmp(name, "init") == 0) return test_init();
    if (strcmp(name, "accum") == 0) return test_accum();
    if (strcmp(name, "st-roundtrip") == 0) return test_st_roundtrip(dir);
    if (strcmp(name, "st-dtypes") == 0) return test_st_dtypes(dir);
    if (strcmp(name, "batch") == 0) return test_batch(dir);
    if (strcmp(name, "moe-gradcheck") == 0) return test_moe_gradcheck();
    if (strcmp(name, "moe-routing") == 0) return test_moe_routing();
    if (strcmp(name, "moe-capacity") == 0) return test_moe_capacity();
    if (strcmp(name, "moe-dense") == 0) return test_moe_dense();
    if (strcmp(name, "moe-layout") == 0) return test_moe_layout(dir);
    if (strcmp(name, "llama-ops") == 0) return test_llama_ops();
    if (strcmp(name, "llama-gradcheck") == 0) return test_llama_gradcheck();
    if (strcmp(name, "llama-layout") == 0) return test_llama_layout(dir);
    if (strcmp(name, "llama-moe-dense") == 0) return test_llama_moe_dense();
    if (strcmp(name, "mkbad") == 0 && argc == 4) return mkbad(argv[2], argv[3]);
    fprintf(stderr, "usage: ref_test gradcheck|adamw|lr|clip|init|accum [DIR]\n"
                    "       ref_test moe-gradcheck|moe-routing|moe-capacity|moe-dense\n"
                    "       ref_test llama-ops|llama-gradcheck|llama-moe-dense\n"
                    "       ref_test st-roundtrip|st-dtypes|batch|moe-layout|llama-layout DIR\n"
                    "       ref_test mkbad st-dtype|st-json|st-offsets FILE\n");
    return 2;
}
