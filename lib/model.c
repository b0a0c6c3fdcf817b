/*
** model.c: the GPT-2 and Llama (docs/llama.md) layers, embedding and head, forward and
** backward, with Megatron's tensor- and sequence-parallel communication written out
** (docs/megatron.md §4): the column-parallel
** input is all-gathered under SP, the row-parallel output reduce-scattered (SP) or all-reduced
** (TP without SP), and the context-parallel attention (§12: the p2p ring or the all-to-all).
** Sizes come from gpt.d; which collectives run depends only on gpt.d.tp > 1, gpt.d.sp,
** gpt.d.cp, gpt.d.cp_a2a and gpt.d.moe, and the generator lists the same ones for its deadlock
** check (every collective of a layer is within the tp or cp group, or ep / expt-tp / tp-cp
** for experts: one stage).
** Called by the generated stage code through gpt_embedding_fwd, gpt_layer_fwd, ...
*/
#include <math.h>

#include "internal.h"

gpt_state gpt;

#define ACT (gpt.d.act)

/* -- Tensor-parallel regions (docs/megatron.md §4.1) ---------------------------------------- */

/*
** Input of a column-parallel layer: the whole sequence. Under sequence parallelism the rows
** are gathered from the tp group into 'full'; otherwise every rank already has them.
** Also the backward of a row-parallel layer's output (the conjugate of its reduction).
*/
static const void *gather_seq(void *full, const void *rows)
{
    if (!gpt.d.sp) return rows;
    /* >>> all-gather over tp: (N_SP, C) from each rank -> (N, C) */
    rt_allgather(rows, full, (size_t)gpt.d.n_sp * gpt.d.C, ACT, gpt.grp[GPT_GRP_TP]);
    return full;
}

/*
** Output of a row-parallel layer: partial sums (N, C) reduced over the tp group; under
** sequence parallelism reduce-scattered to this rank's rows (N_SP, C). Also the backward of a
** column-parallel layer's input (the "f" conjugate: identity forward, reduction backward).
*/
static void *reduce_seq(void *partial)
{
    const gpt_dims *d = &gpt.d;
    if (d->sp) {
        /* >>> reduce-scatter over tp: (N, C) partial sums -> this rank's (N_SP, C) */
        rt_reduce_scatter(partial, lib.s.full_sp, (size_t)d->n_sp * d->C, ACT,
                          gpt.grp[GPT_GRP_TP]);
        return lib.s.full_sp;
    }
    if (d->tp > 1)   /* >>> all-reduce over tp: sum the partial products of every rank */
        rt_allreduce(partial, (size_t)d->N * d->C, ACT, RT_SUM, gpt.grp[GPT_GRP_TP]);
    return partial;
}

/* -- Linear layers through the runtime's GEMM (row-major, weights [in, out]) ---------------- */

/* out (N, OC) = inp (N, IC) . w (IC, OC) [+ bias, unless NULL: add_bias_linear = false], in
** the model's dtype (f32 accumulation). */
static void matmul_fwd(void *out, const void *inp, const void *w, const void *bias, int N,
                       int IC, int OC)
{
    rt_gemm(0, 0, N, OC, IC, 1.0f, inp, IC, 0, w, OC, 0, 0.0f, out, OC, 0, 1, ACT, ACT);
    if (bias) bias_fwd(out, bias, N, OC, ACT);
}

/* dinp (N, IC) = dout . w^T;  dw (IC, OC) += inp^T . dout, accumulated in the f32 main
** gradient;  dbias += column sums of dout */
static void matmul_bwd(void *dinp, float *dw, float *dbias, const void *dout,
                       const void *inp, const void *w, int N, int IC, int OC)
{
    rt_gemm(0, 1, N, IC, OC, 1.0f, dout, OC, 0, w, OC, 0, 0.0f, dinp, IC, 0, 1, ACT, ACT);
    rt_gemm(1, 0, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f, dw, OC, 0, 1, ACT, RT_F32);
    if (dbias) bias_bwd(dbias, dout, N, OC, ACT);
}

/* -- Transformer layer ---------------------------------------------------------------------- */

static void ln1_fwd(const gpt_layer_params *p, gpt_layer_acts *a, const void *x)
{
    const gpt_dims *d = &gpt.d;
    layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln_1_w, p->ln_1_b, d->n_sp, d->C,
                  d->ln_eps, ACT);
}

static void ln2_fwd(const gpt_layer_params *p, gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res1, p->ln_2_w, p->ln_2_b, d->n_sp,
                  d->C, d->ln_eps, ACT);
}

/* -- Context parallelism: attention around the cp ring (docs/megatron.md §12) ---------------- */

/*
** A cp rank holds two chunks of T_CHUNK positions of every sequence: chunk cp_rank (local rows
** [0, T_CHUNK*B)) and chunk 2*CP-1-cp_rank (the rest), so every rank has the same share of the
** causal work. The global chunk index of local half 'half' of rank r:
*/
static int cp_chunk(int r, int half) { return half ? 2 * gpt.d.cp - 1 - r : r; }

/* The global position of local position t. */
int lib_cp_position(int t)
{
    int tc = gpt.d.t_chunk;
    return cp_chunk(gpt.cp_rank, t >= tc) * tc + t % tc;
}

