-- tries to run a command
os.execute("touch /tmp/gen-sandbox-escaped")
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
