/*
** kernel_test.c: every kernel of the library (lib/kernels.h) against the double-precision
** reference's single ops (build/ref/libref.a) on random inputs, at sizes that are multiples of
** nothing, forward and backward. One source, two programs: linked with kernels_cpu.c +
** librt_cpu.a or with kernels_cuda.cu + librt_cuda.a (data moves with rt_memcpy, as in the
** library). Run by tests/kernels/suite.sh; not a benchmark.
**
**   kernel_test PREFIX [--dump FILE.safetensors] [-v]
**
** Prints "PASS PREFIX/<op>" or "FAIL PREFIX/<op>: why" per op, the first mismatches and the
** max errors of a failing check, and with -v the max errors of every check. --dump writes
** every kernel output (F32) so that runs can be compared: thread counts, CPU against CUDA.
**
** Tolerances (|got - ref| <= atol + rtol*|ref|, stated per check below):
**   exact    copies, one add, one multiply: the kernel does one f32 operation per element, so
**            the result must equal that operation done here in f32, bit for bit.
**   F32_RTOL 1e-5 with atol = 1e-5 * max|ref| of the tensor: the inputs are f32 values, which
**            the reference widens exactly, so every difference is f32 rounding inside the
**            kernel. Its outputs are sums of at most ~300 products (u = 6e-8; typical error
**            sqrt(K)*u*scale ~ 1e-6, observed <= 1.5e-6 of the scale), while any logic error
**            (a wrong index, a missing term, the wrong mask) is O(1) of the scale.
**   1e-6     sumsq: accumulated in double, rounded once to f32 (one ulp is 6e-8).
*/
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"    // defines: the kernel prototypes (embed_fwd, ..., scale_inplace)
#include "rt.h"         // defines: rt_malloc, rt_memcpy, rt_init, RT_CHECK
#include "gpt2_ref.h"   // defines: ref_embed_fwd, ref_layernorm_bwd, ..., ref_adamw_update

#define F32_RTOL 1e-5
#define SHOW     5      /* mismatches printed per failing check */

/* -- Results of the current op ------------------------------------------------------------- */

static const char *prefix;      /* "kernels/cpu-t2" */
static int verbose;
static int op_failed;           /* the current op has a failing check */
static char op_why[200];        /* its first failure, for the FAIL line */
static int any_failed;

static void op_begin(void)
{
    op_failed = 0;
    op_why[0] = 0;
}

static void op_end(const char *op)
{
    if (op_failed) printf("FAIL %s/%s: %s\n", prefix, op, op_why);
    else printf("PASS %s/%s\n", prefix, op);
    fflush(stdout);
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
}

/*
** Compare got[n] (f32) with want[n] (double): mismatches are |got - want| > atol + rtol*|want|
** (atol = rtol * max|want| when atol < 0). NaN never matches. On failure prints the first
** SHOW mismatches and the max errors; -v prints the max errors always.
*/
static void check(const char *what, const float *got, const double *want, size_t n, double atol,
                  double rtol)
{
    double scale = 0, max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    if (atol < 0) atol = rtol * scale;
    long long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double r = want[i] != 0 ? d / fabs(want[i]) : d;
        if (!(d <= max_abs)) max_abs = d;
        if (!(r <= max_rel)) max_rel = r;
        if (!(d <= atol + rtol * fabs(want[i]))) {
            if (bad < SHOW) {
                if (bad == 0) printf("  %s: first mismatches (got vs reference)\n", what);
                printf("    [%zu] %.9g vs %.9g  (abs %.3g)\n", i, got[i], want[i], d);
            }
            bad++;
        }
    }
    if (bad || verbose)
        printf("  %s: n %zu, max abs %.3g (atol %.3g), max rel %.3g, scale %.3g%s\n", what, n,
               max_abs, atol, max_rel, scale, bad ? "  MISMATCH" : "");
    if (bad) fail("%s: %lld of %zu values out of tolerance (max abs %.3g)", what, bad, n, max_abs);
}

/* Bit-for-bit equality with an f32 computation done here. */
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

/* -- Outputs kept for --dump ----------------------------------------------------------------- */

typedef struct { char name[160]; float *v; size_t n; } dumped;
static dumped *dumps;
static int ndumps, dumps_cap;

