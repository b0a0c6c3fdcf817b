-- mixtral_8x7b: Mistral AI Mixtral 8x7B (Hugging Face mistralai/Mixtral-8x7B-v0.1
-- config.json): 32 layers, hidden 4096, 32 heads sharing 8 key/value heads, 8 SwiGLU experts
-- of width 14336 per layer with 2 chosen per token, rope_theta 1e6, RMSNorm eps 1e-5,
-- vocabulary 32000, untied LM head, router aux loss coefficient 0.02 (router_aux_loss_coef).
-- 46,702,792,704 parameters.
return llama {
    description = "Mixtral 8x7B",
    layers     = 32,
    hidden     = 4096,
    heads      = 32,
    kv_heads   = 8,
    ffn_hidden = 14336,
    seq_len    = 32768,
    vocab      = 32000,
    norm_eps   = 1e-5,
    rope_theta = 1000000.0,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 14336,
        aux_loss_coeff = 0.02,
    },
}
