-- moe_cap: models/tiny_moe.lua with a capacity factor of 1 (each expert keeps at most
-- ceil(N*K/E) of a router call's N tokens x K = 2 choices, those of highest probability,
-- Megatron's default drop policy "probs": 16 of 64 x 2 for a micro-batch of one sequence;
-- tests/ref/README.md "Capacity"), for tests/moe. Random routing is uneven enough that every
-- step drops choices.
return gpt {
    description = "tiny MoE GPT with capacity factor 1",
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
    },
}
