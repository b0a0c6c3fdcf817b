-- / makes a float in Lua 5.4
local base = 128
return gpt {
    layers = 4,
    hidden = base / 2,
    heads = 4,
    seq_len = 64,
    vocab = 256,
}
