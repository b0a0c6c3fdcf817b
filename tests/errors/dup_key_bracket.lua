-- ["name"] = is the same key as name =
return gpt {
    layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
    ["hidden"] = 128,
}
