-- moe_scale: models/tiny_moe.lua with Megatron's moe_router_topk_scaling_factor (every chosen
-- probability times 2.5, as DeepSeek-V3's routed scaling), for tests/moe.
return gpt {
    description = "tiny MoE GPT, top-k scaling factor 2.5",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts             = 8,
        top_k               = 2,
        ffn_hidden          = 128,
        aux_loss_coeff      = 0.01,
        topk_scaling_factor = 2.5,
    },
}
