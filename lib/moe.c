/*
** moe.c: the mixture-of-experts block, forward and backward (docs/megatron.md §8; the exact
** semantics are in tests/ref/README.md "Mixture of experts"), with expert parallelism: tokens
** travel to the experts' EP ranks with an all-to-all (per-peer counts) and back; with ETP > 1
** every expert's MLP is column/row split over the expert-TP group, which all-gathers the tokens
** first and reduce-scatters the outputs. Which collectives run depends only on gpt.d (TP, EP,
** ETP > 1); the generator lists the same ones. Called by model.c's layer.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stage.h"

#define MS lib.ms
#define ACT (gpt.d.act)

static int *hialloc(size_t n)
{
    int *p = calloc(n ? n : 1, sizeof(int));
    RT_CHECK(p, "out of memory");
    return p;
}

/* -- Row movements between the ranks ---------------------------------------------------------- */

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

/* All-to-all over the EP group: sendrows[q] rows of width w to peer q, recvrows[q] from it;
** rows of tokens travel in the model's dtype, probabilities (w = 1) in f32. */
static void ep_exchange(const void *send, const int *sendrows, void *recv, const int *recvrows,
                        int w, rt_dtype t)
{
    int EP = gpt.d.ep;
    size_t sc[EP], sd[EP], rc[EP], rd[EP];
    layout(sc, sd, sendrows, EP, w);
    layout(rc, rd, recvrows, EP, w);
    rt_alltoallv(send, sc, sd, recv, rc, rd, t, gpt.grp[GPT_GRP_EP]);
}

/* All-gather over the expert-TP group of 'mine' rows of width w (member m holds rows[m]). */
static void etp_gather(const void *send, int mine, void *recv, const int *rows, int w,
                       rt_dtype t)
{
    int ETP = gpt.d.etp;
    size_t sc[ETP], sd[ETP], rc[ETP], rd[ETP];
    for (int m = 0; m < ETP; m++) {
        sc[m] = (size_t)mine * w;
        sd[m] = 0;
    }
    layout(rc, rd, rows, ETP, w);
    rt_alltoallv(send, sc, sd, recv, rc, rd, t, gpt.grp[GPT_GRP_ETP]);
}

