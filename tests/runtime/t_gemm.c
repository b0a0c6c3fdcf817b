/*
** t_gemm.c: compute and memory on one rank: rt_gemm against a naive double-precision triple
** loop (all transpose combinations, odd sizes, padded leading dimensions, strided and shared
** batches, alpha/beta, f32 and bf16 inputs, zero sizes, beta = 0 over NaN, GPT-2 shapes that
** take the threaded path, and rt_gemm called inside rt_parallel_for), rt_parallel_for
** coverage, rt_malloc / rt_memcpy / rt_memset0 and rt_mem_stats. Either backend.
*/
#include "t_util.h"   // defines: T_EXPECT, t_finish, t_to_dev, t_to_host, t_round_bf16, ...

static float frand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, batch;
    long sA, sB, sC;
    float alpha, beta;
    rt_dtype ab;
} gcase;

/* Element (i, j) of op(X) for batch item b (X stored row-major at stride ld). */
static double opx(const float *X, int trans, int ld, long stride, int b, int i, int j)
{
    const float *x = X + b * stride;
    return trans ? x[(size_t)j * (size_t)ld + i] : x[(size_t)i * (size_t)ld + j];
}

static void run_case(const gcase *c, uint32_t seed, int nested)
{
    int arows = c->ta ? c->k : c->m, acols = c->ta ? c->m : c->k;
    int brows = c->tb ? c->n : c->k, bcols = c->tb ? c->k : c->n;
    size_t nbat = c->batch > 0 ? (size_t)c->batch : 1;
    size_t na = c->sA ? (size_t)c->sA * nbat : (size_t)arows * (size_t)c->lda;
    size_t nb = c->sB ? (size_t)c->sB * nbat : (size_t)brows * (size_t)c->ldb;
    size_t nc = (size_t)c->sC * (nbat - 1) + (size_t)c->m * (size_t)c->ldc + 1;
    (void)acols;
    (void)bcols;
    float *A = t_alloc(na * 4 + 4), *B = t_alloc(nb * 4 + 4), *C0 = t_alloc(nc * 4);
    float *C = t_alloc(nc * 4);
    for (size_t i = 0; i < na; i++)
        A[i] = c->ab == RT_BF16 ? t_round_bf16(frand(&seed)) : frand(&seed);
    for (size_t i = 0; i < nb; i++)
        B[i] = c->ab == RT_BF16 ? t_round_bf16(frand(&seed)) : frand(&seed);
    for (size_t i = 0; i < nc; i++)
        C0[i] = c->beta == 0.0f ? NAN : frand(&seed);
    size_t es = c->ab == RT_BF16 ? 2 : 4;
    void *hA = A, *hB = B;
    if (c->ab == RT_BF16) {
        uint16_t *a16 = t_alloc(na * 2 + 2), *b16 = t_alloc(nb * 2 + 2);
        for (size_t i = 0; i < na; i++)
            a16[i] = t_bf16_bits(A[i]);
        for (size_t i = 0; i < nb; i++)
            b16[i] = t_bf16_bits(B[i]);
        hA = a16;
        hB = b16;
    }
    void *dA = t_to_dev(hA, na * es), *dB = t_to_dev(hB, nb * es);
    float *dC = t_to_dev(C0, nc * 4);
    if (!nested) {
        rt_gemm(c->ta, c->tb, c->m, c->n, c->k, c->alpha, dA, c->lda, c->sA, dB, c->ldb, c->sB,
                c->beta, dC, c->ldc, c->sC, c->batch, c->ab, RT_F32);
    } else {
        /* one rt_gemm per batch item from inside rt_parallel_for (single-threaded there) */
        for (int b = 0; b < c->batch; b++)
            rt_gemm(c->ta, c->tb, c->m, c->n, c->k, c->alpha, (char *)dA + (size_t)b * c->sA * es,
                    c->lda, 0, (char *)dB + (size_t)b * c->sB * es, c->ldb, 0, c->beta,
                    dC + (size_t)b * c->sC, c->ldc, 0, 1, c->ab, RT_F32);
    }
    t_to_host(C, dC, nc * 4);
    int bad = 0;
    for (int b = 0; b < c->batch; b++)
        for (int i = 0; i < c->m; i++)
            for (int j = 0; j < c->n; j++) {
                double s = 0, mag = 0;
                for (int p = 0; p < c->k; p++) {
                    double v = opx(A, c->ta, c->lda, c->sA, b, i, p) *
                               opx(B, c->tb, c->ldb, c->sB, b, p, j);
                    s += v;
                    mag += fabs(v);
                }
                size_t at = (size_t)b * (size_t)c->sC + (size_t)i * (size_t)c->ldc + (size_t)j;
                double want = c->alpha * s + (c->beta == 0.0f ? 0.0 : c->beta * C0[at]);
                /* f32 accumulation bound ~ (k + 2) * 2^-23 relative to the magnitudes */
                double tol = (c->k + 2) * 1.2e-7 *
                             (fabs(c->alpha) * mag + (c->beta ? fabs(c->beta * C0[at]) : 0)) +
                             1e-6;
                double got = C[at];
                if (!(fabs(got - want) <= tol) && bad++ < 3)
                    T_EXPECT(0, "gemm %s ta%d tb%d m%d n%d k%d lda%d ldb%d ldc%d batch%d sA%ld "
                             "sB%ld a%g b%g%s: C[%d][%d][%d] = %.9g, want %.9g",
                             rt_dtype_name(c->ab), c->ta, c->tb, c->m, c->n, c->k, c->lda,
                             c->ldb, c->ldc, c->batch, c->sA, c->sB, c->alpha, c->beta,
                             nested ? " nested" : "", b, i, j, got, want);
                t_checks++;
            }
    /* outside the matrices (row padding, between batches) nothing may change */
    for (size_t at = 0; at < nc; at++) {
        size_t b = c->sC ? at / (size_t)c->sC : 0, rem = c->sC ? at % (size_t)c->sC : at;
        int inside = b < (size_t)c->batch && rem / (size_t)c->ldc < (size_t)c->m &&
                     rem % (size_t)c->ldc < (size_t)c->n;
        if (c->m == 0 || c->n == 0)
            inside = 0;
        if (!inside && !(C[at] == C0[at] || (isnan(C[at]) && isnan(C0[at]))))
            T_EXPECT(0, "gemm m%d n%d ldc%d sC%ld: wrote outside C at %zu", c->m, c->n, c->ldc,
                     c->sC, at);
    }
    rt_free(dA);
    rt_free(dB);
    rt_free(dC);
    if (hA != A) {
        free(hA);
        free(hB);
    }
    free(A);
    free(B);
    free(C0);
    free(C);
}

