-- n_embd is a Hugging Face config name; ours is hidden
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    n_embd = 64,
    seq_len = 64,
    vocab = 256,
}
