/*
** moe.c: the mixture-of-experts block's steps between its collectives (ops.h; docs/megatron.md
** §8; the exact semantics are in tests/ref/README.md "Mixture of experts"): the router, top-k
** and aux loss; the dispatch order under the capacity; the counts and displacements of the
** all-to-alls the generated code runs over ep and expt-tp, planned from the routing; the experts
** (GELU, or Mixtral's SwiGLU) on the rows they hold; the combine; and their backward. Nothing
** here communicates. Called by the generated stage code (gen/lua/layer.lua).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stage.h"

#define ACT (gpt.d.act)
#define MS(id) (lib.mem[GPT_M_MS_##id])     /* the stage's MoE buffers */
#define ML(id) (m->a[GPT_M_ML_##id])        /* the layer's, in this activation slot */

static int *hialloc(size_t n)
{
    int *p = calloc(n ? n : 1, sizeof(int));
    RT_CHECK(p, "out of memory");
    return p;
}

/* -- The all-to-alls' counts ---------------------------------------------------------------- */

/* Element counts and displacements of 'n' blocks of rows[i] rows of width w. */
static void layout(size_t *cnt, size_t *dsp, const int *rows, int n, int w)
{
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        cnt[i] = (size_t)rows[i] * w;
        dsp[i] = at;
        at += cnt[i];
    }
}

/* Exchange k: send srows[i] rows of width w to member i, receive rrows[i] from it. */
static void plan(gpt_moe *m, gpt_a2a_kind k, const int *srows, const int *rrows, int n, int w)
{
    gpt_a2a *x = &m->a2a[k];
    layout((size_t *)x->scounts, (size_t *)x->sdispls, srows, n, w);
    layout((size_t *)x->rcounts, (size_t *)x->rdispls, rrows, n, w);
}

/* Exchange k over expt-tp as a gather: the same 'mine' rows to every member, rows[i] from it. */
static void plan_gather(gpt_moe *m, gpt_a2a_kind k, int mine, const int *rows, int w)
{
    gpt_a2a *x = &m->a2a[k];
    for (int i = 0; i < gpt.d.etp; i++) {
        ((size_t *)x->scounts)[i] = (size_t)mine * w;
        ((size_t *)x->sdispls)[i] = 0;
    }
    layout((size_t *)x->rcounts, (size_t *)x->rdispls, rows, gpt.d.etp, w);
}

/* Exchange k over expt-tp as a reduce-scatter: member i's rows[i] rows (member-major) to it;
** this rank's rows from every member. */
static void plan_scatter(gpt_moe *m, gpt_a2a_kind k, const int *rows, int w)
{
    int ETP = gpt.d.etp, each[ETP];
    for (int i = 0; i < ETP; i++) each[i] = rows[gpt.etp_rank];
    plan(m, k, rows, each, ETP, w);
}

/*
** A layer's routing state in one slot: its host arrays, and the counts of the exchange of the
** rows per (peer, local expert), which are fixed (EXPERTS_LOCAL to and from every ep peer).
*/
void lib_moe_init(gpt_moe *m, void *const *a, lib_layer *layer)
{
    const gpt_dims *d = &gpt.d;
    int NSP = d->n_sp, K = d->topk, EP = d->ep, ETP = d->etp, NL = d->experts_local;
    int P = EP > ETP ? EP : ETP;
    m->a = a;
    m->layer = layer;
    m->local = hialloc((size_t)d->aux_seqs * d->experts);
    m->sel_h = hialloc((size_t)NSP * K);
    m->pos_h = hialloc((size_t)NSP * K);
    m->sendmat = hialloc((size_t)EP * NL);
    m->recvmat = hialloc((size_t)EP * NL);
    m->gmat = hialloc((size_t)ETP * EP * NL);
    m->sendrows = hialloc((size_t)EP);
    m->recvrows = hialloc((size_t)EP);
    m->memrows = hialloc((size_t)ETP);
    m->erows = hialloc((size_t)NL);
    m->counts = calloc((size_t)GPT_NA2AS * 4 * P, sizeof(size_t));
    RT_CHECK(m->counts, "out of memory");
    for (int k = 0; k < GPT_NA2AS; k++) {
        size_t *c = m->counts + (size_t)k * 4 * P;
        m->a2a[k] = (gpt_a2a){ c, c + P, c + 2 * P, c + 3 * P };
    }
    int each[EP];
    for (int q = 0; q < EP; q++) each[q] = NL;
    plan(m, GPT_A2A_EP_COUNTS, each, each, EP, 1);
}