/* One hop of the ring: send our block to the next cp rank, receive the previous rank's; the
** K|V blocks (N, 2 C_LOCAL) are in the model's dtype, their dK|dV f32. kv: posted, its request
** returned for rt_wait (the attention of the block in hand runs meanwhile); dkv: completed
** here (NULL returned). */
static rt_req *ring_hop(const void *kv_out, void *kv_in, const float *dkv_out, float *dkv_in)
{
    size_t n = (size_t)gpt.d.N * 2 * gpt.d.c_local;
    rt_p2p_op ops[4];
    int k = 0;
    if (kv_out) {
        ops[k++] = (rt_p2p_op){ .send = 1, .buf = (void *)kv_out, .n = n, .t = ACT,
                                .peer = gpt.cp_next, .tag = GPT_TAG_RING_KV };
    }
    if (dkv_out) {
        ops[k++] = (rt_p2p_op){ .send = 1, .buf = (void *)dkv_out, .n = n, .t = RT_F32,
                                .peer = gpt.cp_next, .tag = GPT_TAG_RING_DKV };
    }
    if (kv_in) {
        ops[k++] = (rt_p2p_op){ .send = 0, .buf = kv_in, .n = n, .t = ACT, .peer = gpt.cp_prev,
                                .tag = GPT_TAG_RING_KV };
    }
    if (dkv_in) {
        ops[k++] = (rt_p2p_op){ .send = 0, .buf = dkv_in, .n = n, .t = RT_F32,
                                .peer = gpt.cp_prev, .tag = GPT_TAG_RING_DKV };
    }
    /* >>> p2p on the cp ring: to the next cp rank, from the previous one */
    if (kv_out) return rt_p2p_start(ops, k);
    rt_p2p(ops, k);
    return NULL;
}

/*
** The pairs (query half, key half) of this rank's queries and the block of cp rank s that
** the causal mask does not hide entirely: a key chunk before the query chunk is seen whole, the
** same chunk (s = this rank) with the causal rule, a later one not at all.
*/
typedef struct { int qh, kh, causal; } cp_pair;

static int cp_pairs(int s, cp_pair out[4])
{
    int n = 0;
    for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
            int q = cp_chunk(gpt.cp_rank, qh), k = cp_chunk(s, kh);
            if (k <= q) out[n++] = (cp_pair){ qh, kh, k == q };
        }
    return n;
}

/* This rank's K|V block (N, 2 C_LOCAL), the k and v columns of its q|k|v, into ring buffer 0. */
static void ring_pack_kv(const gpt_layer_acts *a)
{
    size_t cl = (size_t)gpt.d.c_local;
    copy_cols(lib.s.ring_kv, ACT, 2 * cl, lib_at(a->qkv, cl), ACT, 3 * cl, gpt.d.N,
              2 * gpt.d.c_local);
}

/*
** Forward: this rank's K|V block, then CP-1 hops; each block's attention is merged into the
** f32 output and the log-sum-exp (a->lse) as it arrives (online softmax across blocks).
*/
static void ring_fwd(gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    int B = d->B, tc = d->t_chunk, cl = d->c_local, cp = d->cp;
    size_t kvn = (size_t)d->N * 2 * cl, half = (size_t)tc * B;
    ring_pack_kv(a);
    rt_memset0(lib.s.ring_acc, (size_t)d->N * cl * sizeof(float));
    fill_f32(a->lse, (size_t)B * d->heads_local * d->T, -INFINITY);
    for (int i = 0; i < cp; i++) {
        int s = (gpt.cp_rank - i + cp) % cp;        /* the block held now is cp rank s's */
        const void *kv = lib_at(lib.s.ring_kv, (size_t)(i % 2) * kvn);
        rt_req *hop = NULL;
        if (i < cp - 1)     /* the next block travels while this one is attended to */
            hop = ring_hop(kv, lib_at(lib.s.ring_kv, (size_t)((i + 1) % 2) * kvn), NULL, NULL);
        cp_pair pr[4];
        for (int j = 0, n = cp_pairs(s, pr); j < n; j++) {
            size_t qh = (size_t)pr[j].qh, kh = (size_t)pr[j].kh;
            int causal = pr[j].causal;
            const void *k = lib_at(kv, kh * half * 2 * cl);
            attention_fwd_block(lib.s.ring_acc + qh * half * cl, a->lse + qh * tc, d->T,
                                lib_at(a->qkv, qh * half * 3 * cl), 3 * cl, k, lib_at(k, cl),
                                2 * cl, B, tc, tc, d->heads_local, d->head_dim, causal,
                                d->att_scale, ACT);
        }
        rt_wait(hop);
    }
    convert(a->atty, ACT, lib.s.ring_acc, RT_F32, (size_t)d->N * cl);
}

/*
** Backward: the blocks travel the ring again, each with the f32 dK|dV its visited ranks have
** added; after CP-1 hops one more hop brings every block's dK|dV home. dq sums in ring_acc.
*/
static void ring_bwd(const gpt_layer_acts *a)
{
    const void *datty = lib.s.datty;
    const gpt_dims *d = &gpt.d;
    int B = d->B, tc = d->t_chunk, cl = d->c_local, cp = d->cp;
    size_t kvn = (size_t)d->N * 2 * cl, half = (size_t)tc * B;
    attention_dsum(lib.s.dsum, datty, a->atty, B, d->T, d->heads_local, d->head_dim, ACT);
    ring_pack_kv(a);
    rt_memset0(lib.s.ring_acc, (size_t)d->N * cl * sizeof(float));
    rt_memset0(lib.s.ring_dkv, kvn * sizeof(float));
    for (int i = 0; i < cp; i++) {
        int s = (gpt.cp_rank - i + cp) % cp, cur = i % 2, nxt = (i + 1) % 2;
        const void *kv = lib_at(lib.s.ring_kv, (size_t)cur * kvn);
        float *dkv = lib.s.ring_dkv + (size_t)cur * kvn;
        int more = i < cp - 1;      /* K|V travel on while this block's gradients are summed */
        rt_req *hop = more ? ring_hop(kv, lib_at(lib.s.ring_kv, (size_t)nxt * kvn), NULL, NULL)
                           : NULL;
        cp_pair pr[4];
        for (int j = 0, n = cp_pairs(s, pr); j < n; j++) {
            size_t qh = (size_t)pr[j].qh, kh = (size_t)pr[j].kh;
            int causal = pr[j].causal;
            const void *k = lib_at(kv, kh * half * 2 * cl);
            float *dk = dkv + kh * half * 2 * cl;
            attention_bwd_block(lib.s.ring_acc + qh * half * cl, dk, dk + cl, 2 * cl,
                                lib_at(datty, qh * half * cl), a->lse + qh * tc,
                                lib.s.dsum + qh * tc, d->T, lib_at(a->qkv, qh * half * 3 * cl),
                                3 * cl, k, lib_at(k, cl), 2 * cl, B, tc, tc, d->heads_local,
                                d->head_dim, causal, d->att_scale, ACT);
        }
        rt_wait(hop);
        ring_hop(NULL, NULL, dkv, lib.s.ring_dkv + (size_t)nxt * kvn);   /* then their dK|dV */
    }
    /* dq from ring_acc, dK|dV of this rank's own block (home after CP hops) */
    copy_cols(lib.s.dqkv, ACT, 3 * (size_t)cl, lib.s.ring_acc, RT_F32, cl, d->N, cl);
    copy_cols(lib_at(lib.s.dqkv, cl), ACT, 3 * (size_t)cl, lib.s.ring_dkv + (cp % 2) * kvn, RT_F32,
              2 * (size_t)cl, d->N, 2 * cl);
}

