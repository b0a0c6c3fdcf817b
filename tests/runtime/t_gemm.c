/*
** t_gemm.c: compute and memory on one rank: rt_gemm against a naive double-precision loop
** (every transpose pair, odd sizes, padded leading dimensions, strided and shared batches,
** alpha/beta, f32 and bf16 inputs and outputs, zero sizes, beta = 0 over NaN, the GPT-2 124M
** shapes, rt_gemm inside rt_parallel_for), bf16 results bit for bit where the exact value is
** known, results bit-identical for 1, 2 and 3 threads and when nested (CPU), the CPU primitive
** cache, rt_parallel_for coverage, rt_malloc / rt_memcpy / rt_memset0 and rt_mem_stats; the
** fused GEMMs of rt_gemm_epi (bias, GELU, GELU gradient) where the backend has them, untouched
** outputs where not. Either backend. --no-gpt2 leaves the GPT-2 shapes out (their
** double-precision loops are most of the time); --fused (last) requires every documented
** epilogue case to be fused (the CUDA emulation).
*/
#include "t_util.h"   // defines: T_EXPECT, t_finish, t_to_dev, t_to_host, t_round_bf16, ...

/* Tolerances, against the double-precision loop over the same (bf16-exact) inputs:
**   f32 C:  |got - want| <= e = (k + 2) 2^-23 (|alpha| sum_p |a_ip b_pj| + |beta c_ij|) + 1e-6.
**           Each of the k additions of an f32 accumulation, the alpha scale and the beta term
**           rounds with relative error at most u = 2^-24, so a sum in any order is off by at
**           most about (k + 2) u times the sum of the magnitudes; 2u per step leaves room for
**           blocked and pairwise orders (bf16 dot-product instructions add products in pairs).
**           The absolute 1e-6 covers results near 0 (hardware bf16 flushes subnormals).
**   bf16 C: e, then one rounding to 8 significant bits, at most half an ulp, and an ulp is at
**           most 2^-7 |x|: |got - want| <= e + 2^-8 (|want| + e). A truncating conversion (up
**           to a whole ulp) or a second rounding breaks it for a large share of the elements;
**           test_bf16_exact checks the tie rule itself, bit for bit. */
static double tolerance(rt_dtype c, int k, double mag, double want)
{
    double e = (k + 2) * 0x1p-23 * mag + 1e-6;
    return c == RT_BF16 ? e + 0x1p-8 * (fabs(want) + e) : e;
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Uniform in [-1, 1): 16 bits for f32, 8 (so exactly a bf16) for bf16. */
static float frand(uint32_t *s, rt_dtype t)
{
    if (t == RT_BF16)
        return (float)((int)(lcg(s) & 0xff) - 128) / 128.0f;
    return (float)(lcg(s) & 0xffff) / 32768.0f - 1.0f;
}

static int esize(rt_dtype t)
{
    return t == RT_BF16 ? 2 : 4;
}

/* Buffers as stored in dtype t: element i of p set to v (which must be a bf16 value already
** for bf16: its upper half is kept) and read back. */
static void store(void *p, rt_dtype t, size_t i, float v)
{
    if (t != RT_BF16) {
        ((float *)p)[i] = v;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    if (u & 0xffff) {
        fprintf(stderr, "t_gemm: %.9g is not a bf16 value\n", v);
        exit(2);
    }
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
}

static float stored_value(const void *p, rt_dtype t, size_t i)
{
    return t == RT_BF16 ? t_bf16_value(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, batch;
    long sA, sB, sC;
    float alpha, beta;
    rt_dtype ab, c;
} gcase;

/* Element (i, j) of op(X) for batch item b (X of dtype t stored row-major at stride ld). */
static double opx(const void *X, rt_dtype t, int trans, int ld, long stride, int b, int i, int j)
{
    size_t at = (size_t)b * (size_t)stride;
    at += trans ? (size_t)j * (size_t)ld + (size_t)i : (size_t)i * (size_t)ld + (size_t)j;
    return stored_value(X, t, at);
}

/* A case's buffers on the host, as stored: A, B (dtype ab), C's initial contents (dtype c). */
typedef struct {
    void *hA, *hB, *hC0;
    size_t na, nb, nc;
} gdata;

static void data_make(gdata *d, const gcase *c, uint32_t seed)
{
    int arows = c->ta ? c->k : c->m, brows = c->tb ? c->n : c->k;
    size_t nbat = c->batch > 0 ? (size_t)c->batch : 1;
    d->na = c->sA ? (size_t)c->sA * nbat : (size_t)arows * (size_t)c->lda;
    d->nb = c->sB ? (size_t)c->sB * nbat : (size_t)brows * (size_t)c->ldb;
    d->nc = (size_t)c->sC * (nbat - 1) + (size_t)c->m * (size_t)c->ldc + 1;
    d->hA = t_alloc(d->na * 4 + 4);
    d->hB = t_alloc(d->nb * 4 + 4);
    d->hC0 = t_alloc(d->nc * 4);
    for (size_t i = 0; i < d->na; i++)
        store(d->hA, c->ab, i, frand(&seed, c->ab));
    for (size_t i = 0; i < d->nb; i++)
        store(d->hB, c->ab, i, frand(&seed, c->ab));
    for (size_t i = 0; i < d->nc; i++)
        store(d->hC0, c->c, i, c->beta == 0.0f ? NAN : frand(&seed, c->c));
}

static void data_free(gdata *d)
{
    free(d->hA);
    free(d->hB);
    free(d->hC0);
}

/* rt_gemm from inside rt_parallel_for: index b runs batch item b alone (CPU: host buffers). */
typedef struct { const gcase *c; const char *A, *B; char *C; } nest_gemm;

static void nest_gemm_body(void *ctx, int lo, int hi)
{
    const nest_gemm *g = ctx;
    const gcase *c = g->c;
    for (int b = lo; b < hi; b++)
        rt_gemm(c->ta, c->tb, c->m, c->n, c->k, c->alpha,
                g->A + (size_t)b * (size_t)c->sA * (size_t)esize(c->ab), c->lda, 0,
                g->B + (size_t)b * (size_t)c->sB * (size_t)esize(c->ab), c->ldb, 0, c->beta,
                g->C + (size_t)b * (size_t)c->sC * (size_t)esize(c->c), c->ldc, 0, 1, c->ab,
                c->c);
}

/* Run case c on device copies of d; the result (as stored) into a new host buffer. nested:
** one call per batch item, from inside rt_parallel_for on the CPU (in turn on CUDA, whose
** rt_gemm belongs to the main thread). */
static void *run_gemm(const gcase *c, const gdata *d, int nested)
{
    size_t es = (size_t)esize(c->ab), cs = (size_t)esize(c->c);
    void *dA = t_to_dev(d->hA, d->na * es), *dB = t_to_dev(d->hB, d->nb * es);
    void *dC = t_to_dev(d->hC0, d->nc * cs);
    if (!nested) {
        rt_gemm(c->ta, c->tb, c->m, c->n, c->k, c->alpha, dA, c->lda, c->sA, dB, c->ldb, c->sB,
                c->beta, dC, c->ldc, c->sC, c->batch, c->ab, c->c);
    } else {
        nest_gemm g = { c, dA, dB, dC };
        if (strcmp(rt_backend(), "cpu") == 0)
            rt_parallel_for(c->batch, nest_gemm_body, &g);
        else
            nest_gemm_body(&g, 0, c->batch);
    }
    void *hC = t_alloc(d->nc * cs);
    t_to_host(hC, dC, d->nc * cs);
    rt_free(dA);
    rt_free(dB);
    rt_free(dC);
    return hC;
}

static char *case_name(char *buf, size_t len, const gcase *c, int nested)
{
    snprintf(buf, len, "gemm %s->%s ta%d tb%d m%d n%d k%d lda%d ldb%d ldc%d batch%d sA%ld sB%ld "
             "sC%ld a%g b%g%s", rt_dtype_name(c->ab), rt_dtype_name(c->c), c->ta, c->tb, c->m,
             c->n, c->k, c->lda, c->ldb, c->ldc, c->batch, c->sA, c->sB, c->sC, c->alpha,
             c->beta, nested ? " nested" : "");
    return buf;
}

/* Check element (b, i, j) of the result against the double-precision loop; 1 if wrong. */
static int check_elem(const gcase *c, const gdata *d, const void *hC, int b, int i, int j,
                      int *bad, int nested)
{
    double s = 0, mag = 0;
    for (int p = 0; p < c->k; p++) {
        double v = opx(d->hA, c->ab, c->ta, c->lda, c->sA, b, i, p) *
                   opx(d->hB, c->ab, c->tb, c->ldb, c->sB, b, p, j);
        s += v;
        mag += fabs(v);
    }
    size_t at = (size_t)b * (size_t)c->sC + (size_t)i * (size_t)c->ldc + (size_t)j;
    double old = c->beta == 0.0f ? 0.0 : (double)c->beta * stored_value(d->hC0, c->c, at);
    double want = c->alpha * s + old;
    double tol = tolerance(c->c, c->k, fabs(c->alpha) * mag + fabs(old), want);
    double got = stored_value(hC, c->c, at);
    t_checks++;
    if (fabs(got - want) <= tol)
        return 0;
    if ((*bad)++ < 3) {
        char name[256];
        T_EXPECT(0, "%s: C[%d][%d][%d] = %.9g, want %.9g (tolerance %.3g)",
                 case_name(name, sizeof name, c, nested), b, i, j, got, want, tol);
    }
    return 1;
}

/* Run a case and check it: every element, or for large ones elements in the rows and columns
** next to the CPU's block edges and others at random (about 5e6 multiply-adds of reference in
** all); nothing outside the matrices may change. */
static void run_case(const gcase *c, uint32_t seed, int nested)
{
    gdata d;
    data_make(&d, c, seed);
    void *hC = run_gemm(c, &d, nested);
    int bad = 0;
    if ((double)c->m * c->n * c->batch * (c->k + 1) <= 5e6) {
        for (int b = 0; b < c->batch; b++)
            for (int i = 0; i < c->m; i++)
                for (int j = 0; j < c->n; j++)
                    check_elem(c, &d, hC, b, i, j, &bad, nested);
    } else {
        static const int edges[] = { 0, 1, 127, 128, 129, 255, 256, 257 };
        uint32_t s = seed;
        int samples = (int)(5e6 / (c->k + 1)), per_edge = samples / 200 + 1;
        for (int b = 0; b < c->batch; b++)
            for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
                for (int x = 0; x < per_edge; x++) {
                    if (edges[e] < c->m)
                        check_elem(c, &d, hC, b, edges[e], (int)(lcg(&s) % (uint32_t)c->n),
                                   &bad, nested);
                    if (edges[e] < c->n)
                        check_elem(c, &d, hC, b, (int)(lcg(&s) % (uint32_t)c->m), edges[e],
                                   &bad, nested);
                }
        for (int x = 0; x < samples / 2; x++)
            check_elem(c, &d, hC, (int)(lcg(&s) % (uint32_t)c->batch),
                       (int)(lcg(&s) % (uint32_t)c->m), (int)(lcg(&s) % (uint32_t)c->n), &bad,
                       nested);
        if (c->m > 0 && c->n > 0)
            check_elem(c, &d, hC, c->batch - 1, c->m - 1, c->n - 1, &bad, nested);
    }
    /* outside the matrices (row padding, between batches) nothing may change, bit for bit */
    size_t cs = (size_t)esize(c->c);
    int outside = 0;
    for (size_t at = 0; at < d.nc; at++) {
        size_t b = c->sC ? at / (size_t)c->sC : 0, rem = c->sC ? at % (size_t)c->sC : at;
        int inside = b < (size_t)c->batch && rem / (size_t)c->ldc < (size_t)c->m &&
                     rem % (size_t)c->ldc < (size_t)c->n;
        if (c->m == 0 || c->n == 0)
            inside = 0;
        if (!inside && memcmp((char *)hC + at * cs, (char *)d.hC0 + at * cs, cs) != 0 &&
            outside++ == 0) {
            char name[256];
            T_EXPECT(0, "%s: wrote outside C at %zu", case_name(name, sizeof name, c, nested),
                     at);
        }
    }
    free(hC);
    data_free(&d);
}

static void gemm_case(int ta, int tb, int m, int n, int k, int pad, int batch, int shareB,
                      float alpha, float beta, rt_dtype ab, rt_dtype cd, int nested)
{
    gcase c;
    c.ta = ta;
    c.tb = tb;
    c.m = m;
    c.n = n;
    c.k = k;
    c.lda = (ta ? m : k) + pad;
    c.ldb = (tb ? k : n) + pad;
    c.ldc = n + pad;
    if (c.lda < 1) c.lda = 1;
    if (c.ldb < 1) c.ldb = 1;
    if (c.ldc < 1) c.ldc = 1;
    c.batch = batch;
    c.sA = (long)(ta ? k : m) * c.lda + pad;
    c.sB = shareB ? 0 : (long)(tb ? n : k) * c.ldb + 3 * pad;
    c.sC = (long)m * c.ldc + pad;
    c.alpha = alpha;
    c.beta = beta;
    c.ab = ab;
    c.c = cd;
    run_case(&c, (uint32_t)(m * 131 + n * 17 + k * 7 + ta + 2 * tb + batch), nested);
}

/* -- bf16 rounding, exactly --------------------------------------------------------------- */

/* Products of small integers: every f32 sum is exact, so a bf16 C must hold the exact
** alpha * AB + beta * C rounded once to nearest even, bit for bit (257 -> 256, 259 -> 260,
** 1030 -> 1032: ties go to the even significand). Every path: OpenBLAS-size and oneDNN-size
** GEMMs, f32 and bf16 inputs, beta 0 / 1 / -2, the k = 0 and alpha = 0 scaling, and NaN in A
** making its row NaN. */
static void exact_case(int ta, int tb, int m, int n, int k, float alpha, float beta,
                       rt_dtype ab, int nan_row)
{
    gcase c = { ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 1, 0, 0, 0, alpha, beta, ab,
                RT_BF16 };
    gdata d;
    uint32_t s = (uint32_t)(m + 3 * n + 7 * k);
    d.na = (size_t)m * (size_t)k + 1;
    d.nb = (size_t)k * (size_t)n + 1;
    d.nc = (size_t)m * (size_t)n;
    d.hA = t_alloc(d.na * 4);
    d.hB = t_alloc(d.nb * 4);
    d.hC0 = t_alloc(d.nc * 4);
    for (size_t i = 0; i < d.na; i++)
        store(d.hA, ab, i, (float)((int)(lcg(&s) % 41) - 20));
    for (size_t i = 0; i < d.nb; i++)
        store(d.hB, ab, i, (float)((int)(lcg(&s) % 41) - 20));
    for (size_t i = 0; i < d.nc; i++)
        store(d.hC0, RT_BF16, i, beta == 0.0f ? NAN : (float)((int)(lcg(&s) % 513) - 256));
    if (nan_row)                /* element (0, 0) of op(A): row 0 of C becomes NaN */
        store(d.hA, ab, 0, NAN);
    uint16_t *got = run_gemm(&c, &d, 0);
    int bad = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int p = 0; p < k; p++)
                sum += opx(d.hA, ab, ta, c.lda, 0, 0, i, p) * opx(d.hB, ab, tb, c.ldb, 0, 0, p, j);
            size_t at = (size_t)i * (size_t)n + (size_t)j;
            double old = beta == 0.0f ? 0.0 : beta * stored_value(d.hC0, RT_BF16, at);
            double want = (k == 0 ? 0.0 : alpha * sum) + old;
            uint16_t g = got[at];
            int ok = isnan(want) ? (g & 0x7f80) == 0x7f80 && (g & 0x7f) != 0
                                 : g == t_bf16_bits((float)want);
            t_checks++;
            if (!ok && bad++ < 3) {
                char name[256];
                T_EXPECT(0, "%s exact: C[%d][%d] = %.9g (bits %04x), want %.9g rounded to "
                         "%.9g (bits %04x)", case_name(name, sizeof name, &c, 0), i, j,
                         t_bf16_value(g), g, want, t_round_bf16((float)want),
                         t_bf16_bits((float)want));
            }
        }
    free(got);
    data_free(&d);
}

static void test_bf16_exact(void)
{
    static const float betas[] = { 0.0f, 1.0f, -2.0f };
    for (int ai = 0; ai < 2; ai++) {
        rt_dtype ab = ai ? RT_BF16 : RT_F32;
        for (int t = 0; t < 4; t++)
            for (int bi = 0; bi < 3; bi++) {
                exact_case(t & 1, t >> 1, 8, 24, 2, 1.0f, betas[bi], ab, 0);        /* small */
                exact_case(t & 1, t >> 1, 300, 600, 16, 0.5f, betas[bi], ab, 0);    /* split */
                exact_case(t & 1, t >> 1, 40, 1000, 16, 1.0f, betas[bi], ab, 0);    /* columns */
            }
        exact_case(0, 0, 8, 24, 2, 1.0f, 1.0f, ab, 1);          /* NaN in A: its row is NaN */
        exact_case(0, 1, 300, 600, 16, 1.0f, 0.0f, ab, 1);
        exact_case(0, 0, 9, 7, 0, 1.0f, 3.0f, ab, 0);           /* k = 0: C = 3 C, rounded */
        exact_case(1, 0, 9, 7, 5, 0.0f, -3.0f, ab, 0);          /* alpha = 0 */
        exact_case(1, 0, 9, 7, 5, 0.0f, 0.0f, ab, 0);           /* ... over NaN, beta = 0 */
    }
}

/* -- Thread count, nesting, the primitive cache (CPU) ------------------------------------- */

/* -- rt_gemm_epi: the fused bias, GELU and GELU gradient -------------------------------------- */

/* GPT-2's GELU (tanh form) and its derivative, in double */
static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double dgelu_d(double x)
{
    double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) +
           0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

static int epi_fused, epi_cases;

/*
** One rt_gemm_epi call (alpha 1, beta 0, batch 1, ldc = n + pad) against the double loop:
** C = A.B + bias (BIAS); aux = A.B [+ bias], C = gelu(aux) (GELU); C = A.B * gelu'(aux) with
** aux given (DGELU). Tolerances: the sum's (tolerance() with k + 1 terms for the bias); through
** the GELU, times max |gelu'| (1.13 < 1.2), plus 8 ulps of f32 (2^-20) relative for its own f32
** evaluation (tanh, the cube); the derivative the same. A bf16 result: then one rounding.
** When the backend does not fuse (returns 0; the CPU always), C and aux must be untouched.
*/
static void epi_case(int ta, int tb, int m, int n, int k, int pad, rt_epilogue epi, int bias,
                     rt_dtype t, int must_fuse, int skew)
{
    uint32_t seed = (uint32_t)(m * 131 + n * 7 + k + epi * 1000 + ta * 2 + tb);
    int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb, nc = (size_t)m * ldc;
    size_t es = (size_t)esize(t);
    void *hA = t_alloc(na * 4), *hB = t_alloc(nb * 4), *hb = t_alloc((size_t)n * 4);
    void *hC = t_alloc(nc * 4), *hX = t_alloc(nc * 4), *hX0 = t_alloc(nc * 4);
    for (size_t i = 0; i < na; i++) store(hA, t, i, frand(&seed, t));
    for (size_t i = 0; i < nb; i++) store(hB, t, i, frand(&seed, t));
    for (int j = 0; j < n; j++) store(hb, t, (size_t)j, frand(&seed, t));
    for (size_t i = 0; i < nc; i++) {
        store(hC, t, i, NAN);
        store(hX0, t, i, epi == RT_EPI_DGELU ? 4 * frand(&seed, t) : NAN);
    }
    /* skew: A, C and aux start that many elements into their buffers (pointers less aligned
    ** than rt_malloc's 256 bytes) */
    size_t sk = (size_t)skew * es;
    void *dA = rt_malloc(na * es + sk), *dB = t_to_dev(hB, nb * es), *db = t_to_dev(hb, n * es);
    void *dC = rt_malloc(nc * es + sk), *dX = rt_malloc(nc * es + sk);
    char *pA = (char *)dA + sk, *pC = (char *)dC + sk, *pX = (char *)dX + sk;
    rt_memcpy(pA, hA, na * es, RT_H2D);
    rt_memcpy(pC, hC, nc * es, RT_H2D);
    rt_memcpy(pX, hX0, nc * es, RT_H2D);
    int done = rt_gemm_epi(ta, tb, m, n, k, pA, lda, dB, ldb, pC, ldc, epi, bias ? db : NULL,
                           epi == RT_EPI_BIAS ? NULL : pX, t);
    void *gC = t_alloc(nc * es);
    t_to_host(gC, pC, nc * es);
    t_to_host(hX, pX, nc * es);
    char name[160];
    snprintf(name, sizeof name, "gemm_epi %s %s%s ta%d tb%d m%d n%d k%d ldc%d skew%d",
             epi == RT_EPI_BIAS ? "bias" : epi == RT_EPI_GELU ? "gelu" : "dgelu",
             rt_dtype_name(t), bias ? " +bias" : "", ta, tb, m, n, k, ldc, skew);
    epi_cases++;
    epi_fused += done;
    T_EXPECT(done || !must_fuse, "%s: not fused (rt_gemm_epi returned 0)", name);
    T_EXPECT(!done || strcmp(rt_backend(), "cpu") != 0, "%s: the CPU backend fused it", name);
    int bad = 0;
    for (size_t at = 0; at < nc && !done; at++)
        if (memcmp((char *)gC + at * es, (char *)hC + at * es, es) ||
            memcmp((char *)hX + at * es, (char *)hX0 + at * es, es)) {
            T_EXPECT(0, "%s: returned 0 but wrote C or aux at %zu", name, at);
            break;
        }
    for (int i = 0; i < m && done; i++)
        for (int j = 0; j < ldc; j++) {
            size_t at = (size_t)i * ldc + j;
            double got = stored_value(gC, t, at), aux = stored_value(hX, t, at);
            t_checks++;
            if (j >= n) {       /* the padding: untouched */
                if (memcmp((char *)gC + at * es, (char *)hC + at * es, es) && bad++ < 3)
                    T_EXPECT(0, "%s: wrote C's padding at [%d][%d]", name, i, j);
                continue;
            }
            double sum = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                double v = opx(hA, t, ta, lda, 0, 0, i, p) * opx(hB, t, tb, ldb, 0, 0, p, j);
                sum += v;
                mag += fabs(v);
            }
            if (bias) {
                sum += stored_value(hb, t, (size_t)j);
                mag += fabs(stored_value(hb, t, (size_t)j));
            }
            double e = tolerance(RT_F32, k + 1, mag, sum), want, tol;
            if (epi == RT_EPI_BIAS) {
                want = sum;
                tol = tolerance(t, k + 1, mag, want);
            } else if (epi == RT_EPI_GELU) {
                double taux = tolerance(t, k + 1, mag, sum);
                if (fabs(aux - sum) > taux && bad++ < 3)
                    T_EXPECT(0, "%s: aux[%d][%d] = %.9g, want %.9g (tolerance %.3g)", name, i,
                             j, aux, sum, taux);
                want = gelu_d(sum);
                e = 1.2 * e + 0x1p-20 * fabs(want) + 1e-7;
                tol = t == RT_BF16 ? e + 0x1p-8 * (fabs(want) + e) : e;
            } else {
                double x0 = stored_value(hX0, t, at), dg = dgelu_d(x0);
                want = sum * dg;
                e = e * fabs(dg) + 0x1p-20 * fabs(sum) * (fabs(dg) + 1) + 1e-7;
                tol = t == RT_BF16 ? e + 0x1p-8 * (fabs(want) + e) : e;
                if (memcmp((char *)hX + at * es, (char *)hX0 + at * es, es) && bad++ < 3)
                    T_EXPECT(0, "%s: DGELU wrote its input aux at [%d][%d]", name, i, j);
            }
            if (fabs(got - want) > tol && bad++ < 3)
                T_EXPECT(0, "%s: C[%d][%d] = %.9g, want %.9g (tolerance %.3g)", name, i, j, got,
                         want, tol);
        }
    free(hA); free(hB); free(hb); free(hC); free(hX); free(hX0); free(gC);
    rt_free(dA); rt_free(dB); rt_free(db); rt_free(dC); rt_free(dX);
}

