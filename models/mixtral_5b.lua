-- mixtral_5b: a Mixtral-shaped MoE GPT at GPT-2 scale (not a released model): 24 layers,
-- hidden 2048, 16 heads, context 4096, 8 experts of ffn 5632 with top-2 routing, no biases
-- in any linear layer (add_bias_linear = false, so any ETP works), aux-loss coefficient 0.02
-- as in Mixtral's training recipe.
local hidden = 2048
return gpt {
    description = "Mixtral-style 8-expert MoE at GPT-2 scale",
    layers  = 24,
    hidden  = hidden,
    heads   = 16,
    seq_len = 4096,
    vocab   = 50257,
    add_bias_linear = false,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 11 * hidden // 4,
        aux_loss_coeff = 0.02,
    },
}
