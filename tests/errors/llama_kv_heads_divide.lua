-- 8 query heads cannot share 3 kv heads evenly
return llama {
    layers = 2,
    hidden = 64,
    heads = 8,
    kv_heads = 3,
    ffn_hidden = 128,
    seq_len = 64,
    vocab = 256,
}
