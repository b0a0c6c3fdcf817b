-- tests/llama/tied_llama.lua: tiny_llama with the LM head tied to embed_tokens
-- (tie_embeddings = true, as Llama 3.2 1B/3B do), for the embedding group at PP > 1.
return llama {
    description = "tiny Llama, tied embeddings",
    layers         = 8,
    hidden         = 64,
    heads          = 8,
    kv_heads       = 4,
    ffn_hidden     = 128,
    seq_len        = 64,
    vocab          = 256,
    tie_embeddings = true,
}
