-- a table built inside a function body is a table too
local function sizes(n)
    return { layers = n, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
             heads = n }
end
return gpt(sizes(4))