/*
** CP_COMM=a2a (Megatron's "a2a", Ulysses): an all-to-all over cp trades sequence for heads, so
** each cp rank runs the plain causal attention of the whole sequence on HEADS_LOCAL/CP heads,
** then a second all-to-all trades back. Head group j (HG = HEADS_LOCAL/CP heads, hw = HG*hd
** channels) goes to cp rank j; the blocks a rank receives, one per cp rank s, hold s's local
** rows (its two chunks), which a2a_order puts at their true positions.
*/
static void a2a_exchange(const void *send, void *recv, size_t block)
{
    static size_t cnt[GPT_MAX_CP], dis[GPT_MAX_CP];     /* the main thread's only */
    for (int j = 0; j < gpt.d.cp; j++) {
        cnt[j] = block;
        dis[j] = (size_t)j * block;
    }
    /* >>> all-to-all over cp: block j to cp rank j, block s from cp rank s */
    rt_alltoallv(send, cnt, dis, recv, cnt, dis, ACT, gpt.grp[GPT_GRP_CP]);
}

/* Rows of width w between the received order (block s: cp rank s's local rows, its chunk s
** then chunk 2CP-1-s) and the sequence order (position-major rows t*B + b of the whole
** sequence): to_seq = 1 from the first to the second, 0 back. Whole chunks of T_CHUNK*B rows. */
static void a2a_order(void *dst, const void *src, size_t w, int to_seq)
{
    const gpt_dims *d = &gpt.d;
    size_t chunk = (size_t)d->t_chunk * d->B * w;
    for (int s = 0; s < d->cp; s++)
        for (int h = 0; h < 2; h++) {
            size_t blk = (size_t)(2 * s + h) * chunk, seq = (size_t)cp_chunk(s, h) * chunk;
            rt_memcpy(lib_at(dst, to_seq ? seq : blk), lib_at(src, to_seq ? blk : seq),
                      chunk * lib.es, RT_D2D);
        }
}

/* Pack head groups: block j (N rows of 'parts' x hw) = columns [p*C_LOCAL + j*hw, +hw) of
** each part p of src (rows of parts*C_LOCAL); unpack: the inverse. */
static void a2a_heads(void *blocks, void *rows, int parts, int pack)
{
    const gpt_dims *d = &gpt.d;
    int cl = d->c_local, hw = cl / d->cp;
    size_t bw = (size_t)parts * hw, rw = (size_t)parts * cl;
    for (int j = 0; j < d->cp; j++)
        for (int p = 0; p < parts; p++) {
            void *b = lib_at(blocks, (size_t)j * d->N * bw + (size_t)p * hw);
            void *r = lib_at(rows, (size_t)p * cl + (size_t)j * hw);
            if (pack) copy_cols(b, ACT, bw, r, ACT, rw, d->N, hw);
            else copy_cols(r, ACT, rw, b, ACT, bw, d->N, hw);
        }
}

static void a2a_fwd(gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    int hg = d->heads_local / d->cp, hw = hg * d->head_dim;
    size_t n3 = (size_t)d->N * 3 * hw, n1 = (size_t)d->N * hw;
    a2a_heads(lib.s.a2a_send, a->qkv, 3, 1);
    a2a_exchange(lib.s.a2a_send, lib.s.a2a_recv, n3);
    a2a_order(a->qkv_seq, lib.s.a2a_recv, 3 * (size_t)hw, 1);
    attention_fwd(a->atty_seq, a->lse, a->qkv_seq, d->B, d->seq, hg, d->head_dim, d->att_scale,
                  ACT);
    a2a_order(lib.s.a2a_send, a->atty_seq, (size_t)hw, 0);
    a2a_exchange(lib.s.a2a_send, lib.s.a2a_recv, n1);
    a2a_heads(lib.s.a2a_recv, a->atty, 1, 0);
}

