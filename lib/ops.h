/*
** ops.h: the library's compute steps above the kernels, which generated code calls between its
** collectives: the linear layers on the runtime's GEMM (ops.c), the context-parallel attention
** blocks and the all-to-all reorderings (ops.c), and the mixture of experts' steps (moe.c).
** None communicates: every collective and message is the generated code's. Shapes are
** arguments, as for the kernels (kernels.h); 't' is the storage dtype of activations and
** parameters, gradients are f32 (the main gradients).
*/
#ifndef GPT_OPS_H
#define GPT_OPS_H

#include "rt.h"   // defines: rt_dtype

#ifdef __cplusplus
extern "C" {
#endif

/* -- Linear layers (row-major; one rounding of each output to t) --------------------------- */

/* GPT-2's Conv1D orientation, w (IC, OC): out (N, OC) = inp (N, IC) . w [+ bias (OC); NULL:
** none]. With a bias, where the backend fuses it into the GEMM (rt_gemm_epi: cuBLASLt) the sum
** and the bias are rounded once; elsewhere the product is rounded, then the sum (bias_fwd). */
void matmul_fwd(void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                int OC, rt_dtype t);
/* The MLP's first half: pre (N, OC) = inp . w [+ bias], out (N, OC) = gelu(pre). Fused
** (rt_gemm_epi: out is the GELU of the unrounded sum) or matmul_fwd then gelu_fwd. */
void matmul_gelu_fwd(void *pre, void *out, const void *inp, const void *w, const void *bias,
                     int N, int IC, int OC, rt_dtype t);
/* dw (IC, OC) += inp^T . dout (f32); dbias (OC) += column sums of dout (NULL: none);
** dinp (N, IC) = dout . w^T, written after the weight gradient (dinp may be inp). */
void matmul_bwd(void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                const void *w, int N, int IC, int OC, rt_dtype t);
/* matmul_bwd through a GELU: dw (IC, OC) += inp^T . dout, then dinp (N, IC) = (dout . w^T) *
** gelu'(pre) (pre: the GELU's input, N x IC), the gradient of the GELU's input. Fused
** (rt_gemm_epi: the product unrounded) or matmul_bwd then gelu_bwd. */
void matmul_bwd_gelu(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                     const void *pre, int N, int IC, int OC, rt_dtype t);
/* nn.Linear's orientation, w (OC, IC): out (N, OC; rows of ldo) = inp (N, IC) . w^T. */
void linear_fwd(void *out, int ldo, const void *inp, const void *w, int N, int IC, int OC,
                rt_dtype t);
/* dw (OC, IC) += dout^T . inp (f32); then dinp (N, IC) = dout . w (beta 0) or += (beta 1);
** dout: rows of ldd. dinp may be inp (the weight gradient is taken first). */
void linear_bwd(void *dinp, float beta, float *dw, const void *dout, int ldd, const void *inp,
                const void *w, int N, int IC, int OC, rt_dtype t);

/* -- Context parallelism (docs/megatron.md §12) ------------------------------------------- */

/*
** A cp rank holds two chunks of T/2 positions of every sequence: chunk cp_rank (local rows
** [0, T/2*B)) and chunk 2*cp-1-cp_rank. At hop i of the ring it holds cp rank s's K|V block
** (s = (cp_rank - i) mod cp): kv (B*T rows of 2*KVl*hd, k then v of the KVl kv heads). The
** query and key halves the causal mask does not hide entirely are attended to: a key chunk
** before the query chunk whole, the same chunk with the causal rule. qkv: this rank's q|k|v
** (rows of (Hl + 2*KVl)*hd, kernels.h).
*/
/* The block's attention merged into the f32 output acc (rows of Hl*hd) and lse (B, Hl, T). */
void cp_ring_fwd_block(int i, int cp, int cp_rank, float *acc, float *lse, const void *qkv,
                       const void *kv, int B, int T, int Hl, int KVl, int hd, float scale,
                       rt_dtype t);
/* Its gradients: dq (f32, rows of Hl*hd) and the block's dK|dV (f32, rows of 2*KVl*hd) +=, from
** dout (rows of Hl*hd), the final lse and dsum (B, Hl, T). */
void cp_ring_bwd_block(int i, int cp, int cp_rank, float *dq, float *dkv, const void *dout,
                       const float *lse, const float *dsum, const void *qkv, const void *kv,
                       int B, int T, int Hl, int KVl, int hd, float scale, rt_dtype t);
/* CP_COMM=a2a: head groups between 'rows' (N rows of [q (qc) | k (kc) | v (kc)]; kc = 0: q
** alone) and 'blocks' (cp blocks of N rows of (qc + 2*kc)/cp: block j holds head group j of
** every part, qc/cp and kc/cp channels); pack = 1: rows -> blocks, 0: back. Group j's query
** heads read group j's kv heads when cp divides the kv heads (config.lua checks it). */
void cp_a2a_heads(void *blocks, void *rows, int qc, int kc, int pack, int N, int cp,
                  rt_dtype t);
/* Rows of width w between the received order (block s: cp rank s's local rows, its chunk s
** then chunk 2cp-1-s, tc*B rows each) and the sequence order (rows t*B + b of the whole
** sequence, N*cp rows); to_seq = 1 from the first to the second, 0 back. */
void cp_a2a_order(void *dst, const void *src, int w, int to_seq, int N, int cp, int tc, int B,
                  rt_dtype t);

/* -- Mixture of experts (moe.c; docs/megatron.md §8) --------------------------------------- */

/*
** The steps of a MoE layer between its collectives, on the layer's routing state m and its
** tensors w (gradients dw, f32) by field (gpt.h gpt_params); the rows travel in the stage's
** MoE buffers (MS_*). Forward: route, (all-gather the aux loss's counts over tp), dispatch,
** (all-to-all the counts and then the rows over ep: recv_plan), (all-gather over expt-tp:
** member_plan), the experts, (reduce-scatter over expt-tp: sum_members), (all-to-all back),
** combine. Backward: the output gradients' rows, the same exchanges the other way, the
** experts' backward, the router's backward.
*/
typedef struct gpt_moe gpt_moe;
/* Router logits, top-k and probabilities of x (N_SP, C); the aux loss's token counts of this
** rank's rows into counts[0 .. AUX_SEQS*E) (device i32). */
void moe_router_fwd(gpt_moe *m, void *const *w, const void *x, int *counts);
/* The aux loss (from the counts of the tp-cp group: TP*CP blocks, or this rank's) and the
** z-loss, added to the step's unless again (a recomputed forward); the dispatch order (the
** capacity, padding), the rows to send gathered into MS_XS with their probabilities in MS_PS;
** with EP or ETP > 1 the rows per (peer, local expert) into counts[0 .. EP*NL). */
void moe_dispatch(gpt_moe *m, void *const *w, const void *x, int *counts, int again);
/* EP > 1: the rows each peer sends, from counts[EP*NL ..]; the all-to-alls' counts. With
** ETP > 1, this rank's received rows per (peer, local expert) into counts[0 .. EP*NL). */
void moe_recv_plan(gpt_moe *m, int *counts);
/* ETP > 1: every member's received rows from counts[EP*NL ..]; the expt-tp exchanges' counts. */
void moe_member_plan(gpt_moe *m, int *counts);
/* The experts on every row they hold (x, p: the rows and probabilities as received): their
** outputs in member-major order in MS_YG. */
void moe_experts_fwd(gpt_moe *m, void *const *w, const void *x, const float *p);
/* out = the sum of the ETP blocks of this rank's rows (width elements each) in 'blocks'. */
void moe_sum_members(gpt_moe *m, void *out, const void *blocks, int width, rt_dtype t);
/* out (N_SP, C) = each token's sum of its kept choices' rows of src (dispatch order). */
void moe_combine(gpt_moe *m, void *out, const void *src);
/* Backward: each kept choice's row of dout (N_SP, C) into MS_YS, in dispatch order. */
void moe_bwd_rows(gpt_moe *m, const void *dout);
/* The experts' backward on the output gradients dy (member-major rows as received): weight
** gradients into dw; the input and probability gradients' rows into MS_YG and MS_DPG. */
void moe_experts_bwd(gpt_moe *m, void *const *w, float *const *dw, const void *dy);
/* dx (N_SP, C) = the gradient of the layer's input x, from the rows' input gradients dxs and
** probability gradients dps (dispatch order) through the combine and the router; the
** router's gradients into dw. */
void moe_router_bwd(gpt_moe *m, void *const *w, float *const *dw, const void *x,
                    const void *dxs, const float *dps, void *dx);

#ifdef __cplusplus
}
#endif
#endif
