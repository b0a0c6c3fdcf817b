/*
** gpt_tables.h: the lists the generator and the training library share, each written once:
** the communicators a program may use, the fields of a layer's tensors (with the model's tensor
** names that land in each), every buffer of a stage's memory plan (its element type and shape),
** and the all-to-alls of a MoE layer. X-macros: lib/gpt.h makes the library's enums of them;
** build/gen reads the same lists (gen/tables.c, the Lua module `tables`), so a name or an order
** cannot differ between the generated code and the library. No C types here, no includes.
*/
#ifndef GPT_TABLES_H
#define GPT_TABLES_H

/* The communicators: enum suffix, kind (topology.json), in creation order. */
#define GPT_GROUPS(_) \
    _(TP, "tp") _(DPCP, "dp-cp") _(PP, "pp") _(EMBD, "embd") _(MP, "mp") _(EP, "ep") \
    _(ETP, "expt-tp") _(EDP, "expt-dp") _(TPEPPP, "tp-ep-pp") _(CP, "cp") _(TPCP, "tp-cp")

/* The parameter tensors of the model code: enum suffix, what it is, and the role names
** (gen/lua/shards.lua, Hugging Face GPT-2, Llama, Mixtral and Qwen2-MoE spellings; a shared
** expert lives in the dense MLP's fields) that are seen through it, space-separated. */
#define GPT_FIELDS(_) \
    _(WTE, "wte.weight", \
      "wte.weight embed_tokens.weight") \
    _(WPE, "wpe.weight", \
      "wpe.weight") \
    _(LN_F_W, "ln_f.weight", \
      "ln_f.weight norm.weight") \
    _(LN_F_B, "ln_f.bias", \
      "ln_f.bias") \
    _(HEAD_WTE, "the head's copy of wte.weight", \
      "") \
    _(LN1_W, "ln_1.weight", \
      "ln_1.weight input_layernorm.weight") \
    _(LN1_B, "ln_1.bias", \
      "ln_1.bias") \
    _(QKV_W, "attn.c_attn.weight", \
      "attn.c_attn.weight self_attn.q_proj.weight") \
    _(QKV_B, "attn.c_attn.bias", \
      "attn.c_attn.bias") \
    _(ATTN_PROJ_W, "attn.c_proj.weight", \
      "attn.c_proj.weight self_attn.o_proj.weight") \
    _(ATTN_PROJ_B, "attn.c_proj.bias", \
      "attn.c_proj.bias") \
    _(LN2_W, "ln_2.weight", \
      "ln_2.weight post_attention_layernorm.weight") \
    _(LN2_B, "ln_2.bias", \
      "ln_2.bias") \
    _(FC_W, "mlp.c_fc.weight", \
      "mlp.c_fc.weight mlp.shared_experts.c_fc.weight mlp.gate_proj.weight " \
        "mlp.shared_expert.gate_proj.weight") \
    _(FC_B, "mlp.c_fc.bias", \
      "mlp.c_fc.bias mlp.shared_experts.c_fc.bias") \
    _(MLP_PROJ_W, "mlp.c_proj.weight", \
      "mlp.c_proj.weight mlp.shared_experts.c_proj.weight mlp.down_proj.weight " \
        "mlp.shared_expert.down_proj.weight") \
    _(MLP_PROJ_B, "mlp.c_proj.bias", \
      "mlp.c_proj.bias mlp.shared_experts.c_proj.bias") \
    _(ROUTER_W, "mlp.router.weight", \
      "mlp.router.weight block_sparse_moe.gate.weight") \
    _(ROUTER_B, "mlp.router.bias", \
      "mlp.router.bias") \
    _(EXPERT_FC_W, "mlp.experts.c_fc.weight", \
      "mlp.experts.c_fc.weight block_sparse_moe.experts.w1.weight") \
    _(EXPERT_FC_B, "mlp.experts.c_fc.bias", \
      "mlp.experts.c_fc.bias") \
    _(EXPERT_PROJ_W, "mlp.experts.c_proj.weight", \
      "mlp.experts.c_proj.weight block_sparse_moe.experts.w2.weight") \
    _(EXPERT_PROJ_B, "mlp.experts.c_proj.bias", \
      "mlp.experts.c_proj.bias") \
    _(K_W, "self_attn.k_proj.weight", \
      "self_attn.k_proj.weight") \
    _(V_W, "self_attn.v_proj.weight", \
      "self_attn.v_proj.weight") \
    _(UP_W, "mlp.up_proj.weight", \
      "mlp.up_proj.weight mlp.shared_expert.up_proj.weight") \
    _(EXPERT_UP_W, "block_sparse_moe.experts.w3.weight", \
      "block_sparse_moe.experts.w3.weight") \
    _(LM_HEAD, "lm_head.weight (untied)", \
      "lm_head.weight")

