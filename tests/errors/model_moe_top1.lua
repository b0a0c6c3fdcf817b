-- top-1 with the softmax after the top-k: Megatron refuses it (zero router gradient)
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        experts = 4,
        top_k = 1,
    },
}
