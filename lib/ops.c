/*
** ops.c: the linear layers on the runtime's GEMM and the context-parallel attention steps
** (ops.h), shared by both backends: each is a few kernel or GEMM calls with shapes as
** arguments. No communication (the generated code sends the ring's blocks and runs the
** all-to-alls between these calls). Called by the generated stage code.
*/
#include "ops.h"       // defines: matmul_fwd, linear_fwd, cp_ring_fwd_block, ...
#include "kernels.h"   // defines: bias_fwd, attention_fwd_block, copy_cols, ...

static void *at(const void *p, size_t n, rt_dtype t)
{
    return (char *)p + n * rt_dtype_size(t);
}

/* -- Linear layers ------------------------------------------------------------------------ */

void matmul_fwd(void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                int OC, rt_dtype t)
{
    if (bias && rt_gemm_epi(0, 0, N, OC, IC, inp, IC, w, OC, out, OC, RT_EPI_BIAS, bias, NULL, t))
        return;
    rt_gemm(0, 0, N, OC, IC, 1.0f, inp, IC, 0, w, OC, 0, 0.0f, out, OC, 0, 1, t, t);
    if (bias) bias_fwd(out, bias, N, OC, t);
}

void matmul_gelu_fwd(void *pre, void *out, const void *inp, const void *w, const void *bias,
                     int N, int IC, int OC, rt_dtype t)
{
    if (rt_gemm_epi(0, 0, N, OC, IC, inp, IC, w, OC, out, OC, RT_EPI_GELU, bias, pre, t))
        return;
    matmul_fwd(pre, inp, w, bias, N, IC, OC, t);
    gelu_fwd(out, pre, (size_t)N * OC, t);
}

void matmul_bwd(void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                const void *w, int N, int IC, int OC, rt_dtype t)
{
    rt_gemm(1, 0, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f, dw, OC, 0, 1, t, RT_F32);
    if (dbias) bias_bwd(dbias, dout, N, OC, t);
    rt_gemm(0, 1, N, IC, OC, 1.0f, dout, OC, 0, w, OC, 0, 0.0f, dinp, IC, 0, 1, t, t);
}

void matmul_bwd_gelu(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                     const void *pre, int N, int IC, int OC, rt_dtype t)
{
    rt_gemm(1, 0, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f, dw, OC, 0, 1, t, RT_F32);
    if (rt_gemm_epi(0, 1, N, IC, OC, dout, OC, w, OC, dinp, IC, RT_EPI_DGELU, NULL, (void *)pre,
                    t))
        return;
    rt_gemm(0, 1, N, IC, OC, 1.0f, dout, OC, 0, w, OC, 0, 0.0f, dinp, IC, 0, 1, t, t);
    gelu_bwd(dinp, pre, dinp, (size_t)N * IC, t);
}

void linear_fwd(void *out, int ldo, const void *inp, const void *w, int N, int IC, int OC,
                rt_dtype t)
{
    rt_gemm(0, 1, N, OC, IC, 1.0f, inp, IC, 0, w, IC, 0, 0.0f, out, ldo, 0, 1, t, t);
}

void linear_bwd(void *dinp, float beta, float *dw, const void *dout, int ldd, const void *inp,
                const void *w, int N, int IC, int OC, rt_dtype t)
{
    rt_gemm(1, 0, OC, IC, N, 1.0f, dout, ldd, 0, inp, IC, 0, 1.0f, dw, IC, 0, 1, t, RT_F32);
    rt_gemm(0, 0, N, IC, OC, 1.0f, dout, ldd, 0, w, IC, 0, beta, dinp, IC, 0, 1, t, t);
}

/* -- Context parallelism ------------------------------------------------------------------ */

/* The global chunk index of local half 'half' of cp rank r. */
static int cp_chunk(int cp, int r, int half) { return half ? 2 * cp - 1 - r : r; }

/* The pairs (query half, key half) of this rank's queries and cp rank s's block that the
** causal mask does not hide entirely. */
typedef struct { int qh, kh, causal; } cp_pair;

