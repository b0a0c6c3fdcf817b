-- a model too large to count exactly
return gpt {
    layers = 16384,
    hidden = 1 << 20,
    heads = 1024,
    seq_len = 64,
    vocab = 256,
}
