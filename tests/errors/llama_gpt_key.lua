-- layernorm-style keys of gpt{} are not llama{} keys
return llama {
    layers = 2,
    hidden = 64,
    heads = 8,
    ffn_hidden = 128,
    seq_len = 64,
    vocab = 256,
    rope = true,
}