static void keep(const char *name, const float *v, size_t n)
{
    if (ndumps == dumps_cap) {
        dumps_cap = dumps_cap ? 2 * dumps_cap : 64;
        dumps = realloc(dumps, sizeof(dumped) * (size_t)dumps_cap);
        if (!dumps) { fprintf(stderr, "kernel_test: out of memory\n"); exit(2); }
    }
    dumped *d = &dumps[ndumps++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->v = malloc((n ? n : 1) * sizeof(float));
    if (!d->v) { fprintf(stderr, "kernel_test: out of memory\n"); exit(2); }
    memcpy(d->v, v, n * sizeof(float));
    d->n = n;
}

/* A safetensors file of 1-D F32 tensors, in the order kept (header padded to 8 bytes). */
static int write_dump(const char *path)
{
    size_t cap = 64 + (size_t)ndumps * 256, len = 0, off = 0;
    char *h = malloc(cap);
    if (!h) return -1;
    len += (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < ndumps; i++) {
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu],"
                                "\"data_offsets\":[%zu,%zu]}", i ? "," : "", dumps[i].name,
                                dumps[i].n, off, off + 4 * dumps[i].n);
        off += 4 * dumps[i].n;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) { free(h); return -1; }
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int ok = fwrite(l8, 8, 1, f) == 1 && fwrite(h, 1, len, f) == len;
    for (int i = 0; i < ndumps && ok; i++)            /* little-endian hosts only (x86, arm) */
        ok = fwrite(dumps[i].v, sizeof(float), dumps[i].n, f) == dumps[i].n;
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

static float *frand(size_t n, float lo, float hi)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
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

static float *down(const float *dev, size_t n)   /* a new host copy of a device buffer */
{
    float *h = xmalloc(n * sizeof(float));
    if (n) rt_memcpy(h, dev, n * sizeof(float), RT_D2H);
    return h;
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
    float *wte = frand((size_t)V * C, -1, 1), *wpe = frand((size_t)Tw * C, -1, 1);
    float *dout = frand((size_t)N * C, -1, 1);
    /* dwte gets V rows: those past vrows are a guard that must stay untouched */
    float *dwte0 = frand((size_t)V * C, -1, 1), *dwpe0 = frand((size_t)Tw * C, -1, 1);

    int *d_tok = dev_copy(tok, (size_t)N * sizeof(int));
    float *d_wte = dev_copy(wte + (size_t)vstart * C, (size_t)vrows * C * sizeof(float));
    float *d_wpe = dev_copy(wpe, (size_t)Tw * C * sizeof(float));
    float *nan = fconst((size_t)N * C, NAN);
    float *d_out = dev_copy(nan, (size_t)N * C * sizeof(float));
    float *d_dout = dev_copy(dout, (size_t)N * C * sizeof(float));
    float *d_dwte = dev_copy(dwte0, (size_t)V * C * sizeof(float));
    float *d_dwpe = dev_copy(dwpe0, (size_t)Tw * C * sizeof(float));

    /* embed_fwd overwrites with a copy (or zeros): exact */
    embed_fwd(d_out, d_tok, d_wte, N, C, vstart, vrows);
    float *got = down(d_out, (size_t)N * C), *want = xmalloc((size_t)N * C * sizeof(float));
    for (int n = 0; n < N; n++) {
        int v = tok[n] - vstart, own = v >= 0 && v < vrows;
        for (int c = 0; c < C; c++) want[(size_t)n * C + c] = own ? wte[(size_t)tok[n] * C + c] : 0;
    }
    check_exact(label("embed_fwd", "out", size), got, want, (size_t)N * C);
    keep(label("embed_fwd", "out", size), got, (size_t)N * C);

    /* pos_fwd adds wpe[t0 + t]: one f32 add, exact */
    pos_fwd(d_out, d_wpe, T, B, C, t0);
    float *got2 = down(d_out, (size_t)N * C);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++) {
                size_t i = ((size_t)t * B + b) * C + c;
                want[i] = want[i] + wpe[(size_t)(t0 + t) * C + c];
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
        check(label("embed+pos", "ref", size), got2, rs, (size_t)N * C, 0, 1e-7);
        free(tok_bm); free(rwte); free(rwpe); free(rout); free(rs);
    }

    /* backward: dwte rows of owned tokens += dout rows (token order), dwpe[t0 + t] += sum_b */
    embed_bwd(d_dwte, d_dout, d_tok, N, C, vstart, vrows);
    pos_bwd(d_dwpe, d_dout, T, B, C, t0);
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

    free(tok); free(wte); free(wpe); free(dout); free(dwte0); free(dwpe0); free(nan);
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
    op_end("embed_pos");
}