const gpt_a2a *gpt_moe_a2a(const gpt_moe *m, gpt_a2a_kind which)
{
    RT_CHECK(which >= 0 && which < GPT_NA2AS, "gpt_moe_a2a: no exchange %d", (int)which);
    return &m->a2a[which];
}

/* -- The capacity ----------------------------------------------------------------------------- */

typedef struct {
    float p;                  /* the choice's probability */
    int i;                    /* its index token*K + choice: the row order */
} lib_choice;

/* Higher probability first, then the earlier row. */
static int by_prob(const void *a, const void *b)
{
    const lib_choice *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/*
** keep[i] = 1 for the choices i (of n = N_SP*K; sel, prob on the host) this rank keeps: each
** expert keeps at most d->capacity of its choices here (Megatron's apply_router_token_dropping
** on the router's own tokens), those of the highest probabilities (ties: the earlier row)
** with d->drop_probs, else the earliest rows.
*/
static void keep_choices(int *keep, const int *sel, const float *prob, int n)
{
    const int E = gpt.d.experts, cap = gpt.d.capacity;
    for (int i = 0; i < n; i++) keep[i] = 1;
    if (cap >= n) return;
    lib_choice *c = malloc((size_t)n * sizeof *c);
    RT_CHECK(c, "out of memory");
    for (int e = 0; e < E; e++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (sel[i] == e) c[m++] = (lib_choice){ prob[i], i };
        if (m <= cap) continue;
        if (gpt.d.drop_probs) qsort(c, (size_t)m, sizeof *c, by_prob);
        for (int j = cap; j < m; j++) keep[c[j].i] = 0;
    }
    free(c);
}


/* -- Mixtral's experts (llama) ---------------------------------------------------------------- */

/*
** Expert l on its r rows from row 'off': y = (prob * silu(x . w1^T) * (x . w3^T)) . w2^T, the
** weights [out, in] (w1, w3 (EFF_LOCAL, C) column-parallel over expt-tp, w2 (C, EFF_LOCAL)
** row-parallel); fc keeps [x . w1^T | x . w3^T] (r, 2 EFF_LOCAL), h the SwiGLU output.
*/
static void swiglu_expert_fwd(void *const *w, const gpt_moe *m, int l, int off, int r)
{
    const int C = gpt.d.C, EFF = gpt.d.eff_local;
    rt_dtype t = gpt.d.act;
    const void *w1 = w[LIB_FIELD(GPT_P_EXPERT_FC_W, l)], *w3 = w[LIB_FIELD(GPT_P_EXPERT_UP_W, l)];
    const void *w2 = w[LIB_FIELD(GPT_P_EXPERT_PROJ_W, l)];
    void *fc = lib_at(ML(FC), (size_t)off * 2 * EFF), *h = lib_at(ML(H), (size_t)off * EFF);
    void *act = lib_at(MS(ACT), (size_t)off * EFF), *y = lib_at(MS(YE), (size_t)off * C);
    const void *xe = lib_at(ML(XE), (size_t)off * C);
    rt_gemm(0, 1, r, EFF, C, 1.0f, xe, C, 0, w1, C, 0, 0.0f, fc, 2 * EFF, 0, 1, t, t);
    rt_gemm(0, 1, r, EFF, C, 1.0f, xe, C, 0, w3, C, 0, 0.0f, lib_at(fc, (size_t)EFF), 2 * EFF, 0,
            1, t, t);
    swiglu_fwd(h, fc, r, EFF, t);
    rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
    row_scale(act, (const float *)ML(PE) + off, r, EFF, t);
    rt_gemm(0, 1, r, C, EFF, 1.0f, act, EFF, 0, w2, EFF, 0, 0.0f, y, C, 0, 1, t, t);
}

/* Its backward: MS_YE holds d(y) of the rows; d(x) partials go to MS_XG, d(prob) partials to
** MS_DPE (summed over expt-tp by the generated code); weight gradients accumulate into dw. */
static void swiglu_expert_bwd(void *const *w, float *const *dw, const gpt_moe *m, int l,
                              int off, int r)
{
    const int C = gpt.d.C, EFF = gpt.d.eff_local;
    rt_dtype t = gpt.d.act;
    const void *w1 = w[LIB_FIELD(GPT_P_EXPERT_FC_W, l)], *w3 = w[LIB_FIELD(GPT_P_EXPERT_UP_W, l)];
    const void *w2 = w[LIB_FIELD(GPT_P_EXPERT_PROJ_W, l)];
    float *dw1 = dw[LIB_FIELD(GPT_P_EXPERT_FC_W, l)], *dw3 = dw[LIB_FIELD(GPT_P_EXPERT_UP_W, l)];
    float *dw2 = dw[LIB_FIELD(GPT_P_EXPERT_PROJ_W, l)];
    const void *fc = lib_at(ML(FC), (size_t)off * 2 * EFF);
    const void *h = lib_at(ML(H), (size_t)off * EFF);
    const void *xe = lib_at(ML(XE), (size_t)off * C), *dy = lib_at(MS(YE), (size_t)off * C);
    const float *pe = (const float *)ML(PE) + off;
    void *act = lib_at(MS(ACT), (size_t)off * EFF), *dfc = lib_at(MS(DFC), (size_t)off * 2 * EFF);
    void *dxe = lib_at(MS(XG), (size_t)off * C);
    rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
    row_scale(act, pe, r, EFF, t);                                        /* act = prob * h */
    rt_gemm(1, 0, C, EFF, r, 1.0f, dy, C, 0, act, EFF, 0, 1.0f, dw2, EFF, 0, 1, t, RT_F32);
    rt_gemm(0, 0, r, EFF, C, 1.0f, dy, C, 0, w2, EFF, 0, 0.0f, act, EFF, 0, 1, t,
            t);                                                           /* act := d(act) */
    row_dot((float *)MS(DPE) + off, act, h, r, EFF, t);                   /* d(prob), partial */
    row_scale(act, pe, r, EFF, t);                                        /* d(h) */
    swiglu_bwd(dfc, act, fc, r, EFF, t);                                  /* d(w1 x | w3 x) */
    rt_gemm(1, 0, EFF, C, r, 1.0f, dfc, 2 * EFF, 0, xe, C, 0, 1.0f, dw1, C, 0, 1, t, RT_F32);
    rt_gemm(1, 0, EFF, C, r, 1.0f, lib_at(dfc, (size_t)EFF), 2 * EFF, 0, xe, C, 0, 1.0f, dw3, C,
            0, 1, t, RT_F32);
    rt_gemm(0, 0, r, C, EFF, 1.0f, dfc, 2 * EFF, 0, w1, C, 0, 0.0f, dxe, C, 0, 1, t, t);
    rt_gemm(0, 0, r, C, EFF, 1.0f, lib_at(dfc, (size_t)EFF), 2 * EFF, 0, w3, C, 0, 1.0f, dxe, C,
            0, 1, t, t);                                                  /* d(x), partial */
}

/* -- Forward ---------------------------------------------------------------------------------- */

/*
** Router: logits = x . router_w^T (+ router_b, with biases; kept in f32), then top-k and
** probabilities (ties: the lower expert). The aux loss's counts: tokens per expert (before
** dropping) of each of its token sets (the micro-batch, or with seq_aux_loss each sequence: row
** n is sequence n % B's).
*/
void moe_router_fwd(gpt_moe *m, void *const *w, const void *x, int *counts)
{
    const gpt_dims *d = &gpt.d;
    const int NSP = d->n_sp, E = d->experts, K = d->topk, C = d->C;
    float *logits = MS(LOGITS), *colsum = MS(COLSUM);
    rt_gemm(0, 1, NSP, E, C, 1.0f, x, C, 0, w[GPT_P_ROUTER_W], C, 0, 0.0f, logits, E, 0, 1,
            ACT, RT_F32);
    if (w[GPT_P_ROUTER_B]) {    /* the bias in f32 (MS_COLSUM is free until the aux loss) */
        convert(colsum, RT_F32, w[GPT_P_ROUTER_B], ACT, (size_t)E);
        bias_fwd(logits, colsum, NSP, E, RT_F32);
    }
    const float *ebias = NULL;  /* expert bias: staged in MS_COLSUM (free again) */
    if (m->layer->ebias) {
        rt_memcpy(colsum, m->layer->ebias, (size_t)E * sizeof(float), RT_H2D);
        ebias = colsum;
    }
    moe_route(ML(SEL), ML(PROB), ML(SCORES), ML(SSUM), logits, NSP, E, K, d->pre_softmax,
              d->topk_scale, d->groups, d->group_topk, ebias);
    rt_memcpy(m->sel_h, ML(SEL), (size_t)NSP * K * sizeof(int), RT_D2H);

    const int S = d->aux_seqs, SE = S * E;
    int *local = m->local;
    memset(local, 0, (size_t)SE * sizeof(int));
    if ((d->groups > 1 || ebias) && d->aux_scale != 0.0f) {
        /* group-limited routing or an expert bias: the aux loss counts the plain top-k of the
        ** logits, without the group limit and the bias (Megatron's
        ** compute_routing_scores_for_aux_loss; docs/megatron.md §8.1), ties to the lower
        ** expert. Without either, that is the routing itself (and without an aux loss the
        ** counts are multiplied by 0). */
        float *lg = malloc((size_t)NSP * E * sizeof(float));
        RT_CHECK(lg, "out of memory");
        rt_memcpy(lg, logits, (size_t)NSP * E * sizeof(float), RT_D2H);
        for (int n = 0; n < NSP; n++) {
            const float *z = lg + (size_t)n * E;
            for (int e = 0; e < E; e++) {
                int rank = 0;            /* experts ahead of e */
                for (int f = 0; f < E && rank < K; f++)
                    rank += z[f] > z[e] || (z[f] == z[e] && f < e);
                if (rank < K) local[n % S * E + e]++;
            }
        }
        free(lg);
    } else {
        for (int i = 0; i < NSP * K; i++) local[(i / K) % S * E + m->sel_h[i]]++;
    }
    rt_memcpy(counts, local, (size_t)SE * sizeof(int), RT_H2D);
}

/*
** The aux loss: AUX_SCALE * sum over (set, e) of (the set's sum of score[e]) * total[set, e],
** total the counts of the tp-cp group (every sequence shard of the micro-batch); its gradient
** with respect to score[n, e] is AUX_SCALE * total[n's set, e], times AUX_GRAD (the objective's
** share: 1/NMB, CP/NMB under CP). Rows of S sets are the scores seen as (NSP/S, S*E). Then the
** z-loss (Megatron's z_loss_func): Z_SCALE * sum over this rank's tokens of lse^2, lse = the
** logsumexp of the token's logits; d/d(lse) = 2 Z_SCALE lse, times AUX_GRAD. Returns both.
*/
static double aux_loss(gpt_moe *m, const int *counts)
{
    const gpt_dims *d = &gpt.d;
    const int NSP = d->n_sp, E = d->experts, S = d->aux_seqs, SE = S * E;
    int G = gpt.prog->tp * d->cp, total[SE];
    if (G > 1) {
        int *all = malloc((size_t)G * SE * sizeof(int));
        RT_CHECK(all, "out of memory");
        rt_memcpy(all, counts + SE, (size_t)G * SE * sizeof(int), RT_D2H);
        for (int e = 0; e < SE; e++) {
            total[e] = 0;
            for (int t = 0; t < G; t++) total[e] += all[t * SE + e];
        }
        free(all);
    } else {
        memcpy(total, m->local, sizeof total);
    }
    float g[SE], colsum[SE];
    rt_memset0(MS(COLSUM), (size_t)SE * sizeof(float));
    bias_bwd(MS(COLSUM), ML(SCORES), NSP / S, SE, RT_F32);
    rt_memcpy(colsum, MS(COLSUM), sizeof colsum, RT_D2H);
    double layer_aux = 0.0;
    for (int e = 0; e < SE; e++) {
        layer_aux += (double)d->aux_scale * colsum[e] * total[e];
        g[e] = d->aux_scale * (float)total[e] * d->aux_grad;
    }
    rt_memcpy(ML(AUXG), g, sizeof g, RT_H2D);
    if (ML(ZG)) {
        float *lg = malloc((size_t)NSP * E * sizeof(float));
        float *zg = malloc((size_t)NSP * sizeof(float));
        RT_CHECK(lg && zg, "out of memory");
        rt_memcpy(lg, MS(LOGITS), (size_t)NSP * E * sizeof(float), RT_D2H);
        for (int n = 0; n < NSP; n++) {
            const float *z = lg + (size_t)n * E;
            double mx = z[0], sum = 0.0;
            for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < E; e++) sum += exp(z[e] - mx);
            double lse = mx + log(sum);
            layer_aux += (double)d->z_scale * lse * lse;
            zg[n] = (float)(2.0 * d->z_scale * lse * d->aux_grad);
        }
        rt_memcpy(ML(ZG), zg, (size_t)NSP * sizeof(float), RT_H2D);
        free(lg);
        free(zg);
    }
    return layer_aux;
}

