-- a constructor given thousands of values
local t = { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
for i = 1, 100000 do t[i] = i end
return gpt(t)
