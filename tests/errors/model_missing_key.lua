-- forgets the vocabulary size
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    seq_len = 64,
}
