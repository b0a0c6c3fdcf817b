-- moe_none: models/tiny_moe.lua with Megatron's load balancing type "none" (no
-- load-balancing loss, whatever aux_loss_coeff says), for tests/moe.
return gpt {
    description = "tiny MoE GPT, load balancing none",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 128,
        aux_loss_coeff = 0.01,
        load_balancing = "none",
    },
}
