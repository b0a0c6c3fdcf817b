-- bias_update_rate only updates the expert bias
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        experts = 8,
        top_k = 2,
        score_function = "sigmoid",
        bias_update_rate = 1e-2,
    },
}
