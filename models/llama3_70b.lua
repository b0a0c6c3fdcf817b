-- llama3_70b: Meta Llama 3 70B (Hugging Face meta-llama/Meta-Llama-3-70B config.json):
-- 80 layers, hidden 8192, 64 heads sharing 8 key/value heads, SwiGLU width 28672,
-- rope_theta 500000, RMSNorm eps 1e-5, vocabulary 128256, untied LM head.
return llama {
    description = "Llama 3 70B",
    layers     = 80,
    hidden     = 8192,
    heads      = 64,
    kv_heads   = 8,
    ffn_hidden = 28672,
    seq_len    = 8192,
    vocab      = 128256,
    norm_eps   = 1e-5,
    rope_theta = 500000.0,
}
