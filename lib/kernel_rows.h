/*
** kernel_rows.h: the arithmetic of every kernel over a range of rows, columns or elements,
** shared by both backends: kernels_cpu.c runs these functions on ranges of the runtime's thread
** pool, kernels_cuda.cu on one row, column or element per device thread, so the two compute
** the same formulas in the same order. Not an interface: included only by the two kernel files
** (each defines nothing else first) and bench/specialize.c.
**
** Storage types. The functions that read or write activations and parameters are written once,
** in the second half of this file, over a storage type KR_T, and instantiated twice by this
** file including itself: KR_T = float (loads and stores are plain) and KR_T = uint16_t (bf16:
** loads widen exactly, stores round to nearest even). In C they are named with a suffix
** (layernorm_fwd_rows_f32, layernorm_fwd_rows_bf16); in C++ (CUDA) both are overloads of one
** name, so a kernel template over its storage type calls the right one. Everything is computed
** in f32; with KR_T = float the expressions are exactly the f32 code's.
*/
#ifndef GPT_KERNEL_ROWS_H
#define GPT_KERNEL_ROWS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ROW_FN static __device__ inline
#else
#define ROW_FN static inline
#endif

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define MIN(a, b)      ((a) < (b) ? (a) : (b))
#define LANES 16       /* partial sums of a row reduction (CPU: one AVX-512 register) */

#define EXP_MIN    (-87.0f)          /* vexpf's input range: 2^k stays a normal float */
#define EXP_MAX    88.0f
#define EXP_LOG2E  1.44269504088896341f
#define EXP_LN2_HI 0.693359375f      /* ln 2 in 9 bits: k * EXP_LN2_HI is exact */
#define EXP_LN2_LO (-2.12194440e-4f) /* ln 2 - EXP_LN2_HI */
#define EXP_ROUND  12582912.0f       /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_ROUND_BITS 0x4B400000u   /* its bit pattern: the integer sits in the low bits */

/*
** exp(x) for softmax, attention, cross-entropy and GELU, written for the CPU vectoriser (libm's
** expf is one call per element) and used on the device too, so both backends clamp alike:
** x = k ln2 + r with |r| <= ln2/2, exp(r) by its Taylor series to r^7, times 2^k added into the
** exponent bits. Relative error <= 1.1e-7 (2 ulp). x is clamped to [EXP_MIN, EXP_MAX]
** (exp(-87) = 1.6e-38 stands for 0 in the sums that use it; exp(88) = 1.7e38 is finite, so
** GELU's backward stays finite for every finite x); NaN stays NaN. Vector and scalar code give
** the same bits (no FMA contraction under -std=c11), so results never depend on how rows are
** split.
*/
ROW_FN
float vexpf(float x)
{
    float xc = x < EXP_MIN ? EXP_MIN : x > EXP_MAX ? EXP_MAX : x;
    float t = xc * EXP_LOG2E + EXP_ROUND;
    float k = t - EXP_ROUND;
    float r = (xc - k * EXP_LN2_HI) - k * EXP_LN2_LO;
    float p = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 +
              r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    uint32_t tbits, pbits;
    memcpy(&tbits, &t, sizeof tbits);
    memcpy(&pbits, &p, sizeof pbits);
    pbits += (tbits - EXP_ROUND_BITS) << 23;
    float y;
    memcpy(&y, &pbits, sizeof y);
    return x == x ? y : x;
}

