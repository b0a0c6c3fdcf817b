/*
** kernel_test.c: every kernel of the library (lib/kernels.h) against the double-precision
** reference's single ops (build/ref/libref.a; where the reference has no such op -- the
** mixture of experts' row movements and routing, the attention log-sum-exp -- the formula
** here; grouped-query attention: the multi-head reference on the kv heads copied to their
** query heads, its kv gradients summed over them) on random inputs, at sizes that are multiples of
** nothing, forward and backward, in both storage dtypes (f32, then bf16). One source, two
** programs: linked with kernels_cpu.c + librt_cpu.a or with kernels_cuda.cu + librt_cuda.a
** (data moves with rt_memcpy, as in the library). Run by tests/kernels/suite.sh; not a
** benchmark.
**
**   kernel_test PREFIX [--dump FILE.safetensors] [--dump-bf16 FILE.safetensors] [--first]
**               [--only OP[,OP...]] [-v]
**
** --first stops at the first failing check, printing its op's FAIL line (the suite's mutants
** need no more). --only runs the named ops alone (their names as printed: "attention" in both
** dtypes, "attention-bf16" in one, "sumsq"), on the inputs the whole run gives them: each op
** draws its random inputs from its own fixed point of the generator's sequence (tests[]).
** Prints "PASS PREFIX/<op>-<dtype>" or "FAIL PREFIX/<op>-<dtype>: why" per op, the first
** mismatches and the max errors of a failing check, and with -v the max errors of every check.
** --dump writes every output of the f32 pass (F32), --dump-bf16 those of the bf16 pass (the
** bf16 values widened), so that runs can be compared: thread counts, CPU against CUDA.
**
** bf16 inputs are random f32 values rounded to bf16 first (here, by an independent rounding:
** the nearer of the two neighbours, computed in double, ties to even); the reference gets those
** values, widened exactly, so a bf16 kernel differs from the reference by its f32 arithmetic and
** by the rounding of its outputs alone.
**
** Tolerances (|got - ref| <= atol + rtol*|ref|, stated per check below):
**   exact    copies, one add, one multiply: the kernel does one f32 operation per element (and
**            in bf16 one rounding), so the result must equal that operation done here, bit for
**            bit.
**   F32_RTOL 1e-5 with atol = 1e-5 * max|ref| of the tensor: the inputs are f32 (or bf16)
**            values, which the reference widens exactly, so every difference is f32 rounding
**            inside the kernel. Its outputs are sums of at most ~1000 products (u = 6e-8;
**            typical error sqrt(K)*u*scale ~ 2e-6), while any logic error (a wrong index, a
**            missing term, the wrong mask) is O(1) of the scale.
**   BF16_REL 2^-8 of the value, added for every output stored in bf16: rounding an f32 value v
**            to the nearest bf16 (8 significant bits) moves it by at most half an ulp, 2^-9 of
**            the power of two below |v|, so <= 2^-8 |v| (the f32 term above stays as it is;
**            atol grows by the same factor). Statistics and f32 gradients keep F32_RTOL.
**            The attention backward reads the bf16 output of the forward, whose rounding enters
**            dsum = rowsum(dout * out): its own bound, at that check.
**   1e-6     sumsq: accumulated in double, rounded once to f32 (one ulp is 6e-8).
*/
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"    // defines: the kernel prototypes (embed_fwd, ..., sum_blocks)
#include "rt.h"         // defines: rt_malloc, rt_memcpy, rt_init, rt_dtype_size, RT_CHECK
#include "gpt2_ref.h"   // defines: ref_embed_fwd, ref_layernorm_bwd, ..., ref_adamw_update

#define F32_RTOL 1e-5
#define BF16_REL 0x1p-8 /* one rounding to bf16, relative to the value */
#define SHOW     5      /* mismatches printed per failing check */

/* -- Results of the current op ------------------------------------------------------------- */

static const char *prefix;      /* "kernels/cpu-t2" */
static int verbose;
static int op_failed;           /* the current op has a failing check */
static char op_why[200];        /* its first failure, for the FAIL line */
static int any_failed;
static rt_dtype dt;             /* the storage dtype of this pass: RT_F32, then RT_BF16 */

static const char *dt_name(void) { return dt == RT_BF16 ? "bf16" : "f32"; }

static const char *cur_op;      /* the op running (main's tests[]) */
static int cur_typed;           /* it runs in this pass's storage dtype */
static int stop_first;          /* --first: exit at the first failing check */

static void op_begin(void)
{
    op_failed = 0;
    op_why[0] = 0;
}

static void op_line(void)
{
    char name[64];
    snprintf(name, sizeof name, cur_typed ? "%s-%s" : "%s", cur_op, dt_name());
    if (op_failed) printf("FAIL %s/%s: %s\n", prefix, name, op_why);
    else printf("PASS %s/%s\n", prefix, name);
    fflush(stdout);
}

/* op: the name; typed: the op ran in this pass's storage dtype (its name gets "-f32"/"-bf16") */
static void op_end(const char *op, int typed)
{
    if (strcmp(op, cur_op) || typed != cur_typed) {
        fprintf(stderr, "kernel_test: test '%s' ends op '%s': tests[] in main is out of date\n",
                cur_op, op);
        exit(2);
    }
    op_line();
    any_failed |= op_failed;
}

static void fail(const char *fmt, ...) RT_PRINTF(1, 2);
static void fail(const char *fmt, ...)
{
    if (!op_failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op_why, sizeof op_why, fmt, ap);
        va_end(ap);
    }
    op_failed = 1;
    if (stop_first) {           /* --first: the first failing check is the verdict */
        op_line();
        rt_finalize();
        exit(1);
    }
}

/*
** Compare got[n] (f32) with want[n] (double): mismatches are |got - want| > atol + rtol*|want|
** + extra[i] (atol = rtol * max|want| when atol < 0; extra may be NULL). NaN never matches. On
** failure prints the first SHOW mismatches and the max errors; -v prints the max errors always.
*/
static void check_bound(const char *what, const float *got, const double *want, size_t n,
                        double atol, double rtol, const double *extra)
{
    double scale = 0, max_abs = 0, max_rel = 0, max_used = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    if (atol < 0) atol = rtol * scale;
    long long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double r = want[i] != 0 ? d / fabs(want[i]) : d;
        double tol = atol + rtol * fabs(want[i]) + (extra ? extra[i] : 0.0);
        if (!(d <= max_abs)) max_abs = d;
        if (!(r <= max_rel)) max_rel = r;
        if (tol > 0 && !(d / tol <= max_used)) max_used = d / tol;
        if (!(d <= tol)) {
            if (bad < SHOW) {
                if (bad == 0) printf("  %s: first mismatches (got vs reference)\n", what);
                printf("    [%zu] %.9g vs %.9g  (abs %.3g)\n", i, got[i], want[i], d);
            }
            bad++;
        }
    }
    if (bad || verbose)
        printf("  %s: n %zu, max abs %.3g (atol %.3g), max rel %.3g, scale %.3g, %.2f of the "
               "tolerance%s\n", what, n, max_abs, atol, max_rel, scale, max_used,
               bad ? "  MISMATCH" : "");
    if (bad) fail("%s: %lld of %zu values out of tolerance (max abs %.3g)", what, bad, n, max_abs);
}

/* An f32 result (statistics, gradients) against the reference. */
static void check(const char *what, const float *got, const double *want, size_t n, double atol,
                  double rtol)
{
    check_bound(what, got, want, n, atol, rtol, NULL);
}

/* A result stored in this pass's dtype: in bf16 one rounding more (BF16_REL); extra (may be
** NULL) as check_bound's. */
static void check_st_bound(const char *what, const float *got, const double *want, size_t n,
                           double atol, double rtol, const double *extra)
{
    if (dt == RT_BF16) {
        double scale = 0;
        for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
        atol = (atol < 0 ? rtol * scale : atol) * (1 + BF16_REL);
        rtol += BF16_REL;
    }
    check_bound(what, got, want, n, atol, rtol, extra);
}

static void check_st(const char *what, const float *got, const double *want, size_t n,
                     double atol, double rtol)
{
    check_st_bound(what, got, want, n, atol, rtol, NULL);
}

/* Bit-for-bit equality with a computation done here. */
static void check_exact(const char *what, const float *got, const float *want, size_t n)
{
    long long bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float))) {
            if (bad < SHOW) {
                if (bad == 0) printf("  %s: first mismatches (got vs expected, exact)\n", what);
                printf("    [%zu] %.9g vs %.9g\n", i, got[i], want[i]);
            }
            bad++;
        }
    if (bad) fail("%s: %lld of %zu values differ (exact)", what, bad, n);
}

static void check_finite(const char *what, const float *got, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(got[i])) {
            printf("  %s: [%zu] is %g\n", what, i, got[i]);
            fail("%s: a value is not finite", what);
            return;
        }
}

/* -- Outputs kept for --dump ----------------------------------------------------------------- */

typedef struct { char name[160]; float *v; size_t n; } dumped;
typedef struct { dumped *d; int n, cap; } dump_list;
static dump_list dumps[2];      /* [0]: f32 pass, [1]: bf16 pass */

static void keep(const char *name, const float *v, size_t n)
{
    dump_list *l = &dumps[dt == RT_BF16];
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->d = realloc(l->d, sizeof(dumped) * (size_t)l->cap);
        if (!l->d) { fprintf(stderr, "kernel_test: out of memory\n"); exit(2); }
    }
    dumped *d = &l->d[l->n++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->v = malloc((n ? n : 1) * sizeof(float));
    if (!d->v) { fprintf(stderr, "kernel_test: out of memory\n"); exit(2); }
    memcpy(d->v, v, n * sizeof(float));
    d->n = n;
}

/* A safetensors file of 1-D F32 tensors, in the order kept (header padded to 8 bytes). */
static int write_dump(const dump_list *l, const char *path)
{
    size_t cap = 64 + (size_t)l->n * 256, len = 0, off = 0;
    char *h = malloc(cap);
    if (!h) return -1;
    len += (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < l->n; i++) {
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu],"
                                "\"data_offsets\":[%zu,%zu]}", i ? "," : "", l->d[i].name,
                                l->d[i].n, off, off + 4 * l->d[i].n);
        off += 4 * l->d[i].n;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) { free(h); return -1; }
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int ok = fwrite(l8, 8, 1, f) == 1 && fwrite(h, 1, len, f) == len;
    for (int i = 0; i < l->n && ok; i++)            /* little-endian hosts only (x86, arm) */
        ok = fwrite(l->d[i].v, sizeof(float), l->d[i].n, f) == l->d[i].n;
    ok = fclose(f) == 0 && ok;
    free(h);
    return ok ? 0 : -1;
}

/* -- Host and device buffers ----------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void)      /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next() >> 40) * 0x1p-24);
}

static void *xmalloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) { fprintf(stderr, "kernel_test: out of memory\n"); exit(2); }
    return p;
}

/* x rounded to bf16, chosen independently of the kernels' bit arithmetic: the nearer of the two
** bf16 neighbours (truncation toward zero and the next one out), compared in double; a tie
** goes to the even one; past the largest bf16, half an ulp rounds to infinity; NaN stays. */
static float bf16_round(float x)
{
    if (isnan(x)) return x;
    uint32_t u, uhi;
    memcpy(&u, &x, 4);
    uint32_t ulo = u & 0xffff0000u;
    uhi = ulo + 0x10000u;
    float lo, hi;
    memcpy(&lo, &ulo, 4);
    memcpy(&hi, &uhi, 4);
    if (ulo == u) return x;
    double dhi = isinf(hi) ? copysign(ldexp(1.0, 128), x) : (double)hi;
    double elo = fabs((double)x - (double)lo), ehi = fabs(dhi - (double)x);
    if (elo < ehi) return lo;
    if (ehi < elo) return hi;
    return (ulo >> 16) & 1 ? hi : lo;
}

static uint16_t bf16_bits(float x)      /* x must be a bf16 value (or NaN) */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x as this pass stores it: itself (f32) or rounded to bf16 */
static float st_round(float x) { return dt == RT_BF16 ? bf16_round(x) : x; }

static float *frand(size_t n, float lo, float hi)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}

/* random values representable in this pass's dtype */
static float *frand_st(size_t n, float lo, float hi)
{
    float *x = frand(n, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = st_round(x[i]);
    return x;
}

static float *fconst(size_t n, float v)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

static double *widen(const float *x, size_t n)
{
    double *d = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = rt_malloc(bytes ? bytes : 1);
    if (bytes) rt_memcpy(d, host, bytes, RT_H2D);
    return d;
}

static float *down(const float *dev, size_t n)   /* a new host copy of a device f32 buffer */
{
    float *h = xmalloc(n * sizeof(float));
    if (n) rt_memcpy(h, dev, n * sizeof(float), RT_D2H);
    return h;
}

/* A device buffer of this pass's dtype holding x (values already representable). */
static void *dev_st(const float *x, size_t n)
{
    if (dt == RT_F32) return dev_copy(x, n * sizeof(float));
    uint16_t *h = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) h[i] = bf16_bits(bf16_round(x[i]));
    void *d = dev_copy(h, n * sizeof(uint16_t));
    free(h);
    return d;
}

static void *dev_st_nan(size_t n)
{
    float *nan = fconst(n, NAN);
    void *d = dev_st(nan, n);
    free(nan);
    return d;
}

/* A new host f32 copy of a device buffer of this pass's dtype (bf16 widened). */
static float *down_st(const void *dev, size_t n)
{
    if (dt == RT_F32) return down(dev, n);
    uint16_t *h = xmalloc(n * sizeof(uint16_t));
    if (n) rt_memcpy(h, dev, n * sizeof(uint16_t), RT_D2H);
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = bf16_value(h[i]);
    free(h);
    return x;
}

