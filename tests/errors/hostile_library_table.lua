-- a library view as the fields of moe{}
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             moe = moe(math) }
