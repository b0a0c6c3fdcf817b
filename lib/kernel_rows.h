/*
** kernel_rows.h: the arithmetic of one row (or one column block) of every kernel, shared by
** both backends: kernels_cpu.c runs these functions in loops on the runtime's thread pool,
** kernels_cuda.cu in device threads, so the two compute the same formulas in the same order.
** Not an interface: included only by the two kernel files (each defines nothing else first).
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
** exp(x) for softmax, cross-entropy and GELU, written for the CPU vectoriser (libm's expf is
** one call per element) and used on the device too, so both backends clamp alike: x = k ln2 + r
** with |r| <= ln2/2, exp(r) by its Taylor series to r^7, times 2^k added into the exponent
** bits. Relative error <= 1.1e-7 (2 ulp). x is clamped to [EXP_MIN, EXP_MAX] (exp(-87) =
** 1.6e-38 stands for 0 in the sums that use it; GELU's backward at x < -10 then stays finite);
** NaN stays NaN. Vector and scalar code give the same bits (no FMA contraction under -std=c11),
** so results never depend on how rows are split.
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

/* -- Embedding: vocabulary-parallel tokens, learned positions ---------------------------------- */
/*
** Activations are sequence-major: row t*B + b holds token b of position t. A rank owns the
** vocabulary rows [vstart, vstart + vrows); other token ids give zero rows (the TP all-reduce
** that follows adds the owner's row). Backward sums in token order: deterministic.
*/

/* out[n, :] = wte[tok[n] - vstart, :] if this rank owns tok[n], else 0. */
ROW_FN
void embed_row_fwd(float *out, const float *wte, int tok, int C, int vstart, int vrows)
{
    int v = tok - vstart;
    if (v >= 0 && v < vrows) {
        const float *w = wte + (size_t)v * C;
        for (int i = 0; i < C; i++) out[i] = w[i];
    } else {
        for (int i = 0; i < C; i++) out[i] = 0.0f;
    }
}

/* Columns [i0, i1) of dwte: every owned token's gradient row added in token order. */
ROW_FN
void embed_cols_bwd(float *dwte, const float *dout, const int *tok, int N, int C,
                    int vstart, int vrows, int i0, int i1)
{
    for (int n = 0; n < N; n++) {
        int v = tok[n] - vstart;
        if (v < 0 || v >= vrows) continue;
        float *dw = dwte + (size_t)v * C;
        const float *d = dout + (size_t)n * C;
        for (int i = i0; i < i1; i++) dw[i] += d[i];
    }
}

/* Position t (local) of a (T*B, C) block: rows t*B .. t*B+B-1 get wpe row t0 + t added. */
ROW_FN
void pos_row_fwd(float *out, const float *wpe, int t, int B, int C, int t0)
{
    const float *p = wpe + (size_t)(t0 + t) * C;
    for (int b = 0; b < B; b++) {
        float *o = out + ((size_t)t * B + b) * C;
        for (int i = 0; i < C; i++) o[i] += p[i];
    }
}

ROW_FN
void pos_row_bwd(float *dwpe, const float *dout, int t, int B, int C, int t0)
{
    float *dp = dwpe + (size_t)(t0 + t) * C;
    for (int b = 0; b < B; b++) {
        const float *d = dout + ((size_t)t * B + b) * C;
        for (int i = 0; i < C; i++) dp[i] += d[i];
    }
}

/* -- LayerNorm over rows of a (N, C) matrix ---------------------------------------------------- */
/*
** Statistics in f32 with a two-pass mean/variance; backward accumulates into dinp, dw, db
** (the residual stream and micro-batch accumulation both add). Every output element is summed
** in a fixed order.
*/