/* The model's three uses (matmul_fwd's bias, matmul_gelu_fwd, matmul_bwd_gelu: ta 0, tb 0 or
** 1), odd sizes with an aux leading dimension that is a multiple of 8, in both types, also from
** pointers aligned to only 2 to 8 bytes (cuBLASLt's heuristic must be told); an aux
** leading dimension that is not must not be fused. must_fuse: the backend fuses every case
** that cuBLASLt documents (the emulation; a GPU may still refuse a shape, and then runs none). */
static void test_gemm_epi(int must_fuse)
{
    rt_dtype types[2] = { RT_F32, RT_BF16 };
    for (int ti = 0; ti < 2; ti++) {
        rt_dtype t = types[ti];
        for (int tb = 0; tb < 2; tb++) {
            epi_case(0, tb, 37, 29, 45, 0, RT_EPI_BIAS, 1, t, must_fuse, 0);
            epi_case(0, tb, 37, 40, 45, 0, RT_EPI_GELU, 1, t, must_fuse, 0);
            epi_case(0, tb, 19, 43, 70, 5, RT_EPI_GELU, 0, t, must_fuse, 0);   /* ldc 48 */
            epi_case(0, tb, 37, 40, 45, 0, RT_EPI_DGELU, 0, t, must_fuse, 0);
            epi_case(0, tb, 130, 64, 150, 0, RT_EPI_DGELU, 0, t, must_fuse, 0);
            /* A, C and aux 1 or 2 elements into their buffers: aligned to 2 to 8 bytes */
            epi_case(0, tb, 37, 40, 45, 0, RT_EPI_GELU, 1, t, must_fuse, 1 + tb);
            epi_case(0, tb, 37, 29, 45, 0, RT_EPI_BIAS, 1, t, must_fuse, 2);
        }
        epi_case(0, 0, 9, 30, 12, 0, RT_EPI_GELU, 1, t, 0, 0);     /* ldc 30: never fused */
    }
    printf("rt_gemm_epi: %d of %d cases fused (%s backend)\n", epi_fused, epi_cases,
           rt_backend());
}

