-- moe_ebias_aux: tests/models/moe_ebias.lua (sigmoid scores, the expert bias at rate 0.01) with
-- the aux loss on too, for tests/moe: the tokens go where the bias sends them, the aux loss
-- counts the plain top-k without the bias (Megatron's compute_routing_scores_for_aux_loss).
return gpt {
    description = "tiny MoE GPT, expert bias and aux loss",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts          = 8,
        top_k            = 2,
        ffn_hidden       = 128,
        aux_loss_coeff   = 0.01,
        score_function   = "sigmoid",
        expert_bias      = true,
        bias_update_rate = 0.01,
    },
}