/* Row reductions keep LANES partial sums (acc[l] takes elements l, l + LANES, ...), which the
** CPU compiler holds in one vector register, then add them in a fixed order: the result
** depends on the row length only, never on threads. */
ROW_FN
float lanes_total(const float *acc)
{
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

/* -- bf16 storage ------------------------------------------------------------------------------ */
/*
** bf16 is the upper half of an IEEE f32: widening is exact. Narrowing rounds to nearest, ties
** to even; a NaN stays a (quiet) NaN; overflow rounds to infinity. The same bits as the
** runtime's conversion (its collectives and GEMM), written branch-free for the vectoriser.
*/

ROW_FN
float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

ROW_FN
uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t nan = (u >> 16) | 0x0040u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* -- GELU (tanh approximation), AdamW: f32 element arithmetic ---------------------------------- */
/*
** GELU as GPT-2 and Hugging Face's "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
*/

#define GELU_SCALE 0.7978845608028654f   /* sqrt(2/pi) */
#define GELU_CUBE  0.044715f

/* 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x s with s = 1 / (1 + e), e = exp(-2u): no tanhf,
** and no cancellation in 1 + tanh(u) for negative x. */
ROW_FN
float gelu1(float x)
{
    float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    return x / (1.0f + vexpf(-2.0f * u));
}

/* d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) du with t = tanh(u); 0.5 (1 + t) = s and
** 1 - t^2 = 4 s (1 - s) = 4 s^2 e, so the derivative is s + 2 x s^2 e du. e <= exp(88) is
** finite, and for x < -10 the product underflows to 0 before it meets e: finite for all x. */
ROW_FN
float gelu1_grad(float x)
{
    float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    float e = vexpf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    return s + 2.0f * x * s * s * e * du;
}

/*
** AdamW in torch's order: p *= 1 - lr*wd; m, v updated; p -= (lr / bc1) * m / (sqrt(v) /
** sqrt(bc2) + eps), with g = grad * gscale (the clipping coefficient, 1 when not clipping).
*/
ROW_FN
void adamw1(float *p, float g, float *m, float *v, float lr, float beta1, float beta2,
            float eps, float wd, float step_size, float bc2_sqrt)
{
    *p *= 1.0f - lr * wd;
    *m += (1.0f - beta1) * (g - *m);          /* torch: exp_avg.lerp_(grad, 1 - beta1) */
    *v = beta2 * *v + (1.0f - beta2) * g * g;
    *p -= step_size * (*m / (sqrtf(*v) / bc2_sqrt + eps));
}

/* -- Llama layer: RMSNorm, rotary embedding, SwiGLU (f32 arithmetic) ------------------------- */

/* RMSNorm's 1/sqrt(mean(x^2) + eps) from the row's sum of squares */
ROW_FN
float rms_rstd(float sumsq, int C, float eps)
{
    return 1.0f / sqrtf(sumsq / (float)C + eps);
}

/* One element of RMSNorm's input gradient: dx + rstd (g - xhat gx_mean), g = dout w. */
ROW_FN
float rms_dinp(float dx, float g, float xhat, float rstd, float gx_mean)
{
    return dx + rstd * (g - xhat * gx_mean);
}

/*
** Rotary embedding: the rotation of pair i (channels i, i + hd/2) at position pos, Hugging
** Face's rotate_half convention: inv = 1 / theta^(2i/hd) and a = pos inv in double (HF's f32
** angle is off by up to ulp(a)/2 = 0.004 rad at pos 1e5), cos a and sin a rounded to f32;
** inverse: the rotation by -a. Both backends call libm's (CUDA's) double pow, cos and sin, so
** they agree but where cos or sin lies within a double rounding of an f32 midpoint.
*/
#define ROPE_PAIRS 32    /* pairs whose angles the CPU computes at a time */

ROW_FN
double rope_inv(int i, int hd, float theta)
{
    return 1.0 / pow((double)theta, (double)(2 * i) / hd);
}

ROW_FN
void rope_cos_sin(float *c, float *s, int pos, double inv, int inverse)
{
    double a = (double)pos * inv;
    *c = (float)cos(a);
    *s = (float)(inverse ? -sin(a) : sin(a));
}

/*
** sigmoid(g) = 1 / (1 + exp(-g)), and 0 for g < -EXP_MAX: there exp(-g) overflows f32 and
** vexpf clamps it, which would leave s = 6e-39 instead of (nearly) 0 and silu(-1000) = -6e-36.
** With s = 0, silu(g) = g s is -0 for every g < -88 (the exact value is below 6e-37 in
** magnitude), and so is the gradient's s (1 + g (1 - s)): finite for every finite g; NaN
** stays NaN.
*/
ROW_FN
float sigmoid1(float g)
{
    float s = 1.0f / (1.0f + vexpf(-g));
    return g < -EXP_MAX ? 0.0f : s;
}

/* d silu(g) / dg = s (1 + g (1 - s)) */
ROW_FN float silu1_grad(float g, float s) { return s * (1.0f + g * (1.0f - s)); }

/* -- Causal attention: the formulas both backends share --------------------------------------- */

/* Grouped-query attention: query head h of Hl (in groups of Hl / KVl consecutive heads) reads
** kv head h / (Hl / KVl) of KVl, as Megatron-LM and FlashAttention map them. */
ROW_FN
int att_kv_head(int h, int Hl, int KVl)
{
    return h / (Hl / KVl);
}
/*
** The backends tile the (T, T) scores differently (the CPU in cache-sized f32 tiles and
** register blocks, CUDA in shared memory) but compute each row with these: the online softmax
** keeps a running maximum m and sum l of exp(s - m) over the key tiles seen so far; a new
** tile's maximum rescales l and the output accumulated so far by exp(m_old - m_new). The
** log-sum-exp m + log(l) is saved; the backward recomputes p = exp(s - lse).
*/

ROW_FN float att_rescale(float m_old, float m_new) { return vexpf(m_old - m_new); }
ROW_FN float att_lse(float m, float l) { return m + logf(l); }
ROW_FN float att_prob(float s, float lse) { return vexpf(s - lse); }
/* dscore = p (dp - sum_j p_j dp_j), with sum_j p_j dp_j = rowsum(dout * out) = dsum */
ROW_FN float att_dscore(float p, float dp, float dsum) { return p * (dp - dsum); }
/* Context parallelism merges the attention of one key block (normalised output o, log-sum-exp
** l) into a running one (lse): the new log-sum-exp is log(e^lse + e^l) and the two outputs are
** weighted by att_weight(lse, new) and att_weight(l, new). lse = -inf (nothing seen) gives
** weights 0 and 1 exactly (libm's and CUDA's expf(-inf) = 0, unlike the clamped vexpf). */
ROW_FN float att_merge_lse(float lse, float l)
{
    float m = lse > l ? lse : l;
    return m + logf(expf(lse - m) + expf(l - m));
}
ROW_FN float att_weight(float l, float lse_new) { return expf(l - lse_new); }

/* -- Mixture of experts: routing (f32) --------------------------------------------------------- */
/*
** Top-k with ties to the lower expert, its probabilities, the softmax over all experts for the
** aux loss, and its backward; the row movements between token and expert order are gathers
** (no scatter, no atomics): deterministic.
*/

/*
** One token: score = softmax(logit) over all E experts; sel = the k largest logits in
** descending order (a tie goes to the lower expert); prob = softmax over the k selected logits,
** or, with pre_softmax, the scores of the selected experts (not renormalised); times 'scale'
** (Megatron's moe_router_topk_scaling_factor; 1: none). With 'sigmoid' (Megatron's score
** function sigmoid): score = sigmoid(logit) / *ssum, *ssum = the sum of the E sigmoids + 1e-20,
** and prob = the selected sigmoids over their sum + 1e-20 (k = 1: the sigmoid itself).
** Group-limited routing (groups > 1, Megatron's moe_router_num_groups / group_topk): the E
** experts form 'groups' equal groups, each scored by the sum of its k/group_topk largest
** selection values (the logits; the scores with pre_softmax or sigmoid); the top-k is taken
** only from the group_topk best groups. Ties: the lower expert, the lower group. With 'ebias'
** (E; sigmoid only, Megatron's expert bias for aux-loss-free balancing) the top-k and the
** group scores use sigmoid(logit) + ebias instead; the scores and probabilities do not.
*/
#define KR_MAX_GROUPS 64          /* config.lua: num_groups <= this */

/* The value route_row's top-k ranks expert e by: the logit, or with ebias sigmoid + bias. */
ROW_FN float route_key(const float *logit, const float *ebias, int e)
{
    return ebias ? 1.0f / (1.0f + vexpf(-logit[e])) + ebias[e] : logit[e];
}

ROW_FN
void route_row(int *sel, float *prob, float *score, float *ssum, const float *logit, int E,
               int k, int pre_softmax, float scale, int sigmoid, int groups, int group_topk,
               const float *ebias)
{
    float mx = logit[0], sum = 0.0f;
    for (int e = 1; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
    for (int e = 0; e < E; e++) {
        score[e] = sigmoid ? 1.0f / (1.0f + vexpf(-logit[e])) : vexpf(logit[e] - mx);
        sum += score[e];
    }
    if (sigmoid) {
        sum += 1e-20f;
        *ssum = sum;
    }
    for (int e = 0; e < E; e++) score[e] /= sum;
    unsigned char ok[KR_MAX_GROUPS];  /* group-limited: the groups the top-k may use */
    int W = groups > 1 ? E / groups : E;
    if (groups > 1) {
        const float *v = (pre_softmax || sigmoid) ? score : logit;
        float gs[KR_MAX_GROUPS];
        int m = k / group_topk;
        for (int g = 0; g < groups; g++) {
            gs[g] = 0.0f;
            for (int e = g * W; e < (g + 1) * W; e++) {
                int rank = 0;            /* experts of the group ahead of e */
                float ve = ebias ? route_key(logit, ebias, e) : v[e];
                for (int f = g * W; f < (g + 1) * W; f++) {
                    float vf = ebias ? route_key(logit, ebias, f) : v[f];
                    rank += vf > ve || (vf == ve && f < e);
                }
                if (rank < m) gs[g] += ve;
            }
        }
        for (int g = 0; g < groups; g++) {
            int rank = 0;
            for (int h = 0; h < groups; h++) rank += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
            ok[g] = rank < group_topk;
        }
    }
    for (int j = 0; j < k; j++) {
        int best = -1;
        float kb = 0.0f;
        for (int e = 0; e < E; e++) {
            int taken = groups > 1 && !ok[e / W];
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (taken) continue;
            float ke = route_key(logit, ebias, e);
            if (best < 0 || ke > kb) {
                best = e;
                kb = ke;
            }
        }
        sel[j] = best;
    }
    if (sigmoid) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            prob[j] = 1.0f / (1.0f + vexpf(-logit[sel[j]]));
            s += prob[j];
        }
        for (int j = 0; j < k; j++) prob[j] = (k > 1 ? prob[j] / (s + 1e-20f) : prob[j]) * scale;
        return;
    }
    if (pre_softmax) {
        for (int j = 0; j < k; j++) prob[j] = score[sel[j]] * scale;
        return;
    }
    float m = logit[sel[0]], s = 0.0f;      /* sel[0] holds the largest logit */
    for (int j = 0; j < k; j++) {
        prob[j] = vexpf(logit[sel[j]] - m);
        s += prob[j];
    }
    for (int j = 0; j < k; j++) prob[j] = prob[j] / s * scale;
}