static void set_pool(int threads)
{
    rt__pool_shutdown();
    rt__pool_init(threads);
}

/* rt.h: the same call gives the same bits on 1, 2 or 3 threads and from inside an
** rt_parallel_for body (CPU; the parts depend on the shape alone). */
static void test_threads_identical(void)
{
    if (strcmp(rt_backend(), "cpu") != 0)
        return;
    static const int shapes[][7] = {    /* ta tb m n k batch shareB */
        { 0, 1, 256, 2304, 768, 1, 0 },     /* two row blocks (qkv forward) */
        { 1, 0, 768, 768, 256, 1, 0 },      /* six row blocks, A transposed (weight grad) */
        { 0, 0, 40, 3072, 768, 1, 0 },      /* column blocks */
        { 0, 1, 300, 17, 500, 1, 0 },       /* a short last block (OpenBLAS-size for f32) */
        { 0, 1, 256, 256, 64, 12, 1 },      /* batch items, shared B */
        /* f32 items small enough for OpenBLAS, run side by side on the pool: OpenBLAS called
        ** from two threads at once (its serial build, not made for that, gave other bits) */
        { 0, 1, 64, 64, 64, 256, 0 },
    };
    static const rt_dtype types[4][2] = { { RT_F32, RT_F32 }, { RT_BF16, RT_BF16 },
                                          { RT_F32, RT_BF16 }, { RT_BF16, RT_F32 } };
    int threads0 = rt_threads();
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ti = 0; ti < 4; ti++) {
            const int *sh = shapes[si];
            gcase c = { sh[0], sh[1], sh[2], sh[3], sh[4], sh[0] ? sh[2] : sh[4],
                        sh[1] ? sh[4] : sh[3], sh[3], sh[5], (long)sh[2] * sh[4],
                        sh[6] ? 0 : (long)sh[3] * sh[4], (long)sh[2] * sh[3], 0.5f, 0.25f,
                        types[ti][0], types[ti][1] };
            gdata d;
            data_make(&d, &c, (uint32_t)(si * 4 + (size_t)ti));
            size_t bytes = d.nc * (size_t)esize(c.c);
            void *ref = NULL;
            char name[256];
            case_name(name, sizeof name, &c, 0);
            for (int t = 1; t <= 3; t++) {
                set_pool(t);
                for (int nested = 0; nested < (c.batch > 1 ? 2 : 1); nested++) {
                    void *got = run_gemm(&c, &d, nested);
                    if (!ref) {
                        ref = got;
                        continue;
                    }
                    T_EXPECT(memcmp(got, ref, bytes) == 0, "%s: %d thread(s)%s differ from 1 "
                             "thread in the last bits", name, t, nested ? ", nested" : "");
                    free(got);
                }
            }
            free(ref);
            data_free(&d);
        }
    set_pool(threads0);
}

