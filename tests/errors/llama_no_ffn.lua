-- a Llama must say its SwiGLU width (there is no 4*hidden default)
return llama {
    layers = 2,
    hidden = 64,
    heads = 8,
    seq_len = 64,
    vocab = 256,
}