/* The gradient reaching score e of one token: the aux loss's auxg[e], plus with pre_softmax
** scale * d(prob) of the choices that selected e (in choice order). */
ROW_FN
float route_dscore(int e, const float *dprob, const int *sel, const float *auxg, int k,
                   int pre_softmax, float scale)
{
    float ds = auxg[e];
    if (pre_softmax)
        for (int j = 0; j < k; j++) ds += sel[j] == e ? scale * dprob[j] : 0.0f;
    return ds;
}

/* -- The typed half: instantiated for each storage type ---------------------------------------- */

#ifdef __cplusplus
#define KR_FN(name) name               /* C++: overloads on the storage type */
#define KR_F32(name) name
#define KR_BF16(name) name
#else
#define KR_F32(name) name##_f32
#define KR_BF16(name) name##_bf16
#endif

#define KR_T float
#define KR_LD(x) (x)
#define KR_ST(f) (f)
#ifndef __cplusplus
#define KR_FN KR_F32
#endif
#include "kernel_rows.h"
#undef KR_T
#undef KR_LD
#undef KR_ST
#ifndef __cplusplus
#undef KR_FN
#endif

#define KR_T uint16_t
#define KR_LD(x) bf16_to_f32(x)
#define KR_ST(f) f32_to_bf16(f)
#ifndef __cplusplus
#define KR_FN KR_BF16
#endif
#include "kernel_rows.h"
#undef KR_T
#undef KR_LD
#undef KR_ST
#undef KR_FN