static void a2a_bwd(const gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    int hg = d->heads_local / d->cp, hw = hg * d->head_dim;
    size_t n3 = (size_t)d->N * 3 * hw, n1 = (size_t)d->N * hw;
    a2a_heads(lib.s.a2a_send, lib.s.datty, 1, 1);
    a2a_exchange(lib.s.a2a_send, lib.s.a2a_recv, n1);
    a2a_order(lib.s.a2a_dout, lib.s.a2a_recv, (size_t)hw, 1);
    attention_bwd(lib.s.a2a_send, lib.s.dsum, lib.s.a2a_dout, a->atty_seq, a->lse, a->qkv_seq,
                  d->B, d->seq, hg, d->head_dim, d->att_scale, ACT);
    a2a_order(lib.s.a2a_recv, lib.s.a2a_send, 3 * (size_t)hw, 0);
    a2a_exchange(lib.s.a2a_recv, lib.s.a2a_send, n3);
    a2a_heads(lib.s.a2a_send, lib.s.dqkv, 3, 0);
}

static void attention_core(gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    if (d->cp > 1) {
        if (d->cp_a2a) a2a_fwd(a);
        else ring_fwd(a);
        return;
    }
    attention_fwd(a->atty, a->lse, a->qkv, d->B, d->T, d->heads_local, d->head_dim,
                  d->att_scale, ACT);
}

static void attention_core_bwd(const gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    if (d->cp > 1) {
        if (d->cp_a2a) a2a_bwd(a);
        else ring_bwd(a);
        return;
    }
    attention_bwd(lib.s.dqkv, lib.s.dsum, lib.s.datty, a->atty, a->lse, a->qkv, d->B, d->T,
                  d->heads_local, d->head_dim, d->att_scale, ACT);
}

/* fc = h . c_fc + b, gelu = GELU(fc): h is ln_2's output, gathered under SP. */
static void mlp_up(const gpt_layer_params *p, gpt_layer_acts *a, const void *h)
{
    const gpt_dims *d = &gpt.d;
    matmul_fwd(a->fc, h, p->c_fc_w, p->c_fc_b, d->N, d->C, d->ff_local);
    gelu_fwd(a->gelu, a->fc, (size_t)d->N * d->ff_local, ACT);
}

/*
** The dense MLP on ln_2's output -- the layer's MLP, or the shared expert beside the routed ones
** (gpt.d.shared_expert): c_proj(gelu(c_fc(ln_2))) as this rank's (N_SP, C) rows, in scratch
** (the row-parallel bias after the sum).
*/
static void *mlp_fwd(const gpt_layer_params *p, gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    mlp_up(p, a, gather_seq(lib.s.gather, a->ln2));
    matmul_fwd(lib.s.full, a->gelu, p->mlp_proj_w, NULL, d->N, d->ff_local, d->C);
    void *proj = reduce_seq(lib.s.full);
    if (p->mlp_proj_b) bias_fwd(proj, p->mlp_proj_b, d->n_sp, d->C, ACT);
    return proj;
}

/*
** Backward of mlp_fwd for dout = d(its output) (N_SP, C): gradients into g; returns d(ln_2
** output) (N_SP, C) in scratch. Collectives: program.lua column_bwd.
*/
static void *mlp_bwd(const gpt_layer_params *p, gpt_layer_params *g, const gpt_layer_acts *a,
                     const void *dout)
{
    const gpt_dims *d = &gpt.d;
    const void *h = gather_seq(lib.s.gather, a->ln2);
    if (d->rc_mlp) mlp_up(p, (gpt_layer_acts *)a, h);
    if (g->mlp_proj_b) bias_bwd(g->mlp_proj_b, dout, d->n_sp, d->C, ACT);
    const void *dd = gather_seq(lib.s.full, dout);
    matmul_bwd(lib.s.dfc, g->mlp_proj_w, NULL, dd, a->gelu, p->mlp_proj_w, d->N, d->ff_local,
               d->C);
    gelu_bwd(lib.s.dfc, a->fc, lib.s.dfc, (size_t)d->N * d->ff_local, ACT);
    matmul_bwd(lib.s.full, g->c_fc_w, g->c_fc_b, lib.s.dfc, h, p->c_fc_w, d->N, d->C,
               d->ff_local);
    return reduce_seq(lib.s.full);
}

/* The dense MLP of either architecture (mlp_fwd, llama_mlp_fwd) and its backward. */
typedef void *mlp_fwd_fn(const gpt_layer_params *p, gpt_layer_acts *a);
typedef void *mlp_bwd_fn(const gpt_layer_params *p, gpt_layer_params *g,
                         const gpt_layer_acts *a, const void *dout);

/*
** The mixture-of-experts branch: res2 = res1 [+ shared(ln_2)] + moe(ln_2), on this rank's
** tokens; the shared expert (the model's MLP, 'mlp') runs first, its collectives before the
** routed ones. A recomputed forward does not count the aux loss again.
*/
static void moe_branch_fwd(const gpt_layer_params *p, gpt_layer_acts *a, mlp_fwd_fn *mlp)
{
    const gpt_dims *d = &gpt.d;
    size_t rows = (size_t)d->n_sp * d->C;
    if (d->shared_expert) add_fwd(a->res2, a->res1, mlp(p, a), rows, ACT);
    double aux = 0.0;
    lib_moe_fwd(&p->moe, &a->moe, a->ln2, lib.s.full_sp, &aux);
    if (!gpt.recomputing) gpt.moe_aux += aux;
    if (d->shared_expert)
        add_inplace(a->res2, lib.s.full_sp, rows, ACT);
    else
        add_fwd(a->res2, a->res1, lib.s.full_sp, rows, ACT);
}

/*
** Backward of moe_branch_fwd for dres = d(res2): the routed experts', then the shared
** expert's; returns d(ln_2 output) (N_SP, C) in scratch, the sum of both.
*/
static void *moe_branch_bwd(const gpt_layer_params *p, gpt_layer_params *g,
                            const gpt_layer_acts *a, const void *dres, mlp_bwd_fn *mlp)
{
    const gpt_dims *d = &gpt.d;
    if (!d->shared_expert) {
        lib_moe_bwd(&p->moe, &g->moe, &a->moe, a->ln2, dres, lib.s.full_sp);
        return lib.s.full_sp;
    }
    lib_moe_bwd(&p->moe, &g->moe, &a->moe, a->ln2, dres, lib.s.dshared);
    void *dd = mlp(p, g, a, dres);
    add_inplace(dd, lib.s.dshared, (size_t)d->n_sp * d->C, ACT);
    return dd;
}

