-- moe_seq: models/tiny_moe.lua with Megatron's load balancing type "seq_aux_loss" (an aux
-- loss per sequence of the micro-batch, averaged over its sequences), for tests/moe.
return gpt {
    description = "tiny MoE GPT, load balancing seq_aux_loss",
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
        load_balancing = "seq_aux_loss",
    },
}
