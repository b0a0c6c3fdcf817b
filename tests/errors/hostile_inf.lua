return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             -- math.huge is a float infinity
             ffn_hidden = math.huge }