/*
** The dispatch order: the kept choices (keep_choices: the capacity), expert-major, tokens in row
** order; with padding, each expert's rows topped up to PAD_ROWS with the earliest tokens that did
** not choose it, at probability 0 (they add nothing and get no gradient).
*/
void moe_dispatch(gpt_moe *m, void *const *w, const void *x, int *counts, int again)
{
    const gpt_dims *d = &gpt.d;
    const int NSP = d->n_sp, E = d->experts, K = d->topk, C = d->C, EP = d->ep, ETP = d->etp;
    const int NL = d->experts_local;
    (void)w;
    double aux = aux_loss(m, counts);
    if (!again) gpt.moe_aux += aux;     /* a recomputed forward does not count it again */

    int *sendmat = m->sendmat;
    memset(sendmat, 0, (size_t)EP * NL * sizeof(int));
    int *send_tok = hialloc((size_t)d->moe_send_max), *keep = hialloc((size_t)NSP * K);
    int *chose = hialloc((size_t)NSP);
    float *prob_h = malloc((size_t)(NSP * K + d->moe_send_max) * sizeof(float));
    RT_CHECK(prob_h, "out of memory");
    float *send_prob = prob_h + (size_t)NSP * K;
    rt_memcpy(prob_h, ML(PROB), (size_t)NSP * K * sizeof(float), RT_D2H);
    keep_choices(keep, m->sel_h, prob_h, NSP * K);
    int nsend = 0;
    for (int e = 0; e < E; e++) {
        for (int n = 0; n < NSP; n++) {
            chose[n] = 0;
            for (int j = 0; j < K; j++) {
                int i = n * K + j;
                if (m->sel_h[i] != e) continue;
                chose[n] = 1;
                if (!keep[i]) {                /* beyond the capacity */
                    m->pos_h[i] = -1;
                    continue;
                }
                m->pos_h[i] = nsend;
                send_tok[nsend] = n;
                send_prob[nsend] = prob_h[i];
                sendmat[e]++;                  /* [peer][local expert] = expert index */
                nsend++;
            }
        }
        for (int n = 0; n < NSP && sendmat[e] < d->pad_rows; n++) {
            if (chose[n]) continue;
            send_tok[nsend] = n;
            send_prob[nsend] = 0.0f;
            sendmat[e]++;
            nsend++;
        }
    }
    m->nsend = nsend;
    /* the expert bias's token counts (Megatron counts its routing map after dropping, and
    ** padded: exactly the rows sent); a recomputed forward does not count again */
    if (m->layer->ecount && !again)
        for (int e = 0; e < E; e++) m->layer->ecount[e] += sendmat[e];
    rt_memcpy(ML(POS), m->pos_h, (size_t)NSP * K * sizeof(int), RT_H2D);
    rt_memcpy(ML(SEND_TOK), send_tok, (size_t)nsend * sizeof(int), RT_H2D);
    rt_memcpy(MS(PS), send_prob, (size_t)nsend * sizeof(float), RT_H2D);
    gather_rows(MS(XS), x, ML(SEND_TOK), nsend, C, ACT);
    free(send_tok);
    free(keep);
    free(chose);
    free(prob_h);
    for (int q = 0; q < EP; q++) {
        m->sendrows[q] = 0;
        for (int l = 0; l < NL; l++) m->sendrows[q] += sendmat[q * NL + l];
    }
    if (EP == 1) {              /* one EP rank: every expert is here */
        m->recvrows[0] = nsend;
        memcpy(m->recvmat, sendmat, (size_t)NL * sizeof(int));
    }
    if (EP > 1 || ETP > 1)      /* for the exchange over ep, or the gather over expt-tp */
        rt_memcpy(counts, sendmat, (size_t)EP * NL * sizeof(int), RT_H2D);
}