/* Sequence-major (row t*B + b, ours) <-> batch-major (row b*T + t, the reference's). */
static double *to_batch_major(const double *x, int T, int B, int C)
{
    double *y = xmalloc((size_t)T * B * C * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            memcpy(y + ((size_t)b * T + t) * C, x + ((size_t)t * B + b) * C, C * sizeof(double));
    return y;
}

static double *to_seq_major(const double *x, int T, int B, int C)
{
    double *y = xmalloc((size_t)T * B * C * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            memcpy(y + ((size_t)t * B + b) * C, x + ((size_t)b * T + t) * C, C * sizeof(double));
    return y;
}

static char *label(const char *op, const char *what, const char *size)
{
    static char buf[160];
    snprintf(buf, sizeof buf, "%s.%s.%s", op, what, size);
    return buf;
}

/* -- Embedding: token and position ----------------------------------------------------------- */

/*
** Tokens (T, B) drawn from [0, V) with repeats; a rank owning vocabulary rows [vstart,
** vstart + vrows) looks up its rows and leaves zeros for the others (vocab-parallel, §4.4).
** Position rows come from wpe rows t0 .. t0+T-1 (sequence-parallel / context offsets).
*/
static void test_embed_case(int T, int B, int C, int V, int vstart, int vrows, int t0)
{
    char size[64];
    snprintf(size, sizeof size, "T%dB%dC%dV%d_v%d+%d_t%d", T, B, C, V, vstart, vrows, t0);
    int N = T * B, Tw = t0 + T + 2;
    int *tok = xmalloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) tok[n] = (int)(rng_next() % (uint64_t)V);
    float *wte = frand_st((size_t)V * C, -1, 1), *wpe = frand_st((size_t)Tw * C, -1, 1);
    float *dout = frand_st((size_t)N * C, -1, 1);
    /* dwte gets V rows: those past vrows are a guard that must stay untouched */
    float *dwte0 = frand((size_t)V * C, -1, 1), *dwpe0 = frand((size_t)Tw * C, -1, 1);

    int *d_tok = dev_copy(tok, (size_t)N * sizeof(int));
    void *d_wte = dev_st(wte + (size_t)vstart * C, (size_t)vrows * C);
    void *d_wpe = dev_st(wpe, (size_t)Tw * C);
    void *d_out = dev_st_nan((size_t)N * C), *d_dout = dev_st(dout, (size_t)N * C);
    float *d_dwte = dev_copy(dwte0, (size_t)V * C * sizeof(float));
    float *d_dwpe = dev_copy(dwpe0, (size_t)Tw * C * sizeof(float));

    /* embed_fwd overwrites with a copy (or zeros): exact */
    embed_fwd(d_out, d_tok, d_wte, N, C, vstart, vrows, dt);
    float *got = down_st(d_out, (size_t)N * C), *want = xmalloc((size_t)N * C * sizeof(float));
    for (int n = 0; n < N; n++) {
        int v = tok[n] - vstart, own = v >= 0 && v < vrows;
        for (int c = 0; c < C; c++) want[(size_t)n * C + c] = own ? wte[(size_t)tok[n] * C + c] : 0;
    }
    check_exact(label("embed_fwd", "out", size), got, want, (size_t)N * C);
    keep(label("embed_fwd", "out", size), got, (size_t)N * C);

    /* pos_fwd adds wpe[t0 + t]: one f32 add (and one rounding), exact */
    pos_fwd(d_out, d_wpe, T, B, C, t0, dt);
    float *got2 = down_st(d_out, (size_t)N * C);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++) {
                size_t i = ((size_t)t * B + b) * C + c;
                want[i] = st_round(want[i] + wpe[(size_t)(t0 + t) * C + c]);
            }
    check_exact(label("pos_fwd", "out", size), got2, want, (size_t)N * C);
    keep(label("pos_fwd", "out", size), got2, (size_t)N * C);

    /* against the reference's embedding (whole vocabulary owned only) */
    if (vstart == 0 && vrows == V) {
        int *tok_bm = xmalloc((size_t)N * sizeof(int));
        for (int t = 0; t < T; t++)
            for (int b = 0; b < B; b++) tok_bm[b * T + t] = tok[t * B + b];
        double *rwte = widen(wte, (size_t)V * C);
        double *rwpe = widen(wpe + (size_t)t0 * C, (size_t)T * C);
        double *rout = xmalloc((size_t)N * C * sizeof(double));
        ref_embed_fwd(rout, tok_bm, rwte, rwpe, B, T, C);
        double *rs = to_seq_major(rout, T, B, C);
        check_st(label("embed+pos", "ref", size), got2, rs, (size_t)N * C, 0, 1e-7);
        free(tok_bm); free(rwte); free(rwpe); free(rout); free(rs);
    }

    /* backward: dwte rows of owned tokens += dout rows (token order), dwpe[t0 + t] += sum_b */
    embed_bwd(d_dwte, d_dout, d_tok, N, C, vstart, vrows, dt);
    pos_bwd(d_dwpe, d_dout, T, B, C, t0, dt);
    float *gdwte = down(d_dwte, (size_t)V * C), *gdwpe = down(d_dwpe, (size_t)Tw * C);
    double *rdwte = xmalloc((size_t)V * C * sizeof(double));
    double *rdwpe = xmalloc((size_t)T * C * sizeof(double));
    for (int v = 0; v < vrows; v++)
        for (int c = 0; c < C; c++) rdwte[(size_t)(vstart + v) * C + c] = dwte0[(size_t)v * C + c];
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) rdwpe[(size_t)t * C + c] = dwpe0[(size_t)(t0 + t) * C + c];
    int *tok_bm = xmalloc((size_t)N * sizeof(int));
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++) tok_bm[b * T + t] = tok[t * B + b];
    double *rdout = widen(dout, (size_t)N * C), *rdout_bm = to_batch_major(rdout, T, B, C);
    ref_embed_bwd(rdwte, rdwpe, rdout_bm, tok_bm, B, T, C);
    check(label("embed_bwd", "dwte", size), gdwte, rdwte + (size_t)vstart * C, (size_t)vrows * C,
          -1, F32_RTOL);
    keep(label("embed_bwd", "dwte", size), gdwte, (size_t)vrows * C);
    /* the contract's order: every owned token's row added in token order, in f32 (exact) */
    float *tord = xmalloc((size_t)vrows * C * sizeof(float));
    memcpy(tord, dwte0, (size_t)vrows * C * sizeof(float));
    for (int n = 0; n < N; n++) {
        int v = tok[n] - vstart;
        if (v >= 0 && v < vrows)
            for (int c = 0; c < C; c++) tord[(size_t)v * C + c] += dout[(size_t)n * C + c];
    }
    check_exact(label("embed_bwd", "token-order", size), gdwte, tord, (size_t)vrows * C);
    free(tord);
    check_exact(label("embed_bwd", "guard-rows", size), gdwte + (size_t)vrows * C,
                dwte0 + (size_t)vrows * C, (size_t)(V - vrows) * C);
    check(label("pos_bwd", "dwpe", size), gdwpe + (size_t)t0 * C, rdwpe, (size_t)T * C, -1,
          F32_RTOL);
    keep(label("pos_bwd", "dwpe", size), gdwpe, (size_t)Tw * C);
    /* rows of wpe outside [t0, t0 + T) are untouched */
    float *rest = xmalloc((size_t)Tw * C * sizeof(float));
    float *rest_want = xmalloc((size_t)Tw * C * sizeof(float));
    size_t nrest = 0;
    for (int t = 0; t < Tw; t++)
        if (t < t0 || t >= t0 + T)
            for (int c = 0; c < C; c++, nrest++) {
                rest[nrest] = gdwpe[(size_t)t * C + c];
                rest_want[nrest] = dwpe0[(size_t)t * C + c];
            }
    check_exact(label("pos_bwd", "untouched", size), rest, rest_want, nrest);

    free(tok); free(wte); free(wpe); free(dout); free(dwte0); free(dwpe0);
    free(got); free(got2); free(want); free(gdwte); free(gdwpe); free(rdwte); free(rdwpe);
    free(tok_bm); free(rdout); free(rdout_bm); free(rest); free(rest_want);
    rt_free(d_tok); rt_free(d_wte); rt_free(d_wpe); rt_free(d_out); rt_free(d_dout);
    rt_free(d_dwte); rt_free(d_dwpe);
}

static void test_embed(void)
{
    op_begin();
    test_embed_case(7, 3, 37, 11, 0, 11, 0);
    test_embed_case(7, 3, 37, 11, 4, 5, 3);        /* vocab-parallel rank, offset positions */
    test_embed_case(20, 15, 150, 50, 0, 50, 0);    /* > one block of columns / threads */
    test_embed_case(20, 15, 150, 50, 13, 29, 5);
    test_embed_case(30, 20, 9, 2, 0, 2, 0);        /* ids repeated more than a block's threads */
    test_embed_case(9, 5, 64, 13, 3, 7, 2);        /* rows of 16-byte groups (CUDA: vectors) */
    test_embed_case(6, 4, 36, 10, 0, 10, 1);       /* groups in f32, not in bf16 */
    op_end("embed_pos", 1);
}

/* -- LayerNorm ------------------------------------------------------------------------------- */

/* nconst: the first rows are constant (variance 0: rstd = 1/sqrt(eps), out = b). Their values
** are dyadic so that the f32 mean is exact, as in the reference: x - mean is then 0, not a
** rounding error times 316. */
static void test_layernorm_case(int N, int C, int nconst)
{
    char size[32];
    snprintf(size, sizeof size, "N%dC%d", N, C);
    size_t nc = (size_t)N * C;
    float *x = frand(nc, -1, 1), *w = frand_st((size_t)C, 0.5f, 1.5f);
    float *b = frand_st((size_t)C, -1, 1);
    for (size_t i = 0; i < nc; i++) x[i] = st_round(x[i] + 3.0f);   /* a mean far from 0 */
    const float consts[3] = { 1.25f, -3.0f, 0.0f };
    for (int n = 0; n < nconst && n < N; n++)
        for (int c = 0; c < C; c++) x[(size_t)n * C + c] = consts[n % 3];
    float *dout = frand_st(nc, -1, 1), *dx0 = frand_st(nc, -1, 1);
    float *dw0 = frand((size_t)C, -1, 1), *db0 = frand((size_t)C, -1, 1);
    float *nan = fconst(nc, NAN);
    void *d_x = dev_st(x, nc), *d_w = dev_st(w, (size_t)C), *d_b = dev_st(b, (size_t)C);
    void *d_out = dev_st_nan(nc);
    float *d_mean = dev_copy(nan, (size_t)N * 4), *d_rstd = dev_copy(nan, (size_t)N * 4);
    void *d_dout = dev_st(dout, nc), *d_dx = dev_st(dx0, nc);
    float *d_dw = dev_copy(dw0, (size_t)C * 4), *d_db = dev_copy(db0, (size_t)C * 4);

    layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f, dt);
    float *out = down_st(d_out, nc), *mean = down(d_mean, (size_t)N);
    float *rstd = down(d_rstd, (size_t)N);
    double *rx = widen(x, nc), *rw = widen(w, (size_t)C), *rb = widen(b, (size_t)C);
    double *rout = xmalloc(nc * 8), *rmean = xmalloc((size_t)N * 8);
    double *rrstd = xmalloc((size_t)N * 8);
    ref_layernorm_fwd(rout, rmean, rrstd, rx, rw, rb, N, C, 1e-5);
    check_st(label("layernorm_fwd", "out", size), out, rout, nc, -1, F32_RTOL);
    check(label("layernorm_fwd", "mean", size), mean, rmean, (size_t)N, -1, F32_RTOL);
    check(label("layernorm_fwd", "rstd", size), rstd, rrstd, (size_t)N, -1, F32_RTOL);
    check_finite(label("layernorm_fwd", "out", size), out, nc);
    keep(label("layernorm_fwd", "out", size), out, nc);
    keep(label("layernorm_fwd", "mean", size), mean, (size_t)N);
    keep(label("layernorm_fwd", "rstd", size), rstd, (size_t)N);

    /* backward from the kernel's own mean/rstd; every gradient accumulates */
    layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C, dt);
    float *dx = down_st(d_dx, nc), *dw = down(d_dw, (size_t)C), *db = down(d_db, (size_t)C);
    double *rdx = widen(dx0, nc), *rdw = widen(dw0, (size_t)C), *rdb = widen(db0, (size_t)C);
    double *rdout = widen(dout, nc);
    ref_layernorm_bwd(rdx, rdw, rdb, rdout, rx, rw, rmean, rrstd, N, C);
    check_st(label("layernorm_bwd", "dinp", size), dx, rdx, nc, -1, F32_RTOL);
    check(label("layernorm_bwd", "dw", size), dw, rdw, (size_t)C, -1, F32_RTOL);
    check(label("layernorm_bwd", "db", size), db, rdb, (size_t)C, -1, F32_RTOL);
    keep(label("layernorm_bwd", "dinp", size), dx, nc);
    keep(label("layernorm_bwd", "dw", size), dw, (size_t)C);
    keep(label("layernorm_bwd", "db", size), db, (size_t)C);

    free(x); free(w); free(b); free(dout); free(dx0); free(dw0); free(db0); free(nan);
    free(out); free(mean); free(rstd); free(rx); free(rw); free(rb); free(rout); free(rmean);
    free(rrstd); free(dx); free(dw); free(db); free(rdx); free(rdw); free(rdb); free(rdout);
    rt_free(d_x); rt_free(d_w); rt_free(d_b); rt_free(d_out); rt_free(d_mean); rt_free(d_rstd);
    rt_free(d_dout); rt_free(d_dx); rt_free(d_dw); rt_free(d_db);
}

static void test_layernorm(void)
{
    op_begin();
    test_layernorm_case(23, 37, 0);
    test_layernorm_case(1, 5, 0);
    test_layernorm_case(301, 150, 0);
    test_layernorm_case(7, 37, 3);                  /* constant rows */
    test_layernorm_case(2100, 8, 0);                /* CUDA: 16 chunks of rows, each past the
                                                       column loop's unrolled part */
    test_layernorm_case(5, 776, 0);                 /* CUDA: 97 16-byte groups of bf16 a row
                                                       (3 to 4 a lane), 194 of f32 */
    op_end("layernorm", 1);
}

/* -- The residual add fused with the norm after it ------------------------------------------ */

/* add_layernorm_fwd and add_rmsnorm_fwd against add_fwd then layernorm_fwd / rmsnorm_fwd (each
** checked against the reference on its own): the same bits, out of place and in place
** (res = a), every output written (they start as NaN) */
static void test_add_norm_case(int N, int C)
{
    char size[32];
    snprintf(size, sizeof size, "N%dC%d", N, C);
    size_t nc = (size_t)N * C;
    float *a = frand_st(nc, -2, 4), *b = frand_st(nc, -1, 1);
    float *w = frand_st((size_t)C, 0.5f, 1.5f), *bias = frand_st((size_t)C, -1, 1);
    float *nan = fconst((size_t)N, NAN);
    void *d_a = dev_st(a, nc), *d_b = dev_st(b, nc), *d_w = dev_st(w, (size_t)C);
    void *d_bias = dev_st(bias, (size_t)C);
    for (int rms = 0; rms < 2; rms++) {
        const char *op = rms ? "add_rmsnorm_fwd" : "add_layernorm_fwd";
        void *res[3], *out[3];
        float *mean[3], *rstd[3];
        for (int k = 0; k < 3; k++) {
            res[k] = k == 2 ? dev_st(a, nc) : dev_st_nan(nc);      /* 2: in place, res = a */
            out[k] = dev_st_nan(nc);
            mean[k] = dev_copy(nan, (size_t)N * 4);
            rstd[k] = dev_copy(nan, (size_t)N * 4);
        }
        add_fwd(res[0], d_a, d_b, nc, dt);
        if (rms) {
            rmsnorm_fwd(out[0], rstd[0], res[0], d_w, N, C, 1e-5f, dt);
            add_rmsnorm_fwd(res[1], out[1], rstd[1], d_a, d_b, d_w, N, C, 1e-5f, dt);
            add_rmsnorm_fwd(res[2], out[2], rstd[2], res[2], d_b, d_w, N, C, 1e-5f, dt);
        } else {
            layernorm_fwd(out[0], mean[0], rstd[0], res[0], d_w, d_bias, N, C, 1e-5f, dt);
            add_layernorm_fwd(res[1], out[1], mean[1], rstd[1], d_a, d_b, d_w, d_bias, N, C,
                              1e-5f, dt);
            add_layernorm_fwd(res[2], out[2], mean[2], rstd[2], res[2], d_b, d_w, d_bias, N, C,
                              1e-5f, dt);
        }
        float *want[3] = { down_st(res[0], nc), down_st(out[0], nc), down(rstd[0], (size_t)N) };
        float *wmean = down(mean[0], (size_t)N);
        for (int k = 1; k < 3; k++) {
            const char *how = k == 1 ? "res" : "res-in-place";
            char what[64];
            float *got = down_st(res[k], nc);
            check_exact(label(op, how, size), got, want[0], nc);
            free(got);
            snprintf(what, sizeof what, "out%s", k == 2 ? "-in-place" : "");
            got = down_st(out[k], nc);
            check_exact(label(op, what, size), got, want[1], nc);
            free(got);
            snprintf(what, sizeof what, "rstd%s", k == 2 ? "-in-place" : "");
            got = down(rstd[k], (size_t)N);
            check_exact(label(op, what, size), got, want[2], (size_t)N);
            free(got);
            if (!rms) {
                snprintf(what, sizeof what, "mean%s", k == 2 ? "-in-place" : "");
                got = down(mean[k], (size_t)N);
                check_exact(label(op, what, size), got, wmean, (size_t)N);
                free(got);
            }
        }
        check_finite(label(op, "out", size), want[1], nc);
        for (int k = 0; k < 3; k++) {
            rt_free(res[k]); rt_free(out[k]); rt_free(mean[k]); rt_free(rstd[k]);
            free(want[k]);
        }
        free(wmean);
    }
    free(a); free(b); free(w); free(bias); free(nan);
    rt_free(d_a); rt_free(d_b); rt_free(d_w); rt_free(d_bias);
}

static void test_add_norm(void)
{
    op_begin();
    test_add_norm_case(23, 37);
    test_add_norm_case(1, 5);
    test_add_norm_case(301, 150);
    test_add_norm_case(2100, 8);
    test_add_norm_case(5, 776);
    op_end("add_norm", 1);
}

/* -- GELU, bias, add, scale, conversions ------------------------------------------------------ */

/* n inputs in [lo, hi], the first ones the edges and a few exact points */
static void test_gelu_case(size_t n, float lo, float hi)
{
    char size[48];
    snprintf(size, sizeof size, "n%zu_%g_%g", n, lo, hi);
    float *x = frand_st(n, lo, hi), *dout = frand_st(n, -1, 1);
    const float edges[] = { lo, hi, 0.0f, -10.0f, -11.0f, -8.5f, 10.0f };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0] && i < n; i++)
        if (edges[i] >= lo && edges[i] <= hi) x[i] = st_round(edges[i]);
    void *d_x = dev_st(x, n), *d_out = dev_st_nan(n), *d_dout = dev_st(dout, n);
    void *d_dx = dev_st_nan(n);
    gelu_fwd(d_out, d_x, n, dt);
    gelu_bwd(d_dx, d_x, d_dout, n, dt);             /* overwrites */
    float *out = down_st(d_out, n), *dx = down_st(d_dx, n);
    double *rx = widen(x, n), *rdout = widen(dout, n);
    double *rout = xmalloc(n * 8), *rdx = xmalloc(n * 8);
    ref_gelu_fwd(rout, rx, n);
    ref_gelu_bwd(rdx, rdout, rx, n);                /* adds into zeros */
    check_st(label("gelu_fwd", "out", size), out, rout, n, -1, F32_RTOL);
    check_st(label("gelu_bwd", "dinp", size), dx, rdx, n, -1, F32_RTOL);
    check_finite(label("gelu_fwd", "out", size), out, n);
    check_finite(label("gelu_bwd", "dinp", size), dx, n);
    keep(label("gelu_fwd", "out", size), out, n);
    keep(label("gelu_bwd", "dinp", size), dx, n);
    /* in place, as the model calls it: gelu_bwd(d, inp, d) */
    gelu_bwd(d_dout, d_x, d_dout, n, dt);
    float *dx2 = down_st(d_dout, n);
    check_exact(label("gelu_bwd", "in-place", size), dx2, dx, n);
    free(x); free(dout); free(out); free(dx); free(rx); free(rdout); free(rout); free(rdx);
    free(dx2);
    rt_free(d_x); rt_free(d_out); rt_free(d_dout); rt_free(d_dx);
}

static void test_gelu(void)
{
    op_begin();
    test_gelu_case(37, -6, 6);
    test_gelu_case(3 * 4096 + 37, -6, 6);           /* several CPU blocks and CUDA blocks */
    test_gelu_case(4099, -30, 30);                  /* the tails: exp clamped, still finite */
    op_end("gelu", 1);
}

