-- moe_ebias: models/tiny_moe.lua with aux-loss-free load balancing (Megatron's expert bias:
-- sigmoid scores, as Megatron requires; no aux loss), its rate raised to 0.01 so that six
-- steps move the choices, for tests/moe.
return gpt {
    description = "tiny MoE GPT, expert bias",
    layers  = 4,
    hidden  = 64,
    heads   = 4,
    seq_len = 64,
    vocab   = 256,
    add_bias_linear = false,
    moe = moe {
        experts          = 8,
        top_k            = 2,
        ffn_hidden       = 128,
        aux_loss_coeff   = 0,
        score_function   = "sigmoid",
        expert_bias      = true,
        bias_update_rate = 0.01,
    },
}
