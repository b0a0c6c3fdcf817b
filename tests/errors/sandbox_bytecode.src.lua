-- compiled to bytecode by tests/errors/suite.sh; the generator must refuse the result
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
