-- moe_shared: tests/models/moe_bias.lua with a shared expert (Megatron's
-- moe_shared_expert_intermediate_size, no gate): a GELU MLP 64 -> 96 -> 64 with the model's
-- biases on every token beside the 8 routed experts, split over tp like the dense MLP, for
-- tests/moe. Biases in MoE layers need ETP 1.
return gpt {
    description = "tiny MoE GPT with biases and a shared expert",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    moe = moe {
        experts           = 8,
        top_k             = 2,
        ffn_hidden        = 128,
        aux_loss_coeff    = 0.01,
        shared_expert_ffn = 96,
    },
}
