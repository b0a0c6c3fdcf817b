-- moe_bench: the model of bench/moe_bench.sh (not a test model): 4 layers of hidden 256
-- with 8 experts of width 512 (top-2, aux loss 0.01, no biases), context 128, a byte-sized
-- vocabulary. Large enough that the experts' GEMMs, not the program's fixed costs, set the
-- step time on a small CPU; small enough that EP 1 (every expert on every rank) fits anywhere.
return gpt {
    description = "MoE GPT for the expert-parallel CPU benchmark",
    layers  = 4,
    hidden  = 256,
    heads   = 4,
    seq_len = 128,
    vocab   = 256,
    moe = moe {
        experts        = 8,
        top_k          = 2,
        ffn_hidden     = 512,
        aux_loss_coeff = 0.01,
        bias           = false,
    },
}
