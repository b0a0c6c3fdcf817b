-- control characters in a message are escaped, so they cannot rewrite the terminal
error("\27[2Jcleared\rgen: wrote out/")
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
