-- moe_z: models/tiny_moe.lua with Megatron's router z-loss (moe_z_loss_coeff; 0.01, ten times
-- the usual 1e-3 so that it visibly moves the router), for tests/moe.
return gpt {
    description = "tiny MoE GPT with a router z-loss",
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
        z_loss_coeff   = 0.01,
    },
}
