-- a key given twice: Lua keeps only the last value, so the first is silently lost
local seq = 64
return gpt {
    layers = 4,
    hidden = 64,
    heads = 4,
    layers = 8,
    seq_len = seq,
    vocab = 256,
}
