-- moe_top1: models/tiny_moe.lua with top-1 routing (Switch), for tests/moe. Without
-- pre_softmax a token's probability is 1, so the router learns only through the aux loss.
return gpt {
    description = "tiny MoE GPT, top-1",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    moe = moe {
        experts        = 8,
        top_k          = 1,
        ffn_hidden     = 128,
        aux_loss_coeff = 0.01,
        bias           = false,
    },
}
