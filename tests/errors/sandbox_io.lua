-- tries to read a file
local f = io.open("/etc/passwd")
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
