-- tiny_moe: tiny with a mixture of 8 experts (top-2) in every MLP, for tests of the expert
-- grid (EP, ETP, EDP). Each expert is a GELU MLP 64 -> 128 -> 64. No linear layer has a
-- bias (Megatron's --disable-bias-linear), so the layout may also use expert tensor
-- parallelism (Megatron allows biases in MoE layers only with ETP 1).
return gpt {
    description = "tiny GPT with 8 experts, top-2",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 128,
        aux_loss_coeff = 0.01,
    },
}