static void test_bias_case(int N, int OC)
{
    char size[32];
    snprintf(size, sizeof size, "N%dOC%d", N, OC);
    size_t n = (size_t)N * OC;
    float *out0 = frand_st(n, -1, 1), *bias = frand_st((size_t)OC, -1, 1);
    float *dout = frand_st(n, -1, 1), *db0 = frand((size_t)OC, -1, 1);
    void *d_out = dev_st(out0, n), *d_bias = dev_st(bias, (size_t)OC), *d_dout = dev_st(dout, n);
    float *d_db = dev_copy(db0, (size_t)OC * 4);
    bias_fwd(d_out, d_bias, N, OC, dt);
    bias_bwd(d_db, d_dout, N, OC, dt);
    float *out = down_st(d_out, n), *db = down(d_db, (size_t)OC), *want = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) want[i] = st_round(out0[i] + bias[i % (size_t)OC]);
    check_exact(label("bias_fwd", "out", size), out, want, n);
    keep(label("bias_fwd", "out", size), out, n);
    /* the reference's linear backward with IN = 1 gives db = column sums of dout */
    double *rdb = widen(db0, (size_t)OC), *rdout = widen(dout, n), *rin = xmalloc((size_t)N * 8);
    double *rw = xmalloc((size_t)OC * 8), *rdin = xmalloc((size_t)N * 8);
    double *rdw = xmalloc((size_t)OC * 8);
    ref_linear_bwd(rdin, rdw, rdb, rdout, rin, rw, N, 1, OC);
    check(label("bias_bwd", "dbias", size), db, rdb, (size_t)OC, -1, F32_RTOL);
    keep(label("bias_bwd", "dbias", size), db, (size_t)OC);
    free(out0); free(bias); free(dout); free(db0); free(out); free(db); free(want); free(rdb);
    free(rdout); free(rin); free(rw); free(rdin); free(rdw);
    rt_free(d_out); rt_free(d_bias); rt_free(d_dout); rt_free(d_db);
}

static void test_bias(void)
{
    op_begin();
    test_bias_case(23, 37);
    test_bias_case(301, 150);                       /* > one column block (64) and one CUDA block */
    op_end("bias", 1);
}

static void test_add(void)
{
    op_begin();
    size_t sizes[2] = { 37, 2 * 4096 + 301 };
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        char size[32];
        snprintf(size, sizeof size, "n%zu", n);
        float *a = frand_st(n, -1, 1), *b = frand_st(n, -1, 1);
        float *want = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) want[i] = st_round(a[i] + b[i]);
        void *d_a = dev_st(a, n), *d_b = dev_st(b, n), *d_out = dev_st_nan(n);
        add_fwd(d_out, d_a, d_b, n, dt);
        add_inplace(d_a, d_b, n, dt);
        float *out = down_st(d_out, n), *inpl = down_st(d_a, n);
        check_exact(label("add_fwd", "out", size), out, want, n);
        check_exact(label("add_inplace", "y", size), inpl, want, n);
        keep(label("add_fwd", "out", size), out, n);
        free(a); free(b); free(want); free(out); free(inpl);
        rt_free(d_a); rt_free(d_b); rt_free(d_out);
    }
    op_end("add", 1);
}

static void test_scale(void)                        /* f32 only */
{
    op_begin();
    size_t sizes[2] = { 5, 2 * 16384 + 37 };
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        char size[32];
        snprintf(size, sizeof size, "n%zu", n);
        float *x = frand(n, -3, 3), *want = xmalloc(n * 4), s = 0.3712f;
        for (size_t i = 0; i < n; i++) want[i] = x[i] * s;
        float *d_x = dev_copy(x, n * 4);
        scale_inplace(d_x, n, s);
        float *got = down(d_x, n);
        check_exact(label("scale_inplace", "x", size), got, want, n);
        keep(label("scale_inplace", "x", size), got, n);
        free(x); free(want); free(got);
        rt_free(d_x);
    }
    op_end("scale_inplace", 0);
}

/*
** f32 -> bf16 against bf16_round (random values of every magnitude, ties both ways, the edges:
** signed zeros, subnormals, the largest bf16 and the values that round past it, infinities,
** NaN), bf16 -> f32 exactly, and the copies of dt == st. dtype-free: run once.
*/
static void test_convert(void)
{
    op_begin();
    size_t n = 3 * 4096 + 77;
    float *x = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)rng_next();
        if (i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u;         /* a tie */
        memcpy(&x[i], &u, 4);
        if (isnan(x[i]) && i % 2) x[i] = uniform(-1, 1);
    }
    const uint32_t edges[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x00008000u, 0x00018000u,
                               0x007fffffu, 0x7f7f0000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu,
                               0xff7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u,
                               0x7f800001u, 0x3f808000u, 0x3f818000u };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) memcpy(&x[i], &edges[i], 4);
    float *want = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) want[i] = bf16_round(x[i]);
    float *d_x = dev_copy(x, n * 4), *d_f = dev_copy(x, n * 4);
    uint16_t *h = xmalloc(n * 2);
    void *d_h = dev_copy(h, n * 2), *d_h2 = dev_copy(h, n * 2);
    convert(d_h, RT_BF16, d_x, RT_F32, n);
    rt_memcpy(h, d_h, n * 2, RT_D2H);
    float *got = xmalloc(n * 4);
    long long bad = 0;
    for (size_t i = 0; i < n; i++) {
        got[i] = bf16_value(h[i]);
        if (isnan(want[i]) != isnan(got[i]) || (!isnan(want[i]) && got[i] != want[i]) ||
            (!isnan(want[i]) && signbit(got[i]) != signbit(want[i]))) {
            if (bad++ < SHOW)
                printf("  convert f32->bf16: [%zu] %a gives %a, not %a\n", i, x[i], got[i],
                       want[i]);
        }
    }
    if (bad) fail("convert f32->bf16: %lld of %zu values rounded wrongly", bad, n);
    keep("convert.f32-bf16", got, n);
    /* back: exact; then a bf16 copy and an f32 copy */
    convert(d_f, RT_F32, d_h, RT_BF16, n);
    convert(d_h2, RT_BF16, d_h, RT_BF16, n);
    float *back = down(d_f, n);
    check_exact("convert.bf16-f32", back, got, n);
    uint16_t *h2 = xmalloc(n * 2);
    rt_memcpy(h2, d_h2, n * 2, RT_D2H);
    if (memcmp(h, h2, n * 2)) fail("convert bf16->bf16 is not a copy");
    float *d_c = dev_copy(want, n * 4);
    convert(d_c, RT_F32, d_x, RT_F32, n);
    float *copy = down(d_c, n);
    if (memcmp(copy, x, n * 4)) fail("convert f32->f32 is not a copy");
    /* from and to addresses that are not 16-byte aligned (CUDA: element by element) */
    convert((uint16_t *)d_h2 + 1, RT_BF16, d_x + 3, RT_F32, n - 3);
    convert(d_c + 1, RT_F32, (uint16_t *)d_h + 5, RT_BF16, n - 5);
    rt_memcpy(h2, d_h2, n * 2, RT_D2H);
    float *c2 = down(d_c, n);
    long long bad2 = 0;
    for (size_t i = 0; i + 3 < n; i++)
        if (h2[i + 1] != h[i + 3]) bad2++;
    for (size_t i = 0; i + 5 < n; i++)
        if (memcmp(&c2[i + 1], &got[i + 5], 4)) bad2++;
    if (bad2) fail("convert at unaligned addresses: %lld of %zu values differ", bad2, 2 * n - 8);
    free(c2);
    free(x); free(want); free(h); free(got); free(back); free(h2); free(copy);
    rt_free(d_x); rt_free(d_f); rt_free(d_h); rt_free(d_h2); rt_free(d_c);
    op_end("convert", 0);
}

/*
** copy_cols between strided blocks (explicit dtypes: run once): a block of 'cols' columns at
** column 7 of f32 rows of 50 goes to column 2 of bf16 rows of 41, and back to column 5 of f32
** rows of 45. Most values are bf16 values, which come back exactly; every fifth is an f32
** value that is not, rounded to the nearest bf16 (against bf16_round), among them ties both
** ways. The columns outside the block keep their guard value. Then the same-dtype copies.
*/
static void test_copy_cols_case(int rows, int cols, int aligned)
{
    char size[32];
    snprintf(size, sizeof size, "r%dc%d%s", rows, cols, aligned ? "a" : "");
    /* aligned: every row's block starts 16-byte aligned (CUDA: vectors) */
    const size_t lds = aligned ? 48 : 50, ldb = aligned ? 40 : 41, ldf = aligned ? 44 : 45,
                 s0 = aligned ? 8 : 7, b0 = aligned ? 0 : 2, f0 = aligned ? 4 : 5;
    size_t ns = (size_t)rows * lds, nb = (size_t)rows * ldb, nf = (size_t)rows * ldf;
    const float guard = -7.0f;                      /* a bf16 value outside the data's range */
    float *src = frand(ns, -4, 4);
    for (size_t i = 0; i < ns; i++)
        if (i % 5) src[i] = bf16_round(src[i]);
    /* 1 + 2^-8 (a tie: down to 1), 1 + 3 2^-8 (a tie: up to 1 + 2^-6), -(1 + 3 2^-9) (not
    ** a tie: to -(1 + 2^-7)), in the block's first row */
    const uint32_t edges[] = { 0x3f808000u, 0x3f818000u, 0xbf80c000u };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0] && (int)i < cols; i++)
        memcpy(&src[s0 + i], &edges[i], 4);
    uint16_t *hb = xmalloc(nb * 2);
    for (size_t i = 0; i < nb; i++) hb[i] = bf16_bits(guard);
    float *hf = fconst(nf, guard);
    float *d_src = dev_copy(src, ns * 4), *d_f = dev_copy(hf, nf * 4), *d_f2 = dev_copy(hf, nf * 4);
    uint16_t *d_b = dev_copy(hb, nb * 2), *d_b2 = dev_copy(hb, nb * 2);

    copy_cols(d_b + b0, RT_BF16, ldb, d_src + s0, RT_F32, lds, rows, cols);
    copy_cols(d_f + f0, RT_F32, ldf, d_b + b0, RT_BF16, ldb, rows, cols);
    rt_memcpy(hb, d_b, nb * 2, RT_D2H);
    float *gb = xmalloc(nb * 4), *gf = down(d_f, nf);
    for (size_t i = 0; i < nb; i++) gb[i] = bf16_value(hb[i]);
    float *wb = fconst(nb, guard), *wf = fconst(nf, guard);
    for (size_t r = 0; r < (size_t)rows; r++)
        for (size_t c = 0; c < (size_t)cols; c++) {
            wb[r * ldb + b0 + c] = bf16_round(src[r * lds + s0 + c]);
            wf[r * ldf + f0 + c] = wb[r * ldb + b0 + c];
        }
    check_exact(label("copy_cols", "f32-bf16", size), gb, wb, nb);
    check_exact(label("copy_cols", "bf16-f32", size), gf, wf, nf);
    keep(label("copy_cols", "bf16-f32", size), gf, nf);

    /* same dtype: copies */
    copy_cols(d_f2 + f0, RT_F32, ldf, d_src + s0, RT_F32, lds, rows, cols);
    copy_cols(d_b2 + b0, RT_BF16, ldb, d_b + b0, RT_BF16, ldb, rows, cols);
    float *gf2 = down(d_f2, nf);
    for (size_t r = 0; r < (size_t)rows; r++)
        for (size_t c = 0; c < (size_t)cols; c++) wf[r * ldf + f0 + c] = src[r * lds + s0 + c];
    check_exact(label("copy_cols", "f32-f32", size), gf2, wf, nf);
    rt_memcpy(hb, d_b2, nb * 2, RT_D2H);
    for (size_t i = 0; i < nb; i++) gb[i] = bf16_value(hb[i]);
    check_exact(label("copy_cols", "bf16-bf16", size), gb, wb, nb);

    free(src); free(hb); free(hf); free(gb); free(gf); free(wb); free(wf); free(gf2);
    rt_free(d_src); rt_free(d_f); rt_free(d_f2); rt_free(d_b); rt_free(d_b2);
}

static void test_copy_cols(void)
{
    op_begin();
    test_copy_cols_case(3, 11, 0);
    test_copy_cols_case(301, 37, 0);                /* several CUDA blocks of elements */
    test_copy_cols_case(301, 37, 1);
    op_end("copy_cols", 0);
}

/* fill_f32 on n elements with 5 guards on each side: -inf (the log-sum-exp's start) and a
** finite value, exact; the guards untouched. */
static void test_fill(void)
{
    op_begin();
    const size_t sizes[2] = { 1, 3 * 4096 + 37 };  /* several CPU and CUDA blocks */
    const float vals[2] = { -INFINITY, 0.3712f };
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 2; m++) {
            size_t n = sizes[k], g = 5;
            char size[48];
            snprintf(size, sizeof size, "n%zu_v%g", n, vals[m]);
            float *x = frand(n + 2 * g, -1, 1), *want = xmalloc((n + 2 * g) * 4);
            float *d_x = dev_copy(x, (n + 2 * g) * 4);
            fill_f32(d_x + g, n, vals[m]);
            float *got = down(d_x, n + 2 * g);
            for (size_t i = 0; i < n + 2 * g; i++)
                want[i] = i >= g && i < g + n ? vals[m] : x[i];
            check_exact(label("fill_f32", "x", size), got, want, n + 2 * g);
            keep(label("fill_f32", "x", size), got, n + 2 * g);
            free(x); free(want); free(got);
            rt_free(d_x);
        }
    op_end("fill_f32", 0);
}

/* -- Attention ------------------------------------------------------------------------------- */

/* Element i of a device buffer of this pass's dtype. */
static void *st_at(void *p, size_t i) { return (char *)p + i * rt_dtype_size(dt); }

/* Grouped-query attention (kernels.h): the compact rows [q (H hd) | k (KV hd) | v (KV hd)] of
** N rows widened to the reference's [q | k | v] of 3 H hd, query head h given kv head
** h / (H/KV) (copies); and back for gradients: dq copied, the dk (dv) of a kv head the sum in
** double over its query heads. The reference is multi-head: these make it grouped. */
static double *kv_widen(const double *x, int N, int H, int KV, int hd)
{
    size_t C = (size_t)H * hd, K = (size_t)KV * hd, W = C + 2 * K;
    double *y = xmalloc((size_t)N * 3 * C * 8);
    for (size_t n = 0; n < (size_t)N; n++)
        for (int part = 0; part < 3; part++)
            for (int h = 0; h < H; h++) {
                size_t src = part ? C + (part - 1) * K + (size_t)(h / (H / KV)) * hd
                                  : (size_t)h * hd;
                memcpy(y + n * 3 * C + part * C + (size_t)h * hd, x + n * W + src, hd * 8);
            }
    return y;
}

static double *kv_sum(const double *y, int N, int H, int KV, int hd)
{
    size_t C = (size_t)H * hd, K = (size_t)KV * hd, W = C + 2 * K;
    double *x = xmalloc((size_t)N * W * 8);
    memset(x, 0, (size_t)N * W * 8);
    for (size_t n = 0; n < (size_t)N; n++)
        for (int part = 0; part < 3; part++)
            for (int h = 0; h < H; h++) {
                size_t dst = part ? C + (part - 1) * K + (size_t)(h / (H / KV)) * hd
                                  : (size_t)h * hd;
                for (int d = 0; d < hd; d++)
                    x[n * W + dst + d] += y[n * 3 * C + part * C + (size_t)h * hd + d];
            }
    return x;
}

/* rlse (B, H, T) = log sum_{s <= t} exp(q_t . k_s / sqrt(hd)) of the batch-major rows of qkv
** (rows of 3 H hd), in double: the reference has no such output. */
static void lse_in_double(double *rlse, const double *rqkv_bm, int B, int T, int H, int hd)
{
    int C = H * hd;
    double dscale = 1.0 / sqrt((double)hd), *sc = xmalloc((size_t)T * 8);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const double *q = rqkv_bm + ((size_t)b * T + t) * 3 * C + (size_t)h * hd;
                double m = -INFINITY, s = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = rqkv_bm + ((size_t)b * T + u) * 3 * C + C + (size_t)h * hd;
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += q[d] * k[d];
                    sc[u] = dot * dscale;
                    m = fmax(m, sc[u]);
                }
                for (int u = 0; u <= t; u++) s += exp(sc[u] - m);
                rlse[((size_t)b * H + h) * T + t] = m + log(s);
            }
    free(sc);
}

/*
** bf16: the backward's dsum_i = dout_i . out_i reads the stored out, each element within
** 2^-8 of the exact one, so dsum is off by up to e_i = 2^-8 sum_d |dout_id out_id|. Through
** ds_ij = p_ij (dp_ij - dsum_i) that moves dq_i by at most scale e_i sum_j p_ij |k_j| and
** dk_j by at most scale sum_i p_ij e_i |q_i| (dv does not use dsum): per-element bounds,
** computed here in double from the reference's p (ratt) and out (rout, batch-major) with
** rqkv (sequence-major) and rdout_bm, returned in the layout of dqkv (N, 3C), to be added to
** the tolerance. NULL in f32, where out is stored as computed.
*/
static double *dsum_bf16_bound(const double *rqkv, const double *rdout_bm, const double *rout,
                               const double *ratt, int B, int T, int H, int hd)
{
    if (dt != RT_BF16) return NULL;
    int C = H * hd;
    double dscale = 1.0 / sqrt((double)hd);
    double *extra = xmalloc((size_t)T * B * 3 * C * 8), *e = xmalloc((size_t)T * 8);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < T; t++) {
                size_t r = ((size_t)b * T + t) * C + (size_t)h * hd;
                e[t] = 0;
                for (int d = 0; d < hd; d++) e[t] += fabs(rdout_bm[r + d] * rout[r + d]);
                e[t] *= BF16_REL;
            }
            const double *p = ratt + ((size_t)b * H + h) * T * T;
            for (int t = 0; t < T; t++)
                for (int u = 0; u <= t; u++) {
                    double w = dscale * p[(size_t)t * T + u];
                    size_t rt = ((size_t)t * B + b) * 3 * C + (size_t)h * hd;
                    size_t ru = ((size_t)u * B + b) * 3 * C + (size_t)h * hd;
                    for (int d = 0; d < hd; d++) {
                        extra[rt + d] += w * e[t] * fabs(rqkv[ru + C + d]);     /* dq */
                        extra[ru + C + d] += w * e[t] * fabs(rqkv[rt + d]);     /* dk */
                    }
                }
        }
    free(e);
    return extra;
}