#endif /* GPT_KERNEL_ROWS_H */

/* ============================================================================================== */
/* Typed half: KR_T, KR_LD(x) (KR_T -> f32), KR_ST(f) (f32 -> KR_T), KR_FN(name) are set.        */
#if defined(KR_T) && defined(GPT_KERNEL_ROWS_H)

/* -- Element access, copies, conversions ------------------------------------------------------- */

ROW_FN float KR_FN(kr_load)(const KR_T *p) { return KR_LD(*p); }
ROW_FN void KR_FN(kr_store)(KR_T *p, float f) { *p = KR_ST(f); }

/* dst[i] = src[i] rounded, i in [i0, i1) */
ROW_FN
void KR_FN(narrow_span)(KR_T *dst, const float *src, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) dst[i] = KR_ST(src[i]);
}

/* dst[i] = src[i] widened, i in [i0, i1) */
ROW_FN
void KR_FN(widen_span)(float *dst, const KR_T *src, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) dst[i] = KR_LD(src[i]);
}

/* -- Embedding: vocabulary-parallel tokens, learned positions ---------------------------------- */
/*
** Activations are sequence-major: row t*B + b holds token b of position t. A rank owns the
** vocabulary rows [vstart, vstart + vrows); other token ids give zero rows (the TP all-reduce
** that follows adds the owner's row). Backward sums in token order: deterministic.
*/

/* Rows [lo, hi) of out: out[n, :] = wte[tok[n] - vstart, :] if this rank owns tok[n], else 0
** (copies: no rounding). */
ROW_FN
void KR_FN(embed_fwd_rows)(KR_T *out, const int *tok, const KR_T *wte, int C, int vstart,
                           int vrows, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        KR_T *o = out + (size_t)n * C;
        int v = tok[n] - vstart;
        if (v >= 0 && v < vrows) {
            const KR_T *w = wte + (size_t)v * C;
            for (int i = 0; i < C; i++) o[i] = w[i];
        } else {
            for (int i = 0; i < C; i++) o[i] = KR_ST(0.0f);
        }
    }
}

/* Columns [i0, i1) of dwte: every owned token's gradient row added in token order. */
ROW_FN
void KR_FN(embed_bwd_cols)(float *dwte, const KR_T *dout, const int *tok, int N, int C,
                           int vstart, int vrows, int i0, int i1)
{
    for (int n = 0; n < N; n++) {
        int v = tok[n] - vstart;
        if (v < 0 || v >= vrows) continue;
        float *dw = dwte + (size_t)v * C;
        const KR_T *d = dout + (size_t)n * C;
        for (int i = i0; i < i1; i++) dw[i] += KR_LD(d[i]);
    }
}

/* Positions [lo, hi) (local) of a (T*B, C) block: rows t*B .. t*B+B-1 get wpe row t0 + t. */
ROW_FN
void KR_FN(pos_fwd_rows)(KR_T *out, const KR_T *wpe, int B, int C, int t0, int lo, int hi)
{
    for (int t = lo; t < hi; t++) {
        const KR_T *p = wpe + (size_t)(t0 + t) * C;
        for (int b = 0; b < B; b++) {
            KR_T *o = out + ((size_t)t * B + b) * C;
            for (int i = 0; i < C; i++) o[i] = KR_ST(KR_LD(o[i]) + KR_LD(p[i]));
        }
    }
}

ROW_FN
void KR_FN(pos_bwd_rows)(float *dwpe, const KR_T *dout, int B, int C, int t0, int lo, int hi)
{
    for (int t = lo; t < hi; t++) {
        float *dp = dwpe + (size_t)(t0 + t) * C;
        for (int b = 0; b < B; b++) {
            const KR_T *d = dout + ((size_t)t * B + b) * C;
            for (int i = 0; i < C; i++) dp[i] += KR_LD(d[i]);
        }
    }
}

/* -- LayerNorm over rows of a (N, C) matrix ---------------------------------------------------- */
/*
** Statistics in f32 with a two-pass mean/variance; backward accumulates into dinp, dw, db
** (the residual stream and micro-batch accumulation both add). Every output element is summed
** in a fixed order.
*/

/* Rows [lo, hi): out = (inp - mean) * rstd * w + b; mean and rstd kept for the backward. */
ROW_FN
void KR_FN(layernorm_fwd_rows)(KR_T *out, float *mean, float *rstd, const KR_T *inp,
                               const KR_T *w, const KR_T *b, int C, float eps, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *x = inp + (size_t)n * C;
        KR_T *o = out + (size_t)n * C;
        float acc[LANES] = { 0.0f };
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += KR_LD(x[i + l]);
        float m = lanes_total(acc);
        for (; i < C; i++) m += KR_LD(x[i]);
        m /= (float)C;
        for (int l = 0; l < LANES; l++) acc[l] = 0.0f;
        for (i = 0; i + LANES <= C; i += LANES)
            for (int l = 0; l < LANES; l++) {
                float d = KR_LD(x[i + l]) - m;
                acc[l] += d * d;
            }
        float v = lanes_total(acc);
        for (; i < C; i++) {
            float d = KR_LD(x[i]) - m;
            v += d * d;
        }
        v /= (float)C;
        float s = 1.0f / sqrtf(v + eps);
        for (i = 0; i < C; i++) o[i] = KR_ST((KR_LD(x[i]) - m) * s * KR_LD(w[i]) + KR_LD(b[i]));
        mean[n] = m;
        rstd[n] = s;
    }
}