void moe_recv_plan(gpt_moe *m, int *counts)
{
    const int EP = gpt.d.ep, NL = gpt.d.experts_local, C = gpt.d.C;
    rt_memcpy(m->recvmat, counts + EP * NL, (size_t)EP * NL * sizeof(int), RT_D2H);
    for (int q = 0; q < EP; q++) {
        m->recvrows[q] = 0;
        for (int l = 0; l < NL; l++) m->recvrows[q] += m->recvmat[q * NL + l];
    }
    plan(m, GPT_A2A_EP_ROWS, m->sendrows, m->recvrows, EP, C);
    plan(m, GPT_A2A_EP_PROBS, m->sendrows, m->recvrows, EP, 1);
    plan(m, GPT_A2A_EP_BACK, m->recvrows, m->sendrows, EP, C);
    plan(m, GPT_A2A_EP_BACK_PROBS, m->recvrows, m->sendrows, EP, 1);
    if (gpt.d.etp > 1)
        rt_memcpy(counts, m->recvmat, (size_t)EP * NL * sizeof(int), RT_H2D);
}

/* The rows this rank received over ep. */
static int received(const gpt_moe *m)
{
    int n = 0;
    for (int q = 0; q < gpt.d.ep; q++) n += m->recvrows[q];
    return n;
}

