local s = ('x'):rep(1 << 20)
return gpt { layers = #s }
