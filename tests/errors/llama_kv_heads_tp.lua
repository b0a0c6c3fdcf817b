-- 2 kv heads cannot be split over TP 4 (Megatron would replicate them; we do not)
return llama {
    layers = 2,
    hidden = 64,
    heads = 8,
    kv_heads = 2,
    ffn_hidden = 128,
    seq_len = 64,
    vocab = 256,
}
