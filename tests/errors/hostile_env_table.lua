-- the model's environment as the fields: its lookups raise, so it is refused
layers, hidden, heads, seq_len, vocab = 4, 64, 4, 64, 256
return gpt(_ENV)
