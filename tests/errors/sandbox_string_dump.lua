-- tries to make bytecode through the string library
local code = string.dump(gpt)
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
