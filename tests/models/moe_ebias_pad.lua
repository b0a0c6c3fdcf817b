-- moe_ebias_pad: tests/models/moe_ebias.lua with capacity factor 1 padded to the capacity:
-- Megatron counts the padded routing map, the same rows for every expert, so the bias never
-- moves (sign(0) = 0), for tests/moe.
return gpt {
    description = "tiny MoE GPT, expert bias with padding to the capacity",
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
        aux_loss_coeff   = 0,
        score_function   = "sigmoid",
        expert_bias      = true,
        bias_update_rate = 0.01,
        capacity_factor  = 1,
        drop_policy      = "position",
        pad_to_capacity  = true,
    },
}
