-- moe_ebias_seq: tests/models/moe_ebias_aux.lua with Megatron's load balancing type
-- "seq_aux_loss" (the aux loss per sequence, averaged), for tests/moe: the per-sequence counts
-- are the plain top-k's too, not the bias's.
return gpt {
    description = "tiny MoE GPT, expert bias and seq_aux_loss",
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
        load_balancing   = "seq_aux_loss",
        score_function   = "sigmoid",
        expert_bias      = true,
        bias_update_rate = 0.01,
    },
}
