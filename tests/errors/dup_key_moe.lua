-- moe{} inside gpt{}: the same key at two levels is fine, twice in moe{} is not
return gpt {
    layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256, ffn_hidden = 128,
    moe = moe { experts = 4, top_k = 2, ffn_hidden = 128,
                experts = 8 },
}
