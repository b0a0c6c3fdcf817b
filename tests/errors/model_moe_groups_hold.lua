-- group_topk groups too small for top_k
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
    vocab = 256,
    moe = moe {
        experts = 8,
        top_k = 4,
        num_groups = 4,
        group_topk = 1,
    },
}
