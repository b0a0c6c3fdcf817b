-- 1e308 is a float far beyond any integer
return gpt {
    layers = 1e308, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
