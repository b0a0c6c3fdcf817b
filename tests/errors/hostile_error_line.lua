-- an error object with a line that is no line: the raising line is used
local at = 1e308
error({ msg = "bad sizes", line = at })
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
