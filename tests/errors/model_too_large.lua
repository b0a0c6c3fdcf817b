-- more layers than the generator accepts
return gpt {
    layers = 100000,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
}