/* Rows [lo, hi) of the input gradient: dinp += rstd * (dn - mean(dn) - xhat * mean(dn * xhat)),
** with dn = dout * w and xhat the normalised input. */
ROW_FN
void KR_FN(layernorm_bwd_rows)(KR_T *dinp, const KR_T *dout, const KR_T *inp, const KR_T *w,
                               const float *mean, const float *rstd, int C, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        KR_T *dx = dinp + (size_t)n * C;
        float mu = mean[n], rs = rstd[n];
        float acc_dn[LANES] = { 0.0f }, acc_dnx[LANES] = { 0.0f };
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int l = 0; l < LANES; l++) {
                float xhat = (KR_LD(x[i + l]) - mu) * rs;
                float dn = KR_LD(d[i + l]) * KR_LD(w[i + l]);
                acc_dn[l] += dn;
                acc_dnx[l] += dn * xhat;
            }
        float dn_mean = lanes_total(acc_dn), dn_xhat_mean = lanes_total(acc_dnx);
        for (; i < C; i++) {
            float xhat = (KR_LD(x[i]) - mu) * rs;
            float dn = KR_LD(d[i]) * KR_LD(w[i]);
            dn_mean += dn;
            dn_xhat_mean += dn * xhat;
        }
        dn_mean /= (float)C;
        dn_xhat_mean /= (float)C;
        for (i = 0; i < C; i++) {
            float xhat = (KR_LD(x[i]) - mu) * rs;
            float dn = KR_LD(d[i]) * KR_LD(w[i]);
            dx[i] = KR_ST(KR_LD(dx[i]) + rs * (dn - dn_mean - xhat * dn_xhat_mean));
        }
    }
}

/* Columns [i0, i1) of the parameter gradients, accumulated over the rows in order. */
ROW_FN
void KR_FN(layernorm_bwd_cols)(float *dw, float *db, const KR_T *dout, const KR_T *inp,
                               const float *mean, const float *rstd, int N, int C, int i0,
                               int i1)
{
    for (int n = 0; n < N; n++) {
        const KR_T *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        for (int i = i0; i < i1; i++) {
            dw[i] += KR_LD(d[i]) * ((KR_LD(x[i]) - mean[n]) * rstd[n]);
            db[i] += KR_LD(d[i]);
        }
    }
}

/* -- GELU, bias, residual adds ----------------------------------------------------------------- */

ROW_FN
void KR_FN(gelu_fwd_span)(KR_T *out, const KR_T *inp, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) out[i] = KR_ST(gelu1(KR_LD(inp[i])));
}

/* dinp may be dout (in place): each element is read before it is written. */
ROW_FN
void KR_FN(gelu_bwd_span)(KR_T *dinp, const KR_T *inp, const KR_T *dout, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) dinp[i] = KR_ST(KR_LD(dout[i]) * gelu1_grad(KR_LD(inp[i])));
}

/* Rows [lo, hi), columns [c0, c1) of out (N, OC) += bias. */
ROW_FN
void KR_FN(bias_fwd_block)(KR_T *out, const KR_T *bias, int OC, int lo, int hi, int c0, int c1)
{
    for (int n = lo; n < hi; n++) {
        KR_T *o = out + (size_t)n * OC;
        for (int i = c0; i < c1; i++) o[i] = KR_ST(KR_LD(o[i]) + KR_LD(bias[i]));
    }
}

/* Columns [i0, i1) of a bias gradient: column sums of dout over the rows, in row order. */
ROW_FN
void KR_FN(bias_bwd_cols)(float *dbias, const KR_T *dout, int N, int OC, int i0, int i1)
{
    for (int n = 0; n < N; n++) {
        const KR_T *d = dout + (size_t)n * OC;
        for (int i = i0; i < i1; i++) dbias[i] += KR_LD(d[i]);
    }
}

/* out = a + b on [i0, i1); out may be a (add_inplace). */
ROW_FN
void KR_FN(add_span)(KR_T *out, const KR_T *a, const KR_T *b, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) out[i] = KR_ST(KR_LD(a[i]) + KR_LD(b[i]));
}

/* -- Vocabulary-parallel cross-entropy (docs/megatron.md §4.5) --------------------------------- */
/*
** logits (N, Vl) hold this rank's vocabulary columns [vstart, vstart + valid); columns past
** 'valid' are padding and never count. The caller reduces between the pieces: all-reduce MAX
** of the row maxima, then all-reduce SUM of [sum exp | target logit].
*/

ROW_FN
void KR_FN(ce_max_rows)(float *mx, const KR_T *logits, int Vl, int valid, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *row = logits + (size_t)n * Vl;
        float acc[LANES], m = -INFINITY;
        int j = 0;
        for (int l = 0; l < LANES; l++) acc[l] = -INFINITY;
        for (; j + LANES <= valid; j += LANES)
            for (int l = 0; l < LANES; l++)
                acc[l] = KR_LD(row[j + l]) > acc[l] ? KR_LD(row[j + l]) : acc[l];
        for (int l = 0; l < LANES; l++) m = acc[l] > m ? acc[l] : m;
        for (; j < valid; j++) m = KR_LD(row[j]) > m ? KR_LD(row[j]) : m;
        mx[n] = m;
    }
}