/*
** x (N_SP, C) -> a->res2 (N_SP, C): x + attn(ln_1(x)), then + mlp(ln_2(.)) (or the mixture of
** experts, with the shared expert's MLP first when there is one). Saves in 'a' everything the
** backward needs; under SP a column-parallel input is gathered into scratch, not kept
** (docs/megatron.md §9.3).
*/
static void layer_fwd(const gpt_layer_params *p, gpt_layer_acts *a, const void *x)
{
    const gpt_dims *d = &gpt.d;
    size_t rows = (size_t)d->n_sp * d->C;
    /* attention: res1 = x + c_proj(attention(c_attn(ln_1(x)))) */
    ln1_fwd(p, a, x);
    const void *h = gather_seq(lib.s.gather, a->ln1);
    matmul_fwd(a->qkv, h, p->c_attn_w, p->c_attn_b, d->N, d->C, d->qkv_local);
    attention_core(a);
    matmul_fwd(lib.s.full, a->atty, p->attn_proj_w, NULL, d->N, d->c_local, d->C);
    void *proj = reduce_seq(lib.s.full);
    if (p->attn_proj_b)                                     /* row-parallel bias: after the sum */
        bias_fwd(proj, p->attn_proj_b, d->n_sp, d->C, ACT);
    add_fwd(a->res1, x, proj, rows, ACT);

    ln2_fwd(p, a);
    if (d->moe)
        moe_branch_fwd(p, a, mlp_fwd);
    else                /* MLP: res2 = res1 + c_proj(gelu(c_fc(ln_2(res1)))) */
        add_fwd(a->res2, a->res1, mlp_fwd(p, a), rows, ACT);
}

/*
** Backward of layer_fwd. dres (N_SP, C) holds d(res2) on entry and d(x) on return (each
** branch adds its input gradient to the residual stream). Gradients accumulate into g.
** Selective recompute (gpt.d.rc_*) first computes again what the layer did not keep.
** Collectives per branch, in order: the input gathered again (SP), the output gradient
** gathered (SP), the input gradient reduced (program.lua column_bwd).
*/
static void layer_bwd(const gpt_layer_params *p, gpt_layer_params *g, const gpt_layer_acts *a,
                      const void *x, void *dres)
{
    const gpt_dims *d = &gpt.d;
    gpt_layer_acts *w = (gpt_layer_acts *)a;       /* what recompute writes again */
    const void *dd, *h;
    if (d->rc_ln) ln2_fwd(p, w);
    /* MLP or mixture-of-experts branch */
    dd = d->moe ? moe_branch_bwd(p, g, a, dres, mlp_bwd) : mlp_bwd(p, g, a, dres);
    layernorm_bwd(dres, g->ln_2_w, g->ln_2_b, dd, a->res1, p->ln_2_w, a->ln2_mean,
                  a->ln2_rstd, d->n_sp, d->C, ACT);

    /* attention branch */
    if (d->rc_ln) ln1_fwd(p, w, x);
    h = gather_seq(lib.s.gather, a->ln1);
    if (d->rc_attn) attention_core(w);
    if (g->attn_proj_b) bias_bwd(g->attn_proj_b, dres, d->n_sp, d->C, ACT);
    dd = gather_seq(lib.s.full, dres);
    matmul_bwd(lib.s.datty, g->attn_proj_w, NULL, dd, a->atty, p->attn_proj_w, d->N,
               d->c_local, d->C);
    attention_core_bwd(a);
    matmul_bwd(lib.s.full, g->c_attn_w, g->c_attn_b, lib.s.dqkv, h, p->c_attn_w, d->N, d->C,
               d->qkv_local);
    dd = reduce_seq(lib.s.full);
    layernorm_bwd(dres, g->ln_1_w, g->ln_1_b, dd, x, p->ln_1_w, a->ln1_mean, a->ln1_rstd,
                  d->n_sp, d->C, ACT);
}

/* -- The Llama layer (docs/llama.md) ---------------------------------------------------------- */

/*
** Hugging Face LlamaForCausalLM's block with Megatron's tensor parallelism: RMSNorm, q|k|v
** column-parallel (q over HEADS_LOCAL heads, k and v over KV_LOCAL heads), rotary positions
** on q and k, grouped-query attention (each kv head repeated for its query heads, then the
** same attention as GPT: one code path for CP 1, the ring and the all-to-all), o_proj
** row-parallel, SwiGLU with gate|up column-parallel and down row-parallel. No biases. The
** weights are nn.Linear's [out, in], so a linear layer is inp . w^T. The collectives are
** those of layer_fwd / layer_bwd, in the same order.
*/

/* out (N, OC; rows of ldo) = inp (N, IC) . w^T, w (OC, IC) */
static void linear_fwd(void *out, int ldo, const void *inp, const void *w, int N, int IC, int OC)
{
    rt_gemm(0, 1, N, OC, IC, 1.0f, inp, IC, 0, w, IC, 0, 0.0f, out, ldo, 0, 1, ACT, ACT);
}

/* dinp (N, IC) = dout . w (beta 0), or += (beta 1); dw (OC, IC) += dout^T . inp (f32 main
** gradient). dout: rows of ldd. */
static void linear_bwd(void *dinp, float beta, float *dw, const void *dout, int ldd,
                       const void *inp, const void *w, int N, int IC, int OC)
{
    rt_gemm(0, 0, N, IC, OC, 1.0f, dout, ldd, 0, w, IC, 0, beta, dinp, IC, 0, 1, ACT, ACT);
    rt_gemm(1, 0, OC, IC, N, 1.0f, dout, ldd, 0, inp, IC, 0, 1.0f, dw, IC, 0, 1, ACT, RT_F32);
}

