-- returns a plain table instead of gpt{ }
return { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
