-- a string of 2^40 bytes
local s = string.rep("x", 2^40)
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
