-- moe_top1: models/tiny_moe.lua with top-1 routing (Switch), for tests/moe. Megatron needs
-- pre_softmax with top-1 (a softmax over one logit is 1, with no gradient), so a token's
-- probability is its expert's softmax over all 8 experts.
return gpt {
    description = "tiny MoE GPT, top-1",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts        = 8,
        top_k          = 1,
        pre_softmax    = true,
        ffn_hidden     = 128,
        aux_loss_coeff = 0.01,
    },
}