/* sums[n] = sum_j exp(logit - max), sums[N + n] = the target's logit if this rank owns it. */
ROW_FN
void KR_FN(ce_sums_rows)(float *sums, const KR_T *logits, const float *mx, const int *targets,
                         int N, int Vl, int valid, int vstart, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *row = logits + (size_t)n * Vl;
        float acc[LANES] = { 0.0f }, m = mx[n];
        int j = 0;
        for (; j + LANES <= valid; j += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += vexpf(KR_LD(row[j + l]) - m);
        float s = lanes_total(acc);
        for (; j < valid; j++) s += vexpf(KR_LD(row[j]) - m);
        sums[n] = s;
        int t = targets[n] - vstart;
        sums[N + n] = (t >= 0 && t < valid) ? KR_LD(row[t]) : 0.0f;
    }
}

/* dlogits = (softmax - onehot(target)) * dloss over this rank's columns, in place; padding 0. */
ROW_FN
void KR_FN(ce_bwd_rows)(KR_T *logits, const float *mx, const float *sums, const int *targets,
                        int Vl, int valid, int vstart, float dloss, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        KR_T *row = logits + (size_t)n * Vl;
        float inv = 1.0f / sums[n], m = mx[n];
        int t = targets[n] - vstart;
        for (int j = 0; j < valid; j++) {
            float p = vexpf(KR_LD(row[j]) - m) * inv;
            row[j] = KR_ST((p - (j == t ? 1.0f : 0.0f)) * dloss);
        }
        for (int j = valid; j < Vl; j++) row[j] = KR_ST(0.0f);
    }
}

/* -- AdamW on the f32 main parameters, with the model's copy ----------------------------------- */

/* Elements [i0, i1); copy (NULL: none) receives the updated parameters rounded. */
ROW_FN
void KR_FN(adamw_span)(float *p, const float *g, float *m, float *v, KR_T *copy, float lr,
                       float beta1, float beta2, float eps, float wd, float step_size,
                       float bc2_sqrt, float gscale, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++)
        adamw1(p + i, g[i] * gscale, m + i, v + i, lr, beta1, beta2, eps, wd, step_size,
               bc2_sqrt);
    if (copy)
        for (size_t i = i0; i < i1; i++) copy[i] = KR_ST(p[i]);
}

/* -- Mixture of experts: routing backward and row movements ------------------------------------ */

/*
** Tokens [lo, hi): dlogit (E) from d(prob) (k) and the aux loss's gradient with respect to the
** scores, auxg (E, the same for every token of the micro-batch). Through the softmax over all
** experts: dz = s * (ds - sum(s * ds)); without pre_softmax also through the softmax over the
** selected logits. Each element is summed in f32 and rounded once.
*/
ROW_FN
void KR_FN(route_bwd_rows)(KR_T *dlogits, const float *dprob, const float *prob,
                           const float *scores, const float *ssum, const int *sel,
                           const float *auxg, int aux_period, const float *zg, int E, int k,
                           int pre_softmax, float scale, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const float *ag = auxg + (size_t)(n % aux_period) * E;      /* row n's aux gradient */
        if (ssum) {         /* sigmoid: d sigma from the probabilities and the aux scores */
            const float *score = scores + (size_t)n * E, *dp = dprob + (size_t)n * k;
            const int *s = sel + (size_t)n * k;
            KR_T *dl = dlogits + (size_t)n * E;
            float D = ssum[n], ssel = 0.0f, qd = 0.0f, gs = 0.0f;
            for (int j = 0; j < k; j++) {
                ssel += score[s[j]] * D;
                qd += score[s[j]] * D * dp[j];
            }
            float den = ssel + 1e-20f;
            qd = scale * qd / den;              /* sum over j of q_j * d q_j */
            for (int e = 0; e < E; e++) gs += ag[e] * score[e];
            for (int e = 0; e < E; e++) {
                float sig = score[e] * D, dsig = (ag[e] - gs) / D;
                for (int j = 0; j < k; j++)
                    if (s[j] == e) dsig += k > 1 ? (scale * dp[j] - qd) / den : scale * dp[j];
                dl[e] = KR_ST(dsig * sig * (1.0f - sig));
            }
            continue;
        }
        const float *dp = dprob + (size_t)n * k, *pr = prob + (size_t)n * k;
        const float *score = scores + (size_t)n * E;
        const int *s = sel + (size_t)n * k;
        KR_T *dl = dlogits + (size_t)n * E;
        float dot = 0.0f, pd = 0.0f;
        for (int e = 0; e < E; e++)
            dot += score[e] * route_dscore(e, dp, s, ag, k, pre_softmax, scale);
        if (!pre_softmax)                      /* prob = scale * q: d q = scale d prob */
            for (int j = 0; j < k; j++) pd += pr[j] * dp[j] / scale;
        for (int e = 0; e < E; e++) {
            float g = score[e] * (route_dscore(e, dp, s, ag, k, pre_softmax, scale) - dot);
            if (!pre_softmax)
                for (int j = 0; j < k; j++)
                    if (s[j] == e) g += pr[j] * (dp[j] - pd);
            if (zg) g += zg[n] * score[e];             /* the z-loss: d lse = scores */
            dl[e] = KR_ST(g);
        }
    }
}

#define KR_COMBINE 64    /* columns summed at a time in f32 */

