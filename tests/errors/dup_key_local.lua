-- any table of the file counts, not only gpt{}
local base = { layers = 12, hidden = 768,
               layers = 24 }
return gpt { layers = base.layers, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
