-- pad_to_capacity without a capacity factor
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        experts = 8,
        top_k = 2,
        pad_to_capacity = true,
    },
}
