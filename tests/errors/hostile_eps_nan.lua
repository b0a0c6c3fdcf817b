return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             init_std = 0/0 }