/* One row: out = (inp - mean) * rstd * w + b; returns mean and rstd for the backward. */
ROW_FN
void layernorm_row_fwd(float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int C, float eps)
{
    float acc[LANES] = { 0.0f };
    int i = 0;
    for (; i + LANES <= C; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += inp[i + l];
    float m = lanes_total(acc);
    for (; i < C; i++) m += inp[i];
    m /= (float)C;
    for (int l = 0; l < LANES; l++) acc[l] = 0.0f;
    for (i = 0; i + LANES <= C; i += LANES)
        for (int l = 0; l < LANES; l++) {
            float d = inp[i + l] - m;
            acc[l] += d * d;
        }
    float v = lanes_total(acc);
    for (; i < C; i++) {
        float d = inp[i] - m;
        v += d * d;
    }
    v /= (float)C;
    float s = 1.0f / sqrtf(v + eps);
    for (i = 0; i < C; i++) out[i] = (inp[i] - m) * s * w[i] + b[i];
    *mean = m;
    *rstd = s;
}

/* One row of the input gradient: dinp += rstd * (dn - mean(dn) - xhat * mean(dn * xhat)),
** with dn = dout * w and xhat the normalised input. */
ROW_FN
void layernorm_row_bwd(float *dinp, const float *dout, const float *inp,
                       const float *w, float mean, float rstd, int C)
{
    float acc_dn[LANES] = { 0.0f }, acc_dnx[LANES] = { 0.0f };
    int i = 0;
    for (; i + LANES <= C; i += LANES)
        for (int l = 0; l < LANES; l++) {
            float xhat = (inp[i + l] - mean) * rstd;
            float dn = dout[i + l] * w[i + l];
            acc_dn[l] += dn;
            acc_dnx[l] += dn * xhat;
        }
    float dn_mean = lanes_total(acc_dn), dn_xhat_mean = lanes_total(acc_dnx);
    for (; i < C; i++) {
        float xhat = (inp[i] - mean) * rstd;
        float dn = dout[i] * w[i];
        dn_mean += dn;
        dn_xhat_mean += dn * xhat;
    }
    dn_mean /= (float)C;
    dn_xhat_mean /= (float)C;
    for (i = 0; i < C; i++) {
        float xhat = (inp[i] - mean) * rstd;
        float dn = dout[i] * w[i];
        dinp[i] += rstd * (dn - dn_mean - xhat * dn_xhat_mean);
    }
}

/* Columns [i0, i1) of the parameter gradients, accumulated over the rows in order. */
ROW_FN
void layernorm_cols_bwd(float *dw, float *db, const float *dout, const float *inp,
                        const float *mean, const float *rstd, int N, int C,
                        int i0, int i1)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        for (int i = i0; i < i1; i++) {
            dw[i] += d[i] * ((x[i] - mean[n]) * rstd[n]);
            db[i] += d[i];
        }
    }
}

/* -- GELU (tanh approximation), bias, residual adds -------------------------------------------- */
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
** 1 - t^2 = 4 s (1 - s) = 4 s^2 e, so the derivative is s + 2 x s^2 e du. */
ROW_FN
float gelu1_grad(float x)
{
    float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
    float e = vexpf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
    return s + 2.0f * x * s * s * e * du;
}

/* Columns [i0, i1) of a bias gradient: column sums of dout over the rows, in row order. */
ROW_FN
void bias_cols_bwd(float *dbias, const float *dout, int N, int OC, int i0, int i1)
{
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * OC;
        for (int i = i0; i < i1; i++) dbias[i] += d[i];
    }
}

/* -- Causal multi-head self-attention over the local heads ------------------------------------- */
/*
** qkv rows are tokens in sequence-major order (row t*B + b), each [q | k | v] with Hl heads of
** hd channels. Scores are scaled by 1/sqrt(hd) in the GEMM (Megatron's baddbmm alpha), then a
** causal softmax; att (B, Hl, T, T) keeps the probabilities (zeros above the diagonal).
*/

