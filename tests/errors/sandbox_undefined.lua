-- a typo in a name
local hidden = 64
return gpt { layers = 4, hidden = hiden, heads = 4, seq_len = 64, vocab = 256 }
