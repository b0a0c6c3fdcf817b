-- a string doubled until it does not fit: the memory cap stops it
local s = "x"
for i = 1, 64 do s = s .. s end
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
