-- tiny_llama: a small Llama for tests and the CPU demo: 8 layers (PP=4 with VP=2 divides them),
-- hidden 64, 8 query heads of 8 channels sharing 4 key/value heads (grouped-query attention,
-- so TP may be 1, 2 or 4), a SwiGLU MLP 64 -> 128 -> 64, rotary positions, untied LM head,
-- context 64, byte vocabulary (256 tokens: no tokenizer needed).
return llama {
    description = "tiny Llama for tests",
    layers     = 8,
    hidden     = 64,
    heads      = 8,
    kv_heads   = 4,
    ffn_hidden = 128,
    seq_len    = 64,
    vocab      = 256,
}
