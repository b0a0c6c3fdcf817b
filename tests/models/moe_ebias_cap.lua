-- moe_ebias_cap: tests/models/moe_ebias.lua with group-limited routing (4 groups of 2, the
-- best 2: the groups are scored with the bias too) and capacity factor 1 (the bias counts the
-- choices each expert kept, as Megatron's routing map after dropping), for tests/moe.
return gpt {
    description = "tiny MoE GPT, expert bias with groups and a capacity",
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
        num_groups       = 4,
        group_topk       = 2,
        capacity_factor  = 1,
    },
}