/* Primitives are created once per shape, kept up to RT__GEMM_CACHE_MAX, least recently used
** evicted first; results do not change when one is created again. */
static void test_cache(void)
{
    if (strcmp(rt_backend(), "cpu") != 0)
        return;
    gcase c = { 0, 1, 211, 67, 64, 64, 64, 67, 1, 0, 0, 0, 1.0f, 0.0f, RT_BF16, RT_F32 };
    gdata d;
    data_make(&d, &c, 99);
    long c0, c1, c2;
    int n0, n1;
    rt_gemm_cache_stats(&c0, &n0);
    void *first = run_gemm(&c, &d, 0);
    rt_gemm_cache_stats(&c1, &n1);
    T_EXPECT(c1 == c0 + 1, "gemm cache: a new shape created %ld primitives, want 1", c1 - c0);
    void *again = run_gemm(&c, &d, 0);
    rt_gemm_cache_stats(&c2, &n1);
    T_EXPECT(c2 == c1, "gemm cache: the same shape again created %ld primitives, want 0",
             c2 - c1);
    free(again);
    /* more distinct shapes than the cache holds: bounded, the first one evicted */
    uint16_t *a = rt_malloc(300 * 8 * 2), *b = rt_malloc(8 * 8 * 2);
    float *o = rt_malloc(300 * 8 * 4);
    for (int m = 1; m <= RT__GEMM_CACHE_MAX + 44; m++)
        rt_gemm(0, 0, m, 8, 8, 1.0f, a, 8, 0, b, 8, 0, 0.0f, o, 8, 0, 1, RT_BF16, RT_F32);
    rt_gemm_cache_stats(&c1, &n1);
    T_EXPECT(n1 <= RT__GEMM_CACHE_MAX, "gemm cache holds %d primitives, limit %d", n1,
             (int)RT__GEMM_CACHE_MAX);
    T_EXPECT(c1 - c2 == RT__GEMM_CACHE_MAX + 44, "gemm cache: %d new shapes created %ld",
             (int)RT__GEMM_CACHE_MAX + 44, c1 - c2);
    void *third = run_gemm(&c, &d, 0);
    rt_gemm_cache_stats(&c2, &n1);
    T_EXPECT(c2 == c1 + 1, "gemm cache: the least recently used shape was not evicted");
    T_EXPECT(memcmp(first, third, d.nc * 4) == 0, "gemm cache: a re-created primitive gives "
             "other bits");
    rt_free(a);
    rt_free(b);
    rt_free(o);
    free(first);
    free(third);
    data_free(&d);
}

