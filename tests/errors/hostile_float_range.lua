-- the programs hold init_std in a C float: 1e300 would be inf there
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             init_std = 1e300 }
