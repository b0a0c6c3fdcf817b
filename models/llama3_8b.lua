-- llama3_8b: Meta Llama 3 8B (Hugging Face meta-llama/Meta-Llama-3-8B config.json):
-- 32 layers, hidden 4096, 32 heads sharing 8 key/value heads, SwiGLU width 14336,
-- rope_theta 500000, RMSNorm eps 1e-5, vocabulary 128256, untied LM head.
-- 8,030,261,248 parameters.
return llama {
    description = "Llama 3 8B",
    layers     = 32,
    hidden     = 4096,
    heads      = 32,
    kv_heads   = 8,
    ffn_hidden = 14336,
    seq_len    = 8192,
    vocab      = 128256,
    norm_eps   = 1e-5,
    rope_theta = 500000.0,
}
