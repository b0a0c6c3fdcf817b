-- moe_group: models/tiny_moe.lua with Megatron's group-limited routing: the 8 experts in 4
-- groups of 2, each token's top-2 taken from its 2 best groups (a group's score: its largest
-- logit, the sum of its top_k/group_topk = 1 best), for tests/moe.
return gpt {
    description = "tiny MoE GPT, group-limited routing",
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
        num_groups     = 4,
        group_topk     = 2,
    },
}