/*
** bf16 where attention_bf16_products (kernels.h: the tensor-core kernels, head sizes a multiple
** of 16 up to 128): the probabilities p and the score gradients ds enter their second products
** rounded to bf16, each term then off by up to BF16_REL of itself. So out_i moves by at most
** BF16_REL sum_j p_ij |v_j|, dv_j by BF16_REL sum_i p_ij |dout_i|, dq_i by scale BF16_REL
** sum_j |ds_ij| |k_j| and dk_j by scale BF16_REL sum_i |ds_ij| |q_i|, with ds_ij = p_ij
** (dout_i . v_j - dsum_i): per-element bounds, computed here in double from the reference's p
** (ratt), rqkv (sequence-major) and rdout_bm, in the layouts of out (N, C) and dqkv (N, 3C),
** to be added to the tolerances. NULL where those operands stay f32.
*/
static int attention_rounds_products(int hd)
{
    return dt == RT_BF16 && attention_bf16_products && hd % 16 == 0 && hd <= 128;
}

static void products_bf16_bound(double **eout, double **edqkv, const double *rqkv,
                                const double *rdout_bm, const double *ratt, int B, int T, int H,
                                int hd)
{
    *eout = *edqkv = NULL;
    if (!attention_rounds_products(hd)) return;
    int C = H * hd;
    size_t N = (size_t)T * B;
    double dscale = 1.0 / sqrt((double)hd), *dp = xmalloc((size_t)T * 8);
    double *eo = xmalloc(N * C * 8), *ed = xmalloc(N * 3 * C * 8);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const double *p = ratt + ((size_t)b * H + h) * T * T;
            for (int t = 0; t < T; t++) {
                size_t rt = ((size_t)t * B + b) * 3 * C + (size_t)h * hd;
                size_t ot = ((size_t)t * B + b) * C + (size_t)h * hd;
                const double *dout = rdout_bm + ((size_t)b * T + t) * C + (size_t)h * hd;
                double dsum = 0;
                for (int u = 0; u <= t; u++) {
                    const double *v = rqkv + ((size_t)u * B + b) * 3 * C + 2 * C +
                                      (size_t)h * hd;
                    dp[u] = 0;
                    for (int d = 0; d < hd; d++) dp[u] += dout[d] * v[d];
                    dsum += p[(size_t)t * T + u] * dp[u];
                }
                for (int u = 0; u <= t; u++) {
                    size_t ru = ((size_t)u * B + b) * 3 * C + (size_t)h * hd;
                    double pu = p[(size_t)t * T + u], ds = fabs(pu * (dp[u] - dsum)) * dscale;
                    for (int d = 0; d < hd; d++) {
                        eo[ot + d] += pu * fabs(rqkv[ru + 2 * C + d]);          /* out */
                        ed[ru + 2 * C + d] += pu * fabs(dout[d]);               /* dv */
                        ed[rt + d] += ds * fabs(rqkv[ru + C + d]);              /* dq */
                        ed[ru + C + d] += ds * fabs(rqkv[rt + d]);              /* dk */
                    }
                }
            }
        }
    for (size_t i = 0; i < N * C; i++) eo[i] *= BF16_REL;
    for (size_t i = 0; i < N * 3 * C; i++) ed[i] *= BF16_REL;
    free(dp);
    *eout = eo;
    *edqkv = ed;
}

/* x (an f32 sum, as a bf16 GEMM or softmax leaves it) stored in bf16 */
static double bf16_stored(double x) { return bf16_round((float)x); }

/*
** The same attention as a framework computes it step by step in bf16 (FlashAttention's tests'
** "naive" attention: each product summed, then stored in bf16): s = bf16(scale q k^T),
** p = bf16(softmax(s)), out = bf16(p v); dp = bf16(dout v^T), ds = bf16(p (dp - rowsum(p
** dp))), dq = bf16(scale ds k), dk = bf16(scale ds^T q), dv = bf16(p^T dout), a kv head's dk
** (dv) the sum of its query heads' rounded once more. Sequence-major results: nout (N, C),
** ndqkv (N, W) compact; from rqkv (sequence-major, multi-head) and rdout_bm.
*/
static void naive_bf16_attention(double *nout, double *ndqkv, const double *rqkv,
                                 const double *rdout_bm, int B, int T, int H, int KV, int hd)
{
    int C = H * hd;
    size_t N = (size_t)T * B;
    double dscale = 1.0 / sqrt((double)hd);
    double *P = xmalloc((size_t)T * T * 8), *dS = xmalloc((size_t)T * T * 8);
    double *g = xmalloc(N * 3 * C * 8), *o = xmalloc((size_t)hd * 4 * 8);
    double *dq = o + hd, *dk = dq + hd, *dv = dk + hd;
#define NQ(t) (rqkv + ((size_t)(t) * B + b) * 3 * C + (size_t)h * hd)
#define NDO(t) (rdout_bm + ((size_t)b * T + (t)) * C + (size_t)h * hd)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < T; t++) {
                double m = -INFINITY, l = 0, dsum = 0, *pt = P + (size_t)t * T;
                for (int u = 0; u <= t; u++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += NQ(t)[d] * NQ(u)[C + d];
                    pt[u] = bf16_stored(dot * dscale);
                    m = fmax(m, pt[u]);
                }
                for (int u = 0; u <= t; u++) l += exp(pt[u] - m);
                for (int u = 0; u <= t; u++) pt[u] = bf16_stored(exp(pt[u] - m) / l);
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int u = 0; u <= t; u++)
                    for (int d = 0; d < hd; d++) o[d] += pt[u] * NQ(u)[2 * C + d];
                for (int d = 0; d < hd; d++)
                    nout[((size_t)t * B + b) * C + (size_t)h * hd + d] = bf16_stored(o[d]);
                double *st = dS + (size_t)t * T;
                for (int u = 0; u <= t; u++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += NDO(t)[d] * NQ(u)[2 * C + d];
                    st[u] = bf16_stored(dot);
                    dsum += pt[u] * st[u];
                }
                for (int u = 0; u <= t; u++) st[u] = bf16_stored(pt[u] * (st[u] - dsum));
            }
            /* each sum over u in order, hd of them side by side */
            for (int t = 0; t < T; t++) {
                for (int d = 0; d < hd; d++) dq[d] = dk[d] = dv[d] = 0;
                for (int u = 0; u <= t; u++)
                    for (int d = 0; d < hd; d++) dq[d] += dS[(size_t)t * T + u] * NQ(u)[C + d];
                for (int u = t; u < T; u++) {
                    double ws = dS[(size_t)u * T + t], wp = P[(size_t)u * T + t];
                    for (int d = 0; d < hd; d++) {
                        dk[d] += ws * NQ(u)[d];
                        dv[d] += wp * NDO(u)[d];
                    }
                }
                double *gt = g + ((size_t)t * B + b) * 3 * C + (size_t)h * hd;
                for (int d = 0; d < hd; d++) {
                    gt[d] = bf16_stored(dscale * dq[d]);
                    gt[C + d] = bf16_stored(dscale * dk[d]);
                    gt[2 * C + d] = bf16_stored(dv[d]);
                }
            }
        }
#undef NQ
#undef NDO
    double *c = kv_sum(g, (int)N, H, KV, hd);
    size_t W = (size_t)(H + 2 * KV) * hd;
    for (size_t i = 0; i < N * W; i++) ndqkv[i] = bf16_stored(c[i]);
    free(P); free(dS); free(g); free(c); free(o);
}

/* The largest |got - want| over columns [c0, c1) of n rows of w (NaN if any is NaN). */
static double max_err_cols(const double *got, const double *want, size_t n, size_t w, size_t c0,
                           size_t c1)
{
    double e = 0;
    for (size_t r = 0; r < n; r++)
        for (size_t c = c0; c < c1; c++) {
            double d = fabs(got[r * w + c] - want[r * w + c]);
            if (!(d <= e)) e = d;
        }
    return e;
}

/*
** FlashAttention's own test of bf16 attention (its tests/test_flash_attn.py): the kernel's
** largest error against the float64 reference at most FA_TIMES times the naive bf16 attention's
** (naive_bf16_attention) in each of out, dq, dk and dv, plus F32_RTOL of the tensor's largest
** reference value (where the naive one is exact: T = 1, dq of a first row). bf16 only.
*/
#define FA_TIMES 2.0
static void check_like_flash(const char *size, const float *out, const double *rout_sm,
                             const float *dqkv, const double *rdqkv_c, const double *rqkv,
                             const double *rdout_bm, int B, int T, int H, int KV, int hd)
{
    if (dt != RT_BF16) return;
    size_t N = (size_t)T * B, C = (size_t)H * hd, K = (size_t)KV * hd, W = C + 2 * K;
    double *nout = xmalloc(N * C * 8), *ndqkv = xmalloc(N * W * 8);
    double *kout = widen(out, N * C), *kdqkv = widen(dqkv, N * W);
    naive_bf16_attention(nout, ndqkv, rqkv, rdout_bm, B, T, H, KV, hd);
    static const char *part[4] = { "out", "dq", "dk", "dv" };
    size_t c0[4] = { 0, 0, C, C + K }, c1[4] = { C, C, C + K, W }, w[4] = { C, W, W, W };
    for (int i = 0; i < 4; i++) {
        const double *got = i ? kdqkv : kout, *ref = i ? rdqkv_c : rout_sm;
        const double *naive = i ? ndqkv : nout;
        double scale = 0;
        for (size_t r = 0; r < N; r++)
            for (size_t c = c0[i]; c < c1[i]; c++) scale = fmax(scale, fabs(ref[r * w[i] + c]));
        double ek = max_err_cols(got, ref, N, w[i], c0[i], c1[i]);
        double en = max_err_cols(naive, ref, N, w[i], c0[i], c1[i]);
        double lim = FA_TIMES * en + F32_RTOL * scale;
        char what[96];
        snprintf(what, sizeof what, "attention %s %s against naive bf16", part[i], size);
        if (verbose || !(ek <= lim))
            printf("  %s: max abs %.3g, naive's %.3g (%.2f of it)%s\n", what, ek, en,
                   en > 0 ? ek / en : 0.0, ek <= lim ? "" : "  MISMATCH");
        if (!(ek <= lim))
            fail("%s: max abs %.3g over %g x the naive's %.3g", what, ek, FA_TIMES, en);
    }
    free(nout); free(ndqkv); free(kout); free(kdqkv);
}

/* dsum (B, H, T) = rowsum(dout * out) of the kernel's own (stored) out, in double. */
static void dsum_in_double(double *rdsum, const float *dout, const float *out, int B, int T,
                           int H, int hd)
{
    int C = H * hd;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                size_t r = ((size_t)t * B + b) * C + (size_t)h * hd;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)dout[r + d] * out[r + d];
                rdsum[((size_t)b * H + h) * T + t] = s;
            }
}

/*
** Causal attention against ref_attention_fwd / ref_attention_bwd (batch-major rows, the
** (B, H, T, T) probabilities), and the log-sum-exp of the scaled masked scores in double here.
** Sizes cross the CPU's 64-row tiles and the CUDA 32-row tiles at non-multiples.
*/
static void test_attention_case(int B, int T, int H, int KV, int hd, int again)
{
    char size[48];
    snprintf(size, sizeof size, "B%dT%dH%dKV%dhd%d", B, T, H, KV, hd);
    int C = H * hd, N = T * B, W = (H + 2 * KV) * hd;
    size_t nq = (size_t)N * W, nx = (size_t)N * 3 * C, ny = (size_t)N * C;
    size_t nl = (size_t)B * H * T, na = nl * T;
    float scale = 1.0f / sqrtf((float)hd);
    float *qkv = frand_st(nq, -1.5f, 1.5f), *dout = frand_st(ny, -1, 1);
    float *nan = fconst(nl, NAN);
    void *d_qkv = dev_st(qkv, nq), *d_out = dev_st_nan(ny), *d_dout = dev_st(dout, ny);
    void *d_dqkv = dev_st_nan(nq);
    float *d_lse = dev_copy(nan, nl * 4), *d_dsum = dev_copy(nan, nl * 4);

    attention_fwd(d_out, d_lse, d_qkv, B, T, H, KV, hd, scale, dt);
    float *out = down_st(d_out, ny), *lse = down(d_lse, nl);
    double *rqkv_c = widen(qkv, nq), *rqkv = kv_widen(rqkv_c, N, H, KV, hd);
    double *rqkv_bm = to_batch_major(rqkv, T, B, 3 * C);
    double *rout = xmalloc(ny * 8), *ratt = xmalloc(na * 8), *rlse = xmalloc(nl * 8);
    ref_attention_fwd(rout, ratt, rqkv_bm, B, T, C, H);
    double *rout_sm = to_seq_major(rout, T, B, C);
    lse_in_double(rlse, rqkv_bm, B, T, H, hd);
    double *rdout = widen(dout, ny), *rdout_bm = to_batch_major(rdout, T, B, C), *ebo, *ebd;
    products_bf16_bound(&ebo, &ebd, rqkv, rdout_bm, ratt, B, T, H, hd);
    check_st_bound(label("attention_fwd", "out", size), out, rout_sm, ny, -1, F32_RTOL, ebo);
    check(label("attention_fwd", "lse", size), lse, rlse, nl, -1, F32_RTOL);
    keep(label("attention_fwd", "out", size), out, ny);
    keep(label("attention_fwd", "lse", size), lse, nl);

    attention_bwd(d_dqkv, d_dsum, d_dout, d_out, d_lse, d_qkv, B, T, H, KV, hd, scale, dt);
    float *dqkv = down_st(d_dqkv, nq), *dsum = down(d_dsum, nl);
    double *rdqkv = xmalloc(nx * 8), *rdsum = xmalloc(nl * 8);
    ref_attention_bwd(rdqkv, rdout_bm, rqkv_bm, ratt, B, T, C, H);
    double *rdqkv_sm = to_seq_major(rdqkv, T, B, 3 * C);
    double *rdqkv_c = kv_sum(rdqkv_sm, N, H, KV, hd);
    dsum_in_double(rdsum, dout, out, B, T, H, hd);
    check(label("attention_bwd", "dsum", size), dsum, rdsum, nl, -1, F32_RTOL);
    /* dqkv is stored in this pass's dtype: in bf16 BF16_REL, and the bound of the bf16 out
    ** (a kv head's: the sum of its query heads' bounds) */
    double *extra_x = dsum_bf16_bound(rqkv, rdout_bm, rout, ratt, B, T, H, hd);
    if (ebd)
        for (size_t i = 0; i < nx; i++) extra_x[i] += ebd[i];
    double *extra = extra_x ? kv_sum(extra_x, N, H, KV, hd) : NULL;
    double atol = -1, rtol = F32_RTOL;
    if (dt == RT_BF16) {
        double s = 0;
        for (size_t i = 0; i < nq; i++) s = fmax(s, fabs(rdqkv_c[i]));
        atol = F32_RTOL * s * (1 + BF16_REL);
        rtol += BF16_REL;
    }
    check_bound(label("attention_bwd", "dqkv", size), dqkv, rdqkv_c, nq, atol, rtol, extra);
    keep(label("attention_bwd", "dqkv", size), dqkv, nq);
    check_like_flash(size, out, rout_sm, dqkv, rdqkv_c, rqkv, rdout_bm, B, T, H, KV, hd);
    if (again) {        /* the same call again gives the same bits (no run-dependent order) */
        void *d_out2 = dev_st_nan(ny), *d_dqkv2 = dev_st_nan(nq);
        float *d_lse2 = dev_copy(nan, nl * 4), *d_dsum2 = dev_copy(nan, nl * 4);
        attention_fwd(d_out2, d_lse2, d_qkv, B, T, H, KV, hd, scale, dt);
        attention_bwd(d_dqkv2, d_dsum2, d_dout, d_out2, d_lse2, d_qkv, B, T, H, KV, hd, scale,
                      dt);
        float *out2 = down_st(d_out2, ny), *lse2 = down(d_lse2, nl);
        float *dqkv2 = down_st(d_dqkv2, nq);
        check_exact(label("attention_fwd", "out again", size), out2, out, ny);
        check_exact(label("attention_fwd", "lse again", size), lse2, lse, nl);
        check_exact(label("attention_bwd", "dqkv again", size), dqkv2, dqkv, nq);
        free(out2); free(lse2); free(dqkv2);
        rt_free(d_out2); rt_free(d_dqkv2); rt_free(d_lse2); rt_free(d_dsum2);
    }

    free(qkv); free(dout); free(nan); free(out); free(lse); free(rqkv_c); free(rqkv);
    free(rqkv_bm); free(rout); free(ratt); free(rlse); free(rout_sm); free(dqkv); free(dsum);
    free(rdout); free(rdout_bm); free(rdqkv); free(rdsum); free(rdqkv_sm); free(rdqkv_c);
    free(extra_x); free(extra); free(ebo); free(ebd);
    rt_free(d_qkv); rt_free(d_out); rt_free(d_dout); rt_free(d_dqkv); rt_free(d_lse);
    rt_free(d_dsum);
}