void moe_member_plan(gpt_moe *m, int *counts)
{
    const int EP = gpt.d.ep, ETP = gpt.d.etp, NL = gpt.d.experts_local, C = gpt.d.C;
    rt_memcpy(m->gmat, counts + EP * NL, (size_t)ETP * EP * NL * sizeof(int), RT_D2H);
    for (int i = 0; i < ETP; i++) {
        m->memrows[i] = 0;
        for (int k = 0; k < EP * NL; k++) m->memrows[i] += m->gmat[i * EP * NL + k];
    }
    int mine = received(m);
    plan_gather(m, GPT_A2A_ETP_ROWS, mine, m->memrows, C);
    plan_gather(m, GPT_A2A_ETP_PROBS, mine, m->memrows, 1);
    plan_scatter(m, GPT_A2A_ETP_SUM, m->memrows, C);
    plan_scatter(m, GPT_A2A_ETP_SUM_PROBS, m->memrows, 1);
}

/*
** The experts on every row they hold, expert-major (local expert, then member, then source
** peer): y = (prob * gelu(x . c_fc + b_fc)) . c_proj + prob * b_proj, or Mixtral's SwiGLU;
** the outputs back in member-major order in MS_YG.
*/
void moe_experts_fwd(gpt_moe *m, void *const *w, const void *xg, const float *pg)
{
    const gpt_dims *d = &gpt.d;
    const int C = d->C, EP = d->ep, ETP = d->etp, NL = d->experts_local, EFF = d->eff_local;
    const int *gmat = m->gmat;
    if (ETP == 1) {             /* no expert-tp group: this rank's own received rows */
        m->memrows[0] = received(m);
        gmat = m->recvmat;
    }
    int *order = hialloc((size_t)d->moe_rows_max), *unorder = hialloc((size_t)d->moe_rows_max);
    int block_at[ETP * EP * NL], at = 0, nrows = 0;
    for (int b = 0; b < ETP * EP * NL; b++) {
        block_at[b] = at;
        at += gmat[b];
    }
    for (int l = 0; l < NL; l++) {
        m->erows[l] = 0;
        for (int i = 0; i < ETP; i++)
            for (int q = 0; q < EP; q++) {
                int b = (i * EP + q) * NL + l;
                for (int r = 0; r < gmat[b]; r++) {
                    order[nrows] = block_at[b] + r;
                    unorder[block_at[b] + r] = nrows;
                    nrows++;
                }
                m->erows[l] += gmat[b];
            }
    }
    m->nrows = nrows;
    rt_memcpy(ML(ORDER), order, (size_t)nrows * sizeof(int), RT_H2D);
    rt_memcpy(ML(UNORDER), unorder, (size_t)nrows * sizeof(int), RT_H2D);
    free(order);
    free(unorder);
    gather_rows(ML(XE), xg, ML(ORDER), nrows, C, ACT);
    gather_rows(ML(PE), pg, ML(ORDER), nrows, 1, RT_F32);

    for (int l = 0, off = 0; l < NL; off += m->erows[l], l++) {
        int r = m->erows[l];
        if (r == 0) continue;
        if (d->llama) {
            swiglu_expert_fwd(w, m, l, off, r);
            continue;
        }
        const float *pe = (const float *)ML(PE) + off;
        void *fc = lib_at(ML(FC), (size_t)off * EFF), *h = lib_at(ML(H), (size_t)off * EFF);
        void *act = lib_at(MS(ACT), (size_t)off * EFF), *y = lib_at(MS(YE), (size_t)off * C);
        matmul_gelu_fwd(fc, h, lib_at(ML(XE), (size_t)off * C), w[LIB_FIELD(GPT_P_EXPERT_FC_W, l)],
                        d->bias ? w[LIB_FIELD(GPT_P_EXPERT_FC_B, l)] : NULL, r, C, EFF, ACT);
        rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
        row_scale(act, pe, r, EFF, ACT);
        rt_gemm(0, 0, r, C, EFF, 1.0f, act, EFF, 0, w[LIB_FIELD(GPT_P_EXPERT_PROJ_W, l)], C, 0,
                0.0f, y, C, 0, 1, ACT, ACT);
        if (d->bias) add_scaled_bias(y, pe, w[LIB_FIELD(GPT_P_EXPERT_PROJ_B, l)], r, C, ACT);
    }
    gather_rows(MS(YG), MS(YE), ML(UNORDER), nrows, C, ACT);
}

