-- tries the string metatable: ("").dump is the string library too
local s = "x"
local code = s.dump(gpt)
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