/* -- LayerNorm ------------------------------------------------------------------------------- */

static void test_layernorm_case(int N, int C)
{
    char size[32];
    snprintf(size, sizeof size, "N%dC%d", N, C);
    size_t nc = (size_t)N * C;
    float *x = frand(nc, -1, 1), *w = frand((size_t)C, 0.5f, 1.5f), *b = frand((size_t)C, -1, 1);
    for (size_t i = 0; i < nc; i++) x[i] += 3.0f;           /* a mean far from 0 */
    float *dout = frand(nc, -1, 1), *dx0 = frand(nc, -1, 1);
    float *dw0 = frand((size_t)C, -1, 1), *db0 = frand((size_t)C, -1, 1);
    float *nan = fconst(nc, NAN);
    float *d_x = dev_copy(x, nc * 4), *d_w = dev_copy(w, (size_t)C * 4);
    float *d_b = dev_copy(b, (size_t)C * 4);
    float *d_out = dev_copy(nan, nc * 4), *d_mean = dev_copy(nan, (size_t)N * 4);
    float *d_rstd = dev_copy(nan, (size_t)N * 4), *d_dout = dev_copy(dout, nc * 4);
    float *d_dx = dev_copy(dx0, nc * 4), *d_dw = dev_copy(dw0, (size_t)C * 4);
    float *d_db = dev_copy(db0, (size_t)C * 4);

    layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f);
    float *out = down(d_out, nc), *mean = down(d_mean, (size_t)N), *rstd = down(d_rstd, (size_t)N);
    double *rx = widen(x, nc), *rw = widen(w, (size_t)C), *rb = widen(b, (size_t)C);
    double *rout = xmalloc(nc * 8), *rmean = xmalloc((size_t)N * 8);
    double *rrstd = xmalloc((size_t)N * 8);
    ref_layernorm_fwd(rout, rmean, rrstd, rx, rw, rb, N, C, 1e-5);
    check(label("layernorm_fwd", "out", size), out, rout, nc, -1, F32_RTOL);
    check(label("layernorm_fwd", "mean", size), mean, rmean, (size_t)N, -1, F32_RTOL);
    check(label("layernorm_fwd", "rstd", size), rstd, rrstd, (size_t)N, -1, F32_RTOL);
    keep(label("layernorm_fwd", "out", size), out, nc);
    keep(label("layernorm_fwd", "mean", size), mean, (size_t)N);
    keep(label("layernorm_fwd", "rstd", size), rstd, (size_t)N);

    /* backward from the kernel's own mean/rstd; every gradient accumulates */
    layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
    float *dx = down(d_dx, nc), *dw = down(d_dw, (size_t)C), *db = down(d_db, (size_t)C);
    double *rdx = widen(dx0, nc), *rdw = widen(dw0, (size_t)C), *rdb = widen(db0, (size_t)C);
    double *rdout = widen(dout, nc);
    ref_layernorm_bwd(rdx, rdw, rdb, rdout, rx, rw, rmean, rrstd, N, C);
    check(label("layernorm_bwd", "dinp", size), dx, rdx, nc, -1, F32_RTOL);
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
    test_layernorm_case(23, 37);
    test_layernorm_case(1, 5);
    test_layernorm_case(301, 150);
    op_end("layernorm");
}

/* -- GELU, bias, add, scale ------------------------------------------------------------------ */

static void test_gelu_case(size_t n)
{
    char size[32];
    snprintf(size, sizeof size, "n%zu", n);
    float *x = frand(n, -6, 6), *dout = frand(n, -1, 1), *nan = fconst(n, NAN);
    float *d_x = dev_copy(x, n * 4), *d_out = dev_copy(nan, n * 4), *d_dout = dev_copy(dout, n * 4);
    float *d_dx = dev_copy(nan, n * 4);
    gelu_fwd(d_out, d_x, n);
    gelu_bwd(d_dx, d_x, d_dout, n);                 /* overwrites */
    float *out = down(d_out, n), *dx = down(d_dx, n);
    double *rx = widen(x, n), *rdout = widen(dout, n);
    double *rout = xmalloc(n * 8), *rdx = xmalloc(n * 8);
    ref_gelu_fwd(rout, rx, n);
    ref_gelu_bwd(rdx, rdout, rx, n);                /* adds into zeros */
    check(label("gelu_fwd", "out", size), out, rout, n, -1, F32_RTOL);
    check(label("gelu_bwd", "dinp", size), dx, rdx, n, -1, F32_RTOL);
    keep(label("gelu_fwd", "out", size), out, n);
    keep(label("gelu_bwd", "dinp", size), dx, n);
    /* in place, as the model calls it: gelu_bwd(d, inp, d) */
    gelu_bwd(d_dout, d_x, d_dout, n);
    float *dx2 = down(d_dout, n);
    check_exact(label("gelu_bwd", "in-place", size), dx2, dx, n);
    free(x); free(dout); free(nan); free(out); free(dx); free(rx); free(rdout); free(rout);
    free(rdx); free(dx2);
    rt_free(d_x); rt_free(d_out); rt_free(d_dout); rt_free(d_dx);
}