void moe_sum_members(gpt_moe *m, void *out, const void *blocks, int width, rt_dtype t)
{
    sum_blocks(out, blocks, gpt.d.etp, (size_t)m->memrows[gpt.etp_rank] * width, t);
}

void moe_combine(gpt_moe *m, void *out, const void *src)
{
    combine_rows(out, src, ML(POS), gpt.d.n_sp, gpt.d.topk, gpt.d.C, ACT);
}

/* -- Backward --------------------------------------------------------------------------------- */

void moe_bwd_rows(gpt_moe *m, const void *dout)
{
    gather_rows(MS(YS), dout, ML(SEND_TOK), m->nsend, gpt.d.C, ACT);
}

/*
** Every expert's backward on its rows: dy (member-major, as received) into expert-major order
** in MS_YE; the weight gradients accumulate; d(x) and d(prob) partials back in member-major
** order in MS_YG and MS_DPG (summed over expt-tp by the generated code).
*/
void moe_experts_bwd(gpt_moe *m, void *const *w, float *const *dw, const void *dy)
{
    const gpt_dims *d = &gpt.d;
    const int C = d->C, NL = d->experts_local, EFF = d->eff_local, nrows = m->nrows;
    gather_rows(MS(YE), dy, ML(ORDER), nrows, C, ACT);
    for (int l = 0, off = 0; l < NL; off += m->erows[l], l++) {
        int r = m->erows[l];
        if (r == 0) continue;
        if (d->llama) {
            swiglu_expert_bwd(w, dw, m, l, off, r);
            continue;
        }
        const void *proj_w = w[LIB_FIELD(GPT_P_EXPERT_PROJ_W, l)];
        const void *fc_w = w[LIB_FIELD(GPT_P_EXPERT_FC_W, l)];
        float *dproj_w = dw[LIB_FIELD(GPT_P_EXPERT_PROJ_W, l)];
        float *dfc_w = dw[LIB_FIELD(GPT_P_EXPERT_FC_W, l)];
        const void *fc = lib_at(ML(FC), (size_t)off * EFF);
        const void *h = lib_at(ML(H), (size_t)off * EFF);
        const float *pe = (const float *)ML(PE) + off;
        const void *xe = lib_at(ML(XE), (size_t)off * C), *dye = lib_at(MS(YE), (size_t)off * C);
        void *act = lib_at(MS(ACT), (size_t)off * EFF);
        float *dpe = (float *)MS(DPE) + off;
        void *dxe = lib_at(MS(XG), (size_t)off * C);
        /* y = act . c_proj (+ prob * b_proj), act = prob * h */
        rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
        row_scale(act, pe, r, EFF, ACT);
        rt_gemm(1, 0, EFF, C, r, 1.0f, act, EFF, 0, dye, C, 0, 1.0f, dproj_w, C, 0, 1, ACT,
                RT_F32);
        rt_gemm(0, 1, r, EFF, C, 1.0f, dye, C, 0, proj_w, C, 0, 0.0f, act, EFF, 0, 1, ACT,
                ACT);                                                     /* act := d(act) */
        row_dot(dpe, act, h, r, EFF, ACT);                                /* d(prob), partial */
        if (d->bias) {
            scaled_bias_bwd(dw[LIB_FIELD(GPT_P_EXPERT_PROJ_B, l)], pe, dye, r, C, ACT);
            rt_gemm(0, 0, r, 1, C, 1.0f, dye, C, 0, w[LIB_FIELD(GPT_P_EXPERT_PROJ_B, l)], 1, 0,
                    1.0f, dpe, 1, 0, 1, ACT, RT_F32);                     /* + dy . b_proj */
        }
        row_scale(act, pe, r, EFF, ACT);                                  /* d(h) */
        gelu_bwd(act, fc, act, (size_t)r * EFF, ACT);                     /* d(fc) */
        if (d->bias) bias_bwd(dw[LIB_FIELD(GPT_P_EXPERT_FC_B, l)], act, r, EFF, ACT);
        rt_gemm(1, 0, C, EFF, r, 1.0f, xe, C, 0, act, EFF, 0, 1.0f, dfc_w, EFF, 0, 1, ACT,
                RT_F32);
        rt_gemm(0, 1, r, C, EFF, 1.0f, act, EFF, 0, fc_w, EFF, 0, 0.0f, dxe, C, 0, 1, ACT,
                ACT);                                                     /* d(x), partial */
    }
    gather_rows(MS(YG), MS(XG), ML(UNORDER), nrows, C, ACT);
    gather_rows(MS(DPG), MS(DPE), ML(UNORDER), nrows, 1, RT_F32);
}