static void rms1_fwd(const gpt_layer_params *p, gpt_layer_acts *a, const void *x)
{
    const gpt_dims *d = &gpt.d;
    rmsnorm_fwd(a->ln1, a->ln1_rstd, x, p->ln_1_w, d->n_sp, d->C, d->ln_eps, ACT);
}

static void rms2_fwd(const gpt_layer_params *p, gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    rmsnorm_fwd(a->ln2, a->ln2_rstd, a->res1, p->ln_2_w, d->n_sp, d->C, d->ln_eps, ACT);
}

/* Rotary positions on the q and k heads of q|k|v projections (N, QKVP_LOCAL), chunk by
** chunk at their true positions (context parallelism); inverse: the backward. */
static void rope_qk(void *qkvp, int inverse)
{
    const gpt_dims *d = &gpt.d;
    size_t ld = (size_t)d->qkvp_local;
    for (int t = 0; t < d->T; t += d->t_chunk) {
        void *rows = lib_at(qkvp, (size_t)t * d->B * ld);
        int pos = lib_cp_position(t);
        rope_fwd(rows, ld, d->t_chunk, d->B, d->heads_local, d->head_dim, pos, d->rope_theta,
                 inverse, ACT);
        rope_fwd(lib_at(rows, (size_t)d->heads_local * d->head_dim), ld, d->t_chunk, d->B,
                 d->kv_local, d->head_dim, pos, d->rope_theta, inverse, ACT);
    }
}

/* q|k|v of h (ln_1's output, gathered under SP) into the attention's layout a->qkv: the
** projections, rotated, each kv head repeated for its HEADS_LOCAL/KV_LOCAL query heads. */
static void qkv_fwd(const gpt_layer_params *p, gpt_layer_acts *a, const void *h)
{
    const gpt_dims *d = &gpt.d;
    int qn = d->heads_local * d->head_dim, kvn = d->kv_local * d->head_dim, P = d->qkvp_local;
    linear_fwd(lib.s.qkvp, P, h, p->c_attn_w, d->N, d->C, qn);
    linear_fwd(lib_at(lib.s.qkvp, (size_t)qn), P, h, p->k_w, d->N, d->C, kvn);
    linear_fwd(lib_at(lib.s.qkvp, (size_t)(qn + kvn)), P, h, p->v_w, d->N, d->C, kvn);
    rope_qk(lib.s.qkvp, 0);
    kv_expand(a->qkv, lib.s.qkvp, d->N, d->heads_local, d->kv_local, d->head_dim, ACT);
}

/* fc = [h . gate^T | h . up^T] (N, 2 FF_LOCAL), gelu := silu(gate) * up (N, FF_LOCAL). */
static void swiglu_up(const gpt_layer_params *p, gpt_layer_acts *a, const void *h)
{
    const gpt_dims *d = &gpt.d;
    int F = d->ff_local;
    linear_fwd(a->fc, 2 * F, h, p->c_fc_w, d->N, d->C, F);
    linear_fwd(lib_at(a->fc, (size_t)F), 2 * F, h, p->up_w, d->N, d->C, F);
    swiglu_fwd(a->gelu, a->fc, d->N, F, ACT);
}

/* down(swiglu(gate|up(ln_2))) as this rank's (N_SP, C) rows: mlp_fwd's Llama form (the dense
** MLP or the shared expert). */
static void *llama_mlp_fwd(const gpt_layer_params *p, gpt_layer_acts *a)
{
    const gpt_dims *d = &gpt.d;
    swiglu_up(p, a, gather_seq(lib.s.gather, a->ln2));
    linear_fwd(lib.s.full, d->C, a->gelu, p->mlp_proj_w, d->N, d->ff_local, d->C);
    return reduce_seq(lib.s.full);
}

/* Backward of llama_mlp_fwd, as mlp_bwd. */
static void *llama_mlp_bwd(const gpt_layer_params *p, gpt_layer_params *g,
                           const gpt_layer_acts *a, const void *dout)
{
    const gpt_dims *d = &gpt.d;
    int N = d->N, C = d->C, F = d->ff_local;
    const void *h = gather_seq(lib.s.gather, a->ln2);
    if (d->rc_mlp) swiglu_up(p, (gpt_layer_acts *)a, h);
    const void *dd = gather_seq(lib.s.full, dout);
    linear_bwd(lib.s.dact, 0.0f, g->mlp_proj_w, dd, C, a->gelu, p->mlp_proj_w, N, F, C);
    swiglu_bwd(lib.s.dfc, lib.s.dact, a->fc, N, F, ACT);
    linear_bwd(lib.s.full, 0.0f, g->c_fc_w, lib.s.dfc, 2 * F, h, p->c_fc_w, N, C, F);
    linear_bwd(lib.s.full, 1.0f, g->up_w, lib_at(lib.s.dfc, (size_t)F), 2 * F, h, p->up_w,
               N, C, F);
    return reduce_seq(lib.s.full);
}

/* x (N_SP, C) -> a->res2: x + o_proj(attention(rope(q|k|v(rms(x))))), then
** + down(swiglu(gate|up(rms(.)))) or the mixture of experts (and the shared expert). */
static void llama_layer_fwd(const gpt_layer_params *p, gpt_layer_acts *a, const void *x)
{
    const gpt_dims *d = &gpt.d;
    size_t rows = (size_t)d->n_sp * d->C;
    rms1_fwd(p, a, x);
    const void *h = gather_seq(lib.s.gather, a->ln1);
    qkv_fwd(p, a, h);
    attention_core(a);
    linear_fwd(lib.s.full, d->C, a->atty, p->attn_proj_w, d->N, d->c_local, d->C);
    add_fwd(a->res1, x, reduce_seq(lib.s.full), rows, ACT);

    rms2_fwd(p, a);
    if (d->moe)
        moe_branch_fwd(p, a, llama_mlp_fwd);
    else
        add_fwd(a->res2, a->res1, llama_mlp_fwd(p, a), rows, ACT);
}