static void test_gelu(void)
{
    op_begin();
    test_gelu_case(37);
    test_gelu_case(3 * 4096 + 37);                  /* several CPU blocks and CUDA blocks */
    op_end("gelu");
}

static void test_bias_case(int N, int OC)
{
    char size[32];
    snprintf(size, sizeof size, "N%dOC%d", N, OC);
    size_t n = (size_t)N * OC;
    float *out0 = frand(n, -1, 1), *bias = frand((size_t)OC, -1, 1), *dout = frand(n, -1, 1);
    float *db0 = frand((size_t)OC, -1, 1);
    float *d_out = dev_copy(out0, n * 4), *d_bias = dev_copy(bias, (size_t)OC * 4);
    float *d_dout = dev_copy(dout, n * 4), *d_db = dev_copy(db0, (size_t)OC * 4);
    bias_fwd(d_out, d_bias, N, OC);
    bias_bwd(d_db, d_dout, N, OC);
    float *out = down(d_out, n), *db = down(d_db, (size_t)OC), *want = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) want[i] = out0[i] + bias[i % (size_t)OC];
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
    op_end("bias");
}

static void test_add(void)
{
    op_begin();
    size_t sizes[2] = { 37, 2 * 4096 + 301 };
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        char size[32];
        snprintf(size, sizeof size, "n%zu", n);
        float *a = frand(n, -1, 1), *b = frand(n, -1, 1), *nan = fconst(n, NAN);
        float *want = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
        float *d_a = dev_copy(a, n * 4), *d_b = dev_copy(b, n * 4), *d_out = dev_copy(nan, n * 4);
        add_fwd(d_out, d_a, d_b, n);
        add_inplace(d_a, d_b, n);
        float *out = down(d_out, n), *inpl = down(d_a, n);
        check_exact(label("add_fwd", "out", size), out, want, n);
        check_exact(label("add_inplace", "y", size), inpl, want, n);
        keep(label("add_fwd", "out", size), out, n);
        free(a); free(b); free(nan); free(want); free(out); free(inpl);
        rt_free(d_a); rt_free(d_b); rt_free(d_out);
    }
    op_end("add");
}

static void test_scale(void)
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
    op_end("scale_inplace");
}

/* -- Attention ------------------------------------------------------------------------------- */

static void test_attention_case(int B, int T, int H, int hd)
{
    char size[48];
    snprintf(size, sizeof size, "B%dT%dH%dhd%d", B, T, H, hd);
    int C = H * hd, N = T * B;
    size_t nq = (size_t)N * 3 * C, ny = (size_t)N * C, na = (size_t)B * H * T * T;
    float scale = 1.0f / sqrtf((float)hd);
    float *qkv = frand(nq, -1.5f, 1.5f), *dout = frand(ny, -1, 1);
    float *nanq = fconst(nq, NAN);
    float *nana = fconst(na, NAN);
    float *d_qkv = dev_copy(qkv, nq * 4), *d_out = dev_copy(nanq, ny * 4);
    float *d_att = dev_copy(nana, na * 4), *d_datt = dev_copy(nana, na * 4);
    float *d_dout = dev_copy(dout, ny * 4), *d_dqkv = dev_copy(nanq, nq * 4);

    attention_fwd(d_out, d_att, d_qkv, B, T, H, hd, scale);
    float *out = down(d_out, ny), *att = down(d_att, na);
    double *rqkv = widen(qkv, nq), *rqkv_bm = to_batch_major(rqkv, T, B, 3 * C);
    double *rout = xmalloc(ny * 8), *ratt = xmalloc(na * 8);
    ref_attention_fwd(rout, ratt, rqkv_bm, B, T, C, H);
    double *rout_sm = to_seq_major(rout, T, B, C);
    check(label("attention_fwd", "out", size), out, rout_sm, ny, -1, F32_RTOL);
    check(label("attention_fwd", "att", size), att, ratt, na, -1, F32_RTOL);
    keep(label("attention_fwd", "out", size), out, ny);
    keep(label("attention_fwd", "att", size), att, na);

    attention_bwd(d_dqkv, d_datt, d_dout, d_att, d_qkv, B, T, H, hd, scale);
    float *dqkv = down(d_dqkv, nq);
    double *rdout = widen(dout, ny), *rdout_bm = to_batch_major(rdout, T, B, C);
    double *rdqkv = xmalloc(nq * 8);
    ref_attention_bwd(rdqkv, rdout_bm, rqkv_bm, ratt, B, T, C, H);
    double *rdqkv_sm = to_seq_major(rdqkv, T, B, 3 * C);
    check(label("attention_bwd", "dqkv", size), dqkv, rdqkv_sm, nq, -1, F32_RTOL);
    keep(label("attention_bwd", "dqkv", size), dqkv, nq);

    free(qkv); free(dout); free(nanq); free(nana); free(out); free(att); free(rqkv); free(rqkv_bm);
    free(rout); free(ratt); free(rout_sm); free(dqkv); free(rdout); free(rdout_bm); free(rdqkv);
    free(rdqkv_sm);
    rt_free(d_qkv); rt_free(d_out); rt_free(d_att); rt_free(d_datt); rt_free(d_dout);
    rt_free(d_dqkv);
}

