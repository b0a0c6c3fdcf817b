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

/* -- gradcheck: every parameter's gradient against central differences ------------------------ */

static double mean_loss(const ref_model *m, ref_acts *a, const int *in, const int *tg, int n)
{
    double sum = 0.0;
    for (int s = 0; s < n; s += a->B)
        sum += ref_forward(m, a, in + (size_t)s * m->cfg.seq, tg + (size_t)s * m->cfg.seq);
    return sum / ((double)n * m->cfg.seq);
}

/*
** Tiny model (2 layers, C=8, 2 heads, T=5, V=11, F=32), 2 sequences as 2 micro-batches of 1
** (so accumulation and the 1/(tokens) scale are covered). Every element of every tensor:
** |analytic - fd| <= 1e-6 |fd| + 1e-9 with fd = (L(p+h) - L(p-h)) / 2h, h = 1e-5. Truncation is
** O(h^2) ~ 1e-10 relative and rounding ~ 1e-16/h ~ 1e-11 absolute, far inside the bound; any
** real error in a backward formula is O(1) relative. Tokens 8..10 never appear as inputs,
** so their wte rows are reached only through the tied head; rows 0..7 through both uses.
*/
static int test_gradcheck(void)
{
    ref_config cfg = {.layers = 2, .hidden = 8, .heads = 2, .seq = 5, .vocab = 11, .ffn = 32,
                      .ln_eps = 1e-5};
    const int inputs[10] = {3, 1, 4, 1, 5, 2, 6, 5, 7, 0};
    const int targets[10] = {1, 4, 1, 5, 9, 6, 5, 8, 0, 10};
    const double h = 1e-5, rtol = 1e-6, atol = 1e-9;
    ref_model *m = ref_model_new(&cfg);
    ref_acts *a = ref_acts_new(&cfg, 1);
    fill_lively(m, 42);
    ref_compute_grads(m, a, inputs, targets, 2);
    double *an = ref_xmalloc(m->nparams * sizeof(double));
    memcpy(an, m->grads, m->nparams * sizeof(double));

    int bad = 0, checked = 0;
    for (int ti = 0; ti < m->ntensors; ti++) {
        const ref_tensor *t = &m->tensors[ti];
        double worst = 0.0, gmax = 0.0;
        for (size_t e = 0; e < t->numel; e++) {
            double *p = &m->params[t->offset + e], p0 = *p;
            *p = p0 + h;
            double lp = mean_loss(m, a, inputs, targets, 2);
            *p = p0 - h;
            double lm = mean_loss(m, a, inputs, targets, 2);
            *p = p0;
            double fd = (lp - lm) / (2 * h), g = an[t->offset + e];
            double err = fabs(g - fd), lim = rtol * fabs(fd) + atol;
            if (err / lim > worst)
                worst = err / lim;
            if (fabs(g) > gmax)
                gmax = fabs(g);
            if (err > lim && bad++ < 10)
                printf("  %s[%zu]: analytic %.12g, finite difference %.12g\n", t->name, e, g, fd);
            checked++;
        }
        if (gmax < 1e-6) {
            printf("  %s: every gradient is below 1e-6 (max %.3g): a path is dead\n", t->name,
                   gmax);
            bad++;
        }
        if (worst > 1.0)
            printf("  %s: worst error %.3g x the bound\n", t->name, worst);
    }
    ref_acts_free(a, &cfg);
    ref_model_free(m);
    free(an);
    if (bad)
        return fail("%d of %d gradient elements off (bound 1e-6 rel + 1e-9 abs)", bad, checked);
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
    struct {
        ref_optim o;
        int t;
        double want;
    } cases[] = {
        /* warm-up 10, cosine to step 110 from 1.0 to 0.1 */
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 1, 0.1},
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 5, 0.5},
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 10, 1.0},
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 35,
         0.86819805153394638598037996},     /* 0.1 + 0.45 (1 + cos(pi/4)) */
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 60, 0.55},
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 85,
         0.23180194846605361401962004},     /* 0.1 + 0.45 (1 - cos(pi/4)) */
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 110, 0.1},
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 111, 0.1},
        {{.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay_steps = 110}, 5000, 0.1},
        /* no warm-up: the first step is already a quarter of the way (t=1 of 4) */
        {{.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 4}, 1,
         0.85355339059327376220042218},     /* 0.5 (1 + cos(pi/4)) */
        {{.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 4}, 2, 0.5},
        {{.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 4}, 3,
         0.14644660940672623779957782},
        {{.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 4}, 4, 0.0},
        {{.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay_steps = 4}, 5, 0.0},
        /* decay_steps == warmup: warm-up, then min_lr at once */
        {{.lr = 6e-4, .min_lr = 6e-5, .warmup = 3, .decay_steps = 3}, 3, 6e-4},
        {{.lr = 6e-4, .min_lr = 6e-5, .warmup = 3, .decay_steps = 3}, 4, 6e-5},
        /* no warm-up and decay_steps 0: constant min_lr */
        {{.lr = 6e-4, .min_lr = 2e-4, .warmup = 0, .decay_steps = 0}, 1, 2e-4},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = ref_lr(&cases[i].o, cases[i].t);
        double tol = cases[i].want == 0.0 ? 0.0 : 1e-15;
        if (!(fabs(got - cases[i].want) <= tol * fabs(cases[i].want) + 1e-17))
            bad += fail("  lr=%g min=%g warmup=%d decay=%d t=%d: got %.17g, want %.17g",
                        cases[i].o.lr, cases[i].o.min_lr, cases[i].o.warmup,
                        cases[i].o.decay_steps, cases[i].t, got, cases[i].want);
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
    /* element values depend on (seed, name, index) only: wte is the same at 2 and 4 layers */
    const ref_tensor *w = ref_model_find(m, "wte.weight"), *w2 = ref_model_find(m2, "wte.weight");
    if (memcmp(m->params + w->offset, m2->params + w2->offset, w->numel * sizeof(double)) != 0)
        bad += fail("  wte differs between a 2-layer and a 4-layer model of the same seed");
    if (m->params[w->offset + 5] != (double)(float)(0.02 * ref_rng_normal(7, "wte.weight", 5)))
        bad += fail("  wte[5] is not 0.02 * ref_rng_normal(7, \"wte.weight\", 5)");
    if (memcmp(m->params, m3->params, w->numel * sizeof(double)) == 0)
        bad += fail("  seeds 7 and 8 give the same wte");
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
    return bad ? fail("batching differs from issue 4's rule") : 0;
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
    if (strcmp(name, "mkbad") == 0 && argc == 4) return mkbad(argv[2], argv[3]);
    fprintf(stderr, "usage: ref_test gradcheck|adamw|lr|clip|init|accum [DIR]\n"
                    "       ref_test st-roundtrip|st-dtypes|batch DIR\n"
                    "       ref_test mkbad st-dtype|st-json|st-offsets FILE\n");
    return 2;
}
