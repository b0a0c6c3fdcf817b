-- moe_cap_pos: tests/models/moe_cap.lua with Megatron's other drop policy, "position" (an
-- expert keeps the earliest rows t*B + b of its rank's choices), and pad_to_capacity (every
-- expert gets exactly its capacity of rows, topped up with zero-probability rows), for
-- tests/moe.
return gpt {
    description = "tiny MoE GPT, capacity 1, drop by position, padded",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts         = 8,
        top_k           = 2,
        ffn_hidden      = 128,
        aux_loss_coeff  = 0.01,
        capacity_factor = 1.0,
        drop_policy     = "position",
        pad_to_capacity = true,
    },
}