static void test_attention(void)
{
    op_begin();
    test_attention_case(3, 7, 5, 3);
    test_attention_case(1, 1, 1, 1);
    test_attention_case(2, 33, 3, 8);
    test_attention_case(1, 70, 4, 5);           /* 280 softmax rows: > one CUDA block */
    op_end("attention");
}

/* -- Cross-entropy, vocabulary-parallel -------------------------------------------------------- */

/*
** N rows, vocabulary V padded to TP * Vl columns and split over TP simulated ranks the way the
** model does it (model.c head_fwd_bwd): ce_rowmax per rank, max over ranks, ce_sums per rank
** with the global max, sums over ranks, ce_loss, ce_bwd per rank. Padding columns hold
** garbage that must not matter; a rank may own no valid column; targets are spread over all
** ranks (so most are outside any one rank's range).
*/
static void test_ce_case(int N, int V, int TP, int Vl, float dloss)
{
    char size[48];
    snprintf(size, sizeof size, "N%dV%dtp%dVl%d", N, V, TP, Vl);
    int *tgt = xmalloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) tgt[n] = (int)(rng_next() % (uint64_t)V);
    tgt[0] = V - 1;                                 /* the last valid column */
    float *logits = frand((size_t)N * V, -4, 4);
    int *d_tgt = dev_copy(tgt, (size_t)N * sizeof(int));
    float *gmx = fconst((size_t)N, -INFINITY), *gsums = fconst(2 * (size_t)N, 0);
    float *d_logit[16], *d_ce[16];
    float *nan = fconst(4 * (size_t)N, NAN);
    for (int r = 0; r < TP; r++) {
        int vstart = r * Vl, valid = V - vstart < 0 ? 0 : V - vstart > Vl ? Vl : V - vstart;
        float *part = frand((size_t)N * Vl, 50, 60);   /* padding: large, would dominate */
        for (int n = 0; n < N; n++)
            for (int j = 0; j < valid; j++)
                part[(size_t)n * Vl + j] = logits[(size_t)n * V + vstart + j];
        d_logit[r] = dev_copy(part, (size_t)N * Vl * 4);
        d_ce[r] = dev_copy(nan, 4 * (size_t)N * 4);
        ce_rowmax(d_ce[r], d_logit[r], N, Vl, valid);
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
        ce_sums(d_ce[r] + N, d_logit[r], d_gmx, d_tgt, N, Vl, valid, vstart);
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
    keep(label("ce_loss", "loss", size), loss, (size_t)N);
    keep(label("sum_rows", "sum", size), lsum, 1);

    /* backward, in place over each rank's logits; padding columns become 0 */
    double *rdl = xmalloc((size_t)N * V * 8);
    ref_xent_bwd(rdl, rprobs, tgt, N, V, dloss);
    for (int r = 0; r < TP; r++) {
        int vstart = r * Vl, valid = V - vstart < 0 ? 0 : V - vstart > Vl ? Vl : V - vstart;
        ce_bwd(d_logit[r], d_gmx, d_gsums, d_tgt, N, Vl, valid, vstart, dloss);
        float *dl = down(d_logit[r], (size_t)N * Vl);
        double *want = xmalloc((size_t)N * Vl * 8);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < valid; j++)
                want[(size_t)n * Vl + j] = rdl[(size_t)n * V + vstart + j];
        char what[64];
        snprintf(what, sizeof what, "dlogits-rank%d", r);
        check(label("ce_bwd", what, size), dl, want, (size_t)N * Vl, -1, F32_RTOL);
        keep(label("ce_bwd", what, size), dl, (size_t)N * Vl);
        free(dl); free(want);
        rt_free(d_logit[r]); rt_free(d_ce[r]);
    }
    free(tgt); free(logits); free(gmx); free(gsums); free(nan); free(rmx); free(rsum); free(rtl);
    free(loss); free(lsum); free(rlogits); free(rprobs); free(rloss); free(rdl);
    rt_free(d_tgt); rt_free(d_gmx); rt_free(d_gsums); rt_free(d_loss); rt_free(d_lsum);
}

