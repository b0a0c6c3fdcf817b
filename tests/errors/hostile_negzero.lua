-- negative zero is a float
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             vocab_pad = -0.0 }