static void test_attention(void)
{
    op_begin();
    test_attention_case(3, 7, 5, 5, 3, 0);
    test_attention_case(1, 1, 1, 1, 1, 0);
    test_attention_case(2, 67, 3, 3, 64, 1);    /* two tiles, the second of 3 rows */
    test_attention_case(2, 200, 2, 2, 13, 0);   /* 4 tiles; odd head size, padded */
    test_attention_case(2, 130, 3, 3, 67, 0);   /* head size past one register block */
    test_attention_case(1, 1024, 2, 2, 64, 0);  /* 16 x 16 tiles, 136 computed */
    /* bf16 on CUDA: the tensor-core kernels for head sizes 64, 128 and any multiple of 16 */
    test_attention_case(2, 130, 2, 2, 128, 0);  /* three 64-row tiles, the last of 2 rows */
    test_attention_case(3, 77, 2, 2, 32, 0);
    /* grouped-query: groups of 2, 3 and 4 query heads (the tensor-core kernels: hd 32, 16) */
    test_attention_case(2, 67, 4, 2, 13, 0);
    test_attention_case(3, 9, 6, 2, 5, 0);
    test_attention_case(2, 130, 4, 1, 32, 1);
    test_attention_case(1, 77, 6, 2, 16, 0);
    test_attention_case(48, 16, 16, 4, 16, 0);  /* CUDA: grid.y = B x H = 768 blocks (as 124M's
                                                micro-batch 64 x 12 heads), kv heads 4 */
    op_end("attention", 1);
}

/*
** Context-parallel attention as a generated layer's ring (gen/lua/layer.lua) runs it, all ranks' blocks in
** one process: a sequence of T = nch * tc positions cut into nch chunks of tc (nch = 2 CP: the
** load-balanced chunks; nch = 1: one causal block, the whole sequence). Query chunk a sees key
** chunk b < a whole (causal = 0), b = a under the causal rule (causal = 1), b > a not at all.
** q is read from qkv (rows of 3C), k and v from a K|V buffer (rows of 2C) that copy_cols makes
** from qkv, as the ring passes it. attention_fwd_block merges the blocks into acc = 0 and
** lse = -inf (fill_f32) in the order b = (a/2 + j) mod (a + 1), j = 0 .. a: the first merge
** into -inf is a full block (a >= 1) or the causal one (a = 0), and from a = 2 on the causal
** block comes between full ones. The result must be the causal attention of the whole sequence:
** ref_attention_fwd and the log-sum-exp in double. Backward: attention_dsum of (dout, out
** stored in this pass's dtype, as the ring's forward converts it), then attention_bwd_block over the
** same blocks adds into f32 dq (rows of C) and dK|dV (rows of 2C): ref_attention_bwd's
** gradients. copy_cols writes them into dqkv in this pass's dtype, as the ring's backward does.
**
** Tolerances. acc, lse, dsum and the gradients stay in f32 whatever the storage dtype:
** F32_RTOL, as attention_fwd's lse. Each merge adds to a row a log-sum-exp rounded to f32
** (|lse| < 8 here: 5e-7 absolute), which scales both weights alike, so acc moves by that
** relative amount per merge: <= 6 merges, ~3e-6 of the value, inside 1e-5. In bf16 the
** gradients get dsum_bf16_bound (dsum reads the bf16 out, as attention_bwd's does) but not
** BF16_REL: they are not rounded. dqkv is that f32 gradient rounded once to the dtype: exact.
*/
static void test_attention_cp_case(int B, int tc, int nch, int H, int KV, int hd)
{
    char size[56];
    snprintf(size, sizeof size, "B%dT%dH%dKV%dhd%d_%dx%d", B, nch * tc, H, KV, hd, nch, tc);
    int T = nch * tc, C = H * hd, K = KV * hd, W = C + 2 * K, N = T * B;
    size_t nq = (size_t)N * W, nk = (size_t)N * 2 * K, ny = (size_t)N * C;
    size_t nl = (size_t)B * H * T;
    size_t chunk = (size_t)tc * B;                  /* rows of one chunk */
    float scale = 1.0f / sqrtf((float)hd);
    float *qkv = frand_st(nq, -1.5f, 1.5f), *dout = frand_st(ny, -1, 1);
    float *nan = fconst(nl, NAN), *zero = fconst(nk > ny ? nk : ny, 0);
    void *d_qkv = dev_st(qkv, nq), *d_kv = dev_st_nan(nk), *d_dout = dev_st(dout, ny);
    void *d_out = dev_st_nan(ny), *d_dqkv = dev_st_nan(nq);
    float *d_acc = dev_copy(zero, ny * 4), *d_lse = dev_copy(nan, nl * 4);
    float *d_dsum = dev_copy(nan, nl * 4), *d_dq = dev_copy(zero, ny * 4);
    float *d_dkv = dev_copy(zero, nk * 4);

    /* K|V: columns C .. W of qkv, a copy */
    copy_cols(d_kv, dt, 2 * (size_t)K, st_at(d_qkv, (size_t)C), dt, (size_t)W, N, 2 * K);
    float *kv = down_st(d_kv, nk), *want = xmalloc(nq * 4);
    for (size_t r = 0; r < (size_t)N; r++)
        memcpy(want + r * 2 * K, qkv + r * W + C, 2 * (size_t)K * 4);
    check_exact(label("copy_cols", "kv", size), kv, want, nk);

    fill_f32(d_lse, nl, -INFINITY);
    for (int a = 0; a < nch; a++)
        for (int j = 0; j <= a; j++) {
            int b = (a / 2 + j) % (a + 1);
            size_t qa = (size_t)a * chunk, kb = (size_t)b * chunk;
            attention_fwd_block(d_acc + qa * C, d_lse + (size_t)a * tc, T,
                                st_at(d_qkv, qa * W), W, st_at(d_kv, kb * 2 * K),
                                st_at(d_kv, kb * 2 * K + K), 2 * K, B, tc, tc, H, KV, hd,
                                b == a, scale, dt);
        }
    float *acc = down(d_acc, ny), *lse = down(d_lse, nl);
    double *rqkv_c = widen(qkv, nq), *rqkv = kv_widen(rqkv_c, N, H, KV, hd);
    double *rqkv_bm = to_batch_major(rqkv, T, B, 3 * C);
    double *rout = xmalloc(ny * 8), *ratt = xmalloc(nl * T * 8), *rlse = xmalloc(nl * 8);
    ref_attention_fwd(rout, ratt, rqkv_bm, B, T, C, H);
    double *rout_sm = to_seq_major(rout, T, B, C);
    lse_in_double(rlse, rqkv_bm, B, T, H, hd);
    check(label("attention_fwd_block", "acc", size), acc, rout_sm, ny, -1, F32_RTOL);
    check(label("attention_fwd_block", "lse", size), lse, rlse, nl, -1, F32_RTOL);
    keep(label("attention_fwd_block", "acc", size), acc, ny);
    keep(label("attention_fwd_block", "lse", size), lse, nl);

    convert(d_out, dt, d_acc, RT_F32, ny);
    float *out = down_st(d_out, ny);
    attention_dsum(d_dsum, d_dout, d_out, B, T, H, hd, dt);
    float *dsum = down(d_dsum, nl);
    double *rdsum = xmalloc(nl * 8);
    dsum_in_double(rdsum, dout, out, B, T, H, hd);
    check(label("attention_dsum", "dsum", size), dsum, rdsum, nl, -1, F32_RTOL);
    keep(label("attention_dsum", "dsum", size), dsum, nl);

    for (int a = 0; a < nch; a++)
        for (int j = 0; j <= a; j++) {
            int b = (a / 2 + j) % (a + 1);
            size_t qa = (size_t)a * chunk, kb = (size_t)b * chunk;
            attention_bwd_block(d_dq + qa * C, d_dkv + kb * 2 * K, d_dkv + kb * 2 * K + K,
                                2 * K, st_at(d_dout, qa * C), d_lse + (size_t)a * tc,
                                d_dsum + (size_t)a * tc, T, st_at(d_qkv, qa * W), W,
                                st_at(d_kv, kb * 2 * K), st_at(d_kv, kb * 2 * K + K), 2 * K, B,
                                tc, tc, H, KV, hd, b == a, scale, dt);
        }
    /* the f32 gradients in the layout of dqkv: dq | dk | dv */
    float *dq = down(d_dq, ny), *dkv = down(d_dkv, nk), *grad = xmalloc(nq * 4);
    for (size_t r = 0; r < (size_t)N; r++) {
        memcpy(grad + r * W, dq + r * C, (size_t)C * 4);
        memcpy(grad + r * W + C, dkv + r * 2 * K, 2 * (size_t)K * 4);
    }
    double *rdout = widen(dout, ny), *rdout_bm = to_batch_major(rdout, T, B, C);
    double *rdqkv = xmalloc((size_t)N * 3 * C * 8);
    ref_attention_bwd(rdqkv, rdout_bm, rqkv_bm, ratt, B, T, C, H);
    double *rdqkv_sm = to_seq_major(rdqkv, T, B, 3 * C);
    double *rdqkv_c = kv_sum(rdqkv_sm, N, H, KV, hd);
    double *extra_x = dsum_bf16_bound(rqkv, rdout_bm, rout, ratt, B, T, H, hd);
    double *extra = extra_x ? kv_sum(extra_x, N, H, KV, hd) : NULL;
    check_bound(label("attention_bwd_block", "dqkv", size), grad, rdqkv_c, nq, -1, F32_RTOL,
                extra);
    keep(label("attention_bwd_block", "dqkv", size), grad, nq);

    /* into dqkv as ring_bwd copies them out: one rounding to this pass's dtype */
    copy_cols(d_dqkv, dt, (size_t)W, d_dq, RT_F32, (size_t)C, N, C);
    copy_cols(st_at(d_dqkv, (size_t)C), dt, (size_t)W, d_dkv, RT_F32, 2 * (size_t)K, N, 2 * K);
    float *dqkv = down_st(d_dqkv, nq);
    for (size_t i = 0; i < nq; i++) want[i] = st_round(grad[i]);
    check_exact(label("copy_cols", "dqkv", size), dqkv, want, nq);

    free(qkv); free(dout); free(nan); free(zero); free(kv); free(want); free(acc); free(lse);
    free(rqkv_c); free(rqkv); free(rqkv_bm); free(rout); free(ratt); free(rlse); free(rout_sm); free(out);
    free(dsum); free(rdsum); free(dq); free(dkv); free(grad); free(rdout); free(rdout_bm);
    free(rdqkv); free(rdqkv_sm); free(rdqkv_c); free(extra_x); free(extra); free(dqkv);
    rt_free(d_qkv); rt_free(d_kv); rt_free(d_dout); rt_free(d_out); rt_free(d_dqkv);
    rt_free(d_acc); rt_free(d_lse); rt_free(d_dsum); rt_free(d_dq); rt_free(d_dkv);
}

static void test_attention_cp(void)
{
    op_begin();
    test_attention_cp_case(3, 5, 6, 2, 2, 13);  /* CP 3: 21 blocks of 5 positions */
    test_attention_cp_case(1, 70, 4, 2, 2, 13); /* CP 2: blocks of two tiles, the second of 6 */
    test_attention_cp_case(3, 70, 2, 3, 3, 64); /* CP 1: causal, full, causal */
    test_attention_cp_case(2, 37, 1, 3, 3, 7);  /* one causal block: the whole sequence */
    test_attention_cp_case(2, 1, 6, 1, 1, 1);   /* one position per chunk */
    test_attention_cp_case(1, 33, 6, 2, 2, 67); /* head size past one register block */
    test_attention_cp_case(2, 9, 4, 4, 2, 7);   /* grouped-query: groups of 2, CP 2 */
    test_attention_cp_case(1, 70, 2, 6, 2, 16); /* groups of 3, blocks of two tiles */
    op_end("attention_cp", 1);
}

/* -- Cross-entropy, vocabulary-parallel -------------------------------------------------------- */

/*
** N rows, vocabulary V padded to TP * Vl columns and split over TP simulated ranks the way the
** generated head does it (head_fwd_bwd in a stage source): ce_rowmax per rank, max over ranks, ce_sums per rank
** with the global max, sums over ranks, ce_loss, ce_bwd per rank. Padding columns hold
** garbage that must not matter; a rank may own no valid column; targets are spread over all
** ranks (so most are outside any one rank's range). Logits in [-amp, amp]; with 'peaked' every
** third row is -amp everywhere but one column (0): a one-hot softmax.
*/
static void test_ce_case(int N, int V, int TP, int Vl, float dloss, float amp, int peaked)
{
    char size[64];
    snprintf(size, sizeof size, "N%dV%dtp%dVl%d_a%g%s", N, V, TP, Vl, amp, peaked ? "p" : "");
    int *tgt = xmalloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) tgt[n] = (int)(rng_next() % (uint64_t)V);
    tgt[0] = V - 1;                                 /* the last valid column */
    float *logits = frand_st((size_t)N * V, -amp, amp);
    if (peaked)
        for (int n = 0; n < N; n += 3) {
            int hot = (int)(rng_next() % (uint64_t)V);
            for (int v = 0; v < V; v++)
                logits[(size_t)n * V + v] = v == hot ? 0.0f : st_round(-amp);
        }
    int *d_tgt = dev_copy(tgt, (size_t)N * sizeof(int));
    float *gmx = fconst((size_t)N, -INFINITY), *gsums = fconst(2 * (size_t)N, 0);
    void *d_logit[16], *d_fused = NULL;      /* TP 1: a copy for ce_fused */
    float *d_ce[16];
    float *nan = fconst(4 * (size_t)N, NAN);
    for (int r = 0; r < TP; r++) {
        int vstart = r * Vl, valid = V - vstart < 0 ? 0 : V - vstart > Vl ? Vl : V - vstart;
        float *part = frand_st((size_t)N * Vl, 2 * amp + 50, 2 * amp + 60);  /* padding: max */
        for (int n = 0; n < N; n++)
            for (int j = 0; j < valid; j++)
                part[(size_t)n * Vl + j] = logits[(size_t)n * V + vstart + j];
        d_logit[r] = dev_st(part, (size_t)N * Vl);
        if (TP == 1) d_fused = dev_st(part, (size_t)N * Vl);
        d_ce[r] = dev_copy(nan, 4 * (size_t)N * 4);
        ce_rowmax(d_ce[r], d_logit[r], N, Vl, valid, dt);
        float *mx = down(d_ce[r], (size_t)N);
        for (int n = 0; n < N; n++) gmx[n] = fmaxf(gmx[n], mx[n]);
        free(part); free(mx);
    }
    /* the reference: row max, sum of exp, target logit over the whole row, in double */
    double *rmx = xmalloc((size_t)N * 8), *rsum = xmalloc((size_t)N * 8);
    double *rtl = xmalloc((size_t)N * 8);
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        double m = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) m = fmax(m, z[v]);
        for (int v = 0; v < V; v++) s += exp(z[v] - (double)gmx[n]);
        rmx[n] = m;
        rsum[n] = s;
        rtl[n] = z[tgt[n]];
    }
    check(label("ce_rowmax", "max", size), gmx, rmx, (size_t)N, 0, 0);
    keep(label("ce_rowmax", "max", size), gmx, (size_t)N);
    float *d_gmx = dev_copy(gmx, (size_t)N * 4);
    for (int r = 0; r < TP; r++) {
        int vstart = r * Vl, valid = V - vstart < 0 ? 0 : V - vstart > Vl ? Vl : V - vstart;
        ce_sums(d_ce[r] + N, d_logit[r], d_gmx, d_tgt, N, Vl, valid, vstart, dt);
        float *s = down(d_ce[r] + N, 2 * (size_t)N);
        for (int n = 0; n < N; n++) {
            int t = tgt[n] - vstart;
            if (!(t >= 0 && t < valid) && s[N + n] != 0) {
                printf("  ce_sums.%s: rank %d row %d: target %d is not its own but its target "
                       "logit is %.9g, not 0\n", size, r, n, tgt[n], s[N + n]);
                fail("ce_sums.%s: target logit of a target outside rank %d is not 0", size, r);
            }
            gsums[n] += s[n];
            gsums[N + n] += s[N + n];
        }
        free(s);
    }
    check(label("ce_sums", "sumexp", size), gsums, rsum, (size_t)N, -1, F32_RTOL);
    check(label("ce_sums", "target", size), gsums + N, rtl, (size_t)N, 0, 0);
    keep(label("ce_sums", "sums", size), gsums, 2 * (size_t)N);

    /* loss per row and its sum (sum_rows: in order), against ref_xent_fwd */
    float *d_gsums = dev_copy(gsums, 2 * (size_t)N * 4);
    float *d_loss = dev_copy(nan, (size_t)N * 4), *d_lsum = dev_copy(nan, 4);
    ce_loss(d_loss, d_gsums, d_gmx, N);
    sum_rows(d_lsum, d_loss, N);
    float *loss = down(d_loss, (size_t)N), *lsum = down(d_lsum, 1);
    double *rlogits = widen(logits, (size_t)N * V), *rprobs = xmalloc((size_t)N * V * 8);
    double *rloss = xmalloc((size_t)N * 8), rlsum = 0;
    ref_xent_fwd(rprobs, rloss, rlogits, tgt, N, V);
    for (int n = 0; n < N; n++) rlsum += rloss[n];
    check(label("ce_loss", "loss", size), loss, rloss, (size_t)N, -1, F32_RTOL);
    check(label("sum_rows", "sum", size), lsum, &rlsum, 1, -1, F32_RTOL);
    check_finite(label("ce_loss", "loss", size), loss, (size_t)N);
    keep(label("ce_loss", "loss", size), loss, (size_t)N);
    keep(label("sum_rows", "sum", size), lsum, 1);

    /* backward, in place over each rank's logits; padding columns become 0 */
    double *rdl = xmalloc((size_t)N * V * 8);
    ref_xent_bwd(rdl, rprobs, tgt, N, V, dloss);
    for (int r = 0; r < TP; r++) {
        int vstart = r * Vl, valid = V - vstart < 0 ? 0 : V - vstart > Vl ? Vl : V - vstart;
        ce_bwd(d_logit[r], d_gmx, d_gsums, d_tgt, N, Vl, valid, vstart, dloss, dt);
        float *dl = down_st(d_logit[r], (size_t)N * Vl);
        double *want = xmalloc((size_t)N * Vl * 8);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < valid; j++)
                want[(size_t)n * Vl + j] = rdl[(size_t)n * V + vstart + j];
        char what[64];
        snprintf(what, sizeof what, "dlogits-rank%d", r);
        check_st(label("ce_bwd", what, size), dl, want, (size_t)N * Vl, -1, F32_RTOL);
        keep(label("ce_bwd", what, size), dl, (size_t)N * Vl);
        free(dl); free(want);
        rt_free(d_logit[r]); rt_free(d_ce[r]);
    }
    /* TP 1: the fused kernel against the same reference (its sums in another order) */
    if (TP == 1) {
        float *d_f = dev_copy(nan, 4 * (size_t)N * 4);
        ce_fused(d_f + 3 * N, d_f, d_f + N, d_fused, d_tgt, N, Vl, V, 0, dloss, dt);
        float *f = down(d_f, 4 * (size_t)N), *dl = down_st(d_fused, (size_t)N * Vl);
        check(label("ce_fused", "max", size), f, rmx, (size_t)N, 0, 0);
        check(label("ce_fused", "sumexp", size), f + N, rsum, (size_t)N, -1, F32_RTOL);
        check(label("ce_fused", "target", size), f + 2 * N, rtl, (size_t)N, 0, 0);
        check(label("ce_fused", "loss", size), f + 3 * N, rloss, (size_t)N, -1, F32_RTOL);
        double *want = xmalloc((size_t)N * Vl * 8);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < Vl; j++)
                want[(size_t)n * Vl + j] = j < V ? rdl[(size_t)n * V + j] : 0.0;
        check_st(label("ce_fused", "dlogits", size), dl, want, (size_t)N * Vl, -1, F32_RTOL);
        keep(label("ce_fused", "stats", size), f, 4 * (size_t)N);
        keep(label("ce_fused", "dlogits", size), dl, (size_t)N * Vl);
        free(f); free(dl); free(want);
        rt_free(d_f); rt_free(d_fused);
    }
    free(tgt); free(logits); free(gmx); free(gsums); free(nan); free(rmx); free(rsum); free(rtl);
    free(loss); free(lsum); free(rlogits); free(rprobs); free(rloss); free(rdl);
    rt_free(d_tgt); rt_free(d_gmx); rt_free(d_gsums); rt_free(d_loss); rt_free(d_lsum);
}