static int cp_pairs(int cp, int cp_rank, int s, cp_pair out[4])
{
    int n = 0;
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
            int q = cp_chunk(cp, cp_rank, qh), k = cp_chunk(cp, s, kh);
            if (k <= q) out[n++] = (cp_pair){ qh, kh, k == q };
        }
    return n;
}

void cp_ring_fwd_block(int i, int cp, int cp_rank, float *acc, float *lse, const void *qkv,
                       const void *kv, int B, int T, int Hl, int KVl, int hd, float scale,
                       rt_dtype t)
{
    int tc = T / 2, cl = Hl * hd, kl = KVl * hd, w = cl + 2 * kl;
    size_t half = (size_t)tc * B;
    cp_pair pr[4];
    for (int j = 0, n = cp_pairs(cp, cp_rank, (cp_rank - i + cp) % cp, pr); j < n; j++) {
        size_t qh = (size_t)pr[j].qh, kh = (size_t)pr[j].kh;
        const void *k = at(kv, kh * half * 2 * kl, t);
        attention_fwd_block(acc + qh * half * cl, lse + qh * tc, T, at(qkv, qh * half * w, t),
                            w, k, at(k, (size_t)kl, t), 2 * kl, B, tc, tc, Hl, KVl, hd,
                            pr[j].causal, scale, t);
    }
}

void cp_ring_bwd_block(int i, int cp, int cp_rank, float *dq, float *dkv, const void *dout,
                       const float *lse, const float *dsum, const void *qkv, const void *kv,
                       int B, int T, int Hl, int KVl, int hd, float scale, rt_dtype t)
{
    int tc = T / 2, cl = Hl * hd, kl = KVl * hd, w = cl + 2 * kl;
    size_t half = (size_t)tc * B;
    cp_pair pr[4];
    for (int j = 0, n = cp_pairs(cp, cp_rank, (cp_rank - i + cp) % cp, pr); j < n; j++) {
        size_t qh = (size_t)pr[j].qh, kh = (size_t)pr[j].kh;
        const void *k = at(kv, kh * half * 2 * kl, t);
        float *dk = dkv + kh * half * 2 * kl;
        attention_bwd_block(dq + qh * half * cl, dk, dk + kl, 2 * kl,
                            at(dout, qh * half * cl, t), lse + qh * tc, dsum + qh * tc, T,
                            at(qkv, qh * half * w, t), w, k, at(k, (size_t)kl, t), 2 * kl, B,
                            tc, tc, Hl, KVl, hd, pr[j].causal, scale, t);
    }
}

void cp_a2a_heads(void *blocks, void *rows, int qc, int kc, int pack, int N, int cp,
                  rt_dtype t)
{
    int part[3] = { qc, kc, kc }, parts = kc ? 3 : 1;
    size_t rw = (size_t)qc + 2 * (size_t)kc, bw = rw / cp;
    for (int j = 0; j < cp; j++)
        for (int p = 0, r0 = 0, b0 = 0; p < parts; r0 += part[p], b0 += part[p] / cp, p++) {
            int hw = part[p] / cp;
            void *b = at(blocks, (size_t)j * N * bw + (size_t)b0, t);
            void *r = at(rows, (size_t)r0 + (size_t)j * hw, t);
            if (pack) copy_cols(b, t, bw, r, t, rw, N, hw);
            else copy_cols(r, t, rw, b, t, bw, N, hw);
        }
}

void cp_a2a_order(void *dst, const void *src, int w, int to_seq, int N, int cp, int tc, int B,
                  rt_dtype t)
{
    RT_CHECK(N == 2 * tc * B, "cp_a2a_order: %d rows are not two chunks of %d x %d", N, tc, B);
    size_t chunk = (size_t)tc * B * w;
    for (int s = 0; s < cp; s++)
        for (int h = 0; h < 2; h++) {
            size_t blk = (size_t)(2 * s + h) * chunk, seq = (size_t)cp_chunk(cp, s, h) * chunk;
            rt_memcpy(at(dst, to_seq ? seq : blk, t), at(src, to_seq ? blk : seq, t),
                      chunk * rt_dtype_size(t), RT_D2D);
        }
}