/* Tokens [lo, hi): out[t] = the k rows of src at pos[t*k + j], summed in j order (pos < 0:
** dropped). */
ROW_FN
void KR_FN(combine_out_rows)(KR_T *out, const KR_T *src, const int *pos, int k, int C, int lo,
                             int hi)
{
    for (int n = lo; n < hi; n++) {
        const int *pn = pos + (size_t)n * k;
        KR_T *o = out + (size_t)n * C;
        for (int c0 = 0; c0 < C; c0 += KR_COMBINE) {
            int w = MIN(KR_COMBINE, C - c0);
            float acc[KR_COMBINE];
            for (int c = 0; c < w; c++) acc[c] = 0.0f;
            for (int j = 0; j < k; j++) {
                if (pn[j] < 0) continue;
                const KR_T *s = src + (size_t)pn[j] * C + c0;
                for (int c = 0; c < w; c++) acc[c] += KR_LD(s[c]);
            }
            for (int c = 0; c < w; c++) o[c0 + c] = KR_ST(acc[c]);
        }
    }
}

/* Rows [lo, hi), columns [c0, c1): y[i] *= s[i]. */
ROW_FN
void KR_FN(row_scale_block)(KR_T *y, const float *s, int C, int lo, int hi, int c0, int c1)
{
    for (int i = lo; i < hi; i++)
        for (int c = c0; c < c1; c++)
            y[(size_t)i * C + c] = KR_ST(KR_LD(y[(size_t)i * C + c]) * s[i]);
}

/* Rows [lo, hi): out[i] = a[i] . b[i], summed in column order. */
ROW_FN
void KR_FN(row_dot_rows)(float *out, const KR_T *a, const KR_T *b, int C, int lo, int hi)
{
    for (int i = lo; i < hi; i++) {
        float s = 0.0f;
        for (int c = 0; c < C; c++)
            s += KR_LD(a[(size_t)i * C + c]) * KR_LD(b[(size_t)i * C + c]);
        out[i] = s;
    }
}

/* Rows [lo, hi), columns [c0, c1): y[i] += s[i] b. */
ROW_FN
void KR_FN(add_scaled_bias_block)(KR_T *y, const float *s, const KR_T *b, int C, int lo, int hi,
                                  int c0, int c1)
{
    for (int i = lo; i < hi; i++)
        for (int c = c0; c < c1; c++)
            y[(size_t)i * C + c] = KR_ST(KR_LD(y[(size_t)i * C + c]) + s[i] * KR_LD(b[c]));
}

/* Columns [c0, c1): db[c] += s[i] dy[i, c] for the rows in order. */
ROW_FN
void KR_FN(scaled_bias_bwd_cols)(float *db, const float *s, const KR_T *dy, int n, int C, int c0,
                                 int c1)
{
    for (int i = 0; i < n; i++)
        for (int c = c0; c < c1; c++) db[c] += s[i] * KR_LD(dy[(size_t)i * C + c]);
}

/* Elements [i0, i1) of out (n) = the sum of the nblocks blocks of 'in', in block order. */
ROW_FN
void KR_FN(sum_blocks_span)(KR_T *out, const KR_T *in, int nblocks, size_t n, size_t i0,
                            size_t i1)
{
    for (size_t i = i0; i < i1; i++) {
        float s = 0.0f;
        for (int m = 0; m < nblocks; m++) s += KR_LD(in[(size_t)m * n + i]);
        out[i] = KR_ST(s);
    }
}

/* -- Llama layer: RMSNorm, rotary embedding, SwiGLU ------------------------------------------- */

/* Rows [lo, hi): rstd = 1/sqrt(mean(x^2) + eps), the squares summed in LANES partial sums (as
** layernorm's); out = x * rstd * w. */
ROW_FN
void KR_FN(rmsnorm_fwd_rows)(KR_T *out, float *rstd, const KR_T *inp, const KR_T *w, int C,
                             float eps, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *x = inp + (size_t)n * C;
        KR_T *o = out + (size_t)n * C;
        float acc[LANES] = { 0.0f };
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += KR_LD(x[i + l]) * KR_LD(x[i + l]);
        float ss = lanes_total(acc);
        for (; i < C; i++) ss += KR_LD(x[i]) * KR_LD(x[i]);
        float s = rms_rstd(ss, C, eps);
        for (i = 0; i < C; i++) o[i] = KR_ST(KR_LD(x[i]) * s * KR_LD(w[i]));
        rstd[n] = s;
    }
}

/* Rows [lo, hi) of the input gradient: dinp += rstd (g - xhat mean(g xhat)), g = dout w. */
ROW_FN
void KR_FN(rmsnorm_bwd_rows)(KR_T *dinp, const KR_T *dout, const KR_T *inp, const KR_T *w,
                             const float *rstd, int C, int lo, int hi)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        KR_T *dx = dinp + (size_t)n * C;
        float rs = rstd[n], acc[LANES] = { 0.0f };
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int l = 0; l < LANES; l++)
                acc[l] += KR_LD(d[i + l]) * KR_LD(w[i + l]) * (KR_LD(x[i + l]) * rs);
        float gx = lanes_total(acc);
        for (; i < C; i++) gx += KR_LD(d[i]) * KR_LD(w[i]) * (KR_LD(x[i]) * rs);
        gx /= (float)C;
        for (i = 0; i < C; i++)
            dx[i] = KR_ST(rms_dinp(KR_LD(dx[i]), KR_LD(d[i]) * KR_LD(w[i]), KR_LD(x[i]) * rs, rs,
                                   gx));
    }
}

/* Columns [i0, i1) of dw += dout * xhat, accumulated over the rows in order. */
ROW_FN
void KR_FN(rmsnorm_bwd_cols)(float *dw, const KR_T *dout, const KR_T *inp, const float *rstd,
                             int N, int C, int i0, int i1)
{
    for (int n = 0; n < N; n++) {
        const KR_T *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        for (int i = i0; i < i1; i++) dw[i] += KR_LD(d[i]) * (KR_LD(x[i]) * rstd[n]);
    }
}

