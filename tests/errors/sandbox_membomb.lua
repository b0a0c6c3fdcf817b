-- tries to allocate 1 GiB
local s = "x"
local big = s:rep(1 << 30)
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