/* Row t of a (T, T) score block, in place: causal softmax over columns 0..t. */
ROW_FN
void softmax_row_fwd(float *row, int t, int T)
{
    int n = t + 1, j;
    float acc[LANES];
    for (int l = 0; l < LANES; l++) acc[l] = row[0];
    for (j = 0; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = row[j + l] > acc[l] ? row[j + l] : acc[l];
    float mx = acc[0];
    for (int l = 1; l < LANES; l++) mx = acc[l] > mx ? acc[l] : mx;
    for (; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    for (int l = 0; l < LANES; l++) acc[l] = 0.0f;
    for (j = 0; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) {
            row[j + l] = vexpf(row[j + l] - mx);
            acc[l] += row[j + l];
        }
    float sum = lanes_total(acc);
    for (; j < n; j++) {
        row[j] = vexpf(row[j] - mx);
        sum += row[j];
    }
    float inv = 1.0f / sum;
    for (j = 0; j < n; j++) row[j] *= inv;
    for (j = n; j < T; j++) row[j] = 0.0f;
}

/* Row t: ds = p * (dp - sum_j p_j dp_j), written over dp. */
ROW_FN
void softmax_row_bwd(float *dp, const float *p, int t, int T)
{
    int n = t + 1, j;
    float acc[LANES] = { 0.0f };
    for (j = 0; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += p[j + l] * dp[j + l];
    float dot = lanes_total(acc);
    for (; j < n; j++) dot += p[j] * dp[j];
    for (j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - dot);
    for (j = n; j < T; j++) dp[j] = 0.0f;
}

/* -- Vocabulary-parallel cross-entropy (docs/megatron.md §4.5) --------------------------------- */
/*
** logits (N, Vl) hold this rank's vocabulary columns [vstart, vstart + valid); columns past
** 'valid' are padding and never count. The caller reduces between the pieces: all-reduce MAX
** of the row maxima, then all-reduce SUM of [sum exp | target logit].
*/

ROW_FN
void ce_row_max(float *mx, const float *row, int valid)
{
    float acc[LANES], m = -INFINITY;
    int j = 0;
    for (int l = 0; l < LANES; l++) acc[l] = -INFINITY;
    for (; j + LANES <= valid; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = row[j + l] > acc[l] ? row[j + l] : acc[l];
    for (int l = 0; l < LANES; l++) m = acc[l] > m ? acc[l] : m;
    for (; j < valid; j++) m = row[j] > m ? row[j] : m;
    *mx = m;
}

/* sums[n] = sum_j exp(logit - max), sums[N + n] = the target's logit if this rank owns it. */
ROW_FN
void ce_row_sums(float *sumexp, float *target_logit, const float *row, float mx,
                 int target, int valid, int vstart)
{
    float acc[LANES] = { 0.0f };
    int j = 0;
    for (; j + LANES <= valid; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += vexpf(row[j + l] - mx);
    float s = lanes_total(acc);
    for (; j < valid; j++) s += vexpf(row[j] - mx);
    *sumexp = s;
    int t = target - vstart;
    *target_logit = (t >= 0 && t < valid) ? row[t] : 0.0f;
}

/* dlogits = (softmax - onehot(target)) * dloss, over this rank's columns; padding gets 0. */
ROW_FN
void ce_row_bwd(float *row, float mx, float sumexp, int target, int Vl, int valid,
                int vstart, float dloss)
{
    float inv = 1.0f / sumexp;
    int t = target - vstart;
    for (int j = 0; j < valid; j++) {
        float p = vexpf(row[j] - mx) * inv;
        row[j] = (p - (j == t ? 1.0f : 0.0f)) * dloss;
    }
    for (int j = valid; j < Vl; j++) row[j] = 0.0f;
}

/* -- AdamW (torch.optim.AdamW), gradient-norm pieces, scaling ---------------------------------- */
/*
** torch's order: p *= 1 - lr*wd; m, v updated; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),
** with g = grad * gscale (the clipping coefficient, 1 when not clipping).
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

/* -- Mixture of experts: routing and row movements --------------------------------------------- */
/*
** Top-k with ties to the lower expert, its probabilities, the softmax over all experts for the
** aux loss, and its backward; the row movements between token and expert order are gathers
** (no scatter, no atomics): deterministic.
*/

ROW_FN void route_row(int *sel, float *prob, float *score, const float *logit, int E, int k,
                        int pre_softmax)
{
    float mx = logit[0], sum = 0.0f;
    for (int e = 1; e < E; e++) mx = logit[e] > mx ? logit[e] : mx;
    for (int e = 0; e < E; e++) {
        score[e] = vexpf(logit[e] - mx);
        sum += score[e];
    }
    for (int e = 0; e < E; e++) score[e] /= sum;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || logit[e] > logit[best])) best = e;
        }
        sel[j] = best;
    }
    if (pre_softmax) {
        for (int j = 0; j < k; j++) prob[j] = score[sel[j]];
        return;
    }
    float m = logit[sel[0]], s = 0.0f;      /* sel[0] holds the largest logit */
    for (int j = 0; j < k; j++) {
        prob[j] = vexpf(logit[sel[j]] - m);
        s += prob[j];
    }
    for (int j = 0; j < k; j++) prob[j] /= s;
}

ROW_FN void route_row_bwd(float *dlogit, const float *dprob, const float *prob,
                            const float *score, const int *sel, const float *auxg, int E, int k,
                            int pre_softmax)
{
    /* through the softmax over all experts: ds = auxg (+ dprob at the selected experts when
    ** the probabilities are scores), dz = s * (ds - sum(s * ds)) */
    float dot = 0.0f;
    for (int e = 0; e < E; e++) {
        float ds = auxg[e];
        if (pre_softmax)
            for (int j = 0; j < k; j++) ds += sel[j] == e ? dprob[j] : 0.0f;
        dlogit[e] = ds;
        dot += score[e] * ds;
    }
    for (int e = 0; e < E; e++) dlogit[e] = score[e] * (dlogit[e] - dot);
    if (pre_softmax) return;
    /* through the softmax over the selected logits */
    float pd = 0.0f;
    for (int j = 0; j < k; j++) pd += prob[j] * dprob[j];
    for (int j = 0; j < k; j++) dlogit[sel[j]] += prob[j] * (dprob[j] - pd);
}

/* Row i of out: the k rows of src at pos[t*k + j] summed in j order (pos < 0: dropped). */
ROW_FN void combine_row(float *out, const float *src, const int *pos, int k, int C)
{
    for (int c = 0; c < C; c++) out[c] = 0.0f;
    for (int j = 0; j < k; j++) {
        if (pos[j] < 0) continue;
        const float *s = src + (size_t)pos[j] * C;
        for (int c = 0; c < C; c++) out[c] += s[c];
    }
}

#endif