static void test_ce(void)
{
    op_begin();
    test_ce_case(23, 37, 1, 48, 1.0f / 23, 4, 0);     /* one rank, 11 padding columns */
    test_ce_case(23, 37, 4, 16, 0.125f, 4, 0);        /* 16 | 16 | 5 valid + 11 pad | 0 valid */
    test_ce_case(301, 200, 3, 67, 1.0f / 600, 4, 0);  /* > one CUDA block of rows */
    test_ce_case(41, 90, 2, 48, 1.0f / 41, 1e4f, 0);  /* |logit| ~ 1e4 */
    test_ce_case(41, 90, 2, 48, 1.0f / 41, 1e4f, 1);  /* and rows that are one-hot */
    test_ce_case(5, 1500, 1, 1536, 0.2f, 4, 0);       /* > a CUDA block's threads per row */
    test_ce_case(6, 1100, 1, 1100, 0.25f, 1e4f, 1);
    op_end("crossentropy", 1);
}

/* -- AdamW, sum of squares ------------------------------------------------------------------- */

/* with_copy: the updated parameters are also written in this pass's dtype: they must be the
** kernel's own f32 parameters, rounded. */
static void test_adamw_case(size_t n, float wd, int with_copy)
{
    char size[32];
    snprintf(size, sizeof size, "n%zu_wd%g%s", n, wd, with_copy ? "_copy" : "");
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float *p = frand(n, -1, 1), *m = fconst(n, 0), *v = fconst(n, 0);
    float *d_p = dev_copy(p, n * 4), *d_m = dev_copy(m, n * 4), *d_v = dev_copy(v, n * 4);
    void *d_copy = with_copy ? dev_st_nan(n) : NULL;
    double *rp = widen(p, n), *rm = xmalloc(n * 8), *rv = xmalloc(n * 8), *rg = xmalloc(n * 8);
    for (int t = 1; t <= 3; t++) {
        float *g = frand(n, -0.5f, 0.5f), gscale = t == 2 ? 0.7f : 1.0f;
        for (size_t i = 0; i < n; i += 7) g[i] = 0;              /* zero gradients too */
        for (size_t i = 3; i < n; i += 11) g[i] *= 1e-6f;        /* and tiny ones */
        float *d_g = dev_copy(g, n * 4);
        float bc1 = (float)(1.0 - pow((double)beta1, t));     /* as the stage computes them */
        float bc2 = (float)(1.0 - pow((double)beta2, t));
        adamw_step(d_p, d_g, d_m, d_v, n, lr, beta1, beta2, eps, wd, bc1, bc2, gscale, d_copy,
                   dt);
        for (size_t i = 0; i < n; i++) rg[i] = (double)(g[i] * gscale);
        ref_adamw_update(rp, rg, rm, rv, n, lr, beta1, beta2, eps, wd, t);
        free(g);
        rt_free(d_g);
    }
    float *gp = down(d_p, n), *gm = down(d_m, n), *gv = down(d_v, n);
    /* p moves by <= 3 lr; the tolerance is relative to p (O(1)) and to the step (lr) */
    check(label("adamw_step", "p", size), gp, rp, n, lr * 1e-5, F32_RTOL);
    check(label("adamw_step", "m", size), gm, rm, n, -1, F32_RTOL);
    check(label("adamw_step", "v", size), gv, rv, n, -1, F32_RTOL);
    keep(label("adamw_step", "p", size), gp, n);
    keep(label("adamw_step", "m", size), gm, n);
    keep(label("adamw_step", "v", size), gv, n);
    if (with_copy) {
        float *copy = down_st(d_copy, n), *want = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) want[i] = st_round(gp[i]);
        check_exact(label("adamw_step", "copy", size), copy, want, n);
        free(copy); free(want);
    }
    free(p); free(m); free(v); free(rp); free(rm); free(rv); free(rg); free(gp); free(gm); free(gv);
    rt_free(d_p); rt_free(d_m); rt_free(d_v); rt_free(d_copy);
}

/* adamw_multi on MT_NT tensors (more than a launch takes; sizes 0, 1, ..., some past a CUDA
** block; decay on every other one; copies: none, all, or every third tensor's, which splits
** the CUDA launches) against adamw_step on each: bit for bit. */
#define MT_NT (MT_TENSORS + 7)
static void test_adamw_multi_case(int copies)      /* 0: none, 1: all, 2: every third */
{
    char size[32];
    snprintf(size, sizeof size, "x%d_copies%d", MT_NT, copies);
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, bc1 = 0.19f, bc2 = 0.0975f;
    adamw_tensor ts[MT_NT], one[MT_NT];
    size_t n[MT_NT];
    for (int k = 0; k < MT_NT; k++) {
        n[k] = k < 2 ? (size_t)k : (size_t)(k * 97 % 700);
        float *p = frand(n[k], -1, 1), *m = frand(n[k], -0.1f, 0.1f), *v = frand(n[k], 0, 0.01f);
        float *g = frand(n[k], -0.5f, 0.5f);
        float wd = k % 2 ? 0.1f : 0.0f;
        int with_copy = copies == 1 || (copies == 2 && k % 3 == 0);
        void *c0 = with_copy ? dev_st_nan(n[k]) : NULL, *c1 = with_copy ? dev_st_nan(n[k]) : NULL;
        float *d_g = dev_copy(g, n[k] * 4);
        ts[k] = (adamw_tensor){ dev_copy(p, n[k] * 4), dev_copy(m, n[k] * 4),
                                dev_copy(v, n[k] * 4), d_g, c0, n[k], wd };
        one[k] = (adamw_tensor){ dev_copy(p, n[k] * 4), dev_copy(m, n[k] * 4),
                                 dev_copy(v, n[k] * 4), d_g, c1, n[k], wd };
        free(p); free(m); free(v); free(g);
    }
    adamw_multi(ts, MT_NT, lr, beta1, beta2, eps, bc1, bc2, 0.7f, dt);
    for (int k = 0; k < MT_NT; k++)
        adamw_step(one[k].p, one[k].g, one[k].m, one[k].v, n[k], lr, beta1, beta2, eps,
                   one[k].wd, bc1, bc2, 0.7f, one[k].copy, dt);
    for (int k = 0; k < MT_NT; k++) {
        float *a[3] = { ts[k].p, ts[k].m, ts[k].v }, *b[3] = { one[k].p, one[k].m, one[k].v };
        for (int j = 0; j < 3; j++) {
            float *ga = down(a[j], n[k]), *gb = down(b[j], n[k]);
            check_exact(label("adamw_multi", "pmv", size), ga, gb, n[k]);
            free(ga); free(gb);
            rt_free(a[j]); rt_free(b[j]);
        }
        if (ts[k].copy) {
            float *ga = down_st(ts[k].copy, n[k]), *gb = down_st(one[k].copy, n[k]);
            check_exact(label("adamw_multi", "copy", size), ga, gb, n[k]);
            free(ga); free(gb);
        }
        rt_free((void *)ts[k].g); rt_free(ts[k].copy); rt_free(one[k].copy);
    }
}

static void test_adamw(void)
{
    op_begin();
    test_adamw_case(5, 0.1f, 1);
    test_adamw_case(2 * 16384 + 37, 0.1f, 1);       /* several CPU tasks, many CUDA blocks */
    test_adamw_case(301, 0.0f, 0);                  /* no decay (biases, LayerNorm), no copy */
    test_adamw_multi_case(1);
    test_adamw_multi_case(0);
    test_adamw_multi_case(2);
    op_end("adamw", 1);
}

static void test_sumsq(void)                        /* f32 only */
{
    op_begin();
    size_t sizes[3] = { 1, 37, 100003 };
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        char size[32];
        snprintf(size, sizeof size, "n%zu", n);
        float *x = frand(n, -2, 2), *nan = fconst(1, NAN);
        x[0] = 2.0f;        /* a large first element whatever the stream: skipping it shows */
        float *d_x = dev_copy(x, n * 4), *d_out = dev_copy(nan, 4);
        sumsq(d_out, d_x, n);
        float *got = down(d_out, 1);
        double want = 0;
        for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        check(label("sumsq", "out", size), got, &want, 1, 0, 1e-6);
        keep(label("sumsq", "out", size), got, 1);
        free(x); free(nan); free(got);
        rt_free(d_x); rt_free(d_out);
    }
    /* sumsq_multi over MT_NT tensors (sizes 0, 1, ..., one of several CUDA parts) against
    ** sumsq on each: bit for bit */
    const float *xs[MT_NT];
    size_t ns[MT_NT];
    float *nan = fconst(MT_NT, NAN), *d_multi = dev_copy(nan, MT_NT * 4);
    float *d_one = dev_copy(nan, MT_NT * 4);
    for (int k = 0; k < MT_NT; k++) {
        ns[k] = k == 5 ? 100003 : k < 2 ? (size_t)k : (size_t)(k * 131 % 900);
        float *x = frand(ns[k], -2, 2);
        xs[k] = dev_copy(x, ns[k] * 4);
        sumsq(d_one + k, xs[k], ns[k]);
        free(x);
    }
    sumsq_multi(d_multi, xs, ns, MT_NT);
    float *gm = down(d_multi, MT_NT), *go = down(d_one, MT_NT);
    check_exact(label("sumsq_multi", "out", "x31"), gm, go, MT_NT);
    for (int k = 0; k < MT_NT; k++) rt_free((void *)xs[k]);
    free(nan); free(gm); free(go);
    rt_free(d_multi); rt_free(d_one);
    op_end("sumsq", 0);
}

/* -- Mixture of experts ---------------------------------------------------------------------- */
/*
** The reference has the whole MoE block only (ref_moe_fwd/bwd; the moe suite compares the model
** with it); here each kernel against its formula in double (tests/ref/README.md, "Mixture of
** experts": top-k of the logits with ties to the lower expert, softmax over the k or, with
** pre_softmax, the scores).
*/

/* moe_route (f32 in and out): E experts, top k, some rows with tied logits. */
static void test_route_case(int N, int E, int k, int pre)
{
    char size[48];
    snprintf(size, sizeof size, "N%dE%dk%d%s", N, E, k, pre ? "_pre" : "");
    float *logits = frand((size_t)N * E, -2, 2);
    for (int n = 0; n < N; n += 4) logits[(size_t)n * E + E - 1] = logits[(size_t)n * E];
    float *d_logits = dev_copy(logits, (size_t)N * E * 4);
    int *d_sel = rt_malloc((size_t)N * k * sizeof(int));
    float *d_prob = rt_malloc((size_t)N * k * 4), *d_scores = rt_malloc((size_t)N * E * 4);
    const float c = k > 1 ? 2.5f : 1.0f;          /* topk_scaling_factor */
    moe_route(d_sel, d_prob, d_scores, NULL, d_logits, N, E, k, pre, c, 1, 1, NULL);
    int *sel = xmalloc((size_t)N * k * sizeof(int));
    rt_memcpy(sel, d_sel, (size_t)N * k * sizeof(int), RT_D2H);
    float *prob = down(d_prob, (size_t)N * k), *scores = down(d_scores, (size_t)N * E);
    double *rprob = xmalloc((size_t)N * k * 8), *rscores = xmalloc((size_t)N * E * 8);
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * E;
        double m = -INFINITY, s = 0;
        for (int e = 0; e < E; e++) m = fmax(m, z[e]);
        for (int e = 0; e < E; e++) s += exp(z[e] - m);
        for (int e = 0; e < E; e++) rscores[(size_t)n * E + e] = exp(z[e] - m) / s;
        int rsel[16];
        for (int j = 0; j < k; j++) {        /* the largest not taken; ties: the lower expert */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= rsel[i] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            rsel[j] = best;
            if (sel[(size_t)n * k + j] != best) {
                printf("  moe_route.%s: row %d choice %d is expert %d, not %d\n", size, n, j,
                       sel[(size_t)n * k + j], best);
                fail("moe_route.%s: wrong experts selected", size);
            }
        }
        double ps = 0;
        for (int j = 0; j < k; j++) ps += exp(z[rsel[j]] - z[rsel[0]]);
        for (int j = 0; j < k; j++)
            rprob[(size_t)n * k + j] = c * (pre ? rscores[(size_t)n * E + rsel[j]]
                                               : exp(z[rsel[j]] - z[rsel[0]]) / ps);
    }
    check(label("moe_route", "prob", size), prob, rprob, (size_t)N * k, -1, F32_RTOL);
    check(label("moe_route", "scores", size), scores, rscores, (size_t)N * E, -1, F32_RTOL);
    keep(label("moe_route", "prob", size), prob, (size_t)N * k);
    keep(label("moe_route", "scores", size), scores, (size_t)N * E);

    /* the backward in this pass's dtype, from the kernel's own f32 routing state, with a
    ** z-loss gradient zg per row and per-sequence aux gradients (period 3: rows n % 3) */
    const int P = 3;
    float *dprob = frand((size_t)N * k, -1, 1), *auxg = frand((size_t)P * E, -0.1f, 0.1f);
    float *zg = frand((size_t)N, -0.1f, 0.1f);
    float *d_dprob = dev_copy(dprob, (size_t)N * k * 4);
    float *d_auxg = dev_copy(auxg, (size_t)P * E * 4);
    float *d_zg = dev_copy(zg, (size_t)N * 4);
    void *d_dl = dev_st_nan((size_t)N * E);
    moe_route_bwd(d_dl, d_dprob, d_prob, d_scores, NULL, d_sel, d_auxg, P, d_zg, N, E, k, pre,
                  c, dt);
    float *dl = down_st(d_dl, (size_t)N * E);
    double *rdl = xmalloc((size_t)N * E * 8), *ds = xmalloc((size_t)E * 8);
    for (int n = 0; n < N; n++) {
        const float *s = scores + (size_t)n * E, *p = prob + (size_t)n * k;
        const float *dp = dprob + (size_t)n * k;
        const int *se = sel + (size_t)n * k;
        double dot = 0, pd = 0;
        for (int e = 0; e < E; e++) {
            ds[e] = auxg[(size_t)(n % P) * E + e];
            for (int j = 0; j < k && pre; j++) ds[e] += se[j] == e ? c * dp[j] : 0;
            dot += s[e] * ds[e];
        }
        for (int j = 0; j < k; j++) pd += (double)p[j] * dp[j] / c;
        for (int e = 0; e < E; e++) rdl[(size_t)n * E + e] = s[e] * (ds[e] - dot + zg[n]);
        for (int j = 0; j < k && !pre; j++) rdl[(size_t)n * E + se[j]] += p[j] * (dp[j] - pd);
    }
    check_st(label("moe_route_bwd", "dlogits", size), dl, rdl, (size_t)N * E, -1, F32_RTOL);
    keep(label("moe_route_bwd", "dlogits", size), dl, (size_t)N * E);
    free(logits); free(sel); free(prob); free(scores); free(rprob); free(rscores); free(dprob);
    free(auxg); free(zg); free(dl); free(rdl); free(ds);
    rt_free(d_logits); rt_free(d_sel); rt_free(d_prob); rt_free(d_scores); rt_free(d_dprob);
    rt_free(d_auxg); rt_free(d_zg); rt_free(d_dl);
}

