-- builds the model but forgets to return it
local m = gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
