-- mixtral_ebias: models/tiny_mixtral.lua with aux-loss-free load balancing (Megatron's expert
-- bias, sigmoid scores as it requires; rate 0.01), saved as Hugging Face DeepSeek-V3 names it
-- (model.layers.{i}.block_sparse_moe.gate.e_score_correction_bias), for tests/llama.
return llama {
    description = "tiny Mixtral with an expert bias",
    layers     = 4,
    hidden     = 64,
    heads      = 8,
    kv_heads   = 4,
    ffn_hidden = 128,
    seq_len    = 64,
    vocab      = 256,
    moe = moe {
        experts          = 8,
        top_k            = 2,
        ffn_hidden       = 128,
        aux_loss_coeff   = 0.01,
        score_function   = "sigmoid",
        expert_bias      = true,
        bias_update_rate = 0.01,
    },
}
