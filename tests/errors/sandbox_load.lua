-- tries to compile code at run time
local f = load("return 12")
return gpt { layers = f(), hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