static void test_ce(void)
{
    op_begin();
    test_ce_case(23, 37, 1, 48, 1.0f / 23);         /* one rank, 11 padding columns */
    test_ce_case(23, 37, 4, 16, 0.125f);            /* 16 | 16 | 5 valid + 11 pad | 0 valid */
    test_ce_case(301, 200, 3, 67, 1.0f / 600);      /* > one CUDA block of rows */
    op_end("crossentropy");
}

/* -- AdamW, sum of squares ------------------------------------------------------------------- */

static void test_adamw_case(size_t n, float wd)
{
    char size[32];
    snprintf(size, sizeof size, "n%zu_wd%g", n, wd);
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float *p = frand(n, -1, 1), *m = fconst(n, 0), *v = fconst(n, 0);
    float *d_p = dev_copy(p, n * 4), *d_m = dev_copy(m, n * 4), *d_v = dev_copy(v, n * 4);
    double *rp = widen(p, n), *rm = xmalloc(n * 8), *rv = xmalloc(n * 8), *rg = xmalloc(n * 8);
    for (int t = 1; t <= 3; t++) {
        float *g = frand(n, -0.5f, 0.5f), gscale = t == 2 ? 0.7f : 1.0f;
        for (size_t i = 0; i < n; i += 7) g[i] = 0;              /* zero gradients too */
        for (size_t i = 3; i < n; i += 11) g[i] *= 1e-6f;        /* and tiny ones */
        float *d_g = dev_copy(g, n * 4);
        float bc1 = (float)(1.0 - pow((double)beta1, t));     /* as the stage computes them */
        float bc2 = (float)(1.0 - pow((double)beta2, t));
        adamw_step(d_p, d_g, d_m, d_v, n, lr, beta1, beta2, eps, wd, bc1, bc2, gscale);
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
    free(p); free(m); free(v); free(rp); free(rm); free(rv); free(rg); free(gp); free(gm); free(gv);
    rt_free(d_p); rt_free(d_m); rt_free(d_v);
}

static void test_adamw(void)
{
    op_begin();
    test_adamw_case(5, 0.1f);
    test_adamw_case(2 * 16384 + 37, 0.1f);          /* several CPU tasks, many CUDA blocks */
    test_adamw_case(301, 0.0f);                     /* no decay (biases, LayerNorm) */
    op_end("adamw");
}

static void test_sumsq(void)
{
    op_begin();
    size_t sizes[3] = { 1, 37, 100003 };
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        char size[32];
        snprintf(size, sizeof size, "n%zu", n);
        float *x = frand(n, -2, 2), *nan = fconst(1, NAN);
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
    op_end("sumsq");
}

/* -- Main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 1, "kernel test");
    const char *dump = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!prefix && argv[i][0] != '-') prefix = argv[i];
        else {
            fprintf(stderr, "usage: kernel_test PREFIX [--dump FILE.safetensors] [-v]\n");
            rt_finalize();
            return 2;
        }
    }
    if (!prefix) prefix = "kernels";
    rng_state = 20240520;
    test_embed();
    test_layernorm();
    test_gelu();
    test_bias();
    test_add();
    test_scale();
    test_attention();
    test_ce();
    test_adamw();
    test_sumsq();
    if (dump && write_dump(dump)) {
        printf("FAIL %s/dump: cannot write %s\n", prefix, dump);
        any_failed = 1;
    }
    rt_finalize();
    return any_failed;
}
