-- tie_embeddings is a boolean
return llama {
    layers = 2,
    hidden = 64,
    heads = 8,
    ffn_hidden = 128,
    seq_len = 64,
    vocab = 256,
    tie_embeddings = "yes",
}
