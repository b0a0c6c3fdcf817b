-- positional values are not fields
return gpt { 4, layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
