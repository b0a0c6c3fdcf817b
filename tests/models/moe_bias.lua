-- moe_bias: models/tiny_moe.lua with Megatron's default add_bias_linear = true: biases in
-- every linear layer, the router's and every expert's c_fc and c_proj included, for
-- tests/moe. Megatron allows MoE biases only with ETP 1, so its layouts set ETP=1.
return gpt {
    description = "tiny MoE GPT with expert biases",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 128,
        aux_loss_coeff = 0.01,
    },
}
