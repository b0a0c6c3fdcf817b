-- the model raises its own error
local heads = 4
if heads < 8 then error("this description needs at least 8 heads") end
return gpt { layers = 4, hidden = 64, heads = heads, seq_len = 64, vocab = 256 }
