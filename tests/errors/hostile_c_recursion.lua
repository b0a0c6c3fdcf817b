-- recursion through a library function that calls back into the model
local function again()
    table.sort({ 3, 2, 1 }, function(a, b) again(); return a < b end)
end
again()
return gpt { layers = 4, hidden = 64, heads = 4, seq_len = 64, vocab = 256 }
