-- head size 96/32 = 3 is odd: rotary embeddings rotate pairs of channels
return llama {
    layers = 2,
    hidden = 96,
    heads = 32,
    ffn_hidden = 128,
    seq_len = 64,
    vocab = 256,
}