/* Backward of llama_layer_fwd, as layer_bwd: dres holds d(res2) on entry, d(x) on return. */
static void llama_layer_bwd(const gpt_layer_params *p, gpt_layer_params *g,
                            const gpt_layer_acts *a, const void *x, void *dres)
{
    const gpt_dims *d = &gpt.d;
    gpt_layer_acts *w = (gpt_layer_acts *)a;       /* what recompute writes again */
    const void *dd, *h;
    int N = d->N, C = d->C;
    if (d->rc_ln) rms2_fwd(p, w);
    dd = d->moe ? moe_branch_bwd(p, g, a, dres, llama_mlp_bwd) : llama_mlp_bwd(p, g, a, dres);
    rmsnorm_bwd(dres, g->ln_2_w, dd, a->res1, p->ln_2_w, a->ln2_rstd, d->n_sp, C, ACT);

    /* attention branch */
    int qn = d->heads_local * d->head_dim, kvn = d->kv_local * d->head_dim, P = d->qkvp_local;
    if (d->rc_ln) rms1_fwd(p, w, x);
    h = gather_seq(lib.s.gather, a->ln1);
    if (d->rc_attn) attention_core(w);
    dd = gather_seq(lib.s.full, dres);
    linear_bwd(lib.s.datty, 0.0f, g->attn_proj_w, dd, C, a->atty, p->attn_proj_w, N,
               d->c_local, C);
    attention_core_bwd(a);
    kv_reduce(lib.s.qkvp, lib.s.dqkv, N, d->heads_local, d->kv_local, d->head_dim, ACT);
    rope_qk(lib.s.qkvp, 1);
    linear_bwd(lib.s.full, 0.0f, g->c_attn_w, lib.s.qkvp, P, h, p->c_attn_w, N, C, qn);
    linear_bwd(lib.s.full, 1.0f, g->k_w, lib_at(lib.s.qkvp, (size_t)qn), P, h, p->k_w, N, C,
               kvn);
    linear_bwd(lib.s.full, 1.0f, g->v_w, lib_at(lib.s.qkvp, (size_t)(qn + kvn)), P, h, p->v_w,
               N, C, kvn);
    dd = reduce_seq(lib.s.full);
    rmsnorm_bwd(dres, g->ln_1_w, dd, x, p->ln_1_w, a->ln1_rstd, d->n_sp, C, ACT);
}

/* -- Embedding (first stage, chunk 0) ------------------------------------------------------- */

/*
** out (N_SP, C) = wte[tok] + wpe[t]. The vocabulary-parallel lookup gives zero rows for tokens
** other ranks own; the all-reduce over tp completes every row (docs/megatron.md §4.4).
*/
static void embedding_fwd(const lib_embed *p, void *out, const int *tok)
{
    const gpt_dims *d = &gpt.d;
    void *full = d->sp ? lib.s.full : out;
    embed_fwd(full, tok, p->wte, d->N, d->C, gpt.vocab_start, d->v_local, ACT);
    if (d->tp > 1)   /* >>> all-reduce over tp: each rank looked up its vocabulary's tokens */
        rt_allreduce(full, (size_t)d->N * d->C, ACT, RT_SUM, gpt.grp[GPT_GRP_TP]);
    /* each chunk at its true positions (llama: none here; rotary, in the layers) */
    for (int t = 0; t < d->T && !d->llama; t += d->t_chunk)
        pos_fwd(lib_at(full, (size_t)t * d->B * d->C), p->wpe, d->t_chunk, d->B, d->C,
                lib_cp_position(t), ACT);
    if (d->sp)   /* scatter to the sequence-parallel region: keep this rank's rows */
        rt_memcpy(out, lib_at(full, (size_t)gpt.tp_rank * d->n_sp * d->C),
                  (size_t)d->n_sp * d->C * lib.es, RT_D2D);
}

/* Backward of embedding_fwd for dout (N_SP, C); accumulates into g (f32). */
static void embedding_bwd(lib_embed *g, const void *dout, const int *tok)
{
    const gpt_dims *d = &gpt.d;
    const void *dd = gather_seq(lib.s.full, dout);
    embed_bwd(g->wte, dd, tok, d->N, d->C, gpt.vocab_start, d->v_local, ACT);
    for (int t = 0; t < d->T && !d->llama; t += d->t_chunk)
        pos_bwd(g->wpe, lib_at(dd, (size_t)t * d->B * d->C), d->t_chunk, d->B, d->C,
                lib_cp_position(t), ACT);
}

/* -- Head and loss (last stage, last chunk) -------------------------------------------------- */

