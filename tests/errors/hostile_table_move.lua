-- table.move walks every index in C, even where there is nothing
local t = table.move({}, 1, 1 << 62, 1, {})
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