/* -- rt_mem_stats ---------------------------------------------------------------------------- */

/* The runtime's own device bytes right after rt_init (rt.h). */
static size_t runtime_bytes(void)
{
    return strcmp(rt_backend(), "cpu") == 0 ? 0 : RT_CUDA_WORKSPACE_BYTES + RT_CUDA_STAGE_BYTES;
}

/* Exactly the requested bytes, live and peak, through growth of the runtime's table and frees
** in another order than the allocations; rt_free(NULL) changes nothing. */
static void test_mem_stats(void)
{
    size_t live0, peak0, live, peak;
    rt_mem_stats(&live0, &peak0);
    void *a = rt_malloc(1000003), *z = rt_malloc(0);
    rt_mem_stats(&live, &peak);
    T_EXPECT(live == live0 + 1000003 && peak == (peak0 > live ? peak0 : live),
             "rt_mem_stats after rt_malloc(1000003) and rt_malloc(0): live %zu peak %zu, "
             "want live %zu", live, peak, live0 + 1000003);
    rt_free(a);
    rt_free(z);
    rt_free(NULL);
    size_t top = peak;
    rt_mem_stats(&live, &peak);
    T_EXPECT(live == live0 && peak == top, "rt_mem_stats after rt_free: live %zu peak %zu, "
             "want %zu and %zu", live, peak, live0, top);
    enum { NB = 3000 };
    void **p = t_alloc(NB * sizeof *p);
    size_t sum = 0;
    for (int i = 0; i < NB; i++) {
        p[i] = rt_malloc((size_t)i * 7 + 1);
        sum += (size_t)i * 7 + 1;
    }
    rt_mem_stats(&live, &peak);
    T_EXPECT(live == live0 + sum, "rt_mem_stats with %d blocks: live %zu, want %zu", NB, live,
             live0 + sum);
    uint32_t s = 17;
    for (int i = NB - 1; i > 0; i--) {          /* free in a shuffled order */
        int j = (int)(lcg(&s) % (uint32_t)(i + 1));
        void *t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    for (int i = 0; i < NB; i++)
        rt_free(p[i]);
    size_t want_peak = live0 + sum > top ? live0 + sum : top;
    rt_mem_stats(&live, &peak);
    T_EXPECT(live == live0 && peak == want_peak, "rt_mem_stats after freeing %d blocks: live "
             "%zu peak %zu, want %zu and %zu", NB, live, peak, live0, want_peak);
    free(p);
}

/* -- rt_parallel_for ------------------------------------------------------------------------- */

typedef struct { int *hits; long sum; int calls; } pf_ctx;

static void pf_body(void *ctx, int lo, int hi)
{
    pf_ctx *p = ctx;
    for (int i = lo; i < hi; i++)
        p->hits[i]++;
    __atomic_add_fetch(&p->calls, 1, __ATOMIC_RELAXED);
}

typedef struct { float *dst; int inner; } nest_ctx;

static void nest_inner(void *ctx, int lo, int hi)
{
    nest_ctx *c = ctx;
    for (int i = lo; i < hi; i++)
        c->dst[i] += 1.0f;
}

static void nest_outer(void *ctx, int lo, int hi)
{
    nest_ctx *c = ctx;
    for (int i = lo; i < hi; i++) {
        nest_ctx in = { c->dst + (size_t)i * (size_t)c->inner, c->inner };
        rt_parallel_for(c->inner, nest_inner, &in);     /* nested: inline */
    }
}

static void test_parallel_for(void)
{
    static const int ns[] = { 0, 1, 2, 3, 5, 64, 1000, 100003 };
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        pf_ctx p = { t_alloc((size_t)(n + 1) * sizeof(int)), 0, 0 };
        for (int rep = 0; rep < 3; rep++)
            rt_parallel_for(n, pf_body, &p);
        int bad = 0;
        for (int i = 0; i < n; i++)
            bad += p.hits[i] != 3;
        T_EXPECT(bad == 0, "parallel_for n=%d: %d indices not run exactly once per call", n, bad);
        int want_calls = n == 0 ? 0 : 3 * (n < rt_threads() ? n : rt_threads());
        T_EXPECT(p.calls == want_calls, "parallel_for n=%d: %d body calls, want %d (threads %d)",
                 n, p.calls, want_calls, rt_threads());
        free(p.hits);
    }
    nest_ctx c = { t_alloc(37 * 41 * sizeof(float)), 41 };
    rt_parallel_for(37, nest_outer, &c);
    int bad = 0;
    for (int i = 0; i < 37 * 41; i++)
        bad += c.dst[i] != 1.0f;
    T_EXPECT(bad == 0, "nested parallel_for: %d elements wrong", bad);
    free(c.dst);
}

