-- num_experts is not a moe{} key
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        num_experts = 8,
        experts = 8,
        top_k = 2,
    },
}
