-- moe_pre: models/tiny_moe.lua with Megatron's moe_router_pre_softmax (softmax over all
-- experts, then top-k of the probabilities, not renormalised), for tests/moe.
return gpt {
    description = "tiny MoE GPT, softmax before top-k",
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
        pre_softmax    = true,
    },
}
