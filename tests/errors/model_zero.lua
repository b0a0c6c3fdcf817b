-- no layers
return gpt {
    layers = 0,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
}