/* rt_gemm from inside rt_parallel_for bodies, one batch item per index, against the batched
** call: bit for bit (rt.h: nested calls run the same parts). */
typedef struct { int ta, tb, m, n, k; const float *A, *B; float *C; } pg_ctx;

static void pg_body(void *ctx, int lo, int hi)
{
    const pg_ctx *c = ctx;
    for (int b = lo; b < hi; b++)
        rt_gemm(c->ta, c->tb, c->m, c->n, c->k, 1.0f, c->A + (size_t)b * c->m * c->k,
                c->ta ? c->m : c->k, 0, c->B + (size_t)b * c->k * c->n, c->tb ? c->k : c->n, 0,
                0.0f, c->C + (size_t)b * c->m * c->n, c->n, 0, 1, RT_F32, RT_F32);
}

static void test_gemm_in_parallel_for(void)
{
    /* CPU only: the buffers are host memory, as a CPU kernel's would be */
    if (strcmp(rt_backend(), "cpu") != 0)
        return;
    int nb = 12, m = 64, n = 64, k = 64;
    uint32_t s = 5;
    float *A = t_alloc((size_t)nb * m * k * 4), *B = t_alloc((size_t)nb * k * n * 4);
    float *C = t_alloc((size_t)nb * m * n * 4), *R = t_alloc((size_t)nb * m * n * 4);
    for (int i = 0; i < nb * m * k; i++)
        A[i] = frand(&s, RT_F32);
    for (int i = 0; i < nb * k * n; i++)
        B[i] = frand(&s, RT_F32);
    pg_ctx c = { 0, 1, m, n, k, A, B, C };
    rt_parallel_for(nb, pg_body, &c);
    rt_gemm(0, 1, m, n, k, 1.0f, A, k, (long)m * k, B, k, (long)k * n, 0.0f, R, n, (long)m * n,
            nb, RT_F32, RT_F32);
    T_EXPECT(memcmp(C, R, (size_t)nb * m * n * 4) == 0,
             "rt_gemm inside rt_parallel_for differs from the batched call");
    free(A);
    free(B);
    free(C);
    free(R);
}