/* moe_route with group-limited routing: E experts in G groups, the top k from the g best
** groups (a group's score: the sum of its k/g largest logits, or softmax scores with pre);
** the choices against a double-precision selection. */
static void test_route_group_case(int N, int E, int k, int G, int g, int pre)
{
    char size[48];
    snprintf(size, sizeof size, "N%dE%dk%dG%dg%d%s", N, E, k, G, g, pre ? "_pre" : "");
    float *logits = frand((size_t)N * E, -2, 2);
    float *d_logits = dev_copy(logits, (size_t)N * E * 4);
    int *d_sel = rt_malloc((size_t)N * k * sizeof(int));
    float *d_prob = rt_malloc((size_t)N * k * 4), *d_scores = rt_malloc((size_t)N * E * 4);
    moe_route(d_sel, d_prob, d_scores, NULL, d_logits, N, E, k, pre, 1.0f, G, g, NULL);
    int *sel = xmalloc((size_t)N * k * sizeof(int));
    rt_memcpy(sel, d_sel, (size_t)N * k * sizeof(int), RT_D2H);
    float *scores = down(d_scores, (size_t)N * E);
    int W = E / G, m = k / g, bad = 0;
    for (int n = 0; n < N && !bad; n++) {
        const float *z = logits + (size_t)n * E;
        const float *v = pre ? scores + (size_t)n * E : z;     /* the kernel's own scores */
        double gs[64];
        int ok[64], rsel[16];
        for (int q = 0; q < G; q++) {
            gs[q] = 0;
            for (int e = q * W; e < (q + 1) * W; e++) {
                int rank = 0;
                for (int f = q * W; f < (q + 1) * W; f++)
                    rank += v[f] > v[e] || (v[f] == v[e] && f < e);
                if (rank < m) gs[q] += v[e];
            }
        }
        for (int q = 0; q < G; q++) {
            int rank = 0;
            for (int h = 0; h < G; h++) rank += gs[h] > gs[q] || (gs[h] == gs[q] && h < q);
            ok[q] = rank < g;
        }
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = !ok[e / W];
                for (int i = 0; i < j; i++) taken |= rsel[i] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            rsel[j] = best;
            if (sel[(size_t)n * k + j] != best) {
                printf("  moe_route.%s: row %d choice %d is expert %d, not %d\n", size, n, j,
                       sel[(size_t)n * k + j], best);
                bad = 1;
            }
        }
    }
    if (bad) fail("moe_route.%s: wrong experts selected", size);
    free(logits); free(sel); free(scores);
    rt_free(d_logits); rt_free(d_sel); rt_free(d_prob); rt_free(d_scores);
}

/* moe_route with sigmoid scores (Megatron's score function sigmoid), top k, scaling factor c:
** forward against double sigmoids, backward against the chain rule in double. */
static void test_route_sigmoid_case(int N, int E, int k)
{
    char size[48];
    snprintf(size, sizeof size, "N%dE%dk%d_sigmoid", N, E, k);
    float *logits = frand((size_t)N * E, -3, 3);
    float *d_logits = dev_copy(logits, (size_t)N * E * 4);
    int *d_sel = rt_malloc((size_t)N * k * sizeof(int));
    float *d_prob = rt_malloc((size_t)N * k * 4), *d_scores = rt_malloc((size_t)N * E * 4);
    float *d_ssum = rt_malloc((size_t)N * 4);
    const float c = 1.5f;
    moe_route(d_sel, d_prob, d_scores, d_ssum, d_logits, N, E, k, 0, c, 1, 1, NULL);
    int *sel = xmalloc((size_t)N * k * sizeof(int));
    rt_memcpy(sel, d_sel, (size_t)N * k * sizeof(int), RT_D2H);
    float *prob = down(d_prob, (size_t)N * k), *scores = down(d_scores, (size_t)N * E);
    double *rprob = xmalloc((size_t)N * k * 8), *rscores = xmalloc((size_t)N * E * 8);
    double *sig = xmalloc((size_t)N * E * 8), *rD = xmalloc((size_t)N * 8);
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * E;
        double D = 1e-20, ps = 0;
        for (int e = 0; e < E; e++) D += sig[(size_t)n * E + e] = 1.0 / (1.0 + exp(-z[e]));
        rD[n] = D;
        for (int e = 0; e < E; e++) rscores[(size_t)n * E + e] = sig[(size_t)n * E + e] / D;
        const int *se = sel + (size_t)n * k;        /* selection: as the softmax test checks */
        for (int j = 0; j < k; j++) ps += sig[(size_t)n * E + se[j]];
        for (int j = 0; j < k; j++)
            rprob[(size_t)n * k + j] = c * sig[(size_t)n * E + se[j]] / (k > 1 ? ps + 1e-20 : 1);
    }
    check(label("moe_route", "prob", size), prob, rprob, (size_t)N * k, -1, F32_RTOL);
    check(label("moe_route", "scores", size), scores, rscores, (size_t)N * E, -1, F32_RTOL);

    const int P = 2;
    float *dprob = frand((size_t)N * k, -1, 1), *auxg = frand((size_t)P * E, -0.1f, 0.1f);
    float *d_dprob = dev_copy(dprob, (size_t)N * k * 4);
    float *d_auxg = dev_copy(auxg, (size_t)P * E * 4);
    void *d_dl = dev_st_nan((size_t)N * E);
    moe_route_bwd(d_dl, d_dprob, d_prob, d_scores, d_ssum, d_sel, d_auxg, P, NULL, N, E, k, 0,
                  c, dt);
    float *dl = down_st(d_dl, (size_t)N * E);
    double *rdl = xmalloc((size_t)N * E * 8);
    for (int n = 0; n < N; n++) {
        const double *sg = sig + (size_t)n * E, *s = rscores + (size_t)n * E;
        const float *dp = dprob + (size_t)n * k, *ag = auxg + (size_t)(n % P) * E;
        const int *se = sel + (size_t)n * k;
        double ssel = 0, qd = 0, gs = 0;
        for (int j = 0; j < k; j++) ssel += sg[se[j]];
        double den = ssel + 1e-20;
        for (int j = 0; j < k; j++) qd += sg[se[j]] / den * c * dp[j];
        for (int e = 0; e < E; e++) gs += ag[e] * s[e];
        for (int e = 0; e < E; e++) {
            double dsig = (ag[e] - gs) / rD[n];
            for (int j = 0; j < k; j++)
                if (se[j] == e) dsig += k > 1 ? (c * dp[j] - qd) / den : c * dp[j];
            rdl[(size_t)n * E + e] = dsig * sg[e] * (1 - sg[e]);
        }
    }
    check_st(label("moe_route_bwd", "dlogits", size), dl, rdl, (size_t)N * E, -1, F32_RTOL);
    free(logits); free(sel); free(prob); free(scores); free(rprob); free(rscores); free(sig);
    free(rD); free(dprob); free(auxg); free(dl); free(rdl);
    rt_free(d_logits); rt_free(d_sel); rt_free(d_prob); rt_free(d_scores); rt_free(d_ssum);
    rt_free(d_dprob); rt_free(d_auxg); rt_free(d_dl);
}

/* moe_route with sigmoid scores and an expert bias (aux-loss-free balancing; groups > 1:
** group-limited): the choice is the top-k of sigmoid + bias in double (groups scored with it),
** the probabilities the unbiased sigmoids of the chosen; the bias must change some choice. */
static void test_route_ebias_case(int N, int E, int k, int G, int g)
{
    char size[48];
    snprintf(size, sizeof size, "N%dE%dk%dG%d_ebias", N, E, k, G);
    float *logits = frand((size_t)N * E, -3, 3), *bias = xmalloc((size_t)E * 4);
    for (int e = 0; e < E; e++) bias[e] = 0.01f * (float)((int)(rng_next() % 61) - 30);
    float *d_logits = dev_copy(logits, (size_t)N * E * 4), *d_bias = dev_copy(bias, (size_t)E * 4);
    int *d_sel = rt_malloc((size_t)N * k * sizeof(int));
    float *d_prob = rt_malloc((size_t)N * k * 4), *d_scores = rt_malloc((size_t)N * E * 4);
    float *d_ssum = rt_malloc((size_t)N * 4);
    moe_route(d_sel, d_prob, d_scores, d_ssum, d_logits, N, E, k, 0, 1.0f, G, g, d_bias);
    int *sel = xmalloc((size_t)N * k * sizeof(int));
    rt_memcpy(sel, d_sel, (size_t)N * k * sizeof(int), RT_D2H);
    float *prob = down(d_prob, (size_t)N * k);
    double *rprob = xmalloc((size_t)N * k * 8), *key = xmalloc((size_t)E * 8);
    int bad = 0, moved = 0, W = E / G;
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * E;
        double gs[64];
        unsigned char ok[64];
        for (int e = 0; e < E; e++) key[e] = 1.0 / (1.0 + exp(-z[e])) + bias[e];
        for (int h = 0; h < G; h++) {        /* group score: its k/g largest keys */
            gs[h] = 0;
            for (int e = h * W; e < (h + 1) * W; e++) {
                int r = 0;
                for (int f = h * W; f < (h + 1) * W; f++)
                    r += key[f] > key[e] || (key[f] == key[e] && f < e);
                if (r < k / g) gs[h] += key[e];
            }
        }
        for (int h = 0; h < G; h++) {
            int r = 0;
            for (int q = 0; q < G; q++) r += gs[q] > gs[h] || (gs[q] == gs[h] && q < h);
            ok[h] = G == 1 || r < g;
        }
        int rsel[16];
        double ps = 0;
        for (int j = 0; j < k; j++) {
            int best = -1, plain = -1;
            for (int e = 0; e < E; e++) {
                int taken = !ok[e / W];
                for (int i = 0; i < j; i++) taken |= rsel[i] == e;
                if (!taken && (best < 0 || key[e] > key[best])) best = e;
                if (!taken && (plain < 0 || z[e] > z[plain])) plain = e;
            }
            rsel[j] = best;
            moved |= best != plain;
            ps += 1.0 / (1.0 + exp(-z[best]));
            if (sel[(size_t)n * k + j] != best) {
                if (!bad) printf("  moe_route.%s: row %d choice %d is expert %d, not %d\n", size,
                                 n, j, sel[(size_t)n * k + j], best);
                bad = 1;
            }
        }
        for (int j = 0; j < k; j++)
            rprob[(size_t)n * k + j] = (1.0 / (1.0 + exp(-z[rsel[j]]))) / (k > 1 ? ps + 1e-20 : 1);
    }
    if (bad) fail("moe_route.%s: wrong experts selected", size);
    if (!moved) fail("moe_route.%s: the bias changed no choice (the test tests nothing)", size);
    check(label("moe_route", "prob", size), prob, rprob, (size_t)N * k, -1, F32_RTOL);
    free(logits); free(bias); free(sel); free(prob); free(rprob); free(key);
    rt_free(d_logits); rt_free(d_bias); rt_free(d_sel); rt_free(d_prob); rt_free(d_scores);
    rt_free(d_ssum);
}

/* The row movements and row arithmetic of the experts: n rows of C in this pass's dtype. */
static void test_moe_rows_case(int n, int C, int k)
{
    char size[48];
    snprintf(size, sizeof size, "n%dC%dk%d", n, C, k);
    size_t nc = (size_t)n * C;
    int nsrc = 3 * n + 2, N = n, nb = 3;      /* sum_blocks reads nb blocks of n rows */
    float *src = frand_st((size_t)nsrc * C, -1, 1), *y = frand_st(nc, -1, 1);
    float *b = frand_st((size_t)C, -1, 1), *s = frand((size_t)n, -2, 2);
    int *idx = xmalloc((size_t)n * sizeof(int)), *pos = xmalloc((size_t)N * k * sizeof(int));
    for (int i = 0; i < n; i++) idx[i] = i % 5 == 4 ? -1 : (int)(rng_next() % (uint64_t)nsrc);
    for (int i = 0; i < N * k; i++) pos[i] = i % 7 == 3 ? -1 : (int)(rng_next() % (uint64_t)nsrc);
    void *d_src = dev_st(src, (size_t)nsrc * C), *d_out = dev_st_nan(nc);
    int *d_idx = dev_copy(idx, (size_t)n * sizeof(int));
    int *d_pos = dev_copy(pos, (size_t)N * k * sizeof(int));

    /* gather: copies and zero rows, exact */
    gather_rows(d_out, d_src, d_idx, n, C, dt);
    float *got = down_st(d_out, nc), *want = xmalloc(nc * 4);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            want[(size_t)i * C + c] = idx[i] < 0 ? 0.0f : src[(size_t)idx[i] * C + c];
    check_exact(label("gather_rows", "out", size), got, want, nc);
    keep(label("gather_rows", "out", size), got, nc);

    /* combine: the k chosen rows summed in f32, rounded once */
    combine_rows(d_out, d_src, d_pos, N, k, C, dt);
    float *comb = down_st(d_out, nc);
    double *rcomb = xmalloc(nc * 8);
    for (int t = 0; t < N; t++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int j = 0; j < k; j++)
                if (pos[t * k + j] >= 0) a += src[(size_t)pos[t * k + j] * C + c];
            rcomb[(size_t)t * C + c] = a;
        }
    check_st(label("combine_rows", "out", size), comb, rcomb, nc, -1, F32_RTOL);
    keep(label("combine_rows", "out", size), comb, nc);

    /* row_scale: one multiply, exact; row_dot, add_scaled_bias, scaled_bias_bwd: sums */
    float *d_s = dev_copy(s, (size_t)n * 4), *nan = fconst((size_t)n, NAN);
    void *d_y = dev_st(y, nc), *d_b = dev_st(b, (size_t)C), *d_y2 = dev_st(y, nc);
    row_scale(d_y, d_s, n, C, dt);
    float *ys = down_st(d_y, nc);
    for (size_t i = 0; i < nc; i++) want[i] = st_round(y[i] * s[i / (size_t)C]);
    check_exact(label("row_scale", "y", size), ys, want, nc);
    keep(label("row_scale", "y", size), ys, nc);
    float *d_dot = dev_copy(nan, (size_t)n * 4);
    row_dot(d_dot, d_src, d_y2, n, C, dt);
    float *dot = down(d_dot, (size_t)n);
    double *rdot = xmalloc((size_t)n * 8);
    for (int i = 0; i < n; i++) {
        rdot[i] = 0;
        for (int c = 0; c < C; c++)
            rdot[i] += (double)src[(size_t)i * C + c] * y[(size_t)i * C + c];
    }
    check(label("row_dot", "out", size), dot, rdot, (size_t)n, -1, F32_RTOL);
    keep(label("row_dot", "out", size), dot, (size_t)n);
    add_scaled_bias(d_y2, d_s, d_b, n, C, dt);
    float *yb = down_st(d_y2, nc);
    double *ryb = xmalloc(nc * 8);
    for (size_t i = 0; i < nc; i++) ryb[i] = y[i] + (double)s[i / (size_t)C] * b[i % (size_t)C];
    check_st(label("add_scaled_bias", "y", size), yb, ryb, nc, -1, F32_RTOL);
    keep(label("add_scaled_bias", "y", size), yb, nc);
    float *db0 = frand((size_t)C, -1, 1), *d_db = dev_copy(db0, (size_t)C * 4);
    scaled_bias_bwd(d_db, d_s, d_src, n, C, dt);
    float *db = down(d_db, (size_t)C);
    double *rdb = widen(db0, (size_t)C);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++) rdb[c] += (double)s[i] * src[(size_t)i * C + c];
    check(label("scaled_bias_bwd", "db", size), db, rdb, (size_t)C, -1, F32_RTOL);
    keep(label("scaled_bias_bwd", "db", size), db, (size_t)C);

    /* sum_blocks: nb blocks of n*C elements summed in block order, rounded once */
    sum_blocks(d_out, d_src, nb, nc, dt);
    float *sb = down_st(d_out, nc);
    double *rsb = xmalloc(nc * 8);
    for (size_t i = 0; i < nc; i++) {
        rsb[i] = 0;
        for (int m = 0; m < nb; m++) rsb[i] += src[(size_t)m * nc + i];
    }
    check_st(label("sum_blocks", "out", size), sb, rsb, nc, -1, F32_RTOL);
    keep(label("sum_blocks", "out", size), sb, nc);

    free(src); free(y); free(b); free(s); free(idx); free(pos); free(got); free(want);
    free(comb); free(rcomb); free(nan); free(ys); free(dot); free(rdot); free(yb); free(ryb);
    free(db0); free(db); free(rdb); free(sb); free(rsb);
    rt_free(d_src); rt_free(d_out); rt_free(d_idx); rt_free(d_pos); rt_free(d_s); rt_free(d_y);
    rt_free(d_b); rt_free(d_y2); rt_free(d_dot); rt_free(d_db);
}

