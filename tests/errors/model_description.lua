-- description must be text
return gpt {
    description = 42,
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
}