/*
** Through the combine (each kept choice's input gradient back to its token) and the router:
** the top-k softmax and the aux loss (f32), then logits = x . router_w^T (the logit gradient
** rounded to the model's dtype for its two GEMMs, docs/megatron.md §9.1).
*/
void moe_router_bwd(gpt_moe *m, void *const *w, float *const *dw, const void *x,
                    const void *dxs, const float *dps, void *dx)
{
    const gpt_dims *d = &gpt.d;
    const int NSP = d->n_sp, E = d->experts, K = d->topk, C = d->C;
    combine_rows(dx, dxs, ML(POS), NSP, K, C, ACT);
    gather_rows(MS(DPROB), dps, ML(POS), NSP * K, 1, RT_F32);            /* dropped: 0 */
    moe_route_bwd(MS(DLOGITS), MS(DPROB), ML(PROB), ML(SCORES), ML(SSUM), ML(SEL), ML(AUXG),
                  d->aux_seqs, ML(ZG), NSP, E, K, d->pre_softmax, d->topk_scale, ACT);
    rt_gemm(1, 0, E, C, NSP, 1.0f, MS(DLOGITS), E, 0, x, C, 0, 1.0f, dw[GPT_P_ROUTER_W], C, 0, 1,
            ACT, RT_F32);
    if (dw[GPT_P_ROUTER_B]) bias_bwd(dw[GPT_P_ROUTER_B], MS(DLOGITS), NSP, E, ACT);
    rt_gemm(0, 0, NSP, C, E, 1.0f, MS(DLOGITS), E, 0, w[GPT_P_ROUTER_W], C, 0, 1.0f, dx, C, 0, 1,
            ACT, ACT);
}