static void gemm_case(int ta, int tb, int m, int n, int k, int pad, int batch, int shareB,
                      float alpha, float beta, rt_dtype ab, int nested)
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
    run_case(&c, (uint32_t)(m * 131 + n * 17 + k * 7 + ta + 2 * tb + batch), nested);
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

/* rt_gemm from inside rt_parallel_for bodies, one batch item per index. */
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
        A[i] = frand(&s);
    for (int i = 0; i < nb * k * n; i++)
        B[i] = frand(&s);
    pg_ctx c = { 0, 1, m, n, k, A, B, C };
    rt_parallel_for(nb, pg_body, &c);
    rt_gemm(0, 1, m, n, k, 1.0f, A, k, (long)m * k, B, k, (long)k * n, 0.0f, R, n, (long)m * n,
            nb, RT_F32, RT_F32);
    int bad = 0;
    for (int i = 0; i < nb * m * n; i++)
        bad += fabsf(C[i] - R[i]) > 1e-4f;
    T_EXPECT(bad == 0, "rt_gemm inside rt_parallel_for: %d of %d differ from the batched call",
             bad, nb * m * n);
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

/* -- rt_mem_stats ---------------------------------------------------------------------------- */

/* The runtime's own device bytes right after rt_init (rt.h). */
static size_t runtime_bytes(void)
{
    return strcmp(rt_backend(), "cpu") == 0 ? 0 : RT_CUDA_WORKSPACE_BYTES;
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
        s = s * 1664525u + 1013904223u;
        int j = (int)((s >> 8) % (uint32_t)(i + 1));
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

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 1, "tp1 pp1 dp1");
    size_t live0, peak0;
    rt_mem_stats(&live0, &peak0);
    T_EXPECT(live0 == runtime_bytes() && peak0 == live0, "rt_mem_stats after rt_init: live %zu "
             "peak %zu, want %zu (the runtime's own workspaces)", live0, peak0, runtime_bytes());
    rt_dtype abs[2] = { RT_F32, RT_BF16 };
    static const int dims[][3] = {
        { 1, 1, 1 }, { 3, 5, 7 }, { 17, 33, 9 }, { 64, 64, 64 }, { 129, 67, 250 },
        { 5, 200, 3 }, { 2, 3, 1 },
    };
    for (int ai = 0; ai < 2; ai++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
                    const int *s = dims[d];
                    gemm_case(ta, tb, s[0], s[1], s[2], 0, 1, 0, 1.0f, 0.0f, abs[ai], 0);
                    gemm_case(ta, tb, s[0], s[1], s[2], 3, 3, 0, 0.5f, -0.25f, abs[ai], 0);
                    gemm_case(ta, tb, s[0], s[1], s[2], 1, 2, 1, -1.5f, 1.0f, abs[ai], 0);
                }
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            /* zero sizes; k = 0 scales C by beta; alpha = 0 too */
            gemm_case(ta, tb, 0, 5, 3, 1, 2, 0, 1.0f, 0.5f, RT_F32, 0);
            gemm_case(ta, tb, 4, 0, 3, 1, 2, 0, 1.0f, 0.5f, RT_F32, 0);
            gemm_case(ta, tb, 4, 5, 0, 1, 2, 0, 1.0f, 0.5f, RT_F32, 0);
            gemm_case(ta, tb, 4, 5, 0, 1, 2, 0, 1.0f, 0.0f, RT_BF16, 0);
            gemm_case(ta, tb, 4, 5, 6, 1, 2, 0, 0.0f, 2.0f, RT_F32, 0);
            gemm_case(ta, tb, 4, 5, 6, 1, 0, 0, 1.0f, 2.0f, RT_F32, 0);
            /* GPT-2 shapes (B*T = 256) through the threaded path, and per-item nesting */
            gemm_case(ta, tb, 256, 768, 192, 0, 1, 0, 1.0f, 0.0f, RT_F32, 0);
            gemm_case(ta, tb, 96, 256, 768, 2, 1, 0, 1.0f, 1.0f, RT_BF16, 0);
            gemm_case(ta, tb, 64, 64, 64, 0, 12, 0, 1.0f, 0.0f, RT_F32, 1);
        }
    gemm_case(0, 1, 256, 2304, 768, 0, 1, 0, 1.0f, 0.0f, RT_F32, 0);   /* qkv forward */
    gemm_case(1, 0, 768, 3072, 256, 0, 1, 0, 1.0f, 1.0f, RT_F32, 0);   /* fc weight grad */
    gemm_case(0, 0, 300, 17, 500, 0, 5, 0, 1.0f, 0.0f, RT_F32, 0);     /* tall: split rows */
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