/* -- Memory ---------------------------------------------------------------------------------- */

static void test_memory(void)
{
    size_t n = 1000003;
    unsigned char *d = rt_malloc(n), *h = t_alloc(n), *h2 = t_alloc(n);
    t_to_host(h, d, n);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++)
        nz += h[i] != 0;
    T_EXPECT(nz == 0, "rt_malloc: %zu of %zu bytes not zero", nz, n);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 7 + 1);
    rt_memcpy(d, h, n, RT_H2D);
    unsigned char *d2 = rt_malloc(n);
    rt_memcpy(d2, d, n, RT_D2D);
    rt_memcpy(h2, d2, n, RT_D2H);
    T_EXPECT(memcmp(h, h2, n) == 0, "rt_memcpy H2D -> D2D -> D2H changed the bytes");
    rt_memset0(d2 + 10, 100);
    rt_memcpy(h2, d2, n, RT_D2H);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= h2[i] == (i >= 10 && i < 110 ? 0 : h[i]);
    T_EXPECT(ok, "rt_memset0 of bytes 10..109 wrong");
    unsigned char *p = rt_host_malloc(n), *q = rt_host_malloc(16);
    nz = 0;
    for (size_t i = 0; i < n; i++)
        nz += p[i] != 0;
    T_EXPECT(nz == 0, "rt_host_malloc: %zu bytes not zero", nz);
    rt_memcpy(p, h, n, RT_H2H);
    T_EXPECT(memcmp(p, h, n) == 0, "rt_memcpy H2H wrong");
    rt_host_free(p);
    rt_host_free(q);
    rt_free(d);
    rt_free(d2);
    rt_free(NULL);
    free(h);
    free(h2);
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 1, "tp1 pp1 dp1");
    size_t live0, peak0;
    rt_mem_stats(&live0, &peak0);
    T_EXPECT(live0 == runtime_bytes() && peak0 == live0, "rt_mem_stats after rt_init: live %zu "
             "peak %zu, want %zu (the runtime's own workspaces)", live0, peak0, runtime_bytes());
    static const rt_dtype types[4][2] = { { RT_F32, RT_F32 }, { RT_BF16, RT_F32 },
                                          { RT_F32, RT_BF16 }, { RT_BF16, RT_BF16 } };
    static const int dims[][3] = {
        { 1, 1, 1 }, { 3, 5, 7 }, { 17, 33, 9 }, { 64, 64, 64 }, { 129, 67, 250 },
        { 5, 200, 3 }, { 2, 3, 1 },
    };
    for (int ti = 0; ti < 4; ti++) {
        rt_dtype ab = types[ti][0], cd = types[ti][1];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
                    const int *s = dims[d];
                    gemm_case(ta, tb, s[0], s[1], s[2], 0, 1, 0, 1.0f, 0.0f, ab, cd, 0);
                    gemm_case(ta, tb, s[0], s[1], s[2], 3, 3, 0, 0.5f, -0.25f, ab, cd, 0);
                    gemm_case(ta, tb, s[0], s[1], s[2], 1, 2, 1, -1.5f, 1.0f, ab, cd, 0);
                }
                /* zero sizes; k = 0 scales C by beta; alpha = 0 too; beta = 0 over NaN */
                gemm_case(ta, tb, 0, 5, 3, 1, 2, 0, 1.0f, 0.5f, ab, cd, 0);
                gemm_case(ta, tb, 4, 0, 3, 1, 2, 0, 1.0f, 0.5f, ab, cd, 0);
                gemm_case(ta, tb, 4, 5, 0, 1, 2, 0, 1.0f, 0.5f, ab, cd, 0);
                gemm_case(ta, tb, 4, 5, 0, 1, 2, 0, 1.0f, 0.0f, ab, cd, 0);
                gemm_case(ta, tb, 4, 5, 6, 1, 2, 0, 0.0f, 2.0f, ab, cd, 0);
                gemm_case(ta, tb, 4, 5, 6, 1, 2, 0, 0.0f, 0.0f, ab, cd, 0);
                gemm_case(ta, tb, 4, 5, 6, 1, 0, 0, 1.0f, 2.0f, ab, cd, 0);
                /* the threaded path: row blocks (with a short last one), column blocks,
                ** padded and strided, shared B, and per-item nesting */
                gemm_case(ta, tb, 300, 17, 500, 2, 2, 1, 1.0f, 0.5f, ab, cd, 0);
                gemm_case(ta, tb, 40, 1100, 200, 3, 1, 0, -0.5f, 1.0f, ab, cd, 0);
                gemm_case(ta, tb, 96, 256, 768, 2, 1, 0, 1.0f, 1.0f, ab, cd, 0);
                gemm_case(ta, tb, 64, 64, 64, 0, 12, 0, 1.0f, 0.0f, ab, cd, 1);
                gemm_case(ta, tb, 130, 140, 150, 5, 3, 1, 2.0f, -1.0f, ab, cd, 1);
            }
    }
    /* GPT-2 124M at B*T = 256 tokens, C = 768, vocabulary padded to 50304; the weight stored
    ** (out, in): forward Y = X W^T, input grad dX = dY W, weight grad dW += dY^T X. f32, and
    ** bf16 inputs with bf16 activations and f32 weight grads. */
    static const int gpt2[][2] = { { 2304, 768 }, { 3072, 768 }, { 768, 3072 }, { 50304, 768 } };
    int gpt2_shapes = !(argc > 1 && !strcmp(argv[1], "--no-gpt2"));
    for (int ai = 0; ai < 2 * gpt2_shapes; ai++)
        for (size_t g = 0; g < sizeof gpt2 / sizeof gpt2[0]; g++) {
            rt_dtype ab = ai ? RT_BF16 : RT_F32, act = ab;
            int out = gpt2[g][0], in = gpt2[g][1];
            gemm_case(0, 1, 256, out, in, 0, 1, 0, 1.0f, 0.0f, ab, act, 0);
            gemm_case(0, 0, 256, in, out, 0, 1, 0, 1.0f, 0.0f, ab, act, 0);
            gemm_case(1, 0, out, in, 256, 0, 1, 0, 1.0f, 1.0f, ab, RT_F32, 0);
        }
    test_bf16_exact();
    test_gemm_epi(argc > 1 && !strcmp(argv[argc - 1], "--fused"));
    test_threads_identical();
    test_cache();
    test_parallel_for();
    test_gemm_in_parallel_for();
    test_memory();
    test_mem_stats();
    size_t live, peak;
    rt_mem_stats(&live, &peak);
    T_EXPECT(live == live0, "rt_mem_stats at the end: live %zu, want %zu (a block not freed)",
             live, live0);
    int bad = t_finish("compute");
    rt_finalize();
    return bad;
}
