-- Mixtral experts have no biases
return llama {
    layers = 2,
    hidden = 64,
    heads = 8,
    ffn_hidden = 128,
    seq_len = 64,
    vocab = 256,
    moe = moe { experts = 4, top_k = 2, bias = true },
}