/* Every device buffer of a stage's memory plan: enum suffix (L_: per layer and activation slot
** or recompute workspace position; C_: per chunk slot; H_: head; S_: stage scratch; ML_/MS_:
** a mixture-of-experts layer's / scratch; X_: misc), element type (A: the activations' dtype,
** f32 or bf16; F: f32; I: i32), shape and meaning, and the meaning in a Llama layer where it
** differs (""). Their sizes are the generator's (gen/lua/program.lua memory_plan). */
#define GPT_MEMS(_) \
    _(L_LN1, A, "(N_SP, C) ln_1 output", "") \
    _(L_LN1_MEAN, F, "(N_SP)", "") \
    _(L_LN1_RSTD, F, "(N_SP)", "") \
    _(L_QKV, A, "(N, QKV_LOCAL)", "") \
    _(L_LSE, F, "(B, HEADS_LOCAL, T) attention log-sum-exp", "") \
    _(L_ATTY, A, "(N, C_LOCAL) attention output", "") \
    _(L_RES1, A, "(N_SP, C) x + attention", "") \
    _(L_LN2, A, "(N_SP, C) ln_2 output", "") \
    _(L_LN2_MEAN, F, "(N_SP)", "") \
    _(L_LN2_RSTD, F, "(N_SP)", "") \
    _(L_FC, A, "(N, FF_LOCAL) c_fc output", "(N, 2 FF_LOCAL) gate | up projections") \
    _(L_GELU, A, "(N, FF_LOCAL)", "(N, FF_LOCAL) SwiGLU output") \
    _(L_RES2, A, "(N_SP, C) the layer's output", "") \
    _(L_QKV_SEQ, A, "(N, QKV_LOCAL) CP_COMM=a2a: q|k|v, HEADS_LOCAL/CP heads, whole sequence", "") \
    _(L_ATTY_SEQ, A, "(N, C_LOCAL) CP_COMM=a2a: their attention output", "") \
    _(ML_SCORES, F, "(N_SP, EXPERTS) softmax over all experts", "") \
    _(ML_PROB, F, "(N_SP, TOPK) chosen probabilities", "") \
    _(ML_SEL, I, "(N_SP, TOPK)", "") \
    _(ML_POS, I, "(N_SP, TOPK)", "") \
    _(ML_SEND_TOK, I, "(SEND_MAX)", "") \
    _(ML_ORDER, I, "(ROWS_MAX)", "") \
    _(ML_UNORDER, I, "(ROWS_MAX)", "") \
    _(ML_XE, A, "(ROWS_MAX, C) expert inputs", "") \
    _(ML_PE, F, "(ROWS_MAX)", "") \
    _(ML_FC, A, "(ROWS_MAX, EFF_LOCAL)", "(ROWS_MAX, 2 EFF_LOCAL) w1 | w3 outputs") \
    _(ML_H, A, "(ROWS_MAX, EFF_LOCAL)", "") \
    _(ML_AUXG, F, "(AUX_SEQS, EXPERTS)", "") \
    _(ML_ZG, F, "(N_SP) d(z-loss)/d(logsumexp)", "") \
    _(ML_SSUM, F, "(N_SP) sigmoid scores: the sum of the row's sigmoids + 1e-20", "") \
    _(C_X, A, "(N_SP, C) the chunk's input", "") \
    _(C_DY, A, "(N_SP, C) its gradient", "") \
    _(C_TOKENS, I, "(N) token ids", "") \
    _(H_LNF, A, "(N_SP, C) ln_f output", "") \
    _(H_LNF_MEAN, F, "(N_SP)", "") \
    _(H_LNF_RSTD, F, "(N_SP)", "") \
    _(S_FULL, A, "(N, C) partial sums / the output gradient gathered", "") \
    _(S_FULL_SP, A, "(N_SP, C) reduce-scatter output", "") \
    _(S_GATHER, A, "(N, C) a column-parallel input gathered over tp", "") \
    _(S_DQKV, A, "(N, QKV_LOCAL)", "") \
    _(S_DATTY, A, "(N, C_LOCAL)", "") \
    _(S_DSUM, F, "(B, HEADS_LOCAL, T) attention backward: rowsum(dout * out)", "") \
    _(S_DFC, A, "(N, FF_LOCAL)", "(N, 2 FF_LOCAL) d(gate | up)") \
    _(S_DACT, A, "(N, FF_LOCAL) d(SwiGLU output)", "") \
    _(S_DSHARED, A, "(N_SP, C) shared expert: the routed experts' input gradient", "") \
    _(S_LOGITS, A, "(N, V_LOCAL)", "") \
    _(S_CE, F, "(4N) row max | sum exp | target logit | loss", "") \
    _(S_TARGETS, I, "(N)", "") \
    _(S_RING_KV, A, "(2, N, 2 C_LOCAL) K|V blocks on the cp ring: the one used, the next", "") \
    _(S_RING_DKV, F, "(2, N, 2 C_LOCAL) their dK|dV (backward)", "") \
    _(S_RING_ACC, F, "(N, C_LOCAL) the merged attention output / dq", "") \
    _(S_A2A_SEND, A, "(N, QKV_LOCAL) CP_COMM=a2a: the blocks sent", "") \
    _(S_A2A_RECV, A, "(N, QKV_LOCAL) CP_COMM=a2a: the blocks received", "") \
    _(S_A2A_DOUT, A, "(N, C_LOCAL) CP_COMM=a2a: the output gradient, whole sequence", "") \
    _(MS_LOGITS, F, "(N_SP, EXPERTS)", "") \
    _(MS_XS, A, "(SEND_MAX, C)", "") \
    _(MS_PS, F, "(SEND_MAX)", "") \
    _(MS_XR, A, "(RECV_MAX, C)", "") \
    _(MS_PR, F, "(RECV_MAX)", "") \
    _(MS_XG, A, "(ROWS_MAX, C)", "") \
    _(MS_PG, F, "(ROWS_MAX)", "") \
    _(MS_ACT, A, "(ROWS_MAX, EFF_LOCAL)", "") \
    _(MS_DFC, A, "(ROWS_MAX, 2 EFF_LOCAL) d(w1 | w3 outputs)", "") \
    _(MS_YE, A, "(ROWS_MAX, C)", "") \
    _(MS_YG, A, "(ROWS_MAX, C)", "") \
    _(MS_YR, A, "(RECV_MAX, C)", "") \
    _(MS_YS, A, "(SEND_MAX, C)", "") \
    _(MS_DPE, F, "(ROWS_MAX)", "") \
    _(MS_DPG, F, "(ROWS_MAX)", "") \
    _(MS_DPR, F, "(RECV_MAX)", "") \
    _(MS_DPS, F, "(SEND_MAX)", "") \
    _(MS_DPROB, F, "(N_SP, TOPK)", "") \
    _(MS_DLOGITS, A, "(N_SP, EXPERTS)", "") \
    _(MS_COLSUM, F, "(AUX_SEQS, EXPERTS)", "") \
    _(MS_COUNTS, I, "(MOE_COUNTS)", "") \
    _(X_LOSS, F, "(NMB) loss sums per micro-batch", "") \
    _(X_STAT, F, "(tensors + 3) norm pieces, then dense | experts | total", "") \
    _(X_SP_PACK, F, "packed sequence-parallel gradients", "")

/* A MoE layer's all-to-alls (gpt.h gpt_a2a): the rows per (peer, local expert); rows and
** probabilities to the experts' ranks and back; over expt-tp the gathers and the reduce-
** scatters (an all-to-all of partial blocks), for rows (width C) and probabilities (width 1). */
#define GPT_A2AS(_) _(EP_COUNTS) _(EP_ROWS) _(EP_PROBS) _(EP_BACK) _(EP_BACK_PROBS) \
    _(ETP_ROWS) _(ETP_PROBS) _(ETP_SUM) _(ETP_SUM_PROBS)

#endif
