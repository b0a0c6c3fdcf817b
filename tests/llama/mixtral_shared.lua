-- mixtral_shared: models/tiny_mixtral.lua with a shared SwiGLU expert of width 96 on every
-- token beside the routed ones (Megatron's moe_shared_expert_intermediate_size, no gate),
-- saved under Qwen2-MoE's names (model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj),
-- for tests/llama.
return llama {
    description = "tiny Mixtral with a shared expert",
    layers     = 4,
    hidden     = 64,
    heads      = 8,
    kv_heads   = 4,
    ffn_hidden = 128,
    seq_len    = 64,
    vocab      = 256,
    moe = moe {
        experts           = 8,
        top_k             = 2,
        ffn_hidden        = 128,
        aux_loss_coeff    = 0.01,
        shared_expert_ffn = 96,
    },
}
