-- moe must come from moe{ }
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = { experts = 8, top_k = 2 },
}
