-- biases (add_bias_linear, the default: the router's and the experts' too) with ETP 2
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe { experts = 8, top_k = 2 },
}