static void test_moe(void)
{
    op_begin();
    test_route_case(37, 8, 2, 0);
    test_route_case(37, 8, 2, 1);
    test_route_case(300, 5, 3, 0);                  /* > one CUDA block of rows */
    test_route_sigmoid_case(37, 8, 2);
    test_route_group_case(37, 8, 2, 4, 2, 0);
    test_route_group_case(300, 16, 4, 8, 2, 1);
    test_route_sigmoid_case(300, 6, 1);
    test_route_ebias_case(300, 8, 2, 1, 1);
    test_route_ebias_case(300, 16, 4, 8, 2);        /* groups scored with the bias */
    test_route_ebias_case(37, 6, 1, 1, 1);
    test_moe_rows_case(37, 23, 2);
    test_moe_rows_case(301, 70, 3);                 /* > one combine block of columns */
    test_moe_rows_case(5, 1, 2);                    /* single values (the probabilities) */
    op_end("moe", 1);
}

/* -- Llama layer ----------------------------------------------------------------------------- */
/*
** RMSNorm, the rotary embedding and SwiGLU against the reference's Llama ops (ref_rmsnorm_*,
** ref_rope_*, ref_swiglu_*: Hugging Face's formulas in double).
*/

/* nzero: the first rows are zero (mean square 0: rstd = 1/sqrt(eps), out = 0 exactly); in a
** case of their own, since their input gradient rstd * g (316 g) sets the tensor's scale. */
static void test_rmsnorm_case(int N, int C, int nzero)
{
    char size[32];
    snprintf(size, sizeof size, "N%dC%d%s", N, C, nzero ? "_zero" : "");
    size_t nc = (size_t)N * C;
    const float eps = 1e-5f;
    float *x = frand_st(nc, -2, 2), *w = frand_st((size_t)C, 0.5f, 1.5f);
    for (size_t i = 0; i < (size_t)nzero * C && i < nc; i++) x[i] = 0.0f;
    float *dout = frand_st(nc, -1, 1), *dx0 = frand_st(nc, -1, 1), *dw0 = frand((size_t)C, -1, 1);
    float *nan = fconst((size_t)N, NAN);
    void *d_x = dev_st(x, nc), *d_w = dev_st(w, (size_t)C), *d_out = dev_st_nan(nc);
    void *d_dout = dev_st(dout, nc), *d_dx = dev_st(dx0, nc);
    float *d_rstd = dev_copy(nan, (size_t)N * 4), *d_dw = dev_copy(dw0, (size_t)C * 4);

    rmsnorm_fwd(d_out, d_rstd, d_x, d_w, N, C, eps, dt);
    float *out = down_st(d_out, nc), *rstd = down(d_rstd, (size_t)N);
    double *rx = widen(x, nc), *rw = widen(w, (size_t)C), *rout = xmalloc(nc * 8);
    double *rrstd = xmalloc((size_t)N * 8);
    ref_rmsnorm_fwd(rout, rrstd, rx, rw, N, C, (double)eps);
    check_st(label("rmsnorm_fwd", "out", size), out, rout, nc, -1, F32_RTOL);
    check(label("rmsnorm_fwd", "rstd", size), rstd, rrstd, (size_t)N, -1, F32_RTOL);
    check_finite(label("rmsnorm_fwd", "out", size), out, nc);
    float *zeros = fconst((size_t)nzero * C, 0.0f);
    check_exact(label("rmsnorm_fwd", "zero-rows", size), out, zeros, (size_t)nzero * C);
    keep(label("rmsnorm_fwd", "out", size), out, nc);
    keep(label("rmsnorm_fwd", "rstd", size), rstd, (size_t)N);

    /* backward from the kernel's own rstd; both gradients accumulate */
    rmsnorm_bwd(d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, C, dt);
    float *dx = down_st(d_dx, nc), *dw = down(d_dw, (size_t)C);
    double *rdx = widen(dx0, nc), *rdw = widen(dw0, (size_t)C), *rdout = widen(dout, nc);
    ref_rmsnorm_bwd(rdx, rdw, rdout, rx, rw, rrstd, N, C);
    check_st(label("rmsnorm_bwd", "dinp", size), dx, rdx, nc, -1, F32_RTOL);
    check(label("rmsnorm_bwd", "dw", size), dw, rdw, (size_t)C, -1, F32_RTOL);
    keep(label("rmsnorm_bwd", "dinp", size), dx, nc);
    keep(label("rmsnorm_bwd", "dw", size), dw, (size_t)C);

    free(x); free(w); free(dout); free(dx0); free(dw0); free(nan); free(out); free(rstd);
    free(rx); free(rw); free(rout); free(rrstd); free(zeros); free(dx); free(dw); free(rdx);
    free(rdw); free(rdout);
    rt_free(d_x); rt_free(d_w); rt_free(d_out); rt_free(d_dout); rt_free(d_dx); rt_free(d_rstd);
    rt_free(d_dw);
}

static void test_rmsnorm(void)
{
    op_begin();
    test_rmsnorm_case(23, 37, 0);
    test_rmsnorm_case(1, 5, 0);                     /* fewer columns than a warp's lanes */
    test_rmsnorm_case(301, 150, 0);                 /* > one column block, many rows a block */
    test_rmsnorm_case(3, 1031, 0);                  /* long rows: 32 lanes x 32 and a tail */
    test_rmsnorm_case(5, 776, 0);                   /* CUDA: 16-byte groups, 3 to 4 a lane */
    test_rmsnorm_case(7, 37, 3);                    /* zero rows */
    op_end("rmsnorm", 1);
}

/*
** The rotary embedding in place on H heads at column col0 of rows of ld elements (as the model
** rotates the q or k part of its qkv rows): the forward, then the inverse on a gradient,
** against ref_rope_fwd / ref_rope_bwd with the positions pos0 + t of rows t*B + b. The
** columns outside the heads keep their values exactly. Large positions: an angle computed in
** f32 would be off by up to ulp(1e5)/2 = 0.004 rad, hundreds of times the tolerance.
*/
static void test_rope_case(int T, int B, int H, int hd, int pos0, float theta)
{
    char size[64];
    snprintf(size, sizeof size, "T%dB%dH%dhd%d_p%d_th%g", T, B, H, hd, pos0, theta);
    int N = T * B, ld = (H + 2) * hd + 3, col0 = hd + 1;
    size_t n = (size_t)N * ld;
    int *pos = xmalloc((size_t)N * sizeof(int));
    for (int r = 0; r < N; r++) pos[r] = pos0 + r / B;
    for (int dir = 0; dir < 2; dir++) {             /* 0: forward, 1: inverse (the backward) */
        const char *op = dir ? "rope_bwd" : "rope_fwd";
        float *x = frand_st(n, -2, 2);
        void *d_x = dev_st(x, n);
        rope_fwd(st_at(d_x, (size_t)col0), (size_t)ld, T, B, H, hd, pos0, theta, dir, dt);
        float *got = down_st(d_x, n);
        double *rx = widen(x, n);
        if (dir) ref_rope_bwd(rx + col0, ld, N, pos, H, hd, (double)theta);
        else ref_rope_fwd(rx + col0, ld, N, pos, H, hd, (double)theta);
        check_st(label(op, "x", size), got, rx, n, -1, F32_RTOL);
        check_finite(label(op, "x", size), got, n);
        size_t ng = 0;                              /* the columns outside the heads */
        float *guard = xmalloc(n * 4), *guard_want = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            int c = (int)(i % (size_t)ld);
            if (c < col0 || c >= col0 + H * hd) {
                guard[ng] = got[i];
                guard_want[ng++] = x[i];
            }
        }
        check_exact(label(op, "untouched", size), guard, guard_want, ng);
        keep(label(op, "x", size), got, n);
        free(x); free(got); free(rx); free(guard); free(guard_want);
        rt_free(d_x);
    }
    free(pos);
}

static void test_rope(void)
{
    op_begin();
    test_rope_case(7, 3, 5, 8, 0, 10000.0f);
    test_rope_case(3, 1, 1, 2, 7, 10000.0f);        /* one pair */
    test_rope_case(37, 2, 3, 128, 1000, 500000.0f); /* Llama 3's head size: two angle chunks */
    test_rope_case(300, 2, 2, 70, 0, 10000.0f);     /* 35 pairs; many CUDA blocks */
    test_rope_case(5, 2, 2, 64, 100000, 500000.0f); /* large positions */
    op_end("rope", 1);
}

/*
** SwiGLU on gu rows [gate | up]: gates in [lo, hi], the first ones edges (where exp(-g)
** overflows f32, g = +-1000, 0); ups in [-2, 2]. Where g <= -200 the exact silu and gradient
** (below 200 e^-200) are 0 in f32: the kernel must give +-0 there, and nothing may be NaN.
*/
static void test_swiglu_case(int N, int F, float lo, float hi)
{
    char size[48];
    snprintf(size, sizeof size, "N%dF%d_%g_%g", N, F, lo, hi);
    size_t n = (size_t)N * F, n2 = 2 * n;
    float *gu = frand_st(n2, -2, 2), *dout = frand_st(n, -1, 1);
    const float edges[] = { lo, hi, 0.0f, -1000.0f, 1000.0f, -88.5f, -87.5f, -100.0f, -200.0f,
                            -20.0f, 20.0f, 88.5f };
    size_t ne = 0;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < F; c++) {
            float g = uniform(lo, hi);
            while (ne < sizeof edges / sizeof edges[0] && !(edges[ne] >= lo && edges[ne] <= hi))
                ne++;
            if (ne < sizeof edges / sizeof edges[0]) g = edges[ne++];
            gu[(size_t)r * 2 * F + c] = st_round(g);
        }
    double *rg = xmalloc(n * 8), *ru = xmalloc(n * 8);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < F; c++) {
            rg[(size_t)r * F + c] = gu[(size_t)r * 2 * F + c];
            ru[(size_t)r * F + c] = gu[(size_t)r * 2 * F + F + c];
        }
    void *d_gu = dev_st(gu, n2), *d_out = dev_st_nan(n), *d_dout = dev_st(dout, n);
    void *d_dgu = dev_st_nan(n2);

    swiglu_fwd(d_out, d_gu, N, F, dt);
    float *out = down_st(d_out, n);
    double *rout = xmalloc(n * 8);
    ref_swiglu_fwd(rout, rg, ru, n);
    check_st(label("swiglu_fwd", "out", size), out, rout, n, -1, F32_RTOL);
    check_finite(label("swiglu_fwd", "out", size), out, n);
    keep(label("swiglu_fwd", "out", size), out, n);

    swiglu_bwd(d_dgu, d_dout, d_gu, N, F, dt);      /* writes: the NaN it starts with goes */
    float *dgu = down_st(d_dgu, n2);
    double *rdg = xmalloc(n * 8), *rdu = xmalloc(n * 8), *rdout = widen(dout, n);
    double *rdgu = xmalloc(n2 * 8);
    ref_swiglu_bwd(rdg, rdu, rdout, rg, ru, n);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < F; c++) {
            rdgu[(size_t)r * 2 * F + c] = rdg[(size_t)r * F + c];
            rdgu[(size_t)r * 2 * F + F + c] = rdu[(size_t)r * F + c];
        }
    check_st(label("swiglu_bwd", "dgu", size), dgu, rdgu, n2, -1, F32_RTOL);
    check_finite(label("swiglu_bwd", "dgu", size), dgu, n2);
    keep(label("swiglu_bwd", "dgu", size), dgu, n2);

    for (int r = 0; r < N; r++)
        for (int c = 0; c < F; c++) {
            size_t i = (size_t)r * F + c, ig = (size_t)r * 2 * F + c;
            if (rg[i] <= -200 && (out[i] != 0.0f || dgu[ig] != 0.0f || dgu[ig + F] != 0.0f)) {
                printf("  swiglu.%s: gate %g gives out %g, dgate %g, dup %g (not 0)\n", size,
                       rg[i], out[i], dgu[ig], dgu[ig + F]);
                fail("swiglu.%s: silu of a gate <= -200 is not 0", size);
            }
        }

    free(gu); free(dout); free(rg); free(ru); free(out); free(rout); free(dgu); free(rdg);
    free(rdu); free(rdout); free(rdgu);
    rt_free(d_gu); rt_free(d_out); rt_free(d_dout); rt_free(d_dgu);
}

static void test_swiglu(void)
{
    op_begin();
    test_swiglu_case(23, 37, -8, 8);
    test_swiglu_case(301, 150, -8, 8);              /* many CUDA blocks */
    test_swiglu_case(37, 136, -8, 8);               /* CUDA: 16-byte groups (17 a row in bf16) */
    test_swiglu_case(37, 41, -1000, 1000);          /* exp overflowing both ways: no NaN */
    op_end("swiglu", 1);
}

/* -- Main ------------------------------------------------------------------------------------ */

/*
** The ops in the order they run, each pass (f32, then bf16; the untyped ops in the f32 pass
** only). draws: where in the random sequence the op's inputs start, in draws of rng_next from
** the start (seed 20240520) of its pass; a pass starts PASS_DRAWS draws after the one before.
** These are the points each op reached when they all drew from one running sequence, kept fixed
** so that an op alone (--only) gets the inputs the whole run gives it. A new op takes an
** offset past the last one's draws.
*/
#define PASS_DRAWS 3669490ull
static const struct {
    const char *op;
    void (*run)(void);
    int typed;                  /* runs in both dtypes (else in the f32 pass only) */
    unsigned long long draws;
} tests[] = {
    { "embed_pos",     test_embed,       1,       0 },
    { "layernorm",     test_layernorm,   1,  140078 },
    { "gelu",          test_gelu,        1,  279789 },
    { "bias",          test_bias,        1,  312711 },
    { "add",           test_add,         1,  405087 },
    { "attention",     test_attention,   1,  422147 },
    { "attention_cp",  test_attention_cp, 1, 1626627 },
    { "crossentropy",  test_ce,          1, 2100059 },
    { "adamw",         test_adamw,       1, 2240733 },
    { "moe",           test_moe,         1, 2373177 },
    { "rmsnorm",       test_rmsnorm,     1, 2481344 },
    { "rope",          test_rope,        1, 2631938 },
    { "swiglu",        test_swiglu,      1, 3074414 },
    { "scale_inplace", test_scale,       0, 3484362 },
    { "sumsq",         test_sumsq,       0, 3517172 },
    { "convert",       test_convert,     0, 3617213 },
    { "copy_cols",     test_copy_cols,   0, 3629598 },
    { "fill_f32",      test_fill,        0, 3644798 },
    { "add_norm",      test_add_norm,    1, 3650000 },
};

/* only: NULL (every op), or a comma-separated list of "op" or "op-f32"/"op-bf16" */
static int selected(const char *only, const char *op, int typed)
{
    if (!only) return 1;
    size_t n = strlen(op);
    for (const char *p = only; *p; ) {
        size_t len = strcspn(p, ",");
        if (len >= n && !strncmp(p, op, n) &&
            (len == n || (typed && len == n + 1 + strlen(dt_name()) && p[n] == '-' &&
                          !strncmp(p + n + 1, dt_name(), len - n - 1))))
            return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 1, "kernel test");
    const char *dump[2] = { NULL, NULL }, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump[0] = argv[++i];
        else if (!strcmp(argv[i], "--dump-bf16") && i + 1 < argc) dump[1] = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "--first")) stop_first = 1;
        else if (!prefix && argv[i][0] != '-') prefix = argv[i];
        else {
            fprintf(stderr, "usage: kernel_test PREFIX [--dump FILE.safetensors] "
                    "[--dump-bf16 FILE.safetensors] [--first] [--only OP[,OP...]] [-v]\n");
            rt_finalize();
            return 2;
        }
    }
    if (!prefix) prefix = "kernels";
    int ran = 0;
    for (int pass = 0; pass < 2; pass++) {
        dt = pass ? RT_BF16 : RT_F32;
        for (size_t k = 0; k < sizeof tests / sizeof tests[0]; k++) {
            if ((pass && !tests[k].typed) || !selected(only, tests[k].op, tests[k].typed))
                continue;
            rng_state = 20240520 + (pass * PASS_DRAWS + tests[k].draws) * 0x9e3779b97f4a7c15ull;
            cur_op = tests[k].op;
            cur_typed = tests[k].typed;
            tests[k].run();
            ran++;
        }
    }
    if (!ran) {
        fprintf(stderr, "kernel_test: --only %s names no op\n", only);
        rt_finalize();
        return 2;
    }
    for (int k = 0; k < 2; k++)
        if (dump[k] && write_dump(&dumps[k], dump[k])) {
            printf("FAIL %s/dump: cannot write %s\n", prefix, dump[k]);
            any_failed = 1;
        }
    rt_finalize();
    return any_failed;
}
