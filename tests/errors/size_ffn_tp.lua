-- an MLP width that TP 4 cannot split
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    ffn_hidden = 102,
}
