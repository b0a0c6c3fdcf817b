-- drop_policy must be one of Megatron's two
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        experts = 8,
        top_k = 2,
        capacity_factor = 1.0,
        drop_policy = "random",
    },
}
