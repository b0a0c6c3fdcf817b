-- a shared expert width that TP 4 cannot split (the shared expert is tensor-parallel like the
-- dense MLP, over tp, not over the expert tensor-parallel group)
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    add_bias_linear = false,
    moe = moe {
        experts = 8,
        top_k = 2,
        ffn_hidden = 128,
        shared_expert_ffn = 98,
    },
}