/*
** ln_f, logits = h . wte^T over this rank's vocabulary columns, vocabulary-parallel
** cross-entropy (docs/megatron.md §4.5; in f32 from the logits, §9.1) and, fused, its
** backward: dx (N_SP, C) receives d(loss)/d(x) for the micro-batch's share 1/(N*NMB) of the
** step's mean loss; the head's gradients accumulate into g. *loss_sum (device) gets the sum
** of the N token losses.
*/
static void head_fwd_bwd(const lib_head *p, lib_head *g, lib_head_acts *a, const void *x,
                         const int *targets, float *loss_sum, void *dx)
{
    const gpt_dims *d = &gpt.d;
    int N = d->N, C = d->C, Vl = d->v_local;
    float *mx = lib.s.ce, *sums = lib.s.ce + N, *loss = lib.s.ce + 3 * (size_t)N;
    if (d->llama) rmsnorm_fwd(a->lnf, a->lnf_rstd, x, p->ln_f_w, d->n_sp, C, d->ln_eps, ACT);
    else layernorm_fwd(a->lnf, a->lnf_mean, a->lnf_rstd, x, p->ln_f_w, p->ln_f_b, d->n_sp, C,
                       d->ln_eps, ACT);
    const void *h = gather_seq(lib.s.full, a->lnf);
    rt_gemm(0, 1, N, Vl, C, 1.0f, h, C, 0, p->wte, C, 0, 0.0f, lib.s.logits, Vl, 0, 1, ACT,
            ACT);
    ce_rowmax(mx, lib.s.logits, N, Vl, gpt.vocab_valid, ACT);
    if (d->tp > 1)   /* >>> all-reduce MAX over tp: the row maxima over the whole vocabulary */
        rt_allreduce(mx, (size_t)N, RT_F32, RT_MAX, gpt.grp[GPT_GRP_TP]);
    ce_sums(sums, lib.s.logits, mx, targets, N, Vl, gpt.vocab_valid, gpt.vocab_start, ACT);
    if (d->tp > 1)   /* >>> all-reduce SUM over tp: [sum of exp | target logit] (its owner's) */
        rt_allreduce(sums, 2 * (size_t)N, RT_F32, RT_SUM, gpt.grp[GPT_GRP_TP]);
    ce_loss(loss, sums, mx, N);
    sum_rows(loss_sum, loss, N);

    /* backward: dlogits = (softmax - onehot) * DLOSS, in place; no communication (§4.5) */
    ce_bwd(lib.s.logits, mx, sums, targets, N, Vl, gpt.vocab_valid, gpt.vocab_start, d->dloss,
           ACT);
    rt_gemm(1, 0, Vl, C, N, 1.0f, lib.s.logits, Vl, 0, h, C, 0, 1.0f, g->wte, C, 0, 1, ACT,
            RT_F32);
    rt_gemm(0, 0, N, C, Vl, 1.0f, lib.s.logits, Vl, 0, p->wte, C, 0, 0.0f, lib.s.full, C, 0, 1,
            ACT, ACT);
    const void *dh = reduce_seq(lib.s.full);
    rt_memset0(dx, (size_t)d->n_sp * C * lib.es);
    if (d->llama) rmsnorm_bwd(dx, g->ln_f_w, dh, x, p->ln_f_w, a->lnf_rstd, d->n_sp, C, ACT);
    else layernorm_bwd(dx, g->ln_f_w, g->ln_f_b, dh, x, p->ln_f_w, a->lnf_mean, a->lnf_rstd,
                       d->n_sp, C, ACT);
}

/* -- What the generated chunks call ----------------------------------------------------------- */

void gpt_embedding_fwd(int chunk, int mb, int slot)
{
    gpt_chunk_acts *a = &gpt.chunk[chunk].acts[slot];
    size_t N = (size_t)gpt.d.N;
    rt_memcpy(a->tokens, gpt.in->inputs + (size_t)mb * N, N * sizeof(int), RT_H2D);
    embedding_fwd(&lib.embed_p, a->x, a->tokens);
}

void gpt_embedding_bwd(int chunk, int slot)
{
    gpt_chunk_acts *a = &gpt.chunk[chunk].acts[slot];
    embedding_bwd(&lib.embed_g, a->dy, a->tokens);
}

void gpt_layer_fwd(int chunk, int j, int slot)
{
    gpt_chunk *c = &gpt.chunk[chunk];
    gpt_chunk_acts *a = &c->acts[slot];
    const void *x = j == 0 ? a->x : a->layer[j - 1].res2;
    if (gpt.d.llama) llama_layer_fwd(&c->params[j], &a->layer[j], x);
    else layer_fwd(&c->params[j], &a->layer[j], x);
}

/* Full recompute: the layer's forward again from its kept input, into the recompute
** workspace where its buffers live; the same numbers as the first time (docs/megatron.md
** §9.2). */
void gpt_layer_recompute(int chunk, int j, int slot)
{
    gpt.recomputing = 1;
    gpt_layer_fwd(chunk, j, slot);
    gpt.recomputing = 0;
}

void gpt_layer_bwd(int chunk, int j, int slot)
{
    gpt_chunk *c = &gpt.chunk[chunk];
    gpt_chunk_acts *a = &c->acts[slot];
    const void *x = j == 0 ? a->x : a->layer[j - 1].res2;
    if (gpt.d.llama) llama_layer_bwd(&c->params[j], &c->grads[j], &a->layer[j], x, a->dy);
    else layer_bwd(&c->params[j], &c->grads[j], &a->layer[j], x, a->dy);
}

void gpt_head_fwd_bwd(int chunk, int mb, int slot)
{
    size_t N = (size_t)gpt.d.N;
    gpt_chunk_acts *a = &gpt.chunk[chunk].acts[slot];
    rt_memcpy(lib.s.targets, gpt.in->targets + (size_t)mb * N, N * sizeof(int), RT_H2D);
    head_fwd_bwd(&lib.head_p, &lib.head_g, &lib.head_a, gpt_chunk_output(chunk, slot),
                 lib.s.targets, lib.loss_dev + mb, a->dy);
}

void *gpt_chunk_output(int chunk, int slot)
{
    int last = gpt.stage->chunks[chunk].layers - 1;
    gpt_chunk_acts *a = &gpt.chunk[chunk].acts[slot];
    return last < 0 ? a->x : a->layer[last].res2;   /* no layers (a layout's "E|"): its input */
}
