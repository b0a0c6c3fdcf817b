-- moe_sigmoid: models/tiny_moe.lua with Megatron's sigmoid score function (the chosen
-- sigmoids over their sum, as DeepSeek-V3) and top-k scaling factor 2.5, for tests/moe.
return gpt {
    description = "tiny MoE GPT, sigmoid scores",
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
        score_function      = "sigmoid",
        topk_scaling_factor = 2.5,
    },
}
