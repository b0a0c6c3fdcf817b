-- 100 channels cannot be cut into 12 heads
return gpt {
    layers = 4,
    hidden = 100,
    heads = 12,
    seq_len = 64,
    vocab = 256,
}
