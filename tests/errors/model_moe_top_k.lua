-- top-3 of 2 experts
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        experts = 2,
        top_k = 3,
    },
}
