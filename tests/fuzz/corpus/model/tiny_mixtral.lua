-- tiny_mixtral: tiny_llama's attention with a Mixtral mixture of 8 SwiGLU experts (top-2)
-- in every layer, for tests of the expert grid (EP, ETP, EDP) on the Llama family. Each
-- expert is w2(silu(w1 x) * w3 x), 64 -> 128 -> 64, without biases (so ETP may be > 1).
return llama {
    description = "tiny Mixtral: 8 SwiGLU experts, top-2",
    layers     = 4,
    hidden     = 64,
    heads      = 8,
    kv_heads   = 4,
    ffn_hidden = 128,
    seq_len    = 64,
    vocab      = 256,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 128,
        aux_loss_coeff = 0.01,
    },
}
