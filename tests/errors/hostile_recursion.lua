-- recursion without end: Lua's stack limit stops it, not the C stack
local function depth(n)
    return 1 + depth(n + 1)
end
local d = depth(1)
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