/* Reduce-scatter over the expert-TP group: send member m its rows (rows[m], member-major in
** 'send'), sum the ETP partial blocks of this rank's rows into 'out'. 'tmp' holds ETP blocks. */
static void etp_reduce(const void *send, const int *rows, void *tmp, void *out, int w,
                       rt_dtype t)
{
    int ETP = gpt.d.etp;
    size_t sc[ETP], sd[ETP], rc[ETP], rd[ETP];
    int mine = rows[gpt.etp_rank], each[ETP];
    layout(sc, sd, rows, ETP, w);
    for (int m = 0; m < ETP; m++) each[m] = mine;
    layout(rc, rd, each, ETP, w);
    rt_alltoallv(send, sc, sd, tmp, rc, rd, t, gpt.grp[GPT_GRP_ETP]);
    sum_blocks(out, tmp, ETP, (size_t)mine * w, t);
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
static void swiglu_expert_fwd(const gpt_moe_params *p, gpt_moe_acts *a, int l, int off, int r)
{
    const int C = gpt.d.C, EFF = gpt.d.eff_local;
    rt_dtype t = gpt.d.act;
    void *fc = lib_at(a->fc, (size_t)off * 2 * EFF), *h = lib_at(a->h, (size_t)off * EFF);
    void *act = lib_at(MS.act, (size_t)off * EFF), *y = lib_at(MS.ye, (size_t)off * C);
    const void *xe = lib_at(a->xe, (size_t)off * C);
    rt_gemm(0, 1, r, EFF, C, 1.0f, xe, C, 0, p->fc_w[l], C, 0, 0.0f, fc, 2 * EFF, 0, 1, t, t);
    rt_gemm(0, 1, r, EFF, C, 1.0f, xe, C, 0, p->up_w[l], C, 0, 0.0f, lib_at(fc, (size_t)EFF),
            2 * EFF, 0, 1, t, t);
    swiglu_fwd(h, fc, r, EFF, t);
    rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
    row_scale(act, a->pe + off, r, EFF, t);
    rt_gemm(0, 1, r, C, EFF, 1.0f, act, EFF, 0, p->proj_w[l], EFF, 0, 0.0f, y, C, 0, 1, t, t);
}

/* Its backward: MS.ye holds d(y) of the rows; d(x) partials go to MS.xg, d(prob) partials to
** MS.dpe (summed over expt-tp by the caller), weight gradients accumulate into g. */
static void swiglu_expert_bwd(const gpt_moe_params *p, gpt_moe_params *g, const gpt_moe_acts *a,
                              int l, int off, int r)
{
    const int C = gpt.d.C, EFF = gpt.d.eff_local;
    rt_dtype t = gpt.d.act;
    const void *fc = lib_at(a->fc, (size_t)off * 2 * EFF);
    const void *h = lib_at(a->h, (size_t)off * EFF);
    const void *xe = lib_at(a->xe, (size_t)off * C), *dy = lib_at(MS.ye, (size_t)off * C);
    const float *pe = a->pe + off;
    void *act = lib_at(MS.act, (size_t)off * EFF), *dfc = lib_at(MS.dfc, (size_t)off * 2 * EFF);
    void *dxe = lib_at(MS.xg, (size_t)off * C);
    rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
    row_scale(act, pe, r, EFF, t);                                        /* act = prob * h */
    rt_gemm(1, 0, C, EFF, r, 1.0f, dy, C, 0, act, EFF, 0, 1.0f, g->proj_w[l], EFF, 0, 1, t,
            RT_F32);                                                      /* d(w2) */
    rt_gemm(0, 0, r, EFF, C, 1.0f, dy, C, 0, p->proj_w[l], EFF, 0, 0.0f, act, EFF, 0, 1, t,
            t);                                                           /* act := d(act) */
    row_dot(MS.dpe + off, act, h, r, EFF, t);                             /* d(prob), partial */
    row_scale(act, pe, r, EFF, t);                                        /* d(h) */
    swiglu_bwd(dfc, act, fc, r, EFF, t);                                  /* d(w1 x | w3 x) */
    rt_gemm(1, 0, EFF, C, r, 1.0f, dfc, 2 * EFF, 0, xe, C, 0, 1.0f, g->fc_w[l], C, 0, 1, t,
            RT_F32);
    rt_gemm(1, 0, EFF, C, r, 1.0f, lib_at(dfc, (size_t)EFF), 2 * EFF, 0, xe, C, 0, 1.0f,
            g->up_w[l], C, 0, 1, t, RT_F32);
    rt_gemm(0, 0, r, C, EFF, 1.0f, dfc, 2 * EFF, 0, p->fc_w[l], C, 0, 0.0f, dxe, C, 0, 1, t, t);
    rt_gemm(0, 0, r, C, EFF, 1.0f, lib_at(dfc, (size_t)EFF), 2 * EFF, 0, p->up_w[l], C, 0, 1.0f,
            dxe, C, 0, 1, t, t);                                          /* d(x), partial */
}

/* -- Forward ---------------------------------------------------------------------------------- */

/*
** out (N_SP, C) = the MoE block of x (N_SP, C): router, top-k, dispatch, experts, combine.
** Saves in 'a' what the backward needs. Adds this rank's share of the layer's aux loss to
** *aux (host).
*/
void lib_moe_fwd(const gpt_moe_params *p, gpt_moe_acts *a, const void *x, void *out,
                 double *aux)
{
    const gpt_dims *d = &gpt.d;
    const int NSP = d->n_sp, E = d->experts, K = d->topk, C = d->C, EP = d->ep, ETP = d->etp;
    const int NL = d->experts_local, EFF = d->eff_local, TP = gpt.prog->tp;

    /* router: logits = x . router_w^T (+ router_b, with biases; kept in f32), then top-k and
    ** probabilities (ties: lower expert) */
    rt_gemm(0, 1, NSP, E, C, 1.0f, x, C, 0, p->router_w, C, 0, 0.0f, MS.logits, E, 0, 1,
            ACT, RT_F32);
    if (p->router_b) {          /* the bias in f32 (MS.colsum is free until the aux loss) */
        convert(MS.colsum, RT_F32, p->router_b, ACT, (size_t)E);
        bias_fwd(MS.logits, MS.colsum, NSP, E, RT_F32);
    }
    const float *ebias = NULL;  /* expert bias: staged in MS.colsum (free again) */
    if (p->ebias) {
        rt_memcpy(MS.colsum, p->ebias, (size_t)E * sizeof(float), RT_H2D);
        ebias = MS.colsum;
    }
    moe_route(a->sel, a->prob, a->scores, a->ssum, MS.logits, NSP, E, K, d->pre_softmax,
              d->topk_scale, d->groups, d->group_topk, ebias);
    rt_memcpy(a->sel_h, a->sel, (size_t)NSP * K * sizeof(int), RT_D2H);

    /* tokens per expert (before dropping) of each of the aux loss's token sets (the
    ** micro-batch, or with seq_aux_loss each sequence: row n is sequence n % B's) */
    const int S = d->aux_seqs, SE = S * E;
    int local[SE], total[SE];
    memset(local, 0, sizeof local);
    if ((d->groups > 1 || ebias) && d->aux_scale != 0.0f) {
        /* group-limited routing or an expert bias: the aux loss counts the plain top-k of the
        ** logits, without the group limit and the bias (Megatron's
        ** compute_routing_scores_for_aux_loss; docs/megatron.md §8.1), ties to the lower
        ** expert. Without either, that is the routing itself (and without an aux loss the
        ** counts are multiplied by 0). */
        float *lg = malloc((size_t)NSP * E * sizeof(float));
        RT_CHECK(lg, "out of memory");
        rt_memcpy(lg, MS.logits, (size_t)NSP * E * sizeof(float), RT_D2H);
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
        for (int i = 0; i < NSP * K; i++) local[(i / K) % S * E + a->sel_h[i]]++;
    }
    int G = TP * d->cp;     /* the tp-cp group: the micro-batch's every token */
    if (G > 1) {
        /* >>> all-gather over tp (tp-cp under CP): every sequence shard's counts
        ** (docs/megatron.md §8.1) */
        int *all = malloc((size_t)G * SE * sizeof(int));
        RT_CHECK(all, "out of memory");
        rt_memcpy(MS.counts, local, sizeof local, RT_H2D);
        rt_allgather(MS.counts, MS.counts + SE, (size_t)SE, RT_I32,
                     gpt.grp[d->cp > 1 ? GPT_GRP_TPCP : GPT_GRP_TP]);
        rt_memcpy(all, MS.counts + SE, (size_t)G * SE * sizeof(int), RT_D2H);
        for (int e = 0; e < SE; e++) {
            total[e] = 0;
            for (int t = 0; t < G; t++) total[e] += all[t * SE + e];
        }
        free(all);
    } else {
        memcpy(total, local, sizeof total);
    }

    /* aux loss: AUX_SCALE * sum over (set, e) of (the set's sum of score[e]) * total[set, e];
    ** its gradient with respect to score[n, e] is AUX_SCALE * total[n's set, e], times
    ** AUX_GRAD (the objective's share: 1/NMB, CP/NMB under CP). Rows of S sets are the
    ** scores seen as (NSP/S, S*E). */
    float g[SE], colsum[SE];
    rt_memset0(MS.colsum, (size_t)SE * sizeof(float));
    bias_bwd(MS.colsum, a->scores, NSP / S, SE, RT_F32);
    rt_memcpy(colsum, MS.colsum, sizeof colsum, RT_D2H);
    double layer_aux = 0.0;
    for (int e = 0; e < SE; e++) {
        layer_aux += (double)d->aux_scale * colsum[e] * total[e];
        g[e] = d->aux_scale * (float)total[e] * d->aux_grad;
    }
    rt_memcpy(a->auxg, g, sizeof g, RT_H2D);
    if (a->zg) {
        /* z-loss (Megatron's z_loss_func): Z_SCALE * sum over this rank's tokens of
        ** lse^2, lse = logsumexp of the token's logits; d/d(lse) = 2 Z_SCALE lse, times
        ** AUX_GRAD */
        float *lg = malloc((size_t)NSP * E * sizeof(float));
        float *zg = malloc((size_t)NSP * sizeof(float));
        RT_CHECK(lg && zg, "out of memory");
        rt_memcpy(lg, MS.logits, (size_t)NSP * E * sizeof(float), RT_D2H);
        for (int n = 0; n < NSP; n++) {
            const float *z = lg + (size_t)n * E;
            double mx = z[0], sum = 0.0;
            for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < E; e++) sum += exp(z[e] - mx);
            double lse = mx + log(sum);
            layer_aux += (double)d->z_scale * lse * lse;
            zg[n] = (float)(2.0 * d->z_scale * lse * d->aux_grad);
        }
        rt_memcpy(a->zg, zg, (size_t)NSP * sizeof(float), RT_H2D);
        free(lg);
        free(zg);
    }
    *aux += layer_aux;

    /* dispatch order: the kept choices (keep_choices: the capacity), expert-major, tokens in
    ** row order; with padding, each expert's rows topped up to PAD_ROWS with the earliest
    ** tokens that did not choose it, at probability 0 (they add nothing and get no gradient) */
    int sendmat[EP * NL];
    memset(sendmat, 0, sizeof sendmat);
    int *send_tok = hialloc((size_t)d->moe_send_max), *keep = hialloc((size_t)NSP * K);
    int *chose = hialloc((size_t)NSP);
    float *prob_h = malloc((size_t)(NSP * K + d->moe_send_max) * sizeof(float));
    RT_CHECK(prob_h, "out of memory");
    float *send_prob = prob_h + (size_t)NSP * K;
    rt_memcpy(prob_h, a->prob, (size_t)NSP * K * sizeof(float), RT_D2H);
    keep_choices(keep, a->sel_h, prob_h, NSP * K);
    int nsend = 0;
    for (int e = 0; e < E; e++) {
        for (int n = 0; n < NSP; n++) {
            chose[n] = 0;
            for (int j = 0; j < K; j++) {
                int i = n * K + j;
                if (a->sel_h[i] != e) continue;
                chose[n] = 1;
                if (!keep[i]) {                /* beyond the capacity */
                    a->pos_h[i] = -1;
                    continue;
                }
                a->pos_h[i] = nsend;
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
    a->nsend = nsend;
    /* the expert bias's token counts (Megatron counts its routing map after dropping, and
    ** padded: exactly the rows sent); a recomputed forward does not count again */
    if (p->ecount && !gpt.recomputing)
        for (int e = 0; e < E; e++) p->ecount[e] += sendmat[e];
    rt_memcpy(a->pos, a->pos_h, (size_t)NSP * K * sizeof(int), RT_H2D);
    rt_memcpy(a->send_tok, send_tok, (size_t)nsend * sizeof(int), RT_H2D);
    rt_memcpy(MS.ps, send_prob, (size_t)nsend * sizeof(float), RT_H2D);
    gather_rows(MS.xs, x, a->send_tok, nsend, C, ACT);
    free(send_tok);
    free(keep);
    free(chose);
    free(prob_h);
    for (int q = 0; q < EP; q++) {
        a->sendrows[q] = 0;
        for (int l = 0; l < NL; l++) a->sendrows[q] += sendmat[q * NL + l];
    }

    int recvmat_own[EP * NL];
    int *recvmat = sendmat;                     /* one EP rank: every expert is here */
    if (d->ep > 1) {
        /* >>> all-to-all over ep: counts per (peer, local expert), then the rows and probs */
        int each[EP];
        size_t c[EP], dd[EP];
        for (int q = 0; q < EP; q++) each[q] = NL;
        layout(c, dd, each, EP, 1);
        rt_memcpy(MS.counts, sendmat, sizeof sendmat, RT_H2D);
        rt_alltoallv(MS.counts, c, dd, MS.counts + EP * NL, c, dd, RT_I32, gpt.grp[GPT_GRP_EP]);
        rt_memcpy(recvmat_own, MS.counts + EP * NL, sizeof recvmat_own, RT_D2H);
        recvmat = recvmat_own;
        for (int q = 0; q < EP; q++) {
            a->recvrows[q] = 0;
            for (int l = 0; l < NL; l++) a->recvrows[q] += recvmat[q * NL + l];
        }
        ep_exchange(MS.xs, a->sendrows, MS.xr, a->recvrows, C, ACT);
        ep_exchange(MS.ps, a->sendrows, MS.pr, a->recvrows, 1, RT_F32);
    } else {
        a->recvrows[0] = nsend;
    }
    int nrecv = 0;
    for (int q = 0; q < EP; q++) nrecv += a->recvrows[q];

    const void *xg;
    const float *pg;
    int gmat_own[ETP * EP * NL];
    const int *gmat = recvmat;
    if (d->etp > 1) {
        /* >>> all-gather over expt-tp: every member's received rows (each computes its slice
        **     of every expert for all of them) */
        rt_memcpy(MS.counts, recvmat, (size_t)EP * NL * sizeof(int), RT_H2D);
        rt_allgather(MS.counts, MS.counts + EP * NL, (size_t)EP * NL, RT_I32,
                     gpt.grp[GPT_GRP_ETP]);
        rt_memcpy(gmat_own, MS.counts + EP * NL, sizeof gmat_own, RT_D2H);
        gmat = gmat_own;
        for (int m = 0; m < ETP; m++) {
            a->memrows[m] = 0;
            for (int i = 0; i < EP * NL; i++) a->memrows[m] += gmat[m * EP * NL + i];
        }
        etp_gather(d->ep > 1 ? MS.xr : MS.xs, nrecv, MS.xg, a->memrows, C, ACT);
        etp_gather(d->ep > 1 ? MS.pr : MS.ps, nrecv, MS.pg, a->memrows, 1, RT_F32);
        xg = MS.xg;
        pg = MS.pg;
    } else {
        a->memrows[0] = nrecv;
        xg = d->ep > 1 ? MS.xr : MS.xs;
        pg = d->ep > 1 ? MS.pr : MS.ps;
    }

    /* expert-major order: local expert, then member, then source peer */
    int *order = hialloc((size_t)d->moe_rows_max), *unorder = hialloc((size_t)d->moe_rows_max);
    int block_at[ETP * EP * NL], at = 0, nrows = 0;
    for (int b = 0; b < ETP * EP * NL; b++) {
        block_at[b] = at;
        at += gmat[b];
    }
    for (int l = 0; l < NL; l++) {
        a->erows[l] = 0;
        for (int m = 0; m < ETP; m++)
            for (int q = 0; q < EP; q++) {
                int b = (m * EP + q) * NL + l;
                for (int r = 0; r < gmat[b]; r++) {
                    order[nrows] = block_at[b] + r;
                    unorder[block_at[b] + r] = nrows;
                    nrows++;
                }
                a->erows[l] += gmat[b];
            }
    }
    a->nrows = nrows;
    rt_memcpy(a->order, order, (size_t)nrows * sizeof(int), RT_H2D);
    rt_memcpy(a->unorder, unorder, (size_t)nrows * sizeof(int), RT_H2D);
    free(order);
    free(unorder);
    gather_rows(a->xe, xg, a->order, nrows, C, ACT);
    gather_rows(a->pe, pg, a->order, nrows, 1, RT_F32);

    /* the experts: y = (prob * gelu(x . c_fc + b_fc)) . c_proj + prob * b_proj */
    for (int l = 0, off = 0; l < NL; off += a->erows[l], l++) {
        int r = a->erows[l];
        if (r == 0) continue;
        if (d->llama) {
            swiglu_expert_fwd(p, a, l, off, r);
            continue;
        }
        void *fc = lib_at(a->fc, (size_t)off * EFF), *h = lib_at(a->h, (size_t)off * EFF);
        void *act = lib_at(MS.act, (size_t)off * EFF), *y = lib_at(MS.ye, (size_t)off * C);
        rt_gemm(0, 0, r, EFF, C, 1.0f, lib_at(a->xe, (size_t)off * C), C, 0, p->fc_w[l], EFF, 0,
                0.0f, fc, EFF, 0, 1, ACT, ACT);
        if (d->bias) bias_fwd(fc, p->fc_b[l], r, EFF, ACT);
        gelu_fwd(h, fc, (size_t)r * EFF, ACT);
        rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
        row_scale(act, a->pe + off, r, EFF, ACT);
        rt_gemm(0, 0, r, C, EFF, 1.0f, act, EFF, 0, p->proj_w[l], C, 0, 0.0f, y, C, 0, 1,
                ACT, ACT);
        if (d->bias) add_scaled_bias(y, a->pe + off, p->proj_b[l], r, C, ACT);
    }

    /* back: member-major rows, the sum over expt-tp, the way they came over ep, then the sum
    ** of each token's expert outputs */
    gather_rows(MS.yg, MS.ye, a->unorder, nrows, C, ACT);
    const void *yr = MS.yg;
    if (d->etp > 1) {
        /* >>> reduce-scatter over expt-tp: each member's rows get every member's partials */
        etp_reduce(MS.yg, a->memrows, MS.xg, MS.yr, C, ACT);
        yr = MS.yr;
    }
    if (d->ep > 1) {
        /* >>> all-to-all over ep: the outputs back to the tokens' ranks */
        ep_exchange(yr, a->recvrows, MS.ys, a->sendrows, C, ACT);
        combine_rows(out, MS.ys, a->pos, NSP, K, C, ACT);
    } else {
        combine_rows(out, yr, a->pos, NSP, K, C, ACT);
    }
}

/* -- Backward --------------------------------------------------------------------------------- */

/*
** dx (N_SP, C) = d(loss)/d(x) of lib_moe_fwd's input for dout = d(loss)/d(out); expert and
** router gradients accumulate into g.
*/
void lib_moe_bwd(const gpt_moe_params *p, gpt_moe_params *g, const gpt_moe_acts *a,
                 const void *x, const void *dout, void *dx)
{
    const gpt_dims *d = &gpt.d;
    const int NSP = d->n_sp, E = d->experts, K = d->topk, C = d->C, EP = d->ep;
    const int NL = d->experts_local, EFF = d->eff_local;
    int nsend = a->nsend, nrows = a->nrows, nrecv = 0;
    for (int q = 0; q < EP; q++) nrecv += a->recvrows[q];

    /* every kept assignment's output gradient is its token's, sent the way the token went */
    gather_rows(MS.ys, dout, a->send_tok, nsend, C, ACT);
    const void *dyr = MS.ys;
    if (d->ep > 1) {
        /* >>> all-to-all over ep */
        ep_exchange(MS.ys, a->sendrows, MS.yr, a->recvrows, C, ACT);
        dyr = MS.yr;
    }
    const void *dyg = dyr;
    if (d->etp > 1) {
        /* >>> all-gather over expt-tp (the backward of the forward's reduce-scatter) */
        etp_gather(dyr, nrecv, MS.yg, a->memrows, C, ACT);
        dyg = MS.yg;
    }
    gather_rows(MS.ye, dyg, a->order, nrows, C, ACT);

    for (int l = 0, off = 0; l < NL; off += a->erows[l], l++) {
        int r = a->erows[l];
        if (r == 0) continue;
        if (d->llama) {
            swiglu_expert_bwd(p, g, a, l, off, r);
            continue;
        }
        const void *fc = lib_at(a->fc, (size_t)off * EFF);
        const void *h = lib_at(a->h, (size_t)off * EFF);
        const float *pe = a->pe + off;
        const void *xe = lib_at(a->xe, (size_t)off * C), *dy = lib_at(MS.ye, (size_t)off * C);
        void *act = lib_at(MS.act, (size_t)off * EFF);
        float *dpe = MS.dpe + off;
        void *dxe = lib_at(MS.xg, (size_t)off * C);
        /* y = act . c_proj (+ prob * b_proj), act = prob * h */
        rt_memcpy(act, h, (size_t)r * EFF * lib.es, RT_D2D);
        row_scale(act, pe, r, EFF, ACT);
        rt_gemm(1, 0, EFF, C, r, 1.0f, act, EFF, 0, dy, C, 0, 1.0f, g->proj_w[l], C, 0, 1,
                ACT, RT_F32);
        rt_gemm(0, 1, r, EFF, C, 1.0f, dy, C, 0, p->proj_w[l], C, 0, 0.0f, act, EFF, 0, 1,
                ACT, ACT);                                                /* act := d(act) */
        row_dot(dpe, act, h, r, EFF, ACT);                                /* d(prob), partial */
        if (d->bias) {
            scaled_bias_bwd(g->proj_b[l], pe, dy, r, C, ACT);
            rt_gemm(0, 0, r, 1, C, 1.0f, dy, C, 0, p->proj_b[l], 1, 0, 1.0f, dpe, 1, 0, 1,
                    ACT, RT_F32);                                         /* + dy . b_proj */
        }
        row_scale(act, pe, r, EFF, ACT);                                  /* d(h) */
        gelu_bwd(act, fc, act, (size_t)r * EFF, ACT);                     /* d(fc) */
        if (d->bias) bias_bwd(g->fc_b[l], act, r, EFF, ACT);
        rt_gemm(1, 0, C, EFF, r, 1.0f, xe, C, 0, act, EFF, 0, 1.0f, g->fc_w[l], EFF, 0, 1,
                ACT, RT_F32);
        rt_gemm(0, 1, r, C, EFF, 1.0f, act, EFF, 0, p->fc_w[l], EFF, 0, 0.0f, dxe, C, 0, 1,
                ACT, ACT);                                                /* d(x), partial */
    }

    /* back to member-major order, summed over expt-tp, over ep to the tokens' ranks */
    gather_rows(MS.yg, MS.xg, a->unorder, nrows, C, ACT);
    gather_rows(MS.dpg, MS.dpe, a->unorder, nrows, 1, RT_F32);
    const void *dxr = MS.yg;
    const float *dpr = MS.dpg;
    if (d->etp > 1) {
        /* >>> reduce-scatter over expt-tp: d(x) and d(prob) partials of every member's rows */
        etp_reduce(MS.yg, a->memrows, MS.xg, MS.yr, C, ACT);
        etp_reduce(MS.dpg, a->memrows, MS.dpe, MS.dpr, 1, RT_F32);
        dxr = MS.yr;
        dpr = MS.dpr;
    }
    const void *dxs = dxr;
    const float *dps = dpr;
    if (d->ep > 1) {
        /* >>> all-to-all over ep */
        ep_exchange(dxr, a->recvrows, MS.ys, a->sendrows, C, ACT);
        ep_exchange(dpr, a->recvrows, MS.dps, a->sendrows, 1, RT_F32);
        dxs = MS.ys;
        dps = MS.dps;
    }
    combine_rows(dx, dxs, a->pos, NSP, K, C, ACT);
    gather_rows(MS.dprob, dps, a->pos, NSP * K, 1, RT_F32);              /* dropped: 0 */

    /* router: through the top-k softmax and the aux loss (f32), then logits = x . router_w^T
    ** (the logit gradient rounded to the model's dtype for the two GEMMs, docs/megatron.md
    ** §9.1) */
    moe_route_bwd(MS.dlogits, MS.dprob, a->prob, a->scores, a->ssum, a->sel, a->auxg,
                  d->aux_seqs, a->zg, NSP, E, K, d->pre_softmax, d->topk_scale, ACT);
    rt_gemm(1, 0, E, C, NSP, 1.0f, MS.dlogits, E, 0, x, C, 0, 1.0f, g->router_w, C, 0, 1,
            ACT, RT_F32);
    if (g->router_b) bias_bwd(g->router_b, MS.dlogits, NSP, E, ACT);
    rt_gemm(0, 0, NSP, C, E, 1.0f, MS.dlogits, E, 0, p->router_w, C, 0, 1.0f, dx, C, 0, 1,
            ACT, ACT);
}
