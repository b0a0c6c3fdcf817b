-- shapes that repeat a name without repeating a key: all accepted
local a, b = 1, 2
local helpers = {
    f = function() a = 1; a = 2; b = a end,   -- assignments in a function body
    g = function() local t = {}; t.x = 1; t.x = 2; return t end,
    same = a == b, other = (a == b),          -- comparisons, not keys
    inner = { f = 1, same = 2 },              -- the same names one level down
    ["layers ="] = 1, note = "layers = 2",    -- inside strings
    -- layers = 3 (a comment)
    list = { 1, 2, 3, 1, 2, 3 },              -- positional fields are not keys
    [1] = 4, [2] = 5,                         -- nor are numbers
}
local other = { f = 1, same = 3 }             -- the same key in another table
for i = 1, 2 do local t = { i = i } ; t.i = 3 end
return gpt {
    layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256,
    description = [[layers = 4, layers = 8]],
}