/* Pair i of one head (hd channels at x) rotated by (c, s): x[i], x[i + npair]. */
ROW_FN
void KR_FN(rope_pair)(KR_T *x, int i, int npair, float c, float s)
{
    float x0 = KR_LD(x[i]), x1 = KR_LD(x[i + npair]);
    x[i] = KR_ST(x0 * c - x1 * s);
    x[i + npair] = KR_ST(x1 * c + x0 * s);
}

/* Positions [lo, hi): rows t*B .. t*B + B-1 (of ld elements, H heads of hd) rotated in place
** for position pos0 + t; the angles of ROPE_PAIRS pairs at a time, then every row and head. */
ROW_FN
void KR_FN(rope_rows)(KR_T *x, size_t ld, int B, int H, int hd, int pos0, float theta,
                      int inverse, int lo, int hi)
{
    int npair = hd / 2;
    for (int i0 = 0; i0 < npair; i0 += ROPE_PAIRS) {
        int np = MIN(ROPE_PAIRS, npair - i0);
        double inv[ROPE_PAIRS];
        float c[ROPE_PAIRS], s[ROPE_PAIRS];
        for (int p = 0; p < np; p++) inv[p] = rope_inv(i0 + p, hd, theta);
        for (int t = lo; t < hi; t++) {
            for (int p = 0; p < np; p++) rope_cos_sin(&c[p], &s[p], pos0 + t, inv[p], inverse);
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++) {
                    KR_T *r = x + ((size_t)t * B + b) * ld + (size_t)h * hd + i0;
                    for (int p = 0; p < np; p++) KR_FN(rope_pair)(r, p, npair, c[p], s[p]);
                }
        }
    }
}

/* Rows [lo, hi), columns [c0, c1) of out (N, F) = silu(gate) * up from gu rows [gate | up]. */
ROW_FN
void KR_FN(swiglu_fwd_block)(KR_T *out, const KR_T *gu, int F, int lo, int hi, int c0, int c1)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *g = gu + (size_t)n * 2 * F, *u = g + F;
        KR_T *o = out + (size_t)n * F;
        for (int i = c0; i < c1; i++) {
            float gi = KR_LD(g[i]);
            o[i] = KR_ST(gi * sigmoid1(gi) * KR_LD(u[i]));
        }
    }
}

/* Rows [lo, hi), columns [c0, c1) of dgu [dgate | dup] (written) from dout (N, F), gu. */
ROW_FN
void KR_FN(swiglu_bwd_block)(KR_T *dgu, const KR_T *dout, const KR_T *gu, int F, int lo, int hi,
                             int c0, int c1)
{
    for (int n = lo; n < hi; n++) {
        const KR_T *g = gu + (size_t)n * 2 * F, *u = g + F, *d = dout + (size_t)n * F;
        KR_T *dg = dgu + (size_t)n * 2 * F, *du = dg + F;
        for (int i = c0; i < c1; i++) {
            float gi = KR_LD(g[i]), s = sigmoid1(gi), di = KR_LD(d[i]);
            dg[i] = KR_ST(di * KR_LD(u[i]) * silu1_grad(gi, s));
            du[i] = KR_ST(di * (gi * s));
        }
    }
}

/* -- Attention: tiles in and out of storage ---------------------------------------------------- */

/* Rows [lo, hi) of dsum = rowsum(dout * out) over hd channels (rows of stride ld), in order. */
ROW_FN
void KR_FN(att_dsum_rows)(float *dsum, const KR_T *dout, const KR_T *out, size_t ld, int hd,
                          int lo, int hi)
{
    for (int i = lo; i < hi; i++) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += KR_LD(dout[i * ld + d]) * KR_LD(out[i * ld + d]);
        dsum[i] = s;
    }
}

/*
** An f32 tile of 'rows' rows and 'cols' channels from storage rows of stride ld, times mul;
** rows past nr and channels past hd are zero (padding). trans = 0: dst[r * dld + d];
** trans = 1: transposed, dst[d * dld + r].
*/
ROW_FN
void KR_FN(att_load_tile)(float *dst, int dld, int trans, const KR_T *src, size_t ld, int nr,
                          int rows, int hd, int cols, float mul)
{
    for (int r = 0; r < rows; r++) {
        const KR_T *s = src + (r < nr ? r : 0) * ld;
        int n = r < nr ? hd : 0;
        if (trans) {
            for (int d = 0; d < n; d++) dst[(size_t)d * dld + r] = KR_LD(s[d]) * mul;
            for (int d = n; d < cols; d++) dst[(size_t)d * dld + r] = 0.0f;
        } else {
            float *o = dst + (size_t)r * dld;
            for (int d = 0; d < n; d++) o[d] = KR_LD(s[d]) * mul;
            for (int d = n; d < cols; d++) o[d] = 0.0f;
        }
    }
}

/* nr rows of hd channels of an f32 tile (rows of stride sld) times mul, rounded into storage
** rows of stride ld. */
ROW_FN
void KR_FN(att_store_tile)(KR_T *dst, size_t ld, const float *src, int sld, int nr, int hd,
                           float mul)
{
    for (int r = 0; r < nr; r++)
        for (int d = 0; d < hd; d++) dst[r * ld + d] = KR_ST(src[(size_t)r * sld + d] * mul);
}

#endif /* the typed half */
